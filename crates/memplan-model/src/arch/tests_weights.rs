//! Config-only weight estimates of real checkpoints. Configs are in
//! `tests/data/weight-configs.jsonl` (each with its source and the checkpoint's size); every
//! expected figure is counted by hand in the comments from the tensor shapes vLLM 0.19.0
//! builds (the file and class named), or taken from the checkpoint's safetensors index.

use serde_json::Value;

use memplan_core::kv::{AttentionKind, KvDtype};

use crate::config::{Block, LayerKind};
use crate::weights::{params_per_rank, weight_bytes};
use crate::ModelConfig;

const REAL: &str = include_str!("../../tests/data/weight-configs.jsonl");

/// The real config.json of `model`, as written.
pub(crate) fn real_json(model: &str) -> Value {
    REAL.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["model"] == model)
        .unwrap_or_else(|| panic!("{model} is not in weight-configs.jsonl"))["config"]
        .clone()
}

/// The real config of `model`.
pub(crate) fn real(model: &str) -> ModelConfig {
    ModelConfig::from_value(&real_json(model)).unwrap_or_else(|e| panic!("{model}: {e}"))
}

/// Nemotron-3-Nano-30B-A3B's blocks, counted by hand (TP 1), hidden 2688:
/// - Mamba2 (`mamba_mixer2.py`, `MambaMixer2`; 64 heads of 64 = 4096 inner, 8 groups of
///   state 128, kernel 4, conv bias): in_proj 2688 x (2 x 4096 + 2 x 1024 + 64) =
///   27,697,152; conv1d (4096 + 2048) x 4 + 6144 bias = 30,720; A, D, dt_bias 3 x 64; gated
///   norm 4096; out_proj 4096 x 2688 = 11,010,048; block norm 2688: 38,744,896.
/// - Attention (`NemotronHAttention`; 32 heads, 2 KV heads of 128): 2688 x (4096 + 512) +
///   4096 x 2688 + norm 2688 = 23,399,040.
/// - MoE (`NemotronHMoE`): 128 experts of up and down (`is_act_and_mul=False`) 2688 x 1856
///   = 1,277,165,568; the shared expert up and down 2688 x 3712 = 19,955,712; the router
///   2688 x 128 = 344,064; block norm 2688: 1,297,468,032 (the router's 128 fp32
///   `e_score_correction_bias` entries are left out).
pub(crate) const NANO_MAMBA: u64 = 38_744_896;
pub(crate) const NANO_ATTN: u64 = 23_399_040;
pub(crate) const NANO_MOE: u64 = 1_297_468_032;
pub(crate) const NANO_EMB: u64 = 131_072 * 2688;

#[test]
fn nemotron_h_counts_each_block_by_its_kind() {
    // "MEMEM*EMEMEM*...": 23 Mamba2, 6 attention and 23 MoE blocks, no MLP block; the
    // embedding and an untied head of 131,072 x 2688 and the final norm. NVIDIA gives 31.6B
    // parameters; counted as attention + experts in every one of the 52 layers it was 102B.
    let c = real("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    let n = |b| c.blocks.iter().filter(|x| **x == b).count() as u64;
    assert_eq!(
        (
            n(Block::Mamba),
            n(Block::Attention),
            n(Block::Mlp),
            n(Block::Moe)
        ),
        (23, 6, 0, 23)
    );
    let want = 23 * NANO_MAMBA + 6 * NANO_ATTN + 23 * NANO_MOE + 2 * NANO_EMB + 2688;
    assert_eq!(want, 31_577_937_344);
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), want);
    // Weights: bf16, and no rotary cache (`NemotronHAttention` applies no rotary embedding;
    // it was counted as 262,144 positions x 128 x 2 bytes = 67,108,864).
    assert_eq!(weight_bytes(&c, 1, 2, None).unwrap(), 2 * want);

    // Nemotron-H-56B: 54 Mamba2 (256 heads of 64 = 16,384 inner, 8 groups of state 256),
    // 10 attention (64 heads, 8 KV heads of 128) and 54 relu^2 MLP blocks (up and down,
    // `NemotronHMLP`, 8192 x 32768), hidden 8192:
    // Mamba2: 8192 x (32768 + 4096 + 256) + (16384 + 4096) x 5 + 3 x 256 + 16384 + 16384 x
    // 8192 + 8192 = 438,432,512; attention 8192 x (8192 + 2048) + 8192 x 8192 + 8192 =
    // 151,003,136; MLP 2 x 8192 x 32768 + 8192 = 536,879,104. With the embedding, head and
    // final norm, 56,324,350,464 (the "56B" of its name).
    let c = real("nvidia/Nemotron-H-56B-Base-8K");
    let emb = 131_072 * 8192;
    let want = 54 * 438_432_512 + 10 * 151_003_136 + 54 * 536_879_104 + 2 * emb + 8192;
    assert_eq!(want, 56_324_350_464);
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), want);
    // TP 2: the mixers, MLPs, vocabulary and attention heads split; norms, the SSM's per-head
    // figures split with the heads, the block norms replicated. Mamba2 per rank: 8192 x
    // (16384 + 2048 + 128) + (8192 + 2048) x 5 + 3 x 128 + 8192 + 8192 x 8192 + 8192 =
    // 219,220,352; attention 8192 x (4096 + 1024) + 4096 x 8192 + 8192 = 75,505,664; MLP
    // 2 x 8192 x 16384 + 8192 = 268,443,648.
    let half = 54 * 219_220_352 + 10 * 75_505_664 + 54 * 268_443_648 + emb + 8192;
    assert_eq!(params_per_rank(&c, 2).unwrap().total(), half);
}

