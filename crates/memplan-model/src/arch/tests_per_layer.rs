//! Configs that describe their layers one by one: read layer by layer, or refused naming the
//! key. Real configs are in `tests/data/per-layer-configs.jsonl` (each with its source);
//! expected figures are derived by hand in the comments with vLLM 0.34's rules (block 64).
//! Each test names the engine file and function whose behaviour it pins.

use memplan_core::kv::{AttentionKind, KvDtype};
use serde_json::Value;

use super::tests_families::{dense, plan};
use crate::config::LayerKind;
use crate::weights::params_per_rank;
use crate::ModelConfig;

const REAL: &str = include_str!("../../tests/data/per-layer-configs.jsonl");

/// The real config of `model` (its text, as the CLI would read it).
fn real(model: &str) -> Value {
    REAL.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["model"] == model)
        .unwrap_or_else(|| panic!("{model} is not in per-layer-configs.jsonl"))["config"]
        .clone()
}

fn err(v: &Value) -> String {
    ModelConfig::from_value(v).unwrap_err().to_string()
}

fn attention_layers(c: &ModelConfig) -> usize {
    c.layers.iter().filter(|k| **k == LayerKind::Full).count()
}

#[test]
fn nemotron_nas_super_49b_is_read_block_by_block() {
    // vLLM `model_executor/models/nemotron_nas.py`, `DeciLMDecoderLayer.__init__`: a block
    // whose `attention.no_op` is true has no attention (and no KV cache); the others have
    // `num_attention_heads // n_heads_in_group` KV heads. 80 blocks, 31 without attention, 49
    // with 64 / 8 = 8 KV heads of 128; `ffn_mult` -> `_ffn_mult_to_intermediate_size`.
    let v = real("nvidia/Llama-3_3-Nemotron-Super-49B-v1");
    let (c, spec, z) = plan(&v.to_string(), Some(131_072));
    assert_eq!((c.num_layers, attention_layers(&c)), (80, 49));
    assert_eq!(
        c.layers.iter().filter(|k| **k == LayerKind::None).count(),
        31
    );
    // `NemotronNasModelArchConfigConvertor.get_total_num_kv_heads`: the first attention block.
    assert_eq!((c.num_kv_heads, c.intermediate_size), (8, 28_672));
    assert_eq!(spec.groups.len(), 1);
    assert_eq!(
        (spec.groups[0].num_layers, spec.groups[0].kv_heads),
        (49, 8)
    );
    // 49 layers x 64 tokens x 8 heads x (128 + 128) x 2 bytes.
    assert_eq!(z.block_bytes, 49 * 64 * 8 * 256 * 2);
    assert_eq!(z.blocks_per_request, 131_072 / 64);
    // Read as a uniform decoder (80 layers, num_key_value_heads null -> 64 heads), a block
    // would cost 80 * 64 / (49 * 8) = 13x as much: the "92% too few tokens" the per-layer
    // reader fixes.
    let (misread, _) = dense(80, 64, 128, 131_072);
    assert_eq!(misread / z.block_bytes, 13);
    // Weights block by block: 49.87B parameters (the model card's 49.9B).
    let p = params_per_rank(&c, 1).unwrap().total() as f64;
    assert!((49.8e9..49.95e9).contains(&p), "{p}");
    assert!(
        c.rule.contains("block_configs (nemotron_nas.py)"),
        "{}",
        c.rule
    );
    // Tensor parallelism splits each attention block's 8 KV heads.
    let s8 = c.kv_spec(KvDtype::Bf16, 64, 8).unwrap();
    assert_eq!((s8.groups[0].num_layers, s8.groups[0].kv_heads), (49, 1));
}

#[test]
fn nemotron_nas_ultra_253b_skips_attention_and_mlp_blocks() {
    // Same reader (`DeciLMDecoderLayer`): 162 blocks, 98 without attention, 81 without MLP
    // (`ffn.no_op`), 64 attention blocks of 128 / 16 = 8 KV heads.
    let v = real("nvidia/Llama-3_1-Nemotron-Ultra-253B-v1");
    let c = ModelConfig::from_value(&v).unwrap();
    assert_eq!((c.num_layers, attention_layers(&c)), (162, 64));
    assert_eq!(
        c.layer_shapes
            .iter()
            .filter(|s| s.intermediate == 0)
            .count(),
        81
    );
    let spec = c.kv_spec(KvDtype::Bf16, 64, 8).unwrap();
    assert_eq!(
        (spec.groups[0].num_layers, spec.groups[0].kv_heads),
        (64, 1)
    );
    let p = params_per_rank(&c, 1).unwrap().total() as f64;
    assert!((253.0e9..253.8e9).contains(&p), "{p}");
}

