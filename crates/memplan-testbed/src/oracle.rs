//! The oracle: the largest KV cache that would have fit, computed only from the simulator's
//! ground truth ([`GroundTruth`]) and the scenario's true inputs.
//!
//! Written apart from the planner on purpose: nothing here calls planner code (no budget
//! arithmetic, no KV sizing, no plan figure). What the engine's parts really take is measured by
//! running the engine *alone* on a fresh device with the same seed ([`engine_alone`]): no
//! profiling, no calibration, only the engine's own steps, each read from the ground truth. The
//! KV arithmetic is the engine's own ([`crate::kv`]): the tensors vLLM allocates for the model's
//! layer groups, each rounded by the allocator as the device's physics draw it.
//!
//! Two oracles judge a run:
//! - [`oracle_tokens`], the run's: the smaller of the room within the requested memory
//!   (`requested`, the request's share of the device's real memory, or where the plan named
//!   that it took the share of a total nothing checks, of the larger of the real total and the
//!   runtime's, as the over-request rules hold the run to: [`AtPlan::unchecked_total_allowance`];
//!   less the weights, activation, library workspace and graph memory the engine
//!   alone takes, less the per-capture memory the run's own profiling left held for good; where
//!   the run kept its graphs, less the graph memory the process holds at the plan instead) and
//!   the physical room when the plan was made (the true free memory less the peak the engine
//!   still needs after allocating its KV cache);
//! - [`clean_oracle_tokens`], from a clean device: the scenario's engine as configured (it
//!   captures its graphs wherever the device captures, whatever strategy the run chose; its KV
//!   cache from its caching allocator), without anything the run's profiling did (no
//!   leftovers, the free memory of the engine alone, less what other processes took since the
//!   start). It depends neither on the run's strategy nor on its leaks, and is reported beside
//!   the first.
//!
//! Where the engine alone runs out of memory (its weights, profile run or workspace, or its
//! graphs, unless the run kept the graphs it captured: they are the engine's, and a replay
//! of their captures on another allocator history says nothing of them), nothing fits: the
//! oracle is an empty cache and refusing is the right answer (an
//! out-of-memory in the engine's own loading step is then the model not fitting, not a plan's
//! failure; so too where another process took memory during the start-up and the engine alone,
//! beside what the others then held, runs out of memory in that step: the run says so, and an
//! engine step that runs out of memory where the engine alone would have fitted is counted as
//! an out-of-memory, since memplan's calibration or profiling left less). Where the engine's
//! own start-up check refuses the request, a refusal is right too ([`Oracle::start_refused`]):
//! vLLM's worker refuses a request above the free memory at the start; SGLang checks no
//! request against the free memory (its static fraction is of the memory free when it starts)
//! and refuses only a pool that is empty or too short for its least request
//! ([`StartRule`](crate::scenario::StartRule)). Where the engine alone runs out of memory
//! beside what other processes held at the start, but they hold less when the run makes its
//! plan, a plan is judged on the engine alone beside what they hold then
//! ([`crate::run::run_judged`]): the run's engine got past its loading and profile run beside
//! the others as they were at each step. A run that refuses (or fails) before its KV cache is
//! judged on the engine alone beside what the others hold when it refuses, wherever that
//! differs from the start (less or more): a refusal after they left where the engine then fits
//! is needless, one after they grew where the engine then does not fit is right; its room is
//! at most what the engine alone then has before its KV cache, since a run that refused
//! before loading its weights still has them to take.

use memplan_backend_sim::{AllocatorSnapshot, GroundTruth, SimGpu};
use memplan_core::{Error, Result};

use crate::engine::SimEngine;
use crate::kv::EngineKv;
use crate::run::{graph_truth, open};
use crate::setup::Setup;

