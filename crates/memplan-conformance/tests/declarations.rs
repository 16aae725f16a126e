//! Each simulated profile declares what the real backend declares for the platform it
//! imitates: the same reliability (and tolerance) per reading and the same device facts. The
//! real declarations come from the backends' own `capability::declare` functions, fed the
//! facts the real platform would report. Fails when the simulator's table drifts from them.

#![cfg(all(feature = "sim", feature = "cuda", feature = "rocm", feature = "xpu"))]

use memplan::{ProfilingCapability, Reading};

fn cuda(total: u64) -> ProfilingCapability {
    use memplan_backend_cuda::capability::{declare, CudaFacts};
    use memplan_backend_cuda::conv::CudaVersion;
    declare(&CudaFacts {
        driver_version: CudaVersion(12080),
        integrated: false,
        vmm_attribute: Some(true),
        memory_pools_attribute: Some(true),
        mig_profile: None,
        total_bytes: Some(total),
    })
}

fn rocm(major: u32, minor: u32, integrated: bool, drm: bool, vmm: bool) -> ProfilingCapability {
    use memplan_backend_rocm::capability::{declare, Inputs};
    use memplan_backend_rocm::conv::HipVersion;
    declare(&Inputs {
        runtime: HipVersion::new(major, minor, 0),
        integrated,
        drm_vram: drm,
        vmm_attribute: vmm,
        lacks: Vec::new(),
    })
    .capability
}

fn xpu(sysman: Option<(u64, u64)>) -> ProfilingCapability {
    use memplan_backend_xpu::capability::{declare, Facts};
    use memplan_backend_xpu::conv::SysmanFree;
    declare(&Facts {
        integrated: false,
        sysman: match sysman {
            Some((free, size)) => SysmanFree::Readable {
                free,
                size,
                modules: 1,
            },
            None => SysmanFree::unavailable("zesInit unavailable and ZES_ENABLE_SYSMAN not set"),
        },
        virtual_memory: memplan::Support::Supported,
    })
}

/// What the real backend declares for the platform a profile imitates.
fn real(profile: &memplan_backend_sim::SimProfile) -> Option<ProfilingCapability> {
    let t = profile.total_bytes;
    Some(match profile.name {
        "rtx4090" | "rtx3090" | "a100-40gb" | "a100-80gb" | "h100-80gb" | "h200" | "l4" => cuda(t),
        "mi300x" => rocm(6, 2, false, true, true),
        "rx7900xtx-rocm5.4" => rocm(5, 4, false, false, false),
        "rx7900xtx-rocm5.5" => rocm(5, 5, false, false, false),
        "rx7900xtx-rocm6.2" => rocm(6, 2, false, true, true),
        "strix-halo" => rocm(6, 2, true, true, false),
        "arc-a770" => xpu(Some((t, t))),
        "max1550" => xpu(Some((t / 2, t))),
        "arc-b580-nosysman" => xpu(None),
        _ => return None,
    })
}

/// The parts of a declaration both must agree on, as text.
fn shape(c: &ProfilingCapability) -> Vec<String> {
    let f = &c.facts;
    let mut v: Vec<String> = Reading::ALL
        .iter()
        .map(|r| {
            let rel = c.reading(*r);
            format!("{}: {} ±{}", r.name(), rel.label(), rel.tolerance_bytes())
        })
        .collect();
    v.push(format!("graph capture: {}", f.graph_capture.is_supported()));
    v.push(format!(
        "graph-pool attrs: {}",
        f.graph_pool_attributes.is_supported()
    ));
    v.push(format!(
        "virtual memory: {}",
        f.virtual_memory.is_supported()
    ));
    v.push(format!("unified: {}", f.unified_memory));
    v.push(format!("graph release: {:?}", f.graph_release));
    v.push(format!("synchronize: {}", f.synchronize.is_supported()));
    v.push(format!(
        "hidden per capture: {:?}",
        f.hidden_bytes_per_capture
    ));
    v
}

#[test]
fn every_simulated_profile_declares_what_its_real_backend_declares() {
    let mut drifts = Vec::new();
    for p in memplan_backend_sim::profiles() {
        let Some(real) = real(p) else { continue };
        let (sim, real) = (shape(&(p.declared)()), shape(&real));
        for (s, r) in sim.iter().zip(&real) {
            if s != r {
                drifts.push(format!("{}: sim `{s}` vs real `{r}`", p.name));
            }
        }
    }
    assert!(
        drifts.is_empty(),
        "{} drifts:\n{}",
        drifts.len(),
        drifts.join("\n")
    );
}
