//! The allocator layer: a view of the engine's caching allocator.
//!
//! Engines hand memplan an [`AllocatorView`] (PyTorch's `memory_stats`, a Rust engine's own
//! pool); memplan's own calibration uses [`OwnAccounting`], which counts the raw allocations
//! memplan made itself.

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// Allocator statistics at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AllocatorStats {
    /// Bytes held from the driver (cached or in use).
    pub reserved: u64,
    /// Bytes in use.
    pub allocated: u64,
    /// Peak of `allocated` since the last `reset_peak`.
    pub peak_allocated: u64,
    /// Peak of `reserved` since the last `reset_peak` (PyTorch: `reserved_bytes.all.peak`);
    /// `None` when the allocator does not report it. The segments an activation peak made the
    /// allocator hold, rounding and fragmentation included, are what the process really needs;
    /// without this figure the planner counts the allocated peak plus a documented rounding
    /// bound.
    pub peak_reserved: Option<u64>,
}

impl AllocatorStats {
    /// Statistics: bytes `reserved` from the driver, `allocated` (in use), and the peak of
    /// `allocated` since the last reset.
    pub const fn new(reserved: u64, allocated: u64, peak_allocated: u64) -> Self {
        Self {
            reserved,
            allocated,
            peak_allocated,
            peak_reserved: None,
        }
    }

    /// With the peak of `reserved` since the last reset (`None`: not reported).
    pub const fn with_peak_reserved(mut self, peak_reserved: Option<u64>) -> Self {
        self.peak_reserved = peak_reserved;
        self
    }
}

/// What memplan needs from an engine's caching allocator.
pub trait AllocatorView {
    /// Current statistics. Cheap; called at every snapshot.
    fn stats(&self) -> AllocatorStats;
    /// Return every cached (reserved but unallocated) segment to the driver
    /// (`torch.cuda.empty_cache()`).
    fn release_cached(&mut self) -> Result<()>;
    /// Reset the peaks of `allocated` and `reserved` to their current values.
    fn reset_peak(&mut self);

    /// Which physical GPU the allocator allocates on, in the device's terms
    /// ([`Device::gpu_id`](crate::Device::gpu_id)), when it knows. A measurement session
    /// refuses to start when both are known and differ: the allocator's memory would not show
    /// on the device it reads, and every figure would be wrong. Default: unknown (`None`).
    fn gpu_id(&self) -> Option<String> {
        None
    }
}

/// Accounting of memplan's own raw allocations (no caching: reserved == allocated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnAccounting {
    allocated: u64,
    peak: u64,
}

impl OwnAccounting {
    /// Record an allocation.
    pub fn add(&mut self, bytes: u64) {
        self.allocated = self.allocated.saturating_add(bytes);
        self.peak = self.peak.max(self.allocated);
    }
    /// Record a free.
    pub fn remove(&mut self, bytes: u64) {
        self.allocated = self.allocated.saturating_sub(bytes);
    }
}

impl AllocatorView for OwnAccounting {
    fn stats(&self) -> AllocatorStats {
        AllocatorStats::new(self.allocated, self.allocated, self.peak)
            .with_peak_reserved(Some(self.peak))
    }
    fn release_cached(&mut self) -> Result<()> {
        Ok(())
    }
    fn reset_peak(&mut self) {
        self.peak = self.allocated;
    }
}
