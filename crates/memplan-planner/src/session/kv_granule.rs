//! The allocator's granule, measured on KV caches smaller than planned, and the KV cache's
//! count by it: the part of the KV cache hand-over ([`super::kv_cache`]) used where one tensor's
//! measure ([`count_by_one_tensor`](super::kv_cache::count_by_one_tensor)) does not hold (the
//! engine's allocator offers no tensors, or the planned tensors are not rounded alone).
//!
//! The allocator's granule is measured on caches of at most half the planned blocks
//! ([`granule`]), so that the full-size allocation does not go
//! past what the plan kept even for an instant where the allocator rounds more coarsely than
//! the plan assumed: an allocator that rounds every allocation up to a multiple of a granule
//! gives rounded sizes that are all multiples of it, so their greatest common divisor bounds
//! it from above. Where the planned tensors are large enough for the allocator to round each
//! on its own ([`is_large_request`](crate::plan::is_large_request)), caches whose tensors are
//! not are left out: packed into shared segments, their sizes can read as a granule the
//! planned tensors are not rounded to. Sizes between a quarter and half the planned tensors
//! can all round to one multiple of the granule (10 to 15 MiB tensors all read 15 MiB on a
//! 7.5 MiB granule), so one more cache follows, its tensors just past a multiple of what they
//! read ([`probe_count`]): a finer granule rounds it to other than the next multiple. It can
//! be larger than half the planned cache, and is allocated only where its tensors, rounded up
//! to the common divisor read so far (which every fixed granule divides), fit in what the
//! plan kept. The planned count is then cut to what fits with that granule
//! ([`count_by_granule`]) before it is allocated. Where the plan is this rank's own
//! ([`Planned::grows`]) and its tensors are rounded alone, the count also grows to what fits in
//! what the plan kept with that granule, where it is finer than the rounding the plan kept
//! room for: an engine that offers only the hook gets a plan that keeps, per tensor, the
//! coarsest granule its start-up allowed (nothing measured the allocation before the plan),
//! and the measurement replaces that bound. A plan combined from every rank's never grows (a
//! rank would hold more than the others planned). Where every cache read one rounded size, the
//! cache past it does not fit (planned tensors under twice a coarse granule) and the sizes
//! read allow no granule as fine as the one the plan kept room for, that size still bounds
//! the granule from above ([`Granule::Bounded`]): the planned count is cut to what fits by it,
//! never grown, so that the full cache is not allocated past the room on a granule nothing
//! narrowed. Only an allocator whose rounding is not a
//! fixed granule (or a cache whose tensors are not all of one size) leaves the count as
//! planned, and the shrinking of the hand-over's attempts is what protects it; a cut or grown
//! count whose cache takes other than the granule predicted is released, and the planned count
//! allocated.
//!
//! [`Planned::grows`]: super::kv_cache::Planned::grows

use memplan_core::Result;

use crate::engine::Engine;
use crate::session::Recorder;

use super::kv_cache::{attempt, Allocating, Attempt};

/// Most allocations [`granule`] makes: up to one less of at most half the planned cache, then
/// one just past a multiple of the common divisor those read ([`probe_count`]). The smaller
/// ones step down from half the planned blocks by one, two, four, ... times one and a quarter
/// of the plan's rounding bound ([`granule_counts`]), never below a quarter of the planned
/// blocks (the last is a quarter where the steps reach it): sizes that far apart cross any
/// granule up to the tensors' own size at least once, and three distinct rounded sizes are
/// enough to narrow the common divisor to the granule in practice. Where they all read one
/// size (a granule that divides it and that every size between a quarter and half rounds to
/// the same multiple of), the last one tells the granule apart from that size.
pub const GRANULE_ATTEMPTS: usize = 9;

/// Distinct rounded sizes [`granule`] stops at.
const GRANULE_SIZES: usize = 3;

/// What measured allocations say about the allocator's granule: `sizes` are `(own bytes,
/// rounded bytes)` of one tensor each. A granule every rounded size is a multiple of, and
/// larger than every waste (a rounding up wastes less than one granule): the greatest common
/// divisor of the rounded sizes, an upper bound of any fixed granule that gave them. `None`
/// until two rounded sizes differ, or where the sizes contradict rounding to a granule.
pub(crate) fn granule_of(sizes: &[(u64, u64)]) -> Option<u64> {
    let (first, rest) = sizes.split_first()?;
    if rest.iter().all(|s| s.1 == first.1) {
        return None;
    }
    divisor_bound(sizes).map(|(g, _)| g)
}

