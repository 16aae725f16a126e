//! `--from-log` on the real start-up log quotes of `engine-startup-logs.jsonl`: every figure
//! the log prints is read back as the data set's curator copied it, and the logs whose model
//! has a config reproduce their logged KV tokens from the figures read (vLLM 0.19 rules).

use memplan_core::bytes::GIB;
use memplan_model::fromlog::parse;
use memplan_model::validation::reproduce;
use serde_json::{json, Value};

const LOGS: &str = include_str!("data/engine-startup-logs.jsonl");

fn close(read: Option<u64>, want: &Value) -> bool {
    match (read, want.as_f64()) {
        (Some(r), Some(w)) => ((r as f64 / GIB as f64) - w).abs() < 0.006,
        (_, None) => true,
        (None, Some(_)) => false,
    }
}

#[test]
fn real_logs_are_read_and_reproduce() {
    let mut read = 0;
    let mut reproduced = 0;
    for line in LOGS.lines().filter(|l| !l.trim().is_empty()) {
        let e: Value = serde_json::from_str(line).unwrap();
        let quote = e["quote"].as_str().unwrap();
        let f = parse(quote).unwrap_or_else(|err| panic!("{}: {err}", e["model"]));
        read += 1;
        // V0's "Loading model weights took X GB" is the same 2^30 figure.
        assert!(
            close(f.weights, &e["weights_gib"]),
            "{}: weights {:?}",
            e["model"],
            f.weights
        );
        // (One entry's KV figure comes from the user's own summary, not a log line.)
        if quote.contains("Available KV cache memory") || quote.contains("kv_cache_size=") {
            assert!(
                close(f.kv_available, &e["available_kv_gib"]),
                "{}: kv {:?}",
                e["model"],
                f.kv_available
            );
        }
        if e["quote"].as_str().unwrap().contains("GPU KV cache size") {
            assert_eq!(f.kv_tokens, e["kv_cache_tokens"].as_u64(), "{}", e["model"]);
        }
        if let Some(t) = e["gpu_total_gib"].as_f64() {
            if f.total.is_some() {
                assert!(close(f.total, &json!(t)), "{}", e["model"]);
            }
        }
        assert!(
            close(f.activation, &e["activation_peak_gib"]) || f.activation.is_none(),
            "{}",
            e["model"]
        );
        assert!(
            close(f.graph_estimate, &e["cuda_graph_estimate_gib"]) || f.graph_estimate.is_none(),
            "{}",
            e["model"]
        );
        // Rebuild the log entry from what was read (figures printed with 2 decimals) and
        // reproduce it; the model id and settings come from the log too where printed.
        let g = |b: Option<u64>| b.map(|b| (b as f64 / GIB as f64 * 100.0).round() / 100.0);
        let mut entry = e.clone();
        for (k, v) in [
            ("weights_gib", g(f.weights)),
            ("activation_peak_gib", g(f.activation)),
            ("non_torch_gib", g(f.non_torch)),
            ("available_kv_gib", g(f.kv_available)),
            ("gpu_total_gib", g(f.total)),
        ] {
            if let Some(v) = v {
                entry[k] = json!(v);
            }
        }
        if let Some(r) = reproduce(&entry).unwrap() {
            assert!(r.ok, "{r:?}");
            reproduced += 1;
        }
    }
    assert_eq!(read, LOGS.lines().filter(|l| !l.trim().is_empty()).count());
    println!("read {read} logs, reproduced {reproduced} from the figures read");
    assert_eq!(reproduced, 13);
}

const CURRENT: &str = include_str!("../data/validation-logs.jsonl");

/// The raw start-up lines of vLLM 0.20+ (and forks) and SGLang that users pasted, read back as
/// curated: every figure the quote prints is the curated one, the release its version line
/// names is the curated version.
#[test]
fn current_release_logs_are_read_as_curated() {
    let read = read_as_curated(CURRENT);
    println!("read {read} current-release quotes");
    assert!(read >= 15, "{read}");
}