/// What the engine's parts take when it runs alone (bytes, from the ground truth).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineAlone {
    /// Allocator segments holding the weights.
    pub weights: u64,
    /// Segments the activation peak needs above the weights.
    pub activation: u64,
    /// Driver memory of the library workspace (outside the allocator).
    pub workspace: u64,
    /// Graph memory of capturing every size (pool, executable objects, allocation nodes,
    /// per-capture memory, a library's allocation on the first capture).
    pub graph: u64,
    /// Standard deviation of the sum of the executable objects of every graph the engine
    /// captures, from one capture to the next (the device's drawn capture jitter, ground truth):
    /// how much the engine's own later capture may differ from any earlier one, which no plan
    /// made before it can know ([`Oracle::jitter_tokens`]).
    pub graph_jitter_sd: u64,
    /// Peak growth of the process while capturing every graph (warm-ups included) and then
    /// serving a burst, above where it stood before the first warm-up.
    pub capture_and_burst_peak: u64,
    /// True free memory where the engine alone would allocate its KV cache (after its weights,
    /// profile run and workspace; other processes as at the start).
    pub free_before_kv: u64,
    /// Memory other processes hold at the start.
    pub others_at_start: u64,
    /// The engine's graphs do not fit on the device even alone: no KV cache fits.
    pub graphs_do_not_fit: bool,
    /// The engine alone's allocator where it would allocate its KV cache.
    #[serde(skip)]
    pub allocator: AllocatorSnapshot,
    /// The engine alone runs out of memory before its graphs (weights, profile run, library
    /// workspace): the model does not fit on the device at all.
    pub nothing_fits: bool,
    /// The process's high-water mark (ground truth, context included) in each of the engine's
    /// own steps before its KV cache, alone ([`AloneMarks`]): what a start-up's phases are
    /// judged beside before the plan ([`crate::run`]).
    pub marks: AloneMarks,
}

/// The engine alone's high-water marks before its KV cache, each of its own step (bytes the
/// process held at its most, context included, from the ground truth; 0 for a step it never
/// reached, having run out of memory before it). A step that ran out of memory is marked with
/// the most the process could hold when it did (what it held and what was free, beside the
/// other processes as they were): the step asked for more than that, so the engine's own step
/// takes the process to the device's limit, whatever memplan did. How far it got before the
/// allocation that failed is no bound on it: the same step run again gets further or less far
/// by the size and order of its allocations (the same graphs captured again with a smaller draw
/// of their capture-to-capture variation get past the capture that failed alone).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct AloneMarks {
    /// Loading its weights.
    pub weights: u64,
    /// Its profile run (the activation peak, the library's workspace).
    pub profile_run: u64,
    /// What it held after the profile run (the weights, the workspace, the cache emptied).
    pub after_profile_run: u64,
    /// Capturing every graph, warm-ups included (before the serving burst).
    pub graphs: u64,
    /// What it held once every graph was captured (the graphs kept, and the cache its
    /// warm-ups and captures left); where its allocator gave that cache back to go on at the
    /// device's limit, the graphs' own mark ([`engine_alone`]).
    pub after_graphs: u64,
}

impl AloneMarks {
    /// Each step's larger mark of `self` and `other` (the same engine alone beside different
    /// other processes: one that ran out of memory sooner shows less of its own steps).
    pub fn fuller(&self, other: &AloneMarks) -> AloneMarks {
        AloneMarks {
            weights: self.weights.max(other.weights),
            profile_run: self.profile_run.max(other.profile_run),
            after_profile_run: self.after_profile_run.max(other.after_profile_run),
            graphs: self.graphs.max(other.graphs),
            after_graphs: self.after_graphs.max(other.after_graphs),
        }
    }
}

impl EngineAlone {
    /// The engine's own steps before a start-up that refused, judged beside `self` (the engine
    /// alone beside what other processes hold when the refusal came) and `start` (beside what
    /// they held at the start): the run's steps ran beside the others as they were at each, so
    /// each step's mark is the fuller of the two ([`AloneMarks::fuller`]), and so is the
    /// captures' variation ([`Self::graph_jitter_sd`]). It is the device's, whoever else holds
    /// memory; an engine alone that ran out of memory before capturing (beside others that
    /// grew after the graph phase) captured nothing and shows none of it, though the run's graph
    /// phase, beside the others of the start, captured every graph and varied as the engine's
    /// own captures there do. Taken from that engine alone only, the graph phase was held to its
    /// mark with no room for the variation: a post-capture pass 58 MB above the engine alone's
    /// (35 graphs of 230 MB, varying by 150 MB in all) read as memplan's own, past the request.
    pub fn fuller_steps(&self, start: &EngineAlone) -> EngineAlone {
        EngineAlone {
            marks: start.marks.fuller(&self.marks),
            graph_jitter_sd: start.graph_jitter_sd.max(self.graph_jitter_sd),
            ..self.clone()
        }
    }

