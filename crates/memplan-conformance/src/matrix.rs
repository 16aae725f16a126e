//! The capability matrix of the shipped backends, generated from the code: each simulated
//! profile's declaration, and each real backend's declaration for representative platforms
//! (built from the same `capability::declare` functions the backends call at run time).
//!
//! `cargo xtask capability-matrix` writes it to `docs/capability-matrix.md`; `cargo xtask ci`
//! fails when the committed file differs from what the code declares.

use memplan::{ProfilingCapability, Reading};

/// One row: backend, platform, capability.
pub struct Row {
    /// Backend name.
    pub backend: &'static str,
    /// Platform (profile name, or runtime version and device kind).
    pub platform: String,
    /// The declared capability.
    pub capability: ProfilingCapability,
}

/// Every row this build can produce (real backends only when their feature is on).
pub fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    #[cfg(feature = "sim")]
    for p in memplan_backend_sim::profiles() {
        rows.push(Row {
            backend: "sim",
            platform: p.name.to_string(),
            capability: (p.declared)(),
        });
    }
    #[cfg(feature = "cuda")]
    rows.extend(cuda_rows());
    #[cfg(feature = "rocm")]
    rows.extend(rocm_rows());
    #[cfg(feature = "xpu")]
    rows.extend(xpu_rows());
    rows
}

#[cfg(feature = "cuda")]
fn cuda_rows() -> Vec<Row> {
    use memplan_backend_cuda::capability::{declare, CudaFacts};
    use memplan_backend_cuda::conv::CudaVersion;
    let gib = memplan::bytes::GIB;
    let base = CudaFacts {
        driver_version: CudaVersion(12080),
        integrated: false,
        vmm_attribute: Some(true),
        memory_pools_attribute: Some(true),
        mig_profile: None,
        total_bytes: Some(80 * gib),
    };
    let cases = [
        ("driver 12.8, discrete", base.clone()),
        (
            "driver 11.2, discrete (no graph-memory attributes)",
            CudaFacts {
                driver_version: CudaVersion(11020),
                ..base.clone()
            },
        ),
        (
            "driver 12.8, MIG 1g.10gb",
            CudaFacts {
                mig_profile: Some("1g.10gb".into()),
                vmm_attribute: Some(true),
                ..base.clone()
            },
        ),
        (
            "driver 12.6, integrated (Jetson-class)",
            CudaFacts {
                driver_version: CudaVersion(12060),
                integrated: true,
                vmm_attribute: Some(false),
                ..base
            },
        ),
    ];
    cases
        .into_iter()
        .map(|(p, f)| Row {
            backend: "cuda",
            platform: p.into(),
            capability: declare(&f),
        })
        .collect()
}

#[cfg(feature = "rocm")]
fn rocm_rows() -> Vec<Row> {
    use memplan_backend_rocm::capability::{declare, Inputs};
    use memplan_backend_rocm::conv::HipVersion;
    let input = |major, minor, integrated, drm_vram, vmm_attribute| Inputs {
        runtime: HipVersion::new(major, minor, 0),
        integrated,
        drm_vram,
        vmm_attribute,
        lacks: Vec::new(),
    };
    let cases = [
        ("HIP 5.2, discrete", input(5, 2, false, false, false)),
        ("HIP 5.4, discrete", input(5, 4, false, false, false)),
        (
            "HIP 5.6, discrete with DRM sysfs",
            input(5, 6, false, true, true),
        ),
        (
            "HIP 6.2, discrete with DRM sysfs",
            input(6, 2, false, true, true),
        ),
        ("HIP 7.0, discrete", input(7, 0, false, false, true)),
        ("HIP 6.2, APU", input(6, 2, true, false, false)),
    ];
    cases
        .into_iter()
        .map(|(p, i)| Row {
            backend: "rocm",
            platform: p.into(),
            capability: declare(&i).capability,
        })
        .collect()
}

