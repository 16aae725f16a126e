//! The allocator layer: a view of the engine's caching allocator.
//!
//! Engines hand memplan an [`AllocatorView`] (PyTorch's `memory_stats`, a Rust engine's own
//! pool); memplan's own calibration uses [`OwnAccounting`], which counts the raw allocations
//! memplan made itself.
//!
//! An allocator may also offer one allocation of a given size
//! ([`AllocatorView::allocate_tensor`]): how it rounds a request is its own rule (PyTorch's
//! 2 MiB and 20 MiB segments, another allocator's pages), and the one way to know how it will
//! round the engine's KV tensors is to ask it for tensors of their size and read what it
//! reserved.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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

/// One tensor allocated through [`AllocatorView::allocate_tensor`], to give back with
/// [`AllocatorView::free_tensor`]. The number is the allocator's own (an index, an address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorId(pub u64);

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

    /// Optional: allocate one tensor of `bytes` the way the engine allocates its own tensors
    /// (PyTorch: `torch.empty(bytes, dtype=torch.uint8, device=...)`), outside any graph
    /// capture, kept until [`free_tensor`](AllocatorView::free_tensor). memplan allocates its
    /// planned KV layout this way, reads what the allocator reserved for it and frees it at
    /// once, where the engine does not allocate its KV cache inside the session. `Ok(None)`
    /// (the default): not offered. A request the device cannot hold is an out-of-memory
    /// error, and must leave nothing allocated.
    fn allocate_tensor(&mut self, _bytes: u64) -> Result<Option<TensorId>> {
        Ok(None)
    }

    /// Free a tensor [`allocate_tensor`](AllocatorView::allocate_tensor) returned (its memory
    /// may stay cached in the allocator until
    /// [`release_cached`](AllocatorView::release_cached)).
    fn free_tensor(&mut self, id: TensorId) -> Result<()> {
        Err(Error::invalid(
            "allocator tensor",
            format!(
                "tensor {} was not allocated by this allocator (it offers no tensor allocation)",
                id.0
            ),
        ))
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