    /// What a plan that knew every graph's mean cost would keep for the engine's own later
    /// capture: [`ATTAINABLE_Z`](crate::sweep::acceptance::ATTAINABLE_Z) standard deviations
    /// of its capture-to-capture variation ([`Oracle::jitter_tokens`]).
    pub fn jitter_allowance(&self) -> u64 {
        (self.graph_jitter_sd as f64 * crate::sweep::acceptance::ATTAINABLE_Z).ceil() as u64
    }
}

/// Run the engine alone on a fresh device of the scenario (same selector and seed, the other
/// processes present at start) and read what each part takes from the ground truth. An
/// out-of-memory while capturing its graphs is an answer ([`EngineAlone::graphs_do_not_fit`]);
/// any other failure is the harness's.
pub fn engine_alone(setup: &Setup) -> Result<EngineAlone> {
    let gpu = open(setup)?;
    let mut e = SimEngine::new(gpu.clone(), setup.clone());
    let alloc = gpu.allocator();
    let t0 = gpu.truth();
    // Each step's high-water mark: watched from where the process stands as it begins.
    let mut marks = AloneMarks::default();
    gpu.watch_peak();
    let step_mark = |gpu: &SimGpu| {
        let p = gpu.peak().unwrap_or(0);
        gpu.watch_peak();
        p
    };
    // The mark of a step that ran out of memory: the most the process could hold then.
    let ran_out = |gpu: &SimGpu| {
        let t = gpu.truth();
        step_mark(gpu).max(t.this_process().saturating_add(t.free))
    };
    let nothing = |marks: AloneMarks| EngineAlone {
        weights: 0,
        activation: 0,
        workspace: 0,
        graph: 0,
        graph_jitter_sd: 0,
        capture_and_burst_peak: 0,
        free_before_kv: 0,
        others_at_start: t0.other_processes,
        graphs_do_not_fit: false,
        allocator: alloc.snapshot(),
        nothing_fits: true,
        marks,
    };
    let loaded = e.load_weights();
    let oom = matches!(&loaded, Err(err) if err.is_out_of_memory());
    marks.weights = if oom { ran_out(&gpu) } else { step_mark(&gpu) };
    match loaded {
        Err(err) if err.is_out_of_memory() => return Ok(nothing(marks)),
        r => r?,
    }
    let t1 = gpu.truth();
    // The profile run as the engine runs it: the activation peak, the library workspace
    // taken while it is live, the cache emptied at the end.
    let b = match alloc.malloc(setup.activation_peak.max(1)) {
        Err(err) if err.is_out_of_memory() => {
            marks.profile_run = ran_out(&gpu);
            return Ok(nothing(marks));
        }
        r => r?,
    };
    let activation = gpu.truth().allocator_reserved - t1.allocator_reserved;
    let mut workspace = 0;
    let mut _held = None;
    if setup.workspace > 0 {
        let r0 = gpu.truth().raw_allocations;
        _held = match e.device().allocate(setup.workspace) {
            Err(err) if err.is_out_of_memory() => {
                marks.profile_run = ran_out(&gpu);
                return Ok(nothing(marks));
            }
            r => Some(r?),
        };
        workspace = gpu.truth().raw_allocations - r0;
    }
    alloc.free(b)?;
    alloc.empty_cache();
    // The engine waits for its own queue after the profile run (on a platform without a
    // device-wide synchronize, the segments return only then).
    alloc.synchronize()?;
    marks.profile_run = step_mark(&gpu);
    let base = gpu.truth().this_process();
    marks.after_profile_run = base;
    let free_before_kv = gpu.truth().free;
    let kv_allocator = alloc.snapshot();
    let g0 = graph_truth(&gpu.truth());
    let mut peak = 0u64;
    let mut see = |gpu: &SimGpu| peak = peak.max(gpu.truth().this_process().saturating_sub(base));
    let mut graphs_do_not_fit = false;
    let mut jitter_var = 0f64;
    // Whether the allocator gave cached segments back inside a warm-up or a capture: what
    // the caching allocator does only when the device cannot serve a request (free segments
    // released as PyTorch's retry releases them, the request retried), or, for the default
    // pool, where the engine's capture empties the cache on entering.
    let empties = gpu.quirks().capture_empties_cache;
    let cached = |gpu: &SimGpu| {
        let t = gpu.truth();
        (t.allocator_reserved, t.private_pool_reserved)
    };
    let mut gave_back = false;
    for s in setup.sizes.clone() {
        let before = cached(&gpu);
        let mut warm = before;
        let step = memplan_planner::Engine::warm_up(&mut e, s).and_then(|()| {
            see(&gpu);
            warm = cached(&gpu);
            memplan_planner::Engine::capture_graph(&mut e, s)
        });
        let after = cached(&gpu);
        gave_back |= warm.0 < before.0
            || warm.1 < before.1
            || after.1 < warm.1
            || (!empties && after.0 < warm.0);
        match step {
            Ok(()) => {
                see(&gpu);
                let sd = gpu
                    .physics()
                    .exec_bytes_sd(u64::from(e.spec(s).kernel_nodes));
                jitter_var += sd * sd;
            }
            // The device cannot capture: the engine runs eagerly, no graph memory.
            Err(Error::Unsupported { .. }) => {
                jitter_var = 0.0;
                memplan_planner::Engine::release_graphs(&mut e)?;
                break;
            }
            Err(err) if err.is_out_of_memory() => {
                graphs_do_not_fit = true;
                break;
            }
            Err(err) => return Err(err),
        }
    }
    let graph = graph_truth(&gpu.truth()).saturating_sub(g0);
    marks.graphs = if graphs_do_not_fit {
        ran_out(&gpu)
    } else {
        step_mark(&gpu)
    };
    // Captures that reached the device's limit went on only by giving the allocator's cache
    // back (the warm-ups' free segments, the graph pool's oversize ones): what they held after
    // is no bound on what the same captures leave held where they do not reach it (kept in
    // another order of cache, with a smaller draw of their variation, or beside a session that
    // released the warm-ups' cache before each capture to measure it). There the mark after the
    // graphs is the graphs' own mark: the most those captures held.
    marks.after_graphs = if gave_back {
        marks.graphs
    } else {
        gpu.truth().this_process()
    };
    if !graphs_do_not_fit {
        match alloc.malloc(setup.activation_peak.max(1)) {
            Ok(b) => {
                see(&gpu);
                alloc.free(b)?;
            }
            Err(err) if err.is_out_of_memory() => graphs_do_not_fit = true,
            Err(err) => return Err(err),
        }
    }
    Ok(EngineAlone {
        weights: t1.allocator_reserved - t0.allocator_reserved,
        activation,
        workspace,
        graph,
        graph_jitter_sd: jitter_var.sqrt().ceil() as u64,
        capture_and_burst_peak: peak,
        free_before_kv,
        others_at_start: t0.other_processes,
        graphs_do_not_fit,
        allocator: kv_allocator,
        nothing_fits: false,
        marks,
    })
}

