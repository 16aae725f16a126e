//! Every way an engine can misuse a session is a typed error (or, where it is legitimate, a
//! documented behaviour), never a wrong plan: steps out of order or repeated, weights loaded
//! in parts, a graph phase skipped by an engine that captures graphs, a KV cache mapped
//! beyond its plan, a session's rank in its plan.

#![cfg(feature = "sim")]

use memplan::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan::{
    AllocatorView, CaptureWork, Engine, Error, GraphId, OwnAccounting, Rank, Request, Result,
    Session, SharedDevice, Step, StrategyKind, Warning,
};

const MIB: u64 = 1 << 20;

/// A small engine on raw device allocations: 1 GiB of weights per load, graphs of 64 kernels.
struct Toy {
    dev: SharedDevice,
    acct: OwnAccounting,
    held: Vec<memplan::RawAllocation>,
    graphs: Vec<GraphId>,
    sizes: Vec<u32>,
}

impl Toy {
    fn new(dev: &SharedDevice, sizes: Vec<u32>) -> Self {
        Toy {
            dev: dev.clone(),
            acct: OwnAccounting::default(),
            held: Vec::new(),
            graphs: Vec::new(),
            sizes,
        }
    }
    fn load(&mut self) -> Result<()> {
        for _ in 0..8 {
            self.held.push(self.dev.allocate(128 * MIB)?);
            self.acct.add(128 * MIB);
        }
        Ok(())
    }
    fn forward(&mut self) -> Result<()> {
        let a = self.dev.allocate(256 * MIB)?;
        self.acct.add(256 * MIB);
        self.acct.remove(256 * MIB);
        Ok(self.dev.free(a)?)
    }
}

impl Drop for Toy {
    /// The engine shuts down: its weights go back (tests reuse a device).
    fn drop(&mut self) {
        for a in self.held.drain(..) {
            let _ = self.dev.free(a);
        }
    }
}

impl Engine for Toy {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.acct
    }
    fn graph_sizes(&self) -> Vec<u32> {
        self.sizes.clone()
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        let g = self
            .dev
            .graph_capture()?
            .capture_once(&CaptureWork::new(64))?;
        self.graphs.push(g);
        Ok(())
    }
    fn release_graphs(&mut self) -> Result<()> {
        if self.graphs.is_empty() {
            return Ok(());
        }
        let gc = self.dev.graph_capture()?;
        self.graphs.drain(..).try_for_each(|g| gc.destroy(g))
    }
}

fn kv() -> (KvSpec, KvLimits) {
    let g = LayerGroup::new(AttentionKind::Full, 24, 8, 128);
    (
        KvSpec::new(vec![g], KvDtype::Bf16, 16),
        KvLimits::new(4096, 2048),
    )
}

const REQ: Request = Request::Utilization(0.9);

/// `step` was refused as out of order / repeated: `InvalidState` naming it.
fn refused<T: std::fmt::Debug>(r: Result<T>, step: Step, says: &str) {
    match r {
        Err(Error::InvalidState { operation, reason }) => {
            assert_eq!(operation, step.name(), "{reason}");
            assert!(reason.contains(says), "{step}: {reason}");
        }
        other => panic!("{step} was not refused: {other:?}"),
    }
}

#[test]
fn weights_loaded_in_parts_add_up() {
    let dev = memplan::open("sim:rtx4090,other=0").unwrap();
    let mut e = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut e).unwrap();
    let first = s.load_weights(Toy::load).unwrap();
    let second = s.load_weights(Toy::load).unwrap();
    assert_eq!((first, second), (1024 * MIB, 1024 * MIB));
    let p = s.profile();
    assert_eq!(p.weights_bytes, Some(2048 * MIB), "both loads are held");
    assert_eq!(
        p.steps
            .iter()
            .filter(|st| st.name == "load_weights")
            .count(),
        2
    );
    s.profile_run(Toy::forward).unwrap();
    let (spec, limits) = kv();
    let plan = s.plan(REQ, &spec, limits).unwrap();
    assert_eq!(
        plan.consumers.bytes(memplan::ConsumerKind::Weights),
        2048 * MIB
    );
}