#[cfg(feature = "xpu")]
fn xpu_rows() -> Vec<Row> {
    use memplan_backend_xpu::capability::{declare, Facts};
    use memplan_backend_xpu::conv::SysmanFree;
    let gib = memplan::bytes::GIB;
    let readable = |free| SysmanFree::Readable {
        free,
        size: 16 * gib,
        modules: 1,
    };
    let cases = [
        (
            "discrete, Sysman readable",
            Facts {
                integrated: false,
                sysman: readable(15 * gib),
                virtual_memory: memplan::Support::Supported,
            },
        ),
        (
            "discrete, Sysman free == total (non-root i915)",
            Facts {
                integrated: false,
                sysman: readable(16 * gib),
                virtual_memory: memplan::Support::Supported,
            },
        ),
        (
            "discrete, Sysman unavailable",
            Facts {
                integrated: false,
                sysman: SysmanFree::unavailable(
                    "zesInit unavailable and ZES_ENABLE_SYSMAN not set",
                ),
                virtual_memory: memplan::Support::Supported,
            },
        ),
        (
            "integrated",
            Facts {
                integrated: true,
                sysman: SysmanFree::unavailable("integrated GPU: shared system memory"),
                virtual_memory: memplan::Support::no("zeVirtualMemQueryPageSize failed"),
            },
        ),
    ];
    cases
        .into_iter()
        .map(|(p, f)| Row {
            backend: "xpu",
            platform: p.into(),
            capability: declare(&f),
        })
        .collect()
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The matrix as Markdown.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "# Capability matrix\n\n\
         Generated by `cargo xtask capability-matrix` from the backends' own declarations; \
         `cargo xtask ci` fails when this file drifts from the code. Reliability of each \
         reading: exact / approximate / deferred / process-local / unavailable (see \
         docs/architecture.md). These are *declarations*; calibration on the device confirms \
         or downgrades them.\n\n\
         | backend | platform | driver total | driver free | graph pool | graph capture | graph-pool attrs | virtual memory | unified | graph release | synchronize |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let c = &r.capability;
        let f = &c.facts;
        let yes_no = |s: &memplan::Support| if s.is_supported() { "yes" } else { "no" };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.backend,
            cell(&r.platform),
            c.reading(Reading::DriverTotal).label(),
            c.reading(Reading::DriverFree).label(),
            c.reading(Reading::GraphPool).label(),
            yes_no(&f.graph_capture),
            yes_no(&f.graph_pool_attributes),
            yes_no(&f.virtual_memory),
            if f.unified_memory { "yes" } else { "no" },
            match f.graph_release {
                memplan::GraphRelease::Immediate => "immediate",
                memplan::GraphRelease::AtNextSync => "at next sync",
            },
            yes_no(&f.synchronize),
        ));
    }
    out.push_str(
        "\nA device without a device-wide `synchronize` gets the engine's own synchronize \
         (`Engine::synchronize`) before each reading, or a `readings_not_synchronized` warning \
         (docs/measurement-protocol.md).\n",
    );
    out.push_str("\n## Why each reading is not exact\n\n");
    for r in rows {
        let c = &r.capability;
        let reasons: Vec<String> = Reading::ALL
            .iter()
            .filter_map(|rd| {
                let rel = c.reading(*rd);
                (!rel.is_exact()).then(|| format!("{}: {}", rd.name(), cell(&rel.to_string())))
            })
            .collect();
        if !reasons.is_empty() {
            out.push_str(&format!(
                "- **{} {}**: {}\n",
                r.backend,
                cell(&r.platform),
                reasons.join("; ")
            ));
        }
    }
    out.push_str("\n## Why a device cannot synchronize\n\n");
    for r in rows {
        if let memplan::Support::Unsupported { reason } = &r.capability.facts.synchronize {
            out.push_str(&format!(
                "- **{} {}**: {}\n",
                r.backend,
                cell(&r.platform),
                cell(reason)
            ));
        }
    }
    out
}