/// The requested memory, from the true total: `ceil(total * utilization)` or the byte budget.
pub fn requested(total: u64, utilization: Option<f64>, budget: Option<u64>) -> Option<u64> {
    match (utilization, budget) {
        (Some(u), None) if u > 0.0 && u <= 1.0 => Some(((total as f64) * u).ceil() as u64),
        (None, Some(b)) => Some(b),
        _ => None,
    }
}

/// Where the run stood when its plan was made.
#[derive(Debug, Clone)]
pub struct AtPlan {
    /// Ground truth at device open (before the engine did anything).
    pub start: GroundTruth,
    /// Ground truth right after the plan (before the KV cache).
    pub plan: GroundTruth,
    /// The strategy kept its graphs (post-capture): nothing left to capture.
    pub graphs_kept: bool,
    /// The engine runs eagerly: no graphs at all.
    pub eager: bool,
    /// The engine's allocator right after the plan.
    pub allocator: AllocatorSnapshot,
    /// The run refused or failed before its KV cache: `plan` is where it stood then, which
    /// may be before its engine loaded its weights or ran its profile run, and `alone` the
    /// engine alone beside what other processes hold then ([`crate::run::run_judged`]).
    pub refused: bool,
    /// The most an engine that sizes its KV pool from its own free readings can give its pool
    /// at any fraction: what it read free once its weights were loaded (SGLang's `rest` at a
    /// fraction of 1). Memory that came free later (other processes that left after the
    /// weights) is in no pool it can make. `None` for an engine that sizes its pool otherwise,
    /// and where the plan named that it could not model those readings
    /// (`engine_pool_unmodelled`: the plan is judged on its own there).
    pub engine_pool_most: Option<u64>,
    /// What the request's share of the total the runtime reports asks past its share of the
    /// device's real memory, where the plan named that it took the share of a total nothing
    /// checks (`crate::report::Outcome::unchecked_total_allowance`; 0 elsewhere, and for a run
    /// that refused): the request the run is held to is that much larger, and so is the room
    /// the oracle fits its cache in. The physical room is the device's real free memory all
    /// the same.
    pub unchecked_total_allowance: u64,
}