#[test]
fn steps_out_of_order_or_repeated_are_refused_by_name() {
    let dev = memplan::open("sim:rtx4090,other=1").unwrap();
    let mut e = Toy::new(&dev, vec![4, 2, 1]);
    let mut s = Session::start(&dev, &mut e).unwrap();
    refused(
        s.profile_run(Toy::forward),
        Step::ProfileRun,
        "needs load_weights",
    );
    refused(s.capture_graphs(), Step::CaptureGraphs, "needs profile_run");
    s.check_request(REQ).unwrap();
    refused(s.check_request(REQ), Step::CheckRequest, "already ran");
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    refused(s.profile_run(Toy::forward), Step::ProfileRun, "already ran");
    refused(
        s.load_weights(Toy::load),
        Step::LoadWeights,
        "cannot run after profile_run",
    );
    s.capture_graphs().unwrap();
    refused(
        s.capture_graphs_with(StrategyKind::Full),
        Step::CaptureGraphs,
        "already ran",
    );
    let (spec, limits) = kv();
    let plan = s.plan(REQ, &spec, limits).unwrap();
    refused(
        s.capture_graphs(),
        Step::CaptureGraphs,
        "cannot run after plan",
    );
    assert_eq!(s.last_step(), Step::Plan);
    // Planning again (another request) is allowed; the last plan is the one held to.
    let smaller = s.plan(Request::Utilization(0.8), &spec, limits).unwrap();
    assert!(smaller.kv.num_blocks < plan.kv.num_blocks);
    // The first plan has more blocks than the last one: mapping it is refused.
    match s.into_kv_cache(&plan) {
        Err(Error::InvalidInput { field, message }) => {
            assert_eq!(field, "plan");
            assert!(message.contains("planned"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_engine_with_graphs_cannot_plan_without_a_graph_phase() {
    let dev = memplan::open("sim:rtx4090,other=2").unwrap();
    let (spec, limits) = kv();
    let mut e = Toy::new(&dev, vec![8, 4, 2, 1]);
    let mut s = Session::start(&dev, &mut e).unwrap();
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    refused(s.plan(REQ, &spec, limits), Step::Plan, "no graph phase ran");
    // On purpose, without a reserve: allowed, and the plan says it was overridden.
    s.capture_graphs_with(StrategyKind::None).unwrap();
    let plan = s.plan(REQ, &spec, limits).unwrap();
    assert_eq!(plan.graph_reserve(), 0);
    assert!(plan
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::StrategyOverridden { .. })));

    // An eager engine (no graph sizes) plans without a graph phase.
    let mut eager = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut eager).unwrap();
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    s.plan(REQ, &spec, limits).unwrap();
}

#[test]
fn the_kv_cache_follows_the_plan_never_more() {
    let dev = memplan::open("sim:rtx4090,other=3").unwrap();
    let (spec, limits) = kv();
    let mut e = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut e).unwrap();
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    let plan = s.plan(REQ, &spec, limits).unwrap();

    // 8 GiB more than planned, as a plan: refused.
    let mut inflated = plan.clone();
    inflated.kv_cache_bytes += 8 << 30;
    inflated.kv.num_blocks += (8 << 30) / plan.kv.block_bytes;
    let e = s.into_kv_cache(&inflated).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidInput { field, .. } if field == "plan"),
        "{e}"
    );

    // Before any plan: refused by name.
    let mut e2 = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut e2).unwrap();
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    refused(s.into_kv_cache(&plan), Step::IntoKvCache, "needs plan");

    // A plan with fewer blocks (another rank's, combined) gives this rank that many blocks.
    let mut e3 = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut e3).unwrap();
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    let own = s.plan(REQ, &spec, limits).unwrap();
    let mut fewer = own.clone();
    fewer.kv.num_blocks -= 10;
    let cache = s.into_kv_cache(&fewer).unwrap();
    assert_eq!(cache.num_blocks, own.kv.num_blocks - 10);
    assert_eq!(cache.bytes, cache.num_blocks * own.kv.block_bytes);
    assert!(
        cache.range.is_none(),
        "no post-capture: the engine allocates"
    );
}

