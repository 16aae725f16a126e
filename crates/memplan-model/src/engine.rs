//! Engine releases as data: `--engine vllm[@VERSION]` / `--engine sglang[@VERSION]` selects
//! one row of [`VLLM`] (or [`SGLANG`]), the version-dependent rules and defaults of KV sizing.
//! Every rule names the vLLM file it was read from and the release where it changed
//! (`docs/engine-rules.md` has the same table); the figures were read from the released
//! wheels (`pip download vllm==X --no-deps`), 0.19.0 to 0.34.0.
//!
//! A version between two rows takes the older row (rules only change at the listed releases);
//! a version older than the first row or newer than the last is refused with the range.

use std::fmt;
use std::str::FromStr;

use memplan_core::bytes::GIB;
use memplan_core::kv::{
    Capacity, KvAllocation, KvSizing, LongRequests, SizingRules, StartCheck, SwaPools,
};
use memplan_core::{Error, Param, Result};

pub mod coefficients;
pub use coefficients::Coefficients;

/// Which engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// vLLM (v1 engine).
    Vllm,
    /// SGLang.
    Sglang,
}

/// How a hybrid model's recurrent-state layers hold pages per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateMode {
    /// Prefix caching off for hybrids: one page per request (`mamba_cache_mode = "none"`).
    One,
    /// Prefix caching on: `align` mode keeps 2 pages; Mamba2 layers (0.32+) and gated
    /// DeltaNet with checkpoints (0.33+) one more.
    Align,
}

/// Which blocks the start-up log's KV token count ("GPU KV cache size: N tokens", SGLang's
/// "#tokens") counts, against the plan's [`KvSizing::tokens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoggedKvTokens {
    /// The plan's own count. vLLM 0.20.1 on: `int(max_concurrency * max_model_len)` with
    /// `max_concurrency = num_blocks / blocks_per_request`, every block counted
    /// (`v1/core/kv_cache_utils.py` `_report_kv_cache_config`,
    /// `get_max_concurrency_for_kv_cache_config`), which [`Capacity::Concurrency`] sizes
    /// alike. SGLang: "KV Cache is allocated. #tokens" is the pool less its padded page, the
    /// plan's usable count.
    Planned,
    /// Every block, the null block included: `num_blocks // num_groups * block_size`, where
    /// the plan counts `(num_blocks - 1) // num_groups * block_size`. vLLM 0.9.2 to 0.20.0
    /// (`v1/core/kv_cache_utils.py` `_report_kv_cache_config` in 0.16.0, 0.19.0 and 0.20.0;
    /// `_get_kv_cache_config_uniform_type`'s `num_blocks * block_size` and
    /// `_get_kv_cache_config_uniform_page_size` in 0.9.2 and 0.10.0) divides
    /// `KVCacheConfig.num_blocks`, the count `BlockPool` is built with
    /// (`v1/core/kv_cache_coordinator.py`) and takes the null block from afterwards
    /// (`v1/core/block_pool.py` `BlockPool.__init__`: `self.null_block =
    /// self.free_block_queue.popleft()`).
    AllBlocks,
}

/// How the engine counts what is not KV cache after its profile run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NonKvAccounting {
    /// `weights + torch peak increase + non-torch increase` (`utils/mem_utils.py`
    /// `memory_profiling`, vLLM 0.19 to 0.26).
    TorchPeak,
    /// `total consumed (free memory at creation - free memory after the profile run) +
    /// transient peak headroom (torch peak - torch allocated after it)` (the same function,
    /// 0.27 on): persistent buffers outside the weights count once, from the driver.
    Consumed,
    /// SGLang: `mem_fraction_static` covers weights and the KV pool; activations and graphs
    /// live in the rest (`srt/arg_groups/memory_hook.py`).
    StaticFraction,
}

/// Which model runner a release starts a model on by default (`vllm/config/vllm.py`
/// `VllmConfig.use_v2_model_runner` / `_is_default_v2_model_runner_model`). The runners size
/// the KV cache alike but profile differently: the V2 runner (`v1/worker/gpu/model_runner.py`)
/// measures no graph memory before 0.29 (`profile_cudagraph_memory` returns 0) and its dummy
/// sampler keeps a smaller peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunnerDefault {
    /// The V1 runner for every model (V2 only with `VLLM_USE_V2_MODEL_RUNNER=1`).
    V1,
    /// V2 for generating models of the listed architectures that are neither MoE nor
    /// quantized (0.22, 0.23).
    V2Listed(&'static [&'static str]),
    /// V2 for every generating model of the listed architectures (0.24).
    V2Architectures(&'static [&'static str]),
    /// V2 for generating models that are not MoE (or are of the listed architectures), not
    /// hybrid (attention + recurrent state) unless listed (0.27+; 0.25 and 0.26 refuse every
    /// hybrid), and not attention-free.
    V2Dense {
        /// Architectures that run on V2 although MoE or hybrid.
        listed: &'static [&'static str],
        /// Whether a listed hybrid architecture runs on V2 (0.27+).
        listed_hybrids: bool,
    },
    /// V2 for every model (0.29+), except the listed architectures on ROCm.
    V2 {
        /// Architectures that stay on V1 on ROCm.
        rocm_v1: &'static [&'static str],
    },
}

