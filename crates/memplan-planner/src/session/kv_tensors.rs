//! The KV cache's count measured tensor by tensor through the engine's allocator, never past
//! the room: the part of the KV cache hand-over ([`super::kv_cache`]) used where neither one
//! tensor's measure ([`count_by_one_tensor`](super::kv_cache::count_by_one_tensor)) nor the
//! allocator's granule ([`super::kv_granule`]) gave a count, and one tensor of the planned size
//! alone says the planned cache does not fit.
//!
//! Neither may say anything where the planned tensors are under twice a coarse segment: caches
//! of half the blocks hold tensors too small for the allocator to round alone (they share
//! segments, and say nothing of the planned tensors' rounding), and smaller tensors of the
//! planned cache share segments two to one (a 15.25 MiB tensor beside another in a 30.5 MiB
//! segment), so what one tensor alone takes says nothing of them either. The planned cache was
//! then allocated whole: 128 tensors of 16 MiB, each rounded alone to 30.5 MiB, went 1.2 GiB
//! past the request before the session's attempt could read what they took.
//!
//! Here the session allocates a cache's tensors itself, one at a time through the engine's
//! allocator ([`AllocatorView::allocate_tensor`]), as the engine lays them out (one per layer,
//! in the plan's layout), and stops before any tensor that could take the room past `limit`:
//! a tensor no larger than the planned ones, large enough to be rounded on its own
//! ([`is_large_request`](crate::plan::is_large_request)), takes at most the segment one planned
//! tensor took alone (the allocator rounds a request up to its own segment size, which does
//! not grow as the request shrinks), and less where it fits in a segment an earlier one left.
//! The count is bisected among the caches whose tensors are that large; each measured cache is
//! freed and the allocator's cache released. What the largest count that fits took is the
//! prediction the engine's own allocation of it is checked against.
//!
//! [`AllocatorView::allocate_tensor`]: memplan_core::AllocatorView::allocate_tensor

use memplan_core::{Result, TensorId};

use crate::engine::Engine;
use crate::session::Recorder;

use super::kv_cache::one_tensor;

/// The largest count up to `highest` for which `fits(count)` says it fits, with what it took,
/// bisected from `known` (a count known to fit, with what it took): `fits` gives
/// `Some(Some(taken))` where the count fits, `Some(None)` where it does not, `None` where
/// nothing can be measured (the whole search gives `None`). Counts that fit are taken to be
/// those below some count (a cache of fewer blocks takes no more).
pub(crate) fn largest_fitting(
    known: (u64, u64),
    highest: u64,
    mut fits: impl FnMut(u64) -> Result<Option<Option<u64>>>,
) -> Result<Option<(u64, u64)>> {
    let ((mut lo, mut lo_takes), mut hi) = (known, highest.max(known.0));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        match fits(mid)? {
            None => return Ok(None),
            Some(Some(t)) => (lo, lo_takes) = (mid, t),
            Some(None) => hi = mid - 1,
        }
    }
    Ok(Some((lo, lo_takes)))
}

/// The count of `planned` blocks of `tensors` tensors of `n x page` bytes measured tensor by
/// tensor (see the module docs), where one planned tensor alone says the planned cache takes
/// more than `limit`: `(count, what the planned count takes by one tensor alone, what the count
/// took)`; `None` where the planned cache fits by that measure, its tensors are too small to be
/// rounded alone, the allocator offers no tensors, or no cache of tensors that large fits.
pub(super) fn by_tensors(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    planned: u64,
    (tensors, page): (u64, u64),
    limit: u64,
) -> Result<Option<(u64, u64, u64)>> {
    let own = planned.saturating_mul(page);
    if planned < 2 || page == 0 || !crate::plan::is_large_request(own) {
        return Ok(None);
    }
    let Some(segment) = one_tensor(rec, engine, own, tensors)?.filter(|s| *s >= own) else {
        return Ok(None);
    };
    let planned_takes = segment.saturating_mul(tensors);
    if planned_takes <= limit {
        return Ok(None);
    }
    // The fewest blocks whose tensors the allocator rounds alone.
    let lowest = (1..=planned)
        .find(|n| crate::plan::is_large_request(n.saturating_mul(page)))
        .unwrap_or(planned);
    let mut fits =
        |n: u64| tensors_fit(rec, engine, n.saturating_mul(page), tensors, limit, segment);
    let got = match (lowest < planned).then(|| fits(lowest)).transpose()? {
        Some(Some(Some(took))) => largest_fitting((lowest, took), planned - 1, fits)?,
        _ => None,
    };
    if let Some((count, took)) = got {
        tracing::info!(
            planned,
            count,
            planned_takes,
            took,
            segment,
            "the KV cache's count measured tensor by tensor: the planned tensors alone would not fit"
        );
    }
    Ok(got.map(|(count, took)| (count, planned_takes, took)))
}

