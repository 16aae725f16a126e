//! What each simulated platform declares: the real backend's own declaration, computed by the
//! real backend's pure `capability::declare` from the facts the real platform would report
//! (driver/runtime version, device attributes, what sysfs/Sysman offers). One facts function
//! per platform; the profiles in `catalog.rs` point at them. Nothing here states a reliability
//! or a device fact of its own: the three backend crates are built without their `runtime`
//! feature (no vendor library), and their declaration is the one source.
//!
//! `memplan-conformance` (`tests/declarations.rs`) checks these facts against an independent
//! description of each real platform, and that the capability-matrix rows of each simulated
//! profile and of the real platform it imitates agree.

use memplan_backend_cuda::facts::CudaFacts;
use memplan_backend_cuda::facts::CudaVersion;
use memplan_backend_rocm::facts::HipVersion;
use memplan_backend_rocm::facts::Inputs as RocmFacts;
use memplan_backend_xpu::facts::Facts as XpuFacts;
use memplan_backend_xpu::facts::{SysmanFree, SysmanProcesses};
use memplan_core::{ProfilingCapability, Support};

use crate::profile::SimProfile;

/// The facts a real backend reads on one platform, by backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlatformFacts {
    /// What the CUDA backend reads (driver version, device attributes, MIG profile, total).
    Cuda(CudaFacts),
    /// What the ROCm backend reads (runtime version, APU, DRM sysfs, VMM attribute, symbols).
    Rocm(RocmFacts),
    /// What the Level Zero backend reads (integrated, Sysman's reading at open, VMM probe).
    Xpu(XpuFacts),
}

impl PlatformFacts {
    /// The real backend's declaration for these facts.
    pub fn declare(&self) -> ProfilingCapability {
        match self {
            PlatformFacts::Cuda(f) => memplan_backend_cuda::capability::declare(f),
            PlatformFacts::Rocm(f) => memplan_backend_rocm::capability::declare(f).capability,
            PlatformFacts::Xpu(f) => memplan_backend_xpu::capability::declare(f),
        }
    }

    /// The real backend's name (`cuda`, `rocm`, `xpu`).
    pub fn backend(&self) -> &'static str {
        match self {
            PlatformFacts::Cuda(_) => "cuda",
            PlatformFacts::Rocm(_) => "rocm",
            PlatformFacts::Xpu(_) => "xpu",
        }
    }
}

/// NVIDIA, CUDA driver 12.8 on a discrete card: VMM and memory pools supported, no MIG.
pub fn cuda(p: &SimProfile) -> PlatformFacts {
    PlatformFacts::Cuda(CudaFacts {
        driver_version: CudaVersion(12080),
        integrated: false,
        vmm_attribute: Some(true),
        memory_pools_attribute: Some(true),
        mig_profile: None,
        total_bytes: Some(p.total_bytes),
    })
}

fn rocm(major: u32, minor: u32, integrated: bool, drm_vram: bool, vmm: bool) -> PlatformFacts {
    PlatformFacts::Rocm(RocmFacts {
        runtime: HipVersion::new(major, minor, 0),
        integrated,
        drm_vram,
        vmm_attribute: vmm,
        lacks: Vec::new(),
    })
}

/// AMD ROCm 5.4 on a discrete card without DRM sysfs counters; the device reports no VMM.
pub fn rocm54(_: &SimProfile) -> PlatformFacts {
    rocm(5, 4, false, false, false)
}

/// AMD ROCm 5.5 on a discrete desktop card without DRM sysfs counters; no VMM.
pub fn rocm55(_: &SimProfile) -> PlatformFacts {
    rocm(5, 5, false, false, false)
}

/// AMD ROCm 6.2 on a discrete desktop card (RDNA3) with DRM sysfs; the VMM attribute is 1.
pub fn rocm62_desktop(_: &SimProfile) -> PlatformFacts {
    rocm(6, 2, false, true, true)
}

/// AMD ROCm 6.2 on an Instinct accelerator: the same facts as a desktop card.
pub fn rocm62_instinct(_: &SimProfile) -> PlatformFacts {
    rocm(6, 2, false, true, true)
}

/// AMD ROCm 6.2 on an APU (unified memory) with DRM sysfs; the VMM attribute is 0.
pub fn rocm62_apu(_: &SimProfile) -> PlatformFacts {
    rocm(6, 2, true, true, false)
}

fn level_zero(p: &SimProfile, sysman: SysmanFree) -> PlatformFacts {
    PlatformFacts::Xpu(XpuFacts {
        integrated: false,
        sysman,
        virtual_memory: Support::Supported,
        processes: processes(p),
    })
}

/// What Sysman's per-process query gives at open: this process's context, where the platform
/// lists it (`sysman_processes`), else why not.
fn processes(p: &SimProfile) -> SysmanProcesses {
    if p.quirks.sysman_processes {
        SysmanProcesses::Readable {
            own: p.context_overhead_bytes,
            others: 0,
        }
    } else if p.quirks.sysman_missing {
        SysmanProcesses::unavailable("Level Zero Sysman not initialised")
    } else {
        SysmanProcesses::unavailable(
            "zesDeviceProcessesGetState: ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
        )
    }
}

/// Intel Arc A770 on i915, non-root: Sysman answers, but free == total at open.
pub fn xpu_arc_a770(p: &SimProfile) -> PlatformFacts {
    level_zero(
        p,
        SysmanFree::Readable {
            free: p.total_bytes,
            size: p.total_bytes,
            modules: 1,
        },
    )
}

/// Intel Data Center GPU Max 1550 with Sysman: free at open is the total less the context.
pub fn xpu_max1550(p: &SimProfile) -> PlatformFacts {
    level_zero(
        p,
        SysmanFree::Readable {
            free: p.total_bytes - p.context_overhead_bytes,
            size: p.total_bytes,
            modules: 1,
        },
    )
}

/// An integrated Intel GPU (Lunar Lake): shared system memory, for which Sysman reports no
/// device-local free memory (what the real backend's translation of Sysman gives an
/// integrated device). Virtual memory is not assumed: the sim takes the probe as failed.
pub fn xpu_integrated(p: &SimProfile) -> PlatformFacts {
    PlatformFacts::Xpu(XpuFacts {
        integrated: true,
        sysman: SysmanFree::unavailable(INTEGRATED_NO_SYSMAN_FREE),
        virtual_memory: Support::no("zeVirtualMemQueryPageSize failed"),
        processes: processes(p),
    })
}

/// The reason the real backend gives for an integrated GPU's free memory (`conv::translate`).
const INTEGRATED_NO_SYSMAN_FREE: &str = "integrated GPU: device memory is shared system memory and Sysman reports no device-local free memory";

/// An Intel GPU whose process did not enable Sysman: no free reading at all.
pub fn xpu_no_sysman(p: &SimProfile) -> PlatformFacts {
    level_zero(
        p,
        SysmanFree::unavailable(
            "Level Zero Sysman not initialised (ZES_ENABLE_SYSMAN=1 unset and zesInit failed)",
        ),
    )
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
