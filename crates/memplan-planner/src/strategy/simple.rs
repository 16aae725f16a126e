//! `conservative` and `none`.
//!
//! The conservative bound is used when the driver's free reading cannot measure this process.
//! It captures every size (so nothing is guessed about the allocator-visible part) and bounds
//! what only the driver sees:
//!
//! `reserve = (pool + nodes + Σ per graph (hidden + exec)) * 1.25` where `pool` is the
//! allocator's reserved growth over the capture (exact: this process's own allocator), `nodes`
//! the graph allocation nodes (the graph-pool reading where it can be trusted, else the
//! engine's [`alloc_node_bytes_hint`](crate::Engine::alloc_node_bytes_hint)), `hidden` the
//! per-capture memory the capability declares (or calibration measured), and `exec` the
//! executable object: [`EXEC_BYTES_PER_KERNEL_NODE_BOUND`] per kernel node when the engine says
//! how many nodes a graph has, else [`DEFAULT_EXEC_BYTES_PER_GRAPH`]. The per-node figure is the
//! *upper* end of the public range (one published data point of about 64 KiB per node, which
//! varies with driver, kernel and graph shape: bounded here at double), never a simulator's
//! figure; see `docs/simulator-physics.md`. The 25% margin covers allocator rounding.
//!
//! A bound is only as good as the figures behind it: where a reading the device does give
//! (the driver's free reading within its tolerance, or the device-wide reading) shows the
//! capture taking more than the bound, the bound was wrong for this device and the reading
//! replaces it ([`Warning::GraphBoundContradicted`]), with the same margin. Where no reading
//! measures this process at all, allocation probes do: the largest allocation that succeeds
//! before the captures and after them differ by what the captures hold (executable objects
//! and per-capture memory included, whatever their size per kernel node): that measurement
//! replaces the bound, above it or below it (at least the allocator's measured part). A
//! measurement needs no quarter kept for what a bound may miss, only for what the engine's own
//! later capture may take beyond it: the first size is captured again
//! [`PROBED_REPEATS`](super::full::PROBED_REPEATS) times, each alone and measured by probes,
//! and their range sizes the margin as `full` sizes its own from repeats read by the driver
//! (at least what the probes cannot tell apart counted as variation: a probe moves in the
//! whole pages a driver commits raw allocations in, so captures less than a page apart read
//! alike, [`alike_within`](crate::session::probe::alike_within)). On a stale free reading
//! with graphs of 16-20 GiB, a quarter kept a third of the KV cache's room and refused
//! start-ups that fit.
//! Where probes measure, the first size is captured and released once before the pass
//! (`prime_by_probes`), as `full` primes: memory a library takes on the process's first
//! capture is then counted once, as held after the teardown, not also as graphs.
//! Every figure above is read after the pass; where the allocator gave its cache back inside
//! it (a request the device could not serve, graphs whose intermediates take segments of their
//! own under `max_split_size_mb`), the engine's capture holds that before giving anything back,
//! and the pass is taken at its peak: the drops of what the allocator held from one capture to
//! the next are added (`AllocatorHeld`), as `full` takes its own pass at its peak.

use memplan_core::bytes::{fmt_bytes, KIB};
use memplan_core::{Reading, Result};

use super::context::{GraphContext, Primed};
use super::{GraphEstimate, GraphStrategy, StrategyKind};
use crate::warning::Warning;

/// Upper bound of the driver memory per kernel node of a graph's executable object: double the
/// one public data point (~64 KiB), since the figure varies with driver and graph shape.
pub const EXEC_BYTES_PER_KERNEL_NODE_BOUND: u64 = 128 * KIB;
/// Executable-object bound per graph when the engine gives no kernel-node count
/// (256 nodes, a ~28-layer decoder at ~9 kernels per layer, at the per-node bound).
pub const DEFAULT_EXEC_BYTES_PER_GRAPH: u64 = 256 * EXEC_BYTES_PER_KERNEL_NODE_BOUND;

/// Analytic bound plus margin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conservative;

/// No graphs: the engine runs eagerly.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGraphs;

impl GraphStrategy for Conservative {
    fn kind(&self) -> StrategyKind {
        StrategyKind::Conservative
    }

