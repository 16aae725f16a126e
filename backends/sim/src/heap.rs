//! The block bookkeeping of the simulated caching allocator (PyTorch-like), without the driver.
//!
//! Rules ([`AllocatorRules`], drawn with the device's physics; PyTorch's constants in the
//! world): requests are rounded up to 512 B; requests of at most 1 MiB are served from 2 MiB
//! "small" segments, requests below 10 MiB from 20 MiB segments (`kLargeBuffer`, off in the
//! nominal rules), larger ones from "large" segments rounded up to the drawn granule (2 MiB,
//! `kRoundLarge`, in the world; coarser or finer in the adversarial regime); a free block is reused best-fit within its pool
//! and kind, split when the remainder is at least 512 B (small) or more than 1 MiB (large);
//! freed blocks merge with free neighbours; segments stay reserved (cached) until released
//! while wholly free. The default pool and the graph private pool never share segments.
//!
//! The engine's `PYTORCH_ALLOC_CONF` options, where drawn ([`AllocatorRules`]): requests are
//! first rounded to power-of-two divisions; `max_split_size_mb` keeps blocks that large from
//! being split or serving smaller requests; with expandable segments each pool has one segment
//! per size class that grows by whole pages at its end, and giving the cache back unmaps the
//! whole free pages at its end (the simulator keeps pages inside free blocks before the last
//! used block mapped, where PyTorch unmaps those too: it holds at least as much).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::physics::AllocatorRules;

/// Rounding of every request (`kMinBlockSize`, the same in every rule set).
pub const ROUND: u64 = 512;

/// An allocation made by [`crate::SimAllocator::malloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BlockId(pub u64);

/// Which pool a segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pool {
    /// Ordinary allocations.
    Default,
    /// The graph-capture private pool (shared by every captured graph).
    Private,
}

#[derive(Debug, Clone)]
struct Segment {
    pool: Pool,
    small: bool,
    /// Grown by pages at its end ([`AllocatorRules::expandable`]).
    expandable: bool,
    /// Blocks in address order: (size, owner).
    blocks: Vec<(u64, Option<BlockId>)>,
}

impl Segment {
    fn size(&self) -> u64 {
        self.blocks.iter().map(|b| b.0).sum()
    }
    fn is_free(&self) -> bool {
        self.blocks.iter().all(|b| b.1.is_none())
    }
}

/// Round a request the way the allocator does.
pub fn round_request(bytes: u64) -> u64 {
    // Saturating: an absurd request must become an out-of-memory error, not an overflow.
    bytes.max(1).div_ceil(ROUND).saturating_mul(ROUND)
}

/// Segments and blocks of every pool.
#[derive(Debug, Clone)]
pub(crate) struct Heap {
    /// The block rules.
    pub rules: AllocatorRules,
    segments: BTreeMap<u64, Segment>,
    next_segment: u64,
    next_block: u64,
    peak: u64,
    peak_reserved: u64,
    /// Bytes of every segment, kept as segments come and go: the device's readings ask for it
    /// on every read, and summing hundreds of segments each time is most of a sweep's time.
    reserved_all: u64,
    /// Bytes of every live block, kept as blocks are taken and freed (see `reserved_all`).
    allocated_all: u64,
}

impl Default for Heap {
    fn default() -> Self {
        Heap::with_rules(AllocatorRules::PLAIN)
    }
}

impl Heap {
    /// An empty heap with `rules`.
    pub fn with_rules(rules: AllocatorRules) -> Self {
        Heap {
            rules,
            segments: BTreeMap::new(),
            next_segment: 0,
            next_block: 0,
            peak: 0,
            peak_reserved: 0,
            reserved_all: 0,
            allocated_all: 0,
        }
    }

    /// The segment size a rounded request needs when no cached block fits.
    pub fn segment_size(&self, rounded: u64) -> u64 {
        self.rules.segment_size(rounded)
    }

