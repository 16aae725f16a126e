//! The flags of `memplan plan` and their value checks. Every value is checked where clap
//! parses it (so a bad one is a usage error, exit 2, naming the flag and the value as
//! written); the caps are documented in `docs/input-limits.md`. A negative value
//! (`--gpu-memory-utilization -0.5`, `--total-memory -80GiB`) is the flag's value, refused by
//! its check, never taken for an unknown flag `-0` that names nothing the user wrote.

use std::path::PathBuf;

use memplan::bytes::{fmt_bytes, parse_bytes_or_too_large};
use memplan::kv::KvDtype;
use memplan_model::arch::state::MambaDtype;
use memplan_model::engine::{EngineKind, EngineRules};

// The ranges of every planning figure are one table, shared with the figures read from an
// engine's start-up log (`--from-log`), so a log cannot carry a value its flag would refuse.
pub use memplan_model::limits::{
    MAX_BATCHED_TOKENS, MAX_BLOCK, MAX_BYTES, MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_TP,
};
/// Most `--cudagraph-capture-sizes` (after merging duplicates), and the largest size.
pub const MAX_CAPTURE_SIZES: usize = 1024;
/// See [`MAX_CAPTURE_SIZES`].
pub const MAX_CAPTURE_SIZE: u64 = 1 << 20;
/// Largest `--pipeline-parallel-size` (the model's layer count bounds it further).
pub const MAX_PP: u64 = 1024;
/// Largest `--num-speculative-tokens` (vLLM takes any count above 0; real drafts propose at
/// most a few dozen).
pub const MAX_SPECULATIVE_TOKENS: u64 = 1024;
/// Largest `--max-loras` (vLLM takes any count from 1, `LoRAConfig.max_loras`).
pub const MAX_LORAS: u64 = 1024;
/// The LoRA ranks vLLM accepts (`MaxLoRARanks`, vllm/config/lora.py, 0.34.0).
pub const LORA_RANKS: &[u64] = &[1, 8, 16, 32, 64, 128, 256, 320, 512];
/// Largest `--cpu-offload-gb`: [`MAX_BYTES`] in GiB.
pub const MAX_CPU_OFFLOAD_GIB: f64 = (MAX_BYTES >> 30) as f64;

fn bytes(flag: &'static str) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s| {
        let b = parse_bytes_or_too_large(flag, s).map_err(|e| match e {
            memplan::Error::InvalidInput { message, .. } => message,
            other => other.to_string(),
        })?;
        match b {
            Some(b) if b <= MAX_BYTES => Ok(b),
            // Past 64 bits: too large to show as a size, past the limit all the same.
            None => Err(format!(
                "{s:?} is more than any device holds (at most {}, 1 PiB)",
                fmt_bytes(MAX_BYTES)
            )),
            Some(b) => Err(format!(
                "{s:?} is {}, more than any device holds (at most {}, 1 PiB)",
                fmt_bytes(b),
                fmt_bytes(MAX_BYTES)
            )),
        }
    }
}

fn positive_bytes(flag: &'static str) -> impl Fn(&str) -> Result<u64, String> + Clone {
    let b = bytes(flag);
    move |s| match b(s)? {
        0 => Err(format!("{s:?}: must be more than 0 bytes")),
        n => Ok(n),
    }
}

fn count(max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s| {
        let n: u64 = s.trim().parse().map_err(|_| {
            // A negative whole number (vLLM's `--max-model-len -1`) is one, just out of
            // range; so is one past 64 bits.
            if whole_number(s) {
                format!("{} is outside 1..={max}", s.trim())
            } else {
                format!("{s:?} is not a whole number")
            }
        })?;
        if n == 0 || n > max {
            return Err(format!("{n} is outside 1..={max}"));
        }
        Ok(n)
    }
}

/// Whether `s` is a whole number in decimal digits, with a sign or not, of any length.
fn whole_number(s: &str) -> bool {
    let t = s.trim();
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
}

