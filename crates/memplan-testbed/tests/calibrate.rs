//! Calibration on every simulated profile: honest declarations hold, lies are caught, every
//! calibration allocation is freed. (Moved from `memplan-planner`, which depends on no
//! backend.)

use memplan_backend_sim::{profiles, SimGpu};
use memplan_core::{
    Device, DeviceDescriptor, DriverMemory, Error, GraphPoolMemory, GraphRelease, HalDevice,
    HalGraphs, HalVirtualMemory, ProfilingCapability, Reading, Reliability, Result,
};
use memplan_planner::calibrate::{calibrate, CalibrationReport, Status};

fn cal(selector: &str) -> CalibrationReport {
    cal_gpu(selector).0
}

/// The note of the verdict on `item`.
fn note<'r>(r: &'r CalibrationReport, item: &str) -> &'r str {
    &r.verdicts.iter().find(|v| v.item == item).unwrap().note
}

/// The per-capture memory calibration found is the device's drawn figure, within what its
/// reading noise and the executable object's bound allow (4 kernel nodes at most 512 KiB).
fn hidden_close_to_truth(r: &CalibrationReport, gpu: &SimGpu) -> bool {
    let truth = gpu.physics().hidden_bytes_per_capture as i64;
    let slack = 2 * gpu.physics().read_noise_bytes as i64 + (512 << 10);
    let found = r.calibrated.facts.hidden_bytes_per_capture.unwrap_or(0) as i64;
    (found - truth).abs() <= slack
}

/// Honest but for the per-capture memory, which calibration may refine to what it measured
/// (the declaration carries the public figure; the device draws its own).
fn honest_but_hidden(r: &CalibrationReport, gpu: &SimGpu) -> bool {
    let mut declared = r.declared.clone();
    declared.facts.hidden_bytes_per_capture = r.calibrated.facts.hidden_bytes_per_capture;
    let refined =
        r.calibrated.facts.hidden_bytes_per_capture != r.declared.facts.hidden_bytes_per_capture;
    declared == r.calibrated && (!refined || hidden_close_to_truth(r, gpu))
}

fn cal_gpu(selector: &str) -> (CalibrationReport, SimGpu) {
    let gpu = SimGpu::open(selector).expect("profile exists");
    let before = gpu.truth();
    let r = calibrate(&gpu.device()).expect("calibration runs");
    // Every calibration allocation is freed (per-capture memory a runtime keeps aside).
    let after = gpu.truth();
    assert_eq!(after.raw_allocations, before.raw_allocations, "{selector}");
    assert_eq!(after.live_graphs, 0, "{selector}");
    assert_eq!(after.vmm_mapped, 0, "{selector}");
    assert_eq!(after.vmm_ranges, 0, "{selector}");
    assert_eq!(
        after.graph_pool_reserved, before.graph_pool_reserved,
        "{selector}"
    );
    (r, gpu)
}

