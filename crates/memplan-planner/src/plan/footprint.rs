//! What the KV cache's tensors take once the engine's caching allocator has rounded them: the
//! allocator's rules (PyTorch's `c10/<device>/<Device>CachingAllocator.cpp`, cited at each
//! constant), the granule bounded from the allocator's own sizes, and the largest cache whose
//! rounded tensors fit a room. [`PlanBuilder`](super::PlanBuilder) keeps this room below the
//! budget; the arithmetic lives here so that the builder reads as the budget's order.

use memplan_core::bytes::MIB;
use memplan_core::kv::{AttentionKind, KvAllocation, KvSizing, KvSpec, SizingRules, SwaPools};
use memplan_core::AllocatorConfig;

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
pub(crate) const MID_SEGMENT: u64 = 20 * MIB;
/// Every request is rounded up to this (`kMinBlockSize`).
pub(super) const MIN_BLOCK: u64 = 512;

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
pub(super) fn footprint(bytes: u64, count: u64, g: Granule, a: &AllocatorConfig) -> u64 {
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
            Granule::AtMost(m) => g
                .large(b)
                .saturating_mul(count)
                .min(shared_at_most(b, count, m, a)),
        },
    }
}

/// The most `count` large requests of at most `b` bytes each take where the allocator
/// rounds each new segment by less than `g`, to a granule that need not divide it, and shares
/// its segments as PyTorch's caching allocator does: a new segment is made only where no
/// cached free block holds the request (`get_free_block` takes the best fitting one first),
/// and a block is split where the rest is over `kSmallSize` (`should_split`,
/// `c10/<device>/<Device>CachingAllocator.cpp`). So when a segment is made, every segment
/// made before it has less than one request (`b`) free, and keeps no more; the last has less
/// than its rounding free (under `g`, or a mid-sized segment where a smaller tensor took
/// one). Each segment holds at least one request: they take at most their own bytes, less
/// than `b` free beside all but one of them, and `max(g, mid-sized segment)` beside that
/// one. A bound with a granule far coarser than the tensors (120 MiB read off two of the
/// engine's own sizes, against 52 KV tensors of 17 MiB) is no longer a whole granule per
/// tensor (6.9 GiB, where no granule up to it takes more than 1.9 GiB). A declared
/// `max_split_size_mb` stops the sharing where a request or a free block can reach it (a
/// request that large is not split off a block, and a block that large is not handed to a
/// smaller request: `should_split`, `get_free_block`): `u64::MAX` then, each kept rounded on
/// its own. Every free block here is under the rounding, so one below the split limit
/// keeps the sharing.
fn shared_at_most(b: u64, count: u64, g: u64, a: &AllocatorConfig) -> u64 {
    if count == 0 {
        return 0;
    }
    let last = g.max(MID_SEGMENT).max(a.mid_segment());
    if split_stops_sharing(b, b.saturating_add(last), a) {
        return u64::MAX;
    }
    count
        .saturating_mul(2)
        .saturating_sub(1)
        .saturating_mul(b)
        .saturating_add(last)
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
    expandable_pages(b.saturating_mul(count), b <= SMALL_REQUEST, a)
}

/// `total` bytes of requests packed into an expandable segment, rounded up to its pages: the
/// small pool's where they are requests of up to `kSmallSize` (`small`), else the larger of
/// the large pool's ([`expandable_footprint`]).
fn expandable_pages(total: u64, small: bool, a: &AllocatorConfig) -> u64 {
    let up = |page: u64| total.div_ceil(page).saturating_mul(page);
    if small {
        up(SMALL_SEGMENT)
    } else {
        up(MID_SEGMENT).max(up(a.mid_segment()))
    }
}