/// One engine release's rules and defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct EngineRules {
    /// Engine.
    pub kind: EngineKind,
    /// The release this row describes (`0.34`).
    pub version: &'static str,
    /// Default tokens per KV block (`CacheConfig.DEFAULT_BLOCK_SIZE`).
    pub block_size: u32,
    /// Default `--gpu-memory-utilization` (without the extensible KV cache).
    pub gpu_memory_utilization: f64,
    /// The CUDA-graph estimate is subtracted from the KV budget
    /// (`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` default 1 from 0.20).
    pub graph_subtracted: bool,
    /// The KV cache is sized after graph capture from measured free memory, at utilisation
    /// 1.0 by default (`enable_extensible_kv_cache`, 0.34, CUDA and ROCm, unless
    /// `--kv-cache-memory-bytes`).
    pub extensible_kv_cache: bool,
    /// Sliding/chunked windows keep one more batch in flight with async scheduling (0.26).
    pub async_in_flight: bool,
    /// Reported capacity formula.
    pub capacity: Capacity,
    /// Which blocks the logged KV token count counts ([`EngineRules::logged_kv_tokens`]).
    pub logged_kv_tokens: LoggedKvTokens,
    /// Non-divisor attention pages are padded (0.24).
    pub pad_attention_pages: bool,
    /// Devices of 160 GiB or more get 16384 batched tokens (0.28, `get_batch_defaults`).
    pub large_device_defaults: bool,
    /// Recurrent-state pages per request.
    pub state_mode: StateMode,
    /// Mamba2 layers keep one more page for their prefill checkpoint (0.32).
    pub mamba2_checkpoint_page: bool,
    /// Nemotron-H's SSM state is float16 where neither `--mamba-ssm-cache-dtype` nor the
    /// config's `mamba_ssm_cache_dtype` names a dtype (0.19: `model_executor/models/config.py`
    /// `NemotronHForCausalLMConfig.verify_and_update_config`, `getattr(hf_config,
    /// "mamba_ssm_cache_dtype", "float16")`); float32 from 0.20.0
    /// (`DEFAULT_MAMBA_SSM_CACHE_DTYPE`). SGLang rows keep float32.
    pub nemotron_h_ssm_float16: bool,
    /// How the profile run's non-KV memory is counted.
    pub non_kv: NonKvAccounting,
    /// Platforms whose graph memory the engine profiles before sizing the KV cache
    /// (`v1/worker/gpu_worker.py` `determine_available_memory`: CUDA only from 0.20, which
    /// skipped ROCm as unreliable; CUDA and ROCm from 0.26, `is_cuda_alike`; XPU too from 0.31).
    /// Elsewhere the estimate is neither measured nor subtracted.
    pub graph_profiled_on: &'static [&'static str],
    /// SGLang's default `mem_fraction_static` is computed from the device
    /// (`memory_hook.py` `_handle_gpu_memory_settings`, 0.5.23) rather than fixed.
    pub computed_static_fraction: bool,
    /// Hybrid (attention + state) block alignment for non-MLA attention: the attention
    /// block is a multiple of this (`_align_hybrid_block_size`: the smallest kernel block or
    /// the default block size, whichever is larger).
    pub hybrid_block_align: u32,
    /// Which models run on the V2 model runner by default.
    pub runner: RunnerDefault,
    /// How the KV cache is allocated: one tensor per layer of a KV-cache group up to 0.28
    /// (`v1/worker/gpu_model_runner.py` `_allocate_kv_cache_tensors`), one backing allocation
    /// of `num_blocks x bytes per block` from 0.29.0 (`v1/worker/utils.py` `allocate_kv_cache`,
    /// both runners). SGLang allocates per-layer buffers (`srt/mem_cache/memory_pool.py`,
    /// `MHATokenToKVPool`): a K and a V tensor per layer up to 0.5.22 (`SplitKv`,
    /// `_create_buffers`; `_create_buffers_normal` in 0.5.16), K and V as halves of one
    /// tensor per layer where their shapes match from 0.5.23 (`PairedKv`); one `kv_buffer` per
    /// layer for MLA (`MLATokenToKVPool._create_buffers`) in both.
    pub kv_allocation: KvAllocation,
    /// The V2 runner profiles graph memory before sizing the KV cache
    /// (`v1/worker/gpu/model_runner.py` `profile_cudagraph_memory`, 0.29+; before, it
    /// returns 0 and nothing is subtracted for graphs on that runner).
    pub v2_profiles_graphs: bool,
    /// What the engine does at start-up when one request of `max_model_len` does not fit in
    /// its KV cache: vLLM refuses (`v1/core/kv_cache_utils.py`, `get_kv_cache_configs` →
    /// `_check_enough_kv_cache_memory`, 0.19.0; the same in `v1/core/kv_cache_planning.py`
    /// and after warm-up in `shrink_kv_cache_configs`, 0.34.0); SGLang starts and admits
    /// requests of at most the pool's tokens less one where the pool holds 7 tokens (0.5.1 to
    /// 0.5.13) or 2 (0.5.14 on) (`srt/managers/tp_worker.py`, `TpModelWorker`: `max_req_len =
    /// min(context_len - 1, max_total_num_tokens - 1)`, see [`LongRequests::CapByPool`]).
    pub long_requests: LongRequests,
    /// How the engine weighs its request against the memory free at its start
    /// ([`StartCheck`]): vLLM refuses a request above it (`vllm/v1/worker/utils.py`
    /// `request_memory`, from `gpu_worker.py` `Worker.init_device`, 0.19.0 to 0.34.0); SGLang's
    /// fraction is of the free memory at its start and it refuses no request for it
    /// (`profile_max_num_token`: `rest = available - total_gpu_memory x (1 -
    /// mem_fraction_static)`, `total_gpu_memory` read before the weights; 0.4.4, 0.5.9, 0.5.14
    /// and 0.5.23 read).
    pub start_check: StartCheck,
    /// The figures the dry run fits on start-up logs for this release group (the activation,
    /// non-torch and graph terms the code does not determine), with the logs they come from.
    pub coefficients: Coefficients,
    /// SGLang before 0.4.9: the model runner multiplies `mem_fraction_static` by this for a
    /// model of one of [`multimodal_architectures`](Self::multimodal_architectures) after the
    /// server arguments are printed (`srt/model_executor/model_runner.py`
    /// `ModelRunner.__init__`: `if self.is_multimodal: self.mem_fraction_static *= 0.95` in
    /// 0.4.4 and 0.4.4.post2, `0.90` in 0.4.5 to 0.4.8). 1.0 elsewhere (0.4.10.post2 and 0.5
    /// adjust the default in `ServerArgs`, which the printed arguments show).
    pub multimodal_fraction: f64,
    /// The architectures [`multimodal_fraction`](Self::multimodal_fraction) applies to
    /// (`srt/configs/model_config.py` `multimodal_model_archs`).
    pub multimodal_architectures: &'static [&'static str],
    /// Sliding-window and chunked-local layers are sized as full-attention layers: SGLang
    /// before 0.4.9 has no sliding-window pool (`srt/mem_cache/memory_pool.py`: MHA, MLA and
    /// DoubleSparse pools only in 0.4.4 to 0.4.8) and `profile_max_num_token` sizes a token as
    /// `kv_heads x head_dim x num_hidden_layers x 2 x dtype bytes`.
    pub windows_as_full: bool,
    /// How a hybrid model's full-attention and sliding-window layers are kept: vLLM's groups,
    /// or SGLang's two pools split as its release splits them ([`SwaPools`]: up to 0.5.13 the
    /// tokens given are every layer's, `set_num_tokens_hybrid_swa` read in 0.5.9; from 0.5.14
    /// they are the full pool's, `HybridSWAPoolConfigurator._solve_pool_sizes` read in 0.5.14,
    /// 0.5.16, 0.5.19, 0.5.21, 0.5.22 and 0.5.23).
    pub swa_pools: SwaPools,
}

const fn v(version: &'static str) -> EngineRules {
    EngineRules {
        kind: EngineKind::Vllm,
        version,
        block_size: 16,
        gpu_memory_utilization: 0.92,
        graph_subtracted: true,
        extensible_kv_cache: false,
        async_in_flight: false,
        capacity: Capacity::Concurrency,
        logged_kv_tokens: LoggedKvTokens::Planned,
        pad_attention_pages: false,
        large_device_defaults: false,
        state_mode: StateMode::One,
        mamba2_checkpoint_page: false,
        nemotron_h_ssm_float16: false,
        non_kv: NonKvAccounting::TorchPeak,
        graph_profiled_on: &["cuda"],
        computed_static_fraction: false,
        hybrid_block_align: 16,
        runner: RunnerDefault::V1,
        kv_allocation: KvAllocation::PerTensor,
        v2_profiles_graphs: false,
        long_requests: LongRequests::Refuse,
        start_check: StartCheck::RefuseAboveFree,
        coefficients: coefficients::VLLM_020_026,
        multimodal_fraction: 1.0,
        multimodal_architectures: &[],
        windows_as_full: false,
        swa_pools: SwaPools::Groups,
    }
}

/// Architectures that run on V2 by default although MoE (0.25, 0.26; `vllm/config/vllm.py`
/// `DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`).
const V2_LISTED_026: &[&str] = &[
    "DeepseekV2ForCausalLM",
    "GraniteMoeForCausalLM",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "LongcatFlashNgramForCausalLM",
    "Qwen2MoeForCausalLM",
];

/// The same list in 0.27 and 0.28 (Kimi K3 and DeepSeek V4 added).
const V2_LISTED_028: &[&str] = &[
    "DeepseekV2ForCausalLM",
    "DeepseekV4ForCausalLM",
    "GraniteMoeForCausalLM",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
    "LongcatFlashNgramForCausalLM",
    "Qwen2MoeForCausalLM",
];

/// 0.29+: every model on V2, except these on ROCm (`ROCM_DEFAULT_MRV1_ARCHITECTURES`).
const V2_ALL: RunnerDefault = RunnerDefault::V2 {
    rocm_v1: &[
        "DeepseekV32ForCausalLM",
        "DeepseekV4ForCausalLM",
        "GlmMoeDsaForCausalLM",
    ],
};

