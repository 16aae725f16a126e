//! KV sizing: from a [`KvSpec`] and a byte budget to blocks, tokens, maximum concurrency and the
//! longest `max_model_len` that fits, with the arithmetic of vLLM's v1 KV-cache manager.
//!
//! Grouping (vLLM `_get_kv_cache_groups_uniform_page_size`): layers of one layout form one
//! *type*. With one type, all layers form one group. With several (Gemma 2/3, gpt-oss: full and
//! sliding-window layers), `group_size` is the largest type's layer count when it is below 1.5x
//! the smallest (current vLLM; versions of late 2025 used 1.25x, earlier ones always the
//! smallest), else the smallest count; each type is cut into `ceil(n / group_size)` groups
//! (the last one padded). The budget is split into `group_size` pools; one block of a pool
//! serves one layer of any group, so one block costs `page * group_size` bytes, and the engine
//! reports `num_blocks / num_groups * block_size` tokens.
//!
//! Tokens are the *usable* capacity, `(num_blocks - 1) / num_groups * block_size`: the block
//! pool hands one block out as the null block. vLLM's own "GPU KV cache size" line divides
//! `num_blocks` without removing it, so it can print one block (16 tokens) more; that is inside
//! the rounding of the GiB figures it prints next to it (see `docs/model-validation.md`).
//!
//! Page sizes that differ between types (rare: different head dims; no config memplan reads
//! produces them) are padded to the largest. vLLM instead puts layers of one attention kind in
//! one group with per-layer pages, or enlarges the block size of the smaller pages; padding
//! gives at most as many blocks and tokens as either, so the result is then an under-estimate.

use serde::{Deserialize, Serialize};

use super::{AttentionKind, KvSpec};
use crate::error::Error;

/// The request-shape limits that sizing needs beyond the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvLimits {
    /// Longest request (prompt + output) in tokens; concurrency is given at this length.
    pub max_model_len: u64,
    /// Tokens per scheduler step (chunked prefill); bounds what a sliding window keeps.
    pub max_num_batched_tokens: u64,
    /// Upper bound of the search for the longest `max_model_len` that fits (usually the
    /// model's `max_position_embeddings`).
    pub max_len_limit: u64,
}

/// The result of sizing a KV cache into a budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvSizing {
    /// Bytes of one page (one block of one layer), padded to the largest layout.
    pub page_bytes: u64,
    /// Layers per KV-cache group (= number of memory pools).
    pub group_size: u64,
    /// Number of KV-cache groups (one block table each).
    pub num_groups: u64,
    /// Bytes one block takes across the pools: `page_bytes * group_size`.
    pub block_bytes: u64,
    /// Blocks that fit in the budget, the null block included.
    pub num_blocks: u64,
    /// Blocks usable by requests: `num_blocks - 1` (one null block).
    pub usable_blocks: u64,
    /// Bytes the blocks take: `num_blocks * block_bytes` (at most the budget).
    pub used_bytes: u64,
    /// KV-cache size in tokens as the engine reports it.
    pub tokens: u64,
    /// Blocks one request of `max_model_len` tokens needs across all groups.
    pub blocks_per_request: u64,
    /// How many requests of `max_model_len` tokens fit at once.
    pub max_concurrency: f64,
    /// Longest `max_model_len` (up to the search limit) for which one request fits; `None`
    /// when not even a one-token request fits.
    pub max_model_len_fit: Option<u64>,
}

/// One KV-cache group after grouping: its attention kind (for per-request block counts).
#[derive(Debug, Clone, Copy)]
struct Group {
    attention: AttentionKind,
}

/// Layers of one layout, and their page size.
struct LayerType {
    attention: AttentionKind,
    layers: u64,
    page: u64,
}

