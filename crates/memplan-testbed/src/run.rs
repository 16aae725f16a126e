//! One simulated start-up per strategy, then what a real engine does next, checked against the
//! simulator's ground truth.
//!
//! Per run: open a fresh simulated GPU, calibrate (when the scenario says so), profile the
//! engine through a [`Session`], plan; then allocate the KV cache the plan allowed, capture
//! every graph for real (unless the strategy kept them, or runs eagerly), and serve a burst at
//! full concurrency. The engine sizes its KV cache itself from the plan's block count
//! ([`crate::kv`]). The oracles ([`crate::oracle`]) are the largest KV cache that would have
//! fit: within the requested memory with the *real* graph memory and the engine's real
//! non-allocator growth, and within what was physically free.

use memplan_backend_sim::{GroundTruth, SimGpu};
use memplan_core::Result;

use crate::engine::SimEngine;
use crate::kv::EngineKv;
use crate::oracle::{clean_oracle_tokens, engine_alone, oracle_tokens, AtPlan};
use crate::report::Outcome;
use crate::setup::Setup;
use memplan_planner::calibrate::{calibrate, CalibrationReport};
use memplan_planner::plan::{Plan, PlanBuilder};
use memplan_planner::session::Session;
use memplan_planner::strategy::StrategyKind;
use memplan_planner::{KvCache, Profile};

/// Which strategy a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Chosen automatically from the (calibrated) capability.
    Auto,
    /// Forced.
    Forced(StrategyKind),
}

/// Memory the truth attributes to graphs: private pool, exec objects, hidden per-capture
/// memory, a library's allocation on the first capture, graph-pool memory and releases still
/// pending.
pub fn graph_truth(t: &GroundTruth) -> u64 {
    t.private_pool_reserved
        + t.graph_exec
        + t.hidden_capture
        + t.library_lazy
        + t.graph_pool_reserved
        + t.pending_release
}

/// Open the scenario's device (with the setup's seed) and its world.
pub fn open(setup: &Setup) -> Result<SimGpu> {
    let mut gpu = SimGpu::open(&setup.selector())?;
    if let Some((options, _)) = &setup.allocator {
        gpu = gpu.pin_allocator_options(options)?;
    }
    if setup.other_processes > 0 {
        gpu.set_other_processes(setup.other_processes);
    }
    Ok(gpu)
}

/// Calibrate the scenario's device (on a fresh instance).
pub fn calibration(setup: &Setup) -> Result<CalibrationReport> {
    calibrate(&open(setup)?.device())
}

/// Other processes hold `bytes` from now on, or what they held and all that is free where
/// `bytes` is more: memory no process holds is all another one can take (the allocation that
/// finds none fails in that process, not in this one). A change between captures or after the
/// plan lands so, at once.
pub fn others_now(gpu: &SimGpu, bytes: u64) {
    let t = gpu.truth();
    gpu.set_other_processes(bytes.min(t.other_processes.saturating_add(t.free)));
}

/// The neighbour changes between captures of `step` (`neighbour.during`): `(after_capture,
/// bytes)`, in capture order.
fn capture_changes(setup: &Setup, step: &str) -> Vec<(u32, u64)> {
    setup
        .neighbour_captures
        .iter()
        .filter(|(s, _, _)| s == step)
        .map(|(_, at, b)| (*at, *b))
        .collect()
}

fn neighbour(setup: &Setup, gpu: &SimGpu, step: &str) {
    for (s, bytes) in &setup.neighbour {
        if s == step && crate::setup::AFTER_PLAN_STEPS.contains(&step) {
            // After the plan: at once (the plan made, nothing of the session left to see it).
            others_now(gpu, *bytes);
        } else if s == step && step == "plan" {
            // Lands now, in the quiet window after the graph phase's teardown: the plan step
            // opens with no settle snapshot of its own, and a session that plans without a
            // synchronize would otherwise see the change land after its plan (the oracle,
            // taken at the plan, would not see it either, and the run would be judged on
            // memory the world took after the plan was made).
            gpu.set_other_processes(*bytes);
        } else if s == step {
            // Lands at the next synchronize: the settle snapshot that opens the step.
            gpu.schedule_other_processes(gpu.tick() + 1, *bytes);
        }
    }
}

struct Profiled {
    plan: Plan,
    why: String,
    kept_graph_truth: Option<u64>,
    /// Ground truth right after the plan, before the KV cache.
    at_plan: GroundTruth,
    /// The engine's allocator then.
    at_plan_allocator: memplan_backend_sim::AllocatorSnapshot,
    /// The KV cache the session ended with (allocated by the engine inside it, or mapped).
    cache: KvCache,
    /// The process's high-water mark (ground truth) once the session's KV allocation ended.
    peak_after_kv: Option<u64>,
    downgrades: Vec<String>,
}

/// The first phase of a start-up: the session's start (memplan's calibration, where the
/// scenario calibrates).
const PHASE_START: &str = "the session's start (calibration)";
/// The session's check of the request, between its start and the engine's weights (a step
/// of memplan's alone; marked only where a start-up ended in it).
const PHASE_REQUEST: &str = "the session's check of the request";
/// The engine's weights.
const PHASE_WEIGHTS: &str = "the engine's weights";
/// The engine's profile run.
const PHASE_PROFILE: &str = "the engine's profile run";
/// The graph phase.
const PHASE_GRAPHS: &str = "the graph phase";
/// The plan step.
const PHASE_PLAN: &str = "the plan";
/// The mark of the step a start-up that failed or refused ended in (`Outcome::ended_in`).
const PHASE_ENDED: &str = "the step that ended the start-up";

