//! A launch command pasted with the log (`vllm serve X --gpu-memory-utilization 0.85`,
//! `python -m vllm.entrypoints.openai.api_server --model X -tp 2`, `python3 -m
//! sglang.launch_server --model-path X --mem-fraction-static 0.8`): the flags that change the
//! plan, read with shell-like quoting (`'...'`, `"..."`, `\`, a `\` line continuation), as
//! `--flag value` or `--flag=value`.
//!
//! The flags are the engines' own (vLLM 0.19.0 `vllm/engine/arg_utils.py`
//! `EngineArgs.add_cli_args`; SGLang `srt/server_args.py` `ServerArgs.add_cli_args`):
//! vLLM's parser takes `--flag_name` for `--flag-name` (`vllm/utils/argparse_utils.py`
//! `FlexibleArgumentParser`), and its `--max-model-len` / `--max-num-batched-tokens` take
//! `1k` (1,000) and `1K` (1,024) (`arg_utils.py` `human_readable_int`; `-1` / `auto` is
//! `max_model_len`'s "fit the longest", not a figure). The last occurrence of a flag wins, as
//! with argparse. Flags that do not change the plan are ignored; a malformed value of one that
//! does is an error naming the flag and the line.
//!
//! The figures the engine itself printed (its non-default args, engine config, `ServerArgs`)
//! win over the command's, as they are what the start-up ran with: where both are given and
//! differ, a note says so ([`merge`]).

use memplan_core::Result;

use super::{bad, LogFigures};
use crate::limits;

/// What launches an engine on a command line, in the order looked for.
const LAUNCHERS: [&str; 7] = [
    "vllm serve ",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.api_server",
    "sglang.launch_server",
    "sglang serve ",
    "sglang.bench_one_batch",
    "sglang.bench_offline_throughput",
];

/// The longest command line a shell launches: Linux's `ARG_MAX` under the default 8 MiB
/// stack (a quarter of it) bounds the arguments and the environment together. A longer
/// "command" is no command anyone ran, and splitting it into words would take several times
/// its size in memory (a 256 MiB log of one such line: gigabytes).
pub(super) const MAX_COMMAND: usize = 2 << 20;

/// A figure of the command, with the flag as it was written.
#[derive(Debug, Clone, PartialEq)]
struct Given<T> {
    value: T,
    flag: String,
}

/// The figures a pasted launch command gives.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Command {
    /// The line (1-based) the command starts on.
    pub line: usize,
    /// The command's last line (its `\\` continuation lines included).
    pub last_line: usize,
    /// What launched the engine (`vllm serve`).
    pub launcher: &'static str,
    /// The models it names: `vllm serve X`'s positional argument, `--model X`,
    /// `--model-path X`, in that order (SGLang takes both flags: a command may name two).
    pub models: Vec<String>,
    utilization: Option<Given<f64>>,
    max_model_len: Option<Given<u64>>,
    kv_cache_dtype: Option<Given<String>>,
    block_size: Option<Given<u32>>,
    tensor_parallel: Option<Given<u64>>,
    pipeline_parallel: Option<Given<u64>>,
    enforce_eager: Option<Given<bool>>,
    enable_prefix_caching: Option<Given<bool>>,
    max_num_seqs: Option<Given<u64>>,
    max_num_batched_tokens: Option<Given<u64>>,
    quantization: Option<Given<String>>,
    mamba_cache_dtype: Option<Given<String>>,
    mamba_ssm_cache_dtype: Option<Given<String>>,
}

