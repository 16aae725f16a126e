//! Scenario files for `memplan simulate` (TOML; documented in `docs/scenarios.md`).
//!
//! A scenario names a simulated device (a `sim` selector with modifiers), the world around it
//! (other processes, graphics allocations, a neighbour that changes its memory during
//! profiling), the engine's request, the model's memory (weights, activation peak, library
//! workspace), its KV cache and its graphs. The shipped scenarios are embedded in the binary
//! ([`SHIPPED`]) and loadable by name; any other path is read from disk.

use memplan_core::bytes::parse_bytes;
use memplan_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The scenarios shipped with memplan: `(name, TOML)`.
pub const SHIPPED: &[(&str, &str)] = &[
    ("fp8-24g", include_str!("../scenarios/fp8-24g.toml")),
    ("bf16-24g", include_str!("../scenarios/bf16-24g.toml")),
    (
        "deferred-release-24g",
        include_str!("../scenarios/deferred-release-24g.toml"),
    ),
    (
        "process-local-24g",
        include_str!("../scenarios/process-local-24g.toml"),
    ),
    (
        "free-equals-total",
        include_str!("../scenarios/free-equals-total.toml"),
    ),
    (
        "unified-memory-apu",
        include_str!("../scenarios/unified-memory-apu.toml"),
    ),
    (
        "neighbour-frees",
        include_str!("../scenarios/neighbour-frees.toml"),
    ),
    (
        "neighbour-takes",
        include_str!("../scenarios/neighbour-takes.toml"),
    ),
    ("shared-pool", include_str!("../scenarios/shared-pool.toml")),
    (
        "gemma3-27b-80g",
        include_str!("../scenarios/gemma3-27b-80g.toml"),
    ),
];

/// The largest byte quantity a scenario may give (1 PiB).
pub const MAX_SCENARIO_BYTES: u64 = 1 << 50;

/// A byte quantity in a scenario: an integer or a string with a unit (`"512MiB"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ByteValue {
    /// Bytes.
    Int(u64),
    /// With a unit.
    Str(String),
}

impl ByteValue {
    /// The bytes, or an error naming the field. Quantities above [`MAX_SCENARIO_BYTES`] are
    /// errors: no simulated device comes near them, and arithmetic on them could overflow.
    pub fn bytes(&self, field: &str) -> Result<u64> {
        let b = match self {
            ByteValue::Int(b) => *b,
            ByteValue::Str(s) => parse_bytes(field, s)?,
        };
        if b > MAX_SCENARIO_BYTES {
            return Err(Error::invalid(
                field,
                format!("{b} bytes is more than any simulated device holds (at most 1 PiB)"),
            ));
        }
        Ok(b)
    }
}

/// What a byte quantity is, as an error says it.
const BYTE_VALUE: &str =
    "a byte quantity: a whole number of bytes (2147483648) or a string with a unit (\"24GiB\", \"512MiB\")";

