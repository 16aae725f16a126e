//! `sampled`: capture a few sizes, each after releasing cached memory, and model the rest.
//!
//! Each sample is read in three layers, so that what graphs *share* is modelled apart from what
//! each graph *adds*:
//! - `output`: growth of the allocator's `allocated` (memory the graph keeps live in the
//!   shared private pool);
//! - `transient`: the allocator's peak above that (intermediates, freed inside the capture and
//!   kept cached by the pool, so the pool grows to the largest need, not the sum);
//! - `driver_only`: driver growth beyond the allocator's reserved growth (executable objects,
//!   per-capture memory a runtime keeps, graph allocation nodes).
//!
//! Sizes are sampled evenly over the sizes, largest first; each layer is interpolated linearly
//! in size between samples. The estimate is
//! `Σ driver_only(s) + max_k (Σ_{j<=k} output(s_j) + transient(s_k)) + rounding` over the
//! capture order, where `rounding` is what the first sample's pool took beyond its live and
//! transient bytes. The margin is the largest deviation of a sampled layer from the line
//! through its extreme samples, times the number of unsampled graphs, plus 2% of the estimate,
//! plus a fragmentation allowance: a few samples cannot show how the pool's free space
//! fragments over dozens of captures (live outputs filling the space earlier intermediates
//! left, so that a later graph's intermediates need a block of their own): the largest
//! intermediates once more for every such block's worth of live outputs (at least once), and
//! 10% of the pool.

use memplan_core::bytes::{fmt_bytes, fmt_signed, signed};
use memplan_core::Result;

use super::context::GraphContext;
use super::{GraphEstimate, GraphSample, GraphStrategy, StrategyKind};
use crate::warning::Warning;

/// Sampled capture.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Sampled {
    /// How many sizes to capture (at least 2 when there are 2 or more sizes).
    pub samples: usize,
}

impl Sampled {
    /// Capture `samples` of the sizes (at least 2 when there are 2 or more).
    pub const fn new(samples: usize) -> Self {
        Self { samples }
    }
}

/// Eight samples: the largest and smallest sizes and six between them. The margin is sized by
/// how far the samples between the extremes deviate from the line through them, so those are
/// what it sees of how the graphs vary: with two (four samples), on 67 sizes whose kernel
/// counts vary in no order with the size, both fell near the line, the margin was a tenth of
/// the graphs' memory too small, and the plan went 1.1 GiB past the request; with six, none of
/// 600 seeds of that graph set did. Still far fewer captures than the 64 sizes above which the
/// automatic choice samples instead of capturing every size.
impl Default for Sampled {
    fn default() -> Self {
        Sampled { samples: 8 }
    }
}

/// One sample in layers (bytes, signed as measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Layers {
    /// Graph size.
    pub size: u32,
    /// Live bytes the graph keeps in the private pool.
    pub output: i64,
    /// Transient bytes during the capture above the live ones.
    pub transient: i64,
    /// Driver growth beyond the allocator's reserved growth.
    pub driver_only: i64,
    /// Allocator reserved growth.
    pub reserved: i64,
}

/// Sizes to sample: `k` positions evenly spread over the sizes sorted largest first, always
/// including the largest and the smallest.
pub fn sample_sizes(sizes: &[u32], k: usize) -> Vec<u32> {
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let n = sorted.len();
    let k = k.clamp(n.min(2), n.max(1)).min(n);
    if k <= 1 {
        return sorted.into_iter().take(k).collect();
    }
    let mut v: Vec<u32> = (0..k).map(|i| sorted[i * (n - 1) / (k - 1)]).collect();
    v.dedup();
    v
}

