//! Analytic estimates of what an engine measures at start-up, each labelled with its basis.
//! They stand in for measurements in a dry run; passing measured values replaces them.
//!
//! - **Activation peak** (allocator peak above the weights during the profile run): the larger
//!   of the forward pass over `max_num_batched_tokens` (gated MLP intermediates plus four
//!   hidden-size buffers) and the sampler over `min(max_num_seqs, max_num_batched_tokens)`
//!   rows (plus 2.5 hidden-size buffers of the batch still alive). The sampler's peak per
//!   logit (row x full vocabulary, on every rank) depends on the model runner:
//!   [`SAMPLER_V1`] (3.5 fp32 copies: logits, probabilities, sort buffers) from vLLM 0.19's
//!   profile runs on H100 (six logs in `docs/model-validation.md`); for the V2 runner one
//!   copy of the logits in the activation dtype ([`sampler_v2`]): its dummy sampler
//!   (`v1/worker/gpu/model_runner.py` `_dummy_sampler_run`) computes the logits in the model
//!   dtype (`layers/logits_processor.py`) and, for the dummy greedy requests,
//!   `sample/sampler.py` `apply_sampling_params` returns them untouched (the float32 copy is
//!   made only for requests with penalties, bias, temperature or top-k/top-p).
//! - **Non-allocator growth**: 0.25 GiB of library workspaces (cuBLAS/cuBLASLt), plus 1.82 GiB
//!   of communication buffers (NCCL, custom all-reduce) when tensor parallelism is on; both
//!   observed in the same logs. With pipeline parallelism alone, 0.07 GiB per stage (the
//!   PP 2 and PP 4 runs of llm-d-planner's vLLM 0.19 H100 accuracy report).
//! - **Graph memory**: per captured size, one piecewise graph per layer plus one, each costing
//!   five kernel nodes of ~64 KiB (the public figure for a graph exec's kernel node); plus the
//!   graph pool of the largest capture size's activations, plus a fixed 0.35 GiB observed as
//!   the intercept over six models. `0` when eager.

use memplan_core::bytes::{GIB, KIB};

use crate::config::ModelConfig;

/// An estimated byte count and how it was obtained.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Estimate {
    /// Bytes.
    pub bytes: u64,
    /// How the figure was obtained (shown to the user).
    pub basis: String,
}

/// Sampler peak per logit of the V1 model runner (bytes): 3.5 float32 copies of the logits.
pub const SAMPLER_V1: u64 = 14;

/// Sampler peak per logit of the V2 model runner (bytes): one copy of the logits in the
/// activation dtype of `dtype_bytes` bytes.
pub const fn sampler_v2(dtype_bytes: u64) -> u64 {
    dtype_bytes
}

/// The engine settings the estimates depend on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct EngineShape {
    /// Requests per step.
    pub max_num_seqs: u64,
    /// Tokens per step.
    pub max_num_batched_tokens: u64,
    /// Tensor-parallel ranks.
    pub tensor_parallel: u64,
    /// Pipeline-parallel stages (1 = off).
    pub pipeline_parallel: u64,
    /// Whether this rank runs the sampler: only the last pipeline stage does
    /// (`v1/worker/gpu/model_runner.py` `profile_run`: "Only run sampler/pooler on last PP
    /// rank"), so the other stages' activation peak is the forward pass alone.
    pub samples: bool,
    /// Batch sizes captured as graphs (empty when eager).
    pub capture_sizes: Vec<u64>,
    /// Activation dtype size in bytes.
    pub dtype_bytes: u64,
    /// The sampler's peak per logit in bytes ([`SAMPLER_V1`] or [`sampler_v2`], by the model
    /// runner the engine starts the model on).
    pub sampler_bytes_per_logit: u64,
}

impl EngineShape {
    /// `max_num_seqs` requests and `max_num_batched_tokens` tokens per step, one rank, bf16
    /// activations, vLLM's default capture sizes for `max_num_seqs`.
    pub fn new(max_num_seqs: u64, max_num_batched_tokens: u64) -> Self {
        Self {
            max_num_seqs,
            max_num_batched_tokens,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            samples: true,
            capture_sizes: default_capture_sizes(max_num_seqs),
            dtype_bytes: 2,
            sampler_bytes_per_logit: SAMPLER_V1,
        }
    }

