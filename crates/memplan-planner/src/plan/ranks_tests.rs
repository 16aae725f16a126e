//! Combining rank plans and reading plans back from JSON.

use memplan_core::bytes::GIB;
use memplan_core::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan_core::{Error, Param};

use super::*;
use crate::budget::Request;
use crate::plan::{combine_json, Consumer, PlanBuilder, MAX_PLAN_JSON_BYTES};

fn spec(layers: u32) -> KvSpec {
    KvSpec::new(
        vec![LayerGroup::new(AttentionKind::Full, layers, 8, 128)],
        KvDtype::Bf16,
        16,
    )
}

/// One rank's plan: `weights` on a 24 GiB device, `layers` attention layers in its stage.
pub(crate) fn rank_plan(rank: Rank, weights: u64, layers: u32) -> Plan {
    PlanBuilder::new(
        24 * GIB,
        Request::Utilization(0.9),
        spec(layers),
        KvLimits::new(4096, 2048),
    )
    .consumer(Consumer::measured(
        ConsumerKind::Weights,
        weights,
        "load_weights",
        "test",
    ))
    .rank(rank)
    .device(format!("sim:rtx4090 #{}", rank.global()))
    .build()
    .unwrap()
}

fn tp(r: u64, n: u64) -> Rank {
    Rank::new(r, n).unwrap()
}

fn param(e: &Error) -> Option<Param> {
    match e.root() {
        Error::InvalidParam { param, .. } => Some(*param),
        _ => None,
    }
}

#[test]
fn equal_ranks_name_no_limiting_rank() {
    let p = combine_ranks(vec![
        rank_plan(tp(1, 2), 4 * GIB, 32),
        rank_plan(tp(0, 2), 4 * GIB, 32),
    ])
    .unwrap();
    let r = p.ranks.as_ref().unwrap();
    assert_eq!((r.count, r.limiting, r.tensor_parallel_size), (2, None, 2));
    assert_eq!(p.tensor_parallel_size, 2);
    assert_eq!(r.num_blocks, p.kv.num_blocks);
    // By global rank, whatever order they came in.
    assert_eq!(r.per_rank[0].rank, tp(0, 2));
    assert!(!p
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::LimitingRank { .. })));
    assert!(
        p.notes.last().unwrap().contains("the same"),
        "{:?}",
        p.notes
    );
}

#[test]
fn the_fewest_blocks_win_and_the_limiting_rank_is_named() {
    let plans = vec![
        rank_plan(tp(0, 4), 4 * GIB, 32),
        rank_plan(tp(1, 4), 4 * GIB, 32),
        rank_plan(tp(2, 4), 9 * GIB, 32), // another process holds memory on this GPU
        rank_plan(tp(3, 4), 4 * GIB, 32),
    ];
    let fewest = plans[2].kv.num_blocks;
    let p = combine_ranks(plans).unwrap();
    let r = p.ranks.as_ref().unwrap();
    assert_eq!((r.num_blocks, r.limiting), (fewest, Some(2)));
    assert_eq!(p.rank, Some(tp(2, 4)));
    assert!(r
        .per_rank
        .iter()
        .all(|x| x.mapped_bytes == fewest * x.block_bytes));
    assert!(matches!(
        p.warnings.last(),
        Some(Warning::LimitingRank { rank: 2, ranks: 4, device }) if device.ends_with("#2")
    ));
}

#[test]
fn pipeline_stages_map_the_fewest_blocks_in_their_own_layout() {
    let s = |stage, layers, weights| {
        rank_plan(
            Rank::new(0, 1).unwrap().with_stage(stage, 2).unwrap(),
            weights,
            layers,
        )
    };
    // Stage 0 holds more layers (larger blocks) and the embeddings.
    let plans = vec![s(0, 17, 6 * GIB), s(1, 15, 5 * GIB)];
    let (b0, b1) = (plans[0].kv.block_bytes, plans[1].kv.block_bytes);
    assert_ne!(b0, b1);
    let fewest = plans.iter().map(|p| p.kv.num_blocks).min().unwrap();
    let p = combine_ranks(plans).unwrap();
    let r = p.ranks.as_ref().unwrap();
    assert_eq!((p.pipeline_parallel_size, r.num_blocks), (2, fewest));
    assert_eq!(r.per_rank[0].mapped_bytes, fewest * b0);
    assert_eq!(r.per_rank[1].mapped_bytes, fewest * b1);
}