#[test]
fn a_failed_load_stops_the_session() {
    let dev = memplan::open("sim:rtx4090,other=4").unwrap();
    let mut e = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut e).unwrap();
    let err = s
        .load_weights(|e| {
            e.load()?;
            // More than the device has.
            e.dev.allocate(1 << 50).map(drop)
        })
        .unwrap_err();
    // Out of memory, in the step, with what was held when it happened.
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(err.step(), Some("load_weights"), "{err}");
    assert_eq!(err.requested_bytes(), Some(1 << 50));
    let msg = err.to_string();
    assert!(
        msg.starts_with("load_weights: ")
            && msg.contains(" free of ")
            && msg.contains("held by the engine's allocator"),
        "{msg}"
    );
    refused(
        s.profile_run(Toy::forward),
        Step::ProfileRun,
        "load_weights failed earlier",
    );
}

#[test]
fn the_plan_reports_the_sessions_rank() {
    let dev = memplan::open("sim:rtx4090,other=5").unwrap();
    let (spec, limits) = kv();
    let mut e = Toy::new(&dev, vec![]);
    let rank = Rank::new(1, 2).unwrap().with_stage(1, 2).unwrap();
    let mut s = Session::start(&dev, &mut e).unwrap().with_rank(rank);
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    let plan = s.plan(REQ, &spec, limits).unwrap();
    assert_eq!(plan.rank, Some(rank));
    assert_eq!(
        (plan.tensor_parallel_size, plan.pipeline_parallel_size),
        (2, 2)
    );
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["rank"]["tensor_parallel_rank"], 1);
    assert_eq!(json["pipeline_parallel_size"], 2);
}

/// Rank `r` of 2 on `dev`, measured up to its plan (returned as JSON).
fn rank_session<'e>(
    dev: &SharedDevice,
    e: &'e mut Toy,
    r: u64,
    req: Request,
) -> (Session<'e, Toy>, String) {
    let (spec, limits) = kv();
    let mut s = Session::start(dev, e)
        .unwrap()
        .with_rank(Rank::new(r, 2).unwrap());
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    let json = s.plan(req, &spec, limits).unwrap().to_json();
    (s, json)
}

/// Two ranks in one process (the multi-process recipe is `examples/engine --ranks`): each
/// plans, the plans travel as JSON, and every rank maps the fewest blocks of the two.
#[test]
fn ranks_map_the_combined_plan() {
    // An 80 GB GPU beside a 24 GB one with 2 GiB held by someone else. (Two 24 GB GPUs 2 GiB
    // apart can plan the same cache: the toy engine's allocator holds exactly the powers of two
    // it allocates, so the granule its KV tensors are planned for may be as coarse as 256 MiB,
    // and both rooms round down to the same count.)
    let d0 = memplan::open("sim:a100-80gb,other=6").unwrap();
    let d1 = memplan::open("sim:rtx4090,other=2GiB").unwrap();
    let (mut e0, mut e1) = (Toy::new(&d0, vec![]), Toy::new(&d1, vec![]));
    let (s0, j0) = rank_session(&d0, &mut e0, 0, REQ);
    let (s1, j1) = rank_session(&d1, &mut e1, 1, REQ);
    let combined = memplan::combine_json(&[j0, j1]).unwrap();
    let ranks = combined.ranks.clone().unwrap();
    assert_eq!(ranks.limiting, Some(1), "the GPU with less room limits");
    assert_eq!(combined.tensor_parallel_size, 2);
    for s in [s0, s1] {
        let kv = s.into_kv_cache(&combined).unwrap();
        assert_eq!(kv.num_blocks, ranks.num_blocks);
    }
}