#[test]
fn nas_blocks_of_different_kv_heads_share_one_uniform_type_group() {
    // Full-attention layers whose pages differ form one group whose block is the sum of their
    // pages (vLLM `v1/kv_cache_interface.py` `UniformTypeKVCacheSpecs.page_size_bytes`, chosen
    // by `kv_cache_planning.py` `get_kv_cache_groups`). Give the first two attention blocks 16
    // query heads per group (4 KV heads) instead of 8.
    let mut v = real("nvidia/Llama-3_3-Nemotron-Super-49B-v1");
    for i in 0..2 {
        v["block_configs"][i]["attention"]["n_heads_in_group"] = 16.into();
    }
    let (c, spec, z) = plan(&v.to_string(), Some(8192));
    let heads: Vec<_> = spec
        .groups
        .iter()
        .map(|g| (g.kv_heads, g.num_layers))
        .collect();
    assert_eq!(heads, vec![(4, 2), (8, 47)]);
    assert_eq!(z.num_groups, 1);
    assert_eq!(z.block_bytes, (2 * 4 + 47 * 8) * 64 * 256 * 2);
    // The first attention block decides the model-wide figure, as in vLLM.
    assert_eq!(c.num_kv_heads, 4);
}

#[test]
fn nas_variants_vllm_does_not_build_are_refused_by_name() {
    let base = real("nvidia/Llama-3_3-Nemotron-Super-49B-v1");
    let with = |path: &[&str], value: Value| {
        let mut v = base.clone();
        let mut slot = &mut v["block_configs"][3];
        for p in path {
            slot = &mut slot[*p];
        }
        *slot = value;
        err(&v)
    };
    // `DeciLMDecoderLayer` has no linear replacement: the engine cannot load such a block.
    let e = with(&["attention", "replace_with_linear"], true.into());
    assert!(
        e.starts_with("block_configs[3].attention.replace_with_linear:")
            && e.contains("nemotron_nas.py"),
        "{e}"
    );
    let e = with(&["ffn", "replace_with_linear"], true.into());
    assert!(
        e.starts_with("block_configs[3].ffn.replace_with_linear:"),
        "{e}"
    );
    // Windows, sinks and sparsity exist in the DeciLM schema but not in vLLM's layer.
    for (k, val) in [
        ("window_length", Value::from(4096)),
        ("num_sink_tokens", Value::from(4)),
        ("sparsify", Value::from("2:4")),
    ] {
        let e = with(&["attention", k], val);
        assert!(
            e.starts_with(&format!("block_configs[3].attention.{k}:"))
                && e.contains("an attention variant"),
            "{e}"
        );
    }
    // Unknown keys that ask for something are refused too (a MoE block, say).
    let e = with(&["ffn", "moe"], serde_json::json!({"num_experts": 8}));
    assert!(
        e.starts_with("block_configs[3].ffn.moe:") && e.contains("an ffn variant"),
        "{e}"
    );
    // A group size that does not divide the heads, a missing one.
    assert!(with(&["attention", "n_heads_in_group"], 7.into())
        .starts_with("block_configs[3].attention.n_heads_in_group:"));
    assert!(with(&["attention", "n_heads_in_group"], Value::Null)
        .starts_with("block_configs[3].attention.n_heads_in_group:"));
    assert!(with(&["ffn"], Value::Null).starts_with("block_configs[3]:"));
    // One block too few.
    let mut v = base.clone();
    v["block_configs"].as_array_mut().unwrap().pop();
    assert!(err(&v).starts_with("block_configs: 79 blocks for 80 layers"));
    // No attention anywhere: vLLM raises in `get_total_num_kv_heads`.
    let mut v = base.clone();
    for b in v["block_configs"].as_array_mut().unwrap() {
        b["attention"]["no_op"] = true.into();
    }
    assert!(err(&v).starts_with("block_configs: no block has attention"));
}

