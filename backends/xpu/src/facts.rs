//! The facts an Intel declaration is made from ([`Facts`]: integrated or not, what Sysman gave
//! for free memory and for this process's own memory (`zesDeviceProcessesGetState`), or why it
//! gave nothing, virtual-memory support), all that needs no loader. Pure data, compiled without the `runtime` feature, so the
//! simulator declares its Intel profiles through [`crate::capability::declare`] on a machine
//! without Level Zero; `conv` (with `runtime`) re-exports it and turns Sysman's module
//! readings into it.

use memplan_core::Support;

/// Free device memory as Sysman gives it, or why it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SysmanFree {
    /// Sum over the device-local modules.
    Readable {
        /// Free bytes.
        free: u64,
        /// Allocatable bytes.
        size: u64,
        /// Number of device-local modules summed.
        modules: usize,
    },
    /// No free-memory reading; never reported as 0.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl SysmanFree {
    /// Unavailable, with a reason.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        SysmanFree::Unavailable {
            reason: reason.into(),
        }
    }

    /// `free == size`: the reading non-root users get from i915 on some kernels, where the
    /// kernel hides usage. Suspect, not proof (an idle device can be this empty).
    pub fn free_equals_total(&self) -> bool {
        matches!(self, SysmanFree::Readable { free, size, .. } if free == size)
    }
}

/// This process's device memory as Sysman's per-process query gives it
/// (`zesDeviceProcessesGetState`: one `zes_process_state_t` per host process using the device,
/// `memSize` the device memory it allocated). Where it is permitted (the caller's own processes
/// for an ordinary user, every process for root), it measures this process even where the free
/// reading cannot: `free = total - memSize` is a process-local free reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SysmanProcesses {
    /// The query answered and listed this process.
    Readable {
        /// `memSize` of this process.
        own: u64,
        /// Other processes it listed (0: none listed, which an ordinary user always gets).
        others: usize,
    },
    /// No per-process reading (Sysman unreachable, the call refused or failed, or this
    /// process not listed); never reported as 0.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl SysmanProcesses {
    /// Unavailable, with a reason.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        SysmanProcesses::Unavailable {
            reason: reason.into(),
        }
    }

    /// Whether this process's memory was read.
    pub fn is_readable(&self) -> bool {
        matches!(self, SysmanProcesses::Readable { .. })
    }
}

/// Where the declared total comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TotalSource {
    /// Sysman's `zes_mem_state_t.size` (same source as free, so `total - free` is consistent).
    Sysman,
    /// `zeDeviceGetMemoryProperties` `totalSize` (Sysman unavailable).
    CoreProperties,
}

/// The facts a declaration is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// `ZE_DEVICE_PROPERTY_FLAG_INTEGRATED`.
    pub integrated: bool,
    /// The Sysman reading taken at open (or why there is none).
    pub sysman: SysmanFree,
    /// Virtual-memory support as probed with `zeVirtualMemQueryPageSize`.
    pub virtual_memory: Support,
    /// Sysman's per-process reading taken at open (or why there is none).
    pub processes: SysmanProcesses,
}

impl Facts {
    /// Where the total comes from, given the Sysman reading.
    pub fn total_source(&self) -> TotalSource {
        match self.sysman {
            SysmanFree::Readable { .. } => TotalSource::Sysman,
            SysmanFree::Unavailable { .. } => TotalSource::CoreProperties,
        }
    }
}
