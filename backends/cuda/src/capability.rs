//! The capability the CUDA backend declares, derived from facts only.
//!
//! [`CudaFacts`] holds what the driver told us (version, device attributes, the MIG profile in
//! the name); [`declare`] turns it into a [`ProfilingCapability`]. Pure data and functions, so
//! every rule is tested without a GPU. Calibration in the planner then confirms or downgrades.
//!
//! The rules, each with its source:
//! - driver total/free: `cuMemGetInfo` is exact and device-wide (every process, every API) on
//!   discrete GPUs; under MIG both are the instance's memory. On integrated GPUs (Jetson/Tegra)
//!   device memory is host memory and `free` does not count reclaimable page cache, so it is
//!   declared approximate, within 5 % of total, for calibration to check.
//! - graph pool: `cuDeviceGetGraphMemAttribute` (CUDA >= 11.4) counts graph allocation nodes
//!   only, not a framework's private pool of ordinary allocations; it needs memory-pool support.
//! - graph capture: stream capture with allocation nodes needs CUDA >= 11.4 and memory pools.
//! - virtual memory: `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, CUDA >= 10.2.

use memplan_core::{GraphRelease, ProfilingCapability, Reading, Reliability, Support};

use crate::facts::{check_version, CudaFacts, Feature};

/// Tolerance declared for `free` on integrated GPUs, as a fraction of total memory.
pub const INTEGRATED_FREE_TOLERANCE: f64 = 0.05;

fn attribute_support(attr: Option<bool>, name: &str) -> Support {
    match attr {
        Some(true) => Support::Supported,
        Some(false) => Support::no(format!("the device reports {name} = 0")),
        None => Support::no(format!("{name} could not be read")),
    }
}

fn version_support(facts: &CudaFacts, f: Feature) -> Support {
    match check_version(facts.driver_version, f) {
        Ok(()) => Support::Supported,
        Err(e) => Support::no(e.to_string()),
    }
}

fn both(a: Support, b: Support) -> Support {
    if a.is_supported() {
        b
    } else {
        a
    }
}

/// The capability declared for a device with these facts.
pub fn declare(facts: &CudaFacts) -> ProfilingCapability {
    let mut cap = ProfilingCapability::exact_discrete();
    let mut notes = vec![format!(
        "CUDA driver {}: cuMemGetInfo is device-wide (all processes and APIs)",
        facts.driver_version
    )];

    if let Some(p) = &facts.mig_profile {
        notes.push(format!(
            "MIG instance {p}: total and free are the instance's memory, not the whole GPU's"
        ));
    }
    if facts.integrated {
        let tol = facts
            .total_bytes
            .map(|t| (t as f64 * INTEGRATED_FREE_TOLERANCE) as u64)
            .unwrap_or(0);
        let why =
            "integrated GPU: device memory is host memory; free excludes reclaimable page cache";
        cap.set(
            Reading::DriverFree,
            if tol > 0 {
                Reliability::Approximate {
                    tolerance_bytes: tol,
                    why: why.into(),
                }
            } else {
                Reliability::Unavailable {
                    reason: format!("{why}, and total memory is unknown"),
                }
            },
        );
        notes.push("unified memory: the KV cache competes with host allocations".into());
    }

    // cuMemGetInfo is the device-wide source itself: the same trust as the free reading.
    cap.set(Reading::DeviceAvailable, cap.reading(Reading::DriverFree));

    let pools = attribute_support(
        facts.memory_pools_attribute,
        "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED",
    );
    let graph_pool = both(version_support(facts, Feature::GraphMemory), pools.clone());
    match &graph_pool {
        Support::Supported => {
            notes.push(
                "graph pool: counts graph allocation nodes only, not a framework's private pool"
                    .into(),
            );
        }
        Support::Unsupported { reason } => {
            cap.set(
                Reading::GraphPool,
                Reliability::Unavailable {
                    reason: reason.clone(),
                },
            );
        }
    }
    cap.facts.graph_pool_attributes = graph_pool;
    cap.facts.graph_capture = both(version_support(facts, Feature::GraphCapture), pools);
    cap.facts.virtual_memory = both(
        version_support(facts, Feature::VirtualMemory),
        attribute_support(
            facts.vmm_attribute,
            "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
        ),
    );
    cap.facts.unified_memory = facts.integrated;
    cap.facts.graph_release = GraphRelease::Immediate;
    cap.facts.hidden_bytes_per_capture = None;
    cap.notes = notes;
    cap
}

/// Downgrade what `cap` promises when the library lacks symbols it needs (a driver that
/// reports a version but not its exports: a stub or a broken install). Each argument is
/// `Driver::supports` (in `loader`, with the `runtime` feature) of the matching feature.
pub fn require_exports(
    cap: &mut ProfilingCapability,
    graph_memory: Result<(), String>,
    graph_capture: Result<(), String>,
    virtual_memory: Result<(), String>,
) {
    if let Err(why) = graph_memory {
        cap.facts.graph_pool_attributes = Support::no(why.clone());
        cap.set(
            Reading::GraphPool,
            Reliability::Unavailable {
                reason: why.clone(),
            },
        );
        cap.facts.graph_capture = Support::no(why);
    }
    if let Err(why) = graph_capture {
        cap.facts.graph_capture = Support::no(why);
    }
    if let Err(why) = virtual_memory {
        cap.facts.virtual_memory = Support::no(why);
    }
}