fn interpolate(points: &[(u32, i64)], size: u32) -> i64 {
    // `points` sorted by size ascending, non-empty.
    let (first, last) = (points[0], points[points.len() - 1]);
    if size <= first.0 {
        return first.1;
    }
    if size >= last.0 {
        return last.1;
    }
    for w in points.windows(2) {
        let ((s0, d0), (s1, d1)) = (w[0], w[1]);
        if size >= s0 && size <= s1 {
            if s1 == s0 {
                return d0.max(d1);
            }
            let t = f64::from(size - s0) / f64::from(s1 - s0);
            return (d0 as f64 + t * (d1 as f64 - d0 as f64)).round() as i64;
        }
    }
    last.1
}

fn layer(samples: &[Layers], f: impl Fn(&Layers) -> i64) -> Vec<(u32, i64)> {
    let mut v: Vec<(u32, i64)> = samples.iter().map(|s| (s.size, f(s).max(0))).collect();
    v.sort_unstable();
    v
}

fn residual(points: &[(u32, i64)]) -> u64 {
    let (lo, hi) = (points[0], points[points.len() - 1]);
    points
        .iter()
        .map(|p| p.1.abs_diff(interpolate(&[lo, hi], p.0)))
        .max()
        .unwrap_or(0)
}

/// The sampled model over `samples` (the first is the largest size) for `sizes` in capture
/// order: `(point estimate, margin)`.
pub fn sampled_model(samples: &[Layers], sizes: &[u32]) -> (i64, u64) {
    let Some(first) = samples.first() else {
        return (0, 0);
    };
    let (out, tr, drv) = (
        layer(samples, |s| s.output),
        layer(samples, |s| s.transient),
        layer(samples, |s| s.driver_only),
    );
    let exact = |size: u32| samples.iter().find(|s| s.size == size);
    let (mut cum_out, mut pool, mut driver) = (0i64, 0i64, 0i64);
    for &s in sizes {
        let (o, t, d) = match exact(s) {
            Some(x) => (x.output.max(0), x.transient.max(0), x.driver_only.max(0)),
            None => (
                interpolate(&out, s),
                interpolate(&tr, s),
                interpolate(&drv, s),
            ),
        };
        // Saturating throughout: the layers come from the engine's allocator figures.
        cum_out = cum_out.saturating_add(o);
        pool = pool.max(cum_out.saturating_add(t));
        driver = driver.saturating_add(d);
    }
    let rounding = first
        .reserved
        .saturating_sub(first.output.max(0))
        .saturating_sub(first.transient.max(0))
        .max(0);
    let point = pool.saturating_add(driver).saturating_add(rounding);
    let unsampled = sizes.iter().filter(|s| exact(**s).is_none()).count() as u64;
    let res = residual(&out).saturating_add(residual(&drv));
    // The pool's fragmentation is not visible in a few samples. A graph's intermediates need
    // free blocks while the graphs' live outputs fill the space earlier intermediates left
    // (placed best-fit, an output lands in the largest such hole it fits, the one the next
    // intermediates need): the pool can hold one more block the size of the largest
    // intermediates than packing shows for every such block's worth of live outputs the
    // graphs keep, plus 10% of the pool for how the rest fragments (see
    // [`fragmentation_blocks`]).
    let transient = samples
        .iter()
        .map(|s| s.transient.max(0))
        .max()
        .unwrap_or(0) as u64;
    let fragmentation = (pool.max(0) as u64 / 10)
        .saturating_add(transient.saturating_mul(fragmentation_blocks(cum_out, transient)));
    let margin = res
        .saturating_mul(unsampled)
        .saturating_add(point.max(0) as u64 / 50)
        .saturating_add(fragmentation);
    (point, margin)
}

