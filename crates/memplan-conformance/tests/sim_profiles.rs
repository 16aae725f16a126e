//! The suite in-process (no second process) on particular simulated devices; every profile
//! with a second process is in liars.rs.

#![cfg(feature = "sim")]

use memplan_conformance::{run_id, Outcome};

/// Where Sysman's per-process query is not permitted, the real xpu backend's free == total
/// declaration is suspect by design: the suite catches it.
#[test]
fn arc_a770_is_suspect() {
    let report =
        run_id("sim:arc-a770,sysman-processes=off").expect("the sim device opens and reads");
    let cal = report
        .checks
        .iter()
        .find(|c| c.name == "calibration.declared_holds")
        .expect("calibration check");
    assert_eq!(cal.outcome, Outcome::Fail, "{report}");
    assert!(cal.evidence.contains("driver_free"), "{}", cal.evidence);
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
    let report = run_id("sim:arc-a770,sysman-processes=off,declare-exact").expect("opens");
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

/// A simulated GPU whose virtual-memory granularity is garbage.
struct HugeGranule(memplan_backend_sim::SimGpu);

impl memplan::HalDevice for HugeGranule {
    fn descriptor(&self) -> &memplan::DeviceDescriptor {
        self.0.descriptor()
    }
    fn capabilities(&self) -> &memplan::ProfilingCapability {
        self.0.capabilities()
    }
    fn driver_memory(&mut self) -> memplan::Result<memplan::DriverMemory> {
        self.0.driver_memory()
    }
    fn synchronize(&mut self) -> memplan::Result<()> {
        self.0.synchronize()
    }
    fn allocate(&mut self, bytes: u64) -> memplan::Result<u64> {
        self.0.allocate(bytes)
    }
    unsafe fn free(&mut self, address: u64, bytes: u64) -> memplan::Result<()> {
        // SAFETY: the caller's guarantee, passed on to the GPU that made the allocation.
        unsafe { self.0.free(address, bytes) }
    }
    fn virtual_memory(&mut self) -> memplan::Result<&mut dyn memplan::HalVirtualMemory> {
        Ok(self)
    }
}

impl memplan::HalVirtualMemory for HugeGranule {
    fn granularity(&mut self) -> memplan::Result<u64> {
        Ok(u64::MAX / 2)
    }
    fn reserve(&mut self, bytes: u64) -> memplan::Result<u64> {
        self.0.reserve(bytes)
    }
    unsafe fn free_range(&mut self, base: u64, bytes: u64) -> memplan::Result<()> {
        // SAFETY: the caller's guarantee, passed on (as for every call below).
        unsafe { self.0.free_range(base, bytes) }
    }
    fn create_physical(&mut self, bytes: u64) -> memplan::Result<u64> {
        self.0.create_physical(bytes)
    }
    unsafe fn destroy_physical(&mut self, physical: u64, bytes: u64) -> memplan::Result<()> {
        // SAFETY: as above.
        unsafe { self.0.destroy_physical(physical, bytes) }
    }
    unsafe fn map(&mut self, address: u64, bytes: u64, physical: u64) -> memplan::Result<()> {
        // SAFETY: as above.
        unsafe { self.0.map(address, bytes, physical) }
    }
    unsafe fn unmap(&mut self, address: u64, bytes: u64) -> memplan::Result<()> {
        // SAFETY: as above.
        unsafe { self.0.unmap(address, bytes) }
    }
}

#[test]
fn a_garbage_granularity_fails_the_checks_without_a_panic() {
    let d = memplan::Device::new(HugeGranule(
        memplan_backend_sim::SimGpu::open("rtx4090").unwrap(),
    ));
    let report = memplan_conformance::run(&d).expect("the device reads");
    let vm = report
        .checks
        .iter()
        .find(|c| c.name == "virtual_memory.lifecycle")
        .expect("virtual memory check");
    assert_eq!(vm.outcome, Outcome::Fail, "{}", vm.evidence);
    assert!(!report.passed());
}

// `memplan::open` shares one simulated GPU among everyone in the process who opens the same
// selector, as a real device is shared; the test above runs the suite on `sim:rtx4090` at the
// same time, so this one opens a selector nobody else in this binary uses.
memplan_conformance::conformance_test!(
    macro_instantiation_rtx4090,
    memplan::open("sim:rtx4090,other=0")
);

/// What `conformance_test!` does, checked: the test binary starts itself again on this one
/// test as the second process, which holds memory the parent's device-wide reading sees.
#[test]
fn the_second_process_of_a_test_is_the_test_binary_again() {
    memplan_conformance::serve_if_asked();
    let device = memplan::open("sim:rtx4090,other=0,seed=5").expect("opens");
    let how = memplan_conformance::SecondProcess::this_test(concat!(
        module_path!(),
        "::the_second_process_of_a_test_is_the_test_binary_again"
    ))
    .expect("this binary");
    let report = memplan_conformance::run_with(
        &device,
        &memplan_conformance::Options::with_second_process(how),
    )
    .expect("runs");
    for name in ["locality.driver_free", "total.accounted"] {
        let c = report
            .checks
            .iter()
            .find(|c| c.name == name)
            .expect("present");
        assert_eq!(c.outcome, Outcome::Pass, "{name}: {}", c.evidence);
        assert!(c.evidence.contains("second process"), "{}", c.evidence);
    }
}
