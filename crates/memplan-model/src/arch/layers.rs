//! Which layers cache what, from the keys families use to describe their layer pattern.
//! Tried in order; the first rule whose key is present wins, and its name goes in the plan's
//! notes. vLLM's model classes read the same keys (file named per rule).

use memplan_core::{Error, Result};
use serde_json::Value;

use crate::config::{Fields, LayerKind};

/// The rule that read the layer pattern, and the keys it read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rule {
    /// Its name, for the plan's notes.
    pub(crate) name: &'static str,
    /// The config keys it read.
    pub(crate) keys: &'static [&'static str],
    /// Whether a key stated the pattern layer by layer (a fallback assumes it).
    pub(crate) explicit: bool,
}

impl Rule {
    const fn new(name: &'static str, keys: &'static [&'static str]) -> Self {
        Rule {
            name,
            keys,
            explicit: true,
        }
    }

    const fn fallback(name: &'static str, keys: &'static [&'static str]) -> Self {
        Rule {
            name,
            keys,
            explicit: false,
        }
    }
}

fn window(f: &Fields<'_>) -> Result<u64> {
    f.positive("sliding_window")
}

/// `layer_types` names (transformers' `layer_types`, Granite-4.0-H/Qwen3.5 lists).
fn kind_of(name: &str, f: &Fields<'_>) -> Result<LayerKind> {
    Ok(match name {
        "full_attention" | "attention" | "global" | "global_attention" => LayerKind::Full,
        "sliding_attention" | "sliding_window" | "local" | "local_attention" => {
            LayerKind::Sliding(window(f)?)
        }
        "chunked_attention" => LayerKind::Chunked(f.positive("attention_chunk_size")?),
        "linear_attention" | "mamba" | "mamba2" | "ssm" | "conv" => LayerKind::State,
        other => {
            return Err(Error::invalid(
                "layer_types",
                format!("unsupported layer type {other:?}"),
            ))
        }
    })
}

fn list<'a>(f: &Fields<'a>, key: &str) -> Result<Option<&'a Vec<Value>>> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(Error::invalid(key, format!("expected a list, found {v}"))),
    }
}

pub(crate) fn indices(f: &Fields<'_>, key: &str, layers: u64) -> Result<Option<Vec<u64>>> {
    let Some(a) = list(f, key)? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(a.len());
    for v in a {
        match v.as_u64() {
            Some(i) if i < layers => out.push(i),
            _ => {
                return Err(Error::invalid(
                    key,
                    format!("{v} is not a layer index below {layers}"),
                ))
            }
        }
    }
    Ok(Some(out))
}

/// Attention where `attention(i)` holds, a recurrent state elsewhere.
fn attention_where(layers: u64, attention: impl Fn(u64) -> bool) -> Vec<LayerKind> {
    (0..layers)
        .map(|i| {
            if attention(i) {
                LayerKind::Full
            } else {
                LayerKind::State
            }
        })
        .collect()
}

/// Attention at the listed layers (indices below `layers`), a recurrent state elsewhere.
fn attention_at(ix: &[u64], layers: u64) -> Vec<LayerKind> {
    let mut at = vec![false; layers as usize];
    for &i in ix {
        at[i as usize] = true;
    }
    attention_where(layers, |i| at[i as usize])
}

