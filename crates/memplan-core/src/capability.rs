//! `ProfilingCapability`: how far each reading of a device can be trusted, and what the device
//! can do. Backends declare it from facts (driver version, device attributes); calibration
//! (in `memplan-planner`) confirms or downgrades it with evidence.
//!
//! The planner chooses its strategy from these values alone, never from a vendor's name.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

use crate::bytes::fmt_bytes;

/// A reading that a device (or the allocator view beside it) can provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reading {
    /// Driver total memory.
    DriverTotal,
    /// Driver free memory.
    DriverFree,
    /// Graph-pool used/reserved attributes.
    GraphPool,
    /// Device-wide available memory from a source that counts every process and API
    /// ([`DeviceWideMemory`](crate::DeviceWideMemory)): what the planner caps the KV cache by
    /// where the driver's free reading is process-local, absent or suspect.
    DeviceAvailable,
}

impl Reading {
    /// Every reading, in display order.
    pub const ALL: [Reading; 4] = [
        Reading::DriverTotal,
        Reading::DriverFree,
        Reading::GraphPool,
        Reading::DeviceAvailable,
    ];

    /// Name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Reading::DriverTotal => "driver_total",
            Reading::DriverFree => "driver_free",
            Reading::GraphPool => "graph_pool",
            Reading::DeviceAvailable => "device_available",
        }
    }
}

/// How far one reading can be trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reliability {
    /// Exact, device-wide, immediately after a synchronize.
    Exact,
    /// Within `tolerance_bytes` of the truth; `why` says what it misses.
    Approximate {
        /// Largest expected error in bytes.
        tolerance_bytes: u64,
        /// What the reading misses.
        why: String,
    },
    /// Right only after a synchronize (or a delay); `why` says what lags.
    Deferred {
        /// What lags behind.
        why: String,
    },
    /// Counts only this process, within `tolerance_bytes` of what this process holds;
    /// memory held by other processes is invisible. The planner widens its margins by the
    /// tolerance (as for [`Reliability::Approximate`]) and, because the reading cannot see
    /// other processes, bounds the plan by a device-wide reading or an allocation probe.
    ProcessLocal {
        /// Largest expected error in bytes on this process's own use (0: exact for this
        /// process). Absent in JSON written before the field existed: 0.
        #[serde(default)]
        tolerance_bytes: u64,
        /// Where this comes from.
        why: String,
    },
    /// Cannot be read at all.
    Unavailable {
        /// Why not.
        reason: String,
    },
}

impl Reliability {
    /// A process-local reading within `tolerance_bytes` of what this process holds.
    pub fn process_local(tolerance_bytes: u64, why: impl Into<String>) -> Self {
        Reliability::ProcessLocal {
            tolerance_bytes,
            why: why.into(),
        }
    }

    /// Can the reading be used to measure a window of this process's own allocations?
    /// Exact, approximate, deferred (after a sync) and process-local readings can; only
    /// unavailable ones cannot.
    pub fn measures_own_usage(&self) -> bool {
        !matches!(self, Reliability::Unavailable { .. })
    }

    /// Does the reading see memory held by other processes and other APIs?
    pub fn sees_whole_device(&self) -> bool {
        matches!(
            self,
            Reliability::Exact | Reliability::Approximate { .. } | Reliability::Deferred { .. }
        )
    }

    /// Is the reading exact?
    pub fn is_exact(&self) -> bool {
        matches!(self, Reliability::Exact)
    }