/// The first launch command in `text`, or `None` where the log holds none.
pub(super) fn find(text: &str) -> Result<Option<Command>> {
    let Some((at, launcher)) = LAUNCHERS
        .iter()
        .filter_map(|k| {
            text.match_indices(k)
                .find(|(at, _)| is_command(text, *at))
                .map(|(at, _)| (at, *k))
        })
        .min_by_key(|(at, _)| *at)
    else {
        return Ok(None);
    };
    let line = text[..at].bytes().filter(|b| *b == b'\n').count() + 1;
    // The command from the launcher on, with its `\` continuation lines.
    let mut cmd = String::new();
    let mut last_line = line;
    for (i, l) in text[at + launcher.len()..].split('\n').enumerate() {
        last_line = line + i;
        let l = l.trim_end_matches('\r');
        // A continuation line of a log is no longer than a command line.
        if i > 64 {
            break;
        }
        let (body, more) = match l.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (l, false),
        };
        if cmd.len() + body.len() > MAX_COMMAND {
            return Err(bad(
                line,
                format!(
                    "the pasted {} command is longer than {} MiB, more than a shell passes to a program (Linux's ARG_MAX): not a command line",
                    launcher.trim(),
                    MAX_COMMAND >> 20
                ),
            ));
        }
        cmd.push_str(body);
        cmd.push(' ');
        if !more {
            break;
        }
    }
    let words = split(&cmd);
    let mut c = Command {
        line,
        last_line,
        launcher: launcher.trim(),
        ..Command::default()
    };
    let positional = (launcher == "vllm serve ")
        .then(|| words.first().filter(|w| !w.starts_with('-')).cloned())
        .flatten();
    let mut model_flag: Option<String> = None;
    let mut model_path: Option<String> = None;
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        i += 1;
        if !w.starts_with('-') || w == "-" || w == "--" {
            continue;
        }
        let (name, inline) = match w.split_once('=') {
            Some((n, v)) if w.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (w.clone(), None),
        };
        let name = if name.starts_with("--") {
            name.replace('_', "-")
        } else {
            name
        };
        let (no_value, flag) = match name.strip_prefix("--no-") {
            Some(rest) => (true, format!("--{rest}")),
            None => (false, name.clone()),
        };
        if matches!(name.as_str(), "--model" | "--model-path") {
            let v = inline.clone().or_else(|| {
                words
                    .get(i)
                    .filter(|v| !v.starts_with('-'))
                    .inspect(|_| i += 1)
                    .cloned()
            });
            let slot = if name == "--model" {
                &mut model_flag
            } else {
                &mut model_path
            };
            *slot = v.filter(|v| !v.is_empty() && v.len() <= 512);
            continue;
        }
        let Some(kind) = KNOWN
            .iter()
            .find(|(names, _)| names.contains(&flag.as_str()))
            .map(|k| k.1)
        else {
            continue;
        };
        if matches!(kind, Kind::Eager | Kind::PrefixCaching) {
            let v = match (&inline, no_value) {
                (None, no) => !no,
                (Some(v), false) => match v.to_ascii_lowercase().as_str() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => {
                        return Err(bad(
                            line,
                            format!("the pasted command's {name} {v:?} is not true or false"),
                        ))
                    }
                },
                (Some(v), true) => {
                    return Err(bad(
                        line,
                        format!("the pasted command's {name} takes no value (given {v:?})"),
                    ))
                }
            };
            let g = Some(Given {
                value: v,
                flag: name,
            });
            if kind == Kind::Eager {
                c.enforce_eager = g;
            } else {
                c.enable_prefix_caching = g;
            }
            continue;
        }
        if no_value {
            continue;
        }
        // `--flag value`: the next word, unless it is another flag (`-1` is a value).
        let value = match inline {
            Some(v) => Some(v),
            None => match words.get(i) {
                Some(v) if !(v.starts_with("--") || is_short_flag(v)) => {
                    i += 1;
                    Some(v.clone())
                }
                _ => None,
            },
        };
        let Some(v) = value else {
            return Err(bad(
                line,
                format!("the pasted command's {name} has no value"),
            ));
        };
        c.set(kind, &flag, name, &v)?;
    }
    c.models = [positional, model_flag, model_path]
        .into_iter()
        .flatten()
        .collect();
    Ok(Some(c))
}

