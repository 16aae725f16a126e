//! The simulated engine's own KV-cache arithmetic, written here from the engine's rules and
//! shared with nothing in the planner: a planner whose page layout is wrong hands the engine a
//! block count that this arithmetic turns into more memory than the plan reserved, and the run
//! ends in an out-of-memory or over the request.
//!
//! The rules are vLLM v1's as released in **vLLM 0.19.0** (the release the test-bed's planner
//! runs are labelled with, `run.rs`: `vllm@0.19`), read from its wheel:
//! - page (one block of one layer) of full and sliding-window attention: `2 * block_size *
//!   num_kv_heads * head_size * dtype_size` (`vllm/v1/kv_cache_interface.py`,
//!   `AttentionSpec.real_page_size_bytes`; `SlidingWindowSpec` inherits it: a window changes
//!   how many pages a request holds, not their size), plus `2 * block_size * num_kv_heads * 4`
//!   bytes of f32 scales for an int8 cache scaled per token and head (the test-bed's own
//!   int8 layout, not in vLLM 0.19.0's spec);
//! - for multi-head latent attention (`MLAAttentionSpec.real_page_size_bytes`), one latent per
//!   token and head, no V: a page of `block_size * num_kv_heads * head_size * dtype_size`
//!   bytes, or `block_size * 656` for the `fp8_ds_mla` layout (a 512-value fp8 latent, four
//!   f32 scales, a 64-value bf16 rotary part; vLLM 0.19.0 `MLAAttentionSpec.real_page_size_bytes`
//!   returns `self.block_size * 656`; vLLM 0.34.0 keeps the 656-byte row in
//!   `vllm/v1/attention/backend.py`, `MLAAttentionImpl.get_fp8_ds_mla_row_bytes`);
//! - the layers are grouped by `vllm/v1/core/kv_cache_utils.py`, `get_kv_cache_groups`:
//!   1. every layer's spec the same: one group, one tensor per layer of `page * num_blocks`
//!      (`_get_kv_cache_groups_uniform_spec`, then `get_kv_cache_config_from_groups`' general
//!      case with `group_size` = the layers);
//!   2. else every layer full-like (full or MLA: `MLAAttentionSpec` subclasses
//!      `FullAttentionSpec`) or every layer sliding with one window
//!      (`UniformTypeKVCacheSpecs.is_uniform_type`): one group, one tensor per layer of its
//!      own `page * num_blocks`, `num_blocks = available // sum(pages)`
//!      (`get_kv_cache_config_from_groups`' special case);
//!   3. else (a hybrid model) the pages are unified to the largest by multiplying the block
//!      size of the smaller ones, an error where the largest is not a multiple
//!      (`unify_kv_cache_spec_page_size`); the layers of each spec are split into groups of
//!      `group_size` layers, `group_size` the fewest layers of any spec, or the most where
//!      the most is under 1.5 times the fewest, the last group of a spec padded
//!      (`_get_kv_cache_groups_uniform_page_size`); the engine allocates `group_size` tensors
//!      of `page * num_blocks`, each shared by one layer of every group, and
//!      `num_blocks = available // page // group_size` (`get_kv_cache_config_from_groups`,
//!      general case, `get_num_blocks`);
//! - each tensor is allocated on its own through the caching allocator
//!   (`vllm/v1/worker/gpu_model_runner.py`, `GPUModelRunner._allocate_kv_cache_tensors`:
//!   `torch.zeros(kv_cache_tensor.size, dtype=torch.int8)`), so each is rounded by the
//!   allocator;
//! - every group takes its blocks from one pool of `num_blocks`, one of them the null block
//!   (`vllm/v1/core/block_pool.py`, `BlockPool`); vLLM reports the cache as
//!   `num_blocks // len(kv_cache_groups) * min_block_size` tokens (`kv_cache_utils.py`,
//!   `_report_kv_cache_config`): the engine serves that of the blocks left after the null
//!   block, `(num_blocks - 1) // groups * min_block_size` (for one group the
//!   `(num_blocks - 1) * block_size` it always served).
//!
//! vLLM 0.29.0 on lays the cache out differently (`vllm/v1/core/kv_cache_utils.py`, 0.34.0
//! `kv_cache_planning.py`, `get_kv_cache_config_from_groups`: every `KVCacheTensor` of size
//! `bytes_per_block * num_blocks`, `bytes_per_block` the largest group's pages summed,
//! `_get_kv_cache_bytes_per_block`; `vllm/v1/worker/utils.py`, `allocate_kv_cache`: one
//! backing `torch.zeros` of that size that every layer views, padded to 4 KiB on ROCm only).
//! The test-bed models 0.19.0, the release its planner runs are labelled with; a setup may
//! have its engine allocate as 0.29.0 does instead ([`EngineKv::of_setup`]: one backing
//! allocation, padded to [`ROCM_BACKING_PAGE`] on a ROCm profile), the rest of its arithmetic
//! 0.19.0's, which 0.34.0 keeps for every layout modelled here (read from the 0.34.0 wheel,
//! in the layer-outer `LBNHC` layout that FlashAttention and every backend that declares no
//! layout resolve to, `vllm/v1/attention/backends/utils.py`, `_DEFAULT_LAYOUT_PREFERENCE`):
//! - blocks: `available // bytes_per_block`, the largest group's pages summed
//!   (`vllm/v1/core/kv_cache_planning.py`, `get_kv_cache_configs`,
//!   `_get_kv_cache_bytes_per_block`; each page rounded up to its block-stride alignment,
//!   `KVCacheSpec.get_block_stride_alignment`: 1, or a kernel block's page, which divides it),
//!   the `available // page // group_size` and `available // sum(pages)` above;
//! - grouping: `get_kv_cache_groups` as above, the same 1.5 rule for `group_size`
//!   (`_get_kv_cache_groups_uniform_page_size`); a smaller attention page that does not divide
//!   the largest is padded to it instead of refused (`unify_kv_cache_spec_page_size`, 0.24
//!   on: the engine here still refuses it, and no generated scenario has one), and mixed
//!   pages are packed side by side only in a block-outermost layout
//!   (`_get_packed_kv_cache_groups`), which no default backend resolves to;
//! - the null block: still taken from the pool (`vllm/v1/core/block_pool.py`,
//!   `BlockPool.__init__`, `self.null_block = self.free_block_queue.popleft()`); the start-up
//!   check now leaves it out (`check_enough_kv_cache_memory`: `available_memory -
//!   _pool_bytes_per_block`), as the oracle's room for one request does
//!   ([`crate::oracle::Oracle::has_room`]);
//! - tokens: what the blocks serve is unchanged; what 0.34.0 logs is `int(num_blocks /
//!   blocks_per_request * max_model_len)` (`kv_cache_utils.py`, `get_kv_cache_capacity`, from
//!   0.20.1, the planner's `Capacity::Concurrency`), a report nothing here is judged by;
//! - a sliding window holds the tokens of every batch in flight
//!   (`SlidingWindowSpec.max_memory_usage_bytes`, `max_in_flight_tokens`, 0.26 on), where
//!   [`EngineKv::blocks_per_request`] counts 0.19.0's one batch, as the session's sizing
//!   rules (vLLM 0.19's but for the allocation) count it.
//!
//! SGLang allocates its token pool per layer with K and V apart, read from its wheels
//! (`python/sglang/srt/mem_cache/memory_pool.py`): in 0.5.1 to 0.5.22
//! `MHATokenToKVPool._create_buffers` (`_create_buffers_normal` in 0.5.16) makes a `k_buffer`
//! of one `torch.zeros((size + page_size, head_num, head_dim))` per layer and a `v_buffer` the
//! same way, each tensor its own allocation; `MLATokenToKVPool._create_buffers` one `kv_buffer` of
//! `(size + page_size, 1, kv_lora_rank + qk_rope_head_dim)` per layer. 0.5.23 keeps K and V as
//! the halves of one `torch.zeros((2, padded, head_num, head_dim))` per layer where K's and V's
//! shapes match (every layer here: a group has one head dim for both), as a tensor per layer.
//! A model of sliding-window and full layers is not grouped as vLLM groups it (tensors shared
//! by one layer of every group): 0.5.22 keeps two such pools side by side
//! (`python/sglang/srt/mem_cache/swa_memory_pool.py`, `SWAKVPool.__init__`: a `full_kv_pool`
//! of `layer_num = len(full_attention_layer_ids)` and then a `swa_kv_pool` of the sliding
//! layers, each an `MHATokenToKVPool`), so the engine still allocates a K and a V tensor per
//! layer, twice the model's layers in all (gemma-3-4b: 68, where vLLM 0.19.0 allocates 5);
//! 0.5.23 keeps the same two pools, a tensor per layer in each (34).
//! A setup may have its engine allocate K and V apart ([`EngineKv::k_and_v_apart`]) or paired
//! ([`EngineKv::paired`]), the rest of its arithmetic (pages, grouping, tokens) still vLLM
//! 0.19.0's, but for a hybrid model's two pools ([`SwaPools`]): SGLang is given the tokens the
//! plan's blocks hold, as `--emit-args` writes them (`--max-total-tokens`), and sizes the two
//! pools itself, the sliding layers' rows `swa_full_tokens_ratio`, 0.8 by default, of the full
//! layers'. How it reads the tokens given changed ([`SwaSplit`]): up to 0.5.13 (read in 0.5.9,
//! `model_executor/model_runner_kv_cache_mixin.py`, `set_num_tokens_hybrid_swa`) they are what
//! every layer would hold and the full pool gets more, the bytes the same; from 0.5.14
//! (`model_executor/pool_configurator.py`, `HybridSWAPoolConfigurator._solve_pool_sizes`,
//! read in 0.5.14 to 0.5.23) they are the full pool's and the sliding pool holds 0.8 of them,
//! fewer bytes than every layer holding them. The setup's SGLang release, the one its start
//! rule names ([`swa_split`]), picks the rule. Each tensor is rounded by the allocator.
//! Not modelled: a sliding pool that cannot hold one window and a page, which 0.5.22 refuses
//! (`MemoryPoolConfigurator.validate_swa_pool_size`), and the models whose hybrid pools SGLang
//! turns off (`disable_hybrid_swa_memory`: Gemma 2 and 3 among them, 0.5.9
//! `ServerArgs._handle_model_specific_adjustments`, 0.5.22
//! `arg_groups/model_overrides/gemma2_gemma3.py`), which keep every layer in one pool.

