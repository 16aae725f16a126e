//! Benchmark: read GGUF headers whose metadata arrays are as large as the reader allows.
//! Run with `cargo run --release -p memplan-model --example gguf_bench` (or without
//! `--release` for the debug build); prints the median of 5 reads of each file:
//!
//! - `bytes`: one 60 MiB `u8` array (the header cap is 64 MiB);
//! - `strings`: 60 MiB of 4-character strings (5 M elements, the worst case per byte);
//! - `vocab`: a 262,144-token vocabulary with scores and types, as Gemma 3's files carry.
//!
//! Not a timed test: CI only builds it.

use std::time::Instant;

use memplan_model::gguf::{self, Builder};

fn file(name: &str, b: Builder) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "memplan-gguf-bench-{}-{name}.gguf",
        std::process::id()
    ));
    std::fs::write(&p, b.bytes()).unwrap();
    p
}

fn base() -> Builder {
    Builder::new("llama")
        .u32("llama.block_count", 1)
        .tensor("blk.0.attn_q.weight", &[256, 256], 8)
}

fn main() {
    let mib = 60u64 << 20;
    let bytes = base().raw("bytes", 9, {
        let mut p = 0u32.to_le_bytes().to_vec();
        p.extend(mib.to_le_bytes());
        p.resize(p.len() + mib as usize, 1);
        p
    });
    let strings: Vec<String> = (0..mib / 12)
        .map(|i| format!("{:04}", i % 10_000))
        .collect();
    let vocab: Vec<String> = (0..262_144).map(|i| format!("token{i}")).collect();
    let cases = [
        ("bytes", bytes),
        ("strings", base().strings("strings", &strings)),
        (
            "vocab",
            base()
                .strings("tokenizer.ggml.tokens", &vocab)
                .raw("tokenizer.ggml.scores", 9, {
                    let mut p = 6u32.to_le_bytes().to_vec();
                    p.extend((vocab.len() as u64).to_le_bytes());
                    p.resize(p.len() + 4 * vocab.len(), 0);
                    p
                }),
        ),
    ];
    for (name, b) in cases {
        let p = file(name, b);
        let size = std::fs::metadata(&p).unwrap().len();
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                gguf::read(&p).unwrap();
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{name}: {:.1} MiB file, median read {:.1} ms",
            size as f64 / (1 << 20) as f64,
            times[2] * 1e3
        );
        std::fs::remove_file(p).unwrap();
    }
}
