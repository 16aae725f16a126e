//! The measurement protocol as an engine runs it: [`Session`].
//!
//! An engine opens a session on its device with its allocator, then runs its start-up through
//! the session's steps: [`Session::begin`] (release cached memory, baseline),
//! [`Session::load_weights`], [`Session::profile_run`] (activation peak),
//! [`Session::graph_phase`] (a [`GraphStrategy`] measures or
//! bounds graph memory; teardown on every path), then [`Session::finish`] gives a
//! [`Profile`] that [`plan()`](crate::plan()) turns into a plan.
//!
//! Rules the session enforces, whatever the engine or strategy does:
//! - every reading is a [`snapshot`] (synchronize, then read
//!   every layer); windows are differences of snapshots and keep their sign;
//! - before each step a *settle* snapshot closes a quiet window in which the engine did
//!   nothing: any change of non-allocator memory there belongs to other processes and is
//!   attributed to them, not to the engine (a neighbour acting *inside* a step cannot be told
//!   apart from the engine and is counted as the engine's, which errs on the safe side);
//! - free memory that grows without the allocator releasing anything (a neighbour freed memory)
//!   is a warning, never a crash, and the negative window is kept in the record.

use memplan_core::protocol::snapshot;
use memplan_core::{Device, Error, MemoryInfo, MemoryWindow, ProfilingCapability, Result};

use crate::engine::Engine;
pub use crate::profile::{Profile, StepRecord};
use crate::strategy::{GraphContext, GraphEstimate, GraphStrategy};
use memplan_core::bytes::{fmt_bytes, fmt_signed};

/// A start-up being measured. See the module docs for the rules.
pub struct Session<'d> {
    pub(crate) device: &'d mut dyn Device,
    pub(crate) p: Profile,
    own_growth: i64,
    growth_known: bool,
    free_ok: bool,
}

impl<'d> Session<'d> {
    /// Release the engine's cached memory, then take the baseline snapshot.
    pub fn begin(
        device: &'d mut dyn Device,
        engine: &mut dyn Engine,
        capability: ProfilingCapability,
    ) -> Result<Self> {
        let span = tracing::info_span!("baseline", device = %device.descriptor().id);
        let _e = span.enter();
        engine.allocator().release_cached()?;
        let baseline = snapshot(device, Some(&*engine.allocator()))?;
        tracing::info!(free = ?baseline.driver.free, total = ?baseline.driver.total, "baseline");
        let growth_known = capability
            .reading(memplan_core::Reading::DriverFree)
            .measures_own_usage();
        let p = Profile {
            capability,
            baseline,
            last: baseline,
            steps: Vec::new(),
            warnings: Vec::new(),
            foreign_bytes: 0,
            weights_bytes: None,
            weights_held_bytes: None,
            activation_peak_bytes: None,
            non_allocator_growth: None,
            graph: None,
            kv_reservation: None,
        };
        Ok(Session {
            device,
            p,
            own_growth: 0,
            growth_known,
            free_ok: growth_known,
        })
    }

    /// The capability the session trusts.
    pub fn capability(&self) -> &ProfilingCapability {
        &self.p.capability
    }

    /// The baseline snapshot.
    pub fn baseline(&self) -> &MemoryInfo {
        &self.p.baseline
    }

    /// Warnings so far.
    pub fn warnings(&self) -> &[String] {
        &self.p.warnings
    }

    /// Record a warning (also emitted as a `tracing` warning).
    pub fn warn(&mut self, msg: impl Into<String>) {
        let msg = msg.into();
        tracing::warn!("{msg}");
        self.p.warnings.push(msg);
    }

    /// Synchronize and read every layer, with the engine's allocator.
    pub(crate) fn snap(&mut self, engine: &mut dyn Engine) -> Result<MemoryInfo> {
        snapshot(self.device, Some(&*engine.allocator()))
    }

    /// Close the quiet window since the last snapshot: non-allocator change there is foreign.
    pub(crate) fn settle(&mut self, engine: &mut dyn Engine) -> Result<MemoryInfo> {
        let s = self.snap(engine)?;
        let w = self.p.last.window_to(&s);
        if let Some(d) = w.non_allocator.filter(|d| *d != 0 && self.free_ok) {
            self.p.foreign_bytes = self.p.foreign_bytes.saturating_add(d);
            if d < 0 {
                self.warn(format!(
                    "free memory grew by {} while the engine was idle: another process released memory; attributed to it",
                    fmt_bytes(d.unsigned_abs())
                ));
            } else {
                tracing::info!(
                    bytes = d,
                    "memory taken by another process while the engine was idle; attributed to it"
                );
            }
            self.record("quiet", self.p.last, s);
        }
        self.p.last = s;
        Ok(s)
    }

    fn record(&mut self, name: &str, before: MemoryInfo, after: MemoryInfo) {
        let window = before.window_to(&after);
        tracing::info!(step = name, %window, "window");
        self.p.steps.push(StepRecord {
            name: name.into(),
            before,
            after,
            window,
        });
    }

    /// Account an engine step: its non-allocator change is the engine's own (context, library
    /// workspaces); a negative one means someone else freed memory inside the step.
    fn engine_step(&mut self, name: &str, before: MemoryInfo, after: MemoryInfo) -> MemoryWindow {
        self.record(name, before, after);
        let w = before.window_to(&after);
        match w.non_allocator.filter(|_| self.free_ok) {
            Some(d) if d < 0 => self.warn(format!(
                "free memory grew by {} during {name} beyond what the allocator released: another process freed memory (window kept, not clamped)",
                fmt_signed(d).trim_start_matches('-')
            )),
            Some(d) => self.own_growth = self.own_growth.saturating_add(d),
            None => self.growth_known = false,
        }
        self.p.last = after;
        w
    }

