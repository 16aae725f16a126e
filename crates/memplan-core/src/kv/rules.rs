//! The engine-version-dependent parts of KV sizing, as data: which release of an engine
//! counts what. The tables that fill these in per release live in `memplan-model`'s engine
//! module (with the vLLM file and version of each rule); the core only applies them.

use serde::{Deserialize, Serialize};

use super::LayerGroup;

/// How the engine turns blocks into the "KV cache size: N tokens" it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capacity {
    /// `num_blocks // num_groups * block_size` (vLLM up to 0.20.0,
    /// `_report_kv_cache_config`). memplan removes the null block first.
    BlocksPerGroup,
    /// `int(num_blocks / blocks_per_request * max_model_len)`: group-aware, windows counted
    /// (vLLM 0.20.1 on, `get_kv_cache_capacity`).
    Concurrency,
}

/// How the engine allocates its KV cache, which decides how often its caching allocator rounds
/// it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvAllocation {
    /// One allocation per `KVCacheTensor` (one per layer of a KV-cache group), each rounded on
    /// its own: vLLM up to 0.28 (`vllm/v1/worker/gpu_model_runner.py`,
    /// `GPUModelRunner._allocate_kv_cache_tensors`: one `torch.zeros(kv_cache_tensor.size)` per
    /// tensor unless it is packed, `block_stride > 0`, which 0.28.0 added as an option).
    #[default]
    PerTensor,
    /// One allocation of `num_blocks x bytes per block` that every layer views: vLLM 0.29.0 on
    /// (`vllm/v1/worker/utils.py`, `allocate_kv_cache`: every `KVCacheTensor` has the size
    /// `bytes_per_block * num_blocks` of `get_kv_cache_config_from_groups`, asserted to
    /// "share one backing allocation", one `torch.zeros` of it; `create_kv_cache_views`).
    /// Rounded once.
    OneBacking,
    /// A K tensor and a V tensor per layer, each rounded on its own (one tensor where the layer
    /// has no V: MLA's latent, an indexer's keys, a recurrent state): SGLang 0.5.1 to 0.5.22
    /// (`python/sglang/srt/mem_cache/memory_pool.py`, `MHATokenToKVPool._create_buffers`, in
    /// 0.5.16 `_create_buffers_normal`: `k_buffer` and `v_buffer`, one `torch.zeros((size +
    /// page_size, head_num, head_dim))` per layer each; `MLATokenToKVPool._create_buffers`: one
    /// `kv_buffer` per layer).
    SplitKv,
    /// One tensor per layer whose halves are K and V where their shapes match, a K and a V
    /// tensor per layer where they differ (one tensor where the layer has no V): SGLang 0.5.23
    /// (`memory_pool.py`, `MHATokenToKVPool._create_buffers_normal`: `torch.zeros((2, padded,
    /// head_num, head_dim))` per layer when `k_shape == v_shape`, `padded` the `size +
    /// page_size` rows page-aligned; else `k_buffer` and `v_buffer` apart;
    /// `MLATokenToKVPool._create_buffers` unchanged).
    PairedKv,
}

impl KvAllocation {
    /// The tensors the engine allocates for one layer of `group`: two where it allocates K and
    /// V apart ([`Self::SplitKv`]; [`Self::PairedKv`] where their head dims differ), else one.
    /// [`Self::OneBacking`] allocates no tensor per layer (every layer views the one backing
    /// allocation): one, as a layer's share of it.
    pub fn tensors_per_layer(self, group: &LayerGroup) -> u64 {
        let v_apart = match self {
            KvAllocation::PerTensor | KvAllocation::OneBacking => false,
            KvAllocation::SplitKv => has_v(group),
            KvAllocation::PairedKv => has_v(group) && group.head_dim_v != group.head_dim_k,
        };
        1 + u64::from(v_apart)
    }