    fn run(&self, ctx: &mut GraphContext<'_>) -> Result<GraphEstimate> {
        let sizes = ctx.sizes();
        let primed = match (ctx.probe_resolution(), sizes.first()) {
            (Some(_), Some(&first)) => prime_by_probes(ctx, first)?,
            _ => None,
        };
        let before = ctx.flushed_snapshot()?;
        let before_probe = ctx.allocatable()?;
        let mut held = AllocatorHeld::default();
        for s in &sizes {
            ctx.warm_up(*s)?;
            ctx.capture(*s)?;
            held.after_capture(ctx.allocator_reserved());
        }
        // Every size warmed up and captured in the engine's order with nothing released in
        // between: the release before this snapshot gives back what the engine's warm-up
        // sequence leaves cached where its capture keeps the cache (counted beside the burst in
        // serving), none where the capture empties it.
        let after = ctx.flushed_snapshot_after_captures()?;
        // No reading measures this process: what the captures made unallocatable (the
        // executable objects and per-capture memory included) is the one measurement of what
        // they hold outside the allocator.
        let probed = match (before_probe, ctx.allocatable()?) {
            (Some(b), Some(a)) => Some(ctx.probed_growth(b, a)),
            _ => None,
        };
        let w = before.window_to(&after);
        if let Some(d) = w.allocator_reserved.filter(|d| *d < 0) {
            // Reported, not clamped silently: the bound itself counts 0 for the private pool.
            ctx.warn(Warning::AllocatorShrankDuringCapture {
                graphs: sizes.len(),
                bytes: d,
            });
        }
        let private = w.allocator_reserved.unwrap_or(0).max(0) as u64;
        // Graph allocation nodes: measured where the device's graph-pool reading can be
        // trusted and was read, else the engine's own figure; without either they are
        // invisible, and the explanation says they were assumed absent.
        let measured = w.graph_pool_reserved.filter(|_| {
            ctx.capability()
                .reading(Reading::GraphPool)
                .measures_own_usage()
        });
        let (nodes, nodes_basis) = if let Some(grown) = measured {
            (grown.max(0) as u64, "measured by the graph-pool reading")
        } else {
            let hints: Option<Vec<u64>> = sizes
                .iter()
                .map(|s| ctx.engine().alloc_node_bytes_hint(*s))
                .collect();
            match hints {
                Some(h) => (
                    h.iter().fold(0u64, |a, b| a.saturating_add(*b)),
                    "from the engine's allocation-node figures",
                ),
                None => (
                    0,
                    "unreadable on this device and not given by the engine: assumed none",
                ),
            }
        };
        let pool = private.saturating_add(nodes);
        let hidden = ctx.capability().facts.hidden_bytes_per_capture.unwrap_or(0);
        let mut hinted = 0usize;
        let driver_only: u64 = sizes
            .iter()
            .map(|s| {
                let exec = match ctx.engine().kernel_nodes_hint(*s) {
                    Some(k) => {
                        hinted += 1;
                        u64::from(k) * EXEC_BYTES_PER_KERNEL_NODE_BOUND
                    }
                    None => DEFAULT_EXEC_BYTES_PER_GRAPH,
                };
                exec.saturating_add(hidden)
            })
            .fold(0, u64::saturating_add);
        // Saturating, and at most i64::MAX: a bound must never wrap into a small number.
        let bound = pool.saturating_add(driver_only).min(i64::MAX as u64);
        let seen = seen_by_readings(ctx, &before, &after, &w, probed);
        let (point, contradicted) = match seen {
            Some((measured, reading)) if measured > bound => {
                ctx.warn(Warning::GraphBoundContradicted {
                    bound,
                    measured,
                    reading: reading.into(),
                });
                (measured, Some(reading))
            }
            // The probes measured everything the captures hold, physically: the bound is a
            // guess beside it (the allocator's own measurement stays the least it can be).
            Some((measured, reading)) if probed.is_some() => (measured.max(pool), Some(reading)),
            _ => (bound, None),
        };
        // What the allocator gave back inside the pass: the engine's capture holds it before
        // giving anything back (see [`AllocatorHeld`]); every figure above was read after it.
        let given_back = held.given_back();
        if given_back > 0 {
            tracing::warn!(
                bytes = given_back,
                "memory was given back inside the conservative pass: its graphs are taken at the pass's peak"
            );
        }
        let seen_point = point;
        let point = point.saturating_add(given_back);
        // A bound keeps a quarter for what it may have missed; a measurement keeps what the
        // same capture varies by, measured by probes too where they measured the pass (also
        // where a reading showed more than they did: the larger measurement stands, and a
        // quarter of it is no figure of a capture's variation).
        let alike = ctx.probes_alike_within().unwrap_or(0);
        let repeats = match (contradicted, probed, sizes.first()) {
            (Some(_), Some(_), Some(&first)) => {
                let margin = (sizes.len(), ctx.probe_resolution().unwrap_or(0), alike);
                probed_repeats(ctx, first, margin, |c, _| c.allocatable())?
            }
            _ => None,
        };
        let (margin, margin_basis) = match (&repeats, ctx.probe_resolution()) {
            (Some(r), Some(res)) => {
                let m = super::full::probed_variation_margin(r, sizes.len(), res, alike);
                tracing::debug!(repeats = ?r, resolution = res, alike, margin = m, "probed repeats of the first size");
                let spread = super::full::probed_spread_per_mille(r, res);
                if spread > super::full::VARIATION_REPORTED_PER_MILLE {
                    ctx.warn(Warning::GraphCaptureVaries {
                        spread_per_mille: spread,
                        margin: m,
                    });
                }
                (
                    m,
                    format!(
                        "{} for the capture-to-capture variation of {} repeats of the first size, each measured by allocation probes",
                        fmt_bytes(m),
                        r.len()
                    ),
                )
            }
            _ => (point / 4, format!("25% margin ({})", fmt_bytes(point / 4))),
        };
        // Memory of the priming graph that its release had not given back when the pass
        // started may have come back inside the pass, which then measured that much less than
        // its captures took: what a capture of the first size takes (the probed repeats'
        // median; the priming capture itself, all it left held, where there are none), less
        // what the release gave back, at most what it left held.
        let not_back = primed.map_or(0, |p| {
            let recapture = repeats
                .as_ref()
                .and_then(|r| super::full::median(r))
                .unwrap_or(p.returned.saturating_add(p.outstanding));
            p.may_come_back(recapture)
        });
        let (margin, margin_basis) = if not_back > 0 {
            (
                margin.saturating_add(not_back),
                format!(
                    "{margin_basis}; {} of the priming graph had not come back after its release (it may have come back inside the pass)",
                    fmt_bytes(not_back)
                ),
            )
        } else {
            (margin, margin_basis)
        };
        let mut e = GraphEstimate::new(
            StrategyKind::Conservative,
            sizes.len(),
            point as i64,
            margin,
            "allocator reserved + analytic bound",
        );
        e.explanation = format!(
            "driver free cannot measure this process: private pool measured by the allocator ({}), graph allocation nodes {} ({}), executable objects and hidden per-capture memory bounded analytically ({} for {} graphs, {} with the engine's kernel-node count, {} hidden each), plus {}",
            fmt_bytes(private),
            nodes_basis,
            fmt_bytes(nodes),
            fmt_bytes(driver_only),
            sizes.len(),
            hinted,
            fmt_bytes(hidden),
            margin_basis
        );
        if given_back > 0 {
            e.explanation = format!(
                "{}; taken at the pass's peak: the allocator gave {} of cached memory back inside the pass, as it does where the device cannot serve a request, and the engine's capture holds it before giving anything back",
                e.explanation,
                fmt_bytes(given_back)
            );
        }
        if let Some(r) = contradicted {
            let than = if seen_point > bound {
                "more"
            } else {
                "no more"
            };
            e.explanation = format!(
                "{}; the {r} showed {} taken, {than} than the bound {}: the measurement replaces it",
                e.explanation,
                fmt_bytes(seen_point),
                fmt_bytes(bound)
            );
        }
        Ok(e)
    }
}

