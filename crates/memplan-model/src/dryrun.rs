//! The dry run behind `memplan plan`: a model, a device total and the engine's flags in; the
//! budget arithmetic and the KV sizing out, with every figure marked measured (passed by the
//! user) or estimated (with its basis).
//!
//! Pure: no device is touched here; the caller supplies the total (and optionally a snapshot
//! for the start-up free-memory check).

use memplan_core::kv::{KvDtype, KvLimits, KvSizing, KvSpec};
use memplan_core::{Error, MemoryInfo, Result};
use memplan_planner::budget::{self, Budget, Consumers, Request};

use crate::engine::EngineRules;
use crate::estimate::{self, EngineShape, Estimate};
use crate::kvspec::SpecOptions;
use crate::quant::Quantization;
use crate::{dtype_bytes, Model};

/// Values the user measured in an earlier start-up (they replace the estimates).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    /// Weights per rank.
    pub weights: Option<u64>,
    /// Activation peak per rank.
    pub activation: Option<u64>,
    /// Non-allocator growth per rank.
    pub non_torch: Option<u64>,
    /// Graph memory per rank.
    pub graph: Option<u64>,
}

/// How graph memory enters the budget of a dry run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GraphReserve {
    /// Reserve the measured value, else the analytic estimate.
    Reserve,
    /// Reserve nothing (eager, or an engine that does not subtract graph memory).
    None,
}

/// Everything a dry run needs.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// The model.
    pub model: Model,
    /// Device total per rank.
    pub total: u64,
    /// A snapshot for the start-up check (free >= requested), when a device was read.
    pub snapshot: Option<MemoryInfo>,
    /// Utilisation, byte budget or fixed KV size.
    pub request: Request,
    /// Model dtype override (`auto` = config).
    pub dtype: Option<String>,
    /// KV dtype (`None` = the model dtype).
    pub kv_cache_dtype: Option<KvDtype>,
    /// Online quantization (`--quantization fp8`); the checkpoint's own config is used
    /// otherwise.
    pub quantization: Option<Quantization>,
    /// Longest request (`None` = the model's `max_position_embeddings`).
    pub max_model_len: Option<u64>,
    /// Requests per step (`None` = the engine default for this total).
    pub max_num_seqs: Option<u64>,
    /// Tokens per step (`None` = the engine default for this total).
    pub max_num_batched_tokens: Option<u64>,
    /// Tokens per KV block (`None` = the engine release's default).
    pub block_size: Option<u32>,
    /// The engine release whose rules and defaults apply.
    pub engine: EngineRules,
    /// The device's name (engines pick batch defaults by it: the A100 exception).
    pub device_name: String,
    /// Tensor-parallel ranks.
    pub tensor_parallel: u64,
    /// Graph capture sizes (`None` = the engine default).
    pub capture_sizes: Option<Vec<u64>>,
    /// No graphs at all.
    pub enforce_eager: bool,
    /// Graph reserve policy.
    pub graph_reserve: GraphReserve,
    /// Measured values.
    pub measured: Measured,
}

/// One consumer figure and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Figure {
    /// Bytes.
    pub bytes: u64,
    /// `measured`, `checkpoint` (safetensors headers), `estimate` or `not reserved`.
    pub source: &'static str,
    /// How it was obtained.
    pub basis: String,
}

/// The dry run's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DryRun {
    /// Budget arithmetic.
    pub budget: Budget,
    /// KV sizing.
    pub sizing: KvSizing,
    /// The KV spec sized.
    pub kv_spec: KvSpec,
    /// Weights.
    pub weights: Figure,
    /// Activation peak.
    pub activation: Figure,
    /// Non-allocator growth.
    pub non_torch: Figure,
    /// Graph memory (reserved or not).
    pub graph: Figure,
    /// Graph estimate even when not reserved (for comparison).
    pub graph_estimate: Estimate,
    /// Settings actually used (defaults resolved).
    pub max_model_len: u64,
    /// Requests per step used.
    pub max_num_seqs: u64,
    /// Tokens per step used.
    pub max_num_batched_tokens: u64,
    /// Warnings for the user.
    pub warnings: Vec<String>,
    /// Notes: which rule read the config, which engine rules applied, what is estimated.
    pub notes: Vec<String>,
    /// The engine release (`vllm@0.34`).
    pub engine: String,
}

