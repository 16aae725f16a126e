//! What a start-up holds beyond the weights, the activation peak and the graphs, as the engine
//! release counts it (vLLM `utils/mem_utils.py` `memory_profiling`, called by
//! `v1/worker/gpu_worker.py` `determine_available_memory`). The snapshot it is measured from is
//! taken in `Worker.init_device` after the CUDA context and the distributed environment
//! (0.20+: "Initialize the distributed environment BEFORE taking memory snapshot"), so the
//! context itself is never counted; what is counted depends on the release's accounting:
//!
//! - up to 0.26 ([`NonKvAccounting::TorchPeak`]): the growth of the memory outside PyTorch's
//!   allocator (`non_torch_increase`): kernel images the first launches load, library handles,
//!   communication buffers. Tensors the model runner allocates before the profile run are not
//!   counted at all (neither weights nor torch peak increase).
//! - from 0.27 ([`NonKvAccounting::Consumed`]): the drop of free memory from the snapshot to
//!   the end of the profile run minus the weights: the same non-torch growth, plus every tensor
//!   the model runner keeps (its persistent buffers, library workspaces), plus, on unified
//!   memory, whatever the process took from the host.
//!
//! Terms, per rank:
//!
//! The fitted figures are the release group's [`Coefficients`] (`EngineRules::coefficients`,
//! with the logs in `engine::coefficients::FITS`); the values below are every vLLM set's.
//!
//! 1. Non-torch growth, by [`DeviceClass`]: 0.25 GiB on Hopper/Blackwell datacenter GPUs (the
//!    six vLLM 0.19 H100 logs of llm-d-planner's report, 0.24-0.25 GiB each), 0.07 GiB on the
//!    others (the vLLM 0.26 log of a 16 GB card, 0.07 GiB; older V1 logs of an A100 40GB and a
//!    24 GB card print 0.02 GiB). With tensor parallelism: +1.82 GiB on the NVSwitch class
//!    (NCCL's NVLink SHARP buffers; the vLLM 0.19 H100 TP 2 log, 2.07 GiB), +0.18 GiB on the
//!    others (NCCL over PCIe or NVLink without NVLS; an RTX 4090 TP 2 log, 0.25 GiB). Pipeline
//!    parallelism alone: 0.07 GiB per stage (llm-d-planner's PP 2 and PP 4 H100 runs).
//! 2. Consumed accounting only: buffers the allocator keeps besides the weights and the
//!    sampler state below (library workspaces, input buffers, allocator segments the profile
//!    run left pinned): 0.07 GiB ([`Coefficients::kept_buffers`]), fitted on the two 0.27+ logs that print consumed
//!    memory and weights (A100 0.31.0 Llama-3.1-8B: 0.061 GiB; RTX 4090 0.27.1
//!    Qwen2.5-0.5B: 0.078 GiB). Hold-out: each predicts the other's consumed memory within
//!    0.017 GiB.
//! 3. Consumed accounting, V2 model runner, a rank that samples: the sampler's per-request
//!    state, read from the code (`v1/worker/gpu/sample/penalties.py` `PenaltiesState`:
//!    `output_bin_counts` int32 `[max_num_reqs, vocab]` and `prompt_bin_mask` int32
//!    `[max_num_reqs, ceil(vocab / 32)]`; `sample/logit_bias.py` `LogitBiasState`: three int32
//!    or float32 tables of 1024 and one of 128 entries per request). Allocated in
//!    `GPUModelRunner.load_model` after the weights are measured, so 0.27+ counts it in
//!    consumed memory and earlier releases do not count it.
//! 4. Unified memory ([`crate::device::unified_memory`]): the token table the runner keeps on
//!    the host, `[max_num_reqs, max_model_len]` int32 (V2: `v1/worker/gpu/states.py`
//!    `RequestState.all_token_ids`, pinned host memory) or int32 plus a bool mask (V1:
//!    `gpu_input_batch.py` `InputBatch.token_ids_cpu_tensor` and `is_token_ids`): on such a
//!    device the engine's free memory is the host's available memory.

use memplan_core::bytes::GIB;

use super::{EngineShape, Estimate};
use crate::config::ModelConfig;
use crate::device::DeviceClass;
#[cfg(doc)]
use crate::engine::{Coefficients, NonKvAccounting};

/// Per-request entries of the V2 sampler's logit-bias and stop tables
/// (`MAX_NUM_ALLOWED_TOKEN_IDS`, `MAX_NUM_LOGIT_BIAS_TOKENS` twice, `MAX_NUM_STOP_TOKEN_IDS`).
const BIAS_TABLE_ENTRIES: u64 = 1024 * 3 + 128;

fn gib(b: u64) -> f64 {
    b as f64 / GIB as f64
}

