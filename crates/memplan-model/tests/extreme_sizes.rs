//! Arithmetic that cannot wrap: every shipped config with each dimension set to the largest
//! values the config reader accepts (just under 2^40, powers of two, primes), planned through
//! the whole dry run with every other memory user a flag can add (tensor and pipeline
//! parallelism, a draft model, LoRA slots, CPU offload, every KV dtype, the longest lengths
//! the flags take). The result is a plan or an error, never an overflow: tests run with
//! overflow checks, so a product that would wrap panics here.

use std::panic::{catch_unwind, AssertUnwindSafe};

use memplan_core::kv::KvDtype;
use memplan_model::consumers::Extras;
use memplan_model::dryrun::DryRun;
use memplan_model::{presets, ModelConfig};
use serde_json::Value;

const PRESETS: &str = include_str!("../models/model-configs.jsonl");

/// Values a dimension takes: the largest accepted, large powers of two, odd primes.
const EXTREME: &[u64] = &[
    (1 << 40) - 1,
    1 << 39,
    1 << 32,
    (1 << 32) - 1,
    1 << 31,
    1 << 24,
    1 << 20,
    65_521,
    4_294_967_291,
    1,
];

/// Keys of dimensions in configs (nested sections are set too).
const KEYS: &[&str] = &[
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "sliding_window",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_value_heads",
    "mamba_d_state",
    "mamba_n_heads",
    "mamba_d_head",
    "ssm_state_size",
    "patch_size",
];

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn set(v: &mut Value, key: &str, x: u64) {
    match v {
        Value::Object(m) => {
            if let Some(slot) = m.get_mut(key) {
                if slot.is_number() {
                    *slot = Value::from(x);
                }
            }
            for (_, inner) in m.iter_mut() {
                set(inner, key, x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|i| set(i, key, x)),
        _ => {}
    }
}

/// Plan `c` six ways; how many planned (the rest were refused with an error).
fn plan_all_ways(c: &ModelConfig, r: &mut Rng) -> Result<usize, String> {
    let Ok(m) = memplan_model::Model::load("qwen2.5-0.5b-instruct") else {
        return Err("preset".into());
    };
    let mut m = m;
    m.config = c.clone();
    let draft = presets::find("qwen2.5-0.5b-instruct").unwrap().config;
    let mut planned = 0;
    for _ in 0..6 {
        let mut e = Extras::default();
        if r.below(2) == 0 {
            e = e.with_draft(
                if r.below(2) == 0 {
                    draft.clone()
                } else {
                    c.clone()
                },
                1 + r.below(1024) as u64,
            );
        }
        if r.below(2) == 0 {
            e = e.with_lora(1 + r.below(1024) as u64, [1, 16, 512][r.below(3)]);
        }
        e = e
            .with_cpu_offload([0, 1 << 30, 1 << 50][r.below(3)])
            .with_pipeline_parallel([1, 1, 1, 2, 3, 1024][r.below(6)]);
        let total = [1u64 << 30, 80 << 30, 1 << 50][r.below(3)];
        let d = DryRun::new(m.clone(), total)
            .tensor_parallel([1, 1, 1, 2, 8, 1024][r.below(6)])
            .kv_cache_dtype(
                [
                    None,
                    Some(KvDtype::Fp8E4m3),
                    Some(KvDtype::F32),
                    Some(KvDtype::Int8),
                ][r.below(4)],
            )
            .max_model_len([None, Some(1), Some(1 << 30)][r.below(3)])
            .max_num_seqs([None, Some(1), Some(1 << 20)][r.below(3)])
            .max_num_batched_tokens([None, Some(1), Some(1 << 30)][r.below(3)])
            .block_size([None, Some(1), Some(4096)][r.below(3)])
            .capture_sizes((r.below(2) == 0).then(|| vec![1, 1 << 20]))
            .extras(e);
        planned +=
            catch_unwind(AssertUnwindSafe(move || usize::from(d.plan().is_ok()))).map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })?;
    }
    Ok(planned)
}

#[test]
fn extreme_dimensions_plan_or_fail_but_never_overflow() {
    let configs: Vec<Value> = PRESETS
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| v["config"].clone())
        .collect();
    // `MEMPLAN_FUZZ_SEED` picks another deterministic run.
    let seed = std::env::var("MEMPLAN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x005E_ED0F_E0E0_u64);
    let mut r = Rng(seed | 1);
    let mut failures = Vec::new();
    let (mut parsed, mut planned) = (0, 0);
    for cfg in &configs {
        for _ in 0..40 {
            let mut v = cfg.clone();
            for _ in 0..1 + r.below(3) {
                set(
                    &mut v,
                    KEYS[r.below(KEYS.len())],
                    EXTREME[r.below(EXTREME.len())],
                );
            }
            let c = match catch_unwind(|| ModelConfig::from_value(&v)) {
                Ok(Ok(c)) => c,
                Ok(Err(_)) => continue,
                Err(_) => {
                    failures.push(format!("config reader panicked on {v}"));
                    continue;
                }
            };
            parsed += 1;
            match plan_all_ways(&c, &mut r) {
                Ok(n) => planned += n,
                Err(p) => failures.push(format!("{p}\n  on {v}")),
            }
        }
    }
    // Not vacuous: hundreds of extreme configs parse and plan.
    assert!(
        parsed > 200 && planned > 200,
        "{parsed} parsed, {planned} planned"
    );
    assert!(
        failures.is_empty(),
        "{} overflow(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