    /// The same shape with a sampler of `bytes` peak per logit.
    pub fn with_sampler_bytes_per_logit(mut self, bytes: u64) -> Self {
        self.sampler_bytes_per_logit = bytes;
        self
    }

    /// The same shape over `ranks` tensor-parallel ranks.
    pub fn with_tensor_parallel(mut self, ranks: u64) -> Self {
        self.tensor_parallel = ranks;
        self
    }

    /// The same shape over `stages` pipeline-parallel stages.
    pub fn with_pipeline_parallel(mut self, stages: u64) -> Self {
        self.pipeline_parallel = stages;
        self
    }

    /// The same shape capturing graphs of `sizes` (empty = eager).
    pub fn with_capture_sizes(mut self, sizes: Vec<u64>) -> Self {
        self.capture_sizes = sizes;
        self
    }

    /// The same shape with activations of `bytes` per element.
    pub fn with_dtype_bytes(mut self, bytes: u64) -> Self {
        self.dtype_bytes = bytes;
        self
    }
}

/// vLLM's defaults for a device of `total` bytes (v0.12+: 1024 sequences and 8192 batched
/// tokens for the API server on devices of 70 GiB or more, else 256 and 2048).
pub fn default_limits(total: u64) -> (u64, u64) {
    if total >= 70 * GIB {
        (1024, 8192)
    } else {
        (256, 2048)
    }
}

/// vLLM's default capture sizes: `[1, 2, 4]`, then steps of 8 to 256, then steps of 16, up to
/// `min(2 * max_num_seqs, 512)`.
pub fn default_capture_sizes(max_num_seqs: u64) -> Vec<u64> {
    let max = (2 * max_num_seqs).min(512);
    let mut v: Vec<u64> = [1, 2, 4].into_iter().filter(|s| *s <= max).collect();
    v.extend((8..256.min(max + 1)).step_by(8));
    v.extend((256..=max).step_by(16));
    v
}

/// The activation peak of the profile run.
pub fn activation(c: &ModelConfig, s: &EngineShape) -> Estimate {
    let tp = s.tensor_parallel.max(1);
    let t = s.max_num_batched_tokens;
    let b = s.dtype_bytes;
    let inter = match c.moe {
        Some(m) => m
            .top_k
            .saturating_mul(m.expert_intermediate)
            .saturating_add(m.shared_intermediate)
            .max(c.intermediate_size),
        None => c.intermediate_size,
    } / tp;
    // Saturating: absurd flags give an absurd (huge) estimate, never an overflow.
    let forward = t
        .saturating_mul(
            inter
                .saturating_mul(3)
                .saturating_add(c.hidden_size.saturating_mul(4)),
        )
        .saturating_mul(b);
    let rows = s.max_num_seqs.min(t);
    // Logits are gathered to the full vocabulary on every rank before sampling.
    let logits = rows
        .saturating_mul(c.vocab_size)
        .saturating_mul(s.sampler_bytes_per_logit);
    let hidden = t.saturating_mul(c.hidden_size).saturating_mul(b);
    let sampler = logits.saturating_add((hidden / 2).saturating_mul(5));
    let sampler = if s.samples { sampler } else { 0 };
    let (bytes, which) = if forward > sampler || !s.samples {
        (forward, "forward pass")
    } else {
        (sampler, "sampler")
    };
    Estimate {
        bytes,
        basis: format!(
            "estimate: max(forward over {t} tokens = {:.2} GiB, sampler over {rows} rows x vocab {} x {} bytes = {:.2} GiB), {which} dominates; {}",
            forward as f64 / GIB as f64,
            c.vocab_size,
            s.sampler_bytes_per_logit,
            sampler as f64 / GIB as f64,
            if s.sampler_bytes_per_logit != SAMPLER_V1 {
                "the V2 runner's sampler keeps one copy of the logits (vLLM 0.22+)"
            } else {
                "coefficients from vLLM 0.19 profile runs"
            }
        ),
    }
}

