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
//! as the engine's). The warm-ups run smallest first, each only where what the largest warm-up
//! so far and the profile run took per token say it fits in what the request leaves beside
//! what the plan counts as this process's (the KV cache's budget, the activation peak and the
//! graphs still to capture), less one granule of rounding and what the power-of-two divisions
//! the engine declared may round a request up by ([`before_divisions`]); where the batch's
//! sizes do not fit, each is the same fraction of the tokens that do (`narrow_by_warm_ups`): a
//! forward pass can take more per token than the profile run did, and the plan step is the
//! session's own, so what it takes past the request is memplan's. The session stops where the bound reaches
//! [`ALLOCATOR_ROUNDING_BOUND`] (the plan keeps no less), after [`GRANULE_WARM_UPS`] warm-ups,
//! where no size fits, or at the first one that makes the allocator reserve nothing (an engine
//! without a warm-up, whose default does nothing) or fails (the bound stays as the earlier
//! steps left it).
//!
//! [`AllocatorView::allocate_tensor`]: memplan_core::AllocatorView::allocate_tensor

use memplan_core::bytes::MIB;
use memplan_core::{AllocatorConfig, Result};

use super::kv_cache::one_tensor;
use super::{AsDynEngine, Session};
use crate::plan::{
    granule_bound_beside, is_large_request, weights_left_out, ALLOCATOR_ROUNDING_BOUND, MID_SEGMENT,
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
/// [`GRANULE_WARM_UPS`], smallest first. A count just below a simple fraction of a round batch (8191 of 8192)
/// asks for just less than a round request, which the allocator rounds up to that round
/// request: warm-ups at 8191, 7167, ... 3071 tokens of 330 KiB each reserved 2640, 2310, ... 990
/// MiB, all multiples of 330 MiB, and bounded a 2 MiB granule at 10 MiB.
pub(crate) fn warm_up_sizes(max_tokens: u64) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for k in 1..=GRANULE_WARM_UPS {
        match odd_tokens(max_tokens, warm_up_fraction(k)) {
            Some(s) if !out.contains(&s) => out.push(s),
            _ => {}
        }
    }
    out.sort_unstable();
    out
}

/// The fraction of the batch of [`warm_up_sizes`]'s `k`-th size: `3/8 + 5/8 * frac(k * 0.618...)`.
fn warm_up_fraction(k: usize) -> f64 {
    const GOLDEN: f64 = 0.618_033_988_749_895;
    0.375 + 0.625 * (k as f64 * GOLDEN).fract()
}

/// The largest odd count of tokens no larger than `f` of `max_tokens`; `None` where that is
/// none.
fn odd_tokens(max_tokens: u64, f: f64) -> Option<u32> {
    let m = max_tokens.min(u64::from(u32::MAX)) as f64;
    let s = (m * f).floor() as u64;
    let odd = if s.is_multiple_of(2) {
        s.saturating_sub(1)
    } else {
        s
    };
    u32::try_from(odd).ok().filter(|s| *s > 0)
}

