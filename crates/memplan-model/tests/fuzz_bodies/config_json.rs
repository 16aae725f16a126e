//! `config.json` text through the config reader and everything downstream: the KV spec and
//! its sizing, weights, estimates. Any panic is a bug; errors are fine.

use memplan_core::kv::{KvDtype, KvLimits};
use memplan_model::estimate::{self, EngineShape};
use memplan_model::{weights, ModelConfig};

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(c) = ModelConfig::from_json_str(text) else {
        return;
    };
    for tp in [1, 2, 8] {
        if let Ok(spec) = c.kv_spec(KvDtype::Int8, 16, tp) {
            let limits = KvLimits::new(8192, 2048).with_max_len_limit(1 << 20);
            let _ = spec.size(1 << 36, &limits);
        }
        let _ = weights::weight_bytes(&c, tp, 2, c.quantization.as_ref());
        let shape = EngineShape::new(256, 8192).with_tensor_parallel(tp);
        let _ = estimate::activation(&c, &shape);
        let _ = estimate::graph(&c, &shape);
    }
}
