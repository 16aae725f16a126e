//! `full` and `post-capture`: capture every size and measure what it really took.
//!
//! `full` throws its graphs away, and the engine captures them again after the KV cache exists,
//! so what it measured must stand for a second capture. Two things can make it not:
//! - memory a library allocates once, on the first capture, and keeps (a cuBLAS workspace
//!   taken outside the caching allocator): the second capture does not take it again, and the
//!   session already counts it as this engine's memory (held after teardown);
//! - captures that do not cost the same twice (the executable object of one size varies from
//!   capture to capture).
//!
//! So `full` reads every capture in its own window (the cache released before each baseline),
//! then captures the first size again [`REPEATS`] times on its own: what the first capture took
//! beyond the most a repeat took is the one-time part, taken out of the estimate; the spread of
//! the repeats is the capture-to-capture variation, which sizes the margin (scaled to every
//! graph, as independent variations add up: `6 * spread / mean * sqrt(sum of squares)`, the
//! spread of a few repeats understating the variation more often than not).
//! `post-capture` keeps the graphs it measured, so neither applies there.

use memplan_core::bytes::{fmt_bytes, fmt_signed};
use memplan_core::{Error, Result};

use super::context::GraphContext;
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
}

/// Capture every size, each in a window opened after releasing cached memory (the warm-up's
/// cache would otherwise be released inside it).
fn capture_all(ctx: &mut GraphContext<'_>) -> Result<Pass> {
    let sizes = ctx.sizes();
    let first = ctx.flushed_snapshot()?;
    let mut each = Vec::with_capacity(sizes.len());
    let mut from_driver = true;
    let mut last = first;
    for s in &sizes {
        ctx.warm_up(*s)?;
        let before = ctx.flushed_snapshot()?;
        ctx.capture(*s)?;
        let after = ctx.flushed_snapshot()?;
        let r = ctx.graph_bytes(&before.window_to(&after));
        from_driver &= r.from_driver;
        each.push(r.bytes);
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
    })
}

/// Capture `size` again [`REPEATS`] times, each alone (released before the next): the bytes of
/// each.
fn repeat(ctx: &mut GraphContext<'_>, size: u32) -> Result<Vec<i64>> {
    let mut v = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        ctx.release_graphs()?;
        ctx.warm_up(size)?;
        let before = ctx.flushed_snapshot()?;
        ctx.capture(size)?;
        let after = ctx.flushed_snapshot()?;
        v.push(ctx.graph_bytes(&before.window_to(&after)).bytes);
    }
    Ok(v)
}

/// The repeats' spread beyond what `tolerance` explains, per mille of their mean.
fn spread_per_mille(repeats: &[i64], tolerance: u64) -> u64 {
    let (Some(&hi), Some(&lo)) = (repeats.iter().max(), repeats.iter().min()) else {
        return 0;
    };
    let noise = i64::try_from(tolerance.saturating_mul(2)).unwrap_or(i64::MAX);
    let mean = repeats.iter().map(|x| *x as f64).sum::<f64>() / repeats.len() as f64;
    let varied = hi.saturating_sub(lo).saturating_sub(noise);
    if mean <= 0.0 || varied <= 0 {
        return 0;
    }
    (varied as f64 * 1000.0 / mean).round() as u64
}

