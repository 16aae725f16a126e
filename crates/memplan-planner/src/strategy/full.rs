//! `full` and `post-capture`: capture every size and measure what it really took.
//!
//! `full` throws its graphs away, and the engine captures them again after the KV cache exists,
//! so what it measured must stand for a second capture. Two things can make it not:
//! - memory a library allocates once, on the process's first capture, and keeps (a cuBLAS
//!   workspace taken outside the caching allocator): the engine's later capture does not take
//!   it again. So `full` first captures the first size once and releases it
//!   ([`GraphContext::prime`]): that memory is taken there, held after the phase's teardown
//!   and counted once as held, and the measured pass costs what a later capture costs;
//! - captures that do not cost the same twice (the executable object of one size varies from
//!   capture to capture).
//!
//! So `full` reads every capture in its own window (the cache released before each baseline),
//! then captures the first size again [`REPEATS`] times on its own: the spread of the repeats
//! (less a repeat far below the others: memory a late release gives back inside a window
//! makes it read low) is the capture-to-capture variation, which sizes the margin (scaled to every graph, as
//! independent variations add up: `k * spread / mean * sqrt(sum of squares)`). The repeats
//! are windows of a reading that may be off by its window error, independently of the
//! capture: the part of their range the noise explains is taken off in quadrature. The noise
//! is what the reading was seen to do on this phase's windows, not the most its window error
//! allows: each repeat's window opening is read a second time with nothing done in between
//! (an idle window), and what the idle windows' range surely shows of the noise (at most twice
//! the window error) is what is taken off. The window error is the largest error a window may
//! have; the repeats' windows need not reach it, and a range within it taken off at the bound
//! read as no variation at all where the capture's variation was the whole range. Nor is the
//! idle windows' range taken off whole: it is one draw of the noise's range, and a draw that
//! came out high hid a variation as surely as the bound did; what is taken off is the range the
//! noise's lower bound at 99.95% gives the windows ([`surely_noise`]).
//!
//! `k` makes the margin a one-sided bound at 99.95% from `n` repeats: their range estimates
//! the standard deviation of one capture as `range / d2(n)` (d2 = 2.059 for 4 samples, 3.258
//! for 12: the control-chart constant, e.g. ASTM E2587 or Montgomery's *Introduction to
//! Statistical Quality Control*, appendix table VI; 4.139 for 32, beyond the tables: the
//! expected range of 32 standard normal samples, integrated numerically), and with `n - 1`
//! degrees of freedom the bound is Student's t (12.92 for 3, 4.44 for 11, 3.63 for 31): `k`
//! is 6.3 for 4 repeats, 1.4 for 12, 0.88 for 32.
//!
//! What stands for the standard deviation. d2(n) is the expected range of `n` samples of a
//! *normal* variation; one with lighter tails (bounded both ways, as a capture whose sizes an
//! allocator rounds to a few granules is) ranges over fewer of its standard deviations, the
//! more so the more samples: `n` samples of a uniform variation range over `(n - 1) / (n + 1)`
//! of its width on average (the `i`-th of `n` uniform order statistics has mean `i / (n + 1)`:
//! David and Nagaraja, *Order Statistics*, 3rd ed., Wiley 2003, chapter 2), which is `sqrt(12)
//! (n - 1) / (n + 1)` standard deviations: 2.08 for 4 (d2 2.059), 2.93 for 12 (3.258), 3.25
//! for 32 (4.139). Read with d2, 32 repeats of such a variation give a standard deviation 21%
//! low. The sample standard deviation `s` assumes no shape (its square is unbiased for any
//! variation), and is the estimator Student's t is defined with: `t s` is the one-sided bound
//! the factor stands for (the prediction bound for one further observation, `t s sqrt(1 +
//! 1/n)` about the sample mean, e.g. Hahn and Meeker, *Statistical Intervals*, Wiley 1991,
//! chapter 4). The range stays where it is the larger: a variation with heavier tails than the
//! normal's shows them in the range, which `s` averages away. So the margin of repeats read
//! through the free reading takes the larger of `range / d2(n)` and `s` ([`margin_range`]);
//! repeats measured by allocation probes keep their range ([`probed_variation_margin`]). 32
//! repeats of a 0.89 GB capture ranged 14.7% of it with `s` 4.29% (`range / d2` 3.55%): the
//! margin kept 229.5 MB for four graphs, and the engine alone's captures of them took 265.5 MB
//! more than the pass, past the room the request left the KV cache; `s` keeps 277 MB.
//!
//! Four repeats that vary beyond the idle windows' noise are followed by [`MORE_REPEATS`] more:
//! a few captures of the smallest size cost far less than the KV cache a margin from four
//! samples would take (about five times the margin of twelve). So are four repeats whose
//! reading's window error could hide 7.5% of a capture ([`hides_variation`]): their range
//! then says nothing of a variation that, summed over every graph, passes the request. So are
//! four repeats of a noisy reading whose pass's graphs together weigh more than one repeat: a
//! variation of each capture within the noise, summed over them, passes the two windows the
//! margin keeps for the reading ([`hidden_variation_sums_past_the_windows`]).
//! `post-capture` keeps the graphs it measured, so neither applies there.
//!
//! A reading that moves in steps rounds every window to a multiple of its step: repeats that
//! differ by less than a step read the same or one step apart by where the readings fell, and
//! no range of theirs tells a variation below the step from none. Where the step could hide
//! such a variation, the margin counts the step as the repeats' range at least, the same bytes
//! for every graph ([`hidden_by_step`]).
//!
//! What the runtime keeps of every capture after the graph is destroyed (per-capture memory
//! a runtime holds for good, 4 MiB per capture on one platform: docs/measurement-protocol.md
//! cites the report) is read from the repeats too ([`kept_per_capture`]): between the
//! openings of two repeats' windows one capture was taken and released. The priming capture
//! kept that much for good as well, so it is not part of the memory of the priming graph that
//! may still come back inside the pass ([`Primed::may_come_back`]); counting it there widened
//! the pass's margin by memory that never comes back (and the teardown counts it as held
//! besides).
//!
//! What the factor bounds. The engine captures its graphs again after the plan, and its
//! captures and the measured pass are two independent draws of every graph: their difference
//! varies `sqrt(2)` times as much as one capture, which the margin (sized from one capture's
//! variation) does not count; nor does the t with `n - 1` degrees of freedom fit a range
//! exactly (the range of 12 is worth about 9, Patnaik's approximation). So the margin does
//! not double-count the pass's own variation; read as a bound on that difference, the factor
//! of 12 repeats is about 99.4% (`P(T > 4.44 / sqrt(2))` with 9 degrees of freedom), not
//! 99.95%. More repeats narrow it at that confidence only so much, and each further capture
//! leaves held what the runtime keeps per capture. From 32 repeats, Student's t with 31
//! degrees of freedom is 3.63 where 11 take 4.44: 18% less margin on the same standard
//! deviation (read from the range of 32 with the same convention as 12, d2(32) = 4.139 and
//! `n - 1` degrees of freedom, though a range of 32 is worth fewer than a standard deviation
//! would be). That is the same confidence on one capture's variation, not quite on the
//! difference: read as a bound on it, 32 repeats' factor is about 99.2% (`P(T > 3.63 /
//! sqrt(2))` with 31 degrees of freedom; somewhat less for the fewer a range is worth), where
//! twelve's is 99.4%, as Student's t has a thinner tail with more degrees of freedom. So
//! `full` takes [`FURTHER_REPEATS`] more only where that 18% of the twelve's
//! margin is more than what the runtime keeps of 20 captures for good, as measured over the
//! twelve ([`further_repeats_pay`]): 20 more at 4 MiB hold 80 MiB, more than 18% of any
//! margin under 440 MiB; a runtime that keeps nothing loses nothing to them. It stops at 32:
//! 64 would take only 7% more off.
//!
//! The margin keeps the reading's error on two windows beside the variation
//! ([`independent_margin`]); where the repeats' idle windows all read exactly 0, each window is
//! kept at the step the phase's windows show the reading moves in, where that is less
//! ([`quiet_reading_window`]).
//!
//! That is the margin of a plan that warns the captures vary ([`Warning::GraphCaptureVaries`],
//! a spread over [`VARIATION_REPORTED_PER_MILLE`]): the warning names what a later capture can
//! still exceed. A plan that says nothing of the variation keeps `sqrt(2)` times it, the bound
//! at the same confidence on the difference itself ([`unwarned_margin`]); allocation probes'
//! repeats follow the same rule ([`probed_variation_margin`]).