use crate::scenario::{KvAttention, KvGroupToml, KvToml};

/// Bytes per token of one layer of DeepSeek's `fp8_ds_mla` layout (vLLM 0.19.0
/// `vllm/v1/kv_cache_interface.py`, `MLAAttentionSpec.real_page_size_bytes`: `block_size *
/// 656`; vLLM 0.34.0 `vllm/v1/attention/backend.py`,
/// `MLAAttentionImpl.get_fp8_ds_mla_row_bytes`: 656).
const FP8_DS_MLA_TOKEN_BYTES: u64 = 656;

/// What vLLM pads its one backing KV allocation to on ROCm: `page_size = 4096`, the buffer
/// `((raw_size + page_size - 1) // page_size) * page_size` (vLLM 0.29.0 and 0.34.0
/// `vllm/v1/worker/utils.py`, `_allocate_kv_cache_buffer` under `allocate_kv_cache`, "Pad to
/// the page granularity MoRIIO needs"; other platforms keep the exact size).
pub const ROCM_BACKING_PAGE: u64 = 4096;

/// Whether the setup's simulated device is a ROCm one (its profile's platform facts are the
/// ROCm backend's).
fn on_rocm(setup: &crate::Setup) -> bool {
    let name = setup.scenario.device.split(',').next().unwrap_or_default();
    memplan_backend_sim::profile(name)
        .is_some_and(|p| matches!(p.facts(), memplan_backend_sim::PlatformFacts::Rocm(_)))
}

/// One layer's KV spec as vLLM 0.19.0 compares them (`KVCacheSpec` dataclass equality): the
/// kind (with its window), the heads and head dim, the block size; `page` follows from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spec {
    attention: KvAttention,
    window: Option<u64>,
    kv_heads: u32,
    head_dim: u32,
    block_size: u64,
    page: u64,
}

/// Bytes per token of one layer of `g` in `dtype` (see the module's page rules), `None` for a
/// dtype the engine does not know for that attention or a shape that overflows.
pub(crate) fn token_bytes(g: &KvGroupToml, dtype: &str) -> Option<u64> {
    let elems = u64::from(g.kv_heads).checked_mul(u64::from(g.head_dim))?;
    if g.attention == KvAttention::Mla {
        return match dtype {
            "fp8_ds_mla" => Some(FP8_DS_MLA_TOKEN_BYTES),
            "fp32" | "float32" | "float" => elems.checked_mul(4),
            "fp16" | "float16" | "half" | "bf16" | "bfloat16" => elems.checked_mul(2),
            d if d.starts_with("fp8") || d.starts_with("float8") => Some(elems),
            _ => None,
        };
    }
    // (bytes per element, f32 scale bytes per token and head for each of K and V)
    let (elem, scale) = match dtype {
        "fp32" | "float32" | "float" => (4u64, 0u64),
        "fp16" | "float16" | "half" | "bf16" | "bfloat16" => (2, 0),
        "int8" | "int8_per_token_head" => (1, 4),
        "fp8_ds_mla" => return None,
        d if d.starts_with("fp8") || d.starts_with("float8") => (1, 0),
        _ => return None,
    };
    u64::from(g.kv_heads)
        .checked_mul(
            u64::from(g.head_dim)
                .checked_mul(elem)?
                .checked_add(scale)?,
        )?
        .checked_mul(2)
}

/// The engine's KV layout for a scenario's model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EngineKv {
    /// The tensors the engine allocates, in order: `(bytes of one block, how many)`.
    pub tensors: Vec<(u64, u64)>,
    /// Tokens per block of the group with the smallest blocks (vLLM's `min_block_size`).
    pub block_size: u64,
    /// KV cache groups drawing on the one pool of blocks.
    pub groups: u64,
    /// What the groups hold per request: `(window, tokens per block, groups)` per spec (the
    /// window of sliding layers, `None` for full-like ones).
    pub per_request: Vec<(Option<u64>, u64, u64)>,
    /// Each tensor's bytes are rounded up to a multiple of this (1: allocated as sized; 4 KiB
    /// for one backing allocation on ROCm, [`EngineKv::padded`]).
    pub pad: u64,
    /// Where not 0, the engine allocates the cache's bytes (`tensors`' pages of every block)
    /// as this many tensors of as near one size as bytes allow, instead of `tensors`: SGLang's
    /// K and V of every layer of a hybrid model where the setup names no SGLang release
    /// ([`EngineKv::k_and_v_apart`]).
    pub spread: u64,
    /// Where set, the engine allocates SGLang's two pools of a hybrid model instead of
    /// `tensors` ([`SwaPools`]; [`EngineKv::k_and_v_apart`], [`EngineKv::paired`]).
    pub swa: Option<SwaPools>,
}

