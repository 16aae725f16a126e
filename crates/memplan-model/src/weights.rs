//! Weight bytes from the architecture, per tensor-parallel rank.
//!
//! Counted: embeddings and LM head (vocab-parallel: divided by TP; the head only when not
//! tied), attention projections (divided by TP; KV projections replicated when there are
//! fewer KV heads than ranks; MLA's down-projections replicated), dense and expert MLPs
//! (divided by TP; layer by layer where the config gives each layer its own heads and MLP
//! width, as Nemotron-NAS `block_configs` do), routers and norms (replicated), the rotary cos/sin cache the engine
//! builds at load time (`max_position_embeddings * head_dim` elements), and a vision tower
//! (replicated). Quantized checkpoints use [`Quantization::bytes`] for the linear layers it
//! covers; everything else uses the model dtype.
//!
//! This is an estimate: engines add small buffers (a few MiB) that no config describes.
//! Safetensors headers ([`crate::safetensors`]) give the exact checkpoint bytes.

use memplan_core::{Error, Result};

use crate::config::{Family, ModelConfig};
use crate::quant::Quantization;

/// Weight parameters of one rank, split by how they are stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ParamCount {
    /// Attention projections (quantizable unless the scheme keeps attention in full precision).
    pub attention: u64,
    /// MLP and expert projections (quantizable).
    pub mlp: u64,
    /// Embeddings, LM head, norms, routers, biases, vision tower (never quantized).
    pub other: u64,
}

impl ParamCount {
    /// All parameters.
    pub fn total(&self) -> u64 {
        self.attention + self.mlp + self.other
    }
}

/// Parameters held by one of `tp` ranks. Counted in `f64` (exact below 2^53, far above any
/// real model) so that absurd configs give an error instead of an overflow.
pub fn params_per_rank(c: &ModelConfig, tp: u64) -> Result<ParamCount> {
    let kv_rank = c.kv_heads_per_rank(tp)? as f64;
    let f = |n: u64| n as f64;
    let (h, l, hd, tpf) = (f(c.hidden_size), f(c.num_layers), f(c.head_dim), f(tp));
    let heads = f(c.num_heads / tp);
    let (mut attention, mut mlp, mut other) = (0.0f64, 0.0f64, 0.0f64);
    // Vocab-parallel embedding and head.
    let emb = f(c.vocab_size.div_ceil(tp)) * h;
    other += if c.tie_word_embeddings {
        emb
    } else {
        2.0 * emb
    };
    // Attention.
    let attn_layer = if let Some(m) = c.mla {
        let (rank_q, rank_kv, rope, nope, v) = (
            f(m.q_lora_rank),
            f(m.kv_lora_rank),
            f(m.qk_rope_head_dim),
            f(m.qk_nope_head_dim),
            f(m.v_head_dim),
        );
        let q = if m.q_lora_rank > 0 {
            heads * rank_q * (nope + rope)
        } else {
            heads * h * (nope + rope)
        };
        // Replicated down-projections and their norms.
        other += l * (rank_q * h + rank_q + h * (rank_kv + rope) + rank_kv);
        q + heads * rank_kv * (nope + v) + heads * v * h
    } else if !c.layer_shapes.is_empty() {
        // Layers with their own heads (Nemotron-NAS, OpenELM): summed layer by layer below.
        0.0
    } else {
        if c.qkv_bias {
            other += l * (heads + 2.0 * kv_rank) * hd;
        }
        h * (heads + 2.0 * kv_rank) * hd + heads * hd * h
    };
    attention += l * attn_layer;
    if c.mla.is_none() {
        for s in c.layer_shapes.iter().filter(|s| s.has_attention()) {
            let kv = f(crate::kvspec::heads_per_rank(s.heads, s.kv_heads, tp)?);
            let q = f(s.heads / tp);
            let hd = f(s.head_dim_or(c.head_dim));
            if c.qkv_bias {
                other += (q + 2.0 * kv) * hd;
            }
            attention += h * (q + 2.0 * kv) * hd + q * hd * h;
        }
    }
    // MLP: gated (gate, up, down) except Phi-2's plain fc1/fc2 with biases.
    let inter = f(c.intermediate_size);
    let mats = if c.family == Family::Phi2 || !c.gated_mlp {
        2.0
    } else {
        3.0
    };
    let dense_mlp = mats * h * inter / tpf;
    if c.family == Family::Phi2 && c.layer_shapes.is_empty() {
        other += l * (inter / tpf + h);
    }
    match c.moe {
        // Layers with their own MLP widths (0: no MLP).
        None if !c.layer_shapes.is_empty() => {
            for s in &c.layer_shapes {
                mlp += mats * h * f(s.intermediate) / tpf;
                if c.family == Family::Phi2 {
                    other += f(s.intermediate) / tpf + h;
                }
            }
        }
        None => mlp += l * dense_mlp,
        Some(m) => {
            let dense = f(m.dense_layers.min(c.num_layers));
            let moe_layers = l - dense;
            mlp += dense * dense_mlp;
            mlp += moe_layers
                * (f(m.num_experts) * 3.0 * h * f(m.expert_intermediate)
                    + 3.0 * h * f(m.shared_intermediate))
                / tpf;
            other += moe_layers * h * f(m.num_experts); // router
        }
    }
    // Norms: two per layer (four in Gemma), final norm; Qwen3/Gemma3 q/k norms are tiny.
    let norms = if c.family == Family::Gemma { 4.0 } else { 2.0 };
    other += l * norms * h + h;
    if let Some((vocab, width)) = c.per_layer_input {
        let (v, w) = (f(vocab.div_ceil(tp)), f(width));
        // The table (vocab-parallel, as the token embedding), the hidden state's projection
        // to it (column-parallel) and each layer's gate and projection back (replicated:
        // gemma4.py `ReplicatedLinear`).
        other += v * l * w + h * l * w / tpf + l * 2.0 * h * w;
    }
    if let Some(v) = c.vision {
        let (vh, vi, patch) = (f(v.hidden), f(v.intermediate), f(v.patch));
        let vm = if v.gated { 3.0 } else { 2.0 };
        other += f(v.layers) * (4.0 * vh * vh + vm * vh * vi + 9.0 * vh);
        other += 3.0 * patch * patch * vh + vh * h + h * h; // patch embed, projector
    }
    let int = |x: f64| {
        if x.is_finite() && x < 2f64.powi(62) {
            Ok(x.round() as u64)
        } else {
            Err(Error::invalid(
                "config.json",
                "the dimensions give an implausible parameter count",
            ))
        }
    };
    Ok(ParamCount {
        attention: int(attention)?,
        mlp: int(mlp)?,
        other: int(other)?,
    })
}