#[test]
fn honest_declarations_hold() {
    // arc-a770: the real backend declares its free == total reading suspect (approximate within
    // the whole size, "calibration must confirm"), and calibration does downgrade it: checked
    // in `specific_quirks_give_specific_downgrades`. World physics: on adversarial seeds the
    // device does what its declaration does not say, and calibration should disagree.
    for p in profiles()
        .iter()
        .filter(|p| !p.name.starts_with("broken") && p.name != "arc-a770")
    {
        for seed in 0..8 {
            let (r, gpu) = cal_gpu(&format!("{},seed={seed},regime=world", p.name));
            assert!(
                honest_but_hidden(&r, &gpu),
                "{} seed {seed}: {:#?} {:?}",
                p.name,
                r.downgrade_lines(),
                gpu.physics()
            );
        }
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
            // A free reading that reports the total is caught: the driver's where nothing
            // composes it, Sysman's own (the device-wide reading) where the per-process query
            // composes the driver's.
            || q.free_equals_total
            // Sysman's per-process query, where permitted, composes a free that holds.
            || (q.sysman_missing && !q.sysman_processes)
            || q.apu_wrong_pool
            || q.graph_pool_attrs_zero
            // Without graph capture there is no graph pool to check.
            || (q.no_graph_pool_query && p.capability().facts.graph_capture.is_supported())
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
    let (r, gpu) = cal_gpu("rx7900xtx-rocm6.2,declare-exact");
    assert_eq!(r.calibrated.facts.graph_release, GraphRelease::AtNextSync);
    assert!(hidden_close_to_truth(&r, &gpu), "{:?}", r.calibrated.facts);
    let r = cal("rx7900xtx-rocm5.4,declare-exact");
    assert_eq!(
        r.calibrated.reading(Reading::GraphPool).label(),
        "unavailable"
    );
    let r = cal("arc-a770,sysman-processes=off,declare-exact");
    assert_eq!(
        r.calibrated.reading(Reading::DriverFree).label(),
        "unavailable"
    );
    // An APU backend that trusts hipMemGetInfo reads the aperture: caught.
    let r = cal("strix-halo,declare-exact,apu-wrong-pool=on");
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

#[test]
fn capture_works_where_allocation_nodes_do_not() {
    // A runtime without stream-ordered allocation (no asynchronous malloc at all) refuses
    // the allocation node, not the capture: graph capture stays supported, and the graph-pool
    // check says it could not be made instead of passing or failing.
    for name in ["rtx4090", "rx7900xtx-rocm6.2", "mi300x"] {
        let (r, gpu) = cal_gpu(&format!("{name},no-graph-alloc-nodes"));
        assert!(
            honest_but_hidden(&r, &gpu),
            "{name}: {:#?}",
            r.downgrade_lines()
        );
        assert!(r.calibrated.facts.graph_capture.is_supported(), "{name}");
        let pool = r.verdicts.iter().find(|v| v.item == "graph_pool").unwrap();
        assert_eq!(pool.status, Status::NotChecked, "{name}");
        assert!(pool.note.contains("allocation node"), "{}", pool.note);
        let capture = note(&r, "graph_capture");
        assert!(capture.contains("without an allocation node"), "{capture}");
    }
    // Declared exact over the deferred release and hidden memory: still caught without a node.
    let (r, gpu) = cal_gpu("rx7900xtx-rocm6.2,declare-exact,no-graph-alloc-nodes");
    assert_eq!(r.calibrated.facts.graph_release, GraphRelease::AtNextSync);
    assert!(hidden_close_to_truth(&r, &gpu), "{:?}", r.calibrated.facts);
    assert!(r.calibrated.facts.graph_capture.is_supported());
}

#[test]
fn allocation_nodes_refused_without_graph_pool_attributes_to_check() {
    // Declared without graph-pool attributes, nothing checks the allocation node's growth, but
    // the test capture still asks for one: whether the device records it is what an engine
    // whose graphs allocate in such nodes needs to know before it warms them up. A runtime
    // that cannot record one refuses it, the capture goes on without, and calibration says so.
    let r = cal("rx7900xtx-rocm5.4,no-graph-alloc-nodes");
    assert!(r.honest(), "{:#?}", r.downgrade_lines());
    assert!(r.calibrated.facts.graph_capture.is_supported());
    assert!(r.graph_alloc_nodes_refused);
    let capture = note(&r, "graph_capture");
    assert!(
        capture.contains("cannot record a graph allocation node"),
        "{capture}"
    );
    // Where the node records, the pool is left unchecked as declared, and nothing is refused.
    for name in ["rx7900xtx-rocm5.4", "rx7900xtx-rocm5.5"] {
        let r = cal(name);
        assert!(r.honest(), "{name}: {:#?}", r.downgrade_lines());
        assert!(!r.graph_alloc_nodes_refused, "{name}");
        let pool = r.verdicts.iter().find(|v| v.item == "graph_pool").unwrap();
        assert_eq!(pool.status, Status::NotChecked, "{name}");
        assert!(pool.note.contains("declared unsupported"), "{}", pool.note);
        let capture = note(&r, "graph_capture");
        assert!(
            capture.contains("allocation node") && !capture.contains("without"),
            "{name}: {capture}"
        );
    }
}

/// A simulated GPU whose `fail_at`-th driver reading fails.
struct FlakyReadings {
    gpu: SimGpu,
    reads: usize,
    fail_at: Option<usize>,
}

impl HalDevice for FlakyReadings {
    fn descriptor(&self) -> &DeviceDescriptor {
        self.gpu.descriptor()
    }
    fn capabilities(&self) -> &ProfilingCapability {
        self.gpu.capabilities()
    }
    fn driver_memory(&mut self) -> Result<DriverMemory> {
        self.reads += 1;
        if self.fail_at == Some(self.reads - 1) {
            return Err(Error::DriverCall {
                call: "flaky reading".into(),
                code: 1,
                name: "injected".into(),
            });
        }
        self.gpu.driver_memory()
    }
    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        self.gpu.graph_pool_memory()
    }
    fn synchronize(&mut self) -> Result<()> {
        self.gpu.synchronize()
    }
    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        self.gpu.allocate(bytes)
    }
    unsafe fn free(&mut self, address: u64, bytes: u64) -> Result<()> {
        // SAFETY: the caller's guarantee, passed on to the GPU that made the allocation.
        unsafe { self.gpu.free(address, bytes) }
    }
    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        self.gpu.graphs()
    }
    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        self.gpu.virtual_memory()
    }
}