/// How SGLang splits the tokens it is given (`--max-total-tokens`) between the pool of a
/// hybrid model's full-attention layers and the pool of its sliding-window layers, the
/// sliding pool holding `swa_full_tokens_ratio` of the full pool's tokens (0.8 by default:
/// `ServerArgs.swa_full_tokens_ratio` in `srt/server_args.py`, 0.5.9; the `fallback=0.8` of
/// `swa_full_tokens_ratio` in `srt/arg_groups/fields/schedule.py`, 0.5.22 and 0.5.23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum SwaSplit {
    /// SGLang 0.5.9 (`model_executor/model_runner_kv_cache_mixin.py`, `init_memory_pool` then
    /// `set_num_tokens_hybrid_swa`): the tokens, capped by `--max-total-tokens`, are what
    /// every layer would hold (`cell_size` counts every layer once); the full pool holds
    /// `full = int(tokens x (F n_full + S n_swa) / (F n_full + 0.8 S n_swa))` and the sliding
    /// pool `int(full x 0.8)`, each floored to whole pages; the engine then serves `full`.
    MeanTokens,
    /// SGLang 0.5.14 on (read in 0.5.14, 0.5.16, 0.5.19, 0.5.21, 0.5.22 and 0.5.23:
    /// `model_executor/pool_configurator.py`, `HybridSWAPoolConfigurator._solve_pool_sizes`,
    /// reached from `--max-total-tokens` through `calculate_pool_sizes_from_max_tokens`;
    /// `cell_size` is `F n_full + 0.8 S n_swa`): the tokens are the full pool's, floored to
    /// whole pages, the sliding pool `int(full x 0.8)` floored to whole pages.
    FullTokens,
}

/// SGLang's `swa_full_tokens_ratio` default, 0.8, as `(numerator, denominator)`. SGLang
/// multiplies by the float 0.8, whose double is a little above 4/5, so `int(x * 0.8)` of an
/// integer `x` is `floor(4 x / 5)` (a product that is exactly an integer rounds to it, and any
/// other is at least 1/5 from one).
const SWA_FULL_TOKENS_RATIO: (u64, u64) = (4, 5);

/// SGLang's pools of a hybrid model (`python/sglang/srt/mem_cache/swa_memory_pool.py`,
/// `SWAKVPool.__init__`, read in 0.5.9, 0.5.22 and 0.5.23): a pool of `size` rows for the
/// full-attention layers, then one of `size_swa` rows for the sliding-window layers, each an
/// `MHATokenToKVPool` whose every layer has `size + page_size` rows (`_create_buffers`:
/// `torch.zeros((size + page_size, head_num, head_dim))`), as a K and a V tensor per layer
/// (all the pool's K, then all its V, up to 0.5.22) or one tensor of both (0.5.23).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SwaPools {
    /// How the tokens given are split.
    pub split: SwaSplit,
    /// SGLang's page, the scenario's block size (`--page-size`).
    pub page: u64,
    /// Bytes one token takes in each full-attention layer, in layer order.
    pub full: Vec<u64>,
    /// Bytes one token takes in each sliding-window layer, in layer order.
    pub swa: Vec<u64>,
    /// Tensors per layer: 2 (K and V apart), 1 (paired).
    pub per_layer: u64,
}

/// The split of the SGLang release the setup's engine starts as
/// ([`crate::scenario::StartRule`]): 0.5.1 to 0.5.13 (the rule read in 0.5.9)
/// [`SwaSplit::MeanTokens`], 0.5.14 on [`SwaSplit::FullTokens`]; `None` for an engine that
/// names no SGLang release (a hybrid cache allocated as SGLang's tensors keeps vLLM's bytes,
/// spread over them: [`EngineKv::spread`]).
pub fn swa_split(rule: crate::scenario::StartRule) -> Option<SwaSplit> {
    use crate::scenario::StartRule;
    match rule {
        StartRule::Sglang051 => Some(SwaSplit::MeanTokens),
        StartRule::Sglang0514 => Some(SwaSplit::FullTokens),
        StartRule::Vllm => None,
    }
}

impl SwaPools {
    /// The pools of `kv` (full-attention and sliding-window layers only, `None` otherwise or
    /// for a dtype the engine does not know) split by `split`, `per_layer` tensors a layer.
    pub fn of(kv: &KvToml, split: SwaSplit, per_layer: u64) -> Option<Self> {
        let dtype = kv.dtype.to_ascii_lowercase();
        let (mut full, mut swa) = (Vec::new(), Vec::new());
        for g in kv.layer_groups().ok()? {
            if g.layers == 0 {
                continue;
            }
            let t = token_bytes(&g, &dtype)?;
            if !t.is_multiple_of(per_layer.max(1)) {
                return None;
            }
            let into = match g.attention {
                KvAttention::Full => &mut full,
                KvAttention::Sliding => &mut swa,
                KvAttention::Mla => return None,
            };
            into.extend(std::iter::repeat_n(t, g.layers as usize));
        }
        Some(SwaPools {
            split,
            page: u64::from(kv.block_size.max(1)),
            full,
            swa,
            per_layer,
        })
    }

    /// `(full, sliding)` rows of the two pools (before each pool's padded page) for `tokens`
    /// given as `--max-total-tokens` (see [`SwaSplit`]).
    pub fn rows(&self, tokens: u64) -> Option<(u64, u64)> {
        let page = self.page.max(1);
        let floor_page = |x: u64| x / page * page;
        let (num, den) = SWA_FULL_TOKENS_RATIO;
        let f: u64 = self.full.iter().try_fold(0u64, |a, b| a.checked_add(*b))?;
        let s: u64 = self.swa.iter().try_fold(0u64, |a, b| a.checked_add(*b))?;
        if f == 0 {
            // Every layer sliding: one pool of the tokens (`_solve_pool_sizes`'s all-SWA
            // branch; `set_num_tokens_hybrid_swa`'s, 0.5.9).
            return Some((0, floor_page(tokens)));
        }
        let full = match self.split {
            SwaSplit::FullTokens => tokens,
            SwaSplit::MeanTokens => {
                // int(tokens * (F + S) / (F + 0.8 S)), in exact fractions.
                let top = u128::from(tokens) * u128::from(f.checked_add(s)?) * u128::from(den);
                let bottom = u128::from(f) * u128::from(den) + u128::from(s) * u128::from(num);
                u64::try_from(top / bottom).ok()?
            }
        };
        let full = floor_page(full);
        let swa =
            floor_page(u64::try_from(u128::from(full) * u128::from(num) / u128::from(den)).ok()?);
        Some((full, swa))
    }