/// vLLM releases older than the first row of [`VLLM`] whose KV sizing was read from their
/// wheels and found to be that row's, rule by rule, so a start-up log of one is planned with
/// it: `(minor release, the release read, what was compared)`. Read in the 0.10.2 and 0.11.0
/// wheels against 0.19.0:
/// - the budget: `requested_memory = total x gpu_memory_utilization` (`v1/worker/gpu_worker.py`
///   `Worker.init_device`; 0.19 rounds it up to a byte, `v1/worker/utils.py` `request_memory`)
///   less `non_kv_cache_memory = weights + torch peak increase + non-torch increase`
///   (`vllm/utils/__init__.py` `memory_profiling`, 0.19 `utils/mem_utils.py`), in
///   `Worker.determine_available_memory`; no graph estimate is subtracted (0.10.2 and 0.11.0
///   have none; 0.19 profiles one but applies it only with
///   `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`): the 0.19 row's `graph_subtracted: false`;
/// - `gpu_memory_utilization` 0.9 and 16-token blocks on CUDA (`vllm/config/cache.py`
///   `CacheConfig`; `platforms/cuda.py` `check_and_update_config` sets a `None` block size to
///   16, 0.19 `CacheConfig.DEFAULT_BLOCK_SIZE`);
/// - blocks `available // page_size // num_layers` (`v1/core/kv_cache_utils.py`
///   `get_num_blocks`), a tensor per layer (`get_kv_cache_config_from_groups`), every worker
///   cut to the fewest blocks, the null block taken from the pool (`v1/core/block_pool.py`
///   `BlockPool.__init__`: `self.null_block = self.free_block_queue.popleft()`);
/// - the logged "GPU KV cache size" `num_blocks // len(kv_cache_groups) * min_block_size`,
///   null block included (`get_kv_cache_config_from_groups` in 0.11.0, `_get_kv_cache_config_*`
///   in 0.10.2; 0.19 `_report_kv_cache_config`): [`LoggedKvTokens::AllBlocks`];
/// - a request of `max_model_len` that does not fit is refused
///   (`check_enough_kv_cache_memory`).
///
/// What differs is outside the KV budget: 0.10.2 defaults to piecewise graphs only
/// (`vllm/config/__init__.py` `VllmConfig.__post_init__`: `cudagraph_mode = PIECEWISE`;
/// `FULL_AND_PIECEWISE` from 0.11.0, as in 0.19), so the graph memory memplan's warning
/// estimates for a 0.10 start-up is the larger full-and-piecewise capture's; and 0.10.2 takes
/// its memory snapshot before it sets up the distributed environment (`Worker.init_device`),
/// so NCCL's buffers count in its non-torch figure, as 0.19's fitted coefficients count them.
/// Hybrid (attention + Mamba) models were not compared.
pub const VLLM_OLDER_AS_FIRST_ROW: &[(&str, &str, &str)] = &[
    (
        "0.10",
        "0.10.2",
        "the same KV budget, block size, block count and logged token count as 0.19 (`v1/worker/gpu_worker.py` `determine_available_memory`, `v1/core/kv_cache_utils.py`); its graphs are piecewise only by default (`cudagraph_mode` PIECEWISE), so the graph memory estimated outside the budget is of a larger capture than its own",
    ),
    (
        "0.11",
        "0.11.0",
        "the same KV budget, block size, block count and logged token count as 0.19 (`v1/worker/gpu_worker.py` `determine_available_memory`, `v1/core/kv_cache_utils.py`)",
    ),
];

const CUDA_ROCM: &[&str] = &["cuda", "rocm"];
const CUDA_ROCM_XPU: &[&str] = &["cuda", "rocm", "xpu"];

/// Architectures vLLM runs in `'all'` Mamba cache mode when prefix caching is on (classes
/// that implement `SupportsMambaPrefixCaching`, 0.20.0 `model_executor/models`), unless
/// speculative decoding is on too (`align` then).
pub const MAMBA_PREFIX_CACHING: &[&str] = &[
    "BambaForCausalLM",
    "FalconH1ForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "JambaForCausalLM",
    "Mamba2ForCausalLM",
    "MambaForCausalLM",
    "NemotronHForCausalLM",
    "Zamba2ForCausalLM",
];

/// vLLM releases where a sizing rule changed, oldest first.
pub const VLLM: &[EngineRules] = &[
    EngineRules {
        gpu_memory_utilization: 0.9,
        graph_subtracted: false,
        capacity: Capacity::BlocksPerGroup,
        logged_kv_tokens: LoggedKvTokens::AllBlocks,
        nemotron_h_ssm_float16: true,
        coefficients: coefficients::VLLM_019,
        ..v("0.19")
    },
    EngineRules {
        capacity: Capacity::BlocksPerGroup,
        logged_kv_tokens: LoggedKvTokens::AllBlocks,
        ..v("0.20.0")
    },
    v("0.20.1"),
    EngineRules {
        runner: RunnerDefault::V2Listed(&["Qwen3ForCausalLM"]),
        ..v("0.22")
    },
    EngineRules {
        runner: RunnerDefault::V2Listed(&[
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "Qwen3ForCausalLM",
        ]),
        ..v("0.23")
    },
    EngineRules {
        pad_attention_pages: true,
        runner: RunnerDefault::V2Architectures(&[
            "Qwen3ForCausalLM",
            "DeepseekV2ForCausalLM",
            "Qwen2MoeForCausalLM",
            "GraniteMoeForCausalLM",
            "LlamaForCausalLM",
            "MistralForCausalLM",
        ]),
        ..v("0.24")
    },
    EngineRules {
        pad_attention_pages: true,
        runner: RunnerDefault::V2Dense {
            listed: V2_LISTED_026,
            listed_hybrids: false,
        },
        ..v("0.25")
    },
    EngineRules {
        pad_attention_pages: true,
        async_in_flight: true,
        state_mode: StateMode::Align,
        graph_profiled_on: CUDA_ROCM,
        runner: RunnerDefault::V2Dense {
            listed: V2_LISTED_026,
            listed_hybrids: false,
        },
        ..v("0.26")
    },
    EngineRules {
        pad_attention_pages: true,
        async_in_flight: true,
        state_mode: StateMode::Align,
        graph_profiled_on: CUDA_ROCM,
        non_kv: NonKvAccounting::Consumed,
        runner: RunnerDefault::V2Dense {
            listed: V2_LISTED_028,
            listed_hybrids: true,
        },
        coefficients: coefficients::VLLM_027_028,
        ..v("0.27")
    },
    EngineRules {
        pad_attention_pages: true,
        async_in_flight: true,
        state_mode: StateMode::Align,
        large_device_defaults: true,
        graph_profiled_on: CUDA_ROCM,
        non_kv: NonKvAccounting::Consumed,
        runner: RunnerDefault::V2Dense {
            listed: V2_LISTED_028,
            listed_hybrids: true,
        },
        coefficients: coefficients::VLLM_027_028,
        ..v("0.28")
    },
    EngineRules {
        pad_attention_pages: true,
        async_in_flight: true,
        state_mode: StateMode::Align,
        large_device_defaults: true,
        graph_profiled_on: CUDA_ROCM,
        non_kv: NonKvAccounting::Consumed,
        runner: V2_ALL,
        v2_profiles_graphs: true,
        kv_allocation: KvAllocation::OneBacking,
        coefficients: coefficients::VLLM_029_034,
        ..v("0.29")
    },
    // 0.31: XPU joins the platforms whose graph memory is profiled and subtracted
    // (`determine_available_memory`: `is_cuda_alike() or is_xpu()`).
    EngineRules {
        pad_attention_pages: true,
        async_in_flight: true,
        state_mode: StateMode::Align,
        large_device_defaults: true,
        graph_profiled_on: CUDA_ROCM_XPU,
        non_kv: NonKvAccounting::Consumed,
        runner: V2_ALL,
        v2_profiles_graphs: true,
        kv_allocation: KvAllocation::OneBacking,
        coefficients: coefficients::VLLM_029_034,
        ..v("0.31")
    },
    EngineRules {
        pad_attention_pages: true,
        async_in_flight: true,
        state_mode: StateMode::Align,
        large_device_defaults: true,
        mamba2_checkpoint_page: true,
        graph_profiled_on: CUDA_ROCM_XPU,
        non_kv: NonKvAccounting::Consumed,
        runner: V2_ALL,
        v2_profiles_graphs: true,
        kv_allocation: KvAllocation::OneBacking,
        coefficients: coefficients::VLLM_029_034,
        ..v("0.32")
    },
    EngineRules {
        block_size: 64,
        extensible_kv_cache: true,
        pad_attention_pages: true,
        async_in_flight: true,
        state_mode: StateMode::Align,
        large_device_defaults: true,
        mamba2_checkpoint_page: true,
        graph_profiled_on: CUDA_ROCM_XPU,
        non_kv: NonKvAccounting::Consumed,
        hybrid_block_align: 64,
        runner: V2_ALL,
        v2_profiles_graphs: true,
        kv_allocation: KvAllocation::OneBacking,
        coefficients: coefficients::VLLM_029_034,
        ..v("0.34")
    },
];