use memplan_core::bytes::{fmt_bytes, fmt_signed};
use memplan_core::{Error, Result};

use super::context::{GraphContext, Primed};
use super::{GraphEstimate, GraphStrategy, StrategyKind};
use crate::warning::Warning;

/// Capture every size into a throwaway pool, measure, release. Exact where the driver free
/// reading measures this process; costs one capture per size, and four more (`REPEATS`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Full;

/// Capture every size once and for all, then size the KV cache from real usage. The KV cache's
/// address range is reserved first (virtual memory) and handed to the engine
/// ([`Engine::bind_kv_range`](crate::Engine::bind_kv_range)) so its graphs can be captured
/// against it; memory is mapped there once the plan says how much fits.
#[derive(Debug, Clone, Copy, Default)]
pub struct PostCapture;

/// Captures of the first size repeated on their own after the full pass (see the module docs).
pub const REPEATS: usize = 4;

/// Repeats added where the first [`REPEATS`] varied beyond the reading's noise (see the module
/// docs).
pub const MORE_REPEATS: usize = 8;

/// Student's t at 99.95% with `n - 1` degrees of freedom and the control-chart constant d2(n)
/// (the expected range of `n` normal samples in standard deviations) of the largest tabulated
/// count of repeats at or below `n` (see the module docs).
fn t_and_d2(n: usize) -> (f64, f64) {
    if n >= REPEATS + MORE_REPEATS + FURTHER_REPEATS {
        (3.634, 4.139)
    } else if n >= REPEATS + MORE_REPEATS {
        (4.437, 3.258)
    } else {
        (12.924, 2.059)
    }
}

/// The margin's factor on the repeats' relative range for `n` repeats: Student's t at 99.95%
/// with `n - 1` degrees of freedom over d2(n) (see the module docs).
fn margin_factor(n: usize) -> f64 {
    let (t, d2) = t_and_d2(n);
    t / d2
}

/// Repeats added to twelve where the margin they take off, at the same confidence, is more than
/// the memory the runtime keeps of them (see the module docs).
pub const FURTHER_REPEATS: usize = 20;

/// Whether [`FURTHER_REPEATS`] are worth taking after twelve whose margin is `twelve`: what
/// they are expected to take off it (the t of 32 repeats against that of 12, on the same
/// standard deviation) is more than what the runtime keeps of every capture (`kept`) holds for
/// good over them.
fn further_repeats_pay(twelve: u64, kept: u64) -> bool {
    let n = REPEATS + MORE_REPEATS;
    let off = 1.0 - t_and_d2(n + FURTHER_REPEATS).0 / t_and_d2(n).0;
    (kept as f64) * (FURTHER_REPEATS as f64) < twelve as f64 * off
}

/// Whether the probed repeats after the `first` ones ([`PROBED_REPEATS`] in all) are worth
/// taking where their probes' frees keep `cost` for good (what the device keeps of every raw
/// free, times the frees the first ones made per repeat, times the repeats still to take): the
/// margin they are expected to take off ([`probed_variation_margin`] of the first ones against
/// the same range at the factor of all of them) is more than that. The range of more repeats
/// only grows, and the pass's margin joins the reading's window error in quadrature
/// ([`probed_pass_margin`]), so the margin taken off is at most that: the rule errs towards
/// taking them. A device that keeps nothing of a free (`cost` 0) takes them all.
pub(super) fn more_probed_repeats_pay(
    first: &[i64],
    graphs: usize,
    resolution: u64,
    alike: u64,
    cost: u64,
) -> bool {
    if cost == 0 || first.is_empty() {
        return true;
    }
    let now = probed_variation_margin(first, graphs, resolution, alike) as f64;
    let all = now * margin_factor(PROBED_REPEATS) / margin_factor(first.len());
    now - all > cost as f64
}

/// Repeats that differ by more than this (per mille of their mean) are reported
/// ([`Warning::GraphCaptureVaries`]).
pub const VARIATION_REPORTED_PER_MILLE: u64 = 10;

/// What capturing every size took.
struct Pass {
    /// Signed bytes of the whole pass.
    total: i64,
    /// Bytes of each capture, in capture order.
    each: Vec<i64>,
    /// Read from the driver (everything the process holds) rather than the allocator only.
    from_driver: bool,
    /// The most the pass held after any of its captures, from where it started (signed
    /// bytes, at least `total`): more than `total` where memory was given back inside the
    /// pass ([`given_back_inside`]).
    peak: i64,
}

/// Capture every size, each in a window opened after releasing cached memory (the warm-up's
/// cache would otherwise be released inside it). What the pass held after each capture is
/// read from where it started too: its peak ([`Pass::peak`]).
fn capture_all(ctx: &mut GraphContext<'_>) -> Result<Pass> {
    let sizes = ctx.sizes();
    let first = ctx.flushed_snapshot()?;
    let mut each = Vec::with_capacity(sizes.len());
    let mut from_driver = true;
    let mut last = first;
    let mut peak = 0i64;
    for s in &sizes {
        ctx.warm_up(*s)?;
        let before = ctx.flushed_snapshot()?;
        ctx.capture(*s)?;
        let after = ctx.flushed_snapshot()?;
        let r = ctx.graph_bytes(&before.window_to(&after));
        from_driver &= r.from_driver;
        each.push(r.bytes);
        peak = peak.max(ctx.graph_bytes(&first.window_to(&after)).bytes);
        last = after;
    }
    let r = ctx.graph_bytes(&first.window_to(&last));
    if r.bytes < 0 {
        ctx.warn(Warning::NegativeCaptureWindow {
            graphs: sizes.len(),
            bytes: r.bytes,
        });
    }
    Ok(Pass {
        total: r.bytes,
        each,
        from_driver: from_driver && r.from_driver,
        peak: peak.max(r.bytes),
    })
}

