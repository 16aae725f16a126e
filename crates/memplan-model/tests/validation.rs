//! Every start-up log whose model has a shipped config is reproduced from its logged measured
//! values within the rounding of the printed figures (see `memplan_model::validation` for how
//! the tolerance is derived). `MEMPLAN_LOGS=logs.jsonl` checks another set of logs the same
//! way, and `MEMPLAN_CONFIGS=configs.jsonl` (the layout of `crates/memplan-model/models/model-configs.jsonl`) adds
//! configs for models that are not shipped.

use memplan_model::validation::reproduce_all_with;

fn read(var: &str) -> Option<String> {
    let p = std::env::var(var).ok()?;
    Some(std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{var}={p}: {e}")))
}

#[test]
fn every_log_with_a_config_is_reproduced() {
    let own = read("MEMPLAN_LOGS");
    let text = own
        .clone()
        .unwrap_or_else(|| include_str!("data/engine-startup-logs.jsonl").to_string());
    let configs = read("MEMPLAN_CONFIGS");
    let runs = reproduce_all_with(&text, configs.as_deref()).expect("logs parse");
    for r in &runs {
        println!(
            "{:<48} {:<13} {:>6} logged {:>9} planned {:>9} range {:?} graph subtracted {}",
            r.model, r.basis, r.compared, r.logged, r.planned, r.range, r.graph_subtracted
        );
    }
    // The shared set has 12 checkable logs (8 with every component printed).
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    println!(
        "reproduced {} of {lines} logs (the others have no config or no logged count)",
        runs.len()
    );
    if own.is_none() {
        assert_eq!(runs.len(), 13, "checkable logs");
        assert_eq!(runs.iter().filter(|r| r.basis == "components").count(), 8);
    } else {
        // A set of logs none of which could be checked must not pass as reproduced.
        assert!(
            !runs.is_empty() || lines == 0,
            "none of the {lines} logs in MEMPLAN_LOGS has a config (add MEMPLAN_CONFIGS)"
        );
    }
    let bad: Vec<_> = runs.iter().filter(|r| !r.ok).collect();
    assert!(bad.is_empty(), "not reproduced: {bad:#?}");
}

#[test]
fn extra_configs_are_used_for_models_not_shipped() {
    // A config given beside the logs (here Qwen3-0.6B's public facts under a name no preset
    // has) lets a log of that model be checked.
    let configs = r#"{"model":"example/Unshipped-0.6B","source":"test","config":{"architectures":["Qwen3ForCausalLM"],"hidden_size":1024,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"intermediate_size":3072,"vocab_size":151936,"max_position_embeddings":40960,"tie_word_embeddings":true,"torch_dtype":"bfloat16"}}"#;
    let log = include_str!("data/engine-startup-logs.jsonl")
        .lines()
        .find(|l| l.contains("Qwen/Qwen3-0.6B"))
        .expect("the log is in the data")
        .replace("Qwen/Qwen3-0.6B", "example/Unshipped-0.6B");
    let log = log.as_str();
    let runs = reproduce_all_with(log, Some(configs)).unwrap();
    assert_eq!(runs.len(), 1);
    assert!(runs[0].ok, "{:?}", runs[0]);
    assert!(reproduce_all_with(log, None).unwrap().is_empty());
}

/// The pure dry run (config, device total, utilisation, release; nothing measured) of every
/// versioned log of a release this table covers is within 1% of the device's memory, unless
/// the log's entry names why it cannot be (`dry_run_caveat`). Runs on the corpus of newer
/// releases, or on `MEMPLAN_LOGS` (with `MEMPLAN_CONFIGS` for models that are not shipped);
/// prints every checked log.
#[test]
fn versioned_logs_dry_run_within_one_percent_of_the_device() {
    use memplan_model::accuracy::{dry_run_entry, release};
    use serde_json::Value;
    let text = read("MEMPLAN_LOGS")
        .unwrap_or_else(|| include_str!("../data/validation-logs.jsonl").to_string());
    let configs = read("MEMPLAN_CONFIGS");
    let (mut checked, mut bad) = (0, Vec::new());
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let e: Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("line {}: {err}", i + 1));
        let (group, _) = release(&e);
        let Ok(c) = dry_run_entry(&e, configs.as_deref()) else {
            continue;
        };
        if !group.starts_with("vLLM 0.") {
            continue;
        }
        checked += 1;
        let caveat = e["dry_run_caveat"].as_str();
        println!(
            "{:<34} {:<48} {:+.2}% of the device, {:+.2}% of KV{}",
            group,
            e["model"].as_str().unwrap_or(""),
            c.error_of_device * 100.0,
            c.error_of_kv * 100.0,
            caveat
                .map(|c| format!(" (caveat: {c})"))
                .unwrap_or_default()
        );
        if c.error_of_device.abs() > 0.01 && caveat.is_none() {
            bad.push(format!(
                "line {}: {:+.2}%",
                i + 1,
                c.error_of_device * 100.0
            ));
        }
    }
    println!("{checked} versioned logs dry-run checked");
    assert!(bad.is_empty(), "beyond 1% of the device: {bad:?}");
}
