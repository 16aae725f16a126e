//! `memplan plan --json` and `memplan simulate --json` print one plan type: the plan of a dry
//! run and the plan of every simulated start-up are `memplan.plan/1` objects with the same
//! keys, the same consumer kinds and the same nested shapes.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_memplan"))
        .args(args)
        .env_remove("MEMPLAN_LOG")
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

#[test]
fn plan_and_simulate_print_the_same_plan_document() {
    let dry = json(&[
        "plan",
        "--model",
        "qwen2.5-1.5b-instruct",
        "--device",
        "sim:rtx4090",
        "--json",
    ]);
    let sim = json(&["simulate", "--scenario", "fp8-24g", "--json"]);
    let runs = sim["runs"].as_array().expect("runs");
    assert!(!runs.is_empty());
    for run in runs {
        let measured = &run["plan"];
        assert_eq!(measured["schema"], "memplan.plan/1");
        assert_eq!(dry["schema"], measured["schema"]);
        assert_eq!(keys(&dry), keys(measured), "top-level keys");
        for k in ["graph", "kv", "limits", "suggestions", "kv_spec"] {
            assert_eq!(keys(&dry[k]), keys(&measured[k]), "keys of {k}");
        }
        let kinds = |p: &Value| -> Vec<Value> {
            p["consumers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["kind"].clone())
                .collect()
        };
        assert_eq!(kinds(&dry), kinds(measured));
        // Provenance tells them apart: estimated in the dry run, measured in the start-up.
        assert_eq!(dry["consumers"][0]["provenance"]["kind"], "estimated");
        assert_eq!(measured["consumers"][0]["provenance"]["kind"], "measured");
        assert_eq!(
            measured["kv_cache_tokens"], measured["kv"]["tokens"],
            "top-level token count"
        );
    }
}