/// The per-layer kinds and the rule that produced them. `model_type` selects family
/// patterns that have no explicit key (Gemma 2/3, Cohere2).
pub(crate) fn read(
    f: &Fields<'_>,
    layers: u64,
    model_type: &str,
) -> Result<(Vec<LayerKind>, Rule)> {
    let n = layers as usize;
    if let Some(types) = list(f, "layer_types")? {
        if types.len() != n {
            return Err(Error::invalid(
                "layer_types",
                format!("{} entries for {layers} layers", types.len()),
            ));
        }
        let mut out = Vec::with_capacity(n);
        for t in types {
            let name = t
                .as_str()
                .ok_or_else(|| Error::invalid("layer_types", format!("{t} is not a name")))?;
            out.push(kind_of(name, f)?);
        }
        // Gemma 3n: the last `num_kv_shared_layers` reuse earlier layers' KV.
        let shared = f.opt_u64("num_kv_shared_layers")?.unwrap_or(0).min(layers) as usize;
        for k in out.iter_mut().skip(n - shared) {
            *k = LayerKind::None;
        }
        return Ok((
            out,
            Rule::new("layer_types", &["layer_types", "num_kv_shared_layers"]),
        ));
    }
    // MiniMax (`attn_type_list`, vLLM `config/model.py` `get_num_layers_by_block_type`): 1 is
    // softmax attention, 0 a lightning (linear) attention layer. MiniMax-M2 writes all 1s.
    if let Some(types) = list(f, "attn_type_list")? {
        if types.len() != n {
            return Err(Error::invalid(
                "attn_type_list",
                format!("{} entries for {layers} layers", types.len()),
            ));
        }
        let mut out = Vec::with_capacity(n);
        for t in types {
            match t.as_u64() {
                Some(1) => out.push(LayerKind::Full),
                Some(0) => return Err(Error::invalid(
                    "attn_type_list",
                    "has lightning (linear) attention layers (0), whose recurrent state memplan does not size; vLLM served them last in 0.23 (MiniMaxText01ForCausalLM, MiniMaxM1ForCausalLM)",
                )),
                _ => return Err(Error::invalid("attn_type_list", format!("{t} is not 0 (linear) or 1 (softmax attention)"))),
            }
        }
        return Ok((
            out,
            Rule::new("attn_type_list (minimax_m2.py)", &["attn_type_list"]),
        ));
    }
    // LFM2 without `layer_types`: attention at `full_attn_idxs`, short convolutions elsewhere
    // (transformers `Lfm2Config`, which vLLM's lfm2.py reads through `layer_types`).
    if model_type.starts_with("lfm2") {
        if let Some(ix) = indices(f, "full_attn_idxs", layers)? {
            let out = attention_at(&ix, layers);
            return Ok((
                out,
                Rule::new("full_attn_idxs (lfm2.py)", &["full_attn_idxs"]),
            ));
        }
    }
    // Nemotron-H: one character per block, M = Mamba2, * = attention, - and E = MLP/MoE.
    if let Some(p) = f.str("hybrid_override_pattern") {
        let out: Vec<LayerKind> = p
            .chars()
            .map(|c| match c {
                'M' => LayerKind::State,
                '*' => LayerKind::Full,
                _ => LayerKind::None,
            })
            .collect();
        if out.len() != n {
            return Err(Error::invalid(
                "hybrid_override_pattern",
                format!("{} blocks for {layers} layers", out.len()),
            ));
        }
        return Ok((
            out,
            Rule::new(
                "hybrid_override_pattern (nemotron_h.py)",
                &["hybrid_override_pattern"],
            ),
        ));
    }
    // Jamba: attention every `attn_layer_period` layers from `attn_layer_offset`.
    if let Some(period) = f.opt_u64("attn_layer_period")?.filter(|p| *p > 0) {
        let offset = f.opt_u64("attn_layer_offset")?.unwrap_or(0);
        let out = attention_where(layers, |i| i % period == offset);
        return Ok((
            out,
            Rule::new(
                "attn_layer_period/offset (jamba.py)",
                &["attn_layer_period", "attn_layer_offset"],
            ),
        ));
    }
    // Bamba: attention at the listed layers, Mamba2 elsewhere.
    if let Some(ix) = indices(f, "attn_layer_indices", layers)? {
        let out = attention_at(&ix, layers);
        return Ok((
            out,
            Rule::new("attn_layer_indices (bamba)", &["attn_layer_indices"]),
        ));
    }
    // Qwen3-Next: every `full_attention_interval`-th layer is attention, the rest GDN.
    if let Some(every) = f.opt_u64("full_attention_interval")?.filter(|p| *p > 0) {
        let out = attention_where(layers, |i| (i + 1) % every == 0);
        return Ok((
            out,
            Rule::new(
                "full_attention_interval (qwen3_next.py)",
                &["full_attention_interval"],
            ),
        ));
    }
    // Zamba2: a Mamba2 state in every layer, plus a shared attention block (with its own
    // cache) at each hybrid layer.
    if let Some(ix) = indices(f, "hybrid_layer_ids", layers)? {
        let mut out = vec![LayerKind::State; n];
        out.extend(ix.iter().map(|_| LayerKind::Full));
        return Ok((
            out,
            Rule::new("hybrid_layer_ids (zamba2.py)", &["hybrid_layer_ids"]),
        ));
    }
    // Mllama: cross-attention layers attend to the vision encoder's tokens.
    if let Some(ix) = indices(f, "cross_attention_layers", layers)? {
        let tokens = f.opt_u64("vision_tokens")?.unwrap_or(6404);
        let out = (0..layers)
            .map(|i| {
                if ix.contains(&i) {
                    LayerKind::Cross(tokens)
                } else {
                    LayerKind::Full
                }
            })
            .collect();
        return Ok((
            out,
            Rule::new(
                "cross_attention_layers (mllama)",
                &["cross_attention_layers"],
            ),
        ));
    }
    // Llama 4: layers with RoPE (`no_rope_layers[i] == 1`) use chunked local attention.
    if let Some(chunk) = f.opt_u64("attention_chunk_size")?.filter(|c| *c > 0) {
        let out = match list(f, "no_rope_layers")? {
            Some(l) if l.len() == n => l
                .iter()
                .map(|v| {
                    if v.as_u64() == Some(0) {
                        LayerKind::Full
                    } else {
                        LayerKind::Chunked(chunk)
                    }
                })
                .collect(),
            _ => {
                let every = f.opt_u64("nope_layer_interval")?.unwrap_or(4).max(1);
                (0..layers)
                    .map(|i| {
                        if (i + 1) % every == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::Chunked(chunk)
                        }
                    })
                    .collect()
            }
        };
        return Ok((
            out,
            Rule::new(
                "attention_chunk_size/no_rope_layers (llama4.py)",
                &[
                    "attention_chunk_size",
                    "no_rope_layers",
                    "nope_layer_interval",
                ],
            ),
        ));
    }
    // Falcon-H1: attention and Mamba2 side by side in every layer.
    if f.get("mamba_d_ssm").is_some() || model_type == "falcon_h1" {
        let mut out = vec![LayerKind::Full; n];
        out.extend(vec![LayerKind::State; n]);
        return Ok((
            out,
            Rule::new("parallel attention + mamba (falcon_h1.py)", &[]),
        ));
    }
    let on = f.get("use_sliding_window").and_then(Value::as_bool);
    if model_type.starts_with("gemma2") {
        let w = window(f)?;
        let out = (0..layers)
            .map(|i| {
                if i % 2 == 0 {
                    LayerKind::Sliding(w)
                } else {
                    LayerKind::Full
                }
            })
            .collect();
        return Ok((out, Rule::new("gemma2 alternating (gemma2.py)", &[])));
    }
    if model_type.starts_with("gemma3") || model_type.starts_with("cohere2") {
        let w = window(f)?;
        let default = if model_type.starts_with("gemma3") {
            6
        } else {
            4
        };
        let every = f
            .opt_u64("sliding_window_pattern")?
            .unwrap_or(default)
            .max(1);
        let out = (0..layers)
            .map(|i| {
                if (i + 1) % every == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Sliding(w)
                }
            })
            .collect();
        return Ok((
            out,
            Rule::new("sliding_window_pattern", &["sliding_window_pattern"]),
        ));
    }
    // Qwen2-style: sliding only with `use_sliding_window`, from `max_window_layers` on.
    if f.get("max_window_layers").is_some() {
        if on != Some(true) {
            return Ok((
                vec![LayerKind::Full; n],
                Rule::fallback("use_sliding_window off (qwen2.py)", &["max_window_layers"]),
            ));
        }
        let w = window(f)?;
        let from = f.opt_u64("max_window_layers")?.unwrap_or(layers);
        let out = (0..layers)
            .map(|i| {
                if i >= from {
                    LayerKind::Sliding(w)
                } else {
                    LayerKind::Full
                }
            })
            .collect();
        return Ok((
            out,
            Rule::fallback("max_window_layers (qwen2.py)", &["max_window_layers"]),
        ));
    }
    // Mistral v0.1, Phi-3: one window for every layer unless switched off.
    if on != Some(false) {
        if let Some(w) = f.opt_u64("sliding_window")?.filter(|w| *w > 0) {
            return Ok((
                vec![LayerKind::Sliding(w); n],
                Rule::fallback("uniform sliding_window", &[]),
            ));
        }
    }
    Ok((
        vec![LayerKind::Full; n],
        Rule::fallback("full attention", &[]),
    ))
}