    /// How many allocations the engine makes for a cache of `groups`' layers, each rounded by
    /// its allocator on its own: one ([`Self::OneBacking`]), or every layer's
    /// [`tensors_per_layer`](Self::tensors_per_layer).
    pub fn allocations(self, groups: &[LayerGroup]) -> u64 {
        match self {
            KvAllocation::OneBacking => 1,
            _ => groups
                .iter()
                .map(|g| u64::from(g.num_layers).saturating_mul(self.tensors_per_layer(g)))
                .fold(0, u64::saturating_add),
        }
    }

    /// The tensors each layer of `groups` splits its page into, where that is one count for
    /// every layer and the tensors are equal halves (K and V of one size): `Some(1)` for one
    /// tensor per layer, `Some(2)` for a K and a V of one size; `None` where layers split
    /// differently or K and V differ in size. [`Self::OneBacking`]: `Some(1)`.
    pub fn equal_tensors_per_layer(self, groups: &[LayerGroup]) -> Option<u64> {
        let mut counts =
            groups
                .iter()
                .filter(|g| g.num_layers > 0)
                .map(|g| match self.tensors_per_layer(g) {
                    1 => Some(1),
                    // K and V apart: equal where their head dims match (a scale, where the dtype
                    // has one, exists for each).
                    n => (g.head_dim_k == g.head_dim_v).then_some(n),
                });
        let first = counts.next().unwrap_or(Some(1))?;
        counts.try_fold(first, |a, n| (n? == a).then_some(a))
    }
}

/// What the engine does at start-up when its KV cache cannot hold one request of
/// `max_model_len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LongRequests {
    /// It refuses to start: vLLM (0.19.0 `vllm/v1/core/kv_cache_utils.py`,
    /// `get_kv_cache_configs` → `_check_enough_kv_cache_memory`: "To serve at least one request
    /// with the models's max seq len (N), (X GiB KV cache is needed, which is larger than the
    /// available KV cache memory"; 0.34.0 the same function in `kv_cache_planning.py`, checked
    /// again after the extensible cache's warm-up in `shrink_kv_cache_configs`).
    #[default]
    Refuse,
    /// It starts with a pool shorter than `max_model_len` and admits only requests of at most
    /// the pool's tokens less one (longer ones are refused or truncated when they arrive),
    /// provided the pool holds at least `least_tokens` tokens; below that it refuses. SGLang:
    /// `max_req_len = min(context_len - 1, pool tokens - 1)`
    /// (`python/sglang/srt/managers/tp_worker.py`, `TpModelWorker`; 0.5.23 `get_worker_info`
    /// also logs "KV pool holds N tokens, fewer than --context-length"), and "Not enough
    /// memory. Please try to increase --mem-fraction-static" is raised only for an empty pool
    /// (`max_total_num_tokens <= 0`: `model_executor/model_runner.py` `init_memory_pool` in
    /// 0.5.1, `model_runner_kv_cache_mixin.py` `init_memory_pool` in 0.5.9,
    /// `pool_configurator.py` `MemoryPoolConfig.__post_init__` in 0.5.22 and 0.5.23). The
    /// least pool: 7 tokens up to 0.5.13 (`TpModelWorker.__init__` asserts `max_req_len > 0
    /// and max_req_input_len > 0`, `max_req_input_len = max_req_len - 5`: "Memory pool size is
    /// too small"), 2 from 0.5.14 (`TpModelWorker.alloc_memory_pool` asserts `max_req_len > 0`
    /// only; read in 0.5.14, 0.5.16, 0.5.22 and 0.5.23).
    CapByPool {
        /// Fewest tokens the pool must hold for the engine to start.
        least_tokens: u64,
    },
}

impl LongRequests {
    /// The longest request (tokens) an engine of this rule admits from a pool of `pool_tokens`
    /// when one request of `max_model_len` does not fit; `None` where it refuses to start
    /// instead ([`Self::Refuse`], or a pool below [`Self::CapByPool`]'s least).
    pub fn longest_admitted(self, pool_tokens: u64, max_model_len: u64) -> Option<u64> {
        match self {
            LongRequests::Refuse => None,
            LongRequests::CapByPool { least_tokens } => (pool_tokens >= least_tokens.max(1))
                .then(|| pool_tokens.min(max_model_len).saturating_sub(1)),
        }
    }
}

