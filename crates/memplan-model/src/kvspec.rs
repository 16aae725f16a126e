//! The KV spec of a model on one tensor-parallel rank: full and sliding-window layers grouped
//! by window, MLA as one latent "head" per token (not split by tensor parallelism), KV heads
//! split across ranks and replicated when there are fewer heads than ranks.

use memplan_core::kv::{AttentionKind, KvDtype, KvSpec, LayerGroup};
use memplan_core::{Error, Result};

use crate::config::ModelConfig;

impl ModelConfig {
    /// KV heads held by one rank: heads are split across ranks, and replicated when there are
    /// fewer KV heads than ranks.
    pub fn kv_heads_per_rank(&self, tp: u64) -> Result<u64> {
        if tp == 0 {
            return Err(Error::invalid("tensor-parallel-size", "must be > 0"));
        }
        if !self.num_heads.is_multiple_of(tp) {
            return Err(Error::invalid(
                "tensor-parallel-size",
                format!(
                    "{tp} does not divide num_attention_heads {}",
                    self.num_heads
                ),
            ));
        }
        // Engines split KV heads across ranks when there are at least as many heads as ranks,
        // and otherwise replicate each head on `tp / kv_heads` ranks, which must be whole
        // (vLLM's QKVParallelLinear: `divide(tp_size, total_num_kv_heads)`).
        let kv = self.num_kv_heads;
        let (divides, what) = if kv >= tp {
            (kv.is_multiple_of(tp), "does not divide")
        } else {
            (tp.is_multiple_of(kv), "is not a multiple of")
        };
        if !divides {
            return Err(Error::invalid(
                "tensor-parallel-size",
                format!("{tp} {what} num_key_value_heads {kv}"),
            ));
        }
        Ok((kv / tp).max(1))
    }

    /// The KV spec of one tensor-parallel rank. MLA caches one latent per token on every rank.
    pub fn kv_spec(&self, dtype: KvDtype, block_size: u32, tp: u64) -> Result<KvSpec> {
        let kv = self.kv_heads_per_rank(tp)?;
        let as_u32 = |n: u64, k: &str| {
            u32::try_from(n).map_err(|_| Error::invalid(k, format!("{n} is too large")))
        };
        let groups = if let Some(m) = self.mla {
            vec![LayerGroup {
                attention: AttentionKind::Mla,
                num_layers: as_u32(self.num_layers, "num_hidden_layers")?,
                kv_heads: 1,
                head_dim_k: as_u32(m.kv_lora_rank + m.qk_rope_head_dim, "kv_lora_rank")?,
                head_dim_v: 0,
            }]
        } else {
            let mut groups: Vec<LayerGroup> = Vec::new();
            for w in &self.sliding {
                let attention = match w {
                    Some(w) => AttentionKind::SlidingWindow { window: *w },
                    None => AttentionKind::Full,
                };
                match groups.iter_mut().find(|g| g.attention == attention) {
                    Some(g) => g.num_layers += 1,
                    None => groups.push(LayerGroup {
                        attention,
                        num_layers: 1,
                        kv_heads: as_u32(kv, "num_key_value_heads")?,
                        head_dim_k: as_u32(self.head_dim, "head_dim")?,
                        head_dim_v: as_u32(self.head_dim, "head_dim")?,
                    }),
                }
            }
            groups
        };
        let spec = KvSpec {
            groups,
            dtype,
            block_size,
        };
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
            e.starts_with("tensor-parallel-size") && e.contains("num_key_value_heads 2"),
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