#[test]
fn plans_that_are_not_one_deployment_are_refused() {
    let a = || rank_plan(tp(0, 2), 4 * GIB, 32);
    // The same rank twice.
    let e = combine_ranks(vec![a(), a()]).unwrap_err();
    assert_eq!(param(&e), Some(Param::Ranks), "{e}");
    assert!(e.to_string().contains("both"), "{e}");
    // Different deployments.
    let e = combine_ranks(vec![a(), rank_plan(tp(1, 4), 4 * GIB, 32)]).unwrap_err();
    assert!(e.to_string().contains("different deployments"), "{e}");
    // A stage without a plan.
    let stage = |s| Rank::new(0, 1).unwrap().with_stage(s, 3).unwrap();
    let e = combine_ranks(vec![
        rank_plan(stage(0), GIB, 10),
        rank_plan(stage(2), GIB, 10),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("stage 1"), "{e}");
    // Another KV layout within one stage.
    let e = combine_ranks(vec![a(), rank_plan(tp(1, 2), 4 * GIB, 31)]).unwrap_err();
    assert!(e.to_string().contains("layout"), "{e}");
    // Another block size.
    let mut other = rank_plan(tp(1, 2), 4 * GIB, 32);
    other.kv_spec.block_size = 32;
    let e = combine_ranks(vec![a(), other]).unwrap_err();
    assert_eq!(param(&e), Some(Param::BlockSize), "{e}");
    // Mixed: with and without ranks.
    let mut anon = rank_plan(tp(1, 2), 4 * GIB, 32);
    anon.rank = None;
    assert!(combine_ranks(vec![a(), anon]).is_err());
    // Already combined.
    let c = combine_ranks(vec![a(), rank_plan(tp(1, 2), 4 * GIB, 32)]).unwrap();
    let e = combine_ranks(vec![c]).unwrap_err();
    assert!(e.to_string().contains("already combined"), "{e}");
    assert!(combine_ranks(Vec::new()).is_err());
}

#[test]
fn a_combination_covers_every_rank_once() {
    // Rank 0 of two alone: rank 1 might have fewer blocks and could not map the plan.
    let e = combine_ranks(vec![rank_plan(tp(0, 2), 4 * GIB, 32)]).unwrap_err();
    assert_eq!(param(&e), Some(Param::Ranks), "{e}");
    assert!(e.to_string().contains("no plan of rank 1 of 2"), "{e}");
    // Ranks 0 and 2 of four: 1 and 3 are named.
    let e = combine_ranks(vec![
        rank_plan(tp(0, 4), 4 * GIB, 32),
        rank_plan(tp(2, 4), 4 * GIB, 32),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("rank 1 of 4, rank 3 of 4")
            && e.contains("plans of 2 of the deployment's 4 ranks"),
        "{e}"
    );
    // A stage's tensor-parallel rank left out.
    let r = |t, s| Rank::new(t, 2).unwrap().with_stage(s, 2).unwrap();
    let e = combine_ranks(vec![
        rank_plan(r(0, 0), GIB, 16),
        rank_plan(r(1, 0), GIB, 16),
        rank_plan(r(0, 1), GIB, 16),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("rank 3 of 4 (tensor 1 of 2, stage 1 of 2)"),
        "{e}"
    );
    // Plans without ranks of a larger deployment than there are plans.
    let anon = |n| {
        let mut p = rank_plan(tp(0, n), 4 * GIB, 32);
        p.rank = None;
        p
    };
    let e = combine_ranks(vec![anon(4), anon(4)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 2 of 4, rank 3 of 4"), "{e}");
    // ... or more plans than it has ranks.
    let e = combine_ranks(vec![anon(2), anon(2), anon(2)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 plans without ranks"), "{e}");
    // One rank of a million: a short message that says how many are missing.
    let e = combine_ranks(vec![rank_plan(tp(0, 1 << 20), GIB, 32)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("(1048575 in all)") && e.len() < 600, "{e}");
}

#[test]
fn plans_that_cannot_be_one_deployment_name_the_field() {
    let named = |r| {
        let mut p = rank_plan(r, 4 * GIB, 32);
        p.model = Some("org/model".into());
        p.engine = Some("vllm@0.34".into());
        p
    };
    let a = || named(tp(0, 2));
    let b = || named(tp(1, 2));
    let refused = |other: Plan, key: &str| {
        let e = combine_ranks(vec![a(), other]).unwrap_err();
        assert_eq!(param(&e), Some(Param::Ranks), "{key}: {e}");
        assert!(
            e.to_string().contains(&format!("`{key}` differs")),
            "{key}: {e}"
        );
    };
    let mut other = b();
    other.model = Some("another/model".into());
    refused(other, "model");
    let mut other = b();
    other.engine = Some("vllm@0.19".into());
    refused(other, "engine");
    let mut other = b();
    other.sizing_rules.in_flight_batches += 1;
    refused(other, "sizing_rules");
    let mut other = b();
    other.kv_spec.dtype = KvDtype::Fp8E4m3;
    refused(other, "kv_spec.dtype");
    let mut other = b();
    other.limits.max_model_len /= 2;
    refused(other, "limits.max_model_len");
    let mut other = b();
    other.request = Request::Bytes(20 * GIB);
    refused(other, "request.kind");
    // A fixed KV cache is one engine flag for every rank.
    let fixed = |r, bytes| {
        let mut p = rank_plan(r, 4 * GIB, 32);
        p.request = Request::KvCacheBytes(bytes);
        p
    };
    let e = combine_ranks(vec![fixed(tp(0, 2), 8 * GIB), fixed(tp(1, 2), 9 * GIB)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`request.value` differs"), "{e}");
    assert!(combine_ranks(vec![fixed(tp(0, 2), 8 * GIB), fixed(tp(1, 2), 8 * GIB)]).is_ok());
    // A utilisation may differ (vllm@0.34's default is each device's own free share), and the
    // batch limits (a dry run's defaults are its own device's); a model or engine release a
    // plan does not name is no contradiction.
    let mut other = rank_plan(tp(1, 2), 4 * GIB, 32);
    other.request = Request::Utilization(0.8);
    other.max_num_seqs = Some(1024);
    other.limits.max_num_batched_tokens *= 2;
    assert!(combine_ranks(vec![a(), other]).is_ok());
}

#[test]
fn plans_without_ranks_combine_as_tensor_parallel_ranks() {
    let anon = |w| {
        let mut p = rank_plan(tp(0, 1), w, 32);
        p.rank = None;
        p
    };
    let p = combine_ranks(vec![anon(4 * GIB), anon(6 * GIB)]).unwrap();
    let r = p.ranks.unwrap();
    assert_eq!((r.tensor_parallel_size, r.limiting), (2, Some(1)));
    // One dry run standing for every rank of its deployment is the deployment's plan.
    let mut whole = anon(4 * GIB);
    whole.tensor_parallel_size = 4;
    whole.pipeline_parallel_size = 2;
    assert_eq!(combine_ranks(vec![whole.clone()]).unwrap(), whole);
}

#[test]
fn plans_round_trip_through_their_json() {
    let one = rank_plan(tp(1, 2), 4 * GIB, 32);
    assert_eq!(Plan::from_json(&one.to_json()).unwrap(), one);
    let texts = [rank_plan(tp(0, 2), 5 * GIB, 32).to_json(), one.to_json()];
    let c = combine_json(&texts).unwrap();
    assert_eq!(c.ranks.as_ref().unwrap().limiting, Some(0));
    let back = Plan::from_json(&c.to_json()).unwrap();
    assert_eq!(back, c);
}

/// A plan whose text holds a `NaN` or `Infinity` literal (Python's `json.dumps` writes them) is
/// refused naming the key it is at and saying what the literal is, through a combine too.
#[test]
fn a_non_finite_literal_in_a_plan_names_its_key() {
    let p = rank_plan(tp(0, 2), 4 * GIB, 32);
    let mut v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    const MARK: u64 = 987_654_321_987;
    v["kv"]["num_blocks"] = MARK.into();
    for literal in ["NaN", "Infinity", "-Infinity"] {
        let text = v.to_string().replace(&MARK.to_string(), literal);
        let e = Plan::from_json(&text).unwrap_err().to_string();
        assert!(
            e.contains("kv.num_blocks")
                && e.contains("NaN and infinity are not valid JSON numbers")
                && e.contains(&format!("`{literal}`")),
            "{literal}: {e}"
        );
        let other = rank_plan(tp(1, 2), 4 * GIB, 32).to_json();
        let e = combine_json(&[other, text]).unwrap_err().to_string();
        assert!(
            e.contains("plan 1") && e.contains("kv.num_blocks") && e.contains("NaN"),
            "{literal}: {e}"
        );
    }
}

#[test]
fn another_version_or_a_tampered_plan_is_refused() {
    let p = rank_plan(tp(0, 1), 4 * GIB, 32);
    let mut v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    let read = |v: &serde_json::Value| Plan::from_json(&v.to_string());

    v["schema"] = "memplan.plan/2".into();
    let e = read(&v).unwrap_err().to_string();
    assert!(
        e.contains("version 2") && e.contains("memplan.plan/1"),
        "{e}"
    );
    v["schema"] = "memplan.probe/1".into();
    assert!(read(&v)
        .unwrap_err()
        .to_string()
        .contains("not a memplan plan"));
    v["schema"] = "memplan.plan/1".into();
    assert!(read(&v).is_ok());

    let mut t = v.clone();
    t["kv_cache_tokens"] = (p.kv_cache_tokens + 1).into();
    assert!(read(&t)
        .unwrap_err()
        .to_string()
        .contains("kv_cache_tokens"));
    let mut t = v.clone();
    t["kv"]["num_blocks"] = (p.kv.num_blocks * 2).into();
    assert!(read(&t).unwrap_err().to_string().contains("num_blocks"));
    let mut t = v.clone();
    t["rank"]["tensor_parallel_rank"] = 3.into();
    assert!(read(&t).is_err());
    let mut t = v.clone();
    t["total_bytes"] = "24 GiB".into();
    assert!(read(&t).is_err());
    // A value of the wrong type is named by its key path.
    for (path, value) in [
        (&["total_bytes"][..], serde_json::json!(-1)),
        (&["kv", "num_blocks"][..], serde_json::json!(1.5)),
        (&["rank", "tensor_parallel_rank"][..], serde_json::json!(-1)),
        (&["kv_spec", "block_size"][..], serde_json::json!("16")),
    ] {
        let mut t = v.clone();
        let mut at = &mut t;
        for k in path {
            at = &mut at[*k];
        }
        *at = value;
        let e = read(&t).expect_err(&path.join(".")).to_string();
        assert!(e.contains(&format!("{}: ", path.join("."))), "{e}");
    }
    let mut t = v.clone();
    t["consumers"][0]["bytes"] = (-5).into();
    let e = read(&t).unwrap_err().to_string();
    assert!(e.contains("consumers[0].bytes: "), "{e}");
    // The request passes the same checks as when it was made: a utilisation in (0, 1], a
    // byte budget or KV size above 0.
    for (kind, value) in [
        ("utilization", serde_json::json!(2.0)),
        ("utilization", serde_json::json!(-1.0)),
        ("utilization", serde_json::json!(0.0)),
        ("utilization", serde_json::json!(1.0000001)),
        ("bytes", serde_json::json!(0)),
        ("kv_cache_bytes", serde_json::json!(0)),
    ] {
        let mut t = v.clone();
        t["request"] = serde_json::json!({"kind": kind, "value": value});
        let e = read(&t).expect_err(&format!("{kind} {value}")).to_string();
        assert!(e.contains("request"), "{kind} {value}: {e}");
    }
    // A key a newer memplan of the same version added is ignored.
    let mut t = v.clone();
    t["from_the_future"] = 1.into();
    assert!(read(&t).is_ok());

    assert!(Plan::from_json("{")
        .unwrap_err()
        .to_string()
        .contains("not valid JSON"));
    assert!(Plan::from_json("{}")
        .unwrap_err()
        .to_string()
        .contains("schema"));
    let huge = " ".repeat(MAX_PLAN_JSON_BYTES + 1);
    assert!(Plan::from_json(&huge)
        .unwrap_err()
        .to_string()
        .contains("beyond"));
    for e in [read(&t).map(drop), Plan::from_json("[]").map(drop)] {
        if let Err(e) = e {
            assert!(
                matches!(e, Error::InvalidInput { ref field, .. } if field == "plan"),
                "{e}"
            );
        }
    }
}

#[test]
fn a_tampered_combination_is_refused() {
    let c = combine_ranks(vec![
        rank_plan(tp(0, 2), 4 * GIB, 32),
        rank_plan(tp(1, 2), 6 * GIB, 32),
    ])
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
    let read = |v: &serde_json::Value| Plan::from_json(&v.to_string());
    let mut t = v.clone();
    t["ranks"]["limiting"] = serde_json::Value::Null;
    assert!(read(&t).unwrap_err().to_string().contains("limiting"));
    let mut t = v.clone();
    t["ranks"]["per_rank"][0]["mapped_bytes"] = 1.into();
    assert!(read(&t).is_err());
    let mut t = v.clone();
    t["ranks"]["per_rank"][1]["rank"]["tensor_parallel_rank"] = 0.into();
    assert!(read(&t).unwrap_err().to_string().contains("twice"));
    let mut t = v;
    t["ranks"]["count"] = 3.into();
    assert!(read(&t).is_err());
}

#[test]
fn a_combination_read_back_holds_every_rank() {
    let c = combine_ranks(vec![
        rank_plan(tp(0, 2), 4 * GIB, 32),
        rank_plan(tp(1, 2), 6 * GIB, 32),
    ])
    .unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
    // Rank 1 limits; drop rank 0's figures.
    let per_rank = v["ranks"]["per_rank"].as_array_mut().unwrap();
    per_rank.remove(0);
    v["ranks"]["count"] = 1.into();
    v["ranks"]["limiting"] = serde_json::Value::Null;
    let e = Plan::from_json(&v.to_string()).unwrap_err().to_string();
    assert!(e.contains("no figures of rank 0 of 2"), "{e}");
}

#[test]
fn the_kv_figures_are_the_sizing_of_the_kv_cache_granted() {
    let p = rank_plan(tp(0, 1), 4 * GIB, 32);
    let v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    let read = |v: &serde_json::Value| Plan::from_json(&v.to_string());
    assert_eq!(read(&v).unwrap(), p);
    let k = &p.kv;
    for (key, value) in [
        ("page_bytes", serde_json::json!(1u64 << 63)),
        ("page_bytes", serde_json::json!(k.page_bytes * 2)),
        ("usable_blocks", serde_json::json!(1u64 << 63)),
        ("usable_blocks", serde_json::json!(k.num_blocks)),
        ("group_size", serde_json::json!(k.group_size + 1)),
        ("num_groups", serde_json::json!(2)),
        ("block_size", serde_json::json!(k.block_size * 2)),
        ("blocks_per_request", serde_json::json!(1)),
        ("max_model_len_fit", serde_json::Value::Null),
    ] {
        let mut t = v.clone();
        t["kv"][key] = value.clone();
        let e = read(&t).expect_err(&format!("{key} {value}")).to_string();
        assert!(e.contains(&format!("kv.{key} ")), "{key} {value}: {e}");
    }
    // Blocks, bytes and tokens changed together still are not what the KV cache granted holds.
    let mut t = v.clone();
    t["kv"]["num_blocks"] = (k.num_blocks - 1).into();
    t["kv"]["usable_blocks"] = (k.usable_blocks - 1).into();
    t["kv"]["used_bytes"] = ((k.num_blocks - 1) * k.block_bytes).into();
    let e = read(&t).unwrap_err().to_string();
    assert!(e.contains("kv.num_blocks "), "{e}");
    // The budget: requested within the total, the consumers plus the KV budget.
    let mut t = v.clone();
    t["total_bytes"] = 5.into();
    let e = read(&t).unwrap_err().to_string();
    assert!(
        e.contains("requested_bytes") && e.contains("total_bytes 5"),
        "{e}"
    );
    let mut t = v.clone();
    t["consumers"][0]["bytes"] = (p.consumers.bytes(ConsumerKind::Weights) / 2).into();
    let e = read(&t).unwrap_err().to_string();
    assert!(e.contains("kv_budget_bytes"), "{e}");
    let mut t = v.clone();
    t["request"] = serde_json::json!({"kind": "bytes", "value": p.requested_bytes + 1});
    let e = read(&t).unwrap_err().to_string();
    assert!(e.contains("the request asks for"), "{e}");
    // A spec the sizing refuses is named.
    let mut t = v.clone();
    t["kv_spec"]["groups"] = serde_json::json!([]);
    let e = read(&t).unwrap_err().to_string();
    assert!(e.contains("kv_spec"), "{e}");
}

/// Every plan this crate writes is valid under `docs/schemas/plan.schema.json`, the schema
/// other languages read it with.
#[test]
fn plans_match_the_published_schema() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/schemas/plan.schema.json"
    );
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let single = rank_plan(tp(0, 1), 4 * GIB, 32);
    let combined = combine_ranks(vec![
        rank_plan(tp(0, 2), 4 * GIB, 32),
        rank_plan(tp(1, 2), 6 * GIB, 32),
    ])
    .unwrap();
    for p in [single, combined] {
        let j: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        let errors: Vec<String> = v.iter_errors(&j).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:#?}");
    }
}
