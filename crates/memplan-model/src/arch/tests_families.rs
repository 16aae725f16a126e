//! The families engines serve today, from a faithfully reconstructed `config.json` (the keys vLLM
//! reads, values of the public checkpoint), sized with vLLM 0.34's rules: block 64
//! (`CacheConfig.DEFAULT_BLOCK_SIZE`), 8192 batched tokens (`get_batch_defaults`, H100 API
//! server), two batches in flight (`VllmConfig.max_in_flight_tokens`), `align` state pages
//! (`MambaModelConfig`, `MambaSpec.max_memory_usage_bytes`; Mamba2 +1 checkpoint page,
//! `MambaMixer2.get_kv_cache_spec`), the hybrid block alignment of
//! `Platform._align_hybrid_block_size` and the grouping of
//! `_get_kv_cache_groups_uniform_page_size`. Expected figures are derived by hand in the
//! comments; concurrency is `floor(budget / block_bytes) / blocks_per_request`
//! (`get_max_concurrency_for_kv_cache_config`).

use memplan_core::bytes::GIB;
use memplan_core::kv::{KvDtype, KvLimits, KvSizing, KvSpec};

use crate::engine::EngineRules;
use crate::kvspec::SpecOptions;
use crate::ModelConfig;

const BUDGET: u64 = 40 * GIB;

/// Size `json` with vLLM 0.34's defaults at the config's own max_model_len (or `len`).
pub(super) fn plan(json: &str, len: Option<u64>) -> (ModelConfig, KvSpec, KvSizing) {
    let c = ModelConfig::from_json_str(json).unwrap_or_else(|e| panic!("{e}"));
    let e = EngineRules::newest_vllm();
    let opts = SpecOptions {
        state_pages: (e.state_pages(false), e.state_pages(true)),
        hybrid_block_align: if c.mla.is_some() {
            128
        } else {
            e.hybrid_block_align
        },
        dtype_bytes: 2,
        mamba_cache_dtype: None,
        mamba_ssm_cache_dtype: None,
        nemotron_h_ssm_default: crate::arch::state::MambaDtype::Float32,
        nemotron_h_vl_ssm_rule: true,
    };
    let spec = c
        .kv_spec_with(KvDtype::Bf16, e.block_size, 1, &opts)
        .unwrap();
    let mml = len.or(c.derived_max_len).unwrap();
    let chunked = c
        .layers
        .iter()
        .any(|k| matches!(k, crate::config::LayerKind::Chunked(_)));
    let limits = KvLimits::new(mml, 8192);
    let z = spec
        .size_with(BUDGET, &limits, &e.sizing(1, !chunked))
        .unwrap();
    assert_eq!(z.num_blocks, BUDGET / z.block_bytes);
    (c, spec, z)
}

/// (block bytes, blocks per request) for a dense model of `layers` layers, `kv` heads of
/// `hd` dims (bf16, block 64) at `len` tokens.
pub(super) fn dense(layers: u64, kv: u64, hd: u64, len: u64) -> (u64, u64) {
    (layers * 64 * kv * hd * 2 * 2, len.div_ceil(64))
}

fn check(z: &KvSizing, want: (u64, u64)) {
    assert_eq!((z.block_bytes, z.blocks_per_request), want);
}

