//! The capability this backend declares for a device, from facts read at open: integrated or
//! discrete, what Sysman gave (or why it gave nothing), whether virtual memory is supported.
//! Calibration (in the planner) later confirms or downgrades it with evidence.
//!
//! Known traps, each a declaration rather than a silent number:
//! - Sysman unreachable (no `zesInit` in the loader and `ZES_ENABLE_SYSMAN` not set, or a
//!   failing Sysman call): free memory **unavailable**, with the reason.
//! - Integrated GPU: free memory **unavailable** ("shared system memory"), unified memory set.
//! - free == total right after memplan created a context: what i915 reports to non-root users
//!   on some kernels. Declared **approximate** with a tolerance of the whole device, flagged as
//!   suspect; calibration checks whether free memory moves with an allocation and downgrades.
//! - Where Sysman's free memory cannot be used (integrated, or free == total) but its
//!   per-process query lists this process (`zesDeviceProcessesGetState`, permitted for the
//!   caller's own processes), free memory is **process-local**: the total less this process's
//!   `memSize`. It measures this engine's own memory; other processes stay for the device-wide
//!   reading or the planner's allocation probe.
//! - Otherwise free memory is device-wide (the kernel's memory-region counters): exact.
//! - No device-wide synchronize ([`NO_DEVICE_SYNCHRONIZE`]): Level Zero waits only for work on
//!   a command queue, list or fence the caller holds, and the engine's queues are not
//!   memplan's. Declared unsupported, so the protocol waits through the engine's own hook.

use memplan_core::{GraphRelease, ProfilingCapability, Reading, Reliability, Support};

use crate::facts::{Facts, SysmanFree, SysmanProcesses, TotalSource};
use crate::graph;

/// Why this backend cannot synchronize the device: what `synchronize` would have to wait for
/// is on the engine's queues, which Level Zero gives memplan no handle on.
pub const NO_DEVICE_SYNCHRONIZE: &str = "Level Zero has no device-wide synchronize: \
     zeCommandQueueSynchronize, zeCommandListHostSynchronize and zeFenceHostSynchronize wait \
     only for a queue, list or fence the caller owns, and the engine's queues are not \
     memplan's (memplan submits no work of its own on Intel)";

/// How far the host's `MemAvailable` may be off for an integrated GPU: reclaimable page cache
/// and other host processes move it between a reading and an allocation.
const HOST_TOLERANCE: u64 = 256 * memplan_core::bytes::MIB;

/// Why a free reading composed from the per-process query sees only this process.
pub const PER_PROCESS_FREE: &str = "Sysman zesDeviceProcessesGetState: the total less this \
     process's memSize (other processes are not listed to an ordinary user)";