/// What the readings the device does give show the capture taking, and which one: the
/// driver's free reading where it is sourced (even within a wide tolerance: a window cancels
/// a constant offset), the device-wide reading, and where the session measures by allocation
/// probes (no reading measures this process) what the captures made unallocatable (`probed`);
/// the largest. `None` where none moved or none is sourced.
fn seen_by_readings(
    ctx: &GraphContext<'_>,
    before: &memplan_core::MemoryInfo,
    after: &memplan_core::MemoryInfo,
    w: &memplan_core::MemoryWindow,
    probed: Option<u64>,
) -> Option<(u64, &'static str)> {
    let free_sourced = !matches!(
        ctx.capability().reading(Reading::DriverFree),
        memplan_core::Reliability::Unavailable { .. }
    );
    let driver = w
        .driver_used
        .filter(|_| free_sourced)
        .and_then(|d| u64::try_from(d).ok())
        .map(|d| (d, "driver free reading"));
    let device = before
        .device
        .available
        .zip(after.device.available)
        .and_then(|(b, a)| b.checked_sub(a))
        .map(|d| (d, "device-wide reading"));
    let probes = probed.map(|d| (d, PROBES));
    [driver, device, probes]
        .into_iter()
        .flatten()
        .max_by_key(|x| x.0)
}