/// What the session said by name it put on top of the engine before its plan: the largest
/// allocation its probes held ([`memplan_planner::Warning::ProbesTakeFreeMemory`]) or its
/// start's checks held where the request was below the memory in use before the start
/// ([`memplan_planner::Warning::RequestBelowMemoryInUse`]), and the memory its checks left
/// held for good ([`memplan_planner::Warning::ChecksLeftHeld`]).
fn named(out: &mut Outcome, warnings: &[memplan_planner::Warning]) {
    use memplan_planner::Warning;
    out.probes_named = warnings
        .iter()
        .filter_map(|w| match w {
            Warning::ProbesTakeFreeMemory { largest }
            | Warning::RequestBelowMemoryInUse { largest, .. } => Some(*largest),
            _ => None,
        })
        .max();
    out.checks_left_held = warnings.iter().find_map(|w| match w {
        Warning::ChecksLeftHeld { bytes, within } => Some(bytes.saturating_add(*within)),
        _ => None,
    });
}

/// What the test-bed names the engine's own loading steps (weights, profile run) in errors.
const ENGINE_STEP: &str = "the engine's loading (weights, profile run)";

/// A change applied to the measured profile before planning (tests inflate a planner figure
/// with it, to show the oracle does not move with the plan).
pub type Tamper<'a> = &'a dyn Fn(&mut Profile);

/// The simulated engine states its caching allocator's configuration
/// (`Session::with_allocator_config`): where the physics drew options for it
/// (`PYTORCH_ALLOC_CONF`), always, as an engine that knows its plan rests on them; where they
/// drew none, on odd seeds it states the default configuration (an empty option string, which
/// must plan as stating nothing does), on even seeds nothing. An engine that runs with options
/// it does not state is planned by PyTorch's default rules, and the session's measure of the
/// cache (where it has one) shrinks what those rules miss: a limit the plan warns about, not
/// one the sweep's gating can hold the planner to.
fn declare_allocator<'a>(
    s: Session<'a, SimEngine>,
    gpu: &SimGpu,
    setup: &Setup,
) -> Result<Session<'a, SimEngine>> {
    let options = match (gpu.physics().allocator.option_string(), &setup.allocator) {
        // Pinned by the scenario: stated on every seed, the default configuration included,
        // with the collection threshold the simulated allocator does not act on (see
        // docs/scenarios.md, "Allocator options").
        (o, Some((_, gc))) => {
            let mut o: Vec<String> = o.into_iter().collect();
            o.extend(gc.map(|g| format!("garbage_collection_threshold:{g}")));
            o.join(",")
        }
        (Some(o), None) => o,
        (None, None) if setup.seed.is_multiple_of(2) => return Ok(s),
        (None, None) => String::new(),
    };
    let conf = memplan_core::AllocatorConfig::parse(&options)?;
    Ok(s.with_allocator_config(conf, "the simulated engine's PYTORCH_ALLOC_CONF"))
}