#[test]
fn decilm_without_block_configs_is_refused() {
    // DeciLM-7B's layout (per-layer KV heads in `num_key_value_heads_per_layer`): vLLM 0.34's
    // registry maps DeciLMForCausalLM to nemotron_nas.py, whose layers read
    // `config.block_configs[layer_idx]`, so the engine cannot load it.
    let v = serde_json::json!({"architectures":["DeciLMForCausalLM"],"model_type":"deci",
        "hidden_size":4096,"num_hidden_layers":4,"num_attention_heads":32,
        "num_key_value_heads_per_layer":[4,4,2,1],"intermediate_size":14336,"vocab_size":32000});
    let e = err(&v);
    assert!(
        e.starts_with("num_key_value_heads_per_layer:") && e.contains("block_configs"),
        "{e}"
    );
}

#[test]
fn openelm_per_layer_heads_and_mlp_widths() {
    // OpenELM-1.1B (`OpenELMConfig`: per-layer `num_query_heads`, `num_kv_heads`,
    // `ffn_multipliers`). No vLLM release has a model file for it; it is sized as vLLM sizes
    // layers with their own head counts (one `FullAttentionSpec` per layer, grouped by
    // `UniformTypeKVCacheSpecs`): 28 layers of 4..8 KV heads of 64, 169 KV heads in all.
    let v = real("apple/OpenELM-1_1B-Instruct");
    let (c, spec, z) = plan(&v.to_string(), Some(2048));
    assert_eq!((c.hidden_size, c.num_layers, c.head_dim), (2048, 28, 64));
    let heads: Vec<_> = spec
        .groups
        .iter()
        .map(|g| (g.kv_heads, g.num_layers))
        .collect();
    assert_eq!(heads, vec![(4, 3), (5, 7), (6, 8), (7, 6), (8, 4)]);
    assert_eq!(z.block_bytes, 169 * 64 * 64 * 2 * 2);
    // `make_divisible(ffn_multiplier * model_dim, 256)`: 1024 (layer 0) .. 8192 (layer 27).
    let widths: Vec<_> = c.layer_shapes.iter().map(|s| s.intermediate).collect();
    assert_eq!(
        (widths[0], widths[1], widths[13], widths[27]),
        (1024, 1280, 4608, 8192)
    );
    assert!(c.tie_word_embeddings);
    // 1.08B parameters (the model card's OpenELM-1_1B).
    let p = params_per_rank(&c, 1).unwrap().total() as f64;
    assert!((1.075e9..1.085e9).contains(&p), "{p}");
    assert!(c.notes.iter().any(|n| n.contains("OpenELM")));
    // TP 4 needs every layer's heads to split: 20 query heads do, 5 KV heads do not.
    assert!(c.kv_spec(KvDtype::Bf16, 64, 4).is_err());
}

#[test]
fn per_layer_lists_are_checked() {
    let mut v = real("apple/OpenELM-1_1B-Instruct");
    v["num_kv_heads"].as_array_mut().unwrap().pop();
    assert!(err(&v).starts_with("num_kv_heads: 27 entries for 28 layers"));
    let mut v = real("apple/OpenELM-1_1B-Instruct");
    v["num_kv_heads"][0] = 3.into();
    assert!(
        err(&v).starts_with("num_kv_heads: layer 0: 3 KV heads do not divide its 16 query heads")
    );
}