/// Read by hand rather than as an untagged enum, whose error ("data did not match any variant
/// of untagged enum ByteValue") says neither what was written nor what a byte quantity is.
impl<'de> Deserialize<'de> for ByteValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = ByteValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(BYTE_VALUE)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<ByteValue, E> {
                Ok(ByteValue::Int(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<ByteValue, E> {
                u64::try_from(v)
                    .map(ByteValue::Int)
                    .map_err(|_| E::custom(format!("{v} is negative; expected {BYTE_VALUE}")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<ByteValue, E> {
                Err(E::custom(format!(
                    "{v:?} is a float; expected {BYTE_VALUE} (a fraction goes in a string with a unit: \"2.5GiB\")"
                )))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<ByteValue, E> {
                Ok(ByteValue::Str(v.to_owned()))
            }
        }
        d.deserialize_any(Visit)
    }
}

fn zero() -> ByteValue {
    ByteValue::Int(0)
}
fn yes() -> bool {
    true
}
fn one() -> u32 {
    1
}
fn sixteen() -> u32 {
    16
}
fn batched() -> u64 {
    8192
}

/// The simulated engine's KV cache (`[engine]`, optional): which of the session's ways to measure
/// its allocation it offers, and how it allocates it. The session is told the allocation (the
/// engine names its release); the default is every hook and a tensor per layer (vLLM 0.19.0).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineToml {
    /// The engine lets the session allocate its KV cache (`Engine::allocate_kv_cache`).
    #[serde(default = "yes")]
    pub kv_hook: bool,
    /// Its allocator offers the session tensors (`AllocatorView::allocate_tensor`), so the
    /// session can measure the plan's layout where the engine offers no hook.
    #[serde(default = "yes")]
    pub allocator_tensors: bool,
    /// How it allocates the cache: `per_tensor` (a tensor per layer, vLLM up to 0.28),
    /// `one_backing` (one buffer, vLLM 0.29.0 on), `split_kv` (a K and a V tensor per layer,
    /// SGLang 0.5.1 to 0.5.22) or `paired_kv` (SGLang 0.5.23).
    #[serde(default)]
    pub kv_allocation: memplan_core::kv::KvAllocation,
    /// What it does at start-up where its KV cache cannot hold one request of `max_model_len`
    /// tokens: `vllm` (it refuses, the default), `sglang_0_5_1` or `sglang_0_5_14` (it starts
    /// and admits shorter requests, from a pool of a least size) ([`StartRule`]).
    #[serde(default)]
    pub start_rule: StartRule,
}

impl Default for EngineToml {
    fn default() -> Self {
        EngineToml {
            kv_hook: true,
            allocator_tensors: true,
            kv_allocation: memplan_core::kv::KvAllocation::PerTensor,
            start_rule: StartRule::Vllm,
        }
    }
}

/// What the simulated engine does at start-up where its KV cache cannot hold one request of
/// `max_model_len` tokens, each as its engine's own source does it (read from the released
/// wheels; the oracle judges a refusal by it, [`crate::oracle::Oracle::has_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum StartRule {
    /// vLLM v1 refuses to start: 0.19.0 `vllm/v1/core/kv_cache_utils.py`,
    /// `get_kv_cache_configs` calls `_check_enough_kv_cache_memory`, which raises "To serve at
    /// least one request with the models's max seq len ..." where one request's pages
    /// (`max_memory_usage_bytes`) exceed the available memory; 0.34.0 the same in
    /// `vllm/v1/core/kv_cache_planning.py` (the null block left out).
    #[default]
    #[serde(rename = "vllm")]
    Vllm,
    /// SGLang 0.5.1 to 0.5.13: `python/sglang/srt/managers/tp_worker.py`,
    /// `TpModelWorker.__init__`: `max_req_len = min(context_len - 1, max_total_num_tokens - 1)`,
    /// `max_req_input_len = max_req_len - 5`, `assert max_req_len > 0 and max_req_input_len >
    /// 0, "Memory pool size is too small"`; a pool shorter than the context is otherwise
    /// served, requests capped at `max_req_len`.
    #[serde(rename = "sglang_0_5_1")]
    Sglang051,
    /// SGLang 0.5.14 on (read in 0.5.14, 0.5.16, 0.5.22, 0.5.23):
    /// `TpModelWorker.alloc_memory_pool` asserts `max_req_len > 0` only (`max_req_len` as
    /// above); 0.5.23's `get_worker_info` logs "KV pool holds N tokens, fewer than
    /// --context-length" and serves.
    #[serde(rename = "sglang_0_5_14")]
    Sglang0514,
}

impl StartRule {
    /// Whether the engine starts with a pool of `pool_tokens` tokens (`max_total_num_tokens`)
    /// that cannot hold one request of `context_len` tokens. vLLM never does; SGLang does
    /// where its own assertions on the longest request hold (see the variants; an empty pool
    /// raises "Not enough memory" before them).
    pub fn starts_short(self, pool_tokens: u64, context_len: u64) -> bool {
        let max_req_len = context_len.min(pool_tokens) as i128 - 1;
        match self {
            StartRule::Vllm => false,
            StartRule::Sglang051 => pool_tokens > 0 && max_req_len > 0 && max_req_len - 5 > 0,
            StartRule::Sglang0514 => pool_tokens > 0 && max_req_len > 0,
        }
    }

    /// Whether the engine's own start-up check refuses a request of `requested` bytes where
    /// `free` bytes are free when it starts, whatever its KV cache would hold.
    ///
    /// vLLM's worker compares the free memory with the request before loading anything:
    /// `vllm/v1/worker/gpu_worker.py` `Worker.init_device` takes a `MemorySnapshot` after the
    /// context and the distributed set-up and calls `request_memory`
    /// (`vllm/v1/worker/utils.py`), which computes `ceil(total_memory *
    /// gpu_memory_utilization)` and raises "Free memory on device ... on startup is less than
    /// desired GPU memory utilization" where `free_memory` is below it (read in 0.19.0 and
    /// 0.29.0; 0.34.0 the same, skipped only with its extensible KV cache, which the
    /// test-bed's engine does not model). vLLM has no byte budget for the whole process
    /// (`--kv-cache-memory-bytes` sizes the cache alone, and the check still reads the
    /// utilisation): the test-bed's engine asked for a byte budget is checked as vLLM checks
    /// the bytes of a utilisation, on the bytes it asks for.
    ///
    /// SGLang compares no request with the free memory: its static fraction is of the memory
    /// free when it starts, so other processes' memory is never requested. 0.5.9
    /// (`srt/model_executor/model_runner.py` `ModelRunner.init_torch_distributed` returns
    /// `min_per_gpu_memory`, the free memory after the distributed set-up, which
    /// `model_runner_kv_cache_mixin.py` `profile_max_num_token` takes as `total_gpu_memory`:
    /// `rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static)`);
    /// 0.5.14 (`pre_model_load_memory`, `_profile_available_bytes`) and 0.5.23
    /// (`srt/distributed/bootstrap.py` `measure_pre_model_load_memory`,
    /// `srt/mem_cache/kv_cache_configurator.py` `_profile_available_bytes`) the same. It
    /// refuses only an empty pool ("Not enough memory", `init_memory_pool` in 0.5.9;
    /// "Loaded weights leave no GPU memory for the KV cache" in 0.5.14 and 0.5.23) and a pool
    /// too short for its least request ([`StartRule::starts_short`]), both judged on the
    /// oracle's pool ([`crate::oracle::Oracle::has_room`]). The memory-balance check across
    /// tensor-parallel ranks ("The memory capacity is unbalanced", a warning unless
    /// `SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK`) does not apply to one device.
    pub fn refuses_at_start(self, requested: u64, free: u64) -> bool {
        match self {
            StartRule::Vllm => requested > free,
            StartRule::Sglang051 | StartRule::Sglang0514 => false,
        }
    }
}

/// A change of the memory other processes hold: before a step (`before`), or between two
/// graph captures (`during` with `after_capture`); exactly one of the two.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighbourChange {
    /// The step it happens before ([`crate::setup::NEIGHBOUR_STEPS`]): `load_weights`,
    /// `profile_run`, `graph_phase` or `plan` (after the graph phase and its teardown) land at
    /// the synchronize that opens the step; `kv_cache` (after the plan, before the KV cache is
    /// allocated), `engine_capture` (after the KV cache, before the engine captures its graphs)
    /// and `serve` (before the serving burst) land at once, after the plan
    /// ([`crate::setup::AFTER_PLAN_STEPS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// The captures it happens between ([`crate::setup::CAPTURE_STEPS`]): `graph_phase` (the
    /// session's graph phase, before the plan) or `engine_capture` (the engine's own capture
    /// after the plan); with `after_capture`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub during: Option<String>,
    /// With `during`: the change lands right after that many captures of the step (1: after
    /// the first), at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_capture: Option<u32>,
    /// What other processes hold from then on.
    pub bytes: ByteValue,
}

impl NeighbourChange {
    /// Other processes hold `bytes` from the synchronize that opens `step` on.
    pub fn before(step: &str, bytes: ByteValue) -> Self {
        NeighbourChange {
            before: Some(step.into()),
            during: None,
            after_capture: None,
            bytes,
        }
    }
}

/// `roundup_power2_divisions` as written: one count for every size interval, or a table of
/// counts by interval (`{ "256" = 4, ">" = 1 }`: the interval that starts at that many MiB, a
/// power of two; `">"` every interval after the last one named), as PyTorch's list form
/// (`[256:4,>:1]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DivisionsToml {
    /// One count for every interval.
    All(u64),
    /// Counts by interval.
    ByInterval(std::collections::BTreeMap<String, u64>),
}