#[test]
fn nemotron_h_pattern_must_cover_every_layer() {
    // Nemotron-3-Nano's real config with its 52-character pattern cut to 26. With a
    // `layer_types` beside it (read first for the KV cache) the short pattern used to give the
    // weights of 26 blocks only, 31,090,968,832 bytes instead of 63,222,983,552, silently.
    let mut v = real_json("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    let full = v["hybrid_override_pattern"].as_str().unwrap().to_string();
    assert_eq!(
        (full.len(), &v["num_hidden_layers"]),
        (52, &Value::from(52))
    );
    let types: Vec<&str> = full
        .chars()
        .map(|ch| if ch == 'M' { "mamba" } else { "attention" })
        .collect();
    v["layer_types"] = Value::from(types);
    v["hybrid_override_pattern"] = Value::from(&full[..26]);
    let e = ModelConfig::from_value(&v).unwrap_err().to_string();
    assert!(
        e.contains("hybrid_override_pattern") && e.contains("26 blocks for 52 layers"),
        "{e}"
    );
    // Without `layer_types` too.
    v.as_object_mut().unwrap().remove("layer_types");
    let e = ModelConfig::from_value(&v).unwrap_err().to_string();
    assert!(e.contains("26 blocks for 52 layers"), "{e}");
    // The whole pattern beside a `layer_types` that makes its MoE blocks attention layers:
    // the KV cache would follow one key and the weights the other.
    v["hybrid_override_pattern"] = Value::from(full.as_str());
    v["layer_types"] = Value::from(
        full.chars()
            .map(|ch| if ch == 'M' { "mamba" } else { "attention" })
            .collect::<Vec<_>>(),
    );
    let e = ModelConfig::from_value(&v).unwrap_err().to_string();
    assert!(
        e.contains("hybrid_override_pattern") && e.contains("disagree") && e.contains("block 1"),
        "{e}"
    );
}

#[test]
fn nemotron_h_blocks_given_only_as_layers_block_type() {
    // transformers 5 writes Nemotron-H's blocks as `layers_block_type` (one name per layer)
    // and no `hybrid_override_pattern`; its `NemotronHConfig._list_to_pattern` gives the
    // pattern vLLM 0.19.0's `nemotron_h.py` builds from back (mamba M, attention *, mlp -,
    // moe E; newer transformers say linear_attention / full_attention).
    //
    // Nemotron-3-Nano's real config in that form, with `num_hidden_layers` left out too: the
    // same 52 blocks, so the same 31,577,937,344 parameters as the pattern (counted block by
    // block above: 23 Mamba2, 6 attention, 23 MoE).
    let mut v = real_json("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    let pattern = v["hybrid_override_pattern"].as_str().unwrap().to_string();
    let names: Vec<&str> = pattern
        .chars()
        .map(|ch| match ch {
            'M' => "mamba",
            '*' => "attention",
            '-' => "mlp",
            _ => "moe",
        })
        .collect();
    let o = v.as_object_mut().unwrap();
    o.remove("hybrid_override_pattern");
    o.remove("num_hidden_layers");
    o.insert("layers_block_type".into(), Value::from(names.clone()));
    let c = ModelConfig::from_value(&v).unwrap();
    let n = |b| c.blocks.iter().filter(|x| **x == b).count() as u64;
    assert_eq!(c.num_layers, 52);
    assert_eq!(
        (
            n(Block::Mamba),
            n(Block::Attention),
            n(Block::Mlp),
            n(Block::Moe)
        ),
        (23, 6, 0, 23)
    );
    let want = 23 * NANO_MAMBA + 6 * NANO_ATTN + 23 * NANO_MOE + 2 * NANO_EMB + 2688;
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), want);
    assert!(
        c.notes.iter().any(|n| n.contains("layers_block_type")),
        "{:?}",
        c.notes
    );
    // Newer transformers' names read the same.
    let renamed: Vec<&str> = names
        .iter()
        .map(|t| match *t {
            "mamba" => "linear_attention",
            "attention" => "full_attention",
            t => t,
        })
        .collect();
    v["layers_block_type"] = Value::from(renamed);
    let c2 = ModelConfig::from_value(&v).unwrap();
    assert_eq!(c2.blocks, c.blocks);

    // Nemotron-3-Ultra-550B-A55B (the real config: 108 names, no count, no pattern): 48
    // Mamba2, 12 attention and 48 MoE blocks. KV per token at bf16 on one rank: 12 layers x
    // (K + V) x 2 KV heads x 128 x 2 B = 12,288. Each Mamba2 layer's state
    // (`mamba_ssm_cache_dtype` float32; 256 heads of 64, 8 groups of state 128, kernel 4):
    // conv (256 x 64 + 2 x 8 x 128) x 3 x 2 B = 18,432 x 6 = 110,592, SSM 256 x 64 x 128 x
    // 4 B = 8,388,608: 8,499,200.
    let c = real("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16");
    let n = |b| c.blocks.iter().filter(|x| **x == b).count() as u64;
    assert_eq!(c.num_layers, 108);
    assert_eq!(
        (
            n(Block::Mamba),
            n(Block::Attention),
            n(Block::Mlp),
            n(Block::Moe)
        ),
        (48, 12, 0, 48)
    );
    let kinds = |k| c.layers.iter().filter(|x| **x == k).count();
    assert_eq!((kinds(LayerKind::Full), kinds(LayerKind::State)), (12, 48));
    let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
    let attention: u64 = spec
        .groups
        .iter()
        .filter(|g| !matches!(g.attention, AttentionKind::State { .. }))
        .map(|g| g.page_bytes(KvDtype::Bf16, 1).unwrap() * u64::from(g.num_layers))
        .sum();
    assert_eq!(attention, 12_288);
    assert_eq!(
        c.state.unwrap().bytes_per_rank(1, 2).unwrap(),
        110_592 + 8_388_608
    );
    // The same blocks written as a pattern give the same model, weights included.
    let mut p = real_json("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16");
    let written: String = p["layers_block_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| match t.as_str().unwrap() {
            "mamba" => 'M',
            "attention" => '*',
            "mlp" => '-',
            _ => 'E',
        })
        .collect();
    let o = p.as_object_mut().unwrap();
    o.remove("layers_block_type");
    o.insert(
        "hybrid_override_pattern".into(),
        Value::from(written.as_str()),
    );
    o.insert("num_hidden_layers".into(), Value::from(108));
    let q = ModelConfig::from_value(&p).unwrap();
    assert_eq!((&q.blocks, &q.layers), (&c.blocks, &c.layers));
    assert_eq!(
        params_per_rank(&q, 1).unwrap().total(),
        params_per_rank(&c, 1).unwrap().total()
    );

    // Both forms, agreeing: read. Disagreeing (block 7 made MoE instead of attention in the
    // pattern): refused, naming both keys.
    let mut both = real_json("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16");
    both["hybrid_override_pattern"] = Value::from(written.as_str());
    assert_eq!(ModelConfig::from_value(&both).unwrap().blocks, c.blocks);
    assert_eq!(&written[7..8], "*");
    let mut wrong = written.clone();
    wrong.replace_range(7..8, "E");
    both["hybrid_override_pattern"] = Value::from(wrong);
    let e = ModelConfig::from_value(&both).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "hybrid_override_pattern: block 7 is `E` but `layers_block_type` makes it `*`"
        ) && e.contains("disagree"),
        "{e}"
    );
    // A pattern of another length beside the list.
    both["hybrid_override_pattern"] = Value::from(&written[..107]);
    let e = ModelConfig::from_value(&both).unwrap_err().to_string();
    assert!(
        e.contains("107 blocks but `layers_block_type` names 108"),
        "{e}"
    );
    // A `num_hidden_layers` of another length than the list.
    let mut count = real_json("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16");
    count["num_hidden_layers"] = Value::from(104);
    let e = ModelConfig::from_value(&count).unwrap_err().to_string();
    assert!(
        e.starts_with("layers_block_type: names 108 blocks but `num_hidden_layers` is 104"),
        "{e}"
    );
    count["num_hidden_layers"] = Value::from(108);
    assert!(ModelConfig::from_value(&count).is_ok());
    // A name no Nemotron-H block has.
    let mut odd = real_json("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16");
    odd["layers_block_type"][3] = Value::from("hybrid");
    let e = ModelConfig::from_value(&odd).unwrap_err().to_string();
    assert!(
        e.starts_with("layers_block_type: entry 3 is \"hybrid\""),
        "{e}"
    );
}