/// What the engine's allocator held after each capture of the pass, read without releasing
/// anything (its own figure, exact for this process whatever the driver's readings are worth).
///
/// The pass releases nothing before its end, and a graph pool keeps what its captures freed
/// cached for the next capture, so what the allocator holds only grows from one capture to the
/// next (a capture that empties the cache on entering gives back the warm-up before it, and
/// holds at least the graphs before it plus its own), unless the allocator gives its cache
/// back inside the pass: the caching allocator does that when the device cannot serve a
/// request (PyTorch's `malloc` frees its cached blocks and retries, `release_cached_blocks` on
/// an allocation failure). Under `max_split_size_mb` PyTorch splits no cached block for a
/// request of that size or more (`should_split`, `get_free_block`), so each graph's large
/// intermediates take segments of their own, the pool grows by their sum, and on a device that
/// cannot serve it the pass ends holding only what was left after the release: every figure
/// read at its end (the allocator's, the probes') misses what was given back, while the
/// engine's own capture, with its KV cache beside, holds that peak before its allocator gives
/// anything back and goes past the request, or runs out of memory outside the allocator (in a
/// graph's instantiation). Each drop from what one capture left to what the next left is
/// memory given back, and the engine's capture, which gives nothing back before it must, holds
/// their sum beside what the pass ended with (`full` takes its pass at its peak the same way).
#[derive(Debug, Default, Clone, Copy)]
struct AllocatorHeld {
    /// Held after the last capture (`None` before the first).
    last: Option<u64>,
    /// The drops seen so far, summed.
    dropped: u64,
}

impl AllocatorHeld {
    fn after_capture(&mut self, reserved: u64) {
        if let Some(l) = self.last {
            self.dropped = self.dropped.saturating_add(l.saturating_sub(reserved));
        }
        self.last = Some(reserved);
    }

    /// What the allocator gave back inside the pass (0 where what it held only grew).
    fn given_back(&self) -> u64 {
        self.dropped
    }
}

/// What [`seen_by_readings`] calls a measurement by allocation probes.
const PROBES: &str = "allocation probes";

/// Where allocation probes measure the pass (no reading measures this process): capture the
/// first size once and release it before the pass, as `full` does ([`GraphContext::prime`]).
/// Memory a library allocates on the process's first capture and keeps (a workspace taken
/// outside the caching allocator) is then taken here, held after the phase's teardown and
/// counted once, as held (the probes around the phase measure it), and the pass costs what the
/// engine's later capture costs. Measured in the pass, it was counted twice: as graphs, and as
/// the memory the teardown did not give back (a 440 MiB workspace beside an 8B model's 3 GiB of
/// graphs on a stale reading refused a start-up the device had room for). Returns what the
/// release gave back and what the capture still holds, both measured by probes (`None` where a
/// probe could not be taken).
fn prime_by_probes(ctx: &mut GraphContext<'_>, size: u32) -> Result<Option<Primed>> {
    ctx.warm_up(size)?;
    ctx.flushed_snapshot()?;
    let start = ctx.allocatable()?;
    ctx.capture(size)?;
    ctx.flushed_snapshot()?;
    let captured = ctx.allocatable()?;
    ctx.release_graphs()?;
    ctx.flushed_snapshot()?;
    let released = ctx.allocatable()?;
    let signed = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
    Ok(match (start, captured, released) {
        (Some(s), Some(c), Some(r)) => Some(Primed {
            returned: signed(r).saturating_sub(signed(c)),
            outstanding: signed(s).saturating_sub(signed(r)),
        }),
        _ => None,
    })
}

