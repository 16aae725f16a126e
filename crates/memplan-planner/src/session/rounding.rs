//! Narrowing the bound on the allocator's granule where the KV cache's allocation will go
//! unmeasured ([`Session::narrow_granule_bound`]).
//!
//! An engine that neither allocates its KV cache inside the session nor offers tensors from its
//! allocator gets a plan that keeps, per KV tensor, room for rounding it up to the coarsest
//! granule its own allocations allow ([`granule_bound`]): the greatest common divisor of what
//! its steps made the allocator reserve. The weights, the activation peak and the graph phase's
//! warm-ups are sizes the engine chose, and sizes of round numbers share large divisors: a
//! model whose weights and activation peak are whole multiples of 8 MiB bounds a 2 MiB granule
//! at 8 MiB, and the cache is then planned in steps four times too coarse (with a few dozen
//! per-layer tensors, a tenth of the cache).
//!
//! Where the engine's allocator offers tensors ([`AllocatorView::allocate_tensor`]) but the
//! plan's layout of the cache is not one the session can allocate to measure (a hybrid cache
//! whose K and V tensors are not all of one size, or pages of several sizes), the granule is
//! measured rather than bounded: the session allocates single tensors of odd sizes past
//! PyTorch's `kMinLargeAlloc` (10 MiB, the smallest request rounded on its own), one at a time
//! from an emptied cache, and reads what each made the allocator reserve ([`tensor_sizes`]).
//! One request is rounded up to a multiple of the granule and wastes less than one, so such
//! readings bound it as the engine's own steps do, and unlike the weights (hundreds of tensors,
//! many in shared 20 MiB segments) or an activation peak of round size, they are single requests
//! of sizes no round granule divides: an eager engine whose weights reserved 7.81 GiB beside an
//! activation peak of 1.5 GiB bounded a 2 MiB granule at 64 MiB, and the cache was refused.
//!
//! More sizes narrow it. Before such a plan the session warms the engine up at a few odd
//! token counts between 3/8 of its `max_num_batched_tokens` and all of it, away from simple
//! fractions of it ([`warm_up_sizes`]; a forward pass of that many tokens,
//! [`Engine::warm_up`](crate::Engine::warm_up)), each after releasing the allocator's cache,
//! so that what each makes the allocator reserve is its own segments: such a count gives a
//! request that is no multiple of a round number, and the segments it is rounded to are a
//! multiple of the granule and seldom of anything coarser. Every warm-up is one engine step of
//! the session (settled before, measured after, memory it leaves outside the allocator counted
//! as the engine's). The session stops where the bound reaches [`ALLOCATOR_ROUNDING_BOUND`]
//! (the plan keeps no less), after [`GRANULE_WARM_UPS`] warm-ups, or at the first one that
//! makes the allocator reserve nothing (an engine without a warm-up, whose default does
//! nothing) or fails (the bound stays as the earlier steps left it).
//!
//! [`AllocatorView::allocate_tensor`]: memplan_core::AllocatorView::allocate_tensor

use memplan_core::bytes::MIB;
use memplan_core::Result;

use super::kv_cache::one_tensor;
use super::{AsDynEngine, Session};
use crate::plan::{
    granule_bound_beside, is_large_request, weights_left_out, ALLOCATOR_ROUNDING_BOUND,
};

/// Most warm-ups [`Session::narrow_granule_bound`] runs. Each is a forward pass of at most
/// `max_num_batched_tokens` tokens (what the profile run already ran once); two or three
/// distinct rounded sizes are enough to bring a common divisor down to the granule in most
/// cases (`n` random multiples of it share no further factor with probability `1/zeta(n)`:
/// 61% for two, 83% for three, 98% for six).
pub const GRANULE_WARM_UPS: usize = 6;

