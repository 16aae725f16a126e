use super::*;
use crate::budget::Request;
use crate::session::Profile;
use crate::strategy::GraphEstimate;
use memplan_core::bytes::{GIB, MIB};
use memplan_core::kv::{AttentionKind, KvDtype, LayerGroup};
use memplan_core::{
    AllocatorMemory, DriverMemory, MemoryInfo, ProfilingCapability, Reading, Reliability,
};
use memplan_core::{Error, Param, Refusal, Result};
use proptest::prelude::*;

fn snap(total: u64, free: u64) -> MemoryInfo {
    MemoryInfo::default()
        .with_driver(DriverMemory::new(Some(total), Some(free)))
        .with_allocator(AllocatorMemory::new(Some(0), Some(0), Some(0)).with_peak_reserved(Some(0)))
}

#[allow(clippy::too_many_arguments)]
fn profile(
    total: u64,
    free0: u64,
    free_last: u64,
    w: u64,
    a: u64,
    g: i64,
    graph: Option<(i64, u64, bool)>,
) -> Profile {
    let mut p = Profile::new(ProfilingCapability::exact_discrete(), snap(total, free0));
    p.last = snap(total, free_last);
    p.weights_bytes = Some(w);
    p.weights_held_bytes = Some(w);
    p.activation_peak_bytes = Some(a);
    p.non_allocator_growth = Some(g);
    p.graph = graph.map(|(p, m, kept)| {
        let mut e = GraphEstimate::new(StrategyKind::Full, 35, p, m, "test");
        e.kept = kept;
        e
    });
    p
}

/// Plan a profile the way a session does.
fn plan(p: &Profile, why: &str, request: Request) -> Result<Plan> {
    PlanBuilder::from_profile(p, why, request, spec(), limits())?.build()
}

/// The KV layout the planner's tests plan (28 layers of 2 heads of 128, bf16, 16 a block).
pub(super) fn spec() -> KvSpec {
    KvSpec::new(
        vec![LayerGroup::new(AttentionKind::Full, 28, 2, 128)],
        KvDtype::Bf16,
        16,
    )
}

/// The limits the planner's tests plan with.
pub(super) fn limits() -> KvLimits {
    KvLimits::new(4096, 8192).with_max_len_limit(1 << 20)
}

#[test]
fn table_and_bar() {
    let p = profile(
        24 * GIB,
        23 * GIB,
        19 * GIB,
        3 * GIB,
        GIB,
        128 * MIB as i64,
        Some((200 * MIB as i64, 0, false)),
    );
    let plan = plan(&p, "test", Request::Utilization(0.9)).unwrap();
    let s = plan.to_string();
    for needle in [
        "total",
        "requested",
        "weights",
        "graph reserve",
        "KV cache budget",
        "KV cache tokens",
        "max concurrency",
        "[WWW",
    ] {
        assert!(s.contains(needle), "{needle} in\n{s}");
    }
    assert_eq!(plan.bar(60).chars().count(), 62);
    let j = serde_json::to_value(&plan).unwrap();
    assert_eq!(j["schema"], SCHEMA);
    assert_eq!(j["graph"]["strategy"], "full");
    assert!(j["kv_cache_tokens"].as_u64().unwrap() > 0);
    assert_eq!(j["kv_cache_tokens"], j["kv"]["tokens"]);
    assert_eq!(j["consumers"][0]["kind"], "weights");
    assert_eq!(j["consumers"][0]["provenance"]["kind"], "measured");
    assert_eq!(j["consumers"][3]["provenance"]["strategy"], "full");
}

#[test]
fn free_memory_caps_and_says_so() {
    // Someone holds 8 GiB: the budget would allow more than is free.
    let p = profile(24 * GIB, 23 * GIB, 8 * GIB, 3 * GIB, GIB, 0, None);
    let plan = plan(&p, "t", Request::Utilization(0.9)).unwrap();
    assert!(plan.capped_by_free_bytes.is_some() && plan.kv_cache_bytes < plan.kv_budget_bytes);
    assert!(plan.kv_cache_bytes <= 8 * GIB - GIB);
    assert!(plan
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::KvCappedByFreeMemory { .. })));
    let j = serde_json::to_value(&plan).unwrap();
    assert!(j["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w["code"] == "kv_capped_by_free_memory"
            && w["message"].as_str().unwrap().contains("caps the KV cache")));
}

/// Where the plan warns that the engine's later capture may exceed the graph reserve
/// (`graph_capture_varies`: the reserve keeps one capture's bound on the variation), a cap by
/// the memory physically there keeps the bound on the difference of two captures, `sqrt(2)`
/// times the warned margin, the rest on top: past the request the excess is an over-request
/// the warning names, past the free memory an out-of-memory. The request's budget keeps the
/// warned margin alone.
#[test]
fn a_physical_cap_keeps_the_whole_bound_of_a_capture_the_plan_warns_may_vary() {
    // 1 GiB of activation and 2 GiB of graphs still to capture, `free_last` free at the end.
    let with_graphs = |free_last| {
        profile(
            24 * GIB,
            23 * GIB,
            free_last,
            3 * GIB,
            GIB,
            0,
            Some((2 << 30, 0, false)),
        )
    };
    // Someone holds 15 GiB (8 GiB free at the end); the graphs' reserve keeps a warned margin
    // of 400 MiB.
    let mut p = with_graphs(8 * GIB);
    let quiet = plan(&p, "t", Request::Utilization(0.9)).unwrap();
    p.warnings.push(Warning::GraphCaptureVaries {
        spread_per_mille: 200,
        margin: 400 * MIB,
    });
    let warned = plan(&p, "t", Request::Utilization(0.9)).unwrap();
    let (q, w) = (
        quiet.capped_by_free_bytes.unwrap(),
        warned.capped_by_free_bytes.unwrap(),
    );
    let extra = (400.0 * MIB as f64 * (std::f64::consts::SQRT_2 - 1.0)).ceil() as u64;
    assert_eq!(q - w, extra);
    assert!(warned.kv_cache_bytes <= w);
    // Uncapped (nobody else holds memory), the request's budget is the same either way.
    let mut roomy = with_graphs(19 * GIB);
    let quiet = plan(&roomy, "t", Request::Utilization(0.9)).unwrap();
    roomy.warnings = p.warnings.clone();
    let warned = plan(&roomy, "t", Request::Utilization(0.9)).unwrap();
    assert_eq!(warned.capped_by_free_bytes, None);
    assert_eq!(warned.kv_cache_bytes, quiet.kv_cache_bytes);
}

#[test]
fn a_cap_fitted_tensor_by_tensor_keeps_no_slack_on_top() {
    // Someone holds 15 GiB; the exact free reading leaves 8 GiB, of which the activation peak
    // takes 1 GiB. The KV cache's tensors are fitted as the allocator rounds each, so the cap
    // is what is there (7 GiB) and the cache comes within one block of every tensor of it.
    let p = profile(24 * GIB, 23 * GIB, 8 * GIB, 3 * GIB, GIB, 0, None);
    let plan = plan(&p, "t", Request::Utilization(0.9)).unwrap();
    assert_eq!(plan.capped_by_free_bytes, Some(7 * GIB));
    assert!(plan.kv_cache_bytes <= 7 * GIB);
    assert!(
        plan.kv_cache_bytes + plan.kv.block_bytes > 7 * GIB,
        "{} of {}",
        plan.kv_cache_bytes,
        7 * GIB
    );
}

/// Free memory at the start below the request: vLLM refuses to start (`request_memory`, from
/// `Worker.init_device`) and so does the plan; SGLang takes its `mem_fraction_static` of the
/// memory free at its start (`profile_max_num_token`: `rest = available - total_gpu_memory x
/// (1 - mem_fraction_static)`, `total_gpu_memory` read before the weights) and refuses no
/// request for it, so the plan is made within 0.9 of the 20 GiB free: never above the request, never
/// above the free memory.
#[test]
fn an_engine_whose_fraction_is_of_the_free_memory_is_planned_within_its_share() {
    use memplan_core::kv::StartCheck;
    // 24 GiB, 4 GiB held by others at the start: 0.9 asks for 21.6 GiB, 20 GiB are free.
    let p = profile(24 * GIB, 20 * GIB, 16 * GIB, 3 * GIB, GIB, 0, None);
    let build = |check: StartCheck| {
        PlanBuilder::from_profile(&p, "t", Request::Utilization(0.9), spec(), limits())?
            .sizing_rules(SizingRules::default().with_start_check(check))
            .build()
    };
    let e = build(StartCheck::RefuseAboveFree).unwrap_err();
    assert!(
        matches!(e.refusal(), Some(Refusal::FreeBelowRequested { .. })),
        "{e}"
    );
    let plan = build(StartCheck::ShareOfFree).unwrap();
    // floor(ceil(0.9 x 24 GiB) x 20 / 24) = 0.9 x 20 GiB.
    assert_eq!(plan.requested_bytes, 18 * GIB);
    assert_eq!(
        plan.kv_budget_bytes,
        18 * GIB - plan.consumers.total().unwrap()
    );
    assert!(plan.kv_cache_bytes <= plan.kv_budget_bytes && plan.kv_cache_bytes > 0);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("share of that free memory")),
        "{:?}",
        plan.notes
    );
    // Where the free memory holds the request, the request stands for both.
    let p = profile(24 * GIB, 23 * GIB, 19 * GIB, 3 * GIB, GIB, 0, None);
    for check in [StartCheck::RefuseAboveFree, StartCheck::ShareOfFree] {
        let plan = PlanBuilder::from_profile(&p, "t", Request::Utilization(0.9), spec(), limits())
            .unwrap()
            .sizing_rules(SizingRules::default().with_start_check(check))
            .build()
            .unwrap();
        assert_eq!(
            plan.requested_bytes,
            (0.9 * (24 * GIB) as f64).ceil() as u64
        );
    }
}

