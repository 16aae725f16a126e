//! vLLM 0.19 sizing (the default rules).
use super::*;
use crate::bytes::{GIB, MIB};
use crate::kv::{KvDtype, LayerGroup};

fn full(layers: u32, kv_heads: u32, head_dim: u32) -> LayerGroup {
    LayerGroup {
        attention: AttentionKind::Full,
        num_layers: layers,
        kv_heads,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
    }
}

fn spec(groups: Vec<LayerGroup>, dtype: KvDtype) -> KvSpec {
    KvSpec {
        groups,
        dtype,
        block_size: 16,
    }
}

fn limits(len: u64) -> KvLimits {
    KvLimits {
        max_model_len: len,
        max_num_batched_tokens: 8192,
        max_len_limit: 131072,
    }
}

#[test]
fn llama_3_1_8b_reproduces_the_logged_tokens() {
    // vLLM 0.19 on H100: "Available KV cache memory: 58.11 GiB" -> 476,016 tokens,
    // 58.11x at 8,192 tokens. 58.11 GiB is rounded; 58.1105 is the unrounded arithmetic.
    let s = spec(vec![full(32, 8, 128)], KvDtype::Bf16);
    let budget = (58.1105 * GIB as f64) as u64;
    let z = s
        .size(
            budget,
            &KvLimits {
                max_len_limit: 1 << 20,
                ..limits(8192)
            },
        )
        .unwrap();
    assert_eq!(z.page_bytes, 64 * 1024);
    assert_eq!(z.block_bytes, 2 * MIB);
    assert_eq!(z.tokens, 476_016);
    assert_eq!(z.usable_blocks, 29_751);
    assert_eq!(format!("{:.2}", z.max_concurrency), "58.11");
    // 29,751 blocks of 16 tokens: the longest request is exactly that many tokens.
    assert_eq!(z.max_model_len_fit, Some(29_751 * 16));
}

#[test]
fn fp8_halves_the_page_and_int8_adds_scales() {
    let fp8 = spec(vec![full(32, 8, 128)], KvDtype::Fp8E4m3)
        .size(2 * GIB, &limits(8192))
        .unwrap();
    assert_eq!(fp8.page_bytes, 32 * 1024);
    let int8 = spec(vec![full(32, 8, 128)], KvDtype::Int8)
        .size(2 * GIB, &limits(8192))
        .unwrap();
    // 16 tokens * 8 heads * (256 one-byte values + 2 f32 scales).
    assert_eq!(int8.page_bytes, 16 * 8 * (256 + 8));
}

#[test]
fn mla_has_one_latent_head_and_no_v() {
    // DeepSeek-V2: kv_lora_rank 512 + rope 64 = 576 per token, 60 layers.
    let mla = LayerGroup {
        attention: AttentionKind::Mla,
        num_layers: 60,
        kv_heads: 1,
        head_dim_k: 576,
        head_dim_v: 0,
    };
    let z = spec(vec![mla], KvDtype::Bf16)
        .size(GIB, &limits(4096))
        .unwrap();
    assert_eq!(z.page_bytes, 16 * 576 * 2);
    assert_eq!(z.num_blocks, GIB / (16 * 576 * 2 * 60));
}

#[test]
fn gpt_oss_hybrid_groups() {
    // 12 sliding (window 128) + 12 full layers, 8 KV heads, head dim 64: two groups of 12.
    let sw = LayerGroup {
        attention: AttentionKind::SlidingWindow { window: 128 },
        ..full(12, 8, 64)
    };
    let s = spec(vec![sw, full(12, 8, 64)], KvDtype::Bf16);
    let z = s.size(10 * GIB, &limits(8192)).unwrap();
    assert_eq!((z.group_size, z.num_groups), (12, 2));
    assert_eq!(z.block_bytes, 16 * 8 * 128 * 2 * 12);
    assert_eq!(z.tokens, (z.num_blocks - 1) / 2 * 16);
    // Per request: 512 blocks for the full group, min(127 + 8192, 8192)/16 + 1 for the window.
    assert_eq!(z.blocks_per_request, 512 + 513);
}

#[test]
fn gemma3_27b_five_to_one_pattern() {
    // 62 layers: 52 sliding + 10 full -> group size 10, 6 sliding groups + 1 full group.
    let sw = LayerGroup {
        attention: AttentionKind::SlidingWindow { window: 1024 },
        ..full(52, 16, 128)
    };
    let z = spec(vec![sw, full(10, 16, 128)], KvDtype::Bf16)
        .size(20 * GIB, &limits(8192))
        .unwrap();
    assert_eq!((z.group_size, z.num_groups), (10, 7));
}

