//! The graph phase of a [`Session`]: the strategy chosen from the capability (or the
//! engine's choice) measures or bounds the engine's graph memory inside a
//! [`GraphContext`], which tears the graphs down on every path. A failed phase may rerun
//! (another strategy); out-of-memory while capturing is the refusal that the graphs do not
//! fit, wrapped as an error of the `capture_graphs` step.

use memplan_core::bytes::{fmt_bytes, MIB};
use memplan_core::{CaptureWork, Error, Result};

use super::{AsDynEngine, Session, Step, SAMPLED_MARGIN_LIMIT_PER_MILLE};
use crate::kv_range::KvRange;
use crate::strategy::{
    select, GraphContext, GraphEstimate, GraphStrategy, Sampled, Selection, SelectionPolicy,
    StrategyKind,
};
use crate::warning::Warning;

impl<E: AsDynEngine + ?Sized> Session<'_, E> {
    /// What the automatic selection chooses for this engine on this capability.
    ///
    /// Where the engine declared `max_split_size_mb`
    /// ([`with_allocator_config`](Self::with_allocator_config)), `sampled` gives way to `full`:
    /// the sampled model's shared pool grows to the largest capture's intermediates, since a
    /// later graph's intermediates reuse the blocks an earlier one freed, but PyTorch hands a
    /// cached block of `max_split_size` or more to no smaller request and splits none for a
    /// request of that size or more, so each graph's intermediates between may take blocks of
    /// their own and the pool grows by their sum, which samples of four sizes do not show
    /// (forced `sampled` on the shared-pool scenario planned up to 113.8% of the oracle under
    /// `max_split_size_mb:128` and ran out of memory in the engine's capture on 3 of 40
    /// seeds). `full` measures every size.
    pub fn selection(&mut self) -> Selection {
        let e = self.engine.as_dyn();
        let sel = select(
            &self.rec.p.capability,
            e.graph_sizes().len(),
            e.supports_post_capture(),
            SelectionPolicy::default(),
        );
        if sel.kind == StrategyKind::Sampled && self.rec.max_split_declared {
            let why = format!(
                "{}; but the engine declared max_split_size_mb, under which each graph's intermediates may take blocks of their own, which samples cannot model: every size measured instead",
                sel.why
            );
            tracing::info!(strategy = %StrategyKind::Full, %why, "strategy selected");
            return Selection {
                kind: StrategyKind::Full,
                why,
            };
        }
        if sel.kind == StrategyKind::Sampled {
            if let Some(why) = self.sampled_below_resolution(&sel.why) {
                tracing::info!(strategy = %StrategyKind::Full, %why, "strategy selected");
                return Selection {
                    kind: StrategyKind::Full,
                    why,
                };
            }
        }
        sel
    }

    /// Where the free reading moves in a step ([`Profile::free_step`](crate::Profile), as
    /// calibration or the session's start measured it) too coarse for the samples: each
    /// sample reads a graph's own memory beyond the allocator's (executable objects, driver-only
    /// memory) as a window of the free reading, which is off by up to that
    /// step, and the sampled model extrapolates each unsampled graph's term from those windows,
    /// so its point may miss up to a step for every unsampled graph, and its margin, sized by
    /// the samples' spread, does not see a miss the samples share (a 512 MiB step read eight
    /// samples' tens of MiB as nothing: 0.88 GB reserved for 2.07 GB of graphs). Capturing
    /// every size reads all of them in the same few windows, each off by one step at most.
    /// So where a step per unsampled graph would take more of the KV cache's room than a
    /// sampled margin may ([`SAMPLED_MARGIN_LIMIT_PER_MILLE`], the rule that measures every
    /// size where the margin costs more), and more than capturing every size would leave held
    /// at what calibration measured one capture keeping, every size is measured instead; the
    /// reason, or `None` where sampling stays (no step, or the request unknown).
    fn sampled_below_resolution(&mut self, why: &str) -> Option<String> {
        let step = self.rec.p.free_step;
        if step == 0 {
            return None;
        }
        let sizes = self.engine.as_dyn().graph_sizes();
        let samples = crate::strategy::sample_sizes(&sizes, Sampled::default().samples).len();
        let unsampled = sizes.len().saturating_sub(samples) as u64;
        let unseen = step.saturating_mul(unsampled);
        let room = self.kv_room(0)?;
        // As where the margin costs more: capturing every size must not leave more held for
        // good than it saves, at what calibration measured one capture keeping.
        let full_cost = self
            .calibration
            .as_ref()
            .and_then(|r| r.observed(crate::calibrate::HIDDEN_PER_CAPTURE))
            .and(self.rec.p.capability.facts.hidden_bytes_per_capture)
            .unwrap_or(0)
            .saturating_mul(sizes.len() as u64);
        let costly =
            unseen.saturating_mul(1000) > room.saturating_mul(SAMPLED_MARGIN_LIMIT_PER_MILLE);
        if !costly || unseen <= full_cost {
            return None;
        }
        Some(format!(
            "{why}; but the free reading moves in steps of {}, within which the samples' windows cannot resolve a graph's own memory: a step for each of the {unsampled} unsampled graphs ({}) would take over {}% of the KV cache's room ({}): every size measured instead",
            fmt_bytes(step),
            fmt_bytes(unseen),
            SAMPLED_MARGIN_LIMIT_PER_MILLE as f64 / 10.0,
            fmt_bytes(room)
        ))
    }

    /// The graph-memory phase with the strategy chosen from the capability
    /// ([`selection`](Self::selection)).
    ///
    /// When the choice is `sampled` and the session knows the request
    /// ([`check_request`](Self::check_request)), an estimate whose margin would take more than
    /// [`SAMPLED_MARGIN_LIMIT_PER_MILLE`] of the room left for the KV cache is replaced by a
    /// full capture (measured), with a warning that says what the margin would have cost,
    /// unless capturing every size would leave more memory held for good (at the rate the
    /// samples left it) than the margin.
    ///
    /// Runs once, after [`profile_run`](Self::profile_run) ([`Step`]); a phase that failed
    /// (its graphs torn down) may run again. Where the request's budget has no room for a KV
    /// cache on what the engine holds after its profile run, its graphs counted as nothing, the
    /// plan's refusal comes back before anything is warmed up (as from every graph phase that
    /// captures).
    pub fn capture_graphs(&mut self) -> Result<&GraphEstimate> {
        self.steps.check(Step::CaptureGraphs)?;
        let r = self.capture_graphs_auto();
        self.graph_phase_done(r)
    }

    /// The automatic choice's graph phase. Where the capability declared capture supported
    /// but the device refused to record the engine's graphs ([`Error::Unsupported`] from a
    /// warm-up or capture: a graph allocation node on a runtime without stream-ordered
    /// allocation), the engine cannot capture them at all: it runs eagerly, as where the
    /// capability declares capture unsupported, and the plan says why
    /// ([`Warning::GraphCaptureUnsupported`]) instead of refusing start-up.
    fn capture_graphs_auto(&mut self) -> Result<()> {
        self.rec.capture_unsupported = None;
        let r = self.capture_graphs_selected();
        match (r, self.rec.capture_unsupported.take()) {
            (Err(_), Some(reason)) if !self.steps.is_poisoned() => {
                self.rec.warn(Warning::GraphCaptureUnsupported {
                    reason: reason.clone(),
                });
                let why = format!(
                    "graph capture failed as unsupported ({reason}): the engine runs eagerly"
                );
                self.run_graph_phase(&*StrategyKind::None.strategy(), why)
            }
            (r, _) => r,
        }
    }

    fn capture_graphs_selected(&mut self) -> Result<()> {
        let sel = self.selection();
        if sel.kind != StrategyKind::Sampled {
            return self.run_graph_phase(&*sel.kind.strategy(), sel.why);
        }
        // What the samples leave held is read from after the trial capture, whose leftovers
        // are the trial's, not a rate of the samples'.
        self.before_captures()?;
        let held_before = self.rec.non_allocator_growth();
        self.run_graph_phase(&*sel.kind.strategy(), sel.why.clone())?;
        let (margin, reserve, captures, graphs) = {
            let e = self.rec.p.graph.as_ref().ok_or_else(|| {
                Error::state("capture_graphs", "the graph phase stored no estimate")
            })?;
            // The samples' captures and the one that asked whether the capture keeps the
            // allocator's cache (`Sampled`): each may have left what a runtime keeps per capture.
            (
                e.margin,
                e.reserve,
                e.samples.len() as u64 + 1,
                e.graphs as u64,
            )
        };
        // What capturing every size would leave held for good, at the rate the samples left
        // (per-capture memory some runtimes keep): measuring must save more than it costs.
        // What the samples left held is at most that rate times the samples, plus memory taken
        // once (a library's workspace on the first capture), which capturing again does not
        // take again; calibration measured what one capture keeps, where it could: the smaller
        // of the two rates, both at least the true one.
        let held = match (held_before, self.rec.non_allocator_growth()) {
            (Some(b), Some(a)) => u64::try_from(a.saturating_sub(b)).unwrap_or(0),
            _ => u64::MAX,
        };
        // The capability's figure stands on calibration's reading only where calibration read
        // one (otherwise it is the declaration, which may be wrong).
        let calibrated = self
            .calibration
            .as_ref()
            .and_then(|r| r.observed(crate::calibrate::HIDDEN_PER_CAPTURE))
            .and(self.rec.p.capability.facts.hidden_bytes_per_capture);
        let per_capture = match calibrated {
            Some(c) => (held / captures.max(1)).min(c),
            None => held / captures.max(1),
        };
        let full_cost = per_capture.saturating_mul(graphs);
        match self.kv_room(reserve) {
            Some(room)
                if margin.saturating_mul(1000)
                    > room.saturating_mul(SAMPLED_MARGIN_LIMIT_PER_MILLE)
                    && margin > full_cost =>
            {
                self.rec.warn(Warning::SampledMarginTooCostly {
                    margin,
                    kv_room: room,
                });
                let why = format!(
                    "{}; the sampled margin would take over {}% of the KV cache's room: every size measured instead",
                    sel.why,
                    SAMPLED_MARGIN_LIMIT_PER_MILLE as f64 / 10.0
                );
                self.run_graph_phase(&*StrategyKind::Full.strategy(), why)
            }
            _ => Ok(()),
        }
    }

    /// An error of `step`, in [`Error::During`] naming the step; running out of memory also
    /// says what the device and the engine's allocator held when it happened (the root stays
    /// the device's [`Error::OutOfMemory`], so [`Error::is_out_of_memory`] sees it).
    pub(super) fn in_step(&mut self, step: Step, e: Error) -> Error {
        if !e.is_out_of_memory() {
            return e.during(step.name());
        }
        let mut held = Vec::new();
        if let Ok(d) = self.rec.device.driver_memory() {
            if let (Some(free), Some(total)) = (d.free, d.total) {
                held.push(format!(
                    "{} free of {} when it ran out",
                    fmt_bytes(free),
                    fmt_bytes(total)
                ));
            }
        }
        let stats = self.engine.as_dyn().allocator().stats();
        held.push(format!(
            "{} held by the engine's allocator ({} in use)",
            fmt_bytes(stats.reserved),
            fmt_bytes(stats.allocated)
        ));
        e.during(held.join(", ")).during(step.name())
    }

    /// A graph phase ended: on success the step is done and its estimate returned.
    fn graph_phase_done(&mut self, r: Result<()>) -> Result<&GraphEstimate> {
        let r = match r {
            Err(e) if e.step().is_none() => Err(self.in_step(Step::CaptureGraphs, e)),
            r => r,
        };
        r?;
        self.steps.succeeded(Step::CaptureGraphs);
        self.rec
            .p
            .graph
            .as_ref()
            .ok_or_else(|| Error::state("capture_graphs", "the graph phase stored no estimate"))
    }

    /// Room the request leaves for the KV cache after what was measured so far and a graph
    /// reserve; `None` when the request or a figure is unknown.
    fn kv_room(&self, graph_reserve: u64) -> Option<u64> {
        let p = &self.rec.p;
        let total = p.total_at_least(p.baseline.driver.total?);
        let requested = crate::budget::requested_bytes(total, self.request?).ok()?;
        let non_alloc = u64::try_from(self.rec.non_allocator_growth()?.max(0)).ok()?;
        Some(
            requested
                .saturating_sub(p.weights_held_bytes?)
                .saturating_sub(p.activation_peak_bytes?)
                .saturating_sub(non_alloc)
                .saturating_sub(graph_reserve),
        )
    }

    /// The graph-memory phase with a strategy chosen by the caller (a warning says so when the
    /// capability calls for another). [`StrategyKind::None`] plans an engine that captures
    /// graphs without a graph reserve, on purpose (the warning says so).
    pub fn capture_graphs_with(&mut self, kind: StrategyKind) -> Result<&GraphEstimate> {
        self.steps.check(Step::CaptureGraphs)?;
        let auto = self.selection().kind;
        if auto != kind {
            self.rec.warn(Warning::StrategyOverridden {
                chosen: kind,
                automatic: auto,
            });
        }
        let r = self.run_graph_phase(&*kind.strategy(), "chosen by the caller");
        self.graph_phase_done(r)
    }

    /// The graph-memory phase: `strategy` measures or bounds the graph memory; `why` says why
    /// it runs (kept for the plan). Unless the strategy keeps its graphs (post-capture), every
    /// graph is destroyed and its pool released afterwards, on success and on error alike, and
    /// the session checks that the allocator and the graph pool are back where they were. A
    /// KV range reserved by a failed strategy is released after the teardown. A teardown that
    /// fails ends the session's measurements (later steps are refused).
    pub fn graph_phase(
        &mut self,
        strategy: &dyn GraphStrategy,
        why: impl Into<String>,
    ) -> Result<&GraphEstimate> {
        self.steps.check(Step::CaptureGraphs)?;
        let r = self.run_graph_phase(strategy, why);
        self.graph_phase_done(r)
    }

    fn run_graph_phase(
        &mut self,
        strategy: &dyn GraphStrategy,
        why: impl Into<String>,
    ) -> Result<()> {
        let span = tracing::info_span!("graph_phase", strategy = %strategy.kind());
        let _e = span.enter();
        self.why = why.into();
        let captures = strategy.kind() != StrategyKind::None;
        if captures {
            self.before_captures()?;
        }
        // Where the session measures by allocation probes, what the phase leaves unallocatable
        // after its teardown is measured as any other step's; an eager phase captures nothing
        // to measure.
        let est = self.graph_step(captures, |ctx| strategy.run(ctx), |e| e.kept)?;
        tracing::info!(reserve = est.reserve, strategy = %est.strategy, "graph phase done");
        self.rec.p.graph = Some(est);
        Ok(())
    }

    /// Before a graph phase that captures: before the first only, the refusal the plan already
    /// owes ([`refusal_before_graphs`](Self::refusal_before_graphs)), then, once a session, the
    /// trial capture where the device may refuse graph allocation nodes: where calibration's
    /// test capture saw it refuse one, or, where nothing calibrated, where the device refused to
    /// record one when asked ([`device_refuses_alloc_nodes`]) or could not be asked. A trial
    /// that recorded the graph is not run again by a later phase (a sampled estimate measured
    /// again in full): the device's answer stands, and each trial leaves what a capture leaves.
    ///
    /// The refusal is asked for before anything is warmed up, on what the profile run left,
    /// and not again before a later phase: a sampled phase's warm-ups and leftovers are then
    /// in what the session read, and a start-up cut between a sampled phase and its full
    /// measure named its warm-ups' peak as the activation and said its graphs were not
    /// captured yet, where its samples had gone up to 685 MiB past the request (the engine's
    /// own capture of every size, which the full measure runs as the engine does, takes that
    /// much and more).
    fn before_captures(&mut self) -> Result<()> {
        if !self.graph_room_checked {
            self.refusal_before_graphs()?;
            self.graph_room_checked = true;
        }
        if self.graphs_record {
            return Ok(());
        }
        let refused = match self.calibration.as_ref() {
            Some(c) => Some(c.graph_alloc_nodes_refused),
            None => device_refuses_alloc_nodes(&self.rec.device)?,
        };
        if refused != Some(false) {
            self.trial_capture(refused == Some(true))?;
        }
        self.graphs_record = true;
        Ok(())
    }

    /// Whether the device records the engine's graphs at all, found with the smallest size
    /// before a strategy warms up the first, the largest
    /// ([`GraphContext::trial_capture`](crate::strategy::GraphContext::trial_capture)): a
    /// step of its own, torn down, whose leftovers (memory a library takes on the first
    /// capture, per-capture memory) count as held after a graph teardown does, so that the
    /// phase after it measures what it always did. [`Error::Unsupported`] where the device
    /// refuses (the automatic choice then plans the engine eagerly).
    ///
    /// It runs where calibration's test capture saw the device refuse a graph allocation
    /// node, and, where nothing calibrated, where the device refused to record one or could
    /// not be asked ([`device_refuses_alloc_nodes`]): a session that trusts the declared
    /// capability learned of the refusal only from the engine's own capture, after the
    /// strategy had warmed up the largest size (and, post-capture, asked whether the capture
    /// keeps the cache): 12 MiB a token of warm-ups over sizes of up to 512 tokens went 980 MiB
    /// past a 10 GiB budget that the engine's weights and activation (7.1 GiB) left room in,
    /// where the eager engine takes none of it. The smallest size's warm-up is the least any
    /// capture of the engine's takes.
    ///
    /// Where calibration or the device itself showed the refusal (`refused`) and the engine
    /// states that a graph of its allocates in graph allocation nodes
    /// ([`Engine::alloc_node_bytes_hint`](crate::Engine::alloc_node_bytes_hint)), that graph
    /// cannot record on this device: the refusal is known without the trial, whose warm-up
    /// would otherwise be memory the engine alone, running eagerly, never takes (2 MiB past a
    /// request the engine's own profile run had already passed). Where nothing could ask the
    /// device, the engine's figure says nothing of it: the trial runs.
    fn trial_capture(&mut self, refused: bool) -> Result<()> {
        let engine = self.engine.as_dyn();
        let stated = engine
            .graph_sizes()
            .into_iter()
            .filter(|_| refused)
            .find_map(|size| {
                engine
                    .alloc_node_bytes_hint(size)
                    .filter(|b| *b > 0)
                    .map(|b| (size, b))
            });
        if let Some((size, bytes)) = stated {
            let e = Error::unsupported(
                "graph allocation nodes",
                format!(
                    "the engine's graph of size {size} allocates {} in graph allocation nodes (its own figure), and {} found the device refusing such a node",
                    fmt_bytes(bytes),
                    if self.calibration.is_some() {
                        "calibration's test capture"
                    } else {
                        "a capture that recorded one and was abandoned"
                    }
                ),
            );
            self.rec.capture_unsupported = Some(e.to_string());
            return Err(e);
        }
        self.graph_step(true, |ctx| ctx.trial_capture(), |_| false)
    }

    /// Before a graph phase that captures: where the budget of the request the session checked
    /// ([`check_request`](Self::check_request)) has no room for a KV cache on what the engine
    /// holds after its profile run (its weights, its activation peak as measured, the memory
    /// outside its allocator), the graphs counted as nothing, the plan's refusal
    /// ([`refusal_owed`](Self::refusal_owed), which takes the activation peak where it was
    /// measured), said before anything is warmed up. A graph reserve is at least 0 and the
    /// phase only adds to what the budget counts, so the plan after it refuses too; the phase's
    /// warm-ups and captures are memory the request never had room for, and where the device
    /// then refuses the capture, memory the engine alone, running eagerly, never takes: a trial
    /// capture's warm-up of 16 tokens at 16 MiB a token went 2-58 MiB past such a request and
    /// the engine's own steps, and one of 128 tokens at 20 MiB a token up to 1.5 GiB.
    fn refusal_before_graphs(&self) -> Result<()> {
        self.refusal_owed(
            "before the graph phase, what the engine holds and its measured activation peak \
             already leave no room for a KV cache (its graphs, not captured yet, counted as \
             nothing: a utilisation named is the least that could leave room, the graphs \
             come on top)",
        )
    }

    /// One step of graphs measured as the session measures each: the device trimmed and
    /// settled, `body` run in a graph context, its graphs kept where `keep` says so of its
    /// outcome and destroyed otherwise (a KV range it reserved released after them), the step
    /// recorded even where `body` failed (memory it left held is this engine's, not other
    /// processes'), and, where `probe` is set and the graphs were destroyed, what the teardown
    /// left unallocatable measured by the allocation probes (no reading sees per-capture
    /// memory a runtime keeps or a release still pending). A teardown that fails ends the
    /// session's measurements.
    fn graph_step<T>(
        &mut self,
        probe: bool,
        body: impl FnOnce(&mut GraphContext<'_>) -> Result<T>,
        keep: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        crate::strategy::trim_and_settle(&self.rec.device, self.rec.settle_synchronizes)?;
        let before = self.rec.settle(self.engine.as_dyn())?;
        let before_probe = if probe {
            self.probe_allocatable(&before)?
        } else {
            None
        };
        let engine = self.engine.as_dyn();
        let mut ctx = GraphContext::new(&mut self.rec, engine, before);
        let outcome = body(&mut ctx);
        let keep = outcome.as_ref().is_ok_and(keep);
        let after = if keep {
            ctx.disarm_and_read()
        } else {
            ctx.teardown()
        };
        drop(ctx);
        if !keep {
            // After the graphs that might point into it are gone.
            drop(self.rec.kv_range.take());
        }
        if let (Err(_), Err(e)) = (&outcome, &after) {
            tracing::error!(error = %e, "graph teardown failed after the step failed");
        }
        if let Ok(a) = &after {
            self.rec.graph_step(before, *a, keep);
            if !keep {
                self.probe_step(before_probe, &before, a)?;
            }
        }
        if let Err(e) = &after {
            self.steps.poisoned(Step::CaptureGraphs, e);
        }
        let out = outcome?;
        after?;
        Ok(out)
    }

    /// Why the last graph phase ran the strategy it ran (kept for the plan).
    pub fn graph_why(&self) -> &str {
        &self.why
    }

    /// Whether the graph phase kept its graphs (post-capture).
    pub fn kept_graphs(&self) -> bool {
        self.rec.p.graph.as_ref().is_some_and(|g| g.kept)
    }

    /// The KV cache's reserved address range, when post-capture reserved one.
    pub fn kv_range(&self) -> Option<&KvRange> {
        self.rec.kv_range.as_ref()
    }
}

