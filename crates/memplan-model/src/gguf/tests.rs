//! GGUF files written by [`Builder`] are read back; every class llama.cpp's loader refuses is
//! refused here too, naming the offending key, tensor or value; extreme but well-formed
//! dimensions give an answer, never an overflow; arrays are read in linear time.
use super::*;

/// A 2-layer llama: hidden 256, 4 heads, 2 KV heads, head dim 64, Q8_0 weights.
fn tiny() -> Builder {
    let tokens: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
    Builder::new("llama")
        .u32("llama.block_count", 2)
        .u32("llama.embedding_length", 256)
        .u32("llama.attention.head_count", 4)
        .u32("llama.attention.head_count_kv", 2)
        .u32("llama.feed_forward_length", 512)
        .u32("llama.context_length", 4096)
        .strings("tokenizer.ggml.tokens", &tokens)
        .tensor("token_embd.weight", &[256, 1000], 8)
        .tensor("blk.0.attn_q.weight", &[256, 256], 8)
        .tensor("blk.0.ffn_up.weight", &[256, 512], 12)
        .tensor("blk.1.attn_q.weight", &[256, 256], 8)
        .tensor("blk.1.ffn_up.weight", &[256, 512], 12)
        .tensor("output.weight", &[256, 1000], 14)
}

fn write(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("memplan-gguf-{}-{name}.gguf", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Read `bytes` (in memory: the reader is the one files go through); the error message,
/// which must name the file.
fn refused(name: &str, bytes: &[u8]) -> String {
    let file = format!("/models/{name}.gguf");
    let e = read_bytes(&file, bytes).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::InvalidFile { .. }), "{name}: {e:?}");
    let m = e.to_string();
    assert!(m.contains(&file), "{name}: {m}");
    m
}

#[test]
fn reads_weights_per_layer_and_plans() {
    let p = write("tiny", &tiny().bytes());
    let info = read(&p).unwrap();
    // Q8_0: 34 bytes per 32; Q4_K: 144 per 256; Q6_K: 210 per 256.
    let q8 = |n: u64| n / 32 * 34;
    let q4k = |n: u64| n / 256 * 144;
    assert_eq!(info.layer_bytes, vec![q8(65536) + q4k(131072); 2]);
    assert_eq!(info.output_bytes, 256_000 / 256 * 210);
    assert_eq!(info.other_bytes, q8(256_000));
    assert_eq!(info.meta["tokenizer.ggml.tokens"]["len"], 1000);
    let m = Model::load(p.to_str().unwrap()).unwrap();
    assert_eq!(
        (
            m.config.num_layers,
            m.config.num_kv_heads,
            m.config.head_dim,
            m.config.vocab_size
        ),
        (2, 2, 64, 1000)
    );
    assert_eq!(
        m.checkpoint.as_ref().unwrap().total(),
        info.layer_bytes.iter().sum::<u64>() + info.output_bytes + info.other_bytes
    );
    // KV f16: 2 heads * 128 dims * 2 bytes = 512 B per layer and token; q8_0: 272; q4_0: 144.
    let w_all: u64 = info.layer_bytes.iter().sum::<u64>() + info.output_bytes;
    let f = fit(&info, &m.config, w_all + 2 * 512 * 4096, 0, "f16", 4096).unwrap();
    assert_eq!((f.ngl, f.ctx), (3, 4096));
    let f = fit(&info, &m.config, w_all + 2 * 272 * 4096, 0, "q8_0", 1024).unwrap();
    assert_eq!(f.ctx, 4096);
    // Too small for everything: fewer layers on the GPU.
    let f = fit(
        &info,
        &m.config,
        info.layer_bytes[0] + 144 * 4096,
        0,
        "q4_0",
        4096,
    )
    .unwrap();
    assert_eq!(f.ngl, 1);
    assert!(kv_type_bytes("q5_1").is_err());
    std::fs::remove_file(p).unwrap();
}

#[test]
fn alignment_must_be_a_u32_power_of_two() {
    for a in [1u32, 2, 8, 64, 4096, 1 << 20] {
        assert!(
            read_bytes("aligned", &tiny().alignment(a).bytes()).is_ok(),
            "alignment {a}"
        );
    }
    for a in [0u32, 3, 5, 6, 7, 12, 48, 100, (1 << 31) + 1, u32::MAX] {
        let m = refused(&format!("align{a}"), &tiny().alignment(a).bytes());
        assert!(
            m.contains("general.alignment") && m.contains(&a.to_string()),
            "{m}"
        );
    }
    let m = refused("align-u64", &tiny().u64("general.alignment", 32).bytes());
    assert!(m.contains("general.alignment must be a u32"), "{m}");
    let m = refused(
        "align-str",
        &tiny().string("general.alignment", "32").bytes(),
    );
    assert!(m.contains("general.alignment"), "{m}");
}