/// SGLang 0.5.1 to 0.5.13 (the first 0.5 row of [`SGLANG`]).
const SGLANG_0_5: EngineRules = EngineRules {
    kind: EngineKind::Sglang,
    block_size: 1,
    gpu_memory_utilization: 0.88,
    capacity: Capacity::BlocksPerGroup,
    non_kv: NonKvAccounting::StaticFraction,
    graph_profiled_on: &[],
    // `srt/mem_cache/memory_pool.py` `MHATokenToKVPool._create_buffers` (0.5.1, 0.5.9;
    // `_create_buffers_normal` 0.5.16, 0.5.19, 0.5.21, 0.5.22): `k_buffer` and `v_buffer`, one
    // `torch.zeros((size + page_size, head_num, head_dim))` per layer each.
    kv_allocation: KvAllocation::SplitKv,
    // `srt/managers/tp_worker.py` `TpModelWorker.__init__` (0.5.1, 0.5.9, 0.5.13): `assert
    // self.max_req_len > 0 and self.max_req_input_len > 0`, `max_req_input_len =
    // max_req_len - 5`: a pool of 7 tokens at least.
    long_requests: LongRequests::CapByPool { least_tokens: 7 },
    // The pool is the free memory read once the weights are loaded less the free memory read
    // before them times `1 - mem_fraction_static`, and no request is compared with the free
    // memory (`StartCheck::PoolOfFreeAfterWeights`), in every release of this table (read in
    // each wheel): 0.4.4 and 0.4.8 `srt/model_executor/model_runner.py`
    // `ModelRunner.profile_max_num_token` (`rest_memory = available_gpu_memory -
    // total_gpu_memory * (1 - self.mem_fraction_static)`, `available_gpu_memory` read after
    // `load_model`, `total_gpu_memory` the `min_per_gpu_memory` of `init_torch_distributed`,
    // passed on by `init_memory_pool`); 0.5.1 the same; 0.5.9
    // `model_runner_kv_cache_mixin.py` `profile_max_num_token`; 0.5.13 and 0.5.14
    // `model_runner_kv_cache_mixin.py` `_profile_available_bytes` (`post_model_load_memory -
    // pre_model_load_memory * (1 - self.mem_fraction_static)`); 0.5.22 and 0.5.23
    // `srt/mem_cache/kv_cache_configurator.py` `_profile_available_bytes` (`slack_gb =
    // pre_model_load_memory * (1 - mem_fraction_static)`, `pre_model_load_memory` from
    // `srt/distributed/bootstrap.py` `measure_pre_model_load_memory`). A plan that reads no
    // free memory after the weights (the dry run) takes the older model,
    // `StartCheck::ShareOfFree` (`StartCheck::without_free_after_weights`).
    start_check: StartCheck::PoolOfFreeAfterWeights,
    coefficients: coefficients::SGLANG,
    // `model_executor/model_runner_kv_cache_mixin.py` `set_num_tokens_hybrid_swa` (0.5.9).
    swa_pools: SwaPools::SglangEveryLayer,
    ..v("0.5")
};

/// `multimodal_model_archs` of SGLang 0.4.4.post2 (`srt/configs/model_config.py`; 0.4.4's
/// list lacks Gemma 3, which that release could not load).
const SGLANG_MULTIMODAL_044: &[&str] = &[
    "DeepseekVL2ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "Grok1VForCausalLM",
    "Grok1AForCausalLM",
    "LlavaLlamaForCausalLM",
    "LlavaMistralForCausalLM",
    "LlavaQwenForCausalLM",
    "LlavaVidForCausalLM",
    "MiniCPMO",
    "MiniCPMV",
    "MultiModalityCausalLM",
    "MllamaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
];

/// `multimodal_model_archs` of SGLang 0.4.8 (0.4.6's is a subset of it).
const SGLANG_MULTIMODAL_048: &[&str] = &[
    "CLIPModel",
    "DeepseekVL2ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "Grok1VForCausalLM",
    "Grok1AForCausalLM",
    "LlavaLlamaForCausalLM",
    "Llama4ForConditionalGeneration",
    "LlavaMistralForCausalLM",
    "LlavaQwenForCausalLM",
    "LlavaForConditionalGeneration",
    "LlavaVidForCausalLM",
    "MiniCPMO",
    "MiniCPMV",
    "Mistral3ForConditionalGeneration",
    "MultiModalityCausalLM",
    "MllamaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "KimiVLForConditionalGeneration",
    "InternVLChatModel",
    "Phi4MMForCausalLM",
    "VILAForConditionalGeneration",
];

/// SGLang 0.4.4 (read in the 0.4.4 and 0.4.4.post2 wheels): the 0.5 row's pool
/// (`model_runner.py` `profile_max_num_token`: `rest = available - total x (1 -
/// mem_fraction_static)`, `max_total_num_tokens = rest // cell_size`, floored to pages; a K and
/// a V buffer per layer, `MHATokenToKVPool._create_buffers`), but every layer is sized as full
/// attention ([`EngineRules::windows_as_full`]) and a multimodal model's fraction is cut by
/// 0.95 after the arguments are printed ([`EngineRules::multimodal_fraction`]).
const SGLANG_0_4_4: EngineRules = EngineRules {
    version: "0.4.4",
    multimodal_fraction: 0.95,
    multimodal_architectures: SGLANG_MULTIMODAL_044,
    windows_as_full: true,
    swa_pools: SwaPools::Groups,
    ..SGLANG_0_5
};

/// Architectures whose sliding-window layers SGLang keeps in its one pool as full-attention
/// layers, its hybrid pools turned off (`disable_hybrid_swa_memory = True`, "Disable hybrid SWA
/// memory for ... as it is not yet supported"): `ServerArgs._handle_model_specific_adjustments`
/// in 0.5.9 and 0.5.14, `arg_groups/model_overrides/gemma2_gemma3.py` in 0.5.22 and 0.5.23.
pub const SGLANG_ONE_POOL_ARCHITECTURES: &[&str] = &[
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "Gemma3nForCausalLM",
    "Gemma3nForConditionalGeneration",
];

/// SGLang releases between memplan's 0.4 rows and its 0.5 rows whose rules it does not hold:
/// `(first, end)`, `end` excluded. 0.4.9 (read) and 0.4.10.post2 (read) already have a
/// sliding-window pool (`srt/mem_cache/memory_pool.py` `SWAKVPool`) and no multimodal cut in
/// `ModelRunner.__init__` (0.4.10.post2 cuts the default in
/// `ServerArgs.adjust_mem_fraction_for_vlm`, which the printed arguments show).
pub const SGLANG_UNREAD: (&str, &str) = ("0.4.9", "0.5");

/// When the SGLang releases that begin a rule change were published (`(release, date)`, the
/// wheel's build date, oldest first): an SGLang log dated before one was written by an older
/// release. 0.4.5 cut a multimodal fraction by 0.90 rather than 0.95; 0.4.9 brought the
/// sliding-window pool ([`SGLANG_UNREAD`]).
pub const SGLANG_PUBLISHED: &[(&str, &str)] = &[("0.4.5", "2025-04-07"), ("0.4.9", "2025-07-06")];

/// SGLang: one token per page (`--page-size 1`), a token pool rather than blocks, the
/// static fraction taking graphs and activations (`mem_fraction_static`). Sized as one
/// group of one-token pages; windows and states as vLLM's 0.19 rules from 0.5 (before, every
/// attention layer full).
pub const SGLANG: &[EngineRules] = &[
    SGLANG_0_4_4,
    // 0.4.5 to 0.4.8 (read in 0.4.5, 0.4.6, 0.4.7 and 0.4.8): the multimodal cut is 0.90.
    EngineRules {
        version: "0.4.5",
        multimodal_fraction: 0.90,
        multimodal_architectures: SGLANG_MULTIMODAL_048,
        ..SGLANG_0_4_4
    },
    SGLANG_0_5,
    // 0.5.14: only `max_req_len > 0` is asserted (`TpModelWorker.alloc_memory_pool`): a pool of
    // 2 tokens starts. The rest as 0.5.1.
    // Its hybrid pools take `--max-total-tokens` as the full pool's
    // (`model_executor/pool_configurator.py` `HybridSWAPoolConfigurator._solve_pool_sizes`).
    EngineRules {
        version: "0.5.14",
        long_requests: LongRequests::CapByPool { least_tokens: 2 },
        swa_pools: SwaPools::SglangFullPool,
        ..SGLANG_0_5
    },
    // 0.5.23 (the newest on PyPI when read): the default fraction is computed per device
    // (`srt/arg_groups/memory_hook.py` `_handle_gpu_memory_settings`), page size 1, K and V
    // halves of one `torch.zeros((2, padded, head_num, head_dim))` per layer where their
    // shapes match (`MHATokenToKVPool._create_buffers_normal`).
    EngineRules {
        version: "0.5.23",
        computed_static_fraction: true,
        kv_allocation: KvAllocation::PairedKv,
        long_requests: LongRequests::CapByPool { least_tokens: 2 },
        swa_pools: SwaPools::SglangFullPool,
        ..SGLANG_0_5
    },
];

