//! One simulated start-up per strategy, then what a real engine does next, checked against the
//! simulator's ground truth.
//!
//! Per run: open a fresh simulated GPU, calibrate (when the scenario says so), profile the
//! engine through a [`Session`], plan; then allocate the KV cache the plan allowed, capture
//! every graph for real (unless the strategy kept them, or runs eagerly), and serve a burst at
//! full concurrency. The oracle is the largest KV cache that would have fit: within the
//! requested memory with the *real* graph memory and the engine's real non-allocator growth,
//! and within what was physically free (free memory before the KV cache, less the graphs
//! still to capture and the burst's activation; fragments cached by the allocator excluded).

use memplan_backend_sim::{GroundTruth, SimGpu};
use memplan_core::Result;

use crate::engine::SimEngine;
use crate::oracle::{engine_alone, oracle_bytes, tokens_in, AtPlan};
use crate::report::Outcome;
use crate::setup::Setup;
use memplan_planner::calibrate::{calibrate, CalibrationReport};
use memplan_planner::plan::{Plan, PlanBuilder};
use memplan_planner::session::Session;
use memplan_planner::strategy::StrategyKind;
use memplan_planner::{KvRange, Profile};

/// Which strategy a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Chosen automatically from the (calibrated) capability.
    Auto,
    /// Forced.
    Forced(StrategyKind),
}

/// Memory the truth attributes to graphs: private pool, exec objects, hidden per-capture
/// memory, graph-pool memory and releases still pending.
pub fn graph_truth(t: &GroundTruth) -> u64 {
    t.private_pool_reserved
        + t.graph_exec
        + t.hidden_capture
        + t.graph_pool_reserved
        + t.pending_release
}

/// Open the scenario's device (with the setup's seed) and its world.
pub fn open(setup: &Setup) -> Result<SimGpu> {
    let gpu = SimGpu::open(&setup.selector())?;
    if setup.other_processes > 0 {
        gpu.set_other_processes(setup.other_processes);
    }
    Ok(gpu)
}

/// Calibrate the scenario's device (on a fresh instance).
pub fn calibration(setup: &Setup) -> Result<CalibrationReport> {
    calibrate(&open(setup)?.device())
}

fn neighbour(setup: &Setup, gpu: &SimGpu, step: &str) {
    for (s, bytes) in &setup.neighbour {
        if s == step {
            // Lands at the next synchronize: the settle snapshot that opens the step.
            gpu.schedule_other_processes(gpu.tick() + 1, *bytes);
        }
    }
}

struct Profiled {
    plan: Plan,
    why: String,
    kept_graph_truth: Option<u64>,
    kv_range: Option<KvRange>,
    downgrades: Vec<String>,
}

/// A change applied to the measured profile before planning (tests inflate a planner figure
/// with it, to show the oracle does not move with the plan).
pub type Tamper<'a> = &'a dyn Fn(&mut Profile);