impl KvSpec {
    /// Size the cache into `budget_bytes`. Errors on an invalid spec, a zero
    /// `max_model_len`/`max_num_batched_tokens`, or overflow; a budget too small for any block
    /// is not an error (`num_blocks` 0, `max_model_len_fit` `None`).
    pub fn size(&self, budget_bytes: u64, limits: &KvLimits) -> Result<KvSizing, Error> {
        self.validate()?;
        if limits.max_model_len == 0 {
            return Err(Error::invalid("max-model-len", "must be > 0"));
        }
        if limits.max_num_batched_tokens == 0 {
            return Err(Error::invalid("max-num-batched-tokens", "must be > 0"));
        }
        let (page, group_size, groups) = self.grouping()?;
        let over = |what: &str| Error::invalid("kv spec", format!("{what} overflows 64 bits"));
        let block_bytes = page
            .checked_mul(group_size)
            .ok_or_else(|| over("block size in bytes"))?;
        let num_blocks = budget_bytes / block_bytes;
        let usable_blocks = num_blocks.saturating_sub(1);
        let num_groups = groups.len() as u64;
        let bs = u64::from(self.block_size);
        let tokens = (usable_blocks / num_groups)
            .checked_mul(bs)
            .ok_or_else(|| over("token count"))?;
        let blocks_per_request =
            self.request_blocks(&groups, limits.max_model_len, limits.max_num_batched_tokens)?;
        let max_concurrency = usable_blocks as f64 / blocks_per_request as f64;
        let max_model_len_fit = self.longest_fit(&groups, usable_blocks, limits)?;
        Ok(KvSizing {
            page_bytes: page,
            group_size,
            num_groups,
            block_bytes,
            num_blocks,
            usable_blocks,
            used_bytes: num_blocks * block_bytes,
            tokens,
            blocks_per_request,
            max_concurrency,
            max_model_len_fit,
        })
    }

    /// The smallest budget (bytes) that holds `blocks` usable blocks plus the null block.
    pub fn budget_for_usable_blocks(&self, blocks: u64) -> Result<u64, Error> {
        let (page, group_size, _) = self.grouping()?;
        blocks
            .checked_add(1)
            .and_then(|b| b.checked_mul(page))
            .and_then(|b| b.checked_mul(group_size))
            .ok_or_else(|| {
                Error::invalid(
                    "kv spec",
                    "budget for the requested blocks overflows 64 bits",
                )
            })
    }

    /// Page size (padded), group size and the groups, as the engine forms them.
    fn grouping(&self) -> Result<(u64, u64, Vec<Group>), Error> {
        let mut types: Vec<LayerType> = Vec::new();
        for g in self.groups.iter().filter(|g| g.num_layers > 0) {
            let page = g.page_bytes(self.dtype, self.block_size)?;
            let same = types
                .iter_mut()
                .find(|t| t.attention == g.attention && t.page == page);
            match same {
                Some(t) => t.layers += u64::from(g.num_layers),
                None => types.push(LayerType {
                    attention: g.attention,
                    layers: u64::from(g.num_layers),
                    page,
                }),
            }
        }
        let page = types.iter().map(|t| t.page).max().unwrap_or(0);
        let min = types.iter().map(|t| t.layers).min().unwrap_or(0);
        let max = types.iter().map(|t| t.layers).max().unwrap_or(0);
        if page == 0 || min == 0 {
            return Err(Error::invalid("kv spec", "no attention layers to size"));
        }
        // vLLM: use the largest count when it is below 1.5x the smallest (2*max < 3*min).
        let group_size = if types.len() == 1 || 2 * max < 3 * min {
            max
        } else {
            min
        };
        let mut groups = Vec::new();
        for t in &types {
            for _ in 0..t.layers.div_ceil(group_size) {
                groups.push(Group {
                    attention: t.attention,
                });
            }
        }
        Ok((page, group_size, groups))
    }

