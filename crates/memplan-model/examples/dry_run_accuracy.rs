//! Benchmark (not a test): the pure dry run (no measured values) against every start-up log
//! whose model has a shipped config, each term beside what the engine logged. Prints a
//! Markdown table of each estimate's error and of the KV budget's error as a fraction of the
//! device total, then the worst case.
//!
//! ```text
//! cargo run -p memplan-model --example dry_run_accuracy [-- path/to/engine-startup-logs.jsonl]
//! ```
//!
//! Each log is planned as `memplan_model::accuracy` plans it (the validation test's own
//! reading: the release its version selects, vLLM 0.19's rules for a log without one, the
//! device totals of [`accuracy::TOTALS`] where the log printed none, the settings the log
//! implies); this example only lays the terms side by side. The graph estimate is compared
//! with the graph memory the engine reported after capture, whether or not the release
//! subtracts it.

use memplan_core::bytes::GIB;
use memplan_model::accuracy;
use memplan_planner::ConsumerKind;
use serde_json::Value;

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
    println!("| model | GPU, TP | release | weights GiB est / log | activation GiB est / log | non-torch GiB est / log | graph GiB est / actual | KV budget GiB est / log | KV error / total | tokens est / log |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut worst: (f64, String) = (0.0, String::new());
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let e: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(err) => panic!("bad line: {err}"),
        };
        let (mut group, rules) = accuracy::release(&e);
        let rules = rules.unwrap_or_else(|| {
            group.push_str(" (planned with 0.19 rules)");
            "vllm@0.19".parse().expect("a row")
        });
        let model = e["model"].as_str().unwrap_or("");
        let gpu = e["gpu"].as_str().unwrap_or("");
        let tp = e.get("num_gpus_tp").and_then(Value::as_u64).unwrap_or(1);
        let entry = match accuracy::entry_input(&e, &rules, None) {
            Ok(x) => x,
            // No shipped config, no logged KV memory or no device total: nothing to compare.
            Err(_) => continue,
        };
        let graph_estimate = entry.input.resolve().map(|r| r.graph_estimate.bytes);
        let p = match entry.input.plan() {
            Ok(p) => p,
            Err(err) => {
                println!(
                    "| {model} | {gpu}, TP {tp} | {group} | dry run failed: {err} | | | | | | |"
                );
                continue;
            }
        };
        let total = entry.total as f64;
        let assumed = match gib(&e, "gpu_total_gib") {
            Some(_) => String::new(),
            None => accuracy::TOTALS
                .iter()
                .find(|(k, _, _)| gpu.contains(k))
                .map_or(String::new(), |(_, _, src)| format!(" assumed: {src}")),
        };
        let err = (p.kv_budget_bytes as f64 - entry.logged_kv as f64) / total;
        let tokens = e
            .get("kv_cache_tokens")
            .and_then(Value::as_u64)
            .map_or("-".to_string(), |t| t.to_string());
        println!(
            "| {model} | {gpu} ({:.2} GiB{assumed}), TP {tp} | {group} | {} | {} | {} | {} | {} | {:+.2}% | {} / {tokens} |",
            total / GIB as f64,
            pct(p.consumers.bytes(ConsumerKind::Weights), gib(&e, "weights_gib")),
            pct(p.consumers.bytes(ConsumerKind::Activation), gib(&e, "activation_peak_gib")),
            pct(p.consumers.bytes(ConsumerKind::NonAllocator), gib(&e, "non_torch_gib")),
            pct(graph_estimate.unwrap_or(0), gib(&e, "cuda_graph_actual_gib").filter(|g| *g > 0.0)),
            pct(p.kv_budget_bytes, gib(&e, "available_kv_gib")),
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