#[test]
fn gemma3n_intermediate_size_per_layer() {
    // Gemma 3n writes `intermediate_size` as a list (vLLM `gemma3n.py`, `Gemma3nDecoderLayer`:
    // `config.intermediate_size[extract_layer_index(prefix)]`). A uniform list is the
    // model-wide width; a varying one is kept per layer for the weights.
    let types = (0..35)
        .map(|i| {
            if (i + 1) % 5 == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect::<Vec<_>>();
    let cfg = |inter: Vec<u64>| {
        serde_json::json!({"architectures":["Gemma3nForConditionalGeneration"],"model_type":"gemma3n",
            "text_config":{"model_type":"gemma3n_text","hidden_size":2048,"num_hidden_layers":35,
            "num_attention_heads":8,"num_key_value_heads":2,"head_dim":256,"intermediate_size":inter,
            "vocab_size":262400,"max_position_embeddings":32768,"sliding_window":512,
            "num_kv_shared_layers":15,"layer_types":types,
            "activation_sparsity_pattern":vec![0.95; 35]}})
    };
    let c = ModelConfig::from_value(&cfg(vec![16_384; 35])).unwrap();
    assert_eq!(c.intermediate_size, 16_384);
    assert!(c.layer_shapes.is_empty());
    let mut inter = vec![16_384; 35];
    inter[34] = 8192;
    let narrow = ModelConfig::from_value(&cfg(inter)).unwrap();
    assert_eq!(narrow.layer_shapes.len(), 35);
    let (a, b) = (
        params_per_rank(&c, 1).unwrap().mlp,
        params_per_rank(&narrow, 1).unwrap().mlp,
    );
    assert_eq!(a - b, 3 * 2048 * 8192);
}

#[test]
fn lfm2_short_convolutions_and_attention() {
    // LFM2-1.2B (vLLM `lfm2.py`): attention at `full_attn_idxs` (6 layers), short
    // convolutions elsewhere (10), whose state is `short_conv_state_shape`
    // (`layers/mamba/mamba_utils.py`; `ShortConv.get_state_shape`): conv_dim 2048 x
    // (conv_L_cache 3 - 1) x 2 bytes = 8192 B, one page per request (not a Mamba2 layer).
    // Attention: 8 KV heads of 64 -> 2048 B/token, so the 64-token block already holds a
    // state (`_align_hybrid_block_size`). 6 attention vs 10 conv layers: group size 6, 1 + 2
    // groups.
    let v = real("LiquidAI/LFM2-1.2B");
    let (c, spec, z) = plan(&v.to_string(), Some(32_768));
    assert_eq!(attention_layers(&c), 6);
    assert_eq!(c.state.unwrap().bytes_per_rank(1, 2).unwrap(), 8192);
    assert_eq!(spec.block_size, 64);
    assert_eq!((z.group_size, z.num_groups), (6, 3));
    assert_eq!(z.block_bytes, 6 * 64 * 8 * 128 * 2);
    let pages = crate::engine::EngineRules::newest_vllm().state_pages(false);
    assert_eq!(z.blocks_per_request, 32_768 / 64 + 2 * pages);
    // `Lfm2MLP`: block_ff_dim 12288 -> 2/3 -> 8192 (rounded to block_multiple_of 256).
    assert_eq!(c.intermediate_size, 8192);
    // Weights (vLLM 0.19.0): a conv layer's `ShortConv` is in_proj 2048 x 3 x 2048, out_proj
    // 2048 x 2048 and a 2048 x 3 convolution (16,783,360); an attention layer's projections
    // 2048 x (2048 + 2 x 512) + 2048 x 2048 (10,485,760, + q/k norms of 64, left out); every
    // layer's MLP 3 x 2048 x 8192 and two norms; the embedding 65,536 x 2048, which the head
    // shares whatever the config says (`lfm2.py`: `lm_head.tie_weights(embed_tokens)`), and
    // the final norm. With the q/k norms that is LFM2-1.2B's 1,170,340,608 parameters.
    let want =
        10 * 16_783_360 + 6 * 10_485_760 + 16 * (3 * 2048 * 8192 + 2 * 2048) + 65_536 * 2048 + 2048;
    assert_eq!(want + 6 * 128, 1_170_340_608);
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), want);
    // The same model written with `layer_types` reads the same.
    let mut lt = v.clone();
    let types: Vec<_> = (0..16)
        .map(|i| {
            if [2, 5, 8, 10, 12, 14].contains(&i) {
                "full_attention"
            } else {
                "conv"
            }
        })
        .collect();
    lt.as_object_mut().unwrap().remove("full_attn_idxs");
    lt["layer_types"] = serde_json::json!(types);
    let (_, _, z2) = plan(&lt.to_string(), Some(32_768));
    assert_eq!(z2, z);
}

#[test]
fn minimax_lightning_attention_is_refused_softmax_only_plans() {
    // MiniMax-M1: `attn_type_list` 0 = lightning (linear) attention, 1 = softmax (vLLM
    // `config/model.py` `get_num_layers_by_block_type`). Its recurrent state is not sized by
    // memplan, and vLLM served MiniMaxM1ForCausalLM last in 0.23
    // (`registry.py` `_PREVIOUSLY_SUPPORTED_MODELS`): refused by name.
    let e = err(&real("MiniMaxAI/MiniMax-M1"));
    assert!(
        e.starts_with("attn_type_list:") && e.contains("lightning"),
        "{e}"
    );
    // MiniMax-M2 (`minimax_m2.py`) writes all 1s: every layer is full attention.
    let mut m2 = real("MiniMaxAI/MiniMax-M1");
    m2["architectures"] = serde_json::json!(["MiniMaxM2ForCausalLM"]);
    m2["model_type"] = "minimax_m2".into();
    m2["attn_type_list"] = serde_json::json!(vec![1; 80]);
    m2["max_position_embeddings"] = 196_608.into();
    let (_, _, z) = plan(&m2.to_string(), None);
    assert_eq!(
        (z.block_bytes, z.blocks_per_request),
        dense(80, 8, 128, 196_608)
    );
}

