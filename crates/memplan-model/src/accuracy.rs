//! The pure dry run of a logged start-up (one line of a log corpus in the layout of
//! `engine-startup-logs.jsonl`), against the available KV memory the engine logged.
//!
//! Pure: the model's config, the device total, the utilisation and the release, plus the
//! settings the start-up was run with (`max_model_len`, batch sizes, dtype, tensor
//! parallelism, eager mode); nothing the engine measured (weights, activation, non-torch and
//! graph memory come from [`crate::estimate`]). The device's name, as the log gives it, picks
//! the device class and the platform ([`crate::device`]). The release row is the one the log's
//! version selects; a log older than the first row plans with it (and says so in the group
//! name), a log without a version is not checked.
//!
//! Settings the log does not state take the engine's defaults as the engine derived them: the
//! release's default utilisation, the API server's batch defaults for the device
//! (`EngineRules::batch_defaults`), `max_num_seqs` 1024 beside a printed 8192 or more batched
//! tokens (the large-device tier), else 256.

use memplan_core::bytes::GIB;
use memplan_core::kv::KvDtype;
use memplan_planner::budget::Request;
use serde_json::Value;

use crate::dryrun::DryRun;
use crate::engine::coefficients::{refit, Term, FITS};
use crate::engine::{EngineKind, EngineRules};
use crate::{presets, Model, Quantization, Source};

/// Device totals for logs that did not print one, by a fragment of the logged GPU name:
/// (fragment, GiB, where the figure comes from).
pub const TOTALS: &[(&str, f64, &str)] = &[
    (
        "H200",
        140.40,
        "143,771 MiB, nvidia-smi (shared data README)",
    ),
    (
        "A100 80GB",
        79.15,
        "81,050 MiB as the driver reports an 80 GB A100",
    ),
    ("RTX 3090", 23.58, "as vLLM printed it (shared data README)"),
];

/// The pure dry run of one logged start-up.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct DryRunCheck {
    /// The planned KV budget (bytes).
    pub planned_kv: u64,
    /// The logged available KV memory (bytes).
    pub logged_kv: u64,
    /// The device total planned with (bytes).
    pub total: u64,
    /// `(planned - logged) / total`.
    pub error_of_device: f64,
    /// `(planned - logged) / logged`.
    pub error_of_kv: f64,
}

/// The release row a log selects and the group it is reported in: `vLLM 0.27 rules (0.27.1)`,
/// `vLLM before 0.19 (...)` (planned with the oldest row), `SGLang`, or no row for a log
/// without a version.
pub fn release(e: &Value) -> (String, Option<EngineRules>) {
    if e["engine"] == "sglang" {
        return ("SGLang".into(), "sglang".parse().ok());
    }
    let Some(v) = e["vllm_version"].as_str() else {
        return ("vLLM, version not in the log".into(), None);
    };
    let end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let short: Vec<&str> = v[..end].split('.').take(3).collect();
    match format!("vllm@{}", short.join(".")).parse::<EngineRules>() {
        Ok(r) => (
            format!("vLLM {} rules ({})", r.version, short.join(".")),
            Some(r),
        ),
        Err(_) => (
            format!(
                "vLLM before 0.19 ({}; planned with 0.19 rules)",
                short.join(".")
            ),
            "vllm@0.19".parse().ok(),
        ),
    }
}

/// The model a log names, from `extra_configs` (JSONL in the presets' layout) first, then the
/// shipped presets.
fn model_of(name: &str, extra_configs: Option<&str>) -> Result<Model, String> {
    let extra = match extra_configs {
        Some(text) => presets::find_in(text, name).map_err(|e| e.to_string())?,
        None => None,
    };
    if let Some(p) = extra {
        return Ok(Model {
            name: p.model.clone(),
            source: Source::Preset(p.model),
            config: p.config,
            checkpoint: None,
        });
    }
    presets::find(name)
        .map_err(|_| "no shipped config".to_string())
        .and_then(|_| Model::load(name).map_err(|e| e.to_string()))
}