/// The engine's caching-allocator options, pinned (`[allocator]`, optional): what the engine
/// sets in `PYTORCH_ALLOC_CONF` (`PYTORCH_CUDA_ALLOC_CONF`) on every seed, in place of the
/// options the device's physics draw on one seed in four. The engine states them to the
/// session, as it states drawn ones.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatorToml {
    /// `expandable_segments`.
    #[serde(default)]
    pub expandable_segments: bool,
    /// `max_split_size_mb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_split_size_mb: Option<u64>,
    /// `roundup_power2_divisions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roundup_power2_divisions: Option<DivisionsToml>,
    /// `large_segment_size_mb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub large_segment_size_mb: Option<u64>,
    /// `garbage_collection_threshold`, in (0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub garbage_collection_threshold: Option<f64>,
}

/// The engine's request: exactly one of the two.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    /// `--gpu-memory-utilization`.
    pub gpu_memory_utilization: Option<f64>,
    /// An absolute byte budget.
    pub memory_budget: Option<ByteValue>,
}

/// The model's memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Weights.
    pub weights: ByteValue,
    /// Number of weight tensors the weights are loaded as.
    #[serde(default = "one")]
    pub weight_tensors: u32,
    /// Activation peak of the profile run (and of a burst at full concurrency).
    pub activation_peak: ByteValue,
    /// Library workspace taken outside the allocator during the profile run.
    #[serde(default = "zero")]
    pub workspace: ByteValue,
}

