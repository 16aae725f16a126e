//! The parts of `memplan plan` that issue 12 added: `--from-log` (fill the flags from an
//! engine's start-up log), the other memory users (`--speculative-model`, `--max-loras`,
//! `--cpu-offload-gb`, `--pp`) and the llama.cpp answer for `.gguf` models.

use memplan::{Error, Param};
use memplan_model::consumers::Extras;
use memplan_model::engine::{EngineKind, EngineRules};
use memplan_model::Model;
use memplan_planner::{ConsumerKind, Plan};

use super::flags::{Flags, KvChoice, QuantChoice, Strategy};
use crate::contract::Failure;

/// `--from-log`: fill every flag the user did not pass from the log's figures; the notes say
/// where they came from.
pub fn apply_log(a: &mut Flags) -> Result<Vec<String>, Failure> {
    let Some(path) = a.from_log.clone() else {
        return Ok(Vec::new());
    };
    let text = memplan::input::read_text(&path, memplan::input::ENGINE_LOG)?;
    let f = memplan_model::fromlog::parse(&text).map_err(|e| {
        let why = match &e {
            Error::InvalidParam {
                param: Param::EngineLog,
                message,
            } => format!("not a recognised engine start-up log: {message}"),
            other => other.to_string(),
        };
        Error::file(path.display().to_string(), why)
    })?;
    a.total_memory = a.total_memory.or(f.total);
    a.gpu_memory_utilization = a.gpu_memory_utilization.or(f.utilization);
    a.weights_bytes = a.weights_bytes.or(f.weights);
    a.activation_bytes = a.activation_bytes.or(f.activation);
    a.non_torch_bytes = a.non_torch_bytes.or(f.non_torch);
    a.max_model_len = a.max_model_len.or(f.max_model_len);
    a.max_num_batched_tokens = a.max_num_batched_tokens.or(f.max_num_batched_tokens);
    a.max_num_seqs = a.max_num_seqs.or(f.max_num_seqs);
    if let Some(tp) = f.tensor_parallel.filter(|_| a.tensor_parallel_size == 1) {
        a.tensor_parallel_size = tp;
    }
    if a.kv_cache_dtype.0.is_none() {
        if let Some(k) = f.kv_cache_dtype.as_deref().filter(|k| *k != "auto") {
            a.kv_cache_dtype = KvChoice(Some(k.parse()?));
        }
    }
    if a.quantization.0.is_none() && f.quantization.as_deref() == Some("fp8") {
        a.quantization = QuantChoice(Some("fp8".into()));
    }
    // The release that wrote it, when memplan has its rules.
    if a.engine.is_none() {
        let e = match (&f.engine, &f.version) {
            (Some(EngineKind::Sglang), _) => Some("sglang".to_string()),
            (_, Some(v)) => Some(format!("vllm@{v}")),
            _ => None,
        };
        a.engine = e.filter(|e| e.parse::<EngineRules>().is_ok());
    }
    if f.graph_subtracted {
        a.graph_bytes = a.graph_bytes.or(f.graph_estimate);
    } else if f.graph_estimate.is_some() && a.graph_bytes.is_none() {
        // The engine printed its estimate but did not subtract it (vLLM 0.19).
        a.graph_strategy = Strategy::None;
        if a.engine.is_none() {
            a.engine = Some("vllm@0.19".into());
        }
    }
    let mut notes = vec![format!("figures from the log {}", path.display())];
    if let Some(m) = f.model.filter(|m| *m != a.model) {
        notes.push(format!("the log was written for model {m}"));
    }
    if let Some(t) = f.kv_tokens {
        notes.push(format!("the logged engine reported {t} KV tokens"));
    }
    Ok(notes)
}

/// The other memory users from the flags.
pub fn extras(a: &Flags) -> Result<Extras, Failure> {
    if !(a.cpu_offload_gb.is_finite() && a.cpu_offload_gb >= 0.0) {
        return Err(Failure::usage(
            "--cpu-offload-gb must be a non-negative number of GiB",
        ));
    }
    let mut e = Extras::default()
        .with_cpu_offload((a.cpu_offload_gb * (1u64 << 30) as f64) as u64)
        .with_pipeline_parallel(a.pipeline_parallel_size);
    if let Some(m) = &a.speculative_model {
        let draft = Model::load(m).map_err(|e| match e {
            // The draft is named by its own flag, not by `--model`.
            Error::InvalidParam {
                param: Param::Model,
                message,
            } => Failure::usage(format!("--speculative-model: {message}")),
            other => Failure::from(other),
        })?;
        e = e.with_draft(draft.config, a.num_speculative_tokens);
    }
    if let Some(n) = a.max_loras {
        e = e.with_lora(n, a.max_lora_rank);
    }
    Ok(e)
}

/// For a `.gguf` model, the llama.cpp answer: which `-c` and `-ngl` fit the same device
/// budget (what the engine may use minus activations, library memory and graphs), per KV
/// type.
pub fn llama_cpp_answer(a: &Flags, plan: &Plan) -> Result<Vec<String>, Failure> {
    if !a.model.ends_with(".gguf") {
        return Ok(Vec::new());
    }
    let path = std::path::Path::new(&a.model);
    let info = memplan_model::gguf::read(path)?;
    let config = Model::load(&a.model)?.config;
    let c = &plan.consumers;
    let budget = plan.requested.saturating_sub(
        c.bytes(ConsumerKind::Activation)
            + c.bytes(ConsumerKind::NonAllocator)
            + c.bytes(ConsumerKind::Graphs),
    );
    let ctx = a.max_model_len.or(config.derived_max_len).unwrap_or(4096);
    let mut out = Vec::new();
    for kv in ["f16", "q8_0", "q4_0"] {
        let f = memplan_model::gguf::fit(&info, &config, budget, 0, kv, ctx)?;
        out.push(format!(
            "llama.cpp: -c {} -ngl {} --cache-type-k {kv} --cache-type-v {kv} fits ({} of weights and {} of KV cache on the GPU)",
            f.ctx,
            f.ngl,
            memplan::bytes::fmt_bytes(f.weight_bytes),
            memplan::bytes::fmt_bytes(f.kv_bytes)
        ));
    }
    Ok(out)
}
