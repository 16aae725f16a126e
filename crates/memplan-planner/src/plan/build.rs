//! [`PlanBuilder`]: the one way a [`Plan`] is made (see the module docs of [`crate::plan`]).

use memplan_core::bytes::{fmt_bytes, MIB};
use memplan_core::kv::{KvAllocation, KvLimits, KvSizing, KvSpec, LongRequests, SizingRules};
use memplan_core::{
    AllocatorConfig, Error, MemoryInfo, Param, Reading, Refusal, Reliability, Result,
};
use std::collections::BTreeMap;

use super::physical::{self, Physical, PhysicalCheck};
use super::{Consumer, ConsumerKind, Consumers, GraphMethod, GraphPlan, Plan, SCHEMA};
use crate::budget::{self, Request};
use crate::rank::Rank;
use crate::session::Profile;
use crate::strategy::StrategyKind;
use crate::warning::Warning;

/// Upper bound of how far an engine's caching allocator rounds one large request up: PyTorch's
/// device caching allocator rounds requests of 10 MiB and more to `kRoundLarge` = 2 MiB
/// (`c10/<device>/<Device>CachingAllocator.cpp`, `get_allocation_size`; smaller requests are
/// served from 2 or 20 MiB segments that other requests share). Used only where the engine's
/// allocator reports no reserved peak, and as the slack a measured plan keeps for each of the
/// KV cache's per-layer tensors of 10 MiB and more (each is its own request, rounded on its
/// own; smaller ones share segments, `tensors_footprint`).
pub const ALLOCATOR_ROUNDING_BOUND: u64 = 2 * MIB;

// PyTorch's caching allocator serves requests of up to `kSmallSize` (1 MiB) from shared
// `kSmallBuffer` (2 MiB) segments, and requests below `kMinLargeAlloc` (10 MiB) from shared
// `kLargeBuffer` (20 MiB) segments, each request rounded to `kMinBlockSize` (512 B) and split
// off a segment that the next request of the same size shares
// (`c10/<device>/<Device>CachingAllocator.cpp`: `get_allocation_size`, `should_split`). Only larger
// requests are rounded on their own, to `ALLOCATOR_ROUNDING_BOUND`.
/// Largest request served from small segments (`kSmallSize`).
const SMALL_REQUEST: u64 = MIB;
/// A small segment (`kSmallBuffer`).
const SMALL_SEGMENT: u64 = 2 * MIB;
/// Requests below this are served from shared mid-sized segments (`kMinLargeAlloc`).
const MID_REQUEST_BELOW: u64 = 10 * MIB;
/// A mid-sized segment (`kLargeBuffer`).
const MID_SEGMENT: u64 = 20 * MIB;
/// Every request is rounded up to this (`kMinBlockSize`).
const MIN_BLOCK: u64 = 512;

/// How the non-allocator growth measured through the free reading is described.
const NON_ALLOCATOR_BASIS: &str =
    "driver used minus allocator reserved, growth during the engine's steps";

/// How far the non-allocator growth measured through the free reading may read low: the
/// reading's window error (the largest error seen on a window, kept as the graph strategies
/// keep it, [`kept_window_error`](crate::strategy::kept_window_error): about 3.6 standard
/// deviations of one window, within the declared tolerance; the declared tolerance where
/// nothing measured it; 0 for an exact reading) times the square root of the windows the
/// growth sums ([`Profile::non_allocator_windows`]): the windows' errors are independent
/// (quiet windows between them), so their sum's standard deviation is that of one window
/// times the square root of their number, and the margin stays at 3.6 of them.
///
/// Where the graph estimate is `full`'s or `post-capture`'s, its margin already keeps one
/// window's error for the engine's other memory measured through the free reading
/// ([`crate::strategy::keeps_a_window_for_other_memory`]): counting every window here as well
/// counted that one twice, so only what the windows' error exceeds it by is kept here,
/// `window * (sqrt(n) - 1)`.
fn non_allocator_windows_error(p: &Profile) -> u64 {
    let window = crate::strategy::window_error(
        p.capability.reading(Reading::DriverFree).tolerance_bytes(),
        p.free_window_error,
    ) as f64;
    let windows = p.non_allocator_windows as f64;
    let in_graph = p
        .graph
        .as_ref()
        .is_some_and(|g| crate::strategy::keeps_a_window_for_other_memory(g.strategy));
    let error = if in_graph {
        window * (windows.sqrt() - 1.0)
    } else {
        window * windows.sqrt()
    };
    error.max(0.0).ceil() as u64
}

/// How the plan takes the caching allocator to round a large request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Granule {
    /// Up to a multiple of this many bytes: a granule measured or read off the allocator's own
    /// sizes (their common divisor, which every fixed granule that gave them divides), or the
    /// plan's assumption where the session measures the KV cache's allocation itself.
    Multiple(u64),
    /// By less than this many bytes, to a granule that need not divide it: the bound kept where
    /// nothing measures the KV cache's allocation and nothing read the granule off the
    /// allocator's sizes. Rounding up to this would not bound a smaller granule: 3.46 GiB rounds
    /// to 177 granules of 20 MiB but to 182 of 19.5 MiB, 9.6 MB more.
    AtMost(u64),
}

impl Granule {
    /// What a large request of `b` bytes takes at most.
    fn large(self, b: u64) -> u64 {
        match self {
            Granule::Multiple(g) => b.div_ceil(g.max(1)).saturating_mul(g.max(1)),
            Granule::AtMost(g) => b.saturating_add(g),
        }
    }
}

/// [`footprint`] in PyTorch's default configuration.
#[cfg(test)]
fn tensors_footprint(bytes: u64, count: u64, g: Granule) -> u64 {
    footprint(bytes, count, g, &AllocatorConfig::default())
}

/// What `count` equal tensors of `bytes` take from the driver in a PyTorch-like caching
/// allocator whose large requests are rounded as `g` says, configured as `a` says. Each
/// request is first rounded as `a` rounds it ([`rounded_request`]). With expandable segments,
/// they are packed one after another into a segment mapped in pages ([`expandable_footprint`]).
/// Otherwise small and mid-sized tensors share segments (as many as fit in one; the last
/// segment may be part empty), larger ones are rounded on their own, or share a segment that a
/// granule coarser than them leaves room in ([`packed_footprint`]); `max_split_size_mb` stops
/// the sharing of blocks it does not split.
fn footprint(bytes: u64, count: u64, g: Granule, a: &AllocatorConfig) -> u64 {
    let b = rounded_request(bytes, a);
    if b > 0 && a.expandable_segments {
        return expandable_footprint(b, count, a);
    }
    match b {
        0 => 0,
        b if b <= SMALL_REQUEST => shared_segments(b, count, SMALL_SEGMENT),
        b if b < MID_REQUEST_BELOW => mid_footprint(b, count, g, a),
        b => match g {
            Granule::Multiple(g) => packed_footprint(b, count, g, a),
            Granule::AtMost(_) => g.large(b).saturating_mul(count),
        },
    }
}

/// A request of `bytes` as the caching allocator rounds it before it looks for a block
/// (PyTorch: `round_size` in `c10/<device>/<Device>CachingAllocator.cpp`): up to `kMinBlockSize`
/// (512 bytes), or where `roundup_power2_divisions` sets `d > 1` divisions for the request's
/// interval and the request is over `512 * d` bytes, up to the next of `d` equal steps between
/// the powers of two around it (`roundup_power2_next_division`: 1200 with 4 divisions is 1280;
/// a power of two stays). 0 stays 0 (no allocation).
fn rounded_request(bytes: u64, a: &AllocatorConfig) -> u64 {
    if bytes == 0 {
        return 0;
    }
    let d = u64::from(a.divisions_for(bytes));
    if d > 1 && bytes > MIN_BLOCK.saturating_mul(d) && !bytes.is_power_of_two() {
        let floor = 1u64 << (63 - bytes.leading_zeros());
        let step = floor / d;
        if step == 0 {
            return floor.saturating_mul(2);
        }
        return bytes.div_ceil(step).saturating_mul(step);
    }
    bytes.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
}

/// What `count` requests of `b` bytes (rounded) take with expandable segments (PyTorch:
/// `expandable_segments:True`): one segment per stream and pool grows by mapping whole pages,
/// 2 MiB (`kSmallBuffer`) in the pool of requests up to 1 MiB, 20 MiB (`kLargeBuffer`) in the
/// other (`find_expandable_block`; `ExpandableSegment::map` rounds the range mapped up to
/// pages), and every request is split off the segment's free tail (`should_split` splits
/// whatever is left from 512 bytes up, `max_split_size_mb` aside), so the tensors lie one
/// after another and the segment grows by at most their sum rounded up to a page. A
/// `large_segment_size_mb` may make the large pool's page (releases that read it take it for
/// the mid-sized segment; whether for the page too depends on the release): the larger of what
/// either page takes.
fn expandable_footprint(b: u64, count: u64, a: &AllocatorConfig) -> u64 {
    let total = b.saturating_mul(count);
    let up = |page: u64| total.div_ceil(page).saturating_mul(page);
    if b <= SMALL_REQUEST {
        up(SMALL_SEGMENT)
    } else {
        up(MID_SEGMENT).max(up(a.mid_segment()))
    }
}

/// The largest page an expandable segment of `a` maps for the KV cache's large tensors.
fn expandable_page(a: &AllocatorConfig) -> u64 {
    MID_SEGMENT.max(a.mid_segment())
}

/// Whether `max_split_size_mb` may stop a block of `segment` bytes holding a request of `b`
/// bytes from being shared: PyTorch does not split a block for a request of `max_split_size`
/// or more (`should_split`), and does not hand a cached block of `max_split_size` or more to a
/// smaller request (`get_free_block`), so a remainder that large serves nothing.
fn split_stops_sharing(b: u64, segment: u64, a: &AllocatorConfig) -> bool {
    a.max_split_size
        .is_some_and(|m| b >= m || segment.saturating_sub(b) >= m)
}

