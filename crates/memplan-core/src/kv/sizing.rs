//! KV sizing: from a [`KvSpec`] and a byte budget to blocks, tokens, maximum concurrency and the
//! longest `max_model_len` that fits, with the arithmetic of vLLM's v1 KV-cache manager
//! (`vllm/v1/core/kv_cache_utils.py`, from 0.33 `kv_cache_planning.py`).
//!
//! Grouping (`get_kv_cache_groups`): when every layer keeps every token (full attention, MLA,
//! DeepSeek-V3.2's indexer) the layers form one group whatever their pages
//! (`UniformTypeKVCacheSpecs`), and one block costs the sum of their pages. Otherwise pages
//! are unified (`unify_kv_cache_spec_page_size`): a smaller attention page that divides the
//! largest gets a proportionally larger block, a recurrent state is padded to the largest
//! page, and (vLLM 0.24 on) another attention page is padded too. Layers of one kind then
//! form a *type*; `group_size` is the largest type's layer count when it is below 1.5x the
//! smallest, else the smallest (`_get_kv_cache_groups_uniform_page_size`); each type is cut
//! into `ceil(n / group_size)` groups (the last one padded), and one block costs
//! `page * group_size` bytes.
//!
//! Tokens: with [`Capacity::BlocksPerGroup`] the *usable* capacity,
//! `(num_blocks - 1) / num_groups * block_size` (vLLM's own line divides `num_blocks` without
//! removing the null block, so it can print one block more, inside the rounding of the GiB
//! figures next to it); with [`Capacity::Concurrency`] exactly what vLLM 0.20.1+ prints,
//! `int(num_blocks / blocks_per_request * max_model_len)`.
//!
//! [`KvSizing::max_concurrency`] counts usable blocks only; [`KvSizing::engine_concurrency`]
//! is the engine's own figure (`num_blocks / blocks_per_request`, null block included).

use serde::{Deserialize, Serialize};

use super::{AttentionKind, Capacity, KvAllocation, KvSpec, SizingRules, SwaPools};
use crate::error::Error;
use crate::refusal::Param;

/// The request-shape limits that sizing needs beyond the budget.
///
/// `#[non_exhaustive]`: build one with [`KvLimits::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KvLimits {
    /// Longest request (prompt + output) in tokens; concurrency is given at this length.
    pub max_model_len: u64,
    /// Tokens per scheduler step (chunked prefill); bounds what a sliding window keeps.
    pub max_num_batched_tokens: u64,
    /// Upper bound of the search for the longest `max_model_len` that fits (usually the
    /// model's `max_position_embeddings`).
    pub max_len_limit: u64,
}

impl KvLimits {
    /// Requests up to `max_model_len` tokens, `max_num_batched_tokens` per scheduler step; the
    /// search for the longest length that fits stops at `max_model_len` until
    /// [`KvLimits::with_max_len_limit`] raises it.
    pub const fn new(max_model_len: u64, max_num_batched_tokens: u64) -> Self {
        Self {
            max_model_len,
            max_num_batched_tokens,
            max_len_limit: max_model_len,
        }
    }

    /// The same limits with the search for the longest `max_model_len` that fits bounded by
    /// `max_len_limit` (usually the model's `max_position_embeddings`).
    pub const fn with_max_len_limit(mut self, max_len_limit: u64) -> Self {
        self.max_len_limit = max_len_limit;
        self
    }
}

