//! The capabilities each simulated platform declares: what the real backend declares for the
//! platform it imitates (driver version, device attributes, what sysfs/Sysman offers). One
//! function per platform; the profiles in `catalog.rs` point at them. A test of
//! `memplan-conformance` (`tests/declarations.rs`) feeds the real backends' `capability::declare`
//! functions each profile's facts and fails when this table drifts from them.

use memplan_core::bytes::MIB;
use memplan_core::{GraphRelease, ProfilingCapability, Reading, Reliability, Support};

fn unavailable(reason: &str) -> Reliability {
    Reliability::Unavailable {
        reason: reason.into(),
    }
}

const ROCM54_FREE: &str = "hipMemGetInfo on ROCm <= 5.4 counts only this process's allocations";
const ROCM_GRAPH_STUB: &str =
    "hipDeviceGetGraphMemAttribute is a stub returning 0 on ROCm 5.3 - 5.5.1";
const BLIND: &str =
    "hipMemGetInfo (ROCm >= 5.5) is device-wide but blind to graphics (DRM) allocations";
const WITH_DRM: &str = "DRM sysfs mem_info_vram_used counts every user of the VRAM: free is the smaller of it and hipMemGetInfo";
/// The real backend's tolerance for free composed from hipMemGetInfo and DRM sysfs.
const TWO_SOURCE_TOLERANCE: u64 = 16 * MIB;
/// The real backend's tolerance on an APU (host MemAvailable bounds the usable memory).
const HOST_BOUNDED_TOLERANCE: u64 = 256 * MIB;
const L0_NO_GRAPH_POOL: &str = "Level Zero has no graph-pool memory query";
const HIDDEN_4MIB: u64 = 4 * MIB;

/// NVIDIA CUDA (driver >= 11.4): every reading exact, graph-memory attributes meaningful,
/// cuMemAddressReserve/cuMemMap available.
pub fn cuda() -> ProfilingCapability {
    let mut c = ProfilingCapability::exact_discrete();
    c.notes
        .push("cuMemGetInfo: device-wide, exact after a synchronize".into());
    c.notes
        .push("cuDeviceGetGraphMemAttribute (CUDA >= 11.4) counts graph allocation nodes".into());
    c
}

/// AMD ROCm 5.4 on a discrete card: free is process-local, graph-pool attributes are a stub,
/// no virtual-memory management on this device/runtime.
pub fn rocm54() -> ProfilingCapability {
    let mut c = ProfilingCapability::exact_discrete();
    c.set(
        Reading::DriverFree,
        Reliability::ProcessLocal {
            why: ROCM54_FREE.into(),
        },
    );
    c.set(Reading::GraphPool, unavailable(ROCM_GRAPH_STUB));
    c.facts.graph_pool_attributes = Support::no(ROCM_GRAPH_STUB);
    c.facts.virtual_memory =
        Support::no("hipMemAddressReserve is not supported by this device/runtime (sim: ROCm 5.4)");
    c.notes.push("sim platform: ROCm 5.4".into());
    c
}

/// AMD ROCm 5.5 on a discrete desktop card: free is device-wide but blind to graphics, the
/// graph-pool attributes are still the stub.
pub fn rocm55() -> ProfilingCapability {
    let mut c = rocm54();
    c.set(
        Reading::DriverFree,
        Reliability::Approximate {
            tolerance_bytes: 512 * MIB,
            why: BLIND.into(),
        },
    );
    c.notes = vec![
        "sim platform: ROCm 5.5 without DRM sysfs; tolerance = a desktop's graphics allocations"
            .into(),
    ];
    c
}

fn rocm62_common(tolerance_bytes: u64) -> ProfilingCapability {
    let mut c = ProfilingCapability::exact_discrete();
    c.set(
        Reading::DriverFree,
        Reliability::Approximate {
            tolerance_bytes,
            why: WITH_DRM.into(),
        },
    );
    c.facts.graph_release = GraphRelease::AtNextSync;
    c.facts.hidden_bytes_per_capture = Some(HIDDEN_4MIB);
    c.notes
        .push("sim platform: ROCm 6.2: graph-pool attributes real (>= 5.6)".into());
    c.notes
        .push("hipGraphExecDestroy frees memory only at the next synchronize (>= 6.2)".into());
    c.notes
        .push("~4 MiB per capture kept by the HIP fragment allocator".into());
    c
}

/// AMD ROCm 6.2 on a discrete desktop card (RDNA3) with DRM sysfs: free composed from
/// hipMemGetInfo and sysfs (sees graphics), deferred graph release, hidden per-capture memory,
/// virtual memory (the device attribute is 1).
pub fn rocm62_desktop() -> ProfilingCapability {
    rocm62_common(TWO_SOURCE_TOLERANCE)
}