fn parse_version(s: &str) -> Option<Vec<u32>> {
    let parts: Option<Vec<u32>> = s.split('.').map(|p| p.parse().ok()).collect();
    parts.filter(|p| !p.is_empty() && p.len() <= 3)
}

impl EngineRules {
    /// The fraction the engine sizes its pool with for a model of `architecture` started with
    /// `fraction`: cut by [`multimodal_fraction`](Self::multimodal_fraction) for the
    /// release's multimodal architectures (SGLang before 0.4.9), else `fraction`.
    pub fn static_fraction(&self, architecture: &str, fraction: f64) -> f64 {
        if self.multimodal_architectures.contains(&architecture) {
            fraction * self.multimodal_fraction
        } else {
            fraction
        }
    }

    /// Whether the engine sizes a model of `architecture`'s sliding-window layers as
    /// full-attention layers: [`windows_as_full`](Self::windows_as_full), or SGLang's two pools
    /// turned off for the architectures of [`SGLANG_ONE_POOL_ARCHITECTURES`].
    pub fn windows_as_full_for(&self, architecture: &str) -> bool {
        self.windows_as_full
            || (self.swa_pools != SwaPools::Groups
                && SGLANG_ONE_POOL_ARCHITECTURES.contains(&architecture))
    }

    /// The newest vLLM release memplan knows (the default engine).
    pub fn newest_vllm() -> &'static EngineRules {
        VLLM.last().expect("table is not empty")
    }

    /// The sizing rules for a deployment with `pipeline_parallel` stages.
    pub fn sizing(&self, pipeline_parallel: u64, hybrid_manager: bool) -> SizingRules {
        SizingRules::default()
            .with_in_flight_batches(pipeline_parallel.max(1) + u64::from(self.async_in_flight))
            .with_capacity(self.capacity)
            .with_hybrid_manager(hybrid_manager)
            .with_pad_attention_pages(self.pad_attention_pages)
            .with_kv_allocation(self.kv_allocation)
            .with_long_requests(self.long_requests)
            .with_swa_pools(self.swa_pools)
            .with_start_check(self.start_check)
    }

    /// Default (`max_num_seqs`, `max_num_batched_tokens`) of the OpenAI API server for a
    /// device of `total` bytes named `device` (`EngineArgs.get_batch_defaults`): 1024 / 8192
    /// on devices of 70 GiB or more except A100s, 1024 / 16384 from 160 GiB (0.28+), else
    /// 256 / 2048.
    pub fn batch_defaults(&self, total: u64, device: &str) -> (u64, u64) {
        if self.kind == EngineKind::Sglang {
            return (if total >= 70 * GIB { 1024 } else { 256 }, 16384);
        }
        if self.large_device_defaults && total >= 160 * GIB {
            (1024, 16384)
        } else if total >= 70 * GIB && !device.to_ascii_lowercase().contains("a100") {
            (1024, 8192)
        } else {
            (256, 2048)
        }
    }

    /// The KV token count this release's start-up log prints for a cache sized `kv`
    /// ([`LoggedKvTokens`]): `kv.tokens`, or every block's tokens, the null block included
    /// (vLLM up to 0.20.0; the smallest group block size is the spec's, `kv.block_size`).
    pub fn logged_kv_tokens(&self, kv: &KvSizing) -> u64 {
        match self.logged_kv_tokens {
            LoggedKvTokens::Planned => kv.tokens,
            LoggedKvTokens::AllBlocks => {
                (kv.num_blocks / kv.num_groups.max(1)).saturating_mul(kv.block_size)
            }
        }
    }

    /// Whether the engine profiles graph memory and subtracts it from the KV budget on
    /// `platform` (a backend name: `cuda`, `rocm`, `xpu`; `None` when unknown, taken as CUDA).
    pub fn subtracts_graphs_on(&self, platform: Option<&str>) -> bool {
        self.graph_subtracted && self.graph_profiled_on.contains(&platform.unwrap_or("cuda"))
    }

    /// The default utilisation on a device of `total` bytes with `tp` x `pp` ranks. vLLM: the
    /// release's fixed default (the extensible KV cache's 1.0 is the caller's: it depends on
    /// free memory). SGLang 0.5.23: `(total - reserved) / total` rounded to 3 decimals, with
    /// `reserved` (MiB) = 512 + 1.5 x max(chunked prefill, 2048) + tp x pp / 8 x 1024 + 2 x
    /// the largest decode graph batch, at least 10 GiB on devices above 60 GiB; chunked
    /// prefill and the decode batch by device size as `_handle_gpu_memory_settings` sets them.
    pub fn default_utilization(&self, total: u64, tp: u64, pp: u64) -> f64 {
        if !self.computed_static_fraction {
            return self.gpu_memory_utilization;
        }
        let mib = (total / (1 << 20)) as f64;
        let small_tp = tp < 4;
        let (chunk, max_bs) = match mib {
            m if m < 20.0 * 1024.0 => (2048.0, 8.0),
            m if m < 35.0 * 1024.0 => (4096.0, if small_tp { 48.0 } else { 160.0 }),
            m if m < 60.0 * 1024.0 => (4096.0, if small_tp { 32.0 } else { 160.0 }),
            m if m < 160.0 * 1024.0 => (8192.0, if small_tp { 256.0 } else { 512.0 }),
            _ => (16384.0, 512.0),
        };
        let mut reserved = 512.0
            + 1.5 * f64::max(chunk, 2048.0)
            + (tp.max(1) * pp.max(1)) as f64 / 8.0 * 1024.0
            + 2.0 * max_bs;
        if mib > 60.0 * 1024.0 {
            reserved = reserved.max(10.0 * 1024.0);
        }
        let f = ((mib - reserved) / mib * 1000.0).round() / 1000.0;
        if f.is_finite() && f > 0.0 && f <= 1.0 {
            f
        } else {
            self.gpu_memory_utilization
        }
    }

    /// Whether the release starts a model of `architecture` on the V2 model runner by default.
    /// `moe`, `quantized`, `hybrid` (attention and recurrent-state layers) and
    /// `attention_free` describe the model; `platform` is the backend (`rocm` matters from
    /// 0.29; `None` is CUDA).
    pub fn runs_v2(
        &self,
        architecture: &str,
        moe: bool,
        quantized: bool,
        hybrid: bool,
        attention_free: bool,
        platform: Option<&str>,
    ) -> bool {
        if self.kind != EngineKind::Vllm {
            return false;
        }
        match self.runner {
            RunnerDefault::V1 => false,
            RunnerDefault::V2Listed(archs) => archs.contains(&architecture) && !moe && !quantized,
            RunnerDefault::V2Architectures(archs) => archs.contains(&architecture),
            RunnerDefault::V2Dense {
                listed,
                listed_hybrids,
            } => {
                let is_listed = listed.contains(&architecture);
                if attention_free || (hybrid && !(listed_hybrids && is_listed)) {
                    return false;
                }
                is_listed || !moe
            }
            RunnerDefault::V2 { rocm_v1 } => {
                !(platform == Some("rocm") && rocm_v1.contains(&architecture))
            }
        }
    }

    /// Whether graph memory is profiled and subtracted from the KV budget on `platform` for a
    /// model the release runs on the V2 runner (`v2`) or the V1 runner.
    pub fn subtracts_graphs_for(&self, platform: Option<&str>, v2: bool) -> bool {
        self.subtracts_graphs_on(platform) && (!v2 || self.v2_profiles_graphs)
    }

    /// Pages per request of a recurrent-state layer (`MambaSpec.max_memory_usage_bytes`).
    pub fn state_pages(&self, mamba2: bool) -> u64 {
        self.state_pages_with(mamba2, None)
    }

    /// [`state_pages`](Self::state_pages) with prefix caching as vLLM's
    /// `--enable-prefix-caching` / `--no-enable-prefix-caching` set it (`None`: the release's
    /// default, [`state_mode`](Self::state_mode)): off, one page per request (`mamba_cache_mode`
    /// `none`); on, `align` mode's two (`MambaSpec.max_memory_usage_bytes`: `page_size_bytes *
    /// (2 + num_speculative_blocks)`, 0.19.0 and 0.23.0 `v1/kv_cache_interface.py`), which
    /// `MambaModelConfig.verify_and_update_config` chooses for models without Mamba prefix
    /// caching (0.20.0 `model_executor/models/config.py`).
    pub fn state_pages_with(&self, mamba2: bool, prefix_caching: Option<bool>) -> u64 {
        let mode = match prefix_caching {
            None => self.state_mode,
            Some(false) => StateMode::One,
            Some(true) => StateMode::Align,
        };
        match mode {
            StateMode::One => 1,
            StateMode::Align => 2 + u64::from(mamba2 && self.mamba2_checkpoint_page),
        }
    }
}