/// SGLang's pool as its source sizes it (0.5.9 `model_executor/model_runner_kv_cache_mixin.py`
/// `profile_max_num_token`; 0.5.22 `mem_cache/kv_cache_configurator.py`
/// `_profile_available_bytes`): the free memory it reads once its weights are loaded less the
/// free memory it read at its start times `1 - mem_fraction_static`. The plan keeps the
/// request's room (the older rule took the request's share of the free memory for the whole
/// process, weights, activations and graphs too, and left room the engine would have used),
/// held to the memory free now as for every engine, and suggests the static fraction whose
/// pool by the engine's own rule holds the plan's KV cache: the request's share where that
/// does, more where the engine's slack of the free memory at its start is more than the
/// activations and graphs the plan measured (`--max-total-tokens` only lowers its pool).
#[test]
fn an_engine_that_sizes_its_pool_after_its_weights_is_given_the_fraction_that_reaches_the_plan() {
    use crate::session::StepRecord;
    use memplan_core::kv::StartCheck;
    // 24 GiB, 4 GiB held by others at the start: 0.9 asks for 21.6 GiB, 20 GiB are free; the
    // weights take 3 GiB (17 GiB free after them), the activation peak 4 GiB.
    let mut p = profile(24 * GIB, 20 * GIB, 13 * GIB, 3 * GIB, 4 * GIB, 0, None);
    p.steps.push(StepRecord {
        name: "load_weights".into(),
        before: snap(24 * GIB, 20 * GIB),
        after: snap(24 * GIB, 17 * GIB),
        window: Default::default(),
    });
    let build = |p: &Profile, check: StartCheck| {
        PlanBuilder::from_profile(p, "t", Request::Utilization(0.9), spec(), limits())
            .unwrap()
            .sizing_rules(SizingRules::default().with_start_check(check))
            .build()
            .unwrap()
    };
    // The engine's own pool for a static fraction of `k` thousandths, as its source computes
    // it (written here apart from `StartCheck`).
    let engine_pool =
        |k: u64, start: u64, after: u64| after.saturating_sub((start * (1000 - k)).div_ceil(1000));
    let thousandths = |f: f64| (f * 1000.0).round() as u64;
    let older = build(&p, StartCheck::ShareOfFree);
    let plan = build(&p, StartCheck::PoolOfFreeAfterWeights);
    let requested = (0.9 * (24 * GIB) as f64).ceil() as u64;
    let used = plan.consumers.total().unwrap();
    assert_eq!(plan.requested_bytes, requested);
    assert_eq!(plan.kv_budget_bytes, requested - used);
    assert!(plan.kv_budget_bytes > older.kv_budget_bytes);
    // The request's share (0.9: a pool of 17 GiB less 2 GiB) holds the plan's cache.
    let f = plan.suggestions.engine_static_fraction.unwrap();
    assert_eq!(thousandths(f), 900);
    assert!(engine_pool(900, 20 * GIB, 17 * GIB) >= plan.kv_cache_bytes);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("less the free memory it read at its start")),
        "{:?}",
        plan.notes
    );
    // Weights that leave the engine less after them (10 GiB taken, 10 GiB free, 9 GiB free
    // at the end with an activation peak of 1 GiB): the request's share would give the engine
    // a pool of 10 GiB less 2 GiB, below the 8 GiB the memory free now leaves the cache less
    // what rounding keeps; the plan keeps its room and suggests more.
    let mut heavy = profile(24 * GIB, 20 * GIB, 9 * GIB, 10 * GIB, GIB, 0, None);
    heavy.steps.push(StepRecord {
        name: "load_weights".into(),
        before: snap(24 * GIB, 20 * GIB),
        after: snap(24 * GIB, 10 * GIB),
        window: Default::default(),
    });
    // Others took 1 GiB more before the profile run: 8 GiB free at the end, 7 GiB for the
    // cache, and a share of 0.9 leaves the engine 8 GiB, enough.
    heavy.last = snap(24 * GIB, 8 * GIB);
    let plan = build(&heavy, StartCheck::PoolOfFreeAfterWeights);
    let f = thousandths(plan.suggestions.engine_static_fraction.unwrap());
    assert_eq!(f, 900, "{:?}", plan.notes);
    // Others held 8 GiB at the start instead (16 GiB free, 6 GiB after the weights and at the
    // end): a share of 0.9 leaves the engine 6 GiB less 1.6 GiB, below the 5 GiB the memory
    // free now leaves the cache beside the activation peak; the fraction that reaches it is
    // above the request's share (0.938).
    let mut crowded = profile(24 * GIB, 16 * GIB, 6 * GIB, 10 * GIB, GIB, 0, None);
    crowded.steps.push(StepRecord {
        name: "load_weights".into(),
        before: snap(24 * GIB, 16 * GIB),
        after: snap(24 * GIB, 6 * GIB),
        window: Default::default(),
    });
    let plan = build(&crowded, StartCheck::PoolOfFreeAfterWeights);
    let limit = StartCheck::PoolOfFreeAfterWeights
        .pool_limit(requested, 24 * GIB, 16 * GIB, 6 * GIB)
        .unwrap();
    assert!(plan.kv_cache_bytes > limit, "{:?}", plan.notes);
    let f = thousandths(plan.suggestions.engine_static_fraction.unwrap());
    assert!(f > 900);
    assert!(engine_pool(f, 16 * GIB, 6 * GIB) >= plan.kv_cache_bytes);
    assert!(engine_pool(f - 1, 16 * GIB, 6 * GIB) < plan.kv_cache_bytes);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("the request's share of the device would give it")),
        "{:?}",
        plan.notes
    );
    // A free reading that does not follow this process's allocations (stale: calibration
    // found it off even after a synchronize): the engine's own readings are just as wrong, a
    // lagging one reading the weights' memory as still free, so its pool does not bound the
    // plan; the request does.
    let mut stale = heavy.clone();
    stale.capability.set(
        memplan_core::Reading::DriverFree,
        memplan_core::Reliability::Unavailable {
            reason: "free memory does not follow allocations even after a synchronize".into(),
        },
    );
    let plan = PlanBuilder::from_profile(&stale, "t", Request::Utilization(0.9), spec(), limits())
        .unwrap()
        .sizing_rules(SizingRules::default().with_start_check(StartCheck::PoolOfFreeAfterWeights))
        .build()
        .unwrap();
    assert_eq!(plan.requested_bytes, requested);
    assert!(
        !plan
            .notes
            .iter()
            .any(|n| n.contains("less the free memory it read at its start")),
        "{:?}",
        plan.notes
    );
    assert_eq!(plan.suggestions.engine_static_fraction, None);
    // Where the free memory at the start holds the request, the request stands.
    let mut roomy = profile(24 * GIB, 23 * GIB, 19 * GIB, 3 * GIB, GIB, 0, None);
    roomy.steps.push(StepRecord {
        name: "load_weights".into(),
        before: snap(24 * GIB, 23 * GIB),
        after: snap(24 * GIB, 20 * GIB),
        window: Default::default(),
    });
    let plan = build(&roomy, StartCheck::PoolOfFreeAfterWeights);
    assert_eq!(
        plan.kv_budget_bytes,
        requested - plan.consumers.total().unwrap()
    );
    // Other processes that took 3 GiB before the weights and left after them: the engine
    // read 17 GiB free once its weights were loaded, and no fraction gives its pool more.
    roomy.steps = p.steps.clone();
    let plan = build(&roomy, StartCheck::PoolOfFreeAfterWeights);
    assert_eq!(plan.kv_budget_bytes, 17 * GIB);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("whatever its static fraction")),
        "{:?}",
        plan.notes
    );
}

/// Where the free memory now bounds the KV cache of an engine that sizes its pool from its own
/// readings and the plan warns that a later capture may vary, the request's share of the free
/// memory at the start is kept as a margin below the physical cap. That share is no rule of
/// the engine's (SGLang refuses no request for the free memory): where it leaves the engine no
/// pool to start with, the physical cap stands, and the plan is not refused. An L4 beside
/// 3 GiB of others, graphs varying by 40%: the share refused by 718 MiB where the engine alone
/// held 29,120 tokens.
#[test]
fn the_share_of_the_free_memory_never_refuses_a_plan_the_free_memory_holds() {
    use crate::session::StepRecord;
    use memplan_core::kv::StartCheck;
    // 24 GiB, 3.5 GiB held by others: 0.86 asks for 20.64 GiB, 20.5 GiB are free; the weights
    // take 10 GiB, 2 GiB more stays held outside the allocator, the activation peak is
    // 1.5 GiB, and the graphs still to capture `graphs` with a warned margin of 420 MiB.
    let at = |graphs: u64| {
        let mut p = profile(
            24 * GIB,
            20 * GIB + GIB / 2,
            8 * GIB + GIB / 2,
            10 * GIB,
            GIB + GIB / 2,
            2 << 30,
            Some((graphs as i64, 420 * MIB, false)),
        );
        p.steps.push(StepRecord {
            name: "load_weights".into(),
            before: snap(24 * GIB, 20 * GIB + GIB / 2),
            after: snap(24 * GIB, 10 * GIB + GIB / 2),
            window: Default::default(),
        });
        p.warnings.push(Warning::GraphCaptureVaries {
            spread_per_mille: 403,
            margin: 420 * MIB,
        });
        PlanBuilder::from_profile(&p, "t", Request::Utilization(0.86), spec(), limits())
            .unwrap()
            .sizing_rules(
                SizingRules::default().with_start_check(StartCheck::PoolOfFreeAfterWeights),
            )
            .build()
    };
    let share = |plan: &Plan| {
        plan.notes
            .iter()
            .any(|n| n.contains("for the whole process"))
    };
    // Graphs of 3 GiB (3.42 GiB kept): the share (17.63 GiB) leaves the cache about 700 MiB
    // below the physical cap, and a pool the engine starts with: it stands.
    let plan = at(3 * GIB).unwrap();
    assert!(plan.capped_by_free_bytes.is_some());
    assert!(share(&plan), "{:?}", plan.notes);
    assert!(plan.kv_cache_bytes < plan.capped_by_free_bytes.unwrap());
    // Graphs of 3.66 GiB: the share leaves the cache 57 MiB, less than one request of 4,096
    // tokens (112 MiB): the physical cap stands.
    let plan = at(3 * GIB + 680 * MIB).unwrap();
    assert!(!share(&plan), "{:?}", plan.notes);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("too little for the engine to start with")),
        "{:?}",
        plan.notes
    );
    assert!(plan.kv.max_concurrency >= 1.0);
    assert!(plan.kv_cache_bytes <= plan.capped_by_free_bytes.unwrap());
    // Graphs of 4.5 GiB: the consumers alone take more than the share (it would refuse): the
    // physical cap stands, over 1 GiB for the cache.
    let plan = at(4 * GIB + GIB / 2).unwrap();
    assert!(!share(&plan), "{:?}", plan.notes);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("would leave it no room")),
        "{:?}",
        plan.notes
    );
    assert!(plan.kv_cache_bytes > GIB);
    assert!(plan
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::GraphCaptureVaries { .. })));
}

