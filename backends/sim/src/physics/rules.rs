//! [`AllocatorRules`]: the block rules of the simulated caching allocator, PyTorch's constants
//! in the world, another large-allocation granule on adversarial seeds, and on a share of
//! seeds the options an engine sets in `PYTORCH_ALLOC_CONF` (drawn in `physics/mod.rs`).
//!
//! The options' rules are read here from PyTorch's source, on their own (the simulator shares
//! no code or constant with the planner): `c10/cuda/CUDACachingAllocator.cpp` at commit
//! 001074d25084fdb87a799823e395a50f5ec044d3 (`round_size` and `roundup_power2_next_division`
//! for the divisions, `get_free_block` and `should_split` for `max_split_size_mb`,
//! `find_expandable_block`, `map_block` and `try_allocate_expandable_block` for expandable
//! segments) and `c10/core/AllocatorConfig.cpp` (`roundup_power2_divisions(size)`: sixteen
//! size intervals from 1 MiB, one per power of two).

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
    /// `expandable_segments:True`: one segment per pool and size class, grown by mapping
    /// pages (the small segment's size for small requests, `EXPANDABLE_LARGE_PAGE` (20 MiB) for the
    /// others), every request split off it (remainders of 512 B and more).
    #[serde(default)]
    pub expandable: bool,
    /// `max_split_size_mb`, in bytes: no block this large is split, and none serves a smaller
    /// request (`None`: unlimited).
    #[serde(default)]
    pub max_split: Option<u64>,
    /// `roundup_power2_divisions` per size interval (below 2 MiB, then one per power of two up
    /// to 32 GiB and beyond): a request is rounded up to the next of that many equal cuts of
    /// its power-of-two interval (0 or 1: not).
    #[serde(default)]
    pub divisions: [u32; 16],
    /// `large_segment_size_mb` as the engine set it (it sets `large_buffer`).
    #[serde(default)]
    pub large_segment_mb: Option<u64>,
}

/// The options an engine sets in `PYTORCH_ALLOC_CONF` (`PYTORCH_CUDA_ALLOC_CONF`) that the
/// simulated caching allocator follows, as a scenario pins them instead of the ones a seed
/// draws ([`AllocatorRules::with_options`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineOptions {
    /// `expandable_segments:True`.
    pub expandable: bool,
    /// `max_split_size_mb`, in bytes.
    pub max_split: Option<u64>,
    /// `roundup_power2_divisions`, per size interval (see [`AllocatorRules::divisions`]).
    pub divisions: [u32; 16],
    /// `large_segment_size_mb`.
    pub large_segment_mb: Option<u64>,
}

/// The page an expandable segment of large requests maps: `kLargeBuffer`, 20 MiB
/// (`find_expandable_block`), whatever `large_segment_size_mb` says in the release read.
pub const EXPANDABLE_LARGE_PAGE: u64 = 20 * MIB;

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
        expandable: false,
        max_split: None,
        divisions: [0; 16],
        large_segment_mb: None,
    };

    /// The rules the simulator's own unit tests compare to the byte: PyTorch's rounding
    /// without the 20 MiB buffers for mid-sized requests.
    pub const PLAIN: AllocatorRules = AllocatorRules {
        min_large_alloc: 0,
        ..AllocatorRules::PYTORCH
    };

    /// These rules with the engine's options replaced by `options`: the device's own rules (its
    /// large-allocation granule) stay, every option the seed drew goes. The mid-sized segment is
    /// `large_segment_size_mb` where set (never below the granule, as the drawn options set
    /// it), else PyTorch's 20 MiB, never below the granule.
    pub fn with_options(self, options: &EngineOptions) -> Self {
        let large_buffer = match options.large_segment_mb {
            Some(mb) => mb.saturating_mul(MIB).max(self.round_large),
            None => Self::PYTORCH.large_buffer.max(self.round_large),
        };
        AllocatorRules {
            expandable: options.expandable,
            max_split: options.max_split,
            divisions: options.divisions,
            large_segment_mb: options.large_segment_mb,
            large_buffer,
            ..self
        }
    }

    /// A request rounded the way the allocator rounds it. Saturating: an absurd request must
    /// become an out-of-memory error, not an overflow.
    pub fn round_request(&self, bytes: u64) -> u64 {
        let bytes = bytes.max(1);
        let cuts = u64::from(self.divisions_of(bytes));
        if cuts >= 2 && bytes > self.min_block.saturating_mul(cuts) {
            return Self::next_cut(bytes, cuts);
        }
        bytes
            .div_ceil(self.min_block)
            .saturating_mul(self.min_block)
    }

    /// The divisions set for a request of `bytes`: the interval below 2 MiB, or the power of
    /// two interval `[2^k, 2^(k+1))` MiB it falls in, the last from 32 GiB on.
    fn divisions_of(&self, bytes: u64) -> u32 {
        let mut interval = 0;
        let mut edge = 2 * MIB;
        while interval < 15 && bytes >= edge {
            interval += 1;
            edge = edge.saturating_mul(2);
        }
        self.divisions[interval]
    }

    /// `bytes` rounded up to the next of `cuts` equal cuts of the power-of-two interval it is
    /// in (a power of two stays; cuts finer than a byte round to the next power of two).
    fn next_cut(bytes: u64, cuts: u64) -> u64 {
        let low = 1u64 << (u64::BITS - 1 - bytes.leading_zeros());
        if low == bytes {
            return bytes;
        }
        let cut = low / cuts;
        if cut == 0 {
            return low.saturating_mul(2);
        }
        bytes.div_ceil(cut).saturating_mul(cut)
    }

    /// Whether a cached free block of `block` bytes may serve a rounded request of `rounded`
    /// bytes (`get_free_block`): under `max_split_size_mb`, an unsplittable block never serves a
    /// smaller request, and serves a larger one only within 20 MiB of its size.
    pub fn may_serve(&self, block: u64, rounded: u64) -> bool {
        match self.max_split {
            None => true,
            Some(m) if rounded < m => block < m,
            Some(_) => block < rounded.saturating_add(20 * MIB),
        }
    }

    /// Whether what is left of a block of a large request is split off for later requests
    /// (`should_split`; small blocks and expandable segments split any remainder of
    /// `min_block` or more).
    pub fn splits(&self, small: bool, rounded: u64, rest: u64) -> bool {
        if small || self.expandable {
            rest >= self.min_block
        } else {
            rest > self.small_size && self.max_split.is_none_or(|m| rounded < m)
        }
    }

    /// The page an expandable segment of this size class maps.
    pub fn page(&self, small: bool) -> u64 {
        if small {
            self.small_buffer
        } else {
            EXPANDABLE_LARGE_PAGE
        }
    }

    /// The options as the engine sets them in `PYTORCH_ALLOC_CONF`, or `None` where it sets
    /// none (PyTorch's default configuration).
    pub fn option_string(&self) -> Option<String> {
        let mut o = Vec::new();
        if self.expandable {
            o.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split {
            o.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if let Some(l) = self.large_segment_mb {
            o.push(format!("large_segment_size_mb:{l}"));
        }
        if self.divisions.iter().any(|d| *d > 0) {
            let cuts: Vec<String> = self
                .divisions
                .iter()
                .enumerate()
                .map(|(i, d)| format!("{}:{d}", 1u64 << i))
                .collect();
            o.push(format!("roundup_power2_divisions:[{}]", cuts.join(",")));
        }
        (!o.is_empty()).then(|| o.join(","))
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