/// An oracle's verdict on a setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Oracle {
    /// Usable KV tokens of the largest cache that fits.
    pub tokens: u64,
    /// Blocks of that cache (the null block included).
    pub blocks: u64,
    /// The engine's own start-up check refuses this request whatever its KV cache would hold
    /// ([`start_refused`]: vLLM's, free memory at start below the request; SGLang has
    /// none).
    pub start_refused: bool,
    /// Bytes the KV cache could take: the room the cache of `blocks` was fitted in.
    pub room: u64,
    /// Usable KV tokens of the largest cache that fits in each share of `room` (at most
    /// `tokens`) the acceptance rules hold a plan to ([`MEASURED_FLOOR`], [`BOUNDED_FLOOR`]), by the same arithmetic:
    /// the floor judged in memory. A cache whose allocator rounds each tensor to a coarse
    /// granule holds its tokens in steps of many blocks, and a plan short of the room by a
    /// fraction of a percent can lose a whole step; these say what a plan that lost at most
    /// the floor's share of the memory holds.
    ///
    /// [`MEASURED_FLOOR`]: crate::sweep::acceptance::MEASURED_FLOOR
    /// [`BOUNDED_FLOOR`]: crate::sweep::acceptance::BOUNDED_FLOOR
    pub floor_tokens: FloorTokens,
    /// Usable KV tokens of the largest cache that fits in `room` less
    /// [`ATTAINABLE_Z`](crate::sweep::acceptance::ATTAINABLE_Z) standard deviations of the
    /// engine's later graph capture ([`EngineAlone::graph_jitter_sd`]; at most `tokens`): what
    /// a plan that knew the mean cost of every graph exactly, and kept only the margin that
    /// holds the request in 99.9% of the engine's captures, would hold. Where graphs are not
    /// captured after the plan (kept, or none), `tokens`. Below the floor and at or above it
    /// here is what a plan could have done better ([`crate::sweep::acceptance`]).
    pub jitter_tokens: u64,
    /// Blocks of the cache of `jitter_tokens` (the null block included): what
    /// [`Oracle::has_room`] judges where the acceptance rules ask whether a refusal was within
    /// reach of a plan that kept only the engine's own capture variation.
    pub jitter_blocks: u64,
}

/// See [`Oracle::floor_tokens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FloorTokens {
    /// In [`MEASURED_FLOOR`](crate::sweep::acceptance::MEASURED_FLOOR) of the room.
    pub measured: u64,
    /// In [`BOUNDED_FLOOR`](crate::sweep::acceptance::BOUNDED_FLOOR) of the room.
    pub bounded: u64,
}

impl FloorTokens {
    /// The tokens at `share` (one of the two floors; the bounded floor's for any other).
    pub fn at(&self, share: f64) -> u64 {
        if share >= crate::sweep::acceptance::MEASURED_FLOOR {
            self.measured
        } else {
            self.bounded
        }
    }
}

impl Oracle {
    /// Whether the oracle holds at least one request of `max_model_len` tokens after keeping
    /// `share` of its blocks (the share a plan is held to): a refusal then is needless. What
    /// one request holds is the engine's own count ([`EngineKv::blocks_per_request`]: a
    /// sliding-window group holds its window, not the whole request).
    ///
    /// An engine that starts with a pool shorter than one such request (SGLang,
    /// [`StartRule`](crate::scenario::StartRule)) has room wherever that share of the oracle's
    /// pool is one it starts with, by its own rule.
    pub fn has_room(&self, setup: &Setup, share: f64) -> bool {
        let kv = &setup.scenario.kv;
        let bs = u64::from(kv.block_size.max(1));
        let engine = EngineKv::of_setup(setup);
        let per_request = engine.as_ref().map_or(kv.max_model_len.div_ceil(bs), |k| {
            k.blocks_per_request(kv.max_model_len, kv.max_num_batched_tokens)
        });
        let usable = self.blocks.saturating_sub(1) as f64 * share;
        // The pool of that share: its usable blocks in tokens, as the engine counts them.
        let pool = {
            let blocks = usable.floor() as u64 + 1;
            engine.map_or(blocks.saturating_sub(1).saturating_mul(bs), |k| {
                k.tokens(blocks)
            })
        };
        !self.start_refused
            && (usable >= per_request as f64
                || setup.start_rule.starts_short(pool, kv.max_model_len))
    }
}

