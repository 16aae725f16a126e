//! `memplan plan --from-log FILE`: the figures of an engine's start-up log as the user pasted
//! it, so a start-up can be reproduced without retyping. Formats read: vLLM V0 ("Memory
//! profiling results", "# GPU blocks"), vLLM V1 from 0.6 to the newest release ("Model loading
//! took", "Memory profiling takes ... Total non KV cache memory", "Estimated CUDA graph
//! memory", "CUDA graph pool memory", "Available KV cache memory", "GPU KV cache size",
//! "Maximum concurrency", "Free memory on device (F/T GiB)", "Extended KV cache to N
//! blocks"), its XPU worker of the 0.9/0.10 releases ("Before/After memory profiling run"),
//! vllm-ascend's worker ("Available memory: N, total memory: T", bytes), and SGLang ("Load
//! weight end ... mem usage", "KV Cache is allocated. #tokens", each graph runner's "Capture
//! ... graph end ... mem usage", its `ServerArgs`).
//!
//! ## The contract
//!
//! - Every figure is checked as the flag it stands for would be ([`crate::limits`]): a
//!   utilisation outside (0, 1], a count outside its range, a byte figure above 1 PiB, a
//!   negative weight, a number that does not fit in 64 bits or is not finite. Such a figure is
//!   an error naming the line and the value as printed ([`Error::InvalidInput`] with field
//!   `line N`; [`read`] names the file too), never a value clamped, wrapped or replaced by 0.
//! - A figure the log does not print is `None`. The first occurrence of a figure wins (tensor
//!   parallel workers print theirs once each); later occurrences are checked all the same.
//!   The available KV memory is the exception: where several processes print their own (each
//!   named by its line's process prefix, vLLM's or Ray's; see `process_of`), the smallest
//!   counts, as the engine sizes every worker by the fewest blocks, and lines Ray's
//!   de-duplication folded are named in the notes.
//! - Whether the torch.compile cache was cold or warm at the profile run is read where the
//!   log says so ([`CompileCache`]); a cold one is named in the notes.
//! - Negative windows engines do print (a graph pool that freed memory, an available KV memory
//!   below zero in a start-up that failed) are not figures of a plan: they are left out and
//!   said so in [`LogFigures::notes`].
//! - A log with none of the engines' memory lines is an error that says what was looked for.
//! - A log of vLLM's CPU backend ("# cpu blocks", `VLLM_CPU_KVCACHE_SPACE`) is an error that says
//!   why: its KV cache is a fixed host-memory space, not a share of a GPU's memory.
//! - A launch command pasted with the log (`vllm serve X ...`, `python -m
//!   vllm.entrypoints.openai.api_server ...`, `python -m sglang.launch_server ...`) gives the
//!   flags that change the plan (utilisation, lengths, KV dtype, block size, parallel sizes,
//!   eager, batch limits), read with shell-like quoting; the engine's own printed arguments
//!   win where both give a figure, and a note names any that differ. A malformed value of such
//!   a flag is an error naming the flag and the line.
//! - vllm-ascend's "Block size is set to N" is the block size, whatever the arguments asked
//!   for (`vllm_ascend/utils.py` `refresh_block_size`).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use memplan_core::bytes::{fmt_bytes, GIB, MIB};
use memplan_core::{Error, Param, Result};

use crate::engine::EngineKind;
use crate::limits;

/// Figures read from a log; `None` where the log does not print them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LogFigures {
    /// Which engine wrote it.
    pub engine: Option<EngineKind>,
    /// The version it printed, as printed (`0.20.2rc1.dev9+g01d4d1ad3`).
    pub version: Option<String>,
    /// `model` of the non-default args or the engine config (or SGLang's `model_path`).
    pub model: Option<String>,
    /// Every distinct model the log's start-up lines name (the non-default args, the engine
    /// config, SGLang's server args), in order: a log of two start-ups of different models
    /// names two. Where none does, the banner's model, else every model the pasted launch
    /// commands name (two commands of different models name two).
    pub models: Vec<String>,
    /// Device total (bytes).
    pub total: Option<u64>,
    /// Free device memory at start-up (bytes).
    pub free: Option<u64>,
    /// Free device memory once the weights were loaded (SGLang: "Load weight end. ... avail
    /// mem=X GB, mem usage=W GB"): the device holds at least this and the weights.
    pub free_after_weights: Option<u64>,
    /// `gpu_memory_utilization` (or SGLang's `mem_fraction_static`).
    pub utilization: Option<f64>,
    /// Weights per rank.
    pub weights: Option<u64>,
    /// Activation peak per rank (torch peak increase of the profile run).
    pub activation: Option<u64>,
    /// Non-torch memory growth per rank.
    pub non_torch: Option<u64>,
    /// Everything the instance consumed by the end of the profile run, read from free
    /// memory (weights + non-torch + persistent buffers; vLLM 0.2x+ "total consumed").
    pub consumed: Option<u64>,
    /// "Total non KV cache memory".
    pub non_kv: Option<u64>,
    /// The utilisation that gives the same KV cache without the graph reserve ("The current
    /// --gpu-memory-utilization=U is equivalent to --gpu-memory-utilization=V without CUDA
    /// graph memory profiling": V). With the graph estimate it gives the device total
    /// (`estimate / (U - V)`), to the rounding of the printed figures.
    pub utilization_without_graphs: Option<f64>,
    /// The utilisation that keeps the same KV cache with the graph reserve subtracted, as vLLM
    /// 0.19 advises ("increase --gpu-memory-utilization from U to V to maintain the same
    /// effective KV cache size": V). With the graph estimate it gives the device total
    /// (`estimate / (V - U)`).
    pub utilization_with_graphs: Option<f64>,
    /// The engine's graph-memory estimate.
    pub graph_estimate: Option<u64>,
    /// Graph memory measured after capture.
    pub graph_actual: Option<u64>,
    /// Whether the estimate was subtracted from the KV budget: the log says so ("CUDA graph
    /// memory profiling is enabled") or its "Total non KV cache memory" line includes it.
    pub graph_subtracted: bool,
    /// "Available KV cache memory".
    pub kv_available: Option<u64>,
    /// How far `kv_available` may be from the engine's own figure, as the log rounded it:
    /// `Some(0)` where the log prints it in bytes (vllm-ascend's "Available memory: N", vLLM
    /// 0.10's "Current kv cache memory in use is N bytes"), `Some(GIB / 100)` where it is the
    /// sum of two figures printed to 0.01 GB each (SGLang's "K size: X GB, V size: Y GB");
    /// `None` for one figure printed to 0.01 GiB (half a hundredth of a GiB).
    pub kv_available_rounding: Option<u64>,
    /// The KV cache the extensible cache committed after warmup and graph capture (vLLM
    /// 0.34: "Extended KV cache to N blocks (X GiB)", "Memory after warmup: ... X GiB
    /// committed to the KV cache"): the start-up's final KV memory, where printed.
    pub kv_final: Option<u64>,
    /// "GPU KV cache size" tokens (SGLang: the allocated #tokens).
    pub kv_tokens: Option<u64>,
    /// KV blocks the engine allocated (V0's "# GPU blocks", "Extended KV cache to N blocks").
    pub kv_blocks: Option<u64>,
    /// "Maximum concurrency for N tokens per request: X" (X).
    pub max_concurrency: Option<f64>,
    /// `max_model_len`.
    pub max_model_len: Option<u64>,
    /// Tokens per KV block.
    pub block_size: Option<u32>,
    /// Tensor-parallel ranks.
    pub tensor_parallel: Option<u64>,
    /// Pipeline-parallel stages (`pipeline_parallel_size`, SGLang's `pp_size`).
    pub pipeline_parallel: Option<u64>,
    /// `kv_cache_dtype`.
    pub kv_cache_dtype: Option<String>,
    /// `mamba_cache_dtype` (vLLM's non-default args).
    pub mamba_cache_dtype: Option<String>,
    /// `mamba_ssm_cache_dtype` (vLLM's non-default args).
    pub mamba_ssm_cache_dtype: Option<String>,
    /// `quantization`.
    pub quantization: Option<String>,
    /// `enforce_eager` (SGLang's `disable_cuda_graph`).
    pub enforce_eager: Option<bool>,
    /// `enable_prefix_caching` (the engine config line, or vLLM's non-default args).
    pub enable_prefix_caching: Option<bool>,
    /// The line that says the start-up captures no graphs although it is not eager:
    /// `cudagraph_mode` NONE in the engine config (`"cudagraph_mode":0` up to 0.10,
    /// `'cudagraph_mode': <CUDAGraphMode.NONE: 0>` from 0.11), or the capture's own "Skipping
    /// CUDA graph capture" (`v1/worker/gpu_model_runner.py` `capture_model`, which returns 0
    /// for that mode): no graph memory, as with `enforce_eager`.
    pub no_graphs: Option<usize>,
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u64>,
    /// `max_num_seqs`.
    pub max_num_seqs: Option<u64>,
    /// Whether the torch.compile cache was cold or warm when the KV cache was sized, where the
    /// log says so before its available KV memory (see [`CompileCache`]).
    pub compile_cache: Option<CompileCache>,
    /// The first line in a format only vLLM releases before 0.19 print (V0's "Memory profiling
    /// results" and "the rest of the memory reserved for KV Cache is", "# GPU blocks:" /
    /// "# CUDA blocks:", "Loading model weights took", V0's refusal "maximum number of tokens
    /// that can be stored in KV cache"): it dates a log that has no version line.
    pub legacy_line: Option<usize>,
    /// The date (`YYYY-MM-DD`) of the first start-up line read that opens with SGLang's
    /// `[YYYY-MM-DD hh:mm:ss` stamp: it bounds the release of an SGLang log without a version
    /// line (a release published after it cannot have written it).
    pub date: Option<String>,
    /// The line where the engine refused to start because one request of `max_model_len`
    /// does not fit its KV cache (V0: "... is larger than the maximum number of tokens that
    /// can be stored in KV cache (N)"; V1: "... which is larger than the available KV cache
    /// memory (X GiB)"): that start-up allocated no KV cache.
    pub refused: Option<usize>,
    /// The line where the engine refused to start because less memory was free at start-up
    /// than its utilisation of the total asks for (vLLM V1, `v1/worker/gpu_worker.py`
    /// `init_device` / `request_memory`: "Free memory on device (F/T GiB) on startup is less
    /// than desired GPU memory utilization (U, X GiB)"): that start-up ran nothing.
    pub refused_free: Option<usize>,
    /// The line (1-based) each figure was read from, by figure name.
    pub lines: Vec<(&'static str, usize)>,
    /// What was read but left out, and why.
    pub notes: Vec<String>,
}

/// The state of vLLM's torch.compile cache at the profile run, as the log prints it.
///
/// vLLM compiles the model on its first forward, which is the profile run inside
/// `memory_profiling` (`v1/worker/gpu_worker.py` `determine_available_memory`;
/// `compilation/decorators.py`: "torch.compile and initial profiling/warmup run together").
/// With a cold cache, inductor compiles and autotunes there (`compilation/backends.py`
/// `VllmBackend`/`CompilerManager.compile`: "Compiling a graph for ... takes"), and what that
/// leaves on the device (autotuning's benchmark copies in the torch peak, every candidate
/// kernel loaded) is charged to the non-KV terms; with a warm cache the compiled graphs are
/// loaded ("Directly load the compiled graph(s) for ... from the cache", or "Directly load AOT
/// compilation from path") and none of that happens. Public cold/warm pairs differ by 0 to
/// tens of GiB of KV memory depending on model, device and compiled shapes
/// (docs/engine-rules.md), so no rule predicts the cold surplus: the dry run plans the warm
/// start-up and a cold log is named as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompileCache {
    /// The start-up compiled its graphs inside the profile run.
    Cold,
    /// The start-up loaded its compiled graphs from the cache.
    Warm,
}