    /// The tensors of the pools for `tokens` given, in the order SGLang allocates them:
    /// `(how many, bytes of each)`.
    fn tensors(&self, tokens: u64) -> Option<Vec<(u64, u64)>> {
        let (full, swa) = self.rows(tokens)?;
        let mut runs = Vec::new();
        for (rows, layers) in [(full, &self.full), (swa, &self.swa)] {
            if layers.is_empty() {
                continue;
            }
            let rows = rows.checked_add(self.page)?;
            let each: Vec<u64> = layers
                .iter()
                .map(|t| rows.checked_mul(*t / self.per_layer.max(1)))
                .collect::<Option<_>>()?;
            // K of every layer, then V of every layer (K and V apart); one per layer paired.
            for _ in 0..self.per_layer.max(1) {
                runs.extend(each.iter().map(|b| (1, *b)));
            }
        }
        Some(runs)
    }

    /// Tokens the engine serves: the full pool's (`max_total_num_tokens = full`), or the
    /// sliding pool's where every layer slides.
    fn served(&self, tokens: u64) -> u64 {
        self.rows(tokens).map_or(
            0,
            |(full, swa)| if self.full.is_empty() { swa } else { full },
        )
    }
}

impl EngineKv {
    /// The layout of `kv` (vLLM 0.19.0's grouping, see the module), `None` for a dtype the
    /// engine does not know, a shape that overflows, no layers, or pages vLLM cannot unify.
    pub fn of(kv: &KvToml) -> Option<Self> {
        let dtype = kv.dtype.to_ascii_lowercase();
        let block_size = u64::from(kv.block_size);
        // Each layer's spec, identical specs merged (vLLM groups layers by spec equality).
        let mut specs: Vec<(Spec, u64)> = Vec::new();
        for g in kv.layer_groups().ok()? {
            if g.layers == 0 {
                continue;
            }
            let page = token_bytes(&g, &dtype)?.checked_mul(block_size)?;
            if page == 0 {
                return None;
            }
            let spec = Spec {
                attention: g.attention,
                window: match g.attention {
                    KvAttention::Sliding => Some(g.window?),
                    _ => None,
                },
                kv_heads: g.kv_heads,
                head_dim: g.head_dim,
                block_size,
                page,
            };
            match specs.iter_mut().find(|(s, _)| *s == spec) {
                Some((_, n)) => *n = n.checked_add(u64::from(g.layers))?,
                None => specs.push((spec, u64::from(g.layers))),
            }
        }
        let first = specs.first()?.0;
        if specs.len() == 1 {
            // `_get_kv_cache_groups_uniform_spec`: one group, a tensor per layer.
            return Some(EngineKv {
                tensors: vec![(first.page, specs[0].1)],
                block_size,
                groups: 1,
                per_request: vec![(first.window, block_size, 1)],
                pad: 1,
                spread: 0,
                swa: None,
            });
        }
        let full_like = |s: &Spec| matches!(s.attention, KvAttention::Full | KvAttention::Mla);
        let uniform_type = specs.iter().all(|(s, _)| full_like(s))
            || specs
                .iter()
                .all(|(s, _)| s.attention == KvAttention::Sliding && s.window == first.window);
        if uniform_type {
            // `UniformTypeKVCacheSpecs`: one group, a tensor per layer of its own page.
            // Every layer holds as many pages per request (one kind, one block size).
            return Some(EngineKv {
                tensors: specs.iter().map(|(s, n)| (s.page, *n)).collect(),
                block_size,
                groups: 1,
                per_request: vec![(first.window, block_size, 1)],
                pad: 1,
                spread: 0,
                swa: None,
            });
        }
        // `unify_kv_cache_spec_page_size`: the smaller pages take bigger blocks.
        let page = specs.iter().map(|(s, _)| s.page).max()?;
        let mut unified = Vec::with_capacity(specs.len());
        for (s, n) in &specs {
            if page % s.page != 0 {
                return None;
            }
            unified.push((s.window, s.block_size.checked_mul(page / s.page)?, *n));
        }
        let min_block = unified.iter().map(|(_, b, _)| *b).min()?;
        // `_get_kv_cache_groups_uniform_page_size`: `group_size` layers per group.
        let fewest = specs.iter().map(|(_, n)| *n).min()?;
        let most = specs.iter().map(|(_, n)| *n).max()?;
        // `max_num_layers < min_num_layers * 1.5`, in integers.
        let group_size = if most.checked_mul(2)? < fewest.checked_mul(3)? {
            most
        } else {
            fewest
        };
        let per_request: Vec<_> = unified
            .iter()
            .map(|(w, b, n)| (*w, *b, n.div_ceil(group_size)))
            .collect();
        Some(EngineKv {
            tensors: vec![(page, group_size)],
            block_size: min_block,
            groups: per_request.iter().map(|(_, _, g)| g).sum(),
            per_request,
            pad: 1,
            spread: 0,
            swa: None,
        })
    }

    /// The layout of the engine of `setup`: [`EngineKv::of`] its scenario's cache, as one
    /// backing allocation where the setup's engine allocates so
    /// ([`crate::Setup::kv_allocation`]), as SGLang's tensors where it allocates K and V per
    /// layer, a hybrid model's in two pools split by the setup's SGLang release
    /// ([`swa_split`]).
    pub fn of_setup(setup: &crate::Setup) -> Option<Self> {
        use memplan_core::kv::KvAllocation;
        let kv = EngineKv::of(&setup.scenario.kv)?;
        let split = swa_split(setup.start_rule);
        match setup.kv_allocation {
            KvAllocation::OneBacking if on_rocm(setup) => {
                kv.one_backing().map(|k| k.padded(ROCM_BACKING_PAGE))
            }
            KvAllocation::OneBacking => kv.one_backing(),
            KvAllocation::PerTensor => Some(kv),
            // SGLang 0.5.23: K and V of one shape are halves of one tensor per layer.
            KvAllocation::PairedKv => kv.paired(&setup.scenario.kv, split),
            KvAllocation::SplitKv => kv.k_and_v_apart(&setup.scenario.kv, split),
        }
    }

    /// The same cache allocated as SGLang 0.5.1 to 0.5.22 do (see the module): a K and a V
    /// tensor for every layer with K and V (not MLA's latent). Where each tensor is one layer's
    /// (one group), each becomes two of half its pages. A hybrid model's tensors are shared by
    /// one layer of every group (vLLM's grouping), which SGLang does not do: it keeps a pool
    /// per kind of layer and a K and a V per layer in each, the tokens split between them by
    /// `split` ([`SwaPools`]). `None` where MLA and other layers share the cache (SGLang pools
    /// them apart, not modelled here).
    pub fn k_and_v_apart(mut self, kv: &KvToml, split: Option<SwaSplit>) -> Option<Self> {
        let groups = kv.layer_groups().ok()?;
        let mla = groups
            .iter()
            .filter(|g| g.layers > 0)
            .all(|g| g.attention == KvAttention::Mla);
        if mla {
            return Some(self);
        }
        if groups
            .iter()
            .any(|g| g.layers > 0 && g.attention == KvAttention::Mla)
        {
            return None;
        }
        if self.groups > 1 {
            match split {
                Some(split) => return SwaPools::of(kv, split, 2).map(|p| self.in_pools(p)),
                None => {
                    let layers = groups
                        .iter()
                        .try_fold(0u64, |a, g| a.checked_add(u64::from(g.layers)))?;
                    self.spread = layers.checked_mul(2)?;
                    return Some(self);
                }
            }
        }
        self.tensors = self
            .tensors
            .iter()
            .map(|(page, n)| Some((page / 2, n.checked_mul(2)?)).filter(|_| page.is_multiple_of(2)))
            .collect::<Option<_>>()?;
        Some(self)
    }