/// What the pass gave back inside itself beyond what its windows may be off by and what the
/// priming graph may have returned in it: 0 where the pass held the most at its end.
///
/// A graph pool keeps what its captures freed cached for the next capture, and the pass
/// releases no graph before its end, so the memory it holds only grows from capture to
/// capture, but where the allocator gives its cache back inside a capture: the caching
/// allocator does that when the device cannot serve a request (PyTorch's `malloc` frees its
/// cached blocks and retries once, `release_cached_blocks` on an allocation failure). A pool
/// that reaches the device's limit this way is one whose captures do not share its blocks:
/// under `max_split_size_mb` PyTorch splits no cached block for a request of that size or more
/// and hands it none more than 20 MiB larger (`should_split`, `get_free_block`), so each
/// graph's large intermediates take segments of their own and the pool grows by their sum.
/// The end of such a pass reads only what was left after the release; the engine's own
/// capture, in the same order, holds the peak before its allocator gives anything back, and
/// with the KV cache beside it reaches the device's limit past the request (or runs out of
/// memory outside the allocator, in a graph's instantiation). So the pass's graphs take what
/// it held at its peak.
///
/// Two other things read as memory given back, and are not this: the reading's error (the
/// peak and the end are two windows from one baseline, each off by at most `window`), and
/// memory of the priming graph that came back inside the pass (at most what it still held,
/// `outstanding`, which the estimate counts apart: [`Primed::may_come_back`]).
fn given_back_inside(pass: &Pass, window: u64, outstanding: i64) -> u64 {
    let drop = pass.peak.saturating_sub(pass.total);
    let explained = i64::try_from(window)
        .unwrap_or(i64::MAX)
        .saturating_add(outstanding.max(0));
    if drop > explained {
        u64::try_from(drop).unwrap_or(0)
    } else {
        0
    }
}

/// Captures of one size, each alone (released before the next).
#[derive(Debug, Default)]
struct Repeats {
    /// Bytes of each capture.
    bytes: Vec<i64>,
    /// Driver used memory where each capture's window opened (the previous one released and
    /// settled); empty where the driver reading has no used figure.
    baselines: Vec<i64>,
    /// Each idle window: read again where the capture's window opened, with nothing done in
    /// between, so all it shows is the reading's error on a window of this phase.
    idle: Vec<i64>,
}

impl Repeats {
    /// How far the repeats' windows are off from one another by the reading alone: the range of
    /// the idle windows, taken at what it surely shows of the noise ([`surely_noise`]), at most
    /// `bound` (the range a window error of `tolerance` allows, twice it).
    fn noise(&self, tolerance: u64) -> Noise {
        let bound = tolerance.saturating_mul(2);
        let seen = match (self.idle.iter().min(), self.idle.iter().max()) {
            (Some(lo), Some(hi)) => surely_noise(
                u64::try_from(hi.saturating_sub(*lo)).unwrap_or(0),
                self.idle.len(),
            ),
            _ => bound,
        };
        Noise {
            bound,
            seen: seen.min(bound),
            hidden: 0,
        }
    }
}

/// The upper 99.95% point of the range of `n` normal samples, in standard deviations, for the
/// largest tabulated count at or below `n` (4, 12, 32: the counts of repeats `full` takes; four
/// for fewer, which `full` never reads), with
/// the expected range d2 of as many ([`t_and_d2`]): 5.55 for 4, 6.31 for 12, 6.94 for 32,
/// computed numerically (a million simulated draws of each count; the tables of the range's
/// percentage points, e.g. Pearson and Hartley's *Biometrika Tables for Statisticians*, table
/// 22, stop at 99.9%).
fn range_upper_point(n: usize) -> (f64, f64) {
    if n >= REPEATS + MORE_REPEATS + FURTHER_REPEATS {
        (6.94, t_and_d2(n).1)
    } else if n >= REPEATS + MORE_REPEATS {
        (6.31, t_and_d2(n).1)
    } else {
        (5.55, t_and_d2(REPEATS).1)
    }
}

/// What `n` idle windows whose range was `range` surely show of the reading's noise on the
/// repeats' windows: the range `n` windows of that noise are expected to have, from the
/// noise's lower bound at 99.95% (`range` over the upper 99.95% point of the range of `n`
/// samples, times their expected range d2: [`range_upper_point`]), about half the range seen
/// for twelve. The idle windows' range is itself one draw of the noise's range, as likely above
/// its expectation as below; taken off the repeats' range whole, a draw that came out high read
/// a capture variation the noise had not explained as none. Twelve repeats of a 87 MB capture
/// ranged 711 KB beside idle windows that ranged 867 KB: no margin for variation, though the
/// executable objects beneath varied by 2.1% of their 10 MB each, and the engine's 35 captures
/// took 2.8 MB more than the pass, past the request in serving. The bound is at the confidence
/// the margin's own factor keeps ([`margin_factor`]), so the noise taken off errs as the
/// margin does, towards keeping more.
fn surely_noise(range: u64, n: usize) -> u64 {
    let (upper, d2) = range_upper_point(n);
    (range as f64 * d2 / upper).floor() as u64
}

/// The reading's error on the repeats' windows (see [`Repeats::noise`]).
#[derive(Debug, Clone, Copy, Default)]
struct Noise {
    /// The range of window errors the reading's measured window error allows: the most a
    /// repeat's window may be off from another's by the reading alone.
    bound: u64,
    /// The range of the idle windows: how far the windows were off from one another by the
    /// reading alone, as seen.
    seen: u64,
    /// The step every window came out a multiple of, where it is large enough beside a capture
    /// to hide a variation that matters ([`hidden_by_step`]); 0 elsewhere.
    hidden: u64,
}

impl Noise {
    /// The same noise, for windows that all came out a multiple of `step` (see
    /// [`hidden_by_step`]) with repeats `repeats`.
    fn stepped(self, repeats: &[i64], step: u64) -> Noise {
        Noise {
            hidden: hidden_by_step(repeats, step),
            ..self
        }
    }
}

/// The capture-to-capture variation that windows in steps of `step` hide from the repeats:
/// the step itself, where it could hide a variation of [`HIDDEN_VARIATION_PER_MILLE`] of the
/// repeats' median (0 elsewhere: a step of a few bytes, or one far below any variation that
/// matters). A reading that moves in steps rounds every window to a multiple of the step, so
/// captures that differ by less than a step read the same, or one step apart, depending on
/// where the window's readings fell between steps, not on the capture: the repeats' range is
/// then one step whatever the captures did, and nothing in it (nor in the idle windows, which
/// read 0 or a step just the same) tells a variation below the step from none. Twelve repeats
/// of a capture that varies uniformly over a whole step still show two values, one step apart,
/// more often than not. So the margin takes the step as the repeats' range at least: taking
/// the idle windows' step off that range read the variation of twelve repeats in 256 MiB steps
/// as none at all, and the engine's 35 captures then took up to 235 MiB more than the
/// request. It is the same rule as allocation probes' resolution (see
/// [`probed_variation_margin`]): what a measurement cannot resolve is counted as variation.
fn hidden_by_step(repeats: &[i64], step: u64) -> u64 {
    match median(repeats) {
        // A median of no step at all (captures smaller than a step, read as 0 or a step):
        // the step hides all of them.
        Some(m) if step as f64 * 1000.0 > m.max(0) as f64 * HIDDEN_VARIATION_PER_MILLE as f64 => {
            step
        }
        _ => 0,
    }
}