fn profile(
    setup: &Setup,
    gpu: &SimGpu,
    engine: &mut SimEngine,
    (choice, tamper): (Choice, Option<Tamper<'_>>),
    out: &mut Outcome,
) -> Result<Profiled> {
    let device = engine.device().clone();
    // The process's high-water mark in each phase before the plan (watched from the engine's
    // start, `run_judged`): read, then watched again from what the process holds now.
    let mark = |out: &mut Outcome, phase: &'static str| {
        out.phase_peaks.push((phase, gpu.peak().unwrap_or(0)));
        out.phase_others.push(gpu.truth().other_processes);
        gpu.watch_peak();
    };
    out.ended_in = Some(PHASE_START);
    // Calibrating, the session starts the way an engine starts it (`Session::start`: its
    // calibration's leftovers are accounted); else it trusts the declaration.
    // The oracle counts tokens as vLLM 0.19 did (usable blocks times the block size,
    // [`crate::oracle::tokens_in`]), so the session sizes with those rules too (the KV
    // cache's allocation as the setup names it, one tensor per layer unless a test says).
    // Where the engine is SGLang (it starts with a pool shorter than one request, keeps a
    // hybrid model in two pools split by its release's rule, and takes its fraction of the
    // memory free at its start), the session is told its release's rules, as an engine names
    // its release.
    fn rules<'a>(s: Session<'a, SimEngine>, setup: &Setup) -> Session<'a, SimEngine> {
        use crate::scenario::StartRule;
        use memplan_core::kv::LongRequests;
        use memplan_core::kv::SwaPools;
        let (long, pools, release) = match setup.start_rule {
            StartRule::Vllm => (LongRequests::Refuse, SwaPools::Groups, "vllm@0.19"),
            StartRule::Sglang051 => (
                LongRequests::CapByPool { least_tokens: 7 },
                SwaPools::SglangEveryLayer,
                "sglang@0.5.9",
            ),
            StartRule::Sglang0514 => (
                LongRequests::CapByPool { least_tokens: 2 },
                SwaPools::SglangFullPool,
                "sglang@0.5.22",
            ),
        };
        // SGLang's pools are its allocation's ([`crate::kv::EngineKv::of_setup`]): an engine
        // that names an SGLang release but allocates as vLLM does keeps vLLM's groups.
        let sglang_tensors = matches!(
            setup.kv_allocation,
            memplan_core::kv::KvAllocation::SplitKv | memplan_core::kv::KvAllocation::PairedKv
        );
        let r = memplan_core::kv::SizingRules::default()
            .with_kv_allocation(setup.planned_kv_allocation)
            .with_long_requests(long)
            .with_swa_pools(if sglang_tensors {
                pools
            } else {
                SwaPools::Groups
            })
            // SGLang sizes its pool from the free memory it reads after its weights less its
            // slack of the memory free at its start, and refuses no request for other
            // processes' memory (`StartCheck::PoolOfFreeAfterWeights`: 0.5.9
            // `profile_max_num_token`, 0.5.22 `_profile_available_bytes`); vLLM's worker
            // refuses a request above the free memory.
            .with_start_check(match setup.start_rule {
                StartRule::Vllm => memplan_core::kv::StartCheck::RefuseAboveFree,
                StartRule::Sglang051 | StartRule::Sglang0514 => {
                    memplan_core::kv::StartCheck::PoolOfFreeAfterWeights
                }
            });
        s.with_sizing_rules(r, release)
    }
    let (s, downgrades) = if setup.scenario.calibrate {
        let s = rules(Session::start_for(&device, engine, setup.request)?, setup);
        let d = s
            .calibration()
            .map(|r| r.downgrade_warnings())
            .unwrap_or_default();
        (s, d)
    } else {
        let cap = device.capabilities().clone();
        (
            rules(
                Session::begin_for(&device, engine, cap, setup.request)?,
                setup,
            ),
            Vec::new(),
        )
    };
    named(out, s.warnings());
    mark(out, PHASE_START);
    out.ended_in = Some(PHASE_REQUEST);
    // The engine knows its model's KV layout and the longest request it serves when it starts,
    // and says so before its profile run (`Session::with_kv`).
    let mut s = declare_allocator(s, gpu, setup)?.with_kv(&setup.kv, setup.limits);
    let downgrades: Vec<String> = downgrades.iter().map(ToString::to_string).collect();
    s.check_request(setup.request)?;
    neighbour(setup, gpu, "load_weights");
    out.ended_in = Some(PHASE_WEIGHTS);
    let r = s.load_weights(|e| e.load_weights());
    named(out, s.warnings());
    r.map_err(|e| e.during(ENGINE_STEP))?;
    mark(out, PHASE_WEIGHTS);
    neighbour(setup, gpu, "profile_run");
    out.ended_in = Some(PHASE_PROFILE);
    let r = s.profile_run(|e| e.profile_run());
    named(out, s.warnings());
    r.map_err(|e| e.during(ENGINE_STEP))?;
    mark(out, PHASE_PROFILE);
    // Attributed before the phase runs, so an out-of-memory inside it names the strategy.
    out.strategy = match choice {
        Choice::Auto => s.selection().kind,
        Choice::Forced(k) => k,
    };
    out.downgrades = downgrades.clone();
    neighbour(setup, gpu, "graph_phase");
    let before = graph_truth(&gpu.truth());
    out.ended_in = Some(PHASE_GRAPHS);
    s.engine()
        .arm_neighbour(capture_changes(setup, "graph_phase"));
    let phase = match choice {
        // The automatic phase as an engine runs it (it may measure instead of sampling).
        Choice::Auto => match s.capture_graphs().map(|g| g.strategy) {
            Ok(k) => Ok((k, s.graph_why().to_string())),
            Err(e) => Err(e),
        },
        Choice::Forced(k) => {
            let why = "chosen on the command line".to_string();
            s.graph_phase(&*k.strategy(), why.clone()).map(|_| (k, why))
        }
    };
    // Changes after more captures than the phase made land as it ends.
    for bytes in s.engine().disarm_neighbour() {
        others_now(gpu, bytes);
    }
    named(out, s.warnings());
    let (kind, why) = phase?;
    out.strategy = kind;
    out.why = why.clone();
    mark(out, PHASE_GRAPHS);
    let kept = s.kept_graphs();
    let kept_graph_truth = kept.then(|| graph_truth(&gpu.truth()).saturating_sub(before));
    neighbour(setup, gpu, "plan");
    out.ended_in = Some(PHASE_PLAN);
    let plan = match tamper {
        None => s.plan(setup.request, &setup.kv, setup.limits),
        Some(t) => {
            let mut p = s.profile();
            t(&mut p);
            PlanBuilder::from_profile(
                &p,
                why.clone(),
                setup.request,
                setup.kv.clone(),
                setup.limits,
            )
            .and_then(|b| s.plan_with(b))
        }
    };
    match &plan {
        Ok(p) => named(out, &p.warnings),
        Err(_) => named(out, s.warnings()),
    }
    let plan = plan?;
    mark(out, PHASE_PLAN);
    out.ended_in = None;
    let at_plan = gpu.truth();
    let at_plan_allocator = gpu.allocator().snapshot();
    // From here on the simulator keeps the process's high-water mark: over the request is
    // judged on the most the process ever held after the plan, not on sampled points.
    gpu.watch_peak();
    neighbour(setup, gpu, "kv_cache");
    // The engine's KV cache, as an engine ends its start-up: the session has the engine
    // allocate the plan's blocks (measured, fewer where they take more than the plan kept),
    // or maps them after post-capture.
    let cache = s.into_kv_cache(&plan)?;
    let peak_after_kv = gpu.peak();
    Ok(Profiled {
        plan,
        why,
        kept_graph_truth,
        at_plan,
        at_plan_allocator,
        cache,
        peak_after_kv,
        downgrades,
    })
}

