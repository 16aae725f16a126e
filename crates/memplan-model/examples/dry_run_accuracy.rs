//! Benchmark (not a test): the pure dry run (no measured values) against every start-up log
//! whose model has a shipped config. Prints a Markdown table of each estimate's error and of
//! the KV budget's error as a fraction of the device total, then the worst case.
//!
//! ```text
//! cargo run -p memplan-model --example dry_run_accuracy [-- path/to/engine-startup-logs.jsonl]
//! ```
//!
//! The engines in these logs did not subtract graph memory from the KV budget (vLLM <= 0.19),
//! so the budget is compared with graph strategy `none`; the graph estimate is compared with
//! the graph memory the engine reported after capture. Device totals the log did not print
//! come from the vendor figure named in the table (`assumed`).
//!
//! Engine settings the log implies are passed as the engine had them: `max_num_seqs`, when not
//! printed, pairs with the printed `max_num_batched_tokens` as in vLLM's defaults (2048 -> 256,
//! 8192 -> 1024); V0 logs (no "GPU KV cache size" line) ran without chunked prefill, so their
//! profile run covered `max_model_len` tokens.

use memplan_core::bytes::GIB;
use memplan_core::kv::KvDtype;
use memplan_model::dryrun::{DryRun, GraphReserve};
use memplan_model::{presets, Model, Quantization};
use memplan_planner::budget::Request;
use memplan_planner::ConsumerKind;
use serde_json::Value;

/// Device totals for logs that did not print one: (substring of `gpu`, GiB, source).
const TOTALS: &[(&str, f64, &str)] = &[
    ("H200", 140.40, "143,771 MiB (nvidia-smi, data README)"),
    (
        "A100 80GB",
        79.15,
        "81,050 MiB as the driver reports an 80 GB A100",
    ),
    (
        "RTX 4090",
        23.99,
        "24,564 MiB as the driver reports an RTX 4090",
    ),
];

fn gib(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

fn pct(est: u64, logged: Option<f64>) -> String {
    match logged {
        Some(l) if l > 0.0 => format!(
            "{:.2} / {:.2} ({:+.0}%)",
            est as f64 / GIB as f64,
            l,
            (est as f64 / GIB as f64 - l) / l * 100.0
        ),
        _ => format!("{:.2} / -", est as f64 / GIB as f64),
    }
}

fn main() {
    let path = std::env::args().nth(1);
    let text = match &path {
        Some(p) => std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}")),
        None => include_str!("../tests/data/engine-startup-logs.jsonl").to_string(),
    };
    println!("| model | GPU, TP | weights GiB est / log | activation GiB est / log | non-torch GiB est / log | graph GiB est / actual | KV budget GiB est / log | KV error / total | tokens est / log |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut worst: (f64, String) = (0.0, String::new());
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let e: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(err) => panic!("bad line: {err}"),
        };
        let model = e["model"].as_str().unwrap_or("");
        if presets::find(model).is_err() || gib(&e, "available_kv_gib").is_none() {
            continue;
        }
        let gpu = e["gpu"].as_str().unwrap_or("");
        let (total, total_note) = match gib(&e, "gpu_total_gib") {
            Some(t) => (t, String::new()),
            None => match TOTALS.iter().find(|(k, _, _)| gpu.contains(k)) {
                Some((_, t, src)) => (*t, format!(" (assumed {t} GiB: {src})")),
                None => continue,
            },
        };
        let u = |k: &str| e.get(k).and_then(Value::as_u64);
        let tp = u("num_gpus_tp").unwrap_or(1);
        // A V0 log has no "GPU KV cache size" line; an entry without a quote is taken as V1.
        let quote = e["quote"].as_str().unwrap_or("");
        let v0 = !quote.is_empty() && !quote.contains("GPU KV cache size");
        let batched = if v0 {
            u("max_model_len").map(|l| l.max(2048))
        } else {
            u("max_num_batched_tokens")
        };
        let seqs = u("max_num_seqs").or(batched.map(|b| if b >= 8192 && !v0 { 1024 } else { 256 }));
        let input = DryRun::new(
            Model::load(model).expect("preset loads"),
            (total * GIB as f64) as u64,
        )
        .device_name(gpu)
        // The release the log's version selects (vLLM 0.19's rules for older and unversioned
        // logs: these engines did not subtract graph memory either).
        .engine(
            memplan_model::accuracy::release(&e)
                .1
                .unwrap_or_else(|| "vllm@0.19".parse().expect("a row")),
        )
        .request(Request::Utilization(
            gib(&e, "gpu_memory_utilization").unwrap_or(0.9),
        ))
        .kv_cache_dtype(match e["kv_cache_dtype"].as_str() {
            Some("auto") | None => None,
            Some(k) => Some(k.parse::<KvDtype>().expect("kv dtype")),
        })
        .quantization((e["quantization"].as_str() == Some("fp8")).then(Quantization::fp8_online))
        .max_model_len(u("max_model_len"))
        .max_num_seqs(seqs)
        .max_num_batched_tokens(batched)
        .tensor_parallel(tp)
        .enforce_eager(e["enforce_eager"].as_bool() == Some(true))
        .graph_reserve(GraphReserve::None);
        let graph_estimate = input.resolve().map(|r| r.graph_estimate.bytes);
        let p = match input.plan() {
            Ok(p) => p,
            Err(err) => {
                println!("| {model} | {gpu}, TP {tp} | dry run failed: {err} | | | | | | |");
                continue;
            }
        };
        let logged_kv = gib(&e, "available_kv_gib").unwrap_or(0.0);
        let err = (p.kv_budget_bytes as f64 / GIB as f64 - logged_kv) / total;
        let tokens = u("kv_cache_tokens").map_or("-".to_string(), |t| t.to_string());
        println!(
            "| {model} | {gpu}{total_note}, TP {tp} | {} | {} | {} | {} | {} | {:+.2}% | {} / {tokens} |",
            pct(p.consumers.bytes(ConsumerKind::Weights), gib(&e, "weights_gib")),
            pct(p.consumers.bytes(ConsumerKind::Activation), gib(&e, "activation_peak_gib")),
            pct(p.consumers.bytes(ConsumerKind::NonAllocator), gib(&e, "non_torch_gib")),
            pct(graph_estimate.unwrap_or(0), gib(&e, "cuda_graph_actual_gib").filter(|g| *g > 0.0)),
            pct(p.kv_budget_bytes, Some(logged_kv)),
            err * 100.0,
            p.kv.tokens,
        );
        if err.abs() > worst.0.abs() {
            worst = (err, format!("{model} on {gpu}, TP {tp}"));
        }
    }
    println!(
        "\nworst KV-budget error: {:+.2}% of the device total ({})",
        worst.0 * 100.0,
        worst.1
    );
}
