//! Engine start-up log text through the `--from-log` reader: no panic, and every figure it
//! returns lies in the range of the flag it stands for (`memplan_model::limits`).

use memplan_model::{fromlog, limits};

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(f) = fromlog::parse(&text) else {
        return;
    };
    let bytes = [
        ("total", f.total),
        ("free", f.free),
        ("weights", f.weights),
        ("activation", f.activation),
        ("non_torch", f.non_torch),
        ("consumed", f.consumed),
        ("non_kv", f.non_kv),
        ("graph_estimate", f.graph_estimate),
        ("graph_actual", f.graph_actual),
        ("kv_available", f.kv_available),
        ("kv_final", f.kv_final),
    ];
    for (name, b) in bytes {
        if let Some(b) = b {
            assert!(b <= limits::MAX_BYTES, "{name} = {b} past the byte cap");
        }
    }
    for (name, u) in [
        ("utilization", f.utilization),
        ("utilization_without_graphs", f.utilization_without_graphs),
    ] {
        if let Some(u) = u {
            assert!(limits::check_fraction(u).is_ok(), "{name} = {u}");
        }
    }
    let counts = [
        ("max_model_len", f.max_model_len, limits::MAX_MODEL_LEN),
        ("max_num_seqs", f.max_num_seqs, limits::MAX_NUM_SEQS),
        (
            "max_num_batched_tokens",
            f.max_num_batched_tokens,
            limits::MAX_BATCHED_TOKENS,
        ),
        ("tensor_parallel", f.tensor_parallel, limits::MAX_TP),
        (
            "block_size",
            f.block_size.map(u64::from),
            u64::from(limits::MAX_BLOCK),
        ),
        ("kv_tokens", f.kv_tokens, limits::MAX_KV_TOKENS),
        ("kv_blocks", f.kv_blocks, limits::MAX_KV_TOKENS),
    ];
    for (name, n, max) in counts {
        if let Some(n) = n {
            assert!((1..=max).contains(&n), "{name} = {n} outside 1..={max}");
        }
    }
    if let Some(c) = f.max_concurrency {
        assert!(c.is_finite() && c >= 0.0, "max_concurrency = {c}");
    }
}