/// A Llama-style config with `extra` keys added.
fn llama(extra: Value) -> Value {
    let mut v = serde_json::json!({"architectures":["LlamaForCausalLM"],"model_type":"llama",
        "hidden_size":2048,"num_hidden_layers":12,"num_attention_heads":16,"num_key_value_heads":8,
        "intermediate_size":4096,"vocab_size":32000,"max_position_embeddings":4096});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn the_generic_reader_refuses_per_layer_structure_it_does_not_read() {
    // A list with one entry per layer, under a name memplan has never seen.
    let e = err(&llama(
        serde_json::json!({"num_key_value_heads_per_layer_v2":[8,8,8,8,8,8,8,4,4,4,2,2]}),
    ));
    assert!(
        e.starts_with("num_key_value_heads_per_layer_v2:") && e.contains("one entry per layer"),
        "{e}"
    );
    let e = err(&llama(
        serde_json::json!({"intermediate_size_per_layer":vec![4096; 12]}),
    ));
    assert!(e.starts_with("intermediate_size_per_layer:"), "{e}");
    // A subset of layers (sliding-window layers by index).
    let e = err(&llama(serde_json::json!({"swa_layers":[0, 2, 4]})));
    assert!(e.starts_with("swa_layers:") && e.contains("subset"), "{e}");
    // Kimi Linear's per-layer attention description (`linear_attn_config.kda_layers`).
    let e = err(&llama(
        serde_json::json!({"linear_attn_config":{"kda_layers":[1,2,3],"full_attn_layers":[4]}}),
    ));
    assert!(e.starts_with("linear_attn_config:"), "{e}");
    // Blocks described one by one in a layout no reader knows (Nemotron-H puzzle models write
    // `block_configs` of `block_type`s, read by nemotron_h.py, not the NAS reader).
    let mut v = llama(serde_json::json!({"hybrid_override_pattern":"M*M*M*M*M*M*"}));
    v["architectures"] = serde_json::json!(["NemotronHForCausalLM"]);
    v["block_configs"] = serde_json::json!(vec![serde_json::json!({"block_type":"mamba"}); 12]);
    v["mamba_num_heads"] = 64.into();
    v["mamba_head_dim"] = 64.into();
    v["ssm_state_size"] = 128.into();
    let e = err(&v);
    assert!(e.starts_with("block_configs:"), "{e}");
    // A layer pattern stated only by `layers_block_type` (no rule reads it alone).
    let types: Vec<_> = (0..12)
        .map(|i| if i % 4 == 0 { "attention" } else { "mamba" })
        .collect();
    let e = err(&llama(serde_json::json!({"layers_block_type": types})));
    assert!(e.starts_with("layers_block_type:"), "{e}");
    // Linear-attention layers without dimensions that say which recurrence they run.
    let types: Vec<_> = (0..12)
        .map(|i| {
            if i % 4 == 3 {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    let e = err(&llama(serde_json::json!({"layer_types": types})));
    assert!(
        e.starts_with("layer_types:") && e.contains("recurrent-state"),
        "{e}"
    );
}

#[test]
fn per_layer_looking_keys_that_change_nothing_still_plan() {
    // Token ids, RoPE-free layers (SmolLM3, llama4.py), Gemma 3n's activation sparsity and a
    // redundant pattern beside an explicit one plan as before.
    let v = llama(serde_json::json!({
        "eos_token_id": [1,2,3,4,5,6,7,8,9,10,11,12],
        "no_rope_layers": [1,1,1,0,1,1,1,0,1,1,1,0],
        "activation_sparsity_pattern": vec![0.0; 12],
        "layer_types": vec!["full_attention"; 12],
        "full_attn_idxs": (0..12).collect::<Vec<_>>(),
        "mlp_only_layers": []
    }));
    let c = ModelConfig::from_value(&v).unwrap();
    assert_eq!(attention_layers(&c), 12);
}

#[test]
fn interleaved_experts_are_counted_layer_by_layer() {
    // Jamba: experts every `expert_layer_period` layers from `expert_layer_offset`
    // (transformers' JambaConfig `layers_num_experts`, read per layer by vLLM's jamba.py):
    // 16 of 32 layers. Llama 4 Maverick: `interleave_moe_layer_step` 2 (llama4.py
    // `Llama4DecoderLayer`). DeepSeek: `moe_layer_freq` after `first_k_dense_replace`.
    let jamba = |period: u64| {
        serde_json::json!({"architectures":["JambaForCausalLM"],"model_type":"jamba","hidden_size":4096,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,
        "num_experts":16,"num_experts_per_tok":2,"expert_layer_period":period,"expert_layer_offset":1,
        "attn_layer_period":8,"attn_layer_offset":4,"mamba_d_state":16,"mamba_d_conv":4,"mamba_expand":2,
        "vocab_size":65536,"max_position_embeddings":262144})
    };
    let c = ModelConfig::from_value(&jamba(2)).unwrap();
    assert_eq!(c.moe.unwrap().dense_layers, 16);
    // `layer_idx % expert_layer_period == expert_layer_offset`: the odd layers.
    assert!((0..32).all(|i| c.is_moe_layer(i) == (i % 2 == 1)));
    assert_eq!(
        ModelConfig::from_value(&jamba(1))
            .unwrap()
            .moe
            .unwrap()
            .dense_layers,
        0
    );
    let c = ModelConfig::from_value(&llama(serde_json::json!({
        "num_local_experts":128,"num_experts_per_tok":1,"interleave_moe_layer_step":2})))
    .unwrap();
    assert_eq!(c.moe.unwrap().dense_layers, 6);
    // `(layer_idx + 1) % interleave_moe_layer_step == 0`: layers 1, 3, ..., 11.
    assert!((0..12).all(|i| c.is_moe_layer(i) == (i % 2 == 1)));
    let c = ModelConfig::from_value(&llama(serde_json::json!({
        "n_routed_experts":64,"num_experts_per_tok":6,"first_k_dense_replace":1,"moe_layer_freq":2}))).unwrap();
    // MoE at 2, 4, 6, 8, 10: 7 dense layers.
    assert_eq!(c.moe.unwrap().dense_layers, 7);
    assert_eq!(
        c.moe_layers,
        [false, false, true, false, true, false, true, false, true, false, true, false]
    );
    // MiMo-V2-Flash's form: one 0/1 per layer (mimo_v2_flash.py
    // `MiMoV2FlashDecoderLayer.is_moe_layer`), where it was read as a malformed integer.
    let c = ModelConfig::from_value(&llama(serde_json::json!({
        "n_routed_experts":64,"num_experts_per_tok":6,"moe_layer_freq":[0,1,1,1,1,1,1,1,1,1,1,0]})))
    .unwrap();
    assert_eq!(c.moe.unwrap().dense_layers, 2);
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && !c.is_moe_layer(11));
    let short = ModelConfig::from_value(&llama(serde_json::json!({
        "n_routed_experts":64,"num_experts_per_tok":6,"moe_layer_freq":[0,1,1]})));
    assert!(short
        .unwrap_err()
        .to_string()
        .contains("one 0 or 1 per layer (12)"));
    let c = ModelConfig::from_value(&llama(serde_json::json!({
        "num_experts":8,"num_experts_per_tok":2,"mlp_layer_types":
        ["dense","sparse","sparse","sparse","sparse","sparse","sparse","sparse","sparse","sparse","sparse","dense"]}))).unwrap();
    assert_eq!(c.moe.unwrap().dense_layers, 2);
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && !c.is_moe_layer(11));
    // Step-3: `moe_layers_enum` "4,5,...,10" (step3_text.py): 7 MoE layers, 5 dense.
    let c = ModelConfig::from_value(&llama(serde_json::json!({
        "moe_num_experts":48,"moe_top_k":3,"moe_layers_enum":"4,5,6,7,8,9,10"})))
    .unwrap();
    assert_eq!(c.moe.unwrap().dense_layers, 5);
    assert!((0..12).all(|i| c.is_moe_layer(i) == (4..=10).contains(&i)));
    assert!(matches!(
        c.kv_spec(KvDtype::Bf16, 16, 1).unwrap().groups[0].attention,
        AttentionKind::Full
    ));
}

#[test]
fn per_layer_lists_inside_a_section_of_the_language_model_are_refused() {
    // MiniMax-M3 (MiniMaxAI/MiniMax-M3's config.json as copied in ai-dynamo/aiconfigurator,
    // `aic-core/src/aiconfigurator_core/model_configs/MiniMaxAI--MiniMax-M3_config.json` at
    // 095f58a5): `sparse_attention_config.sparse_attention_freq` gives each of its 60 layers
    // an index cache or none, which no reader reads; planned as 60 plain attention layers, its
    // KV cache would be another model's.
    let freq: Vec<u64> = (0..60).map(|i| u64::from(i >= 3)).collect();
    let m3 = serde_json::json!({"architectures":["MiniMaxM3ForCausalLM"],"model_type":"minimax_m3",
        "hidden_size":6144,"num_hidden_layers":60,"num_attention_heads":64,"num_key_value_heads":4,
        "head_dim":128,"intermediate_size":3072,"vocab_size":200064,"max_position_embeddings":1048576,
        "sparse_attention_config":{"sparse_attention_freq":freq,"sparse_index_dim":128,
        "sparse_num_index_heads":4,"use_sparse_attention":true},
        "quantization_config":{"quant_method":"fp8","ignore":(0..60).map(|i| format!("model.layers.{i}.gate")).collect::<Vec<_>>()}});
    let e = ModelConfig::from_value(&m3).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "sparse_attention_config.sparse_attention_freq: has one entry per layer (60 entries)"
        ),
        "{e}"
    );
    // Module lists of a quantization section are no layers, nor are sections without a
    // per-layer list.
    let mut plain = m3.clone();
    plain["sparse_attention_config"] = serde_json::json!({"sparse_index_dim":128});
    assert!(ModelConfig::from_value(&plain).is_ok());
}