#[test]
fn gated_deltanet_layers_count_their_own_projections() {
    // Qwen3-Next-80B-A3B, hidden 2048, 48 layers, every 4th full attention (12), the rest
    // gated DeltaNet (36), routed experts in every layer:
    // - attention (qwen3_next.py `Qwen3NextAttention`, `attn_output_gate` true by default):
    //   2048 x (2 x 16 + 2 x 2) x 256 + 16 x 256 x 2048 = 27,262,976 (+ q/k norms 512, left
    //   out);
    // - gated DeltaNet (gdn_linear_attn.py `GatedDeltaNetAttention`; 16 key heads and 32
    //   value heads of 128): in_proj_qkvz 2048 x (2 x 2048 + 2 x 4096) = 25,165,824,
    //   in_proj_ba 2048 x 64 = 131,072, conv1d (2 x 2048 + 4096) x 4 = 32,768, A_log and
    //   dt_bias 64, norm 128, out_proj 4096 x 2048 = 8,388,608: 33,718,464;
    // - MoE: 512 experts x 3 x 2048 x 512 + the shared expert 3 x 2048 x 512 + the router
    //   2048 x 512 = 1,614,807,040 (+ the shared expert's gate 2048, left out);
    // - two norms per layer, the embedding and untied head 151,936 x 2048, the final norm.
    // The hand count with the two left-out terms is 79,674,391,296, and with the MTP layer's
    // 1,650,471,424 exactly the checkpoint's 81,324,862,720 parameters.
    let c = real("Qwen/Qwen3-Next-80B-A3B-Instruct");
    assert!(c.attn_output_gate);
    let want = 12 * 27_262_976
        + 36 * 33_718_464
        + 48 * (1_614_807_040 + 2 * 2048)
        + 2 * 151_936 * 2048
        + 2048;
    assert_eq!(want + 12 * 512 + 48 * 2048, 79_674_391_296);
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), want);

    // Qwen3.5-18B-REAP-A3B (Qwen3.5-35B-A3B with 128 experts left, no MTP or vision tensors
    // saved): the same layer shapes, 40 layers (10 full), 248,320 tokens. Its checkpoint is
    // 37,087,995,136 bytes of fp16: 18,543,997,568 parameters, the hand count with the
    // left-out terms; the estimate adds the rotary cache (262,144 x 256 x 2 bytes).
    let c = real("bryce-hoehn/Qwen3.5-18B-REAP-A3B-Coding");
    let moe = 128 * 3 * 2048 * 512 + 3 * 2048 * 512 + 2048 * 128;
    let want =
        10 * 27_262_976 + 30 * 33_718_464 + 40 * (moe + 2 * 2048) + 2 * 248_320 * 2048 + 2048;
    assert_eq!(want + 10 * 512 + 40 * 2048, 18_543_997_568);
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), want);
    assert_eq!(
        weight_bytes(&c, 1, 2, None).unwrap(),
        2 * want + 262_144 * 256 * 2
    );
}