/// Whether `tensors` tensors of `bytes` each, allocated one at a time through the engine's
/// allocator from an emptied cache, fit in `limit`, none allocated where the room taken so far
/// plus `segment` (the most one of them can take) would pass it: `Some(Some(taken))` where all
/// fit, `Some(None)` where not, `None` where the allocator offers no tensors. Every tensor is
/// freed and the cache released after.
fn tensors_fit(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    bytes: u64,
    tensors: u64,
    limit: u64,
    segment: u64,
) -> Result<Option<Option<u64>>> {
    rec.snap(engine)?;
    engine.allocator().release_cached()?;
    let first = engine.allocator().stats();
    let start = first.reserved;
    // Free bytes the measure's segments hold: what they reserved beyond the tensors in them.
    let free_of = |s: &memplan_core::AllocatorStats| {
        s.reserved
            .saturating_sub(start)
            .saturating_sub(s.allocated.saturating_sub(first.allocated))
    };
    // Free bytes in segments no later tensor fits in: what was free when a tensor last took
    // a new segment (the allocator serves a request from a cached block that holds it before
    // it takes a new one, `get_free_block`, so none of those did).
    let mut stale = 0u64;
    // Whether a tensor predicted to fit in the last segment's free rest took a new one: the
    // prediction is not trusted again.
    let mut mispredicted = false;
    let mut held: Vec<TensorId> = Vec::new();
    let mut outcome: Option<Option<()>> = Some(Some(()));
    let mut failed = None;
    for _ in 0..tensors {
        let a = engine.allocator();
        let before = a.stats();
        let grown = before.reserved.saturating_sub(start);
        // Tensors of one size share a segment where its rest after one holds another (two
        // 15.5 MiB tensors in a 31 MiB segment): the next one is then served from that rest
        // and takes nothing new, so only the room taken so far must fit. Without this, the
        // last tensor of a cache packed two to a segment was refused the room of a whole
        // segment it did not need, and the count fell to caches packed three to one: 330
        // blocks of 512 where 496 fitted.
        let in_rest = !mispredicted && free_of(&before).saturating_sub(stale) >= bytes;
        let may_take = if in_rest { 0 } else { segment };
        if grown.saturating_add(may_take) > limit {
            outcome = Some(None);
            break;
        }
        match a.allocate_tensor(bytes) {
            Ok(Some(id)) => held.push(id),
            Ok(None) => {
                outcome = None;
                break;
            }
            Err(e) if e.is_out_of_memory() => {
                outcome = Some(None);
                break;
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        if engine.allocator().stats().reserved > before.reserved {
            mispredicted |= in_rest;
            stale = free_of(&before);
        }
    }
    let taken = engine.allocator().stats().reserved.saturating_sub(start);
    if taken > limit {
        // A tensor predicted to fit in a segment's rest took a new one past the room.
        outcome = outcome.map(|_| None);
    }
    super::kv_cache::free_all(engine, &mut held)?;
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(outcome.map(|o| o.map(|()| taken)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_count_that_fits_is_found_and_nothing_unmeasured_is_guessed() {
        // Counts up to 700 fit, taking twice their count.
        let fits =
            |n: u64| -> Result<Option<Option<u64>>> { Ok(Some((n <= 700).then_some(2 * n))) };
        assert_eq!(
            largest_fitting((100, 200), 1023, fits).unwrap(),
            Some((700, 1400))
        );
        // Nothing past what is known fits: the known count.
        assert_eq!(
            largest_fitting((700, 1400), 700, fits).unwrap(),
            Some((700, 1400))
        );
        // Nothing can be measured: no count.
        assert_eq!(
            largest_fitting((100, 200), 1023, |_| Ok(None)).unwrap(),
            None
        );
    }
}
