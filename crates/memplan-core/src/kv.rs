//! The KV-cache spec the planner sizes: layer groups (full attention, sliding window, MLA), head
//! counts and dims, the cache dtype and the block size. Produced by `memplan-model` from a
//! model config (or written by hand), consumed by the planner's KV sizing.
//!
//! ## Sizing contract ([`KvSpec::size`], in [`sizing`])
//!
//! - One *page* is one block of `block_size` tokens of one layer:
//!   `kv_heads * block_size * (head_dim_k + head_dim_v) * bytes(dtype)` plus the per-token
//!   quantization scales the dtype carries ([`KvDtype::scale_bytes_per_token_head`]).
//! - Layers are grouped the way vLLM's v1 KV-cache manager groups them: one group per attention
//!   kind when the model is uniform; for hybrid models (full + sliding window) every kind is cut
//!   into groups of the same number of layers, and the budget is split into `group_size` pools
//!   in which one block serves one layer of every group.
//! - `num_blocks = floor(budget / (page * group_size))`; one block is the null block; the
//!   engine's token count is `(num_blocks - 1) / num_groups * block_size`.
//! - Maximum concurrency at `max_model_len` and the longest `max_model_len` that fits follow the
//!   engine's per-request block count (sliding windows only keep `window - 1 +
//!   max_num_batched_tokens` tokens, plus one block).
//!
//! Every product is checked: an overflow or a zero-sized layout is an error naming the field,
//! never a silent 0.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::Error;

pub mod sizing;

pub use sizing::{KvLimits, KvSizing};

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// fp8 e4m3.
    Fp8E4m3,
    /// fp8 e5m2.
    Fp8E5m2,
    /// int8.
    Int8,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 | KvDtype::Int8 => 1,
        }
    }

    /// Is this a quantized (1-byte) cache that carries scale factors?
    pub fn is_quantized(self) -> bool {
        self.bytes() == 1
    }

    /// Bytes of quantization scale stored in the paged cache per token, per KV head, per
    /// tensor (K or V).
    ///
    /// - fp8 (e4m3/e5m2): 0. Engines (vLLM, SGLang) scale fp8 caches per tensor: one f32 for K
    ///   and one for V per layer, held beside the weights, not in the pages.
    /// - int8: 4. Integer caches are scaled per token and head (one f32 each for K and V, as in
    ///   vLLM's `int8_per_token_head`, LMDeploy and TensorRT-LLM), carved from the same
    ///   allocation as the values.
    /// - f32/f16/bf16: 0 (not quantized).
    pub fn scale_bytes_per_token_head(self) -> u64 {
        match self {
            KvDtype::Int8 => 4,
            _ => 0,
        }
    }

    /// Name as engines spell it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "fp32",
            KvDtype::F16 => "fp16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8E4m3 => "fp8_e4m3",
            KvDtype::Fp8E5m2 => "fp8_e5m2",
            KvDtype::Int8 => "int8",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvDtype {
    type Err = Error;
    /// Parses engine spellings: `bf16`/`bfloat16`, `fp16`/`float16`/`half`, `fp32`/`float32`,
    /// `fp8` (= e4m3), `fp8_e4m3`, `fp8_e5m2`, `int8`. `auto` is resolved by the caller from the
    /// model dtype and is not accepted here.
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "float" => KvDtype::F32,
            "fp16" | "float16" | "half" => KvDtype::F16,
            "bf16" | "bfloat16" => KvDtype::Bf16,
            "fp8" | "fp8_e4m3" | "fp8e4m3" | "float8_e4m3fn" => KvDtype::Fp8E4m3,
            "fp8_e5m2" | "fp8e5m2" | "float8_e5m2" => KvDtype::Fp8E5m2,
            "int8" => KvDtype::Int8,
            other => {
                return Err(Error::invalid(
                    "kv-cache-dtype",
                    format!("unknown dtype {other:?}; expected auto, bf16, fp16, fp32, fp8, fp8_e4m3, fp8_e5m2 or int8"),
                ))
            }
        })
    }
}