/// The result of sizing a KV cache into a budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KvSizing {
    /// Bytes of one page (one block of one layer), after unification (the largest page).
    pub page_bytes: u64,
    /// Layers per KV-cache group (= number of memory pools).
    pub group_size: u64,
    /// Number of KV-cache groups (one block table each).
    pub num_groups: u64,
    /// Bytes one block takes across the pools.
    pub block_bytes: u64,
    /// Tokens per block of the full-attention groups (the spec's block size).
    pub block_size: u64,
    /// Blocks that fit in the budget, the null block included.
    pub num_blocks: u64,
    /// Blocks usable by requests: `num_blocks - 1` (one null block).
    pub usable_blocks: u64,
    /// Bytes the blocks take: `num_blocks * block_bytes` (at most the budget).
    pub used_bytes: u64,
    /// KV-cache size in tokens as the engine reports it (see [`Capacity`]).
    pub tokens: u64,
    /// Blocks one request of `max_model_len` tokens needs across all groups.
    pub blocks_per_request: u64,
    /// How many requests of `max_model_len` tokens fit at once (usable blocks).
    pub max_concurrency: f64,
    /// The engine's "Maximum concurrency" figure: `num_blocks / blocks_per_request`.
    pub engine_concurrency: f64,
    /// Longest `max_model_len` (up to the search limit) for which one request fits; `None`
    /// when not even a one-token request fits.
    pub max_model_len_fit: Option<u64>,
}

/// One KV-cache group after grouping: its attention kind and the tokens one of its blocks
/// holds (larger than the spec's block size when its page was unified by scaling).
#[derive(Debug, Clone, Copy)]
struct Group {
    attention: AttentionKind,
    block_size: u64,
}

/// Layers of one layout, and their page size.
struct LayerType {
    attention: AttentionKind,
    layers: u64,
    page: u64,
}

/// How the pool is laid out.
struct Layout {
    page: u64,
    group_size: u64,
    block_bytes: u64,
    groups: Vec<Group>,
    /// SGLang's pools from 0.5.14 ([`SwaPools::SglangFullPool`]): see `size_with`.
    sglang_full_pool: bool,
}

fn over(what: &str) -> Error {
    Error::invalid("kv spec", format!("{what} overflows 64 bits"))
}

impl KvSpec {
    /// Size the cache into `budget_bytes` with vLLM 0.19's rules ([`SizingRules::default`]).
    pub fn size(&self, budget_bytes: u64, limits: &KvLimits) -> Result<KvSizing, Error> {
        self.size_with(budget_bytes, limits, &SizingRules::default())
    }

    /// Size the cache into `budget_bytes` with an engine release's `rules`. Errors on an
    /// invalid spec, a zero `max_model_len`/`max_num_batched_tokens`, pages the engine cannot
    /// unify, or overflow; a budget too small for any block is not an error (`num_blocks` 0,
    /// `max_model_len_fit` `None`).
    pub fn size_with(
        &self,
        budget_bytes: u64,
        limits: &KvLimits,
        rules: &SizingRules,
    ) -> Result<KvSizing, Error> {
        self.validate()?;
        if limits.max_model_len == 0 {
            return Err(Error::param(Param::MaxModelLen, "must be > 0"));
        }
        if limits.max_num_batched_tokens == 0 {
            return Err(Error::param(Param::MaxNumBatchedTokens, "must be > 0"));
        }
        let layout = self.layout(rules)?;
        let mut num_blocks = budget_bytes / layout.block_bytes;
        if layout.sglang_full_pool && num_blocks % 5 == 1 {
            // SGLang's sliding pool of `n` pages (`n - 1` given, the padded page beside it)
            // holds `int(0.8 (n - 1))` pages plus its own padded page: at most `0.8 n` pages,
            // as the block's bytes count it, except where `n` is one more than a multiple of
            // five, where it holds a fifth of a page more. One block fewer holds no more (one
            // block alone gives SGLang no token, which it refuses).
            num_blocks -= 1;
        }
        let usable_blocks = num_blocks.saturating_sub(1);
        let num_groups = layout.groups.len() as u64;
        let in_flight = in_flight(limits, rules)?;
        let blocks_per_request = request_blocks(&layout.groups, limits.max_model_len, in_flight)?;
        let max_concurrency = usable_blocks as f64 / blocks_per_request as f64;
        let engine_concurrency = num_blocks as f64 / blocks_per_request as f64;
        let min_bs = layout
            .groups
            .iter()
            .map(|g| g.block_size)
            .min()
            .unwrap_or(1);
        let tokens = match rules.capacity {
            Capacity::BlocksPerGroup => (usable_blocks / num_groups)
                .checked_mul(min_bs)
                .ok_or_else(|| over("token count"))?,
            Capacity::Concurrency => {
                // vLLM: int(max_concurrency * max_model_len), in floating point.
                (engine_concurrency * limits.max_model_len as f64).floor() as u64
            }
        };
        let max_model_len_fit = longest_fit(&layout.groups, usable_blocks, limits, in_flight)?;
        Ok(KvSizing {
            page_bytes: layout.page,
            group_size: layout.group_size,
            num_groups,
            block_bytes: layout.block_bytes,
            block_size: u64::from(self.block_size),
            num_blocks,
            usable_blocks,
            used_bytes: num_blocks * layout.block_bytes,
            tokens,
            blocks_per_request,
            max_concurrency,
            engine_concurrency,
            max_model_len_fit,
        })
    }

