//! `vllm-legacy`: vLLM's graph-memory estimate as it was, kept only as a baseline to
//! compare against and never chosen automatically.
//!
//! It samples the first two sizes in capture order, each captured on its own (its pool is
//! released before the next sample), reading the driver's free memory around each capture
//! *without* releasing cached memory first, and extrapolates
//! `first + (n - 1) * max(second, 1 MiB)`. Both failures follow: a capture that empties the
//! cache inside the window gives negative samples (under-estimate), and a second sample that
//! carries the whole shared pool is multiplied by the graph count (over-estimate). On a device
//! that gives no free reading it refuses (`Unsupported`) rather than take absent samples as 0.

use memplan_core::bytes::{fmt_signed, MIB};
use memplan_core::{Error, Reading, Result};

use super::context::GraphContext;
use super::{GraphEstimate, GraphSample, GraphStrategy, StrategyKind};
use crate::warning::Warning;

/// vLLM's legacy sampling.
#[derive(Debug, Clone, Copy, Default)]
pub struct VllmLegacy;

/// The legacy extrapolation over signed samples (bytes) for `n` graphs: no samples -> 0;
/// otherwise `first + (n - 1) * max(second, 1 MiB)`, where a missing second sample counts as
/// 0 (so the 1 MiB floor applies).
pub fn legacy_extrapolate(samples: &[i64], n: usize) -> i64 {
    let Some(&first) = samples.first() else {
        return 0;
    };
    let second = samples.get(1).copied().unwrap_or(0).max(MIB as i64);
    let rest = i64::try_from(n.saturating_sub(1)).unwrap_or(i64::MAX);
    first.saturating_add(rest.saturating_mul(second))
}

impl GraphStrategy for VllmLegacy {
    fn kind(&self) -> StrategyKind {
        StrategyKind::VllmLegacy
    }

    fn run(&self, ctx: &mut GraphContext<'_>) -> Result<GraphEstimate> {
        let sizes = ctx.sizes();
        let mut samples = Vec::new();
        for &size in sizes.iter().take(2) {
            // No cache release: the baseline is read after the warm-up, before the capture
            // empties the cache.
            ctx.warm_up(size)?;
            let before = ctx.snapshot()?;
            ctx.capture(size)?;
            let after = ctx.snapshot()?;
            // A free reading the device does not give is absent, not a sample of 0.
            let Some(delta) = before.window_to(&after).driver_taken() else {
                return Err(Error::unsupported(
                    "vllm-legacy sampling",
                    format!(
                        "it samples the driver free reading, which this device does not give ({})",
                        ctx.capability().reading(Reading::DriverFree)
                    ),
                ));
            };
            samples.push(GraphSample {
                size,
                delta,
                flushed: false,
            });
            ctx.release_graphs()?;
        }
        let deltas: Vec<i64> = samples.iter().map(|s| s.delta).collect();
        let point = legacy_extrapolate(&deltas, sizes.len());
        if deltas.iter().any(|d| *d < 0) {
            ctx.warn(Warning::LegacyNegativeSamples {
                samples: deltas.clone(),
            });
        }
        let mut e = GraphEstimate::new(
            StrategyKind::VllmLegacy,
            sizes.len(),
            point,
            0,
            "driver free, no cache release (legacy)",
        );
        e.uncertainty = 0;
        e.explanation = format!(
            "first + (n-1) * max(second, 1 MiB) over samples {:?} for {} graphs = {} (no margin, uncertainty unknown)",
            deltas.iter().map(|d| fmt_signed(*d)).collect::<Vec<_>>(),
            sizes.len(),
            fmt_signed(point)
        );
        e.samples = samples;
        Ok(e)
    }
}
