//! The KV-cache spec the planner sizes: layer groups (full attention, sliding window, MLA), head
//! counts and dims, the cache dtype and the block size. Produced by `memplan-model` from a
//! model config (or written by hand), consumed by the planner's KV sizing.
//!
//! ## Sizing contract ([`KvSpec::size_with`], in [`sizing`]; the rules in [`rules`])
//!
//! - One *page* is one block of `block_size` tokens of one layer:
//!   `kv_heads * block_size * (head_dim_k + head_dim_v) * bytes(dtype)` plus the per-token
//!   quantization scales the dtype carries ([`KvDtype::scale_bytes_per_token_head`]); MLA
//!   stores one latent (plus an f32 scale pair for int8); a recurrent-state layer
//!   ([`AttentionKind::State`]) has one page per sequence, whatever the block size.
//! - Layers are grouped the way vLLM's v1 KV-cache manager groups them: one group when every
//!   layer keeps every token (full attention, MLA, indexer; pages may differ); otherwise
//!   pages are unified (smaller attention pages get a larger block, states are padded) and
//!   every kind is cut into groups of the same number of layers; one block of the pool then
//!   costs `page * group_size` bytes.
//! - `num_blocks = floor(budget / block_bytes)`; one block is the null block. The engine's
//!   reported token count and concurrency follow [`SizingRules::capacity`].
//! - Blocks per request follow each kind's admission rule: sliding windows keep `window - 1`
//!   plus the tokens in flight (plus one block), chunked local attention its chunk plus the
//!   tokens in flight, states a fixed number of pages.
//!
//! Every product is checked: an overflow or a zero-sized layout is an error naming the field,
//! never a silent 0.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::Error;

pub mod rules;
pub mod sizing;

pub use rules::{Capacity, KvAllocation, LongRequests, SizingRules, StartCheck, SwaPools};
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
    /// int8, scaled per token and head (vLLM `int8_per_token_head`).
    Int8,
    /// DeepSeek's packed fp8 MLA row (vLLM `fp8_ds_mla`): the fp8 latent, one f32 scale per
    /// 128 latent values and the rotary part in bf16, 656 bytes per token for a 512 + 64
    /// latent.
    Fp8DsMla,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 | KvDtype::Int8 | KvDtype::Fp8DsMla => 1,
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
            KvDtype::Fp8DsMla => "fp8_ds_mla",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl KvDtype {
    /// The names [`KvDtype::from_str`] takes, as an error lists them (aliases left out). A
    /// caller that also takes `auto` says so in its own message ([`KvDtype::parse_setting`]).
    pub const NAMES: &'static str = "bf16, fp16, fp32, fp8, fp8_e4m3, fp8_e5m2, int8 or fp8_ds_mla";

    /// Parses an engine's `kv_cache_dtype` setting: `auto` (any case; `None`, the cache takes
    /// the model's dtype, which the caller resolves) or a name [`KvDtype::from_str`] takes.
    /// Its error lists `auto` with the names.
    pub fn parse_setting(s: &str) -> Result<Option<KvDtype>, Error> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(None);
        }
        s.trim().parse().map(Some).map_err(|_| {
            Error::param(
                crate::Param::KvCacheDtype,
                format!("unknown dtype {s:?}; expected auto, {}", KvDtype::NAMES),
            )
        })
    }
}