    /// The smallest budget (bytes) that holds `blocks` usable blocks plus the null block,
    /// with vLLM 0.19's rules.
    pub fn budget_for_usable_blocks(&self, blocks: u64) -> Result<u64, Error> {
        self.budget_for_usable_blocks_with(blocks, &SizingRules::default())
    }

    /// [`KvSpec::budget_for_usable_blocks`] with an engine release's `rules`.
    pub fn budget_for_usable_blocks_with(
        &self,
        blocks: u64,
        rules: &SizingRules,
    ) -> Result<u64, Error> {
        let layout = self.layout(rules)?;
        // One block more where SGLang's pools would hold one fewer (see `size_with`).
        let extra = u64::from(layout.sglang_full_pool && (blocks + 1) % 5 == 1);
        blocks
            .checked_add(1 + extra)
            .and_then(|b| b.checked_mul(layout.block_bytes))
            .ok_or_else(|| {
                Error::invalid(
                    "kv spec",
                    "budget for the requested blocks overflows 64 bits",
                )
            })
    }

    /// The layer types, as the engine sees them before grouping.
    fn types(&self, rules: &SizingRules) -> Result<Vec<LayerType>, Error> {
        let live = || self.groups.iter().filter(|g| g.num_layers > 0);
        let has_full = live().any(|g| g.attention == AttentionKind::Full);
        let mut types: Vec<LayerType> = Vec::new();
        for g in live() {
            let page = g.page_bytes(self.dtype, self.block_size)?;
            // Without the hybrid manager, local layers are allocated as full attention.
            let attention = match g.attention {
                AttentionKind::SlidingWindow { .. } | AttentionKind::ChunkedLocal { .. }
                    if has_full && !rules.hybrid_manager =>
                {
                    AttentionKind::Full
                }
                a => a,
            };
            match types
                .iter_mut()
                .find(|t| t.attention == attention && t.page == page)
            {
                Some(t) => t.layers += u64::from(g.num_layers),
                None => types.push(LayerType {
                    attention,
                    layers: u64::from(g.num_layers),
                    page,
                }),
            }
        }
        if types.is_empty() {
            return Err(Error::invalid("kv spec", "no attention layers to size"));
        }
        Ok(types)
    }

    /// Whether the engine keeps this cache in SGLang's two pools ([`SwaPools`]): the rules say
    /// so, with SGLang's allocation (a K and a V per layer, or one tensor of both:
    /// [`KvAllocation::SplitKv`], [`KvAllocation::PairedKv`]), the hybrid manager is on, and
    /// the live layers are full attention and sliding windows, at least one of each.
    pub fn in_sglang_pools(&self, rules: &SizingRules) -> bool {
        let live = || self.groups.iter().filter(|g| g.num_layers > 0);
        rules.swa_pools != SwaPools::Groups
            && matches!(
                rules.kv_allocation,
                KvAllocation::SplitKv | KvAllocation::PairedKv
            )
            && rules.hybrid_manager
            && live().any(|g| g.attention == AttentionKind::Full)
            && live().any(|g| matches!(g.attention, AttentionKind::SlidingWindow { .. }))
            && live().all(|g| {
                matches!(
                    g.attention,
                    AttentionKind::Full | AttentionKind::SlidingWindow { .. }
                )
            })
    }