fn requested_of(setup: &Setup, total: u64) -> Option<u64> {
    let req = &setup.scenario.request;
    let budget = match &req.memory_budget {
        Some(b) => Some(b.bytes("memory_budget").ok()?),
        None => None,
    };
    requested(total, req.gpu_memory_utilization, budget)
}

/// The largest KV cache that would have fit from the run's plan on (`None`: the request or
/// the model cannot be judged; a harness error).
pub fn oracle_tokens(setup: &Setup, alone: &EngineAlone, at: &AtPlan) -> Option<Oracle> {
    let requested =
        requested_of(setup, at.start.total)?.saturating_add(at.unchecked_total_allowance);
    // Graph memory the engine serves with. Where the run kept its graphs, they are the very
    // graphs the engine serves with: what the process holds for graphs at the plan (the kept
    // graphs, and the per-capture and library memory calibration and profiling left held),
    // not a capture of the same sizes by the engine alone, whose executable objects may cost
    // more or less from one capture to the next. Releases still pending come back.
    let held_for_graphs =
        |t: &memplan_backend_sim::GroundTruth| graph_truth(t).saturating_sub(t.pending_release);
    let graph = if at.eager {
        0
    } else if at.graphs_kept {
        held_for_graphs(&at.plan).saturating_sub(held_for_graphs(&at.start))
    } else {
        alone.graph
    };
    // Per-capture memory the run's own measuring captures left held (never returned): the
    // process holds it whatever it plans next. Where graphs were kept it is in `graph`.
    let leftover = if at.graphs_kept {
        0
    } else {
        at.plan
            .hidden_capture
            .saturating_sub(at.start.hidden_capture)
    };
    // Beside its KV cache the engine holds its graphs and, at its peak, an activation: the
    // burst's, or where the engine still captures, whatever its warm-ups and captures made it
    // hold beyond that (a warm-up larger than the profile run, warm-ups a capture does not
    // empty from the cache): the high-water mark the request is judged on.
    let beside_kv = if at.graphs_kept || at.eager {
        alone.activation.saturating_add(graph)
    } else {
        alone
            .activation
            .saturating_add(graph)
            .max(alone.capture_and_burst_peak)
    };
    let in_request = [alone.weights, alone.workspace, leftover, beside_kv]
        .iter()
        .fold(requested, |room, x| room.saturating_sub(*x));
    // What a library allocated on the first capture is taken once per process: the run's
    // profiling already holds it (in its free memory), the engine's capture will not take it
    // again.
    let held_once = at.plan.library_lazy.saturating_sub(at.start.library_lazy);
    let still_needed = if at.graphs_kept || at.eager {
        alone.activation
    } else {
        alone.capture_and_burst_peak.saturating_sub(held_once)
    };
    let mut physical = at.plan.free.saturating_sub(still_needed);
    if at.refused {
        // A run that refused before its engine loaded its weights or ran its profile run
        // still has them to take: its KV cache has at most the room the engine alone has
        // before its KV cache (beside the other processes as they are at the refusal), less
        // what it still needs after it.
        physical = physical.min(
            alone
                .free_before_kv
                .saturating_sub(alone.capture_and_burst_peak),
        );
    }
    // Where the engine alone cannot capture its graphs, no cache fits beside graphs the
    // engine still has to capture. Where the run kept its graphs they are captured already,
    // in this process, and the engine serves with them: whether a replay of the captures on
    // another allocator history fits says nothing of them. Which allocation meets the device's
    // limit first depends on that history: an allocation in the graphs' private pool that does
    // not fit makes the caching allocator give cached free segments back and try again (PyTorch
    // `DeviceCachingAllocator::malloc`, as the simulated allocator does:
    // `release_available_cached_blocks` frees the request's pool's oversize blocks, and no
    // other cache goes back inside a capture), while a graph's instantiation takes driver
    // memory the allocator's cache cannot give way to (`cudaGraphInstantiate`) and fails; and a
    // session that releases the warm-ups' cache before each capture to measure it meets the
    // limit later than the engine alone whose warm-ups' cache stays: the same captures fit
    // after one history and not after another.
    let graphs_refused = alone.graphs_do_not_fit && !at.eager && !at.graphs_kept;
    let room = if alone.nothing_fits || graphs_refused {
        0
    } else {
        in_request
            .min(physical)
            .min(at.engine_pool_most.unwrap_or(u64::MAX))
    };
    let jitter = if at.graphs_kept || at.eager {
        0
    } else {
        alone.jitter_allowance()
    };
    verdict(
        setup,
        room,
        jitter,
        at.graphs_kept,
        start_refused(setup, &at.start),
        &at.allocator,
    )
}

