//! Write the committed seed corpora of the fuzz targets in `fuzz/seeds/` (run from the
//! repository root: `cargo run -p memplan-model --example fuzz_seeds`):
//!
//! - `from_log/`: every engine start-up log quote of the validation corpora;
//! - `gguf/`: small GGUF files laid out as llama.cpp writes them ([`gguf::Builder`]);
//! - `hf_cache/`: programs for the cache builder of `tests/fuzz_bodies/hf_cache.rs` (each 3
//!   bytes: operation, path, target or content), one per class of hostile entry.
//!
//! Deterministic: running it again rewrites the same files.

use std::path::Path;

use memplan_model::gguf::Builder;
use serde_json::Value;

const LOGS: &[&str] = &[
    include_str!("../tests/data/engine-startup-logs.jsonl"),
    include_str!("../data/validation-logs.jsonl"),
];

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn llama(kv_heads: u32) -> Builder {
    let tokens: Vec<String> = (0..64).map(|i| format!("t{i}")).collect();
    Builder::new("llama")
        .u32("llama.block_count", 2)
        .u32("llama.embedding_length", 64)
        .u32("llama.attention.head_count", 4)
        .u32("llama.attention.head_count_kv", kv_heads)
        .u32("llama.feed_forward_length", 128)
        .u32("llama.context_length", 4096)
        .strings("tokenizer.ggml.tokens", &tokens)
        .tensor("token_embd.weight", &[64, 64], 8)
        .tensor("blk.0.attn_q.weight", &[64, 64], 8)
        .tensor("blk.0.ffn_up.weight", &[256, 2], 12)
        .tensor("blk.1.attn_q.weight", &[64, 64], 1)
        .tensor("blk.1.ffn_up.weight", &[256, 2], 14)
        .tensor("output.weight", &[64, 64], 0)
}

fn main() {
    let root = Path::new("fuzz/seeds");
    assert!(
        root.is_dir(),
        "run from the repository root (fuzz/seeds must exist)"
    );
    let mut n = 0;
    for text in LOGS {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).unwrap();
            if let Some(q) = v["quote"].as_str().filter(|q| !q.is_empty()) {
                write(
                    &root.join("from_log"),
                    &format!("log{n:02}.txt"),
                    q.as_bytes(),
                );
                n += 1;
            }
        }
    }
    let g = root.join("gguf");
    write(&g, "llama.gguf", &llama(2).bytes());
    write(&g, "aligned64.gguf", &llama(4).alignment(64).bytes());
    write(
        &g,
        "per-layer-kv.gguf",
        &Builder::new("qwen2")
            .u32("qwen2.block_count", 2)
            .u32("qwen2.embedding_length", 64)
            .u32("qwen2.attention.head_count", 4)
            .u32s("qwen2.attention.head_count_kv", &[2, 4])
            .u32("qwen2.attention.key_length", 16)
            .u64("qwen2.context_length", 32768)
            .tensor("blk.0.attn_k.weight", &[64, 32], 30)
            .tensor("blk.1.attn_k.weight", &[64, 32], 30)
            .tensor("output_norm.weight", &[64], 0)
            .bytes(),
    );
    write(&g, "v2.gguf", &llama(1).version(2).bytes());
    let h = root.join("hf_cache");
    // (name, program): see `tests/fuzz_bodies/hf_cache.rs` for the operations.
    for (name, program) in [
        ("well-formed", vec![]),
        ("ref-to-outside-path", vec![0, 0, 2]),
        ("ref-absolute", vec![0, 0, 3]),
        ("ref-garbage", vec![0, 0, 11, 0x2e, 0x2e, 0x2f]),
        ("ref-link-dev-zero", vec![1, 0, 8]),
        ("ref-link-fifo", vec![1, 0, 7]),
        ("ref-link-outside", vec![1, 0, 6]),
        ("config-link-outside", vec![1, 2, 3]),
        ("config-link-fifo", vec![1, 2, 7]),
        ("checkpoint-link-outside", vec![1, 3, 4]),
        ("snapshot-link-outside", vec![1, 1, 5]),
        ("index-names-escaping-shard", vec![0, 4, 6, 1, 6, 4]),
        ("index-escapes", vec![0, 4, 7]),
        ("sidecar-bad-value", vec![0, 5, 9]),
        ("folder-link-outside", vec![4, 5, 0]),
        ("ref-to-missing-snapshot", vec![0, 0, 1]),
        ("ref-to-second-snapshot", vec![3, 7, 0, 0, 8, 4, 0, 0, 1]),
    ] {
        write(&h, &format!("{name}.bin"), &program);
    }
    println!(
        "wrote {n} log seeds, 4 GGUF seeds, 17 cache programs under {}",
        root.display()
    );
}
