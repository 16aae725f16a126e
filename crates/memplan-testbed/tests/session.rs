//! The planner's session on a simulated device: arithmetic on absurd engine figures.
//! (Moved from `memplan-planner`, which depends on no backend.)

use memplan_backend_sim::SimGpu;
use memplan_core::{AllocatorStats, AllocatorView, Result};
use memplan_planner::strategy::NoGraphs;
use memplan_planner::{Engine, Session};

/// An engine whose allocator view reports whatever the test sets (a broken engine).
struct Liar(AllocatorStats);

impl AllocatorView for Liar {
    fn stats(&self) -> AllocatorStats {
        self.0
    }
    fn release_cached(&mut self) -> Result<()> {
        Ok(())
    }
    fn reset_peak(&mut self) {}
}

impl Engine for Liar {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        self
    }
    fn graph_sizes(&self) -> Vec<u32> {
        Vec::new()
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        Ok(())
    }
    fn release_graphs(&mut self) -> Result<()> {
        // Teardown "gives back" an absurd amount once more.
        self.0.reserved = 0;
        Ok(())
    }
}

#[test]
fn absurd_allocator_figures_saturate_instead_of_wrapping() {
    let gpu = SimGpu::open("rtx4090").unwrap().device();
    let cap = gpu.capabilities().clone();
    let mut e = Liar(AllocatorStats::new(u64::MAX, 0, 0));
    let mut s = Session::begin(&gpu, &mut e, cap).unwrap();
    s.load_weights(|e| {
        e.0.reserved = 0;
        Ok(())
    })
    .unwrap();
    s.profile_run(|e| {
        e.0.reserved = u64::MAX;
        Ok(())
    })
    .unwrap();
    s.graph_phase(&NoGraphs, "test").unwrap();
    let (p, _) = s.into_parts();
    // Two steps of about i64::MAX each: saturated, and still positive (a wrapped sum
    // would be negative and read as no growth at all).
    assert_eq!(p.non_allocator_growth, Some(i64::MAX));
}

/// The activation peak is what the allocator had to hold for it: the reserved peak where the
/// allocator reports one (rounding and fragmentation included), else the allocated peak
/// rounded up to the documented bound, with a warning; never less than the allocated peak.
#[test]
fn activation_counts_what_the_allocator_held_for_the_peak() {
    const MIB: u64 = 1 << 20;
    let run = |peak_reserved: Option<u64>| {
        let gpu = SimGpu::open("rtx4090").unwrap().device();
        let cap = gpu.capabilities().clone();
        let mut e = Liar(
            AllocatorStats::new(10 * MIB, 10 * MIB, 10 * MIB)
                .with_peak_reserved(peak_reserved.map(|_| 10 * MIB)),
        );
        let mut s = Session::begin(&gpu, &mut e, cap).unwrap();
        s.load_weights(|_| Ok(())).unwrap(); // the profile run follows the weights
        let act = s
            .profile_run(|e| {
                e.0.peak_allocated = 110 * MIB + 1;
                e.0.peak_reserved = peak_reserved;
                Ok(())
            })
            .unwrap();
        let warned = s
            .warnings()
            .iter()
            .any(|w| w.to_json()["code"] == "reserved_peak_unreported");
        (act, warned)
    };
    // Segments of 104 MiB held for 100 MiB (and a byte) allocated: the segments count.
    assert_eq!(run(Some(114 * MIB)), (104 * MIB, false));
    // A reserved peak below the allocated one (cached segments reused): the allocated peak.
    assert_eq!(run(Some(50 * MIB)), (100 * MIB + 1, false));
    // No reserved peak: the allocated peak rounded up to 2 MiB, and a warning says so.
    assert_eq!(run(None), (102 * MIB, true));
}