/// Before the profile run, the plan's refusal is foreseen where what the engine holds already
/// leaves no room in the request (weights held above it: large rounding of many tensors), so
/// the engine is not run into memory another process may have taken since; where the budget
/// has room, nothing is foreseen, however little room (the activation peak is not known yet).
#[test]
fn a_refusal_is_foreseen_before_the_profile_run_only_where_it_is_certain() {
    use memplan_core::kv::StartCheck;
    let before_profile = |w: u64, g: i64| {
        let mut p = profile(24 * GIB, 23 * GIB, 23 * GIB - w, w, 0, g, None);
        p.activation_peak_bytes = None;
        p
    };
    let rules = SizingRules::default().with_start_check(StartCheck::RefuseAboveFree);
    let request = Request::Utilization(0.9);
    let requested = (0.9 * (24 * GIB) as f64).ceil() as u64;
    // The weights alone hold 64 MiB more than the request.
    let p = before_profile(requested + 64 * MIB, 0);
    let e = PlanBuilder::refusal_before_profile(&p, request, rules).expect("foreseen");
    assert!(
        matches!(e.refusal(), Some(Refusal::NoRoomForKv { .. })),
        "{e}"
    );
    // The plan after the profile run refuses the same, whatever the run measured.
    for act in [0, MIB, GIB] {
        let mut after = p.clone();
        after.activation_peak_bytes = Some(act);
        let e = plan(&after, "t", request).unwrap_err();
        assert!(
            matches!(e.refusal(), Some(Refusal::NoRoomForKv { .. })),
            "{e}"
        );
    }
    // The memory outside the allocator counts as the plan counts it: weights 64 MiB under the
    // request, 65 MiB outside the allocator.
    let p = before_profile(requested - 64 * MIB, 65 * MIB as i64);
    assert!(PlanBuilder::refusal_before_profile(&p, request, rules).is_some());
    // 1 MiB of room: the profile run decides, nothing is foreseen.
    let p = before_profile(requested - MIB, 0);
    assert!(PlanBuilder::refusal_before_profile(&p, request, rules).is_none());
}

