//! Join the pieces of the GPU check into one JSON report, and say whether it passed.

use serde_json::{json, Map, Value};

/// Write the report; `Ok(true)` when no check failed (a check that did not run is `null` and
/// fails nothing), `Ok(false)` when one did.
pub fn run(args: &[String]) -> Result<bool, String> {
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
    let report = report(pieces);
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&out, text + "\n").map_err(|e| format!("{out}: {e}"))?;
    println!("{out}");
    let (passed, failed, not_run) = summary(&report["checks"]);
    eprintln!("gpu_report: checks passed: {}", list(&passed));
    eprintln!("gpu_report: checks FAILED: {}", list(&failed));
    eprintln!("gpu_report: checks not run: {}", list(&not_run));
    Ok(failed.is_empty())
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The report of these pieces.
fn report(pieces: Map<String, Value>) -> Value {
    json!({
        "memplan_version": env!("CARGO_PKG_VERSION"),
        "memplan_gpu_check": 1,
        // Graph capture succeeded, and not against the test fake.
        "ran_on_hardware": pieces.get("graphs").is_some_and(|v| v["rc"] == json!(0) && v["output"]["driver_is_test_fake"] == json!(false)),
        "checks": checks(&pieces),
        "pieces": pieces,
    })
}

/// The checks that passed, failed and did not run (`null`).
fn summary(checks: &Value) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (mut passed, mut failed, mut not_run) = (Vec::new(), Vec::new(), Vec::new());
    for (k, v) in checks.as_object().into_iter().flatten() {
        match v.as_bool() {
            Some(true) => passed.push(k.clone()),
            Some(false) => failed.push(k.clone()),
            None => not_run.push(k.clone()),
        }
    }
    (passed, failed, not_run)
}

/// A piece: its output (JSON when it parses, else text) and its exit code from `PATH.rc`. A
/// piece without an `.rc` did not run; its output says why (`skipped: …`).
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

/// Pass/fail of every check. `null` only where the step did not run; a step that ran (it has
/// an exit code) but produced no verdict fails its check: a crash is never a silent pass.
fn checks(p: &Map<String, Value>) -> Value {
    let ran = |name: &str| p.get(name).filter(|v| !v["rc"].is_null());
    let rc_ok = |name: &str| ran(name).map(|v| v["rc"] == json!(0));
    let verdict = |name: &str, pointer: &str| {
        ran(name).map(|v| v["output"].pointer(pointer).and_then(Value::as_bool) == Some(true))
    };
    // Calibration ran (`probe --calibrate`) and downgraded no declaration.
    let confirmed = ran("probe").map(|v| {
        v["output"]["calibration"]["verdicts"]
            .as_array()
            .is_some_and(|vs| !vs.is_empty() && vs.iter().all(|v| v["status"] != "downgraded"))
    });
    json!({
        "gpu_tests_pass": rc_ok("tests"),
        "probe_ran": rc_ok("probe"),
        "calibration_confirms_declared": confirmed,
        "graphs_ran": rc_ok("graphs"),
        "conformance_pass": rc_ok("conformance"),
        "graph_samples_all_ran": verdict("graphs", "/graphs/all_samples_ran"),
        "graph_pool_covers_alloc_nodes": verdict("graphs", "/graphs/all_pool_windows_cover_alloc_nodes"),
        "free_within_2mib_of_torch": verdict("torch", "/free_compare/within_2mib"),
        "python_engine_start_up": verdict("python_engine", "/start_up_ok"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("an object")
    }

    #[test]
    fn a_step_that_ran_without_a_verdict_fails_its_check() {
        // PyTorch's step crashed (its output is a traceback, not JSON with the comparison).
        let c = checks(&pieces(json!({
            "torch": { "rc": 1, "output": "Traceback ...\nJSONDecodeError" },
            "graphs": { "rc": 0, "output": { "graphs": { "all_pool_windows_cover_alloc_nodes": true } } },
        })));
        assert_eq!(c["free_within_2mib_of_torch"], json!(false));
        assert_eq!(c["graph_pool_covers_alloc_nodes"], json!(true));
        assert_eq!(
            c["graph_samples_all_ran"],
            json!(false),
            "no statement that every sample ran"
        );
        let (_, failed, _) = summary(&c);
        assert!(failed.contains(&"free_within_2mib_of_torch".to_string()));
    }

    #[test]
    fn a_step_that_did_not_run_is_null_and_fails_nothing() {
        let c = checks(&pieces(json!({
            "torch": { "rc": null, "output": "skipped: PyTorch with CUDA not found" },
            "tests": { "rc": 0, "output": "ok" },
        })));
        assert_eq!(c["free_within_2mib_of_torch"], Value::Null);
        assert_eq!(c["conformance_pass"], Value::Null);
        assert_eq!(c["gpu_tests_pass"], json!(true));
        let (passed, failed, not_run) = summary(&c);
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(passed, ["gpu_tests_pass"]);
        assert!(not_run.contains(&"free_within_2mib_of_torch".to_string()));
    }

    #[test]
    fn calibration_must_have_run_and_confirmed() {
        let probe = |out: Value| {
            checks(&pieces(json!({ "probe": { "rc": 0, "output": out } })))
                ["calibration_confirms_declared"]
                .clone()
        };
        let verdicts = |statuses: &[&str]| {
            let vs: Vec<Value> = statuses.iter().map(|s| json!({ "status": s })).collect();
            json!({ "calibration": { "verdicts": vs } })
        };
        assert_eq!(probe(verdicts(&["confirmed", "not_checked"])), json!(true));
        assert_eq!(probe(verdicts(&["confirmed", "downgraded"])), json!(false));
        assert_eq!(
            probe(json!({ "capability": {} })),
            json!(false),
            "probed without calibrating"
        );
        assert_eq!(
            checks(&Map::new())["calibration_confirms_declared"],
            Value::Null
        );
    }

    #[test]
    fn python_engine_verdict() {
        let ok = checks(&pieces(json!({
            "python_engine": { "rc": 0, "output": { "start_up_ok": true } },
        })));
        assert_eq!(ok["python_engine_start_up"], json!(true));
        let crashed = checks(&pieces(json!({
            "python_engine": { "rc": 1, "output": "Traceback ..." },
        })));
        assert_eq!(crashed["python_engine_start_up"], json!(false));
        let skipped = checks(&pieces(json!({
            "python_engine": { "rc": null, "output": "skipped: no wheel" },
        })));
        assert_eq!(skipped["python_engine_start_up"], Value::Null);
    }

    #[test]
    fn passing_torch_comparison() {
        let c = checks(&pieces(json!({
            "torch": { "rc": 0, "output": { "free_compare": { "within_2mib": true } } },
        })));
        assert_eq!(c["free_within_2mib_of_torch"], json!(true));
        let r = report(pieces(
            json!({ "graphs": { "rc": 0, "output": { "driver_is_test_fake": true } } }),
        ));
        assert_eq!(r["ran_on_hardware"], json!(false));
    }
}