/// Non-torch growth during start-up: term 1 of the module docs.
pub fn non_torch(s: &EngineShape) -> Estimate {
    let k = &s.coefficients;
    let datacenter = s.device_class == DeviceClass::NvSwitchDatacenter;
    let (base, comm, class) = if datacenter {
        (
            k.non_torch_datacenter,
            k.comm_nvls,
            "Hopper/Blackwell datacenter GPU, NCCL with NVLS",
        )
    } else {
        (
            k.non_torch_other,
            k.comm_other,
            "GPU outside the Hopper/Blackwell datacenter class, NCCL without NVLS",
        )
    };
    if s.tensor_parallel <= 1 && s.pipeline_parallel > 1 {
        // llm-d-planner's vLLM 0.19.0 H100 report (accuracy/results/v0.19.0, "Sensitivity:
        // Pipeline Parallelism"): 0.07 GiB per rank at PP 2 and PP 4 (TP 1).
        return Estimate {
            bytes: k.pipeline_stage,
            basis: format!(
                "estimate: {:.2} GiB per pipeline stage ({} coefficients)",
                gib(k.pipeline_stage),
                k.set
            ),
        };
    }
    if s.tensor_parallel > 1 {
        Estimate {
            bytes: base.saturating_add(comm),
            basis: format!(
                "estimate: {:.2} GiB kernel images and library handles + {:.2} GiB communication buffers ({class}; {} coefficients)",
                gib(base),
                gib(comm),
                k.set
            ),
        }
    } else {
        Estimate {
            bytes: base,
            basis: format!(
                "estimate: {:.2} GiB kernel images and library handles ({class}; {} coefficients)",
                gib(base),
                k.set
            ),
        }
    }
}

/// The V2 sampler's per-request state in bytes for `max_num_seqs` requests over `vocab`
/// tokens: term 3 of the module docs.
pub fn sampler_state_bytes(max_num_seqs: u64, vocab: u64) -> u64 {
    let per_request = vocab
        .saturating_add(vocab.div_ceil(32))
        .saturating_add(BIAS_TABLE_ENTRIES)
        .saturating_mul(4);
    max_num_seqs.saturating_mul(per_request)
}

/// Everything outside the weights, the activation peak and the graphs that the release counts
/// against the KV budget: the sum of the module docs' terms that apply to this start-up.
pub fn non_allocator(c: &ModelConfig, s: &EngineShape) -> Estimate {
    let nt = non_torch(s);
    let mut bytes = nt.bytes;
    let mut parts = vec![nt.basis.trim_start_matches("estimate: ").to_string()];
    let kept = s.coefficients.kept_buffers;
    // Only a release that counts consumed memory (0.27+) has kept buffers, and counts the
    // sampler state allocated after the weights were measured.
    if kept > 0 {
        bytes = bytes.saturating_add(kept);
        parts.push(format!(
            "{:.2} GiB buffers the allocator keeps (counted in consumed memory from vLLM 0.27; {} coefficients)",
            gib(kept),
            s.coefficients.set
        ));
        if s.runner_v2 && s.samples {
            let st = sampler_state_bytes(s.max_num_seqs, c.vocab_size);
            bytes = bytes.saturating_add(st);
            parts.push(format!(
                "{:.2} GiB V2 sampler state ({} requests x vocab {} penalty counts and tables)",
                gib(st),
                s.max_num_seqs,
                c.vocab_size
            ));
        }
    }
    if s.unified_memory && s.max_model_len > 0 {
        let per_cell = if s.runner_v2 { 4 } else { 5 };
        let host = s
            .max_num_seqs
            .saturating_mul(s.max_model_len)
            .saturating_mul(per_cell);
        bytes = bytes.saturating_add(host);
        parts.push(format!(
            "{:.2} GiB host token table ({} requests x {} tokens; unified memory: the engine's free memory is the host's)",
            gib(host),
            s.max_num_seqs,
            s.max_model_len
        ));
    }
    Estimate {
        bytes,
        basis: format!("estimate: {}", parts.join(" + ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    /// The two 0.27+ logs the kept-buffer figure comes from: each is predicted within 0.02 GiB
    /// of its consumed memory minus weights when the figure is fitted on the other alone.
    #[test]
    fn consumed_memory_of_the_logs_it_was_fitted_on() {
        let st = |model: &str, seqs: u64| {
            let c = presets::find(model).unwrap().config;
            gib(sampler_state_bytes(seqs, c.vocab_size))
        };
        let nt = 0.07;
        // A100 80GB, vLLM 0.31.0, Llama-3.1-8B, 256 sequences: consumed 15.26, weights 15.0.
        let a100 = 15.26 - 15.0 - nt - st("meta-llama/Llama-3.1-8B-Instruct", 256);
        // RTX 4090, vLLM 0.27.1, Qwen2.5-0.5B-Instruct, 256 sequences: 1.23 and 0.93.
        let rtx = 1.23 - 0.93 - nt - st("Qwen/Qwen2.5-0.5B-Instruct", 256);
        assert!((a100 - 0.061).abs() < 0.002, "{a100}");
        assert!((rtx - 0.078).abs() < 0.002, "{rtx}");
        assert!((a100 - rtx).abs() < 0.02);
        let kept = crate::engine::coefficients::VLLM_027_028.kept_buffers;
        assert!((gib(kept) - (a100 + rtx) / 2.0).abs() < 0.005);
    }

    #[test]
    fn sampler_state_follows_the_code() {
        // 256 requests x (151936 + 4748 + 3200) x 4 bytes.
        assert_eq!(sampler_state_bytes(256, 151_936), 256 * 159_884 * 4);
        assert_eq!(sampler_state_bytes(u64::MAX, u64::MAX), u64::MAX);
    }
}