/// The attention kind of a layer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttentionKind {
    /// Full attention: every token of the context is kept.
    Full,
    /// Sliding-window attention: at most `window` tokens (plus one block) are kept per request.
    SlidingWindow {
        /// Window in tokens.
        window: u64,
    },
    /// Multi-head latent attention (DeepSeek-V2/V3): one latent vector per token, no V.
    Mla,
}

/// A group of layers that share one KV layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerGroup {
    /// What kind of attention.
    pub attention: AttentionKind,
    /// Number of layers in the group (per rank).
    pub num_layers: u32,
    /// KV heads per layer (per rank); 1 for MLA.
    pub kv_heads: u32,
    /// K head dim (for MLA: kv_lora_rank + qk_rope_head_dim).
    pub head_dim_k: u32,
    /// V head dim (0 for MLA).
    pub head_dim_v: u32,
}

impl LayerGroup {
    /// Bytes of one page (one block of `block_size` tokens) of one layer of this group,
    /// including per-token quantization scales. Overflow and an all-zero layout are errors.
    pub fn page_bytes(&self, dtype: KvDtype, block_size: u32) -> Result<u64, Error> {
        let over = || {
            Error::invalid(
                "kv spec",
                format!("page size of {self:?} overflows 64 bits"),
            )
        };
        let dims = u64::from(self.head_dim_k) + u64::from(self.head_dim_v);
        // Scales exist per stored tensor: K always, V only when it has a head dim.
        let tensors = 1 + u64::from(self.head_dim_v > 0);
        let per_token_head = dims
            .checked_mul(dtype.bytes())
            .and_then(|v| v.checked_add(tensors * dtype.scale_bytes_per_token_head()))
            .ok_or_else(over)?;
        let page = per_token_head
            .checked_mul(u64::from(self.kv_heads))
            .and_then(|v| v.checked_mul(u64::from(block_size)))
            .ok_or_else(over)?;
        if page == 0 {
            return Err(Error::invalid(
                "kv spec",
                format!("layer group {:?} has a zero-sized page (kv_heads, head dims and block size must be > 0)", self.attention),
            ));
        }
        Ok(page)
    }
}

/// The KV cache to size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSpec {
    /// Layer groups.
    pub groups: Vec<LayerGroup>,
    /// Cache element type.
    pub dtype: KvDtype,
    /// Tokens per block.
    pub block_size: u32,
}

impl KvSpec {
    /// Check the spec: at least one layer, block size > 0, every group with layers, heads and
    /// a head dim, windows > 0. Errors name the field.
    pub fn validate(&self) -> Result<(), Error> {
        if self.block_size == 0 {
            return Err(Error::invalid(
                "block-size",
                "must be > 0 (engines use 16 by default)",
            ));
        }
        if self.groups.iter().all(|g| g.num_layers == 0) {
            return Err(Error::invalid("kv spec", "no attention layers to size"));
        }
        for g in &self.groups {
            if g.num_layers == 0 {
                continue;
            }
            if g.kv_heads == 0 {
                return Err(Error::invalid(
                    "num_key_value_heads",
                    format!("0 KV heads in a {:?} group", g.attention),
                ));
            }
            if g.head_dim_k == 0 {
                return Err(Error::invalid(
                    "head_dim",
                    format!("0 in a {:?} group", g.attention),
                ));
            }
            if let AttentionKind::SlidingWindow { window: 0 } = g.attention {
                return Err(Error::invalid("sliding_window", "must be > 0"));
            }
            g.page_bytes(self.dtype, self.block_size)?;
        }
        Ok(())
    }

    /// Bytes the KV cache of one token takes across every layer, ignoring block rounding and
    /// windows (full-attention equivalent). For display; sizing uses [`KvSpec::size`].
    pub fn bytes_per_token(&self) -> Result<u64, Error> {
        let mut sum = 0u64;
        for g in self.groups.iter().filter(|g| g.num_layers > 0) {
            let page = g.page_bytes(self.dtype, 1)?;
            sum = page
                .checked_mul(u64::from(g.num_layers))
                .and_then(|v| v.checked_add(sum))
                .ok_or_else(|| Error::invalid("kv spec", "bytes per token overflow 64 bits"))?;
        }
        Ok(sum)
    }
}