    /// Place a rounded request in a cached block of `pool`, if one fits.
    pub fn place_cached(&mut self, pool: Pool, rounded: u64) -> Option<BlockId> {
        let small = self.rules.is_small(rounded);
        let (sid, idx, _) = self
            .segments
            .iter()
            .filter(|(_, s)| s.pool == pool && s.small == small)
            .flat_map(|(sid, s)| s.blocks.iter().enumerate().map(move |(i, b)| (*sid, i, *b)))
            .filter(|(_, _, (size, owner))| owner.is_none() && *size >= rounded)
            .min_by_key(|(sid, i, (size, _))| (*size, *sid, *i))
            .map(|(sid, i, (size, _))| (sid, i, size))?;
        // The best fit only: an oversize one refuses the request (`get_free_block`).
        let size = self.segments[&sid].blocks[idx].0;
        if !self.rules.may_serve(size, rounded) {
            return None;
        }
        Some(self.take(sid, idx, rounded))
    }

    /// The bytes the allocator takes from the driver for a rounded request no cached block
    /// serves: a new segment ([`Self::segment_size`]), or with expandable segments the pages
    /// its segment must grow by for the request to fit after its last used block.
    pub fn growth(&self, pool: Pool, rounded: u64) -> u64 {
        if !self.rules.expandable {
            return self.segment_size(rounded);
        }
        let small = self.rules.is_small(rounded);
        let page = self.rules.page(small);
        let tail = self.expandable_of(pool, small).map_or(0, |sid| {
            match self.segments[&sid].blocks.last() {
                Some((size, None)) => *size,
                _ => 0,
            }
        });
        let short = rounded.saturating_sub(tail);
        short.div_ceil(page).saturating_mul(page)
    }