/// The dry-run input of the start-up `e` describes, with `rules`: the model, device total and
/// settings as the engine had them ([`Entry`]). `Err` says why the log cannot be checked (no
/// config, no logged available KV memory, no device total, a setting the dry run refuses).
pub fn entry_input(
    e: &Value,
    rules: &EngineRules,
    extra_configs: Option<&str>,
) -> Result<Entry, String> {
    if rules.kind != EngineKind::Vllm {
        return Err("SGLang: not dry-run checked".into());
    }
    let model = e["model"].as_str().unwrap_or("");
    let m = model_of(model, extra_configs)?;
    let gib = |k: &str| e.get(k).and_then(Value::as_f64);
    let logged_kv = gib("available_kv_gib").ok_or("no logged available KV memory")?;
    let gpu = e["gpu"].as_str().unwrap_or("");
    let total = match gib("gpu_total_gib") {
        Some(t) => t,
        None => TOTALS
            .iter()
            .find(|(k, _, _)| gpu.contains(k))
            .map(|t| t.1)
            .ok_or("no device total")?,
    };
    let u = |k: &str| e.get(k).and_then(Value::as_u64);
    // A V0 engine's log (no "GPU KV cache size" line); an entry without a quote (figures
    // from a report's prose) says nothing either way and is taken as V1.
    let quote = e["quote"].as_str().unwrap_or("");
    let v0 = !quote.is_empty() && !quote.contains("GPU KV cache size");
    let batched = if v0 {
        u("max_model_len").map(|l| l.max(2048))
    } else {
        u("max_num_batched_tokens")
    };
    let seqs = u("max_num_seqs").or(batched.map(|b| if b >= 8192 && !v0 { 1024 } else { 256 }));
    let total_b = (total * GIB as f64) as u64;
    let tp = u("num_gpus_tp").unwrap_or(1);
    let util =
        gib("gpu_memory_utilization").unwrap_or_else(|| rules.default_utilization(total_b, tp, 1));
    let mut d = DryRun::new(m, total_b);
    if let Some(dt) = e["dtype"].as_str() {
        d = d.dtype(dt);
    }
    let kv_dtype = match e["kv_cache_dtype"].as_str() {
        None => None,
        Some(k) => KvDtype::parse_setting(k).map_err(|x| x.to_string())?,
    };
    let input = d
        .engine(rules.clone())
        .device_name(gpu)
        .request(Request::Utilization(util))
        .kv_cache_dtype(kv_dtype)
        .quantization((e["quantization"].as_str() == Some("fp8")).then(Quantization::fp8_online))
        .max_model_len(u("max_model_len"))
        .max_num_seqs(seqs)
        .max_num_batched_tokens(batched)
        .block_size(Some(u("block_size").unwrap_or(16) as u32))
        .tensor_parallel(tp)
        .enforce_eager(e["enforce_eager"].as_bool() == Some(true));
    Ok(Entry {
        input,
        total: total_b,
        logged_kv: (logged_kv * GIB as f64).round() as u64,
    })
}

/// One logged start-up ready to plan: the dry-run input and the figures it is judged by.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Entry {
    /// The dry run of the start-up (model, total, release, settings).
    pub input: DryRun,
    /// The device total planned with (bytes).
    pub total: u64,
    /// The logged available KV memory (bytes).
    pub logged_kv: u64,
}

/// The pure dry run of the start-up `e` describes, planned with `rules`, against the KV
/// memory the engine logged. `Err` as [`entry_input`], or the dry run's refusal.
pub fn dry_run(
    e: &Value,
    rules: &EngineRules,
    extra_configs: Option<&str>,
) -> Result<DryRunCheck, String> {
    let entry = entry_input(e, rules, extra_configs)?;
    let p = entry.input.plan().map_err(|x| x.to_string())?;
    let planned = p.kv_budget_bytes as f64;
    let logged = entry.logged_kv as f64;
    Ok(DryRunCheck {
        planned_kv: p.kv_budget_bytes,
        logged_kv: entry.logged_kv,
        total: entry.total,
        error_of_device: (planned - logged) / entry.total as f64,
        error_of_kv: (planned - logged) / logged,
    })
}

/// The coefficients fitted on the log `e` ([`FITS`] entries whose log its `source` names).
pub fn fitted_on(e: &Value) -> Vec<Term> {
    let src = e["source"].as_str().unwrap_or("");
    let mut terms: Vec<Term> = FITS
        .iter()
        .filter(|f| src.contains(f.log))
        .map(|f| f.term)
        .collect();
    terms.dedup();
    terms
}

