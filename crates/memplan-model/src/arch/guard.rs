//! The guard against per-layer structure memplan does not read.
//!
//! A config that describes its layers one by one (which layers attend, how many heads each
//! has, how wide each MLP is) and is read by a rule that assumes every layer is alike gives a
//! plan for a different model: wrong KV pages, wrong weights, a wrong token count with a
//! confident face. Such a config is refused, naming the key, unless a reader consumed it.
//!
//! A key is per-layer structure when:
//! - its name is one families use for per-layer structure ([`PER_LAYER`]; vLLM's model files
//!   index these by layer: `config.layer_types[layer_idx]`, `config.block_configs[layer_idx]`,
//!   `config.mlp_layer_types[layer_idx]`, ...), whatever its shape; or
//! - it is a list with one entry per layer; or
//! - it names a subset of layers (`*_layers`, `*_layer_ids`, `*_idx`, `*_idxs`, ...: a list of
//!   layer indices); or
//! - it sits in a section of its own inside the language model's config and is a list of
//!   numbers or flags with one entry per layer (MiniMax-M3's
//!   `sparse_attention_config.sparse_attention_freq`); quantization and RoPE sections are not
//!   searched.
//!
//! Keys that look per-layer but change neither the weights nor the cache are let through,
//! each with its reason ([`INERT`]). A key that only restates which attention each layer
//! has ([`PATTERN`]) is let through when another key already stated the pattern layer by
//! layer (Zamba2's `layers_block_type` beside `hybrid_layer_ids`, LFM2's `full_attn_idxs`
//! beside `layer_types`).

use memplan_core::{Error, Result};
use serde_json::{Map, Value};

/// Keys families use to describe layers one by one.
pub const PER_LAYER: &[&str] = &[
    "block_configs",
    "layer_types",
    "layers_block_type",
    "attn_type_list",
    "hybrid_override_pattern",
    "hybrid_layer_pattern",
    "mlp_layer_types",
    "layers_num_experts",
    "per_layer_config",
    "window_sizes",
    "interleaved_sliding_window",
    "linear_attn_config",
    "num_key_value_heads_per_layer",
    "num_query_heads",
    "ffn_multipliers",
    "full_attn_idxs",
    "swa_layers",
    "full_attn_layers",
    "sliding_window_layers",
    "global_attn_layers",
    "attn_layer_indices",
    "hybrid_layer_ids",
    "cross_attention_layers",
    "moe_layers",
    "moe_layers_enum",
    "mlp_only_layers",
    "sliding_window_pattern",
    "full_attention_interval",
    "attn_layer_period",
    "expert_layer_period",
    "compress_ratios",
];

/// Keys that give some layers a KV cache of another shape than the model-wide one (Gemma 4's
/// full-attention layers: `global_head_dim`, `num_global_key_value_heads`), whatever their
/// value: a reader that assumes every layer's page alike would plan another cache.
pub const LAYER_SHAPE: &[&str] = &["global_head_dim", "num_global_key_value_heads"];

/// Keys counting the layers a checkpoint adds after the decoder's for multi-token prediction
/// (DeepSeek's `num_nextn_predict_layers`): a per-layer list may carry their entries too.
const EXTRA_LAYERS: &[&str] = &[
    "num_nextn_predict_layers",
    "num_mtp_layers",
    "mtp_num_layers",
];

/// Keys that only restate which attention (or state) each layer has.
pub const PATTERN: &[&str] = &[
    "layer_types",
    "layers_block_type",
    "attn_type_list",
    "hybrid_override_pattern",
    "full_attn_idxs",
    "swa_layers",
    "full_attn_layers",
    "sliding_window_layers",
    "global_attn_layers",
    "attn_layer_indices",
    "sliding_window_pattern",
    "full_attention_interval",
    "attn_layer_period",
];

/// Per-layer-looking keys that change neither the weights nor the KV cache, and why.
pub const INERT: &[(&str, &str)] = &[
    (
        "no_rope_layers",
        "which layers skip RoPE (SmolLM3, Llama 4): no weights, no cache",
    ),
    (
        "activation_sparsity_pattern",
        "Gemma 3n's per-layer activation sparsity target (gemma3n.py): a threshold, no weights",
    ),
    (
        "layer_rope_theta",
        "a per-layer RoPE base (granite.py): no weights, no cache",
    ),
    ("architectures", "the model class names, not layers"),
    (
        "image_grid_pinpoints",
        "the image tile sizes a LLaVA-NeXT processor picks from, not layers",
    ),
    (
        "vision_feature_layer",
        "layers of the vision tower a wrapper reads features from, not language-model layers",
    ),
];

/// Sections inside the language model's config that describe no layers (quantization:
/// module names and group sizes; RoPE scaling: frequencies), not searched for per-layer lists.
const NOT_LAYERS: &[&str] = &[
    "quantization_config",
    "compression_config",
    "rope_scaling",
    "rope_parameters",
];

/// Why `v`, inside a section of the language model's config, is per-layer structure: a list
/// of numbers or flags with one entry per layer (or per layer and prediction layer).
fn per_layer_figures(v: &Value, layers: u64, extra: u64) -> Option<String> {
    let a = v.as_array()?;
    let n = a.len() as u64;
    let figures = a.iter().all(|x| x.is_number() || x.is_boolean());
    (figures && layers > 1 && n >= layers && n <= layers + extra)
        .then(|| format!("has one entry per layer ({n} entries)"))
}