/// How the engine keeps a hybrid model's full-attention and sliding-window layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwaPools {
    /// vLLM's KV-cache groups: layers of each kind cut into groups of `group_size` layers, a
    /// block shared by one layer of every group ([`super::KvSpec::size_with`]'s grouping).
    #[default]
    Groups,
    /// SGLang's two pools, a tensor set for the full-attention layers and one for the
    /// sliding-window layers (`python/sglang/srt/mem_cache/swa_memory_pool.py`,
    /// `SWAKVPool.__init__`, read in 0.5.9, 0.5.22 and 0.5.23), each `MHATokenToKVPool`
    /// layer holding its pool's rows plus a padded page (`_create_buffers`: `size +
    /// page_size` rows), the sliding pool's rows `swa_full_tokens_ratio` of the full pool's,
    /// 0.8 by default (`ServerArgs.swa_full_tokens_ratio`, 0.5.9; `fallback=0.8` in
    /// `srt/arg_groups/fields/schedule.py`, 0.5.22, 0.5.23). Up to 0.5.13 (read in 0.5.9:
    /// `model_executor/model_runner_kv_cache_mixin.py`, `set_num_tokens_hybrid_swa`) the
    /// tokens given (`--max-total-tokens`) are what every layer would hold: the full pool
    /// takes `int(T (F + S) / (F + 0.8 S))`, the sliding one `int(full x 0.8)`, each floored
    /// to whole pages, no more bytes than every layer holding `T`.
    SglangEveryLayer,
    /// SGLang from 0.5.14 (read in 0.5.14, 0.5.16, 0.5.19, 0.5.21, 0.5.22, 0.5.23:
    /// `model_executor/pool_configurator.py`, `HybridSWAPoolConfigurator._solve_pool_sizes`,
    /// reached from `--max-total-tokens` by `calculate_pool_sizes_from_max_tokens`): the tokens
    /// given are the full pool's, floored to whole pages, the sliding pool `int(T x 0.8)`
    /// floored to whole pages.
    SglangFullPool,
}

/// How the engine weighs its request against the memory free when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartCheck {
    /// It refuses to start where the free memory is below the request, before loading
    /// anything: vLLM (`vllm/v1/worker/gpu_worker.py` `Worker.init_device` takes a
    /// `MemorySnapshot` and calls `vllm/v1/worker/utils.py` `request_memory`, which raises "Free
    /// memory on device ... on startup is less than desired GPU memory utilization" where
    /// `free_memory < ceil(total_memory x gpu_memory_utilization)`; read in 0.19.0, 0.29.0 and
    /// 0.34.0).
    #[default]
    RefuseAboveFree,
    /// Its fraction is a share of the memory free when it starts, so it never asks for memory
    /// other processes hold and compares no request with the free memory: SGLang. 0.5.9
    /// `ModelRunner.init_torch_distributed` reads the free memory before the weights
    /// (`min_per_gpu_memory`, `get_available_gpu_memory`) and
    /// `model_runner_kv_cache_mixin.py` `profile_max_num_token` sizes the pool from `rest =
    /// available - total_gpu_memory x (1 - mem_fraction_static)`, `total_gpu_memory` being that
    /// start-up reading: weights, activations and pool together take `mem_fraction_static x`
    /// the free memory at the start. 0.5.14 the same through `pre_model_load_memory` and
    /// `_profile_available_bytes`; 0.5.23 `bootstrap.measure_pre_model_load_memory` and
    /// `kv_cache_configurator._profile_available_bytes`. It refuses only a pool that is empty or
    /// too short ([`LongRequests::CapByPool`]). The older model of that rule, which takes the
    /// fraction of the free memory at the start as a bound on everything the engine holds
    /// (weights, activations, graphs and pool), kept for plans written with it and for the dry
    /// run, which reads no free memory after the weights
    /// ([`Self::without_free_after_weights`]); [`Self::PoolOfFreeAfterWeights`] is the rule as
    /// the engine computes it, the one SGLang's releases start with.
    ShareOfFree,
    /// SGLang's pool rule as its source computes it: the pool may take the free memory it reads
    /// once its weights are loaded less the free memory it read at its start times `1 -
    /// mem_fraction_static` (0.5.9 `srt/model_executor/model_runner_kv_cache_mixin.py`
    /// `profile_max_num_token`: `rest_memory = available_gpu_memory - total_gpu_memory * (1 -
    /// self.mem_fraction_static)`, `available_gpu_memory` from `srt/utils/common.py`
    /// `get_available_gpu_memory` (`torch.cuda.empty_cache()` then `torch.cuda.mem_get_info`)
    /// after the weights, `total_gpu_memory` the `min_per_gpu_memory` that
    /// `srt/model_executor/model_runner.py` `ModelRunner.init_torch_distributed` read the same
    /// way before them; 0.5.22 `srt/mem_cache/kv_cache_configurator.py`
    /// `_profile_available_bytes`: `rest_memory = available_gpu_memory - slack_gb`, `slack_gb =
    /// pre_model_load_memory * (1 - mem_fraction_static)`, `pre_model_load_memory` from
    /// `srt/distributed/bootstrap.py` `measure_pre_model_load_memory`). Activations and graphs
    /// are not taken from it: they live in the slack. `--max-total-tokens` only lowers the
    /// pool (`min` of the two), so a plan beyond this limit is one the engine does not keep,
    /// and within it the request stands: the engine refuses no request for the free memory
    /// (only a pool that is empty or too short, [`LongRequests::CapByPool`]).
    PoolOfFreeAfterWeights,
}