/// The hold-out dry run of a log that fitted coefficients: [`dry_run`] with each of them
/// refitted on the other logs alone. `None` when the log fitted nothing (its plain dry run is
/// already held out); `Err` names a coefficient that no other log fits.
pub fn held_out(
    e: &Value,
    rules: &EngineRules,
    extra_configs: Option<&str>,
) -> Option<Result<DryRunCheck, String>> {
    let terms = fitted_on(e);
    if terms.is_empty() {
        return None;
    }
    let src = e["source"].as_str().unwrap_or("");
    let mut r = rules.clone();
    for t in terms {
        match refit(t, Some(src)) {
            Some(bytes) => t.set(&mut r.coefficients, bytes),
            None => return Some(Err("no other log fits it".into())),
        }
    }
    Some(dry_run(e, &r, extra_configs))
}

/// One line of a corpus through [`dry_run`] with the release its version selects.
pub fn dry_run_entry(e: &Value, extra_configs: Option<&str>) -> Result<DryRunCheck, String> {
    match release(e).1 {
        Some(r) => dry_run(e, &r, extra_configs),
        None => Err("no version".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_start_up_is_planned_with_its_release() {
        let e: Value = serde_json::json!({
            "engine": "vllm", "vllm_version": "0.31.0", "gpu": "NVIDIA A100 80GB",
            "gpu_total_gib": 79.25, "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gpu_memory_utilization": 0.92, "available_kv_gib": 56.21, "quote": "GPU KV cache size"
        });
        assert_eq!(release(&e).0, "vLLM 0.31 rules (0.31.0)");
        let c = dry_run_entry(&e, None).unwrap();
        assert!(c.error_of_device.abs() < 0.01, "{c:?}");
        // A log's `auto` is the model's dtype; another name it cannot read is refused, with
        // `auto` among the names it takes.
        let mut kv = e.clone();
        kv["kv_cache_dtype"] = "auto".into();
        assert!(dry_run_entry(&kv, None).is_ok());
        kv["kv_cache_dtype"] = "fp4".into();
        let why = dry_run_entry(&kv, None).unwrap_err();
        assert!(why.contains("expected auto, bf16,"), "{why}");
        let mut none = e.clone();
        none["vllm_version"] = Value::Null;
        assert_eq!(dry_run_entry(&none, None).unwrap_err(), "no version");
        none["vllm_version"] = "0.31.0".into();
        none["model"] = "example/unshipped".into();
        assert_eq!(dry_run_entry(&none, None).unwrap_err(), "no shipped config");
        let configs = r#"{"model":"example/unshipped","source":"test","config":{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":131072,"torch_dtype":"bfloat16"}}"#;
        let c = dry_run_entry(&none, Some(configs)).unwrap();
        assert!(c.error_of_device.abs() < 0.01, "{c:?}");
    }

    #[test]
    fn a_log_that_fitted_coefficients_is_checked_with_them_refitted_without_it() {
        let mut e: Value = serde_json::json!({
            "engine": "vllm", "vllm_version": "0.31.0", "gpu": "NVIDIA A100 80GB",
            "gpu_total_gib": 79.25, "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gpu_memory_utilization": 0.92, "available_kv_gib": 56.21, "quote": "GPU KV cache size",
            "source": "a log nothing was fitted on"
        });
        let rules = release(&e).1.unwrap();
        assert!(fitted_on(&e).is_empty() && held_out(&e, &rules, None).is_none());
        e["source"] = "public repository file, code index ids 70682754770 and 70231782181".into();
        assert_eq!(fitted_on(&e), [Term::KeptBuffers, Term::V2GraphProfiling]);
        let own = dry_run(&e, &rules, None).unwrap();
        let held = held_out(&e, &rules, None).unwrap().unwrap();
        // Refitted on the other logs alone the coefficients differ, and so does the plan.
        assert_ne!(own.planned_kv, held.planned_kv);
        assert!(held.error_of_device.abs() < 0.01, "{held:?}");
        e["source"] = "code index id 69421856836".into();
        assert!(held_out(&e, &rules, None).unwrap().is_err());
    }
}