#[test]
fn early_check_and_missing_total() {
    let p = profile(24 * GIB, GIB, GIB, 3 * GIB, GIB, 0, None);
    let e = plan(&p, "t", Request::Utilization(0.9)).unwrap_err();
    assert!(
        matches!(e.refusal(), Some(Refusal::FreeBelowRequested { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("less than requested"), "{e}");
    let mut p = profile(24 * GIB, 23 * GIB, 20 * GIB, 3 * GIB, GIB, 0, None);
    p.baseline.driver.total = None;
    p.capability.set(
        Reading::DriverTotal,
        Reliability::Unavailable {
            reason: "aperture".into(),
        },
    );
    let e = plan(&p, "t", Request::Utilization(0.9)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidParam {
                param: Param::Utilization,
                ..
            }
        ) && e.to_string().contains("aperture"),
        "{e}"
    );
    assert!(plan(&p, "t", Request::Bytes(16 * GIB)).is_ok());
    // A fixed KV size needs the total too; the error names that parameter, not another.
    let e = plan(&p, "t", Request::KvCacheBytes(GIB)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidParam {
                param: Param::KvCacheBytes,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn ranks_combine_to_the_smallest() {
    let mk = |free_last| {
        let p = profile(24 * GIB, 23 * GIB, free_last, 3 * GIB, GIB, 0, None);
        plan(&p, "t", Request::Utilization(0.9)).unwrap()
    };
    let plans = vec![mk(20 * GIB), mk(9 * GIB), mk(19 * GIB)];
    let blocks: Vec<u64> = plans.iter().map(|q| q.kv.num_blocks).collect();
    let p = combine_ranks(plans).unwrap();
    assert_eq!(
        p.ranks.as_ref().map(|r| (r.count, r.limiting)),
        Some((3, Some(1)))
    );
    assert!(blocks.iter().all(|b| *b >= p.kv.num_blocks));
    assert!(matches!(
        p.warnings.last(),
        Some(Warning::LimitingRank { rank: 1, .. })
    ));
    assert!(combine_ranks(Vec::new()).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A refusal foreseen before the profile run is one the plan makes after it, whatever the
    /// run measured and whatever graph reserve the graph phase kept.
    #[test]
    fn a_refusal_foreseen_before_the_profile_run_is_the_plans(
        total in 1u64..(200 * GIB),
        util in 0.05f64..1.0,
        w in 0.0f64..1.0, a in 0.0f64..0.5, g in -0.1f64..0.1,
        point in 0.0f64..0.2, margin in 0.0f64..0.05, kept in any::<bool>(),
    ) {
        let x = |f: f64| ((total as f64 * f) as u64).min(total);
        let mut before = profile(total, total, total - x(w), x(w), 0, (total as f64 * g) as i64, None);
        before.activation_peak_bytes = None;
        let request = Request::Utilization(util);
        if let Some(e) = PlanBuilder::refusal_before_profile(&before, request, SizingRules::default()) {
            prop_assert!(e.refusal().is_some());
            let mut after = before.clone();
            after.activation_peak_bytes = Some(x(a));
            after.graph = Some({
                let mut e = GraphEstimate::new(StrategyKind::Full, 35, (total as f64 * point) as i64, x(margin), "test");
                e.kept = kept;
                e
            });
            let refused = plan(&after, "prop", request);
            prop_assert!(refused.as_ref().is_err_and(|e| e.refusal().is_some()), "{:?}", refused.map(|p| p.kv_cache_bytes));
        }
    }

    /// Any inputs: a clear error, or a plan that never exceeds the requested memory and never
    /// goes negative.
    #[test]
    fn plan_never_exceeds_requested(
        total in prop_oneof![1u64..(200 * GIB), 1u64..=u64::MAX, Just(u64::MAX)],
        util in 0.0f64..1.2,
        f0 in 0.0f64..1.0, fl in 0.0f64..1.0,
        w in 0.0f64..1.0, a in 0.0f64..0.5, g in -0.1f64..0.1,
        point in -0.05f64..0.2, margin in 0.0f64..0.05, kept in any::<bool>(),
    ) {
        let x = |f: f64| ((total as f64 * f) as u64).min(total);
        let p = profile(total, x(f0), x(fl), x(w), x(a), (total as f64 * g) as i64, Some(((total as f64 * point) as i64, x(margin), kept)));
        match plan(&p, "prop", Request::Utilization(util)) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            Ok(plan) => {
                let used = plan.consumers.total().unwrap();
                prop_assert!(plan.kv_cache_bytes <= plan.kv_budget_bytes);
                prop_assert!(used + plan.kv_cache_bytes <= plan.requested_bytes);
                prop_assert!(plan.requested_bytes <= total);
                prop_assert!(plan.kv.used_bytes <= plan.kv_cache_bytes);
                prop_assert!(plan.bar(60).chars().count() == 62);
                // The JSON reads back as the same plan.
                let back = Plan::from_json(&plan.to_json()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(back, plan);
            }
        }
    }
}

#[test]
fn the_text_shows_the_cap_beside_the_budget_and_sizes_beside_bytes() {
    let line = |s: &str, start: &str| -> String {
        s.lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} in\n{s}"))
            .to_string()
    };
    // Capped: the budget row names the cap, once.
    let capped = plan(
        &profile(24 * GIB, 23 * GIB, 8 * GIB, 3 * GIB, GIB, 0, None),
        "t",
        Request::Utilization(0.9),
    )
    .unwrap();
    let cap = capped.capped_by_free_bytes.expect("capped");
    let s = capped.to_string();
    let budget = line(&s, "= KV cache budget");
    assert!(
        budget.contains(&format!("at {}", memplan_core::bytes::fmt_bytes(cap))),
        "{budget}"
    );
    let figure = memplan_core::bytes::fmt_bytes(capped.kv_budget_bytes);
    assert_eq!(budget.matches(&figure).count(), 1, "{budget}");
    // Not capped: what the KV cache gets, not the budget again.
    let free = plan(
        &profile(24 * GIB, 23 * GIB, 19 * GIB, 3 * GIB, GIB, 0, None),
        "t",
        Request::Utilization(0.9),
    )
    .unwrap();
    let budget = line(&free.to_string(), "= KV cache budget");
    let figure = memplan_core::bytes::fmt_bytes(free.kv_budget_bytes);
    assert_eq!(budget.matches(&figure).count(), 1, "{budget}");
    assert!(budget.contains("allocator rounding"), "{budget}");
    // Suggestions: the flag's bytes and the size a person reads.
    let fill = line(&free.to_string(), "KV cache size");
    assert!(
        fill.contains(&format!(
            "{} ({})",
            free.suggestions.kv_bytes_fill_requested,
            memplan_core::bytes::fmt_bytes(free.suggestions.kv_bytes_fill_requested)
        )),
        "{fill}"
    );
}

#[test]
fn an_unmeasured_kv_allocation_keeps_the_granule_the_engines_own_allocations_allow() {
    // The engine's allocator rounded its weights and its activation to multiples of 26.5 MiB
    // (53 x 512 KiB): a granule coarser than PyTorch's 2 MiB.
    let g = 53 * 512 * 1024;
    let readings = [(800 * g - 500 * MIB, 800 * g), (GIB + 3 * MIB, 39 * g)];
    assert_eq!(granule_bound(&readings), Some(g));
    let p = profile(48 * GIB, 47 * GIB, 46 * GIB, 20 * GIB, GIB, 0, None);
    let default = plan(&p, "test", Request::Utilization(0.9)).unwrap();
    let mut b =
        PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits()).unwrap();
    assert_eq!(b.unmeasured_kv_allocation(granule_bound(&readings)), g);
    let bounded = b.build().unwrap();
    // 28 per-layer tensors of n blocks of 16 x 2 heads x 128 x 2 (K, V) x 2 bytes each: each
    // rounded up to the granule, the cache still fits in the budget; with PyTorch's 2 MiB
    // kept, it does not.
    let page = 16 * 2 * 128 * 2 * 2;
    let takes = |plan: &Plan| 28 * (plan.kv.num_blocks * page).div_ceil(g) * g;
    assert!(
        takes(&bounded) <= bounded.kv_budget_bytes,
        "{}",
        takes(&bounded)
    );
    assert!(
        takes(&default) > default.kv_budget_bytes,
        "{}",
        takes(&default)
    );
    assert!(bounded.kv.num_blocks < default.kv.num_blocks);
}

#[test]
fn the_weights_reading_never_narrows_the_granule_bound_as_one_request_would() {
    // Qwen2.5-0.5B's 290 tensors in 49 segments of 20 MiB (13.5 MiB wasted) beside an
    // activation peak and warm-ups reserved in multiples of a 19.5 MiB granule (39 x 512 KiB).
    let g = 39 * 512 * 1024;
    let readings = [
        (966 * MIB + MIB / 2, 980 * MIB),
        (512 * MIB, 27 * g),
        (73_014_784, 4 * g),
        (48_486_400, 3 * g),
        (2 * g, 2 * g),
    ];
    // Taken for one request, the weights wasted less than a granule: the bound stays at
    // their common divisor with the others.
    assert_eq!(granule_bound(&readings), Some(MIB / 2));
    // Known as the weights, they are left out where that keeps a coarser divisor.
    assert_eq!(granule_bound_beside(&readings, Some(0)), Some(g));
    // Never finer than without the tag.
    assert_eq!(granule_bound_beside(&readings, Some(1)), Some(MIB / 2));
    // Beside one activation peak of one request (513 MiB) the weights share 1 MiB with it: no
    // multiple of PyTorch's 2 MiB, so an allocator that rounds otherwise, whose mid-sized
    // segments need not be multiples of its granule: the peak alone bounds it. The session's
    // warm-ups do not stop there: without them the weights' reading still stands in the way.
    let two = [(966 * MIB + MIB / 2, 980 * MIB), (513 * MIB, 513 * MIB)];
    assert_eq!(granule_bound_beside(&two, Some(0)), Some(513 * MIB));
    assert_eq!(weights_left_out(&two, Some(0)), None);
    // Beside a peak that shares a multiple of 2 MiB with them (PyTorch's own segments all are)
    // and wasted some of its segment, less than 2 MiB: one request wastes that little under any
    // granule it falls close below a multiple of, so nothing shows the weights' segments to be
    // multiples of the granule, and nothing bounds it.
    let pytorch = [(966 * MIB + MIB / 2, 980 * MIB), (513 * MIB, 514 * MIB)];
    assert_eq!(granule_bound_beside(&pytorch, Some(0)), None);
    // A peak read as its whole segment allocated shows no granule: nothing shows the weights'
    // segments to be multiples of it, and nothing bounds it.
    let whole = [(966 * MIB + MIB / 2, 980 * MIB), (514 * MIB, 514 * MIB)];
    assert_eq!(granule_bound_beside(&whole, Some(0)), None);
    // The same weights (whole 20 MiB segments) beside a peak of 70 MiB that reserved 78: a
    // granule above the 8 MiB it wasted, which their common divisor (2 MiB) is not: together
    // they bound nothing (the plan would keep PyTorch's 20 MiB segment). The peak alone bounds
    // it, at 78 MiB, which every candidate (13, 26, 39 MiB) divides.
    let wasted = [(966 * MIB + MIB / 2, 980 * MIB), (70 * MIB, 78 * MIB)];
    assert_eq!(granule_bound(&wasted), None);
    assert_eq!(granule_bound_beside(&wasted, Some(0)), Some(78 * MIB));
    // A divisor above what the peak wasted bounds nothing beside weights of whole mid-sized
    // segments, whatever the peak wasted: under 2 MiB (a 6 MiB granule rounds 70.5 MiB to 72
    // too, and does not divide 4 MiB), or 2 MiB, an allocator that rounds otherwise, whose
    // mid-sized segments need not be multiples of its granule.
    let agree = [
        (966 * MIB + MIB / 2, 980 * MIB),
        (70 * MIB + MIB / 2, 72 * MIB),
    ];
    assert_eq!(granule_bound_beside(&agree, Some(0)), None);
    let two_mib = [(966 * MIB + MIB / 2, 980 * MIB), (70 * MIB, 72 * MIB)];
    assert_eq!(granule_bound_beside(&two_mib, Some(0)), None);
    // Weights that are not whole 20 MiB segments keep their common divisor.
    let large = [(1990 * MIB, 2000 * MIB + 26 * MIB), (70 * MIB, 78 * MIB)];
    assert_eq!(granule_bound_beside(&large, Some(0)), granule_bound(&large));
    assert_eq!(weights_left_out(&readings, Some(0)), Some(g));
}

#[test]
fn weights_in_declared_mid_segments_beside_an_unsplit_peak_bound_nothing() {
    // 19 segments of 64 MiB (`large_segment_size_mb:64`) beside an activation peak past the
    // split limit, read as its whole 640.5 MiB segment allocated (a 30.5 MiB granule): they
    // share 512 KiB, no multiple of PyTorch's 2 MiB.
    let readings = [
        (1_220_358_144, 19 * 64 * MIB),
        (1281 * MIB / 2, 1281 * MIB / 2),
    ];
    assert_eq!(granule_bound_beside(&readings, Some(0)), Some(MIB / 2));
    assert_eq!(
        granule_bound_segments(&readings, Some(0), 64 * MIB),
        Some(1281 * MIB / 2)
    );
    // Weights that are whole segments of neither size keep their common divisor.
    let other = [
        (1_220_358_144, 19 * 64 * MIB + MIB),
        (1281 * MIB / 2, 1281 * MIB / 2),
    ];
    assert_eq!(
        granule_bound_segments(&other, Some(0), 64 * MIB),
        granule_bound(&other)
    );
}

#[test]
fn weights_in_mid_segments_beside_a_peak_that_shows_no_granule_bound_nothing() {
    // Qwen2.5-0.5B's weights in 49 segments of 20 MiB beside an activation peak of 563.2 MiB
    // rounded to 564 MiB, its remainder under 1 MiB not split off (no waste seen): they share
    // 4 MiB, which a 6 MiB granule does not divide. Nothing bounds the granule, and the plan
    // keeps the mid-sized segment per KV tensor.
    let hidden = [(1_016_928_768, 980 * MIB), (564 * MIB, 564 * MIB)];
    assert_eq!(granule_bound(&hidden), Some(4 * MIB));
    assert_eq!(granule_bound_beside(&hidden, Some(0)), None);
    let p = profile(16 * GIB, 15 * GIB, 14 * GIB, GIB, GIB, 0, None);
    let mut b =
        PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits()).unwrap();
    assert_eq!(
        b.unmeasured_kv_allocation(granule_bound_beside(&hidden, Some(0))),
        20 * MIB
    );
    // The same past a 512 MiB split limit beside 42 segments of 64 MiB (declared): 12 MiB in
    // common where the granule was 30.5 MiB.
    let unsplit = [(2_469_691_392, 42 * 64 * MIB), (732 * MIB, 732 * MIB)];
    assert_eq!(granule_bound_segments(&unsplit, Some(0), 64 * MIB), None);
    // A peak that wasted 2.4 MiB, more than PyTorch's 2 MiB rounding can, beside 97 segments of
    // 20 MiB: an allocator that rounds otherwise; their 4 MiB bounds nothing either.
    let wasted = [(2_034_237_440, 97 * 20 * MIB), (966_367_232, 924 * MIB)];
    assert_eq!(granule_bound(&wasted), Some(4 * MIB));
    assert_eq!(granule_bound_beside(&wasted, Some(0)), None);
    // Under 2 MiB wasted, as PyTorch's rounding wastes: a 6 MiB granule rounds 923 MiB to 924
    // too (154 of them) and does not divide 4 MiB. Their 4 MiB bounds nothing either.
    let pytorch = [(2_034_237_440, 97 * 20 * MIB), (923 * MIB, 924 * MIB)];
    assert_eq!(granule_bound_beside(&pytorch, Some(0)), None);
    // A common divisor of a mid-sized segment or more bounds the granule: a granule that coarse
    // makes the mid-sized segments of it and divides the divisor, a finer one is finer than it.
    // Neither shows the granule divides it: a bound of the rounding, not of its steps.
    let coarse = [(950 * MIB, 40 * 24 * MIB), (600 * MIB, 600 * MIB)];
    assert_eq!(granule_bound_beside(&coarse, Some(0)), Some(120 * MIB));
    assert_eq!(
        granule_bound_of_segments(&coarse, Some(0), 20 * MIB),
        Some(GranuleBound::AtMost(120 * MIB))
    );
}

#[test]
fn weights_in_mid_segments_sharing_a_coarse_divisor_bound_the_rounding_not_its_steps() {
    // 600 weight tensors of 8.5 MiB in 300 segments of 20 MiB beside an activation peak of
    // 921.6 MiB that reserved 936 MiB: 48 granules of 19.5 MiB. Their common divisor, 24 MiB,
    // is no multiple of that granule.
    let granule = 39 * MIB / 2;
    let readings = [(5100 * MIB, 6000 * MIB), (966_367_232, 936 * MIB)];
    assert_eq!(936 * MIB % granule, 0);
    assert_ne!(24 * MIB % granule, 0);
    assert_eq!(granule_bound(&readings), Some(24 * MIB));
    // Kept as a multiple, a KV tensor of 81 x 24 MiB would take 1944 MiB in the plan and 1950
    // MiB from the allocator. The granule is at most 24 MiB: each tensor keeps room for a
    // rounding up by less than that.
    assert_eq!(
        granule_bound_of_segments(&readings, Some(0), 20 * MIB),
        Some(GranuleBound::AtMost(24 * MIB))
    );
    let tensor = 81 * 24 * MIB;
    assert!(tensor.div_ceil(granule) * granule - tensor < 24 * MIB);
    let p = profile(16 * GIB, 15 * GIB, 14 * GIB, GIB, GIB, 0, None);
    let b =
        PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits()).unwrap();
    let (mut multiple, mut at_most) = (b.clone(), b);
    assert_eq!(multiple.unmeasured_kv_allocation(Some(24 * MIB)), 24 * MIB);
    assert_eq!(at_most.unmeasured_kv_allocation_at_most(24 * MIB), 24 * MIB);
    // The bound kept per tensor, not a multiple of it: never more blocks.
    let blocks = |b: PlanBuilder| b.build().unwrap().kv.num_blocks;
    assert!(blocks(at_most) <= blocks(multiple));
}

#[test]
fn a_granule_bound_needs_two_readings_that_agree_on_one_granule() {
    let g = 8 * MIB;
    // One reading: no bound.
    assert_eq!(granule_bound(&[(100 * MIB, 104 * MIB)]), None);
    // Two readings of 8 MiB segments.
    assert_eq!(
        granule_bound(&[(950 * MIB, 960 * MIB), (230 * MIB, 232 * MIB)]),
        Some(g)
    );
    // Weights in 20 MiB segments beside an activation in 8 MiB ones: their common divisor,
    // 4 MiB, is no more than what the activation wasted, so it cannot be its granule.
    assert_eq!(
        granule_bound(&[(3000 * MIB, 3980 * MIB), (1131 * MIB, 1136 * MIB)]),
        None
    );
    // Weights in small and mid-sized segments (2 and 20 MiB) beside warm-ups each rounded to
    // 12 MiB: with the weights, the common divisor is 4 MiB, below the granule; leaving each
    // reading out in turn keeps the 12 MiB the warm-ups agree on.
    let warm_ups = [
        (884_470_784, 852 * MIB),
        (773_898_240, 744 * MIB),
        (663_326_208, 636 * MIB),
        (528 * MIB, 528 * MIB),
        (442_181_632, 432 * MIB),
        (331_609_088, 324 * MIB),
    ];
    let mut readings = vec![(404_826_112, 400 * MIB)];
    readings.extend(warm_ups);
    assert_eq!(granule_bound(&readings), Some(12 * MIB));
    // Warm-ups the engine padded to round sizes agree on 250 MiB; the weights on 10 MiB with
    // them; an activation peak of one request (it wasted nothing) that is no multiple of either
    // stays in, and bounds the granule at 2 MiB.
    let padded = [
        (5040 * MIB, 5040 * MIB),
        (652 * MIB, 652 * MIB),
        (2000 * MIB, 2000 * MIB),
        (1750 * MIB, 1750 * MIB),
        (1500 * MIB, 1500 * MIB),
    ];
    assert_eq!(granule_bound(&padded), Some(2 * MIB));
    // Where every step is made of the granule's segments, leaving one out keeps it.
    let pure: Vec<(u64, u64)> = (1..=5u64)
        .map(|k| {
            (
                k * 97 * MIB + 1,
                (k * 97 * MIB + 1).div_ceil(2 * MIB) * 2 * MIB,
            )
        })
        .collect();
    assert_eq!(granule_bound(&pure), Some(2 * MIB));
    // Where nothing bounds it, the plan keeps the coarsest segment PyTorch's rules give one
    // request; never less than PyTorch's own rounding.
    let p = profile(48 * GIB, 47 * GIB, 46 * GIB, 20 * GIB, GIB, 0, None);
    let mut b =
        PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits()).unwrap();
    assert_eq!(b.unmeasured_kv_allocation(None), 20 * MIB);
    let mut b =
        PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits()).unwrap();
    assert_eq!(
        b.unmeasured_kv_allocation(Some(MIB)),
        ALLOCATOR_ROUNDING_BOUND
    );
    // A dry run keeps no slack at all.
    let mut dry = PlanBuilder::new(48 * GIB, Request::Utilization(0.9), spec(), limits());
    assert_eq!(dry.unmeasured_kv_allocation(Some(g)), 0);
}