/// The platforms this backend's row of the capability matrix shows (`docs/capability-matrix.md`),
/// each a label and what [`declare`] makes of its facts: current and old drivers, MIG, an
/// integrated (Jetson-class) device.
pub fn platforms() -> Vec<(&'static str, ProfilingCapability)> {
    use crate::facts::CudaVersion;
    let gib = memplan_core::bytes::GIB;
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
    cases.into_iter().map(|(p, f)| (p, declare(&f))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::CudaVersion;

    fn discrete() -> CudaFacts {
        CudaFacts {
            driver_version: CudaVersion(12040),
            integrated: false,
            vmm_attribute: Some(true),
            memory_pools_attribute: Some(true),
            mig_profile: None,
            total_bytes: Some(24 << 30),
        }
    }

    #[test]
    fn discrete_gpu_on_a_current_driver_is_exact() {
        let c = declare(&discrete());
        for r in Reading::ALL {
            assert!(c.reading(r).is_exact(), "{r:?}: {}", c.reading(r));
        }
        assert!(c.facts.graph_capture.is_supported());
        assert!(c.facts.graph_pool_attributes.is_supported());
        assert!(c.facts.virtual_memory.is_supported());
        assert!(!c.facts.unified_memory);
        assert!(c.notes.iter().any(|n| n.contains("device-wide")));
        assert!(c.notes.iter().any(|n| n.contains("allocation nodes only")));
    }

    #[test]
    fn old_driver_has_no_graph_pool() {
        let c = declare(&CudaFacts {
            driver_version: CudaVersion(11020),
            ..discrete()
        });
        assert_eq!(c.reading(Reading::GraphPool).label(), "unavailable");
        assert!(c.reading(Reading::GraphPool).detail().contains("11.4"));
        assert!(!c.facts.graph_capture.is_supported());
        assert!(!c.facts.graph_pool_attributes.is_supported());
        assert!(c.reading(Reading::DriverFree).is_exact());
        assert!(c.facts.virtual_memory.is_supported());
    }

    #[test]
    fn vmm_follows_the_attribute() {
        let c = declare(&CudaFacts {
            vmm_attribute: Some(false),
            ..discrete()
        });
        assert!(c
            .facts
            .virtual_memory
            .to_string()
            .contains("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0"));
        let c = declare(&CudaFacts {
            vmm_attribute: None,
            ..discrete()
        });
        assert!(!c.facts.virtual_memory.is_supported());
    }

    #[test]
    fn no_memory_pools_means_no_graph_alloc_nodes() {
        let c = declare(&CudaFacts {
            memory_pools_attribute: Some(false),
            ..discrete()
        });
        assert!(!c.facts.graph_capture.is_supported());
        assert_eq!(c.reading(Reading::GraphPool).label(), "unavailable");
    }

    #[test]
    fn integrated_gpu_is_unified_and_free_is_approximate() {
        let c = declare(&CudaFacts {
            integrated: true,
            total_bytes: Some(64 << 30),
            ..discrete()
        });
        assert!(c.facts.unified_memory);
        match c.reading(Reading::DriverFree) {
            Reliability::Approximate {
                tolerance_bytes, ..
            } => {
                assert_eq!(
                    tolerance_bytes,
                    ((64u64 << 30) as f64 * INTEGRATED_FREE_TOLERANCE) as u64
                )
            }
            other => panic!("{other}"),
        }
        let c = declare(&CudaFacts {
            integrated: true,
            total_bytes: None,
            ..discrete()
        });
        assert_eq!(c.reading(Reading::DriverFree).label(), "unavailable");
    }

    #[test]
    fn missing_exports_downgrade_what_needs_them() {
        let mut c = declare(&discrete());
        require_exports(
            &mut c,
            Err("no cuDeviceGraphMemTrim".into()),
            Ok(()),
            Ok(()),
        );
        assert_eq!(c.reading(Reading::GraphPool).label(), "unavailable");
        assert!(
            !c.facts.graph_capture.is_supported() && !c.facts.graph_pool_attributes.is_supported()
        );
        assert!(c.facts.virtual_memory.is_supported());
        let mut c = declare(&discrete());
        require_exports(&mut c, Ok(()), Ok(()), Err("no cuMemMap".into()));
        assert!(c.facts.virtual_memory.to_string().contains("cuMemMap"));
        assert!(c.facts.graph_capture.is_supported() && c.reading(Reading::GraphPool).is_exact());
    }

    #[test]
    fn mig_is_said() {
        let c = declare(&CudaFacts {
            mig_profile: Some("1g.10gb".into()),
            ..discrete()
        });
        assert!(c
            .notes
            .iter()
            .any(|n| n.contains("MIG instance 1g.10gb") && n.contains("instance's memory")));
        assert!(c.reading(Reading::DriverFree).is_exact());
    }
}