fn profile(
    setup: &Setup,
    gpu: &SimGpu,
    engine: &mut SimEngine,
    (choice, tamper): (Choice, Option<Tamper<'_>>),
    out: &mut Outcome,
) -> Result<Profiled> {
    let device = engine.device().clone();
    // Calibrating, the session starts the way an engine starts it (`Session::start`: its
    // calibration's leftovers are accounted); else it trusts the declaration.
    // The oracle counts tokens as vLLM 0.19 did (usable blocks times the block size,
    // [`crate::oracle::tokens_in`]), so the session sizes with those rules too.
    fn rules(s: Session<'_, SimEngine>) -> Session<'_, SimEngine> {
        s.with_sizing_rules(memplan_core::kv::SizingRules::default(), "vllm@0.19")
    }
    let (mut s, downgrades) = if setup.scenario.calibrate {
        let s = rules(Session::start(&device, engine)?);
        let d = s
            .calibration()
            .map(|r| r.downgrade_warnings())
            .unwrap_or_default();
        (s, d)
    } else {
        let cap = device.capabilities().clone();
        (rules(Session::begin(&device, engine, cap)?), Vec::new())
    };
    let downgrades: Vec<String> = downgrades.iter().map(ToString::to_string).collect();
    s.check_request(setup.request)?;
    neighbour(setup, gpu, "load_weights");
    s.load_weights(|e| e.load_weights())?;
    neighbour(setup, gpu, "profile_run");
    s.profile_run(|e| e.profile_run())?;
    // Attributed before the phase runs, so an out-of-memory inside it names the strategy.
    out.strategy = match choice {
        Choice::Auto => s.selection().kind,
        Choice::Forced(k) => k,
    };
    out.downgrades = downgrades.clone();
    neighbour(setup, gpu, "graph_phase");
    let before = graph_truth(&gpu.truth());
    let (kind, why) = match choice {
        // The automatic phase as an engine runs it (it may measure instead of sampling).
        Choice::Auto => {
            let k = s.capture_graphs()?.strategy;
            (k, s.graph_why().to_string())
        }
        Choice::Forced(k) => {
            let why = "chosen on the command line".to_string();
            s.graph_phase(&*k.strategy(), why.clone())?;
            (k, why)
        }
    };
    out.strategy = kind;
    out.why = why.clone();
    let kept = s.kept_graphs();
    let kept_graph_truth = kept.then(|| graph_truth(&gpu.truth()).saturating_sub(before));
    let plan = match tamper {
        None => s.plan(setup.request, &setup.kv, setup.limits)?,
        Some(t) => {
            let mut p = s.profile();
            t(&mut p);
            PlanBuilder::from_profile(
                &p,
                why.clone(),
                setup.request,
                setup.kv.clone(),
                setup.limits,
            )?
            .build()?
        }
    };
    let (_, kv_range) = s.into_parts();
    Ok(Profiled {
        plan,
        why,
        kept_graph_truth,
        kv_range,
        downgrades,
    })
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
/// setup, [`engine_alone`]; computed once for several strategies of one setup).
pub fn run_judged(
    setup: &Setup,
    choice: Choice,
    tamper: Option<Tamper<'_>>,
    alone: Option<crate::oracle::EngineAlone>,
) -> Result<Outcome> {
    let span = tracing::info_span!("simulate", scenario = %setup.scenario.name, ?choice);
    let _e = span.enter();
    let gpu = open(setup)?;
    let start = gpu.truth();
    let mut engine = SimEngine::new(gpu.clone(), setup.clone());
    let mut out = Outcome::new(choice);
    let pr = match profile(setup, &gpu, &mut engine, (choice, tamper), &mut out) {
        Ok(p) => p,
        Err(e) if e.is_out_of_memory() => {
            out.oom = Some(format!("during profiling: {e}"));
            return Ok(out);
        }
        Err(e) => {
            out.failed = Some(format!("start-up refused: {e}"));
            return Ok(out);
        }
    };
    out.strategy = pr.plan.strategy().unwrap_or(StrategyKind::None);
    out.why = pr.why.clone();
    out.downgrades = pr.downgrades.clone();
    out.estimate = pr.plan.graph.estimate.as_ref().map(|g| g.reserve);
    out.kv_tokens = Some(pr.plan.kv.tokens);

    // Where the world stood when the plan was made (for the oracle).
    let at = AtPlan {
        start,
        plan: gpu.truth(),
        graphs_kept: pr.kept_graph_truth.is_some(),
        eager: out.strategy == StrategyKind::None,
    };

    // What happens next in a real engine, watching the process's peak.
    let mut real_graph = pr.kept_graph_truth;
    let mut peak = 0u64;
    // What an engine allocates: whole blocks of the plan's page layout, not the budget.
    let kv_bytes = pr.plan.kv.used_bytes;
    let step = serve(
        setup,
        &gpu,
        &mut engine,
        (kv_bytes, pr.kv_range),
        &at,
        &mut real_graph,
        &mut peak,
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
        real_graph.or(alone.map(|a| a.graph))
    };
    if let (Some(est), Some(r)) = (out.estimate, out.real_graph) {
        out.error_bytes = Some(est as i64 - r as i64);
    }
    if let Some(a) = &alone {
        if let Some(bytes) = oracle_bytes(setup, a, &at) {
            out.oracle_tokens = tokens_in(setup, bytes);
        }
    }
    // Over the requested memory: the process grew past what the engine asked for.
    let req = &setup.scenario.request;
    let budget = req
        .memory_budget
        .as_ref()
        .and_then(|b| b.bytes("memory_budget").ok());
    if let Some(requested) =
        crate::oracle::requested(start.total, req.gpu_memory_utilization, budget)
    {
        let grown = peak.saturating_sub(start.this_process());
        out.over_request_bytes = (grown > requested).then(|| grown - requested);
    }
    out.plan = Some(pr.plan);
    out.finish();
    Ok(out)
}

/// Allocate the KV cache the plan allowed, capture every graph (unless kept or eager), serve a
/// burst; `peak` follows the process's driver memory.
fn serve(
    setup: &Setup,
    gpu: &SimGpu,
    engine: &mut SimEngine,
    (kv_bytes, kv_range): (u64, Option<KvRange>),
    at: &AtPlan,
    real_graph: &mut Option<u64>,
    peak: &mut u64,
) -> Result<()> {
    let mut see = |g: &SimGpu| *peak = (*peak).max(g.truth().this_process());
    engine
        .allocate_kv(kv_bytes, kv_range)
        .map_err(|e| e.during("KV cache allocation"))?;
    see(gpu);
    if !at.eager && !at.graphs_kept {
        let g0 = graph_truth(&gpu.truth());
        for s in setup.sizes.clone() {
            memplan_planner::Engine::warm_up(engine, s).map_err(|e| e.during("graph capture"))?;
            see(gpu);
            memplan_planner::Engine::capture_graph(engine, s)
                .map_err(|e| e.during("graph capture"))?;
            see(gpu);
        }
        *real_graph = Some(graph_truth(&gpu.truth()).saturating_sub(g0));
    }
    let alloc = gpu.allocator();
    let b = alloc
        .malloc(setup.activation_peak.max(1))
        .map_err(|e| e.during("serve burst"))?;
    see(gpu);
    alloc.free(b)
}

/// Run every strategy (the automatic choice first).
pub fn run_all(setup: &Setup) -> Result<Vec<Outcome>> {
    let mut v = vec![run(setup, Choice::Auto)?];
    for k in StrategyKind::ALL {
        v.push(run(setup, Choice::Forced(k))?);
    }
    Ok(v)
}