/// A rank or stage, counted from 0. A whole number that is negative or past 64 bits is
/// refused with the most any parallel size allows, `max` (clap's own parser said "invalid
/// digit found in string", "number too large to fit in target type"); any other is checked
/// against the parallel size given, where the plan is made.
fn index(max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s| match s.trim().parse::<u64>() {
        Ok(n) => Ok(n),
        Err(_) if whole_number(s) => Err(format!("{} is outside 0..={max}", s.trim())),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

fn block(s: &str) -> Result<u32, String> {
    count(u64::from(MAX_BLOCK))(s).map(|n| n as u32)
}

fn utilization(s: &str) -> Result<f64, String> {
    let u: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    memplan_model::limits::check_fraction(u)
        .map_err(|_| format!("{s} is outside (0, 1]: a fraction of the device"))
}

fn capture_size(s: &str) -> Result<u64, String> {
    count(MAX_CAPTURE_SIZE)(s)
}

/// `--max-lora-rank`: one of the ranks vLLM accepts.
fn lora_rank(s: &str) -> Result<u64, String> {
    let ranks = || {
        LORA_RANKS
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let n: u64 = s.trim().parse().map_err(|_| {
        if whole_number(s) {
            format!("{} is not a LoRA rank vLLM accepts ({})", s.trim(), ranks())
        } else {
            format!("{s:?} is not a whole number")
        }
    })?;
    if !LORA_RANKS.contains(&n) {
        return Err(format!("{n} is not a LoRA rank vLLM accepts ({})", ranks()));
    }
    Ok(n)
}

/// `--cpu-offload-gb`: a finite number of GiB from 0 to [`MAX_CPU_OFFLOAD_GIB`].
fn offload_gib(s: &str) -> Result<f64, String> {
    let g: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of GiB"))?;
    if !(g.is_finite() && (0.0..=MAX_CPU_OFFLOAD_GIB).contains(&g)) {
        return Err(format!(
            "{s} is outside 0..={MAX_CPU_OFFLOAD_GIB} GiB (vLLM takes any size from 0)"
        ));
    }
    Ok(g)
}

/// `--kv-cache-dtype`: `auto` (`None`: the model dtype) or a dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvChoice(pub Option<KvDtype>);

/// `--quantization`: `none` or an online method (`fp8`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantChoice(pub Option<String>);

/// `--mamba-cache-dtype`, `--mamba-ssm-cache-dtype`: `auto` (`None`) or a dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MambaChoice(pub Option<MambaDtype>);

/// `--mamba-cache-dtype`, `--mamba-ssm-cache-dtype`: vLLM 0.19.0's `MambaDType` (auto,
/// float32, float16), any case.
fn mamba_dtype(s: &str) -> Result<MambaChoice, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(MambaChoice(None));
    }
    s.parse::<MambaDtype>().map(|d| MambaChoice(Some(d)))
}

/// `--kv-cache-dtype`, any case.
fn kv_dtype(s: &str) -> Result<KvChoice, String> {
    KvDtype::parse_setting(s).map(KvChoice).map_err(|_| {
        format!(
            "{s:?} is not a KV-cache dtype; expected auto, {}",
            KvDtype::NAMES
        )
    })
}

/// `--dtype`: `auto` or a model dtype, any case, normalised to the engines' names.
fn dtype(s: &str) -> Result<String, String> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "auto" => "auto",
        "bfloat16" | "bf16" => "bfloat16",
        "float16" | "fp16" | "half" => "float16",
        "float32" | "fp32" | "float" => "float32",
        _ => {
            return Err(format!(
                "{s:?} is not a model dtype; expected auto, bfloat16, float16 or float32"
            ))
        }
    }
    .to_string())
}

/// `--quantization`: none or online fp8.
fn quantization(s: &str) -> Result<QuantChoice, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "none" => Ok(QuantChoice(None)),
        "fp8" => Ok(QuantChoice(Some("fp8".into()))),
        _ => Err(format!(
            "{s:?}: a dry run knows online fp8 (or none); quantized checkpoints are read from their config"
        )),
    }
}

/// `--device`: the id must parse (backend and selector), even beside `--total-memory`, and
/// must not hold characters no device id has.
fn device(s: &str) -> Result<String, String> {
    if s.chars().any(|c| c.is_control()) {
        return Err(format!("{s:?} holds control characters"));
    }
    memplan::parse_device_id(s)
        .map_err(|e| e.to_string())
        .map(|_| s.to_string())
}

/// `--alloc-conf STRING`: PyTorch's allocator option string, strictly parsed.
fn alloc_conf(s: &str) -> Result<memplan::AllocatorConfig, String> {
    memplan::AllocatorConfig::parse(s).map_err(|e| e.to_string())
}

