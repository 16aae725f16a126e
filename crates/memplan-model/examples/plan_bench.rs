//! Benchmark: plan from a generated 100-shard safetensors checkpoint on disk (headers only
//! are read; the data sections are sparse files). Run with
//! `cargo run --release -p memplan-model --example plan_bench`; prints the median of 50
//! plans (model load with every shard header + the dry run). Not a timed test: CI only
//! builds it.

use std::io::Write;
use std::time::Instant;

use memplan_core::bytes::GIB;
use memplan_model::dryrun::DryRun;
use memplan_model::Model;

const SHARDS: usize = 100;

fn main() {
    // Tensors per shard: `TENSORS=300` for a DeepSeek-sized checkpoint (30,000 tensors); the
    // default 8 is a 70B-class checkpoint spread over 100 shards (800 tensors).
    let per_shard: usize = std::env::var("TENSORS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let dir = std::env::temp_dir().join(format!("memplan-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":8192,"num_hidden_layers":80,
        "num_attention_heads":64,"num_key_value_heads":8,"intermediate_size":28672,
        "vocab_size":128256,"max_position_embeddings":131072,"torch_dtype":"bfloat16"}"#,
    )
    .unwrap();
    let mut weight_map = serde_json::Map::new();
    for s in 0..SHARDS {
        let file = format!("model-{:05}-of-{SHARDS:05}.safetensors", s + 1);
        let mut header = serde_json::Map::new();
        let mut off = 0u64;
        for t in 0..per_shard {
            let name = format!("model.layers.{s}.t{t}.weight");
            let bytes = 4096 * 1024 * 2;
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": "BF16", "shape": [4096, 1024], "data_offsets": [off, off + bytes]}),
            );
            off += bytes;
            weight_map.insert(name, serde_json::json!(file));
        }
        let h = serde_json::to_vec(&header).unwrap();
        let mut f = std::fs::File::create(dir.join(&file)).unwrap();
        f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
        f.write_all(&h).unwrap();
        // Sparse data section: the reader checks the length, never reads it.
        f.set_len(8 + h.len() as u64 + off).unwrap();
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec(&serde_json::json!({"metadata": {}, "weight_map": weight_map})).unwrap(),
    )
    .unwrap();
    let mut times = Vec::new();
    let mut tokens = 0;
    for _ in 0..50 {
        let t0 = Instant::now();
        let model = Model::load(dir.to_str().unwrap()).unwrap();
        let plan = DryRun::new(model, 80 * GIB)
            .tensor_parallel(8)
            .max_model_len(Some(8192))
            .device_name("H100")
            .plan();
        times.push(t0.elapsed());
        if let Ok(p) = plan {
            tokens = p.kv.tokens;
        }
    }
    times.sort();
    println!(
        "plan from a {SHARDS}-shard checkpoint ({} tensors): median {:.2} ms, min {:.2} ms, max {:.2} ms over {} runs ({tokens} KV tokens)",
        SHARDS * per_shard,
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        times.len()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