impl fmt::Display for EngineRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        };
        write!(f, "{name}@{}", self.version)
    }
}

impl FromStr for EngineRules {
    type Err = Error;
    /// `vllm`, `vllm@0.19`, `vllm@0.34.0`, `sglang`, `sglang@0.5.23`.
    fn from_str(s: &str) -> Result<Self> {
        let (name, version) = match s.split_once('@') {
            Some((n, v)) => (n, Some(v)),
            None => (s, None),
        };
        let table = match name.to_ascii_lowercase().as_str() {
            "vllm" => VLLM,
            "sglang" => SGLANG,
            other => {
                return Err(Error::param(
                    Param::Engine,
                    format!(
                        "unknown engine {other:?}; expected vllm[@VERSION] or sglang[@VERSION]"
                    ),
                ))
            }
        };
        let range = format!(
            "{name} {} to {}",
            table[0].version,
            table.last().expect("table is not empty").version
        );
        let Some(version) = version else {
            return Ok(table.last().expect("table is not empty").clone());
        };
        let want = parse_version(version).ok_or_else(|| {
            Error::param(
                Param::Engine,
                format!("{version:?} is not a version (e.g. {name}@0.19); memplan knows {range}"),
            )
        })?;
        let row = |r: &EngineRules| parse_version(r.version).unwrap_or_default();
        if table[0].kind == EngineKind::Sglang {
            let (first, end) = (
                parse_version(SGLANG_UNREAD.0).unwrap_or_default(),
                parse_version(SGLANG_UNREAD.1).unwrap_or_default(),
            );
            if want >= first && want < end {
                return Err(Error::param(
                    Param::Engine,
                    format!(
                        "{name}@{version} is between memplan's SGLang 0.4 rows and its 0.5 rows ({} up to {}: not read; 0.4.10.post2 already has a sliding-window pool); memplan knows {range}",
                        SGLANG_UNREAD.0, SGLANG_UNREAD.1
                    ),
                ));
            }
        }
        // Compare on the components the user gave: `0.20` matches 0.20.x's first row.
        let cmp = |r: &EngineRules| {
            let mut have = row(r);
            have.truncate(want.len());
            have
        };
        // A release newer than the last row is refused, except a patch release of the last
        // row's minor version (`0.34.1` of a `0.34` row): rules change at minor releases, and
        // a patch release keeps its minor's rules (the plan's notes say so).
        let last = row(table.last().expect("table is not empty"));
        if want[..want.len().min(last.len())] > last[..want.len().min(last.len())] {
            return Err(Error::param(
                Param::Engine,
                format!("{name}@{version} is newer than memplan's rules; memplan knows {range}"),
            ));
        }
        table
            .iter()
            .rev()
            .find(|r| cmp(r) <= want)
            .cloned()
            .ok_or_else(|| {
                Error::param(
                    Param::Engine,
                    format!(
                        "{name}@{version} is older than memplan's rules; memplan knows {range}"
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_select_the_row_in_force() {
        let e: EngineRules = "vllm".parse().unwrap();
        assert_eq!((e.version, e.block_size), ("0.34", 64));
        assert_eq!("vllm@0.19".parse::<EngineRules>().unwrap().version, "0.19");
        assert_eq!(
            "vllm@0.19.1".parse::<EngineRules>().unwrap().version,
            "0.19"
        );
        assert_eq!(
            "vllm@0.20.2".parse::<EngineRules>().unwrap().version,
            "0.20.1"
        );
        assert_eq!(
            "vllm@0.27.1".parse::<EngineRules>().unwrap().version,
            "0.27"
        );
        assert_eq!(
            "vllm@0.26.3".parse::<EngineRules>().unwrap().version,
            "0.26"
        );
        // A patch release of the newest row is that row.
        assert_eq!(
            "vllm@0.34.1".parse::<EngineRules>().unwrap().version,
            "0.34"
        );
        assert_eq!(
            "sglang@0.5.23".parse::<EngineRules>().unwrap().version,
            "0.5.23"
        );
        assert_eq!(
            "sglang@0.5.9".parse::<EngineRules>().unwrap().version,
            "0.5"
        );
        assert_eq!(
            "sglang@0.5.22".parse::<EngineRules>().unwrap().version,
            "0.5.14"
        );
        assert!("sglang@0.5.24".parse::<EngineRules>().is_err());
        // SGLang before 0.5: 0.4.4 (x 0.95 for multimodal models), 0.4.5 to 0.4.8 (x 0.90),
        // no sliding-window pool in either; 0.4.9 to 0.4.x not held; older refused.
        for (want, row, cut) in [
            ("sglang@0.4.4", "0.4.4", 0.95),
            ("sglang@0.4.5", "0.4.5", 0.90),
            ("sglang@0.4.8", "0.4.5", 0.90),
        ] {
            let r = want.parse::<EngineRules>().unwrap();
            assert_eq!((r.version, r.multimodal_fraction), (row, cut), "{want}");
            assert!(r.windows_as_full);
            assert_eq!(
                r.static_fraction("Gemma3ForConditionalGeneration", 0.88),
                0.88 * cut
            );
            assert_eq!(r.static_fraction("LlamaForCausalLM", 0.88), 0.88);
        }
        for e in ["sglang@0.4.9", "sglang@0.4.10"] {
            assert!(e
                .parse::<EngineRules>()
                .unwrap_err()
                .to_string()
                .contains("between memplan's SGLang 0.4 rows and its 0.5 rows"));
        }
        assert!("sglang@0.4.3"
            .parse::<EngineRules>()
            .unwrap_err()
            .to_string()
            .contains("older than memplan's rules"));
        let r = "sglang@0.5.1".parse::<EngineRules>().unwrap();
        assert!(!r.windows_as_full);
        assert_eq!(
            r.static_fraction("Gemma3ForConditionalGeneration", 0.88),
            0.88
        );
        assert_eq!(
            "vllm@0.33.0".parse::<EngineRules>().unwrap().version,
            "0.32"
        );
        assert_eq!(
            "VLLM@0.34".parse::<EngineRules>().unwrap().to_string(),
            "vllm@0.34"
        );
        for bad in [
            "vllm@0.18",
            "vllm@0.35",
            "vllm@0.35.0",
            "vllm@1",
            "sglang@0.6.1",
            "vllm@x",
            "tgi",
            "vllm@1.2.3.4",
            "vllm@",
            "vllm@0..34",
            "vllm@-0.34",
            "vllm@99999999999999999999",
        ] {
            let e = bad.parse::<EngineRules>().unwrap_err().to_string();
            assert!(e.starts_with("engine release: "), "{e}");
            assert!(matches!(
                bad.parse::<EngineRules>(),
                Err(Error::InvalidParam {
                    param: Param::Engine,
                    ..
                })
            ));
        }
        assert_eq!("sglang".parse::<EngineRules>().unwrap().block_size, 1);
    }

    #[test]
    fn batch_defaults_follow_the_device() {
        // `EngineArgs.get_batch_defaults`, vLLM 0.34: A100 exception, 160 GiB tier.
        let e = EngineRules::newest_vllm();
        assert_eq!(
            e.batch_defaults(80 * GIB, "NVIDIA H100 80GB HBM3"),
            (1024, 8192)
        );
        assert_eq!(
            e.batch_defaults(80 * GIB, "NVIDIA A100-SXM4-80GB"),
            (256, 2048)
        );
        assert_eq!(e.batch_defaults(180 * GIB, "NVIDIA B200"), (1024, 16384));
        assert_eq!(e.batch_defaults(24 * GIB, "RTX 4090"), (256, 2048));
        let old: EngineRules = "vllm@0.19".parse().unwrap();
        assert_eq!(old.batch_defaults(180 * GIB, "B200"), (1024, 8192));
    }

    #[test]
    fn graph_rules_and_accounting_follow_the_release() {
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        // 0.19 prints its estimate without subtracting it; 0.20..0.25 profile on CUDA only.
        assert!(!r("vllm@0.19").subtracts_graphs_on(None));
        assert!(r("vllm@0.23").subtracts_graphs_on(Some("cuda")));
        assert!(!r("vllm@0.23").subtracts_graphs_on(Some("rocm")));
        assert!(r("vllm@0.26").subtracts_graphs_on(Some("rocm")));
        assert!(!r("vllm@0.30").subtracts_graphs_on(Some("xpu")));
        assert!(r("vllm@0.31").subtracts_graphs_on(Some("xpu")));
        assert!(r("vllm@0.34").subtracts_graphs_on(Some("xpu")));
        assert_eq!(r("vllm@0.26").non_kv, NonKvAccounting::TorchPeak);
        assert_eq!(r("vllm@0.27").non_kv, NonKvAccounting::Consumed);
        assert_eq!(r("vllm@0.19").default_utilization(24 * GIB, 1, 1), 0.9);
        assert_eq!(r("vllm@0.20.1").default_utilization(24 * GIB, 1, 1), 0.92);
    }

    /// vLLM up to 0.28 allocates one tensor per layer of a KV-cache group
    /// (`_allocate_kv_cache_tensors`), 0.29.0 on one backing allocation (`allocate_kv_cache`
    /// in `vllm/v1/worker/utils.py`); SGLang per-layer K and V buffers (see
    /// `sglang_allocates_k_and_v_per_layer`). The sizing rules carry it, and 0.28's and 0.29's
    /// differ in nothing else.
    #[test]
    fn the_kv_cache_is_one_allocation_from_0_29() {
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        for v in ["vllm@0.19", "vllm@0.24", "vllm@0.27", "vllm@0.28.9"] {
            assert_eq!(r(v).kv_allocation, KvAllocation::PerTensor, "{v}");
            assert_eq!(r(v).sizing(1, true).kv_allocation, KvAllocation::PerTensor);
        }
        for v in ["vllm@0.29", "vllm@0.30", "vllm@0.32", "vllm@0.34"] {
            assert_eq!(
                r(v).sizing(2, true).kv_allocation,
                KvAllocation::OneBacking,
                "{v}"
            );
        }
        assert_eq!(
            r("vllm@0.28").sizing(1, true),
            r("vllm@0.29")
                .sizing(1, true)
                .with_kv_allocation(KvAllocation::PerTensor)
        );
    }

    /// Each row's fitted figures follow its accounting: kept buffers only where consumed
    /// memory is counted, the V2 graph profiler's surplus only where V2 graphs are profiled.
    #[test]
    fn coefficients_follow_each_rows_accounting() {
        for r in VLLM {
            let c = &r.coefficients;
            assert_eq!(
                c.kept_buffers > 0,
                r.non_kv == NonKvAccounting::Consumed,
                "{}",
                r.version
            );
            assert_eq!(
                c.v2_graph_profiling > 0,
                r.v2_profiles_graphs,
                "{}",
                r.version
            );
            assert!(c.set.starts_with("vLLM "), "{}", r.version);
        }
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        assert_eq!(r("vllm@0.19").coefficients.set, "vLLM 0.19");
        assert_eq!(r("vllm@0.31").coefficients.set, "vLLM 0.29-0.34");
    }

    #[test]
    fn each_release_picks_its_model_runner() {
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        // (architecture, moe, quantized, hybrid, attention-free, platform)
        let llama =
            |e: &EngineRules, q: bool| e.runs_v2("LlamaForCausalLM", false, q, false, false, None);
        assert!(!llama(&r("vllm@0.19"), false));
        assert!(!llama(&r("vllm@0.21.1"), false));
        // 0.22: Qwen3 only; 0.23: Llama, Mistral, Qwen3, unquantized dense models.
        assert!(!llama(&r("vllm@0.22"), false));
        assert!(r("vllm@0.22").runs_v2("Qwen3ForCausalLM", false, false, false, false, None));
        assert!(llama(&r("vllm@0.23"), false) && !llama(&r("vllm@0.23"), true));
        assert!(!r("vllm@0.23").runs_v2("Qwen2ForCausalLM", false, false, false, false, None));
        // 0.24: the listed architectures, quantized or not.
        assert!(llama(&r("vllm@0.24"), true));
        assert!(!r("vllm@0.24").runs_v2("Qwen2ForCausalLM", false, false, false, false, None));
        // 0.25 to 0.28: every dense model; MoE only when listed; hybrids off (0.25, 0.26) or
        // only when listed (0.27, 0.28).
        for v in ["vllm@0.25", "vllm@0.26", "vllm@0.27.1", "vllm@0.28"] {
            let e = r(v);
            assert!(
                e.runs_v2("Qwen2ForCausalLM", false, false, false, false, None),
                "{v}"
            );
            assert!(!e.runs_v2("Qwen3MoeForCausalLM", true, false, false, false, None));
            assert!(e.runs_v2("Qwen2MoeForCausalLM", true, false, false, false, None));
            assert!(!e.runs_v2("Qwen3NextForCausalLM", true, false, true, false, None));
            assert!(!e.runs_v2("MambaForCausalLM", false, false, false, true, None));
            assert!(!e.subtracts_graphs_for(None, true) && e.subtracts_graphs_for(None, false));
        }
        // 0.29+: every model, except some on ROCm; the V2 runner profiles graphs.
        let e = r("vllm@0.31.0");
        assert!(e.runs_v2("Qwen3MoeForCausalLM", true, true, false, false, None));
        assert!(e.runs_v2("DeepseekV4ForCausalLM", true, false, false, false, None));
        assert!(!e.runs_v2(
            "DeepseekV4ForCausalLM",
            true,
            false,
            false,
            false,
            Some("rocm")
        ));
        assert!(e.subtracts_graphs_for(None, true));
        assert!(!"sglang".parse::<EngineRules>().unwrap().runs_v2(
            "LlamaForCausalLM",
            false,
            false,
            false,
            false,
            None
        ));
    }

    /// SGLang's `MHATokenToKVPool` (`python/sglang/srt/mem_cache/memory_pool.py`): a K and a V
    /// tensor per layer from 0.5.1 to 0.5.22 (`_create_buffers`, in 0.5.16
    /// `_create_buffers_normal`), K and V as halves of one per layer where their shapes match
    /// from 0.5.23; MLA one `kv_buffer` per layer in both (`MLATokenToKVPool._create_buffers`).
    #[test]
    fn sglang_allocates_k_and_v_per_layer() {
        use memplan_core::kv::{AttentionKind, LayerGroup};
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        let llama = [LayerGroup::new(AttentionKind::Full, 32, 8, 128)];
        let mla = [LayerGroup::new(AttentionKind::Mla, 27, 1, 576).with_head_dim_v(0)];
        for (v, allocation, tensors) in [
            ("sglang@0.5.1", KvAllocation::SplitKv, 64),
            ("sglang@0.5.9", KvAllocation::SplitKv, 64),
            ("sglang@0.5.22", KvAllocation::SplitKv, 64),
            ("sglang@0.5.23", KvAllocation::PairedKv, 32),
            ("sglang", KvAllocation::PairedKv, 32),
        ] {
            let a = r(v).sizing(1, true).kv_allocation;
            assert_eq!(a, allocation, "{v}");
            assert_eq!(a.allocations(&llama), tensors, "{v}");
            assert_eq!(a.allocations(&mla), 27, "{v}");
        }
    }

    /// vLLM refuses to start where one request of `max_model_len` does not fit
    /// (`_check_enough_kv_cache_memory`, 0.19.0 and 0.34.0); SGLang starts and caps the requests
    /// it admits by its pool (`srt/managers/tp_worker.py` `TpModelWorker`: `max_req_len =
    /// min(context_len - 1, max_total_num_tokens - 1)`), asserting a pool of 7 tokens up to
    /// 0.5.13 (`max_req_input_len = max_req_len - 5 > 0`) and 2 from 0.5.14 (`max_req_len > 0`).
    #[test]
    fn sglang_admits_requests_shorter_than_its_pool() {
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        for v in VLLM {
            assert_eq!(v.long_requests, LongRequests::Refuse, "{v}");
            assert_eq!(v.sizing(1, true).long_requests, LongRequests::Refuse);
        }
        for (v, least) in [
            ("sglang@0.5.1", 7),
            ("sglang@0.5.9", 7),
            ("sglang@0.5.13", 7),
            ("sglang@0.5.14", 2),
            ("sglang@0.5.22", 2),
            ("sglang@0.5.23", 2),
        ] {
            assert_eq!(
                r(v).sizing(1, true).long_requests,
                LongRequests::CapByPool {
                    least_tokens: least
                },
                "{v}"
            );
        }
        // vLLM refuses a request above the free memory at its start; SGLang's fraction is of it.
        for v in VLLM {
            assert_eq!(v.sizing(1, true).start_check, StartCheck::RefuseAboveFree);
        }
        // Every SGLang release memplan knows sizes its pool from the free memory it reads after
        // its weights (0.4.4 and 0.4.8 `model_runner.py` `profile_max_num_token`, 0.5.9
        // `model_runner_kv_cache_mixin.py` `profile_max_num_token`, 0.5.14
        // `_profile_available_bytes`, 0.5.23 `kv_cache_configurator.py`
        // `_profile_available_bytes`); the dry run, which reads no free memory after the
        // weights, keeps the older model of that rule.
        for v in SGLANG {
            assert_eq!(
                v.sizing(1, true).start_check,
                StartCheck::PoolOfFreeAfterWeights,
                "{v}"
            );
            assert_eq!(
                v.sizing(1, true).start_check.without_free_after_weights(),
                StartCheck::ShareOfFree,
                "{v}"
            );
        }
        for v in [
            "sglang@0.4.4",
            "sglang@0.4.8",
            "sglang@0.5.1",
            "sglang@0.5.9",
            "sglang@0.5.14",
            "sglang@0.5.22",
            "sglang@0.5.23",
        ] {
            assert_eq!(
                r(v).sizing(1, true).start_check,
                StartCheck::PoolOfFreeAfterWeights,
                "{v}"
            );
        }
        // 0.5.14 changed nothing else but the split of a hybrid model's pools.
        assert_eq!(
            r("sglang@0.5.14").sizing(1, true),
            r("sglang@0.5.13")
                .sizing(1, true)
                .with_long_requests(LongRequests::CapByPool { least_tokens: 2 })
                .with_swa_pools(SwaPools::SglangFullPool)
        );
    }

    #[test]
    fn sglang_splits_a_hybrid_models_pools_by_release() {
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        for (v, pools) in [
            ("vllm@0.19", SwaPools::Groups),
            ("vllm@0.34", SwaPools::Groups),
            ("sglang@0.4.4", SwaPools::Groups),
            ("sglang@0.5.1", SwaPools::SglangEveryLayer),
            ("sglang@0.5.13", SwaPools::SglangEveryLayer),
            ("sglang@0.5.14", SwaPools::SglangFullPool),
            ("sglang@0.5.22", SwaPools::SglangFullPool),
            ("sglang@0.5.23", SwaPools::SglangFullPool),
        ] {
            assert_eq!(r(v).sizing(1, true).swa_pools, pools, "{v}");
        }
        // Gemma 2 and 3 keep every layer in SGLang's one pool; gpt-oss in its two.
        for v in ["sglang@0.5.9", "sglang@0.5.23"] {
            assert!(
                r(v).windows_as_full_for("Gemma3ForConditionalGeneration"),
                "{v}"
            );
            assert!(!r(v).windows_as_full_for("GptOssForCausalLM"), "{v}");
        }
        assert!(!r("vllm@0.34").windows_as_full_for("Gemma3ForCausalLM"));
        assert!(r("sglang@0.4.4").windows_as_full_for("GptOssForCausalLM"));
    }

    #[test]
    fn sglang_computes_its_default_fraction_per_device() {
        // `_handle_gpu_memory_settings`, SGLang 0.5.23: a 24 GiB card (chunk 4096, decode
        // graphs to 48): reserved = 512 + 6144 + 128 + 96 = 6880 MiB of 24576.
        let s: EngineRules = "sglang@0.5.23".parse().unwrap();
        assert_eq!(s.default_utilization(24 * GIB, 1, 1), 0.72);
        // An 80 GiB H100: 512 + 12288 + 128 + 512 = 13440 MiB of 81920 -> 0.836.
        assert_eq!(s.default_utilization(80 * GIB, 1, 1), 0.836);
        // TP 8 on a 141 GiB H200: + 1024 for the ranks, decode graphs to 512.
        assert_eq!(s.default_utilization(141 * GIB, 8, 1), 0.897);
        // The older 0.5 row keeps the fixed 0.88.
        let old: EngineRules = "sglang@0.5.2".parse().unwrap();
        assert_eq!(old.default_utilization(24 * GIB, 1, 1), 0.88);
    }

    /// A measured start-up sizes with `SizingRules::newest` unless told otherwise: it is this
    /// table's newest vLLM row, for every number of stages.
    #[test]
    fn the_measured_default_is_the_newest_row() {
        let newest = EngineRules::newest_vllm();
        assert_eq!(newest.to_string(), SizingRules::NEWEST_RELEASE);
        for pp in 1..=4 {
            assert_eq!(
                newest.sizing(pp, true),
                SizingRules::newest(pp),
                "{pp} stages"
            );
        }
    }

    /// The KV tokens each release's log prints for the same cache. vLLM 0.19.0 and 0.20.0
    /// (`v1/core/kv_cache_utils.py` `_report_kv_cache_config`: `num_blocks //
    /// len(kv_cache_groups) * min_block_size`) count the null block that `BlockPool.__init__`
    /// (`v1/core/block_pool.py`) takes from those blocks; 0.20.1 prints
    /// `int(num_blocks / blocks_per_request * max_model_len)`; SGLang the pool's usable tokens.
    #[test]
    fn the_logged_kv_tokens_follow_the_release() {
        use memplan_core::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
        let r = |v: &str| v.parse::<EngineRules>().unwrap();
        // Qwen3-8B: 36 layers x 8 KV heads x 128 x (K + V) x 2 bytes x 16 tokens = 2,359,296
        // bytes a block. 19.36 GiB (a vLLM 0.19.1 log's "Available KV cache memory") =
        // 20,787,641,712 bytes = 8,810.95 blocks: 8,810, one the null block. The log printed
        // "GPU KV cache size: 140,960 tokens" = 8,810 x 16; memplan's usable count is
        // 8,809 x 16 = 140,944.
        let qwen = KvSpec::new(
            vec![LayerGroup::new(AttentionKind::Full, 36, 8, 128)],
            KvDtype::Bf16,
            16,
        );
        let limits = KvLimits::new(40_960, 2048);
        let budget = (19.36 * GIB as f64) as u64;
        for (v, planned, logged) in [
            ("vllm@0.19", 140_944, 140_960),
            ("vllm@0.20.0", 140_944, 140_960),
            // 40,960 / 16 = 2,560 blocks a request: int(8,810 / 2,560 x 40,960) = 140,960.
            ("vllm@0.20.1", 140_960, 140_960),
            ("vllm@0.34", 140_960, 140_960),
        ] {
            let e = r(v);
            let kv = qwen.size_with(budget, &limits, &e.sizing(1, true)).unwrap();
            assert_eq!((kv.num_blocks, kv.tokens), (8_810, planned), "{v}");
            assert_eq!(e.logged_kv_tokens(&kv), logged, "{v}");
        }
        let sglang = r("sglang");
        let kv = qwen.size(budget, &limits).unwrap();
        assert_eq!(sglang.logged_kv_tokens(&kv), kv.tokens);
        // Two groups (12 full + 12 sliding-window layers, pages alike: 12 layers a group,
        // 65,536 x 12 = 786,432 bytes a block), 1,000 blocks: 0.19 prints 1,000 // 2 x 16 =
        // 8,000 tokens, the usable 999 // 2 x 16 = 7,984.
        let two = KvSpec::new(
            vec![
                LayerGroup::new(AttentionKind::Full, 12, 8, 128),
                LayerGroup::new(AttentionKind::SlidingWindow { window: 4096 }, 12, 8, 128),
            ],
            KvDtype::Bf16,
            16,
        );
        let e = r("vllm@0.19");
        let kv = two
            .size_with(1_000 * 786_432, &limits, &e.sizing(1, true))
            .unwrap();
        assert_eq!((kv.num_groups, kv.num_blocks, kv.tokens), (2, 1_000, 7_984));
        assert_eq!(e.logged_kv_tokens(&kv), 8_000);
    }

    #[test]
    fn window_admission_counts_batches_in_flight() {
        // `VllmConfig.max_in_flight_tokens` (0.26+): (pp + async) * max_num_batched_tokens.
        let new = EngineRules::newest_vllm().sizing(1, true);
        assert_eq!(new.in_flight_batches, 2);
        assert_eq!(
            EngineRules::newest_vllm().sizing(4, true).in_flight_batches,
            5
        );
        let old: EngineRules = "vllm@0.25".parse().unwrap();
        assert_eq!(old.sizing(1, true).in_flight_batches, 1);
    }
}