#[test]
fn layers_given_only_as_a_list_name_the_list() {
    // A config that gives its layers only as a per-layer list memplan reads no count from
    // (Zamba2's `layers_block_type`, without `num_hidden_layers`): the refusal names the list,
    // not a missing count. (Nemotron-H's list is read: tests_weights.rs.)
    let types: Vec<&str> = (0..54)
        .map(|i| if i % 6 == 5 { "hybrid" } else { "mamba" })
        .collect();
    let zamba = serde_json::json!({"architectures":["Zamba2ForCausalLM"],"model_type":"zamba2",
        "hidden_size":2560,"num_attention_heads":32,"num_key_value_heads":32,
        "vocab_size":32000,"max_position_embeddings":4096,"layers_block_type":types});
    let e = ModelConfig::from_value(&zamba).unwrap_err().to_string();
    assert!(
        e.starts_with("layers_block_type: describes the layers one by one (54 entries) and the config gives no `num_hidden_layers`"),
        "{e}"
    );
    // With neither, the count is what is missing.
    let mut none = zamba.clone();
    none.as_object_mut().unwrap().remove("layers_block_type");
    let e = ModelConfig::from_value(&none).unwrap_err().to_string();
    assert!(e.starts_with("num_hidden_layers: missing"), "{e}");
}

