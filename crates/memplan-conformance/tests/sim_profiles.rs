//! The suite against every shipped simulated profile, and against the deliberately broken one.

#![cfg(feature = "sim")]

use memplan_conformance::{run_id, Outcome};

#[test]
fn every_shipped_profile_conforms() {
    let mut failed = Vec::new();
    for name in memplan_backend_sim::profiles().iter().map(|p| p.name) {
        if name.starts_with("broken") {
            continue;
        }
        let report = run_id(&format!("sim:{name}")).expect("the sim device opens and reads");
        if !report.passed() {
            failed.push(report.to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "profiles that declare more than they deliver:\n{}",
        failed.join("\n")
    );
}

#[test]
fn broken_profile_fails_with_evidence() {
    let report = run_id("sim:broken-stale").expect("the broken device still opens");
    assert!(!report.passed(), "the broken profile must fail:\n{report}");
    let cal = report
        .checks
        .iter()
        .find(|c| c.name == "calibration.declared_holds")
        .expect("calibration check");
    assert_eq!(cal.outcome, Outcome::Fail);
    assert!(
        cal.evidence.contains("driver_free"),
        "evidence names the reading: {}",
        cal.evidence
    );
}

#[test]
fn declare_exact_over_a_quirk_fails() {
    let report = run_id("sim:arc-a770,declare-exact").expect("opens");
    assert!(
        !report.passed(),
        "free == total declared exact must fail:\n{report}"
    );
}

#[test]
fn capture_without_allocation_nodes_conforms() {
    // HIP < 5.3 has no stream-ordered allocation: the allocation node is refused, capture is
    // not, and a backend declaring capture there is honest.
    for id in [
        "sim:rtx4090,no-graph-alloc-nodes",
        "sim:rx7900xtx-rocm5.4,no-graph-alloc-nodes",
    ] {
        let report = run_id(id).expect("opens");
        assert!(report.passed(), "{id}:\n{report}");
        let lifecycle = report
            .checks
            .iter()
            .find(|c| c.name == "graph_capture.lifecycle")
            .expect("graph capture check");
        assert_eq!(lifecycle.outcome, Outcome::Pass, "{}", lifecycle.evidence);
    }
}

memplan_conformance::conformance_test!(macro_instantiation_rtx4090, memplan::open("sim:rtx4090"));