    /// Short label for tables.
    pub fn label(&self) -> &'static str {
        match self {
            Reliability::Exact => "exact",
            Reliability::Approximate { .. } => "approximate",
            Reliability::Deferred { .. } => "deferred",
            Reliability::ProcessLocal { .. } => "process-local",
            Reliability::Unavailable { .. } => "unavailable",
        }
    }

    /// The detail string, if any.
    pub fn detail(&self) -> String {
        match self {
            Reliability::Exact => String::new(),
            Reliability::Approximate {
                tolerance_bytes,
                why,
            }
            | Reliability::ProcessLocal {
                tolerance_bytes,
                why,
            } if *tolerance_bytes > 0 => {
                format!("±{}: {why}", fmt_bytes(*tolerance_bytes))
            }
            Reliability::Approximate { why, .. }
            | Reliability::Deferred { why }
            | Reliability::ProcessLocal { why, .. } => why.clone(),
            Reliability::Unavailable { reason } => reason.clone(),
        }
    }

    /// How far the reading may be off, in bytes: the tolerance of an approximate or a
    /// process-local reading (on what it counts), 0 for every other kind (exact, or not a
    /// matter of tolerance).
    pub fn tolerance_bytes(&self) -> u64 {
        match self {
            Reliability::Approximate {
                tolerance_bytes, ..
            }
            | Reliability::ProcessLocal {
                tolerance_bytes, ..
            } => *tolerance_bytes,
            _ => 0,
        }
    }

    /// A rank from most (4) to least (0) trustworthy, used to tell a downgrade.
    pub fn rank(&self) -> u8 {
        match self {
            Reliability::Exact => 4,
            Reliability::Approximate { .. } => 3,
            Reliability::Deferred { .. } => 2,
            Reliability::ProcessLocal { .. } => 1,
            Reliability::Unavailable { .. } => 0,
        }
    }
}

impl fmt::Display for Reliability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.detail();
        if d.is_empty() {
            f.write_str(self.label())
        } else {
            write!(f, "{} ({d})", self.label())
        }
    }
}

/// Whether an operation is supported, with the reason when it is not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Support {
    /// Supported.
    Supported,
    /// Not supported, and why.
    Unsupported {
        /// Why not.
        reason: String,
    },
}

impl Support {
    /// Is it supported?
    pub fn is_supported(&self) -> bool {
        matches!(self, Support::Supported)
    }

    /// Unsupported, with a reason.
    pub fn no(reason: impl Into<String>) -> Self {
        Support::Unsupported {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Support::Supported => f.write_str("yes"),
            Support::Unsupported { reason } => write!(f, "no ({reason})"),
        }
    }
}

/// When memory of a destroyed graph returns to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GraphRelease {
    /// Immediately when the graph is destroyed.
    Immediate,
    /// Only at the next device synchronize.
    AtNextSync,
}

/// Facts about the device, beyond the readings. Built through
/// [`ProfilingCapability::exact_discrete`] and changed field by field (`#[non_exhaustive]`: a new
/// fact is not a breaking change for a backend).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceFacts {
    /// Graph capture (stream capture, record/replay).
    pub graph_capture: Support,
    /// Whether graph-pool attributes mean anything (they only count graph allocation nodes).
    pub graph_pool_attributes: Support,
    /// Virtual-memory management: reserve address space now, map physical memory later.
    pub virtual_memory: Support,
    /// Unified memory (APU): device memory is host memory.
    pub unified_memory: bool,
    /// When a destroyed graph's memory returns.
    pub graph_release: GraphRelease,
    /// Driver memory used per captured graph that no allocator sees (bytes), when known.
    pub hidden_bytes_per_capture: Option<u64>,
    /// A device-wide synchronize: [`Device::synchronize`](crate::Device::synchronize) waits
    /// for all work submitted to the device by this process, the engine's queues included, so
    /// a reading right after it sees that work finished. Where it is unsupported (the reason
    /// says why), the protocol waits for the engine's own queues through the engine's hook
    /// before each reading, or warns that readings may see work still in flight.
    pub synchronize: Support,
}

/// Per-reading reliability plus device facts, as declared or as calibrated. Built with
/// [`ProfilingCapability::exact_discrete`], then downgraded with [`ProfilingCapability::set`]
/// and the facts' fields (`#[non_exhaustive]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProfilingCapability {
    /// Reliability of each reading.
    pub readings: BTreeMap<Reading, Reliability>,
    /// Facts about the device.
    pub facts: DeviceFacts,
    /// Free-form notes (where each declaration comes from).
    pub notes: Vec<String>,
}

impl ProfilingCapability {
    /// The reliability of one reading (unavailable when not declared).
    pub fn reading(&self, r: Reading) -> Reliability {
        self.readings
            .get(&r)
            .cloned()
            .unwrap_or_else(|| Reliability::Unavailable {
                reason: "not declared by the backend".into(),
            })
    }

    /// Set the reliability of one reading.
    pub fn set(&mut self, r: Reading, rel: Reliability) {
        self.readings.insert(r, rel);
    }

