//! The simulated engine's own KV-cache arithmetic, written here from the engine's rules and
//! shared with nothing in the planner: a planner whose page layout is wrong hands the engine a
//! block count that this arithmetic turns into more memory than the plan reserved, and the run
//! ends in an out-of-memory or over the request.
//!
//! The rules are vLLM v1's for one group of full-attention layers:
//! - page (one block of one layer): `2 * block_size * num_kv_heads * head_size *
//!   dtype_size`, plus `2 * block_size * num_kv_heads * 4` bytes of f32 scales for an int8
//!   cache scaled per token and head (`vllm/v1/kv_cache_interface.py`,
//!   `AttentionSpec.real_page_size_bytes` and `page_size_bytes`);
//! - one tensor per layer of `page_size * num_blocks` bytes (`vllm/v1/core/kv_cache_utils.py`,
//!   `get_kv_cache_config_from_groups`: `KVCacheTensor(size=page_size * num_blocks)`), each
//!   allocated on its own through the caching allocator (`vllm/v1/worker/gpu_model_runner.py`,
//!   `GPUModelRunner._allocate_kv_cache_tensors`: `torch.zeros(kv_cache_tensor.size,
//!   dtype=torch.int8)`), so each is rounded by the allocator;
//! - one block is the null block: `(num_blocks - 1) * block_size` tokens are usable;
//! - for multi-head latent attention (`vllm/v1/kv_cache_interface.py`, `MLAAttentionSpec`),
//!   one latent per token and head, no V: a page of
//!   `block_size * num_kv_heads * head_size * dtype_size` bytes, or `block_size * 656` for the
//!   `fp8_ds_mla` layout (a 512-value fp8 latent, four f32 scales, a 64-value bf16 rotary
//!   part: `MLAAttentionSpec.real_page_size_bytes`).

use crate::scenario::{KvAttention, KvToml};

/// Bytes per token of one layer of DeepSeek's `fp8_ds_mla` layout (vLLM
/// `vllm/v1/kv_cache_interface.py`, `MLAAttentionSpec.real_page_size_bytes`: `block_size * 656`).
const FP8_DS_MLA_TOKEN_BYTES: u64 = 656;

/// The engine's KV layout for a scenario's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EngineKv {
    /// Bytes of one block of one layer.
    pub page_bytes: u64,
    /// Tensors the engine allocates (one per layer).
    pub tensors: u64,
    /// Tokens per block.
    pub block_size: u64,
}

impl EngineKv {
    /// The layout of `kv`, `None` for a dtype the engine does not know or a shape that
    /// overflows.
    pub fn of(kv: &KvToml) -> Option<Self> {
        // (bytes per element, f32 scale bytes per token and head for each of K and V)
        let dtype = kv.dtype.to_ascii_lowercase();
        if kv.attention == KvAttention::Mla {
            let per_token = match dtype.as_str() {
                "fp8_ds_mla" => FP8_DS_MLA_TOKEN_BYTES,
                "fp32" | "float32" | "float" => u64::from(kv.kv_heads)
                    .checked_mul(u64::from(kv.head_dim))?
                    .checked_mul(4)?,
                "fp16" | "float16" | "half" | "bf16" | "bfloat16" => u64::from(kv.kv_heads)
                    .checked_mul(u64::from(kv.head_dim))?
                    .checked_mul(2)?,
                d if d.starts_with("fp8") || d.starts_with("float8") => {
                    u64::from(kv.kv_heads).checked_mul(u64::from(kv.head_dim))?
                }
                _ => return None,
            };
            let page_bytes = per_token.checked_mul(u64::from(kv.block_size))?;
            return (page_bytes > 0 && kv.layers > 0).then_some(EngineKv {
                page_bytes,
                tensors: u64::from(kv.layers),
                block_size: u64::from(kv.block_size),
            });
        }
        let (elem, scale) = match dtype.as_str() {
            "fp32" | "float32" | "float" => (4u64, 0u64),
            "fp16" | "float16" | "half" | "bf16" | "bfloat16" => (2, 0),
            "int8" | "int8_per_token_head" => (1, 4),
            d if d.starts_with("fp8") || d.starts_with("float8") => (1, 0),
            _ => return None,
        };
        let per_token = u64::from(kv.kv_heads)
            .checked_mul(
                u64::from(kv.head_dim)
                    .checked_mul(elem)?
                    .checked_add(scale)?,
            )?
            .checked_mul(2)?;
        let page_bytes = per_token.checked_mul(u64::from(kv.block_size))?;
        (page_bytes > 0 && kv.layers > 0).then_some(EngineKv {
            page_bytes,
            tensors: u64::from(kv.layers),
            block_size: u64::from(kv.block_size),
        })
    }