    /// Load the weights: `load` runs between two snapshots; weights are the growth of the
    /// allocator's `allocated`.
    pub fn load_weights<E: AsDynEngine + ?Sized>(
        &mut self,
        engine: &mut E,
        load: impl FnOnce(&mut E) -> Result<()>,
    ) -> Result<u64> {
        let span = tracing::info_span!("load_weights");
        let _e = span.enter();
        let before = self.settle(engine.as_dyn())?;
        load(engine)?;
        let after = self.snap(engine.as_dyn())?;
        let w = self.engine_step("load_weights", before, after);
        let grown = w.allocator_allocated.unwrap_or(0);
        let weights = u64::try_from(grown).map_err(|_| {
            Error::Measurement(format!(
                "allocated memory shrank by {} while loading weights",
                fmt_signed(grown)
            ))
        })?;
        let held = u64::try_from(w.allocator_reserved.unwrap_or(grown))
            .unwrap_or(0)
            .max(weights);
        tracing::info!(weights, held, "weights loaded");
        self.p.weights_bytes = Some(weights);
        self.p.weights_held_bytes = Some(held);
        Ok(weights)
    }

    /// The profile run: the peak is reset before `run`, and the activation peak is the peak of
    /// `allocated` above what was allocated before it.
    pub fn profile_run<E: AsDynEngine + ?Sized>(
        &mut self,
        engine: &mut E,
        run: impl FnOnce(&mut E) -> Result<()>,
    ) -> Result<u64> {
        let span = tracing::info_span!("profile_run");
        let _e = span.enter();
        let before = self.settle(engine.as_dyn())?;
        engine.as_dyn().allocator().reset_peak();
        run(engine)?;
        let after = self.snap(engine.as_dyn())?;
        self.engine_step("profile_run", before, after);
        let base = before.allocator.allocated.unwrap_or(0);
        let peak = after.allocator.peak_allocated.unwrap_or(0);
        let act = peak.saturating_sub(base);
        tracing::info!(activation_peak = act, "profile run done");
        self.p.activation_peak_bytes = Some(act);
        Ok(act)
    }

    /// The graph-memory phase: `strategy` measures or bounds the graph memory. Unless the
    /// strategy keeps its graphs (post-capture), every graph is destroyed and its pool released
    /// afterwards, on success and on error alike, and the session checks that the allocator and
    /// the graph pool are back where they were.
    pub fn graph_phase(
        &mut self,
        engine: &mut dyn Engine,
        strategy: &dyn GraphStrategy,
    ) -> Result<&GraphEstimate> {
        let span = tracing::info_span!("graph_phase", strategy = %strategy.kind());
        let _e = span.enter();
        let before = self.settle(engine)?;
        let mut ctx = GraphContext::new(self, engine, before);
        let outcome = strategy.run(&mut ctx);
        let keep = matches!(&outcome, Ok(e) if e.kept);
        let after = if keep {
            ctx.disarm_and_read()
        } else {
            ctx.teardown()
        };
        drop(ctx);
        if let (Err(_), Err(e)) = (&outcome, &after) {
            tracing::error!(error = %e, "graph teardown failed after the strategy failed");
        }
        // Recorded even when the strategy failed: memory the phase left held is this engine's,
        // and must not be attributed to other processes by the next quiet window.
        if let Ok(a) = &after {
            self.engine_step_graph(before, *a, keep);
        }
        let est = outcome?;
        after?;
        tracing::info!(reserve = est.reserve, strategy = %est.strategy, "graph phase done");
        Ok(self.p.graph.insert(est))
    }

    fn engine_step_graph(&mut self, before: MemoryInfo, after: MemoryInfo, kept: bool) {
        self.record(
            if kept {
                "graph_phase (graphs kept)"
            } else {
                "graph_phase (after teardown)"
            },
            before,
            after,
        );
        self.p.last = after;
        if kept {
            return;
        }
        // Memory the device did not give back after teardown (per-capture memory a runtime
        // keeps) is held from now on: it counts as this engine's non-allocator growth.
        if let Some(leak) = before.window_to(&after).non_allocator.filter(|l| *l > 0) {
            if self.growth_known {
                self.warn(format!("{} stayed held outside the allocator after graph teardown: counted as this engine's non-allocator memory", fmt_bytes(leak as u64)));
                self.own_growth = self.own_growth.saturating_add(leak);
            }
        }
    }

    /// Whether the graph phase kept its graphs (post-capture).
    pub fn kept_graphs(&self) -> bool {
        self.p.graph.as_ref().is_some_and(|g| g.kept)
    }

    /// End the session: the measured profile.
    pub fn finish(mut self) -> Profile {
        self.p.non_allocator_growth = self.growth_known.then_some(self.own_growth);
        self.p
    }
}

/// `&mut E` to `&mut dyn Engine` for sized and unsized engines alike.
pub trait AsDynEngine {
    /// This engine as a trait object.
    fn as_dyn(&mut self) -> &mut dyn Engine;
}

impl<E: Engine> AsDynEngine for E {
    fn as_dyn(&mut self) -> &mut dyn Engine {
        self
    }
}

impl AsDynEngine for dyn Engine + '_ {
    fn as_dyn(&mut self) -> &mut dyn Engine {
        self
    }
}
