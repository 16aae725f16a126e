//! Layers a config describes one by one: their own head counts and MLP widths.
//!
//! Two layouts are read:
//!
//! - **DeciLM / Nemotron-NAS `block_configs`** (`DeciLMForCausalLM`, model type
//!   `nemotron-nas`; vLLM `model_executor/models/nemotron_nas.py`, `DeciLMDecoderLayer.__init__`):
//!   each block's attention is either absent (`no_op`) or grouped-query with
//!   `num_attention_heads // n_heads_in_group` KV heads, and its MLP is absent (`no_op`) or
//!   `_ffn_mult_to_intermediate_size(ffn_mult, hidden_size)` wide (else its
//!   `intermediate_size`). vLLM builds nothing else: a block that replaces its attention or MLP
//!   by a linear layer, or asks for sink tokens, a window or sparsity, is refused by name,
//!   since the engine would not run the model the checkpoint describes.
//! - **Per-layer lists of the standard keys**: query heads (`num_attention_heads`,
//!   `num_query_heads`), KV heads (`num_key_value_heads`, `num_kv_heads`) and MLP widths
//!   (`intermediate_size`; OpenELM's `ffn_multipliers`), one entry per layer (OpenELM's
//!   `OpenELMConfig`, Gemma 3n's `intermediate_size`, read per layer by vLLM's `gemma3n.py`
//!   `Gemma3nDecoderLayer`).
//!
//! The model-wide figures handed on to the generic reader are the ones vLLM reports for such a
//! model: the KV heads of the first layer with attention
//! (`transformers_utils/model_arch_config_convertor.py`,
//! `NemotronNasModelArchConfigConvertor.get_total_num_kv_heads`), its query heads, and the
//! widest MLP (the activation peak is the widest layer's).

use memplan_core::{Error, Result};
use serde_json::{Map, Value};

use crate::config::LayerShape;

/// What the per-layer reader found.
pub(crate) struct PerLayer {
    /// One shape per layer.
    pub(crate) shapes: Vec<LayerShape>,
    /// Which layout, for the plan's notes.
    pub(crate) rule: &'static str,
    /// The keys it read (so the guard against unread per-layer keys lets them pass).
    pub(crate) keys: Vec<&'static str>,
    /// Model-wide values to put in place of the per-layer ones for the generic reader.
    pub(crate) scalars: Vec<(&'static str, Value)>,
    /// A note for the plan, if any.
    pub(crate) note: Option<&'static str>,
}

/// Layer-count keys, as the generic reader spells them, plus OpenELM's.
const LAYER_KEYS: &[&str] = &[
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "num_transformer_layers",
];

fn get<'a>(
    map: &'a Map<String, Value>,
    outer: Option<&'a Map<String, Value>>,
    k: &str,
) -> Option<&'a Value> {
    map.get(k)
        .filter(|v| !v.is_null())
        .or_else(|| outer.and_then(|o| o.get(k)).filter(|v| !v.is_null()))
}

fn count(v: &Value, key: &str) -> Result<u64> {
    v.as_u64()
        .filter(|n| *n > 0 && *n < 1 << 40)
        .ok_or_else(|| Error::invalid(key, format!("expected a positive integer, found {v}")))
}

/// The layer count as written (`None` when absent: the generic reader names it).
fn layer_count(
    map: &Map<String, Value>,
    outer: Option<&Map<String, Value>>,
) -> Result<Option<(u64, &'static str)>> {
    for k in LAYER_KEYS {
        if let Some(v) = get(map, outer, k) {
            let n = count(v, k)?;
            if n > 4096 {
                return Err(Error::invalid(
                    *k,
                    format!("{n} is not a plausible layer count"),
                ));
            }
            return Ok(Some((n, k)));
        }
    }
    Ok(None)
}

/// Read the per-layer shapes of a config section (`map`, with the wrapper `outer` as fallback),
/// or `None` when it describes every layer with the model-wide keys.
pub(crate) fn read(
    arch: &str,
    model_type: &str,
    map: &Map<String, Value>,
    outer: Option<&Map<String, Value>>,
) -> Result<Option<PerLayer>> {
    let blocks = get(map, outer, "block_configs");
    let nas = arch == "DeciLMForCausalLM" || model_type == "nemotron-nas";
    if nas {
        let Some(blocks) = blocks else {
            // DeciLM-7B's older layout: vLLM maps DeciLMForCausalLM to nemotron_nas.py, whose
            // DeciLMDecoderLayer reads `config.block_configs[layer_idx]` for every layer.
            let other = ["num_key_value_heads_per_layer", "num_key_value_heads"]
                .into_iter()
                .find(|k| get(map, outer, k).is_some_and(Value::is_array))
                .unwrap_or("block_configs");
            return Err(Error::invalid(
                other,
                "DeciLMForCausalLM without `block_configs`: vLLM builds DeciLM / Nemotron-NAS layers from `block_configs` only (nemotron_nas.py, DeciLMDecoderLayer), so the engine cannot load this layout and memplan does not plan it",
            ));
        };
        return nas_blocks(map, outer, blocks).map(Some);
    }
    lists(model_type, map, outer)
}

