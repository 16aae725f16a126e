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
        // A scenario's `memory_budget` (no flag of its own) and anything newer: the concept.
        other => return other.concept().to_string(),
    }
    .to_string()
}

/// An error as the command line prints it: parameters as flags, refusals with the flag values
/// that would fit.
pub fn describe(e: &Error) -> String {
    match e.root() {
        Error::InvalidParam { param, message } => format!("{}: {message}", flag_name(*param)),
        Error::DoesNotFit(r) => r.describe(&flag_name),
        _ => e.to_string(),
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
    fn refusals_name_the_flags_that_would_fit() {
        let e = Error::does_not_fit(Refusal::RequestDoesNotFit {
            max_model_len: 200_000,
            blocks_per_request: 12_500,
            usable_blocks: 9_000,
            kv_bytes: 1 << 30,
            max_model_len_fit: Some(144_000),
        });
        assert!(describe(&e).contains("the longest --max-model-len that fits is 144000"));
        let e = Error::param(Param::Utilization, "1.5 is outside (0, 1]").during("plan");
        assert_eq!(
            describe(&e),
            "--gpu-memory-utilization: 1.5 is outside (0, 1]"
        );
    }
}