#[test]
fn a_config_without_tie_word_embeddings_takes_its_class_default() {
    // SmolLM3-3B's config.json omits `tie_word_embeddings`; transformers' `SmolLM3Config`
    // defaults it to true and the checkpoint has no lm_head: 6,150,197,248 bytes of bf16 =
    // 3,075,098,624 parameters = 36 layers x (2048 x 3072 + 2048 x 2048 + 3 x 2048 x 11008 +
    // 2 x 2048) + 128,256 x 2048 + 2048, one embedding matrix.
    let c = real("HuggingFaceTB/SmolLM3-3B");
    assert!(c.tie_word_embeddings);
    let layer: u64 = 2048 * 3072 + 2048 * 2048 + 3 * 2048 * 11008 + 2 * 2048;
    assert_eq!(36 * layer + 128_256 * 2048 + 2048, 6_150_197_248 / 2);
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), 6_150_197_248 / 2);
}

#[test]
fn molmo_reads_its_fused_mlp_width_and_fixed_vision_backbone() {
    // Molmo-7B-D (molmo.py): `LanguageModelMLP` is gate and up of `intermediate_size // 2`
    // = 18,944 each (Qwen2-7B's width) and down; `MolmoVisionBackbone` is a fixed CLIP
    // ViT-L/14 (`VisionBackboneConfig`: 23 layers, 1024 wide, MLP 4096) with an attention
    // pooling and a gated projector from 1024 to 3584 through 18,944.
    let c = real("reubzdubz/Molmo7B_D_NF4Quant");
    let p = params_per_rank(&c, 1).unwrap();
    assert_eq!(p.mlp, 28 * 3 * 3584 * 18_944);
    // The checkpoint (index total_size 6,661,964,712): the 28 layers' linear weights,
    // 28 x (3584 x 4608 + 3584 x 3584 + 3584 x 37888 + 18944 x 3584) = 6,525,288,448, in NF4
    // without double quantization (4 bits + one fp32 absmax per 64: 4.5 bits a weight),
    // everything else in fp16: QKV biases 28 x 4608, norms 57 x 3584, the embedding
    // (152,064 + 128) x 3584 and the head 152,064 x 3584, and the vision backbone's
    // 404,950,016 parameters (ViT 290,909,184 with its embeddings, pooling 7,342,080,
    // projector 1024 x 37,888 + 18,944 x 3584 = 106,692,608, pad_embed 4096). That gives
    // 6,661,948,416 bytes, 16 KB short of the file (bitsandbytes' quant-state tensors).
    let lin = 28 * (3584 * 4608 + 3584 * 3584 + 3584 * 37_888 + 18_944 * 3584);
    assert_eq!(p.attention + p.mlp, lin);
    let rest = 28 * 4608 + 57 * 3584 + (152_064 + 128 + 152_064) * 3584 + 404_950_016;
    assert_eq!(lin * 9 / 16 + 2 * rest, 6_661_948_416);
    let w = weight_bytes(&c, 1, 2, c.quantization.as_ref()).unwrap() as f64;
    assert!((w / 6_661_964_712.0 - 1.0).abs() < 0.001, "{w}");
}