/// The attention of a layer group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvAttention {
    /// Full attention: each layer keeps K and V for every token.
    #[default]
    Full,
    /// Sliding-window attention: each layer attends to the last `window` tokens (vLLM
    /// `SlidingWindowSpec`); its pages are those of full attention, what differs is how many a
    /// request holds and how the engine groups the layers.
    Sliding,
    /// Multi-head latent attention (DeepSeek-V2/V3): each layer keeps one latent vector of
    /// `head_dim` values per token (`kv_lora_rank + qk_rope_head_dim`), no separate V, on one
    /// KV head.
    Mla,
}

/// One group of layers of a model with several (`[[kv.groups]]`): gemma-3's sliding and
/// global layers, gpt-oss's alternating sliding and full layers. Every group shares the
/// cache's dtype and block size (`[kv]`), as an engine's cache does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvGroupToml {
    /// `full` (the default), `sliding` or `mla`.
    #[serde(default)]
    pub attention: KvAttention,
    /// Layers of this kind.
    pub layers: u32,
    /// KV heads per layer.
    pub kv_heads: u32,
    /// Head dim (K and V; for MLA the latent's width).
    pub head_dim: u32,
    /// Window in tokens (`sliding` only: the config's `sliding_window`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
}

/// The KV cache: one layer group written in `[kv]` itself (`attention`, `layers`, `kv_heads`,
/// `head_dim`, `window`), or several in `[[kv.groups]]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvToml {
    /// Cache dtype (`bf16`, `fp8`, ...), of every layer.
    pub dtype: String,
    /// The attention of every layer (`full`, the default, `sliding` or `mla`) in the
    /// one-group form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<KvAttention>,
    /// Tokens per block.
    #[serde(default = "sixteen")]
    pub block_size: u32,
    /// Layers (one-group form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// KV heads per layer (one-group form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// Head dim (K and V; for MLA the latent's width; one-group form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    /// Window in tokens of a `sliding` one-group form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Several layer groups, instead of the one-group fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<KvGroupToml>,
    /// Longest request.
    pub max_model_len: u64,
    /// Tokens per scheduler step.
    #[serde(default = "batched")]
    pub max_num_batched_tokens: u64,
}

impl KvToml {
    /// The one-group form of `layers` layers of `attention` (what the generator writes).
    pub fn one_group(
        dtype: &str,
        attention: KvAttention,
        block_size: u32,
        (layers, kv_heads, head_dim): (u32, u32, u32),
        max_model_len: u64,
    ) -> Self {
        KvToml {
            dtype: dtype.into(),
            attention: Some(attention),
            block_size,
            layers: Some(layers),
            kv_heads: Some(kv_heads),
            head_dim: Some(head_dim),
            window: None,
            groups: Vec::new(),
            max_model_len,
            max_num_batched_tokens: 8192,
        }
    }