#[test]
fn one_backing_allocation_keeps_room_for_one_rounding_not_one_per_layer() {
    use memplan_core::kv::KvAllocation;
    // The same model, budget and allocator under the rules of vLLM 0.28 and 0.29 (the newest
    // rules but for the allocation are 0.28's). Figures from vLLM's code:
    // - 0.28 (`vllm/v1/worker/gpu_model_runner.py`, `_allocate_kv_cache_tensors`): one
    //   `torch.zeros(kv_cache_tensor.size)` per layer, size `page_size_bytes * num_blocks`,
    //   each rounded up to the allocator's granule on its own;
    // - 0.29.0 (`vllm/v1/worker/utils.py`, `allocate_kv_cache`): one `torch.zeros(raw_size)`,
    //   `raw_size = bytes_per_block * num_blocks` (`vllm/v1/core/kv_cache_utils.py`,
    //   `get_kv_cache_config_from_groups`; `bytes_per_block` the group's pages summed), rounded
    //   once.
    let page = 16 * 2 * 128 * 2 * 2; // block_size x kv heads x head size x (K, V) x bf16
    let layers = 28;
    let bytes_per_block = layers * page;
    let v028 = SizingRules::newest(1).with_kv_allocation(KvAllocation::PerTensor);
    let v029 = SizingRules::newest(1);
    let p = profile(48 * GIB, 47 * GIB, 46 * GIB, 20 * GIB, GIB, 0, None);
    // PyTorch's 2 MiB (`kRoundLarge`) and a coarse granule of 26.5 MiB.
    for g in [2 * MIB, 53 * 512 * 1024] {
        let planned = |rules: SizingRules| {
            let mut b =
                PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits())
                    .unwrap()
                    .sizing_rules(rules);
            assert_eq!(b.unmeasured_kv_allocation(Some(g)), g);
            b.build().unwrap()
        };
        let (old, new) = (planned(v028), planned(v029));
        let budget = old.kv_budget_bytes;
        assert_eq!(new.kv_budget_bytes, budget);
        // 0.28: 28 tensors of n pages, each rounded up to g, within the budget: each at most
        // the largest multiple of g that 28 times fits.
        let per_tensor = budget / layers / g * g;
        assert_eq!(old.kv.num_blocks, per_tensor / page, "granule {g}");
        // 0.29: one allocation of n blocks with the whole granule beside it within the budget
        // (nothing measures it, and a granule that does not divide g may take up to g more).
        assert_eq!(
            new.kv.num_blocks,
            (budget - g) / bytes_per_block,
            "granule {g}"
        );
        // What each engine takes stays in the budget, and one backing allocation loses less
        // than a granule and a block to rounding where 28 tensors may lose 28 granules.
        let up = |x: u64| x.div_ceil(g) * g;
        assert!(layers * up(old.kv.num_blocks * page) <= budget);
        assert!(up(new.kv.num_blocks * bytes_per_block) <= budget);
        assert!(budget - new.kv.num_blocks * bytes_per_block < g + bytes_per_block);
        assert!(new.kv.num_blocks > old.kv.num_blocks, "granule {g}");
        assert_eq!(new.sizing_rules.kv_allocation, KvAllocation::OneBacking);
    }
}

#[test]
fn k_and_v_apart_keep_room_for_two_roundings_per_layer() {
    use memplan_core::kv::KvAllocation;
    // SGLang 0.5.1 to 0.5.22 (`python/sglang/srt/mem_cache/memory_pool.py`,
    // `MHATokenToKVPool._create_buffers`): a `k_buffer` and a `v_buffer` per layer, each one
    // `torch.zeros((size + page_size, head_num, head_dim))` the allocator rounds on its own: 56
    // tensors of half a page per block for 28 layers, where one per layer makes 28 of a page.
    // SGLang 0.5.23 (`_create_buffers_normal`) allocates K and V as halves of one
    // `torch.zeros((2, rows, head_num, head_dim))` per layer: 28, as vLLM up to 0.28 does.
    let page = 16 * 2 * 128 * 2 * 2; // block_size x kv heads x head size x (K, V) x bf16
    let layers = 28;
    let per_layer = SizingRules::default().with_kv_allocation(KvAllocation::PerTensor);
    let split = SizingRules::default().with_kv_allocation(KvAllocation::SplitKv);
    let paired = SizingRules::default().with_kv_allocation(KvAllocation::PairedKv);
    let p = profile(48 * GIB, 47 * GIB, 46 * GIB, 20 * GIB, GIB, 0, None);
    let up = |x: u64, g: u64| x.div_ceil(g) * g;
    // PyTorch's 2 MiB (`kRoundLarge`) and a coarse granule of 34.5 MiB: the 28 tensors of one
    // per layer take an odd number of granules each (405 and 23 of them), so their halves
    // rounded on their own take half a granule more each.
    for g in [2 * MIB, 36_175_872] {
        let planned = |rules: SizingRules, spec: KvSpec| {
            let mut b =
                PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec, limits())
                    .unwrap()
                    .sizing_rules(rules);
            assert_eq!(b.unmeasured_kv_allocation(Some(g)), g);
            b.build().unwrap()
        };
        let (one, two, halves) = (
            planned(per_layer, spec()),
            planned(split, spec()),
            planned(paired, spec()),
        );
        let budget = one.kv_budget_bytes;
        assert_eq!(two.kv_budget_bytes, budget);
        // One per layer: 28 tensors of n pages, each at most the largest multiple of g that
        // 28 times fits; 0.5.23's halves in one tensor plan the same.
        assert_eq!(
            one.kv.num_blocks,
            budget / layers / g * g / page,
            "granule {g}"
        );
        assert_eq!(halves.kv.num_blocks, one.kv.num_blocks, "granule {g}");
        // K and V apart: 56 tensors of n half pages, each at most the largest multiple of g
        // that 56 times fits.
        assert_eq!(
            two.kv.num_blocks,
            budget / (2 * layers) / g * g / (page / 2),
            "granule {g}"
        );
        assert!(2 * layers * up(two.kv.num_blocks * page / 2, g) <= budget);
        // The per-layer plan's blocks, allocated K and V apart, go past the budget: the room
        // kept for 28 roundings does not hold 56.
        assert!(layers * up(one.kv.num_blocks * page, g) <= budget);
        assert!(
            2 * layers * up(one.kv.num_blocks * page / 2, g) > budget,
            "granule {g}"
        );
        assert!(two.kv.num_blocks < one.kv.num_blocks);
        // K of 192 and V of 128 (SGLang allocates them apart in 0.5.23 too): tensors of two
        // sizes, no layout of equal tensors; the plan keeps the bound, one granule per
        // allocation, 56 of them.
        let uneven = || {
            KvSpec::new(
                vec![LayerGroup::new(AttentionKind::Full, 28, 2, 192).with_head_dim_v(128)],
                KvDtype::Bf16,
                16,
            )
        };
        let block = 28 * 16 * 2 * (192 + 128) * 2;
        for rules in [split, paired] {
            let u = planned(rules, uneven());
            assert_eq!(u.kv.block_bytes, block);
            assert_eq!(
                u.kv.num_blocks,
                (budget - 2 * layers * g) / block,
                "granule {g}"
            );
        }
        // One tensor per layer holds K and V of any dims: 28 tensors of whole pages.
        let u = planned(per_layer, uneven());
        assert_eq!(u.kv.num_blocks, budget / layers / g * g / (block / layers));
    }
}

/// Gemma 3 4B's layers: 29 sliding (window 1024) and 5 full, 4 KV heads of 256, fp8, 64
/// tokens a block; the sliding layers with `sliding_heads` KV heads.
fn gemma3_4b_like(sliding_heads: u32) -> KvSpec {
    KvSpec::new(
        vec![
            LayerGroup::new(
                AttentionKind::SlidingWindow { window: 1024 },
                29,
                sliding_heads,
                256,
            ),
            LayerGroup::new(AttentionKind::Full, 5, 4, 256),
        ],
        KvDtype::Fp8E4m3,
        64,
    )
}

