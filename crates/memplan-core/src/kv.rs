//! The KV-cache spec the planner sizes: layer groups (full attention, sliding window, MLA), head
//! counts and dims, the cache dtype and the block size. Produced by `memplan-model` from a
//! model config (or written by hand), consumed by the planner's KV sizing.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::Error;

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