impl LogFigures {
    /// The line a figure was read from.
    pub fn line(&self, figure: &str) -> Option<usize> {
        self.lines.iter().find(|(k, _)| *k == figure).map(|l| l.1)
    }

    /// The device total the utilisation pair and the graph estimate imply
    /// (`estimate / (U - V)`), when the log prints no total; `None` when the difference is
    /// too small to divide by (under 0.001).
    pub fn derived_total(&self) -> Option<u64> {
        let (u, g) = (self.utilization?, self.graph_estimate?);
        let d = match (
            self.utilization_without_graphs,
            self.utilization_with_graphs,
        ) {
            (Some(v), _) => u - v,
            (None, Some(w)) => w - u,
            (None, None) => return None,
        };
        (d >= 0.001)
            .then(|| (g as f64 / d) as u64)
            .filter(|t| *t > 0 && *t <= limits::MAX_BYTES)
    }

    /// The releases a V1 log's own lines allow, for a log that prints no version line. Each
    /// bound is a line vLLM printed only from or up to a release (docs/engine-rules.md, where
    /// each row cites the function):
    /// - from 0.34: "Extended KV cache to N blocks" / "Memory after warmup: ... committed to
    ///   the KV cache" (`v1/worker/extensible_kv_cache.py` `finalize_extensible_kv_cache`);
    /// - from 0.27: the consumed accounting, "total consumed (from mem_get_info)"
    ///   (`utils/mem_utils.py` `memory_profiling`) and "Actual usage is C GiB for consumed
    ///   memory" (`v1/worker/gpu_worker.py` `compile_or_warm_up_model`);
    /// - from 0.20: graph memory subtracted ("CUDA graph memory profiling is enabled", or a
    ///   "Total non KV cache memory" that includes the estimate: `gpu_worker.py`
    ///   `determine_available_memory`);
    /// - up to 0.26: the profile result before the consumed accounting, "non-torch forward
    ///   increase memory" (`memory_profiling`), and the report "Actual usage is W GiB for
    ///   weight, ..." (`compile_or_warm_up_model`; both replaced in 0.27).
    ///
    /// The oldest bound is the latest of the "from" lines, the newest the earliest of the "up
    /// to" lines.
    pub fn release_bounds(&self) -> ReleaseBounds {
        let mut from = Vec::new();
        let mut until = Vec::new();
        let bound = |release, line: Option<usize>, why| {
            line.map(|line| ReleaseBound { release, line, why })
        };
        from.extend(bound(
            "0.34",
            self.line("kv_final"),
            "printed by the extensible KV cache (`v1/worker/extensible_kv_cache.py` `finalize_extensible_kv_cache`), vLLM 0.34 and later",
        ));
        from.extend(bound(
            "0.27",
            self.line("consumed"),
            "the consumed accounting (`utils/mem_utils.py` `memory_profiling`, `v1/worker/gpu_worker.py` `compile_or_warm_up_model`), vLLM 0.27 and later",
        ));
        if self.graph_subtracted {
            from.extend(bound(
                "0.20",
                self.line("utilization_without_graphs")
                    .or(self.line("non_kv"))
                    .or(self.line("graph_estimate")),
                "graph memory subtracted from the KV budget (`v1/worker/gpu_worker.py` `determine_available_memory`), vLLM 0.20 and later",
            ));
        }
        until.extend(bound(
            "0.26",
            self.line("non_torch_increase"),
            "the profile result before the consumed accounting (`utils/mem_utils.py` `memory_profiling`: \"non-torch forward increase memory\"), vLLM 0.26 and earlier",
        ));
        // (vllm-ascend's worker prints its own report: its releases are not vLLM's.)
        until.extend(bound(
            "0.26",
            self.line("weight_report").filter(|_| self.line("npu").is_none()),
            "the report before the consumed accounting (`v1/worker/gpu_worker.py` `compile_or_warm_up_model`: \"W GiB for weight, ...\"), vLLM 0.26 and earlier",
        ));
        ReleaseBounds {
            oldest: from
                .into_iter()
                .max_by_key(|b| (minor(b.release), usize::MAX - b.line)),
            newest: until.into_iter().min_by_key(|b| (minor(b.release), b.line)),
        }
    }

    /// The release the log's version line names, as `MAJOR.MINOR[.PATCH]` (pre-release and
    /// local suffixes dropped: `0.20.2rc1.dev9+g01d` is 0.20.2).
    pub fn release(&self) -> Option<String> {
        let v = self.version.as_deref()?;
        let end = v
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(v.len());
        let parts: Vec<&str> = v[..end]
            .split('.')
            .filter(|p| !p.is_empty())
            .take(3)
            .collect();
        (parts.len() >= 2).then(|| parts.join("."))
    }
}

/// The date of SGLang's `[YYYY-MM-DD hh:mm:ss` line stamp (`[2025-03-27 21:33:30 TP0] ...`).
fn stamp_date(text: &str) -> Option<String> {
    let d = text.trim_start().strip_prefix('[')?.get(..11)?;
    let b = d.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    (digits(0..4) && b[4] == b'-' && digits(5..7) && b[7] == b'-' && digits(8..10) && b[10] == b' ')
        .then(|| d[..10].to_string())
}

/// One bound a line puts on the vLLM release that wrote a log without a version line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseBound {
    /// The release row (`0.27`).
    pub release: &'static str,
    /// The line (1-based).
    pub line: usize,
    /// Which vLLM code prints the line, and since or until which release.
    pub why: &'static str,
}

/// What a V1 log's own lines say about its release ([`LogFigures::release_bounds`]): the
/// oldest and newest release rows they allow, each with the line that bounds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReleaseBounds {
    /// The oldest release that prints every line (`None`: no line bounds it).
    pub oldest: Option<ReleaseBound>,
    /// The newest release that prints every line.
    pub newest: Option<ReleaseBound>,
}

impl ReleaseBounds {
    /// Whether the bounds contradict each other (a fork that backported one line, or two
    /// start-ups of different releases in one paste): then they date nothing.
    pub fn contradict(&self) -> bool {
        match (self.oldest, self.newest) {
            (Some(lo), Some(hi)) => minor(lo.release) > minor(hi.release),
            _ => false,
        }
    }
}

/// The minor version of a `0.N` release row.
fn minor(release: &str) -> u32 {
    release
        .split('.')
        .nth(1)
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// One line being read.
struct Line<'a> {
    n: usize,
    text: &'a str,
    /// The keys of [`scan::KEYS`] in the line (a whole log line), or `None` for a part of a
    /// line, which is searched.
    found: Option<&'a [(&'static str, usize)]>,
}

/// The longest word [`Line::word`] reads (a dtype, a quantization method, a model path):
/// Linux's `PATH_MAX`, the longest path an engine loads a model from.
const MAX_WORD: usize = 4096;

fn bad(n: usize, message: String) -> Error {
    Error::invalid(format!("line {n}"), message)
}

/// The raw number token right after `key` in `s` (digits, `,`, `.`, a sign, an exponent),
/// with the text after it; sentence punctuation after the number (`0.90.`) is not part of it.
fn token<'a>(s: &'a str, key: &str) -> Option<(&'a str, &'a str)> {
    token_from(s, key, 0)
}

/// [`token`], looking for `key` from byte `from` of `s` on.
fn token_from<'a>(s: &'a str, key: &str, mut from: usize) -> Option<(&'a str, &'a str)> {
    while let Some(i) = s[from..].find(key) {
        let at = from + i;
        from = at + key.len();
        // A key that starts with a letter must not be the tail of a longer name.
        let boundary = !key.starts_with(|c: char| c.is_ascii_alphanumeric())
            || !s[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !boundary {
            continue;
        }
        let rest = s[from..].trim_start_matches([' ', '\t', '=', ':', '\'', '"', '(']);
        // Words that parse as floating-point numbers are figures too (and refused as such),
        // also where a unit follows without a space (`total_memory=NaNGiB`): skipping such a
        // figure would let another line's, or an estimate, stand in for it.
        let word: String = rest
            .trim_start_matches(['-', '+'])
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .collect::<String>()
            .to_ascii_lowercase();
        if let Some(number) = ["infinity", "nan", "inf"].into_iter().find(|n| {
            word.strip_prefix(n).is_some_and(|unit| {
                matches!(
                    unit,
                    "" | "b" | "bytes" | "kib" | "kb" | "mib" | "mb" | "gib" | "gb" | "x"
                )
            })
        }) {
            let len = rest.len() - rest.trim_start_matches(['-', '+']).len() + number.len();
            return Some((&rest[..len], &rest[len..]));
        }
        let end = rest
            .char_indices()
            .find(|&(i, c)| {
                !(c.is_ascii_digit()
                    || c == '.'
                    || c == ','
                    || ((c == '-' || c == '+') && (i == 0 || rest[..i].ends_with(['e', 'E'])))
                    || ((c == 'e' || c == 'E')
                        && i > 0
                        && rest[i + 1..]
                            .starts_with(|d: char| d.is_ascii_digit() || d == '-' || d == '+')))
            })
            .map_or(rest.len(), |(i, _)| i);
        let tok = rest[..end].trim_end_matches(['.', ',']);
        if !tok.contains(|c: char| c.is_ascii_digit()) {
            return None;
        }
        return Some((tok, &rest[tok.len()..]));
    }
    None
}

impl<'a> Line<'a> {
    /// A part of a line (searched, not scanned).
    fn part(n: usize, text: &'a str) -> Line<'a> {
        Line {
            n,
            text,
            found: None,
        }
    }

    fn has(&self, key: &str) -> bool {
        match self.found {
            Some(found) => {
                let has = found.iter().any(|(k, _)| *k == key);
                // The unit tests read logs through every branch: a key looked for in whole
                // lines must be one the scan reports.
                #[cfg(test)]
                assert!(
                    has || scan::is_key(key),
                    "{key:?} is looked for in whole lines but is not in scan::KEYS"
                );
                has
            }
            None => self.text.contains(key),
        }
    }

    /// Where `key` first occurs.
    fn find(&self, key: &str) -> Option<usize> {
        match self.found {
            Some(found) => {
                let at = found.iter().find(|(k, _)| *k == key).map(|f| f.1);
                #[cfg(test)]
                assert!(
                    at.is_some() || scan::is_key(key),
                    "{key:?} is looked for in whole lines but is not in scan::KEYS"
                );
                at
            }
            None => self.text.find(key),
        }
    }

    /// The number token after `key` (see [`token`]), searched from its first occurrence.
    fn token(&self, key: &str) -> Option<(&'a str, &'a str)> {
        let from = self.find(key)?;
        token_from(self.text, key, from)
    }

    /// A byte figure printed in GiB (or GB, which vLLM V0 and SGLang print for the same 2^30
    /// figure; MiB/MB when so printed). `signed`: a negative figure is returned as such (the
    /// caller leaves it out); otherwise it is an error.
    fn bytes_signed(&self, key: &str, what: &str) -> Result<Option<(i128, &'a str)>> {
        let Some((tok, rest)) = self.token(key) else {
            return Ok(None);
        };
        let x: f64 = tok
            .replace(',', "")
            .parse()
            .map_err(|_| bad(self.n, format!("{what} {tok:?} is not a number")))?;
        let unit = rest.trim_start();
        let scale = if unit.starts_with("MiB") || unit.starts_with("MB") {
            MIB
        } else if unit.starts_with("bytes") {
            1
        } else {
            GIB
        } as f64;
        let b = x * scale;
        if !b.is_finite() || b.abs() > limits::MAX_BYTES as f64 {
            return Err(bad(
                self.n,
                format!(
                    "{what} {tok} {} is more than any device holds (at most {})",
                    unit.split_whitespace().next().unwrap_or("GiB"),
                    fmt_bytes(limits::MAX_BYTES)
                ),
            ));
        }
        Ok(Some((b.round() as i128, rest)))
    }

    fn bytes(&self, key: &str, what: &str) -> Result<Option<u64>> {
        match self.bytes_signed(key, what)? {
            Some((b, _)) if b < 0 => {
                Err(bad(self.n, format!("{what} {} is negative", fmt_signed(b))))
            }
            Some((b, _)) => Ok(Some(b as u64)),
            None => Ok(None),
        }
    }

    /// A byte figure printed as a bare whole number (`Available memory: 26954181529`), or
    /// `None` where the figure after `key` is not one (a decimal, a unit after it).
    fn plain_bytes(&self, key: &str, what: &str) -> Result<Option<u64>> {
        let Some((tok, rest)) = self.token(key) else {
            return Ok(None);
        };
        let unit = rest.trim_start();
        if !tok.chars().all(|c| c.is_ascii_digit())
            || unit.starts_with(|c: char| c.is_ascii_alphabetic())
        {
            return Ok(None);
        }
        // Only digits: a parse that fails is a figure past 64 bits, past the limit too.
        let b: u64 = tok.parse().unwrap_or(u64::MAX);
        if b > limits::MAX_BYTES {
            return Err(bad(
                self.n,
                format!(
                    "{what} {tok} bytes is more than any device holds (at most {})",
                    fmt_bytes(limits::MAX_BYTES)
                ),
            ));
        }
        Ok(Some(b))
    }

    /// A whole number in `1..=max` (thousands separators allowed).
    fn count(&self, key: &str, what: &str, max: u64) -> Result<Option<u64>> {
        let Some((tok, _)) = self.token(key) else {
            return Ok(None);
        };
        let digits = tok.replace(',', "");
        if !digits.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad(self.n, format!("{what} {tok} is not a whole number")));
        }
        // Only digits: a parse that fails is a count past 64 bits, outside the range too.
        let n: u64 = digits.parse().unwrap_or(u64::MAX);
        limits::check_count(n, max)
            .map(Some)
            .map_err(|_| bad(self.n, format!("{what} {tok} is outside 1..={max}")))
    }

    fn fraction(&self, key: &str, what: &str) -> Result<Option<f64>> {
        let Some((tok, _)) = self.token(key) else {
            return Ok(None);
        };
        let u: f64 = tok
            .parse()
            .map_err(|_| bad(self.n, format!("{what} {tok:?} is not a number")))?;
        limits::check_fraction(u)
            .map(Some)
            .map_err(|e| bad(self.n, format!("{what} {e}")))
    }

    /// A quoted or bare word after `key` (`'model': 'X'`, `model='X'`, `kv_cache_dtype=fp8`).
    /// A value longer than any memplan reads (a dtype, a quantization, a model path) is an
    /// error naming the line, not read as absent (which planned `auto` in its place).
    fn word(&self, key: &str) -> Result<Option<String>> {
        let Some(i) = self.find(key) else {
            return Ok(None);
        };
        let i = i + key.len();
        let rest = self.text[i..].trim_start_matches([' ', '=', ':']);
        let (quote, rest) = match rest.chars().next() {
            Some(q @ ('\'' | '"')) => (Some(q), &rest[1..]),
            _ => (None, rest),
        };
        let end = match quote {
            Some(q) => match rest.find(q) {
                Some(end) => end,
                None => return Ok(None),
            },
            None => rest
                .find(|c: char| c == ',' || c == '}' || c == ')' || c.is_whitespace())
                .unwrap_or(rest.len()),
        };
        let v = rest[..end].trim();
        if v.len() > MAX_WORD {
            return Err(bad(
                self.n,
                format!(
                    "the value after {:?} is {} bytes long, longer than any value memplan reads there (at most {MAX_WORD})",
                    key.trim_matches(['\'', ':', '=']),
                    v.len()
                ),
            ));
        }
        Ok((!v.is_empty() && v != "None").then(|| v.to_string()))
    }
}

