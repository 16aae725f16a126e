//! The KV spec of a model on one tensor-parallel rank, from its per-layer kinds: full and
//! sliding-window layers grouped by window, chunked local layers, MLA as one latent "head"
//! per token (not split by tensor parallelism) with DeepSeek-V3.2's indexer beside it,
//! recurrent-state layers as one page per sequence, KV heads split across ranks and
//! replicated when there are fewer heads than ranks. Layers with their own head counts
//! (Nemotron-NAS `block_configs`, OpenELM) form one group per head count, as vLLM's per-layer
//! `KVCacheSpec`s do.

use memplan_core::kv::{AttentionKind, KvDtype, KvSpec, LayerGroup};
use memplan_core::{Error, Param, Result};

use crate::arch::state::MambaDtype;
use crate::config::{LayerKind, ModelConfig};

/// Engine facts that shape the spec (besides dtype, block size and TP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpecOptions {
    /// Pages per request of a Mamba1/GDN state layer, and of a Mamba2 one.
    pub state_pages: (u64, u64),
    /// The attention block of a hybrid (attention + state) model is a multiple of this, and
    /// large enough that one attention page holds a state (`_align_hybrid_block_size`).
    pub hybrid_block_align: u32,
    /// Bytes of the model's activation dtype (states are kept in it unless a Mamba cache
    /// dtype below or the family's rule says otherwise).
    pub dtype_bytes: u64,
    /// vLLM's `--mamba-cache-dtype` (`None`: `auto`, the model dtype): the conv and SSM
    /// states of recurrent-state layers.
    pub mamba_cache_dtype: Option<MambaDtype>,
    /// vLLM's `--mamba-ssm-cache-dtype` (`None`: `auto`, the family's rule from the config,
    /// else the Mamba cache dtype): the SSM/temporal state only.
    pub mamba_ssm_cache_dtype: Option<MambaDtype>,
    /// Nemotron-H's SSM state dtype where `--mamba-ssm-cache-dtype` is `auto` and the config
    /// names no `mamba_ssm_cache_dtype`: vLLM 0.19.0 float16
    /// (`model_executor/models/config.py`, `NemotronHForCausalLMConfig.verify_and_update_config`:
    /// `getattr(hf_config, "mamba_ssm_cache_dtype", "float16")`; transformers 4.x, which 0.19.0
    /// requires, has no Nemotron-H config class, and the checkpoints' own
    /// `configuration_nemotron_h.py` sets no such attribute), float32 from 0.20.0
    /// (`NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE`, vLLM PR 39032; read in
    /// 0.20.0, 0.23.0 and 0.34.0).
    pub nemotron_h_ssm_default: MambaDtype,
    /// Whether vLLM runs Nemotron-H's SSM-dtype rule for its VL wrapper
    /// (`NemotronH_Nano_VL_V2`): from 0.20.0 (`NemotronHNanoVLV2Config.verify_and_update_config`,
    /// the config's `text_config` through `NemotronHForCausalLMConfig`'s rule, vLLM PR 39032);
    /// not in 0.19.0, whose `NemotronHNanoVLV2Config` only sets the video backend, so the SSM
    /// state is the Mamba cache dtype there.
    pub nemotron_h_vl_ssm_rule: bool,
}

impl Default for SpecOptions {
    /// vLLM 0.19: one page per state (no prefix caching for hybrids), 16-token alignment; the
    /// newest release's float32 for a Nemotron-H SSM state its config leaves unnamed.
    fn default() -> Self {
        SpecOptions {
            state_pages: (1, 1),
            hybrid_block_align: 16,
            dtype_bytes: 2,
            mamba_cache_dtype: None,
            mamba_ssm_cache_dtype: None,
            nemotron_h_ssm_default: MambaDtype::Float32,
            nemotron_h_vl_ssm_rule: true,
        }
    }
}

