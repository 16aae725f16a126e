//! The command line's words for the library's concepts: a [`Param`] is a flag here, and an
//! error is worded with the flags a person would change. Library errors name concepts ("GPU
//! memory utilisation"); this is the only place they become flags.

use memplan::{Error, Param};

/// The flag that sets a parameter.
pub fn flag_name(p: Param) -> String {
    match p {
        Param::Utilization => "--gpu-memory-utilization",
        Param::KvCacheBytes => "--kv-cache-memory-bytes",
        Param::DeviceTotal => "--total-memory",
        Param::MaxModelLen => "--max-model-len",
        Param::MaxNumSeqs => "--max-num-seqs",
        Param::MaxNumBatchedTokens => "--max-num-batched-tokens",
        Param::TensorParallel | Param::Ranks => "--tensor-parallel-size",
        Param::CaptureSizes => "--cudagraph-capture-sizes",
        Param::BlockSize => "--block-size",
        Param::Dtype => "--dtype",
        Param::KvCacheDtype => "--kv-cache-dtype",
        Param::Quantization => "--quantization",
        Param::GraphStrategy => "--strategy",
        Param::Device => "--device",
        Param::PipelineParallel => "--pipeline-parallel-size",
        Param::Engine => "--engine",
        Param::EngineLog => "--from-log",
        Param::Model => "--model",
        Param::Scenario => "--scenario",
        Param::NonTorchBytes => "--non-torch-bytes",
        // A scenario's `memory_budget` (no flag of its own) and anything newer: the concept.
        other => return other.concept().to_string(),
    }
    .to_string()
}

/// `text` (an error about the command line `args`) worded with the flags as they were typed:
/// where the user wrote a flag's alias (`--pp`, `--tp`) and not its long name, clap's message
/// names the long name (`--pipeline-parallel-size`); this puts the alias back, so an error
/// names only flags the user passed.
pub fn as_passed<T: AsRef<std::ffi::OsStr>>(text: &str, args: &[T]) -> String {
    use clap::CommandFactory;
    let typed = |name: &str| {
        args.iter().any(|a| {
            a.as_ref().to_str().is_some_and(|a| {
                a == name || a.strip_prefix(name).is_some_and(|r| r.starts_with('='))
            })
        })
    };
    let mut out = text.to_string();
    let cli = crate::Cli::command();
    for cmd in std::iter::once(&cli).chain(cli.get_subcommands()) {
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let long = format!("--{long}");
            if typed(&long) || !out.contains(&long) {
                continue;
            }
            let aliases = arg.get_all_aliases().unwrap_or_default();
            if let Some(alias) = aliases.iter().map(|a| format!("--{a}")).find(|a| typed(a)) {
                // Whole flag names only: `--tp` must not turn `--tp-size` into `--tp-size`.
                out = replace_flag(&out, &long, &alias);
            }
        }
    }
    out
}

/// `text` with every whole occurrence of the flag `from` (not followed by a name character)
/// replaced by `to`.
fn replace_flag(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(from) {
        let after = &rest[i + from.len()..];
        let whole = !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        out.push_str(&rest[..i]);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// An error as the command line prints it: parameters as flags, refusals with the flag values
/// that would fit.
pub fn describe(e: &Error) -> String {
    // A bad flag starts with the flag; anything else with the steps it happened in
    // (`load_weights: `), then the root, refusals in flag names.
    let mut steps = String::new();
    let mut root = e;
    while let Error::During { step, source } = root {
        steps.push_str(step);
        steps.push_str(": ");
        root = source;
    }
    match root {
        Error::InvalidParam { param, message } => format!("{}: {message}", flag_name(*param)),
        Error::DoesNotFit(r) => steps + &r.describe(&flag_name),
        _ => steps + &root.to_string(),
    }
}

/// What is wrong, without the parameter's name: for a value parser, whose error clap already
/// prefixes with the flag.
pub fn without_param(e: &Error) -> String {
    match e.root() {
        Error::InvalidParam { message, .. } => message.clone(),
        _ => describe(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan::Refusal;

    #[test]
    fn not_one_block_names_no_flag_that_may_not_apply() {
        let e = Error::does_not_fit(Refusal::RequestDoesNotFit {
            max_model_len: 4096,
            blocks_per_request: 256,
            usable_blocks: 0,
            kv_bytes: 1024,
            max_model_len_fit: None,
            rounding: None,
            capped: None,
        });
        let d = describe(&e);
        assert!(
            d.contains("give the KV cache more memory")
                && d.contains("--kv-cache-memory-bytes")
                && !d.contains("lower --max-num-batched-tokens or raise"),
            "{d}"
        );
    }

    #[test]
    fn errors_name_the_alias_the_user_typed() {
        let msg = "invalid value '0' for '--pipeline-parallel-size <N>': 0 is outside 1..=1024";
        assert_eq!(
            as_passed(msg, &["plan", "--pp", "0"]),
            "invalid value '0' for '--pp <N>': 0 is outside 1..=1024"
        );
        assert_eq!(
            as_passed(msg, &["plan", "--pp=0"]),
            as_passed(msg, &["--pp", "0"])
        );
        // The long name typed: unchanged.
        assert_eq!(
            as_passed(msg, &["plan", "--pipeline-parallel-size", "0"]),
            msg
        );
        assert_eq!(
            as_passed("--tensor-parallel-size: 4 does not divide", &["--tp", "4"]),
            "--tp: 4 does not divide"
        );
        assert_eq!(
            replace_flag("--tp-x --tp, --tp", "--tp", "--t"),
            "--tp-x --t, --t"
        );
    }

    #[test]
    fn refusals_name_the_flags_that_would_fit() {
        let e = Error::does_not_fit(Refusal::RequestDoesNotFit {
            max_model_len: 200_000,
            blocks_per_request: 12_500,
            usable_blocks: 9_000,
            kv_bytes: 1 << 30,
            max_model_len_fit: Some(144_000),
            rounding: None,
            capped: None,
        });
        assert!(describe(&e).contains("the longest --max-model-len that fits is 144000"));
        let e = Error::param(Param::Utilization, "1.5 is outside (0, 1]").during("plan");
        assert_eq!(
            describe(&e),
            "--gpu-memory-utilization: 1.5 is outside (0, 1]"
        );
    }
}