/// The largest KV cache on a clean device: the scenario's engine as configured, alone (its
/// weights, profile run and workspace, its KV cache from its caching allocator, then every
/// graph captured where the device captures, then a burst), nothing the run's profiling left
/// behind, other processes at what they hold when the plan is made (`at.plan`). It does not
/// depend on the run's strategy: an eager or post-capture strategy is judged against the same
/// engine as every other (the engine captures its graphs whatever memplan's strategy did), and
/// only the world's state at the plan (the others' memory) comes from the run.
pub fn clean_oracle_tokens(setup: &Setup, alone: &EngineAlone, at: &AtPlan) -> Option<Oracle> {
    let requested =
        requested_of(setup, at.start.total)?.saturating_add(at.unchecked_total_allowance);
    // Where the engine alone captured graphs, its peak while warming up, capturing and
    // serving (see `oracle_tokens`); where the device could not capture, it runs eagerly.
    let captured = alone.graph > 0;
    let beside_kv = alone
        .activation
        .saturating_add(alone.graph)
        .max(if captured {
            alone.capture_and_burst_peak
        } else {
            0
        });
    let in_request = [alone.weights, alone.workspace, beside_kv]
        .iter()
        .fold(requested, |room, x| room.saturating_sub(*x));
    let others_grew = at
        .plan
        .other_processes
        .saturating_sub(alone.others_at_start);
    let physical = alone
        .free_before_kv
        .saturating_sub(others_grew)
        .saturating_sub(alone.capture_and_burst_peak);
    let room = if alone.nothing_fits || alone.graphs_do_not_fit {
        0
    } else {
        in_request.min(physical)
    };
    let jitter = alone.jitter_allowance();
    verdict(
        setup,
        room,
        jitter,
        false,
        start_refused(setup, &at.start),
        &alone.allocator,
    )
}

/// Whether the engine's own start-up check refuses the setup's request, on the true free
/// memory at the start ([`StartRule::refuses_at_start`](crate::scenario::StartRule::refuses_at_start):
/// vLLM's worker refuses a request above it, SGLang refuses none).
pub fn start_refused(setup: &Setup, start: &GroundTruth) -> bool {
    requested_of(setup, start.total)
        .is_some_and(|r| setup.start_rule.refuses_at_start(r, start.free))
}

fn verdict(
    setup: &Setup,
    room: u64,
    jitter: u64,
    mapped: bool,
    start_refused: bool,
    alloc: &AllocatorSnapshot,
) -> Option<Oracle> {
    let kv = EngineKv::of_setup(setup)?;
    let blocks_in = |room: u64| {
        if mapped {
            // Mapped into a reserved range: whole granules, the tensors side by side.
            let gran = memplan_backend_sim::GRANULARITY;
            kv.blocks_within(room / gran * gran, |b| kv.total_bytes(b))
        } else {
            // The engine's tensors from the caching allocator as it stood: what they take, its
            // cached blocks reused and its segments shared and rounded by its rules.
            kv.blocks_within(room, |b| kv.growth(b, alloc))
        }
    };
    let blocks = blocks_in(room);
    // Where a tensor fits in a segment the allocator had cached, what a cache takes does not
    // grow with every block, and the bisection can find a larger cache in less room: never
    // more than the oracle's own.
    let share_of = |share: f64| kv.tokens(blocks_in((room as f64 * share) as u64).min(blocks));
    let jitter_blocks = blocks_in(room.saturating_sub(jitter)).min(blocks);
    Some(Oracle {
        tokens: kv.tokens(blocks),
        blocks,
        start_refused,
        room,
        floor_tokens: FloorTokens {
            measured: share_of(crate::sweep::acceptance::MEASURED_FLOOR),
            bounded: share_of(crate::sweep::acceptance::BOUNDED_FLOOR),
        },
        jitter_tokens: kv.tokens(jitter_blocks),
        jitter_blocks,
    })
}