#[test]
fn close_counts_use_the_larger_group() {
    // 10 vs 12 layers: 12 < 1.25 * 10, so one group of each with size 12.
    let sw = LayerGroup {
        attention: AttentionKind::SlidingWindow { window: 512 },
        ..full(10, 8, 128)
    };
    let z = spec(vec![sw, full(12, 8, 128)], KvDtype::Bf16)
        .size(GIB, &limits(1024))
        .unwrap();
    assert_eq!((z.group_size, z.num_groups), (12, 2));
    // 12 vs 16 layers: 16 < 1.5 * 12, so still one group of each, padded to 16 (vLLM's
    // `max_num_layers < min_num_layers * 1.5`), not 12 + 12 + 4-and-padding.
    let sw = LayerGroup {
        attention: AttentionKind::SlidingWindow { window: 512 },
        ..full(12, 8, 128)
    };
    let z = spec(vec![sw, full(16, 8, 128)], KvDtype::Bf16)
        .size(GIB, &limits(1024))
        .unwrap();
    assert_eq!((z.group_size, z.num_groups), (16, 2));
    // 10 vs 15: not below 1.5x, so groups of 10.
    let sw = LayerGroup {
        attention: AttentionKind::SlidingWindow { window: 512 },
        ..full(10, 8, 128)
    };
    let z = spec(vec![sw, full(15, 8, 128)], KvDtype::Bf16)
        .size(GIB, &limits(1024))
        .unwrap();
    assert_eq!((z.group_size, z.num_groups), (10, 3));
}

#[test]
fn tiny_budget_fits_nothing() {
    let z = spec(vec![full(32, 8, 128)], KvDtype::Bf16)
        .size(3 * MIB, &limits(8192))
        .unwrap();
    assert_eq!((z.num_blocks, z.usable_blocks, z.tokens), (1, 0, 0));
    assert_eq!(z.max_model_len_fit, None);
    assert_eq!(z.max_concurrency, 0.0);
}

#[test]
fn longest_fit_is_capped_by_the_limit() {
    let z = spec(vec![full(2, 1, 64)], KvDtype::Bf16)
        .size(64 * GIB, &limits(1024))
        .unwrap();
    assert_eq!(z.max_model_len_fit, Some(131072));
}

#[test]
fn bad_specs_name_the_field() {
    let mut s = spec(vec![full(32, 0, 128)], KvDtype::Bf16);
    assert!(s
        .size(GIB, &limits(1))
        .unwrap_err()
        .to_string()
        .contains("num_key_value_heads"));
    s.groups = vec![full(32, 8, 128)];
    s.block_size = 0;
    assert!(s
        .size(GIB, &limits(1))
        .unwrap_err()
        .to_string()
        .contains("KV block size"));
    s.block_size = 16;
    assert!(s
        .size(GIB, &limits(0))
        .unwrap_err()
        .to_string()
        .contains("max model length"));
    s.groups = vec![full(u32::MAX, u32::MAX, u32::MAX)];
    assert!(s.size(u64::MAX, &limits(1)).is_err());
    s.groups = vec![];
    assert!(s
        .size(GIB, &limits(1))
        .unwrap_err()
        .to_string()
        .contains("no attention layers"));
}

#[test]
fn budget_for_blocks_round_trips() {
    let s = spec(vec![full(28, 4, 128)], KvDtype::Bf16);
    let b = s.budget_for_usable_blocks(1000).unwrap();
    let z = s.size(b, &limits(4096)).unwrap();
    assert_eq!(z.usable_blocks, 1000);
    assert_eq!(s.size(b - 1, &limits(4096)).unwrap().usable_blocks, 999);
}

#[test]
fn invariants_hold_for_random_specs() {
    // xorshift: deterministic inputs, no dependency.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for _ in 0..2000 {
        let mut groups = vec![full(
            1 + next(80) as u32,
            1 + next(16) as u32,
            32 * (1 + next(8) as u32),
        )];
        if next(2) == 0 {
            let sw = LayerGroup {
                attention: AttentionKind::SlidingWindow {
                    window: 1 + next(8192),
                },
                ..full(
                    1 + next(80) as u32,
                    groups[0].kv_heads,
                    groups[0].head_dim_k,
                )
            };
            groups.push(sw);
        }
        let dtype =
            [KvDtype::Bf16, KvDtype::Fp8E4m3, KvDtype::Int8, KvDtype::F32][next(4) as usize];
        let s = KvSpec {
            groups,
            dtype,
            block_size: [1, 16, 32, 64][next(4) as usize],
        };
        let budget = next(1 << 40);
        let l = KvLimits {
            max_model_len: 1 + next(1 << 18),
            max_num_batched_tokens: 1 + next(16384),
            max_len_limit: 1 << 20,
        };
        let z = s.size(budget, &l).unwrap();
        assert!(z.used_bytes <= budget && z.usable_blocks <= z.num_blocks);
        assert!(z.tokens <= z.usable_blocks * u64::from(s.block_size));
        if let Some(fit) = z.max_model_len_fit {
            let g = s.layout(&SizingRules::default()).unwrap().groups;
            assert!(request_blocks(&g, fit, l.max_num_batched_tokens).unwrap() <= z.usable_blocks);
            if fit < l.max_len_limit {
                assert!(
                    request_blocks(&g, fit + 1, l.max_num_batched_tokens).unwrap()
                        > z.usable_blocks
                );
            }
        }
    }
}