    /// Place a rounded request after taking `bytes` from the driver ([`Self::growth`]).
    pub fn place_grown(&mut self, pool: Pool, rounded: u64, bytes: u64) -> BlockId {
        if !self.rules.expandable {
            return self.place_new(pool, rounded, bytes);
        }
        let small = self.rules.is_small(rounded);
        let sid = match self.expandable_of(pool, small) {
            Some(sid) => sid,
            None => {
                let sid = self.next_segment;
                self.next_segment += 1;
                self.segments.insert(
                    sid,
                    Segment {
                        pool,
                        small,
                        expandable: true,
                        blocks: Vec::new(),
                    },
                );
                sid
            }
        };
        let seg = self.segments.get_mut(&sid).expect("just found or made");
        match seg.blocks.last_mut() {
            Some((size, None)) => *size += bytes,
            _ => seg.blocks.push((bytes, None)),
        }
        let last = seg.blocks.len() - 1;
        self.reserved_all += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved_all);
        self.take(sid, last, rounded)
    }

    /// The expandable segment of `pool` for requests of this size class.
    fn expandable_of(&self, pool: Pool, small: bool) -> Option<u64> {
        self.segments
            .iter()
            .find(|(_, s)| s.expandable && s.pool == pool && s.small == small)
            .map(|(k, _)| *k)
    }

    /// Add a segment of `seg_bytes` to `pool` and place the request at its start.
    pub fn place_new(&mut self, pool: Pool, rounded: u64, seg_bytes: u64) -> BlockId {
        let sid = self.next_segment;
        self.next_segment += 1;
        let small = self.rules.is_small(rounded);
        self.segments.insert(
            sid,
            Segment {
                pool,
                small,
                expandable: false,
                blocks: vec![(seg_bytes, None)],
            },
        );
        self.reserved_all += seg_bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved_all);
        self.take(sid, 0, rounded)
    }

    fn take(&mut self, sid: u64, idx: usize, rounded: u64) -> BlockId {
        let id = BlockId(self.next_block);
        self.next_block += 1;
        if let Some(seg) = self.segments.get_mut(&sid) {
            let size = seg.blocks[idx].0;
            let rest = size - rounded;
            let split = self.rules.splits(seg.small, rounded, rest);
            if split {
                seg.blocks[idx] = (rounded, Some(id));
                seg.blocks.insert(idx + 1, (rest, None));
                self.allocated_all += rounded;
            } else {
                seg.blocks[idx].1 = Some(id);
                self.allocated_all += size;
            }
        }
        self.peak = self.peak.max(self.allocated_all);
        id
    }

    /// Free a block; returns its pool, or `None` when no live block has that id.
    pub fn free(&mut self, id: BlockId) -> Option<Pool> {
        for seg in self.segments.values_mut() {
            if let Some(i) = seg.blocks.iter().position(|b| b.1 == Some(id)) {
                seg.blocks[i].1 = None;
                self.allocated_all -= seg.blocks[i].0;
                if i + 1 < seg.blocks.len() && seg.blocks[i + 1].1.is_none() {
                    seg.blocks[i].0 += seg.blocks.remove(i + 1).0;
                }
                if i > 0 && seg.blocks[i - 1].1.is_none() {
                    seg.blocks[i - 1].0 += seg.blocks.remove(i).0;
                }
                return Some(seg.pool);
            }
        }
        None
    }

    /// The first retry of a failed allocation, PyTorch's `release_available_cached_blocks`
    /// (c10/cuda/CUDACachingAllocator.cpp at commit 001074d2): under `max_split_size_mb`, give
    /// back free blocks of the request's own pool and size class that are that large (never
    /// split: each is a whole segment), the smallest one of at least `max(rounded,
    /// max_split)`, or else the largest ones first until that much is given back. Returns
    /// whether that much was (what it gave back stays given back either way). Expandable
    /// segments are not released this way (`release_block` takes no expandable block).
    pub fn release_oversize(&mut self, pool: Pool, rounded: u64) -> bool {
        let Some(max_split) = self.rules.max_split else {
            return false;
        };
        let small = self.rules.is_small(rounded);
        let key = rounded.max(max_split);
        let mut free: Vec<(u64, u64)> = self
            .segments
            .iter()
            .filter(|(_, s)| s.pool == pool && s.small == small && !s.expandable && s.is_free())
            .map(|(k, s)| (s.size(), *k))
            .filter(|(size, _)| *size >= max_split)
            .collect();
        free.sort_unstable();
        let pick: Vec<(u64, u64)> = match free.iter().find(|(size, _)| *size >= key) {
            Some(one) => vec![*one],
            None => {
                let mut taken = Vec::new();
                let mut sum = 0u64;
                for f in free.iter().rev() {
                    if sum >= key {
                        break;
                    }
                    sum = sum.saturating_add(f.0);
                    taken.push(*f);
                }
                taken
            }
        };
        let mut released = 0u64;
        for (size, sid) in pick {
            self.segments.remove(&sid);
            released += size;
        }
        self.reserved_all -= released;
        released >= key
    }

    /// Release every wholly free segment of `pool`; returns the bytes given back.
    pub fn release_free(&mut self, pool: Pool) -> u64 {
        let ids: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.pool == pool && s.is_free())
            .map(|(k, _)| *k)
            .collect();
        let mut released: u64 = ids
            .iter()
            .filter_map(|k| self.segments.remove(k))
            .map(|s| s.size())
            .sum();
        // An expandable segment in use unmaps the whole free pages at its end.
        let rules = self.rules;
        for seg in self.segments.values_mut() {
            if !(seg.expandable && seg.pool == pool) {
                continue;
            }
            let page = rules.page(seg.small);
            let size = seg.size();
            let Some((tail, None)) = seg.blocks.last().copied() else {
                continue;
            };
            let used = size - tail;
            let keep = used.div_ceil(page).saturating_mul(page);
            let unmapped = size.saturating_sub(keep).min(tail);
            if unmapped == 0 {
                continue;
            }
            if unmapped == tail {
                seg.blocks.pop();
            } else if let Some(last) = seg.blocks.last_mut() {
                last.0 -= unmapped;
            }
            released += unmapped;
        }
        self.reserved_all -= released;
        released
    }

    /// Bytes of segments (of one pool, or all with `None`).
    pub fn reserved(&self, pool: Option<Pool>) -> u64 {
        if pool.is_none() {
            return self.reserved_all;
        }
        self.segments
            .values()
            .filter(|s| pool.is_none_or(|p| s.pool == p))
            .map(Segment::size)
            .sum()
    }

    /// Bytes of live blocks (of one pool, or all with `None`).
    pub fn allocated(&self, pool: Option<Pool>) -> u64 {
        if pool.is_none() {
            return self.allocated_all;
        }
        self.segments
            .values()
            .filter(|s| pool.is_none_or(|p| s.pool == p))
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.1.is_some())
            .map(|b| b.0)
            .sum()
    }

    /// Peak of allocated bytes since the last reset.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Peak of reserved bytes (segments held, every pool) since the last reset.
    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// Reset both peaks to the current allocated and reserved bytes.
    pub fn reset_peak(&mut self) {
        self.peak = self.allocated_all;
        self.peak_reserved = self.reserved_all;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::MIB;

    #[test]
    fn rounding_rules() {
        let h = Heap::default();
        assert_eq!(round_request(1), 512);
        assert_eq!(round_request(0), 512);
        assert_eq!(round_request(513), 1024);
        assert_eq!(h.segment_size(512), 2 * MIB);
        assert_eq!(h.segment_size(MIB), 2 * MIB);
        assert_eq!(h.segment_size(MIB + 512), 2 * MIB);
        assert_eq!(h.segment_size(5 * MIB), 6 * MIB);
        assert_eq!(
            round_request(u64::MAX),
            u64::MAX,
            "saturates instead of overflowing"
        );
        assert!(h.segment_size(u64::MAX) >= u64::MAX - 2 * MIB);
        let pt = Heap::with_rules(AllocatorRules::PYTORCH);
        assert_eq!(pt.segment_size(5 * MIB), 20 * MIB, "kLargeBuffer");
    }

    #[test]
    fn small_blocks_share_a_segment_and_merge() {
        let mut h = Heap::default();
        let a = h.place_new(Pool::Default, 1024, 2 * MIB);
        let b = h
            .place_cached(Pool::Default, 4096)
            .expect("fits in the small segment");
        assert_eq!(h.reserved(None), 2 * MIB);
        assert_eq!(h.allocated(None), 5120);
        assert_eq!(h.free(a), Some(Pool::Default));
        assert_eq!(h.free(b), Some(Pool::Default));
        assert_eq!(h.free(b), None, "double free is detected");
        assert_eq!(h.allocated(None), 0);
        assert_eq!(h.peak(), 5120);
        assert_eq!(h.release_free(Pool::Default), 2 * MIB);
        assert_eq!(h.reserved(None), 0);
    }

    #[test]
    fn large_blocks_split_only_above_one_mib() {
        let mut h = Heap::default();
        let a = h.place_new(Pool::Default, 8 * MIB, 8 * MIB);
        h.free(a);
        // 8 MiB - 7.5 MiB leaves 0.5 MiB: not split, the whole block is used.
        let b = h.place_cached(Pool::Default, 7 * MIB + MIB / 2).unwrap();
        assert_eq!(h.allocated(None), 8 * MIB);
        h.free(b);
        let _c = h.place_cached(Pool::Default, 4 * MIB).unwrap();
        assert_eq!(h.allocated(None), 4 * MIB);
        assert!(
            h.place_cached(Pool::Default, 3 * MIB).is_some(),
            "the 4 MiB remainder is reusable"
        );
        assert!(
            h.place_cached(Pool::Private, 512).is_none(),
            "pools never share segments"
        );
    }

    #[test]
    fn the_kept_totals_are_the_sums_of_the_segments_and_blocks() {
        let mut h = Heap::with_rules(AllocatorRules::PYTORCH);
        let sum = |h: &Heap| {
            let segs: u64 = h.segments.values().map(Segment::size).sum();
            let live: u64 = h
                .segments
                .values()
                .flat_map(|s| s.blocks.iter())
                .filter(|b| b.1.is_some())
                .map(|b| b.0)
                .sum();
            (segs, live)
        };
        let mut live = Vec::new();
        for (i, bytes) in [300 * 1024, 3 << 20, 12 << 20, 700, 40 << 20, 5 << 20]
            .into_iter()
            .cycle()
            .take(60)
            .enumerate()
        {
            let pool = if i % 7 == 3 {
                Pool::Private
            } else {
                Pool::Default
            };
            let r = round_request(bytes);
            let id = h.place_cached(pool, r).unwrap_or_else(|| {
                let seg = h.segment_size(r);
                h.place_new(pool, r, seg)
            });
            live.push(id);
            if i % 3 == 2 {
                h.free(live.remove(i % live.len()));
            }
            if i % 11 == 10 {
                h.release_free(Pool::Default);
            }
            assert_eq!((h.reserved(None), h.allocated(None)), sum(&h), "after {i}");
        }
        for id in live {
            h.free(id);
        }
        h.release_free(Pool::Default);
        h.release_free(Pool::Private);
        assert_eq!((h.reserved(None), h.allocated(None)), (0, 0));
    }

    fn place(h: &mut Heap, bytes: u64) -> BlockId {
        let r = h.rules.round_request(bytes);
        h.place_cached(Pool::Default, r).unwrap_or_else(|| {
            let g = h.growth(Pool::Default, r);
            h.place_grown(Pool::Default, r, g)
        })
    }

    #[test]
    fn expandable_segments_grow_by_pages_and_unmap_their_free_end() {
        let mut h = Heap::with_rules(AllocatorRules {
            expandable: true,
            ..AllocatorRules::PYTORCH
        });
        // 64 tensors of 7 MiB: one after another, 448 MiB in 23 pages of 20 MiB.
        let ids: Vec<BlockId> = (0..64).map(|_| place(&mut h, 7 * MIB)).collect();
        assert_eq!(h.reserved(None), 460 * MIB);
        assert_eq!(h.allocated(None), 448 * MIB);
        // Small requests: their own segment, in 2 MiB pages.
        let small: Vec<BlockId> = (0..10).map(|_| place(&mut h, 300 * 1024)).collect();
        assert_eq!(h.reserved(None), 464 * MIB);
        // Freeing the last 32 tensors and giving the cache back unmaps the pages past the
        // 32 still used (224 MiB in 12 pages).
        for id in &ids[32..] {
            h.free(*id);
        }
        for id in small {
            h.free(id);
        }
        h.release_free(Pool::Default);
        assert_eq!(h.reserved(None), 240 * MIB);
        for id in &ids[..32] {
            h.free(*id);
        }
        h.release_free(Pool::Default);
        assert_eq!(h.reserved(None), 0);
    }

    #[test]
    fn max_split_size_keeps_large_remainders_from_smaller_requests() {
        let mut h = Heap::with_rules(AllocatorRules {
            max_split: Some(30 * MIB),
            large_buffer: 64 * MIB,
            large_segment_mb: Some(64),
            ..AllocatorRules::PYTORCH
        });
        // 5 MiB requests in 64 MiB segments: the 59 MiB remainder is past the limit.
        for _ in 0..3 {
            place(&mut h, 5 * MIB);
        }
        assert_eq!(h.reserved(None), 3 * 64 * MIB);
        // A request past the limit is not split: it holds its whole segment.
        let mut h = Heap::with_rules(AllocatorRules {
            max_split: Some(30 * MIB),
            ..AllocatorRules::PYTORCH
        });
        place(&mut h, 41 * MIB);
        assert_eq!(h.allocated(None), 42 * MIB);
    }

    /// PyTorch's `release_available_cached_blocks`: the smallest free oversize block that
    /// covers `max(request, max_split_size)`, else the largest ones until that much.
    #[test]
    fn a_failed_allocation_first_gives_back_just_enough_oversize_blocks() {
        let mut h = Heap::with_rules(AllocatorRules {
            max_split: Some(30 * MIB),
            ..AllocatorRules::PYTORCH
        });
        let blocks: Vec<BlockId> = [40, 40, 100, 20]
            .iter()
            .map(|m| place(&mut h, m * MIB))
            .collect();
        for b in blocks {
            h.free(b);
        }
        assert_eq!(h.reserved(None), 200 * MIB);
        assert!(
            h.release_oversize(Pool::Default, 10 * MIB),
            "one 40 MiB block"
        );
        assert_eq!(h.reserved(None), 160 * MIB);
        assert!(
            !h.release_oversize(Pool::Default, 200 * MIB),
            "100 and 40 MiB are not enough"
        );
        assert_eq!(
            h.reserved(None),
            20 * MIB,
            "the 20 MiB block is not oversize"
        );
        assert!(!h.release_oversize(Pool::Private, 10 * MIB));
    }

    #[test]
    fn power_of_two_divisions_round_each_request_first() {
        let r = AllocatorRules {
            divisions: [4; 16],
            ..AllocatorRules::PYTORCH
        };
        // PyTorch's example: 1200 in four divisions is 1280, but only past 4 x 512 bytes.
        assert_eq!(r.round_request(1200), 1536);
        assert_eq!(r.round_request(2049), 2560);
        assert_eq!(r.round_request(4096), 4096);
        assert_eq!(r.round_request(365 * 8 * 1024), 3 * MIB);
        assert_eq!(
            AllocatorRules::PYTORCH.round_request(365 * 8 * 1024),
            365 * 8 * 1024
        );
        assert!(r
            .option_string()
            .unwrap()
            .starts_with("roundup_power2_divisions:[1:4,2:4,"));
        assert_eq!(AllocatorRules::PYTORCH.option_string(), None);
    }
}