/// The most tokens whose warm-up fits in `room` by `costs`, `(tokens, bytes)` that the largest
/// warm-up so far or the profile run of that many tokens took (`u64::MAX` with none): each
/// scaled to that many tokens, at most `room`. A forward pass's activations grow with its
/// tokens (vLLM's profile run is one of `max_num_batched_tokens`, `gpu_model_runner.py`,
/// `profile_run`, `_dummy_run(self.max_num_tokens)`), and what one takes beside that (the
/// allocator's rounding, buffers of fixed size) is a larger share of a smaller pass: scaled up,
/// a smaller pass's share per token bounds a larger one's.
pub(crate) fn warm_up_tokens_within(costs: &[(u64, u64)], room: u64) -> u64 {
    costs
        .iter()
        .filter(|(tokens, bytes)| *tokens > 0 && *bytes > 0)
        .map(|&(tokens, bytes)| {
            let t = u128::from(room) * u128::from(tokens) / u128::from(bytes);
            u64::try_from(t).unwrap_or(u64::MAX)
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// Most tensors [`Session::narrow_granule_bound`] allocates where the allocator offers them.
pub const GRANULE_TENSORS: usize = 6;

/// Most tensors one reading of [`tensor_sizes`] holds at once: a tensor the allocator served
/// from a segment it already held reserves nothing, and another is allocated beside it.
const TENSORS_PER_READING: u64 = 4;

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

/// The most bytes of requests whose rounding by the power-of-two divisions the engine declared
/// (`roundup_power2_divisions` in `conf`) still fits in `room`: a request in `[2^k, 2^(k+1))`
/// rounded up to one of `d` steps of `2^k / d` gains less than `1/d` of itself, so requests of
/// `room x d / (d + 1)` take at most `room` (`room` itself where it declared none). A warm-up's
/// cost scaled from a smaller one's per token is its request before that rounding: warm-ups of
/// 19,315 tokens that reserved 2 GiB scaled to 2.32 GiB for 22,387 tokens, which two divisions
/// rounded up to 3 GiB, 89.6 MiB past the request.
pub(crate) fn before_divisions(room: u64, conf: Option<&AllocatorConfig>) -> u64 {
    match conf.and_then(crate::plan::fewest_divisions) {
        Some(d) => {
            u64::try_from(u128::from(room) * u128::from(d) / u128::from(d + 1)).unwrap_or(u64::MAX)
        }
        None => room,
    }
}

impl<E: AsDynEngine + ?Sized> Session<'_, E> {
    /// See the module docs. Runs once per session; `max_tokens` is the scheduler's
    /// `max_num_batched_tokens`.
    /// `room`: what the request leaves beside what the plan counts as this process's
    /// ([`PlanBuilder::room_before_plan`](crate::PlanBuilder::room_before_plan); `None`: no
    /// amount to keep within).
    pub(super) fn narrow_granule_bound(
        &mut self,
        max_tokens: u64,
        room: Option<u64>,
    ) -> Result<()> {
        if self.granule_narrowed {
            return Ok(());
        }
        self.granule_narrowed = true;
        if self.offers_tensors {
            // Each reading holds at most `TENSORS_PER_READING` tensors at once, each rounded
            // by at most one granule: where that does not fit in what the request leaves, the
            // reading is not taken (a start-up with no room for a KV cache went 100 MiB past
            // the request at the plan step with them, where the engine alone took nothing).
            let most = self.rounding_margin().saturating_mul(TENSORS_PER_READING);
            let fits = |b: &u64| {
                room.is_none_or(|r| {
                    b.saturating_mul(TENSORS_PER_READING).saturating_add(most)
                        <= self.before_divisions(r)
                })
            };
            let sizes: Vec<u64> = tensor_sizes().into_iter().filter(fits).collect();
            self.narrow_by(sizes, "a tensor", Self::granule_tensor);
        }
        self.narrow_by_warm_ups(max_tokens, room);
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

    /// The warm-ups of [`warm_up_sizes`], smallest first, each held to `room`: the `i`-th is
    /// the `i`-th size of a batch of `max_tokens`, or of the most tokens whose warm-up fits in
    /// `room` less one granule of rounding by what the largest warm-up so far and the profile
    /// run took per token ([`warm_up_tokens_within`]) where those are fewer. Forward passes of up to `max_tokens` tokens can take more
    /// than the profile run did (an engine whose warm-ups took 237 KiB a token beside a profile
    /// run of 32 KiB a token went 233 MiB past the request with the warm-up of 14,889 tokens,
    /// 3.4 GiB, where 3.1 GiB was left): the smallest first measure the cost of the larger ones
    /// before they run. Stops as [`Self::narrow_by`] does, or after [`GRANULE_WARM_UPS`].
    fn narrow_by_warm_ups(&mut self, max_tokens: u64, room: Option<u64>) {
        let mut done: Vec<u32> = Vec::new();
        for i in 0..GRANULE_WARM_UPS {
            if self.granule_reached() {
                break;
            }
            let within = room.map_or(max_tokens, |room| {
                let margin = self.rounding_margin();
                let mut costs: Vec<(u64, u64)> = self.rec.largest_warm_up.into_iter().collect();
                if let Some(a) = self.rec.p.activation_peak_bytes {
                    costs.push((max_tokens, a));
                }
                warm_up_tokens_within(&costs, self.before_divisions(room.saturating_sub(margin)))
            });
            let sizes = warm_up_sizes(max_tokens.min(within));
            let Some(size) = sizes.get(i).copied().filter(|s| !done.contains(s)) else {
                tracing::debug!(
                    ?room,
                    within,
                    i,
                    "no warm-up of this place fits in what the request leaves"
                );
                continue;
            };
            done.push(size);
            match self.granule_warm_up(size) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    tracing::info!(size, error = %e, "a warm-up for the allocator's granule failed: the bound stays as the earlier steps left it");
                    break;
                }
            }
        }
    }

    /// [`before_divisions`] by the allocator configuration the engine declared.
    fn before_divisions(&self, room: u64) -> u64 {
        before_divisions(room, self.alloc_conf.as_ref().map(|(c, _)| c))
    }

    /// The most the allocator's rounding may add to one request by the readings so far: the
    /// granule they bound, at least PyTorch's rounding; PyTorch's mid-sized segment
    /// (`kLargeBuffer`) where they bound none.
    fn rounding_margin(&self) -> u64 {
        granule_bound_beside(&self.rec.p.segment_readings, self.rec.p.weights_reading)
            .map_or(MID_SEGMENT, |g| g.max(ALLOCATOR_ROUNDING_BOUND))
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
        let grown = one_tensor(
            &mut self.rec,
            self.engine.as_dyn(),
            bytes,
            TENSORS_PER_READING,
        );
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
        self.rec.warmed_up(u64::from(size), grown.max(peak));
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
    fn warm_ups_are_held_to_the_room_by_the_costliest_measure_per_token() {
        // A profile run of 16,384 tokens took 513 MiB; a warm-up of 7,067 tokens 1,577 MiB
        // (the warm-ups cost seven times as much per token): of 3,235 MiB, a warm-up of at
        // most 14,496 tokens fits, not the 14,889 the sizes of the batch ask for.
        let costs = [(16_384, 513 * MIB), (7_067, 1_577 * MIB)];
        let within = warm_up_tokens_within(&costs, 3_235 * MIB);
        assert_eq!(within, 7_067 * 3_235 / 1_577);
        assert!(within < 14_889);
        // The profile run alone would have allowed them all.
        assert!(warm_up_tokens_within(&costs[..1], 3_235 * MIB) > 16_384);
        // Nothing measured: no bound; no room: no tokens.
        assert_eq!(warm_up_tokens_within(&[], MIB), u64::MAX);
        assert_eq!(warm_up_tokens_within(&costs, 0), 0);
        assert_eq!(warm_up_tokens_within(&[(0, MIB), (10, 0)], MIB), u64::MAX);
    }

    #[test]
    fn warm_ups_keep_room_for_power_of_two_divisions() {
        let room = 3 * 1024 * MIB;
        assert_eq!(before_divisions(room, None), room);
        let plain = AllocatorConfig::parse("max_split_size_mb:512").unwrap();
        assert_eq!(before_divisions(room, Some(&plain)), room);
        let two = AllocatorConfig::parse("roundup_power2_divisions:2").unwrap();
        let kept = before_divisions(room, Some(&two));
        assert_eq!(kept, 2 * 1024 * MIB);
        // What is kept, rounded up by less than half of itself (two divisions), stays within
        // the room; the 2.32 GiB a warm-up was scaled to is not kept (it rounds to 3 GiB).
        assert!(kept + kept / 2 <= room);
        assert!(2_490_000_000 > kept);
        // The coarsest division of any interval counts.
        let mixed = AllocatorConfig::parse("roundup_power2_divisions:[64:8,>:4]").unwrap();
        assert_eq!(before_divisions(room, Some(&mixed)), room * 4 / 5);
    }

    #[test]
    fn warm_up_sizes_are_odd_distinct_and_within_the_batch() {
        let s = warm_up_sizes(8192);
        assert_eq!(s, vec![3533, 4279, 5489, 6235, 6697, 7445]);
        assert!(s
            .iter()
            .all(|x| x % 2 == 1 && *x <= 8192 && *x >= 8192 * 3 / 8));
        assert!(warm_up_sizes(1).is_empty());
        assert_eq!(warm_up_sizes(4), vec![1, 3]);
        assert!(warm_up_sizes(0).is_empty());
        assert_eq!(warm_up_sizes(u64::MAX).len(), GRANULE_WARM_UPS);
        assert!(warm_up_sizes(u64::MAX).iter().all(|x| x % 2 == 1));
    }
}