/// The most blocks, at most `planned`, whose `tensors` tensors of `n x page` bytes, each
/// rounded up to `granule`, fit in `room`; with what the planned blocks would take so rounded.
pub(crate) fn certified_blocks(
    planned: u64,
    (tensors, page): (u64, u64),
    granule: u64,
    room: u64,
) -> (u64, u64) {
    let fit = blocks_within((tensors, page), granule, room).min(planned);
    (fit, rounded_takes(planned, (tensors, page), granule))
}

/// The most blocks whose `tensors` tensors of `n x page` bytes, each rounded up to `granule`,
/// fit in `room`.
pub(crate) fn blocks_within((tensors, page): (u64, u64), granule: u64, room: u64) -> u64 {
    let granule = granule.max(1);
    let per_tensor = room / tensors.max(1) / granule * granule;
    per_tensor / page.max(1)
}

/// What `blocks` blocks take when each of the `tensors` tensors of `blocks x page` bytes is
/// rounded up to `granule`.
pub(crate) fn rounded_takes(blocks: u64, (tensors, page): (u64, u64), granule: u64) -> u64 {
    let granule = granule.max(1);
    blocks
        .saturating_mul(page)
        .div_ceil(granule)
        .saturating_mul(granule)
        .saturating_mul(tensors)
}

/// The block counts [`granule`] allocates first, in order, for a planned cache of `planned`
/// blocks of `page` bytes per tensor (see [`GRANULE_ATTEMPTS`]). They stay between a quarter and half
/// the planned cache: within a factor of two of the full tensors, where an allocator rounds
/// large allocations one way (smaller ones may go to other segment sizes, which say nothing
/// of the full cache's granule).
pub(crate) fn granule_counts(planned: u64, page: u64) -> Vec<u64> {
    let half = planned / 2;
    let quarter = (planned / 4).max(1);
    // A step of one and a quarter rounding bounds: sizes steps apart then differ by odd
    // multiples of a quarter of it, and their rounded sizes resolve a granule finer than the
    // bound (steps of exactly 2 MiB leave sizes 2 MiB apart, whose common divisor stops at
    // 1 MiB where the allocator rounds to 512 KiB: the cache was cut by a granule twice the
    // real one, and the engine served fewer blocks than its allocation would have held).
    let bound = crate::plan::ALLOCATOR_ROUNDING_BOUND;
    let step = bound.saturating_add(bound / 4).div_ceil(page.max(1)).max(1);
    let mut counts: Vec<u64> = Vec::with_capacity(GRANULE_ATTEMPTS - 1);
    let mut cut = 0u64;
    // The last attempt is the cache past a multiple of what these read ([`probe_count`]).
    for _ in 0..GRANULE_ATTEMPTS - 1 {
        let n = half.saturating_sub(cut).max(quarter);
        if n == 0 || counts.last() == Some(&n) {
            break;
        }
        counts.push(n);
        cut = if cut == 0 {
            step
        } else {
            cut.saturating_mul(2)
        };
    }
    counts
}

/// What [`granule`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Granule {
    /// The engine does not offer the hook.
    NotOffered,
    /// No fixed granule measured (see [`granule_of`]), or an attempt ran out of memory.
    Unknown,
    /// The allocator rounds each tensor to (a divisor of) this many bytes.
    Measured(u64),
    /// Every cache measured read one rounded size per tensor, and no cache past a multiple of
    /// it fitted: the allocator rounds each tensor to a divisor of this many bytes (that size,
    /// or the common divisor of the sizes), which may be coarser than the granule. A bound for
    /// cutting the planned count only (see [`by_granule`]).
    Bounded(u64),
}