/// The engine alone beside what other processes hold now (`others`), where that differs from
/// what they held at the start (`alone.others_at_start`); elsewhere `alone` as computed. An
/// engine alone that cannot be computed beside them leaves `alone`.
fn alone_beside(
    setup: &Setup,
    alone: crate::oracle::EngineAlone,
    others: u64,
) -> crate::oracle::EngineAlone {
    if others == alone.others_at_start {
        return alone;
    }
    let mut beside = setup.clone();
    beside.other_processes = others;
    beside.neighbour.clear();
    beside.neighbour_captures.clear();
    engine_alone(&beside).unwrap_or(alone)
}

/// The engine alone a plan made beside `others` (what other processes hold at the plan) is
/// judged on. Where the engine alone runs out of memory beside what the others held at the
/// start (loading its weights, in its profile run or capturing its graphs) and they hold less
/// at the plan, the engine alone beside what they hold then: the run got past its loading and
/// profile run beside the others as they were at each step, its KV cache and graphs face the
/// others as they are at the plan, and an engine that fits beside fewer others is no model
/// that does not fit. Elsewhere `alone` as computed (the others at the start).
fn alone_at_plan(
    setup: &Setup,
    alone: Option<crate::oracle::EngineAlone>,
    others: u64,
) -> Option<crate::oracle::EngineAlone> {
    match alone {
        Some(a) if (a.nothing_fits || a.graphs_do_not_fit) && others < a.others_at_start => {
            Some(alone_beside(setup, a, others))
        }
        a => a,
    }
}

/// Run one strategy on a fresh device.
pub fn run(setup: &Setup, choice: Choice) -> Result<Outcome> {
    run_with(setup, choice, None)
}

/// As [`run`], with the measured profile changed by `tamper` before planning.
pub fn run_with(setup: &Setup, choice: Choice, tamper: Option<Tamper<'_>>) -> Result<Outcome> {
    run_judged(setup, choice, tamper, engine_alone(setup).ok())
}

/// As [`run_with`], judged against `alone` (the engine alone on a fresh device of the same
/// setup, [`engine_alone`]; computed once for several strategies of one setup; `None` when it
/// could not be computed, which the outcome records as the harness's error).
pub fn run_judged(
    setup: &Setup,
    choice: Choice,
    tamper: Option<Tamper<'_>>,
    alone: Option<crate::oracle::EngineAlone>,
) -> Result<Outcome> {
    let out = run_once(setup, choice, tamper, alone.clone())?;
    let Some(calm) = setup.calm_after_plan().filter(|_| out.oom.is_some()) else {
        return Ok(out);
    };
    // Other processes took memory after the plan and the run ran out of memory. The plan and
    // every step before it are the same with the others left as they were at the plan (no
    // change lands before it): run that world, on the same seed. Where it runs out of memory
    // too, the out-of-memory is the run's, judged as any. Where it does not, only the memory
    // the others took after the plan caused it: no plan made at start-up could see it (the
    // engine's request is its own share of the device; what others take past what was free
    // at the plan is the deployment's overcommit). That run is judged by every other rule, and
    // the out-of-memory is reported as the others', never dropped.
    let judged = run_once(&calm, choice, tamper, alone)?;
    if judged.planned_tokens != out.planned_tokens && out.planned_tokens.is_some() {
        let mut out = out;
        out.failed = Some(format!(
            "harness: the plan moved ({:?} tokens, {:?} without the changes after the plan): a change after the plan reached the start-up",
            out.planned_tokens, judged.planned_tokens
        ));
        return Ok(out);
    }
    if judged.oom.is_some() {
        return Ok(out);
    }
    let mut judged = judged;
    judged.oom_others_after_plan = out.oom;
    Ok(judged)
}