/// What `count` equal requests of `b` bytes take in segments of `segment` bytes that each
/// hold as many of them as fit (at least one; the last segment may be part empty).
fn shared_segments(b: u64, count: u64, segment: u64) -> u64 {
    count
        .div_ceil((segment / b.max(1)).max(1))
        .saturating_mul(segment)
}

/// What `count` equal mid-sized requests of `b` bytes (over `kSmallSize`, below
/// `kMinLargeAlloc`) take. PyTorch serves every such request from a shared 20 MiB segment
/// (`get_allocation_size` gives `kLargeBuffer` whatever the request's size, and `should_split`
/// splits the rest off for the next request), not rounded on its own to its granule. An
/// allocator whose granule is coarser than that cannot map a smaller segment: its mid-sized
/// segments are the request rounded up to its granule where that is larger. So a segment is
/// `max(20 MiB, b rounded up to the granule)`, shared by as many requests as fit in it; with a
/// granule known only as a multiple of the real one (read off the allocator's sizes) or a
/// bound of it, the most that any granule the readings allow takes, since sharing is not
/// monotone in the segment (64 tensors of 7 MiB take 640 MiB in 20 MiB segments, two to each,
/// but 480 MiB in 30 MiB ones, four to each). The granule of large requests does not round
/// these: taking it as their segment (two 2.01 MiB tensors in 4 MiB each on a 2 MiB granule)
/// planned a cache of 2 MiB tensors that PyTorch serves at 2.84 MiB each (70% of the room).
/// A declared `large_segment_size_mb` (newer releases) takes the 20 MiB segment's place, and
/// `roundup_power2_divisions` has rounded each request before it is packed (178 tensors of
/// 2.85 MiB are 3 MiB each with 2 or 4 divisions, six to a segment, 600 MiB where seven go to
/// a segment by default, 520 MiB; [`rounded_request`]); `max_split_size_mb` below a segment's
/// remainder stops its sharing ([`split_stops_sharing`]). An engine that does not declare its
/// configuration is taken to run PyTorch's default one; the plan then relies on the session's
/// own measure of the cache, and where nothing measures it, the warning
/// `kv_allocation_unmeasured` says so. A granule coarser than 20 MiB making the
/// segment the granule is the simulator's adversarial extension of PyTorch's rule (PyTorch
/// itself keeps 20 MiB whatever its `kRoundLarge`), bounded here because the readings cannot
/// tell the two apart.
fn mid_footprint(b: u64, count: u64, g: Granule, a: &AllocatorConfig) -> u64 {
    let mid = a.mid_segment();
    let segment = |granule: u64| mid.max(Granule::Multiple(granule).large(b));
    // The largest segment any granule the readings allow gives these requests. Below `g`, a
    // granule `d` rounds `b` up to `d` where `d >= b`, else to less than `b + d`: under 20 MiB
    // (PyTorch's segment) for a request under 10 MiB, not under a smaller declared segment.
    let largest = match g {
        Granule::Multiple(g) => segment(g),
        Granule::AtMost(g) => mid.max(g).max(b.saturating_add(g.min(b)).saturating_sub(1)),
    };
    // A segment whose remainder `max_split_size_mb` keeps from smaller requests holds one
    // request each (taken for every mid-sized request where the largest segment's could be,
    // which keeps the footprint non-decreasing in `b`).
    if split_stops_sharing(SMALL_REQUEST, largest, a) {
        return count.saturating_mul(largest);
    }
    let shared = |segment: u64| shared_segments(b, count, segment);
    match g {
        // Where `g` does not factor within [`FACTOR_LIMIT`] trial divisions, no tensor shares:
        // each takes its own segment, the most any granule makes of them.
        Granule::Multiple(g) => match divisors(g) {
            Some(granules) => granules
                .into_iter()
                .map(|d| shared(segment(d)))
                .max()
                .unwrap_or_else(|| shared(segment(g))),
            None => count.saturating_mul(segment(g)),
        },
        // A granule below `g` that need not divide it: a segment of any size from 20 MiB to
        // `g`. The most such segments take is where each holds one request fewer than the
        // next size would: for each count per segment, the largest segment that holds no more.
        Granule::AtMost(_) => {
            let (lo, hi) = (mid, largest);
            let b = b.max(1);
            // A segment holding all `count` costs at most `hi`: counts past it add nothing.
            (lo / b..=(hi / b).min(count.max(1)))
                .map(|per| {
                    let largest = per
                        .saturating_add(1)
                        .saturating_mul(b)
                        .saturating_sub(MIN_BLOCK)
                        .clamp(lo, hi);
                    shared(largest)
                })
                .chain([shared(hi)])
                .max()
                .unwrap_or(hi)
        }
    }
}

/// What `count` equal large requests of `b` bytes take where the allocator rounds each new
/// segment up to a granule that divides `g` (a granule read off its sizes is a multiple of the
/// real one): the most any such granule takes. A segment rounded up past the request keeps
/// the rest as a free block, and the caching allocator splits it off and serves the next
/// request of the same size from it where it fits (PyTorch: `should_split` splits a large
/// block whose remainder is over `kSmallSize`, 1 MiB, and `get_free_block` takes the best
/// fitting cached block before a new segment is allocated), so a segment of `S` bytes holds
/// `S / b` of them. Where the granule is finer than the request (PyTorch's 2 MiB against
/// requests of 10 MiB and more), that is one per segment, each rounded on its own; where it
/// is coarser (a 30 MiB granule against KV tensors of 15 MiB), two or more share it. Not
/// monotone in the granule (a 30 MiB segment holds two tensors of 14.8 MiB at 15 MiB each, a
/// 10 MiB granule gives each its own 20 MiB), hence the most over every divisor of `g`. Where
/// `g` does not factor within [`FACTOR_LIMIT`] trial divisions, no tensor shares: each is
/// rounded up to `g` (never less than any divisor rounds it to). The sharing is PyTorch's
/// default configuration: a declared `max_split_size_mb` at or below the tensors' size (or a
/// granule's remainder) stops the split, each tensor then rounded alone, and declared
/// `expandable_segments` map pages instead ([`expandable_footprint`]); an undeclared one the
/// plan leaves to the session's own measure of the cache (this bound is kept only where
/// nothing measures it, with the warning `kv_allocation_unmeasured`).
fn packed_footprint(b: u64, count: u64, g: u64, a: &AllocatorConfig) -> u64 {
    let alone = Granule::Multiple(g).large(b).saturating_mul(count);
    // A remainder of less than one granule: `max_split_size_mb` stops its sharing where the
    // request or a granule's remainder reaches it (each then takes its own rounding, the
    // most of which is `g`'s).
    if split_stops_sharing(b, b.saturating_add(g.saturating_sub(1)), a) {
        return alone;
    }
    let Some(granules) = divisors(g) else {
        return alone;
    };
    granules
        .into_iter()
        .map(|granule| shared_segments(b, count, Granule::Multiple(granule).large(b)))
        .max()
        .map_or(alone, |packed| packed.min(alone))
}

/// Trial divisions [`divisors`] makes at most before it gives up on a number.
const FACTOR_LIMIT: u64 = 1 << 20;

/// Every divisor of `n` (`n` itself and 1 included), or `None` where its factors are not all
/// found within [`FACTOR_LIMIT`] trial divisions (a cofactor left over with no factor below the
/// limit and its square above it could be composite).
fn divisors(n: u64) -> Option<Vec<u64>> {
    if n == 0 {
        return None;
    }
    let mut factors: Vec<(u64, u32)> = Vec::new();
    let mut m = n;
    let mut p = 2u64;
    while p.saturating_mul(p) <= m {
        if p > FACTOR_LIMIT {
            return None;
        }
        let mut e = 0;
        while m.is_multiple_of(p) {
            m /= p;
            e += 1;
        }
        if e > 0 {
            factors.push((p, e));
        }
        p += if p == 2 { 1 } else { 2 };
    }
    if m > 1 {
        factors.push((m, 1));
    }
    let mut all = vec![1u64];
    for (p, e) in factors {
        let mut more = Vec::with_capacity(all.len() * (e as usize + 1));
        for d in &all {
            let mut x = *d;
            for _ in 0..=e {
                more.push(x);
                x = x.saturating_mul(p);
            }
        }
        all = more;
    }
    Some(all)
}

/// Whether a step whose allocations peaked at `bytes` made at least one request the caching
/// allocator rounds on its own, to its granule (PyTorch: `kMinLargeAlloc`, 10 MiB; smaller
/// requests share 2 or 20 MiB segments, which say nothing of the granule).
pub fn is_large_request(bytes: u64) -> bool {
    bytes >= MID_REQUEST_BELOW
}

/// The greatest common divisor (of allocator readings, whose granule divides them).
pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The coarsest granule an engine's caching allocator can round a large request up to, as its
/// own allocations before the plan show it: `readings` are `(bytes allocated, bytes reserved)`
/// of the steps that grew its reserved memory ([`Profile::segment_readings`]: the weights, the
/// profile run's peak, the graph phase's warm-ups, the session's warm-ups at odd sizes). The
/// allocator reserves whole segments and a large request's segment is rounded up to a multiple
/// of its granule (PyTorch: `kRoundLarge`, `c10/<device>/<Device>CachingAllocator.cpp`,
/// `get_allocation_size`), so every reserved growth made of such segments is a multiple of the
/// granule, and so is their greatest common divisor: the granule divides it, and is at most it.
/// One rounding wastes less than one granule, so a divisor no larger than what the least
/// wasteful step wasted cannot be the granule of that step's segments: the readings do not
/// bound it (requests served from other segments, 2 MiB or 20 MiB, or an allocator that rounds
/// otherwise). `None` then, and with fewer than two readings.
///
/// A step can also mix segments of another size into its growth (small tensors beside large
/// ones, in 2 MiB segments where the granule is 6 MiB): its growth is then no multiple of the
/// granule, and the common divisor with it falls below the granule (weights in small and
/// mid-sized segments beside warm-ups rounded to 12 MiB gave 4 MiB, and a cache planned with
/// it went 481 MiB past the request). Such a step holds several segments, and wastes more
/// than a step of one request can: a request rounded to a granule wastes less than one. So
/// from three readings on, a reading that wasted at least the divisor the others allow is left
/// out where that keeps a coarser divisor: the weights (norms and biases in small segments
/// beside large tensors) cannot then pull the bound below the granule. A reading that wasted
/// less stays in: it may be a single request, and a single request rounded to a coarser
/// granule would have had to be a multiple of it (warm-ups whose token counts the engine pads
/// to round sizes agree on 250 MiB; an activation peak beside them that is no multiple of it
/// bounds the granule at 2 MiB, where leaving it out would keep 10 MiB, and 17% of the cache).
/// Mixed segments that wasted less than one granule between them still pull it down.
///
/// [`Profile::segment_readings`]: crate::Profile::segment_readings
pub fn granule_bound(readings: &[(u64, u64)]) -> Option<u64> {
    granule_bound_beside(readings, None)
}

