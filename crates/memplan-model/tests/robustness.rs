//! The readers never panic: every shipped config and a safetensors header are mutated (bytes
//! flipped, cut, duplicated; every numeric key set to absurd values) and fed to the readers and
//! everything downstream of them. A result is either an error or a config whose KV spec,
//! weights and estimates compute. The same inputs drive the cargo-fuzz targets in `fuzz/`.

use memplan_core::kv::{KvDtype, KvLimits};
use memplan_model::estimate::{self, EngineShape};
use memplan_model::{safetensors, weights, ModelConfig};
use serde_json::Value;

const PRESETS: &str = include_str!("../models/model-configs.jsonl");

/// xorshift64*: deterministic, no dependency.
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

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(v.len());
        match rng.below(5) {
            0 => v[i] = rng.next() as u8,
            1 => v.truncate(i),
            2 => v.insert(i, b"0123456789-.e\"{}[],:"[rng.below(20)]),
            3 if !v.is_empty() => {
                v.remove(i.min(v.len() - 1));
            }
            _ => {
                let j = rng.below(v.len());
                let chunk: Vec<u8> = v[i.min(j)..i.max(j)].to_vec();
                v.splice(i..i, chunk);
            }
        }
        if v.is_empty() {
            break;
        }
    }
    v
}

/// Everything downstream of a parsed config; must not panic.
fn exercise(c: &ModelConfig) {
    assert!(c.num_layers > 0 && c.hidden_size > 0);
    for tp in [1, 2, 3, 8] {
        if let Ok(spec) = c.kv_spec(KvDtype::Fp8E4m3, 16, tp) {
            let limits = KvLimits::new(4096, 2048).with_max_len_limit(1 << 20);
            let _ = spec.size(1 << 34, &limits);
        }
        let _ = weights::weight_bytes(c, tp, 2, c.quantization.as_ref());
        let shape = EngineShape::new(256, 8192).with_tensor_parallel(tp);
        let _ = estimate::activation(c, &shape);
        let _ = estimate::graph(c, &shape);
    }
}

fn configs() -> Vec<Value> {
    PRESETS
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| v["config"].clone())
        .collect()
}

#[test]
fn mutated_config_bytes_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut parsed = 0;
    for cfg in configs() {
        let text = cfg.to_string();
        for _ in 0..300 {
            let m = mutate(&mut rng, text.as_bytes());
            if let Ok(c) = ModelConfig::from_json_str(&String::from_utf8_lossy(&m)) {
                exercise(&c);
                parsed += 1;
            }
        }
    }
    assert!(parsed > 0, "some mutations keep the config valid");
}

#[test]
fn absurd_values_are_errors_not_panics() {
    let absurd = [
        Value::from(0),
        Value::from(-1),
        Value::from(1e30),
        Value::from(u64::MAX),
        Value::from(1u64 << 39),
        Value::from("x"),
        Value::Null,
        Value::from(vec![1]),
    ];
    for cfg in configs() {
        let obj = cfg.as_object().expect("configs are objects");
        for key in obj.keys() {
            for bad in &absurd {
                let mut m = cfg.clone();
                m[key] = bad.clone();
                if let Some(Value::Object(_)) = m.get("text_config") {
                    let mut t = cfg.clone();
                    if t["text_config"].get(key).is_some() || key == "text_config" {
                        t["text_config"][key] = bad.clone();
                        if let Ok(c) = ModelConfig::from_value(&t) {
                            exercise(&c);
                        }
                    }
                }
                match ModelConfig::from_value(&m) {
                    Ok(c) => exercise(&c),
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
        }
    }
}

#[test]
fn mutated_safetensors_headers_never_panic() {
    let json = br#"{"__metadata__":{"format":"pt"},"model.embed_tokens.weight":{"dtype":"BF16","shape":[16,8],"data_offsets":[0,256]},"model.norm.weight":{"dtype":"F32","shape":[8],"data_offsets":[256,288]}}"#;
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json);
    assert_eq!(
        safetensors::parse_prefixed("m.safetensors", &file)
            .expect("valid header")
            .total(),
        288
    );
    let mut rng = Rng(42);
    for _ in 0..5000 {
        let m = mutate(&mut rng, &file);
        if let Ok(s) = safetensors::parse_prefixed("m.safetensors", &m) {
            assert!(s.per_rank(2) <= s.total());
        }
    }
}