#[test]
fn bitsandbytes_double_quantization_keeps_8_bit_absmax() {
    // Llama-2-13B in NF4 with `bnb_4bit_use_double_quant` (IrfanUruchi/Llama-2-13B-Computer-
    // Engineering, index total_size 7,201,770,923): the 40 layers' 12,687,769,600 linear
    // weights at 4 bits + one 8-bit absmax per 64 + one fp32 scale per 256 absmax =
    // 4.126953125 bits, i.e. 6,545,228,800 bytes; the embedding and head 2 x 32,000 x 5120
    // and 81 norms of 5120 in fp16, and the rotary cache 2048 x 128 x 2 bytes.
    let c = real("IrfanUruchi/Llama-2-13B-Computer-Engineering");
    let want = 6_545_228_800 + (2 * 32_000 * 5120 + 81 * 5120) * 2 + 2048 * 128 * 2;
    assert_eq!(
        weight_bytes(&c, 1, 2, c.quantization.as_ref()).unwrap(),
        want
    );
    assert!((want as f64 / 7_201_770_923.0 - 1.0).abs() < 0.0001);
}

#[test]
fn nvfp4_keeps_what_its_ignore_list_names_in_full_precision() {
    // Qwen3.5-122B-A10B-NVFP4: routed experts in NVFP4 (4 bits + an fp8 scale per 16 = 4.5
    // bits); `ignore` names every layer's `linear_attn*` / `self_attn*` and
    // `mlp.shared_expert*`, the head, `model.visual*` and `mtp*`, which stay bf16. It was
    // counted at 8 bits throughout (128.8 GB, +54% of the checkpoint).
    let c = real("nvidia/Qwen3.5-122B-A10B-NVFP4");
    let q = c.quantization.clone().unwrap();
    assert_eq!(
        (q.bits_per_weight, q.attention, q.shared_experts),
        (4.5, false, false)
    );
    let p = params_per_rank(&c, 1).unwrap();
    // 48 layers x 256 experts x 3 x 3072 x 1024; the shared experts 48 x 3 x 3072 x 1024.
    assert_eq!(p.mlp, 48 * 256 * 3 * 3072 * 1024);
    assert_eq!(p.shared_mlp, 48 * 3 * 3072 * 1024);
    // The checkpoint's 83,474,870,752 bytes hold the MTP layer in bf16, which vLLM loads only
    // for speculative decoding: fc 2 x 3072 x 3072, two input norms, one full-attention layer
    // (3072 x (2 x 32 + 2 x 2) x 256 + 32 x 256 x 3072, q/k norms) with its MoE (256 x 3 x
    // 3072 x 1024 + 3 x 3072 x 1024 + 3072 x 256 + 3072), two layer norms and a final norm:
    // 2,523,679,232 parameters, 5,047,358,464 bytes. The rest is what vLLM holds.
    let mtp = 2 * 3072 * 3072
        + 2 * 3072
        + (3072 * 68 * 256 + 32 * 256 * 3072 + 512)
        + (256 * 3 * 3072 * 1024 + 3 * 3072 * 1024 + 3072 * 256 + 3072)
        + 3 * 3072;
    assert_eq!(mtp, 2_523_679_232u64);
    let served = 83_474_870_752 - 2 * mtp;
    let w = weight_bytes(&c, 1, 2, c.quantization.as_ref()).unwrap() as f64;
    assert!((w / served as f64 - 1.0).abs() < 0.005, "{w} vs {served}");
}