/// `--engine vllm[@VERSION]`: a release memplan has rules for.
fn engine(s: &str) -> Result<String, String> {
    s.parse::<EngineRules>()
        .map(|_| s.to_string())
        .map_err(|e| crate::flags::without_param(&e))
}

/// `--emit-args vllm[@VERSION]`: the same spelling as `--engine`.
fn emit_engine(s: &str) -> Result<(Engine, String), String> {
    let rules: EngineRules = s
        .parse()
        .map_err(|e: memplan::Error| crate::flags::without_param(&e))?;
    let kind = match rules.kind {
        EngineKind::Vllm => Engine::Vllm,
        EngineKind::Sglang => Engine::Sglang,
    };
    Ok((kind, s.to_string()))
}

/// Engines whose flags `--emit-args` can print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// vLLM (`--kv-cache-memory-bytes`, `--max-model-len`, ...).
    Vllm,
    /// SGLang (`--max-total-tokens`, `--mem-fraction-static`, ...).
    Sglang,
}

/// How graph memory enters a dry run. A dry run captures nothing: the device-only strategies
/// (post-capture, full, sampled, conservative) run in an engine start-up (the `memplan` crate's
/// `Session`) or in `memplan simulate`, not here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Follow the device as a measured start-up would: with `--device`, nothing where it
    /// cannot capture graphs (it runs eager); otherwise `--graph-bytes` if given, else the
    /// analytic estimate, and the plan says which strategy a measured start-up would use.
    Auto,
    /// Reserve the analytic estimate from the model (or `--graph-bytes`).
    Estimate,
    /// Reserve nothing (an engine that does not subtract graph memory, as vLLM <= 0.19).
    None,
}