impl StartCheck {
    /// The bytes the engine may use for a request of `requested` bytes of a device of `total`
    /// bytes where `free` are free at its start; `None` where it refuses to start.
    /// [`Self::RefuseAboveFree`]: the request, or `None` where `free` is below it.
    /// [`Self::ShareOfFree`]: the request where `free` holds it, else the request's share of
    /// the device taken of `free` (`floor(requested x free / total)`, SGLang's `mem_fraction_static
    /// x` the free memory at the start), never above the request nor above `free`.
    pub fn budget(self, requested: u64, total: u64, free: u64) -> Option<u64> {
        if free >= requested {
            return Some(requested);
        }
        match self {
            StartCheck::RefuseAboveFree => None,
            StartCheck::PoolOfFreeAfterWeights => Some(requested),
            StartCheck::ShareOfFree => {
                let share = u128::from(requested) * u128::from(free) / u128::from(total.max(1));
                Some(
                    u64::try_from(share)
                        .unwrap_or(u64::MAX)
                        .min(requested)
                        .min(free),
                )
            }
        }
    }
}

impl StartCheck {
    /// The rule as a plan that reads no free memory once the weights are loaded applies it
    /// (a dry run: it touches no device, or reads one snapshot before anything is loaded):
    /// [`Self::PoolOfFreeAfterWeights`] needs that reading, so such a plan takes its older
    /// model, [`Self::ShareOfFree`], which bounds the whole process by the request's share of
    /// the free memory at the start; every other rule as it is.
    pub const fn without_free_after_weights(self) -> StartCheck {
        match self {
            StartCheck::PoolOfFreeAfterWeights => StartCheck::ShareOfFree,
            c => c,
        }
    }

    /// The most the engine's KV pool may take by its own rule, where it has one
    /// ([`Self::PoolOfFreeAfterWeights`]): `free_after_weights - ceil(free_at_start x (total -
    /// requested) / total)`, the request's share of the device being the engine's
    /// `mem_fraction_static`, with both free figures as the engine reads them. `None` for the
    /// rules that bound the pool by the request alone.
    pub fn pool_limit(
        self,
        requested: u64,
        total: u64,
        free_at_start: u64,
        free_after_weights: u64,
    ) -> Option<u64> {
        match self {
            StartCheck::PoolOfFreeAfterWeights => {
                let total = u128::from(total.max(1));
                let slack = (u128::from(free_at_start)
                    * (total.saturating_sub(u128::from(requested))))
                .div_ceil(total);
                Some(free_after_weights.saturating_sub(u64::try_from(slack).unwrap_or(u64::MAX)))
            }
            StartCheck::RefuseAboveFree | StartCheck::ShareOfFree => None,
        }
    }

