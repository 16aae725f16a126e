//! Vision towers of multimodal wrappers: their shape (for the encoder's profiling memory)
//! and their parameters with the projector to the language model, counted from the modules
//! vLLM builds where config.json names a tower memplan knows (vLLM 0.19.0 model files, cited
//! per family); any other tower by a generic ViT count.

use serde_json::{Map, Value};

use crate::config::Vision;

/// The tower `vision_config` describes, for a wrapper `arch` whose language model is `lm`
/// wide; `None` without a `vision_config` or its width and depth.
pub(super) fn read(top: &Map<String, Value>, arch: &str, lm: u64) -> Option<Vision> {
    let Some(Value::Object(v)) = top.get("vision_config") else {
        return None;
    };
    let n = |keys: &[&str]| keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64));
    let flag = |k: &str, default: bool| v.get(k).and_then(Value::as_bool).unwrap_or(default);
    let vision_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    // Qwen2-VL's tower is `embed_dim` wide; its `hidden_size` is the merger's output, the
    // language model's width (transformers `Qwen2VLVisionConfig`).
    let hidden = n(&["embed_dim", "hidden_size", "width"])?;
    let layers = n(&["num_hidden_layers", "depth", "layers"])?;
    let ratio = n(&["mlp_ratio"]).unwrap_or(4);
    let intermediate = n(&["intermediate_size"]).unwrap_or(ratio.saturating_mul(hidden));
    let patch = n(&["patch_size"]).unwrap_or(14);
    // A SiLU tower has a gated MLP (Pixtral's `FeedForward` w1/w2/w3, Qwen2.5-VL's
    // gate/up/down: vLLM `pixtral.py`, `qwen2_5_vl.py`); GELU towers (CLIP, SigLIP, Qwen2-VL)
    // have two matrices, Gemma 4's has three (`Gemma4VisionMLP`).
    let silu = v
        .get("hidden_act")
        .and_then(Value::as_str)
        .is_some_and(|a| a == "silu" || a == "swiglu");
    let gemma4 = vision_type == "gemma4_vision" || arch.starts_with("Gemma4");
    let pixtral = vision_type == "pixtral";
    let gated =
        gemma4 || pixtral || arch.starts_with("Pixtral") || arch.starts_with("Mistral3") || silu;
    // Counted in f64 (exact below 2^53; an absurd config saturates and is refused by the
    // weights' plausibility check).
    let (vh, vi, p, l, h) = (
        hidden as f64,
        intermediate as f64,
        patch as f64,
        layers as f64,
        lm as f64,
    );
    let temporal = n(&["temporal_patch_size"]).unwrap_or(2) as f64;
    let merge = n(&["spatial_merge_size"]).unwrap_or(2) as f64;
    let out = n(&["out_hidden_size"]).unwrap_or(lm) as f64;
    // A bias-carrying ViT layer with LayerNorms (CLIP/SigLIP/Qwen2-VL/Qwen3-VL): q, k, v, o
    // with biases, fc1 and fc2 with biases, two LayerNorms (weight and bias).
    let vit_layer = 4.0 * vh * vh + 4.0 * vh + 2.0 * vh * vi + vi + vh + 4.0 * vh;
    // The Qwen mergers: 2x2 patches concatenated (`context_dim * spatial_merge_size**2`), a
    // biased MLP of that width to `out_hidden_size`.
    let wide = vh * merge * merge;
    let qwen_merger = wide * wide + wide + wide * out + out;
    let params = if gemma4 {
        // transformers `Gemma4VisionModel` (vLLM `gemma4_mm.py` builds it with
        // `AutoModel.from_config`): `Gemma4VisionPatchEmbedder` (`input_proj` 3 p^2 -> vh, no
        // bias; `position_embedding_table` 2 x `position_embedding_size` x vh), each
        // `Gemma4VisionEncoderLayer` (q, k, v, o without biases, q/k RMSNorms of `head_dim`,
        // v norm without weight, four RMSNorms, `Gemma4VisionMLP` gate/up/down; with
        // `use_clipped_linears` four scalar bounds per linear), `std_bias`/`std_scale` when
        // `standardize`; then `Gemma4MultimodalEmbedder` (one vh -> lm projection, a norm
        // without weight).
        let heads = n(&["num_attention_heads"]).unwrap_or(12) as f64;
        let kv = n(&["num_key_value_heads"]).unwrap_or(heads as u64) as f64;
        let hd = n(&["head_dim"]).unwrap_or(64) as f64;
        let positions = n(&["position_embedding_size"]).unwrap_or(10 * 1024) as f64;
        let clip = if flag("use_clipped_linears", false) {
            7.0 * 4.0
        } else {
            0.0
        };
        let layer =
            2.0 * vh * heads * hd + 2.0 * vh * kv * hd + 2.0 * hd + 4.0 * vh + 3.0 * vh * vi + clip;
        let standardize = if flag("standardize", false) {
            2.0 * vh
        } else {
            0.0
        };
        3.0 * p * p * vh + 2.0 * positions * vh + l * layer + standardize + vh * h
    } else if vision_type == "siglip_vision_model" && arch.starts_with("Gemma3") {
        // vLLM `siglip.py` `SiglipVisionModel` as `gemma3_mm.py` builds it (all layers, so the
        // post-LayerNorm; no head): `SiglipVisionEmbeddings` (a biased p x p convolution and
        // (image_size / p)^2 position embeddings), `SiglipEncoderLayer`s; then
        // `Gemma3MultiModalProjector` (`mm_input_projection_weight` vh x lm, an RMSNorm of vh).
        let image = n(&["image_size"]).unwrap_or(224) as f64;
        let positions = (image / p).floor().powi(2);
        3.0 * p * p * vh + vh + positions * vh + l * vit_layer + 2.0 * vh + vh * h + vh
    } else if arch.starts_with("Qwen2VL") {
        // vLLM `qwen2_vl.py` `Qwen2VisionTransformer`: `Qwen2VisionPatchEmbed` (a Conv3d of
        // `temporal_patch_size` x p x p, no bias), `Qwen2VisionBlock`s (LayerNorms, biased
        // qkv/proj and fc1/fc2), `Qwen2VisionPatchMerger` (a LayerNorm and the merger MLP).
        3.0 * temporal * p * p * vh + l * vit_layer + 2.0 * vh + qwen_merger
    } else if arch.starts_with("Qwen2_5_VL") {
        // vLLM `qwen2_5_vl.py` `Qwen2_5_VisionTransformer`: the Conv3d patch embedding (no
        // bias), `Qwen2_5_VisionBlock`s (two RMSNorms, biased qkv/proj, a biased gated MLP),
        // `Qwen2_5_VisionPatchMerger` (an RMSNorm `ln_q` and the merger MLP).
        let layer = 2.0 * vh + 4.0 * vh * vh + 4.0 * vh + 3.0 * vh * vi + 2.0 * vi + vh;
        3.0 * temporal * p * p * vh + l * layer + vh + qwen_merger
    } else if arch.starts_with("Qwen3VL") || arch.starts_with("Qwen3_5") {
        // vLLM `qwen3_vl.py` `Qwen3_VisionTransformer` (Qwen3.5's too: `qwen3_5.py`
        // `visual`): `Qwen3_VisionPatchEmbed` (a biased
        // Conv3d), `pos_embed` (`num_position_embeddings` x vh), `Qwen3_VisionBlock`s
        // (LayerNorms, biased attention and fc1/fc2), the `merger` (a LayerNorm of vh) and one
        // `deepstack_merger_list` entry per `deepstack_visual_indexes` (post-shuffle: its
        // LayerNorm is of the merged width).
        let positions = n(&["num_position_embeddings"]).unwrap_or(2304) as f64;
        let deepstack = v
            .get("deepstack_visual_indexes")
            .and_then(Value::as_array)
            .map_or(0, Vec::len) as f64;
        3.0 * temporal * p * p * vh
            + vh
            + positions * vh
            + l * vit_layer
            + 2.0 * vh
            + qwen_merger
            + deepstack * (2.0 * wide + qwen_merger)
    } else if pixtral && (arch.starts_with("Mistral3") || arch.starts_with("LightOnOCR")) {
        // vLLM `pixtral.py` `PixtralHFVisionModel` as `mistral3.py`
        // `init_vision_tower_for_mistral3` builds it, up to `vision_feature_layer` (-1: all;
        // `utils.py` `get_layer_index`): `patch_conv` (no bias), `ln_pre`, blocks of two
        // RMSNorms, q/k/v/o and a gated MLP, none biased; then `Mistral3MultiModalProjector`
        // (an RMSNorm, `Mistral3PatchMerger` vh m^2 -> vh, `linear_1` vh -> lm, `linear_2`
        // lm -> lm, biased when `multimodal_projector_bias`).
        let built = built_layers(top, layers, -1);
        let bias = if flag_top(top, "multimodal_projector_bias", false) {
            2.0 * h
        } else {
            0.0
        };
        let layer = 2.0 * vh + 4.0 * vh * vh + 3.0 * vh * vi;
        3.0 * p * p * vh + vh + built * layer + vh + vh * merge * merge * vh + vh * h + h * h + bias
    } else if arch == "LlavaForConditionalGeneration"
        && (vision_type.is_empty() || vision_type == "clip_vision_model")
    {
        // vLLM `clip.py` `CLIPVisionModel` as `llava.py` `init_vision_tower_for_llava` builds
        // it, up to `vision_feature_layer` (default -2: all but the last layer, then no
        // post-LayerNorm): `CLIPVisionEmbeddings` (`class_embedding`, a p x p convolution
        // without bias, (image_size / p)^2 + 1 positions), `pre_layrnorm`, `CLIPEncoderLayer`s;
        // then `LlavaMultiModalProjector` (`linear_1` vh -> lm, `linear_2` lm -> lm, biased
        // unless `multimodal_projector_bias` is false). transformers' `CLIPVisionConfig`
        // defaults image_size to 224.
        let image = n(&["image_size"]).unwrap_or(224) as f64;
        let built = built_layers(top, layers, -2);
        let post = if built == l { 2.0 * vh } else { 0.0 };
        let bias = if flag_top(top, "multimodal_projector_bias", true) {
            2.0 * h
        } else {
            0.0
        };
        vh + 3.0 * p * p * vh
            + ((image / p).floor().powi(2) + 1.0) * vh
            + 2.0 * vh
            + built * vit_layer
            + post
            + vh * h
            + h * h
            + bias
    } else {
        generic(hidden, layers, intermediate, patch, gated) + vh * h + h * h
    };
    Some(Vision {
        hidden,
        layers,
        intermediate,
        patch,
        gated,
        params: params as u64,
    })
}