/// The plan of `spec` for 8,192-token requests in 23.5 GiB of a 48 GiB device beside 21 GiB of
/// weights and activation peak (2.5 GiB left for the KV cache), its KV cache allocated as
/// `kind` says and nothing measuring it beyond a 40 MiB granule read off the engine's own
/// allocations.
fn plan_unmeasured_40_mib(
    spec: &KvSpec,
    kind: memplan_core::kv::KvAllocation,
    rule: memplan_core::kv::LongRequests,
) -> Result<Plan> {
    let limits = KvLimits::new(8192, 16384).with_max_len_limit(1 << 20);
    let p = profile(48 * GIB, 47 * GIB, 46 * GIB, 20 * GIB, GIB, 0, None);
    let g = 40 * MIB;
    let mut b = PlanBuilder::from_profile(
        &p,
        "test",
        Request::Bytes(23 * GIB + GIB / 2),
        spec.clone(),
        limits,
    )
    .unwrap()
    .sizing_rules(
        SizingRules::default()
            .with_kv_allocation(kind)
            .with_long_requests(rule),
    );
    assert_eq!(b.unmeasured_kv_allocation(Some(g)), g);
    b.build()
}

/// SGLang's sliding-window pools (`SWAKVPool`) give every layer's K and V the same rows, so a
/// hybrid cache whose layers have pages of one size is tensors of an even share of the plan's
/// blocks: 68 tensors of about 8 MiB for a request of 8,192 tokens, which share the
/// allocator's mid-sized segments, where a whole 40 MiB granule for each (2,720 MiB) took all
/// of the 2.5 GiB left for the cache and the start-up was refused. Larger tensors share the
/// segments of any granule up to 40 MiB too, and the cache grows to tensors of about 19 MiB.
#[test]
fn sliding_window_pools_with_k_and_v_apart_are_fitted_tensor_by_tensor() {
    use memplan_core::kv::{KvAllocation, LongRequests};
    let spec = gemma3_4b_like(4);
    let plan = plan_unmeasured_40_mib(&spec, KvAllocation::SplitKv, LongRequests::Refuse).unwrap();
    assert!(plan.kv.max_concurrency >= 1.0);
    let room = GIB * 5 / 2;
    assert!(plan.kv_cache_bytes <= room);
    // Every segment the granule may make, from 20 MiB to 40, holds the tensors in the room.
    let each = (plan.kv.num_blocks * plan.kv.block_bytes).div_ceil(68) + plan.kv.page_bytes / 2;
    let each = each.div_ceil(512) * 512;
    assert!(each >= 10 * MIB, "{each}");
    // Every granule up to 40 MiB makes segments of the tensor rounded up to it, each holding
    // as many tensors as fit: in the room.
    for granule in (1..=80).map(|k| k * MIB / 2) {
        let segment = each.div_ceil(granule) * granule;
        assert!(
            68u64.div_ceil(segment / each) * segment <= room,
            "{granule}"
        );
    }
}