    /// SGLang's two pools ([`SwaPools`]) as memplan counts them: one group of pages of
    /// `block_size` tokens, a block being a page of every layer's rows, the padded page the
    /// null block (as for SGLang's one pool: `--max-total-tokens` is the usable blocks' tokens).
    /// A request holds its tokens in the full pool, where the tokens given are served. The
    /// sliding pool's rows: up to 0.5.13 its share of the bytes of every layer holding the
    /// tokens given (the full pool holds more rows, the bytes no more: a block is a page of
    /// every layer), from 0.5.14 `int(0.8 x tokens)` floored to pages (a block is a page of
    /// the full layers and `ceil(0.8 x)` a page of the sliding ones). `None` where the cache is
    /// not kept so ([`KvSpec::in_sglang_pools`]).
    fn sglang_pools(&self, rules: &SizingRules) -> Result<Option<Layout>, Error> {
        if !self.in_sglang_pools(rules) {
            return Ok(None);
        }
        let (mut full, mut swa, mut page, mut layers) = (0u64, 0u64, 0u64, 0u64);
        for g in self.groups.iter().filter(|g| g.num_layers > 0) {
            let p = g.page_bytes(self.dtype, self.block_size)?;
            let n = u64::from(g.num_layers);
            let bytes = p
                .checked_mul(n)
                .ok_or_else(|| over("block size in bytes"))?;
            let into = if g.attention == AttentionKind::Full {
                &mut full
            } else {
                &mut swa
            };
            *into = into
                .checked_add(bytes)
                .ok_or_else(|| over("block size in bytes"))?;
            page = page.max(p);
            layers += n;
        }
        let full_pool = rules.swa_pools == SwaPools::SglangFullPool;
        let swa = if full_pool {
            // SGLang's default `swa_full_tokens_ratio`, 0.8 (see [`SwaPools`]).
            u64::try_from((u128::from(swa) * 4).div_ceil(5)).map_err(|_| over("block size"))?
        } else {
            swa
        };
        Ok(Some(Layout {
            page,
            group_size: layers,
            block_bytes: full
                .checked_add(swa)
                .ok_or_else(|| over("block size in bytes"))?,
            groups: vec![Group {
                attention: AttentionKind::Full,
                block_size: u64::from(self.block_size),
            }],
            sglang_full_pool: full_pool,
        }))
    }