/// Bytes of the weights of one rank, given the parameter dtype's size and the quantization.
pub fn weight_bytes(
    c: &ModelConfig,
    tp: u64,
    dtype_bytes: u64,
    quant: Option<&Quantization>,
) -> Result<u64> {
    let p = params_per_rank(c, tp)?;
    let over = || Error::invalid("model", "weight bytes overflow 64 bits");
    let full = |n: u64| n.checked_mul(dtype_bytes).ok_or_else(over);
    let linear = match quant {
        Some(q) => q.bytes(p.mlp).saturating_add(if q.attention {
            q.bytes(p.attention)
        } else {
            full(p.attention)?
        }),
        None => full(p.attention)?
            .checked_add(full(p.mlp)?)
            .ok_or_else(over)?,
    };
    let rotary = c
        .max_position_embeddings
        .unwrap_or(0)
        .checked_mul(c.head_dim)
        .and_then(|v| v.checked_mul(dtype_bytes))
        .ok_or_else(over)?;
    full(p.other)?
        .checked_add(linear)
        .and_then(|v| v.checked_add(rotary))
        .ok_or_else(over)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;
    use memplan_core::bytes::GIB;

    fn gib(b: u64) -> f64 {
        b as f64 / GIB as f64
    }

    #[test]
    fn llama_3_1_8b_is_8b() {
        let c = presets::find("llama-3.1-8b-instruct").unwrap().config;
        let p = params_per_rank(&c, 1).unwrap();
        assert!(
            (8.02e9..8.04e9).contains(&(p.total() as f64)),
            "{}",
            p.total()
        );
        // Logged: 14.99 GiB bf16, 8.49 GiB with online fp8, 7.51 GiB per rank at TP 2.
        assert!((gib(weight_bytes(&c, 1, 2, None).unwrap()) - 14.99).abs() < 0.02);
        assert!(
            (gib(weight_bytes(&c, 1, 2, Some(&Quantization::fp8_online())).unwrap()) - 8.49).abs()
                < 0.05
        );
        assert!((gib(weight_bytes(&c, 2, 2, None).unwrap()) - 7.51).abs() < 0.03);
    }

    #[test]
    fn tied_qwen_0_5b() {
        let c = presets::find("qwen2.5-0.5b-instruct").unwrap().config;
        let p = params_per_rank(&c, 1).unwrap();
        assert!(
            (0.49e9..0.50e9).contains(&(p.total() as f64)),
            "{}",
            p.total()
        );
    }

    #[test]
    fn tp_must_divide_heads() {
        let c = presets::find("qwen2.5-0.5b-instruct").unwrap().config;
        assert!(params_per_rank(&c, 4)
            .unwrap_err()
            .to_string()
            .starts_with("tensor-parallel ranks: "));
    }
}