/// The tower layers vLLM builds: up to the deepest `vision_feature_layer` the wrapper reads
/// (`utils.py` `get_layer_index`: a negative index counts from the end, -1 is the last).
fn built_layers(top: &Map<String, Value>, layers: u64, default: i64) -> f64 {
    let n = i64::try_from(layers).unwrap_or(i64::MAX);
    let built = |i: i64| {
        if i < 0 {
            n.saturating_add(i).saturating_add(1)
        } else {
            i
        }
        .clamp(0, n)
    };
    let feature = match top.get("vision_feature_layer") {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).map(built).max(),
        Some(x) => x.as_i64().map(built),
        None => None,
    };
    feature.unwrap_or_else(|| built(default)) as f64
}

/// A boolean of the wrapper's own config, `default` when absent.
fn flag_top(top: &Map<String, Value>, key: &str, default: bool) -> bool {
    top.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// A ViT tower by the generic count: per layer four square attention matrices, the MLP (two
/// matrices, three gated) and 9 x `hidden` of biases and norms; a p x p x 3 patch embedding.
/// The towers memplan has no model of use it, with a linear projector of the tower's width
/// to the model's and one of the model's width.
pub(super) fn generic(hidden: u64, layers: u64, intermediate: u64, patch: u64, gated: bool) -> f64 {
    let (vh, vi, p) = (hidden as f64, intermediate as f64, patch as f64);
    let vm = if gated { 3.0 } else { 2.0 };
    layers as f64 * (4.0 * vh * vh + vm * vh * vi + 9.0 * vh) + 3.0 * p * p * vh
}