/// A hybrid cache allocated K and V apart whose layers' pages differ in size (sliding-window
/// layers of 8 KV heads beside full-attention ones of 4) has no layout of equal tensors the
/// plan knows: a measured plan keeps a whole granule per K and per V of every layer. Where
/// that room takes what was left for the cache, the refusal says so, with its bytes and what
/// would round the cache less, not an unexplained "0 fit in 0 B"; an engine that starts with a
/// shorter pool (SGLang) is refused by its own start rule, not for one request of the max
/// model length.
#[test]
fn a_refusal_names_the_rounding_reserve_that_took_the_room() {
    use memplan_core::kv::{KvAllocation, LongRequests};
    use memplan_core::RoundingReserve;
    let spec = gemma3_4b_like(8);
    // A 40 MiB granule, read off the engine's own allocations: 68 of them are 2,720 MiB, more
    // than the 2.5 GiB a 23.5 GiB budget leaves the cache beside 21 GiB of weights and peak.
    let g = 40 * MIB;
    let build = |kind: KvAllocation, rule: LongRequests| plan_unmeasured_40_mib(&spec, kind, rule);
    let e = build(KvAllocation::SplitKv, LongRequests::Refuse).unwrap_err();
    let Some(Refusal::RequestDoesNotFit {
        usable_blocks: 0,
        kv_bytes,
        rounding: Some(r),
        ..
    }) = e.refusal()
    else {
        panic!("{e}");
    };
    assert_eq!((r.allocations, r.granule, r.most), (68, g, 68 * g), "{e}");
    assert_eq!(r.room, GIB * 5 / 2, "{e}");
    assert_eq!(r.reserve, r.room - kv_bytes, "{e}");
    let text = e.to_string();
    for needle in [
        "2.50 GiB was left for the KV cache, and the plan keeps 2.50 GiB of it for the caching allocator's rounding of the cache's 68 allocations",
        "a K and a V tensor for each of 34 layers, allocated apart",
        "as much as 40.00 MiB (2.66 GiB for all of them)",
        "expandable segments",
        "(SGLang 0.5.23 on) has 34 allocations to round",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // The JSON names it too.
    let json = serde_json::to_value(e.refusal().unwrap()).unwrap();
    assert_eq!(json["rounding"]["allocations"], 68, "{json}");
    // K and V in one tensor per layer: 34 roundings leave room for the request.
    let paired = build(KvAllocation::PairedKv, LongRequests::Refuse).unwrap();
    assert!(paired.kv.max_concurrency >= 1.0);
    // SGLang's start rule: an empty pool is refused as the engine refuses it.
    let e = build(
        KvAllocation::SplitKv,
        LongRequests::CapByPool { least_tokens: 2 },
    )
    .unwrap_err();
    assert!(
        matches!(
            e.refusal(),
            Some(Refusal::PoolTooSmall {
                pool_tokens: 0,
                least_tokens: 2,
                rounding: Some(RoundingReserve {
                    allocations: 68,
                    ..
                }),
                ..
            })
        ),
        "{e}"
    );
    let text = e.to_string();
    assert!(!text.contains("one request of"), "{text}");
    assert!(
        text.contains("fewer than the 2 the engine needs to start"),
        "{text}"
    );
}

/// Where the engine declared power-of-two divisions (`roundup_power2_divisions`), each KV tensor
/// is rounded up to its division before the granule rounds it, and the fit keeps room for that
/// too: the refusal names the divisions and counts what they add (under `1/d` of the cache's
/// bytes) in the most the rounding takes, so the figures it gives add up to what it kept (a
/// refusal on a 1 GiB-stepped A100 said 6.32 GiB kept, "64.00 MiB for all of them").
#[test]
fn a_rounding_refusal_counts_power_of_two_divisions() {
    use memplan_core::kv::{KvAllocation, LongRequests};
    let spec = gemma3_4b_like(8);
    let limits = KvLimits::new(8192, 16384).with_max_len_limit(1 << 20);
    let p = profile(48 * GIB, 47 * GIB, 46 * GIB, 20 * GIB, GIB, 0, None);
    let conf = memplan_core::AllocatorConfig::parse("roundup_power2_divisions:2").unwrap();
    let mut b =
        PlanBuilder::from_profile(&p, "test", Request::Bytes(23 * GIB + GIB / 2), spec, limits)
            .unwrap()
            .sizing_rules(
                SizingRules::default()
                    .with_kv_allocation(KvAllocation::SplitKv)
                    .with_long_requests(LongRequests::Refuse),
            )
            .allocator_config(conf, "the test");
    b.unmeasured_kv_allocation(Some(40 * MIB));
    let e = b.build().unwrap_err();
    let Some(Refusal::RequestDoesNotFit {
        kv_bytes,
        rounding: Some(r),
        ..
    }) = e.refusal()
    else {
        panic!("{e}");
    };
    assert_eq!(
        r.most,
        r.allocations * r.granule + kv_bytes.div_ceil(2),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("power-of-two division (`roundup_power2_divisions`, 2 at the coarsest)"),
        "{text}"
    );
}

/// The non-allocator consumer of the plan of `p` at 90% utilisation, its KV cache allocated
/// as `allocation` says.
fn non_allocator_bytes(p: &Profile, allocation: memplan_core::kv::KvAllocation) -> u64 {
    non_allocator_bytes_under(p, allocation, None)
}

/// As [`non_allocator_bytes`], the engine's allocator declared as `conf` where given.
fn non_allocator_bytes_under(
    p: &Profile,
    allocation: memplan_core::kv::KvAllocation,
    conf: Option<&str>,
) -> u64 {
    let mut b = PlanBuilder::from_profile(p, "test", Request::Utilization(0.9), spec(), limits())
        .unwrap()
        .sizing_rules(SizingRules::default().with_kv_allocation(allocation));
    if let Some(c) = conf {
        b = b.allocator_config(memplan_core::AllocatorConfig::parse(c).unwrap(), "the test");
    }
    b.build()
        .unwrap()
        .consumers
        .bytes(ConsumerKind::NonAllocator)
}

/// A 48 GiB device whose engine holds 20 GiB of weights, a 1 GiB activation peak and 300 MiB
/// outside its allocator, with the graph phase `graph` ([`profile`]).
fn with_300_mib_outside(graph: Option<(i64, u64, bool)>) -> Profile {
    profile(
        48 * GIB,
        47 * GIB,
        46 * GIB,
        20 * GIB,
        GIB,
        300 * MIB as i64,
        graph,
    )
}

/// Non-allocator memory measured through an approximate free reading is a sum of windows, each
/// off by up to the reading's window error. A reading that read the engine's memory low would
/// hand that memory to the KV cache: the plan keeps that error, times the square root of the
/// windows (their errors independent), whatever the cache's layout. A plan that kept nothing
/// went over the request by what the reading under-read: with one backing allocation (rounded
/// once), and with a tensor per layer too, once taken to absorb it in the rounding of its
/// tensors (an eager engine with four KV tensors on a reading in 32 MiB steps went 16 MiB past
/// the request). Where the free reading is exact and counts bytes, nothing is added.
#[test]
fn the_free_readings_window_error_is_kept_on_non_allocator_memory() {
    use memplan_core::kv::KvAllocation;
    let na_with = non_allocator_bytes;
    let na = |p: &Profile| na_with(p, KvAllocation::OneBacking);
    let mut p = with_300_mib_outside(None);
    p.non_allocator_windows = 4;
    assert_eq!(na(&p), 300 * MIB, "an exact reading: as measured");
    let tolerance = 511 * 1024;
    p.capability.set(
        Reading::DriverFree,
        Reliability::Approximate {
            tolerance_bytes: tolerance,
            why: "moved over reads of the idle device".into(),
        },
    );
    // Nothing measured the window error: the declared tolerance, twice for four windows.
    assert_eq!(na(&p), 300 * MIB + 2 * tolerance);
    assert_eq!(
        na_with(&p, KvAllocation::PerTensor),
        300 * MIB + 2 * tolerance,
        "a tensor per layer keeps it too"
    );
    // A measured window error, kept as the graph strategies keep it (1.25 times, plus 1 MiB),
    // within the declared tolerance.
    p.free_window_error = Some(64 * 1024);
    assert_eq!(na(&p), 300 * MIB + 2 * tolerance);
    p.capability.set(
        Reading::DriverFree,
        Reliability::Approximate {
            tolerance_bytes: 64 * MIB,
            why: "moved over reads of the idle device".into(),
        },
    );
    assert_eq!(na(&p), 300 * MIB + 2 * (80 * 1024 + MIB));
    p.non_allocator_windows = 1;
    assert_eq!(na(&p), 300 * MIB + 80 * 1024 + MIB);
    // No window counted: nothing added.
    p.non_allocator_windows = 0;
    assert_eq!(na(&p), 300 * MIB);
}

/// A free reading in 2 MiB steps stays exact to calibration (the step is within a window's
/// rounding), yet a window of two such reads may be off by up to the step: every window's
/// error is at least the step the reading moves in, and the plan keeps it.
#[test]
fn an_exact_reading_in_steps_keeps_a_step_per_window() {
    use memplan_core::kv::KvAllocation;
    let mut p = with_300_mib_outside(None);
    p.non_allocator_windows = 4;
    assert_eq!(non_allocator_bytes(&p, KvAllocation::PerTensor), 300 * MIB);
    p.free_step = 2 * MIB;
    assert_eq!(
        non_allocator_bytes(&p, KvAllocation::PerTensor),
        300 * MIB + 2 * (2 * MIB),
        "a step, twice for four windows"
    );
}

/// Expandable segments pack the tensors of a KV cache laid out a tensor per layer one after
/// another into pages, rounded once, as one backing allocation is. The plan keeps the windows'
/// error there as it does for tensors rounded on their own. An H200 whose free reading moved
/// in 64 MiB steps read 20 MiB that a failed capture left behind as 4 MiB, and an eager engine
/// with `expandable_segments:True` went 307 KiB past the request in its serving burst (a
/// tensor per layer, 80 layers).
#[test]
fn expandable_segments_keep_the_free_readings_window_error() {
    use memplan_core::kv::KvAllocation;
    let na =
        |p: &Profile, conf: &str| non_allocator_bytes_under(p, KvAllocation::PerTensor, Some(conf));
    let mut p = with_300_mib_outside(None);
    p.non_allocator_windows = 4;
    let tolerance = 511 * 1024;
    p.capability.set(
        Reading::DriverFree,
        Reliability::Approximate {
            tolerance_bytes: tolerance,
            why: "moved over reads of the idle device".into(),
        },
    );
    for conf in ["expandable_segments:True", "expandable_segments:False"] {
        assert_eq!(na(&p, conf), 300 * MIB + 2 * tolerance, "{conf}");
    }
}

/// `full`'s and `post-capture`'s margins keep one window's error for the engine's memory
/// measured through the free reading: where the KV cache is one backing allocation the
/// non-allocator growth keeps only what its windows' error exceeds that window by
/// (`window * (sqrt(n) - 1)`), not that window again. With one window the margin covers it
/// whole; a graph estimate that keeps no window (sampled, conservative) leaves the growth
/// keeping all of them.
#[test]
fn one_backing_counts_no_window_the_graph_margin_keeps_already() {
    use memplan_core::kv::KvAllocation;
    let na = |p: &Profile| non_allocator_bytes(p, KvAllocation::OneBacking);
    let mut p = with_300_mib_outside(Some((2 * GIB as i64, 100 * MIB, false)));
    p.capability.set(
        Reading::DriverFree,
        Reliability::Approximate {
            tolerance_bytes: 64 * MIB,
            why: "moved over reads of the idle device".into(),
        },
    );
    // A window error of 20 MiB seen: 25 MiB + 1 MiB kept.
    p.free_window_error = Some(20 * MIB);
    let w = (25 * MIB + MIB) as f64;
    p.non_allocator_windows = 4;
    let beyond = (w * (4f64.sqrt() - 1.0)).ceil() as u64;
    assert_eq!(na(&p), 300 * MIB + beyond);
    assert!(
        beyond < 2 * (26 * MIB),
        "less than every window counted again"
    );
    p.non_allocator_windows = 1;
    assert_eq!(na(&p), 300 * MIB, "one window: the graph margin keeps it");
    // A graph estimate whose margin keeps no window: every window counted here.
    p.non_allocator_windows = 4;
    p.graph.as_mut().unwrap().strategy = StrategyKind::Sampled;
    assert_eq!(na(&p), 300 * MIB + 2 * 26 * MIB);
}

/// `full`'s margin keeps its captures' capture-to-capture variation and its two windows' error
/// in quadrature (independent errors, each bound at about the same confidence). The engine's
/// other windows are errors of the same reading, as independent of the captures: their
/// statistical part (what is kept for the error calibration saw, 1.25 times it) joins the
/// margin's windows (added whole among themselves) and the variation stays in quadrature with
/// all of them, so the non-allocator growth keeps `sqrt(v^2 + (2w + rest)^2) - sqrt(v^2 +
/// (2w)^2)` of it, not `rest` whole beside the margin; the rest of each window (the granule's
/// worth of slack, 1 MiB) stays whole. Added whole, the variation and every window were
/// counted at their extreme at once, and a plan short of a coarse KV step by less than the
/// excess lost the step. Where the margin keeps no variation, or the reading saw no error (the
/// window is all slack, an allowance rather than a random error), the other windows are kept
/// whole.
#[test]
fn the_other_windows_add_to_the_graph_variation_in_quadrature() {
    use memplan_core::kv::KvAllocation;
    let na = |p: &Profile| non_allocator_bytes(p, KvAllocation::OneBacking);
    let mut p = with_300_mib_outside(Some((2 * GIB as i64, 200 * MIB, false)));
    p.capability.set(
        Reading::DriverFree,
        Reliability::Approximate {
            tolerance_bytes: 64 * MIB,
            why: "moved over reads of the idle device".into(),
        },
    );
    // A window error of 20 MiB seen: 25 MiB + 1 MiB kept a window; nine windows, two of them
    // beyond the one the graph margin keeps.
    p.free_window_error = Some(20 * MIB);
    p.non_allocator_windows = 9;
    let w = (26 * MIB) as f64;
    assert_eq!(
        na(&p),
        300 * MIB + 2 * 26 * MIB,
        "no variation: every window whole"
    );
    let v = (120 * MIB) as f64;
    p.graph.as_mut().unwrap().variation = 120 * MIB;
    let own = 2.0 * w;
    let random = (2 * 25 * MIB) as f64;
    let joined = ((2 * MIB) as f64 + (v * v + (own + random).powi(2)).sqrt()
        - (v * v + own * own).sqrt())
    .ceil() as u64;
    assert_eq!(na(&p), 300 * MIB + joined);
    assert!(
        joined < 2 * 26 * MIB * 3 / 5,
        "well under the windows whole: {joined}"
    );
    // A reading that saw no error: its window is the granule's slack alone, kept whole.
    p.free_window_error = Some(0);
    assert_eq!(na(&p), 300 * MIB + 2 * MIB);
    // A graph estimate whose margin keeps no window: every window counted here, whole.
    p.free_window_error = Some(20 * MIB);
    p.graph.as_mut().unwrap().strategy = StrategyKind::Sampled;
    assert_eq!(na(&p), 300 * MIB + 3 * 26 * MIB);
}

/// `full` keeps its margin's windows at the step its own windows show where every idle window
/// of its repeats read exactly 0 and each snapshot is one read (a quiet reading, carried as
/// [`GraphEstimate::window`](crate::strategy::GraphEstimate)). The engine's other windows are
/// windows of the same reading and are kept at that error too: at the reading's window error
/// (here the 1 MiB page every calibration read sat on, the reading's step), a process-local
/// reading kept 1 MiB beside a graph margin whose own windows kept 1 byte each, for an error
/// no window showed, and a KV cache in coarse steps came out short of its next one. A window
/// above the reading's window error is taken at that error; a graph estimate whose margin
/// keeps no window (sampled) leaves every window at the reading's error.
#[test]
fn the_other_windows_of_a_quiet_reading_are_kept_at_the_step_its_windows_show() {
    use memplan_core::kv::KvAllocation;
    let na = |p: &Profile| non_allocator_bytes(p, KvAllocation::OneBacking);
    let mut p = with_300_mib_outside(Some((2 * GIB as i64, 100 * MIB, false)));
    // An exact reading whose calibration reads all came out in whole 1 MiB pages: its step.
    p.free_step = MIB;
    p.free_window_error = Some(0);
    p.non_allocator_windows = 4;
    assert_eq!(
        na(&p),
        300 * MIB + MIB,
        "one window beyond the graph margin's, at the step"
    );
    // `full`'s idle windows all read 0, its windows in single bytes: 1 byte a window.
    p.graph.as_mut().unwrap().window = Some(1);
    assert_eq!(na(&p), 300 * MIB + 1);
    p.graph.as_mut().unwrap().window = Some(4 * MIB);
    assert_eq!(
        na(&p),
        300 * MIB + MIB,
        "never above the reading's window error"
    );
    p.graph.as_mut().unwrap().window = Some(1);
    // A window that moved with nothing the engine did (a quiet window within the window
    // error): every window at the reading's window error.
    p.non_allocator_windows_moved = 1;
    assert_eq!(na(&p), 300 * MIB + MIB, "a window moved");
    p.non_allocator_windows_moved = 0;
    p.graph.as_mut().unwrap().strategy = StrategyKind::Sampled;
    assert_eq!(na(&p), 300 * MIB + 2 * MIB, "no window in the graph margin");
}

/// Where one request of `max_model_len` does not fit, vLLM refuses to start
/// (`_check_enough_kv_cache_memory`) and the plan is refused; SGLang starts and admits requests
/// of at most its pool less one token (`srt/managers/tp_worker.py` `TpModelWorker`:
/// `max_req_len = min(context_len - 1, max_total_num_tokens - 1)`), so the plan stands, warned
/// by name. A pool below the engine's least (7 tokens up to SGLang 0.5.13, 2 from 0.5.14) and a
/// cache of no usable block are refused all the same.
#[test]
fn an_engine_that_caps_requests_by_its_pool_is_planned_with_a_warning() {
    use memplan_core::kv::LongRequests;
    // SGLang's one-token pages: 28 layers of 2 heads of 128, bf16, K and V: 28 KiB per token.
    let spec = KvSpec::new(
        vec![LayerGroup::new(AttentionKind::Full, 28, 2, 128)],
        KvDtype::Bf16,
        1,
    );
    let token = 28 * 2 * 128 * 2 * 2;
    let build = |rows: u64, rule: LongRequests| {
        PlanBuilder::new(
            80 * GIB,
            Request::KvCacheBytes(rows * token),
            spec.clone(),
            limits(),
        )
        .sizing_rules(SizingRules::default().with_long_requests(rule))
        .build()
    };
    let old = LongRequests::CapByPool { least_tokens: 7 };
    let new = LongRequests::CapByPool { least_tokens: 2 };
    // 1000 tokens (and the padded one) of a 4096-token context: vLLM refuses with the longest
    // length that fits...
    let e = build(1001, LongRequests::Refuse).unwrap_err();
    assert!(
        matches!(
            e.refusal(),
            Some(Refusal::RequestDoesNotFit {
                max_model_len: 4096,
                max_model_len_fit: Some(1000),
                ..
            })
        ),
        "{e}"
    );
    // ...SGLang plans the pool and names the longest request it admits.
    for rule in [old, new] {
        let p = build(1001, rule).unwrap();
        assert_eq!(p.kv.tokens, 1000);
        assert!(p.kv.max_concurrency < 1.0);
        let w = p
            .warnings
            .iter()
            .find(|w| w.code() == "requests_capped_by_pool")
            .expect("the cap is named");
        assert_eq!(
            *w,
            Warning::RequestsCappedByPool {
                longest: 999,
                pool_tokens: 1000,
                max_model_len: 4096,
                max_model_len_fit: Some(1000),
            }
        );
        assert_eq!(w.to_json()["longest"], 999);
        assert!(p
            .to_string()
            .contains("admits requests of at most 999 tokens"));
        // The plan reads back with its rule.
        let back = Plan::from_json(&p.to_json()).unwrap();
        assert_eq!(back.sizing_rules.long_requests, rule);
    }
    // A pool of 6 tokens: SGLang 0.5.14 on starts (requests of 5 tokens), 0.5.1 to 0.5.13 does
    // not ("Memory pool size is too small").
    assert!(build(7, new).is_ok());
    let e = build(7, old).unwrap_err();
    assert!(
        matches!(
            e.refusal(),
            Some(Refusal::PoolTooSmall {
                pool_tokens: 6,
                least_tokens: 7,
                ..
            })
        ),
        "{e}"
    );
    assert!(e
        .to_string()
        .contains("fewer than the 7 the engine needs to start"));
    // Nothing usable (the padded token only): vLLM refuses as it refuses one request that does
    // not fit; SGLang by its own start rule ("Not enough memory" for an empty pool), not for
    // one request of the context. A fixed cache keeps no room for rounding: none is named.
    let e = build(1, LongRequests::Refuse).unwrap_err();
    assert!(
        matches!(
            e.refusal(),
            Some(Refusal::RequestDoesNotFit {
                usable_blocks: 0,
                max_model_len_fit: None,
                rounding: None,
                ..
            })
        ),
        "{e}"
    );
    for rule in [old, new] {
        let e = build(1, rule).unwrap_err();
        assert!(
            matches!(
                e.refusal(),
                Some(Refusal::PoolTooSmall {
                    pool_tokens: 0,
                    rounding: None,
                    ..
                })
            ),
            "{rule:?}: {e}"
        );
        assert!(!e.to_string().contains("one request of 4096"), "{e}");
    }
    // One request of the context fits: no warning, whatever the rule.
    let p = build(4097, new).unwrap();
    assert!(p
        .warnings
        .iter()
        .all(|w| w.code() != "requests_capped_by_pool"));
}

/// The utilisation suggested without a graph reserve says what capture adds to it where the
/// plan warns that graph memory is not reserved, with the figure that warning states.
#[test]
fn the_suggestion_without_a_graph_reserve_adds_the_warnings_capture_figure() {
    let p = profile(
        24 * GIB,
        23 * GIB,
        19 * GIB,
        3 * GIB,
        GIB,
        128 * MIB as i64,
        Some((200 * MIB as i64, 0, false)),
    );
    let mut plan = plan(&p, "test", Request::Utilization(0.9)).unwrap();
    let u = plan.suggestions.utilization_without_graph_reserve.unwrap();
    let line = |plan: &Plan| {
        let s = plan.to_string();
        s.lines()
            .find(|l| l.contains("does not reserve graph memory"))
            .unwrap()
            .to_string()
    };
    assert!(!line(&plan).contains("graph capture"), "{}", line(&plan));
    // 1 GiB of a 24 GiB device: u + 1 / 24.
    plan.warnings
        .push(Warning::GraphMemoryNotReserved { estimate: GIB });
    let all = ((u + 1.0 / 24.0) * 1e4).ceil() / 1e4;
    assert!(all <= 1.0, "{all}");
    assert!(
        line(&plan).ends_with(&format!(
            "; graph capture takes about 1.00 GiB beyond it (the warning's figure): {all:.4} of the device in all"
        )),
        "{}",
        line(&plan)
    );
    // More than the device has left (u + 3 / 24 > 1): said.
    plan.warnings = vec![Warning::GraphMemoryNotReserved { estimate: 3 * GIB }];
    assert!(
        line(&plan).ends_with("of the device in all, more than it has"),
        "{}",
        line(&plan)
    );
}

#[test]
fn a_mapped_kv_cache_holds_every_block_its_whole_granules_hold() {
    // Post-capture maps the KV cache in whole granules of the device's mapping granularity:
    // the budget rounded down to whole granules holds `floor(granules x g / block)` blocks, and
    // those blocks, mapped rounded up to a granule, stay inside the same granules. Nothing else
    // rounds them, so no slack is kept besides (a granule kept on top lost up to two granules'
    // blocks).
    let g = 2 * MIB;
    let p = profile(
        48 * GIB,
        47 * GIB,
        46 * GIB,
        20 * GIB,
        GIB,
        0,
        Some((GIB as i64, 0, true)),
    );
    let plan = PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits())
        .unwrap()
        .mapping_granularity(g)
        .build()
        .unwrap();
    // 28 layers x 16 tokens x 2 heads x 128 x (K, V) x 2 bytes.
    let block = 28 * 16 * 2 * 128 * 2 * 2;
    assert_eq!(plan.kv.block_bytes, block);
    let whole = plan.kv_budget_bytes / g * g;
    assert_eq!(plan.kv_cache_bytes, whole);
    assert_eq!(plan.kv.num_blocks, whole / block);
    let mapped = (plan.kv.num_blocks * block).div_ceil(g) * g;
    assert!(mapped <= plan.kv_budget_bytes);
    // One block more would not fit in them.
    assert!((plan.kv.num_blocks + 1) * block > whole);
}