    /// The same cache allocated as SGLang 0.5.23 does (see the module): one tensor per layer,
    /// K and V its halves. That is vLLM's layout where each tensor is one layer's (one group);
    /// a hybrid model's cache (no MLA layer: SGLang pools the latent apart, not modelled here)
    /// is a tensor per layer in two pools, the tokens split between them by `split`
    /// ([`SwaPools`]), instead of vLLM's tensors shared by one layer of every group.
    pub fn paired(mut self, kv: &KvToml, split: Option<SwaSplit>) -> Option<Self> {
        let Ok(groups) = kv.layer_groups() else {
            return Some(self);
        };
        let mla = groups
            .iter()
            .any(|g| g.layers > 0 && g.attention == KvAttention::Mla);
        if self.groups > 1 && !mla {
            match split {
                Some(split) => return SwaPools::of(kv, split, 1).map(|p| self.in_pools(p)),
                None => self.spread = groups.iter().map(|g| u64::from(g.layers)).sum::<u64>(),
            }
        }
        Some(self)
    }

    /// The same cache kept in SGLang's two pools `p` ([`SwaPools`]): SGLang counts a pool as
    /// one of pages of `page` tokens, a block here, the padded page the null block (as
    /// `--emit-args` counts it: `--max-total-tokens` is the usable blocks' tokens), and a request
    /// holds its tokens in the full pool, where they are served.
    fn in_pools(mut self, p: SwaPools) -> Self {
        self.block_size = p.page;
        self.groups = 1;
        self.per_request = vec![(None, p.page, 1)];
        self.spread = 0;
        self.swa = Some(p);
        self
    }

    /// The same cache with each tensor's bytes rounded up to a multiple of `pad`: vLLM 0.29.0
    /// on pads its one backing allocation to [`ROCM_BACKING_PAGE`] on ROCm.
    pub fn padded(mut self, pad: u64) -> Self {
        self.pad = pad.max(1);
        self
    }

    /// The same cache allocated as vLLM 0.29.0 does: one tensor of `bytes_per_block *
    /// num_blocks` (`vllm/v1/worker/utils.py`, `allocate_kv_cache`), `bytes_per_block` the
    /// largest group's pages summed (`kv_cache_utils.py`, `_get_kv_cache_bytes_per_block`):
    /// the pages of every tensor here, one layer of each group per tensor.
    pub fn one_backing(mut self) -> Option<Self> {
        let bytes_per_block = self.block_bytes()?;
        self.tensors = vec![(bytes_per_block, 1)];
        self.spread = 0;
        self.swa = None;
        Some(self)
    }

    /// Bytes of one block across every tensor.
    pub fn block_bytes(&self) -> Option<u64> {
        self.tensors
            .iter()
            .try_fold(0u64, |a, (p, n)| a.checked_add(p.checked_mul(*n)?))
    }

    /// Tensors the engine allocates.
    pub fn tensor_count(&self) -> u64 {
        if let Some(p) = &self.swa {
            return (p.full.len() as u64 + p.swa.len() as u64).saturating_mul(p.per_layer);
        }
        if self.spread > 0 {
            return self.spread;
        }
        self.tensors.iter().map(|(_, n)| n).sum()
    }

    /// `bytes` rounded up to the tensors' padding ([`EngineKv::pad`]).
    fn pad_up(&self, bytes: u64) -> Option<u64> {
        bytes.div_ceil(self.pad.max(1)).checked_mul(self.pad.max(1))
    }