/// The flags of `memplan plan`.
// The field docs are clap's help text, written for a terminal: `vllm[@VERSION]` is usage
// syntax, not an intra-doc link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args, Debug, Clone)]
pub struct Flags {
    /// Model: a shipped preset (`qwen2.5-1.5b-instruct`; `--model list` lists them), a Hugging
    /// Face id in the local cache (`Qwen/Qwen2.5-7B-Instruct`, no network), a directory with
    /// config.json (and *.safetensors, whose headers give the exact weights), a config.json
    /// path or a .gguf file (with a llama.cpp `-c`/`-ngl` answer). Optional with --from-log
    /// when the log names its model (vLLM's non-default args or engine config, SGLang's
    /// model_path).
    #[arg(long, value_name = "NAME|PATH", required_unless_present = "from_log")]
    pub model: Option<String>,
    /// Device to plan for (`sim:rtx4090`, `cuda:0`); optional with --total-memory.
    #[arg(long, value_name = "ID", value_parser = device)]
    pub device: Option<String>,
    /// Plan for a device of this total instead of reading one (e.g. 79.19GiB).
    #[arg(long, allow_hyphen_values = true, value_name = "BYTES", value_parser = positive_bytes("--total-memory"))]
    pub total_memory: Option<u64>,
    /// Fraction of the device the engine may use, in (0, 1] (default: the engine release's).
    #[arg(long, allow_hyphen_values = true, value_name = "FRACTION", value_parser = utilization)]
    pub gpu_memory_utilization: Option<f64>,
    /// The engine and release whose sizing rules and defaults apply: vllm[@VERSION] or
    /// sglang[@VERSION] (default: the newest vLLM memplan knows; docs/engine-rules.md).
    #[arg(long, value_name = "ENGINE[@VERSION]", value_parser = engine)]
    pub engine: Option<String>,
    /// Fix the KV cache size instead of deriving it from the utilisation.
    #[arg(long, allow_hyphen_values = true, value_name = "BYTES", value_parser = positive_bytes("--kv-cache-memory-bytes"))]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Model dtype: auto (from the config), bfloat16, float16, float32.
    #[arg(long, default_value = "auto", value_parser = dtype)]
    pub dtype: String,
    /// KV-cache dtype: auto, bf16, fp16, fp32, fp8, fp8_e4m3, fp8_e5m2, int8.
    #[arg(long, value_name = "DTYPE", default_value = "auto", value_parser = kv_dtype)]
    pub kv_cache_dtype: KvChoice,
    /// Recurrent-state (Mamba, gated DeltaNet, short-conv) cache dtype, vLLM's flag: auto (the
    /// model dtype), float32, float16. The conv state, and the SSM state where
    /// --mamba-ssm-cache-dtype and the model's config leave it.
    #[arg(long, value_name = "DTYPE", default_value = "auto", value_parser = mamba_dtype)]
    pub mamba_cache_dtype: MambaChoice,
    /// SSM (temporal) state dtype of recurrent-state layers, vLLM's flag: auto, float32,
    /// float16. auto: the config's where the family's rule reads it (Nemotron-H's
    /// mamba_ssm_cache_dtype, when absent float16 under vLLM 0.19 and float32 from 0.20.0;
    /// Qwen3.5's mamba_ssm_dtype), else
    /// --mamba-cache-dtype's.
    #[arg(long, value_name = "DTYPE", default_value = "auto", value_parser = mamba_dtype)]
    pub mamba_ssm_cache_dtype: MambaChoice,
    /// Prefix caching on, as vLLM's flag: a hybrid model's recurrent-state layers hold two
    /// pages a request ('align' mode) instead of one (default: the release's).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Prefix caching off, as vLLM's flag: one recurrent-state page a request.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Online weight quantization (fp8), as the engine's --quantization.
    #[arg(long, value_name = "METHOD", value_parser = quantization, default_value = "none")]
    pub quantization: QuantChoice,
    /// Longest request in tokens (default: the model's max_position_embeddings).
    #[arg(long, allow_negative_numbers = true, value_name = "TOKENS", value_parser = count(MAX_MODEL_LEN))]
    pub max_model_len: Option<u64>,
    /// Requests per step (default: the engine's, by device size).
    #[arg(long, allow_negative_numbers = true, value_name = "N", value_parser = count(MAX_NUM_SEQS))]
    pub max_num_seqs: Option<u64>,
    /// Tokens per step (default: the engine's, by device size).
    #[arg(long, allow_negative_numbers = true, value_name = "TOKENS", value_parser = count(MAX_BATCHED_TOKENS))]
    pub max_num_batched_tokens: Option<u64>,
    /// Tokens per KV block (default: the engine release's).
    #[arg(long, allow_negative_numbers = true, value_name = "TOKENS", value_parser = block)]
    pub block_size: Option<u32>,
    /// Tensor-parallel ranks (figures are per rank).
    #[arg(long, allow_negative_numbers = true, visible_alias = "tp", value_name = "N", default_value = "1", value_parser = count(MAX_TP))]
    pub tensor_parallel_size: u64,
    /// Graph capture sizes, comma-separated (default: the engine's); duplicates are merged, as
    /// the engine merges them.
    #[arg(long, allow_negative_numbers = true, value_name = "N,N,...", value_delimiter = ',', value_parser = capture_size)]
    pub cudagraph_capture_sizes: Option<Vec<u64>>,
    /// No graphs (so no graph memory: conflicts with --graph-bytes and capture sizes).
    #[arg(long, conflicts_with_all = ["graph_bytes", "cudagraph_capture_sizes"])]
    pub enforce_eager: bool,
    /// Graph-memory strategy.
    #[arg(long, value_enum, default_value_t = Strategy::Auto)]
    pub graph_strategy: Strategy,
    /// Measured weights per rank (from an earlier start-up log).
    #[arg(long, allow_hyphen_values = true, value_name = "BYTES", value_parser = bytes("--weights-bytes"))]
    pub weights_bytes: Option<u64>,
    /// Measured activation peak per rank.
    #[arg(long, allow_hyphen_values = true, value_name = "BYTES", value_parser = bytes("--activation-bytes"))]
    pub activation_bytes: Option<u64>,
    /// Measured non-torch (non-allocator) memory growth per rank.
    #[arg(long, allow_hyphen_values = true, value_name = "BYTES", value_parser = bytes("--non-torch-bytes"))]
    pub non_torch_bytes: Option<u64>,
    /// Measured graph memory per rank.
    #[arg(long, allow_hyphen_values = true, value_name = "BYTES", value_parser = bytes("--graph-bytes"))]
    pub graph_bytes: Option<u64>,
    /// Fill the figures an earlier start-up measured (the model, weights, activation,
    /// non-torch, graphs, total, utilisation, settings, the engine release) from its log (vLLM
    /// V0 to current, SGLang); flags given on the command line win. A log without a version
    /// line is planned with the newest release its lines allow (--engine overrides).
    #[arg(long, value_name = "FILE")]
    pub from_log: Option<PathBuf>,
    /// Pipeline-parallel stages: each stage is planned on its own layers (vLLM's split) and
    /// the engine sizes every stage like the one with the fewest blocks.
    #[arg(long, allow_negative_numbers = true, visible_alias = "pp", value_name = "N", default_value = "1", value_parser = count(MAX_PP))]
    pub pipeline_parallel_size: u64,
    /// Plan only this pipeline stage (from 0) of --pipeline-parallel-size: the plan of one
    /// rank of that stage, for ranks that plan their own GPU and combine their plans
    /// afterwards (by the fewest blocks, as the engine sizes every stage).
    #[arg(long, allow_negative_numbers = true, value_name = "STAGE", value_parser = index(MAX_PP - 1))]
    pub pipeline_stage: Option<u64>,
    /// Plan for this tensor-parallel rank (from 0) of --tensor-parallel-size, on --device
    /// alone: the plan says which rank (and, with --pipeline-stage, which stage) it is, so
    /// the ranks' plans combine (memplan.distributed.combine in Python).
    #[arg(long, allow_negative_numbers = true, value_name = "RANK", value_parser = index(MAX_TP - 1))]
    pub tensor_parallel_rank: Option<u64>,
    /// Draft model for speculative decoding (preset, ORG/NAME, directory or config.json): its
    /// weights, and its KV layers in the same pool.
    #[arg(long, value_name = "NAME|PATH")]
    pub speculative_model: Option<String>,
    /// Tokens the draft proposes per step (with --speculative-model).
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value = "1", requires = "speculative_model", value_parser = count(MAX_SPECULATIVE_TOKENS))]
    pub num_speculative_tokens: u64,
    /// LoRA adapter slots pre-allocated on the device (enables LoRA).
    #[arg(long, allow_negative_numbers = true, value_name = "N", value_parser = count(MAX_LORAS))]
    pub max_loras: Option<u64>,
    /// Largest LoRA rank (with --max-loras): 1, 8, 16, 32, 64, 128, 256, 320 or 512.
    #[arg(long, allow_negative_numbers = true, value_name = "RANK", default_value = "16", requires = "max_loras", value_parser = lora_rank)]
    pub max_lora_rank: u64,
    /// Weights kept in host memory, in GiB (vLLM `--cpu-offload-gb`).
    #[arg(long, allow_hyphen_values = true, value_name = "GIB", default_value = "0", value_parser = offload_gib)]
    pub cpu_offload_gb: f64,
    /// The engine's caching-allocator configuration, PyTorch's option string
    /// (`expandable_segments:True,max_split_size_mb:512`); default: PYTORCH_ALLOC_CONF, else
    /// PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_HIP_ALLOC_CONF, the first one set, as PyTorch reads
    /// them. The plan notes it and where it came from; a dry run keeps no room for the
    /// allocator's rounding (a measured start-up plans by it: docs/measurement-protocol.md).
    #[arg(long, value_name = "STRING", value_parser = alloc_conf)]
    pub alloc_conf: Option<memplan::AllocatorConfig>,
    /// Print JSON (`memplan.plan/1`) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a stacked-bar picture of the device memory to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Print only ready-to-paste flags that pin the planned KV cache in an engine
    /// (vllm[@VERSION] or sglang[@VERSION], as --engine); refused where the engine would
    /// refuse the flags or could not reproduce the plan. SGLang's --mem-fraction-static is the
    /// static fraction the plan suggests where it carries one (a measured start-up's), else
    /// the request's share of the device.
    #[arg(long, value_name = "ENGINE[@VERSION]", value_parser = emit_engine)]
    pub emit_args: Option<(Engine, String)>,
    /// The block size a start-up log gave where `--block-size` was not passed (it then fills
    /// `block_size`), with the engine that ran with it: `--emit-args` repeats it only for that
    /// engine, never as a flag the user did not set for another.
    #[arg(skip)]
    pub log_block_size: Option<(u32, EngineKind)>,
}