/// A rank maps only a plan that holds its own last plan.
#[test]
fn a_rank_cannot_map_a_plan_without_its_own() {
    let d0 = memplan::open("sim:rtx4090,other=7").unwrap();
    let d1 = memplan::open("sim:rtx4090,other=8").unwrap();
    let mut e1 = Toy::new(&d1, vec![]);
    let (_s1, j1) = rank_session(&d1, &mut e1, 1, REQ);
    let p1 = memplan::Plan::from_json(&j1).unwrap();
    let refused = |plan: &memplan::Plan, says: &str| {
        let mut e0 = Toy::new(&d0, vec![]);
        let (mut s0, _) = rank_session(&d0, &mut e0, 0, Request::Utilization(0.8));
        let (spec, limits) = kv();
        s0.plan(REQ, &spec, limits).unwrap(); // the last plan: 0.9
        let e = s0.into_kv_cache(plan).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidInput { field, message } if field == "plan" && message.contains(says)),
            "{e}"
        );
    };
    // Another rank's own plan.
    refused(
        &p1,
        "the plan is of rank 1 of 2, this session is rank 0 of 2",
    );
    // Rank 1 alone does not combine: rank 0 has no plan in it.
    let e = memplan::combine_ranks(vec![p1.clone()]).unwrap_err();
    assert!(e.to_string().contains("no plan of rank 0 of 2"), "{e}");
    // A combination holding an earlier plan of rank 0 (0.8), not its last (0.9).
    let mut e0 = Toy::new(&d0, vec![]);
    let (_s0, earlier) = rank_session(&d0, &mut e0, 0, Request::Utilization(0.8));
    let stale = memplan::combine_json(&[earlier, j1]).unwrap();
    refused(&stale, "combine this session's last plan");
    // A combination whose figures of rank 0 were taken out (built here: combining refuses it).
    let mut without = stale.clone();
    if let Some(r) = without.ranks.as_mut() {
        r.per_rank.retain(|r| r.rank.global() != 0);
    }
    refused(&without, "no plan of this rank");
}

/// A measured plan sizes with the newest release's rules by default (the dry run's default),
/// names them, and another release is one call away.
#[test]
fn the_plan_names_its_sizing_rules() {
    let (spec, limits) = kv();
    let dev = memplan::open("sim:rtx4090,other=9").unwrap();
    let mut e = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut e).unwrap();
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    let p = s.plan(REQ, &spec, limits).unwrap();
    assert_eq!(
        p.engine.as_deref(),
        Some(memplan::kv::SizingRules::NEWEST_RELEASE)
    );
    // ... but, with no release named, room for rounding a KV tensor per layer (releases
    // before vLLM 0.29.0 allocate so; one backing allocation would need less).
    assert_eq!(
        p.sizing_rules,
        memplan::kv::SizingRules::newest(1)
            .with_kv_allocation(memplan::kv::KvAllocation::PerTensor)
    );
    let mut e = Toy::new(&dev, vec![]);
    let mut s = Session::start(&dev, &mut e)
        .unwrap()
        .with_sizing_rules(memplan::kv::SizingRules::default(), "vllm@0.19");
    s.load_weights(Toy::load).unwrap();
    s.profile_run(Toy::forward).unwrap();
    let p = s.plan(REQ, &spec, limits).unwrap();
    assert_eq!(p.engine.as_deref(), Some("vllm@0.19"));
    assert_eq!(p.sizing_rules, memplan::kv::SizingRules::default());
    // People read consumer kinds by their labels.
    assert_eq!(
        memplan::ConsumerKind::Activation.to_string(),
        "activation peak"
    );
}

#[test]
fn a_malformed_request_given_at_the_start_is_refused_before_anything_is_allocated() {
    let dev = memplan::open("sim:rtx4090,other=0").unwrap();
    let mut e = Toy::new(&dev, vec![]);
    let frees = dev.raw_frees();
    for (r, says) in [
        (Request::Utilization(1.5), "outside (0, 1]"),
        (Request::Utilization(f64::NAN), "outside (0, 1]"),
        (Request::Bytes(0), "0"),
    ] {
        match Session::start_for(&dev, &mut e, r) {
            Err(err) => assert!(err.to_string().contains(says), "{r:?}: {err}"),
            Ok(_) => panic!("{r:?} was not refused"),
        }
    }
    assert_eq!(dev.raw_frees(), frees, "nothing was allocated and freed");
    // A request well formed starts as `start` does.
    let mut s = Session::start_for(&dev, &mut e, Request::Bytes(2048 * MIB)).unwrap();
    s.check_request(Request::Bytes(2048 * MIB)).unwrap();
}
