//! [`AllocatorRules`]: the block rules of the simulated caching allocator, PyTorch's constants
//! in the world, another large-allocation granule on adversarial seeds.

use memplan_core::bytes::MIB;
use serde::{Deserialize, Serialize};

/// The caching allocator's block rules (PyTorch's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorRules {
    /// Every request is rounded up to this (`kMinBlockSize`).
    pub min_block: u64,
    /// Largest request served from small segments (`kSmallSize`).
    pub small_size: u64,
    /// Size of a small segment (`kSmallBuffer`).
    pub small_buffer: u64,
    /// Requests below this (and above `small_size`) get a whole `large_buffer` segment
    /// (`kMinLargeAlloc`); 0 turns the rule off.
    pub min_large_alloc: u64,
    /// Segment for mid-sized requests (`kLargeBuffer`).
    pub large_buffer: u64,
    /// Larger requests get a segment rounded up to this (`kRoundLarge`).
    pub round_large: u64,
}

impl AllocatorRules {
    /// PyTorch's device caching allocator (c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize
    /// 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kMinLargeAlloc 10 MiB, kLargeBuffer 20 MiB,
    /// kRoundLarge 2 MiB; c10/xpu/XPUCachingAllocator.cpp has the same constants).
    pub const PYTORCH: AllocatorRules = AllocatorRules {
        min_block: 512,
        small_size: MIB,
        small_buffer: 2 * MIB,
        min_large_alloc: 10 * MIB,
        large_buffer: 20 * MIB,
        round_large: 2 * MIB,
    };

    /// The rules the simulator's own unit tests compare to the byte: PyTorch's rounding
    /// without the 20 MiB buffers for mid-sized requests.
    pub const PLAIN: AllocatorRules = AllocatorRules {
        min_large_alloc: 0,
        ..AllocatorRules::PYTORCH
    };

    /// A request rounded the way the allocator rounds it. Saturating: an absurd request must
    /// become an out-of-memory error, not an overflow.
    pub fn round_request(&self, bytes: u64) -> u64 {
        bytes
            .max(1)
            .div_ceil(self.min_block)
            .saturating_mul(self.min_block)
    }

    /// Whether a rounded request is served from small segments.
    pub fn is_small(&self, rounded: u64) -> bool {
        rounded <= self.small_size
    }

    /// The segment a rounded request needs when no cached block fits.
    pub fn segment_size(&self, rounded: u64) -> u64 {
        if self.is_small(rounded) {
            self.small_buffer
        } else if rounded < self.min_large_alloc {
            self.large_buffer
                .max(rounded.div_ceil(self.round_large) * self.round_large)
        } else {
            rounded
                .div_ceil(self.round_large)
                .saturating_mul(self.round_large)
        }
    }
}