    /// The tensors of `blocks` blocks, in order: `(how many, bytes of each)`.
    pub fn tensor_runs(&self, blocks: u64) -> Option<Vec<(u64, u64)>> {
        if let Some(p) = &self.swa {
            // SGLang is given the tokens the plan's blocks hold (`--max-total-tokens`, what
            // `--emit-args` writes) and allocates its two pools for them.
            return p
                .tensors(self.given_tokens(blocks))?
                .into_iter()
                .map(|(n, b)| Some((n, self.pad_up(b)?)))
                .collect();
        }
        let total = self.block_bytes()?.checked_mul(blocks)?;
        if let (Some(each), Some(more)) = (
            total.checked_div(self.spread),
            total.checked_rem(self.spread),
        ) {
            // The cache's bytes over `spread` tensors: the first take one byte more where they
            // do not divide evenly.
            return [(more, each + 1), (self.spread - more, each)]
                .into_iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, b)| Some((n, self.pad_up(b)?)))
                .collect();
        }
        self.tensors
            .iter()
            .map(|(p, n)| Some((*n, self.pad_up(p.checked_mul(blocks)?)?)))
            .collect()
    }

    /// Bytes of every tensor together.
    pub fn total_bytes(&self, blocks: u64) -> Option<u64> {
        self.tensor_runs(blocks)?
            .into_iter()
            .try_fold(0u64, |a, (n, t)| a.checked_add(t.checked_mul(n)?))
    }

    /// Tokens the cache of `blocks` blocks serves: the null block excluded, the rest shared
    /// by the groups (vLLM 0.19.0 `_report_kv_cache_config`: `num_blocks //
    /// len(kv_cache_groups) * min_block_size`).
    /// SGLang's pools of a hybrid model serve their full pool's tokens ([`SwaPools`]: more
    /// than the blocks hold where the tokens given are every layer's, [`SwaSplit::MeanTokens`]).
    pub fn tokens(&self, blocks: u64) -> u64 {
        let given = self.given_tokens(blocks);
        match &self.swa {
            Some(p) => p.served(given),
            None => given,
        }
    }

    /// The tokens `blocks` blocks hold by vLLM 0.19.0's count (see [`EngineKv::tokens`]), for
    /// SGLang's pools the usable pages' tokens ([`EngineKv::in_pools`]): what the plan gives
    /// SGLang as `--max-total-tokens`.
    fn given_tokens(&self, blocks: u64) -> u64 {
        (blocks.saturating_sub(1) / self.groups.max(1)).saturating_mul(self.block_size)
    }

    /// Blocks one request of `max_model_len` tokens holds at most, scheduled
    /// `max_num_batched_tokens` at a time: the sum over the groups of the pages each holds
    /// (vLLM 0.19.0 `kv_cache_utils.py`, `_max_memory_usage_bytes_from_groups`, divided by
    /// the page and `group_size`; `kv_cache_interface.py`:
    /// `FullAttentionSpec.max_memory_usage_bytes`, `cdiv(max_model_len, block_size)` pages;
    /// `SlidingWindowSpec.max_memory_usage_bytes`, `cdiv(min(sliding_window - 1 +
    /// max_num_batched_tokens, max_model_len), block_size) + 1` pages). The engine refuses to
    /// start where its cache holds fewer (`check_enough_kv_cache_memory`).
    pub fn blocks_per_request(&self, max_model_len: u64, max_num_batched_tokens: u64) -> u64 {
        self.per_request
            .iter()
            .map(|(window, block, groups)| {
                let block = (*block).max(1);
                let pages = match window {
                    None => max_model_len.div_ceil(block),
                    Some(w) => w
                        .saturating_sub(1)
                        .saturating_add(max_num_batched_tokens)
                        .min(max_model_len)
                        .div_ceil(block)
                        .saturating_add(1),
                };
                pages.saturating_mul(*groups)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The most blocks whose tensors take at most `room` bytes, `taken(blocks)` being what
    /// all the tensors of `blocks` blocks take (the allocator's rounding and sharing of
    /// segments, or their own bytes when mapped). What they take grows with the blocks:
    /// bisect.
    pub fn blocks_within(&self, room: u64, taken: impl Fn(u64) -> Option<u64>) -> u64 {
        let fits = |blocks: u64| taken(blocks).is_some_and(|t| t <= room);
        // SGLang's pools take less than vLLM's pages for the blocks' tokens where the sliding
        // pool holds fewer ([`SwaSplit::FullTokens`]): search up to a block a byte there.
        let per_block = match self.swa {
            Some(_) => 1,
            None => self.block_bytes().unwrap_or(u64::MAX).max(1),
        };
        let (mut lo, mut hi) = (0u64, room / per_block);
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
        self.tensor_runs(blocks)?
            .into_iter()
            .try_fold(0u64, |a, (n, t)| a.checked_add(segment(t).checked_mul(n)?))
    }

    /// What the tensors of `blocks` blocks would grow the caching allocator `alloc` by, each
    /// its own allocation, in the engine's order.
    pub fn growth(
        &self,
        blocks: u64,
        alloc: &memplan_backend_sim::AllocatorSnapshot,
    ) -> Option<u64> {
        Some(alloc.growth_of(&self.tensor_runs(blocks)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::kv::KvAllocation;

    fn llama8b(dtype: &str) -> KvToml {
        KvToml::one_group(dtype, KvAttention::Full, 16, (32, 8, 128), 8192)
    }

    fn group(
        attention: KvAttention,
        layers: u32,
        kv_heads: u32,
        window: Option<u64>,
    ) -> KvGroupToml {
        KvGroupToml {
            attention,
            layers,
            kv_heads,
            head_dim: 128,
            window,
        }
    }

    fn hybrid(dtype: &str, groups: Vec<KvGroupToml>) -> KvToml {
        KvToml {
            attention: None,
            layers: None,
            kv_heads: None,
            head_dim: None,
            groups,
            ..llama8b(dtype)
        }
    }

    #[test]
    fn pages_follow_the_engine_rules() {
        // Llama-3.1-8B bf16: 2 * 16 * 8 * 128 * 2 = 64 KiB per layer, 2 MiB per block over 32
        // layers (shared/data/README: 58.11 GiB / 2 MiB per block -> 29,751 usable blocks).
        let k = EngineKv::of(&llama8b("bf16")).unwrap();
        assert_eq!((k.tensors.clone(), k.groups), (vec![(64 << 10, 32)], 1));
        assert_eq!(k.total_bytes(29_752), Some(29_752 * (2 << 20)));
        assert_eq!(k.tokens(29_752), 476_016);
        let i8 = EngineKv::of(&llama8b("int8")).unwrap();
        assert_eq!(i8.tensors, vec![((32 << 10) + 2 * 16 * 8 * 4, 32)]);
        assert_eq!(EngineKv::of(&llama8b("fp4")), None);
    }

    #[test]
    fn sglang_before_0_5_23_allocates_k_and_v_apart() {
        // Llama-3.1-8B bf16 with one-token pages (SGLang's `--page-size 1`): a layer's token is
        // 2 * 8 * 128 * 2 = 4 KiB, its K and its V 2 KiB each, 64 tensors of `rows x 2 KiB`.
        let kv = KvToml::one_group("bf16", KvAttention::Full, 1, (32, 8, 128), 8192);
        let k = EngineKv::of(&kv).unwrap();
        let apart = k
            .clone()
            .k_and_v_apart(&kv, Some(SwaSplit::FullTokens))
            .unwrap();
        assert_eq!(apart.tensors, vec![(2 << 10, 64)]);
        assert_eq!(
            apart.tensor_runs(1_000),
            Some(vec![(64, 1_000 * (2 << 10))])
        );
        assert_eq!(apart.total_bytes(1_000), k.total_bytes(1_000));
        assert_eq!(apart.tokens(1_000), k.tokens(1_000));
        // MLA: one `kv_buffer` per layer.
        let mla = KvToml::one_group("bf16", KvAttention::Mla, 1, (27, 1, 576), 8192);
        let m = EngineKv::of(&mla).unwrap();
        assert_eq!(
            m.clone().k_and_v_apart(&mla, Some(SwaSplit::MeanTokens)),
            Some(m)
        );
    }

    /// gemma-3-4b's layers (34: 29 sliding with a 1024-token window, 5 full; 4 KV heads of 256)
    /// in fp8 with 32-token blocks, as SGLang's `SWAKVPool` allocates them: a pool of the 5 full
    /// layers and one of the 29 sliding ones, each a K and a V tensor per layer up to 0.5.22
    /// (68 tensors, not the 5 vLLM shares across its 7 groups), one per layer in 0.5.23 (34).
    /// SGLang is given the usable pages' tokens; the rows of each pool are its split of them,
    /// worked by hand from its formulas (see [`SwaSplit`]).
    #[test]
    fn sglang_allocates_a_hybrid_models_two_pools() {
        let g = KvToml {
            block_size: 32,
            ..hybrid(
                "fp8",
                vec![
                    KvGroupToml {
                        head_dim: 256,
                        ..group(KvAttention::Sliding, 29, 4, Some(1024))
                    },
                    KvGroupToml {
                        head_dim: 256,
                        ..group(KvAttention::Full, 5, 4, None)
                    },
                ],
            )
        };
        let k = EngineKv::of(&g).unwrap();
        // Pages of 2 * 32 * 4 * 256 = 64 KiB; 29 >= 1.5 * 5: group_size 5, 1 + 6 groups.
        assert_eq!((k.tensors.clone(), k.groups), (vec![(64 << 10, 5)], 7));
        let blocks = 1_001;
        let runs = |e: &EngineKv| {
            let mut r = e.tensor_runs(blocks).unwrap();
            r.dedup_by(|a, b| {
                let same = a.1 == b.1;
                if same {
                    b.0 += a.0;
                }
                same
            });
            r
        };
        // A layer's token: 2 * 4 * 256 = 2 KiB, its K and its V 1 KiB each. SGLang's pool of
        // 1,001 pages is given the 1,000 usable pages' 32,000 tokens.
        // 0.5.14 on: the full pool holds them, the sliding one int(32,000 * 0.8) = 25,600; each
        // a page more: 32,032 and 25,632 rows.
        let new = k
            .clone()
            .k_and_v_apart(&g, Some(SwaSplit::FullTokens))
            .unwrap();
        assert_eq!(new.tensor_count(), 68);
        assert_eq!(runs(&new), vec![(10, 32_032 << 10), (58, 25_632 << 10)]);
        assert_eq!(new.total_bytes(blocks), Some(1_850_343_424));
        assert_eq!(new.tokens(blocks), 32_000);
        // A request holds its tokens in the full pool: 4,096 of them 128 pages.
        assert_eq!(new.blocks_per_request(4_096, 2_048), 128);
        // Up to 0.5.13: the 32,000 tokens are every layer's; the full pool holds
        // int(32,000 * (5 + 29) * 2 KiB / ((5 + 0.8 * 29) * 2 KiB)) = 38,581, floored to
        // 38,560, the sliding one int(38,560 * 0.8) = 30,848: rows 38,592 and 30,880, no more
        // bytes than every layer holding 1,001 pages (2,230,452,224); it serves 38,560.
        let old = k
            .clone()
            .k_and_v_apart(&g, Some(SwaSplit::MeanTokens))
            .unwrap();
        assert_eq!(runs(&old), vec![(10, 38_592 << 10), (58, 30_880 << 10)]);
        assert_eq!(old.total_bytes(blocks), Some(2_229_207_040));
        assert_eq!(old.tokens(blocks), 38_560);
        // Each tensor rounded up to 2 MiB: 10 of 31.3 MiB and 58 of 25.0 MiB, 32 and 26 MiB.
        let round = |b: u64| b.div_ceil(2 << 20) * (2 << 20);
        assert_eq!(
            new.each_rounded(blocks, round),
            Some(10 * (32 << 20) + 58 * (26 << 20))
        );
        // The most pages within the bytes of 1,001 pages of every layer: more from 0.5.14, as
        // the sliding pool holds fewer rows.
        let room = 2_230_452_224;
        // (1,002 up to 0.5.13: its full pool's floor to pages leaves room for one more page.)
        assert_eq!(old.blocks_within(room, |b| old.total_bytes(b)), 1_002);
        assert_eq!(new.blocks_within(room, |b| new.total_bytes(b)), 1_207);
        // As one backing allocation the pools no longer apply.
        let one = k.clone().one_backing().unwrap();
        assert_eq!(one.tensor_runs(blocks), Some(vec![(1, 328_007_680)]));
        // The setup's engine: K and V apart allocates the 68, split as its release does.
        let mut setup = crate::Scenario::load("bf16-24g")
            .unwrap()
            .resolve()
            .unwrap();
        setup.scenario.kv = g.clone();
        setup.kv_allocation = KvAllocation::SplitKv;
        setup.start_rule = crate::scenario::StartRule::Sglang051;
        assert_eq!(EngineKv::of_setup(&setup), Some(old));
        setup.start_rule = crate::scenario::StartRule::Sglang0514;
        assert_eq!(EngineKv::of_setup(&setup), Some(new));
        // An engine that names no SGLang release: vLLM's bytes spread over the 68.
        setup.start_rule = crate::scenario::StartRule::Vllm;
        let spread = EngineKv::of_setup(&setup).unwrap();
        assert_eq!(spread.tensor_count(), 68);
        assert_eq!(spread.total_bytes(blocks), k.total_bytes(blocks));
        assert_eq!(spread.tokens(blocks), k.tokens(blocks));
        // SGLang 0.5.23 pairs K and V in one tensor per layer, in the same two pools: 34.
        setup.start_rule = crate::scenario::StartRule::Sglang0514;
        setup.kv_allocation = KvAllocation::PairedKv;
        let paired = EngineKv::of_setup(&setup).unwrap();
        assert_eq!(paired.tensor_count(), 34);
        assert_eq!(paired.total_bytes(blocks), Some(1_850_343_424));
        // vLLM up to 0.28: the 5 tensors shared across the groups.
        setup.kv_allocation = KvAllocation::PerTensor;
        assert_eq!(EngineKv::of_setup(&setup).unwrap().tensor_count(), 5);
    }

    #[test]
    fn mla_pages_are_one_sided() {
        // DeepSeek-V2-Lite: 27 layers, one latent of 512 + 64 per token.
        let mla = |dtype: &str| KvToml::one_group(dtype, KvAttention::Mla, 64, (27, 1, 576), 8192);
        let page = |dtype: &str| EngineKv::of(&mla(dtype)).unwrap().tensors[0].0;
        assert_eq!(page("bf16"), 64 * 576 * 2);
        assert_eq!(page("fp8"), 64 * 576);
        assert_eq!(page("fp8_ds_mla"), 64 * 656);
        assert_eq!(EngineKv::of(&mla("int8")), None);
        assert_eq!(
            EngineKv::of(&llama8b("fp8_ds_mla")),
            None,
            "fp8_ds_mla is MLA's"
        );
    }

    /// gemma-3-27b (`model-configs.jsonl`: 62 layers, 16 KV heads of 128, a 1024-token window
    /// on 5 layers of 6: 52 sliding, 10 global), by vLLM 0.19.0's rules worked by hand: both
    /// pages `2 * 16 * 16 * 128 * 2` = 128 KiB in bf16 (`AttentionSpec.real_page_size_bytes`),
    /// so no unification; two specs, 10 and 52 layers, 52 >= 1.5 * 10 so `group_size` = 10;
    /// groups: 1 full + ceil(52 / 10) = 6 sliding (8 padding layers) = 7; 10 tensors, each
    /// shared by one layer of every group; a block is 10 pages = 1.25 MiB; 7,001 blocks serve
    /// (7,001 - 1) / 7 * 16 = 16,000 tokens.
    #[test]
    fn gemma3_groups_by_the_engine_rules() {
        let g = hybrid(
            "bf16",
            vec![
                group(KvAttention::Sliding, 52, 16, Some(1024)),
                group(KvAttention::Full, 10, 16, None),
            ],
        );
        let k = EngineKv::of(&g).unwrap();
        assert_eq!(k.tensors, vec![(128 << 10, 10)]);
        assert_eq!((k.groups, k.block_size, k.tensor_count()), (7, 16, 10));
        assert_eq!(k.block_bytes(), Some(1280 << 10));
        assert_eq!(k.total_bytes(7_001), Some(7_001 * (1280 << 10)));
        assert_eq!(k.tensor_runs(7_001), Some(vec![(10, 7_001 * (128 << 10))]));
        assert_eq!(k.tokens(7_001), 16_000);
        // As vLLM 0.29.0 allocates it: one `torch.zeros(bytes_per_block * num_blocks)`,
        // `bytes_per_block` the largest group's ten 128 KiB pages (`allocate_kv_cache`,
        // `_get_kv_cache_bytes_per_block`); the blocks and tokens are the same.
        let one = k.clone().one_backing().unwrap();
        assert_eq!(
            one.tensor_runs(7_001),
            Some(vec![(1, 7_001 * 10 * (128 << 10))])
        );
        assert_eq!(one.total_bytes(7_001), k.total_bytes(7_001));
        assert_eq!(one.tokens(7_001), 16_000);
        assert_eq!(
            k.tokens(7_007),
            16_000,
            "a group's partial share serves nothing"
        );
        // One request of 32,768 tokens, 8,192 a step: the global group holds 32768 / 16 =
        // 2,048 pages, each sliding group ceil(min(1023 + 8192, 32768) / 16) + 1 = 577, six
        // of them: 5,510 blocks. Of 16,384 tokens 4,096 a step: 1,024 + 6 * 321 = 2,950.
        assert_eq!(k.blocks_per_request(32_768, 8_192), 5_510);
        assert_eq!(k.blocks_per_request(16_384, 4_096), 2_950);
        // A request shorter than the window holds its length in every group, plus one.
        assert_eq!(k.blocks_per_request(512, 8_192), 32 + 6 * 33);
        // fp8: pages of 64 KiB, the same grouping.
        let f = EngineKv::of(&hybrid("fp8", g.groups.clone())).unwrap();
        assert_eq!((f.tensors.clone(), f.groups), (vec![(64 << 10, 10)], 7));
        // Written global-first the engine groups the same layers the same way.
        let mut rev = g.groups.clone();
        rev.reverse();
        let r = EngineKv::of(&hybrid("bf16", rev)).unwrap();
        assert_eq!(
            (r.tensors, r.groups, r.block_size),
            (k.tensors.clone(), 7, 16)
        );
    }

    /// gpt-oss-20b (24 layers alternating sliding 128 and full, 8 KV heads of 64): 12 and 12
    /// layers, 12 < 1.5 * 12 so `group_size` = 12, 2 groups, 12 tensors of `2 * 16 * 8 * 64 *
    /// 2` = 32 KiB pages in bf16.
    #[test]
    fn gpt_oss_pairs_its_layers() {
        let g = hybrid(
            "bf16",
            vec![
                KvGroupToml {
                    head_dim: 64,
                    ..group(KvAttention::Sliding, 12, 8, Some(128))
                },
                KvGroupToml {
                    head_dim: 64,
                    ..group(KvAttention::Full, 12, 8, None)
                },
            ],
        );
        let k = EngineKv::of(&g).unwrap();
        assert_eq!(
            (k.tensors.clone(), k.groups, k.block_size),
            (vec![(32 << 10, 12)], 2, 16)
        );
        assert_eq!(k.tokens(1_001), 8_000);
        // 12 sliding + 13 full (an EAGLE drafter's extra layer): 13 < 18, padded to 13 each.
        let mut g13 = g.clone();
        g13.groups[1].layers = 13;
        let k = EngineKv::of(&g13).unwrap();
        assert_eq!((k.tensors.clone(), k.groups), (vec![(32 << 10, 13)], 2));
    }

    #[test]
    fn smaller_pages_take_bigger_blocks() {
        // 4 full layers of 8 heads (64 KiB pages) and 20 sliding of 4 (32 KiB): the sliding
        // layers' blocks double to 32 tokens (`unify_kv_cache_spec_page_size`); group_size 4,
        // 1 + 5 groups, 4 tensors of 64 KiB pages; the smallest block is 16 tokens.
        let g = hybrid(
            "bf16",
            vec![
                group(KvAttention::Full, 4, 8, None),
                group(KvAttention::Sliding, 20, 4, Some(4096)),
            ],
        );
        let k = EngineKv::of(&g).unwrap();
        assert_eq!(
            (k.tensors.clone(), k.groups, k.block_size),
            (vec![(64 << 10, 4)], 6, 16)
        );
        // Per request of 8,192 tokens: the full group 512 pages of 16 tokens, each of the 5
        // sliding groups ceil(min(4095 + 8192, 8192) / 32) + 1 = 257 pages of 32.
        assert_eq!(k.blocks_per_request(8_192, 8_192), 512 + 5 * 257);
        // 8 heads beside 6: 64 KiB is not a multiple of 48 KiB, vLLM 0.19.0 raises.
        let mut bad = g.clone();
        bad.groups[1].kv_heads = 6;
        assert_eq!(EngineKv::of(&bad), None);
    }

    #[test]
    fn one_kind_of_layer_is_one_group() {
        // All sliding with one window (Mistral-7B-v0.1): one spec, a tensor per layer.
        let m = KvToml {
            window: Some(4096),
            ..KvToml::one_group("bf16", KvAttention::Sliding, 16, (32, 8, 128), 32768)
        };
        let k = EngineKv::of(&m).unwrap();
        assert_eq!((k.tensors.clone(), k.groups), (vec![(64 << 10, 32)], 1));
        // ceil(min(4095 + 8192, 16384) / 16) + 1 = 769 of the 1,024 a full layer would hold.
        assert_eq!(k.blocks_per_request(16_384, 8_192), 769);
        assert_eq!(
            EngineKv::of(&llama8b("bf16"))
                .unwrap()
                .blocks_per_request(16_384, 8_192),
            1_024
        );
        // Two full shapes: `UniformTypeKVCacheSpecs`, one group, a tensor per layer of its own
        // page, in the order written.
        let u = hybrid(
            "bf16",
            vec![
                group(KvAttention::Full, 30, 8, None),
                group(KvAttention::Full, 2, 2, None),
            ],
        );
        let k = EngineKv::of(&u).unwrap();
        assert_eq!(k.tensors, vec![(64 << 10, 30), (16 << 10, 2)]);
        assert_eq!((k.groups, k.tokens(101)), (1, 1600));
        assert_eq!(
            k.total_bytes(10),
            Some(10 * (30 * (64 << 10) + 2 * (16 << 10)))
        );
        // Two windows are two specs: the hybrid grouping, 10 + 10 layers in 2 groups.
        let w = hybrid(
            "bf16",
            vec![
                group(KvAttention::Sliding, 10, 8, Some(512)),
                group(KvAttention::Sliding, 10, 8, Some(1024)),
            ],
        );
        let k = EngineKv::of(&w).unwrap();
        assert_eq!((k.tensors.clone(), k.groups), (vec![(64 << 10, 10)], 2));
        // Two groups written with the same spec are one.
        let same = hybrid(
            "bf16",
            vec![
                group(KvAttention::Full, 16, 8, None),
                group(KvAttention::Full, 16, 8, None),
            ],
        );
        assert_eq!(EngineKv::of(&same), EngineKv::of(&llama8b("bf16")));
    }

    /// vLLM 0.29.0 on pads its one backing allocation to 4 KiB on ROCm only
    /// (`vllm/v1/worker/utils.py`, `_allocate_kv_cache_buffer`): DeepSeek-V2-Lite's
    /// `fp8_ds_mla` blocks of 27 x 64 x 656 bytes are no multiple of it.
    #[test]
    fn one_backing_on_rocm_is_padded_to_a_page() {
        let mla = KvToml::one_group("fp8_ds_mla", KvAttention::Mla, 64, (27, 1, 576), 8192);
        let one = EngineKv::of(&mla).unwrap().one_backing().unwrap();
        let raw = 3 * 27 * 64 * 656;
        assert_eq!(one.tensor_runs(3), Some(vec![(1, raw)]));
        let rocm = one.clone().padded(ROCM_BACKING_PAGE);
        let padded = raw.div_ceil(4096) * 4096;
        assert!(padded > raw);
        assert_eq!(rocm.tensor_runs(3), Some(vec![(1, padded)]));
        assert_eq!(rocm.total_bytes(3), Some(padded));
        assert_eq!(rocm.tokens(3), one.tokens(3), "the padding serves nothing");
        // Which setups pad: one backing on a ROCm profile, nothing else.
        let mut setup = crate::Scenario::load("bf16-24g")
            .unwrap()
            .resolve()
            .unwrap();
        let pad = |setup: &crate::Setup| EngineKv::of_setup(setup).unwrap().pad;
        for (device, allocation, expected) in [
            (
                "rx7900xtx-rocm6.2,declare-exact",
                KvAllocation::OneBacking,
                4096,
            ),
            ("strix-halo", KvAllocation::OneBacking, 4096),
            ("rx7900xtx-rocm6.2", KvAllocation::PerTensor, 1),
            ("rtx4090", KvAllocation::OneBacking, 1),
        ] {
            setup.scenario.device = device.into();
            setup.kv_allocation = allocation;
            assert_eq!(pad(&setup), expected, "{device} {allocation:?}");
        }
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
        assert!(rounded < exact && k.each_rounded(rounded, round).unwrap() <= room);
        assert!(k.each_rounded(rounded + 1, round).unwrap() > room);
    }
}