/// The vision tower (with its projector) of `model` counted by memplan, TP 1.
fn tower(model: &str) -> u64 {
    crate::weights::params_by_stage(&real(model), 1)
        .unwrap()
        .vision
        .total()
}

#[test]
fn gemma3_tower_is_siglip_with_its_position_embeddings() {
    // MedGemma 27B (gemma3_mm.py builds `SiglipVisionModel`, siglip.py, all 27 layers, and
    // `Gemma3MultiModalProjector`), width 1152, MLP 4304, patch 14, image 896:
    // - `SiglipVisionEmbeddings`: the convolution 3 x 14^2 x 1152 + 1152 bias = 678,528; the
    //   position embedding (896 / 14)^2 = 4096 x 1152 = 4,718,592;
    // - a `SiglipEncoderLayer`: qkv 3 x 1152^2 + 3 x 1152 and out 1152^2 + 1152 = 5,313,024;
    //   fc1 1152 x 4304 + 4304 and fc2 4304 x 1152 + 1152 = 9,921,872; two LayerNorms
    //   4 x 1152 = 4,608: 15,239,504, x 27 = 411,466,608; the post-LayerNorm 2,304;
    // - the projector: `mm_input_projection_weight` 1152 x 5376 = 6,193,152, the soft-token
    //   RMSNorm 1152;
    // 423,060,336 in all (the generic ViT count gave 447,122,304: a square 5376^2 projector
    // the model has not, no position embeddings).
    assert_eq!(tower("google/medgemma-27b-it"), 423_060_336);
    // The whole checkpoint (index total_size 54,864,813,280, bf16) is memplan's count and the
    // language model's q/k norms (62 layers x 2 x 128 = 15,872), which memplan leaves out.
    let c = real("google/medgemma-27b-it");
    assert_eq!(
        params_per_rank(&c, 1).unwrap().total() + 15_872,
        54_864_813_280 / 2
    );
}

