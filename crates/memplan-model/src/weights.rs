//! Weight bytes from the architecture, per tensor-parallel rank.
//!
//! Counted layer by layer ([`params_by_stage`]): embeddings and LM head (vocab-parallel:
//! divided by TP; the head only when not tied), attention projections (divided by TP; KV
//! projections replicated when there are fewer KV heads than ranks; MLA's down-projections
//! replicated; a layer's own heads where the config gives them, as Nemotron-NAS
//! `block_configs` do), recurrent-state mixers in the state layers of hybrid models in place
//! of attention (Mamba, Mamba2, gated DeltaNet, short convolution), Nemotron-H's
//! single-purpose blocks, dense and expert MLPs (divided by TP), routers and norms
//! (replicated), the rotary cos/sin cache the engine builds at load time
//! (`max_position_embeddings * head_dim` elements; none for Nemotron-H), and a vision tower (replicated). Quantized checkpoints use [`Quantization::bytes`] for the linear layers it
//! covers; everything else uses the model dtype.
//!
//! This is an estimate: engines add small buffers (a few MiB) that no config describes.
//! Safetensors headers ([`crate::safetensors`]) give the exact checkpoint bytes.

use memplan_core::{Error, Result};

use crate::config::{Block, Family, LayerKind, ModelConfig};
use crate::quant::Quantization;

/// Weight parameters of one rank, split by how they are stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ParamCount {
    /// Attention projections (quantizable unless the scheme keeps attention in full precision).
    pub attention: u64,
    /// MLP and routed-expert projections (quantizable).
    pub mlp: u64,
    /// Shared-expert projections (quantizable, unless the scheme keeps them in full
    /// precision).
    pub shared_mlp: u64,
    /// Embeddings, LM head, norms, routers, biases, vision tower (never quantized).
    pub other: u64,
}

impl ParamCount {
    /// All parameters.
    pub fn total(&self) -> u64 {
        self.attention + self.mlp + self.shared_mlp + self.other
    }
}

/// One rank's parameters by where a pipeline stage holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct StageParams {
    /// The token embedding, with Gemma 3n / 4's per-layer input table and its projection.
    pub embed: ParamCount,
    /// The vision tower of a multimodal wrapper, with its projector.
    pub vision: ParamCount,
    /// Each decoder layer's own parameters, in layer order.
    pub layers: Vec<ParamCount>,
    /// What the last stage holds: the LM head (when not tied) and the final norm.
    pub head: ParamCount,
}

impl StageParams {
    /// All parameters of the rank.
    pub fn total(&self) -> ParamCount {
        let mut t = self.embed;
        for p in self.layers.iter().chain([&self.vision, &self.head]) {
            t.attention += p.attention;
            t.mlp += p.mlp;
            t.shared_mlp += p.shared_mlp;
            t.other += p.other;
        }
        t
    }
}

/// Parameters in `f64` while they are added up.
#[derive(Clone, Copy, Default)]
struct Acc {
    attention: f64,
    mlp: f64,
    shared_mlp: f64,
    other: f64,
}

impl Acc {
    fn count(self) -> Result<ParamCount> {
        let int = |x: f64| {
            if x.is_finite() && (0.0..2f64.powi(62)).contains(&x) {
                Ok(x.round() as u64)
            } else {
                Err(Error::invalid(
                    "config.json",
                    "the dimensions give an implausible parameter count",
                ))
            }
        };
        Ok(ParamCount {
            attention: int(self.attention)?,
            mlp: int(self.mlp)?,
            shared_mlp: int(self.shared_mlp)?,
            other: int(self.other)?,
        })
    }
}

/// Parameters held by one of `tp` ranks. Counted in `f64` (exact below 2^53, far above any
/// real model) so that absurd configs give an error instead of an overflow.
pub fn params_per_rank(c: &ModelConfig, tp: u64) -> Result<ParamCount> {
    Ok(params_by_stage(c, tp)?.total())
}