/// Odd token counts between 3/8 of `max_tokens` and all of it, at fractions far from simple
/// ones: the `k`-th at `3/8 + 5/8 * frac(k * 0.618...)` (the golden ratio's sequence, whose
/// points stay apart), each the largest odd count no larger; distinct, at most
/// [`GRANULE_WARM_UPS`]. A count just below a simple fraction of a round batch (8191 of 8192)
/// asks for just less than a round request, which the allocator rounds up to that round
/// request: warm-ups at 8191, 7167, ... 3071 tokens of 330 KiB each reserved 2640, 2310, ... 990
/// MiB, all multiples of 330 MiB, and bounded a 2 MiB granule at 10 MiB.
pub(crate) fn warm_up_sizes(max_tokens: u64) -> Vec<u32> {
    const GOLDEN: f64 = 0.618_033_988_749_895;
    let m = max_tokens.min(u64::from(u32::MAX)) as f64;
    let mut out: Vec<u32> = Vec::new();
    for k in 1..=GRANULE_WARM_UPS {
        let f = 0.375 + 0.625 * (k as f64 * GOLDEN).fract();
        let s = (m * f).floor() as u64;
        let odd = if s.is_multiple_of(2) {
            s.saturating_sub(1)
        } else {
            s
        };
        match u32::try_from(odd) {
            Ok(s) if s > 0 && !out.contains(&s) => out.push(s),
            _ => {}
        }
    }
    out
}

/// Most tensors [`Session::narrow_granule_bound`] allocates where the allocator offers them.
pub const GRANULE_TENSORS: usize = 6;

/// Sizes of the single tensors that measure the allocator's granule (see the module docs): from
/// just past 10 MiB (PyTorch's `kMinLargeAlloc`: smaller requests share segments) to 80 MiB, at
/// the golden ratio's fractions of that span (as [`warm_up_sizes`]), each an odd number of KiB,
/// so that no granule of whole MiB divides one; distinct, [`GRANULE_TENSORS`] of them.
pub(crate) fn tensor_sizes() -> Vec<u64> {
    const GOLDEN: f64 = 0.618_033_988_749_895;
    const KIB: u64 = 1024;
    let (low, span) = (10 * MIB + KIB, 70 * MIB);
    let mut out: Vec<u64> = Vec::new();
    for k in 1..=GRANULE_TENSORS {
        let at = low + ((span as f64) * (k as f64 * GOLDEN).fract()) as u64;
        let kib = (at / KIB) | 1;
        if !out.contains(&(kib * KIB)) {
            out.push(kib * KIB);
        }
    }
    out
}