/// Capture `size` again `times` times, each alone (released before the next), adding to `r`.
fn repeat(ctx: &mut GraphContext<'_>, size: u32, times: usize, r: &mut Repeats) -> Result<()> {
    for _ in 0..times {
        ctx.release_graphs()?;
        ctx.warm_up(size)?;
        let before = ctx.flushed_snapshot()?;
        let idle = ctx.snapshot()?;
        r.idle.push(ctx.graph_bytes(&before.window_to(&idle)).bytes);
        ctx.capture(size)?;
        let after = ctx.flushed_snapshot()?;
        r.bytes
            .push(ctx.graph_bytes(&before.window_to(&after)).bytes);
        if let Some(used) = before.driver_used() {
            r.baselines.push(i64::try_from(used).unwrap_or(i64::MAX));
        }
    }
    Ok(())
}

/// What the runtime keeps of every capture after the graph is destroyed (per-capture memory a
/// runtime holds for good, a few MiB per capture on some platforms), from the driver used
/// memory where each repeat's window opened (`baselines`): between two openings one capture
/// was taken and released, so their difference is what it left held, give or take memory a
/// release gave back late and the reading's window error (`tolerance`). The lower median of
/// the later half of the differences, less the window error, at least 0: a runtime
/// that gives a destroyed graph's memory back some synchronizes late moves the first
/// differences (the pass's graphs coming back, a repeat's memory still out), and has reached
/// its steady state by the later half, where what one release gives back late balances what
/// the next keeps waiting. Every error leans towards keeping less, which widens the pass's
/// margin, never narrows it: an estimate too small only keeps memory that will not come back.
fn kept_per_capture(baselines: &[i64], tolerance: u64) -> u64 {
    let diffs: Vec<i64> = baselines
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect();
    let mut later = diffs[diffs.len() / 2..].to_vec();
    later.sort_unstable();
    let Some(&m) = later.get(later.len().saturating_sub(1) / 2) else {
        return 0;
    };
    u64::try_from(m.saturating_sub(i64::try_from(tolerance).unwrap_or(i64::MAX))).unwrap_or(0)
}

/// How many times the largest repeat's excess over the median a repeat must fall below the
/// median to be read as memory coming back inside its window rather than as variation (see
/// [`spread`]).
const CAME_BACK_EXCESSES: f64 = 3.0;

/// The repeats' range and their median, leaving out repeats that read far below the others.
/// Memory that comes back inside a repeat's window (a release the runtime completes after more
/// synchronizes than the settle waits for: the whole pass's graphs, in the first repeat after
/// it) makes that window read less than its capture took, by up to everything that came back:
/// it says nothing of how much more a capture can take, which is what the margin is for, yet
/// the range would count it (and a mean would fall with it, even below zero). A variation as
/// likely either way puts the lowest repeat about as far below the median as the highest is
/// above it; one below the median by more than [`CAME_BACK_EXCESSES`] times that excess (and
/// the reading's window error, `noise`), and below half the median (a capture that cost half
/// what the same capture costs otherwise), is left out. The median stands for the mean.
fn spread(repeats: &[i64], noise: u64) -> Option<(i64, f64)> {
    let (kept, median) = kept_repeats(repeats, noise)?;
    let (lo, hi) = (*kept.first()?, *kept.last()?);
    Some((hi.saturating_sub(lo), median))
}

/// The repeats [`spread`] keeps (in ascending order: those not left out as memory coming back
/// inside their window) and the median of all of them.
fn kept_repeats(repeats: &[i64], noise: u64) -> Option<(Vec<i64>, f64)> {
    let hi = *repeats.iter().max()?;
    let mut v = repeats.to_vec();
    v.sort_unstable();
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] as f64 + v[mid] as f64) / 2.0
    } else {
        v[mid] as f64
    };
    let excess = (hi as f64 - median).max(0.0);
    let floor = (median - CAME_BACK_EXCESSES * excess - noise as f64).min(median / 2.0);
    let from = v
        .iter()
        .position(|x| *x as f64 >= floor)
        .unwrap_or(v.len() - 1);
    Some((v.split_off(from), median))
}