#[test]
fn duplicate_keys_and_tensor_names_are_refused_naming_them() {
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "output.weight"] {
        let m = refused("dup-tensor", &tiny().tensor(name, &[256], 0).bytes());
        assert!(m.contains(name) && m.contains("twice"), "{m}");
    }
    for key in [
        "llama.block_count",
        "general.architecture",
        "tokenizer.ggml.tokens",
    ] {
        let m = refused("dup-key", &tiny().u32(key, 7).bytes());
        assert!(m.contains(key) && m.contains("twice"), "{m}");
    }
    let m = refused("empty-key", &tiny().u32("", 7).bytes());
    assert!(m.contains("empty"), "{m}");
}

#[test]
fn tensors_must_tile_the_data_section_inside_the_file() {
    let good = tiny();
    let laid: Vec<u64> = {
        // The offsets the builder lays out: each the previous end padded to 32.
        let sizes = [272_000u64, 69632, 73728, 69632, 73728];
        let mut v = vec![0u64];
        for s in sizes {
            let next = v.last().unwrap() + s.div_ceil(32) * 32;
            v.push(next);
        }
        v
    };
    assert!(read_bytes("laid", &good.clone().offsets(laid.clone()).bytes()).is_ok());
    // Every displacement of every tensor: misaligned, overlapping, leaving a gap, far past the
    // end, all at 0.
    for i in 0..laid.len() {
        for delta in [1i64, -1, 16, -32, 32, 4096, 1 << 40] {
            let mut o = laid.clone();
            let Some(v) = o[i].checked_add_signed(delta) else {
                continue;
            };
            o[i] = v;
            let m = refused(&format!("off{i}"), &good.clone().offsets(o).bytes());
            assert!(
                m.contains("must start at"),
                "tensor {i} moved by {delta}: {m}"
            );
        }
    }
    // Every tensor at 0 (the file then also ends before the first tensor's data).
    refused("all-zero", &good.clone().offsets(vec![0; 6]).bytes());
    // A file missing part of its tensor data: every cut inside the data section.
    let bytes = good.bytes();
    let data_end = bytes.len();
    for cut in [1usize, 2, 100, 100_000, 200_000, data_end / 2] {
        let m = refused("cut", &bytes[..data_end - cut]);
        assert!(m.contains("past the end of the file"), "cut {cut}: {m}");
    }
}

#[test]
fn every_structural_class_llama_cpp_refuses_is_refused() {
    let cases: Vec<(&str, Builder, &str)> = vec![
        ("version 1", tiny().version(1), "version 1"),
        ("version 4", tiny().version(4), "version 4"),
        (
            "5 dims",
            tiny().tensor("x", &[1, 1, 1, 1, 32], 0),
            "5 dimensions",
        ),
        (
            "long name",
            tiny().tensor(&"n".repeat(64), &[32], 0),
            "64 bytes",
        ),
        (
            "unknown type",
            tiny().tensor("x", &[32], 4),
            "unknown ggml type 4",
        ),
        (
            "row not blocks",
            tiny().tensor("x", &[33, 2], 8),
            "block size 32",
        ),
        (
            "elements overflow",
            tiny().tensor("x", &[1 << 32, 1 << 32], 0),
            "overflows",
        ),
        (
            "array of arrays",
            tiny().raw("a", 9, {
                let mut p = 9u32.to_le_bytes().to_vec();
                p.extend(1u64.to_le_bytes());
                p
            }),
            "array of arrays",
        ),
        (
            "array past the end",
            tiny().raw("a", 9, {
                let mut p = 4u32.to_le_bytes().to_vec();
                p.extend(u64::MAX.to_le_bytes());
                p
            }),
            "longer than the rest of the file",
        ),
        (
            "strings past the end",
            tiny().raw("a", 9, {
                let mut p = 8u32.to_le_bytes().to_vec();
                p.extend((1u64 << 40).to_le_bytes());
                p
            }),
            "longer than the rest of the file",
        ),
        ("no tensors", Builder::new("llama"), "no tensors"),
        (
            "layer index",
            tiny().tensor("blk.99999.x", &[32], 0),
            "layer index",
        ),
        (
            "no architecture",
            Builder::default().tensor("x", &[32], 0),
            "general.architecture",
        ),
    ];
    for (name, b, want) in cases {
        let m = refused(name, &b.bytes());
        assert!(m.contains(want), "{name}: {m}");
    }
    let mut huge = tiny().bytes();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(refused("huge", &huge).contains("not plausible"));
}