/// vLLM `nemotron_nas.py` `_ffn_mult_to_intermediate_size`: `int(2 * ffn_mult * n_embd / 3)`
/// rounded up to a multiple of 256.
fn ffn_mult_to_intermediate(mult: f64, hidden: u64) -> Option<u64> {
    let x = 2.0 * mult * hidden as f64 / 3.0;
    if !(0.0..1e12).contains(&x) {
        return None;
    }
    Some((x as u64).div_ceil(256) * 256)
}

/// A value that asks for nothing: absent, null or false.
fn inert(v: Option<&Value>) -> bool {
    matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)))
}

fn nas_blocks(
    map: &Map<String, Value>,
    outer: Option<&Map<String, Value>>,
    blocks: &Value,
) -> Result<PerLayer> {
    let (layers, _) = layer_count(map, outer)?
        .ok_or_else(|| Error::invalid("num_hidden_layers", "missing from config.json"))?;
    let heads_v = get(map, outer, "num_attention_heads")
        .ok_or_else(|| Error::invalid("num_attention_heads", "missing from config.json"))?;
    let heads = count(heads_v, "num_attention_heads")?;
    let hidden = get(map, outer, "hidden_size")
        .ok_or_else(|| Error::invalid("hidden_size", "missing from config.json"))
        .and_then(|v| count(v, "hidden_size"))?;
    let list = blocks.as_array().ok_or_else(|| {
        Error::invalid(
            "block_configs",
            format!("expected a list of blocks, found {blocks}"),
        )
    })?;
    if list.len() as u64 != layers {
        return Err(Error::invalid(
            "block_configs",
            format!("{} blocks for {layers} layers", list.len()),
        ));
    }
    let mut shapes = Vec::with_capacity(list.len());
    for (i, b) in list.iter().enumerate() {
        let part = |name: &str| -> Result<&Map<String, Value>> {
            b.get(name).and_then(Value::as_object).ok_or_else(|| {
                Error::invalid(
                    format!("block_configs[{i}]"),
                    format!("has no `{name}` object: not the DeciLM / Nemotron-NAS block layout (attention + ffn) that vLLM's nemotron_nas.py reads"),
                )
            })
        };
        let (attn, ffn) = (part("attention")?, part("ffn")?);
        let key = |sub: &str, k: &str| format!("block_configs[{i}].{sub}.{k}");
        // Variants vLLM's DeciLMDecoderLayer does not build: refuse them by name.
        for (sub, obj, read) in [
            ("attention", attn, &["no_op", "n_heads_in_group"][..]),
            (
                "ffn",
                ffn,
                &["no_op", "ffn_mult", "intermediate_size", "hidden_act"][..],
            ),
        ] {
            for (k, v) in obj {
                if read.contains(&k.as_str()) || inert(Some(v)) {
                    continue;
                }
                let why = if k == "replace_with_linear" {
                    format!("replaces the block's {sub} with one linear layer, which vLLM's nemotron_nas.py (DeciLMDecoderLayer) does not build: the engine cannot load this checkpoint")
                } else {
                    format!("is {v}: an {sub} variant vLLM's nemotron_nas.py (DeciLMDecoderLayer) does not build (it would run the block as a plain {sub}), so memplan refuses rather than plan a misread architecture")
                };
                return Err(Error::invalid(key(sub, k), why));
            }
        }
        let flag = |obj: &Map<String, Value>, sub: &str| -> Result<bool> {
            match obj.get("no_op") {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(v) => Err(Error::invalid(
                    key(sub, "no_op"),
                    format!("expected true or false, found {v}"),
                )),
            }
        };
        let kv = if flag(attn, "attention")? {
            0
        } else {
            let g = attn
                .get("n_heads_in_group")
                .filter(|v| !v.is_null())
                .ok_or_else(|| {
                    Error::invalid(
                        key("attention", "n_heads_in_group"),
                        "missing for a block with attention",
                    )
                })?;
            let g = count(g, &key("attention", "n_heads_in_group"))?;
            if heads % g != 0 {
                return Err(Error::invalid(
                    key("attention", "n_heads_in_group"),
                    format!("{g} does not divide num_attention_heads {heads}"),
                ));
            }
            heads / g
        };
        let inter = if flag(ffn, "ffn")? {
            0
        } else if let Some(m) = ffn.get("ffn_mult").filter(|v| !v.is_null()) {
            m.as_f64()
                .filter(|m| *m > 0.0)
                .and_then(|m| ffn_mult_to_intermediate(m, hidden))
                .ok_or_else(|| {
                    Error::invalid(
                        key("ffn", "ffn_mult"),
                        format!("{m} is not a positive multiplier"),
                    )
                })?
        } else {
            let v = ffn
                .get("intermediate_size")
                .filter(|v| !v.is_null())
                .ok_or_else(|| {
                    Error::invalid(
                        key("ffn", "ffn_mult"),
                        "missing (and no intermediate_size) for a block with an MLP",
                    )
                })?;
            count(v, &key("ffn", "intermediate_size"))?
        };
        shapes.push(LayerShape::new(if kv > 0 { heads } else { 0 }, kv, inter));
    }
    // vLLM raises when no block has attention (`get_total_num_kv_heads`).
    let first = shapes.iter().find(|s| s.has_attention()).copied().ok_or_else(|| {
        Error::invalid("block_configs", "no block has attention: vLLM cannot determine the KV heads (NemotronNasModelArchConfigConvertor)")
    })?;
    let widest = shapes.iter().map(|s| s.intermediate).max().unwrap_or(0);
    Ok(PerLayer {
        shapes,
        rule: "block_configs (nemotron_nas.py)",
        keys: vec!["block_configs", "num_key_value_heads", "intermediate_size"],
        scalars: vec![
            ("num_key_value_heads", Value::from(first.kv_heads)),
            ("intermediate_size", Value::from(widest.max(1))),
        ],
        note: None,
    })
}

