//! The suite against simulated devices that each tell one lie, run as a vendor runs it: the
//! `memplan-conformance` binary, which starts itself again as the second process. Each liar
//! must fail, naming the check that caught it; every honest profile must pass the whole suite,
//! second process included.

#![cfg(feature = "sim")]

use std::process::Command;

use memplan_conformance::Outcome;

/// Run the binary on `id`: its exit code and every check as (name, outcome, evidence).
fn suite(id: &str) -> (i32, Vec<(String, String, String)>) {
    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "memplan-conformance-test-{}-{n}-{}",
        std::process::id(),
        id.replace([':', ',', '='], "_")
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let json = dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_memplan-conformance"))
        .args(["--device", id, "--json"])
        .arg(&json)
        .output()
        .expect("run memplan-conformance");
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "{id}: no report ({e}); stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let _ = std::fs::remove_dir_all(&dir);
    let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON report");
    let checks = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("outcome"), s("evidence"))
        })
        .collect();
    (out.status.code().unwrap_or(-1), checks)
}

fn failed(checks: &[(String, String, String)]) -> Vec<&str> {
    checks
        .iter()
        .filter(|c| c.1 == "fail")
        .map(|c| c.0.as_str())
        .collect()
}

/// Each liar, and the checks that must name its lie.
const LIARS: &[(&str, &[&str])] = &[
    // A process-local free reading declared exact: the second process's memory is invisible.
    (
        "broken-process-local",
        &["locality.driver_free", "locality.device_available"],
    ),
    // The total 8 GiB too high: 8 GiB held at start that no context accounts for.
    ("broken-total-high", &["total.accounted"]),
    // The total 128 MiB too low: less held at start than one process's context.
    ("broken-total-low", &["total.accounted"]),
    // free() keeps 2 MiB of each allocation: the reading after a cycle and the probe.
    (
        "broken-leaky-free",
        &["leaks.free_returns_memory", "leaks.capacity_after_free"],
    ),
    // destroy_physical keeps 2 MiB: the reading after a cycle and the probe.
    (
        "broken-leaky-vm",
        &[
            "leaks.vm_release_returns_memory",
            "leaks.capacity_after_vm_release",
        ],
    ),
    // The same leak where free is declared unavailable: the probe alone catches it.
    (
        "broken-leaky-free-unreadable",
        &["leaks.capacity_after_free"],
    ),
    // Free lags a synchronize behind.
    ("broken-stale", &["calibration.declared_holds"]),
];

#[test]
fn every_liar_fails_naming_the_check() {
    let mut wrong = Vec::new();
    for (profile, expected) in LIARS {
        let (code, checks) = suite(&format!("sim:{profile}"));
        let failed = failed(&checks);
        let missing: Vec<_> = expected.iter().filter(|e| !failed.contains(e)).collect();
        if code != 1 || !missing.is_empty() {
            wrong.push(format!(
                "sim:{profile}: exit {code}, failed {failed:?}, expected to fail {missing:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every simulated profile is either honest or a liar above (`arc-a770` without Sysman's
/// per-process query is suspect by design: `arc_a770_is_suspect` in sim_profiles.rs).
#[test]
fn every_honest_profile_passes_the_whole_suite_with_a_second_process() {
    let mut failures = Vec::new();
    for p in memplan_backend_sim::profiles() {
        if LIARS.iter().any(|(l, _)| *l == p.name) {
            continue;
        }
        assert!(
            !p.name.starts_with("broken"),
            "{}: a broken profile without its lie in LIARS",
            p.name
        );
        let (code, checks) = suite(&format!("sim:{}", p.name));
        let locality = checks
            .iter()
            .find(|c| c.0 == "locality.driver_free")
            .map(|c| c.1.clone());
        let f = failed(&checks);
        if code != 0 || !f.is_empty() {
            failures.push(format!("sim:{}: exit {code}, failed {f:?}", p.name));
        }
        // The second process really ran wherever a free reading is declared.
        if p.capability()
            .reading(memplan::Reading::DriverFree)
            .measures_own_usage()
            && locality.as_deref() == Some("skip")
        {
            let why = checks
                .iter()
                .find(|c| c.0 == "locality.driver_free")
                .map(|c| c.2.clone())
                .unwrap_or_default();
            if !why.contains("tolerance") {
                failures.push(format!("sim:{}: locality skipped: {why}", p.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A free reading that counts in 64 MiB steps looks exact to windows over multiples of 64 MiB;
/// calibration's default sizes include 37 MiB, and the suite's are no multiple of a common
/// step either: both see it. Windows over multiples alone see it too, in the readings: every
/// one falls on a multiple of 64 MiB, far coarser than the rounding a window allows.
#[test]
fn a_stepped_reading_declared_exact_fails_calibration_with_odd_sizes() {
    let id = "sim:rtx4090,free-step=64MiB";
    let d = memplan::open(id).expect("opens");
    let default = memplan_planner::calibrate(&d).expect("calibrates");
    assert!(
        !default.downgrades().is_empty(),
        "the default sizes' 37 MiB window sees the step: {default}"
    );
    let only_multiples =
        memplan_planner::calibrate::calibrate_with(&d, &memplan_planner::calibrate::SIZES[1..])
            .expect("calibrates");
    assert!(
        only_multiples
            .to_string()
            .contains("free readings on multiples of 64.00 MiB"),
        "windows over multiples of the step read it in the readings: {only_multiples}"
    );
    assert!(!only_multiples.downgrades().is_empty(), "{only_multiples}");
    let (code, checks) = suite(id);
    assert_eq!(code, 1);
    assert!(
        failed(&checks).contains(&"calibration.declared_holds"),
        "{checks:?}"
    );
}

/// A process-local reading declared process-local is honest: the second process does not move
/// it, and the suite passes.
#[test]
fn a_process_local_reading_declared_so_passes_locality() {
    let (_, checks) = suite("sim:rx7900xtx-rocm5.4");
    let c = checks
        .iter()
        .find(|c| c.0 == "locality.driver_free")
        .expect("the check ran");
    assert_eq!(c.1, "pass", "{c:?}");
    assert!(c.2.contains("unmoved, as declared"), "{c:?}");
}

/// Without a second process (the library's `run`), the locality checks say why they skipped.
#[test]
fn without_a_second_process_locality_is_skipped_with_the_reason() {
    let report = memplan_conformance::run_id("sim:rtx4090,other=0,seed=3").expect("runs");
    let c = report
        .checks
        .iter()
        .find(|c| c.name == "locality.driver_free")
        .expect("present");
    assert_eq!(c.outcome, Outcome::Skip);
    assert!(c.evidence.contains("second process"), "{}", c.evidence);
}

/// Every backend with a device CI can open (the list's `ci_device`) passes the suite, where
/// this build compiled it in (`cargo xtask ci`'s all-backends entry compiles every one, and
/// runs `cargo xtask conformance` on each CI device as well).
#[test]
fn every_compiled_in_ci_device_passes() {
    let compiled = memplan::compiled_backends();
    for k in memplan::BackendKind::ALL {
        let Some(id) = k.info().ci_device else {
            continue;
        };
        if !compiled.contains(&k) {
            eprintln!("{id}: backend not compiled into this build, skipped");
            continue;
        }
        let (code, checks) = suite(id);
        assert_eq!(code, 0, "{id}: failed {:?}", failed(&checks));
    }
}