#[test]
fn mimo_v2_flash_is_refused_by_its_layer_pattern() {
    // MiMo-V2-Flash (vLLM `mimo_v2_flash.py`, `MiMoV2FlashDecoderLayer.__init__`): 9 full
    // layers of 4 KV heads and 39 sliding-window layers (window 128) of 8, K heads of 192, V
    // of 128. vLLM 0.19.0 pads V to 192 in the cache (`MiMoV2Attention.forward`): per token
    // at bf16, 9 x 2 x 4 x 192 x 2 B = 27,648 for the full layers and 39 x 2 x 8 x 192 x 2 B
    // = 239,616 for the sliding ones (267,264 in all); with V at its own size (the later
    // `FlashAttentionDiffKVBackend`), 9 x 4 x (192 + 128) x 2 = 23,040 and 39 x 8 x 320 x 2 =
    // 199,680 (222,720). Which release changed it is not in memplan's rules: refused by the
    // key, not as a malformed `moe_layer_freq` (its per-layer list: layer 0 dense).
    let v = real("XiaomiMiMo/MiMo-V2-Flash");
    let e = err(&v);
    assert!(
        e.starts_with("hybrid_layer_pattern: makes 39 of 48 layers sliding-window attention")
            && e.contains("FlashAttentionDiffKVBackend"),
        "{e}"
    );
}