    /// The least static fraction, in thousandths (SGLang writes `--mem-fraction-static` to
    /// three decimals), whose pool by the engine's own rule ([`Self::pool_limit`]) holds
    /// `pool` bytes where it reads `free_at_start` at its start and `free_after_weights` once
    /// its weights are loaded: the least `k` with `ceil(free_at_start x (1000 - k) / 1000) <=
    /// free_after_weights - pool`. `None` for the rules that bound the pool by the request
    /// alone, and where even the whole of what is free after the weights is less than `pool`
    /// (no fraction reaches it).
    pub fn thousandths_for_pool(
        self,
        pool: u64,
        free_at_start: u64,
        free_after_weights: u64,
    ) -> Option<u32> {
        match self {
            StartCheck::PoolOfFreeAfterWeights => {
                let spare = u128::from(free_after_weights.checked_sub(pool)?);
                let start = u128::from(free_at_start.max(1));
                let slack_thousandths = (spare * 1000 / start).min(1000);
                u32::try_from(1000 - slack_thousandths).ok()
            }
            StartCheck::RefuseAboveFree | StartCheck::ShareOfFree => None,
        }
    }
}

/// Whether a layer of `g` holds a V beside its K (not MLA's latent, an indexer's keys or a
/// recurrent state, whose V head dim is 0).
fn has_v(g: &LayerGroup) -> bool {
    g.head_dim_v > 0 && !matches!(g.attention, super::AttentionKind::State { .. })
}

/// Rules of one engine release that KV sizing applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SizingRules {
    /// Batches whose tokens a sliding or chunked window keeps while they are in flight: 1
    /// before vLLM 0.26; `pipeline stages + 1` with async scheduling from 0.26 on
    /// (`VllmConfig.max_in_flight_tokens`).
    pub in_flight_batches: u64,
    /// Reported token capacity.
    pub capacity: Capacity,
    /// The hybrid KV-cache manager: when off, sliding-window and chunked-local layers next to
    /// full-attention layers are sized as full attention (`unify_hybrid_kv_cache_specs`).
    pub hybrid_manager: bool,
    /// Attention pages that do not divide the largest page are padded to it (vLLM 0.24 on,
    /// `unify_kv_cache_spec_page_size`); before, such a model fails to start.
    pub pad_attention_pages: bool,
    /// How the KV cache is allocated (one tensor per layer, one backing allocation from vLLM
    /// 0.29.0 on, K and V apart in SGLang). Plans written before the rule existed read as per
    /// tensor.
    #[serde(default)]
    pub kv_allocation: KvAllocation,
    /// What the engine does when one request of `max_model_len` does not fit (vLLM refuses to
    /// start, SGLang admits shorter requests). Plans written before the rule existed read as
    /// refusing.
    #[serde(default)]
    pub long_requests: LongRequests,
    /// How a hybrid model's full-attention and sliding-window layers are kept (vLLM's groups,
    /// SGLang's two pools). Plans written before the rule existed read as vLLM's groups.
    #[serde(default)]
    pub swa_pools: SwaPools,
    /// How the engine weighs its request against the memory free at its start (vLLM refuses a
    /// request above it, SGLang takes its fraction of it). Plans written before the rule
    /// existed read as refusing.
    #[serde(default)]
    pub start_check: StartCheck,
}

impl SizingRules {
    /// The engine release whose rules [`SizingRules::newest`] are: the newest vLLM release
    /// memplan knows. A measured start-up sizes with them unless told otherwise.
    pub const NEWEST_RELEASE: &'static str = "vllm@0.34";