/// A per-layer list of counts under one of `keys`, checked against the layer count.
fn counts(
    map: &Map<String, Value>,
    outer: Option<&Map<String, Value>>,
    keys: &[&'static str],
    layers: u64,
) -> Result<Option<(Vec<u64>, &'static str)>> {
    for k in keys {
        let Some(Value::Array(a)) = get(map, outer, k) else {
            continue;
        };
        if a.len() as u64 != layers {
            return Err(Error::invalid(
                *k,
                format!("{} entries for {layers} layers", a.len()),
            ));
        }
        let mut out = Vec::with_capacity(a.len());
        for v in a {
            match v.as_u64() {
                Some(n) if n < 1 << 40 => out.push(n),
                _ => return Err(Error::invalid(*k, format!("{v} is not a count"))),
            }
        }
        return Ok(Some((out, k)));
    }
    Ok(None)
}

/// OpenELM's `make_divisible` (`configuration_openelm.py`): the nearest multiple of `d`, at
/// least `d`, and never more than 10% below `v`.
fn make_divisible(v: f64, d: u64) -> u64 {
    let df = d as f64;
    let mut n = (((v + df / 2.0) as u64) / d * d).max(d);
    if (n as f64) < 0.9 * v {
        n += d;
    }
    n
}

fn lists(
    model_type: &str,
    map: &Map<String, Value>,
    outer: Option<&Map<String, Value>>,
) -> Result<Option<PerLayer>> {
    const Q: &[&str] = &["num_attention_heads", "num_query_heads"];
    const KV: &[&str] = &["num_key_value_heads", "num_kv_heads"];
    let openelm = model_type == "openelm";
    let any_list = Q
        .iter()
        .chain(KV)
        .chain(&["intermediate_size"])
        .any(|k| get(map, outer, k).is_some_and(Value::is_array))
        || (openelm && get(map, outer, "ffn_multipliers").is_some_and(Value::is_array));
    if !any_list {
        return Ok(None);
    }
    let (layers, layer_key) = layer_count(map, outer)?
        .ok_or_else(|| Error::invalid("num_hidden_layers", "missing from config.json"))?;
    let mut keys: Vec<&'static str> = Vec::new();
    let mut scalars: Vec<(&'static str, Value)> = Vec::new();
    let hidden = match (
        get(map, outer, "hidden_size"),
        openelm.then(|| get(map, outer, "model_dim")).flatten(),
    ) {
        (Some(v), _) => count(v, "hidden_size")?,
        (None, Some(v)) => {
            keys.push("model_dim");
            let h = count(v, "model_dim")?;
            scalars.push(("hidden_size", Value::from(h)));
            h
        }
        (None, None) => return Err(Error::invalid("hidden_size", "missing from config.json")),
    };
    if layer_key == "num_transformer_layers" {
        keys.push(layer_key);
        scalars.push(("num_hidden_layers", Value::from(layers)));
    }
    let scalar = |ks: &[&'static str]| -> Result<Option<u64>> {
        for k in ks {
            if let Some(v) = get(map, outer, k) {
                return count(v, k).map(Some);
            }
        }
        Ok(None)
    };
    let heads = match counts(map, outer, Q, layers)? {
        Some((h, k)) => {
            keys.push(k);
            h
        }
        None => {
            let h = scalar(Q)?
                .ok_or_else(|| Error::invalid("num_attention_heads", "missing from config.json"))?;
            vec![h; layers as usize]
        }
    };
    let kv = match counts(map, outer, KV, layers)? {
        Some((h, k)) => {
            keys.push(k);
            h
        }
        None => match scalar(KV)? {
            Some(h) => vec![h; layers as usize],
            None => heads.clone(),
        },
    };
    let inter: Vec<u64> = if let Some((v, k)) = counts(map, outer, &["intermediate_size"], layers)?
    {
        keys.push(k);
        v
    } else if let (true, Some(Value::Array(m))) = (openelm, get(map, outer, "ffn_multipliers")) {
        // OpenELM (`modeling_openelm.py`, `OpenELMFeedForwardNetwork`): each layer's width is
        // `make_divisible(ffn_multiplier * model_dim, ffn_dim_divisor)`.
        if m.len() as u64 != layers {
            return Err(Error::invalid(
                "ffn_multipliers",
                format!("{} entries for {layers} layers", m.len()),
            ));
        }
        if get(map, outer, "ffn_with_glu").is_some_and(|v| v.as_bool() != Some(true)) {
            return Err(Error::invalid(
                "ffn_with_glu",
                "OpenELM without a gated MLP is not a layout memplan sizes",
            ));
        }
        let d = scalar(&["ffn_dim_divisor"])?.unwrap_or(256);
        keys.extend(["ffn_multipliers", "ffn_dim_divisor", "ffn_with_glu"]);
        m.iter()
            .map(|x| {
                x.as_f64()
                    .filter(|x| *x > 0.0 && *x * (hidden as f64) < 1e12)
                    .map(|x| make_divisible(x * hidden as f64, d))
                    .ok_or_else(|| {
                        Error::invalid(
                            "ffn_multipliers",
                            format!("{x} is not a positive multiplier"),
                        )
                    })
            })
            .collect::<Result<_>>()?
    } else {
        let i = scalar(&["intermediate_size"])?.unwrap_or(4 * hidden);
        vec![i; layers as usize]
    };
    let mut shapes = Vec::with_capacity(layers as usize);
    for i in 0..layers as usize {
        let (q, k) = (heads[i], kv[i]);
        if q == 0 || k == 0 || q % k != 0 {
            let key = keys
                .iter()
                .find(|k| KV.contains(k))
                .copied()
                .unwrap_or("num_key_value_heads");
            return Err(Error::invalid(
                key,
                format!("layer {i}: {k} KV heads do not divide its {q} query heads"),
            ));
        }
        shapes.push(LayerShape::new(q, k, inter[i]));
    }
    // The model-wide figures, under every key that held a list: the first layer's heads, the
    // widest MLP.
    let widest = Value::from(inter.iter().copied().max().unwrap_or(1));
    for (names, value) in [
        (Q, Value::from(heads[0])),
        (KV, Value::from(kv[0])),
        (&["intermediate_size"][..], widest),
    ] {
        for k in names {
            if *k == names[0] || get(map, outer, k).is_some() {
                scalars.push((k, value.clone()));
            }
        }
    }
    if openelm {
        if let Some(t) = get(map, outer, "share_input_output_layers").and_then(Value::as_bool) {
            keys.push("share_input_output_layers");
            scalars.push(("tie_word_embeddings", Value::from(t)));
        }
    }
    // Every layer the same: the model-wide keys say it all.
    let uniform = shapes.windows(2).all(|w| w[0] == w[1]);
    Ok(Some(PerLayer {
        shapes: if uniform { Vec::new() } else { shapes },
        rule: "per-layer head / MLP lists",
        keys,
        scalars,
        note: openelm.then_some(
            "no vLLM release has a model file for OpenELM; sized as vLLM sizes layers with their own head counts (one KV spec per layer)",
        ),
    }))
}