#[test]
fn qwen2_vl_towers_count_their_merger_and_biases() {
    // Qwen2.5-VL-7B (qwen2_5_vl.py `Qwen2_5_VisionTransformer`), width 1280, gated MLP 3420,
    // 32 blocks, patch 14, temporal patch 2, 2 x 2 merge to 3584:
    // - `Qwen2_5_VisionPatchEmbed`: Conv3d 3 x 2 x 14^2 x 1280 = 1,505,280, no bias;
    // - a `Qwen2_5_VisionBlock`: two RMSNorms 2,560; qkv 3 x 1280^2 + 3,840 and proj 1280^2
    //   + 1280 = 6,558,720; gate/up 2 x 1280 x 3420 + 6,840 and down 3420 x 1280 + 1280 =
    //   13,140,920: 19,702,200, x 32 = 630,470,400;
    // - `Qwen2_5_VisionPatchMerger`: RMSNorm 1280; 5120^2 + 5120 and 5120 x 3584 + 3584:
    //   44,574,464;
    // 676,550,144 (generic: 648,518,656). With the language model it is the checkpoint to
    // the parameter (index total_size 16,584,333,312, bf16).
    assert_eq!(
        tower("Qwen/Qwen2.5-VL-7B-Instruct (fine-tune)"),
        676_550_144
    );
    let c = real("Qwen/Qwen2.5-VL-7B-Instruct (fine-tune)");
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), 16_584_333_312 / 2);
    // olmOCR-7B, Qwen2-VL (qwen2_vl.py `Qwen2VisionTransformer`): `embed_dim` 1280, MLP
    // 4 x 1280 = 5120 (fc1/fc2, not gated), LayerNorms:
    // - the same Conv3d, 1,505,280;
    // - a `Qwen2VisionBlock`: two LayerNorms 5,120; qkv and proj 4 x 1280^2 + 4 x 1280 =
    //   6,558,720; fc1 1280 x 5120 + 5120, fc2 5120 x 1280 + 1280 = 13,113,600: 19,677,440,
    //   x 32 = 629,678,080;
    // - `Qwen2VisionPatchMerger`: LayerNorm 2,560 and the same MLP, 44,575,744;
    // 675,759,104 (generic: 647,699,456); again the checkpoint to the parameter (index
    // total_size 16,582,751,232).
    assert_eq!(tower("allenai/olmOCR-7B"), 675_759_104);
    let c = real("allenai/olmOCR-7B");
    assert_eq!(params_per_rank(&c, 1).unwrap().total(), 16_582_751_232 / 2);
}

#[test]
fn qwen3_vl_tower_counts_position_and_deepstack_mergers() {
    // Cosmos-Reason2 (Qwen3-VL 8B shapes; qwen3_vl.py `Qwen3_VisionTransformer`): width
    // 1152, MLP 4304 (fc1/fc2), 27 blocks, patch 16, temporal 2, merge 2 x 2 to 4096:
    // - `Qwen3_VisionPatchEmbed`: Conv3d 3 x 2 x 16^2 x 1152 + 1152 bias = 1,770,624;
    //   `pos_embed` 2304 x 1152 = 2,654,208;
    // - a `Qwen3_VisionBlock` (as SigLIP's: biased qkv/proj, fc1/fc2, two LayerNorms):
    //   15,239,504, x 27 = 411,466,608;
    // - `merger`: LayerNorm 2,304, 4608^2 + 4608, 4608 x 4096 + 4096: 40,119,040;
    // - three `deepstack_merger_list` entries (`deepstack_visual_indexes` [8, 16, 24]), each
    //   with its LayerNorm over 4608 (9,216) and the same MLP: 3 x 40,125,952 = 120,377,856;
    // 576,388,336 (generic: 433,730,944; the model was 1.25 % short of its checkpoint).
    assert_eq!(
        tower("nvidia/Cosmos-Reason2 (sarcascoder/nvidia-reason2)"),
        576_388_336
    );
    // The 4 files (17,534,339,368 bytes with their safetensors headers) hold memplan's count
    // in bf16, the language model's q/k norms (36 x 2 x 128) and the headers (~90 KB).
    // Qwen3.5-122B-A10B builds the same transformer (qwen3_5.py `visual`), out to 3072 and
    // with no deepstack mergers (`deepstack_visual_indexes` []): 1,770,624 + 2,654,208 +
    // 411,466,608 + the merger (2,304 + 4608^2 + 4608 + 4608 x 3072 + 3072 = 35,399,424)
    // = 451,290,864 (generic: 425,211,264).
    assert_eq!(tower("nvidia/Qwen3.5-122B-A10B-NVFP4"), 451_290_864);
    let c = real("nvidia/Cosmos-Reason2 (sarcascoder/nvidia-reason2)");
    let counted = 2 * (params_per_rank(&c, 1).unwrap().total() + 36 * 2 * 128);
    assert!((17_534_339_368 - counted) < 128 << 10, "{counted}");
}