    /// A capability where every reading is exact and every operation supported: a well-behaved
    /// discrete GPU. Starting point for backends that then downgrade what they must.
    pub fn exact_discrete() -> Self {
        let readings = Reading::ALL
            .iter()
            .map(|r| (*r, Reliability::Exact))
            .collect();
        ProfilingCapability {
            readings,
            facts: DeviceFacts {
                graph_capture: Support::Supported,
                graph_pool_attributes: Support::Supported,
                virtual_memory: Support::Supported,
                unified_memory: false,
                graph_release: GraphRelease::Immediate,
                hidden_bytes_per_capture: None,
                synchronize: Support::Supported,
            },
            notes: Vec::new(),
        }
    }
}

impl fmt::Display for ProfilingCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in Reading::ALL {
            writeln!(f, "  {:<24} {}", r.name(), self.reading(r))?;
        }
        let fa = &self.facts;
        writeln!(f, "  {:<24} {}", "graph_capture", fa.graph_capture)?;
        writeln!(
            f,
            "  {:<24} {}",
            "graph_pool_attributes", fa.graph_pool_attributes
        )?;
        writeln!(f, "  {:<24} {}", "virtual_memory", fa.virtual_memory)?;
        writeln!(
            f,
            "  {:<24} {}",
            "unified_memory",
            if fa.unified_memory { "yes" } else { "no" }
        )?;
        let rel = match fa.graph_release {
            GraphRelease::Immediate => "immediate",
            GraphRelease::AtNextSync => "at next synchronize",
        };
        writeln!(f, "  {:<24} {rel}", "graph_release")?;
        writeln!(f, "  {:<24} {}", "synchronize", fa.synchronize)?;
        if let Some(h) = fa.hidden_bytes_per_capture {
            writeln!(f, "  {:<24} {}", "hidden_per_capture", fmt_bytes(h))?;
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undeclared_reading_is_unavailable() {
        let mut c = ProfilingCapability::exact_discrete();
        c.readings.remove(&Reading::GraphPool);
        assert_eq!(c.reading(Reading::GraphPool).label(), "unavailable");
    }

    #[test]
    fn serialises_readably() {
        let mut c = ProfilingCapability::exact_discrete();
        c.set(
            Reading::DriverFree,
            Reliability::process_local(0, "ROCm <= 5.4"),
        );
        let j = serde_json::to_value(&c).unwrap();
        assert_eq!(j["readings"]["driver_free"]["kind"], "process_local");
        assert_eq!(j["facts"]["graph_capture"]["kind"], "supported");
        let back: ProfilingCapability = serde_json::from_value(j).unwrap();
        assert_eq!(back, c);
        assert!(c.to_string().contains("process-local (ROCm <= 5.4)"));
    }

    #[test]
    fn ranks_order_downgrades() {
        let a = Reliability::Exact;
        let b = Reliability::Approximate {
            tolerance_bytes: 1,
            why: "x".into(),
        };
        let c = Reliability::Unavailable { reason: "y".into() };
        assert!(a.rank() > b.rank() && b.rank() > c.rank());
        assert!(!c.measures_own_usage());
        assert!(!Reliability::process_local(0, "").sees_whole_device());
    }

    #[test]
    fn process_local_states_a_tolerance() {
        let r = Reliability::process_local(64 << 20, "counted in 64 MiB steps");
        assert_eq!(r.tolerance_bytes(), 64 << 20);
        assert!(!r.sees_whole_device() && r.measures_own_usage());
        assert_eq!(r.label(), "process-local");
        assert_eq!(
            r.to_string(),
            "process-local (±64.00 MiB: counted in 64 MiB steps)"
        );
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["kind"], "process_local");
        assert_eq!(j["tolerance_bytes"], 64 << 20);
        assert_eq!(serde_json::from_value::<Reliability>(j).unwrap(), r);
        // JSON written before the tolerance existed reads as exact for this process.
        let old: Reliability =
            serde_json::from_str(r#"{"kind":"process_local","why":"ROCm <= 5.4"}"#).unwrap();
        assert_eq!(old, Reliability::process_local(0, "ROCm <= 5.4"));
        assert_eq!(old.to_string(), "process-local (ROCm <= 5.4)");
    }
}