/// Measure the allocator's granule on caches of at most half the planned blocks, then on one
/// just past a multiple of what they read (see the module docs): each is allocated by the
/// engine, measured and released. Half the cache plus one granule per tensor fits in what the
/// plan kept unless the granule is larger than half the cache's tensors: these allocations
/// stay inside the room where the full one may not. See [`measure_granule`].
fn granule(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    way: &mut Allocating,
    planned: u64,
    (tensors, page): (u64, u64),
    (room, bound): (u64, u64),
) -> Result<Granule> {
    measure_granule(planned, (tensors, page), (room, bound), |n| {
        let a = attempt(rec, engine, way, n, tensors.saturating_mul(page))?;
        if let Attempt::Took(t) = a {
            way.release(engine)?;
            tracing::debug!(n, t, tensors, "the KV cache's granule: one allocation");
        }
        Ok(a)
    })
}

/// [`granule`] with the allocations made by `take(n)`: a cache of `n` blocks (`tensors`
/// tensors of `n x page` bytes), allocated, measured and released.
///
/// First the caches of [`granule_counts`], between a quarter and half the planned blocks,
/// until [`GRANULE_SIZES`] distinct rounded sizes. Their sizes can all round to one size where
/// the granule is finer than the common divisor they share: tensors of 10, 12.5 and 15 MiB all
/// read 15 MiB on a 7.5 MiB granule as on a 15 MiB one, and the granule stayed unknown (the
/// cache kept the plan's coarser bound, 20% short of the room). So one more cache follows
/// ([`probe_count`]): its tensors just past a multiple of the common divisor `d` read so far,
/// which every fixed granule divides; a granule `g` of `d` rounds them to that multiple plus
/// `g`, so the common divisor falls to `g` where it is finer, and stays where it is `d`. Its
/// tensors are rounded to at most that multiple plus `d`, and it is allocated only where
/// that fits in `room`: even where the cache is larger than half the planned one, it does not
/// pass what the plan kept, by the granule the smaller caches measured.
///
/// `bound` is the coarsest granule the plan kept room for (0: none known). A granule at least
/// twice a tensor's size leaves room in each segment for another tensor of that size, which
/// the caching allocator serves from it (PyTorch: `should_split`, `get_free_block`): such
/// tensors share segments, and what each takes on average is no rounding of it (12 MiB
/// tensors two to a 24 MiB segment read 12 MiB each, as on a 12 MiB granule; the cache grown by
/// that granule took a third more than it predicted, past the request). So a cache whose
/// tensors are at most half the bound says nothing of the granule: not recorded.
pub(crate) fn measure_granule(
    planned: u64,
    (tensors, page): (u64, u64),
    (room, bound): (u64, u64),
    mut take: impl FnMut(u64) -> Result<Attempt>,
) -> Result<Granule> {
    let tensors = tensors.max(1);
    let mut sizes: Vec<(u64, u64)> = Vec::new();
    // Tensors served in part from segments the allocator had cached (it took less than
    // their own bytes), of unequal sizes, or small enough to share segments of the bound,
    // say nothing of the granule: skipped.
    let record = |sizes: &mut Vec<(u64, u64)>, own: u64, t: u64| {
        let may_share = own.saturating_mul(2) <= bound;
        if t.is_multiple_of(tensors) && t / tensors >= own && !may_share {
            sizes.push((own, t / tensors));
        }
    };
    // Tensors too small for the allocator to round on their own (they share segments) say
    // nothing of the granule of planned tensors it does round on their own: their packing can
    // look like a coarse granule (7 MiB tensors two to a 20 MiB segment and 5 MiB ones four to
    // one read as a 5 MiB granule, where 14 MiB tensors are rounded to 2 MiB), and the cache
    // was cut by it. Such counts are not measured; with none left the planned count is
    // allocated as planned, and the attempts below cut it where it takes more.
    let planned_large = crate::plan::is_large_request(planned.saturating_mul(page));
    for n in granule_counts(planned, page) {
        let own = n.saturating_mul(page);
        if planned_large && !crate::plan::is_large_request(own) {
            continue;
        }
        match take(n)? {
            Attempt::NotOffered => return Ok(Granule::NotOffered),
            Attempt::OutOfMemory => return Ok(Granule::Unknown),
            Attempt::Took(t) => record(&mut sizes, own, t),
        }
        let mut distinct: Vec<u64> = sizes.iter().map(|s| s.1).collect();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() >= GRANULE_SIZES {
            break;
        }
    }
    // The cache just past a multiple of what the caches above read: only where the planned
    // tensors are rounded on their own (smaller ones share segments, whose sizes the common
    // divisor does not bound).
    let probe = if planned_large {
        divisor_bound(&sizes).and_then(|(d, _)| probe_count(planned, (tensors, page), d, room))
    } else {
        None
    };
    if let Some(n) = probe {
        match take(n)? {
            Attempt::NotOffered => return Ok(Granule::NotOffered),
            // A cache the measured granule says fits ran out of memory: the allocator does
            // not round to that granule, and nothing measured stands.
            Attempt::OutOfMemory => return Ok(Granule::Unknown),
            Attempt::Took(t) => record(&mut sizes, n.saturating_mul(page), t),
        }
    }
    let g = granule_of(&sizes);
    tracing::info!(?sizes, granule = ?g, ?probe, "the allocator's granule, measured on KV caches of at most half the planned blocks and one just past a multiple of what they read");
    Ok(match (g, divisor_bound(&sizes)) {
        (Some(g), _) => Granule::Measured(g),
        (None, Some((d, waste))) if !kept_granule_fits(d, waste, bound) => Granule::Bounded(d),
        _ => Granule::Unknown,
    })
}

