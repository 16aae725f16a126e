//! Sizing under later engine rules: group-aware capacity (vLLM 0.20.1+), tokens in flight
//! (0.26+), recurrent states, chunked local attention, uniform-type groups, MLA int8.
//! Expected figures are derived by hand from vLLM's code; each test names the function.
use super::*;
use crate::bytes::{GIB, MIB};
use crate::kv::{KvDtype, LayerGroup};

fn group(attention: AttentionKind, layers: u32, kv_heads: u32, head_dim: u32) -> LayerGroup {
    LayerGroup {
        attention,
        num_layers: layers,
        kv_heads,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
    }
}

/// vLLM 0.34's rules: async scheduling keeps two batches in flight, group-aware capacity.
const V0_34: SizingRules = SizingRules {
    in_flight_batches: 2,
    capacity: Capacity::Concurrency,
    hybrid_manager: true,
    pad_attention_pages: true,
    kv_allocation: crate::kv::KvAllocation::OneBacking,
    long_requests: crate::kv::LongRequests::Refuse,
    swa_pools: crate::kv::SwaPools::Groups,
    start_check: crate::kv::StartCheck::RefuseAboveFree,
};

fn limits(len: u64, batched: u64) -> KvLimits {
    KvLimits {
        max_model_len: len,
        max_num_batched_tokens: batched,
        max_len_limit: len,
    }
}

#[test]
fn gemma3_12b_at_32k_under_0_19_and_0_34() {
    // Gemma 3 12B: 48 layers, 8 KV heads, head dim 256, window 1024, 5 sliding per full:
    // 40 sliding + 8 full -> group size 8, 5 sliding groups + 1 full group.
    let spec = |bs| KvSpec {
        groups: vec![
            group(AttentionKind::SlidingWindow { window: 1024 }, 40, 8, 256),
            group(AttentionKind::Full, 8, 8, 256),
        ],
        dtype: KvDtype::Bf16,
        block_size: bs,
    };
    let budget = (50.15 * GIB as f64) as u64;
    // 0.19 (`SlidingWindowSpec.max_memory_usage_bytes`): full cdiv(32768, 16) = 2048;
    // sliding cdiv(min(1023 + 8192, 32768), 16) + 1 = 577, five groups -> 4933 per request.
    let old = spec(16).size(budget, &limits(32768, 8192)).unwrap();
    assert_eq!(old.blocks_per_request, 2048 + 5 * 577);
    assert_eq!(old.block_bytes, MIB);
    assert_eq!(format!("{:.1}", old.engine_concurrency), "10.4");
    // 0.34: block 64 (`CacheConfig.DEFAULT_BLOCK_SIZE`), 16384 batched tokens on H100
    // (`get_batch_defaults`), two batches in flight (`VllmConfig.max_in_flight_tokens`):
    // sliding cdiv(min(1023 + 2 * 16384, 32768), 64) + 1 = 513 (capped at the request);
    // full 512.
    let new = spec(64)
        .size_with(budget, &limits(32768, 16384), &V0_34)
        .unwrap();
    assert_eq!(new.blocks_per_request, 512 + 5 * 513);
    // With 8192 batched tokens (the API server's default): 272 + 1 per sliding group.
    let api = spec(64)
        .size_with(budget, &limits(32768, 8192), &V0_34)
        .unwrap();
    assert_eq!(api.blocks_per_request, 512 + 5 * 273);
    assert_eq!(format!("{:.1}", api.engine_concurrency), "6.8");
    // `get_kv_cache_capacity`: int(concurrency * max_model_len).
    assert_eq!(
        api.tokens,
        (api.num_blocks as f64 / api.blocks_per_request as f64 * 32768.0) as u64
    );
}

#[test]
fn mla_int8_is_584_bytes_per_token() {
    // `MLACommonBackend.customize_spec`: head_size * 1 + 2 f32 scales = 576 + 8.
    let g = group(AttentionKind::Mla, 61, 1, 576);
    let g = LayerGroup { head_dim_v: 0, ..g };
    assert_eq!(g.page_bytes(KvDtype::Int8, 1).unwrap(), 584);
    assert_eq!(g.page_bytes(KvDtype::Bf16, 1).unwrap(), 1152);
    // fp8_ds_mla: 512 fp8 + 4 scales of 4 bytes + 64 bf16 rope (`get_fp8_ds_mla_row_bytes`).
    assert_eq!(g.page_bytes(KvDtype::Fp8DsMla, 1).unwrap(), 656);
    // The indexer: 128 fp8 values + one f32 scale (`Indexer.k_cache`), whatever the dtype.
    let ix = LayerGroup {
        attention: AttentionKind::Indexer,
        ..group(AttentionKind::Indexer, 61, 1, 128)
    };
    assert_eq!(ix.page_bytes(KvDtype::Bf16, 64).unwrap(), 132 * 64);
}