/// Parameters held by one of `tp` ranks, layer by layer (a pipeline stage holds its layers').
///
/// Each layer has a token mixer and a feed-forward block. The mixer is attention (MLA where
/// the config has it; the layer's own heads where [`ModelConfig::layer_shapes`] gives them),
/// or, in a [`LayerKind::State`] layer of a hybrid model, the recurrent mixer's projections
/// ([`crate::arch::state::StateShape::mixer_params_per_rank`]); Falcon-H1 layers have both
/// side by side. A model of single-purpose blocks ([`ModelConfig::blocks`], Nemotron-H) has one
/// mixer or one MLP per block and one norm.
pub fn params_by_stage(c: &ModelConfig, tp: u64) -> Result<StageParams> {
    let kv_rank = c.kv_heads_per_rank(tp)? as f64;
    let f = |n: u64| n as f64;
    let (h, l, hd, tpf) = (f(c.hidden_size), f(c.num_layers), f(c.head_dim), f(tp));
    let heads = f(c.num_heads / tp);
    let n = c.num_layers as usize;
    let mut layers = vec![Acc::default(); n];
    let (mut embed, mut vision, mut head) = (Acc::default(), Acc::default(), Acc::default());
    // Vocab-parallel embedding and head.
    let emb = f(c.vocab_size.div_ceil(tp)) * h;
    embed.other += emb;
    if !c.tie_word_embeddings {
        head.other += emb;
    }
    // Attention of the model-wide shape (`q_width` with Qwen3-Next's output gate).
    let q_width = if c.attn_output_gate { 2.0 } else { 1.0 };
    let attention = |a: &mut Acc, heads: f64, kv: f64, hd: f64| {
        if c.qkv_bias {
            a.other += (heads + 2.0 * kv) * hd;
        }
        a.attention += h * (q_width * heads + 2.0 * kv) * hd + heads * hd * h;
    };
    let mla = |a: &mut Acc| {
        let Some(m) = c.mla else { return };
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
        a.other += rank_q * h + rank_q + h * (rank_kv + rope) + rank_kv;
        a.attention += q + heads * rank_kv * (nope + v) + heads * v * h;
    };
    let state = |a: &mut Acc| {
        if let Some(s) = c.state {
            let (linear, rest) = s.mixer_params_per_rank(c.hidden_size, tp);
            a.attention += linear;
            a.other += rest;
        }
    };
    // MLP: gated (gate, up, down) except the two-matrix families (Phi-2 with biases).
    let inter = f(c.intermediate_size);
    let mats = if c.family == Family::Phi2 || !c.gated_mlp {
        2.0
    } else {
        3.0
    };
    let dense_mlp = |a: &mut Acc, inter: f64| {
        a.mlp += mats * h * inter / tpf;
        if c.family == Family::Phi2 {
            a.other += inter / tpf + h;
        }
    };
    let moe = |a: &mut Acc| {
        let Some(m) = c.moe else { return };
        let width = if m.latent_size > 0 {
            f(m.latent_size)
        } else {
            h
        };
        a.mlp += f(m.num_experts) * mats * width * f(m.expert_intermediate) / tpf;
        a.shared_mlp += mats * h * f(m.shared_intermediate) / tpf;
        // Router; Nemotron-H's latent projections (`ReplicatedLinear`) around the experts.
        a.other += h * f(m.num_experts);
        if m.latent_size > 0 {
            a.mlp += 2.0 * h * width;
        }
    };
    // Norms: two per layer (four in Gemma), one per Nemotron-H block, the final norm.
    let norms = if c.family == Family::Gemma { 4.0 } else { 2.0 };
    head.other += h;
    if !c.blocks.is_empty() {
        for (a, b) in layers.iter_mut().zip(&c.blocks) {
            a.other += h;
            match b {
                Block::Mamba => state(a),
                Block::Attention => attention(a, heads, kv_rank, hd),
                Block::Mlp => dense_mlp(a, inter),
                Block::Moe => moe(a),
            }
        }
    } else {
        // Falcon-H1 lists each layer twice: attention, then the Mamba2 mixer beside it.
        let parallel = c.layers.len() == 2 * n;
        for (i, a) in layers.iter_mut().enumerate() {
            a.other += norms * h;
            let kind = c.layers.get(i).copied().unwrap_or(LayerKind::Full);
            let shape = c.layer_shapes.get(i);
            // The mixer.
            if c.mla.is_some() {
                mla(a);
            } else if kind == LayerKind::State && c.state.is_some() {
                state(a);
            } else if let Some(s) = shape {
                if s.has_attention() {
                    let kv = f(crate::kvspec::heads_per_rank(s.heads, s.kv_heads, tp)?);
                    attention(a, f(s.heads / tp), kv, f(s.head_dim_or(c.head_dim)));
                }
            } else {
                attention(a, heads, kv_rank, hd);
            }
            if parallel && c.layers.get(n + i) == Some(&LayerKind::State) {
                state(a);
            }
            // The feed-forward block (0 wide: none).
            match (c.moe, shape) {
                (Some(_), _) if c.is_moe_layer(i) => moe(a),
                (_, Some(s)) => {
                    if s.intermediate > 0 {
                        dense_mlp(a, f(s.intermediate));
                    }
                }
                _ => dense_mlp(a, inter),
            }
        }
    }
    if let Some((vocab, width)) = c.per_layer_input {
        let (v, w) = (f(vocab.div_ceil(tp)), f(width));
        // The table (vocab-parallel, as the token embedding), the hidden state's projection
        // to it (column-parallel) and each layer's gate and projection back (replicated:
        // gemma4.py `ReplicatedLinear`).
        embed.other += v * l * w + h * l * w / tpf;
        for a in &mut layers {
            a.other += 2.0 * h * w;
        }
    }
    if let Some(v) = c.vision {
        // Counted with its projector when the config was read (`arch::vision`); replicated.
        vision.other += f(v.params);
    }
    // The whole must be plausible too (so that adding the parts up cannot overflow).
    let mut all = Acc::default();
    for a in layers.iter().chain([&embed, &vision, &head]) {
        all.attention += a.attention;
        all.mlp += a.mlp;
        all.shared_mlp += a.shared_mlp;
        all.other += a.other;
    }
    all.count()?;
    Acc {
        attention: all.attention + all.mlp + all.shared_mlp + all.other,
        ..Acc::default()
    }
    .count()?;
    Ok(StageParams {
        embed: embed.count()?,
        vision: vision.count()?,
        layers: layers.into_iter().map(Acc::count).collect::<Result<_>>()?,
        head: head.count()?,
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
    param_bytes(&p, dtype_bytes, quant)?
        .checked_add(rotary_bytes(c, dtype_bytes)?)
        .ok_or_else(overflow)
}

fn overflow() -> Error {
    Error::invalid("model", "weight bytes overflow 64 bits")
}

/// Bytes of `p` parameters: the linear layers at the quantization's size where it covers
/// them, everything else at the dtype's.
pub fn param_bytes(p: &ParamCount, dtype_bytes: u64, quant: Option<&Quantization>) -> Result<u64> {
    let full = |n: u64| n.checked_mul(dtype_bytes).ok_or_else(overflow);
    let linear = match quant {
        Some(q) => {
            let part = |n: u64, quantized: bool| if quantized { Ok(q.bytes(n)) } else { full(n) };
            q.bytes(p.mlp)
                .saturating_add(part(p.attention, q.attention)?)
                .saturating_add(part(p.shared_mlp, q.shared_experts)?)
        }
        None => full(p.attention)?
            .checked_add(full(p.mlp)?)
            .and_then(|v| v.checked_add(full(p.shared_mlp).ok()?))
            .ok_or_else(overflow)?,
    };
    full(p.other)?.checked_add(linear).ok_or_else(overflow)
}

/// The rotary cos/sin cache the engine builds at load time (`max_position_embeddings *
/// head_dim` elements), in every process that runs attention layers. None for Nemotron-H (a
/// model of [`ModelConfig::blocks`]): its attention applies no rotary embedding (vLLM
/// `nemotron_h.py`, `NemotronHAttention` builds no `get_rope` and its `forward` takes no
/// positions).
pub fn rotary_bytes(c: &ModelConfig, dtype_bytes: u64) -> Result<u64> {
    if !c.blocks.is_empty() {
        return Ok(0);
    }
    c.max_position_embeddings
        .unwrap_or(0)
        .checked_mul(c.head_dim)
        .and_then(|v| v.checked_mul(dtype_bytes))
        .ok_or_else(overflow)
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