#[test]
fn a_header_past_the_cap_is_refused_without_reading_it() {
    // A sparse file whose one metadata array claims more than the header cap.
    let n = reader::MAX_HEADER + 1;
    let b = Builder::new("llama").raw("big", 9, {
        let mut p = 0u32.to_le_bytes().to_vec();
        p.extend(n.to_le_bytes());
        p
    });
    let p = std::env::temp_dir().join(format!("memplan-gguf-{}-cap.gguf", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    use std::io::Write;
    (&f).write_all(&b.bytes()).unwrap();
    f.set_len(n + 4096).unwrap();
    let e = read(&p).unwrap_err().to_string();
    assert!(e.contains("memplan's cap"), "{e}");
    std::fs::remove_file(p).unwrap();
}

#[test]
fn large_metadata_arrays_are_read_in_one_pass() {
    // 10 MiB of bytes and 10 MiB of short strings: read linearly (a hang guard, not a
    // benchmark: `crates/memplan-model/examples/gguf_bench.rs` measures the time).
    let strings: Vec<String> = (0..(10 << 20) / 12).map(|i| format!("{i:04}")).collect();
    let b = tiny()
        .raw("bytes", 9, {
            let mut p = 0u32.to_le_bytes().to_vec();
            p.extend((10u64 << 20).to_le_bytes());
            p.resize(p.len() + (10 << 20), 7);
            p
        })
        .strings("strings", &strings);
    let bytes = b.bytes();
    let t = std::time::Instant::now();
    let info = read_bytes("arrays", &bytes).unwrap();
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(info.meta["bytes"]["len"], 10u64 << 20);
    assert_eq!(info.meta["strings"]["len"], strings.len());
}

#[test]
fn extreme_but_well_formed_dimensions_give_an_answer() {
    // Head counts and key lengths up to the largest a GGUF u32 holds: the fit and the whole
    // dry run answer (usually: nothing fits) without overflowing.
    for (heads, kv_heads, key) in [
        (u32::MAX, u32::MAX, u32::MAX),
        (1 << 20, 1 << 20, 1 << 20),
        (64, 8, u32::MAX),
        (u32::MAX, 1, 128),
    ] {
        let b = Builder::new("llama")
            .u32("llama.block_count", 2)
            .u32("llama.embedding_length", u32::MAX)
            .u32("llama.feed_forward_length", u32::MAX)
            .u32("llama.context_length", u32::MAX)
            .u32("llama.vocab_size", u32::MAX)
            .u32("llama.attention.head_count", heads)
            .u32("llama.attention.head_count_kv", kv_heads)
            .u32("llama.attention.key_length", key)
            .tensor("blk.0.attn_q.weight", &[256, 256], 8)
            .tensor("blk.1.attn_q.weight", &[256, 256], 8)
            .tensor("output.weight", &[256], 0);
        let p = write("extreme", &b.bytes());
        let info = read(&p).unwrap();
        if let Ok(m) = Model::load(p.to_str().unwrap()) {
            for kv in ["f16", "q8_0", "q4_0"] {
                for budget in [0, 1 << 30, u64::MAX] {
                    for ctx in [1, 4096, u64::MAX] {
                        let f = fit(&info, &m.config, budget, 0, kv, ctx).unwrap();
                        assert!(f.weight_bytes.saturating_add(f.kv_bytes) <= budget);
                    }
                }
            }
            let _ = crate::dryrun::DryRun::new(m, 80 << 30).plan();
        }
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn corrupt_files_are_errors_not_panics() {
    let good = tiny().bytes();
    // Truncations and single-byte corruptions of the header.
    for cut in [0, 3, 4, 10, 30, 100, 500] {
        assert!(read_bytes("cut", &good[..cut]).is_err());
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut b = good.clone();
        let at = (x % 12_000) as usize;
        b[at] = (x >> 32) as u8;
        if let Ok(info) = read_bytes(&format!("flip{i}"), &b) {
            if let Ok(c) = ModelConfig::from_value(&info.config_json()) {
                let _ = fit(&info, &c, 1 << 30, 0, "f16", 4096);
            }
        }
    }
}