/// KV heads one of `tp` ranks holds for a layer of `heads` query and `kv` KV heads: heads are
/// split across ranks, and replicated when there are fewer KV heads than ranks.
pub(crate) fn heads_per_rank(heads: u64, kv: u64, tp: u64) -> Result<u64> {
    if tp == 0 {
        return Err(Error::param(Param::TensorParallel, "must be > 0"));
    }
    if !heads.is_multiple_of(tp) {
        return Err(Error::param(
            Param::TensorParallel,
            format!("{tp} does not divide num_attention_heads {heads}"),
        ));
    }
    // Engines split KV heads across ranks when there are at least as many heads as ranks,
    // and otherwise replicate each head on `tp / kv_heads` ranks, which must be whole
    // (vLLM's QKVParallelLinear: `divide(tp_size, total_num_kv_heads)`).
    let (divides, what) = if kv >= tp {
        (kv.is_multiple_of(tp), "does not divide")
    } else {
        (kv > 0 && tp.is_multiple_of(kv), "is not a multiple of")
    };
    if !divides {
        return Err(Error::param(
            Param::TensorParallel,
            format!("{tp} {what} num_key_value_heads {kv}"),
        ));
    }
    Ok((kv / tp).max(1))
}

impl ModelConfig {
    /// KV heads held by one rank: heads are split across ranks, and replicated when there are
    /// fewer KV heads than ranks.
    pub fn kv_heads_per_rank(&self, tp: u64) -> Result<u64> {
        heads_per_rank(self.num_heads, self.num_kv_heads, tp)
    }

    /// The KV spec of one tensor-parallel rank with vLLM 0.19's facts ([`SpecOptions`]).
    pub fn kv_spec(&self, dtype: KvDtype, block_size: u32, tp: u64) -> Result<KvSpec> {
        self.kv_spec_with(dtype, block_size, tp, &SpecOptions::default())
    }