/// Whether the launcher at byte `at` starts a command: what precedes it on its line is a
/// shell prompt (`$ `, `❯ `, `user@host:~# `, `command=`), not an engine's log line (a level
/// word or a `[...] ` prefix: a warning that names `vllm serve` is no command).
fn is_command(text: &str, at: usize) -> bool {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let head = &text[start..at];
    !["INFO", "WARNING", "WARN ", "DEBUG", "ERROR", "] ", "`"]
        .iter()
        .any(|w| head.contains(w))
}

fn is_short_flag(w: &str) -> bool {
    w.strip_prefix('-')
        .is_some_and(|r| r.starts_with(|ch: char| ch.is_ascii_alphabetic()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Utilization,
    MaxModelLen,
    KvCacheDtype,
    BlockSize,
    TensorParallel,
    PipelineParallel,
    Eager,
    PrefixCaching,
    MaxNumSeqs,
    MaxNumBatchedTokens,
    Quantization,
    MambaCacheDtype,
    MambaSsmCacheDtype,
}

/// The flags that change the plan, as vLLM 0.19.0 (`vllm/engine/arg_utils.py`
/// `EngineArgs.add_cli_args`) and SGLang (`srt/server_args.py` `ServerArgs.add_cli_args`)
/// name them. SGLang's `--disable-cuda-graph` captures no graphs, as vLLM's
/// `--enforce-eager`.
const KNOWN: &[(&[&str], Kind)] = &[
    (
        &["--gpu-memory-utilization", "--mem-fraction-static"],
        Kind::Utilization,
    ),
    (&["--max-model-len", "--context-length"], Kind::MaxModelLen),
    (&["--kv-cache-dtype"], Kind::KvCacheDtype),
    (&["--block-size", "--page-size"], Kind::BlockSize),
    (
        &["--tensor-parallel-size", "-tp", "--tp-size", "--tp"],
        Kind::TensorParallel,
    ),
    (
        &["--pipeline-parallel-size", "-pp", "--pp-size", "--pp"],
        Kind::PipelineParallel,
    ),
    (&["--enforce-eager", "--disable-cuda-graph"], Kind::Eager),
    (&["--enable-prefix-caching"], Kind::PrefixCaching),
    (&["--max-num-seqs"], Kind::MaxNumSeqs),
    (&["--max-num-batched-tokens"], Kind::MaxNumBatchedTokens),
    (&["--quantization", "-q"], Kind::Quantization),
    (&["--mamba-cache-dtype"], Kind::MambaCacheDtype),
    (&["--mamba-ssm-cache-dtype"], Kind::MambaSsmCacheDtype),
];

impl Command {
    fn set(&mut self, kind: Kind, flag: &str, name: String, v: &str) -> Result<()> {
        let n = self.line;
        let what = |why: String| bad(n, format!("the pasted command's {name} {v:?} {why}"));
        let count = |max: u64, human: bool| -> Result<u64> {
            // A whole number, negative or past 64 bits, is one: outside the range, not "not
            // a whole number".
            let t = v.trim();
            let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
            if !digits.is_empty()
                && digits.chars().all(|c| c.is_ascii_digit())
                && t.parse::<u64>().is_err()
            {
                return Err(what(format!("is outside 1..={max}")));
            }
            let x = match human {
                true => human_int(v),
                false => v.parse().map_err(|_| NotInt::Form),
            }
            .map_err(|e| match e {
                NotInt::Form => what("is not a whole number".into()),
                NotInt::PastU64 => what(format!("is outside 1..={max}")),
            })?;
            limits::check_count(x, max).map_err(|_| what(format!("is outside 1..={max}")))
        };
        let word = || -> Result<String> {
            if v.is_empty() || v.len() > 512 {
                return Err(what("is not a value".into()));
            }
            Ok(v.to_string())
        };
        match kind {
            Kind::Utilization => {
                let u: f64 = v.parse().map_err(|_| what("is not a number".into()))?;
                let u = limits::check_fraction(u).map_err(what)?;
                self.utilization = Some(Given {
                    value: u,
                    flag: name,
                });
            }
            Kind::MaxModelLen => {
                // vLLM's `-1` / `auto`: the longest length that fits, not a figure.
                if flag == "--max-model-len" && (v == "-1" || v.eq_ignore_ascii_case("auto")) {
                    self.max_model_len = None;
                    return Ok(());
                }
                let x = count(limits::MAX_MODEL_LEN, flag == "--max-model-len")?;
                self.max_model_len = Some(Given {
                    value: x,
                    flag: name,
                });
            }
            Kind::MaxNumBatchedTokens => {
                let x = count(limits::MAX_BATCHED_TOKENS, true)?;
                self.max_num_batched_tokens = Some(Given {
                    value: x,
                    flag: name,
                });
            }
            Kind::MaxNumSeqs => {
                let x = count(limits::MAX_NUM_SEQS, false)?;
                self.max_num_seqs = Some(Given {
                    value: x,
                    flag: name,
                });
            }
            Kind::BlockSize => {
                let x = count(u64::from(limits::MAX_BLOCK), false)?;
                self.block_size = Some(Given {
                    value: x as u32,
                    flag: name,
                });
            }
            Kind::TensorParallel => {
                let x = count(limits::MAX_TP, false)?;
                self.tensor_parallel = Some(Given {
                    value: x,
                    flag: name,
                });
            }
            Kind::PipelineParallel => {
                let x = count(limits::MAX_TP, false)?;
                self.pipeline_parallel = Some(Given {
                    value: x,
                    flag: name,
                });
            }
            Kind::KvCacheDtype => {
                self.kv_cache_dtype = Some(Given {
                    value: word()?,
                    flag: name,
                })
            }
            Kind::Quantization => {
                self.quantization = Some(Given {
                    value: word()?,
                    flag: name,
                })
            }
            Kind::MambaCacheDtype => {
                self.mamba_cache_dtype = Some(Given {
                    value: word()?,
                    flag: name,
                })
            }
            Kind::MambaSsmCacheDtype => {
                self.mamba_ssm_cache_dtype = Some(Given {
                    value: word()?,
                    flag: name,
                })
            }
            Kind::Eager | Kind::PrefixCaching => {}
        }
        Ok(())
    }
}

/// Why a value is no `human_readable_int` memplan can hold.
#[derive(Debug, PartialEq, Eq)]
enum NotInt {
    /// Not of its form at all (`32x`, `1.5K`).
    Form,
    /// Of its form, but past 64 bits (`99999999999999999999k`): a number out of range.
    PastU64,
}

/// vLLM's `human_readable_int` (`vllm/engine/arg_utils.py`): digits, or a number with a
/// decimal suffix `k m g t` (10^3..10^12, decimals allowed) or a binary one `K M G T`
/// (2^10..2^40, whole numbers only).
fn human_int(v: &str) -> std::result::Result<u64, NotInt> {
    let v = v.trim();
    if let Ok(x) = v.parse::<u64>() {
        return Ok(x);
    }
    let digits = |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit());
    if digits(v) {
        return Err(NotInt::PastU64);
    }
    // The suffix is the last character, which need not be one byte (`４０９６`).
    let (num, suffix) = v.split_at(v.char_indices().last().ok_or(NotInt::Form)?.0);
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(NotInt::Form);
    }
    let dec = match suffix {
        "k" => Some(1e3),
        "m" => Some(1e6),
        "g" => Some(1e9),
        "t" => Some(1e12),
        _ => None,
    };
    if let Some(m) = dec {
        let x: f64 = num.parse().map_err(|_| NotInt::Form)?;
        let y = (x * m).floor();
        return match y < u64::MAX as f64 {
            true => Ok(y as u64),
            // A number too long for an f64 parses as infinity: past 64 bits too.
            false => Err(NotInt::PastU64),
        };
    }
    let shift = match suffix {
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(NotInt::Form),
    };
    if !digits(num) {
        return Err(NotInt::Form);
    }
    num.parse::<u64>()
        .ok()
        .and_then(|x| x.checked_mul(1 << shift))
        .ok_or(NotInt::PastU64)
}

