//! GGUF bytes through the reader, the config it implies and the llama.cpp fit: no panic,
//! the weights it reports lie inside the file, and every answer of the fit stays within its
//! budget (no overflow, whatever the head counts and key lengths).

use memplan_model::gguf;
use memplan_model::ModelConfig;

pub fn run(data: &[u8]) {
    let Ok(info) = gguf::read_bytes("fuzz.gguf", data) else {
        return;
    };
    let weights = info
        .layer_bytes
        .iter()
        .fold(info.output_bytes, |a, b| a.saturating_add(*b))
        .saturating_add(info.other_bytes);
    assert!(
        weights <= data.len() as u64,
        "{weights} bytes of tensors in a file of {}",
        data.len()
    );
    let Ok(config) = ModelConfig::from_value(&info.config_json()) else {
        return;
    };
    for kv in ["f16", "q8_0", "q4_0"] {
        for budget in [0, 1 << 30, u64::MAX] {
            for ctx in [1, 4096, u64::MAX] {
                let f = gguf::fit(&info, &config, budget, 0, kv, ctx).expect("a known KV type");
                assert!(
                    f.weight_bytes.saturating_add(f.kv_bytes) <= budget,
                    "{f:?} over a budget of {budget}"
                );
            }
        }
    }
}
