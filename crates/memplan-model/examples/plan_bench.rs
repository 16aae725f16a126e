//! Benchmark: plan from a generated sharded safetensors checkpoint on disk, the way
//! `memplan plan --model DIR` does (the index, every shard's header, the dry run; the data
//! sections are sparse files, never read). Not a timed test: CI only builds it.
//!
//! Run with `cargo run --release -p memplan-model --example plan_bench [-- SIZE...]`, SIZE
//! one of `1k`, `10k`, `100k` (that many tensors) and `deepseek-v3` (DeepSeek-V3's layout:
//! 163 shards, 91,991 tensors, fp8 weights each beside its f32 `weight_scale_inv`, MLA and 256
//! routed experts); all four by default. Prints, per size, the median, minimum and maximum of
//! `RUNS` (default 20) plans, the time per tensor (a reader that grows linearly with the
//! tensor count keeps that figure flat from 1k to 100k) and, on Linux, the CPU time per plan
//! (all threads, from `/proc/self/stat`; on a shared machine the wall time also counts the
//! time other processes held the cores).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use memplan_core::bytes::GIB;
use memplan_model::dryrun::DryRun;
use memplan_model::Model;

/// DeepSeek-V3's `config.json` (the keys memplan reads).
const DEEPSEEK_V3: &str = r#"{"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3",
"hidden_size":7168,"num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,
"kv_lora_rank":512,"q_lora_rank":1536,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,
"intermediate_size":18432,"moe_intermediate_size":2048,"n_routed_experts":256,"n_shared_experts":1,
"num_experts_per_tok":8,"first_k_dense_replace":3,"vocab_size":129280,"max_position_embeddings":163840,
"rope_scaling":{"type":"yarn","factor":40,"original_max_position_embeddings":4096},"torch_dtype":"bfloat16",
"quantization_config":{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}}"#;

/// One benchmark size: a label, shards, tensors.
struct Size {
    label: &'static str,
    shards: usize,
    tensors: usize,
}

const SIZES: &[Size] = &[
    Size {
        label: "1k",
        shards: 4,
        tensors: 1_000,
    },
    Size {
        label: "10k",
        shards: 30,
        tensors: 10_000,
    },
    Size {
        label: "100k",
        shards: 163,
        tensors: 100_000,
    },
    Size {
        label: "deepseek-v3",
        shards: 163,
        tensors: 91_991,
    },
];

/// The `i`-th tensor's name (DeepSeek-V3's naming: experts' projections and their fp8
/// scales), its dtype and shape.
fn tensor(i: usize) -> (String, &'static str, [u64; 2]) {
    let (pair, scale) = (i / 2, i % 2 == 1);
    // 256 experts x 3 projections per layer.
    let (layer, expert) = (pair / 768, pair % 768 / 3);
    let proj = ["gate_proj", "up_proj", "down_proj"][pair % 3];
    let base = format!("model.layers.{layer}.mlp.experts.{expert}.{proj}.weight");
    if scale {
        (format!("{base}_scale_inv"), "F32", [16, 56])
    } else {
        (base, "F8_E4M3", [2048, 7168])
    }
}

/// Write a checkpoint of `s.tensors` tensors over `s.shards` shards, with its index.
fn write_checkpoint(dir: &Path, s: &Size) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), DEEPSEEK_V3).unwrap();
    let mut weight_map = serde_json::Map::new();
    let per_shard = s.tensors.div_ceil(s.shards);
    for shard in 0..s.shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", shard + 1, s.shards);
        let mut header = serde_json::Map::new();
        let mut off = 0u64;
        for i in shard * per_shard..((shard + 1) * per_shard).min(s.tensors) {
            let (name, dtype, shape) = tensor(i);
            let bytes = shape[0] * shape[1] * if dtype == "F32" { 4 } else { 1 };
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + bytes]}),
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
}

/// CPU seconds this process has used (user + system, all threads), where the platform says.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is the first, then utime
    // and stime are the 12th and 13th, in clock ticks (USER_HZ, 100 on Linux).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .max(1);
    let asked: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<&Size> = SIZES
        .iter()
        .filter(|s| asked.is_empty() || asked.iter().any(|a| a == s.label))
        .collect();
    if sizes.is_empty() {
        eprintln!(
            "unknown size; expected one of: {}",
            SIZES.iter().map(|s| s.label).collect::<Vec<_>>().join(", ")
        );
        std::process::exit(2);
    }
    let root = std::env::temp_dir().join(format!("memplan-bench-{}", std::process::id()));
    println!(
        "size         shards  tensors   median ms     min ms     max ms   us/tensor  CPU ms/plan   KV tokens"
    );
    for s in sizes {
        let dir = root.join(s.label);
        write_checkpoint(&dir, s);
        let mut times = Vec::with_capacity(runs);
        let mut tokens = 0;
        let cpu0 = cpu_seconds();
        for _ in 0..runs {
            let t0 = Instant::now();
            let model = Model::load(dir.to_str().unwrap()).unwrap();
            let plan = DryRun::new(model, 141 * GIB)
                .tensor_parallel(8)
                .max_model_len(Some(32_768))
                .device_name("H200")
                .plan()
                .unwrap();
            times.push(t0.elapsed());
            tokens = plan.kv.tokens;
        }
        let cpu = cpu_seconds().zip(cpu0).map_or("n/a".to_string(), |(b, a)| {
            format!("{:.1}", (b - a) * 1e3 / runs as f64)
        });
        times.sort();
        let median = times[times.len() / 2];
        println!(
            "{:<12} {:>6} {:>8} {:>11.2} {:>10.2} {:>10.2} {:>11.3} {:>12} {:>11}",
            s.label,
            s.shards,
            s.tensors,
            ms(median),
            ms(times[0]),
            ms(times[times.len() - 1]),
            median.as_secs_f64() * 1e6 / s.tensors as f64,
            cpu,
            tokens
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::remove_dir_all(&root).ok();
}