#[test]
fn full_like_layers_of_different_pages_form_one_group() {
    // DeepSeek-V3.2: 61 MLA layers (1152 B/token) + 61 indexer layers (132 B/token) are
    // one `UniformTypeKVCacheSpecs` group; a block costs the sum of their pages.
    let spec = KvSpec {
        groups: vec![
            LayerGroup {
                head_dim_v: 0,
                ..group(AttentionKind::Mla, 61, 1, 576)
            },
            LayerGroup {
                head_dim_v: 0,
                ..group(AttentionKind::Indexer, 61, 1, 128)
            },
        ],
        dtype: KvDtype::Bf16,
        block_size: 64,
    };
    let z = spec
        .size_with(10 * GIB, &limits(163_840, 8192), &V0_34)
        .unwrap();
    assert_eq!(z.num_groups, 1);
    assert_eq!(z.block_bytes, 61 * (1152 + 132) * 64);
    assert_eq!(z.blocks_per_request, 163_840 / 64);
}

#[test]
fn recurrent_states_are_padded_pages_with_fixed_blocks_per_request() {
    // A Jamba-like hybrid: 4 attention layers (8 KV heads, head dim 128) and 28 Mamba
    // layers whose state is padded to the attention page (`unify_kv_cache_spec_page_size`).
    // Group size 4: one attention group, seven state groups of 2 pages each (`align`).
    let spec = KvSpec {
        groups: vec![
            group(AttentionKind::Full, 4, 8, 128),
            LayerGroup {
                kv_heads: 0,
                head_dim_k: 0,
                head_dim_v: 0,
                ..group(
                    AttentionKind::State {
                        bytes: 1_000_000,
                        pages_per_request: 2,
                    },
                    28,
                    0,
                    0,
                )
            },
        ],
        dtype: KvDtype::Bf16,
        block_size: 256,
    };
    let page = 256 * 8 * 256 * 2;
    let z = spec
        .size_with(8 * GIB, &limits(65_536, 8192), &V0_34)
        .unwrap();
    assert_eq!((z.group_size, z.num_groups, z.page_bytes), (4, 8, page));
    assert_eq!(z.num_blocks, 8 * GIB / (4 * page));
    assert_eq!(z.blocks_per_request, 65_536 / 256 + 7 * 2);
}

#[test]
fn chunked_local_attention_and_the_hybrid_manager() {
    // Llama 4 Scout: 36 chunked (8192) + 12 full layers, 8 KV heads, head dim 128.
    let spec = KvSpec {
        groups: vec![
            group(AttentionKind::ChunkedLocal { chunk: 8192 }, 36, 8, 128),
            group(AttentionKind::Full, 12, 8, 128),
        ],
        dtype: KvDtype::Bf16,
        block_size: 16,
    };
    // Hybrid manager on: 3 chunked groups of cdiv(min(8192 + 8192, 131072), 16) = 1024.
    let on = spec.size(8 * GIB, &limits(131_072, 8192)).unwrap();
    assert_eq!(on.blocks_per_request, 8192 + 3 * 1024);
    // Off (vLLM's default with chunked local attention, `VllmConfig.__post_init__`): every
    // layer is full attention, one group of 48 layers.
    let rules = SizingRules {
        hybrid_manager: false,
        ..SizingRules::default()
    };
    let off = spec
        .size_with(8 * GIB, &limits(131_072, 8192), &rules)
        .unwrap();
    assert_eq!((off.num_groups, off.group_size), (1, 48));
    assert_eq!(off.blocks_per_request, 8192);
}

#[test]
fn pages_that_do_not_divide_are_padded_only_by_later_engines() {
    // Sliding layers with head dim 96 next to full layers with head dim 128: 96 does not
    // divide 128. vLLM 0.19 refuses; 0.24+ pads the smaller page.
    let spec = KvSpec {
        groups: vec![
            group(AttentionKind::SlidingWindow { window: 512 }, 20, 8, 96),
            group(AttentionKind::Full, 20, 8, 128),
        ],
        dtype: KvDtype::Bf16,
        block_size: 16,
    };
    let e = spec.size(GIB, &limits(4096, 2048)).unwrap_err().to_string();
    assert!(e.contains("cannot unify"), "{e}");
    let z = spec.size_with(GIB, &limits(4096, 2048), &V0_34).unwrap();
    assert_eq!(z.page_bytes, 16 * 8 * 256 * 2);
    // A smaller page that divides the larger one gets a larger block instead: head dim 64
    // sliding layers hold 32 tokens per block.
    let spec = KvSpec {
        groups: vec![
            group(AttentionKind::SlidingWindow { window: 512 }, 20, 8, 64),
            group(AttentionKind::Full, 20, 8, 128),
        ],
        ..spec
    };
    let z = spec.size(GIB, &limits(4096, 2048)).unwrap();
    // Full: 4096 / 16 = 256; sliding: cdiv(min(511 + 2048, 4096), 32) + 1 = 81.
    assert_eq!(z.blocks_per_request, 256 + 81);
}

