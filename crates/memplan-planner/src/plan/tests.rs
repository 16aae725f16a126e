use super::*;
use crate::strategy::GraphEstimate;
use memplan_core::bytes::{GIB, MIB};
use memplan_core::kv::{AttentionKind, KvDtype, LayerGroup};
use memplan_core::{AllocatorMemory, DriverMemory, ProfilingCapability, Reliability};
use proptest::prelude::*;

fn snap(total: u64, free: u64) -> MemoryInfo {
    MemoryInfo {
        driver: DriverMemory {
            total: Some(total),
            free: Some(free),
        },
        allocator: AllocatorMemory {
            reserved: Some(0),
            allocated: Some(0),
            peak_allocated: Some(0),
        },
        ..Default::default()
    }
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
    Profile {
        capability: ProfilingCapability::exact_discrete(),
        baseline: snap(total, free0),
        last: snap(total, free_last),
        steps: Vec::new(),
        warnings: Vec::new(),
        foreign_bytes: 0,
        weights_bytes: Some(w),
        weights_held_bytes: Some(w),
        activation_peak_bytes: Some(a),
        non_allocator_growth: Some(g),
        graph: graph.map(|(p, m, kept)| {
            let mut e = GraphEstimate::new(StrategyKind::Full, 35, p, m, "test");
            e.kept = kept;
            e
        }),
        kv_reservation: None,
    }
}

fn inputs(request: Request) -> PlanInputs {
    PlanInputs {
        request,
        kv: KvSpec {
            groups: vec![LayerGroup {
                attention: AttentionKind::Full,
                num_layers: 28,
                kv_heads: 2,
                head_dim_k: 128,
                head_dim_v: 128,
            }],
            dtype: KvDtype::Bf16,
            block_size: 16,
        },
        limits: KvLimits {
            max_model_len: 4096,
            max_num_batched_tokens: 8192,
            max_len_limit: 1 << 20,
        },
    }
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
    let plan = plan(&p, "test", &inputs(Request::Utilization(0.9))).unwrap();
    let s = plan.to_string();
    for needle in [
        "device total",
        "requested",
        "weights",
        "graph reserve",
        "KV budget",
        "KV tokens",
        "max concurrency",
        "[WWW",
    ] {
        assert!(s.contains(needle), "{needle} in\n{s}");
    }
    assert_eq!(plan.bar().chars().count(), 62);
    let j = serde_json::to_value(&plan).unwrap();
    assert_eq!(j["strategy"], "full");
    assert!(j["kv"]["tokens"].as_u64().unwrap() > 0);
}

#[test]
fn free_memory_caps_and_says_so() {
    // Someone holds 8 GiB: the budget would allow more than is free.
    let p = profile(24 * GIB, 23 * GIB, 8 * GIB, 3 * GIB, GIB, 0, None);
    let plan = plan(&p, "t", &inputs(Request::Utilization(0.9))).unwrap();
    assert!(plan.capped_by_free.is_some() && plan.kv_bytes < plan.budget.kv_budget);
    assert!(plan.kv_bytes <= 8 * GIB - GIB);
    assert!(plan
        .warnings
        .iter()
        .any(|w| w.contains("caps the KV cache")));
}

#[test]
fn early_check_and_missing_total() {
    let p = profile(24 * GIB, GIB, GIB, 3 * GIB, GIB, 0, None);
    let e = plan(&p, "t", &inputs(Request::Utilization(0.9)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("less than requested"), "{e}");
    let mut p = profile(24 * GIB, 23 * GIB, 20 * GIB, 3 * GIB, GIB, 0, None);
    p.baseline.driver.total = None;
    p.capability.set(
        Reading::DriverTotal,
        Reliability::Unavailable {
            reason: "aperture".into(),
        },
    );
    let e = plan(&p, "t", &inputs(Request::Utilization(0.9)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpu-memory-utilization") && e.contains("aperture"),
        "{e}"
    );
    assert!(plan(&p, "t", &inputs(Request::Bytes(16 * GIB))).is_ok());
    // A fixed KV size needs the total too; the error names that flag, not another.
    let e = plan(&p, "t", &inputs(Request::KvCacheBytes(GIB)))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("kv-cache-memory-bytes"), "{e}");
}

#[test]
fn ranks_combine_to_the_smallest() {
    let mk = |free_last| {
        let p = profile(24 * GIB, 23 * GIB, free_last, 3 * GIB, GIB, 0, None);
        plan(&p, "t", &inputs(Request::Utilization(0.9))).unwrap()
    };
    let plans = [mk(20 * GIB), mk(9 * GIB), mk(19 * GIB)];
    let (i, p) = combine_ranks(&plans).unwrap();
    assert_eq!(i, 1);
    assert!(plans.iter().all(|q| q.kv.num_blocks >= p.kv.num_blocks));
    assert!(combine_ranks(&[]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

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
        match plan(&p, "prop", &inputs(Request::Utilization(util))) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            Ok(plan) => {
                let b = &plan.budget;
                let used = b.consumers.total().unwrap();
                prop_assert!(plan.kv_bytes <= b.kv_budget);
                prop_assert!(used + plan.kv_bytes <= b.requested);
                prop_assert!(b.requested <= total);
                prop_assert!(plan.kv.used_bytes <= plan.kv_bytes);
                prop_assert!(plan.bar().chars().count() == 62);
            }
        }
    }
}