/// One run of [`run_judged`], as the world of the setup has it.
fn run_once(
    setup: &Setup,
    choice: Choice,
    tamper: Option<Tamper<'_>>,
    alone: Option<crate::oracle::EngineAlone>,
) -> Result<Outcome> {
    let span = tracing::info_span!("simulate", scenario = %setup.scenario.name, ?choice);
    let _e = span.enter();
    let gpu = open(setup)?;
    let start = gpu.truth();
    // The total the runtime reports (the simulator's driver reading, quirks applied): the
    // share of it a plan takes where nothing checks it is judged beside the real total's.
    let reported_total = gpu.raw_driver_memory().total;
    // Over the request is judged from the engine's start: the simulator keeps the process's
    // high-water mark from here on (each phase's, `Outcome::phase_peaks`).
    gpu.watch_peak();
    let mut engine = SimEngine::new(gpu.clone(), setup.clone());
    let mut out = Outcome::new(choice);
    if alone.is_none() {
        out.oracle_error = Some("the engine alone could not run on a fresh device".into());
    }
    let pr = match profile(setup, &gpu, &mut engine, (choice, tamper), &mut out) {
        Ok(p) => p,
        Err(e) => {
            let engine_step = e.is_out_of_memory() && e.to_string().contains(ENGINE_STEP);
            let fails = |a: &Option<crate::oracle::EngineAlone>| {
                a.as_ref()
                    .is_some_and(|a| a.nothing_fits || a.graphs_do_not_fit)
            };
            let fails_at_start = fails(&alone);
            // A refusal (or failure) is judged on the engine alone beside what other processes
            // hold when it came, as a plan is judged beside what they hold at the plan
            // (`alone_at_plan`), in both directions: a refusal after they left, where the
            // engine alone then fits, is needless if the oracle holds a request; one after
            // they grew, where the engine alone then does not fit, is right.
            let now = gpu.truth().other_processes;
            // Its steps before the refusal ran beside the others as they were at each: the
            // engine's own marks, and its captures' variation, are the fuller of the engine
            // alone's beside them at the start and now (one that ran out of memory beside more
            // of them shows less of its steps, and none of its captures).
            let at_start = alone.clone();
            let alone = alone.map(|a| alone_beside(setup, a, now));
            let engine = alone
                .as_ref()
                .map(|a| at_start.as_ref().map_or(a.clone(), |s| a.fuller_steps(s)));
            if engine_step && fails(&alone) && fails_at_start {
                // The engine alone runs out of memory loading too, or capturing its graphs with
                // no KV cache at all: the model does not fit, whatever memplan does (its
                // calibration's leftovers only move the out-of-memory earlier).
                out.failed = Some(format!(
                    "the model does not fit on the device (the engine alone runs out of memory too): {e}"
                ));
            } else if engine_step && fails(&alone) {
                // Another process took memory during the start-up: the engine alone, beside
                // what the others hold now, cannot load or run its profile either. The world
                // left no room; nothing memplan did took it. (Where they left instead and the
                // engine alone beside them fits, an engine step that runs out of memory is
                // memplan's, as anywhere the engine alone fits.)
                out.failed = Some(format!(
                    "the model does not fit beside what other processes took during the start-up (the engine alone, beside them, runs out of memory too): {e}"
                ));
            } else if e.is_out_of_memory() {
                out.oom = Some(format!("during profiling: {e}"));
            } else {
                out.failed = Some(format!("start-up refused: {e}"));
            }
            out.phase_peaks.push((PHASE_ENDED, gpu.peak().unwrap_or(0)));
            out.phase_others.push(now);
            out.over_request_before_plan = over_before_plan(setup, &start, &out.phase_peaks);
            out.own_over_request_before_plan =
                own_over_before_plan(setup, &start, &out, (engine.as_ref(), at_start.as_ref()));
            // Judged all the same: a refusal where the oracles show room is a failure.
            let at = AtPlan {
                start,
                plan: gpu.truth(),
                graphs_kept: false,
                eager: false,
                allocator: gpu.allocator().snapshot(),
                refused: true,
                engine_pool_most: None,
                unchecked_total_allowance: 0,
            };
            judge(setup, alone.as_ref(), &at, &mut out);
            return Ok(out);
        }
    };
    out.over_request_before_plan = over_before_plan(setup, &start, &out.phase_peaks);
    out.own_over_request_before_plan =
        own_over_before_plan(setup, &start, &out, (alone.as_ref(), alone.as_ref()));
    let alone = alone_at_plan(setup, alone, pr.at_plan.other_processes);
    out.strategy = pr.plan.strategy().unwrap_or(StrategyKind::None);
    out.why = pr.why.clone();
    out.downgrades = pr.downgrades.clone();
    out.estimate = pr.plan.graph.estimate.as_ref().map(|g| g.reserve);
    // What the engine's own arithmetic makes of the plan's block count.
    let engine_kv = EngineKv::of_setup(setup);
    out.planned_tokens = Some(pr.plan.kv.tokens);
    out.kv_tokens = engine_kv.as_ref().map(|k| k.tokens(pr.cache.num_blocks));
    // An engine that sizes its pool from its own free readings keeps no more than its own
    // rule gives, whatever it is told: what it serves is the smaller.
    if let (Some(k), Some(readings)) = (engine_kv.as_ref(), engine.own_free_readings()) {
        let own = own_pool_tokens(&pr.plan, readings, k);
        out.engine_pool_tokens = Some(own);
        out.kv_tokens = out.kv_tokens.map(|t| t.min(own));
    }
    // What the caching allocator's rounding of the engine's tensors costs at the plan's block
    // count, in tokens: the blocks the plan's own bytes do not hold once each tensor is
    // rounded by the allocator as it stood at the plan (its segments, its rounding). A cache
    // that must fit what the plan kept loses up to that many blocks to the rounding (up to one
    // granule per tensor: the waste at the plan's own count says nothing of it, the next
    // granule down is what a smaller cache ends on); a session that measures the engine's
    // allocation gives them back, warned.
    out.kv_rounding_tokens = engine_kv.filter(|_| pr.cache.range.is_none()).map(|k| {
        let n = pr.plan.kv.num_blocks;
        let own = k.total_bytes(n).unwrap_or(u64::MAX);
        let held = k.blocks_within(own, |b| k.growth(b, &pr.at_plan_allocator));
        k.tokens(n).saturating_sub(k.tokens(held))
    });
    out.kv_warnings = pr
        .cache
        .warnings
        .iter()
        .map(|w| {
            w.to_json()["code"]
                .as_str()
                .unwrap_or("unnamed")
                .to_string()
        })
        .collect();

    // An engine that sizes its pool from its own free readings (SGLang) keeps no more than
    // what it read free once its weights were loaded, whatever fraction it is given: memory
    // other processes released after that is in no pool it can make, and a plan that counts
    // on it is served below the plan. The oracle is held to the same, except where the plan
    // named that it could not model those readings (`engine_pool_unmodelled`: the plan is then
    // judged on its own and the engine's smaller pool is not held against it, as
    // `acceptance::served_below_plan` says).
    let pool_unmodelled = pr
        .plan
        .warnings
        .iter()
        .any(|w| matches!(w, memplan_planner::Warning::EnginePoolUnmodelled { .. }));
    out.unchecked_total_allowance =
        unchecked_total_allowance(setup, &start, reported_total, &pr.plan.warnings);
    // Where the world stood when the plan was made (for the oracle).
    let at = AtPlan {
        start,
        plan: pr.at_plan,
        graphs_kept: pr.kept_graph_truth.is_some(),
        eager: out.strategy == StrategyKind::None,
        allocator: pr.at_plan_allocator.clone(),
        refused: false,
        engine_pool_most: engine
            .own_free_readings()
            .filter(|_| !pool_unmodelled)
            .map(|(_, after)| after),
        unchecked_total_allowance: out.unchecked_total_allowance.unwrap_or(0),
    };

    // What happens next in a real engine; the simulator keeps the process's high-water mark
    // since the plan, read at the end of each phase.
    let mut real_graph = pr.kept_graph_truth;
    let mut marks = vec![("the session's KV cache allocation", pr.peak_after_kv)];
    let mut sampled = gpu.truth().this_process();
    let step = serve(
        setup,
        &gpu,
        &mut engine,
        pr.cache,
        &at,
        &mut real_graph,
        (&mut marks, &mut sampled),
    );
    if let Err(e) = step {
        if e.is_out_of_memory() {
            out.oom = Some(e.to_string());
        } else {
            out.failed = Some(e.to_string());
        }
    }
    out.real_graph = if at.eager {
        Some(0)
    } else {
        real_graph.or(alone.as_ref().map(|a| a.graph))
    };
    if let (Some(est), Some(r)) = (out.estimate, out.real_graph) {
        out.error_bytes = Some(est as i64 - r as i64);
    }
    judge(setup, alone.as_ref(), &at, &mut out);
    // Over the requested memory: the process's high-water mark from the plan on (ground
    // truth: KV allocation, graph capture, serving) grew past what the engine asked for.
    if let Some(limit) = request_limit(setup, &start) {
        let peak = gpu.peak().unwrap_or(0);
        out.over_request_bytes = (peak > limit).then(|| peak - limit);
        out.over_request_phase = marks
            .iter()
            .find(|(_, p)| p.is_some_and(|p| p > limit))
            .map(|(phase, _)| (*phase).to_string());
        out.over_request_sampled_bytes = (sampled > limit).then(|| sampled - limit);
    }
    out.plan = Some(pr.plan);
    out.finish();
    Ok(out)
}