/// The sample standard deviation of `v` (divisor `n - 1`, the estimator Student's t is built
/// on); 0 for fewer than two values.
fn sample_sd(v: &[i64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let n = v.len() as f64;
    let mean = v.iter().map(|x| *x as f64).sum::<f64>() / n;
    let squares = v.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>();
    (squares / (n - 1.0)).sqrt()
}

/// The range the margin takes the repeats' variation at (see the module docs, "What stands for
/// the standard deviation"), with their median: the larger of the range of the repeats
/// [`spread`] keeps and the range `d2(n)` times their sample standard deviation stands for
/// (`n` the count of repeats, as [`margin_factor`] divides by `d2(n)`), so that the margin is
/// `k` times the larger of the two estimates of one capture's standard deviation, `range /
/// d2(n)` and `s`. The reports ([`spread_per_mille`]) keep the range as seen.
fn margin_range(repeats: &[i64], noise: u64) -> Option<(f64, f64)> {
    let (kept, median) = kept_repeats(repeats, noise)?;
    let range = (*kept.last()? - *kept.first()?).max(0) as f64;
    let d2 = t_and_d2(repeats.len()).1;
    Some((range.max(d2 * sample_sd(&kept)), median))
}

/// The repeats' spread beyond what the reading's error on their windows explains, per mille
/// of their median (see [`spread`] and [`varied_beyond_noise`]), rounded: for reports.
fn spread_per_mille(repeats: &[i64], noise: Noise) -> u64 {
    (spread_share(repeats, noise) * 1000.0).round() as u64
}

/// The same spread as a share of the median, unrounded: what the decision to take more
/// repeats uses (the margin takes the same share of its own range, [`margin_range`]). Rounded
/// to whole per mille, a spread under half of one (18 KB over a 93 MB capture) read as none:
/// no more repeats, no margin, and 35 graphs' variations then added up past the request.
fn spread_share(repeats: &[i64], noise: Noise) -> f64 {
    let Some((range, middle)) = spread(repeats, noise.bound) else {
        return 0.0;
    };
    share_of(varied_beyond_noise(range as f64, noise.seen), middle)
}

/// `varied` as a share of the repeats' `middle`: 0 where either is not positive.
fn share_of(varied: f64, middle: f64) -> f64 {
    if middle <= 0.0 || varied <= 0.0 {
        return 0.0;
    }
    varied / middle
}

/// The part of the repeats' range `range` (see [`spread`]) that the reading's error on their
/// windows, `noise` (the range of the idle windows, see [`Repeats::noise`]), does not explain.
/// The capture's variation and the reading's error are independent, so their spreads add in
/// quadrature, not linearly: subtracting the whole window error from the range would take a
/// variation about as large as the noise for none at all.
///
/// What is taken off is the noise the idle windows showed, not the most the measured window
/// error allows: that bound is the largest error a window may have, and the repeats' windows
/// need not reach it. Taken off at the bound, a range within it read as no variation at all
/// even where the reading was quiet and the whole range was the capture's (a 38 MB range of
/// 12 repeats inside a 51 MB bound left no margin, and the engine's captures then took 180 MiB
/// more than the pass).
fn varied_beyond_noise(range: f64, noise: u64) -> f64 {
    let range = range.max(0.0);
    let noise = noise as f64;
    (range * range - noise * noise).max(0.0).sqrt()
}

/// Whether the reading's window error (`noise.bound` between two windows), or the step every
/// capture's window came out a multiple of (`quantum`, [`quantum`]), is large enough, beside
/// the repeats' median, to hide a variation of [`HIDDEN_VARIATION_PER_MILLE`]: four repeats
/// whose range it covers say nothing of such a variation, and more are taken. A free reading
/// that moves in steps (an RTX 3090 whose reading steps by 32 MiB), or captures that take whole
/// segments of a coarse granule, show four equal repeats where the executable objects beneath
/// vary by up to a step each (four repeats of exactly 224 MiB, no margin, and the engine's
/// captures then took 59 MiB more than the request). A step larger than the captures
/// themselves (repeats that read 0, or 0 and a step) hides them whole ([`hidden_by_step`]).
fn hides_variation(repeats: &[i64], noise: Noise, quantum: u64) -> bool {
    let Some(median) = median(repeats) else {
        return false;
    };
    let hides = noise.bound.max(quantum);
    (median > 0 && hides as f64 * 1000.0 > median as f64 * HIDDEN_VARIATION_PER_MILLE as f64)
        || hidden_by_step(repeats, quantum) > 0
}

/// Whether a variation the repeats' noise could hide, summed over every graph, could pass what
/// the margin keeps for the reading (its two windows, [`independent_margin`]): four repeats
/// whose range is within the idle windows' read as no variation at all, yet each capture may
/// vary by up to the noise (`noise.bound`, as a share of the repeats' median), and over every
/// graph such variations add as [`variation_margin`] adds them, in quadrature of the graphs'
/// bytes. That sum passes the two windows' `noise.bound` wherever the graphs together weigh
/// more than one repeat (`sqrt(sum of squares) > median`): any noisy reading and more than one
/// graph of the first size's weight. More repeats are then taken, which tell a variation from
/// the noise better. On an APU whose reading's windows were off by up to 11 MiB, four repeats
/// of a 394 MB capture ranged 8.5 MB inside 8.6 MB of idle noise: no margin for variation, and
/// the engine's 67 graphs (16.3 GB of them, mostly executable objects) took 71 MB more than the
/// pass, past the request in serving; twelve repeats kept 215 MB for it.
fn hidden_variation_sums_past_the_windows(repeats: &[i64], each: &[i64], noise: Noise) -> bool {
    let Some(median) = median(repeats).filter(|m| *m > 0) else {
        return false;
    };
    if noise.bound == 0 {
        return false;
    }
    let summed = noise.bound as f64 / median as f64 * in_quadrature(each);
    summed > noise.bound as f64
}

/// The graphs' bytes `each` added in quadrature, `sqrt(sum of squares)` (negative windows as
/// 0): how independent variations in proportion to each graph add up over all of them.
fn in_quadrature(each: &[i64]) -> f64 {
    each.iter()
        .map(|c| (*c.max(&0) as f64).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// The step the windows of `captures` come out a multiple of: their greatest common divisor
/// (positive windows only; 0 for none). Windows of a reading that counts bytes share no
/// coarse divisor; windows of a reading that moves in steps, or of captures that take whole
/// segments, share the step.
fn quantum(captures: &[i64]) -> u64 {
    captures
        .iter()
        .filter_map(|c| u64::try_from(*c).ok())
        .filter(|c| *c > 0)
        .fold(0, crate::plan::gcd)
}

/// The step windows in `quantum` steps hide, where the reading's own step (`reading`,
/// [`Profile::free_step`](crate::Profile), 0 where unknown) is known: their common divisor.
/// Windows that all read the same share that value as their divisor, which says nothing of a
/// step: twelve repeats of one 7.38 GiB capture on a reading in 64 MiB steps gave a "step" of
/// 7.38 GiB, the margin took the whole capture as hidden variation (9.17 GiB), and a 1.5B model
/// that fitted was refused. The reading moves in its own step, and hides no more than that.
fn within_reading_step(quantum: u64, reading: u64) -> u64 {
    if reading == 0 {
        quantum
    } else {
        crate::plan::gcd(quantum, reading)
    }
}

/// The median of `v` (the upper one of an even count); `None` for no values.
pub(super) fn median(v: &[i64]) -> Option<i64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// A capture-to-capture variation (per mille of a capture) that four repeats must be able to
/// see beyond the reading's window error; where the window error could hide it, more repeats
/// are taken (see [`hides_variation`]).
pub const HIDDEN_VARIATION_PER_MILLE: u64 = 75;

/// The margin for capture-to-capture variation from the repeats and every capture's bytes, the
/// repeats' windows read with `noise` (only what exceeds it counts as variation).
fn variation_margin(repeats: &[i64], each: &[i64], noise: Noise) -> u64 {
    let Some((range, middle)) = margin_range(repeats, noise.bound) else {
        return 0;
    };
    // The variation beyond the noise relative to one capture, at most the whole capture.
    let beyond = varied_beyond_noise(range, noise.seen);
    let spread = share_of(beyond, middle).min(1.0);
    if spread <= 0.0 && noise.hidden == 0 {
        return 0;
    }
    // Scaled to every graph two ways, the larger kept: in proportion to each graph's bytes
    // (a variation of the whole capture), and as the same bytes for every graph (a variation
    // of the executable object, whose size follows the kernel count, not the batch: a
    // proportional scaling from the largest size would understate the smaller ones).
    let quadrature = in_quadrature(each);
    // What the windows' step hides is a variation of the same bytes for every graph (the
    // step does not grow with a capture), counted at least (see `hidden_by_step`).
    let varied = beyond.max(noise.hidden as f64);
    let same_bytes = varied * (each.len() as f64).sqrt();
    let k = margin_factor(repeats.len());
    (k * (spread * quadrature).max(same_bytes)).ceil() as u64
}

/// The margin for the pass's capture-to-capture variation (`variation`, [`variation_margin`])
/// beside the reading's error on two windows (`window` each: the pass's own and the engine's
/// other memory measured through the free reading). The captures' variation and the windows'
/// reads are independent, and each margin is a bound of about the same confidence (the
/// variation's one-sided 99.95%, the window error about 3.6 standard deviations,
/// [`kept_window_error`](super::context::kept_window_error)), so the two add as independent
/// errors do, in quadrature: `sqrt(variation^2 + (2 window)^2)`, as the repeats' range and
/// their noise are told apart ([`varied_beyond_noise`]). Added whole, both were counted at their
/// extreme at once: on a reading good to 20 MiB a window, a pass whose captures varied by 180
/// MiB kept 220 MiB where 184 MiB bound both at the same confidence. The two windows stay
/// added whole (`2 window`): where the repeats' noise hides the captures' variation (a range
/// within the idle windows' reads as none, [`varied_beyond_noise`]), they are all the margin
/// there is for it, and a quiet pass on a noisy APU kept 1.41 windows in quadrature and went
/// 18 MiB past the request in serving.
fn independent_margin(variation: u64, window: u64) -> u64 {
    let v = variation as f64;
    let w = window.saturating_mul(2) as f64;
    ((v * v + w * w).sqrt().ceil() as u64)
        .max(variation)
        .max(window.saturating_mul(2))
}

/// The margin of a pass measured by allocation probes ([`by_probes`]): its captures'
/// variation (`variation`) and the reading's error on one window (`window`) in quadrature, as
/// [`independent_margin`] keeps two. The pass's own window is the probes', whose error
/// [`step_growth`](crate::session::probe::step_growth) already counts on the safe side; the
/// window kept is the one for the engine's other memory measured through the reading
/// ([`keeps_a_window_for_other_memory`]). The plan joins the other windows' error to this
/// margin as if it kept two (`plan::build`), which keeps more than one would, never less (the
/// difference `sqrt(v^2 + (a + r)^2) - sqrt(v^2 + a^2)` grows with `a`). Two windows of a
/// reading in 768 MiB steps kept 1.5 GiB beside 1.3 GB of graphs the probes measured to 2 MiB.
fn probed_pass_margin(variation: u64, window: u64) -> u64 {
    let v = variation as f64;
    let w = window as f64;
    ((v * v + w * w).sqrt().ceil() as u64)
        .max(variation)
        .max(window)
}

/// The error each window [`independent_margin`] keeps is taken at: the reading's window error
/// kept (`tolerance`, [`GraphContext::window_tolerance`]: 1.25 times the largest error
/// calibration or the session's start saw on a window plus a MiB of slack, at least the step
/// their reads all came out a multiple of, [`kept_window_error`](super::kept_window_error)),
/// except where this phase's own windows show the reading more finely than that measurement
/// could. Calibration reads windows over raw allocations, which a driver maps in whole pages
/// (a 37 MiB allocation takes 38 MiB of 2 MiB pages): beside a free memory in whole pages,
/// every one of its reads is a multiple of the page, and a window reads the page rounding as
/// an error of the reading (1 MiB) and the page as the reading's step, even where the reading
/// counts bytes. The repeats' windows measure the same reading without raw allocations:
/// - every idle window (`idle`, two reads of unchanged memory at each repeat's opening, 12 or
///   32 of them) read exactly 0: the reading did not move by a byte with nothing done, so it
///   carries no noise for the slack to stand for, nor one that moves in whole steps;
/// - the step a reading moves in divides every read, so it divides every window of two single
///   reads (`single_reads`; a mean of several reads moves by less than a step): the common
///   divisor of the pass's and the repeats' windows with the step calibration saw (`step`,
///   [`within_reading_step`] of [`quantum`]) is a multiple of it.
///
/// A reading without noise is off on a window only by where its two reads fall between its
/// steps: by less than one step, so a window is kept at that step where it is less than
/// `tolerance`. A reading that moves in coarse steps still keeps its step (its windows are
/// all multiples of it), a noisy one keeps `tolerance` (its idle windows moved), and so does a
/// `step` of 0 (no window of the phase moved). On a process-local reading whose calibration
/// windows were off by the 1 MiB of page rounding, 32 repeats of an 86 MB capture varied by
/// 10 KB beside 32 idle windows of 0 and windows in single bytes, yet the margin kept two
/// windows of 1 MiB (the plan a third beside it) for an error no window showed, and the KV
/// cache, in steps of 256 MiB, came out 0.21 MiB short of its next step: 98.28% of the oracle.
fn quiet_reading_window(tolerance: u64, idle: &[i64], single_reads: bool, step: u64) -> u64 {
    let quiet = !idle.is_empty() && idle.iter().all(|w| *w == 0);
    if quiet && single_reads && step > 0 {
        tolerance.min(step)
    } else {
        tolerance
    }
}

/// Whether the margin of a graph estimate of `kind` keeps the error of one window of the free
/// reading for the engine's other memory measured through it ([`independent_margin`]): `full`
/// and `post-capture`. The plan keeps the rest of that memory's windows' error beside it
/// (`plan::build`).
pub(crate) fn keeps_a_window_for_other_memory(kind: StrategyKind) -> bool {
    matches!(kind, StrategyKind::Full | StrategyKind::PostCapture)
}

/// The margin for capture-to-capture variation `margin` (one capture's bound, [`variation_margin`])
/// as the plan keeps it: where the plan does not warn that the captures vary
/// (`unwarned`: a spread within [`VARIATION_REPORTED_PER_MILLE`]), `sqrt(2)` times it, a bound
/// at the same confidence on the difference between the engine's later captures and the
/// measured pass, two independent draws of every graph (see the module docs); where it warns
/// ([`Warning::GraphCaptureVaries`]), one capture's bound, the warning naming the variation a
/// later capture can still exceed it by. Quiet captures are where a plan says nothing of the
/// variation, so that is where its margin must hold: a spread of 0.46% over 32 repeats of a
/// 342 MB capture kept 8.3 MB for 35 graphs, and the engine's later captures took 9.8 MB more
/// than the pass (the bound on the difference keeps 11.7 MB). Where the captures vary by more,
/// the same factor costs the most memory (a quarter of the graphs' bytes where they vary by
/// 20%), and the warning says what the plan could not bound.
fn unwarned_margin(margin: u64, unwarned: bool) -> u64 {
    if unwarned {
        (margin as f64 * std::f64::consts::SQRT_2).ceil() as u64
    } else {
        margin
    }
}

/// Captures of one size measured by allocation probes, where no reading measures this process
/// (`conservative`'s measurement, see its module docs): as many as `full` takes once its first
/// four vary.
pub(super) const PROBED_REPEATS: usize = REPEATS + MORE_REPEATS;

/// The margin for capture-to-capture variation of `graphs` graphs from `repeats` captures of
/// one size each measured by allocation probes of resolution `resolution`: `full`'s margin
/// (see the module docs) as the same bytes for every graph, the one model that needs no
/// per-graph figure (the probes measure the whole pass, not each capture). A probe brackets
/// what is allocatable within its resolution, so each repeat's window is off by up to that
/// either way: it is left in the range as variation (two searches over memory that did not
/// change agree exactly, so no idle window would show it), which errs on the safe side.
///
/// A range is never taken below what the probes cannot tell apart (`alike`: captures up to
/// that far apart read alike, [`alike_within`](crate::session::probe::alike_within), at least
/// one resolution): a probe moves in the whole pages a driver commits a raw allocation in, so
/// captures that differ by less than a page fall into one bracket and read alike, and repeats
/// that all read the same do not show that the capture does not vary. It is the rule of a
/// free reading that moves in steps ([`hidden_by_step`]): the step is the least range, and
/// what the plan warns of is what the repeats show beyond the probes' own error (twelve
/// identical probed repeats of a 150 MB capture, at a 2.26 MB resolution, kept no margin, and
/// the engine's 35 captures later took 2.6 MiB more; twelve of a 206 MB capture, at the
/// search's 0.39 MB where the probes moved in 2 MiB pages, kept 4.5 MB for 36 graphs, and
/// the engine's captures took 5.3 MB past the reserve).
pub(super) fn probed_variation_margin(
    repeats: &[i64],
    graphs: usize,
    resolution: u64,
    alike: u64,
) -> u64 {
    let Some((range, _)) = spread(repeats, resolution.saturating_mul(2)) else {
        return 0;
    };
    let range = (range.max(0) as u64).max(resolution).max(alike);
    let varied = range as f64 * (graphs as f64).sqrt();
    // As `full`'s: the bound on the difference between the engine's later captures and the
    // probed pass where the plan does not warn of the variation ([`unwarned_margin`]).
    unwarned_margin(
        (margin_factor(repeats.len()) * varied).ceil() as u64,
        probed_spread_per_mille(repeats, resolution) <= VARIATION_REPORTED_PER_MILLE,
    )
}

/// How much probed repeats of one capture (`repeats`, probes of resolution `resolution`) vary
/// beyond what the probes' resolution explains, per mille of their median: over
/// [`VARIATION_REPORTED_PER_MILLE`], the plan warns ([`Warning::GraphCaptureVaries`]), as
/// `full` does for its repeats.
pub(super) fn probed_spread_per_mille(repeats: &[i64], resolution: u64) -> u64 {
    spread_per_mille(
        repeats,
        Noise {
            bound: resolution.saturating_mul(2),
            seen: resolution,
            hidden: 0,
        },
    )
}

fn source(from_driver: bool) -> &'static str {
    if from_driver {
        "driver free (everything this process holds)"
    } else {
        "allocator reserved only (executable objects not seen)"
    }
}

impl GraphStrategy for Full {
    fn kind(&self) -> StrategyKind {
        StrategyKind::Full
    }

    fn run(&self, ctx: &mut GraphContext<'_>) -> Result<GraphEstimate> {
        let primed = match ctx.sizes().first() {
            Some(&size) => ctx.prime(size)?,
            None => Primed::default(),
        };
        // Where the reading's step hides the captures (a step over 7.5% of the priming capture
        // as read), the pass and the repeats are measured by allocation probes instead
        // ([`by_probes`]).
        let probe_limit = ctx
            .step_probe_limit()
            .filter(|_| hidden_by_step(&[primed.returned], ctx.reading_step()) > 0);
        let start = match probe_limit {
            Some(limit) => {
                ctx.flushed_snapshot()?;
                ctx.probe_free(limit, None)?
            }
            None => None,
        };
        let pass = capture_all(ctx)?;
        if let (Some(limit), Some(start), Some(&size)) = (probe_limit, start, ctx.sizes().first()) {
            if let Some(e) = by_probes(ctx, &primed, &pass, size, limit, start)? {
                return Ok(e);
            }
        }
        let n = pass.each.len();
        let mut recaptures: Vec<i64> = pass.each.first().copied().into_iter().collect();
        let (margin, n_repeats, kept, window) = match ctx.sizes().first() {
            Some(&size) if pass.from_driver && !pass.each.is_empty() => {
                let mut r = Repeats::default();
                repeat(ctx, size, REPEATS, &mut r)?;
                // Windows compared with windows: how far one may be off is the reading's
                // window error (measured at the start where it could be), not its declared
                // tolerance, which often covers an offset a window cancels.
                let tol = ctx.window_tolerance();
                // The step the pass's and the repeats' windows all came out a multiple of, and
                // the repeats' noise with what that step hides counted.
                let reading_step = ctx.reading_step();
                let step_of = |r: &Repeats| {
                    within_reading_step(
                        quantum(&[pass.each.as_slice(), r.bytes.as_slice()].concat()),
                        reading_step,
                    )
                };
                let stepped_noise = |r: &Repeats| r.noise(tol).stepped(&r.bytes, step_of(r));
                let noise = r.noise(tol);
                if spread_share(&r.bytes, noise) > 0.0
                    || hides_variation(&r.bytes, noise, step_of(&r))
                    || hidden_variation_sums_past_the_windows(&r.bytes, &pass.each, noise)
                {
                    repeat(ctx, size, MORE_REPEATS, &mut r)?;
                }
                let noise = stepped_noise(&r);
                if r.bytes.len() >= REPEATS + MORE_REPEATS
                    && further_repeats_pay(
                        variation_margin(&r.bytes, &pass.each, noise),
                        kept_per_capture(&r.baselines, tol),
                    )
                {
                    repeat(ctx, size, FURTHER_REPEATS, &mut r)?;
                }
                let noise = stepped_noise(&r);
                let repeats = &r.bytes;
                recaptures.extend(repeats);
                let spread = spread_per_mille(repeats, noise);
                let margin = unwarned_margin(
                    variation_margin(repeats, &pass.each, noise),
                    spread <= VARIATION_REPORTED_PER_MILLE,
                );
                if spread > VARIATION_REPORTED_PER_MILLE {
                    ctx.warn(Warning::GraphCaptureVaries {
                        spread_per_mille: spread,
                        margin,
                    });
                }
                let kept = kept_per_capture(&r.baselines, tol);
                let window = quiet_reading_window(tol, &r.idle, ctx.single_reads(), step_of(&r));
                tracing::debug!(?repeats, idle = ?r.idle, ?noise, kept, margin, window, ?primed, "repeats of the first size");
                (margin, repeats.len(), kept, window)
            }
            _ => (0, 0, 0, ctx.window_tolerance()),
        };
        // Memory the allocator gave back inside the pass: the engine's capture holds it
        // before giving anything back ([`given_back_inside`]).
        let given_back = given_back_inside(&pass, ctx.window_tolerance(), primed.outstanding);
        if given_back > 0 {
            tracing::warn!(
                bytes = given_back,
                peak = pass.peak,
                end = pass.total,
                "memory was given back inside the full pass: its graphs are taken at the pass's peak"
            );
        }
        let bytes = pass
            .total
            .saturating_add(i64::try_from(given_back).unwrap_or(i64::MAX));
        let tol = ctx.free_tolerance();
        // Memory of the priming graph that its release had not given back when the pass
        // started may have come back inside the pass (a runtime that waits more synchronizes
        // than the settle): the pass measured up to that much less than its captures took.
        // A capture of that size: the median of the pass's first capture and the repeats (a
        // capture-to-capture variation or a window that something came back inside moves one
        // of them, not the median), less what the runtime keeps of every capture for good
        // (measured over the repeats): that part of the priming capture never comes back.
        let not_back = median(&recaptures).map_or(0, |r| {
            primed.may_come_back(r.saturating_sub(i64::try_from(kept).unwrap_or(i64::MAX)))
        });
        if not_back > ctx.window_tolerance() {
            tracing::warn!(
                bytes = not_back,
                "the priming graph's memory had not come back after the settle: the pass is widened by it"
            );
        }
        // The windows this estimate and the engine's other measured memory come from may be
        // off by the reading's window error each; those errors and the captures' variation are
        // independent, so they add to it in quadrature ([`independent_margin`]). What the priming
        // graph did not give back is one-sided, not an error of either: it adds whole.
        let variation = margin;
        let margin = independent_margin(margin, window).saturating_add(not_back);
        let mut e = GraphEstimate::new(
            StrategyKind::Full,
            n,
            bytes,
            margin,
            source(pass.from_driver),
        );
        e.uncertainty = tol.saturating_add(margin);
        e.variation = variation;
        e.window = (window < ctx.window_tolerance()).then_some(window);
        e.explanation = format!(
            "captured the first size once (memory a library takes on the first capture is held from there on), then all {n} sizes into a throwaway pool, each after releasing cached memory: {} measured{}{}{}{}",
            fmt_signed(bytes),
            if given_back > 0 {
                format!(" at the pass's peak ({} at its end: the allocator gave {} of cached memory back inside the pass, as it does where the device cannot serve a request; the engine's capture holds it before giving anything back)", fmt_signed(pass.total), fmt_bytes(given_back))
            } else {
                String::new()
            },
            if margin > 0 {
                format!(", margin {} for the capture-to-capture variation of {n_repeats} repeats and the reading's window error", fmt_bytes(margin))
            } else {
                String::new()
            },
            if tol > 0 { format!(" (the reading is good to ±{})", fmt_bytes(tol)) } else { String::new() },
            if not_back > 0 {
                format!("; {} of the priming graph had not come back after its release (the margin includes it: it may have come back inside the pass)", fmt_bytes(not_back))
            } else {
                String::new()
            }
        );
        Ok(e)
    }
}

/// `full` where the free reading moves in steps coarse enough for a probe
/// ([`GraphContext::step_probe_limit`]) and to hide its captures (the step over
/// [`HIDDEN_VARIATION_PER_MILLE`] of the priming capture as read, [`hidden_by_step`]): the
/// pass and the repeats measured by allocation probes, whose resolution does not depend on the step.
///
/// A reading in steps reads a window up to a step off, and repeats of a capture smaller than a
/// step read 0 or a step whatever the capture did: no range of theirs tells a variation from
/// none, and the margin counted the whole step as the range of every graph (`k * step *
/// sqrt(graphs)`, times `sqrt(2)` where the plan does not warn). On a 24 GiB card whose free
/// reading moves in 768 MiB steps that kept 5.5 GiB for 35 graphs of 1.3 GB, and refused
/// every start-up the device had room for; in 256 MiB steps it kept 2 GB more than the graphs
/// took. The largest allocation that succeeds moves in the driver's pages: probed before the
/// pass (the first size primed and released, the cache released) and after it, it measures
/// what the pass took within the search's resolution and a page (on the safe side,
/// [`step_growth`](crate::session::probe::step_growth)); the first size is captured again
/// [`PROBED_REPEATS`] times, each measured by probes, and their range sizes the margin as
/// `conservative`'s probed repeats do ([`probed_variation_margin`]). The margin keeps the
/// reading's window error on one window beside it ([`probed_pass_margin`]). Each probe holds
/// what is free for an instant, named ([`Warning::ProbesTakeFreeMemory`]).
///
/// `None` where a probe could not be taken (the device cannot allocate): the reading's
/// measurement stands.
fn by_probes(
    ctx: &mut GraphContext<'_>,
    primed: &Primed,
    pass: &Pass,
    size: u32,
    limit: u64,
    start: u64,
) -> Result<Option<GraphEstimate>> {
    ctx.flushed_snapshot()?;
    let Some(end) = ctx.probe_free(limit, Some(start))? else {
        return Ok(None);
    };
    let n = pass.each.len();
    let resolution = crate::session::probe::resolution(limit);
    let alike = crate::session::probe::alike_within(limit);
    let Some(repeats) =
        super::simple::probed_repeats(ctx, size, (n, resolution, alike), |c, hint| {
            c.probe_free(limit, hint)
        })?
    else {
        return Ok(None);
    };
    let took = crate::session::probe::step_growth(start, end, limit, 0).max(0);
    let variation = probed_variation_margin(&repeats, n, resolution, alike);
    let spread = probed_spread_per_mille(&repeats, resolution);
    if spread > VARIATION_REPORTED_PER_MILLE {
        ctx.warn(Warning::GraphCaptureVaries {
            spread_per_mille: spread,
            margin: variation,
        });
    }
    let tol = ctx.window_tolerance();
    // Memory given back inside the pass, as the reading saw it ([`given_back_inside`]).
    let given_back = given_back_inside(pass, tol, primed.outstanding);
    let bytes = took.saturating_add(i64::try_from(given_back).unwrap_or(i64::MAX));
    // What the priming graph had not given back may have come back inside the pass, as in
    // the reading's measurement: a capture of that size is the probed repeats' median.
    let not_back = median(&repeats).map_or(0, |r| primed.may_come_back(r));
    let margin = probed_pass_margin(variation, tol).saturating_add(not_back);
    tracing::debug!(
        start,
        end,
        took,
        ?repeats,
        resolution,
        alike,
        variation,
        margin,
        not_back,
        "the pass and repeats of the first size measured by allocation probes"
    );
    let mut e = GraphEstimate::new(
        StrategyKind::Full,
        n,
        bytes,
        margin,
        "allocation probes (the free reading's step hides the captures)",
    );
    e.uncertainty = ctx.free_tolerance().saturating_add(margin);
    e.variation = variation;
    e.explanation = format!(
        "captured the first size once, then all {n} sizes into a throwaway pool; the free reading moves in steps of {} that hide the captures, so the pass was measured by the largest allocation that succeeds before and after it: {} measured{}, margin {} for the capture-to-capture variation of {} repeats of the first size, each measured by allocation probes, and the reading's window error on the engine's other memory",
        fmt_bytes(ctx.reading_step()),
        fmt_signed(bytes),
        if given_back > 0 {
            format!(" (with {} the allocator gave back inside the pass)", fmt_bytes(given_back))
        } else {
            String::new()
        },
        fmt_bytes(margin),
        repeats.len()
    );
    Ok(Some(e))
}

impl GraphStrategy for PostCapture {
    fn kind(&self) -> StrategyKind {
        StrategyKind::PostCapture
    }

    fn run(&self, ctx: &mut GraphContext<'_>) -> Result<GraphEstimate> {
        if !ctx.engine().supports_post_capture() {
            return Err(Error::unsupported(
                "post-capture sizing",
                "the engine cannot bind its KV cache after capture",
            ));
        }
        let want = ctx.phase_baseline().driver.total.ok_or_else(|| {
            Error::unsupported(
                "post-capture sizing",
                "the device reports no total to reserve the KV cache's address space for",
            )
        })?;
        // The engine has the range before the first capture; if anything below fails, the
        // session tears the graphs down and then releases the range.
        let reserved = ctx.reserve_kv_range(want)?;
        let pass = capture_all(ctx)?;
        let n = pass.each.len();
        let tol = ctx.free_tolerance();
        // Its window and the engine's other measured memory may be off by the reading's
        // window error each.
        let margin = ctx.window_tolerance().saturating_mul(2);
        let mut e = GraphEstimate::new(
            StrategyKind::PostCapture,
            n,
            pass.total,
            margin,
            source(pass.from_driver),
        );
        e.uncertainty = tol.saturating_add(margin);
        e.kept = true;
        e.explanation = format!(
            "reserved {} of address space for the KV cache and gave it to the engine, captured all {n} sizes for good: they hold {}; the KV cache is sized from real usage, nothing is estimated",
            fmt_bytes(reserved),
            fmt_signed(pass.total)
        );
        Ok(e)
    }
}

#[cfg(test)]
#[path = "full_tests.rs"]
mod tests;