/// A byte figure printed before its name, in GiB (`8.8 GiB for weight`: `key` is
/// `" GiB for weight"`), as signed bytes; `None` when the line has no such figure.
fn gib_before(l: &Line, key: &str, what: &str) -> Result<Option<i128>> {
    let Some(at) = l.find(key) else {
        return Ok(None);
    };
    let head = l.text[..at].trim_end();
    let start = head
        .char_indices()
        .rev()
        .take_while(|&(_, c)| c.is_ascii_digit() || matches!(c, '.' | ',' | '-' | '+'))
        .last()
        .map_or(head.len(), |(i, _)| i);
    let tok = &head[start..];
    if !tok.contains(|c: char| c.is_ascii_digit()) {
        return Ok(None);
    }
    let x: f64 = tok
        .replace(',', "")
        .parse()
        .map_err(|_| bad(l.n, format!("{what} {tok:?} is not a number")))?;
    let b = x * GIB as f64;
    if !b.is_finite() || b.abs() > limits::MAX_BYTES as f64 {
        return Err(bad(
            l.n,
            format!(
                "{what} {tok} GiB is more than any device holds (at most {})",
                fmt_bytes(limits::MAX_BYTES)
            ),
        ));
    }
    Ok(Some(b.round() as i128))
}

fn fmt_signed(b: i128) -> String {
    let s = fmt_bytes(b.unsigned_abs().min(u64::MAX as u128) as u64);
    if b < 0 {
        format!("-{s}")
    } else {
        s
    }
}