/// [`granule_bound`], where `readings[weights]` is the weights' reading. A model's weights are
/// hundreds of tensors (norms and biases of a few KiB beside matrices of a few MiB to a few
/// hundred), never one request: the reading may be made of segments the granule does not
/// divide whatever it wasted (PyTorch serves requests of 1 - 10 MiB from 20 MiB segments,
/// `kLargeBuffer`, so the weights of a small model can be mostly such segments), and a few
/// hundred tensors packed into them can waste less than one granule between them. So from
/// three readings on it is left out where that keeps a coarser divisor, whatever it wasted:
/// Qwen2.5-0.5B's 290 tensors reserved 980 MiB (49 segments of 20 MiB) for 966.5 MiB, beside an
/// activation peak and warm-ups all in multiples of a 19.5 MiB granule; with the weights the
/// common divisor fell to 512 KiB, the plan kept PyTorch's 2 MiB per KV tensor, and the cache's
/// 48 tensors took 280 MiB more than it kept (the engine ran out of memory capturing its
/// graphs). It stays in otherwise: the weights of a model of a few large tensors are each
/// rounded to the granule like one request (7 tensors of 2 GiB that wasted 206 MiB bound a
/// coarse granule that an activation peak alone does not). Leaving it out can only coarsen the
/// bound: a plan keeps more room, never less. See [`weights_left_out`] for when the session
/// stops narrowing it.
pub fn granule_bound_beside(readings: &[(u64, u64)], weights: Option<usize>) -> Option<u64> {
    let grown: Vec<((u64, u64), bool)> = readings
        .iter()
        .enumerate()
        .filter(|(_, r)| r.1 > 0)
        .map(|(i, r)| (*r, Some(i) == weights))
        .collect();
    let readings: Vec<(u64, u64)> = grown.iter().map(|(r, _)| *r).collect();
    let all = common_granule(&readings);
    if readings.len() == 2 {
        // The weights beside one other reading: where the weights' reservation is whole
        // mid-sized segments (PyTorch's 20 MiB `kLargeBuffer`, which serves every request of 1
        // to 10 MiB), it may say nothing of the granule. Where their common divisor is no more
        // than the other reading wasted, it contradicts that reading as one request rounded
        // to the granule (which wastes less than one granule): the weights are then left out,
        // and the other reading alone is the bound, since the granule divides what a request
        // rounded to it reserved, and a cache rounded to that is rounded to any granule that
        // divides it. Qwen2.5-0.5B's weights reserved 980 MiB (49 such segments) beside an
        // activation peak of 70 MiB that reserved 78 (a granule of 13, 26 or 39 MiB): their
        // divisor, 2 MiB, left the cache's 24 tensors hundreds of MiB short.
        if let Some(i) = grown.iter().position(|(_, many)| *many) {
            let (weights, other) = (grown[i].0, grown[1 - i].0);
            let waste = other.1.saturating_sub(other.0);
            if weights.1.is_multiple_of(MID_SEGMENT)
                && is_large_request(other.0)
                && gcd(weights.1, other.1) <= waste
            {
                return Some(other.1);
            }
        }
    }
    if readings.len() < 3 {
        return all;
    }
    (0..readings.len())
        .filter_map(|i| {
            let ((allocated, reserved), many) = grown[i];
            common_granule(&without(&readings, Some(i)))
                .filter(|g| many || reserved.saturating_sub(allocated) >= *g)
        })
        .chain(all)
        .max()
}

/// The bound on the granule from `readings` without the weights' (`readings[weights]`), as
/// [`granule_bound`] reads the rest: what the session's warm-ups for the granule narrow until
/// it reaches PyTorch's rounding. The weights beside one activation peak bound a granule at
/// their common divisor, which can be far below it (980 MiB of 20 MiB segments beside a peak
/// of 513 MiB rounded to a 19 MiB granule gave 1 MiB): stopping there left the plan keeping
/// 2 MiB per KV tensor and a one-backing cache 13.8 MiB past the request, where the warm-ups
/// would have given readings that leave the weights out ([`granule_bound_beside`]).
pub fn weights_left_out(readings: &[(u64, u64)], weights: Option<usize>) -> Option<u64> {
    granule_bound(&without(readings, weights))
}

/// `readings` without `readings[left_out]` (all of them where it is `None`).
fn without(readings: &[(u64, u64)], left_out: Option<usize>) -> Vec<(u64, u64)> {
    readings
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != left_out)
        .map(|(_, r)| *r)
        .collect()
}

/// The greatest common divisor of the readings' reserved growth where it exceeds what the
/// least wasteful of them wasted (see [`granule_bound`]); `None` with fewer than two.
fn common_granule(grown: &[(u64, u64)]) -> Option<u64> {
    if grown.len() < 2 {
        return None;
    }
    let g = grown.iter().fold(0, |g, r| gcd(g, r.1));
    let least_waste = grown.iter().map(|(a, r)| r.saturating_sub(*a)).min()?;
    (g > least_waste).then_some(g)
}