/// The same check on logs held back from the repository (`MEMPLAN_LOGS=logs.jsonl`, the
/// corpus layout); nothing to do without it.
#[test]
fn held_back_logs_are_read_as_curated() {
    let Ok(path) = std::env::var("MEMPLAN_LOGS") else {
        return;
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let read = read_as_curated(&text);
    println!("read {read} quotes of {path}");
}

/// Read every entry's quote and check each figure it prints against the curated one; the
/// number of quotes read.
fn read_as_curated(jsonl: &str) -> usize {
    let mut read = 0;
    for line in jsonl.lines().filter(|l| !l.trim().is_empty()) {
        let e: Value = serde_json::from_str(line).unwrap();
        let quote = e["quote"].as_str().unwrap();
        if quote.is_empty() {
            continue;
        }
        let src = e["source"].as_str().unwrap();
        let f = parse(quote).unwrap_or_else(|err| panic!("{src}: {err}"));
        read += 1;
        let has = |k: &str| quote.contains(k);
        if has("Available KV cache memory:") && !has("ValueError")
            || has("available KV cache memory")
        {
            assert!(
                close(f.kv_available, &e["available_kv_gib"]),
                "{src}: kv {:?}",
                f.kv_available
            );
        }
        if has("GPU KV cache size") || has("#tokens:") {
            assert_eq!(f.kv_tokens, e["kv_cache_tokens"].as_u64(), "{src}");
        }
        if has("Estimated CUDA graph memory") || has("(estimated)") {
            assert!(
                close(f.graph_estimate, &e["cuda_graph_estimate_gib"]),
                "{src}: {:?}",
                f.graph_estimate
            );
        }
        if has("Graph capturing finished") {
            assert!(
                close(f.graph_actual, &e["cuda_graph_actual_gib"]),
                "{src}: {:?}",
                f.graph_actual
            );
        }
        if has("gpu-memory-utilization=") {
            assert_eq!(f.utilization, e["gpu_memory_utilization"].as_f64(), "{src}");
            assert!(f.graph_subtracted, "{src}");
        }
        if has("Maximum concurrency") {
            assert_eq!(f.max_concurrency, e["max_concurrency"].as_f64(), "{src}");
            assert_eq!(f.max_model_len, e["max_model_len"].as_u64(), "{src}");
        }
        if has("Model loading took") {
            assert!(close(f.weights, &e["weights_gib"]), "{src}");
        }
        if has("Free memory on device (") {
            assert!(
                close(f.total, &e["gpu_total_gib"]),
                "{src}: total {:?}",
                f.total
            );
        }
        if let Some(v) = e["vllm_version"].as_str().filter(|v| quote.contains(*v)) {
            assert_eq!(f.version.as_deref(), Some(v), "{src}");
        }
        if e["engine"] == "sglang" {
            assert_eq!(
                f.engine,
                Some(memplan_model::engine::EngineKind::Sglang),
                "{src}"
            );
        }
        if let Some(tp) = e["num_gpus_tp"]
            .as_u64()
            .filter(|_| has("'tensor_parallel_size'"))
        {
            assert_eq!(f.tensor_parallel, Some(tp), "{src}");
        }
        // The report before the consumed accounting ("W GiB for weight, A GiB for peak
        // activation, N GiB for non-torch memory"), SGLang's MLA pool ("KV size:"), the
        // refusals ("max seq len (N)").
        if has("GiB for weight") {
            assert!(close(f.weights, &e["weights_gib"]), "{src}");
            assert!(close(f.activation, &e["activation_peak_gib"]), "{src}");
            if e["non_torch_gib"].as_f64().is_some_and(|n| n >= 0.0) {
                assert!(close(f.non_torch, &e["non_torch_gib"]), "{src}");
            } else {
                assert_eq!(f.non_torch, None, "{src}");
            }
        }
        if has("KV size:") {
            assert!(close(f.kv_available, &e["available_kv_gib"]), "{src}");
        }
        if has("max seq len (") {
            assert_eq!(f.max_model_len, e["max_model_len"].as_u64(), "{src}");
            assert!(f.refused.is_some(), "{src}");
        }
        if has("stored in KV cache (") {
            assert_eq!(f.kv_tokens, e["kv_cache_tokens"].as_u64(), "{src}");
        }
    }
    read
}
