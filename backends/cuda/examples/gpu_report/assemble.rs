//! Join the pieces of the GPU check into one JSON report.

use serde_json::{json, Map, Value};

pub fn run(args: &[String]) -> Result<(), String> {
    let mut out = None;
    let mut pieces = Map::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            out = Some(it.next().ok_or("--out needs a file")?.clone());
            continue;
        }
        let (name, path) = a
            .split_once('=')
            .ok_or_else(|| format!("piece `{a}`: expected NAME=PATH"))?;
        pieces.insert(name.to_string(), piece(path));
    }
    let out = out.ok_or("--out FILE is required")?;
    let checks = checks(&pieces);
    let report = json!({
        "memplan_version": env!("CARGO_PKG_VERSION"),
        "memplan_gpu_check": 1,
        // Graph capture succeeded, and not against the test fake.
        "ran_on_hardware": pieces.get("graphs").is_some_and(|v| v["rc"] == json!(0) && v["output"]["driver_is_test_fake"] == json!(false)),
        "checks": checks,
        "pieces": pieces,
    });
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&out, text + "\n").map_err(|e| format!("{out}: {e}"))?;
    println!("{out}");
    Ok(())
}

fn piece(path: &str) -> Value {
    let rc = std::fs::read_to_string(format!("{path}.rc"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok());
    let output = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
        Err(e) => Value::String(format!("not produced: {e}")),
    };
    json!({ "rc": rc, "output": output })
}

/// Pass/fail of every check the pieces allow, `null` where a piece did not run.
fn checks(p: &Map<String, Value>) -> Value {
    let rc_ok = |name: &str| p.get(name).map(|v| v["rc"] == json!(0));
    let torch = p.get("torch").map(|v| &v["output"]);
    json!({
        "gpu_tests_pass": rc_ok("tests"),
        "probe_ran": rc_ok("probe"),
        "graphs_ran": rc_ok("graphs"),
        "conformance_pass": rc_ok("conformance"),
        "graph_pool_covers_alloc_nodes": p.get("graphs").and_then(|v| v["output"]["graphs"]["all_pool_windows_cover_alloc_nodes"].as_bool()),
        "free_within_2mib_of_torch": torch.and_then(|t| t["free_compare"]["within_2mib"].as_bool()),
    })
}