/// The most pages of `page` bytes each of `count` tensors may have and all still take at most
/// `room` once the allocator rounded them ([`footprint`]).
fn pages_within(room: u64, count: u64, g: Granule, page: u64, a: &AllocatorConfig) -> u64 {
    let page = page.max(1);
    let (mut lo, mut hi) = (0u64, room / count.max(1) / page);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if footprint(mid.saturating_mul(page), count, g, a) <= room {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The engine's KV tensors for the cache of `spec` sized as `s` under `rules`: `(tensors, page
/// bytes)`, a cache of `n` blocks being `tensors` tensors of `n x page` bytes. Per tensor
/// ([`KvAllocation::PerTensor`], vLLM up to 0.28): one tensor per layer of a group, where a
/// block is whole pages of one size (`None` otherwise). One backing allocation
/// ([`KvAllocation::OneBacking`], vLLM 0.29.0 on, `vllm/v1/worker/utils.py`
/// `allocate_kv_cache`: `torch.zeros(raw_size)` with `raw_size = bytes_per_block * num_blocks`
/// from `get_kv_cache_config_from_groups`): one tensor of the block's bytes. K and V apart
/// ([`KvAllocation::SplitKv`], SGLang 0.5.1 to 0.5.22; [`KvAllocation::PairedKv`], SGLang
/// 0.5.23, where K's and V's shapes differ; `MHATokenToKVPool` in
/// `python/sglang/srt/mem_cache/memory_pool.py`): each layer's page is that many tensors of
/// equal halves, one layer per tensor (SGLang's pools share no tensor between layers, so one
/// KV-cache group only); `None` where K and V differ in size or layers split differently.
pub(crate) fn kv_layout(spec: &KvSpec, s: &KvSizing, rules: &SizingRules) -> Option<(u64, u64)> {
    let whole_pages = |tensors: u64| {
        (s.page_bytes > 0 && s.group_size.checked_mul(s.page_bytes) == Some(s.block_bytes))
            .then_some((
                s.group_size.max(1).checked_mul(tensors)?,
                s.page_bytes / tensors,
            ))
    };
    match rules.kv_allocation {
        KvAllocation::OneBacking => (s.block_bytes > 0).then_some((1, s.block_bytes)),
        KvAllocation::PerTensor => whole_pages(1),
        a @ (KvAllocation::SplitKv | KvAllocation::PairedKv) => {
            let per_layer = a.equal_tensors_per_layer(&spec.groups)?;
            if s.num_groups > 1 || !s.page_bytes.is_multiple_of(per_layer) {
                return None;
            }
            whole_pages(per_layer)
        }
    }
}

/// Reserved for memory held outside the allocator (library workspaces, context growth) when it
/// cannot be measured because the driver's free reading is unavailable: never taken as 0. In
/// the single-GPU vLLM start-up logs of `shared/data` this memory is 0.24-0.35 GiB; 512 MiB
/// covers it with margin (multi-GPU communication buffers can take more: measure them).
pub const UNMEASURED_NON_ALLOCATOR_BYTES: u64 = 512 * MIB;

/// Everything a plan is made from. Start with [`PlanBuilder::new`] (a dry run) or
/// [`PlanBuilder::from_profile`] (a measured start-up), override what you know better, then
/// [`build`](PlanBuilder::build).
#[derive(Debug, Clone)]
#[must_use]
pub struct PlanBuilder {
    total: u64,
    request: Request,
    kv_spec: KvSpec,
    limits: KvLimits,
    consumers: Consumers,
    graph: GraphPlan,
    start: Option<MemoryInfo>,
    /// How far the start snapshot's free figure may under-state free memory.
    start_tolerance: u64,
    free_now: Option<(u64, u64)>,
    available_now: Option<(u64, u64, PhysicalCheck)>,
    blind: bool,
    foreign: Option<i64>,
    warnings: Vec<Warning>,
    device: Option<String>,
    model: Option<String>,
    max_num_seqs: Option<u64>,
    tensor_parallel: u64,
    pipeline_parallel: u64,
    rank: Option<Rank>,
    rules: SizingRules,
    engine: Option<String>,
    notes: Vec<String>,
    /// Kept below the budget, per tensor of the KV cache, for the allocator's rounding of each
    /// (see [`build`](Self::build)).
    alloc_slack: u64,
    /// The KV cache is mapped in whole granules of this many bytes (post-capture).
    granularity: Option<u64>,
    /// How far the measured non-allocator growth may read low ([`non_allocator_windows_error`]):
    /// added to it where the KV cache is one backing allocation (see [`build`](Self::build)).
    non_allocator_error: u64,
    /// The granule kept for the KV cache's rounding is one the allocator's own sizes gave
    /// (every fixed granule divides it), not a default: see [`Granule`].
    rounding_divides: bool,
    /// The caching allocator's configuration the engine declared, and where it came from
    /// ([`Self::allocator_config`]); `None`: not declared (PyTorch's default rules).
    alloc_conf: Option<(AllocatorConfig, String)>,
}

impl PlanBuilder {
    /// A plan of a device of `total` bytes for `request`, sizing `kv_spec` under `limits`. No
    /// consumers yet, no graph strategy (`none`), no free-memory checks.
    pub fn new(total: u64, request: Request, kv_spec: KvSpec, limits: KvLimits) -> Self {
        PlanBuilder {
            total,
            request,
            kv_spec,
            limits,
            consumers: Consumers::new(),
            graph: GraphPlan::new(GraphMethod::Strategy(StrategyKind::None), "no graph phase"),
            start: None,
            start_tolerance: 0,
            free_now: None,
            available_now: None,
            blind: false,
            foreign: None,
            warnings: Vec::new(),
            device: None,
            model: None,
            max_num_seqs: None,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            rank: None,
            rules: SizingRules::default(),
            engine: None,
            notes: Vec::new(),
            alloc_slack: 0,
            granularity: None,
            non_allocator_error: 0,
            rounding_divides: true,
            alloc_conf: None,
        }
    }

    /// A plan from a measured start-up: the device total of its baseline (or, where the
    /// device gives none, an absolute byte budget), every consumer it measured, its graph
    /// strategy (`why` says why it ran), the start-up check and the physical cap where the
    /// free reading measures this process, its warnings.
    pub fn from_profile(
        p: &Profile,
        why: impl Into<String>,
        request: Request,
        kv_spec: KvSpec,
        limits: KvLimits,
    ) -> Result<Self> {
        let total_reading = p.capability.reading(Reading::DriverTotal);
        let total = match (crate::budget::share_total(&p.baseline, &total_reading), request) {
            (Some(t), _) => t,
            (None, Request::Bytes(b)) => b,
            (None, r) => {
                return Err(Error::param(
                    r.param(),
                    format!(
                        "the device reports no usable total ({}): give an absolute memory budget instead",
                        p.capability.reading(Reading::DriverTotal)
                    ),
                ))
            }
        };
        let mut b = PlanBuilder::new(total, request, kv_spec, limits);
        b.warnings = p.warnings.clone();
        if let (Reliability::Unavailable { reason }, Request::Utilization(_)) =
            (&total_reading, request)
        {
            // Only reached with a second total: without one, a share refused above.
            b.warnings.push(Warning::UtilizationOfDeviceTotal {
                device: total,
                why: reason.clone(),
            });
        } else if let (Some(driver), Some(device)) =
            (p.baseline.driver.total, p.baseline.device.total)
        {
            if driver > device && total == device {
                b.warnings
                    .push(Warning::DriverTotalAboveDevice { driver, device });
            }
        }
        // A share of an approximate total is a share of the reported figure, as the engine
        // takes it (vLLM's V1 worker, `vllm/v1/worker/gpu_worker.py`, `Worker.init_device`:
        // `requested_memory = init_snapshot.total_memory * gpu_memory_utilization`, in the
        // 0.2x releases): said, not corrected.
        if let (
            Request::Utilization(_),
            Reliability::Approximate {
                tolerance_bytes,
                why,
            },
        ) = (request, p.capability.reading(Reading::DriverTotal))
        {
            b.warnings.push(Warning::UtilizationOfInexactTotal {
                reported_total: total,
                tolerance: tolerance_bytes,
                why,
            });
        }
        // A measured plan is held to the request: the engine's allocation of the KV cache may
        // be rounded up by its allocator (each per-layer tensor on its own), so that rounding
        // stays inside the budget.
        b.alloc_slack = ALLOCATOR_ROUNDING_BOUND;
        let weights = p.weights_held_bytes.ok_or_else(|| {
            Error::state(
                "plan",
                "the weights were not measured (load_weights did not run)",
            )
        })?;
        let act = p
            .activation_peak_bytes
            .ok_or_else(|| Error::state("plan", "the profile run did not run"))?;
        // The engine warms every size up again before its own capture, with its KV cache
        // allocated: where a warm-up took more than the profile run, that is the transient
        // peak beside the cache (not where the graphs were kept: they are captured already).
        let to_capture = !p.graph.as_ref().is_some_and(|g| g.kept);
        // Where the engine's capture keeps the allocator's cache, the largest warm-up's segments
        // stay reserved through every capture and into serving, where a burst needs its own
        // peak beside them (a request larger than a cached block gets a segment of its own).
        // What stays cached is what the engine's warm-up sequence left there (its largest
        // warm-up's segments and a small warm-up's, measured), at least the largest warm-up.
        let kept_cache = p
            .warmup_peak_bytes
            .filter(|_| to_capture && p.capture_keeps_cache == Some(true))
            .map(|w| w.max(p.capture_cache_left_bytes.unwrap_or(0)));
        let larger_warmup = p.warmup_peak_bytes.filter(|w| *w > act && to_capture);
        let activation = match (kept_cache, larger_warmup) {
            (Some(w), _) => Consumer::measured(
                ConsumerKind::Activation,
                act.saturating_add(w),
                "capture_graphs",
                "the profile run's peak, and beside it what the engine's warm-ups leave cached (the largest warm-up's segments, and a small warm-up's in segments of their own): the engine's capture keeps the allocator's cache, so they stay reserved through serving",
            ),
            (None, Some(w)) => Consumer::measured(
                ConsumerKind::Activation,
                w,
                "capture_graphs",
                "what the allocator held for the graph phase's largest warm-up above where it stood before (reserved peak, at least the allocated peak): more than the profile run's peak, and the engine warms each size up again before its capture",
            ),
            (None, None) => Consumer::measured(
                ConsumerKind::Activation,
                act,
                "profile_run",
                "what the allocator held for the run's peak above where it stood before (reserved peak, at least the allocated peak)",
            ),
        };
        b = b
            .consumer(Consumer::measured(
                ConsumerKind::Weights,
                weights,
                "load_weights",
                "allocator reserved growth while loading (the weights as held)",
            ))
            .consumer(activation);
        let mut read_low = 0;
        let non_alloc = match p.non_allocator_growth {
            Some(g) if p.non_allocator_by_probe => Consumer::measured(
                ConsumerKind::NonAllocator,
                g.max(0) as u64,
                "allocation probes",
                "the largest allocation at the baseline less the largest now, less the allocator's growth (no reading measures this process; within the probes' resolution, on the safe side)",
            ),
            Some(g) => {
                // What the windows the growth sums may be off by, kept where nothing else in
                // the plan absorbs it (see `build`).
                read_low = non_allocator_windows_error(p);
                Consumer::measured(
                    ConsumerKind::NonAllocator,
                    g.max(0) as u64,
                    "engine steps",
                    NON_ALLOCATOR_BASIS,
                )
            }
            None => {
                b.warnings.push(Warning::NonAllocatorUnmeasured {
                    reserved: UNMEASURED_NON_ALLOCATOR_BYTES,
                });
                Consumer::estimated(
                    ConsumerKind::NonAllocator,
                    UNMEASURED_NON_ALLOCATOR_BYTES,
                    "bound: the driver free reading cannot measure memory outside the allocator",
                )
            }
        };
        b = b.consumer(non_alloc);
        b.non_allocator_error = read_low;
        b = match &p.graph {
            Some(g) => b
                .consumer(Consumer::new(
                    ConsumerKind::Graphs,
                    g.reserve,
                    super::Provenance::GraphStrategy {
                        strategy: g.strategy,
                        uncertainty_bytes: g.uncertainty,
                        basis: g.explanation.clone(),
                    },
                ))
                .graph(GraphPlan::from_estimate(g.clone(), why)),
            None => b
                .consumer(Consumer::not_reserved(
                    ConsumerKind::Graphs,
                    "no graph phase ran",
                ))
                .graph(GraphPlan::new(
                    GraphMethod::Strategy(StrategyKind::None),
                    why,
                )),
        };
        let free = p.capability.reading(Reading::DriverFree);
        if free.measures_own_usage() {
            b.start = Some(p.baseline);
            b.start_tolerance = free.tolerance_bytes();
            b.free_now = p.last.driver.free.map(|f| (f, free.tolerance_bytes()));
        }
        // Memory other processes hold: where the free reading cannot see it, the device-wide
        // reading bounds the start and the KV cache; where neither can, say so by name (the
        // session then checks the plan with an allocation probe).
        match physical::judge(p) {
            Physical::FreeSeesAll => {}
            Physical::DeviceWide {
                baseline,
                last,
                tolerance,
            } => {
                if let Some(baseline) = baseline {
                    let mut start = b.start.unwrap_or(p.baseline);
                    if b.start.is_none() || baseline < start.driver.free.unwrap_or(u64::MAX) {
                        b.start_tolerance = tolerance;
                    }
                    start.driver.free = Some(baseline.min(start.driver.free.unwrap_or(u64::MAX)));
                    start.driver.total = start.driver.total.or(Some(total));
                    b.start = Some(start);
                }
                b.available_now = Some((last, tolerance, PhysicalCheck::DeviceAvailable));
            }
            Physical::Blind {
                free_reading,
                device_wide,
            } => {
                b.blind = true;
                b.warnings.push(Warning::OtherProcessesUnseen {
                    free_reading,
                    device_wide,
                });
            }
        }
        // The start-up check judges the free memory the engine found when it started: what
        // calibration's own test captures left held was free then (the budget still counts
        // it as this engine's).
        if let Some(s) = &mut b.start {
            s.driver.free = s
                .driver
                .free
                .map(|f| f.saturating_add(p.held_by_calibration));
        }
        b.foreign = Some(p.foreign_bytes);
        Ok(b)
    }

    /// Neither the free reading nor a device-wide source sees memory other processes hold:
    /// the plan should be checked by allocating what it still needs ([`Self::needs`]) once.
    pub fn is_blind(&self) -> bool {
        self.blind
    }

    /// The largest tolerance a physical cap subtracts (how far the free or device-wide reading
    /// may over-state what is there).
    pub fn cap_tolerance(&self) -> u64 {
        let free = self.free_now.map_or(0, |f| f.1);
        let device = self.available_now.map_or(0, |a| a.1);
        free.max(device)
    }

    /// The same plan with its physical caps taking the readings at their word (no tolerance
    /// subtracted), to be checked by an allocation probe instead ([`Self::probed`]): where a
    /// reading's tolerance is wide, a probe resolves what it leaves open.
    pub fn without_cap_tolerance(mut self) -> Self {
        if let Some(f) = &mut self.free_now {
            f.1 = 0;
        }
        if let Some(a) = &mut self.available_now {
            a.1 = 0;
        }
        self
    }

    /// Cap the KV cache by what an allocation probe found physically available at the last
    /// quiet point: `bytes`, the largest allocation that succeeded; `complete` when that was
    /// all the plan still needs ([`Self::needs`]), which leaves the plan as it is.
    ///
    /// A device-wide cap already in the builder stays (taken at its word: the probe checked
    /// the plan it gave), lowered to what the probe found.
    pub fn probed(mut self, bytes: u64, complete: bool) -> Self {
        let found = if complete { u64::MAX } else { bytes };
        let avail = match self.available_now {
            Some((a, tol, _)) => a.saturating_sub(tol).min(found),
            None => found,
        };
        self.available_now = Some((avail, 0, PhysicalCheck::Probe));
        self
    }

    /// What the engine still allocates after the plan, for a KV cache of `kv_bytes`: the KV
    /// cache with its allocator's rounding of each tensor, the activation peak and the graph reserve still to capture, plus the slack the
    /// physical cap keeps for allocator rounding. An allocation probe of this size proves it
    /// is there.
    pub fn needs(&self, kv_bytes: u64) -> u64 {
        let n = self
            .rounded_kv(kv_bytes)
            .saturating_add(self.needs_beside_kv());
        n.saturating_add(physical::rounding_slack(n))
    }

    /// The engine's KV tensors where its allocator rounds each on its own: `(tensors, page
    /// bytes)`, the cache of `n` blocks being `tensors` tensors of `n x page` bytes. `None` in a
    /// dry run (no slack), where the cache is mapped in whole granules (post-capture: one
    /// mapping), or where the layout is not tensors of whole pages. vLLM v1 up to 0.28
    /// allocates one tensor per layer of a KV-cache group
    /// (`GPUModelRunner._allocate_kv_cache_tensors`, one `torch.zeros` per tensor of
    /// `page_size * num_blocks`), each rounded by the caching allocator; from 0.29.0 one
    /// backing allocation of `bytes_per_block * num_blocks` (`vllm/v1/worker/utils.py`
    /// `allocate_kv_cache`), whatever the pages ([`KvAllocation::OneBacking`]: one tensor of
    /// the block's bytes).
    fn kv_tensors(&self) -> Option<(u64, u64)> {
        if self.alloc_slack == 0 || self.granularity.is_some() {
            return None;
        }
        let s = self.kv_spec.size_with(0, &self.limits, &self.rules).ok()?;
        kv_layout(&self.kv_spec, &s, &self.rules)
    }

    /// What a KV cache of `kv_bytes` takes once the allocator rounded its tensors (each as
    /// [`tensors_footprint`] says: a large one at most [`ALLOCATOR_ROUNDING_BOUND`] more, small
    /// and mid-sized ones their share of the segments they share; the bound once per layer
    /// where the layout is not known).
    fn rounded_kv(&self, kv_bytes: u64) -> u64 {
        let g = self.granule();
        let a = self.alloc();
        match self.kv_tensors() {
            Some((tensors, page)) => {
                let blocks = kv_bytes / page.saturating_mul(tensors).max(1);
                footprint(blocks.saturating_mul(page), tensors, g, a).max(kv_bytes)
            }
            None => kv_bytes
                .saturating_add(self.kv_rounding_bound())
                .saturating_add(power2_waste(kv_bytes, a)),
        }
    }

    /// The caching allocator's configuration the plan takes ([`Self::allocator_config`];
    /// PyTorch's default where none was declared).
    fn alloc(&self) -> &AllocatorConfig {
        static DEFAULT: std::sync::OnceLock<AllocatorConfig> = std::sync::OnceLock::new();
        match &self.alloc_conf {
            Some((a, _)) => a,
            None => DEFAULT.get_or_init(AllocatorConfig::default),
        }
    }

    /// The allocator's rounding bound kept once per allocation the engine makes: per layer, per
    /// K and per V where it allocates them apart ([`KvAllocation::allocations`]), once where
    /// the cache is mapped or is one backing allocation ([`KvAllocation::OneBacking`]).
    fn kv_rounding_bound(&self) -> u64 {
        if self.granularity.is_some() {
            return self.alloc_slack;
        }
        let allocations = self.rules.kv_allocation.allocations(&self.kv_spec.groups);
        let per_allocation = self.alloc_slack.saturating_mul(allocations.max(1));
        // Expandable segments pack every tensor into one segment: one page past their sum
        // (and each rounded to 512 bytes), whatever the rounding of one request (a granule
        // read off the allocator's sizes there is the page, not a rounding per tensor).
        if self.alloc_slack > 0 && self.alloc().expandable_segments {
            return expandable_page(self.alloc())
                .saturating_add(MIN_BLOCK.saturating_mul(allocations.max(1)));
        }
        per_allocation
    }

    /// What the engine still needs once its KV cache is allocated: the activation peak and the
    /// graphs still to capture (no rounding slack: the KV cache's rounding is what takes it).
    pub fn needs_beside_kv(&self) -> u64 {
        let to_capture = if self.graph.kept {
            0
        } else {
            self.consumers.bytes(ConsumerKind::Graphs)
        };
        self.consumers
            .bytes(ConsumerKind::Activation)
            .saturating_add(to_capture)
    }

    /// Keep room for what the device kept of `frees` raw frees this start-up made after its
    /// last reading (its allocation probe), `bytes` in all: a device that keeps memory per free
    /// ([`Warning::DeviceKeepsMemoryOnFree`]) holds that much more than any reading measured,
    /// outside the engine's allocator, so it is added to that consumer (its measured figure
    /// and what the readings' windows may be off by stay as they were).
    pub fn kept_by_own_frees(mut self, bytes: u64, frees: u64) -> Self {
        if bytes == 0 {
            return self;
        }
        let mut c = self
            .consumers
            .get(ConsumerKind::NonAllocator)
            .cloned()
            .unwrap_or_else(|| {
                Consumer::measured(ConsumerKind::NonAllocator, 0, "engine steps", "")
            });
        c.bytes = c.bytes.saturating_add(bytes);
        let more = format!(
            "; plus {} the device keeps of the {frees} raw free(s) this start-up made after its last reading",
            fmt_bytes(bytes)
        );
        match &mut c.provenance {
            super::Provenance::Measured { basis, .. }
            | super::Provenance::Checkpoint { basis }
            | super::Provenance::Given { basis }
            | super::Provenance::Estimated { basis }
            | super::Provenance::GraphStrategy { basis, .. }
            | super::Provenance::NotReserved { reason: basis } => basis.push_str(&more),
        }
        self.consumers.set(c);
        self
    }

    /// Add a consumer, replacing the one of its kind (a figure the caller knows better).
    pub fn consumer(mut self, c: Consumer) -> Self {
        if c.kind == ConsumerKind::NonAllocator {
            self.non_allocator_error = 0;
        }
        self.consumers.set(c);
        self
    }

    /// How graph memory entered the plan.
    pub fn graph(mut self, g: GraphPlan) -> Self {
        self.graph = g;
        self
    }

    /// Refuse when free memory in this snapshot (taken before the engine loaded anything) is
    /// below the requested memory.
    pub fn start_snapshot(mut self, s: MemoryInfo) -> Self {
        self.start = Some(s);
        self
    }

    /// Cap the KV cache by what is free now (after the engine's steps), `tolerance` being how
    /// far the reading may over-state it.
    pub fn free_now(mut self, free: u64, tolerance: u64) -> Self {
        self.free_now = Some((free, tolerance));
        self
    }

    /// The KV cache will be mapped in whole granules of `bytes` (post-capture: the device's
    /// mapping granularity), as one region at the start of its range (`session::kv_cache::map`):
    /// the KV cache granted is rounded down to whole granules, so its blocks, rounded up to a
    /// granule when mapped, stay inside it. A cache mapped in several regions (K and V, or
    /// each layer, apart) would round each up and needs a granule per region besides.
    pub fn mapping_granularity(mut self, bytes: u64) -> Self {
        self.granularity = Some(bytes);
        self
    }

    /// Add a warning.
    pub fn warning(mut self, w: Warning) -> Self {
        self.warnings.push(w);
        self
    }

    /// The device's name for people.
    pub fn device(mut self, label: impl Into<String>) -> Self {
        self.device = Some(label.into());
        self
    }

    /// The model's name.
    pub fn model(mut self, name: impl Into<String>) -> Self {
        self.model = Some(name.into());
        self
    }

    /// Requests per step (reported, and used by engine flags).
    pub fn max_num_seqs(mut self, n: u64) -> Self {
        self.max_num_seqs = Some(n);
        self
    }

    /// Tensor-parallel ranks the per-rank figures belong to.
    pub fn tensor_parallel(mut self, ranks: u64) -> Self {
        self.tensor_parallel = ranks;
        self
    }

    /// Pipeline stages of the deployment (the figures are one stage's).
    pub fn pipeline_parallel(mut self, stages: u64) -> Self {
        self.pipeline_parallel = stages;
        self
    }

    /// The rank the plan is for (a measured start-up's): its tensor- and pipeline-parallel
    /// sizes become the plan's.
    pub fn rank(mut self, rank: Rank) -> Self {
        self.tensor_parallel = rank.tensor_parallel_size;
        self.pipeline_parallel = rank.pipeline_parallel_size;
        self.rank = Some(rank);
        self
    }

    /// The engine release's KV sizing rules (default: vLLM 0.19's, [`SizingRules::default`]).
    pub fn sizing_rules(mut self, rules: SizingRules) -> Self {
        self.rules = rules;
        self
    }

    /// The engine release the plan is for (`vllm@0.34`).
    pub fn engine(mut self, e: impl Into<String>) -> Self {
        self.engine = Some(e.into());
        self
    }

    /// Notes for people: which rule read the config, which engine rules applied.
    pub fn notes(mut self, notes: Vec<String>) -> Self {
        self.notes.extend(notes);
        self
    }

    /// The engine's caching allocator runs with `conf` (PyTorch's option string, parsed by
    /// [`AllocatorConfig::parse`]); `source` says where the plan got it (a flag, an
    /// environment variable, the engine). Where the plan keeps room for the allocator's
    /// rounding of the KV cache's tensors (a measured start-up), it takes them to round and
    /// share segments as `conf` says (`footprint` in `plan/build.rs`): expandable segments,
    /// power-of-two divisions, `max_split_size_mb`, `large_segment_size_mb`. A note says which
    /// configuration the plan took, and from where. Not declared: PyTorch's default rules,
    /// the same figures as declaring the default configuration.
    pub fn allocator_config(mut self, conf: AllocatorConfig, source: impl Into<String>) -> Self {
        self.alloc_conf = Some((conf, source.into()));
        self
    }

    /// The caching allocator's configuration declared ([`Self::allocator_config`]).
    pub fn declared_allocator_config(&self) -> Option<&AllocatorConfig> {
        self.alloc_conf.as_ref().map(|(a, _)| a)
    }

    /// Nothing will measure the engine's allocation of its KV cache: a measured plan keeps, per
    /// KV tensor, room for rounding it up to `granule` (a bound from the engine's own
    /// allocations, [`granule_bound`]; at least [`ALLOCATOR_ROUNDING_BOUND`]), or where nothing
    /// bounds it (`None`), to the 20 MiB segment PyTorch's rules give every request below
    /// `kMinLargeAlloc`, the coarsest they give one request. Returns the granule kept (0 in a
    /// dry run, which keeps none).
    pub fn unmeasured_kv_allocation(&mut self, granule: Option<u64>) -> u64 {
        if self.alloc_slack > 0 {
            // The coarsest PyTorch's rules give one request: the mid-sized segment
            // (`large_segment_size_mb` where declared larger), which is also an expandable
            // segment's page.
            let coarsest = MID_SEGMENT.max(self.alloc().mid_segment());
            self.alloc_slack = self.alloc_slack.max(granule.unwrap_or(coarsest));
            // A default granule bounds the rounding, not its steps (see [`Granule`]); nor does
            // the bound read off the allocator's sizes where they mix size classes (weights in
            // shared 20 MiB segments beside a 1.2 GiB activation rounded to the granule gave
            // 10 MiB of 3,400 and 1,230 MiB where the granule is 6 MiB). One backing allocation
            // keeps the whole bound beside it (one granule, at most); a tensor per layer keeps
            // each rounded up to the bound, the model the sweeps hold it to (keeping the whole
            // bound per tensor cost the unmeasured group 19 runs below the floor of 500).
            self.rounding_divides = granule == Some(self.alloc_slack)
                && self.rules.kv_allocation != KvAllocation::OneBacking;
        }
        self.alloc_slack
    }

    /// The KV cache's rounding as the plan keeps room for it ([`Granule`]).
    fn granule(&self) -> Granule {
        if self.rounding_divides {
            Granule::Multiple(self.alloc_slack)
        } else {
            Granule::AtMost(self.alloc_slack)
        }
    }

    /// The consumers so far.
    pub fn consumers(&self) -> &Consumers {
        &self.consumers
    }

    /// The KV cache to size.
    pub fn kv_spec(&self) -> &KvSpec {
        &self.kv_spec
    }

    /// The request-shape limits.
    pub fn limits(&self) -> KvLimits {
        self.limits
    }

    /// The engine release's KV sizing rules.
    pub fn rules(&self) -> SizingRules {
        self.rules
    }

    /// The engine release the plan is for, when set.
    pub fn engine_release(&self) -> Option<&str> {
        self.engine.as_deref()
    }

    /// Requests per step, when set.
    pub fn requests_per_step(&self) -> Option<u64> {
        self.max_num_seqs
    }

    /// The notes so far.
    pub fn notes_so_far(&self) -> &[String] {
        &self.notes
    }

    /// Make the plan. Errors: a bad request (naming the [`Param`]), overflow, and
    /// [`Error::DoesNotFit`] with a [`Refusal`]: free memory below the request at the start,
    /// consumers beyond the request or the device, one request of the max model length not
    /// fitting (with the longest that fits).
    pub fn build(self) -> Result<Plan> {
        let span = tracing::info_span!("plan");
        let _e = span.enter();
        if self.tensor_parallel == 0 {
            return Err(Error::param(Param::TensorParallel, "must be > 0"));
        }
        if self.pipeline_parallel == 0 {
            return Err(Error::param(Param::PipelineParallel, "must be > 0"));
        }
        if let Some(r) = &self.rank {
            r.validate()?;
        }
        let fixed_kv = matches!(self.request, Request::KvCacheBytes(_));
        // A measured plan fits the KV cache's tensors, each rounded by the allocator, in what it
        // keeps for the cache (see `fit_rounded`); a mapped cache is rounded down to whole
        // granules of its mapping.
        let per_tensor = !fixed_kv && self.alloc_slack > 0 && self.granularity.is_none();
        let fit = (self.granule(), self.kv_tensors(), self.kv_rounding_bound());
        let alloc = self.alloc().clone();
        let mut notes = self.notes;
        if let Some((a, source)) = &self.alloc_conf {
            notes.push(alloc_conf_note(
                a,
                source,
                self.alloc_slack > 0,
                self.granularity.is_some(),
            ));
        }
        // A KV cache that is rounded once is packed: one backing allocation (vLLM 0.29.0 on,
        // `allocate_kv_cache`), or tensors packed one after another into an expandable
        // segment mapped in pages (`expandable_segments:True`, `footprint`). What is left of
        // the budget after it is under a granule (a page) and a block, and a free reading that
        // read the engine's memory outside the allocator low would hand that memory to the
        // cache and take the engine past the request. The plan keeps what the reading's
        // windows may be off by there (beyond the window a measured graph reserve's margin
        // keeps for them, `non_allocator_windows_error`). A tensor per layer rounded on its
        // own leaves the rounding of its tensors (in steps of a granule per tensor) to absorb
        // it, and is left as it was.
        let packed = self.rules.kv_allocation == KvAllocation::OneBacking
            || (alloc.expandable_segments && self.alloc_slack > 0);
        let mut consumers = self.consumers;
        if self.non_allocator_error > 0 && packed && self.granularity.is_none() && !fixed_kv {
            let measured = consumers.bytes(ConsumerKind::NonAllocator);
            consumers.set(Consumer::measured(
                ConsumerKind::NonAllocator,
                measured.saturating_add(self.non_allocator_error),
                "engine steps",
                format!(
                    "{NON_ALLOCATOR_BASIS}, plus what the free reading's windows may be off by beyond what the graph reserve's margin keeps for them ({}; the KV cache is rounded once, as one allocation or packed into pages)",
                    fmt_bytes(self.non_allocator_error)
                ),
            ));
        }
        let consumers = consumers;
        if let (Some(s), false) = (&self.start, fixed_kv) {
            let requested = budget::requested_bytes(self.total, self.request)?;
            budget::check_free(s, requested, &self.request, self.start_tolerance)?;
        }
        let b = budget::compute(self.total, self.request, &consumers).map_err(|e| {
            budget::with_free_at_start(e, self.start.as_ref().and_then(|s| s.driver.free))
        })?;
        if let (Some(s), true) = (&self.start, fixed_kv) {
            budget::check_free(s, b.requested, &self.request, self.start_tolerance)?;
        }
        let mut warnings = self.warnings;
        // The whole budget: a tensor-by-tensor fit counts its allocator's rounding below
        // (`fit_rounded`), and a mapped cache (post-capture) is rounded down to whole granules,
        // its blocks, mapped rounded up to a granule, staying inside them. Keeping a granule
        // besides lost up to two granules' blocks (a 117 MB budget on a 2 MiB granularity held
        // 109 blocks of 1 MB where 111 fit in its 55 granules).
        let mut kv_bytes = b.kv_budget;
        let mut capped_by_free = None;
        let mut physical_check = None;
        let to_capture = if self.graph.kept { 0 } else { b.graph_reserve };
        let activation = consumers.bytes(ConsumerKind::Activation);
        let cap_of = |avail: u64, tol: u64| {
            let cap = avail
                .saturating_sub(activation)
                .saturating_sub(to_capture)
                .saturating_sub(tol);
            // Slack for the allocator's rounding of the allocations still to come: a cap that
            // is met exactly leaves a large allocation nowhere to go. Where the KV cache is fitted
            // tensor by tensor as the allocator rounds each (`fit_rounded`), its rounding is
            // counted there, and the activation peak and the graphs are what the allocator held
            // for them (reserved, so rounded already): no slack on top.
            if per_tensor {
                cap
            } else {
                cap.saturating_sub(physical::rounding_slack(cap))
            }
        };
        if let Some((free, tol)) = self.free_now {
            let cap = cap_of(free, tol);
            // A free reading that cannot see other processes still bounds the plan from above,
            // but it is not what checked it physically.
            physical_check = (!self.blind).then_some(PhysicalCheck::DriverFree);
            if cap < kv_bytes {
                warnings.push(Warning::KvCappedByFreeMemory {
                    cap,
                    budget: kv_bytes,
                    foreign: self.foreign.unwrap_or(0),
                });
                kv_bytes = cap;
                capped_by_free = Some(cap);
            }
        }
        if let Some((avail, tol, check)) = self.available_now {
            let cap = cap_of(avail, tol);
            physical_check = Some(check);
            if cap < kv_bytes {
                warnings.push(Warning::KvCappedByAvailableMemory {
                    cap,
                    budget: kv_bytes,
                    source: check,
                });
                kv_bytes = cap;
                capped_by_free = Some(cap);
            }
        }
        if let Some(g) = self.granularity.filter(|g| *g > 1) {
            kv_bytes = kv_bytes / g * g;
        }
        if per_tensor {
            kv_bytes = fit_rounded(kv_bytes, fit.0, fit.1, fit.2, &alloc);
        }
        if let Some(f) = self.foreign.filter(|f| *f != 0) {
            warnings.push(Warning::ForeignMemoryChanged { bytes: f });
        }
        let kv = self
            .kv_spec
            .size_with(kv_bytes, &self.limits, &self.rules)?;
        // One request of `max_model_len` does not fit: vLLM refuses to start; an engine that
        // admits shorter requests (SGLang) starts where its pool holds its least, warned.
        if kv.max_concurrency < 1.0 {
            let refuse = Refusal::RequestDoesNotFit {
                max_model_len: self.limits.max_model_len,
                blocks_per_request: kv.blocks_per_request,
                usable_blocks: kv.usable_blocks,
                kv_bytes,
                max_model_len_fit: kv.max_model_len_fit,
            };
            let rule = self.rules.long_requests;
            match (
                rule,
                rule.longest_admitted(kv.tokens, self.limits.max_model_len),
            ) {
                (LongRequests::Refuse, _) => return Err(Error::does_not_fit(refuse)),
                (_, Some(longest)) => warnings.push(Warning::RequestsCappedByPool {
                    longest,
                    pool_tokens: kv.tokens,
                    max_model_len: self.limits.max_model_len,
                    max_model_len_fit: kv.max_model_len_fit,
                }),
                // Not one block: nothing to admit a request into.
                _ if kv.usable_blocks == 0 => return Err(Error::does_not_fit(refuse)),
                (LongRequests::CapByPool { least_tokens }, None) => {
                    return Err(Error::does_not_fit(Refusal::PoolTooSmall {
                        pool_tokens: kv.tokens,
                        least_tokens,
                        kv_bytes,
                    }))
                }
            }
        }
        let plan = Plan {
            schema: SCHEMA,
            device: self.device,
            model: self.model,
            request: self.request,
            total_bytes: b.total,
            requested_bytes: b.requested,
            consumers,
            graph: self.graph,
            kv_budget_bytes: b.kv_budget,
            kv_cache_bytes: kv_bytes,
            capped_by_free_bytes: capped_by_free,
            physical_check,
            kv_spec: self.kv_spec,
            limits: self.limits,
            max_num_seqs: self.max_num_seqs,
            tensor_parallel_size: self.tensor_parallel,
            pipeline_parallel_size: self.pipeline_parallel,
            rank: self.rank,
            kv_cache_tokens: kv.tokens,
            kv,
            sizing_rules: self.rules,
            suggestions: b.suggestions,
            foreign_bytes: self.foreign,
            ranks: None,
            engine: self.engine,
            engine_args: BTreeMap::new(),
            notes,
            warnings,
        };
        tracing::info!(kv_bytes = plan.kv_cache_bytes, tokens = plan.kv.tokens, strategy = %plan.graph.strategy, "plan ready");
        Ok(plan)
    }
}

/// Bytes of the largest KV cache whose tensors, each as the allocator takes it
/// ([`tensors_footprint`]: a large one rounded up to the granule `g`, bounded by
/// [`ALLOCATOR_ROUNDING_BOUND`]; small and mid-sized ones their share of shared segments), take
/// at most `room`: whole blocks, so the blocks the plan promises are the blocks the engine
/// holds there. `tensors`: the layout (`PlanBuilder::kv_tensors`); where it is not known,
/// `bound` (the granule once per layer) is kept instead.
fn fit_rounded(
    room: u64,
    g: Granule,
    tensors: Option<(u64, u64)>,
    bound: u64,
    a: &AllocatorConfig,
) -> u64 {
    match tensors {
        Some((tensors, page)) => pages_within(room, tensors, g, page, a)
            .saturating_mul(page)
            .saturating_mul(tensors)
            .min(room),
        None => {
            // Past the bound, what power-of-two divisions may add: the most bytes whose
            // waste still fits.
            let left = room.saturating_sub(bound);
            let mut kv = match fewest_divisions(a) {
                Some(d) => (u128::from(left) * u128::from(d) / u128::from(d + 1)) as u64,
                None => left,
            };
            while kv > 0 && kv.saturating_add(power2_waste(kv, a)) > left {
                kv -= 1;
            }
            kv
        }
    }
}

/// The fewest divisions (more than one) `roundup_power2_divisions` sets for any interval: the
/// coarsest of its roundings (`None`: it rounds nothing).
fn fewest_divisions(a: &AllocatorConfig) -> Option<u64> {
    a.roundup_power2_divisions
        .iter()
        .filter(|d| **d > 1)
        .min()
        .map(|d| u64::from(*d))
}

/// At most what power-of-two divisions add to tensors of `bytes` in all, where their sizes
/// are not known: a request in `[2^k, 2^(k+1))` rounded to one of `d` steps of `2^k / d`
/// gains less than a step, under `1/d` of itself ([`rounded_request`]).
fn power2_waste(bytes: u64, a: &AllocatorConfig) -> u64 {
    fewest_divisions(a).map_or(0, |d| bytes.div_ceil(d))
}

/// The plan's note on the caching allocator's configuration `a` the engine declared (from
/// `source`): what it changes of the KV cache's footprint, and whether this plan keeps room
/// for that rounding at all (`rounds`: a measured start-up; `mapped`: a cache mapped in
/// granules, which no allocator rounds).
fn alloc_conf_note(a: &AllocatorConfig, source: &str, rounds: bool, mapped: bool) -> String {
    let shown = a.to_string();
    let shown = if shown.is_empty() {
        "the default configuration".to_string()
    } else {
        format!("`{shown}`")
    };
    let mut effects: Vec<String> = Vec::new();
    if a.expandable_segments {
        effects.push(format!(
            "expandable segments: the KV cache's tensors packed one after another into a segment mapped in pages of {} (2 MiB for tensors up to 1 MiB)",
            fmt_bytes(expandable_page(a))
        ));
    }
    if let Some(d) = fewest_divisions(a) {
        effects.push(format!(
            "each tensor first rounded up to its power-of-two division ({d} divisions at the coarsest)"
        ));
    }
    if let Some(m) = a.max_split_size {
        effects.push(format!(
            "blocks of {} or more neither split nor shared",
            fmt_bytes(m)
        ));
    }
    if let Some(l) = a.large_segment_size {
        effects.push(format!(
            "tensors over 1 MiB and under 10 MiB in shared segments of {}",
            fmt_bytes(l)
        ));
    }
    if let Some(b) = &a.backend {
        effects.push(format!(
            "backend {b}: the driver's own pool, whose rounding the plan does not model (it keeps the caching allocator's)"
        ));
    }
    let mut note = format!("caching allocator: {shown}, from {source}");
    if effects.is_empty() {
        note.push_str(": PyTorch's default rules for the KV cache's footprint");
    } else {
        note.push_str(&format!(": {}", effects.join("; ")));
    }
    let kept: Vec<&str> = a
        .other
        .iter()
        .map(|(k, _)| k.as_str())
        .chain(
            a.garbage_collection_threshold
                .map(|_| "garbage_collection_threshold"),
        )
        .chain(
            a.max_non_split_rounding
                .map(|_| "max_non_split_rounding_mb"),
        )
        .collect();
    if !kept.is_empty() {
        note.push_str(&format!(
            " ({} do not change the KV cache's footprint)",
            kept.join(", ")
        ));
    }
    if mapped {
        note.push_str("; the KV cache is mapped in whole granules, which no allocator rounds");
    } else if !rounds {
        note.push_str("; a dry run keeps no room for the allocator's rounding of the KV cache, whatever its configuration (a measured start-up does)");
    }
    note
}

#[cfg(test)]
mod footprint_tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    /// PyTorch's default configuration.
    static D: std::sync::LazyLock<AllocatorConfig> =
        std::sync::LazyLock::new(AllocatorConfig::default);

    #[test]
    fn mid_sized_tensors_share_twenty_mib_segments() {
        // 64 tensors of 8 MiB: two per 20 MiB segment.
        assert_eq!(
            tensors_footprint(8 * MIB, 64, Granule::Multiple(2 * MIB)),
            32 * 20 * MIB
        );
        // An odd count leaves the last segment part empty.
        assert_eq!(
            tensors_footprint(8 * MIB, 3, Granule::Multiple(2 * MIB)),
            2 * 20 * MIB
        );
        // Large tensors are rounded on their own.
        assert_eq!(
            tensors_footprint(11 * MIB, 4, Granule::Multiple(2 * MIB)),
            4 * 12 * MIB
        );
        // Small ones share 2 MiB segments.
        assert_eq!(
            tensors_footprint(MIB / 2, 8, Granule::Multiple(2 * MIB)),
            2 * 2 * MIB
        );
        assert_eq!(tensors_footprint(0, 8, Granule::Multiple(2 * MIB)), 0);
        // Non-decreasing in the tensor's bytes.
        let mut last = 0;
        for kib in (1..=40 * 1024).step_by(97) {
            let f = tensors_footprint(kib * 1024, 64, Granule::Multiple(2 * MIB));
            assert!(f >= last, "{kib} KiB");
            last = f;
        }
    }

    #[test]
    fn the_fit_holds_what_the_allocator_takes() {
        // 64 layers of 8 KiB pages in 512 MiB: 8 MiB tensors would take 640 MiB; tensors of
        // 6.67 MiB go three to a segment (22 segments, 440 MiB).
        let page = 8 * 1024;
        let kv = fit_rounded(
            512 * MIB,
            Granule::Multiple(2 * MIB),
            Some((64, page)),
            0,
            &D,
        );
        let pages = kv / 64 / page;
        assert!(tensors_footprint(pages * page, 64, Granule::Multiple(2 * MIB)) <= 512 * MIB);
        assert!(tensors_footprint((pages + 1) * page, 64, Granule::Multiple(2 * MIB)) > 512 * MIB);
        assert_eq!(pages, 853);
        // Large tensors: whole granules per tensor, as before.
        let kv = fit_rounded(
            64 * 101 * MIB,
            Granule::Multiple(2 * MIB),
            Some((64, page)),
            0,
            &D,
        );
        assert_eq!(kv, 64 * 100 * MIB);
    }

    /// What a caching allocator with PyTorch's size classes reserves for `count` requests of
    /// `b` bytes (over 1 MiB), one after another: a new segment for a request below 10 MiB is
    /// 20 MiB or the request rounded up to `granule` where that is more, for a larger one the
    /// request rounded up to `granule`; a request is served from the best fitting free block
    /// first, and a block whose remainder is over 1 MiB is split.
    fn allocator_reserves(b: u64, count: u64, granule: u64) -> u64 {
        let mut free: Vec<u64> = Vec::new();
        let mut reserved = 0;
        for _ in 0..count {
            let best = (0..free.len())
                .filter(|i| free[*i] >= b)
                .min_by_key(|i| free[*i]);
            let block = match best {
                Some(i) => free.swap_remove(i),
                None => {
                    let rounded = b.div_ceil(granule) * granule;
                    let segment = if b < 10 * MIB {
                        rounded.max(20 * MIB)
                    } else {
                        rounded
                    };
                    reserved += segment;
                    segment
                }
            };
            if block - b > MIB {
                free.push(block - b);
            }
        }
        reserved
    }

    #[test]
    fn large_tensors_share_a_segment_coarser_than_them() {
        // 182 KV tensors of 14.76 MiB (K and V apart, 91 layers) where the allocator's sizes
        // read a 30 MiB granule: two share each 30 MiB segment, but a real granule of 10 MiB
        // (which the readings cannot tell from 30) gives each 20 MiB on its own.
        let b = 1889 * 8 * 1024;
        assert_eq!(allocator_reserves(b, 182, 30 * MIB), 91 * 30 * MIB);
        assert_eq!(allocator_reserves(b, 182, 10 * MIB), 182 * 20 * MIB);
        let f = tensors_footprint(b, 182, Granule::Multiple(30 * MIB));
        assert_eq!(f, 182 * 20 * MIB);
        assert!(f < 182 * 30 * MIB, "no longer a whole granule per tensor");
        // A granule finer than the request: one per segment, as before.
        assert_eq!(
            tensors_footprint(b, 182, Granule::Multiple(2 * MIB)),
            182 * 16 * MIB
        );
        // Nothing read the granule: nothing is taken to share.
        assert_eq!(
            tensors_footprint(b, 182, Granule::AtMost(30 * MIB)),
            182 * (b + 30 * MIB)
        );
    }

    #[test]
    fn mid_sized_tensors_keep_pytorchs_segments_beside_a_coarse_granule() {
        // 64 tensors of 7 MiB, a 30 MiB granule read off the allocator's sizes: PyTorch's 20
        // MiB segments (two each) take 640 MiB, more than four per 30 MiB segment (480 MiB).
        let f = tensors_footprint(7 * MIB, 64, Granule::Multiple(30 * MIB));
        assert!(f >= 32 * 20 * MIB, "{f}");
        for granule in divisors(30 * MIB).expect("small") {
            assert!(allocator_reserves(7 * MIB, 64, granule) <= f, "{granule}");
        }
    }

    #[test]
    fn mid_sized_tensors_are_not_rounded_to_the_large_granule() {
        // 178 KV tensors (K and V apart, 89 layers) of 8 KiB per block in 528.3 MiB, PyTorch's
        // 2 MiB granule: tensors of 2.85 MiB (365 blocks) go seven to a 20 MiB segment, 26 of
        // them (520 MiB); one block more and six go to one, 30 segments. Rounding each to the
        // granule (4 MiB apiece past 2 MiB) held the cache at 256 blocks, 70% of it.
        let (page, room) = (8 * 1024, 554_001_767);
        let kv = fit_rounded(room, Granule::Multiple(2 * MIB), Some((178, page)), 0, &D);
        assert_eq!(kv / 178 / page, 365);
        assert_eq!(allocator_reserves(365 * page, 178, 2 * MIB), 26 * 20 * MIB);
        assert!(allocator_reserves(366 * page, 178, 2 * MIB) > room);
    }

    #[test]
    fn divisors_are_every_divisor() {
        assert_eq!(divisors(0), None);
        let mut d = divisors(30 * MIB).expect("factors");
        d.sort_unstable();
        let by_trial: Vec<u64> = (1..=30 * MIB)
            .filter(|k| (30 * MIB).is_multiple_of(*k))
            .collect();
        assert_eq!(d, by_trial);
        assert_eq!(divisors(1), Some(vec![1]));
        // A large prime factors within the limit; a product of two primes past it does not.
        let p = 1_000_003u64;
        assert_eq!(divisors(p).map(|d| d.len()), Some(2));
        let q = 4_294_967_291u64; // the largest prime below 2^32
        assert_eq!(divisors(q * 4_294_967_279), None);
        // Where it does not factor, every tensor is rounded on its own.
        let g = q * 4_294_967_279;
        assert_eq!(
            packed_footprint(16 * MIB, 10, g, &D),
            Granule::Multiple(g).large(16 * MIB).saturating_mul(10)
        );
    }

    proptest::proptest! {
        #[test]
        fn packed_footprint_bounds_every_granule_the_readings_allow(
            blocks in 1_000u64..20_000,
            page_kib in 1u64..16,
            count in 1u64..300,
            (k, base) in (1u64..40, proptest::sample::select(vec![512u64, 64 * 1024, 512 * 1024, MIB, 2 * MIB])),
        ) {
            let b = blocks * page_kib * 1024;
            proptest::prop_assume!(b > SMALL_REQUEST);
            let g = k * base;
            let f = tensors_footprint(b, count, Granule::Multiple(g));
            for granule in divisors(g).expect("small") {
                proptest::prop_assert!(
                    allocator_reserves(b, count, granule) <= f,
                    "granule {} of {}: {} > {}", granule, g, allocator_reserves(b, count, granule), f
                );
            }
            if b >= MID_REQUEST_BELOW {
                proptest::prop_assert!(f <= Granule::Multiple(g).large(b) * count);
            }
        }

        #[test]
        fn a_bound_on_the_granule_bounds_every_granule_below_it(
            blocks in 1_000u64..20_000,
            page_kib in 1u64..16,
            count in 1u64..300,
            (bound_kib, real_kib) in (2u64..(64 * 1024)).prop_flat_map(|b| (proptest::strategy::Just(b), 1..b)),
        ) {
            let b = (blocks * page_kib * 1024).max(SMALL_REQUEST + 1);
            let f = tensors_footprint(b, count, Granule::AtMost(bound_kib * 1024));
            let real = allocator_reserves(b, count, real_kib * 1024);
            proptest::prop_assert!(real <= f, "granule {} KiB of at most {} KiB: {} > {}", real_kib, bound_kib, real, f);
        }

        /// Mid-sized tensors (over 1 MiB, under 10 MiB), where the segments are shared, with
        /// both kinds of granule.
        #[test]
        fn mid_sized_tensors_take_at_most_their_footprint(
            half_kib in 2049u64..20480,
            count in 1u64..400,
            (bound_kib, real_kib) in (2u64..(64 * 1024)).prop_flat_map(|b| (proptest::strategy::Just(b), 1..b)),
            (k, base) in (1u64..40, proptest::sample::select(vec![512u64, 64 * 1024, 512 * 1024, MIB, 2 * MIB])),
        ) {
            let b = half_kib * 512;
            let bounded = tensors_footprint(b, count, Granule::AtMost(bound_kib * 1024));
            let real = allocator_reserves(b, count, real_kib * 1024);
            proptest::prop_assert!(real <= bounded, "granule {} KiB of at most {} KiB: {} > {}", real_kib, bound_kib, real, bounded);
            let g = k * base;
            let read = tensors_footprint(b, count, Granule::Multiple(g));
            for granule in divisors(g).expect("small") {
                proptest::prop_assert!(allocator_reserves(b, count, granule) <= read, "granule {} of {}", granule, g);
            }
        }
    }

    #[test]
    fn a_default_granule_bounds_what_any_smaller_granule_takes() {
        // One backing buffer of 3.46 GiB (vLLM 0.29+), nothing measuring its allocation and
        // nothing reading the granule off the allocator's sizes: 20 MiB kept. An allocator
        // that rounds large requests to 19.5 MiB takes 182 of them (9.19 MiB past the bytes),
        // more than 177 granules of 20 MiB: rounding up to the default bounds nothing. At most
        // 20 MiB more does, for every granule up to it.
        let b = 3_711_762_432u64;
        let real = |g: u64| b.div_ceil(g) * g;
        assert!(real(19 * MIB + MIB / 2) > tensors_footprint(b, 1, Granule::Multiple(20 * MIB)));
        for g in (1..=40).map(|k| k * 512 * 1024) {
            assert!(
                real(g) <= tensors_footprint(b, 1, Granule::AtMost(20 * MIB)),
                "{g}"
            );
        }
        // A granule read off the allocator's sizes is a multiple of the real one: rounding up
        // to it bounds it, and costs no more than the bytes rounded to it.
        assert_eq!(
            tensors_footprint(b, 1, Granule::Multiple(2 * MIB)),
            real(2 * MIB)
        );
        assert!(real(MIB) <= tensors_footprint(b, 1, Granule::Multiple(2 * MIB)));
        // Fitted with the bound, the cache leaves room for any granule up to it.
        let room = 3_715_516_288u64;
        let kv = fit_rounded(room, Granule::AtMost(20 * MIB), Some((1, 458_752)), 0, &D);
        assert!(kv.div_ceil(19 * MIB + MIB / 2) * (19 * MIB + MIB / 2) <= room);
    }
}

#[cfg(test)]
#[path = "alloc_conf_tests.rs"]
mod alloc_conf_tests;