impl<E: AsDynEngine + ?Sized> Session<'_, E> {
    /// See the module docs. Runs once per session; `max_tokens` is the scheduler's
    /// `max_num_batched_tokens`.
    pub(super) fn narrow_granule_bound(&mut self, max_tokens: u64) -> Result<()> {
        if self.granule_narrowed {
            return Ok(());
        }
        self.granule_narrowed = true;
        if self.offers_tensors {
            self.narrow_by(tensor_sizes(), "a tensor", Self::granule_tensor);
        }
        self.narrow_by(
            warm_up_sizes(max_tokens),
            "a warm-up",
            Self::granule_warm_up,
        );
        tracing::info!(readings = ?self.rec.p.segment_readings, bound = ?granule_bound_beside(&self.rec.p.segment_readings, self.rec.p.weights_reading), "the allocator's granule, bounded after warm-ups at odd sizes");
        Ok(())
    }

    /// Take one reading of `what` (a tensor, a warm-up) per size by `step`, in order, until the
    /// readings bound the granule at PyTorch's rounding, a step reserves nothing (`Ok(false)`)
    /// or fails (the bound stays as the earlier steps left it).
    fn narrow_by<T: Copy + tracing::Value>(
        &mut self,
        sizes: Vec<T>,
        what: &str,
        mut step: impl FnMut(&mut Self, T) -> Result<bool>,
    ) {
        for size in sizes {
            if self.granule_reached() {
                break;
            }
            match step(self, size) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    tracing::info!(size, error = %e, "{what} for the allocator's granule failed: the bound stays as the earlier steps left it");
                    break;
                }
            }
        }
    }

    /// Whether the readings so far bound the granule at PyTorch's rounding, which the plan keeps
    /// in any case ([`ALLOCATOR_ROUNDING_BOUND`]).
    fn granule_reached(&self) -> bool {
        weights_left_out(&self.rec.p.segment_readings, self.rec.p.weights_reading)
            .is_some_and(|g| g <= ALLOCATOR_ROUNDING_BOUND)
    }

    /// One tensor of `bytes` from the engine's allocator, from an emptied cache, as an engine
    /// step: what the allocator reserved for it is a reading of one request (measured as the
    /// KV cache's one tensor is, [`one_tensor`]: a tensor served from a segment already held
    /// reserves nothing, and another is allocated beside it, at most four in all, every one
    /// freed after). `Ok(false)`: none made the allocator reserve at least its size (or it
    /// offered none, or ran out of memory).
    fn granule_tensor(&mut self, bytes: u64) -> Result<bool> {
        self.engine.as_dyn().allocator().release_cached()?;
        let before = self.rec.settle(self.engine.as_dyn())?;
        let probed = self.probe_allocatable(&before)?;
        let grown = one_tensor(&mut self.rec, self.engine.as_dyn(), bytes, 4);
        let after = self.rec.snap(self.engine.as_dyn())?;
        self.probe_step(probed, &before, &after)?;
        self.rec.engine_step("granule_tensor", before, after);
        let grown = grown?;
        tracing::debug!(bytes, ?grown, "a tensor for the allocator's granule");
        if let Some(g) = grown {
            self.rec.p.segment_readings.push((bytes, g));
        }
        Ok(grown.is_some())
    }

    /// One warm-up of `size` tokens from an emptied cache, as an engine step. `Ok(false)`: the
    /// allocator reserved nothing for it.
    fn granule_warm_up(&mut self, size: u32) -> Result<bool> {
        self.engine.as_dyn().allocator().release_cached()?;
        let before = self.rec.settle(self.engine.as_dyn())?;
        let probed = self.probe_allocatable(&before)?;
        let a = self.engine.as_dyn().allocator();
        a.reset_peak();
        let stats = a.stats();
        let warmed = self.engine.as_dyn().warm_up(size);
        let peaks = self.engine.as_dyn().allocator().stats();
        self.engine.as_dyn().allocator().release_cached()?;
        let after = self.rec.snap(self.engine.as_dyn())?;
        self.probe_step(probed, &before, &after)?;
        self.rec.engine_step("granule_warm_up", before, after);
        warmed?;
        let peak = peaks.peak_allocated.saturating_sub(stats.allocated);
        let grown = peaks
            .peak_reserved
            .unwrap_or(peaks.reserved)
            .saturating_sub(stats.reserved);
        tracing::debug!(size, peak, grown, "a warm-up for the allocator's granule");
        if grown > 0 && is_large_request(peak) {
            self.rec.p.segment_readings.push((peak, grown));
        }
        Ok(grown > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_sizes_are_large_requests_no_whole_mib_divides() {
        let s = tensor_sizes();
        assert_eq!(s.len(), GRANULE_TENSORS);
        for (i, b) in s.iter().enumerate() {
            assert!(is_large_request(*b) && *b <= 80 * MIB + 1024, "{b}");
            assert_eq!((b / 1024) % 2, 1, "{b}");
            assert!(!s[..i].contains(b));
        }
        // Rounded to a 2 MiB granule they share no coarser divisor.
        let g = s
            .iter()
            .map(|b| b.div_ceil(2 * MIB) * 2 * MIB)
            .fold(0, crate::plan::gcd);
        assert_eq!(g, 2 * MIB);
    }

    #[test]
    fn warm_up_sizes_are_odd_distinct_and_within_the_batch() {
        let s = warm_up_sizes(8192);
        assert_eq!(s, vec![6235, 4279, 7445, 5489, 3533, 6697]);
        assert!(s
            .iter()
            .all(|x| x % 2 == 1 && *x <= 8192 && *x >= 8192 * 3 / 8));
        assert!(warm_up_sizes(1).is_empty());
        assert_eq!(warm_up_sizes(4), vec![3, 1]);
        assert!(warm_up_sizes(0).is_empty());
        assert_eq!(warm_up_sizes(u64::MAX).len(), GRANULE_WARM_UPS);
        assert!(warm_up_sizes(u64::MAX).iter().all(|x| x % 2 == 1));
    }
}