/// `Outcome::unchecked_total_allowance`: where the plan warned that its share of the device is
/// of a total nothing checks (`utilization_of_unchecked_total`), the request's share of the
/// total the runtime reports (`reported`) less its share of the device's real memory, at
/// least 0; `None` where the plan did not warn so, or the request is no share of the device.
/// A runtime that reports more than the device has makes an engine ask for that much more
/// (vLLM's worker takes its share of the runtime's total), and where no reading of the
/// device's memory contradicts the runtime, no plan can tell; the plan that names it is held
/// to the share as reported, never to more, and the oracle fits its cache in the same request
/// ([`AtPlan::unchecked_total_allowance`]).
fn unchecked_total_allowance(
    setup: &Setup,
    start: &GroundTruth,
    reported: Option<u64>,
    warnings: &[memplan_planner::Warning],
) -> Option<u64> {
    let warned = warnings.iter().any(|w| {
        matches!(
            w,
            memplan_planner::Warning::UtilizationOfUncheckedTotal { .. }
        )
    });
    let req = &setup.scenario.request;
    if !warned || req.memory_budget.is_some() {
        return None;
    }
    let share = |total| crate::oracle::requested(total, req.gpu_memory_utilization, None);
    let real = share(start.total)?;
    Some(share(reported?)?.saturating_sub(real))
}

/// The tokens an engine that sizes its KV pool from its own free readings keeps by its own
/// rule, given the static fraction the plan suggests (`engine_static_fraction`) or, where it
/// suggests none, the request's share of the device rounded up to the thousandth, as
/// `memplan plan --emit-args sglang` writes `--mem-fraction-static`. SGLang keeps the smaller
/// of the tokens it is given (`--max-total-tokens`) and what fits in `rest = free after the
/// weights - free at the start x (1 - mem_fraction_static)` (0.5.9
/// `srt/model_executor/model_runner_kv_cache_mixin.py` `profile_max_num_token`; 0.5.22
/// `srt/mem_cache/kv_cache_configurator.py` `_profile_available_bytes`, `slack_gb =
/// pre_model_load_memory * (1 - mem_fraction_static)`), in its own float arithmetic, the pool's
/// tensors counted at their own bytes (`rest // cell_size`). Written here from SGLang's
/// source, apart from the planner's model of the rule.
fn own_pool_tokens(plan: &memplan_planner::Plan, (start, after): (u64, u64), kv: &EngineKv) -> u64 {
    let fraction = plan.suggestions.engine_static_fraction.unwrap_or_else(|| {
        let share = plan.requested_bytes as f64 / plan.total_bytes.max(1) as f64;
        ((share * 1000.0) - 1e-6).ceil() / 1000.0
    });
    let rest = after as f64 - start as f64 * (1.0 - fraction.min(1.0));
    if rest <= 0.0 {
        return 0;
    }
    kv.tokens(kv.blocks_within(rest as u64, |b| kv.total_bytes(b)))
}