    /// The layer groups as written: `[[kv.groups]]`, or the one group of the `[kv]` fields.
    /// `Err((field, why))` where the two forms are mixed, a group is missing or a field of the
    /// one-group form is absent. What is wrong within a group is the resolver's to say
    /// ([`Scenario::resolve`](crate::Scenario::resolve)).
    pub fn layer_groups(&self) -> std::result::Result<Vec<KvGroupToml>, (&'static str, String)> {
        if !self.groups.is_empty() {
            for (key, given) in [
                ("kv.attention", self.attention.is_some()),
                ("kv.layers", self.layers.is_some()),
                ("kv.kv_heads", self.kv_heads.is_some()),
                ("kv.head_dim", self.head_dim.is_some()),
                ("kv.window", self.window.is_some()),
            ] {
                if given {
                    return Err((
                        key,
                        "give each layer group's shape in [[kv.groups]], not in [kv] as well"
                            .into(),
                    ));
                }
            }
            return Ok(self.groups.clone());
        }
        let need = |key: &'static str, v: Option<u32>| {
            v.ok_or((
                key,
                "missing: give it, or the layer groups in [[kv.groups]]".into(),
            ))
        };
        Ok(vec![KvGroupToml {
            attention: self.attention.unwrap_or_default(),
            layers: need("kv.layers", self.layers)?,
            kv_heads: need("kv.kv_heads", self.kv_heads)?,
            head_dim: need("kv.head_dim", self.head_dim)?,
            window: self.window,
        }])
    }
}

/// The engine's graphs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphsToml {
    /// Sizes to capture; default: the engine's list `1, 2, 4, 8, 16, ..., max_capture_size`.
    pub sizes: Option<Vec<u32>>,
    /// Largest size of the default list.
    pub max_capture_size: Option<u32>,
    /// Kernel nodes per graph.
    pub kernel_nodes: u32,
    /// Intermediate memory per token of batch (goes to the shared private pool).
    pub intermediate_per_token: ByteValue,
    /// Memory an eager warm-up of one token of batch leaves cached before the capture.
    #[serde(default = "zero")]
    pub warmup_per_token: ByteValue,
    /// Graph allocation-node bytes per graph (block tables, scale buffers).
    #[serde(default = "zero")]
    pub alloc_node_bytes: ByteValue,
    /// Whether the engine can size its KV cache after capture.
    #[serde(default = "yes")]
    pub post_capture: bool,
    /// Whether the engine tells memplan its graphs' kernel-node and allocation-node figures
    /// (`Engine::kernel_nodes_hint` / `alloc_node_bytes_hint`). Off by default: an engine
    /// rarely knows them, and hints that are the simulator's own figures would let the plan
    /// agree with it by construction.
    #[serde(default)]
    pub engine_hints: bool,
}

/// A scenario file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name.
    pub name: String,
    /// What it reproduces.
    #[serde(default)]
    pub description: String,
    /// `sim` selector, e.g. `rtx4090` or `rx7900xtx-rocm6.2,declare-exact,graphics=300MiB`.
    pub device: String,
    /// Calibrate before planning (the automatic choice then uses the calibrated capability).
    #[serde(default = "yes")]
    pub calibrate: bool,
    /// Memory held by other processes at start.
    #[serde(default = "zero")]
    pub other_processes: ByteValue,
    /// Changes of other processes' memory during profiling.
    #[serde(default)]
    pub neighbour: Vec<NeighbourChange>,
    /// The request.
    pub request: RequestSpec,
    /// The model.
    pub model: ModelSpec,
    /// The KV cache.
    pub kv: KvToml,
    /// The graphs.
    pub graphs: GraphsToml,
    /// The engine's KV cache: its hooks and how it allocates it.
    #[serde(default)]
    pub engine: EngineToml,
    /// The engine's caching-allocator options, pinned (drawn per seed where absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorToml>,
}