#[test]
fn plain_gqa_decoders_plan_by_the_generic_rule() {
    // Qwen1.5-MoE-A2.7B (Qwen2MoeForCausalLM): 24 layers, 16 KV heads, head 128, 8192.
    let (c, _, z) = plan(
        r#"{"architectures":["Qwen2MoeForCausalLM"],"model_type":"qwen2_moe","hidden_size":2048,"num_hidden_layers":24,"num_attention_heads":16,"num_key_value_heads":16,"intermediate_size":5632,"moe_intermediate_size":1408,"shared_expert_intermediate_size":5632,"num_experts":60,"num_experts_per_tok":4,"vocab_size":151936,"max_position_embeddings":8192,"use_sliding_window":false,"sliding_window":32768,"max_window_layers":21,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(24, 16, 128, 8192));
    assert_eq!(c.moe.unwrap().num_experts, 60);
    // Command-R (CohereForCausalLM): model_max_length wins (`derive_max_model_len_and_key`).
    let (c, _, z) = plan(
        r#"{"architectures":["CohereForCausalLM"],"model_type":"cohere","hidden_size":8192,"num_hidden_layers":40,"num_attention_heads":64,"num_key_value_heads":64,"intermediate_size":22528,"vocab_size":256000,"max_position_embeddings":8192,"model_max_length":131072,"use_qk_norm":false,"torch_dtype":"float16"}"#,
        None,
    );
    assert_eq!(c.derived_max_len, Some(131_072));
    check(&z, dense(40, 64, 128, 131_072));
    // OLMo 2 7B (Transformers backend in vLLM): plain MHA.
    let (_, _, z) = plan(
        r#"{"architectures":["Olmo2ForCausalLM"],"model_type":"olmo2","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"intermediate_size":11008,"vocab_size":100352,"max_position_embeddings":4096,"torch_dtype":"float32"}"#,
        None,
    );
    check(&z, dense(32, 32, 128, 4096));
    // Granite 3.3 8B.
    let (_, _, z) = plan(
        r#"{"architectures":["GraniteForCausalLM"],"model_type":"granite","hidden_size":4096,"num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":12800,"vocab_size":49159,"max_position_embeddings":131072,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(40, 8, 128, 131_072));
    // InternLM2.5-7B: `dynamic` RoPE scaling multiplies the length (`_get_and_verify_max_len`).
    let (c, _, z) = plan(
        r#"{"architectures":["InternLM2ForCausalLM"],"model_type":"internlm2","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":92544,"max_position_embeddings":32768,"rope_scaling":{"type":"dynamic","factor":2.0},"torch_dtype":"bfloat16"}"#,
        None,
    );
    assert_eq!(c.derived_max_len, Some(65_536));
    check(&z, dense(32, 8, 128, 65_536));
    // SmolLM3-3B.
    let (_, _, z) = plan(
        r#"{"architectures":["SmolLM3ForCausalLM"],"model_type":"smollm3","hidden_size":2048,"num_hidden_layers":36,"num_attention_heads":16,"num_key_value_heads":4,"intermediate_size":11008,"vocab_size":128256,"max_position_embeddings":65536,"use_sliding_window":false,"sliding_window":null,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(36, 4, 128, 65_536));
    // EXAONE 3.5 7.8B writes `num_layers`.
    let (_, _, z) = plan(
        r#"{"architectures":["ExaoneForCausalLM"],"model_type":"exaone","hidden_size":4096,"num_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":102400,"max_position_embeddings":32768,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(32, 8, 128, 32_768));
    // ERNIE-4.5-0.3B: explicit head_dim.
    let (_, _, z) = plan(
        r#"{"architectures":["Ernie4_5ForCausalLM"],"model_type":"ernie4_5","hidden_size":1024,"num_hidden_layers":18,"num_attention_heads":16,"num_key_value_heads":2,"head_dim":128,"intermediate_size":3072,"vocab_size":103424,"max_position_embeddings":131072,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(18, 2, 128, 131_072));
    // GLM-4-9B-0414.
    let (_, _, z) = plan(
        r#"{"architectures":["Glm4ForCausalLM"],"model_type":"glm4","hidden_size":4096,"num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":2,"head_dim":128,"intermediate_size":13696,"vocab_size":151552,"max_position_embeddings":32768,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(40, 2, 128, 32_768));
    // GLM-4.5-Air (Glm4MoeForCausalLM).
    let (c, _, z) = plan(
        r#"{"architectures":["Glm4MoeForCausalLM"],"model_type":"glm4_moe","hidden_size":4096,"num_hidden_layers":46,"num_attention_heads":96,"num_key_value_heads":8,"head_dim":128,"intermediate_size":10944,"moe_intermediate_size":1408,"n_routed_experts":128,"n_shared_experts":1,"num_experts_per_tok":8,"first_k_dense_replace":1,"vocab_size":151552,"max_position_embeddings":131072,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(46, 8, 128, 131_072));
    assert!(c.rule.contains("generic decoder keys"), "{}", c.rule);
}

#[test]
fn sliding_patterns_olmo3_exaone4() {
    // OLMo 3 7B: 3 sliding (4096) per full layer, 32 layers -> 24 + 8, group size 8:
    // 3 sliding groups + 1 full. Sliding: cdiv(min(4095 + 2 * 8192, 65536), 64) + 1 = 321.
    let types = (0..32)
        .map(|i| {
            if (i + 1) % 4 == 0 {
                "\"full_attention\""
            } else {
                "\"sliding_attention\""
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    let (_, _, z) = plan(
        &format!(
            r#"{{"architectures":["Olmo3ForCausalLM"],"model_type":"olmo3","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"intermediate_size":11008,"vocab_size":100278,"max_position_embeddings":65536,"sliding_window":4096,"layer_types":[{types}],"torch_dtype":"bfloat16"}}"#
        ),
        None,
    );
    assert_eq!((z.group_size, z.num_groups), (8, 4));
    assert_eq!(z.block_bytes, 8 * 64 * 32 * 256 * 2);
    assert_eq!(z.blocks_per_request, 1024 + 3 * 321);
    // EXAONE 4.0 32B: "LLLG" -> 48 sliding + 16 full of 64; group 16, 3 + 1 groups.
    let types = (0..64)
        .map(|i| {
            if (i + 1) % 4 == 0 {
                "\"full_attention\""
            } else {
                "\"sliding_attention\""
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    let (_, _, z) = plan(
        &format!(
            r#"{{"architectures":["Exaone4ForCausalLM"],"model_type":"exaone4","hidden_size":5120,"num_hidden_layers":64,"num_attention_heads":40,"num_key_value_heads":8,"head_dim":128,"intermediate_size":27392,"vocab_size":102400,"max_position_embeddings":131072,"sliding_window":4096,"sliding_window_pattern":"LLLG","layer_types":[{types}],"torch_dtype":"bfloat16"}}"#
        ),
        None,
    );
    assert_eq!((z.group_size, z.num_groups), (16, 4));
    assert_eq!(z.blocks_per_request, 2048 + 3 * 321);
}

#[test]
fn multimodal_wrappers_size_their_language_model() {
    // Qwen2-VL-7B: top-level Qwen2 keys, mrope is not a length scaling.
    let (c, _, z) = plan(
        r#"{"architectures":["Qwen2VLForConditionalGeneration"],"model_type":"qwen2_vl","hidden_size":3584,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"intermediate_size":18944,"vocab_size":152064,"max_position_embeddings":32768,"sliding_window":32768,"use_sliding_window":false,"max_window_layers":28,"rope_scaling":{"type":"mrope","mrope_section":[16,24,24]},"vision_config":{"depth":32,"embed_dim":1280,"mlp_ratio":4,"num_heads":16,"patch_size":14},"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(28, 4, 128, 32_768));
    assert!(
        c.vision.is_some()
            && c.notes
                .iter()
                .any(|n| n.contains("profiling memory is estimated"))
    );
    // Qwen2.5-VL-7B: the same text shape, 128000 positions.
    let (_, _, z) = plan(
        r#"{"architectures":["Qwen2_5_VLForConditionalGeneration"],"model_type":"qwen2_5_vl","hidden_size":3584,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"intermediate_size":18944,"vocab_size":152064,"max_position_embeddings":128000,"use_sliding_window":false,"max_window_layers":28,"rope_scaling":{"type":"mrope","mrope_section":[16,24,24]},"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(28, 4, 128, 128_000));
    // Qwen3-VL-8B: text_config.
    let (c, _, z) = plan(
        r#"{"architectures":["Qwen3VLForConditionalGeneration"],"model_type":"qwen3_vl","text_config":{"model_type":"qwen3_vl_text","hidden_size":4096,"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"intermediate_size":12288,"vocab_size":151936,"max_position_embeddings":262144,"rope_scaling":{"rope_type":"default","mrope_section":[24,20,20]}},"vision_config":{"depth":27,"hidden_size":1152,"intermediate_size":4304,"patch_size":16}}"#,
        None,
    );
    check(&z, dense(36, 8, 128, 262_144));
    assert_eq!(c.language_key.as_deref(), Some("text_config"));
    // Llava-1.5-7B: text_config names only what differs from LlamaConfig (32 layers, 32
    // heads, KV heads = heads).
    let (_, _, z) = plan(
        r#"{"architectures":["LlavaForConditionalGeneration"],"model_type":"llava","text_config":{"architectures":["LlamaForCausalLM"],"max_position_embeddings":4096,"model_type":"llama","rms_norm_eps":1e-05,"torch_dtype":"float16","vocab_size":32064},"vision_config":{"hidden_size":1024,"intermediate_size":4096,"num_hidden_layers":24,"patch_size":14}}"#,
        None,
    );
    check(&z, dense(32, 32, 128, 4096));
    // Llava-Next (v1.6 Mistral 7B): MistralConfig defaults, no window.
    let (_, _, z) = plan(
        r#"{"architectures":["LlavaNextForConditionalGeneration"],"model_type":"llava_next","text_config":{"architectures":["MistralForCausalLM"],"model_type":"mistral","max_position_embeddings":32768,"sliding_window":null,"vocab_size":32064,"rope_theta":1000000.0}}"#,
        None,
    );
    check(&z, dense(32, 8, 128, 32_768));
    // Pixtral-12B (HF layout).
    let (_, _, z) = plan(
        r#"{"architectures":["LlavaForConditionalGeneration"],"model_type":"llava","text_config":{"model_type":"mistral","hidden_size":5120,"num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"intermediate_size":14336,"vocab_size":131072,"max_position_embeddings":1024000,"sliding_window":null},"vision_config":{"model_type":"pixtral","hidden_size":1024,"num_hidden_layers":24,"intermediate_size":4096,"patch_size":16}}"#,
        Some(131_072),
    );
    check(&z, dense(40, 8, 128, 131_072));
    // InternVL3-8B: llm_config (Qwen2).
    let (c, _, z) = plan(
        r#"{"architectures":["InternVLChatModel"],"model_type":"internvl_chat","llm_config":{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":3584,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"intermediate_size":18944,"vocab_size":151674,"max_position_embeddings":32768,"use_sliding_window":false,"max_window_layers":70},"vision_config":{"hidden_size":1024,"num_hidden_layers":24,"intermediate_size":4096,"patch_size":14}}"#,
        None,
    );
    check(&z, dense(28, 4, 128, 32_768));
    assert_eq!(c.language_key.as_deref(), Some("llm_config"));
    // MiniCPM-V 2.6: Qwen2 keys at the top level.
    let (_, _, z) = plan(
        r#"{"architectures":["MiniCPMV"],"model_type":"minicpmv","hidden_size":3584,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"intermediate_size":18944,"vocab_size":151666,"max_position_embeddings":32768,"use_sliding_window":false,"max_window_layers":28,"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, dense(28, 4, 128, 32_768));
    // Phi-4-multimodal: LongRoPE defaults to original_max_position_embeddings.
    let (c, _, z) = plan(
        r#"{"architectures":["Phi4MMForCausalLM"],"model_type":"phi4mm","hidden_size":3072,"num_hidden_layers":32,"num_attention_heads":24,"num_key_value_heads":8,"intermediate_size":8192,"vocab_size":200064,"max_position_embeddings":131072,"original_max_position_embeddings":4096,"rope_scaling":{"type":"longrope","long_factor":[1.0],"short_factor":[1.0]},"torch_dtype":"bfloat16"}"#,
        None,
    );
    assert_eq!(c.derived_max_len, Some(4096));
    check(&z, dense(32, 8, 128, 4096));
}

#[test]
fn mllama_and_gemma3n() {
    // Llama 3.2 11B Vision: 8 cross-attention layers keep the encoder's 4 tiles x 1601
    // tokens (`CrossAttentionSpec`, cdiv(6404, 64) = 101 blocks); 32 self-attention layers.
    // Both pages are equal (8 KV heads, 128), 32 vs 8 layers -> group size 8: 4 + 1 groups.
    let (c, _, z) = plan(
        r#"{"architectures":["MllamaForConditionalGeneration"],"model_type":"mllama","text_config":{"model_type":"mllama_text_model","hidden_size":4096,"num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":131072,"cross_attention_layers":[3,8,13,18,23,28,33,38],"rope_scaling":{"rope_type":"llama3","factor":8.0}}}"#,
        Some(8192),
    );
    assert_eq!((z.group_size, z.num_groups), (8, 5));
    assert_eq!(z.blocks_per_request, 4 * 128 + 101);
    assert!(c
        .notes
        .iter()
        .any(|n| n.contains("last served by vLLM 0.10.2")));
    // Gemma 3n E4B: 35 layers in a 4:1 sliding (512) pattern, the last 15 reuse earlier
    // KV: 16 sliding + 4 full layers cache. Group size 4: 4 sliding groups + 1 full.
    let types = (0..35)
        .map(|i| {
            if (i + 1) % 5 == 0 {
                "\"full_attention\""
            } else {
                "\"sliding_attention\""
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    let (_, _, z) = plan(
        &format!(
            r#"{{"architectures":["Gemma3nForConditionalGeneration"],"model_type":"gemma3n","text_config":{{"model_type":"gemma3n_text","hidden_size":2048,"num_hidden_layers":35,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":256,"intermediate_size":16384,"vocab_size":262400,"max_position_embeddings":32768,"sliding_window":512,"num_kv_shared_layers":15,"layer_types":[{types}]}}}}"#
        ),
        None,
    );
    assert_eq!((z.group_size, z.num_groups), (4, 5));
    // Sliding: cdiv(min(511 + 16384, 32768), 64) + 1 = 265; full 512.
    assert_eq!(z.blocks_per_request, 512 + 4 * 265);
}

#[test]
fn llama4_chunked_layers_are_full_without_the_hybrid_manager() {
    // Llama 4 Scout: 48 layers, every 4th without RoPE (full), the rest chunked (8192); the
    // hybrid manager is off by default with chunked attention, so one full group of 48.
    let nope = (0..48)
        .map(|i| if (i + 1) % 4 == 0 { "0" } else { "1" })
        .collect::<Vec<_>>()
        .join(",");
    let (c, _, z) = plan(
        &format!(
            r#"{{"architectures":["Llama4ForConditionalGeneration"],"model_type":"llama4","text_config":{{"model_type":"llama4_text","hidden_size":5120,"num_hidden_layers":48,"num_attention_heads":40,"num_key_value_heads":8,"head_dim":128,"intermediate_size":8192,"intermediate_size_mlp":16384,"num_local_experts":16,"num_experts_per_tok":1,"vocab_size":202048,"max_position_embeddings":10485760,"attention_chunk_size":8192,"no_rope_layers":[{nope}],"rope_scaling":{{"rope_type":"llama3","factor":16.0}}}}}}"#
        ),
        Some(131_072),
    );
    assert_eq!(
        c.layers
            .iter()
            .filter(|k| matches!(k, crate::config::LayerKind::Chunked(8192)))
            .count(),
        36
    );
    check(&z, dense(48, 8, 128, 131_072));
}

#[test]
fn mla_families_glm47_flash_and_deepseek_v32() {
    // GLM-4.7-Flash (Glm4MoeLiteForCausalLM): MLA 512 + 64 -> 1152 B/token/layer, 47 layers.
    let (_, spec, z) = plan(
        r#"{"architectures":["Glm4MoeLiteForCausalLM"],"model_type":"glm4_moe_lite","hidden_size":2048,"num_hidden_layers":47,"num_attention_heads":20,"num_key_value_heads":20,"kv_lora_rank":512,"q_lora_rank":768,"qk_rope_head_dim":64,"qk_nope_head_dim":192,"v_head_dim":256,"intermediate_size":10240,"moe_intermediate_size":1536,"n_routed_experts":64,"n_shared_experts":1,"num_experts_per_tok":4,"first_k_dense_replace":1,"vocab_size":154880,"max_position_embeddings":202752,"torch_dtype":"bfloat16"}"#,
        None,
    );
    assert_eq!(spec.groups[0].head_dim_k, 576);
    check(&z, (47 * 64 * 1152, 202_752u64.div_ceil(64)));
    // DeepSeek-V3.2: 61 MLA layers + 61 indexer caches (128 fp8 + one f32 scale = 132 B),
    // one uniform-type group.
    let (_, _, z) = plan(
        r#"{"architectures":["DeepseekV32ForCausalLM"],"model_type":"deepseek_v32","hidden_size":7168,"num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,"kv_lora_rank":512,"q_lora_rank":1536,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,"index_head_dim":128,"index_n_heads":64,"index_topk":2048,"intermediate_size":18432,"moe_intermediate_size":2048,"n_routed_experts":256,"n_shared_experts":1,"num_experts_per_tok":8,"first_k_dense_replace":3,"vocab_size":129280,"max_position_embeddings":163840,"rope_scaling":{"type":"yarn","factor":40,"original_max_position_embeddings":4096},"torch_dtype":"bfloat16"}"#,
        None,
    );
    check(&z, (61 * 64 * (1152 + 132), 163_840 / 64));
}

#[test]
fn mamba_hybrids_jamba_bamba_nemotron_h() {
    // Jamba 1.5 Mini: attention at i % 8 == 4 (4 layers), Mamba1 elsewhere (28).
    // State: d_inner 8192: conv 8192 * 3 * 2 + SSM 8192 * 16 * 2 = 311296 B.
    // Attention 4096 B/token -> block 64 * cdiv(311296, 64 * 4096) = 128; page 524288.
    // Group size 4: 1 attention + 7 state groups (2 pages each, Mamba1 `align`).
    let (_, spec, z) = plan(
        r#"{"architectures":["JambaForCausalLM"],"model_type":"jamba","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"num_experts":16,"num_experts_per_tok":2,"attn_layer_period":8,"attn_layer_offset":4,"mamba_d_state":16,"mamba_d_conv":4,"mamba_expand":2,"vocab_size":65536,"max_position_embeddings":262144,"torch_dtype":"bfloat16"}"#,
        Some(65_536),
    );
    assert_eq!(spec.block_size, 128);
    assert_eq!(
        (z.group_size, z.num_groups, z.block_bytes),
        (4, 8, 4 * 524_288)
    );
    assert_eq!(z.blocks_per_request, 65_536 / 128 + 7 * 2);
    // Bamba 9B: attention at [9, 18, 27]; Mamba2 state: conv (8192 + 2*128) * 3 * 2 =
    // 50688 + SSM 128 * 64 * 128 * 2 = 2097152 -> 2147840 B; block 64 * 9 = 576.
    // 3 attention vs 29 state layers: group 3, 1 + 10 groups, 3 pages per state group.
    let (c, spec, z) = plan(
        r#"{"architectures":["BambaForCausalLM"],"model_type":"bamba","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"attn_layer_indices":[9,18,27],"mamba_n_heads":128,"mamba_d_head":64,"mamba_d_state":128,"mamba_n_groups":1,"mamba_expand":2,"mamba_d_conv":4,"vocab_size":128256,"max_position_embeddings":262144,"torch_dtype":"bfloat16"}"#,
        Some(65_536),
    );
    assert_eq!(spec.block_size, 576);
    assert_eq!((z.group_size, z.num_groups), (3, 11));
    assert_eq!(z.blocks_per_request, 65_536u64.div_ceil(576) + 10 * 3);
    assert!(c.notes.iter().any(|n| n.contains("0.23.0")));
    // Nemotron-H 8B: the pattern string; the SSM state is float32 by default:
    // conv (8192 + 2*8*128) * 3 * 2 = 61440 + SSM 128 * 64 * 128 * 4 = 4194304 -> block
    // 64 * cdiv(4255744, 262144) = 1088. 4 attention, 25 Mamba2, 23 MLP-only blocks:
    // group size 4, 1 + 7 groups.
    let pattern = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-";
    let (c, spec, z) = plan(
        &format!(
            r#"{{"architectures":["NemotronHForCausalLM"],"model_type":"nemotron_h","hidden_size":4096,"num_hidden_layers":{},"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"intermediate_size":21504,"hybrid_override_pattern":"{pattern}","mamba_num_heads":128,"mamba_head_dim":64,"ssm_state_size":128,"n_groups":8,"conv_kernel":4,"vocab_size":131072,"max_position_embeddings":8192,"torch_dtype":"bfloat16"}}"#,
            pattern.len()
        ),
        None,
    );
    assert_eq!(
        c.state.unwrap().bytes_per_rank(1, 2).unwrap(),
        61_440 + 4_194_304
    );
    assert_eq!(spec.block_size, 1088);
    let (att, st) = (
        pattern.matches('*').count() as u64,
        pattern.matches('M').count() as u64,
    );
    assert_eq!((att, st), (4, 25));
    assert_eq!((z.group_size, z.num_groups), (4, 1 + 7));
    assert_eq!(z.blocks_per_request, 8192u64.div_ceil(1088) + 7 * 3);
}

#[test]
fn mamba2_hybrids_granite4_falcon_h1_zamba2() {
    // granite-4.0-h-tiny-like: layer_types of "mamba"/"attention" (4 of 40 attention).
    let types = (0..40)
        .map(|i| {
            if i % 10 == 5 {
                "\"attention\""
            } else {
                "\"mamba\""
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    let (_, spec, z) = plan(
        &format!(
            r#"{{"architectures":["GraniteMoeHybridForCausalLM"],"model_type":"granitemoehybrid","hidden_size":1536,"num_hidden_layers":40,"num_attention_heads":12,"num_key_value_heads":4,"intermediate_size":512,"num_local_experts":62,"num_experts_per_tok":6,"layer_types":[{types}],"mamba_n_heads":48,"mamba_d_head":64,"mamba_d_state":128,"mamba_n_groups":1,"mamba_expand":2,"mamba_d_conv":4,"vocab_size":100352,"max_position_embeddings":131072,"torch_dtype":"bfloat16"}}"#
        ),
        None,
    );
    // State: conv (3072 + 256) * 3 * 2 = 19968 + SSM 48 * 64 * 128 * 2 = 786432 -> 806400;
    // attention 4 * 256 * 2 = 2048 B/token -> block 64 * cdiv(806400, 131072) = 448.
    assert_eq!(spec.block_size, 448);
    assert_eq!((z.group_size, z.num_groups), (4, 10));
    assert_eq!(z.blocks_per_request, 131_072u64.div_ceil(448) + 9 * 3);
    // Falcon-H1-7B: attention and Mamba2 in every layer (44 + 44, one group each).
    // State: conv (3072 + 512) * 3 * 2 = 21504 + SSM 24 * 128 * 256 * 2 = 1572864;
    // attention 2 * 512 * 2 = 2048 B/token -> block 64 * cdiv(1594368, 131072) = 832.
    let (_, spec, z) = plan(
        r#"{"architectures":["FalconH1ForCausalLM"],"model_type":"falcon_h1","hidden_size":3072,"num_hidden_layers":44,"num_attention_heads":12,"num_key_value_heads":2,"head_dim":256,"intermediate_size":12288,"mamba_d_ssm":3072,"mamba_n_heads":24,"mamba_d_head":128,"mamba_d_state":256,"mamba_n_groups":1,"mamba_d_conv":4,"vocab_size":130049,"max_position_embeddings":262144,"torch_dtype":"bfloat16"}"#,
        Some(32_768),
    );
    assert_eq!(spec.block_size, 832);
    assert_eq!((z.group_size, z.num_groups), (44, 2));
    assert_eq!(z.blocks_per_request, 32_768u64.div_ceil(832) + 3);
    // Zamba2-2.7B: Mamba2 in all 54 layers plus 9 shared-attention caches (head dim from
    // `attention_head_dim`, `Zamba2ModelArchConfigConvertor`).
    let (_, _, z) = plan(
        r#"{"architectures":["Zamba2ForCausalLM"],"model_type":"zamba2","hidden_size":2560,"num_hidden_layers":54,"num_attention_heads":32,"num_key_value_heads":32,"head_dim":160,"attention_head_dim":160,"intermediate_size":10240,"hybrid_layer_ids":[6,11,17,23,29,35,41,47,51],"n_mamba_heads":80,"mamba_headdim":64,"mamba_d_state":64,"mamba_ngroups":1,"mamba_expand":2,"mamba_d_conv":4,"vocab_size":32000,"max_position_embeddings":4096,"torch_dtype":"bfloat16"}"#,
        None,
    );
    // 9 attention vs 54 state layers: group 9, 1 + 6 groups.
    assert_eq!((z.group_size, z.num_groups), (9, 7));
}

#[test]
fn gated_deltanet_hybrids_qwen3_next_and_qwen35() {
    // Qwen3-Next-80B-A3B: every 4th layer attention (12 of 48), GDN elsewhere.
    // GDN state: conv (128*16*2 + 128*32) * 3 * 2 = 49152 + recurrent 32 * 128 * 128 * 2 =
    // 1048576 -> 1097728 B; attention 2 * 512 * 2 = 2048 B/token -> block 64 * 9 = 576.
    // 12 vs 36 layers: group 12, 1 + 3 groups, 2 pages per GDN group.
    let (c, spec, z) = plan(
        r#"{"architectures":["Qwen3NextForCausalLM"],"model_type":"qwen3_next","hidden_size":2048,"num_hidden_layers":48,"num_attention_heads":16,"num_key_value_heads":2,"head_dim":256,"intermediate_size":5120,"moe_intermediate_size":512,"shared_expert_intermediate_size":512,"num_experts":512,"num_experts_per_tok":10,"full_attention_interval":4,"linear_num_key_heads":16,"linear_num_value_heads":32,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"vocab_size":151936,"max_position_embeddings":262144,"torch_dtype":"bfloat16"}"#,
        None,
    );
    assert_eq!(c.state.unwrap().bytes_per_rank(1, 2).unwrap(), 1_097_728);
    assert_eq!(spec.block_size, 576);
    assert_eq!((z.group_size, z.num_groups), (12, 4));
    assert_eq!(z.blocks_per_request, 262_144u64.div_ceil(576) + 3 * 2);
    // Qwen3.5 (multimodal wrapper, text_config with layer_types).
    let types = (0..64)
        .map(|i| {
            if (i + 1) % 4 == 0 {
                "\"full_attention\""
            } else {
                "\"linear_attention\""
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    let (c, _, z) = plan(
        &format!(
            r#"{{"architectures":["Qwen3_5ForConditionalGeneration"],"model_type":"qwen3_5","text_config":{{"model_type":"qwen3_5_text","hidden_size":5120,"num_hidden_layers":64,"num_attention_heads":24,"num_key_value_heads":4,"head_dim":256,"intermediate_size":17408,"layer_types":[{types}],"linear_num_key_heads":16,"linear_num_value_heads":48,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"vocab_size":248320,"max_position_embeddings":262144}}}}"#
        ),
        None,
    );
    // State: conv (4096 + 6144) * 3 * 2 = 61440 + 48 * 128 * 128 * 2 = 1572864 -> 1634304;
    // attention 4 * 512 * 2 = 4096 B/token -> block 64 * cdiv(1634304, 262144) = 448.
    assert_eq!(c.state.unwrap().bytes_per_rank(1, 2).unwrap(), 1_634_304);
    assert_eq!((z.group_size, z.num_groups), (16, 4));
    assert_eq!(z.blocks_per_request, 262_144u64.div_ceil(448) + 3 * 2);
    // Every released Qwen3.5 config states `"mamba_ssm_dtype": "float32"`, which vLLM makes
    // the SSM cache's dtype (`Qwen3_5ForConditionalGenerationConfig.verify_and_update_config`,
    // 0.19.0): conv 61440 + 48 * 128 * 128 * 4 = 3145728 -> 3207168 B a layer; block 64 *
    // cdiv(3207168, 262144) = 64 * 13 = 832 tokens.
    let (c, _, z) = plan(
        &format!(
            r#"{{"architectures":["Qwen3_5ForConditionalGeneration"],"model_type":"qwen3_5","text_config":{{"model_type":"qwen3_5_text","hidden_size":5120,"num_hidden_layers":64,"num_attention_heads":24,"num_key_value_heads":4,"head_dim":256,"intermediate_size":17408,"layer_types":[{types}],"linear_num_key_heads":16,"linear_num_value_heads":48,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"mamba_ssm_dtype":"float32","vocab_size":248320,"max_position_embeddings":262144}}}}"#
        ),
        None,
    );
    assert_eq!(c.state.unwrap().bytes_per_rank(1, 2).unwrap(), 3_207_168);
    assert_eq!(z.blocks_per_request, 262_144u64.div_ceil(832) + 3 * 2);
}

#[test]
fn modelopt_fp8_kv_and_unknown_names_still_plan() {
    // ModelOpt FP8 checkpoints ask for an fp8 cache (`kv_cache_quant_algo`).
    let c = ModelConfig::from_json_str(r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"max_position_embeddings":131072,"quantization_config":{"quant_method":"modelopt","quant_algo":"FP8","kv_cache_quant_algo":"FP8"}}"#).unwrap();
    assert_eq!(c.kv_cache_quant.as_deref(), Some("fp8"));
    // An architecture memplan has never heard of, with the standard keys, plans.
    let (c, _, z) = plan(
        r#"{"architectures":["BrandNewForCausalLM"],"hidden_size":2048,"num_hidden_layers":24,"num_attention_heads":16,"num_key_value_heads":4,"vocab_size":50000,"max_position_embeddings":16384}"#,
        None,
    );
    assert!(
        c.rule.contains("not in memplan's family table"),
        "{}",
        c.rule
    );
    check(&z, dense(24, 4, 128, 16_384));
}

/// Gemma 4 31B (`google/gemma-4-31B-it`'s text config): 60 layers, every sixth full attention.
/// vLLM's gemma4.py (`Gemma4DecoderLayer.__init__`) gives the full layers `global_head_dim`
/// 512 and, with `attention_k_eq_v`, `num_global_key_value_heads` 4; the sliding layers keep
/// 16 KV heads of 256.
fn gemma4_31b(k_eq_v: bool) -> String {
    let types = (0..60)
        .map(|i| {
            if (i + 1) % 6 == 0 {
                "\"full_attention\""
            } else {
                "\"sliding_attention\""
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    format!(
        r#"{{"architectures":["Gemma4ForConditionalGeneration"],"model_type":"gemma4","text_config":{{"model_type":"gemma4_text","hidden_size":5376,"num_hidden_layers":60,"num_attention_heads":32,"num_key_value_heads":16,"head_dim":256,"global_head_dim":512,"num_global_key_value_heads":4,"attention_k_eq_v":{k_eq_v},"intermediate_size":21504,"vocab_size":262144,"max_position_embeddings":262144,"sliding_window":1024,"num_kv_shared_layers":0,"use_double_wide_mlp":false,"tie_word_embeddings":true,"layer_types":[{types}]}}}}"#
    )
}

#[test]
fn gemma4_full_layers_keep_their_own_heads() {
    use memplan_core::kv::AttentionKind;
    let c = ModelConfig::from_json_str(&gemma4_31b(true)).unwrap_or_else(|e| panic!("{e}"));
    let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
    let shape = |a: AttentionKind| {
        spec.groups
            .iter()
            .filter(|g| g.attention == a)
            .map(|g| (g.num_layers, g.kv_heads, g.head_dim_k, g.head_dim_v))
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(AttentionKind::Full), vec![(10, 4, 512, 512)]);
    assert_eq!(
        shape(AttentionKind::SlidingWindow { window: 1024 }),
        vec![(50, 16, 256, 256)]
    );
    // Full-context KV per token: 10 x 2 x 4 x 512 x 2 B = 81,920 (not the sliding layers'
    // shape, 163,840).
    let full: u64 = spec
        .groups
        .iter()
        .filter(|g| g.attention == AttentionKind::Full)
        .map(|g| u64::from(g.num_layers) * 2 * u64::from(g.kv_heads) * u64::from(g.head_dim_k) * 2)
        .sum();
    assert_eq!(full, 81_920);
    assert!(c.rule.contains("global_head_dim"), "{}", c.rule);
    // Without k_eq_v the full layers keep `num_key_value_heads` at the global head size.
    let c = ModelConfig::from_json_str(&gemma4_31b(false)).unwrap();
    let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
    assert!(spec
        .groups
        .iter()
        .any(|g| g.attention == AttentionKind::Full && (g.kv_heads, g.head_dim_k) == (16, 512)));
    // The weights count each layer's projections at its own size: the global layers' Q and
    // O (32 x 512) are wider than the sliding layers' (32 x 256).
    let plain = ModelConfig::from_json_str(&gemma4_31b(true).replace(
        r#""global_head_dim":512,"num_global_key_value_heads":4,"attention_k_eq_v":true,"#,
        "",
    ))
    .unwrap();
    let w = |c: &ModelConfig| crate::weights::params_per_rank(c, 1).unwrap().attention;
    assert!(w(&ModelConfig::from_json_str(&gemma4_31b(true)).unwrap()) > w(&plain));
}

#[test]
fn a_shape_key_nothing_reads_is_refused() {
    // `global_head_dim` without the `layer_types` that say which layers are global.
    let e = ModelConfig::from_json_str(
        r#"{"architectures":["Gemma4ForCausalLM"],"model_type":"gemma4_text","hidden_size":5376,"num_hidden_layers":60,"num_attention_heads":32,"num_key_value_heads":16,"head_dim":256,"global_head_dim":512,"intermediate_size":21504,"vocab_size":262144,"max_position_embeddings":262144}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("global_head_dim") && e.contains("layer_types"),
        "{e}"
    );
}

#[test]
fn a_per_layer_list_with_prediction_layers_is_refused() {
    // DeepSeek-V4-Flash: `compress_ratios` has 44 entries for 43 layers and one multi-token
    // prediction layer; its compressed attention is nothing memplan sizes, so no plan.
    let ratios = std::iter::once("0,0".to_string())
        .chain((0..20).map(|_| "4,128".to_string()))
        .chain(std::iter::once("4,0".to_string()))
        .collect::<Vec<_>>()
        .join(",");
    let json = format!(
        r#"{{"architectures":["DeepseekV4ForCausalLM"],"model_type":"deepseek_v4","hidden_size":4096,"num_hidden_layers":43,"num_attention_heads":64,"num_key_value_heads":1,"head_dim":512,"sliding_window":128,"num_nextn_predict_layers":1,"moe_intermediate_size":2048,"n_routed_experts":256,"n_shared_experts":1,"num_experts_per_tok":6,"vocab_size":129280,"max_position_embeddings":1048576,"compress_ratios":[{ratios}]}}"#
    );
    let e = ModelConfig::from_json_str(&json).unwrap_err().to_string();
    assert!(
        e.contains("compress_ratios") && e.contains("44 entries"),
        "{e}"
    );
    // The generic rule, on a key no family table names: one entry per layer and per
    // prediction layer.
    let json = json.replace("compress_ratios", "window_ratio_list");
    let e = ModelConfig::from_json_str(&json).unwrap_err().to_string();
    assert!(
        e.contains("window_ratio_list") && e.contains("43 + 1"),
        "{e}"
    );
}

#[test]
fn chatglm_names_its_vocabulary_and_mlp_its_own_way() {
    // THUDM/chatglm3-6b: `padded_vocab_size`, `ffn_hidden_size`, 2 KV groups
    // (`multi_query_group_num`); vLLM's chatglm.py reads those. 28 x 2 x 2 x 128 x 2 B =
    // 28,672 B of KV per token.
    use memplan_core::kv::AttentionKind;
    let c = ModelConfig::from_json_str(
        r#"{"architectures":["ChatGLMModel"],"model_type":"chatglm","num_layers":28,"padded_vocab_size":65024,"hidden_size":4096,"ffn_hidden_size":13696,"kv_channels":128,"num_attention_heads":32,"seq_length":8192,"multi_query_attention":true,"multi_query_group_num":2,"add_qkv_bias":true,"torch_dtype":"float16"}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.vocab_size, c.intermediate_size), (65_024, 13_696));
    let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
    let g = &spec.groups[0];
    assert_eq!(
        (g.attention, g.num_layers, g.kv_heads, g.head_dim_k),
        (AttentionKind::Full, 28, 2, 128)
    );
}

#[test]
fn a_model_without_attention_is_refused_as_such() {
    // tiiuae/falcon-mamba-7b: Mamba layers only, no attention heads to size.
    let e = ModelConfig::from_json_str(
        r#"{"architectures":["FalconMambaForCausalLM"],"model_type":"falcon_mamba","hidden_size":4096,"num_hidden_layers":64,"state_size":16,"conv_kernel":4,"expand":16,"intermediate_size":8192,"vocab_size":65024,"torch_dtype":"bfloat16"}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("FalconMambaForCausalLM") && e.contains("no attention"),
        "{e}"
    );
}

#[test]
fn per_layer_expert_figures_alike_in_every_layer_are_read() {
    // tencent/Hunyuan-A13B-Instruct writes `moe_topk`, `moe_intermediate_size` and
    // `num_shared_expert` once per layer (hunyuan_v1.py indexes them by layer id).
    let list = |v: u64| vec![v.to_string(); 32].join(",");
    let json = format!(
        r#"{{"architectures":["HunYuanMoEV1ForCausalLM"],"model_type":"hunyuan_v1_moe","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"intermediate_size":3072,"vocab_size":128167,"torch_dtype":"bfloat16","num_experts":64,"use_mixed_mlp_moe":1,"moe_intermediate_size":[{}],"moe_topk":[{}],"num_shared_expert":[{}]}}"#,
        list(3072),
        list(8),
        list(1)
    );
    let c = ModelConfig::from_json_str(&json).unwrap_or_else(|e| panic!("{e}"));
    let m = c.moe.expect("routed experts");
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (64, 8, 3072, 3072)
    );
    let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
    assert_eq!(
        (spec.groups[0].num_layers, spec.groups[0].kv_heads),
        (32, 8)
    );
    // A list whose entries differ is refused by name.
    let mixed = json.replacen("8,8,", "8,4,", 1);
    let e = ModelConfig::from_json_str(&mixed).unwrap_err().to_string();
    assert!(
        e.contains("moe_topk") && e.contains("varies by layer"),
        "{e}"
    );
    // Cross-layer attention shares KV between layers: refused.
    let cla = json.replace(
        r#""num_experts":64"#,
        r#""num_experts":64,"use_cla":true,"cla_share_factor":2"#,
    );
    let e = ModelConfig::from_json_str(&cla).unwrap_err().to_string();
    assert!(e.contains("use_cla"), "{e}");
}

#[test]
fn gemma4_moe_keeps_its_dense_mlp_and_per_layer_embeddings_are_weights() {
    // Gemma 4 26B-A4B-shaped: every layer has its dense MLP and, with `enable_moe_block`,
    // 128 experts of 704 beside it (gemma4.py `Gemma4DecoderLayer`), top 8 by
    // `top_k_experts`.
    let moe = gemma4_31b(true).replace(
        r#""intermediate_size":21504"#,
        r#""intermediate_size":2112,"enable_moe_block":true,"num_experts":128,"top_k_experts":8,"moe_intermediate_size":704"#,
    );
    let c = ModelConfig::from_json_str(&moe).unwrap_or_else(|e| panic!("{e}"));
    let m = c.moe.expect("experts");
    assert_eq!(
        (
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            m.shared_intermediate
        ),
        (128, 8, 704, 2112)
    );
    // Gemma 4 E2B-shaped: a per-layer input table of 262,144 x 35 x 256 (2.35B parameters)
    // beside the token embedding.
    let e2b = gemma4_31b(true).replace(
        r#""vocab_size":262144"#,
        r#""vocab_size":262144,"hidden_size_per_layer_input":256,"vocab_size_per_layer_input":262144"#,
    );
    let w = |j: &str| {
        crate::weights::params_per_rank(&ModelConfig::from_json_str(j).unwrap(), 1)
            .unwrap()
            .total()
    };
    let table = 262_144u64 * 60 * 256;
    assert!(
        w(&e2b) - w(&gemma4_31b(true)) >= table,
        "{}",
        w(&e2b) - w(&gemma4_31b(true))
    );
}

#[test]
fn vision_towers_are_sized_by_their_own_width_and_mlp() {
    // Qwen2-VL (allenai/olmOCR-7B): the tower is `embed_dim` 1280 wide with a GELU MLP of
    // 4 x 1280; `hidden_size` 3584 is the merger's output. Pixtral (LightOnOCR-2-1B): a SiLU
    // tower with a gated MLP.
    let lm = r#""hidden_size":3584,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"intermediate_size":18944,"vocab_size":152064,"max_position_embeddings":32768"#;
    let c = ModelConfig::from_json_str(&format!(
        r#"{{"architectures":["Qwen2VLForConditionalGeneration"],"model_type":"qwen2_vl",{lm},"vision_config":{{"depth":32,"embed_dim":1280,"mlp_ratio":4,"num_heads":16,"hidden_size":3584,"patch_size":14}}}}"#
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let v = c.vision.expect("vision");
    assert_eq!((v.hidden, v.intermediate, v.gated), (1280, 5120, false));
    let c = ModelConfig::from_json_str(&format!(
        r#"{{"architectures":["LightOnOCRForConditionalGeneration"],"model_type":"mistral3","text_config":{{"model_type":"qwen3",{lm}}},"vision_config":{{"model_type":"pixtral","hidden_act":"silu","hidden_size":1024,"intermediate_size":4096,"num_hidden_layers":24,"patch_size":14}}}}"#
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.vision.expect("vision").gated);
    // LLaVA-NeXT's image tile sizes are not a per-layer list, whatever their count.
    let pins = vec!["[336,672]"; 28].join(",");
    assert!(ModelConfig::from_json_str(&format!(
        r#"{{"architectures":["LlavaNextForConditionalGeneration"],"model_type":"llava_next","image_grid_pinpoints":[{pins}],"text_config":{{"model_type":"qwen2",{lm}}}}}"#
    ))
    .is_ok());
}

#[test]
fn two_matrix_mlps_are_counted_as_two() {
    // Falcon's MLP is dense_h_to_4h and dense_4h_to_h (falcon.py `FalconMLP`): two matrices
    // of hidden x 4 hidden, not Llama's three.
    let body = r#""hidden_size":4544,"n_layer":32,"n_head":71,"multi_query":true,"vocab_size":65024,"max_position_embeddings":2048}"#;
    let w = |arch: &str| {
        let c = ModelConfig::from_json_str(&format!(r#"{{"architectures":["{arch}"],{body}"#))
            .unwrap_or_else(|e| panic!("{e}"));
        crate::weights::params_per_rank(&c, 1).unwrap().mlp
    };
    assert_eq!(w("FalconForCausalLM"), 32 * 2 * 4544 * 4 * 4544);
    assert_eq!(w("LlamaForCausalLM"), 32 * 3 * 4544 * 4 * 4544);
}

#[test]
fn mamba_cache_dtype_flags_override_the_state_dtype() {
    // vLLM 0.19.0 `mamba_utils.py`, `MambaStateDtypeCalculator._mamba_state_dtype`: the conv
    // state takes `--mamba-cache-dtype` (`auto`: the model dtype), the SSM state
    // `--mamba-ssm-cache-dtype`, or the conv state's dtype when `auto`; before that,
    // `NemotronHForCausalLMConfig.verify_and_update_config` (`models/config.py`) sets an
    // `auto` SSM dtype to the config's `mamba_ssm_cache_dtype`.
    use crate::arch::state::MambaDtype::{Float16, Float32};
    use memplan_core::kv::AttentionKind;
    let state_of = |c: &ModelConfig, cache, ssm| {
        let opts = SpecOptions {
            state_pages: (1, 1),
            hybrid_block_align: 16,
            dtype_bytes: 2,
            mamba_cache_dtype: cache,
            mamba_ssm_cache_dtype: ssm,
            nemotron_h_ssm_default: Float32,
            nemotron_h_vl_ssm_rule: true,
        };
        let spec = c.kv_spec_with(KvDtype::Bf16, 16, 1, &opts).unwrap();
        let bytes = spec
            .groups
            .iter()
            .find_map(|g| match g.attention {
                AttentionKind::State { bytes, .. } => Some(bytes),
                _ => None,
            })
            .unwrap();
        (bytes, spec.block_size)
    };
    // Nemotron-3-Nano-30B-A3B (bf16, `mamba_ssm_cache_dtype` "float32"): 64 Mamba2 heads of
    // 64, 8 groups of state 128, kernel 4. Conv (64 x 64 + 2 x 8 x 128) x 3 = 18,432
    // elements, SSM 64 x 64 x 128 = 524,288. An attention layer's token: 2 KV heads x 128 x
    // (K + V) x 2 B = 1,024 B, so the block is 16 x cdiv(state, 16 x 1,024).
    let c = super::tests_weights::real("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    // auto, auto: conv 18,432 x 2 = 36,864 + SSM (the config's float32) 524,288 x 4 =
    // 2,097,152: 2,134,016; block 16 x cdiv(2,134,016, 16,384) = 16 x 131 = 2,096.
    assert_eq!(state_of(&c, None, None), (2_134_016, 2_096));
    // --mamba-ssm-cache-dtype float16: SSM 524,288 x 2 = 1,048,576, conv 36,864:
    // 1,085,440; block 16 x cdiv(1,085,440, 16,384) = 16 x 67 = 1,072.
    assert_eq!(state_of(&c, None, Some(Float16)), (1_085_440, 1_072));
    // --mamba-cache-dtype float32 alone: conv 18,432 x 4 = 73,728, the SSM still the
    // config's float32 (2,097,152): 2,170,880; block 16 x cdiv(2,170,880, 16,384) = 16 x 133
    // = 2,128.
    assert_eq!(state_of(&c, Some(Float32), None), (2_170_880, 2_128));
    // Both: conv 73,728 + SSM 1,048,576 = 1,122,304; block 16 x 69 = 1,104.
    assert_eq!(
        state_of(&c, Some(Float32), Some(Float16)),
        (1_122_304, 1_104)
    );
    // Qwen3-Next-80B-A3B (no family rule for the SSM dtype): gated DeltaNet conv (2 x 128 x
    // 16 + 128 x 32) x 3 = 24,576 elements, recurrent 32 x 128 x 128 = 524,288. auto: both
    // in bf16, 49,152 + 1,048,576 = 1,097,728. --mamba-cache-dtype float32: both in float32,
    // 98,304 + 2,097,152 = 2,195,456. With --mamba-ssm-cache-dtype float16 beside it: 98,304
    // + 1,048,576 = 1,146,880.
    let (q, _, _) = plan(
        r#"{"architectures":["Qwen3NextForCausalLM"],"model_type":"qwen3_next","hidden_size":2048,"num_hidden_layers":48,"num_attention_heads":16,"num_key_value_heads":2,"head_dim":256,"intermediate_size":5120,"moe_intermediate_size":512,"shared_expert_intermediate_size":512,"num_experts":512,"num_experts_per_tok":10,"full_attention_interval":4,"linear_num_key_heads":16,"linear_num_value_heads":32,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"vocab_size":151936,"max_position_embeddings":262144,"torch_dtype":"bfloat16"}"#,
        None,
    );
    assert_eq!(state_of(&q, None, None).0, 1_097_728);
    assert_eq!(state_of(&q, Some(Float32), None).0, 2_195_456);
    assert_eq!(state_of(&q, Some(Float32), Some(Float16)).0, 1_146_880);
    // A config's SSM dtype other than the float names vLLM sizes is refused by its key.
    let mut v = super::tests_weights::real_json("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    v["mamba_ssm_cache_dtype"] = serde_json::Value::from("fp4");
    let e = ModelConfig::from_value(&v).unwrap_err().to_string();
    assert!(e.starts_with("mamba_ssm_cache_dtype: \"fp4\""), "{e}");
    // float16 in the config: the SSM state in 2 bytes whatever the Mamba cache dtype.
    v["mamba_ssm_cache_dtype"] = serde_json::Value::from("float16");
    let c = ModelConfig::from_value(&v).unwrap();
    assert_eq!(state_of(&c, Some(Float32), None).0, 73_728 + 1_048_576);
}

#[test]
fn nemotron_h_without_an_ssm_dtype_takes_the_release_default() {
    // vLLM 0.19.0 `model_executor/models/config.py`,
    // `NemotronHForCausalLMConfig.verify_and_update_config`: an `auto` SSM dtype becomes
    // `getattr(hf_config, "mamba_ssm_cache_dtype", "float16")`, and Nemotron-H-56B-Base-8K's
    // config.json names none (transformers 4.x, which 0.19.0 requires, has no Nemotron-H
    // config class with a default). 0.20.0 on: `DEFAULT_MAMBA_SSM_CACHE_DTYPE = "float32"`.
    use crate::arch::state::MambaDtype::{Float16, Float32};
    use memplan_core::kv::AttentionKind;
    let c = super::tests_weights::real("nvidia/Nemotron-H-56B-Base-8K");
    let state_of = |default, ssm| {
        let opts = SpecOptions {
            state_pages: (1, 1),
            hybrid_block_align: 16,
            dtype_bytes: 2,
            mamba_cache_dtype: None,
            mamba_ssm_cache_dtype: ssm,
            nemotron_h_ssm_default: default,
            nemotron_h_vl_ssm_rule: true,
        };
        let spec = c.kv_spec_with(KvDtype::Bf16, 16, 1, &opts).unwrap();
        let bytes = spec
            .groups
            .iter()
            .find_map(|g| match g.attention {
                AttentionKind::State { bytes, .. } => Some(bytes),
                _ => None,
            })
            .unwrap();
        (bytes, spec.block_size)
    };
    // 56B: Mamba2 of 256 heads of 64 (16,384 inner), 8 groups of state 256, kernel 4. Conv
    // (16,384 + 2 x 8 x 256) x 3 = 61,440 elements x 2 B (bf16) = 122,880; SSM 256 x 64 x
    // 256 = 4,194,304 elements. An attention token: 8 KV heads x 128 x (K + V) x 2 B =
    // 4,096 B, so the block is 16 x cdiv(state, 16 x 4,096).
    // 0.19 (float16): 122,880 + 8,388,608 = 8,511,488; block 16 x cdiv(8,511,488, 65,536)
    // = 16 x 130 = 2,080.
    assert_eq!(state_of(Float16, None), (8_511_488, 2_080));
    // 0.20.0 on (float32): 122,880 + 16,777,216 = 16,900,096; block 16 x 258 = 4,128.
    assert_eq!(state_of(Float32, None), (16_900_096, 4_128));
    // --mamba-ssm-cache-dtype float32 under 0.19: the flag wins (16,900,096).
    assert_eq!(state_of(Float16, Some(Float32)).0, 16_900_096);
    // A config that names its dtype keeps it whatever the release: Nano-30B says "float32",
    // 64 heads of 64, 8 groups of state 128: conv 18,432 x 2 = 36,864 + SSM 524,288 x 4 =
    // 2,097,152: 2,134,016 under either default.
    let nano = super::tests_weights::real("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    for d in [Float16, Float32] {
        let opts = SpecOptions {
            nemotron_h_ssm_default: d,
            ..SpecOptions::default()
        };
        let spec = nano.kv_spec_with(KvDtype::Bf16, 16, 1, &opts).unwrap();
        assert!(spec.groups.iter().any(
            |g| matches!(g.attention, AttentionKind::State { bytes, .. } if bytes == 2_134_016)
        ));
    }
}

#[test]
fn nemotron_h_vl_wrapper_runs_the_ssm_rule_from_0_20() {
    // vLLM 0.19.0 `model_executor/models/config.py`: `NemotronHNanoVLV2Config` has no
    // `verify_and_update_config` (only the video backend), so `NemotronH_Nano_VL_V2`'s SSM
    // state stays in the Mamba cache dtype (`auto`: the model's bf16) whatever its language
    // config says; 0.20.0 (vLLM PR 39032) runs `NemotronHForCausalLMConfig`'s rule on its
    // `text_config`. Nano-30B's real config (`mamba_ssm_cache_dtype` "float32") as the
    // wrapper's language model: conv 18,432 x 2 = 36,864 B; SSM 524,288 elements, x 2 =
    // 1,048,576 B (0.19: 1,085,440 in all) or x 4 = 2,097,152 B (0.20.0 on: 2,134,016).
    use memplan_core::kv::AttentionKind;
    let llm = super::tests_weights::real_json("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    let vl = serde_json::json!({
        "architectures": ["NemotronH_Nano_VL_V2"],
        "model_type": "NemotronH_Nano_VL_V2",
        "llm_config": llm,
    });
    let state = |c: &ModelConfig, rule: bool| {
        let opts = SpecOptions {
            nemotron_h_vl_ssm_rule: rule,
            ..SpecOptions::default()
        };
        let spec = c.kv_spec_with(KvDtype::Bf16, 16, 1, &opts).unwrap();
        spec.groups
            .iter()
            .find_map(|g| match g.attention {
                AttentionKind::State { bytes, .. } => Some(bytes),
                _ => None,
            })
            .unwrap()
    };
    let c = ModelConfig::from_value(&vl).unwrap();
    assert_eq!(state(&c, false), 1_085_440);
    assert_eq!(state(&c, true), 2_134_016);
    // The text model itself had the rule in 0.19 too.
    let text = ModelConfig::from_value(&llm).unwrap();
    assert_eq!(state(&text, false), 2_134_016);
}