/// Set a figure once (the first occurrence wins) and remember its line.
fn set<T>(
    slot: &mut Option<T>,
    v: Option<T>,
    lines: &mut Vec<(&'static str, usize)>,
    name: &'static str,
    n: usize,
) {
    if let (None, Some(v)) = (&slot, v) {
        *slot = Some(v);
        lines.push((name, n));
    }
}

/// What a line of line number `n` says graph capture took (`taken`, signed, as read): the
/// graphs' memory where it is positive; a capture that measured below zero freed memory inside
/// its window, and is noted (naming `what` measured it), not used.
fn set_graph_actual<T>(
    slot: &mut Option<u64>,
    notes: &mut Vec<String>,
    lines: &mut Vec<(&'static str, usize)>,
    n: usize,
    taken: Option<(i128, T)>,
    what: &str,
) {
    match taken {
        Some((b, _)) if b < 0 => notes.push(format!(
            "line {n}: {what} measured {} (capture freed memory): not used",
            fmt_signed(b)
        )),
        Some((b, _)) => set(slot, Some(b as u64), lines, "graph_actual", n),
        None => {}
    }
}

/// The process a line's prefix names, or `None` for an unprefixed line (the API server, the
/// engine core of older releases, V0's driver worker). vLLM's multiprocess workers print
/// `(Worker_TP1 pid=12)`, `(Worker_TP0_EP0 pid=..)`, `(VllmWorker rank=1 pid=..)`, V0's
/// `(VllmWorkerProcess pid=..)`; Ray prints its actors' lines under `(RayWorkerWrapper
/// pid=12, ip=10.0.0.2)`, or `(pid=12)` before the actor is named; the engine core prints
/// `(EngineCore_DP0 pid=..)`. The prefix is the first parenthesis within the line's first
/// 160 bytes (after a container or timestamp prefix, or a terminal colour code) that holds a
/// `pid=`; what it holds, up to 120 bytes, names the process.
fn process_of(text: &str) -> Option<&str> {
    // The first 160 bytes, cut back to a character boundary (a pasted log may hold any UTF-8).
    let mut cut = text.len().min(160);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = &text[..cut];
    let mut from = 0;
    while let Some(i) = head[from..].find('(') {
        let start = from + i + 1;
        let rest = &text[start..];
        let end = rest.find(')')?;
        let inner = &rest[..end];
        if end <= 120 && !inner.contains('(') && inner.contains("pid=") {
            return Some(inner);
        }
        from = start;
    }
    None
}

/// The rank an SGLang line's prefix names (`[2026-07-21 13:35:33 TP1]`, `[... DP0 TP1]`):
/// the `TPn` word inside the line's first bracket, or `None` for a single-rank log.
fn sglang_rank(text: &str) -> Option<&str> {
    let open = text.find('[')?;
    let close = open + text[open..].find(']')?;
    text[open + 1..close].split_whitespace().rev().find(|w| {
        w.strip_prefix("TP")
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
    })
}

/// How many other processes' lines Ray folded into this one (`... [repeated 14x across
/// cluster]`: Ray's log de-duplication prints the first such line of each pattern and then
/// one line per batch, numbers ignored), or `None`.
fn ray_folded(text: &str) -> Option<u64> {
    let i = text.find("[repeated ")?;
    let rest = &text[i + "[repeated ".len()..];
    let x = rest.find("x across cluster]")?;
    rest[..x].parse().ok()
}

fn is_version(v: &str) -> bool {
    let mut parts = v.split('.');
    parts
        .next()
        .is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// The block-count line of vLLM V0's executor on each platform (`executor/executor_base.py`
/// `initialize_cache`: "# %s blocks: %d, # CPU blocks: %d" with
/// `current_platform.device_name`: "GPU", "cuda", "rocm", "xpu", "cpu" (the CPU backend,
/// refused below: [`CPU_BACKEND`]); the HPU and TPU executors print their own): it names the
/// engine, marks the legacy format and gives the block count. Each is one of the scanner's
/// keys (`scan::KEYS`).
const V0_BLOCK_LINES: [&str; 8] = [
    "# GPU blocks:",
    "# CUDA blocks:",
    "# cuda blocks:",
    "# rocm blocks:",
    "# xpu blocks:",
    "# HPU blocks:",
    "# TPU blocks:",
    "# cpu blocks:",
];

/// Lines only vLLM's CPU backend prints: V0's block count on the CPU executor ("# cpu blocks:
/// N, # CPU blocks: 0"; the capital "# CPU blocks" every V0 line ends with is the swap
/// space), the platform's detection ("Automatically detected platform cpu.",
/// `platforms/__init__.py`) and the KV cache space it sizes by
/// (`platforms/cpu.py`: V0 "Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend
/// is not set, using 4 by default."; 0.19 "VLLM_CPU_KVCACHE_SPACE not set. Using X GiB for KV
/// cache."). Such a start-up's KV cache is that space, in host memory: vLLM V0 makes it
/// `space // cache_block_size` blocks (`worker/cpu_worker.py`
/// `CPUWorker.determine_num_available_blocks`, 0.6 to 0.9), V1 takes the space as its
/// available KV memory (`v1/worker/cpu_worker.py` `CPUWorker.determine_available_memory`,
/// 0.19.0). Nothing of a GPU's memory budget applies, so memplan refuses such a log. The
/// engine config's `device_config=cpu` is no such line: out-of-tree platforms (vllm-metal,
/// "Platform plugin metal is activated") print it too, and a log that names such a plugin is
/// not refused as the CPU backend's.
const CPU_BACKEND: [&str; 3] = [
    "# cpu blocks:",
    "Automatically detected platform cpu",
    "VLLM_CPU_KVCACHE_SPACE",
];

/// The platform's detection of an accelerator (`platforms/__init__.py`, "Automatically
/// detected platform cuda."). With V0's block count on an accelerator's executor (the
/// [`V0_BLOCK_LINES`] that are not [`CPU_BACKEND`]'s), it shows a start-up ran on an
/// accelerator, whatever else the log holds ([`accelerator_line`]).
const PLATFORM_DETECTED: [&str; 5] = [
    "Automatically detected platform cuda",
    "Automatically detected platform rocm",
    "Automatically detected platform xpu",
    "Automatically detected platform tpu",
    "Automatically detected platform hpu",
];

/// Whether `l` shows an accelerator's start-up: the platform's detection
/// ([`PLATFORM_DETECTED`]) or V0's block count on an accelerator's executor. A log with such a
/// line is not refused for a [`CPU_BACKEND`] line: pasted logs mix processes (a client or a
/// Ray head with no accelerator detects the CPU platform, an environment dump names
/// `VLLM_CPU_KVCACHE_SPACE`), and the accelerator's start-up is the one to plan. vLLM V1's
/// "GPU KV cache size" is not such a line: its CPU backend prints it too.
fn accelerator_line(l: &Line<'_>) -> bool {
    PLATFORM_DETECTED
        .iter()
        .chain(V0_BLOCK_LINES.iter().filter(|k| !CPU_BACKEND.contains(k)))
        .any(|k| l.has(k))
}

/// vllm-ascend's line when it sets the block size (`vllm_ascend/utils.py`
/// `refresh_block_size`: "Block size is set to 128 if prefix cache or chunked prefill is
/// enabled.", logged only where it sets `cache_config.block_size = 128` because prefix
/// caching or chunked prefill is on): the block size the KV cache was sized with, whatever the
/// arguments asked for.
const ASCEND_BLOCK: &str = "Block size is set to";

/// vllm-ascend's profile result (`vllm_ascend/worker/worker_v1.py`
/// `NPUWorker.determine_available_memory`: `available_kv_cache_memory = int(total_npu_memory *
/// gpu_memory_utilization - peak_memory)`, the peak with the non-torch growth, then
/// `logger.info(f"Available memory: {available_kv_cache_memory}, total memory:
/// {total_npu_memory}")`): the worker's available KV memory and the device total, both in
/// bytes as the worker computed them (not rounded). The line marks an Ascend start-up, whose
/// block size is 128 unless the arguments set one (`vllm_ascend/platform.py`
/// `NPUPlatform.check_and_update_config`, `vllm_ascend/utils.py` `refresh_block_size`: a
/// `block_size` of `None` becomes 128).
const ASCEND_AVAILABLE: &str = "Available memory:";

/// vLLM's XPU worker up to the 0.1x releases profiles on its own (`v1/worker/xpu_worker.py`
/// `XPUWorker.determine_available_memory`, 0.9.2 to 0.10.2): "Before memory profiling run,
/// total GPU memory: X MB, model load takes Y MB, free gpu memory is Z MB." (the total and the
/// torch memory after loading, the weights) and "After memory profiling run, peak memory usage
/// is P MB,torch mem is T MB, non-torch mem is N MB, free gpu memory is F MB." (P the torch
/// peak plus the non-torch growth N where positive), MB being 2^20 bytes. The worker's KV
/// memory is `total * gpu_memory_utilization - P`: with the weights and N, the torch peak
/// increase is `P - N - weights`.
const XPU_BEFORE: &str = "Before memory profiling run, total GPU memory:";
const XPU_AFTER: &str = "After memory profiling run, peak memory usage is";
const ASCEND_TOTAL: &str = ", total memory:";

/// SGLang's lines at the end of one graph capture (see the reader), in either case.
const GRAPH_END: [&str; 4] = [
    "cuda graph end",
    "CUDA graph end",
    "npu graph end",
    "NPU graph end",
];

/// The lines that say a start-up captures no graphs (see [`LogFigures::no_graphs`]).
const NO_GRAPHS: [&str; 3] = [
    "Skipping CUDA graph capture",
    "\"cudagraph_mode\":0,",
    "'cudagraph_mode': <CUDAGraphMode.NONE",
];

/// Adds `model`, named by a pasted launch command at line `n`, unless a command already named
/// it (in any case: `Qwen/Qwen3-8B` and `qwen/qwen3-8b` are one model to the hub).
/// `seen` holds the names in `models` in lower case (a log of a million commands is read in
/// time linear in its size, not a search of every earlier command per line).
fn command_model(
    models: &mut Vec<(String, usize)>,
    seen: &mut HashSet<String>,
    model: &str,
    n: usize,
) {
    if seen.insert(model.to_ascii_lowercase()) {
        models.push((model.to_string(), n));
    }
}

/// Read the figures of an engine start-up log.
pub fn parse(text: &str) -> Result<LogFigures> {
    // Which engine wrote it: one scan of each line until it is clear (a vLLM log names its
    // available KV memory early).
    let mut found: Vec<(&'static str, usize)> = Vec::new();
    let (mut sglang, mut vllm, mut vllm_kv) = (false, false, false);
    for line in text.lines() {
        scan::keys_in(line, &mut found);
        for (k, _) in &found {
            match *k {
                "KV Cache is allocated" | "Load weight end" | "ServerArgs(" => sglang = true,
                "Available KV cache memory" | "larger than the available KV cache memory" => {
                    (vllm, vllm_kv) = (true, true)
                }
                "Model loading took"
                | "maximum number of tokens that can be stored in KV cache"
                | " GiB for weight"
                | "Memory profiling results"
                | "Loading model weights took"
                | "GPU KV cache size"
                | "Memory profiling takes"
                | "# GPU blocks"
                | "# CUDA blocks"
                | "Free memory on device"
                | "CUDA graph pool memory"
                | "Estimated CUDA graph memory"
                | "Maximum concurrency for"
                | XPU_BEFORE
                | XPU_AFTER => vllm = true,
                k if V0_BLOCK_LINES.contains(&k) || CPU_BACKEND.contains(&k) => vllm = true,
                _ => {}
            }
        }
        if vllm_kv {
            break;
        }
    }
    if !(sglang || vllm) {
        return Err(Error::param(
            Param::EngineLog,
            "found none of vLLM's \"Model loading took\" / \
             \"Available KV cache memory\" / \"GPU KV cache size\" / \"Memory profiling \
             results\" / \"CUDA graph pool memory\" lines nor SGLang's \"Load weight end\" / \"KV Cache is allocated\" lines",
        ));
    }
    let command = command::find(text)?;
    let mut f = LogFigures {
        engine: Some(if sglang && !vllm_kv {
            EngineKind::Sglang
        } else {
            EngineKind::Vllm
        }),
        ..LogFigures::default()
    };
    let mut peak_torch: Option<u64> = None;
    let mut says_subtracted = false;
    // A "W GiB for weight" report part was read (its other parts may follow on other lines).
    let mut weight_report = false;
    // Each process's own available KV memory, the first it prints (see below); `None` names
    // the unprefixed process.
    let mut rank_kv: Vec<(Option<&str>, u64, bool, usize)> = Vec::new();
    // Where each process's entry is in `rank_kv`: a log of a million worker lines is read
    // in time linear in its size, not a search of every earlier worker per line.
    let mut rank_at: HashMap<Option<&str>, usize> = HashMap::new();
    // Workers' KV lines Ray's de-duplication left out of the log.
    let mut folded: u64 = 0;
    // The line where a second start-up began, once workers have printed their figures: the
    // figures of every later process belong to that start-up, not to this one.
    let mut next_start_up: Option<usize> = None;
    // The model as the start-up banner (`█  model   Qwen/Qwen3-14B`) or V0's "Starting to
    // load model X..." names it: taken only where no argument or config line names one (those
    // name it as the engine resolved it), with the line.
    let mut banner_model: Option<(String, usize)> = None;
    // Every model a pasted launch command names (`vllm serve X`, `--model X`, `--model-path
    // X`), each once, with its line: taken where neither an argument, a config nor a banner
    // line names one; commands naming different models leave the choice to `--model`.
    let mut command_models: Vec<(String, usize)> = Vec::new();
    let mut command_seen: HashSet<String> = HashSet::new();
    // The models of `f.models`, to add each once without searching them.
    let mut models_seen: HashSet<String> = HashSet::new();
    // Whether the line before continues a launch command (`vllm serve \`, then the model and
    // flags on the lines after it), and whether that command's model is still to come.
    let (mut in_command, mut serve_pending) = (false, false);
    // The first line only the CPU backend prints, and the KV cache space it names.
    let mut cpu_backend: Option<usize> = None;
    let mut gpu_platform: Option<usize> = None;
    let mut cpu_space: Option<(String, usize)> = None;
    // An out-of-tree platform plugin other than the CPU's ("Platform plugin metal is
    // activated"): its lines are not the CPU backend's.
    let mut plugin = false;
    // The block size vllm-ascend set, with its line.
    let mut ascend_block: Option<(u32, usize)> = None;
    // SGLang's per-phase graph captures ("Capture target decode CUDA graph end. ... mem
    // usage=X GB"): the first rank's prefix, the sum, the count, the first line.
    let mut sglang_graphs: Option<(Option<&str>, u64, usize, usize)> = None;
    // The XPU worker's profile peak (see XPU_AFTER), with its line.
    let mut xpu_peak: Option<(u64, usize)> = None;
    // Every "KV cache size: N tokens" of the first start-up, with its line.
    let mut kv_size_lines: Vec<(u64, usize, Option<&str>)> = Vec::new();
    for (i, text) in text.lines().enumerate() {
        scan::keys_in(text, &mut found);
        // A launch command continued with `\` over several lines: its lines are the
        // command's, and the first word of the line after `vllm serve \` is its model.
        let continued = in_command;
        let launch = continued || scan::LAUNCHERS.iter().any(|k| text.contains(k));
        in_command = launch && text.trim_end().ends_with('\\');
        if continued && std::mem::take(&mut serve_pending) {
            if let Some(w) = text
                .split_whitespace()
                .next()
                .map(|w| w.trim_matches(['\'', '"']))
                .filter(|w| !w.is_empty() && !w.starts_with('-') && *w != "\\")
            {
                command_model(&mut command_models, &mut command_seen, w, i + 1);
            }
        }
        if next_start_up.is_none()
            && !rank_kv.is_empty()
            && found
                .iter()
                .any(|(k, _)| matches!(*k, "vLLM API server version " | "LLM engine (v"))
        {
            next_start_up = Some(i + 1);
        }
        // A pasted launch command's lines are read as a command (`command::find`), not as
        // the engine's: its flags are not the engine's printed arguments.
        if let Some(c) = command
            .as_ref()
            .filter(|c| (c.line..=c.last_line).contains(&(i + 1)))
        {
            if i + 1 == c.line {
                for m in &c.models {
                    command_model(&mut command_models, &mut command_seen, m, c.line);
                }
            }
            continue;
        }
        // Once a model is known, only start-up lines can name another (a server's request
        // lines name the served model on every request).
        let model_spent = f.model.is_some()
            && !(scan::has_model_key(&found)
                && (text.contains("non-default args")
                    || text.contains(" with config:")
                    || text.contains("ServerArgs(")));
        if !scan::worth_reading(&found, f.version.is_some(), model_spent) {
            continue;
        }
        let l = Line {
            n: i + 1,
            text,
            found: Some(&found),
        };
        let n = l.n;
        if f.date.is_none() {
            if let Some(d) = stamp_date(l.text) {
                f.date = Some(d);
                f.lines.push(("date", n));
            }
        }
        let lines = &mut f.lines;
        if cpu_backend.is_none() && CPU_BACKEND.iter().any(|k| l.has(k)) {
            cpu_backend = Some(n);
        }
        if gpu_platform.is_none() && accelerator_line(&l) {
            gpu_platform = Some(n);
        }
        if l.has("Platform plugin ") && !l.text.contains("Platform plugin cpu ") {
            plugin = true;
        }
        if let Some(i) = l
            .find("VLLM_CPU_KVCACHE_SPACE")
            .filter(|_| cpu_space.is_none())
        {
            let rest = Line::part(n, &l.text[i..]);
            let space = match (rest.token("using "), rest.token("Using ")) {
                (Some((v, _)), _) => Some(format!("{v} GiB, the default")),
                (None, Some((v, _))) => Some(format!("{v} GiB")),
                _ => None,
            };
            cpu_space = space.map(|s| (s, n));
        }
        if ascend_block.is_none() && l.has(ASCEND_BLOCK) {
            if let Some(b) = l.count(ASCEND_BLOCK, "block_size", u64::from(limits::MAX_BLOCK))? {
                ascend_block = Some((b as u32, n));
            }
        }
        // The release.
        if f.version.is_none() {
            for key in scan::RELEASE {
                if let Some(i) = l.find(key) {
                    let v: String = l.text[i + key.len()..]
                        .trim_start_matches([' ', '*', '`'])
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+'))
                        .collect();
                    if is_version(&v) && v.len() <= 64 {
                        f.version = Some(v);
                        lines.push(("version", n));
                        break;
                    }
                }
            }
        }
        // The device: "Free memory on device [cuda:0 ](F/T GiB) on startup".
        if let Some(i) = l.find("Free memory on device") {
            let rest = &l.text[i..];
            if let Some(p) = rest.find('(') {
                let inner = Line::part(n, &rest[p..]);
                let free = inner.bytes("(", "free device memory")?;
                let total = match rest[p..].find('/') {
                    Some(s) => Line::part(n, &rest[p + s..]).bytes("/", "device total")?,
                    None => None,
                };
                if let (Some(fr), Some(t)) = (free, total) {
                    if t == 0 {
                        return Err(bad(n, "device total 0 GiB".into()));
                    }
                    if fr > t {
                        return Err(bad(
                            n,
                            format!(
                                "free device memory {} is more than the device total {}",
                                fmt_bytes(fr),
                                fmt_bytes(t)
                            ),
                        ));
                    }
                }
                set(&mut f.free, free, lines, "free", n);
                set(&mut f.total, total, lines, "total", n);
            }
            // The refusal's wording ("... on startup is less than desired GPU memory
            // utilization (U, X GiB)"), not the start-up's report of the same figures.
            if l.has("desired GPU memory utilization")
                && l.text.contains("less than desired GPU memory utilization")
                && f.refused_free.is_none()
            {
                f.refused_free = Some(n);
                f.notes.push(format!(
                    "line {n}: the engine refused to start: less memory was free at start-up than its utilisation of the total asks for"
                ));
            }
            set(
                &mut f.utilization,
                l.fraction("utilization is", "gpu_memory_utilization")?,
                lines,
                "utilization",
                n,
            );
            set(
                &mut f.utilization,
                l.fraction("desired GPU memory utilization", "gpu_memory_utilization")?,
                lines,
                "utilization",
                n,
            );
        }
        // The same report's parts where a paste wrapped them onto lines of their own.
        set(
            &mut f.utilization,
            l.fraction(
                "Desired GPU memory utilization is",
                "gpu_memory_utilization",
            )?,
            lines,
            "utilization",
            n,
        );
        // vLLM's XPU worker's profile lines (see XPU_BEFORE).
        if let Some(i) = l.find(XPU_BEFORE) {
            let rest = Line::part(n, &l.text[i..]);
            let total = rest.bytes("total GPU memory:", "device total")?;
            if total == Some(0) {
                return Err(bad(n, "device total 0 MB".into()));
            }
            set(&mut f.total, total, lines, "total", n);
            set(
                &mut f.weights,
                rest.bytes("model load takes", "weights")?,
                lines,
                "weights",
                n,
            );
        }
        if let Some(i) = l.find(XPU_AFTER) {
            let rest = Line::part(n, &l.text[i..]);
            if let Some(p) = rest.bytes("peak memory usage is", "peak memory")? {
                xpu_peak.get_or_insert((p, n));
            }
            match rest.bytes_signed("non-torch mem is", "non-torch memory")? {
                Some((b, _)) if b > 0 => {
                    set(&mut f.non_torch, Some(b as u64), lines, "non_torch", n)
                }
                _ => {}
            }
        }
        // vllm-ascend's "Available memory: N, total memory: T" (bytes; see ASCEND_AVAILABLE).
        let mut ascend_kv = None;
        if let Some(i) = l.find(ASCEND_AVAILABLE) {
            let rest = Line::part(n, &l.text[i..]);
            if rest.text.contains(ASCEND_TOTAL) {
                // `int(total * utilization - peak)` goes below 0 where the peak passed the
                // budget: no room for a KV cache, as a 0 says.
                let below_zero = rest.token(ASCEND_AVAILABLE).is_some_and(|(tok, _)| {
                    tok.len() > 1
                        && tok.starts_with('-')
                        && tok[1..].chars().all(|c| c.is_ascii_digit())
                });
                let avail = if below_zero {
                    Some(0)
                } else {
                    rest.plain_bytes(ASCEND_AVAILABLE, "available KV cache memory")?
                };
                let total = rest.plain_bytes(ASCEND_TOTAL, "device total")?;
                if let (Some(av), Some(t)) = (avail, total) {
                    if t == 0 {
                        return Err(bad(n, "device total 0 bytes".into()));
                    }
                    if av > t {
                        return Err(bad(
                            n,
                            format!(
                                "available KV cache memory {} is more than the device total {}",
                                fmt_bytes(av),
                                fmt_bytes(t)
                            ),
                        ));
                    }
                    set(&mut f.total, Some(t), lines, "total", n);
                    if av == 0 {
                        let figure = if below_zero { "below 0" } else { "0 bytes" };
                        f.notes.push(format!(
                            "line {n}: available KV cache memory {figure}: that start-up had no room for a KV cache"
                        ));
                    } else {
                        if f.kv_available.is_none() {
                            f.kv_available_rounding = Some(0);
                        }
                        set(&mut f.kv_available, Some(av), lines, "kv_available", n);
                        ascend_kv = Some(av);
                    }
                    if !lines.iter().any(|(k, _)| *k == "npu") {
                        lines.push(("npu", n));
                        f.notes.push(format!(
                            "line {n}: an Ascend NPU start-up (vllm-ascend's worker prints its available KV memory and the device total in bytes): memplan's rules are vLLM's on CUDA, ROCm and XPU, so its defaults and graph reserve are not that worker's; the figures the log prints are used as printed"
                        ));
                    }
                }
            }
        }
        match l.bytes("Current kv cache memory in use is", "KV cache memory")? {
            Some(0) => f.notes.push(format!(
                "line {n}: KV cache memory in use 0 bytes: that start-up had no room for a KV cache"
            )),
            b => set(&mut f.kv_available, b, lines, "kv_available", n),
        }
        for key in ["total_gpu_memory", "total_memory="] {
            let t = l.bytes(key, "device total")?;
            if t == Some(0) {
                return Err(bad(n, "device total 0 GiB".into()));
            }
            set(&mut f.total, t, lines, "total", n);
        }
        // Utilisation, resolved first ("The current --gpu-memory-utilization=0.9200 is").
        set(
            &mut f.utilization,
            l.fraction(
                "current --gpu-memory-utilization=",
                "gpu_memory_utilization",
            )?,
            lines,
            "utilization",
            n,
        );
        if !l.has("equivalent to --gpu-memory-utilization") || l.has("current --gpu") {
            set(
                &mut f.utilization,
                l.fraction("gpu_memory_utilization", "gpu_memory_utilization")?,
                lines,
                "utilization",
                n,
            );
        }
        set(
            &mut f.utilization,
            l.fraction("mem_fraction_static", "mem_fraction_static")?,
            lines,
            "utilization",
            n,
        );
        if l.has("CUDA graph memory profiling is enabled") {
            says_subtracted = true;
            set(
                &mut f.utilization_without_graphs,
                l.fraction(
                    "equivalent to --gpu-memory-utilization=",
                    "gpu_memory_utilization",
                )?,
                lines,
                "utilization_without_graphs",
                n,
            );
        }
        // vLLM 0.19 (`v1/worker/gpu_worker.py` `determine_available_memory`): "In v0.19, CUDA
        // graph memory profiling will be enabled by default ... increase
        // --gpu-memory-utilization from U to V to maintain the same effective KV cache size".
        if l.has("increase --gpu-memory-utilization from") {
            let key = "increase --gpu-memory-utilization from";
            let u = l.fraction(key, "gpu_memory_utilization")?;
            let v = match l.find(key) {
                Some(i) => match l.text[i + key.len()..].find(" to ") {
                    Some(t) => Line::part(n, &l.text[i + key.len() + t..])
                        .fraction(" to ", "gpu_memory_utilization with graph profiling")?,
                    None => None,
                },
                None => None,
            };
            set(&mut f.utilization, u, lines, "utilization", n);
            set(
                &mut f.utilization_with_graphs,
                v,
                lines,
                "utilization_with_graphs",
                n,
            );
        }
        // The post-start report (0.26+): "Actual usage is C GiB for consumed memory".
        if l.has("for consumed memory") {
            set(
                &mut f.consumed,
                l.bytes("Actual usage is", "consumed memory")?,
                lines,
                "consumed",
                n,
            );
        }
        // The same report before the consumed accounting, as vLLM V1 printed it up to the
        // 0.26 releases (`v1/worker/gpu_worker.py` `compile_or_warm_up_model`: "Actual usage
        // is {W} GiB for weight, {A} GiB for peak activation, {N} GiB for non-torch memory,
        // and {G} GiB for CUDAGraph memory", W = `model_memory_usage`, A =
        // `peak_activation_memory` = the profile's `torch_peak_increase`, N =
        // `non_torch_increase`, G = what `capture_model` took), and as vllm-ascend's
        // `NPUWorker` prints it ("Actual usage: W GiB for weights, ..., G GiB for NPU graph
        // memory"). The figure comes before its name; a paste may wrap the parts onto lines
        // of their own. The consumed report's "peak activation" (0.27+, above) is another
        // figure (the transient peak plus the graph estimate), so it is read only after a
        // "for weight" part.
        if let Some(w) = gib_before(&l, " GiB for weight", "weights")? {
            if w < 0 {
                return Err(bad(n, format!("weights {} is negative", fmt_signed(w))));
            }
            if !weight_report {
                lines.push(("weight_report", n));
            }
            weight_report = true;
            set(&mut f.weights, Some(w as u64), lines, "weights", n);
        }
        if weight_report && !l.has("for consumed memory") {
            match gib_before(&l, " GiB for peak activation", "activation peak")? {
                Some(a) if a < 0 => {
                    return Err(bad(
                        n,
                        format!("activation peak {} is negative", fmt_signed(a)),
                    ))
                }
                Some(a) => set(&mut f.activation, Some(a as u64), lines, "activation", n),
                None => {}
            }
            match gib_before(&l, " GiB for non-torch memory", "non-torch memory")? {
                Some(b) if b < 0 => f.notes.push(format!(
                    "line {n}: non-torch memory {} (the profile run freed memory it had not allocated): not used",
                    fmt_signed(b)
                )),
                Some(b) => set(&mut f.non_torch, Some(b as u64), lines, "non_torch", n),
                None => {}
            }
            if l.has(" GiB for NPU graph memory") && !lines.iter().any(|(k, _)| *k == "npu") {
                lines.push(("npu", n));
                f.notes.push(format!(
                    "line {n}: an Ascend NPU start-up (vllm-ascend's worker): memplan's rules are vLLM's on CUDA, ROCm and XPU, so its defaults and graph reserve are not that worker's; the figures the log prints are used as printed"
                ));
            }
            for key in [" GiB for CUDAGraph memory", " GiB for NPU graph memory"] {
                match gib_before(&l, key, "graph memory")? {
                    Some(b) if b < 0 => f.notes.push(format!(
                        "line {n}: the graph pool measured {} (capture freed memory): not used",
                        fmt_signed(b)
                    )),
                    Some(b) => set(
                        &mut f.graph_actual,
                        Some(b as u64),
                        lines,
                        "graph_actual",
                        n,
                    ),
                    None => {}
                }
            }
        }
        // Weights.
        if let Some(i) = l.find("Load weight end") {
            let part = Line::part(n, &l.text[i..]);
            let w = part.bytes("mem usage", "weights")?;
            set(&mut f.weights, w, lines, "weights", n);
            let free = part.bytes("avail mem", "free device memory")?;
            set(
                &mut f.free_after_weights,
                free,
                lines,
                "free_after_weights",
                n,
            );
        }
        for key in [
            "Model loading took",
            "Loading model weights took",
            "model weights take",
            "weights memory:",
        ] {
            set(
                &mut f.weights,
                l.bytes(key, "weights")?,
                lines,
                "weights",
                n,
            );
        }
        // Activation, non-torch, consumed, non-KV.
        for key in [
            "torch peak memory increase:",
            "PyTorch activation peak memory takes",
            "PyTorch activation peak memory",
        ] {
            set(
                &mut f.activation,
                l.bytes(key, "activation peak")?,
                lines,
                "activation",
                n,
            );
        }
        if let Some(p) = l.bytes("peak_torch_memory=", "torch peak memory")? {
            peak_torch.get_or_insert(p);
        }
        // The profile result as vLLM printed it before the consumed accounting (0.27).
        if l.has("non-torch forward increase memory:")
            && !lines.iter().any(|(k, _)| *k == "non_torch_increase")
        {
            lines.push(("non_torch_increase", n));
        }
        // (A memory snapshot's `non_torch_memory=` is the context's, not growth.)
        for key in [
            "non-torch forward increase memory:",
            "non_torch_memory takes",
            "non_torch_memory",
        ]
        .into_iter()
        .filter(|_| !l.has("snapshot"))
        {
            set(
                &mut f.non_torch,
                l.bytes(key, "non-torch memory")?,
                lines,
                "non_torch",
                n,
            );
        }
        set(
            &mut f.consumed,
            l.bytes("total consumed (from mem_get_info):", "total consumed")?,
            lines,
            "consumed",
            n,
        );
        set(
            &mut f.non_kv,
            l.bytes("Total non KV cache memory:", "non-KV-cache memory")?,
            lines,
            "non_kv",
            n,
        );
        // Graph memory.
        set(
            &mut f.graph_estimate,
            l.bytes("Estimated CUDA graph memory:", "CUDA graph estimate")?,
            lines,
            "graph_estimate",
            n,
        );
        if let Some(i) = l.find("CUDA graph pool memory:") {
            let rest = Line::part(n, &l.text[i..]);
            let taken = rest.bytes_signed("CUDA graph pool memory:", "CUDA graph pool memory")?;
            set_graph_actual(
                &mut f.graph_actual,
                &mut f.notes,
                lines,
                n,
                taken,
                "the graph pool",
            );
            if let Some(j) = rest.text.find("(actual),") {
                let e = Line::part(n, &rest.text[j..]).bytes("(actual),", "CUDA graph estimate")?;
                set(&mut f.graph_estimate, e, lines, "graph_estimate", n);
            }
        }
        if let Some(i) = l.find("Graph capturing finished") {
            let rest = Line::part(n, &l.text[i..]);
            let taken = rest.bytes_signed("took", "graph memory")?;
            set_graph_actual(
                &mut f.graph_actual,
                &mut f.notes,
                lines,
                n,
                taken,
                "graph capture",
            );
        }
        // SGLang captures a graph per runner phase and prints one line each when it ends, with
        // the memory the capture took: 0.5.9 `srt/model_executor/model_runner.py`
        // `init_device_graphs` ("Capture cuda graph end. Time elapsed: X s. mem usage=Y GB";
        // "npu graph" on Ascend) and `init_piecewise_cuda_graphs` ("Capture piecewise CUDA
        // graph end. ..."), its speculative workers (`srt/speculative/eagle_worker.py`:
        // "Capture draft cuda graph end", "Capture draft extend cuda graph end"), and later
        // releases "Capture target decode CUDA graph end. elapsed=X s, mem usage=Y GB" per
        // phase (target prefill, decode, verify; draft decode and extend once per rung of an
        // adaptive ladder). A rank's graph memory is their sum, as SGLang's own boot-log reader
        // takes it (`srt/planner/graphmem.py` `summarize_captures`); the first rank that prints
        // one is read.
        if GRAPH_END.iter().any(|k| l.has(k)) && l.has("mem usage") && l.text.contains("Capture ") {
            let rank = sglang_rank(text);
            let end = GRAPH_END.iter().filter_map(|k| l.find(k)).min();
            if let Some(i) = end {
                let rest = Line::part(n, &l.text[i..]);
                match rest.bytes_signed("mem usage", "graph memory")? {
                    Some((b, _)) if b < 0 => f.notes.push(format!(
                        "line {n}: graph capture measured {} (capture freed memory): not used",
                        fmt_signed(b)
                    )),
                    Some((b, _)) => match &mut sglang_graphs {
                        None => sglang_graphs = Some((rank, b as u64, 1, n)),
                        Some((r, sum, count, _)) if *r == rank => {
                            *sum = sum.saturating_add(b as u64);
                            *count += 1;
                        }
                        Some(_) => {}
                    },
                    None => {}
                }
            }
        }
        // The compile cache, as it stood when the profile run compiled: only lines before the
        // available KV memory count (graphs of single sizes compile after the KV cache is
        // sized, in `compile_or_warm_up_model`).
        if f.kv_available.is_none() {
            if l.has("Compiling a graph for") {
                if f.compile_cache != Some(CompileCache::Cold) {
                    f.compile_cache = Some(CompileCache::Cold);
                    lines.retain(|(k, _)| *k != "compile_cache");
                    lines.push(("compile_cache", n));
                }
            } else if (l.has("Directly load the compiled graph")
                || l.has("Directly load AOT compilation"))
                && f.compile_cache.is_none()
            {
                f.compile_cache = Some(CompileCache::Warm);
                lines.push(("compile_cache", n));
            }
        }
        // Available KV memory (negative in a start-up that failed).
        // vLLM's refusal when one request of `max_model_len` does not fit
        // (`v1/core/kv_cache_utils.py` `_check_enough_kv_cache_memory`: "... which is larger
        // than the available KV cache memory (X GiB)") states the same figure.
        for key in [
            "Available KV cache memory:",
            "larger than the available KV cache memory",
            "available_kv_cache_memory",
            "the rest of the memory reserved for KV Cache is",
            "kv_cache_size=",
        ] {
            // 0 (or a figure that rounds to no byte) is the same failed start-up as a
            // negative one: vLLM refuses to start with no memory for the cache blocks
            // (`_check_enough_kv_cache_memory`), so it sizes nothing to reproduce.
            match l.bytes_signed(key, "available KV cache memory")? {
                Some((b, _)) if b <= 0 => f.notes.push(format!(
                    "line {n}: available KV cache memory {}: that start-up had no room for a KV cache",
                    if b == 0 { "0 B".to_string() } else { fmt_signed(b) }
                )),
                Some((b, _)) => set(&mut f.kv_available, Some(b as u64), lines, "kv_available", n),
                None => {}
            }
        }
        // A worker's own figure ("(Worker_TP1 pid=..) ... Current kv cache memory in use is X
        // GiB", "(RayWorkerWrapper pid=.., ip=..) ... the rest of the memory reserved for KV
        // Cache is X GiB", a V0 driver's unprefixed line): with several workers vLLM sizes
        // every worker by the fewest blocks (V1: `v1/core/kv_cache_planning.py`
        // `get_kv_cache_configs`; V0: `executor/executor_base.py`
        // `determine_num_available_blocks`, the minimum over workers), so the smallest
        // process's figure is the one the logged KV cache follows (taken after the loop).
        if next_start_up.is_none()
            && (l.has("Available KV cache memory:")
                || l.has("Current kv cache memory in use is")
                || l.has("the rest of the memory reserved for KV Cache is")
                || ascend_kv.is_some())
        {
            let process = process_of(text);
            // The figure in bytes where the line prints it so (vllm-ascend's; vLLM 0.10's
            // "Current kv cache memory in use is N bytes", `v1/worker/gpu_worker.py`
            // `compile_or_warm_up_model`: `int(self.available_kv_cache_memory_bytes)`), else the
            // figure as rounded.
            let mut b = ascend_kv.map(|b| (i128::from(b), true));
            for key in [
                "Available KV cache memory:",
                "the rest of the memory reserved for KV Cache is",
                "Current kv cache memory in use is",
            ] {
                if b.is_none() {
                    b = l
                        .bytes_signed(key, "KV cache memory")?
                        .map(|(b, unit)| (b, unit.trim_start().starts_with("bytes")));
                }
            }
            match (rank_at.get(&process).map(|&at| &mut rank_kv[at]), b) {
                (None, Some((b, exact))) if b > 0 => {
                    rank_at.insert(process, rank_kv.len());
                    rank_kv.push((process, b as u64, exact, n));
                }
                // A process's own figure in bytes after its rounded one: the same figure,
                // unrounded, where it lies within the rounding.
                (Some(kv), Some((b, true)))
                    if !kv.2 && b > 0 && (b as u64).abs_diff(kv.1) <= GIB / 200 =>
                {
                    *kv = (process, b as u64, true, n);
                }
                // The same process printing another figure: no plan can follow both.
                (Some(kv), Some((b, true))) if !kv.2 && b > 0 => {
                    f.notes.push(format!(
                        "line {n}: KV cache memory {} in bytes is not the {} the same process printed rounded before it (more than its 0.01 GiB apart): the rounded figure is kept",
                        fmt_bytes(b as u64),
                        fmt_bytes(kv.1)
                    ));
                }
                _ => {}
            }
            if let Some(k) = ray_folded(text) {
                folded = folded.saturating_add(k);
            }
        }
        // The refusals when one request of `max_model_len` does not fit. V0
        // (`worker/worker.py` `raise_if_cache_size_invalid`): "The model's max seq len
        // ({max_model_len}) is larger than the maximum number of tokens that can be stored in
        // KV cache ({block_size * num_gpu_blocks})": the KV tokens of every block. V1
        // (`v1/core/kv_cache_utils.py` `_check_enough_kv_cache_memory`): "To serve at least
        // one request with the model's max seq len ({max_model_len}), ({needed} GiB KV cache
        // is needed, which is larger than the available KV cache memory ({available} GiB).
        // Based on the available memory, the estimated maximum model length is {len}." (the
        // available memory is read above).
        if l.has("maximum number of tokens that can be stored in KV cache") {
            set(
                &mut f.kv_tokens,
                l.count(
                    "maximum number of tokens that can be stored in KV cache",
                    "KV cache tokens",
                    limits::MAX_KV_TOKENS,
                )?,
                lines,
                "kv_tokens",
                n,
            );
        }
        // (Only the refusals print "max seq len (": a terminal may wrap the rest of the
        // sentence onto the next line.)
        if l.has("max seq len (") {
            set(
                &mut f.max_model_len,
                l.count("max seq len (", "max_model_len", limits::MAX_MODEL_LEN)?,
                lines,
                "max_model_len",
                n,
            );
            if f.refused.is_none() {
                f.refused = Some(n);
                let fits = l
                    .count(
                        "estimated maximum model length is",
                        "estimated maximum model length",
                        limits::MAX_MODEL_LEN,
                    )?
                    .map(|m| format!("; the engine estimated that {m} tokens fit"))
                    .unwrap_or_default();
                f.notes.push(format!(
                    "line {n}: the engine refused to start: one request of max_model_len does not fit its KV cache{fits}"
                ));
            }
        }
        if f.legacy_line.is_none()
            && [
                "Memory profiling results",
                "the rest of the memory reserved for KV Cache is",
                "Loading model weights took",
                "maximum number of tokens that can be stored in KV cache",
            ]
            .iter()
            .chain(&V0_BLOCK_LINES)
            .any(|k| l.has(k))
        {
            f.legacy_line = Some(n);
        }
        // KV tokens, blocks, concurrency.
        // "GPU KV cache size: N tokens" ("XPU ...", "GPU + host ..." on other pools).
        if l.has(" tokens") {
            let t = l.count("KV cache size:", "KV cache tokens", limits::MAX_KV_TOKENS)?;
            if let Some(t) = t.filter(|_| next_start_up.is_none()) {
                kv_size_lines.push((t, n, process_of(text)));
            }
            set(&mut f.kv_tokens, t, lines, "kv_tokens", n);
        }
        if let Some(i) = l.find("Extended KV cache to") {
            let rest = Line::part(n, &l.text[i..]);
            set(
                &mut f.kv_final,
                rest.bytes("blocks (", "extended KV cache")?,
                lines,
                "kv_final",
                n,
            );
        }
        if l.has("Memory after warmup:") {
            if let Some(i) = l.text.find(" free, ") {
                let rest = Line::part(n, &l.text[i..]);
                set(
                    &mut f.kv_final,
                    rest.bytes(" free, ", "committed KV cache")?,
                    lines,
                    "kv_final",
                    n,
                );
            }
        }
        if l.has("KV Cache is allocated") {
            set(
                &mut f.kv_tokens,
                l.count("#tokens:", "KV cache tokens", limits::MAX_KV_TOKENS)?,
                lines,
                "kv_tokens",
                n,
            );
            // SGLang's pool: "K size: X GB, V size: Y GB" (2^30 figures) is its KV memory.
            if let (Some(k), Some(v)) = (
                l.bytes("K size:", "K cache size")?,
                l.bytes("V size:", "V cache size")?,
            ) {
                if f.kv_available.is_none() {
                    // Two figures of 0.01 GB each: their sum is known to 0.01 GB.
                    f.kv_available_rounding = Some(GIB / 100);
                }
                set(
                    &mut f.kv_available,
                    Some(k.saturating_add(v)),
                    lines,
                    "kv_available",
                    n,
                );
            }
            // Its MLA pool (DeepSeek, Kimi: one latent per token) and the pools built like it
            // print one figure (`mem_cache/memory_pool.py` `MLATokenToKVPool.__init__`: "KV
            // Cache is allocated. #tokens: {size}, KV size: {kv_size / GB:.2f} GB").
            set(
                &mut f.kv_available,
                l.bytes("KV size:", "KV cache size")?,
                lines,
                "kv_available",
                n,
            );
        }
        // A count of 0 is a start-up with no room for a KV cache.
        for key in V0_BLOCK_LINES
            .into_iter()
            .chain(["Extended KV cache to", "num_gpu_blocks is:"])
        {
            if l.has(key) && l.token(key).is_some_and(|(t, _)| t == "0") {
                f.notes.push(format!(
                    "line {n}: 0 KV cache blocks: that start-up had no room for a KV cache"
                ));
                continue;
            }
            set(
                &mut f.kv_blocks,
                l.count(key, "KV cache blocks", limits::MAX_KV_TOKENS)?,
                lines,
                "kv_blocks",
                n,
            );
        }
        if let Some(i) = l.find("Maximum concurrency for") {
            let rest = Line::part(n, &l.text[i..]);
            let len = rest.count(
                "Maximum concurrency for",
                "max_model_len",
                limits::MAX_MODEL_LEN,
            )?;
            set(&mut f.max_model_len, len, lines, "max_model_len", n);
            if let Some((tok, _)) = token(rest.text, "tokens per request:") {
                let x: f64 = tok
                    .parse()
                    .map_err(|_| bad(n, format!("maximum concurrency {tok:?} is not a number")))?;
                if !(x.is_finite() && x >= 0.0 && x <= limits::MAX_KV_TOKENS as f64) {
                    return Err(bad(n, format!("maximum concurrency {tok} is out of range")));
                }
                set(&mut f.max_concurrency, Some(x), lines, "max_concurrency", n);
            }
        }
        // Settings (non-default args, engine config, SGLang ServerArgs).
        // vLLM's `max_model_len=-1` asks the engine to fit the longest length: not a figure.
        let auto_len = l.has("'max_model_len': -1") || l.has("max_model_len=-1");
        for key in ["'max_model_len'", "max_seq_len", "context_len"]
            .into_iter()
            .filter(|_| !auto_len)
        {
            set(
                &mut f.max_model_len,
                l.count(key, "max_model_len", limits::MAX_MODEL_LEN)?,
                lines,
                "max_model_len",
                n,
            );
        }
        for key in ["'max_num_batched_tokens'", "max_num_batched_tokens"] {
            set(
                &mut f.max_num_batched_tokens,
                l.count(key, "max_num_batched_tokens", limits::MAX_BATCHED_TOKENS)?,
                lines,
                "max_num_batched_tokens",
                n,
            );
        }
        for key in [
            "Defaulting max_num_seqs to",
            "'max_num_seqs'",
            "max_num_seqs",
        ] {
            set(
                &mut f.max_num_seqs,
                l.count(key, "max_num_seqs", limits::MAX_NUM_SEQS)?,
                lines,
                "max_num_seqs",
                n,
            );
        }
        let sglang_args = l.has("ServerArgs(") || l.has("server_args=");
        for key in ["'block_size'", "block_size", "page_size"] {
            if key == "page_size" && !sglang_args {
                continue;
            }
            let b = l.count(key, "block_size", u64::from(limits::MAX_BLOCK))?;
            set(
                &mut f.block_size,
                b.map(|b| b as u32),
                lines,
                "block_size",
                n,
            );
        }
        for key in ["'tensor_parallel_size'", "tensor_parallel_size", "tp_size"] {
            set(
                &mut f.tensor_parallel,
                l.count(key, "tensor_parallel_size", limits::MAX_TP)?,
                lines,
                "tensor_parallel",
                n,
            );
        }
        let mut named = None;
        for key in ["'model':", "model=", "model_path="] {
            if named.is_none() && l.has(key) && token_boundary(l.text, key) {
                named = l.word(key)?;
            }
        }
        if let Some(m) = named {
            if f.model.is_none() || !model_spent {
                set(&mut f.model, Some(m.clone()), lines, "model", n);
                if models_seen.insert(m.clone()) {
                    f.models.push(m);
                    lines.push(("models", n));
                }
            }
        }
        for key in scan::BANNER_MODEL {
            let command = key == "vllm serve " || scan::COMMAND_MODEL.contains(&key);
            if !l.has(key) || (command && !launch) || (!command && banner_model.is_some()) {
                continue;
            }
            let word = l.word(key)?;
            if key == "vllm serve " && word.as_deref() == Some("\\") {
                serve_pending = true;
            }
            let Some(w) = word
                .map(|w| w.trim_end_matches('.').to_string())
                .filter(|w| !w.is_empty() && !w.starts_with('-') && w != "\\")
            else {
                continue;
            };
            if command {
                command_model(&mut command_models, &mut command_seen, &w, n);
            } else {
                banner_model = Some((w, n));
            }
        }
        for key in ["'kv_cache_dtype':", "kv_cache_dtype="] {
            set(
                &mut f.kv_cache_dtype,
                l.word(key)?,
                lines,
                "kv_cache_dtype",
                n,
            );
        }
        for key in ["'mamba_cache_dtype':", "mamba_cache_dtype="] {
            set(
                &mut f.mamba_cache_dtype,
                l.word(key)?,
                lines,
                "mamba_cache_dtype",
                n,
            );
        }
        for key in ["'mamba_ssm_cache_dtype':", "mamba_ssm_cache_dtype="] {
            set(
                &mut f.mamba_ssm_cache_dtype,
                l.word(key)?,
                lines,
                "mamba_ssm_cache_dtype",
                n,
            );
        }
        for key in ["'quantization':", "quantization="] {
            set(&mut f.quantization, l.word(key)?, lines, "quantization", n);
        }
        if f.no_graphs.is_none() && NO_GRAPHS.iter().any(|k| l.has(k)) {
            f.no_graphs = Some(n);
            lines.push(("no_graphs", n));
        }
        for key in ["'enable_prefix_caching':", "enable_prefix_caching="] {
            let e = l.word(key)?.map(|w| w.eq_ignore_ascii_case("true"));
            set(
                &mut f.enable_prefix_caching,
                e,
                lines,
                "enable_prefix_caching",
                n,
            );
        }
        for key in [
            "'pipeline_parallel_size'",
            "pipeline_parallel_size",
            "pp_size",
        ] {
            set(
                &mut f.pipeline_parallel,
                l.count(key, "pipeline_parallel_size", limits::MAX_TP)?,
                lines,
                "pipeline_parallel",
                n,
            );
        }
        for key in ["'enforce_eager':", "enforce_eager=", "disable_cuda_graph="] {
            let e = l.word(key)?.map(|w| w.eq_ignore_ascii_case("true"));
            set(&mut f.enforce_eager, e, lines, "enforce_eager", n);
        }
    }
    // A pasted launch command gives what the engine's own lines do not.
    if let Some(c) = &command {
        command::merge(&mut f, c);
    }
    if let (Some(cpu), Some(gpu)) = (cpu_backend, gpu_platform) {
        f.notes.push(format!(
            "line {cpu}: a line of vLLM's CPU backend, beside an accelerator's start-up (line {gpu}): the accelerator's is planned"
        ));
    }
    let cpu_backend = cpu_backend.filter(|_| gpu_platform.is_none());
    if let Some(n) = cpu_backend.filter(|_| f.engine == Some(EngineKind::Vllm) && !plugin) {
        let space = match &cpu_space {
            Some((s, at)) => format!("{s} (line {at})"),
            None => "the size VLLM_CPU_KVCACHE_SPACE sets (not printed in this log)".into(),
        };
        let blocks = match (f.kv_blocks, f.kv_tokens) {
            (Some(b), _) => format!(
                ": this start-up's {b} blocks (line {})",
                f.line("kv_blocks").unwrap_or(0)
            ),
            (None, Some(t)) => format!(
                ": this start-up's {t} KV tokens (line {})",
                f.line("kv_tokens").unwrap_or(0)
            ),
            (None, None) => String::new(),
        };
        return Err(bad(
            n,
            format!(
                "a vLLM CPU-backend start-up: its KV cache is the fixed host-memory space VLLM_CPU_KVCACHE_SPACE, {space}, not a share of a GPU's memory, and memplan plans GPU memory; vLLM makes that space `space // bytes per block` KV blocks (V0 `worker/cpu_worker.py` `CPUWorker.determine_num_available_blocks`; V1 `v1/worker/cpu_worker.py` `CPUWorker.determine_available_memory`){blocks}"
            ),
        ));
    }
    if let Some((b, n)) = ascend_block {
        if f.block_size.is_some_and(|own| own != b) {
            f.notes.push(format!(
                "line {}: block size {} in the arguments; vllm-ascend set it to {b} (line {n})",
                f.line("block_size").unwrap_or(0),
                f.block_size.unwrap_or(0)
            ));
        }
        f.block_size = Some(b);
        f.lines.retain(|(k, _)| *k != "block_size");
        f.lines.push(("block_size", n));
        if f.line("npu").is_none() {
            f.lines.push(("npu", n));
            f.notes.push(format!(
                "line {n}: an Ascend NPU start-up (vllm-ascend set the block size to {b}, `vllm_ascend/utils.py` `refresh_block_size`): memplan's rules are vLLM's on CUDA, ROCm and XPU, so its defaults and graph reserve are not that worker's; the figures the log prints are used as printed, with its {b}-token blocks"
            ));
        }
    }
    // An Ascend start-up whose log sets no block size: vllm-ascend's 128
    // (`vllm_ascend/platform.py` `NPUPlatform.check_and_update_config` and
    // `vllm_ascend/utils.py` `refresh_block_size`: a `block_size` of `None` becomes 128).
    if f.block_size.is_none() {
        if let Some(n) = f.line("npu") {
            f.block_size = Some(128);
            f.lines.push(("block_size", n));
            f.notes.push(format!(
                "block size 128: vllm-ascend's default where the arguments set none (`vllm_ascend/platform.py` `check_and_update_config`, `vllm_ascend/utils.py` `refresh_block_size`; the start-up at line {n} is Ascend's)"
            ));
        }
    }
    if f.models.is_empty() {
        // The engine's banner names what it loaded; else the pasted commands, every model
        // they name (two of them: `--model` picks, see `LogFigures::models`).
        let named = match banner_model {
            Some(b) => vec![b],
            None => command_models,
        };
        if let Some((m, n)) = named.first() {
            f.model = Some(m.clone());
            f.lines.push(("model", *n));
            f.lines.push(("models", *n));
        }
        f.models.extend(named.into_iter().map(|(m, _)| m));
    }
    if let Some(&(process, min, exact, at)) = rank_kv.iter().min_by_key(|(_, b, ..)| *b) {
        let several = rank_kv.len() > 1;
        // The smallest worker's figure; where it is printed in bytes, that figure unrounded
        // (also for one worker) rather than its rounded twin.
        if f.kv_available
            .is_some_and(|k| (several && min < k) || (exact && min != k))
        {
            f.kv_available = Some(min);
            f.kv_available_rounding = exact.then_some(0);
            // The figure's own line, not the first one's (the notes cite it).
            if let Some(l) = f.lines.iter_mut().find(|(k, _)| *k == "kv_available") {
                l.1 = at;
            }
            let whose = if several {
                format!(
                    "{}'s {}, the smallest of {} workers' figures (vLLM sizes every worker by the fewest blocks)",
                    process.unwrap_or("the unprefixed process"),
                    fmt_signed(i128::from(min)),
                    rank_kv.len()
                )
            } else {
                format!(
                    "{}'s {}",
                    process.unwrap_or("the unprefixed process"),
                    fmt_signed(i128::from(min))
                )
            };
            let how = if exact { ", as printed in bytes" } else { "" };
            f.notes
                .push(format!("available KV cache memory: {whose}{how}"));
        }
    }
    // Several "GPU KV cache size" lines of one start-up: vLLM up to 0.10 reports each
    // worker's own KV configuration (`v1/engine/core.py` `_initialize_kv_caches` calls
    // `v1/core/kv_cache_utils.py` `get_kv_cache_config`, which logs it, once per worker) and
    // then sizes every worker by the fewest blocks (`unify_kv_cache_configs`: "changes the
    // num_blocks of each worker to the smallest among all workers"), so the smallest count is
    // the engine's. (From 0.11 the report follows the unification: one line, or equal ones.)
    // (Only one process's lines: data-parallel engines each size their own KV cache.)
    let first = kv_size_lines.first().copied();
    let same: Vec<(u64, usize)> = kv_size_lines
        .iter()
        .filter(|(_, _, p)| first.is_some_and(|f| f.2 == *p))
        .map(|&(t, n, _)| (t, n))
        .collect();
    if let (Some(&(min, at)), Some(first)) = (same.iter().min_by_key(|(t, _)| *t), first) {
        if min < first.0 && f.line("kv_tokens") == Some(first.1) {
            f.kv_tokens = Some(min);
            f.lines.retain(|(k, _)| *k != "kv_tokens");
            f.lines.push(("kv_tokens", at));
            f.notes.push(format!(
                "KV tokens: {min} (line {at}), the smallest of {} \"GPU KV cache size\" lines: vLLM up to 0.10 reports each worker's KV cache before it sizes every worker by the fewest blocks (`v1/core/kv_cache_utils.py` `unify_kv_cache_configs`)",
                same.len()
            ));
        }
    }
    if let Some(n) = next_start_up {
        f.notes.push(format!(
            "line {n}: another start-up begins; the workers' KV memory is the first start-up's"
        ));
    }
    if f.compile_cache == Some(CompileCache::Cold) {
        f.notes.push(format!(
            "line {}: a cold torch.compile cache: this start-up compiled its graphs inside the profile run, whose compiler and autotuning memory the engine charged to the non-KV terms; a restart with the cache warm sizes a larger KV cache, by an amount that depends on model, device and compiled shapes (the dry run plans the warm start-up)",
            f.line("compile_cache").unwrap_or(0)
        ));
    }
    if folded > 0 {
        f.notes.push(format!(
            "Ray's log de-duplication folded {folded} workers' KV memory lines (\"[repeated Nx across cluster]\"): their figures are not in the log, and the engine sized every worker by the smallest of all, so the available KV memory read here may be above the engine's (RAY_DEDUP_LOGS=0 logs every worker)"
        ));
    }
    if let (None, Some((rank, sum, count, n))) = (f.graph_actual, sglang_graphs) {
        f.graph_actual = Some(sum);
        f.lines.push(("graph_actual", n));
        if count > 1 {
            f.notes.push(format!(
                "graph memory: {} over the {count} graph captures of {} (each phase's \"CUDA graph end ... mem usage\", from line {n})",
                fmt_signed(i128::from(sum)),
                rank.unwrap_or("the first rank")
            ));
        }
    }
    // The XPU worker's peak: the torch peak (weights included) plus the non-torch growth.
    if let (None, Some((peak, n)), Some(w)) = (f.activation, xpu_peak, f.weights) {
        let rest = w.saturating_add(f.non_torch.unwrap_or(0));
        if peak >= rest {
            f.activation = Some(peak - rest);
            f.lines.push(("activation", n));
        }
    }
    // V0: peak_torch_memory includes the weights.
    if let (None, Some(peak), Some(w)) = (f.activation, peak_torch, f.weights) {
        f.activation = Some(peak.saturating_sub(w));
    }
    // No part of the device can be larger than the device.
    if let Some(t) = f.total {
        let parts = [
            ("weights", f.weights),
            ("activation", f.activation),
            ("non_torch", f.non_torch),
            ("consumed", f.consumed),
            ("non_kv", f.non_kv),
            ("graph_estimate", f.graph_estimate),
            ("graph_actual", f.graph_actual),
            ("kv_available", f.kv_available),
            ("kv_final", f.kv_final),
        ];
        for (name, v) in parts {
            if let Some(v) = v.filter(|v| *v > t) {
                return Err(bad(
                    f.line(name).unwrap_or(0),
                    format!(
                        "{} {} is more than the device total {} (line {})",
                        name.replace('_', " "),
                        fmt_bytes(v),
                        fmt_bytes(t),
                        f.line("total").unwrap_or(0)
                    ),
                ));
            }
        }
    }
    // No block size printed: where the log prints both its KV tokens and its blocks, their
    // quotient is the block size when it is a whole power of two (V0's refusal prints
    // `block_size * num_gpu_blocks` beside "# GPU blocks: N"; V1 prints
    // `num_blocks * block_size` tokens for one group of layers of a length that is a
    // multiple of the block, beside "num_gpu_blocks is: N" or 0.34's "Extended KV cache to
    // N blocks").
    if let (None, Some(t), Some(b)) = (f.block_size, f.kv_tokens, f.kv_blocks) {
        let q = t / b;
        if t % b == 0 && q.is_power_of_two() && q <= u64::from(limits::MAX_BLOCK) {
            let (lt, lb) = (
                f.line("kv_tokens").unwrap_or(0),
                f.line("kv_blocks").unwrap_or(0),
            );
            f.block_size = Some(q as u32);
            f.lines.push(("block_size", lb));
            f.notes.push(format!(
                "block size {q}: the log's {t} KV tokens (line {lt}) over its {b} blocks (line {lb})"
            ));
        }
    }
    // Was the graph estimate subtracted? The engine says so, or "Total non KV cache memory" =
    // weights + activation + non-torch (+ graph when subtracted).
    f.graph_subtracted = says_subtracted;
    if let (false, Some(total), Some(w), Some(a), Some(n), Some(g)) = (
        says_subtracted,
        f.non_kv,
        f.weights,
        f.activation,
        f.non_torch,
        f.graph_estimate,
    ) {
        let base = (w as f64) + (a as f64) + (n as f64);
        let t = total as f64;
        f.graph_subtracted = (t - base - g as f64).abs() < (t - base).abs();
    }
    f.notes = fold_notes(std::mem::take(&mut f.notes));
    Ok(f)
}

/// The most notes of one kind (the same text but for its figures and line numbers) a log
/// gives: a line that repeats on every line of a log (a graph capture that freed memory,
/// once per restart of a server running for months) is noted that often, and a 256 MiB log
/// of it would print its size again in notes.
const MAX_NOTES_ALIKE: usize = 8;

/// `notes` with at most [`MAX_NOTES_ALIKE`] of each kind, the rest counted in one note
/// after the last one kept.
fn fold_notes(notes: Vec<String>) -> Vec<String> {
    let kind = |n: &str| {
        let mut k = String::with_capacity(n.len());
        for c in n.chars() {
            if !c.is_ascii_digit() {
                k.push(c);
            } else if !k.ends_with('#') {
                k.push('#');
            }
        }
        k
    };
    let kinds: Vec<String> = notes.iter().map(|n| kind(n)).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for k in &kinds {
        *seen.entry(k.as_str()).or_default() += 1;
    }
    if seen.values().all(|&c| c <= MAX_NOTES_ALIKE) {
        return notes;
    }
    let mut kept: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::new();
    for (n, k) in notes.iter().zip(&kinds) {
        let taken = kept.entry(k.as_str()).or_default();
        *taken += 1;
        if *taken <= MAX_NOTES_ALIKE {
            out.push(n.clone());
        }
        if *taken == MAX_NOTES_ALIKE {
            let left = seen[k.as_str()] - MAX_NOTES_ALIKE;
            if left > 0 {
                out.push(format!(
                    "{left} more note(s) like the one above, from later lines, left out"
                ));
            }
        }
    }
    out
}

/// Whether `key` occurs in `s` at a word boundary (not as the tail of a longer name).
fn token_boundary(s: &str, key: &str) -> bool {
    let mut from = 0;
    while let Some(i) = s[from..].find(key) {
        let at = from + i;
        from = at + key.len();
        if !s[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return true;
        }
    }
    false
}

/// Read a log file (bounded: regular files of at most
/// [`ENGINE_LOG`](memplan_core::input::ENGINE_LOG) bytes) and its figures; errors name the
/// file, and the line and value at fault ([`Error::InvalidFile`]).
pub fn read(path: &Path) -> Result<LogFigures> {
    let text = memplan_core::input::read_text(path, memplan_core::input::ENGINE_LOG)?;
    parse(&text).map_err(|e| {
        let p = path.display().to_string();
        match e {
            Error::InvalidInput { field, message } => Error::file_key(p, field, message),
            Error::InvalidParam {
                param: Param::EngineLog,
                message,
            } => Error::file(
                p,
                format!("not a recognised engine start-up log: {message}"),
            ),
            other => Error::file(p, other.to_string()),
        }
    })
}

mod command;
mod scan;

#[cfg(test)]
mod tests;