/// Whether `k` names a token id list (`eos_token_id`, `bad_words_ids`, ...), never layers.
fn token_ids(k: &str) -> bool {
    k.contains("token") || k.ends_with("_ids") && !k.contains("layer")
}

/// Whether `k`'s value is a list of layer indices (`mlp_only_layers`, `swa_layers`,
/// `full_attn_idxs`, ...).
fn index_list(k: &str, a: &[Value], layers: u64) -> bool {
    let named = [
        "_layers",
        "_layer_ids",
        "_layer_idx",
        "_layer_indices",
        "_layers_idx",
        "_idx",
        "_idxs",
        "_indices",
    ]
    .iter()
    .any(|s| k.ends_with(s));
    named && !a.is_empty() && a.iter().all(|v| v.as_u64().is_some_and(|i| i < layers))
}

/// Why `v` under `k` is per-layer structure, or `None`. `generic`: also judge keys by their
/// shape (in the language model's own section; a wrapper's other keys describe other towers).
/// `extra`: layers the checkpoint adds after the decoder's (multi-token prediction), whose
/// entries a per-layer list may carry as well (DeepSeek-V4's `compress_ratios`: 44 entries for
/// 43 layers and one prediction layer).
fn per_layer(k: &str, v: &Value, layers: u64, extra: u64, generic: bool) -> Option<String> {
    let known = PER_LAYER.contains(&k);
    if LAYER_SHAPE.contains(&k) && !v.is_null() {
        return Some(format!(
            "gives some layers a KV cache of their own shape ({v})"
        ));
    }
    if !known && !generic {
        return None;
    }
    match v {
        Value::Null => None,
        Value::Array(a) if a.is_empty() => None,

        // A list of lists under a name no family uses for layers is no per-layer figure
        // (LLaVA-NeXT's `image_grid_pinpoints`: image tile sizes, 36 pairs beside 36 layers).
        Value::Array(a) if !known && a.iter().all(Value::is_array) => None,
        Value::Array(a) if a.len() as u64 == layers && layers > 1 => {
            Some(format!("has one entry per layer ({} entries)", a.len()))
        }
        Value::Array(a)
            if layers > 1 && a.len() as u64 > layers && a.len() as u64 <= layers + extra =>
        {
            Some(format!(
                "has one entry per layer and per prediction layer ({} entries for {layers} + {extra})",
                a.len()
            ))
        }
        Value::Array(a) if index_list(k, a, layers) => Some(format!(
            "names a subset of the {layers} layers ({} of them)",
            a.len()
        )),
        Value::Array(a) if known => Some(format!(
            "describes the layers one by one ({} entries)",
            a.len()
        )),
        Value::Array(a)
            if a.iter().all(Value::is_object) && (k.contains("layer") || k.contains("block")) =>
        {
            Some(format!("describes blocks one by one ({} entries)", a.len()))
        }
        Value::Bool(false) => None,
        _ if known => Some(format!("describes the layer pattern ({v})")),
        _ => None,
    }
}

/// Refuse the config when a key of `map` (the language model's section; `outer` the
/// wrapper around it, when there is one) holds per-layer structure no reader consumed.
/// `read` lists the keys the readers consumed; `explicit` says whether a key stated the layer
/// pattern layer by layer; `rule` names the rule that read it (for the message).
pub(crate) fn check(
    map: &Map<String, Value>,
    outer: Option<&Map<String, Value>>,
    layers: u64,
    read: &[&str],
    explicit: bool,
    rule: &str,
) -> Result<()> {
    let extra = EXTRA_LAYERS
        .iter()
        .filter_map(|k| map.get(*k).or_else(|| outer.and_then(|o| o.get(*k))))
        .filter_map(Value::as_u64)
        .max()
        .unwrap_or(0)
        .min(layers);
    let sections = std::iter::once((map, true)).chain(outer.map(|o| (o, false)));
    for (section, generic) in sections {
        // serde_json keeps keys sorted, so the key named is the same on every run.
        for (k, v) in section {
            if read.contains(&k.as_str())
                || token_ids(k)
                || INERT.iter().any(|(i, _)| i == k)
                || (explicit && PATTERN.contains(&k.as_str()))
            {
                continue;
            }
            let refuse = |key: String, why: String| {
                Error::invalid(
                    key,
                    format!(
                        "{why}, but memplan's reader for this config ({rule}) does not read it: a plan from a misread architecture would be wrong, so memplan refuses it"
                    ),
                )
            };
            if let Some(why) = per_layer(k, v, layers, extra, generic) {
                return Err(refuse(k.clone(), why));
            }
            // A section of its own inside the language model's (MiniMax-M3's
            // `sparse_attention_config`, whose `sparse_attention_freq` gives each of its 60
            // layers an index cache or none): a list of one number per layer in it is
            // per-layer structure too. Quantization sections list modules, not layers.
            if let (true, Value::Object(inner)) = (generic, v) {
                if NOT_LAYERS.contains(&k.as_str()) {
                    continue;
                }
                for (k2, v2) in inner {
                    if let Some(why) = per_layer_figures(v2, layers, extra) {
                        return Err(refuse(format!("{k}.{k2}"), why));
                    }
                }
            }
        }
    }
    Ok(())
}