#[test]
fn an_abandoned_session_waits_for_deferred_releases_before_trimming() {
    // Post-capture keeps the engine's graphs; a session dropped before its plan releases them,
    // and on a runtime that gives a destroyed graph's memory back some synchronizes later
    // (adversarial seeds that draw two or more), a trim right after the first synchronize would
    // leave their allocation nodes reserved in the graph pool.
    use memplan_planner::strategy::PostCapture;
    use memplan_testbed::engine::SimEngine;
    use memplan_testbed::run::open;
    use memplan_testbed::sweep::seeded;
    use memplan_testbed::Scenario;
    let scenario = Scenario::load("deferred-release-24g").unwrap();
    let mut checked = 0;
    for seed in 0..30 {
        let setup = seeded(scenario.clone().resolve().unwrap(), seed);
        let gpu = open(&setup).unwrap();
        if gpu.physics().release_after_syncs < 2 {
            continue;
        }
        let before = gpu.truth();
        let mut engine = SimEngine::new(gpu.clone(), setup.clone());
        let device = engine.device().clone();
        {
            let mut s = Session::start(&device, &mut engine).unwrap();
            s.load_weights(|e| e.load_weights()).unwrap();
            s.profile_run(|e| e.profile_run()).unwrap();
            s.graph_phase(&PostCapture, "test").unwrap();
            assert!(s.kept_graphs());
            assert!(
                gpu.truth().graph_pool_reserved > 0,
                "seed {seed}: no pool to trim"
            );
        }
        let after = gpu.truth();
        assert_eq!(after.live_graphs, 0, "seed {seed}");
        assert_eq!(
            after.graph_pool_reserved, before.graph_pool_reserved,
            "seed {seed}"
        );
        checked += 1;
    }
    assert!(
        checked >= 3,
        "only {checked} seeds defer past one synchronize"
    );
}

#[test]
fn an_eager_engines_calibration_keeps_no_memory_for_good() {
    // A runtime that keeps ~4 MiB of every graph capture (ROCm 6.x) kept calibration's test
    // capture through the engine's profile run: memory an eager engine alone never takes, and
    // with another process arriving before that run, the difference between fitting and an
    // out-of-memory. An eager engine's session leaves the test capture out; one that captures
    // graphs still checks capture.
    use memplan_planner::calibrate::Status;
    use memplan_testbed::run::open;
    use memplan_testbed::sweep::seeded;
    use memplan_testbed::Scenario;

    struct Capturing(Liar);
    impl Engine for Capturing {
        fn allocator(&mut self) -> &mut dyn AllocatorView {
            &mut self.0
        }
        fn graph_sizes(&self) -> Vec<u32> {
            vec![1, 2, 4]
        }
        fn capture_graph(&mut self, _size: u32) -> Result<()> {
            Ok(())
        }
        fn release_graphs(&mut self) -> Result<()> {
            Ok(())
        }
    }
    let scenario = Scenario::load("deferred-release-24g").unwrap();
    let setup = seeded(scenario.resolve().unwrap(), 0);
    let status_of = |report: &memplan_planner::calibrate::CalibrationReport, item: &str| {
        report
            .verdicts
            .iter()
            .find(|v| v.item == item)
            .map(|v| v.status)
            .unwrap_or_else(|| panic!("no {item} verdict"))
    };

    let gpu = open(&setup).unwrap();
    assert!(
        gpu.physics().hidden_bytes_per_capture > 0,
        "the runtime keeps nothing per capture"
    );
    let device = gpu.device();
    let mut eager = Liar(AllocatorStats::default());
    let s = Session::start(&device, &mut eager).unwrap();
    assert_eq!(
        status_of(s.calibration().expect("calibrated"), "graph_capture"),
        Status::NotChecked
    );
    assert_eq!(
        gpu.truth().hidden_capture,
        0,
        "calibration kept capture memory"
    );

    let gpu = open(&setup).unwrap();
    let device = gpu.device();
    let mut capturing = Capturing(Liar(AllocatorStats::default()));
    let s = Session::start(&device, &mut capturing).unwrap();
    assert_eq!(
        status_of(s.calibration().expect("calibrated"), "graph_capture"),
        Status::Confirmed
    );
    assert!(gpu.truth().hidden_capture > 0, "no test capture ran");
}

/// A calibrated start for an eager engine on a device that maps no virtual memory runs none of
/// the checks that may leave memory held for good (no test capture, no mapping): no allocation
/// probe measures them. On an Arc 140V with no free reading that keeps 32 MiB of every raw free,
/// that probe's own frees were all it measured (named held for good by the start's checks),
/// held before the engine's weights.
#[test]
fn a_calibrated_eager_start_probes_no_checks_that_hold_nothing() {
    let gpu = SimGpu::open("arc-140v,sysman-processes=off,leak-per-free=32MiB").unwrap();
    let device = gpu.device();
    assert!(!device.capabilities().facts.virtual_memory.is_supported());
    let mut eager = Liar(AllocatorStats::default());
    let s = Session::start(&device, &mut eager).unwrap();
    assert!(s.calibration().is_some());
    assert!(
        !s.warnings()
            .iter()
            .any(|w| matches!(w, memplan_planner::Warning::ChecksLeftHeld { .. })),
        "{:?}",
        s.warnings()
    );
}