#[test]
fn a_failing_reading_leaks_nothing() {
    for name in ["rtx4090", "mi300x", "rx7900xtx-rocm6.2,declare-exact"] {
        let probe = Device::new(FlakyReadings {
            gpu: SimGpu::open(name).unwrap(),
            reads: 0,
            fail_at: None,
        });
        calibrate(&probe).unwrap();
        let reads = probe.inspect(|p: &FlakyReadings| p.reads).unwrap();
        for fail_at in 0..reads {
            let gpu = SimGpu::open(name).unwrap();
            let before = gpu.truth();
            let d = Device::new(FlakyReadings {
                gpu: gpu.clone(),
                reads: 0,
                fail_at: Some(fail_at),
            });
            let _ = calibrate(&d);
            let after = gpu.truth();
            let at = format!("{name}, reading {fail_at} of {reads}");
            assert_eq!(after.raw_allocations, before.raw_allocations, "{at}");
            assert_eq!(after.live_graphs, 0, "{at}");
            assert_eq!(after.vmm_mapped, 0, "{at}");
            assert_eq!(after.vmm_ranges, 0, "{at}");
            assert_eq!(after.graph_pool_reserved, 0, "{at}");
        }
    }
}

/// A simulated GPU whose driver reports fixed garbage (a vendor call returning nonsense).
struct Garbage {
    gpu: SimGpu,
    driver: DriverMemory,
}

impl HalDevice for Garbage {
    fn descriptor(&self) -> &DeviceDescriptor {
        self.gpu.descriptor()
    }
    fn capabilities(&self) -> &ProfilingCapability {
        self.gpu.capabilities()
    }
    fn driver_memory(&mut self) -> Result<DriverMemory> {
        Ok(self.driver)
    }
    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        self.gpu.graph_pool_memory()
    }
    fn synchronize(&mut self) -> Result<()> {
        self.gpu.synchronize()
    }
    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        self.gpu.allocate(bytes)
    }
    unsafe fn free(&mut self, address: u64, bytes: u64) -> Result<()> {
        // SAFETY: the caller's guarantee, passed on to the GPU that made the allocation.
        unsafe { self.gpu.free(address, bytes) }
    }
    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        self.gpu.graphs()
    }
    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        self.gpu.virtual_memory()
    }
}

#[test]
fn garbage_driver_readings_are_downgraded_not_a_panic() {
    let big = 1u64 << 63;
    for (total, free) in [
        (u64::MAX, u64::MAX),
        (24 << 30, u64::MAX),
        (u64::MAX, 0),
        (u64::MAX, big),
        (big, big - 1),
    ] {
        for name in ["rtx4090", "strix-halo,declare-exact"] {
            let d = Device::new(Garbage {
                gpu: SimGpu::open(name).unwrap(),
                driver: DriverMemory::new(Some(total), Some(free)),
            });
            let r = calibrate(&d).expect("calibration runs on garbage");
            assert_eq!(
                r.calibrated.reading(Reading::DriverFree).label(),
                "unavailable",
                "{name} total {total} free {free}"
            );
        }
    }
}

#[test]
fn the_report_gives_what_calibration_read_behind_a_verdict() {
    // The per-capture memory a runtime keeps, as calibration read it (the capture cost that
    // did not come back): the device's drawn figure, within its reading noise and the
    // executable object's bound. Nothing for an item calibration did not check.
    let (r, gpu) = cal_gpu("rx7900xtx-rocm6.2,declare-exact");
    let read = r.observed("hidden_per_capture").expect("a reading");
    let truth = gpu.physics().hidden_bytes_per_capture as i64;
    let slack = 2 * gpu.physics().read_noise_bytes as i64 + (512 << 10);
    assert!((read - truth).abs() <= slack, "{read} vs {truth}");
    assert_eq!(r.observed("no such item"), None);
}

#[test]
fn a_release_deferred_past_a_synchronize_is_trimmed_after_it() {
    // A runtime that gives a destroyed graph's memory back only some synchronizes later keeps
    // it in use until then, and a trim of the graph pool frees only what no graph uses: a trim
    // before those synchronizes left calibration's allocation node reserved in the pool, read
    // as memory every capture keeps (32 MiB too much) and given back inside the engine's graph
    // phase as if another process had freed it.
    let mut checked = 0;
    for seed in 0..40 {
        let selector = format!("rx7900xtx-rocm6.2,regime=adversarial,seed={seed}");
        let gpu = SimGpu::open(&selector).expect("profile exists");
        if gpu.physics().release_after_syncs < 2 {
            continue;
        }
        // `cal_gpu` also checks that the pool is back where it stood.
        let (r, gpu) = cal_gpu(&selector);
        let read = r.observed("hidden_per_capture").expect("a reading");
        let truth = gpu.physics().hidden_bytes_per_capture as i64;
        let slack = 2 * gpu.physics().read_noise_bytes as i64 + (512 << 10);
        assert!(
            (read - truth).abs() <= slack,
            "{selector}: {read} vs {truth}"
        );
        checked += 1;
    }
    assert!(
        checked >= 5,
        "only {checked} seeds defer past one synchronize"
    );
}

