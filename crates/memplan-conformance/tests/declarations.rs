//! One source for declarations: a simulated profile's capability is the real backend's own
//! `capability::declare`, run on the profile's facts (`SimProfile::facts`). What can still
//! drift is the facts, so this checks
//! - each profile's facts against an independent description of the real platform it imitates
//!   (the versions, attributes and Sysman answers that platform reports), and
//! - the capability-matrix row of each simulated profile against the row of that real platform
//!   (`memplan_conformance::matrix::drifts`), cell by cell,
//!
//! and shows that each check fails when a fact is perturbed.

use memplan::bytes::GIB;
use memplan_backend_sim::{PlatformFacts, SimProfile};
use memplan_conformance::matrix::{drifts, rows, Row};

fn cuda(total: u64) -> PlatformFacts {
    use memplan_backend_cuda::facts::CudaFacts;
    use memplan_backend_cuda::facts::CudaVersion;
    PlatformFacts::Cuda(CudaFacts {
        driver_version: CudaVersion(12080),
        integrated: false,
        vmm_attribute: Some(true),
        memory_pools_attribute: Some(true),
        mig_profile: None,
        total_bytes: Some(total),
    })
}

fn rocm(major: u32, minor: u32, integrated: bool, drm: bool, vmm: bool) -> PlatformFacts {
    use memplan_backend_rocm::facts::HipVersion;
    use memplan_backend_rocm::facts::Inputs;
    PlatformFacts::Rocm(Inputs {
        runtime: HipVersion::new(major, minor, 0),
        integrated,
        drm_vram: drm,
        vmm_attribute: vmm,
        lacks: Vec::new(),
    })
}

/// What Sysman's per-process query answers an ordinary user: this process (its context at
/// open), or nothing where Sysman is not initialised.
fn processes(own: Option<u64>) -> memplan_backend_xpu::facts::SysmanProcesses {
    use memplan_backend_xpu::facts::SysmanProcesses;
    match own {
        Some(own) => SysmanProcesses::Readable { own, others: 0 },
        None => SysmanProcesses::unavailable("Level Zero Sysman not initialised"),
    }
}

/// An integrated Intel GPU: Sysman has no device-local module to report; its per-process
/// query lists this process.
fn xpu_integrated(context: u64) -> PlatformFacts {
    use memplan_backend_xpu::facts::Facts;
    use memplan_backend_xpu::facts::SysmanFree;
    PlatformFacts::Xpu(Facts {
        integrated: true,
        sysman: SysmanFree::unavailable(
            "integrated GPU: device memory is shared system memory and Sysman reports no device-local free memory",
        ),
        virtual_memory: memplan::Support::no("zeVirtualMemQueryPageSize failed"),
        processes: processes(Some(context)),
    })
}

fn xpu(sysman: Option<(u64, u64)>, context: u64) -> PlatformFacts {
    use memplan_backend_xpu::facts::Facts;
    use memplan_backend_xpu::facts::SysmanFree;
    PlatformFacts::Xpu(Facts {
        processes: processes(sysman.map(|_| context)),
        integrated: false,
        sysman: match sysman {
            Some((free, size)) => SysmanFree::Readable {
                free,
                size,
                modules: 1,
            },
            None => SysmanFree::unavailable(
                "Level Zero Sysman not initialised (ZES_ENABLE_SYSMAN=1 unset and zesInit failed)",
            ),
        },
        virtual_memory: memplan::Support::Supported,
    })
}