/// Split a command line as a POSIX shell would: whitespace between words, `'...'` literal,
/// `"..."` with `\` escaping `"`, `\`, `$` and `` ` ``, `\` escaping the next character
/// elsewhere; the command ends at an unquoted `|`, `;`, `&`, `<`, `>` or a `#` that starts a
/// word. An unterminated quote runs to the end.
fn split(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$' | '`')) => {
                            cur.extend(chars.next());
                        }
                        _ => cur.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.extend(chars.next());
            }
            '|' | ';' | '&' | '<' | '>' => break,
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// Fill the figures the engine did not print from the command; where both give one and they
/// differ, the engine's stands and a note says so.
pub(super) fn merge(f: &mut LogFigures, c: &Command) {
    let n = c.line;
    let mut filled: Vec<String> = Vec::new();
    let mut differ: Vec<String> = Vec::new();
    fn one<T: PartialEq + Clone + std::fmt::Display>(
        slot: &mut Option<T>,
        given: &Option<Given<T>>,
        name: &'static str,
        n: usize,
        lines: &mut Vec<(&'static str, usize)>,
        filled: &mut Vec<String>,
        differ: &mut Vec<String>,
    ) {
        let Some(g) = given else { return };
        match slot {
            None => {
                *slot = Some(g.value.clone());
                lines.retain(|(k, _)| *k != name);
                lines.push((name, n));
                filled.push(format!("{} {}", g.flag, g.value));
            }
            Some(own) if *own != g.value => {
                let at = lines
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|l| format!(" (line {})", l.1))
                    .unwrap_or_default();
                differ.push(format!(
                    "{} {} differs from the engine's printed {own}{at}",
                    g.flag, g.value
                ));
            }
            Some(_) => {}
        }
    }
    let lines = &mut f.lines;
    let (fl, di) = (&mut filled, &mut differ);
    one(
        &mut f.utilization,
        &c.utilization,
        "utilization",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.max_model_len,
        &c.max_model_len,
        "max_model_len",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.kv_cache_dtype,
        &c.kv_cache_dtype,
        "kv_cache_dtype",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.block_size,
        &c.block_size,
        "block_size",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.tensor_parallel,
        &c.tensor_parallel,
        "tensor_parallel",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.pipeline_parallel,
        &c.pipeline_parallel,
        "pipeline_parallel",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.max_num_seqs,
        &c.max_num_seqs,
        "max_num_seqs",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.max_num_batched_tokens,
        &c.max_num_batched_tokens,
        "max_num_batched_tokens",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.quantization,
        &c.quantization,
        "quantization",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.mamba_cache_dtype,
        &c.mamba_cache_dtype,
        "mamba_cache_dtype",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.mamba_ssm_cache_dtype,
        &c.mamba_ssm_cache_dtype,
        "mamba_ssm_cache_dtype",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.enable_prefix_caching,
        &c.enable_prefix_caching,
        "enable_prefix_caching",
        n,
        lines,
        fl,
        di,
    );
    one(
        &mut f.enforce_eager,
        &c.enforce_eager,
        "enforce_eager",
        n,
        lines,
        fl,
        di,
    );
    let launcher = c.launcher;
    if !filled.is_empty() {
        f.notes.push(format!(
            "line {n}: from the pasted `{launcher}` command: {} (the engine's printed arguments win over the command where both give a figure; flags given to memplan win over both)",
            filled.join(", ")
        ));
    }
    for d in differ {
        f.notes.push(format!(
            "line {n}: the pasted `{launcher}` command's {d}: the engine's figure is used (it is what the start-up ran with)"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::Error;

    #[test]
    fn splits_as_a_shell_does() {
        assert_eq!(
            split(r#"a 'b c' "d \"e\" f" g\ h --x=1 | tee log"#),
            ["a", "b c", "d \"e\" f", "g h", "--x=1"]
        );
        assert_eq!(split("a  # comment"), ["a"]);
        assert_eq!(split("a b#c"), ["a", "b#c"]);
    }

    #[test]
    fn reads_vllms_human_readable_ints() {
        assert_eq!(human_int("4096"), Ok(4096));
        assert_eq!(human_int("32k"), Ok(32_000));
        assert_eq!(human_int("32K"), Ok(32_768));
        assert_eq!(human_int("25.6k"), Ok(25_600));
        assert_eq!(human_int("1.5K"), Err(NotInt::Form));
        assert_eq!(human_int("k"), Err(NotInt::Form));
        assert_eq!(human_int("12x"), Err(NotInt::Form));
        // A suffix of several bytes (full-width digits pasted from a chat) is no number, not
        // a split inside a character.
        assert_eq!(human_int("４０９６"), Err(NotInt::Form));
        assert_eq!(human_int("4096７"), Err(NotInt::Form));
        assert_eq!(human_int("32é"), Err(NotInt::Form));
        // Of the form but past 64 bits: a number out of range, whatever the suffix.
        let long = format!("{}t", "1".repeat(400));
        for big in [
            "99999999999999999999",
            "99999999999999999999k",
            long.as_str(),
            "99999999999999999999K",
            "17179869184T",
        ] {
            assert_eq!(human_int(big), Err(NotInt::PastU64), "{big}");
        }
    }

    #[test]
    fn unknown_flags_are_skipped_and_errors_name_the_flag() -> Result<()> {
        let c =
            find("$ vllm serve m --port 8000 --served-model-name x -tp 2 --max_model_len=8k\n")?
                .expect("a command");
        assert_eq!(c.line, 1);
        assert_eq!(c.tensor_parallel.as_ref().map(|g| g.value), Some(2));
        assert_eq!(c.max_model_len.as_ref().map(|g| g.value), Some(8000));
        for (cmd, flag) in [
            (
                "vllm serve m --gpu-memory-utilization=high",
                "--gpu-memory-utilization",
            ),
            (
                "vllm serve m --gpu-memory-utilization 1.5",
                "--gpu-memory-utilization",
            ),
            ("vllm serve m --max-model-len 1.5K", "--max-model-len"),
            (
                "vllm serve m --tensor-parallel-size 0",
                "--tensor-parallel-size",
            ),
            ("vllm serve m --block-size", "--block-size"),
            (
                "python -m sglang.launch_server --mem-fraction-static 0",
                "--mem-fraction-static",
            ),
            ("vllm serve m --enforce-eager=maybe", "--enforce-eager"),
            ("vllm serve m --max-model-len ４０９６", "--max-model-len"),
            (
                "vllm serve m --max-num-batched-tokens 8ｋ",
                "--max-num-batched-tokens",
            ),
        ] {
            let e = find(&format!("INFO x\n{cmd}\n")).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains("line 2"), "{cmd}: {e}");
        }
        // A command longer than any shell passes is refused naming its line, before it is
        // split into words (a log of one 250 MiB "command" took gigabytes).
        let long = format!(
            "INFO x\n$ vllm serve m {}\n",
            "--tp 2 ".repeat(MAX_COMMAND / 7 + 1)
        );
        let e = find(&long).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("vllm serve"), "{e}");
        assert!(find(&long[..MAX_COMMAND / 2])?.is_some());
        // An engine's line that names a launcher is no command.
        let warn = "WARNING 01-02 [api_server.py:9] use `vllm serve m --tp 2` instead\n";
        assert_eq!(find(warn)?, None);
        let e: Error = find("vllm serve m --tp 2 --no-enforce-eager=1").unwrap_err();
        assert!(e.to_string().contains("--no-enforce-eager"), "{e}");
        Ok(())
    }
}