#[test]
fn memory_every_free_keeps_is_reported_and_is_no_error_of_the_reading() {
    // A driver whose every free keeps 2 MiB: each allocate/free pair left that much held. The
    // figure is reported (its evidence fails), and the free reading keeps its declaration:
    // the windows over a free are judged against what the free gave back.
    for name in [
        "h100-80gb",
        "a100-40gb",
        "rtx4090",
        "mi300x",
        "broken-leaky-free",
    ] {
        let leak = if name.starts_with("broken") {
            ""
        } else {
            ",leak-per-free=2MiB"
        };
        let selector = format!("{name}{leak},physics=nominal");
        let r = cal(&selector);
        assert_eq!(r.kept_per_free, Some(2 << 20), "{selector}");
        assert_eq!(
            r.calibrated.reading(Reading::DriverFree),
            r.declared.reading(Reading::DriverFree),
            "{selector}"
        );
        let v = r.verdicts.iter().find(|v| v.item == "driver_free").unwrap();
        assert!(
            v.evidence
                .iter()
                .any(|e| !e.ok && e.check.contains("memory the device keeps per free")),
            "{selector}: {:#?}",
            v.evidence
        );
        assert!(r.to_string().contains("every raw free kept 2.00 MiB held"));
    }
    // 8 MiB each, beyond what a window allows for rounding: still no error of the reading.
    let r = cal("h100-80gb,leak-per-free=8MiB,physics=nominal");
    assert_eq!(r.kept_per_free, Some(8 << 20));
    assert!(r.honest(), "{:?}", r.downgrade_lines());
}

#[test]
fn a_device_that_keeps_nothing_never_reports_memory_kept_per_free() {
    // Every profile but the leaky ones, on drawn and adversarial physics (reading noise, steps,
    // late releases, neighbours as the seed draws them): no figure.
    for p in profiles().iter().filter(|p| p.quirks.leak_per_free == 0) {
        for seed in 0..8 {
            for regime in ["world", "adversarial"] {
                let selector = format!("{},seed={seed},regime={regime}", p.name);
                let r = cal(&selector);
                assert_eq!(r.kept_per_free, None, "{selector}");
            }
        }
    }
}

/// A device-wide reading that lags allocations (the driver counters a lagging free reading
/// comes from, which the simulated NVML-like source shares) is unavailable after calibration:
/// a plan capped by it kept to the room a neighbour that had just left took. The same device
/// without the lag keeps its declaration.
#[test]
fn a_stale_device_wide_reading_is_caught() {
    for seed in 0..4 {
        let r = cal(&format!("rtx4090,stale-free=on,seed={seed}"));
        assert_eq!(
            r.calibrated.reading(Reading::DeviceAvailable).label(),
            "unavailable",
            "seed {seed}: {:?}",
            r.downgrade_lines()
        );
        let r = cal(&format!("rtx4090,seed={seed}"));
        assert_eq!(
            r.calibrated.reading(Reading::DeviceAvailable),
            r.declared.reading(Reading::DeviceAvailable),
            "seed {seed}"
        );
    }
}

/// A runtime that gives no free reading (an Arc B580 without Sysman) leaves nothing for the free
/// check's windows to read: the check allocates nothing, and on a device that keeps memory of
/// every raw free nothing is kept for it (its four allocations kept 128 MiB of a device keeping
/// 32 MiB a free, before the engine's weights). The reading is unavailable, as it was.
#[test]
fn an_absent_free_reading_is_judged_without_allocating() {
    let gpu = SimGpu::open("arc-b580-nosysman,leak-per-free=32MiB").expect("profile exists");
    let device = gpu.device();
    let r = memplan_planner::calibrate::calibrate_with(&device, &[64 << 20, 256 << 20]).unwrap();
    let v = r
        .verdicts
        .iter()
        .find(|v| v.item == Reading::DriverFree.name())
        .expect("a free verdict");
    assert!(
        v.evidence.iter().all(|e| !e.check.contains("allocat")),
        "{:?}",
        v.evidence
    );
    assert!(matches!(
        r.calibrated.reading(Reading::DriverFree),
        Reliability::Unavailable { .. }
    ));
}