/// Declare the capability of one device.
pub fn declare(f: &Facts) -> ProfilingCapability {
    let mut notes = Vec::new();
    let per_process = f.processes.is_readable();
    let free = match &f.sysman {
        SysmanFree::Unavailable { reason } if per_process => {
            notes.push(format!(
                "driver_free: composed from the per-process query ({reason})"
            ));
            Reliability::process_local(0, PER_PROCESS_FREE)
        }
        SysmanFree::Unavailable { reason } => Reliability::Unavailable {
            reason: reason.clone(),
        },
        SysmanFree::Readable { .. } if f.sysman.free_equals_total() && per_process => {
            notes.push("driver_free: Sysman reported free == total with a context open (what i915 reports to non-root users); composed from the per-process query instead".into());
            Reliability::process_local(0, PER_PROCESS_FREE)
        }
        SysmanFree::Readable { size, .. } if f.sysman.free_equals_total() => {
            notes.push("suspect: Sysman reported free == total with a context open; calibration must confirm".into());
            Reliability::Approximate {
                tolerance_bytes: *size,
                why: "Sysman free == total: i915 reports this to non-root users on some kernels, hiding all usage".into(),
            }
        }
        SysmanFree::Readable { .. } => {
            notes.push("driver_free: Sysman zesMemoryGetState, device-wide, ~150 ms per read, read once per snapshot".into());
            Reliability::Exact
        }
    };
    notes.push(match f.total_source() {
        TotalSource::Sysman => {
            "driver_total: Sysman zes_mem_state_t.size of the device-local modules".into()
        }
        TotalSource::CoreProperties => {
            "driver_total: zeDeviceGetMemoryProperties totalSize (Sysman unavailable)".into()
        }
    });
    if f.integrated {
        notes.push(
            "integrated GPU: driver_total is the share of system memory the driver exposes".into(),
        );
    }
    let mut c = ProfilingCapability::exact_discrete();
    // Only what is set below is declared (an undeclared reading reads as unavailable).
    c.readings.clear();
    c.facts.graph_capture = graph::capture_support();
    c.facts.graph_pool_attributes = graph::pool_attributes();
    c.facts.virtual_memory = f.virtual_memory.clone();
    c.facts.unified_memory = f.integrated;
    c.facts.graph_release = GraphRelease::Immediate;
    c.facts.hidden_bytes_per_capture = None;
    c.facts.synchronize = Support::no(NO_DEVICE_SYNCHRONIZE);
    c.notes = notes;
    // Device-wide: Sysman is the driver layer's own source on a discrete card (same trust);
    // an integrated GPU shares the host's memory, which /proc/meminfo MemAvailable counts.
    let device_wide = if f.integrated {
        Reliability::Approximate {
            tolerance_bytes: HOST_TOLERANCE,
            why: "integrated GPU: host /proc/meminfo MemAvailable, every process's use of the shared memory".into(),
        }
    } else {
        match &f.sysman {
            // Sysman's own free reading, whatever the driver layer composed from it.
            SysmanFree::Readable { size, .. } if f.sysman.free_equals_total() => Reliability::Approximate {
                tolerance_bytes: *size,
                why: "Sysman free == total: i915 reports this to non-root users on some kernels, hiding all usage".into(),
            },
            SysmanFree::Readable { .. } => Reliability::Exact,
            SysmanFree::Unavailable { reason } => Reliability::Unavailable {
                reason: reason.clone(),
            },
        }
    };
    c.set(Reading::DriverTotal, Reliability::Exact);
    c.set(Reading::DeviceAvailable, device_wide);
    c.set(Reading::DriverFree, free);
    c.set(Reading::GraphPool, graph::pool_reading());
    c
}

