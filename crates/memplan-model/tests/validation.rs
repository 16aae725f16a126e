//! Every start-up log whose model has a shipped config is reproduced from its logged measured
//! values within the rounding of the printed figures (see `memplan_model::validation` for how
//! the tolerance is derived). `MEMPLAN_LOGS=path.jsonl` checks another set of logs the same way.

use memplan_model::validation::reproduce_all;

#[test]
fn every_log_with_a_config_is_reproduced() {
    let text = match std::env::var("MEMPLAN_LOGS") {
        Ok(p) => std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}")),
        Err(_) => include_str!("data/engine-startup-logs.jsonl").to_string(),
    };
    let runs = reproduce_all(&text).expect("logs parse");
    for r in &runs {
        println!(
            "{:<48} {:<13} {:>6} logged {:>9} planned {:>9} range {:?} graph subtracted {}",
            r.model, r.basis, r.compared, r.logged, r.planned, r.range, r.graph_subtracted
        );
    }
    // The shared set has 12 checkable logs (8 with every component printed).
    if std::env::var("MEMPLAN_LOGS").is_err() {
        assert_eq!(runs.len(), 12, "checkable logs");
        assert_eq!(runs.iter().filter(|r| r.basis == "components").count(), 8);
    }
    let bad: Vec<_> = runs.iter().filter(|r| !r.ok).collect();
    assert!(bad.is_empty(), "not reproduced: {bad:#?}");
}