/// The largest page an expandable segment of `a` maps for the KV cache's large tensors.
pub(super) fn expandable_page(a: &AllocatorConfig) -> u64 {
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

/// Whether a step whose allocations peaked at `bytes` made only requests the caching allocator
/// serves from its small requests' pool (PyTorch: `kSmallSize`, 1 MiB; `get_pool` hands such a
/// request to the small pool's own segments, never to a large request's).
pub fn is_small_request(bytes: u64) -> bool {
    bytes <= SMALL_REQUEST
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
    granule_bound_segments(readings, weights, MID_SEGMENT)
}

/// [`granule_bound_beside`] where the allocator's mid-sized segment is `mid_segment`
/// (`large_segment_size_mb` where the engine declared it, [`AllocatorConfig::mid_segment`]):
/// weights that reserved whole segments of either size may say nothing of the granule.
///
/// Beside one other reading, the weights are also left out where the common divisor is no
/// multiple of PyTorch's rounding ([`ALLOCATOR_ROUNDING_BOUND`]): every segment PyTorch's
/// caching allocator makes is one (`kSmallBuffer` 2 MiB, `kLargeBuffer` 20 MiB, large requests
/// rounded to `kRoundLarge` 2 MiB, `get_allocation_size`), so such a divisor shows an allocator
/// that rounds otherwise, whose mid-sized segments need not be multiples of its granule. The
/// other reading's waste cannot tell it either: a block is not split where what is left is
/// 1 MiB or less (`kSmallSize`) or the request is `max_split_size_mb` or more (`should_split`),
/// and its whole segment then reads as allocated, wasting nothing. Weights of 19 segments of
/// 64 MiB beside an activation peak of 640.5 MiB read as allocated whole (a 30.5 MiB granule
/// under a 512 MiB split limit) share 512 KiB: the plan kept 2 MiB per KV tensor, and the
/// engine's 28 tensors went 782 MiB past the request. The other reading alone bounds the
/// granule then (a request is rounded to a multiple of it): coarsely, the safe side.
///
/// Where their common divisor is a multiple of 2 MiB below a mid-sized segment, nothing shows
/// the weights' segments to be multiples of the granule, whatever the other reading wasted (no
/// waste: its block not split; 2 MiB or more: no PyTorch rounding; less: as close below a
/// multiple of any granule as PyTorch's rounding leaves one): the weights bound nothing, and
/// one reading bounds nothing (`None`: the plan keeps the mid-sized segment per KV tensor).
pub fn granule_bound_segments(
    readings: &[(u64, u64)],
    weights: Option<usize>,
    mid_segment: u64,
) -> Option<u64> {
    granule_bound_of_segments(readings, weights, mid_segment).map(GranuleBound::bytes)
}

/// What the engine's own allocations bound the allocator's granule by
/// ([`granule_bound_of_segments`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GranuleBound {
    /// The granule divides this many bytes: a size rounded up to a multiple of it is rounded
    /// up to a multiple of the granule too.
    Divides(u64),
    /// The granule is at most this many bytes, and need not divide it: a request is rounded up
    /// by less than it.
    AtMost(u64),
}

impl GranuleBound {
    /// The bound's bytes.
    pub fn bytes(self) -> u64 {
        match self {
            GranuleBound::Divides(g) | GranuleBound::AtMost(g) => g,
        }
    }
}