/// Whether the sizes read (all rounded to divisors of `d`, wasting at most `waste`) allow a
/// granule no coarser than the one the plan kept room for (`bound`; PyTorch's 2 MiB where it
/// kept none): a divisor of `d` larger than `waste` (a rounding up wastes less than one
/// granule) and at most `bound`.
/// One tensor of 11 MiB read at 12 MiB allows 2 MiB (and 1.5, 3, 4, 6 and 12 MiB): nothing
/// contradicts the plan. Tensors of 11.5 and 14 MiB both read at 15.5 MiB allow only 5.17,
/// 7.75 and 15.5 MiB: the plan's 2 MiB is contradicted, and `d` bounds the rounding instead.
/// Where too many divisors would have to be tried, the plan is taken as not contradicted.
fn kept_granule_fits(d: u64, waste: u64, bound: u64) -> bool {
    let bound = if bound == 0 {
        crate::plan::ALLOCATOR_ROUNDING_BOUND
    } else {
        bound
    };
    // `g = d / k` with `waste < g <= bound`: `k` from `ceil(d / bound)` to `floor((d - 1) / waste)`.
    let first = d.div_ceil(bound.max(1)).max(1);
    let last = (d - 1).checked_div(waste).unwrap_or(d);
    if last < first {
        return false;
    }
    if last - first > 1 << 20 {
        return true;
    }
    (first..=last).any(|k| d.is_multiple_of(k))
}

/// The common divisor of the rounded sizes read so far where it exceeds every waste (one size
/// is enough: a fixed granule divides it), with the largest waste: every fixed granule that
/// gave them divides it and exceeds that waste.
/// `None` with no sizes, or where they contradict rounding to a granule.
fn divisor_bound(sizes: &[(u64, u64)]) -> Option<(u64, u64)> {
    let g = sizes.iter().fold(0, |g, s| crate::plan::gcd(g, s.1));
    let waste = sizes
        .iter()
        .map(|s| s.1.checked_sub(s.0))
        .try_fold(0u64, |w, x| x.map(|x| w.max(x)))?;
    (!sizes.is_empty() && g > waste).then_some((g, waste))
}

/// The blocks of the cache [`measure_granule`] allocates after the half-size ones, where `d`
/// is the common divisor of their rounded sizes: the fewest whose tensors pass the first
/// multiple of `d` at or above half the planned tensor (`m x d`), so that a granule finer than
/// `d` rounds them to other than a multiple of it. Where `(m + 1) x d` per tensor would not fit
/// in `room`, or the tensors would pass the planned ones, `m` is lowered; `None` where no such
/// cache fits, would be smaller than a quarter of the planned one or too small for the
/// allocator to round its tensors on their own.
pub(crate) fn probe_count(
    planned: u64,
    (tensors, page): (u64, u64),
    d: u64,
    room: u64,
) -> Option<u64> {
    let (page, d) = (page.max(1), d.max(1));
    let half = (planned / 2).saturating_mul(page);
    let per_tensor = room / tensors.max(1);
    let m = half
        .div_ceil(d)
        .max(1)
        .min((per_tensor / d).saturating_sub(1))
        .min(planned.saturating_mul(page).saturating_sub(1) / d);
    if m == 0 {
        return None;
    }
    // The fewest blocks whose tensors pass `m x d`.
    let n = m.saturating_mul(d) / page + 1;
    let own = n.saturating_mul(page);
    let fits = rounded_takes(n, (tensors, page), d) <= room;
    (n <= planned && n >= planned / 4 && crate::plan::is_large_request(own) && fits).then_some(n)
}