/// Bytes of the allocation node [`device_refuses_alloc_nodes`] records: the smallest node
/// calibration's test capture records (whole MiB, at least one). Recorded and never
/// instantiated, it allocates nothing, whatever its size.
const ASKED_NODE_BYTES: u64 = MIB;

/// Whether the device refuses graph allocation nodes, asked of the device itself where nothing
/// calibrated: a capture begun, one allocation node recorded into it, and the capture abandoned
/// before it ends. A runtime without stream-ordered allocation refuses the node as it is
/// recorded (the stream-ordered allocation call made inside a stream capture, as calibration's
/// test capture found); a graph never ended is never instantiated, so the question leaves no
/// executable object, no graph-pool memory and none of the per-capture memory a runtime keeps
/// of each instantiated graph. The engine's own trial capture, which answered the same
/// question where nothing calibrated, left all of that and a library's first-capture memory
/// held before the strategy measured, counted as the engine's: a generated uncalibrated run
/// whose runtime kept 11.6 MB a capture planned 98.96% of the oracle where it had planned
/// 99.24% without the trial, and another fell from 98.81% to 83.33% off a KV rounding cliff.
///
/// `Some(true)`: the device refused the node ([`Error::Unsupported`]); `Some(false)`: it
/// recorded it, so the engine's graphs are not refused for their allocation nodes and no
/// trial is needed; `None`: the device could not be asked (no capture interface, or another
/// error while recording), so the trial runs as before. An abandoned capture that cannot be
/// ended is the session's error.
fn device_refuses_alloc_nodes(device: &memplan_core::Device) -> Result<Option<bool>> {
    let Ok(gc) = device.graph_capture() else {
        return Ok(None);
    };
    if gc.begin_capture().is_err() {
        return Ok(None);
    }
    let recorded = gc.record(&CaptureWork::new(1).with_alloc_node(ASKED_NODE_BYTES));
    gc.abort_capture()?;
    Ok(match recorded {
        Ok(()) => Some(false),
        Err(Error::Unsupported { .. }) => Some(true),
        Err(e) => {
            tracing::debug!(error = %e, "recording a graph allocation node failed otherwise: the trial capture asks");
            None
        }
    })
}