    /// Page, group size, block bytes and the groups, as the engine forms them.
    fn layout(&self, rules: &SizingRules) -> Result<Layout, Error> {
        if let Some(l) = self.sglang_pools(rules)? {
            return Ok(l);
        }
        let types = self.types(rules)?;
        let bs = u64::from(self.block_size);
        let page = types.iter().map(|t| t.page).max().unwrap_or(0);
        // One group: a single type, or every layer keeps every token (uniform type).
        if types.len() == 1 || types.iter().all(|t| t.attention.is_full_like()) {
            let mut block_bytes = 0u64;
            let mut layers = 0u64;
            for t in &types {
                block_bytes = t
                    .page
                    .checked_mul(t.layers)
                    .and_then(|b| b.checked_add(block_bytes))
                    .ok_or_else(|| over("block size in bytes"))?;
                layers += t.layers;
            }
            return Ok(Layout {
                page,
                group_size: layers,
                block_bytes,
                groups: vec![Group {
                    attention: types[0].attention,
                    block_size: bs,
                }],
                sglang_full_pool: false,
            });
        }
        // Unify pages: scale the block of a divisor page, pad states (and other pages).
        let mut unified = Vec::with_capacity(types.len());
        for t in &types {
            let block_size = if t.page == page || matches!(t.attention, AttentionKind::State { .. })
            {
                bs
            } else if page % t.page == 0 {
                bs * (page / t.page)
            } else if rules.pad_attention_pages && t.attention != AttentionKind::Mla {
                bs
            } else {
                return Err(Error::invalid(
                    "kv spec",
                    format!(
                        "a {:?} page of {} bytes does not divide the largest page of {page} bytes; the engine cannot unify them",
                        t.attention, t.page
                    ),
                ));
            };
            unified.push((t, block_size));
        }
        let min = types.iter().map(|t| t.layers).min().unwrap_or(0);
        let max = types.iter().map(|t| t.layers).max().unwrap_or(0);
        // vLLM: use the largest count when it is below 1.5x the smallest (2*max < 3*min).
        let group_size = if 2 * max < 3 * min { max } else { min };
        let mut groups = Vec::new();
        for (t, block_size) in unified {
            for _ in 0..t.layers.div_ceil(group_size) {
                groups.push(Group {
                    attention: t.attention,
                    block_size,
                });
            }
        }
        let block_bytes = page
            .checked_mul(group_size)
            .ok_or_else(|| over("block size in bytes"))?;
        Ok(Layout {
            page,
            group_size,
            block_bytes,
            groups,
            sglang_full_pool: false,
        })
    }
}

/// Tokens a window keeps in flight: `in_flight_batches * max_num_batched_tokens`.
fn in_flight(limits: &KvLimits, rules: &SizingRules) -> Result<u64, Error> {
    limits
        .max_num_batched_tokens
        .checked_mul(rules.in_flight_batches.max(1))
        .ok_or_else(|| {
            Error::param(
                Param::MaxNumBatchedTokens,
                "tokens in flight overflow 64 bits",
            )
        })
}

/// Blocks one request of `len` tokens needs, summed over the groups (vLLM
/// `get_max_concurrency_for_kv_cache_config`: each group's `max_memory_usage_bytes` in pages).
fn request_blocks(groups: &[Group], len: u64, in_flight: u64) -> Result<u64, Error> {
    let mut sum = 0u64;
    for g in groups {
        let bs = g.block_size;
        let blocks = match g.attention {
            AttentionKind::Full | AttentionKind::Mla | AttentionKind::Indexer => len.div_ceil(bs),
            AttentionKind::SlidingWindow { window } => {
                // The window keeps its last `window - 1` tokens plus the tokens in flight,
                // never more than the request; +1 because the window may start mid-block.
                let kept = window.saturating_sub(1).saturating_add(in_flight).min(len);
                kept.div_ceil(bs) + 1
            }
            AttentionKind::ChunkedLocal { chunk } => {
                chunk.saturating_add(in_flight).min(len).div_ceil(bs)
            }
            AttentionKind::State {
                pages_per_request, ..
            } => pages_per_request,
            AttentionKind::Cross { encoder_tokens } => encoder_tokens.div_ceil(bs),
        };
        sum = sum.checked_add(blocks).ok_or_else(|| {
            Error::param(Param::MaxModelLen, "blocks per request overflow 64 bits")
        })?;
    }
    Ok(sum)
}

/// Longest length `<= limits.max_len_limit` whose request fits in `usable` blocks.
fn longest_fit(
    groups: &[Group],
    usable: u64,
    limits: &KvLimits,
    in_flight: u64,
) -> Result<Option<u64>, Error> {
    let limit = limits.max_len_limit.max(1);
    if request_blocks(groups, 1, in_flight)? > usable {
        return Ok(None);
    }
    if request_blocks(groups, limit, in_flight)? <= usable {
        return Ok(Some(limit));
    }
    // Invariant: fits(lo), !fits(hi). Blocks per request never decrease with length.
    let (mut lo, mut hi) = (1u64, limit);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if request_blocks(groups, mid, in_flight)? <= usable {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(lo))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_rules;