/// The planned count cut to what fits in `limit`, or grown to what fits in `room` where
/// `grow`, with the allocator's granule measured on smaller caches ([`granule`], never past
/// `room`; see [`count_by_granule`]): `Some(None)` where the count stays as planned or no
/// granule was measured, `Some(Some((count, what the planned count takes, what the count
/// takes)))` by that granule where it changes, `None` where the engine does not offer the hook.
pub(super) fn by_granule(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    way: &mut Allocating,
    planned: u64,
    l: (u64, u64),
    (limit, room, bound): (u64, u64, u64),
    grow: bool,
) -> Result<Option<Option<(u64, u64, u64)>>> {
    match granule(rec, engine, way, planned, l, (room, bound))? {
        Granule::NotOffered => Ok(None),
        Granule::Unknown => Ok(Some(None)),
        // One rounded size bounds the granule from above, but only coarsely: it may cut the
        // planned count (the full cache allocated as planned could pass the room before its
        // attempt reads what it took: 4,096 tensors of 28 MiB, each read at 15.5 MiB on the
        // caches of half the blocks, went 10.9 GiB past the request in the attempt), never
        // grow it.
        Granule::Bounded(d) => {
            let got = count_by_granule(planned, l, d, limit, None);
            if let Some((count, planned_takes, _)) = got {
                tracing::info!(planned, count, planned_takes, bound = d, "the KV cache's count by the rounded size its smaller caches read: what fits once its tensors are rounded to it");
            }
            Ok(Some(got))
        }
        Granule::Measured(g) => {
            let got = count_by_granule(planned, l, g, limit, grow.then_some(room));
            if let Some((count, planned_takes, _)) = got {
                tracing::info!(planned, count, planned_takes, granule = g, "the KV cache's count by the measured granule: what fits once its tensors are rounded to it");
            }
            Ok(Some(got))
        }
    }
}

/// The count of blocks of `planned` tensors `l` by a measured granule `g` (a bound of any fixed
/// granule, [`granule_of`]), where it differs from `planned`: `(count, what the planned count
/// takes, what the count takes)` by `g`.
///
/// Where the planned count would take more than `limit`, it is cut to what fits. Where `grow`
/// gives a room (the plan is this rank's own, see
/// [`Planned::grows`](super::kv_cache::Planned::grows)) and the planned tensors are large
/// enough for the allocator to round each on its own
/// ([`is_large_request`](crate::plan::is_large_request)), it grows to the most blocks that fit
/// in that room by `g`: the plan kept room for rounding each tensor to a coarser bound than
/// the allocator rounds it to (where nothing it offers measures its rounding before the plan,
/// the coarsest granule the engine's start-up allowed), and the measurement replaces that
/// bound. `g` bounds every fixed granule that gave the measured sizes, so what the count
/// takes by it is at most the room; the attempt checks it.
pub(crate) fn count_by_granule(
    planned: u64,
    l: (u64, u64),
    g: u64,
    limit: u64,
    grow: Option<u64>,
) -> Option<(u64, u64, u64)> {
    let (fit, planned_takes) = certified_blocks(planned, l, g, limit);
    if fit < planned {
        let fit = fit.max(1);
        return Some((fit, planned_takes, rounded_takes(fit, l, g)));
    }
    let room = grow.filter(|_| crate::plan::is_large_request(planned.saturating_mul(l.1)))?;
    let more = blocks_within(l, g, room);
    (more > planned).then(|| (more, planned_takes, rounded_takes(more, l, g)))
}

#[cfg(test)]
#[path = "kv_granule_tests.rs"]
mod tests;