/// What the real platform a profile imitates reports, written from the platform's public
/// facts (driver and runtime releases, device attributes, what Sysman answers a non-root user).
fn real(p: &SimProfile) -> Option<PlatformFacts> {
    let t = p.total_bytes;
    Some(match p.name {
        // CUDA 12.8 drivers on discrete cards: VMM and memory pools supported, no MIG.
        "rtx4090" | "rtx3090" | "a100-40gb" | "a100-80gb" | "h100-80gb" | "h200" | "l4" => cuda(t),
        "broken-stale"
        | "broken-process-local"
        | "broken-total-high"
        | "broken-total-low"
        | "broken-leaky-free"
        | "broken-leaky-vm" => cuda(t),
        "broken-leaky-free-unreadable" => xpu(None, 0),
        // ROCm 6.2: amdgpu exposes mem_info_vram_* in sysfs; RDNA3/CDNA3 report VMM = 1.
        "mi300x" | "rx7900xtx-rocm6.2" => rocm(6, 2, false, true, true),
        "rx7900xtx-rocm5.4" => rocm(5, 4, false, false, false),
        "rx7900xtx-rocm5.5" => rocm(5, 5, false, false, false),
        // Strix Halo: an APU; DRM sysfs present; VMM not reported.
        "strix-halo" => rocm(6, 2, true, true, false),
        // i915 to a non-root user: free == size; the per-process query lists this process.
        "arc-a770" => xpu(Some((t, t)), p.context_overhead_bytes),
        // Sysman readable at open: everything but the context is free.
        "max1550" => xpu(
            Some((t - p.context_overhead_bytes, t)),
            p.context_overhead_bytes,
        ),
        "arc-b580-nosysman" => xpu(None, 0),
        "arc-140v" => xpu_integrated(p.context_overhead_bytes),
        _ => return None,
    })
}

#[test]
fn every_simulated_profile_reports_the_facts_of_its_real_platform() {
    let mut drifts = Vec::new();
    for p in memplan_backend_sim::profiles() {
        match real(p) {
            Some(r) if r == p.facts() => {}
            Some(r) => drifts.push(format!("{}: sim {:?}\n  real {r:?}", p.name, p.facts())),
            None => drifts.push(format!("{}: no real platform described", p.name)),
        }
    }
    assert!(drifts.is_empty(), "{}", drifts.join("\n"));
}

#[test]
fn simulated_rows_of_the_capability_matrix_agree_with_their_real_rows() {
    let d = drifts(&rows());
    assert!(d.is_empty(), "{} drifts:\n{}", d.len(), d.join("\n"));
}

/// A sim row whose facts are perturbed (the profile the test names, built from other facts).
fn perturbed(rows: &mut [Row], profile: &str, facts: PlatformFacts) {
    let r = rows
        .iter_mut()
        .find(|r| r.backend == "sim" && r.platform == profile)
        .expect("the profile has a row");
    r.capability = facts.declare();
}

/// The checks above can fail: one fact changed on one profile shows up in both.
#[test]
fn a_perturbed_fact_is_a_drift() {
    // ROCm 6.2 desktop without the DRM counters: free falls back to hipMemGetInfo (blind to
    // graphics, ±512 MiB instead of ±16 MiB).
    let mut r = rows();
    perturbed(&mut r, "rx7900xtx-rocm6.2", rocm(6, 2, false, false, true));
    let d = drifts(&r);
    assert!(
        d.iter()
            .any(|l| l.contains("rx7900xtx-rocm6.2") && l.contains("driver_free")),
        "{d:?}"
    );
    // A CUDA driver too old for graph-memory attributes: capture and the pool reading go.
    let mut r = rows();
    let old = {
        let PlatformFacts::Cuda(mut f) = cuda(24 * GIB) else {
            unreachable!()
        };
        f.driver_version = memplan_backend_cuda::facts::CudaVersion(11020);
        PlatformFacts::Cuda(f)
    };
    perturbed(&mut r, "rtx4090", old.clone());
    let d = drifts(&r);
    assert!(d.iter().any(|l| l.contains("graph capture")), "{d:?}");
    // And the facts comparison itself tells the two apart.
    let p = memplan_backend_sim::profile("rtx4090").unwrap();
    assert_ne!(p.facts(), old);
    let p = memplan_backend_sim::profile("max1550").unwrap();
    assert_ne!(
        p.facts(),
        xpu(
            Some((p.total_bytes, p.total_bytes)),
            p.context_overhead_bytes
        )
    );
}