impl FromStr for KvDtype {
    type Err = Error;
    /// Parses engine spellings: `bf16`/`bfloat16`, `fp16`/`float16`/`half`, `fp32`/`float32`,
    /// `fp8` (= e4m3), `fp8_e4m3`, `fp8_e5m2`, `int8`, `fp8_ds_mla`. `auto` is resolved by the
    /// caller from the model dtype and is not accepted here (see [`KvDtype::parse_setting`]).
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "float" => KvDtype::F32,
            "fp16" | "float16" | "half" => KvDtype::F16,
            "bf16" | "bfloat16" => KvDtype::Bf16,
            "fp8" | "fp8_e4m3" | "fp8e4m3" | "float8_e4m3fn" => KvDtype::Fp8E4m3,
            "fp8_e5m2" | "fp8e5m2" | "float8_e5m2" => KvDtype::Fp8E5m2,
            "int8" | "int8_per_token_head" => KvDtype::Int8,
            "fp8_ds_mla" => KvDtype::Fp8DsMla,
            other => {
                return Err(Error::param(
                    crate::Param::KvCacheDtype,
                    format!("unknown dtype {other:?}; expected {}", KvDtype::NAMES),
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
    /// Chunked local attention (Llama 4): a request keeps at most its current chunk plus the
    /// tokens in flight (vLLM `ChunkedLocalAttentionSpec`).
    ChunkedLocal {
        /// Chunk in tokens.
        chunk: u64,
    },
    /// A per-sequence recurrent state (Mamba, gated DeltaNet, linear attention): one page
    /// holds a sequence's whole state whatever its length (vLLM `MambaSpec`). `bytes` is the
    /// state of one layer on one rank; the engine pads it to the attention page.
    State {
        /// Bytes of one layer's state (conv + SSM/recurrent), unpadded.
        bytes: u64,
        /// Pages one request holds: 1 without prefix caching, 2 in vLLM's `align` mode, 3
        /// when the layer also exports a prefill checkpoint (plus one per speculative token).
        pages_per_request: u64,
    },
    /// DeepSeek-V3.2's lightning-indexer keys: one fp8 vector of `head_dim_k` values and an
    /// f32 scale per 128 of them, per token, whatever the cache dtype (vLLM
    /// `DeepseekV32IndexerCache`).
    Indexer,
    /// Cross-attention to an encoder's outputs (Mllama): every request keeps the encoder's
    /// tokens (vLLM `CrossAttentionSpec`).
    Cross {
        /// Encoder tokens per request.
        encoder_tokens: u64,
    },
}

impl AttentionKind {
    /// Layers whose blocks cover every token of the request (full attention, MLA, indexer):
    /// vLLM puts them in one group even when their pages differ (`UniformTypeKVCacheSpecs`).
    pub fn is_full_like(self) -> bool {
        matches!(
            self,
            AttentionKind::Full | AttentionKind::Mla | AttentionKind::Indexer
        )
    }
}

/// A group of layers that share one KV layout.
///
/// `#[non_exhaustive]`: build one with [`LayerGroup::new`] (and
/// [`LayerGroup::with_head_dim_v`] where V's head dim differs from K's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// `num_layers` layers of `attention` with `kv_heads` KV heads per layer (per rank) and
    /// `head_dim` for both K and V. A recurrent-state group takes 0 heads and 0 head dim (its
    /// size is in [`AttentionKind::State`]).
    pub const fn new(
        attention: AttentionKind,
        num_layers: u32,
        kv_heads: u32,
        head_dim: u32,
    ) -> Self {
        Self {
            attention,
            num_layers,
            kv_heads,
            head_dim_k: head_dim,
            head_dim_v: head_dim,
        }
    }

    /// The same group with V's head dim set apart from K's (0 for MLA, whose latent is
    /// single-sided).
    pub const fn with_head_dim_v(mut self, head_dim_v: u32) -> Self {
        self.head_dim_v = head_dim_v;
        self
    }

    /// Bytes of one page (one block of `block_size` tokens) of one layer of this group,
    /// including per-token quantization scales. Overflow and an all-zero layout are errors.
    pub fn page_bytes(&self, dtype: KvDtype, block_size: u32) -> Result<u64, Error> {
        let over = || {
            Error::invalid(
                "kv spec",
                format!(
                    "a page of {block_size} tokens of {} KV heads of head dim {} overflows 64 bits",
                    self.kv_heads,
                    self.head_dim_k.max(self.head_dim_v)
                ),
            )
        };
        if let AttentionKind::State { bytes, .. } = self.attention {
            if bytes == 0 {
                return Err(Error::invalid(
                    "kv spec",
                    "a recurrent-state layer group has a zero-sized state",
                ));
            }
            return Ok(bytes);
        }
        let dk = u64::from(self.head_dim_k);
        let per_token_head = match (self.attention, dtype) {
            // fp8 values plus an f32 scale per 128 (vLLM `Indexer.k_cache` head_dim).
            (AttentionKind::Indexer, _) => dk + dk / 128 * 4,
            // 656 bytes for a 512 + 64 latent: fp8 latent, f32 scale per 128, bf16 rope.
            (AttentionKind::Mla, KvDtype::Fp8DsMla) => {
                let rope = 64.min(dk);
                (dk - rope) + (dk - rope) / 128 * 4 + rope * 2
            }
            // MLA packs one scale pair after the single-sided latent (vLLM
            // `MLACommonBackend.customize_spec`: head_size + 2 f32 scales).
            (AttentionKind::Mla, _) => dk
                .checked_mul(dtype.bytes())
                .and_then(|v| v.checked_add(2 * dtype.scale_bytes_per_token_head()))
                .ok_or_else(over)?,
            _ => {
                let dims = dk + u64::from(self.head_dim_v);
                // Scales exist per stored tensor: K always, V only when it has a head dim.
                let tensors = 1 + u64::from(self.head_dim_v > 0);
                dims.checked_mul(dtype.bytes())
                    .and_then(|v| v.checked_add(tensors * dtype.scale_bytes_per_token_head()))
                    .ok_or_else(over)?
            }
        };
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
///
/// `#[non_exhaustive]`: build one with [`KvSpec::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KvSpec {
    /// Layer groups.
    pub groups: Vec<LayerGroup>,
    /// Cache element type.
    pub dtype: KvDtype,
    /// Tokens per block.
    pub block_size: u32,
}

impl KvSpec {
    /// A spec of `groups` stored as `dtype` in blocks of `block_size` tokens. Not validated
    /// here: [`KvSpec::validate`] (which sizing calls) names what is wrong.
    pub fn new(groups: Vec<LayerGroup>, dtype: KvDtype, block_size: u32) -> Self {
        Self {
            groups,
            dtype,
            block_size,
        }
    }

    /// Check the spec: at least one layer, block size > 0, every group with layers, heads and
    /// a head dim, windows > 0. Errors name the field.
    pub fn validate(&self) -> Result<(), Error> {
        if self.block_size == 0 {
            return Err(Error::param(
                crate::Param::BlockSize,
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
            if let AttentionKind::State {
                pages_per_request, ..
            } = g.attention
            {
                if pages_per_request == 0 {
                    return Err(Error::invalid(
                        "kv spec",
                        "a recurrent-state group needs at least one page per request",
                    ));
                }
                g.page_bytes(self.dtype, self.block_size)?;
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
            if let AttentionKind::ChunkedLocal { chunk: 0 } = g.attention {
                return Err(Error::invalid("attention_chunk_size", "must be > 0"));
            }
            g.page_bytes(self.dtype, self.block_size)?;
        }
        Ok(())
    }

    /// Bytes the KV cache of one token takes across every attention layer, ignoring block
    /// rounding, windows and recurrent states (full-attention equivalent). For display;
    /// sizing uses [`KvSpec::size`].
    pub fn bytes_per_token(&self) -> Result<u64, Error> {
        let mut sum = 0u64;
        for g in self.groups.iter().filter(|g| g.num_layers > 0) {
            if matches!(g.attention, AttentionKind::State { .. }) {
                continue;
            }
            let page = g.page_bytes(self.dtype, 1)?;
            sum = page
                .checked_mul(u64::from(g.num_layers))
                .and_then(|v| v.checked_add(sum))
                .ok_or_else(|| Error::invalid("kv spec", "bytes per token overflow 64 bits"))?;
        }
        Ok(sum)
    }
}

#[cfg(test)]
mod dtype_tests {
    use super::KvDtype;

    #[test]
    fn the_parser_lists_only_what_it_takes() {
        let e = "auto".parse::<KvDtype>().unwrap_err().to_string();
        assert!(e.contains("expected bf16,"), "{e}");
        assert!(!e.contains("auto,"), "{e}");
        // Every name the message lists parses.
        for name in KvDtype::NAMES
            .split([',', ' '])
            .filter(|w| !w.is_empty() && *w != "or")
        {
            assert!(
                name.parse::<KvDtype>().is_ok(),
                "{name} is listed but does not parse"
            );
        }
    }

    #[test]
    fn a_setting_takes_auto_and_says_so() {
        assert_eq!(KvDtype::parse_setting(" AUTO ").unwrap(), None);
        assert_eq!(
            KvDtype::parse_setting("fp8").unwrap(),
            Some(KvDtype::Fp8E4m3)
        );
        let e = KvDtype::parse_setting("fp4").unwrap_err().to_string();
        assert!(e.contains("expected auto, bf16,"), "{e}");
    }
}