/// gemma-3-4b's layers (29 sliding with a 1024-token window, 5 full; 4 KV heads of 256) in
/// fp8 with 32-token pages, kept in SGLang's two pools (`SWAKVPool`), worked by hand from
/// SGLang's formulas. A layer's page: 2 x 32 x 4 x 256 = 64 KiB (F = 5 x 64 KiB = 320 KiB,
/// S = 29 x 64 KiB = 1,856 KiB a page).
#[test]
fn sglang_pools_of_a_hybrid_model() {
    use crate::kv::{KvAllocation, LongRequests, SwaPools};
    let spec = KvSpec {
        groups: vec![
            group(AttentionKind::SlidingWindow { window: 1024 }, 29, 4, 256),
            group(AttentionKind::Full, 5, 4, 256),
        ],
        dtype: KvDtype::Fp8E4m3,
        block_size: 32,
    };
    let sglang = |pools| {
        SizingRules::default()
            .with_kv_allocation(KvAllocation::SplitKv)
            .with_long_requests(LongRequests::CapByPool { least_tokens: 2 })
            .with_swa_pools(pools)
    };
    let budget = 2_000_000_000;
    // vLLM's groups: 5 + 29 layers in groups of 5 (1 + 6), a block 5 pages = 320 KiB holding
    // 32 / 7 tokens.
    let v = spec
        .size_with(budget, &limits(8192, 2048), &sglang(SwaPools::Groups))
        .unwrap();
    assert_eq!(
        (v.block_bytes, v.num_groups, v.num_blocks),
        (327_680, 7, 6_103)
    );
    assert_eq!(v.tokens, 871 * 32);
    // Up to 0.5.13 (`set_num_tokens_hybrid_swa`): the tokens given are every layer's, a page
    // of every layer a block: 34 x 64 KiB = 2,228,224 B; 897 pages, 896 usable: 28,672 tokens,
    // a request of 8,192 tokens 256 pages of the full pool.
    let old = spec
        .size_with(
            budget,
            &limits(8192, 2048),
            &sglang(SwaPools::SglangEveryLayer),
        )
        .unwrap();
    assert_eq!(
        (old.block_bytes, old.num_groups, old.num_blocks),
        (2_228_224, 1, 897)
    );
    assert_eq!((old.tokens, old.blocks_per_request), (28_672, 256));
    // From 0.5.14 (`_solve_pool_sizes`): the tokens given are the full pool's, the sliding
    // pool's 0.8 of them: a block is F + ceil(0.8 S) = 327,680 + 1,520,436 = 1,848,116 B;
    // 2e9 / 1,848,116 = 1,082 pages (1,081 usable: 34,592 tokens). The sliding pool of those
    // holds int(0.8 x 1,081) = 864 pages and its padded page, 865 <= 0.8 x 1,082.
    let new = spec
        .size_with(
            budget,
            &limits(8192, 2048),
            &sglang(SwaPools::SglangFullPool),
        )
        .unwrap();
    assert_eq!(
        (new.block_bytes, new.num_groups, new.num_blocks),
        (1_848_116, 1, 1_082)
    );
    assert_eq!(new.tokens, 34_592);
    // 1,001 pages would give the sliding pool int(0.8 x 1,000) + 1 = 801 pages, more than 0.8
    // of 1,001 (800.8): a budget of 1,001 blocks sizes 1,000.
    let at = |n: u64| {
        spec.size_with(
            n * 1_848_116,
            &limits(8192, 2048),
            &sglang(SwaPools::SglangFullPool),
        )
        .unwrap()
        .num_blocks
    };
    assert_eq!((at(1_000), at(1_001), at(1_002)), (1_000, 1_000, 1_002));
    // ... and a budget for 1,000 usable blocks keeps room for 1,002.
    assert_eq!(
        spec.budget_for_usable_blocks_with(1_000, &sglang(SwaPools::SglangFullPool))
            .unwrap(),
        1_002 * 1_848_116
    );
    // The hybrid manager off (every layer sized as full attention): vLLM's rule stands.
    let off = spec
        .size_with(
            budget,
            &limits(8192, 2048),
            &sglang(SwaPools::SglangFullPool).with_hybrid_manager(false),
        )
        .unwrap();
    assert_eq!(off.block_bytes, 2_228_224);
}