    /// The rules of the newest engine release memplan knows ([`Self::NEWEST_RELEASE`]) for a
    /// deployment of `pipeline_stages` stages: with async scheduling a window keeps the tokens
    /// of `pipeline_stages + 1` batches in flight (`VllmConfig.max_in_flight_tokens`, 0.26
    /// on), capacity as vLLM 0.20.1 on reports it, pages padded (0.24 on), the hybrid
    /// KV-cache manager on, the cache one backing allocation (0.29 on). The release table in
    /// `memplan-model` (`EngineRules`, each rule with its vLLM file) is the source; a test there
    /// keeps this equal to its newest row.
    pub const fn newest(pipeline_stages: u64) -> Self {
        SizingRules {
            in_flight_batches: if pipeline_stages == 0 {
                1
            } else {
                pipeline_stages
            } + 1,
            capacity: Capacity::Concurrency,
            hybrid_manager: true,
            pad_attention_pages: true,
            kv_allocation: KvAllocation::OneBacking,
            long_requests: LongRequests::Refuse,
            swa_pools: SwaPools::Groups,
            start_check: StartCheck::RefuseAboveFree,
        }
    }

    /// The same rules with `batches` in flight (see the field).
    pub const fn with_in_flight_batches(mut self, batches: u64) -> Self {
        self.in_flight_batches = batches;
        self
    }

    /// The same rules reporting capacity as `capacity`.
    pub const fn with_capacity(mut self, capacity: Capacity) -> Self {
        self.capacity = capacity;
        self
    }

    /// The same rules with the hybrid KV-cache manager on or off.
    pub const fn with_hybrid_manager(mut self, on: bool) -> Self {
        self.hybrid_manager = on;
        self
    }

    /// The same rules with attention pages padded to the largest page or not.
    pub const fn with_pad_attention_pages(mut self, on: bool) -> Self {
        self.pad_attention_pages = on;
        self
    }

    /// The same rules with the KV cache allocated as `allocation`.
    pub const fn with_kv_allocation(mut self, allocation: KvAllocation) -> Self {
        self.kv_allocation = allocation;
        self
    }

    /// The same rules with the engine doing `rule` where one request of `max_model_len` does
    /// not fit.
    pub const fn with_long_requests(mut self, rule: LongRequests) -> Self {
        self.long_requests = rule;
        self
    }

    /// The same rules keeping a hybrid model's layers as `pools` says.
    pub const fn with_swa_pools(mut self, pools: SwaPools) -> Self {
        self.swa_pools = pools;
        self
    }

    /// The same rules with the engine weighing its request against the free memory at its
    /// start as `check` says.
    pub const fn with_start_check(mut self, check: StartCheck) -> Self {
        self.start_check = check;
        self
    }
}