impl Flags {
    /// `--enable-prefix-caching` (`Some(true)`), `--no-enable-prefix-caching`
    /// (`Some(false)`), else `None` (the release's default); the last one given wins.
    pub fn prefix_caching(&self) -> Option<bool> {
        match (self.enable_prefix_caching, self.no_enable_prefix_caching) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    /// The capture sizes as the engine takes them: duplicates merged, sorted, at most
    /// `MAX_CAPTURE_SIZES`.
    pub fn capture_sizes(&self) -> Result<Option<Vec<u64>>, String> {
        let Some(sizes) = &self.cudagraph_capture_sizes else {
            return Ok(None);
        };
        let mut v = sizes.clone();
        v.sort_unstable();
        v.dedup();
        if v.len() > MAX_CAPTURE_SIZES {
            return Err(format!(
                "--cudagraph-capture-sizes: {} distinct sizes; at most {MAX_CAPTURE_SIZES}",
                v.len()
            ));
        }
        Ok(Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_where_they_are_parsed() {
        assert!(utilization("NaN").is_err() && utilization("inf").is_err());
        assert!(utilization("0").is_err() && utilization("1.0001").is_err());
        assert_eq!(utilization("1").unwrap(), 1.0);
        assert!(count(MAX_NUM_SEQS)("9223372036854775808").is_err());
        assert!(count(MAX_NUM_SEQS)("0").is_err());
        assert_eq!(kv_dtype("AUTO").unwrap(), KvChoice(None));
        assert_eq!(kv_dtype("FP8").unwrap(), KvChoice(Some(KvDtype::Fp8E4m3)));
        let e = kv_dtype("fp4").unwrap_err();
        assert!(e.contains("\"fp4\""), "{e}");
        // Every name the flag takes is listed, `auto` with them.
        assert!(
            e.contains("expected auto, bf16,") && e.contains("fp8_ds_mla"),
            "{e}"
        );
        assert_eq!(dtype("BF16").unwrap(), "bfloat16");
        assert_eq!(mamba_dtype("Auto").unwrap(), MambaChoice(None));
        assert_eq!(
            mamba_dtype("FLOAT32").unwrap(),
            MambaChoice(Some(MambaDtype::Float32))
        );
        assert_eq!(
            mamba_dtype("float16").unwrap(),
            MambaChoice(Some(MambaDtype::Float16))
        );
        // vLLM 0.19.0's `MambaDType` has no bfloat16.
        let e = mamba_dtype("bfloat16").unwrap_err();
        assert!(e.contains("auto, float32 or float16"), "{e}");
        assert!(device("sim:rtx4090\u{1}").is_err());
        assert!(device("nonsense:0").is_err());
        assert!(bytes("--x")("2PiB").is_err() && bytes("--x")("2000TiB").is_err());
        // Past 64 bits: the flag's own limit, not "not a number".
        for big in ["99999999999999999999999", "99999999999999999999PiB"] {
            let e = bytes("--x")(big).unwrap_err();
            assert!(
                e.contains("more than any device holds (at most 1048576.00 GiB, 1 PiB)")
                    && !e.contains("number"),
                "{big}: {e}"
            );
        }
        assert!(positive_bytes("--x")("0").is_err());
        assert_eq!(lora_rank("64").unwrap(), 64);
        for bad in ["0", "17", "1024", "-1", "x", "18446744073709551616"] {
            assert!(lora_rank(bad).is_err(), "{bad}");
        }
        // A whole number of any length is one: out of range, never "not a whole number".
        let huge = "1".repeat(45);
        let e = lora_rank(&huge).unwrap_err();
        assert!(e.contains("is not a LoRA rank vLLM accepts (1, 8,"), "{e}");
        for n in [
            huge.as_str(),
            "-1",
            "-99999999999999999999999999999999999999999",
        ] {
            let e = count(MAX_NUM_SEQS)(n).unwrap_err();
            assert!(e.contains(&format!("{n} is outside 1..=")), "{n}: {e}");
        }
        assert!(count(MAX_NUM_SEQS)("1.5")
            .unwrap_err()
            .contains("not a whole number"));
        for n in [huge.as_str(), "-1"] {
            let e = index(MAX_PP - 1)(n).unwrap_err();
            assert!(e.contains(&format!("{n} is outside 0..=1023")), "{n}: {e}");
        }
        assert_eq!(index(MAX_PP - 1)("0").unwrap(), 0);
        assert_eq!(index(MAX_PP - 1)("2000").unwrap(), 2000); // checked against the size
        assert!(index(MAX_PP - 1)("x")
            .unwrap_err()
            .contains("not a whole number"));
        assert_eq!(offload_gib("2.5").unwrap(), 2.5);
        for bad in ["-1", "NaN", "inf", "1e308", "-0.0001", "x"] {
            assert!(offload_gib(bad).is_err(), "{bad}");
        }
    }
}
