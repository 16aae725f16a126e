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
//! - **Non-allocator memory** ([`non_allocator()`]): what the release counts beyond weights,
//!   activations and graphs: non-torch growth by device class, communication buffers, and from
//!   vLLM 0.27 the buffers the model runner keeps (the V2 sampler's per-request state read from
//!   the code); the terms and the logs behind each are in the module
//!   [`non_allocator`](mod@non_allocator).
//! - **Graph memory**: per captured size, one piecewise graph per layer plus one, each costing
//!   five kernel nodes of ~64 KiB (the public figure for a graph exec's kernel node); plus the
//!   graph pool of the largest capture size's activations, plus a fixed 0.35 GiB observed as
//!   the intercept over six models. `0` when eager.

use memplan_core::bytes::{GIB, KIB};

use crate::config::ModelConfig;
use crate::device::DeviceClass;
use crate::engine::{coefficients, Coefficients};

pub mod non_allocator;
pub use non_allocator::{non_allocator, non_torch, sampler_state_bytes};

/// An estimated byte count and how it was obtained.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Estimate {
    /// Bytes.
    pub bytes: u64,
    /// How the figure was obtained (shown to the user).
    pub basis: String,
}

/// Sampler peak per logit of the V1 model runner (bytes) as fitted on vLLM 0.19's logs: 3.5
/// float32 copies of the logits (every release's figure is its rules' [`Coefficients`]).
pub const SAMPLER_V1: u64 = coefficients::VLLM_019.sampler_v1_bytes_per_logit;

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
    /// Whether the engine starts the model on its V2 model runner (persistent sampler state).
    pub runner_v2: bool,
    /// The release group's fitted figures (`EngineRules::coefficients`).
    pub coefficients: Coefficients,
    /// The class of GPU the non-torch estimate follows.
    pub device_class: DeviceClass,
    /// Whether the device's memory is the host's (the engine reads the host's available
    /// memory, so its host buffers count).
    pub unified_memory: bool,
    /// The longest request (sizes the runner's token table; `0` = not known).
    pub max_model_len: u64,
}

impl EngineShape {
    /// `max_num_seqs` requests and `max_num_batched_tokens` tokens per step, one rank, bf16
    /// activations, vLLM's default capture sizes for `max_num_seqs`, the V1 runner and vLLM
    /// 0.19's coefficients on a Hopper-class device (the set-up of the logs those were fitted
    /// on).
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
            runner_v2: false,
            coefficients: coefficients::VLLM_019,
            device_class: DeviceClass::NvSwitchDatacenter,
            unified_memory: false,
            max_model_len: 0,
        }
    }

    /// The same shape with a release group's fitted figures.
    pub fn with_coefficients(mut self, c: Coefficients) -> Self {
        self.coefficients = c;
        self
    }

    /// The same shape on a device of `class`.
    pub fn with_device_class(mut self, class: DeviceClass) -> Self {
        self.device_class = class;
        self
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
            if s.runner_v2 {
                "the V2 runner's sampler keeps one copy of the logits (read from the code)".to_string()
            } else {
                format!("the V1 sampler's bytes per logit of the {} coefficients", s.coefficients.set)
            }
        ),
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
    let fixed = s.coefficients.graph_fixed;
    let captured = nodes.saturating_add(pool).saturating_add(fixed);
    let basis = format!(
        "estimate: {n} sizes x {} piecewise graphs x 5 kernel nodes x 64 KiB = {:.2} GiB, pool of the largest size ({largest}) {:.2} GiB, fixed {:.2} GiB (observed intercept; {} coefficients)",
        c.num_layers + 1,
        nodes as f64 / GIB as f64,
        pool as f64 / GIB as f64,
        fixed as f64 / GIB as f64,
        s.coefficients.set
    );
    let surplus = s.coefficients.v2_graph_profiling;
    if !s.runner_v2 || surplus == 0 {
        return Estimate {
            bytes: captured,
            basis,
        };
    }
    Estimate {
        bytes: captured.saturating_add(surplus),
        basis: format!(
            "{basis}, + {:.2} GiB the V2 runner's graph profiler measures beyond the capture (kernel images its throwaway capture loads first, FULL graphs extrapolated from the second-largest)",
            surplus as f64 / GIB as f64
        ),
    }
}

/// What the V2 model runner's graph-memory estimate (`v1/worker/gpu/cudagraph_utils.py`
/// `profile_cudagraph_memory`, subtracted from the KV budget from vLLM 0.29) measures beyond
/// the graphs themselves: it captures every piecewise graph and the two largest FULL graphs
/// into a throwaway pool before any warm-up, so the free-memory drop it takes also holds the
/// kernel images those captures load first (the profile run skipped attention), and the
/// remaining FULL graphs are extrapolated as `(n - 1) x` the second-largest's cost. The
/// vLLM 0.29-0.34 set's figure ([`Coefficients::v2_graph_profiling`]), fitted on the two
/// 0.29+ logs with a dry-run-checkable model (A100 0.31.0 Llama-3.1-8B: 0.31 GiB between the logged and the planned non-KV memory; RTX 4070 Laptop 0.30.0
/// Qwen2.5-1.5B-Instruct: 0.21 GiB, its weights' 0.10 GiB above the architecture's count
/// set aside). Hold-out (the generated validation tables): fitted on either alone, the other
/// is planned within +0.10% (A100) and +0.03% (RTX 4070 Laptop) of its device.
pub const V2_GRAPH_PROFILING: u64 = coefficients::VLLM_029_034.v2_graph_profiling;

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
            ..EngineShape::new(1024, 8192)
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