/// The platforms this backend's row of the capability matrix shows (`docs/capability-matrix.md`),
/// each a label and what [`declare`] makes of its facts: Sysman readable, Sysman's free ==
/// total with and without the per-process query, Sysman unavailable, integrated with and
/// without the per-process query.
pub fn platforms() -> Vec<(&'static str, ProfilingCapability)> {
    let gib = memplan_core::bytes::GIB;
    let readable = |free| SysmanFree::Readable {
        free,
        size: 16 * gib,
        modules: 1,
    };
    let refused = || {
        SysmanProcesses::unavailable(
            "zesDeviceProcessesGetState: ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
        )
    };
    let listed = || SysmanProcesses::Readable {
        own: 256 << 20,
        others: 0,
    };
    let cases = [
        (
            "discrete, Sysman readable",
            Facts {
                integrated: false,
                sysman: readable(15 * gib),
                virtual_memory: Support::Supported,
                processes: listed(),
            },
        ),
        (
            "discrete, Sysman free == total (non-root i915)",
            Facts {
                integrated: false,
                sysman: readable(16 * gib),
                virtual_memory: Support::Supported,
                processes: refused(),
            },
        ),
        (
            "discrete, Sysman free == total (non-root i915), per-process query permitted",
            Facts {
                integrated: false,
                sysman: readable(16 * gib),
                virtual_memory: Support::Supported,
                processes: listed(),
            },
        ),
        (
            "discrete, Sysman unavailable",
            Facts {
                integrated: false,
                sysman: SysmanFree::unavailable(
                    "zesInit unavailable and ZES_ENABLE_SYSMAN not set",
                ),
                virtual_memory: Support::Supported,
                processes: SysmanProcesses::unavailable("Level Zero Sysman not initialised"),
            },
        ),
        (
            "integrated",
            Facts {
                integrated: true,
                sysman: SysmanFree::unavailable("integrated GPU: shared system memory"),
                virtual_memory: Support::no("zeVirtualMemQueryPageSize failed"),
                processes: refused(),
            },
        ),
        (
            "integrated, per-process query permitted",
            Facts {
                integrated: true,
                sysman: SysmanFree::unavailable("integrated GPU: shared system memory"),
                virtual_memory: Support::no("zeVirtualMemQueryPageSize failed"),
                processes: listed(),
            },
        ),
    ];
    cases.into_iter().map(|(p, f)| (p, declare(&f))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::GIB;

    fn facts(integrated: bool, sysman: SysmanFree) -> Facts {
        Facts {
            integrated,
            sysman,
            virtual_memory: Support::Supported,
            processes: SysmanProcesses::unavailable("not asked"),
        }
    }

    #[test]
    fn discrete_with_sysman_is_exact() {
        let c = declare(&facts(
            false,
            SysmanFree::Readable {
                free: 40 * GIB,
                size: 48 * GIB,
                modules: 1,
            },
        ));
        assert!(c.reading(Reading::DriverFree).is_exact());
        assert_eq!(c.reading(Reading::GraphPool).label(), "unavailable");
        assert!(!c.facts.graph_capture.is_supported());
        assert!(c.facts.virtual_memory.is_supported());
        assert!(!c.facts.unified_memory);
        match &c.facts.synchronize {
            Support::Unsupported { reason } => {
                assert!(reason.contains("zeCommandQueueSynchronize"), "{reason}")
            }
            Support::Supported => panic!("Level Zero has no device-wide synchronize"),
        }
    }

    #[test]
    fn free_equal_total_is_suspect() {
        let c = declare(&facts(
            false,
            SysmanFree::Readable {
                free: 16 * GIB,
                size: 16 * GIB,
                modules: 1,
            },
        ));
        match c.reading(Reading::DriverFree) {
            Reliability::Approximate {
                tolerance_bytes,
                why,
            } => {
                assert_eq!(tolerance_bytes, 16 * GIB);
                assert!(why.contains("non-root"), "{why}");
            }
            other => panic!("expected approximate, got {other}"),
        }
        assert!(c.notes.iter().any(|n| n.starts_with("suspect")));
    }

    #[test]
    fn missing_sysman_is_unavailable_with_reason() {
        let c = declare(&facts(
            false,
            SysmanFree::unavailable("ZES_ENABLE_SYSMAN is not set"),
        ));
        assert_eq!(
            c.reading(Reading::DriverFree).detail(),
            "ZES_ENABLE_SYSMAN is not set"
        );
        assert!(c
            .notes
            .iter()
            .any(|n| n.contains("zeDeviceGetMemoryProperties")));
        assert!(c.reading(Reading::DriverTotal).is_exact());
    }

    #[test]
    fn integrated_gpu_is_unified_without_free() {
        let s = SysmanFree::unavailable(
            "integrated GPU: device memory is shared system memory and Sysman reports no device-local free memory",
        );
        let c = declare(&Facts {
            integrated: true,
            sysman: s.clone(),
            virtual_memory: Support::no("x"),
            processes: SysmanProcesses::unavailable("not permitted"),
        });
        assert!(c.facts.unified_memory);
        assert!(!c.reading(Reading::DriverFree).measures_own_usage());
        assert!(c
            .reading(Reading::DriverFree)
            .detail()
            .contains("shared system memory"));
        // With the per-process query permitted, free is this process's: process-local.
        let c = declare(&Facts {
            integrated: true,
            sysman: s,
            virtual_memory: Support::no("x"),
            processes: SysmanProcesses::Readable { own: 0, others: 0 },
        });
        assert!(matches!(
            c.reading(Reading::DriverFree),
            Reliability::ProcessLocal { .. }
        ));
        assert!(c.reading(Reading::DriverFree).measures_own_usage());
        assert!(!c.reading(Reading::DriverFree).sees_whole_device());
    }

    #[test]
    fn free_equal_total_with_the_per_process_query_is_process_local() {
        let mut f = facts(
            false,
            SysmanFree::Readable {
                free: 16 * GIB,
                size: 16 * GIB,
                modules: 1,
            },
        );
        f.processes = SysmanProcesses::Readable {
            own: 300 << 20,
            others: 0,
        };
        let c = declare(&f);
        assert!(matches!(
            c.reading(Reading::DriverFree),
            Reliability::ProcessLocal { .. }
        ));
        // The device-wide reading stays Sysman's own, suspect.
        assert!(matches!(
            c.reading(Reading::DeviceAvailable),
            Reliability::Approximate { tolerance_bytes, .. } if tolerance_bytes == 16 * GIB
        ));
    }
}