    /// The KV spec of one tensor-parallel rank. The block size may grow for hybrid models
    /// (an attention page must hold a state page).
    pub fn kv_spec_with(
        &self,
        dtype: KvDtype,
        block_size: u32,
        tp: u64,
        opts: &SpecOptions,
    ) -> Result<KvSpec> {
        let kv = self.kv_heads_per_rank(tp)?;
        // Layers with their own head counts (Nemotron-NAS, OpenELM): each its own KV heads.
        let layer_kv = |i: usize| -> Result<u64> {
            match self.layer_shapes.get(i).filter(|s| s.has_attention()) {
                Some(s) if self.mla.is_none() => heads_per_rank(s.heads, s.kv_heads, tp),
                _ => Ok(kv),
            }
        };
        let as_u32 = |n: u64, k: &str| {
            u32::try_from(n).map_err(|_| Error::invalid(k, format!("{n} is too large")))
        };
        let (dk, dv) = match self.mla {
            Some(m) => (m.kv_lora_rank + m.qk_rope_head_dim, 0),
            None => (self.head_dim, self.head_dim),
        };
        let attention_of = |k: &LayerKind| -> Option<AttentionKind> {
            match (*k, self.mla.is_some()) {
                (LayerKind::Full, true) => Some(AttentionKind::Mla),
                (LayerKind::Full, false) => Some(AttentionKind::Full),
                (LayerKind::Sliding(w), _) => Some(AttentionKind::SlidingWindow { window: w }),
                (LayerKind::Chunked(c), _) => Some(AttentionKind::ChunkedLocal { chunk: c }),
                (LayerKind::Cross(t), _) => Some(AttentionKind::Cross { encoder_tokens: t }),
                (LayerKind::State, _) | (LayerKind::None, _) => None,
            }
        };
        let mut groups: Vec<LayerGroup> = Vec::new();
        // Layers of one kind and one page shape share a group (vLLM groups layers by their
        // `KVCacheSpec`, which holds the head count: `UniformTypeKVCacheSpecs` for full
        // attention of different head counts).
        let mut push = |attention: AttentionKind, heads: u64, dk: u64, dv: u64| -> Result<()> {
            let (h, k, v) = (
                as_u32(heads, "num_key_value_heads")?,
                as_u32(dk, "head_dim")?,
                as_u32(dv, "head_dim")?,
            );
            match groups.iter_mut().find(|g| {
                g.attention == attention
                    && g.kv_heads == h
                    && g.head_dim_k == k
                    && g.head_dim_v == v
            }) {
                Some(g) => g.num_layers += 1,
                None => groups.push(LayerGroup::new(attention, 1, h, k).with_head_dim_v(v)),
            }
            Ok(())
        };
        for (i, k) in self.layers.iter().enumerate() {
            if let Some(a) = attention_of(k) {
                let heads = if self.mla.is_some() { 1 } else { layer_kv(i)? };
                // A layer with its own head size (Gemma 4's full-attention layers) keeps
                // pages of that size.
                let (dk, dv) = match self.layer_shapes.get(i) {
                    Some(s) if self.mla.is_none() && s.head_dim > 0 => (s.head_dim, s.head_dim),
                    _ => (dk, dv),
                };
                push(a, heads, dk, dv)?;
                if a == AttentionKind::Mla {
                    if let Some(ix) = self.indexer_head_dim {
                        push(AttentionKind::Indexer, 1, ix, 0)?;
                    }
                }
            }
        }
        let mut block_size = block_size;
        let states = self
            .layers
            .iter()
            .filter(|k| **k == LayerKind::State)
            .count();
        if states > 0 {
            let shape = self.state.ok_or_else(|| {
                Error::invalid("layer_types", "state layers without state dimensions")
            })?;
            let mut shape = shape;
            if shape.ssm_rule_from_0_20 && !opts.nemotron_h_vl_ssm_rule {
                shape.ssm_dtype_bytes = None;
                shape.ssm_engine_default = false;
            }
            let bytes = shape.bytes_per_rank_with(
                tp,
                opts.dtype_bytes,
                opts.mamba_cache_dtype,
                opts.mamba_ssm_cache_dtype,
                opts.nemotron_h_ssm_default,
            )?;
            let mamba2 = shape.kind == crate::arch::state::StateKind::Mamba2;
            let pages = if mamba2 {
                opts.state_pages.1
            } else {
                opts.state_pages.0
            };
            // `_align_hybrid_block_size`: attention block = align * cdiv(state, align * page1).
            if let Some(g) = groups.first() {
                let tok = g.page_bytes(dtype, 1)?;
                let align = u64::from(opts.hybrid_block_align.max(1));
                let need = align * bytes.div_ceil(align * tok);
                if u64::from(block_size) < need {
                    block_size = as_u32(need, "KV block size")?;
                }
            }
            groups.push(LayerGroup::new(
                AttentionKind::State {
                    bytes,
                    pages_per_request: pages,
                },
                as_u32(states as u64, "num_hidden_layers")?,
                0,
                0,
            ));
        }
        // DeepSeek-V3.2 serves any quantized cache as `fp8_ds_mla` (FlashMLA sparse).
        let dtype = if self.indexer_head_dim.is_some() && dtype.is_quantized() {
            KvDtype::Fp8DsMla
        } else {
            dtype
        };
        let spec = KvSpec::new(groups, dtype, block_size);
        spec.validate()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use crate::ModelConfig;

    fn cfg(heads: u64, kv: u64) -> ModelConfig {
        ModelConfig::from_json_str(&format!(
            r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":{h},"num_hidden_layers":2,
            "num_attention_heads":{heads},"num_key_value_heads":{kv},"vocab_size":100}}"#,
            h = heads * 64
        ))
        .unwrap()
    }

    #[test]
    fn kv_heads_split_or_replicate_never_to_zero() {
        let c = cfg(12, 2);
        assert_eq!(c.kv_heads_per_rank(1).unwrap(), 2);
        assert_eq!(c.kv_heads_per_rank(2).unwrap(), 1);
        // Fewer KV heads than ranks: each head is replicated on 2 ranks, one head per rank.
        assert_eq!(c.kv_heads_per_rank(4).unwrap(), 1);
        // 2 heads cannot be replicated evenly over 3 ranks: the engine refuses it.
        let e = c.kv_heads_per_rank(3).unwrap_err().to_string();
        assert!(
            e.starts_with("tensor-parallel ranks: ") && e.contains("num_key_value_heads 2"),
            "{e}"
        );
        let c = cfg(16, 8);
        assert!(c.kv_heads_per_rank(16).is_ok());
        assert!(c.kv_heads_per_rank(0).is_err());
        let c = cfg(24, 6);
        assert!(c.kv_heads_per_rank(4).is_err());
        assert_eq!(c.kv_heads_per_rank(12).unwrap(), 1);
    }
}