/// The most the process may hold under the request: what it held at the start (its context)
/// and the memory the engine asked for; `None` where the request names no amount.
fn request_limit(setup: &Setup, start: &GroundTruth) -> Option<u64> {
    let req = &setup.scenario.request;
    let budget = req
        .memory_budget
        .as_ref()
        .and_then(|b| b.bytes("memory_budget").ok());
    crate::oracle::requested(start.total, req.gpu_memory_utilization, budget)
        .map(|requested| start.this_process().saturating_add(requested))
}

/// How far the process's high-water mark before the plan passed the request, at its most, and
/// the first phase that passed it.
fn over_before_plan(
    setup: &Setup,
    start: &GroundTruth,
    peaks: &[(&'static str, u64)],
) -> Option<(u64, &'static str)> {
    let limit = request_limit(setup, start)?;
    let most = peaks.iter().map(|(_, p)| *p).max()?;
    let first = peaks.iter().find(|(_, p)| *p > limit)?.0;
    (most > limit).then(|| (most - limit, first))
}

/// How far the process's high-water mark before the plan passed what the engine's own steps
/// took, at its most, and the first phase it did so in (`Outcome::own_over_request_before_plan`):
/// each phase's mark above the larger of the request and the engine alone's mark in the same
/// step (`alone`'s [`crate::oracle::AloneMarks`]; none: the request alone).
///
/// The engine's own steps are its weights, its profile run and, where the run's graph phase
/// captured the engine's graphs (every strategy but conservative and eager), its captures:
/// memory they take past the request is the engine's, which no session can hold back (it
/// learns what the weights or the graphs take only by running them), and the engine alone
/// takes it too, beside the others as they were in that step: a step's mark is the fuller of
/// `alone`'s and the engine alone's beside what other processes held in each step up to it
/// (`Outcome::phase_others`; the engine holds then what its steps so far made, each beside the
/// others of its own step). A neighbour that left before the profile run and came back before
/// the plan let the engine's captures (no KV cache yet, post-capture) take what it left; judged
/// beside the others of the start and of the plan only, the captures of an engine that does not
/// fit went 59-207 MiB past what the engine alone could hold there, read as memplan's own.
/// The same graphs captured again take more or less than the engine alone's
/// captures by the device's capture-to-capture variation (ground truth,
/// [`crate::oracle::EngineAlone::graph_jitter_sd`]): the captures are the engine's up to
/// [`crate::oracle::EngineAlone::jitter_allowance`] above its mark (the variation's 99.9%
/// one-sided quantile, as the attainable floor keeps), the same variation its own capture after
/// the plan has. A step the engine alone ran out of memory in is marked with the most the
/// process could hold then ([`crate::oracle::AloneMarks`]): it asks for more than the device
/// has, so it takes the process to the device's limit whatever memplan did (the same graphs
/// captured again, with a smaller draw of their variation, get past the capture that failed
/// alone). The session's start, its check of the request and the plan step are
/// memplan's own (the plan step beside what the engine holds then: its weights, and its graphs
/// where post-capture kept them). A start-up that ended in a step is judged on that step.
///
/// `(alone, at_start)`: the engine alone the run is judged on, and the one beside the others
/// of the start (from which the engine alone beside the others of each step is computed).
fn own_over_before_plan(
    setup: &Setup,
    start: &GroundTruth,
    out: &Outcome,
    (alone, at_start): (
        Option<&crate::oracle::EngineAlone>,
        Option<&crate::oracle::EngineAlone>,
    ),
) -> Option<(u64, &'static str)> {
    let over = own_over_beside(setup, start, out, |_| alone.cloned())?;
    let (Some(alone), Some(at_start)) = (alone, at_start) else {
        return Some(over);
    };
    // Only where something is left to judge: the engine alone beside each level of the others
    // the steps saw (computed once a level; the level of the start is `at_start` itself).
    let mut beside: Vec<(u64, crate::oracle::EngineAlone)> = Vec::new();
    let mut at = |others: u64| -> crate::oracle::EngineAlone {
        if let Some((_, a)) = beside.iter().find(|(o, _)| *o == others) {
            return a.clone();
        }
        let a = alone_beside(setup, at_start.clone(), others);
        beside.push((others, a.clone()));
        a
    };
    let fuller: Vec<crate::oracle::EngineAlone> = (1..=out.phase_others.len())
        .map(|upto| {
            out.phase_others[..upto]
                .iter()
                .fold(alone.clone(), |acc, o| acc.fuller_steps(&at(*o)))
        })
        .collect();
    let mut phase = fuller.into_iter();
    own_over_beside(setup, start, out, |_| phase.next())
}

/// [`own_over_before_plan`], each phase of `Outcome::phase_peaks` judged in turn against the
/// engine alone `alone_in` gives for it.
fn own_over_beside(
    setup: &Setup,
    start: &GroundTruth,
    out: &Outcome,
    mut alone_in: impl FnMut(&str) -> Option<crate::oracle::EngineAlone>,
) -> Option<(u64, &'static str)> {
    let limit = request_limit(setup, start)?;
    let captures = !matches!(
        out.strategy,
        StrategyKind::Conservative | StrategyKind::None
    );
    let engine = |phase: &str, alone: Option<&crate::oracle::EngineAlone>| -> u64 {
        let Some(e) = alone else { return 0 };
        let a = &e.marks;
        match phase {
            PHASE_WEIGHTS => a.weights,
            PHASE_PROFILE => a.profile_run,
            PHASE_GRAPHS if captures => a.graphs.saturating_add(e.jitter_allowance()),
            PHASE_GRAPHS => a.after_profile_run,
            PHASE_PLAN if out.strategy == StrategyKind::PostCapture => {
                a.after_graphs.saturating_add(e.jitter_allowance())
            }
            PHASE_PLAN => a.after_profile_run,
            _ => 0,
        }
    };
    let mut most: Option<(u64, &'static str)> = None;
    for (phase, peak) in &out.phase_peaks {
        let step = match *phase {
            PHASE_ENDED => out.ended_in.unwrap_or(PHASE_ENDED),
            p => p,
        };
        let alone = alone_in(step);
        let over = peak.saturating_sub(limit.max(engine(step, alone.as_ref())));
        if over > 0 {
            most = Some(match most {
                Some((b, first)) => (b.max(over), first),
                None => (over, step),
            });
        }
    }
    most
}

/// Both oracles' verdicts on the run (an oracle that cannot be computed is recorded as the
/// harness's error, never skipped).
fn judge(
    setup: &Setup,
    alone: Option<&crate::oracle::EngineAlone>,
    at: &AtPlan,
    out: &mut Outcome,
) {
    let Some(a) = alone else { return };
    match oracle_tokens(setup, a, at) {
        Some(o) => out.oracle = Some(o),
        None => {
            out.oracle_error = Some(format!(
                "no oracle for the request or the KV dtype {:?}",
                setup.scenario.kv.dtype
            ))
        }
    }
    out.clean_oracle = clean_oracle_tokens(setup, a, at);
    out.oracle_tokens = out.oracle.map(|o| o.tokens);
}

/// The process's high-water mark (since the plan) at the end of each phase, in order.
type Marks = Vec<(&'static str, Option<u64>)>;

/// Allocate the KV cache of the plan's block count (the engine's own arithmetic), capture
/// every graph (unless kept or eager), serve a burst; `marks` gets the process's high-water
/// mark at the end of each phase (a phase that fails is marked too), `sampled` the most the
/// process held at the sampled points (after the KV cache, each warm-up and capture, the
/// burst).
fn serve(
    setup: &Setup,
    gpu: &SimGpu,
    engine: &mut SimEngine,
    cache: KvCache,
    at: &AtPlan,
    real_graph: &mut Option<u64>,
    (marks, sampled): (&mut Marks, &mut u64),
) -> Result<()> {
    let mut see = |g: &SimGpu| *sampled = (*sampled).max(g.truth().this_process());
    let r = match (cache.allocated, cache.range) {
        (true, _) => Ok(()),
        (false, Some(range)) => engine.adopt_kv(cache.num_blocks, range),
        (false, None) => engine.allocate_kv(cache.num_blocks),
    };
    see(gpu);
    marks.push(("the engine's KV cache allocation", gpu.peak()));
    r.map_err(|e| e.during("KV cache allocation"))?;
    neighbour(setup, gpu, "engine_capture");
    engine.arm_neighbour(capture_changes(setup, "engine_capture"));
    if !at.eager && !at.graphs_kept {
        let g0 = graph_truth(&gpu.truth());
        let r = setup.sizes.clone().into_iter().try_for_each(|s| {
            memplan_planner::Engine::warm_up(engine, s)?;
            see(gpu);
            memplan_planner::Engine::capture_graph(engine, s)?;
            see(gpu);
            Ok(())
        });
        marks.push(("the engine's graph capture", gpu.peak()));
        r.map_err(|e: memplan_core::Error| e.during("graph capture"))?;
        *real_graph = Some(graph_truth(&gpu.truth()).saturating_sub(g0));
    }
    // Changes after more captures than the engine made (none, where it keeps the session's
    // graphs or runs eagerly) land as its captures end.
    for bytes in engine.disarm_neighbour() {
        others_now(gpu, bytes);
    }
    neighbour(setup, gpu, "serve");
    let alloc = gpu.allocator();
    let b = alloc.malloc(setup.activation_peak.max(1));
    see(gpu);
    marks.push(("serving (a burst at full concurrency)", gpu.peak()));
    alloc.free(b.map_err(|e| e.during("serve burst"))?)
}

/// Run every strategy (the automatic choice first).
pub fn run_all(setup: &Setup) -> Result<Vec<Outcome>> {
    let mut v = vec![run(setup, Choice::Auto)?];
    for k in StrategyKind::ALL {
        v.push(run(setup, Choice::Forced(k))?);
    }
    Ok(v)
}