#[test]
fn mistral3_tower_counts_the_patch_merger() {
    // LightOnOCR-2-1B (lightonocr.py: pixtral.py `PixtralHFVisionModel` up to
    // `vision_feature_layer` -1, i.e. all 24 layers, and mistral3.py
    // `Mistral3MultiModalProjector`), width 1024, gated MLP 4096, patch 14, no biases:
    // - `patch_conv` 3 x 14^2 x 1024 = 602,112; `ln_pre` 1024;
    // - a block: two RMSNorms 2,048; q, k, v, o 4 x 1024^2 = 4,194,304; gate/up/down
    //   3 x 1024 x 4096 = 12,582,912: 16,779,264, x 24 = 402,702,336;
    // - the projector: RMSNorm 1024, `Mistral3PatchMerger` (2 x 2 x 1024) x 1024 =
    //   4,194,304, `linear_1` 1024 x 1024 and `linear_2` 1024 x 1024 (the language model is
    //   1024 wide; `multimodal_projector_bias` false): 6,292,480;
    // 409,597,952 (generic: 405,573,632, no patch merger).
    assert_eq!(tower("lightonai/LightOnOCR-2-1B"), 409_597_952);
    // The file (2,011,367,489 bytes with its header) holds memplan's count in bf16, the
    // language model's q/k norms (28 x 2 x 128) and the header (~70 KB).
    let c = real("lightonai/LightOnOCR-2-1B");
    let counted = 2 * (params_per_rank(&c, 1).unwrap().total() + 28 * 2 * 128);
    assert!((2_011_367_489 - counted) < 128 << 10, "{counted}");
}

#[test]
fn llava_clip_tower_stops_at_the_feature_layer() {
    // LLaVA-1.5-7B in the HF layout (llava.py `init_vision_tower_for_llava`: clip.py
    // `CLIPVisionModel` built up to `vision_feature_layer` -2, so 23 of the 24 layers and no
    // post-LayerNorm), CLIP ViT-L/14-336: width 1024, MLP 4096, patch 14, image 336:
    // - `CLIPVisionEmbeddings`: `class_embedding` 1024, the convolution 3 x 14^2 x 1024 =
    //   602,112 (no bias), (336 / 14)^2 + 1 = 577 positions x 1024 = 590,848;
    //   `pre_layrnorm` 2,048;
    // - a `CLIPEncoderLayer`: qkv and out 4 x 1024^2 + 4 x 1024 = 4,198,400; fc1 1024 x 4096
    //   + 4096 and fc2 4096 x 1024 + 1024 = 8,393,728; two LayerNorms 4,096: 12,596,224,
    //   x 23 = 289,713,152;
    // - `LlavaMultiModalProjector`: 1024 x 4096 + 4096 and 4096^2 + 4096 = 20,979,712;
    // 311,888,896 (the generic count: all 24 layers, no positions, 323,784,704).
    let c = ModelConfig::from_value(&serde_json::json!({
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
        "text_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "max_position_embeddings": 4096, "vocab_size": 32064},
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024,
            "intermediate_size": 4096, "num_hidden_layers": 24, "patch_size": 14,
            "image_size": 336, "projection_dim": 768},
        "vision_feature_layer": -2
    }))
    .unwrap();
    let tower = crate::weights::params_by_stage(&c, 1)
        .unwrap()
        .vision
        .total();
    assert_eq!(tower, 311_888_896);
}
