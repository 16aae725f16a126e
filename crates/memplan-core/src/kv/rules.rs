//! The engine-version-dependent parts of KV sizing, as data: which release of an engine
//! counts what. The tables that fill these in per release live in `memplan-model`'s engine
//! module (with the vLLM file and version of each rule); the core only applies them.

use serde::{Deserialize, Serialize};

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
    /// How the KV cache is allocated (one tensor per layer, or one backing allocation from
    /// vLLM 0.29.0 on). Plans written before the rule existed read as per tensor.
    #[serde(default)]
    pub kv_allocation: KvAllocation,
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
}

impl Default for SizingRules {
    /// vLLM 0.19's rules: one batch in flight, per-group token count, hybrid manager on, one
    /// tensor per layer.
    fn default() -> Self {
        SizingRules {
            in_flight_batches: 1,
            capacity: Capacity::BlocksPerGroup,
            hybrid_manager: true,
            pad_attention_pages: false,
            kv_allocation: KvAllocation::PerTensor,
        }
    }
}