    /// Bytes of one tensor holding `blocks` blocks.
    pub fn tensor_bytes(&self, blocks: u64) -> Option<u64> {
        self.page_bytes.checked_mul(blocks)
    }

    /// Bytes of every tensor together.
    pub fn total_bytes(&self, blocks: u64) -> Option<u64> {
        self.tensor_bytes(blocks)?.checked_mul(self.tensors)
    }

    /// Tokens the cache of `blocks` blocks holds (the null block excluded).
    pub fn tokens(&self, blocks: u64) -> u64 {
        blocks.saturating_sub(1).saturating_mul(self.block_size)
    }

    /// The most blocks whose tensors take at most `room` bytes, `taken(blocks)` being what
    /// all the tensors of `blocks` blocks take (the allocator's rounding and sharing of
    /// segments, or their own bytes when mapped). What they take grows with the blocks:
    /// bisect.
    pub fn blocks_within(&self, room: u64, taken: impl Fn(u64) -> Option<u64>) -> u64 {
        let fits = |blocks: u64| taken(blocks).is_some_and(|t| t <= room);
        let (mut lo, mut hi) = (0u64, room / self.page_bytes.max(1) / self.tensors.max(1));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// What the tensors of `blocks` blocks take when each is its own allocation and
    /// `segment(bytes)` is what one allocation takes.
    pub fn each_rounded(&self, blocks: u64, segment: impl Fn(u64) -> u64) -> Option<u64> {
        self.tensor_bytes(blocks)
            .map(segment)
            .and_then(|s| s.checked_mul(self.tensors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama8b(dtype: &str) -> KvToml {
        KvToml {
            dtype: dtype.into(),
            attention: KvAttention::Full,
            block_size: 16,
            layers: 32,
            kv_heads: 8,
            head_dim: 128,
            max_model_len: 8192,
            max_num_batched_tokens: 8192,
        }
    }

    #[test]
    fn pages_follow_the_engine_rules() {
        // Llama-3.1-8B bf16: 2 * 16 * 8 * 128 * 2 = 64 KiB per layer, 2 MiB per block over 32
        // layers (shared/data/README: 58.11 GiB / 2 MiB per block -> 29,751 usable blocks).
        let k = EngineKv::of(&llama8b("bf16")).unwrap();
        assert_eq!((k.page_bytes, k.tensors), (64 << 10, 32));
        assert_eq!(k.total_bytes(29_752), Some(29_752 * (2 << 20)));
        assert_eq!(k.tokens(29_752), 476_016);
        let i8 = EngineKv::of(&llama8b("int8")).unwrap();
        assert_eq!(i8.page_bytes, (32 << 10) + 2 * 16 * 8 * 4);
        assert_eq!(EngineKv::of(&llama8b("fp4")), None);
    }

    #[test]
    fn mla_pages_are_one_sided() {
        // DeepSeek-V2-Lite: 27 layers, one latent of 512 + 64 per token.
        let mla = |dtype: &str| KvToml {
            attention: KvAttention::Mla,
            layers: 27,
            kv_heads: 1,
            head_dim: 576,
            block_size: 64,
            ..llama8b(dtype)
        };
        assert_eq!(EngineKv::of(&mla("bf16")).unwrap().page_bytes, 64 * 576 * 2);
        assert_eq!(EngineKv::of(&mla("fp8")).unwrap().page_bytes, 64 * 576);
        assert_eq!(
            EngineKv::of(&mla("fp8_ds_mla")).unwrap().page_bytes,
            64 * 656
        );
        assert_eq!(EngineKv::of(&mla("int8")), None);
    }

    #[test]
    fn the_largest_cache_within_a_room() {
        let k = EngineKv::of(&llama8b("fp8")).unwrap();
        let room = 1000 << 20;
        let exact = k.blocks_within(room, |b| k.total_bytes(b));
        assert_eq!(exact, 1000, "31.25 MiB per layer");
        // Each tensor rounded up to 2 MiB: 32 MiB per layer does not fit.
        let round = |b: u64| b.div_ceil(2 << 20) * (2 << 20);
        let rounded = k.blocks_within(room, |b| k.each_rounded(b, round));
        assert!(rounded < exact && k.tensor_bytes(rounded).map(round).unwrap() * 32 <= room);
        assert!(k.tensor_bytes(rounded + 1).map(round).unwrap() * 32 > room);
    }
}