/// How many blocks the size of the largest intermediates (`transient`) the shared pool may
/// hold beyond what packing the graphs shows: one for every such block's worth of the live
/// outputs every graph keeps (`outputs`, their sum over the capture order), at least one.
/// Captured largest first, each graph's intermediates are freed inside its capture and its
/// output stays; the next graph's output is placed best-fit, in the hole the intermediates
/// left, so each hole shrinks by an output per graph while the next intermediates shrink by
/// only the step between two sizes (and need not shrink at all: a kernel chosen for one batch
/// size may take more than the next larger one's). Once a hole is too small for them, the next
/// intermediates take a block of their own, and the outputs that filled it have spent about a
/// block. On an APU, 67 graphs whose intermediates went 133.5, 124.6, 127.0, 129.6 and 132.4 MB
/// for the five largest sizes kept 272 MB of outputs and grew the pool to five blocks of about
/// 128 MB where one more was allowed: the plan went 67 MiB past the request in serving, on 7 of
/// 2,000 seeds of that scenario. With the outputs' share counted, none did.
fn fragmentation_blocks(outputs: i64, transient: u64) -> u64 {
    if transient == 0 {
        return 1;
    }
    (outputs.max(0) as u64).div_ceil(transient).max(1)
}

impl GraphStrategy for Sampled {
    fn kind(&self) -> StrategyKind {
        StrategyKind::Sampled
    }

    fn run(&self, ctx: &mut GraphContext<'_>) -> Result<GraphEstimate> {
        let sizes = ctx.sizes();
        let mut layers = Vec::new();
        let mut samples = Vec::new();
        let mut from_driver = true;
        for size in sample_sizes(&sizes, self.samples) {
            ctx.warm_up(size)?;
            // The fix of the negative samples: release the warm-up's cache before the baseline.
            let before = ctx.flushed_snapshot()?;
            ctx.reset_peak();
            ctx.capture(size)?;
            let after = ctx.flushed_snapshot()?;
            let w = before.window_to(&after);
            let r = ctx.graph_bytes(&w);
            from_driver &= r.from_driver;
            if r.bytes < 0 {
                ctx.warn(Warning::NegativeSample {
                    size,
                    bytes: r.bytes,
                });
            }
            let output = w.allocator_allocated.unwrap_or(0);
            let peak = after
                .allocator
                .peak_allocated
                .zip(before.allocator.allocated)
                .map_or(0, |(p, a)| signed(p).saturating_sub(signed(a)));
            let reserved = w.allocator_reserved.unwrap_or(0);
            let driver_only = if r.from_driver {
                r.bytes.saturating_sub(reserved)
            } else {
                0
            };
            layers.push(Layers {
                size,
                output,
                transient: peak.saturating_sub(output),
                driver_only,
                reserved,
            });
            samples.push(GraphSample {
                size,
                delta: r.bytes,
                flushed: true,
            });
        }
        // Each sample released the allocator's cache before its baseline, so none can tell
        // whether the engine's capture keeps the cache: where it does, the engine's warm-ups
        // stay cached through its captures into serving, beside the burst. One more capture
        // asks ([`GraphContext::check_capture_keeps_cache`]), after the samples so that their
        // windows stay as they were (the process's first capture, with what a library takes
        // on it, is the first sample's).
        // The samples' graphs are released first: the engine warms its first size up before
        // it holds any graph, and the check's warm-up of that size beside eight samples' graphs
        // held them past what the engine ever does (an RTX 4090 warming 512 tokens up at 24 MiB
        // each: 166-331 MB past the request and the engine's own steps, 153-314 MB of it the
        // samples' graphs).
        if let Some(&first) = sizes.first() {
            ctx.release_graphs()?;
            ctx.check_capture_keeps_cache(first)?;
        }
        let (point, margin) = sampled_model(&layers, &sizes);
        let by = if from_driver {
            "driver free and allocator, flushed before each sample"
        } else {
            "allocator only"
        };
        let mut e = GraphEstimate::new(StrategyKind::Sampled, sizes.len(), point, margin, by);
        e.uncertainty = margin + ctx.free_tolerance();
        e.explanation = format!(
            "sampled {} of {} sizes (largest first, cache released before each baseline); shared pool (max over the capture order) + per-graph live and driver-only memory gives {}, margin {} from the samples' spread",
            samples.len(),
            sizes.len(),
            fmt_signed(point),
            fmt_bytes(margin)
        );
        e.samples = samples;
        Ok(e)
    }
}
