//! Full-attention layers with a shape of their own (Gemma 4).
//!
//! Gemma 4 interleaves sliding-window layers with full-attention ("global") layers whose heads
//! are another size: vLLM's `model_executor/models/gemma4.py`, `Gemma4DecoderLayer.__init__`,
//! gives a `full_attention` layer `global_head_dim` (else `head_dim`) as its head size and,
//! where `attention_k_eq_v` is set, `num_global_key_value_heads` (else `num_key_value_heads`)
//! as its KV head count; every other layer keeps `head_dim` and `num_key_value_heads`. A
//! `k_eq_v` layer still caches K and V (`Gemma4Attention` loads K's weights into both slots of
//! its QKV projection and hands `Attention` separate K and V), so its page is two such heads'
//! worth per token, as any other layer's. With `use_double_wide_mlp`, the layers that share
//! another layer's KV (the last `num_kv_shared_layers`) have MLPs twice `intermediate_size`.
//!
//! Read as per-layer shapes ([`LayerShape`]), so the KV spec groups the two kinds of layer by
//! their own pages and the weights count each layer's projections at its own size.

use memplan_core::{Error, Result};

use crate::config::{Fields, LayerKind, LayerShape};

/// The keys this reader consumes (the guard against unread layer structure lets them pass).
pub(crate) const KEYS: &[&str] = &[
    "global_head_dim",
    "num_global_key_value_heads",
    "attention_k_eq_v",
    "use_double_wide_mlp",
];

/// The rule's name in the plan's notes.
pub(crate) const RULE: &str = "full-attention layers by global_head_dim (gemma4.py)";

/// Per-layer shapes where the config gives full-attention layers a shape of their own (see
/// the module docs); `None` where it does not. `layers` are the layers' kinds as read (the
/// last `num_kv_shared_layers` already without a cache), `heads`, `kv_heads`, `head_dim` and
/// `intermediate` the model-wide figures.
pub(crate) fn shapes(
    f: &Fields<'_>,
    layers: &[LayerKind],
    (heads, kv_heads, head_dim, intermediate): (u64, u64, u64, u64),
) -> Result<Option<Vec<LayerShape>>> {
    let global_dim = f.opt_u64("global_head_dim")?.filter(|d| *d > 0);
    let k_eq_v = f.bool("attention_k_eq_v", false)?;
    let global_kv = if k_eq_v {
        f.opt_u64("num_global_key_value_heads")?.filter(|k| *k > 0)
    } else {
        None
    };
    if global_dim.is_none() && global_kv.is_none() {
        return Ok(None);
    }
    if f.get("layer_types").is_none() {
        // Which layers are global is `layer_types` in Gemma 4; a pattern read otherwise would
        // give the global shape to layers the engine does not.
        return Err(Error::invalid(
            "global_head_dim",
            "full-attention layers of their own shape without `layer_types`: vLLM's gemma4.py picks them by `layer_types[i] == \"full_attention\"`, which this config does not say",
        ));
    }
    let n = layers.len() as u64;
    let shared = f.opt_u64("num_kv_shared_layers")?.unwrap_or(0).min(n);
    let double = f.bool("use_double_wide_mlp", false)?;
    let types = f
        .get("layer_types")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .map(|t| t.as_str() == Some("full_attention"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let shapes = (0..n)
        .map(|i| {
            let full = types.get(i as usize).copied().unwrap_or(false);
            let inter = if double && shared > 0 && i >= n - shared {
                intermediate.saturating_mul(2)
            } else {
                intermediate
            };
            if full {
                LayerShape::new(heads, global_kv.unwrap_or(kv_heads), inter)
                    .with_head_dim(global_dim.unwrap_or(head_dim))
            } else {
                LayerShape::new(heads, kv_heads, inter)
            }
        })
        .collect();
    Ok(Some(shapes))
}