impl Default for SizingRules {
    /// vLLM 0.19's rules: one batch in flight, per-group token count, hybrid manager on, one
    /// tensor per layer, refusing to start where one request of `max_model_len` does not fit.
    fn default() -> Self {
        SizingRules {
            in_flight_batches: 1,
            capacity: Capacity::BlocksPerGroup,
            hybrid_manager: true,
            pad_attention_pages: false,
            kv_allocation: KvAllocation::PerTensor,
            long_requests: LongRequests::Refuse,
            swa_pools: SwaPools::Groups,
            start_check: StartCheck::RefuseAboveFree,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::AttentionKind;

    #[test]
    fn sglang_allocates_k_and_v_apart_and_mla_once_per_layer() {
        // Llama-3.1-8B per rank: 32 layers of 8 heads of 128, K and V of one shape.
        let llama = [LayerGroup::new(AttentionKind::Full, 32, 8, 128)];
        // DeepSeek-V2-Lite: 27 layers of one 576-value latent, no V.
        let mla = [LayerGroup::new(AttentionKind::Mla, 27, 1, 576).with_head_dim_v(0)];
        // K of 192, V of 128 (K and V apart even in SGLang 0.5.23).
        let uneven = [LayerGroup::new(AttentionKind::Full, 10, 4, 192).with_head_dim_v(128)];
        let count = |a: KvAllocation| {
            [&llama[..], &mla, &uneven].map(|g| (a.allocations(g), a.equal_tensors_per_layer(g)))
        };
        // vLLM up to 0.28: a tensor per layer; 0.29.0 on: one backing allocation.
        assert_eq!(
            count(KvAllocation::PerTensor),
            [(32, Some(1)), (27, Some(1)), (10, Some(1))]
        );
        assert_eq!(
            count(KvAllocation::OneBacking),
            [(1, Some(1)), (1, Some(1)), (1, Some(1))]
        );
        // SGLang 0.5.1-0.5.22: `k_buffer` and `v_buffer` per layer, `kv_buffer` for MLA.
        assert_eq!(
            count(KvAllocation::SplitKv),
            [(64, Some(2)), (27, Some(1)), (20, None)]
        );
        // SGLang 0.5.23: K and V halves of one tensor where their shapes match.
        assert_eq!(
            count(KvAllocation::PairedKv),
            [(32, Some(1)), (27, Some(1)), (20, None)]
        );
        // Layers that split differently (a recurrent state beside attention) have no one count.
        let hybrid = [
            llama[0].clone(),
            LayerGroup::new(
                AttentionKind::State {
                    bytes: 1 << 20,
                    pages_per_request: 1,
                },
                4,
                0,
                0,
            ),
        ];
        assert_eq!(KvAllocation::SplitKv.allocations(&hybrid), 64 + 4);
        assert_eq!(KvAllocation::SplitKv.equal_tensors_per_layer(&hybrid), None);
        assert_eq!(
            KvAllocation::PerTensor.equal_tensors_per_layer(&hybrid),
            Some(1)
        );
    }

    #[test]
    fn an_engine_that_caps_requests_admits_one_token_less_than_its_pool() {
        // vLLM refuses; SGLang admits `min(context_len - 1, pool - 1)` tokens from a pool of at
        // least 7 tokens (0.5.1 to 0.5.13) or 2 (0.5.14 on).
        assert_eq!(LongRequests::Refuse.longest_admitted(1000, 4096), None);
        let old = LongRequests::CapByPool { least_tokens: 7 };
        let new = LongRequests::CapByPool { least_tokens: 2 };
        assert_eq!(old.longest_admitted(1000, 4096), Some(999));
        assert_eq!(old.longest_admitted(6, 4096), None);
        assert_eq!(new.longest_admitted(6, 4096), Some(5));
        assert_eq!(new.longest_admitted(1, 4096), None);
        assert_eq!(new.longest_admitted(0, 4096), None);
        // Plans written before the rule read as refusing; the rule reads and writes by name.
        let mut v = serde_json::to_value(SizingRules::default()).unwrap();
        assert_eq!(v["long_requests"], "refuse");
        v.as_object_mut().unwrap().remove("long_requests");
        let r: SizingRules = serde_json::from_value(v).unwrap();
        assert_eq!(r.long_requests, LongRequests::Refuse);
        let j = serde_json::to_value(SizingRules::default().with_long_requests(new)).unwrap();
        assert_eq!(
            j["long_requests"],
            serde_json::json!({"cap_by_pool": {"least_tokens": 2}})
        );
    }

    #[test]
    fn an_engine_whose_fraction_is_of_the_free_memory_refuses_no_request() {
        // 80 bytes, a request of 72 (0.9): vLLM refuses 70 free, SGLang takes 0.9 of them.
        assert_eq!(StartCheck::RefuseAboveFree.budget(72, 80, 72), Some(72));
        assert_eq!(StartCheck::RefuseAboveFree.budget(72, 80, 70), None);
        assert_eq!(StartCheck::ShareOfFree.budget(72, 80, 80), Some(72));
        assert_eq!(StartCheck::ShareOfFree.budget(72, 80, 70), Some(63));
        assert_eq!(StartCheck::ShareOfFree.budget(72, 80, 0), Some(0));
        // A request of the whole device: all that is free, never more.
        assert_eq!(StartCheck::ShareOfFree.budget(80, 80, 70), Some(70));
        assert_eq!(
            StartCheck::ShareOfFree.budget(u64::MAX, u64::MAX, 7),
            Some(7)
        );
        // Plans written before the rule read as refusing.
        let mut v = serde_json::to_value(SizingRules::default()).unwrap();
        assert_eq!(v["start_check"], "refuse_above_free");
        v.as_object_mut().unwrap().remove("start_check");
        let r: SizingRules = serde_json::from_value(v).unwrap();
        assert_eq!(r.start_check, StartCheck::RefuseAboveFree);
        let j = SizingRules::default().with_start_check(StartCheck::ShareOfFree);
        assert_eq!(
            serde_json::to_value(j).unwrap()["start_check"],
            "share_of_free"
        );
    }

    /// SGLang's pool (0.5.9 `profile_max_num_token`, 0.5.22 `_profile_available_bytes`): the
    /// free memory after the weights less the free memory at the start times `1 -
    /// mem_fraction_static`. Activations and graphs are not taken from it, and it never refuses
    /// the request for the free memory at the start.
    #[test]
    fn sglangs_pool_is_the_free_memory_after_the_weights_less_its_slack() {
        let check = StartCheck::PoolOfFreeAfterWeights;
        // 100 bytes, a request of 80 (0.8): 90 free at the start, 50 after the weights: the
        // slack is 90 x 0.2 = 18, the pool 32.
        assert_eq!(check.pool_limit(80, 100, 90, 50), Some(32));
        // The slack rounds up (a byte short of the engine's pool rather than over it).
        assert_eq!(check.pool_limit(80, 100, 91, 50), Some(31));
        // Weights that leave less than the slack: an empty pool.
        assert_eq!(check.pool_limit(80, 100, 90, 10), Some(0));
        // The whole device requested: everything free after the weights.
        assert_eq!(check.pool_limit(100, 100, 90, 50), Some(50));
        // It refuses no request for the free memory: the request stands.
        assert_eq!(check.budget(80, 100, 10), Some(80));
        assert_eq!(StartCheck::ShareOfFree.pool_limit(80, 100, 90, 50), None);
        assert_eq!(
            StartCheck::RefuseAboveFree.pool_limit(80, 100, 90, 50),
            None
        );
        let j = SizingRules::default().with_start_check(check);
        assert_eq!(
            serde_json::to_value(j).unwrap()["start_check"],
            "pool_of_free_after_weights"
        );
        // The fraction whose pool holds 32 of those bytes is 0.8 (the slack 18 leaves 32);
        // 33 bytes need a slack of 17 at most: 1 - 17/90 is 0.8111.., 812 thousandths (811
        // would leave ceil(90 x 0.189) = 18).
        assert_eq!(check.thousandths_for_pool(32, 90, 50), Some(800));
        assert_eq!(check.thousandths_for_pool(33, 90, 50), Some(812));
        for k in [800, 812] {
            let slack = (90u64 * (1000 - k)).div_ceil(1000);
            assert!(50 - slack >= if k == 800 { 32 } else { 33 });
        }
        assert_eq!(check.thousandths_for_pool(50, 90, 50), Some(1000));
        assert_eq!(check.thousandths_for_pool(51, 90, 50), None);
        assert_eq!(check.thousandths_for_pool(0, 40, 50), Some(0));
        assert_eq!(
            StartCheck::ShareOfFree.thousandths_for_pool(32, 90, 50),
            None
        );
    }

    /// A plan that reads no free memory after the weights keeps SGLang's older model; the
    /// other rules need no such reading.
    #[test]
    fn without_a_reading_after_the_weights_sglangs_pool_rule_is_its_share_of_the_free_memory() {
        for (check, without) in [
            (StartCheck::PoolOfFreeAfterWeights, StartCheck::ShareOfFree),
            (StartCheck::ShareOfFree, StartCheck::ShareOfFree),
            (StartCheck::RefuseAboveFree, StartCheck::RefuseAboveFree),
        ] {
            assert_eq!(check.without_free_after_weights(), without, "{check:?}");
        }
    }

    #[test]
    fn the_new_rules_read_and_write_by_name() {
        for (a, name) in [
            (KvAllocation::SplitKv, "\"split_kv\""),
            (KvAllocation::PairedKv, "\"paired_kv\""),
        ] {
            assert_eq!(serde_json::to_string(&a).unwrap(), name);
            assert_eq!(serde_json::from_str::<KvAllocation>(name).unwrap(), a);
        }
    }
}