/// AMD ROCm 6.2 on an Instinct accelerator: as desktop.
pub fn rocm62_instinct() -> ProfilingCapability {
    let mut c = rocm62_common(TWO_SOURCE_TOLERANCE);
    c.notes.push("headless accelerator".into());
    c
}

/// AMD ROCm 6.2 on an APU (unified memory): the real backend bounds total and free by the
/// host's MemAvailable (hipMemGetInfo reports the VRAM aperture), within 256 MiB.
pub fn rocm62_apu() -> ProfilingCapability {
    let why = "APU: usable memory is bounded by the host's MemAvailable, not the VRAM aperture hipMemGetInfo reports";
    let mut c = rocm62_common(0);
    let approx = || Reliability::Approximate {
        tolerance_bytes: HOST_BOUNDED_TOLERANCE,
        why: why.into(),
    };
    c.set(Reading::DriverTotal, approx());
    c.set(Reading::DriverFree, approx());
    c.facts.unified_memory = true;
    c.facts.virtual_memory = Support::no("not declared for this APU in the sim (device dependent)");
    c.notes
        .push("unified memory: plan with an absolute byte budget".into());
    c
}

/// The real xpu backend cannot synchronize the device (Level Zero has no device-wide wait).
const L0_NO_SYNC: &str = "Level Zero has no device-wide synchronize: \
     zeCommandQueueSynchronize, zeCommandListHostSynchronize and zeFenceHostSynchronize wait \
     only for a queue, list or fence the caller owns, and the engine's queues are not \
     memplan's (memplan submits no work of its own on Intel)";

/// The real xpu backend does not capture (memplan implements no Level Zero record/replay).
const L0_NO_CAPTURE: &str = "Level Zero record/replay is not implemented by memplan's xpu backend, \
     and Level Zero cannot report graph memory; the planner runs eager or uses a conservative reserve";

fn level_zero(free: Reliability) -> ProfilingCapability {
    let mut c = ProfilingCapability::exact_discrete();
    c.set(Reading::DriverFree, free);
    c.set(Reading::GraphPool, unavailable(L0_NO_GRAPH_POOL));
    c.facts.graph_pool_attributes = Support::no(L0_NO_GRAPH_POOL);
    c.facts.graph_capture = Support::no(L0_NO_CAPTURE);
    c.facts.synchronize = Support::no(L0_NO_SYNC);
    c.notes.push(
        "zeDeviceGetMemoryProperties gives total; free only through Sysman (~150 ms per call)"
            .into(),
    );
    c
}

/// Intel Arc A770 on i915, non-root: Sysman answers but free == total; the real backend
/// declares it approximate within the whole size (suspect; calibration must confirm).
pub fn xpu_arc_a770() -> ProfilingCapability {
    let mut c = level_zero(Reliability::Approximate {
        tolerance_bytes: 16 * memplan_core::bytes::GIB,
        why: "Sysman free == total: i915 reports this to non-root users on some kernels, hiding all usage".into(),
    });
    c.notes.push(
        "suspect: Sysman reported free == total with a context open; calibration must confirm"
            .into(),
    );
    c
}

/// Intel Data Center GPU Max 1550 with Sysman available: free exact.
pub fn xpu_max1550() -> ProfilingCapability {
    level_zero(Reliability::Exact)
}

/// An Intel GPU whose process did not enable Sysman: free cannot be read at all.
pub fn xpu_no_sysman() -> ProfilingCapability {
    level_zero(unavailable(
        "Level Zero Sysman not initialised (ZES_ENABLE_SYSMAN=1 unset and zesInit failed)",
    ))
}

/// What `declare-exact` turns a declaration into: every reading exact, graph-pool attributes
/// meaningful, immediate release, no hidden cost; what the device can do (capture, virtual
/// memory, unified memory, synchronize) is kept, since it decides which operations work at all.
pub fn declare_exact(platform: &ProfilingCapability) -> ProfilingCapability {
    let mut c = ProfilingCapability::exact_discrete();
    c.facts.graph_capture = platform.facts.graph_capture.clone();
    c.facts.virtual_memory = platform.facts.virtual_memory.clone();
    c.facts.unified_memory = platform.facts.unified_memory;
    c.facts.synchronize = platform.facts.synchronize.clone();
    c.notes.push(
        "declare-exact: every reading declared exact while the platform's quirks stay on".into(),
    );
    c
}