/// Where a pass's graph memory was measured by allocation probes: the first size captured
/// again [`PROBED_REPEATS`](super::full::PROBED_REPEATS) times, each alone (the pass's graphs
/// and each repeat released before the next), each measured by what its capture made
/// unallocatable, `probe` taking each measurement (given the last one's figure, where its
/// search may start). `None` where a probe could not be taken.
///
/// On a device seen to keep memory of every raw free, each probe's tries that succeed are raw
/// frees whose keep stays held for good, counted as this engine's memory though the engine
/// alone never takes it: past the first [`REPEATS`](super::full::REPEATS), the rest are taken
/// only where the margin they are expected to take off is more than what their frees keep
/// ([`more_probed_repeats_pay`](super::full::more_probed_repeats_pay), the frees counted over
/// the first ones but the first, whose first probe searched without a figure to start from,
/// at the keep seen per free). An L4 keeping 32 MiB a free, whose reading's 256 MiB steps hid the
/// captures, held 1 GiB after the graph phase's teardown, most of it the twelve repeats'
/// probes' frees, where the eight after the first four took about 80 MiB off the margin.
/// `graphs`, `resolution` and `alike` are the margin's
/// ([`probed_variation_margin`](super::full::probed_variation_margin)).
pub(super) fn probed_repeats<F>(
    ctx: &mut GraphContext<'_>,
    size: u32,
    (graphs, resolution, alike): (usize, u64, u64),
    mut probe: F,
) -> Result<Option<Vec<i64>>>
where
    F: FnMut(&mut GraphContext<'_>, Option<u64>) -> Result<Option<u64>>,
{
    let mut taken = Vec::with_capacity(super::full::PROBED_REPEATS);
    let mut last = None;
    // The raw frees from the end of the first repeat: its first probe searches without a
    // figure to start from, and the later ones from the last one's, as further repeats would.
    let mut frees_after_first = 0;
    for made in 0..super::full::PROBED_REPEATS {
        if made == 1 {
            frees_after_first = ctx.device().raw_frees();
        }
        if made == super::full::REPEATS {
            let frees = ctx.device().raw_frees().saturating_sub(frees_after_first);
            let per_repeat = frees.div_ceil(made as u64 - 1);
            let cost = ctx
                .own_keep_per_free()
                .saturating_mul(per_repeat)
                .saturating_mul((super::full::PROBED_REPEATS - made) as u64);
            if !super::full::more_probed_repeats_pay(&taken, graphs, resolution, alike, cost) {
                tracing::debug!(
                    frees,
                    cost,
                    "no more probed repeats: their frees would keep more than they take off the margin"
                );
                break;
            }
        }
        ctx.release_graphs()?;
        ctx.warm_up(size)?;
        ctx.flushed_snapshot()?;
        let Some(before) = probe(ctx, last)? else {
            return Ok(None);
        };
        ctx.capture(size)?;
        ctx.flushed_snapshot()?;
        let Some(after) = probe(ctx, Some(before))? else {
            return Ok(None);
        };
        last = Some(before);
        taken.push(
            i64::try_from(before)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(after).unwrap_or(i64::MAX)),
        );
    }
    Ok(Some(taken))
}

impl GraphStrategy for NoGraphs {
    fn kind(&self) -> StrategyKind {
        StrategyKind::None
    }

    fn run(&self, ctx: &mut GraphContext<'_>) -> Result<GraphEstimate> {
        let mut e = GraphEstimate::new(StrategyKind::None, 0, 0, 0, "nothing measured");
        e.explanation = if ctx.sizes().is_empty() {
            "the engine captures no graphs: nothing to reserve".into()
        } else {
            "no graphs: the engine must run eagerly (capture unsupported or disabled)".into()
        };
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::AllocatorHeld;

    #[test]
    fn the_pass_is_held_at_its_peak_where_the_allocator_gave_memory_back() {
        let mut h = AllocatorHeld::default();
        for r in [100, 300, 600, 250, 700, 650] {
            h.after_capture(r);
        }
        assert_eq!(h.given_back(), 400);
        let mut grows = AllocatorHeld::default();
        for r in [100, 300, 300, 600] {
            grows.after_capture(r);
        }
        assert_eq!(grows.given_back(), 0);
    }
}