/// `(one-time bytes, margin)` from the first capture, its repeats and every capture's bytes,
/// read within `tolerance` (a window of two readings may be off by twice it: only what exceeds
/// that counts as one-time memory or as variation).
fn one_time_and_margin(first: i64, repeats: &[i64], each: &[i64], tolerance: u64) -> (u64, u64) {
    let (Some(&hi), Some(_)) = (repeats.iter().max(), repeats.iter().min()) else {
        return (0, 0);
    };
    let noise = i64::try_from(tolerance.saturating_mul(2)).unwrap_or(i64::MAX);
    let one_time = u64::try_from(first.saturating_sub(hi).saturating_sub(noise)).unwrap_or(0);
    // The variation relative to one capture, at most the whole capture.
    let spread = (spread_per_mille(repeats, tolerance) as f64 / 1000.0).min(1.0);
    if spread <= 0.0 {
        return (one_time, 0);
    }
    let squares: f64 = each.iter().map(|c| (*c.max(&0) as f64).powi(2)).sum();
    (one_time, (6.0 * spread * squares.sqrt()).ceil() as u64)
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
        let pass = capture_all(ctx)?;
        let n = pass.each.len();
        let (one_time, margin) = match (ctx.sizes().first(), pass.each.first()) {
            (Some(&size), Some(&first)) if pass.from_driver => {
                let repeats = repeat(ctx, size)?;
                let tol = ctx.free_tolerance();
                let (once, margin) = one_time_and_margin(first, &repeats, &pass.each, tol);
                let spread = spread_per_mille(&repeats, tol);
                if spread > VARIATION_REPORTED_PER_MILLE {
                    ctx.warn(Warning::GraphCaptureVaries {
                        spread_per_mille: spread,
                        margin,
                    });
                }
                (once, margin)
            }
            _ => (0, 0),
        };
        let bytes = pass
            .total
            .saturating_sub(i64::try_from(one_time).unwrap_or(i64::MAX));
        let tol = ctx.free_tolerance();
        // The windows this estimate and the engine's other measured memory come from may be
        // off by the reading's window error each.
        let margin = margin.saturating_add(ctx.window_tolerance().saturating_mul(2));
        let mut e = GraphEstimate::new(
            StrategyKind::Full,
            n,
            bytes,
            margin,
            source(pass.from_driver),
        );
        e.uncertainty = tol.saturating_add(margin);
        e.explanation = format!(
            "captured all {n} sizes into a throwaway pool, each after releasing cached memory: {} measured{}{}{}",
            fmt_signed(pass.total),
            if one_time > 0 {
                format!(", less {} the first capture took once (not taken again by a later capture; counted as held memory)", fmt_bytes(one_time))
            } else {
                String::new()
            },
            if margin > 0 {
                format!(", margin {} for the capture-to-capture variation of {REPEATS} repeats and the reading's window error", fmt_bytes(margin))
            } else {
                String::new()
            },
            if tol > 0 { format!(" (the reading is good to ±{})", fmt_bytes(tol)) } else { String::new() }
        );
        Ok(e)
    }
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
mod tests {
    use super::*;

    #[test]
    fn the_first_capture_beyond_its_repeats_is_one_time_and_their_spread_the_margin() {
        let mib = 1i64 << 20;
        // Identical repeats: no margin; the first capture took 32 MiB more once.
        let (once, margin) =
            one_time_and_margin(132 * mib, &[100 * mib; 3], &[132 * mib, 90 * mib], 0);
        assert_eq!((once, margin), (32 << 20, 0));
        // Repeats that vary by 10%: a margin that grows with every graph, not their sum.
        let each = vec![100 * mib; 16];
        let (once, margin) =
            one_time_and_margin(100 * mib, &[95 * mib, 100 * mib, 105 * mib], &each, 0);
        assert_eq!(once, 0, "the first capture took no more than a repeat");
        let sqrt_sum = (16.0f64).sqrt() * 100.0 * (1u64 << 20) as f64;
        assert_eq!(margin, (6.0 * 0.1 * sqrt_sum).ceil() as u64);
        // Four times the graphs: twice the margin (independent variations), not four times.
        let (_, margin4) = one_time_and_margin(
            100 * mib,
            &[95 * mib, 100 * mib, 105 * mib],
            &vec![100 * mib; 64],
            0,
        );
        assert!(
            margin4 <= 2 * margin + 1 && margin4 >= 2 * margin - 1,
            "{margin} {margin4}"
        );
        // Within what the reading's tolerance explains: neither.
        let (once, margin) = one_time_and_margin(
            120 * mib,
            &[90 * mib, 100 * mib, 110 * mib],
            &each,
            16 << 20,
        );
        assert_eq!((once, margin), (0, 0));
        // Nothing to compare.
        assert_eq!(one_time_and_margin(5, &[], &[5], 0), (0, 0));
    }
}