fn figure(measured: Option<u64>, e: Estimate) -> Figure {
    match measured {
        Some(b) => Figure {
            bytes: b,
            source: "measured",
            basis: "passed by the user".into(),
        },
        None => Figure {
            bytes: e.bytes,
            source: "estimate",
            basis: e.basis,
        },
    }
}

/// Run the dry run. Errors: bad flags (naming the flag), a model that does not fit (saying
/// what would fit), a free-memory shortfall at start-up.
pub fn run(input: &PlanInput) -> Result<DryRun> {
    let c = &input.model.config;
    let tp = input.tensor_parallel;
    if tp == 0 {
        return Err(Error::invalid("tensor-parallel-size", "must be > 0"));
    }
    // `auto` is the config's dtype, except that engines downcast float32 checkpoints (vLLM
    // `_resolve_auto_dtype`: to the platform's first supported dtype, bfloat16 on current
    // GPUs; SGLang likewise to 16 bits), and a config without one loads as bfloat16.
    let dtype_name = match input.dtype.as_deref() {
        None | Some("auto") => match c.torch_dtype.as_deref() {
            Some(d) if matches!(dtype_bytes(d), Ok(4)) => "bfloat16".to_string(),
            Some(d) => d.to_string(),
            None => "bfloat16".into(),
        },
        Some(d) => d.to_string(),
    };
    let db = dtype_bytes(&dtype_name).map_err(|e| {
        if input.dtype.is_some() {
            e
        } else {
            Error::invalid("torch_dtype", e.to_string())
        }
    })?;
    // `auto` follows a checkpoint that asks for an fp8 cache (ModelOpt `kv_cache_quant_algo`,
    // compressed-tensors `kv_cache_scheme`; vLLM `resolve_kv_cache_dtype_string`).
    let checkpoint_kv = match c.kv_cache_quant.as_deref() {
        Some(k) if k.starts_with("fp8") => Some(KvDtype::Fp8E4m3),
        _ => None,
    };
    let kv_dtype = match input.kv_cache_dtype.or(checkpoint_kv) {
        Some(k) => k,
        None => match db {
            4 => KvDtype::F32,
            _ if dtype_name.contains("bf") => KvDtype::Bf16,
            _ => KvDtype::F16,
        },
    };
    let engine = &input.engine;
    let (def_seqs, def_tokens) = engine.batch_defaults(input.total, &input.device_name);
    let max_num_seqs = input.max_num_seqs.unwrap_or(def_seqs);
    let max_model_len = match (
        input.max_model_len,
        c.derived_max_len.or(c.max_position_embeddings),
    ) {
        (Some(0), _) => return Err(Error::invalid("max-model-len", "must be > 0")),
        (Some(n), _) => n,
        (None, Some(n)) if n > 0 => n,
        (None, _) => {
            return Err(Error::invalid(
                "max-model-len",
                "the config has no usable max_position_embeddings; pass --max-model-len",
            ))
        }
    };
    // `_set_default_max_num_seqs_and_batched_tokens_args`: the default never exceeds
    // max_num_seqs * max_model_len.
    let max_num_batched_tokens = input
        .max_num_batched_tokens
        .unwrap_or_else(|| def_tokens.min(max_num_seqs.saturating_mul(max_model_len)));
    for (k, v) in [
        ("max-num-seqs", max_num_seqs),
        ("max-num-batched-tokens", max_num_batched_tokens),
    ] {
        if v == 0 {
            return Err(Error::invalid(k, "must be > 0"));
        }
    }
    if let Some(bad) = input
        .capture_sizes
        .iter()
        .flatten()
        .find(|s| **s == 0 || **s > 1 << 20)
    {
        return Err(Error::invalid(
            "cudagraph-capture-sizes",
            format!("{bad} is not a batch size a graph can be captured for (1 to 1048576)"),
        ));
    }
    let capture_sizes = if input.enforce_eager {
        Vec::new()
    } else {
        input
            .capture_sizes
            .clone()
            .unwrap_or_else(|| estimate::default_capture_sizes(max_num_seqs))
    };
    let shape = EngineShape {
        max_num_seqs,
        max_num_batched_tokens,
        tensor_parallel: tp,
        capture_sizes,
        dtype_bytes: db,
    };
    let opts = SpecOptions {
        state_pages: (engine.state_pages(false), engine.state_pages(true)),
        hybrid_block_align: match (c.mla.is_some(), engine.block_size >= 64) {
            (true, true) => 128,
            (true, false) => 64,
            (false, _) => engine.hybrid_block_align,
        },
        dtype_bytes: db,
    };
    let block_size = input.block_size.unwrap_or(engine.block_size);
    let kv_spec = c.kv_spec_with(kv_dtype, block_size, tp, &opts)?;
    let mut warnings = Vec::new();
    let mut notes = vec![c.rule.clone()];
    notes.extend(c.notes.iter().cloned());
    if checkpoint_kv.is_some() && input.kv_cache_dtype.is_none() {
        notes.push(format!(
            "--kv-cache-dtype auto: the checkpoint asks for an {} KV cache",
            c.kv_cache_quant.as_deref().unwrap_or("fp8")
        ));
    }
    if kv_spec.block_size != block_size {
        notes.push(format!(
            "block size {} (not {block_size}): an attention page must hold a recurrent state (vLLM `_align_hybrid_block_size`)",
            kv_spec.block_size
        ));
    }
    // vLLM turns the hybrid manager off for chunked local attention (`VllmConfig`), so
    // those layers are sized as full attention.
    let hybrid_manager = !c
        .layers
        .iter()
        .any(|k| matches!(k, crate::config::LayerKind::Chunked(_)));
    if !hybrid_manager {
        notes.push("chunked local attention: the hybrid KV-cache manager is off by default, so those layers are sized as full attention".into());
    }
    let rules = engine.sizing(1, hybrid_manager);

    let quant = input.quantization.as_ref().or(c.quantization.as_ref());
    let weights = match (input.measured.weights, &input.model.checkpoint) {
        (Some(b), _) => Figure {
            bytes: b,
            source: "measured",
            basis: "passed by the user".into(),
        },
        (None, Some(s)) if input.quantization.is_none() => Figure {
            bytes: s.per_rank_as(tp, db, c.quantization.is_some()),
            source: "checkpoint",
            basis: format!(
                "safetensors headers: {} tensors, floating-point ones at {db} bytes, split over {tp} rank(s)",
                s.tensors
            ),
        },
        _ => {
            let b = crate::weights::weight_bytes(c, tp, db, quant)?;
            let q = quant
                .map(|q| format!(", {} at {:.2} bits per weight", q.method, q.bits_per_weight))
                .unwrap_or_default();
            Figure {
                bytes: b,
                source: "estimate",
                basis: format!(
                    "estimate: parameters from the architecture at {db} bytes{q}, per rank of {tp}"
                ),
            }
        }
    };
    let activation = figure(input.measured.activation, estimate::activation(c, &shape));
    let non_torch = figure(input.measured.non_torch, estimate::non_torch(&shape));
    let graph_estimate = estimate::graph(c, &shape);
    let graph = if input.enforce_eager {
        Figure {
            bytes: 0,
            source: "not reserved",
            basis: "eager: no graphs".into(),
        }
    } else {
        match input.graph_reserve {
            GraphReserve::Reserve => figure(input.measured.graph, graph_estimate.clone()),
            GraphReserve::None => {
                warnings.push(format!("graph memory is not reserved (graph strategy none); capture will take about {:.2} GiB outside the budget", graph_estimate.bytes as f64 / (1u64 << 30) as f64));
                Figure {
                    bytes: 0,
                    source: "not reserved",
                    basis: "graph strategy none".into(),
                }
            }
        }
    };

    let consumers = Consumers {
        weights: weights.bytes,
        activation: activation.bytes,
        non_allocator: non_torch.bytes,
        graph_reserve: graph.bytes,
    };
    let budget = budget::compute(input.total, input.request, consumers)?;
    if let Some(s) = &input.snapshot {
        budget::check_free(s, budget.requested, "the engine's requested memory")?;
    }
    let limits = KvLimits {
        max_model_len,
        max_num_batched_tokens,
        max_len_limit: max_model_len
            .max(c.derived_max_len.or(c.max_position_embeddings).unwrap_or(0)),
    };
    let sizing = kv_spec.size_with(budget.kv_budget, &limits, &rules)?;
    if sizing.max_concurrency < 1.0 {
        let fit = match sizing.max_model_len_fit {
            Some(n) => format!("the largest --max-model-len that fits is {n}"),
            None => "not even one block fits: lower --max-num-batched-tokens or raise --gpu-memory-utilization".into(),
        };
        return Err(Error::DoesNotFit(format!(
            "one request of {max_model_len} tokens needs {} KV blocks but only {} fit in {:.2} GiB; {fit}",
            sizing.blocks_per_request,
            sizing.usable_blocks,
            budget.kv_budget as f64 / (1u64 << 30) as f64
        )));
    }
    if c.derived_max_len
        .or(c.max_position_embeddings)
        .is_some_and(|m| max_model_len > m)
    {
        warnings.push(format!(
            "--max-model-len {max_model_len} exceeds the model's max_position_embeddings"
        ));
    }
    if tp > 1 {
        warnings.push(format!(
            "figures are per rank; the engine sizes all {tp} ranks like the smallest"
        ));
    }
    Ok(DryRun {
        budget,
        sizing,
        kv_spec,
        weights,
        activation,
        non_torch,
        graph,
        graph_estimate,
        max_model_len,
        max_num_seqs,
        max_num_batched_tokens,
        warnings,
        notes,
        engine: engine.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{safetensors, ModelConfig, Source};
    use memplan_core::bytes::GIB;

    fn input(config: &str, checkpoint: Option<&str>, dtype: &str) -> PlanInput {
        let config = ModelConfig::from_json_str(config).unwrap();
        PlanInput {
            model: Model {
                name: "m".into(),
                source: Source::Path("m".into()),
                config,
                checkpoint: checkpoint
                    .map(|h| safetensors::parse_header("h", h.as_bytes()).unwrap()),
            },
            total: 24 * GIB,
            snapshot: None,
            request: Request::Utilization(0.9),
            dtype: Some(dtype.into()),
            kv_cache_dtype: None,
            quantization: None,
            max_model_len: Some(4096),
            max_num_seqs: None,
            max_num_batched_tokens: None,
            block_size: Some(16),
            engine: "vllm@0.19".parse().unwrap(),
            device_name: String::new(),
            tensor_parallel: 1,
            capture_sizes: None,
            enforce_eager: true,
            graph_reserve: GraphReserve::Reserve,
            measured: Measured::default(),
        }
    }

    const LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":1024,"num_hidden_layers":4,
        "num_attention_heads":8,"num_key_value_heads":8,"intermediate_size":4096,"vocab_size":32000,
        "max_position_embeddings":4096,"torch_dtype":"DTYPE"}"#;

    #[test]
    fn auto_dtype_downcasts_float32_checkpoints_like_the_engines() {
        let f32 = run(&input(&LLAMA.replace("DTYPE", "float32"), None, "auto")).unwrap();
        let bf16 = run(&input(&LLAMA.replace("DTYPE", "bfloat16"), None, "auto")).unwrap();
        assert_eq!(f32.kv_spec.dtype, KvDtype::Bf16);
        assert_eq!(f32.weights.bytes, bf16.weights.bytes);
        assert_eq!(f32.sizing.tokens, bf16.sizing.tokens);
        // An explicit float32 is honoured.
        let forced = run(&input(&LLAMA.replace("DTYPE", "float32"), None, "float32")).unwrap();
        assert_eq!(forced.kv_spec.dtype, KvDtype::F32);
    }

    #[test]
    fn absurd_capture_sizes_name_the_flag() {
        for sizes in [vec![0, 8], vec![1, u64::MAX]] {
            let mut i = input(&LLAMA.replace("DTYPE", "bfloat16"), None, "auto");
            i.enforce_eager = false;
            i.capture_sizes = Some(sizes);
            let e = run(&i).unwrap_err().to_string();
            assert!(e.starts_with("cudagraph-capture-sizes"), "{e}");
        }
    }

    #[test]
    fn checkpoint_bytes_follow_the_loaded_dtype() {
        let h = r#"{"w":{"dtype":"BF16","shape":[1024,1024],"data_offsets":[0,2097152]}}"#;
        let cfg = LLAMA.replace("DTYPE", "bfloat16");
        let bf16 = run(&input(&cfg, Some(h), "auto")).unwrap();
        assert_eq!(
            (bf16.weights.source, bf16.weights.bytes),
            ("checkpoint", 2 << 20)
        );
        // Served in float32, the same tensors take twice the file's bytes.
        let f32 = run(&input(&cfg, Some(h), "float32")).unwrap();
        assert_eq!(f32.weights.bytes, 4 << 20);
    }
}