/// Memory taken outside the allocator during start-up.
pub fn non_torch(s: &EngineShape) -> Estimate {
    let base = GIB / 4;
    if s.tensor_parallel <= 1 && s.pipeline_parallel > 1 {
        // llm-d-planner's vLLM 0.19.0 H100 report (accuracy/results/v0.19.0, "Sensitivity:
        // Pipeline Parallelism"): 0.07 GiB per rank at PP 2 and PP 4 (TP 1), against 0.25
        // GiB without pipeline parallelism.
        return Estimate {
            bytes: (0.07 * GIB as f64) as u64,
            basis:
                "estimate: 0.07 GiB per pipeline stage (observed, vLLM 0.19, PP 2 and 4 on H100)"
                    .into(),
        };
    }
    if s.tensor_parallel > 1 {
        let comm = (1.82 * GIB as f64) as u64;
        Estimate { bytes: base + comm, basis: "estimate: 0.25 GiB library workspaces + 1.82 GiB communication buffers (observed, vLLM 0.19, TP 2 on H100)".into() }
    } else {
        Estimate {
            bytes: base,
            basis: "estimate: 0.25 GiB library workspaces (observed, vLLM 0.19 on H100)".into(),
        }
    }
}

/// Graph memory for the capture sizes.
pub fn graph(c: &ModelConfig, s: &EngineShape) -> Estimate {
    if s.capture_sizes.is_empty() {
        return Estimate {
            bytes: 0,
            basis: "no graphs (eager)".into(),
        };
    }
    let tp = s.tensor_parallel.max(1);
    let n = s.capture_sizes.len() as u64;
    let nodes = n
        .saturating_mul(c.num_layers + 1)
        .saturating_mul(5 * 64 * KIB);
    let largest = s.capture_sizes.iter().copied().max().unwrap_or(0);
    let width = (c.intermediate_size.saturating_mul(3) / tp)
        .saturating_add(c.hidden_size.saturating_mul(4));
    let pool = largest.saturating_mul(width).saturating_mul(s.dtype_bytes);
    let fixed = (0.35 * GIB as f64) as u64;
    Estimate {
        bytes: nodes.saturating_add(pool).saturating_add(fixed),
        basis: format!(
            "estimate: {n} sizes x {} piecewise graphs x 5 kernel nodes x 64 KiB = {:.2} GiB, pool of the largest size ({largest}) {:.2} GiB, fixed 0.35 GiB (observed intercept)",
            c.num_layers + 1,
            nodes as f64 / GIB as f64,
            pool as f64 / GIB as f64
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    fn shape(tp: u64) -> EngineShape {
        EngineShape {
            max_num_seqs: 1024,
            max_num_batched_tokens: 8192,
            tensor_parallel: tp,
            pipeline_parallel: 1,
            samples: true,
            capture_sizes: default_capture_sizes(1024),
            dtype_bytes: 2,
            sampler_bytes_per_logit: SAMPLER_V1,
        }
    }

    #[test]
    fn capture_sizes_follow_the_engine() {
        let v = default_capture_sizes(1024);
        assert_eq!(
            (v.len(), v[..4].to_vec(), *v.last().unwrap()),
            (51, vec![1, 2, 4, 8], 512)
        );
        assert_eq!(default_capture_sizes(1), vec![1, 2]);
    }

    #[test]
    fn llama_8b_near_the_logged_figures() {
        let c = presets::find("llama-3.1-8b-instruct").unwrap().config;
        let a = activation(&c, &shape(1)).bytes as f64 / GIB as f64;
        assert!((a - 1.89).abs() < 0.1, "{a}");
        let g = graph(&c, &shape(1)).bytes as f64 / GIB as f64;
        assert!((g - 0.91).abs() < 0.15, "{g}");
        assert_eq!(
            non_torch(&shape(2)).bytes,
            GIB / 4 + (1.82 * GIB as f64) as u64
        );
        let eager = EngineShape {
            capture_sizes: vec![],
            ..shape(1)
        };
        assert_eq!(graph(&c, &eager).bytes, 0);
    }
}
