//! A small GGUF file written here (metadata + tensor infos, no tensor data needed beyond
//! what the sizes claim) is read back; corrupt files are errors, never panics.
use super::*;

fn s(out: &mut Vec<u8>, v: &str) {
    out.extend((v.len() as u64).to_le_bytes());
    out.extend(v.as_bytes());
}

fn kv_u32(out: &mut Vec<u8>, k: &str, v: u32) {
    s(out, k);
    out.extend(4u32.to_le_bytes());
    out.extend(v.to_le_bytes());
}

/// A 2-layer llama: hidden 256, 4 heads, 2 KV heads, head dim 64, Q8_0 weights.
fn tiny() -> Vec<u8> {
    let mut o = b"GGUF".to_vec();
    o.extend(3u32.to_le_bytes());
    let tensors: Vec<(String, Vec<u64>, u32)> = vec![
        ("token_embd.weight".into(), vec![256, 1000], 8),
        ("blk.0.attn_q.weight".into(), vec![256, 256], 8),
        ("blk.0.ffn_up.weight".into(), vec![256, 512], 12),
        ("blk.1.attn_q.weight".into(), vec![256, 256], 8),
        ("blk.1.ffn_up.weight".into(), vec![256, 512], 12),
        ("output.weight".into(), vec![256, 1000], 14),
    ];
    o.extend((tensors.len() as u64).to_le_bytes());
    o.extend(8u64.to_le_bytes());
    s(&mut o, "general.architecture");
    o.extend(8u32.to_le_bytes());
    s(&mut o, "llama");
    for (k, v) in [
        ("llama.block_count", 2),
        ("llama.embedding_length", 256),
        ("llama.attention.head_count", 4),
        ("llama.attention.head_count_kv", 2),
        ("llama.feed_forward_length", 512),
        ("llama.context_length", 4096),
    ] {
        kv_u32(&mut o, k, v);
    }
    // tokenizer.ggml.tokens: an array of 1000 strings.
    s(&mut o, "tokenizer.ggml.tokens");
    o.extend(9u32.to_le_bytes());
    o.extend(8u32.to_le_bytes());
    o.extend(1000u64.to_le_bytes());
    for i in 0..1000 {
        s(&mut o, &format!("t{i}"));
    }
    for (name, dims, t) in &tensors {
        s(&mut o, name);
        o.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            o.extend(d.to_le_bytes());
        }
        o.extend(t.to_le_bytes());
        o.extend(0u64.to_le_bytes());
    }
    // Pad so the claimed tensor sizes fit in the file.
    o.resize(o.len() + 700_000, 0);
    o
}

fn write(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("memplan-gguf-{}-{name}.gguf", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn reads_weights_per_layer_and_plans() {
    let p = write("tiny", &tiny());
    let info = read(&p).unwrap();
    // Q8_0: 34 bytes per 32; Q4_K: 144 per 256; Q6_K: 210 per 256.
    let q8 = |n: u64| n / 32 * 34;
    let q4k = |n: u64| n / 256 * 144;
    assert_eq!(info.layer_bytes, vec![q8(65536) + q4k(131072); 2]);
    assert_eq!(info.output_bytes, 256_000 / 256 * 210);
    assert_eq!(info.other_bytes, q8(256_000));
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
fn corrupt_files_are_errors_not_panics() {
    let good = tiny();
    // Truncations and single-byte corruptions of the header.
    for cut in [0, 3, 4, 10, 30, 100, 500] {
        let p = write(&format!("cut{cut}"), &good[..cut]);
        assert!(read(&p).is_err());
        std::fs::remove_file(p).unwrap();
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut b = good.clone();
        let at = (x % 12_000) as usize;
        b[at] = (x >> 32) as u8;
        let p = write(&format!("flip{i}"), &b);
        let _ = read(&p);
        std::fs::remove_file(p).unwrap();
    }
    let mut huge = good.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let p = write("huge", &huge);
    assert!(read(&p).unwrap_err().to_string().contains("not plausible"));
    std::fs::remove_file(p).unwrap();
}