/// Where the engine's capture keeps the allocator's cache under expandable segments, a burst
/// takes the largest warm-up's free pages only where that warm-up made large requests: warm-ups
/// of a small request's size or less (1 MiB, PyTorch's `kSmallSize`) leave their pages in the
/// small requests' pool, which no burst's large request takes, so what they left cached stays
/// beside the burst (four warm-ups of 128 KiB on an RTX 4090 left one 2 MiB small segment,
/// which the plan read as taken by the burst: 523 KiB past the request in serving).
#[test]
fn small_warm_ups_a_keeping_capture_leaves_cached_stay_beside_the_burst() {
    let act = GIB;
    let mut p = profile(24 * GIB, 23 * GIB, 19 * GIB, 3 * GIB, act, 0, None);
    p.expandable_segments = true;
    p.capture_keeps_cache = Some(true);
    p.capture_cache_left_bytes = Some(2 * MIB);
    p.warmup_peak_bytes = Some(2 * MIB);
    let activation = |p: &Profile| {
        let plan = plan(p, "t", Request::Utilization(0.9)).unwrap();
        plan.consumers.get(ConsumerKind::Activation).unwrap().bytes
    };
    // A large warm-up's 2 MiB of pages: the burst takes them.
    assert_eq!(activation(&p), act);
    p.warmup_peak_small = true;
    assert_eq!(activation(&p), act + 2 * MIB);
}

/// A share of the device whose total has one source: the driver's total, with no second
/// reading of the device's memory (no device-wide total) and no allocation probe that raised
/// it, is taken as reported and said by name (`utilization_of_unchecked_total`, with the total
/// and what its share asks for). Not said where a second total was read (equal or lower: it
/// checked the driver's), where an allocation probe found the total reported too low (the
/// share is of a measured figure), or for a byte budget (no share of any total).
#[test]
fn a_share_of_a_total_nothing_checks_is_said_by_name() {
    use memplan_core::DeviceWideMemory;
    let unchecked = |plan: &Plan| {
        plan.warnings.iter().find_map(|w| match w {
            Warning::UtilizationOfUncheckedTotal {
                reported_total,
                requested,
            } => Some((*reported_total, *requested)),
            _ => None,
        })
    };
    let p = profile(24 * GIB, 23 * GIB, 19 * GIB, 3 * GIB, GIB, 0, None);
    let shared = plan(&p, "t", Request::Utilization(0.9)).unwrap();
    assert_eq!(
        unchecked(&shared),
        Some((24 * GIB, shared.requested_bytes)),
        "{:?}",
        shared.warnings
    );
    assert_eq!(
        shared.requested_bytes,
        (0.9 * (24 * GIB) as f64).ceil() as u64
    );
    let message = shared
        .warnings
        .iter()
        .find(|w| w.code() == "utilization_of_unchecked_total")
        .unwrap()
        .to_string();
    assert!(
        message.contains("24.00 GiB") && message.contains("byte budget"),
        "{message}"
    );
    // A byte budget is no share of the total.
    let bytes = plan(&p, "t", Request::Bytes(20 * GIB)).unwrap();
    assert_eq!(unchecked(&bytes), None, "{:?}", bytes.warnings);
    // A second reading of the device's memory checks the driver's total.
    let mut read_twice = p.clone();
    for s in [&mut read_twice.baseline, &mut read_twice.last] {
        *s = s.with_device(DeviceWideMemory::new(Some(23 * GIB)).with_total(Some(24 * GIB)));
    }
    let checked = plan(&read_twice, "t", Request::Utilization(0.9)).unwrap();
    assert_eq!(unchecked(&checked), None, "{:?}", checked.warnings);
    // An allocation that succeeded past the reported total measured the device's total.
    let mut probed = p.clone();
    probed.probe_baseline = Some(25 * GIB);
    probed.allocatable_total = Some(25 * GIB);
    let raised = plan(&probed, "t", Request::Utilization(0.9)).unwrap();
    assert_eq!(unchecked(&raised), None, "{:?}", raised.warnings);
    assert!(raised
        .warnings
        .iter()
        .any(|w| w.code() == "total_below_allocatable"));
}
