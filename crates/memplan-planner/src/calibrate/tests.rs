use super::*;
use memplan_backend_sim::{profiles, SimGpu};
use memplan_core::{GraphRelease, Reliability};

fn cal(selector: &str) -> CalibrationReport {
    let mut gpu = SimGpu::open(selector).expect("profile exists");
    let before = gpu.truth();
    let r = calibrate(&mut gpu).expect("calibration runs");
    // Every calibration allocation is freed (per-capture memory a runtime keeps aside).
    let after = gpu.truth();
    assert_eq!(after.raw_allocations, before.raw_allocations, "{selector}");
    assert_eq!(after.live_graphs, 0, "{selector}");
    assert_eq!(after.vmm_mapped, 0, "{selector}");
    r
}

#[test]
fn honest_declarations_hold() {
    for p in profiles().iter().filter(|p| p.name != "broken-stale") {
        let r = cal(p.name);
        assert!(r.honest(), "{}: {:#?}", p.name, r.downgrade_lines());
        assert_eq!(r.calibrated, r.declared, "{}", p.name);
    }
}

#[test]
fn broken_stale_is_caught() {
    let r = cal("broken-stale");
    assert!(!r.honest());
    let free = r.calibrated.reading(Reading::DriverFree);
    assert!(free.rank() < Reliability::Exact.rank(), "{free}");
    let v = r
        .downgrades()
        .into_iter()
        .find(|v| v.item == "driver_free")
        .expect("driver_free downgraded");
    assert!(
        v.evidence.iter().any(|e| !e.ok),
        "evidence shows the failed check"
    );
    assert!(r.to_string().contains("DOWNGRADED"));
}

#[test]
fn declare_exact_is_caught_wherever_a_quirk_is_observable() {
    for p in profiles() {
        let q = p.quirks;
        let observable = q.stale_free
            || q.free_equals_total
            || q.sysman_missing
            || q.apu_wrong_pool
            || q.graph_pool_attrs_zero
            || q.no_graph_pool_query
            || q.deferred_graph_release
            || q.hidden_bytes_per_capture > 0;
        let r = cal(&format!("{},declare-exact", p.name));
        assert_eq!(
            !r.honest(),
            observable,
            "{}: {:?}",
            p.name,
            r.downgrade_lines()
        );
    }
}

#[test]
fn specific_quirks_give_specific_downgrades() {
    let r = cal("rx7900xtx-rocm6.2,declare-exact");
    assert_eq!(r.calibrated.facts.graph_release, GraphRelease::AtNextSync);
    assert_eq!(r.calibrated.facts.hidden_bytes_per_capture, Some(4 << 20));
    let r = cal("rx7900xtx-rocm5.4,declare-exact");
    assert_eq!(
        r.calibrated.reading(Reading::GraphPool).label(),
        "unavailable"
    );
    let r = cal("arc-a770,declare-exact");
    assert_eq!(
        r.calibrated.reading(Reading::DriverFree).label(),
        "unavailable"
    );
    let r = cal("strix-halo,declare-exact");
    assert_eq!(
        r.calibrated.reading(Reading::DriverFree).label(),
        "unavailable"
    );
    assert_eq!(
        r.calibrated.reading(Reading::DriverTotal).label(),
        "unavailable"
    );
}

#[test]
fn report_serialises_with_evidence() {
    let r = cal("broken-stale");
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["verdicts"][0]["item"], "driver_free");
    assert!(j["calibrated"]["readings"]["driver_free"]["kind"].is_string());
    assert!(j["verdicts"][0]["evidence"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
}
