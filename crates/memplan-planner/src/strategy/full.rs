//! `full` and `post-capture`: capture every size and measure what it really took.

use memplan_core::bytes::{fmt_bytes, fmt_signed};
use memplan_core::{Error, Result};

use super::context::GraphContext;
use super::{GraphEstimate, GraphStrategy, StrategyKind};
use crate::warning::Warning;

/// Capture every size into a throwaway pool, measure, release. Exact where the driver free
/// reading measures this process; costs one capture per size.
#[derive(Debug, Clone, Copy, Default)]
pub struct Full;

/// Capture every size once and for all, then size the KV cache from real usage. The KV cache's
/// address range is reserved first (virtual memory) and handed to the engine
/// ([`Engine::bind_kv_range`](crate::Engine::bind_kv_range)) so its graphs can be captured
/// against it; memory is mapped there once the plan says how much fits.
#[derive(Debug, Clone, Copy, Default)]
pub struct PostCapture;

/// Capture every size after a flushed baseline; the signed graph bytes and the layer used.
fn capture_all(ctx: &mut GraphContext<'_>) -> Result<(i64, bool, usize)> {
    let sizes = ctx.sizes();
    let before = ctx.flushed_snapshot()?;
    for s in &sizes {
        ctx.warm_up(*s)?;
        ctx.capture(*s)?;
    }
    // Release what the last warm-ups left cached: only the graphs remain in the window.
    let after = ctx.flushed_snapshot()?;
    let r = ctx.graph_bytes(&before.window_to(&after));
    if r.bytes < 0 {
        ctx.warn(Warning::NegativeCaptureWindow {
            graphs: sizes.len(),
            bytes: r.bytes,
        });
    }
    Ok((r.bytes, r.from_driver, sizes.len()))
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
        let (bytes, from_driver, n) = capture_all(ctx)?;
        let tol = ctx.free_tolerance();
        let mut e = GraphEstimate::new(StrategyKind::Full, n, bytes, 0, source(from_driver));
        e.uncertainty = tol;
        e.explanation = format!(
            "captured all {n} sizes into a throwaway pool after releasing cached memory: {} measured{}",
            fmt_signed(bytes),
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
        let (bytes, from_driver, n) = capture_all(ctx)?;
        let tol = ctx.free_tolerance();
        let mut e = GraphEstimate::new(StrategyKind::PostCapture, n, bytes, 0, source(from_driver));
        e.uncertainty = tol;
        e.kept = true;
        e.explanation = format!(
            "reserved {} of address space for the KV cache and gave it to the engine, captured all {n} sizes for good: they hold {}; the KV cache is sized from real usage, nothing is estimated",
            fmt_bytes(reserved),
            fmt_signed(bytes)
        );
        Ok(e)
    }
}