    /// Blocks one request of `len` tokens needs, summed over the groups.
    fn request_blocks(&self, groups: &[Group], len: u64, batched: u64) -> Result<u64, Error> {
        let bs = u64::from(self.block_size);
        let mut sum = 0u64;
        for g in groups {
            let blocks = match g.attention {
                AttentionKind::Full | AttentionKind::Mla => len.div_ceil(bs),
                AttentionKind::SlidingWindow { window } => {
                    // The window keeps its last `window - 1` tokens plus the scheduled chunk,
                    // never more than the request; +1 because the window may start mid-block.
                    let kept = window.saturating_sub(1).saturating_add(batched).min(len);
                    kept.div_ceil(bs) + 1
                }
            };
            sum = sum.checked_add(blocks).ok_or_else(|| {
                Error::invalid("max-model-len", "blocks per request overflow 64 bits")
            })?;
        }
        Ok(sum)
    }

    /// Longest length `<= limits.max_len_limit` whose request fits in `usable` blocks.
    fn longest_fit(
        &self,
        groups: &[Group],
        usable: u64,
        limits: &KvLimits,
    ) -> Result<Option<u64>, Error> {
        let batched = limits.max_num_batched_tokens;
        let limit = limits.max_len_limit.max(1);
        if self.request_blocks(groups, 1, batched)? > usable {
            return Ok(None);
        }
        if self.request_blocks(groups, limit, batched)? <= usable {
            return Ok(Some(limit));
        }
        // Invariant: fits(lo), !fits(hi). Blocks per request never decrease with length.
        let (mut lo, mut hi) = (1u64, limit);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.request_blocks(groups, mid, batched)? <= usable {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Some(lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{GIB, MIB};
    use crate::kv::{KvDtype, LayerGroup};

    fn full(layers: u32, kv_heads: u32, head_dim: u32) -> LayerGroup {
        LayerGroup {
            attention: AttentionKind::Full,
            num_layers: layers,
            kv_heads,
            head_dim_k: head_dim,
            head_dim_v: head_dim,
        }
    }

    fn spec(groups: Vec<LayerGroup>, dtype: KvDtype) -> KvSpec {
        KvSpec {
            groups,
            dtype,
            block_size: 16,
        }
    }

    fn limits(len: u64) -> KvLimits {
        KvLimits {
            max_model_len: len,
            max_num_batched_tokens: 8192,
            max_len_limit: 131072,
        }
    }

    #[test]
    fn llama_3_1_8b_reproduces_the_logged_tokens() {
        // vLLM 0.19 on H100: "Available KV cache memory: 58.11 GiB" -> 476,016 tokens,
        // 58.11x at 8,192 tokens. 58.11 GiB is rounded; 58.1105 is the unrounded arithmetic.
        let s = spec(vec![full(32, 8, 128)], KvDtype::Bf16);
        let budget = (58.1105 * GIB as f64) as u64;
        let z = s
            .size(
                budget,
                &KvLimits {
                    max_len_limit: 1 << 20,
                    ..limits(8192)
                },
            )
            .unwrap();
        assert_eq!(z.page_bytes, 64 * 1024);
        assert_eq!(z.block_bytes, 2 * MIB);
        assert_eq!(z.tokens, 476_016);
        assert_eq!(z.usable_blocks, 29_751);
        assert_eq!(format!("{:.2}", z.max_concurrency), "58.11");
        // 29,751 blocks of 16 tokens: the longest request is exactly that many tokens.
        assert_eq!(z.max_model_len_fit, Some(29_751 * 16));
    }

    #[test]
    fn fp8_halves_the_page_and_int8_adds_scales() {
        let fp8 = spec(vec![full(32, 8, 128)], KvDtype::Fp8E4m3)
            .size(2 * GIB, &limits(8192))
            .unwrap();
        assert_eq!(fp8.page_bytes, 32 * 1024);
        let int8 = spec(vec![full(32, 8, 128)], KvDtype::Int8)
            .size(2 * GIB, &limits(8192))
            .unwrap();
        // 16 tokens * 8 heads * (256 one-byte values + 2 f32 scales).
        assert_eq!(int8.page_bytes, 16 * 8 * (256 + 8));
    }

    #[test]
    fn mla_has_one_latent_head_and_no_v() {
        // DeepSeek-V2: kv_lora_rank 512 + rope 64 = 576 per token, 60 layers.
        let mla = LayerGroup {
            attention: AttentionKind::Mla,
            num_layers: 60,
            kv_heads: 1,
            head_dim_k: 576,
            head_dim_v: 0,
        };
        let z = spec(vec![mla], KvDtype::Bf16)
            .size(GIB, &limits(4096))
            .unwrap();
        assert_eq!(z.page_bytes, 16 * 576 * 2);
        assert_eq!(z.num_blocks, GIB / (16 * 576 * 2 * 60));
    }

    #[test]
    fn gpt_oss_hybrid_groups() {
        // 12 sliding (window 128) + 12 full layers, 8 KV heads, head dim 64: two groups of 12.
        let sw = LayerGroup {
            attention: AttentionKind::SlidingWindow { window: 128 },
            ..full(12, 8, 64)
        };
        let s = spec(vec![sw, full(12, 8, 64)], KvDtype::Bf16);
        let z = s.size(10 * GIB, &limits(8192)).unwrap();
        assert_eq!((z.group_size, z.num_groups), (12, 2));
        assert_eq!(z.block_bytes, 16 * 8 * 128 * 2 * 12);
        assert_eq!(z.tokens, (z.num_blocks - 1) / 2 * 16);
        // Per request: 512 blocks for the full group, min(127 + 8192, 8192)/16 + 1 for the window.
        assert_eq!(z.blocks_per_request, 512 + 513);
    }

    #[test]
    fn gemma3_27b_five_to_one_pattern() {
        // 62 layers: 52 sliding + 10 full -> group size 10, 6 sliding groups + 1 full group.
        let sw = LayerGroup {
            attention: AttentionKind::SlidingWindow { window: 1024 },
            ..full(52, 16, 128)
        };
        let z = spec(vec![sw, full(10, 16, 128)], KvDtype::Bf16)
            .size(20 * GIB, &limits(8192))
            .unwrap();
        assert_eq!((z.group_size, z.num_groups), (10, 7));
    }

    #[test]
    fn close_counts_use_the_larger_group() {
        // 10 vs 12 layers: 12 < 1.25 * 10, so one group of each with size 12.
        let sw = LayerGroup {
            attention: AttentionKind::SlidingWindow { window: 512 },
            ..full(10, 8, 128)
        };
        let z = spec(vec![sw, full(12, 8, 128)], KvDtype::Bf16)
            .size(GIB, &limits(1024))
            .unwrap();
        assert_eq!((z.group_size, z.num_groups), (12, 2));
        // 12 vs 16 layers: 16 < 1.5 * 12, so still one group of each, padded to 16 (vLLM's
        // `max_num_layers < min_num_layers * 1.5`), not 12 + 12 + 4-and-padding.
        let sw = LayerGroup {
            attention: AttentionKind::SlidingWindow { window: 512 },
            ..full(12, 8, 128)
        };
        let z = spec(vec![sw, full(16, 8, 128)], KvDtype::Bf16)
            .size(GIB, &limits(1024))
            .unwrap();
        assert_eq!((z.group_size, z.num_groups), (16, 2));
        // 10 vs 15: not below 1.5x, so groups of 10.
        let sw = LayerGroup {
            attention: AttentionKind::SlidingWindow { window: 512 },
            ..full(10, 8, 128)
        };
        let z = spec(vec![sw, full(15, 8, 128)], KvDtype::Bf16)
            .size(GIB, &limits(1024))
            .unwrap();
        assert_eq!((z.group_size, z.num_groups), (10, 3));
    }

    #[test]
    fn tiny_budget_fits_nothing() {
        let z = spec(vec![full(32, 8, 128)], KvDtype::Bf16)
            .size(3 * MIB, &limits(8192))
            .unwrap();
        assert_eq!((z.num_blocks, z.usable_blocks, z.tokens), (1, 0, 0));
        assert_eq!(z.max_model_len_fit, None);
        assert_eq!(z.max_concurrency, 0.0);
    }

    #[test]
    fn longest_fit_is_capped_by_the_limit() {
        let z = spec(vec![full(2, 1, 64)], KvDtype::Bf16)
            .size(64 * GIB, &limits(1024))
            .unwrap();
        assert_eq!(z.max_model_len_fit, Some(131072));
    }

    #[test]
    fn bad_specs_name_the_field() {
        let mut s = spec(vec![full(32, 0, 128)], KvDtype::Bf16);
        assert!(s
            .size(GIB, &limits(1))
            .unwrap_err()
            .to_string()
            .contains("num_key_value_heads"));
        s.groups = vec![full(32, 8, 128)];
        s.block_size = 0;
        assert!(s
            .size(GIB, &limits(1))
            .unwrap_err()
            .to_string()
            .contains("block-size"));
        s.block_size = 16;
        assert!(s
            .size(GIB, &limits(0))
            .unwrap_err()
            .to_string()
            .contains("max-model-len"));
        s.groups = vec![full(u32::MAX, u32::MAX, u32::MAX)];
        assert!(s.size(u64::MAX, &limits(1)).is_err());
        s.groups = vec![];
        assert!(s
            .size(GIB, &limits(1))
            .unwrap_err()
            .to_string()
            .contains("no attention layers"));
    }

    #[test]
    fn budget_for_blocks_round_trips() {
        let s = spec(vec![full(28, 4, 128)], KvDtype::Bf16);
        let b = s.budget_for_usable_blocks(1000).unwrap();
        let z = s.size(b, &limits(4096)).unwrap();
        assert_eq!(z.usable_blocks, 1000);
        assert_eq!(s.size(b - 1, &limits(4096)).unwrap().usable_blocks, 999);
    }

    #[test]
    fn invariants_hold_for_random_specs() {
        // xorshift: deterministic inputs, no dependency.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..2000 {
            let mut groups = vec![full(
                1 + next(80) as u32,
                1 + next(16) as u32,
                32 * (1 + next(8) as u32),
            )];
            if next(2) == 0 {
                let sw = LayerGroup {
                    attention: AttentionKind::SlidingWindow {
                        window: 1 + next(8192),
                    },
                    ..full(
                        1 + next(80) as u32,
                        groups[0].kv_heads,
                        groups[0].head_dim_k,
                    )
                };
                groups.push(sw);
            }
            let dtype =
                [KvDtype::Bf16, KvDtype::Fp8E4m3, KvDtype::Int8, KvDtype::F32][next(4) as usize];
            let s = KvSpec {
                groups,
                dtype,
                block_size: [1, 16, 32, 64][next(4) as usize],
            };
            let budget = next(1 << 40);
            let l = KvLimits {
                max_model_len: 1 + next(1 << 18),
                max_num_batched_tokens: 1 + next(16384),
                max_len_limit: 1 << 20,
            };
            let z = s.size(budget, &l).unwrap();
            assert!(z.used_bytes <= budget && z.usable_blocks <= z.num_blocks);
            assert!(z.tokens <= z.usable_blocks * u64::from(s.block_size));
            if let Some(fit) = z.max_model_len_fit {
                let g = s.grouping().unwrap().2;
                assert!(
                    s.request_blocks(&g, fit, l.max_num_batched_tokens).unwrap() <= z.usable_blocks
                );
                if fit < l.max_len_limit {
                    assert!(
                        s.request_blocks(&g, fit + 1, l.max_num_batched_tokens)
                            .unwrap()
                            > z.usable_blocks
                    );
                }
            }
        }
    }
}