/// [`granule_bound_segments`], saying whether the granule divides the bound.
///
/// Weights of whole mid-sized segments beside one other reading, with a common divisor of a
/// mid-sized segment or more: a granule that coarse makes
/// its mid-sized segments of it, so the weights are multiples of it and it divides the common
/// divisor; but a granule finer than a mid-sized segment may divide the other reading and not
/// the weights' segments, and the common divisor is then no multiple of it. Weights of 300
/// segments of 20 MiB beside an activation peak that reserved 936 MiB (48 granules of
/// 19.5 MiB) share 24 MiB: a KV tensor rounded up to a multiple of 24 MiB is rounded again,
/// by 3 MiB, to the next of 19.5 MiB, and 80 of them went 248 MiB past the request. Every
/// granule the readings allow is at most the larger of the common divisor and the mid-sized
/// segment, which bounds the rounding (`AtMost`), not its steps.
pub fn granule_bound_of_segments(
    readings: &[(u64, u64)],
    weights: Option<usize>,
    mid_segment: u64,
) -> Option<GranuleBound> {
    use GranuleBound::{AtMost, Divides};
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
            let whole_segments = weights.1.is_multiple_of(MID_SEGMENT)
                || weights.1.is_multiple_of(mid_segment.max(1));
            let common = gcd(weights.1, other.1);
            if whole_segments
                && is_large_request(other.0)
                && (common <= waste || !common.is_multiple_of(ALLOCATOR_ROUNDING_BOUND))
            {
                return Some(Divides(other.1));
            }
            // Their common divisor, a multiple of 2 MiB, bounds the granule only where the
            // weights' segments are multiples of it, as PyTorch's are of its 2 MiB. The other
            // reading cannot show that: where it hides its waste (a block is not split where
            // what is left is 1 MiB or less, `kSmallSize`, or the request is
            // `max_split_size_mb` or more, `should_split`: its whole segment reads as
            // allocated), where it wasted 2 MiB or more, more than PyTorch's rounding can (an
            // allocator that rounds otherwise, whose mid-sized segments need not be multiples
            // of its granule), and where it wasted less: one request rounded to any granule
            // wastes less than one, and wastes under 2 MiB wherever its size falls that close
            // below a multiple of it. The weights then bound nothing, and one reading bounds
            // nothing either (as with fewer than two): the plan keeps the coarsest rounding
            // PyTorch's rules give one request, the mid-sized segment. Qwen2.5-0.5B's 49
            // segments of 20 MiB beside an activation peak read as its whole 564 MiB segment
            // share 4 MiB; the plan kept that per KV tensor where the granule was 6 or 12 MiB,
            // and the engine's 48 tensors took 102% of the oracle. Beside a peak of 460.8 MiB
            // that reserved 462 MiB (1.2 MiB wasted) they share 14 MiB; the plan kept that per
            // KV tensor, a granule it does not divide (any of 462 MiB's divisors from 1.2 to
            // 19.25 MiB may be it) took the cache past the oracle, and serving ran out of
            // memory. A common divisor of a mid-sized segment or more stands: an allocator
            // whose granule is that coarse makes its mid-sized segments of it (see
            // `mid_footprint`), and the weights may then be multiples of it.
            let mid = MID_SEGMENT.max(mid_segment);
            if whole_segments && is_large_request(other.0) {
                if common < mid {
                    return None;
                }
                // A granule of a mid-sized segment or more divides the common divisor; a finer
                // one need not (see `granule_bound_of_segments`).
                return all.map(|g| AtMost(g.max(mid)));
            }
        }
    }
    if readings.len() < 3 {
        return all.map(Divides);
    }
    (0..readings.len())
        .filter_map(|i| {
            let ((allocated, reserved), many) = grown[i];
            common_granule(&without(&readings, Some(i)))
                .filter(|g| many || reserved.saturating_sub(allocated) >= *g)
        })
        .chain(all)
        .max()
        .map(Divides)
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
pub(super) fn without(readings: &[(u64, u64)], left_out: Option<usize>) -> Vec<(u64, u64)> {
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

/// The most blocks a cache laid out as `t` may have and all its tensors still take at most
/// `room` once the allocator rounded them ([`footprint`]).
fn blocks_within(room: u64, t: &KvTensors, g: Granule, a: &AllocatorConfig) -> u64 {
    let (mut lo, mut hi) = (0u64, room / t.block_bytes.max(1));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if t.footprint(mid, g, a) <= room {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The KV cache's tensors as the plan fits them: a cache of `n` blocks is `count` tensors of
/// at most [`bytes_each`](Self::bytes_each)`(n)` bytes, each rounded by the engine's caching
/// allocator ([`footprint`]); or, where [`pages`](Self::pages) is set, tensors of pages of
/// different sizes, `page x n` bytes each ([`pages_footprint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KvTensors {
    /// Tensors the engine allocates for its KV cache.
    pub count: u64,
    /// Bytes one block takes across all of them.
    pub block_bytes: u64,
    /// Bytes a tensor may hold beyond its even share of the blocks (0 where the tensors are
    /// whole pages of the blocks, [`kv_layout`]).
    pub beyond: u64,
    /// Where set, the tensors are SGLang's two pools of a hybrid model, of two sizes
    /// ([`SglangPools`]), instead of `count` of an even share.
    pub pools: Option<SglangPools>,
    /// Where set, the tensors hold pages of different sizes: `(page bytes, tensors)` for each
    /// size, a cache of `n` blocks being that many tensors of `page x n` bytes each
    /// ([`per_layer_pages`]), instead of `count` of an even share.
    pub pages: Option<Vec<(u64, u64)>>,
}

/// SGLang's two pools of a hybrid model's cache as the plan counts them
/// ([`memplan_core::kv::SwaPools`]; `python/sglang/srt/mem_cache/swa_memory_pool.py`,
/// `SWAKVPool.__init__`): `per_layer` tensors (a K and a V up to 0.5.22, one of both in 0.5.23)
/// for each of `full_layers` full-attention layers, of the full pool's rows plus a padded page,
/// then the same for each of `swa_layers` sliding-window layers, of the sliding pool's rows
/// plus a padded page (`MHATokenToKVPool._create_buffers`: `size + page_size` rows). A cache
/// of `n` blocks is given `(n - 1) x page` tokens (`--max-total-tokens`), which SGLang splits
/// between the pools by its release's rule ([`SglangPools::rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SglangPools {
    /// The rule of SGLang 0.5.14 on ([`SwaPools::SglangFullPool`]), else up to 0.5.13's.
    pub full_pool: bool,
    /// Tokens per page (the block size, SGLang's `--page-size`).
    pub page: u64,
    /// Full-attention layers and the bytes a token takes in each of their tensors.
    pub full: (u64, u64),
    /// Sliding-window layers and the bytes a token takes in each of their tensors.
    pub swa: (u64, u64),
    /// Tensors per layer.
    pub per_layer: u64,
}

impl SglangPools {
    /// `(full, sliding)` rows of the pools (padded page excluded) of a cache of `blocks`
    /// blocks. SGLang's default `swa_full_tokens_ratio` 0.8 (`ServerArgs`, 0.5.9; the
    /// `fallback=0.8` of `arg_groups/fields/schedule.py`, 0.5.22) is taken as 4/5: SGLang's
    /// `int(x * 0.8)` of an integer `x` is `floor(4 x / 5)`, the float 0.8 being a little
    /// above 4/5 and a product that is not whole being at least 1/5 from one. Up to 0.5.13
    /// (`set_num_tokens_hybrid_swa` in `model_runner_kv_cache_mixin.py`, 0.5.9) the full pool
    /// holds `int(T (F + S) / (F + 0.8 S))` of the `T` tokens given, `F` and `S` the full and
    /// sliding layers' bytes per token; from 0.5.14 (`HybridSWAPoolConfigurator._solve_pool_sizes`
    /// in `pool_configurator.py`) it holds `T`; the sliding pool `int(full x 0.8)`; each
    /// floored to whole pages.
    pub(crate) fn rows(&self, blocks: u64) -> (u64, u64) {
        let page = self.page.max(1);
        let tokens = u128::from(blocks.saturating_sub(1)) * u128::from(page);
        let f = u128::from(self.full.0) * u128::from(self.full.1) * u128::from(self.per_layer);
        let s = u128::from(self.swa.0) * u128::from(self.swa.1) * u128::from(self.per_layer);
        let full = if self.full_pool || s == 0 {
            tokens
        } else {
            tokens * (f + s) * 5 / (f * 5 + s * 4)
        };
        let full = full / u128::from(page) * u128::from(page);
        let swa = full * 4 / 5 / u128::from(page) * u128::from(page);
        let cap = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        (cap(full), cap(swa))
    }

    /// What the pools' tensors of a cache of `blocks` blocks take from the driver
    /// ([`footprint`] of each pool's tensors).
    fn footprint(&self, blocks: u64, g: Granule, a: &AllocatorConfig) -> u64 {
        let (full, swa) = self.rows(blocks);
        let pool = |rows: u64, (layers, row): (u64, u64)| {
            let each = rows.saturating_add(self.page).saturating_mul(row);
            footprint(each, layers.saturating_mul(self.per_layer), g, a)
        };
        pool(full, self.full).saturating_add(pool(swa, self.swa))
    }
}

impl KvTensors {
    /// `count` tensors of `n x page` bytes for a cache of `n` blocks ([`kv_layout`]).
    pub(crate) fn equal(count: u64, page: u64) -> Self {
        KvTensors {
            count,
            block_bytes: count.saturating_mul(page),
            beyond: 0,
            pools: None,
            pages: None,
        }
    }

    /// The most bytes one tensor of a cache of `blocks` blocks holds: an even share of the
    /// blocks' bytes, rounded up, and [`beyond`](Self::beyond).
    pub(crate) fn bytes_each(&self, blocks: u64) -> u64 {
        let share = (u128::from(blocks) * u128::from(self.block_bytes))
            .div_ceil(u128::from(self.count.max(1)));
        u64::try_from(share)
            .unwrap_or(u64::MAX)
            .saturating_add(self.beyond)
    }

    /// What the tensors of a cache of `blocks` blocks take from the driver ([`footprint`]).
    /// Tensors whose bytes are bounds ([`beyond`](Self::beyond) > 0: SGLang's pools, whose
    /// real sizes the plan does not model exactly, [`swa_pools`]) are each taken rounded up by
    /// less than the granule (as the plan kept for them before their layout was modelled),
    /// not to a multiple of it: a large tensor keeps a whole granule, and only small and
    /// mid-sized ones, which share the allocator's segments, keep less. Where the granule is
    /// one the allocator rounds to a multiple of ([`Granule::Multiple`]), a large tensor's
    /// bound is rounded instead ([`bounded_tensors_alone`]): rounding is monotone, so no
    /// tensor within the bound takes more.
    pub(crate) fn footprint(&self, blocks: u64, g: Granule, a: &AllocatorConfig) -> u64 {
        if let Some(p) = self.pools {
            return p.footprint(blocks, g, a);
        }
        if let Some(pages) = &self.pages {
            return pages_footprint(pages, blocks, g, a);
        }
        let each = self.bytes_each(blocks);
        match g {
            Granule::Multiple(m) if self.beyond > 0 => {
                let kept = footprint(each, self.count, Granule::AtMost(m), a);
                bounded_tensors_alone(each, self.count, m, a).map_or(kept, |alone| kept.min(alone))
            }
            g => footprint(each, self.count, g, a),
        }
    }
}

/// The most `count` tensors of at most `bytes` each take where the allocator rounds a large
/// request on its own to a multiple of a granule that divides `g` (a measured granule, or one
/// read off the allocator's own sizes, [`Granule::Multiple`]): each rounded on its own, none
/// sharing a segment. A request and its rounding to a multiple of a granule only grow with
/// the request (PyTorch: `round_size`, then `get_allocation_size` rounds a request of
/// `kMinLargeAlloc` and more to `kRoundLarge`), and a granule that divides `g` rounds no
/// request above its rounding to `g`: so a tensor within the bound that is large takes at
/// most the bound rounded to `g`. One that is smaller than the bound may fall below
/// `kMinLargeAlloc` and take a mid-sized segment (`kLargeBuffer`, or a coarser granule's
/// rounding of it) instead: each is kept the larger of the two. `None` where the bound is no
/// large request, or the allocator packs tensors into an expandable segment
/// ([`expandable_footprint`], which bounds them itself).
fn bounded_tensors_alone(bytes: u64, count: u64, g: u64, a: &AllocatorConfig) -> Option<u64> {
    let b = rounded_request(bytes, a);
    if b < MID_REQUEST_BELOW || a.expandable_segments {
        return None;
    }
    let large = Granule::Multiple(g);
    let mid = a
        .mid_segment()
        .max(large.large(rounded_request(MID_REQUEST_BELOW - 1, a)));
    Some(large.large(b).max(mid).saturating_mul(count))
}

/// The KV cache's tensors as the plan fits them: the layout of whole pages where there is one
/// ([`kv_layout`]), else SGLang's per-layer tensors of a hybrid sliding-window cache
/// ([`swa_pools`]); `None` where neither describes the engine's tensors.
pub(crate) fn kv_fit_layout(spec: &KvSpec, s: &KvSizing, rules: &SizingRules) -> Option<KvTensors> {
    if spec.in_sglang_pools(rules) {
        return sglang_pools(spec, s, rules);
    }
    match kv_layout(spec, s, rules) {
        Some((tensors, page)) => Some(KvTensors::equal(tensors, page)),
        None => per_layer_pages(spec, s, rules).or_else(|| swa_pools(spec, s, rules)),
    }
}

/// The KV tensors of one KV-cache group whose layers have pages of different sizes, one
/// tensor per layer ([`KvAllocation::PerTensor`], vLLM v1 up to 0.28). vLLM lays layers that
/// all keep every token (full attention, MLA), whatever their pages, out as one group
/// (`UniformTypeKVCacheSpecs`, whose page is the sum of the layers' pages), and
/// `get_kv_cache_config_from_groups` (`vllm/v1/core/kv_cache_utils.py`) makes one
/// `KVCacheTensor` per layer of that layer's `page_size_bytes * num_blocks`, which
/// `GPUModelRunner._allocate_kv_cache_tensors` (`vllm/v1/worker/gpu_model_runner.py`) allocates
/// as one `torch.zeros` each. So every tensor's size is a known multiple of the block count,
/// and each is rounded by the caching allocator on its own ([`pages_footprint`]).
///
/// `None` where the engine allocates otherwise, where the cache is more than one group, or
/// where the block is not the sum of every layer's page (the sizing laid the cache out some
/// other way).
fn per_layer_pages(spec: &KvSpec, s: &KvSizing, rules: &SizingRules) -> Option<KvTensors> {
    if rules.kv_allocation != KvAllocation::PerTensor || s.num_groups != 1 || s.block_bytes == 0 {
        return None;
    }
    let mut pages: Vec<(u64, u64)> = Vec::new();
    let (mut block, mut count) = (0u64, 0u64);
    for g in spec.groups.iter().filter(|g| g.num_layers > 0) {
        let page = g.page_bytes(spec.dtype, spec.block_size).ok()?;
        let layers = u64::from(g.num_layers);
        block = block.checked_add(page.checked_mul(layers)?)?;
        count = count.checked_add(layers)?;
        match pages.iter_mut().find(|(p, _)| *p == page) {
            Some((_, n)) => *n += layers,
            None => pages.push((page, layers)),
        }
    }
    if block != s.block_bytes || pages.len() < 2 || pages.iter().any(|(p, _)| *p == 0) {
        return None;
    }
    Some(KvTensors {
        count,
        block_bytes: block,
        beyond: 0,
        pools: None,
        pages: Some(pages),
    })
}

/// What tensors of pages of different sizes (`(page bytes, tensors)` each) take from the
/// driver for a cache of `blocks` blocks, each tensor `page x blocks` bytes. Where the
/// allocator packs them into an expandable segment, their rounded requests lie one after
/// another ([`expandable_footprint`] of their sum, in each pool). Otherwise each large request
/// is rounded as `g` says and takes at most its own segment: the caching allocator makes a new
/// segment only for a request no cached block holds, of that request's rounding
/// (PyTorch: `get_allocation_size`), so the segments made number at most the requests and
/// none is larger than its request's rounding, however tensors of different sizes then share
/// them. Small and mid-sized requests of different sizes need not pack as each size alone
/// would (a 6 MiB, an 8 MiB and a 6 MiB tensor fill a 20 MiB segment and leave the next 8 MiB
/// one a new segment), so each is taken to make its own segment, the largest any granule
/// allows ([`footprint`] of that one request).
pub(crate) fn pages_footprint(
    pages: &[(u64, u64)],
    blocks: u64,
    g: Granule,
    a: &AllocatorConfig,
) -> u64 {
    let sizes = || {
        pages
            .iter()
            .map(move |(p, n)| (p.saturating_mul(blocks), *n))
    };
    if a.expandable_segments {
        let (mut small, mut large) = (0u64, 0u64);
        for (bytes, n) in sizes() {
            let b = rounded_request(bytes, a);
            let pool = if b <= SMALL_REQUEST {
                &mut small
            } else {
                &mut large
            };
            *pool = pool.saturating_add(b.saturating_mul(n));
        }
        return expandable_pages(small, true, a).saturating_add(expandable_pages(large, false, a));
    }
    sizes()
        .map(|(bytes, n)| {
            let b = rounded_request(bytes, a);
            let one = if b >= MID_REQUEST_BELOW {
                g.large(b)
            } else {
                footprint(bytes, 1, g, a)
            };
            one.saturating_mul(n)
        })
        .fold(0u64, u64::saturating_add)
}

/// SGLang's KV tensors for a cache of full-attention and sliding-window layers whose K and V
/// are allocated per layer ([`KvAllocation::SplitKv`], SGLang 0.5.1 to 0.5.22;
/// [`KvAllocation::PairedKv`], 0.5.23), as its own allocation code makes them:
/// `python/sglang/srt/mem_cache/swa_memory_pool.py` `SWAKVPool.__init__` builds two
/// `MHATokenToKVPool`s, one of `size` tokens for the full-attention layers and one of
/// `size_swa` tokens for the sliding-window layers (read in the 0.5.9, 0.5.22 and 0.5.23
/// wheels); each gives every one of its layers the same buffers, `_create_buffers`
/// (0.5.9) / `_create_buffers_normal` (0.5.22, 0.5.23) in `memory_pool.py`: a K and a V
/// `torch.zeros((size + page_size, head_num, head_dim))` per layer up to 0.5.22, and in 0.5.23
/// one `torch.zeros((2, padded, head_num, head_dim))` per layer where K's and V's shapes match
/// (`padded` the same rows aligned to a page). So where every layer has pages of one size (and
/// K and V of one size where they are apart), every tensor has the same bytes per token.
///
/// This is the layout where the rules size this cache with vLLM's grouping
/// ([`SwaPools::Groups`]: rules that do not name SGLang's pools); where they do, the pools are
/// sized as SGLang sizes them ([`sglang_pools`]). Both pools are taken to hold the plan's
/// tokens, which bounds either of SGLang's splits (`swa_full_tokens_ratio`: the bytes of every
/// layer holding them, or fewer). A
/// pool of the plan's tokens, `(n - 1) / groups x block size` for `n` blocks, plus its padded
/// page is at most an even share of the `n` blocks' bytes over the tensors (the groups hold
/// at least every layer, `ceil` of each kind's layers over the group size) plus one page of
/// the tensor: [`KvTensors::beyond`]. `None` where a layer is not full or sliding-window
/// attention (MLA, an indexer, a recurrent state: pools SGLang builds otherwise), where pages
/// differ in size between layers, or where K and V differ in size.
fn swa_pools(spec: &KvSpec, s: &KvSizing, rules: &SizingRules) -> Option<KvTensors> {
    let kind = rules.kv_allocation;
    if !matches!(kind, KvAllocation::SplitKv | KvAllocation::PairedKv) {
        return None;
    }
    let live = || spec.groups.iter().filter(|g| g.num_layers > 0);
    if !live().all(|g| {
        matches!(
            g.attention,
            AttentionKind::Full | AttentionKind::SlidingWindow { .. }
        )
    }) {
        return None;
    }
    let per_layer = kind.equal_tensors_per_layer(&spec.groups)?;
    let mut pages = live().map(|g| g.page_bytes(spec.dtype, spec.block_size).ok());
    let page = pages.next()??;
    if !pages.all(|p| p == Some(page)) || !page.is_multiple_of(per_layer) || s.block_bytes == 0 {
        return None;
    }
    let count = kind.allocations(&spec.groups);
    (count > 0).then_some(KvTensors {
        count,
        block_bytes: s.block_bytes,
        beyond: page / per_layer,
        pools: None,
        pages: None,
    })
}

/// SGLang's two pools of a hybrid model where the rules say the engine keeps them
/// ([`KvSpec::in_sglang_pools`], [`SglangPools`]), its K and V per layer
/// ([`KvAllocation::SplitKv`], [`KvAllocation::PairedKv`]). `None` (the plan then keeps a
/// granule per allocation) where the full layers' tensors, or the sliding layers', differ in
/// size, or K and V differ in size.
fn sglang_pools(spec: &KvSpec, s: &KvSizing, rules: &SizingRules) -> Option<KvTensors> {
    let kind = rules.kv_allocation;
    if !matches!(kind, KvAllocation::SplitKv | KvAllocation::PairedKv) || s.block_bytes == 0 {
        return None;
    }
    let per_layer = kind.equal_tensors_per_layer(&spec.groups)?;
    let bs = u64::from(spec.block_size).max(1);
    let (mut full, mut swa) = ((0u64, None), (0u64, None));
    for g in spec.groups.iter().filter(|g| g.num_layers > 0) {
        let page = g.page_bytes(spec.dtype, spec.block_size).ok()?;
        if !page.is_multiple_of(bs * per_layer) {
            return None;
        }
        let row = page / bs / per_layer;
        let pool = match g.attention {
            AttentionKind::Full => &mut full,
            AttentionKind::SlidingWindow { .. } => &mut swa,
            _ => return None,
        };
        if pool.1.is_some_and(|r| r != row) {
            return None;
        }
        *pool = (pool.0 + u64::from(g.num_layers), Some(row));
    }
    let count = (full.0 + swa.0).checked_mul(per_layer)?;
    Some(KvTensors {
        count,
        block_bytes: s.block_bytes,
        beyond: 0,
        pools: Some(SglangPools {
            full_pool: rules.swa_pools == SwaPools::SglangFullPool,
            page: bs,
            full: (full.0, full.1?),
            swa: (swa.0, swa.1?),
            per_layer,
        }),
        pages: None,
    })
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
    if spec.in_sglang_pools(rules) {
        // SGLang's two pools: tensors of two sizes ([`sglang_pools`]), not whole pages.
        return None;
    }
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

/// Bytes of the largest KV cache whose tensors, each as the allocator takes it
/// ([`tensors_footprint`]: a large one rounded up to the granule `g`, bounded by
/// [`ALLOCATOR_ROUNDING_BOUND`]; small and mid-sized ones their share of shared segments), take
/// at most `room`: whole blocks, so the blocks the plan promises are the blocks the engine
/// holds there. `tensors`: the layout (`PlanBuilder::kv_tensors`), every tensor's size a known
/// function of the block count; where it is not known, `bound` (the granule once per layer)
/// is kept instead, and with power-of-two divisions `1/(d+1)` of the rest, the most a request
/// of unknown size may gain.
pub(super) fn fit_rounded(
    room: u64,
    g: Granule,
    tensors: Option<&KvTensors>,
    bound: u64,
    a: &AllocatorConfig,
) -> u64 {
    match tensors {
        Some(t) => blocks_within(room, t, g, a)
            .saturating_mul(t.block_bytes)
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
pub(crate) fn fewest_divisions(a: &AllocatorConfig) -> Option<u64> {
    a.roundup_power2_divisions
        .iter()
        .filter(|d| **d > 1)
        .min()
        .map(|d| u64::from(*d))
}

/// At most what power-of-two divisions add to tensors of `bytes` in all, where their sizes
/// are not known: a request in `[2^k, 2^(k+1))` rounded to one of `d` steps of `2^k / d`
/// gains less than a step, under `1/d` of itself ([`rounded_request`]).
pub(super) fn power2_waste(bytes: u64, a: &AllocatorConfig) -> u64 {
    fewest_divisions(a).map_or(0, |d| bytes.div_ceil(d))
}

#[cfg(test)]
#[path = "footprint_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "alloc_conf_tests.rs"]
mod alloc_conf_tests;
