//! The dry run behind `memplan plan`: a model, a device total and the engine's settings in; a
//! [`Plan`] out, the same type a measured start-up produces. Every consumer carries its
//! provenance: read from the checkpoint's headers, given by the user (a figure of an earlier
//! start-up, [`DryRun::given`]), or estimated with its basis.
//!
//! Pure: no device is touched here; the caller supplies the total (and optionally a snapshot
//! for the start-up free-memory check). Errors name [`Param`]s, never a command-line flag.

use memplan_core::kv::{KvDtype, KvLimits};
use memplan_core::{Error, MemoryInfo, Param, ProfilingCapability, Result};
use memplan_planner::budget::Request;
use memplan_planner::strategy::{Selection, SelectionPolicy};
use memplan_planner::{
    Consumer, ConsumerKind, GraphMethod, GraphPlan, Plan, PlanBuilder, Provenance, StrategyKind,
    Warning,
};

use crate::arch::state::MambaDtype;
use crate::config::LayerKind;
use crate::device::DeviceClass;
use crate::engine::EngineRules;
use crate::estimate::{self, EngineShape, Estimate};
use crate::kvspec::SpecOptions;
use crate::quant::Quantization;
use crate::{dtype_bytes, Model};

/// How graph memory enters the budget of a dry run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GraphReserve {
    /// As the engine release does on the platform: reserve the given value, else the
    /// analytic estimate, where it subtracts graph memory; nothing where it does not
    /// ([`EngineRules::subtracts_graphs_on`]).
    Engine,
    /// Reserve the given value, else the analytic estimate.
    Reserve,
    /// Reserve nothing (an engine that does not subtract graph memory, as vLLM <= 0.19).
    None,
}

/// A dry run's settings: start with [`DryRun::new`], set what the engine sets, then
/// [`plan`](DryRun::plan). Unset settings take the engine's defaults for the device.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use]
pub struct DryRun {
    /// The model.
    pub model: Model,
    /// Device total per rank.
    pub total: u64,
    /// A snapshot for the start-up check (free >= requested), when a device was read.
    pub snapshot: Option<MemoryInfo>,
    /// The device's capability, when a device was read: the graph phase follows the same
    /// selection a measured start-up makes ([`memplan_planner::select`]), so a device that
    /// cannot capture graphs gets no graph reserve.
    pub capability: Option<ProfilingCapability>,
    /// The device's name, for the plan.
    pub device: Option<String>,
    /// Utilisation, byte budget or fixed KV size.
    pub request: Request,
    /// Model dtype override (`auto` = config).
    pub dtype: Option<String>,
    /// KV dtype (`None` = the model dtype).
    pub kv_cache_dtype: Option<KvDtype>,
    /// vLLM's `--mamba-cache-dtype` (`None` = `auto`): the conv and SSM states of
    /// recurrent-state layers.
    pub mamba_cache_dtype: Option<MambaDtype>,
    /// vLLM's `--mamba-ssm-cache-dtype` (`None` = `auto`: the family's rule from the
    /// config, else the Mamba cache dtype): the SSM state only.
    pub mamba_ssm_cache_dtype: Option<MambaDtype>,
    /// vLLM's `--enable-prefix-caching` (`Some(true)`) or `--no-enable-prefix-caching`
    /// (`Some(false)`); `None`: the release's default. It sets how many pages a request holds
    /// in each recurrent-state layer: one without prefix caching (`mamba_cache_mode` `none`),
    /// two in `align` mode ([`EngineRules::state_pages_with`]).
    pub prefix_caching: Option<bool>,
    /// Online quantization; the checkpoint's own config is used otherwise.
    pub quantization: Option<Quantization>,
    /// Longest request (`None` = the model's `max_position_embeddings`).
    pub max_model_len: Option<u64>,
    /// Requests per step (`None` = the engine default for this total).
    pub max_num_seqs: Option<u64>,
    /// Tokens per step (`None` = the engine default for this total).
    pub max_num_batched_tokens: Option<u64>,
    /// Tokens per KV block (`None` = the engine release's default).
    pub block_size: Option<u32>,
    /// The engine release whose rules and defaults apply.
    pub engine: EngineRules,
    /// The device's name (engines pick batch defaults by it: the A100 exception).
    pub device_name: String,
    /// Tensor-parallel ranks.
    pub tensor_parallel: u64,
    /// Graph capture sizes (`None` = the engine default).
    pub capture_sizes: Option<Vec<u64>>,
    /// No graphs at all.
    pub enforce_eager: bool,
    /// Graph reserve policy.
    pub graph_reserve: GraphReserve,
    /// Whether this rank runs the sampler in the profile run (only the last pipeline stage
    /// does; set per stage when pipeline stages are planned).
    pub runs_sampler: bool,
    /// The platform the engine runs on (`cuda`, `rocm`, `xpu`; `None`: unknown, taken as
    /// CUDA): engine releases profile and subtract graph memory only on some
    /// ([`EngineRules::subtracts_graphs_on`]).
    pub platform: Option<String>,
    /// Figures given by the user, replacing the estimates.
    pub given: Vec<(ConsumerKind, u64)>,
    /// Draft model, LoRA, CPU offload, pipeline stages ([`crate::consumers`]).
    pub extras: crate::consumers::Extras,
    /// Notes for the plan from whoever set the run up (how a default was derived).
    pub notes: Vec<String>,
    /// The engine's caching-allocator configuration and where it came from: noted in the plan
    /// (a dry run keeps no room for the allocator's rounding, whatever its configuration;
    /// [`PlanBuilder::allocator_config`]).
    pub allocator: Option<(memplan_core::AllocatorConfig, String)>,
}

/// `b` with the start-up rule a dry run can apply
/// ([`StartCheck::without_free_after_weights`](memplan_core::kv::StartCheck::without_free_after_weights)):
/// it reads no free memory once the weights are loaded (no device, or one snapshot before
/// anything was loaded), so an engine that sizes its pool from that reading
/// (`StartCheck::PoolOfFreeAfterWeights`, SGLang) is planned by the older model of its rule,
/// `StartCheck::ShareOfFree`: within the request's share of the free memory at the start.
pub fn without_free_after_weights(b: PlanBuilder) -> PlanBuilder {
    let rules = b.rules();
    b.sizing_rules(rules.with_start_check(rules.start_check.without_free_after_weights()))
}

/// A dry run resolved: the plan builder (override figures on it, then build) and the graph
/// estimate even where it is not reserved (for comparison).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Resolved {
    /// The plan, ready to build.
    pub builder: PlanBuilder,
    /// The analytic graph estimate.
    pub graph_estimate: Estimate,
}

impl DryRun {
    /// A dry run of `model` on a device of `total` bytes per rank for the newest vLLM release
    /// memplan knows: utilisation 0.9, one rank, graphs reserved, every other setting the
    /// engine release's default.
    pub fn new(model: Model, total: u64) -> Self {
        DryRun {
            model,
            total,
            snapshot: None,
            capability: None,
            device: None,
            request: Request::Utilization(0.9),
            dtype: None,
            kv_cache_dtype: None,
            mamba_cache_dtype: None,
            mamba_ssm_cache_dtype: None,
            prefix_caching: None,
            quantization: None,
            max_model_len: None,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            block_size: None,
            engine: EngineRules::newest_vllm().clone(),
            device_name: String::new(),
            tensor_parallel: 1,
            capture_sizes: None,
            enforce_eager: false,
            graph_reserve: GraphReserve::Engine,
            platform: None,
            runs_sampler: true,
            given: Vec::new(),
            extras: Default::default(),
            notes: Vec::new(),
            allocator: None,
        }
    }

    /// The engine's caching allocator runs with `conf`, which came from `source` (a flag, an
    /// environment variable): the plan notes it ([`PlanBuilder::allocator_config`]).
    pub fn allocator_config(
        mut self,
        conf: memplan_core::AllocatorConfig,
        source: impl Into<String>,
    ) -> Self {
        self.allocator = Some((conf, source.into()));
        self
    }

    /// Notes for the plan (how a default request was derived: [`crate::defaults::request`]).
    pub fn notes(mut self, notes: Vec<String>) -> Self {
        self.notes.extend(notes);
        self
    }

    /// What the engine may use.
    pub fn request(mut self, r: Request) -> Self {
        self.request = r;
        self
    }
    /// A device snapshot for the start-up check, and the device's name.
    pub fn device(mut self, label: impl Into<String>, snapshot: Option<MemoryInfo>) -> Self {
        self.device = Some(label.into());
        self.snapshot = snapshot;
        self
    }
    /// The device's capability: the graph phase follows the selection a measured start-up on
    /// it makes (no graph reserve where it cannot capture graphs; otherwise the plan says
    /// which strategy it would use).
    pub fn capability(mut self, c: Option<ProfilingCapability>) -> Self {
        self.capability = c;
        self
    }
    /// The model dtype (`auto`, `bfloat16`, ...).
    pub fn dtype(mut self, d: impl Into<String>) -> Self {
        self.dtype = Some(d.into());
        self
    }
    /// The KV cache dtype (`None`: the model's).
    pub fn kv_cache_dtype(mut self, d: Option<KvDtype>) -> Self {
        self.kv_cache_dtype = d;
        self
    }
    /// vLLM's `--mamba-cache-dtype` (`None`: `auto`).
    pub fn mamba_cache_dtype(mut self, d: Option<MambaDtype>) -> Self {
        self.mamba_cache_dtype = d;
        self
    }
    /// vLLM's `--mamba-ssm-cache-dtype` (`None`: `auto`).
    pub fn mamba_ssm_cache_dtype(mut self, d: Option<MambaDtype>) -> Self {
        self.mamba_ssm_cache_dtype = d;
        self
    }
    /// vLLM's `--enable-prefix-caching` / `--no-enable-prefix-caching` (`None`: the
    /// release's default).
    pub fn prefix_caching(mut self, on: Option<bool>) -> Self {
        self.prefix_caching = on;
        self
    }
    /// Online weight quantization.
    pub fn quantization(mut self, q: Option<Quantization>) -> Self {
        self.quantization = q;
        self
    }
    /// The longest request.
    pub fn max_model_len(mut self, n: Option<u64>) -> Self {
        self.max_model_len = n;
        self
    }
    /// Requests per step.
    pub fn max_num_seqs(mut self, n: Option<u64>) -> Self {
        self.max_num_seqs = n;
        self
    }
    /// Tokens per step.
    pub fn max_num_batched_tokens(mut self, n: Option<u64>) -> Self {
        self.max_num_batched_tokens = n;
        self
    }
    /// Tokens per KV block (`None`: the engine release's).
    pub fn block_size(mut self, n: Option<u32>) -> Self {
        self.block_size = n;
        self
    }
    /// The engine release whose rules and defaults apply.
    pub fn engine(mut self, e: EngineRules) -> Self {
        self.engine = e;
        self
    }
    /// The device's own name (batch defaults depend on it).
    pub fn device_name(mut self, name: impl Into<String>) -> Self {
        self.device_name = name.into();
        self
    }
    /// Tensor-parallel ranks.
    pub fn tensor_parallel(mut self, n: u64) -> Self {
        self.tensor_parallel = n;
        self
    }
    /// Graph capture sizes.
    pub fn capture_sizes(mut self, s: Option<Vec<u64>>) -> Self {
        self.capture_sizes = s;
        self
    }
    /// No graphs at all.
    pub fn enforce_eager(mut self, eager: bool) -> Self {
        self.enforce_eager = eager;
        self
    }
    /// The platform the engine runs on (`cuda`, `rocm`, `xpu`).
    pub fn platform(mut self, p: Option<String>) -> Self {
        self.platform = p;
        self
    }
    /// Whether graph memory is subtracted.
    pub fn graph_reserve(mut self, g: GraphReserve) -> Self {
        self.graph_reserve = g;
        self
    }
    /// A figure the user gives (an earlier start-up's), replacing the estimate of its kind.
    pub fn given(mut self, kind: ConsumerKind, bytes: Option<u64>) -> Self {
        if let Some(b) = bytes {
            self.given.retain(|(k, _)| *k != kind);
            self.given.push((kind, b));
        }
        self
    }

    fn given_bytes(&self, kind: ConsumerKind) -> Option<u64> {
        self.given.iter().find(|(k, _)| *k == kind).map(|g| g.1)
    }

    fn figure(&self, kind: ConsumerKind, e: Estimate) -> Consumer {
        match self.given_bytes(kind) {
            Some(b) => Consumer::given(kind, b, "given by the user"),
            None => Consumer::estimated(kind, e.bytes, e.basis),
        }
    }

    /// Draft model, LoRA slots, CPU offload, pipeline stages.
    pub fn extras(mut self, e: crate::consumers::Extras) -> Self {
        self.extras = e;
        self
    }

    /// The plan. Errors: bad settings (naming the [`Param`]), a model that does not fit
    /// (a [`Refusal`](memplan_core::Refusal) saying what would fit), a free-memory shortfall at
    /// start-up. With pipeline parallelism every stage is planned on its own layers (vLLM
    /// `get_pp_indices`; embeddings on the first stage, the LM head on the last) and the
    /// engine sizes every stage like the one with the fewest blocks.
    ///
    /// With [`Extras::pipeline_stage`](crate::consumers::Extras) set, only that stage is
    /// planned: the plan of one rank of that stage, which a deployment combines with the
    /// other ranks' plans.
    ///
    /// A dry run reads no free memory once the weights are loaded, so an engine whose pool is
    /// sized from that reading (SGLang) is planned by the older model of its rule, the
    /// request's share of the free memory at the start ([`without_free_after_weights`]).
    pub fn plan(&self) -> Result<Plan> {
        let pp = self.extras.pipeline_parallel.max(1);
        if pp == 1 {
            let b = without_free_after_weights(self.resolve()?.builder);
            return match self.extras.rank(self.tensor_parallel)? {
                Some(rank) => b.rank(rank).build(),
                None => b.build(),
            };
        }
        if let Some(stage) = self.extras.pipeline_stage {
            let mut p = crate::consumers::plan_stage(self, pp, stage)?;
            p.notes.push(format!(
                "pipeline stage {stage} of {pp} only: the engine sizes every stage like the one with the fewest blocks, so combine this plan with the other stages' ranks"
            ));
            return Ok(p);
        }
        self.extras.rank(self.tensor_parallel)?;
        crate::consumers::plan_stages(self, pp)
    }

    /// Resolve every default and estimate: the plan builder and the graph estimate. The
    /// builder carries the release's own sizing rules, as a measured start-up takes them
    /// (`defaults::settings`); [`plan`](Self::plan) plans with the rules a dry run can apply.
    pub fn resolve(&self) -> Result<Resolved> {
        let c = &self.model.config;
        let tp = self.tensor_parallel;
        // The platform given, else the one the device's name says (an AMD GPU runs on ROCm).
        let platform: Option<String> = self
            .platform
            .clone()
            .or_else(|| crate::device::platform(&self.device_name).map(str::to_string));
        if tp == 0 {
            return Err(Error::param(Param::TensorParallel, "must be > 0"));
        }
        // `auto` is the config's dtype, except that engines downcast float32 checkpoints
        // (vLLM `_resolve_auto_dtype`: to the platform's first supported dtype, bfloat16 on
        // current GPUs; SGLang likewise to 16 bits), and a config without one loads as
        // bfloat16.
        let dtype_name = match self.dtype.as_deref() {
            None | Some("auto") => match c.torch_dtype.as_deref() {
                Some(d) if matches!(dtype_bytes(d), Ok(4)) => "bfloat16".to_string(),
                Some(d) => d.to_string(),
                None => "bfloat16".into(),
            },
            Some(d) => d.to_string(),
        };
        let db = dtype_bytes(&dtype_name).map_err(|e| {
            if self.dtype.is_some() {
                e
            } else {
                Error::invalid("torch_dtype", e.to_string())
            }
        })?;
        // `auto` follows a checkpoint that asks for an fp8 cache (ModelOpt
        // `kv_cache_quant_algo`, compressed-tensors `kv_cache_scheme`; vLLM
        // `resolve_kv_cache_dtype_string`).
        let checkpoint_kv = match c.kv_cache_quant.as_deref() {
            Some(k) if k.starts_with("fp8") => Some(KvDtype::Fp8E4m3),
            _ => None,
        };
        let kv_dtype = match self.kv_cache_dtype.or(checkpoint_kv) {
            Some(k) => k,
            None => match db {
                4 => KvDtype::F32,
                _ if dtype_name.contains("bf") => KvDtype::Bf16,
                _ => KvDtype::F16,
            },
        };
        let engine = &self.engine;
        let (def_seqs, def_tokens) = engine.batch_defaults(self.total, &self.device_name);
        let max_num_seqs = self.max_num_seqs.unwrap_or(def_seqs);
        let model_len = c.derived_max_len.or(c.max_position_embeddings);
        let max_model_len = match (self.max_model_len, model_len) {
            (Some(0), _) => return Err(Error::param(Param::MaxModelLen, "must be > 0")),
            (Some(n), _) => n,
            (None, Some(n)) if n > 0 => n,
            (None, _) => {
                return Err(Error::param(
                    Param::MaxModelLen,
                    "the config has no usable max_position_embeddings; give one",
                ))
            }
        };
        // `_set_default_max_num_seqs_and_batched_tokens_args`: the default never exceeds
        // max_num_seqs * max_model_len.
        let max_num_batched_tokens = self
            .max_num_batched_tokens
            .unwrap_or_else(|| def_tokens.min(max_num_seqs.saturating_mul(max_model_len)));
        for (k, v) in [
            (Param::MaxNumSeqs, max_num_seqs),
            (Param::MaxNumBatchedTokens, max_num_batched_tokens),
        ] {
            if v == 0 {
                return Err(Error::param(k, "must be > 0"));
            }
        }
        if let Some(bad) = self
            .capture_sizes
            .iter()
            .flatten()
            .find(|s| **s == 0 || **s > 1 << 20)
        {
            return Err(Error::param(
                Param::CaptureSizes,
                format!("{bad} is not a batch size a graph can be captured for (1 to 1048576)"),
            ));
        }
        let sizes = self
            .capture_sizes
            .clone()
            .unwrap_or_else(|| estimate::default_capture_sizes(max_num_seqs));
        // The choice a measured start-up on this device makes, from its capability alone.
        let selection: Option<Selection> = self
            .capability
            .as_ref()
            .filter(|_| !self.enforce_eager)
            .map(|cap| memplan_planner::select(cap, sizes.len(), true, SelectionPolicy::default()));
        let device_eager = selection
            .as_ref()
            .filter(|s| s.kind == StrategyKind::None && !sizes.is_empty());
        let capture_sizes = if self.enforce_eager || device_eager.is_some() {
            Vec::new()
        } else {
            sizes
        };
        // The model runner the release starts this model on: it decides whether graph memory
        // is profiled and how large the profile run's sampler peak is.
        let attention = c.layers.iter().any(|k| {
            !matches!(
                k,
                crate::config::LayerKind::State | crate::config::LayerKind::None
            )
        });
        let has_state = c
            .layers
            .iter()
            .any(|k| matches!(k, crate::config::LayerKind::State));
        let v2 = engine.runs_v2(
            &c.architecture,
            c.moe.is_some(),
            c.quantization.is_some() || self.quantization.is_some(),
            attention && has_state,
            !attention,
            platform.as_deref(),
        );
        let shape = EngineShape {
            max_num_seqs,
            max_num_batched_tokens,
            tensor_parallel: tp,
            pipeline_parallel: self.extras.pipeline_parallel.max(1),
            samples: self.runs_sampler,
            capture_sizes,
            dtype_bytes: db,
            sampler_bytes_per_logit: if v2 {
                estimate::sampler_v2(db)
            } else {
                engine.coefficients.sampler_v1_bytes_per_logit
            },
            runner_v2: v2,
            coefficients: engine.coefficients,
            device_class: DeviceClass::of(&self.device_name, self.total),
            unified_memory: crate::device::unified_memory(&self.device_name),
            max_model_len,
        };
        // With prefix caching on, vLLM keeps a hybrid's states in `align` mode unless the
        // model supports Mamba prefix caching ('all' mode, not modelled: the release's pages
        // are kept and a note says so).
        let all_mode = self.prefix_caching == Some(true)
            && self.extras.draft.is_none()
            && has_state
            && crate::engine::MAMBA_PREFIX_CACHING.contains(&c.architecture.as_str());
        let prefix = self.prefix_caching.filter(|_| !all_mode);
        let opts = SpecOptions {
            state_pages: (
                engine.state_pages_with(false, prefix),
                engine.state_pages_with(true, prefix),
            ),
            hybrid_block_align: match (c.mla.is_some(), engine.block_size >= 64) {
                (true, true) => 128,
                (true, false) => 64,
                (false, _) => engine.hybrid_block_align,
            },
            dtype_bytes: db,
            mamba_cache_dtype: self.mamba_cache_dtype,
            mamba_ssm_cache_dtype: self.mamba_ssm_cache_dtype,
            nemotron_h_ssm_default: if engine.nemotron_h_ssm_float16 {
                MambaDtype::Float16
            } else {
                MambaDtype::Float32
            },
            // Both changed in the same vLLM change (PR 39032, 0.20.0).
            nemotron_h_vl_ssm_rule: !engine.nemotron_h_ssm_float16,
        };
        let block_size = self.block_size.unwrap_or(engine.block_size);
        // SGLang before 0.4.9 has no sliding-window pool: every attention layer is full.
        let windowed = c
            .layers
            .iter()
            .filter(|k| matches!(k, LayerKind::Sliding(_) | LayerKind::Chunked(_)))
            .count();
        let full_layers;
        let windows_as_full = engine.windows_as_full_for(&c.architecture);
        let spec_model = if windows_as_full && windowed > 0 {
            let mut m = c.clone();
            for k in &mut m.layers {
                if matches!(k, LayerKind::Sliding(_) | LayerKind::Chunked(_)) {
                    *k = LayerKind::Full;
                }
            }
            full_layers = m;
            &full_layers
        } else {
            c
        };
        let mut kv_spec = spec_model.kv_spec_with(kv_dtype, block_size, tp, &opts)?;
        let mut extra_weights: Vec<(u64, String)> = Vec::new();
        if let Some((draft, n)) = &self.extras.draft {
            // The draft's layers share the pool (vLLM adds them to the KV-cache spec); its
            // weights load beside the target's.
            let d = draft.kv_spec_with(kv_dtype, kv_spec.block_size, tp, &opts)?;
            kv_spec = crate::consumers::with_draft_layers(&kv_spec, &d);
            let w = crate::weights::weight_bytes(draft, tp, db, draft.quantization.as_ref())?;
            extra_weights.push((w, format!("draft model {} ({n} speculative tokens, weights estimated; its KV layers share the pool)", draft.architecture)));
        }
        if let Some((slots, rank)) = self.extras.lora {
            let w = crate::consumers::lora_bytes(c, tp, slots, rank, db);
            extra_weights.push((w, format!("LoRA: {slots} slot(s) of rank {rank} pre-allocated for the QKV/O/gate-up/down projections")));
        }
        let mut notes = vec![c.rule.clone()];
        if windows_as_full && !engine.windows_as_full && windowed > 0 {
            notes.push(format!(
                "{engine} keeps {} in one pool (`disable_hybrid_swa_memory`): the model's {windowed} sliding-window layers are sized as full-attention layers",
                c.architecture
            ));
        } else if windows_as_full && windowed > 0 {
            notes.push(format!(
                "{engine} has no sliding-window KV pool: the model's {windowed} sliding-window or chunked layers are sized as full-attention layers (`profile_max_num_token`: kv heads x head dim x every layer)"
            ));
        }
        // SGLang before 0.4.9 cuts a multimodal model's fraction after printing its arguments.
        let request = match self.request {
            Request::Utilization(u) if engine.static_fraction(&c.architecture, u) != u => {
                let cut = engine.static_fraction(&c.architecture, u);
                notes.push(format!(
                    "{engine} reduces --mem-fraction-static {u} to {cut:.3} for the multimodal {} (`ModelRunner.__init__`: x {})",
                    c.architecture, engine.multimodal_fraction
                ));
                Request::Utilization(cut)
            }
            r => r,
        };
        if all_mode {
            notes.push(format!(
                "--enable-prefix-caching: vLLM keeps {}'s recurrent states in 'all' mode (a page per block of the request, `MambaModelConfig.verify_and_update_config`), which memplan does not model; the states are sized with {}'s default pages",
                c.architecture, engine
            ));
        } else if let (Some(on), true) = (self.prefix_caching, has_state) {
            notes.push(format!(
                "{}: {} page(s) a request in each recurrent-state layer (vLLM Mamba cache mode {})",
                if on {
                    "--enable-prefix-caching"
                } else {
                    "--no-enable-prefix-caching"
                },
                match c.state.map(|s| s.kind) {
                    Some(crate::arch::state::StateKind::Mamba2) => opts.state_pages.1,
                    _ => opts.state_pages.0,
                },
                if on { "'align'" } else { "'none'" },
            ));
        }
        notes.extend(c.notes.iter().cloned());
        notes.extend(self.notes.iter().cloned());
        notes.push(format!(
            "estimated terms (activation, non-torch, graphs) use {engine}'s row: the {} coefficients, fitted on {}",
            engine.coefficients.set, engine.coefficients.fitted_on
        ));
        if engine.kind == crate::engine::EngineKind::Vllm
            && engine.runner != crate::engine::RunnerDefault::V1
        {
            notes.push(format!(
                "model runner: {engine} starts {} on its {} runner (`VllmConfig.use_v2_model_runner`)",
                c.architecture,
                if v2 { "V2" } else { "V1" }
            ));
        }
        if checkpoint_kv.is_some() && self.kv_cache_dtype.is_none() {
            notes.push(format!(
                "KV cache dtype auto: the checkpoint asks for an {} KV cache",
                c.kv_cache_quant.as_deref().unwrap_or("fp8")
            ));
        }
        for (flag, given) in [
            ("--mamba-cache-dtype", self.mamba_cache_dtype),
            ("--mamba-ssm-cache-dtype", self.mamba_ssm_cache_dtype),
        ] {
            let Some(d) = given else { continue };
            notes.push(if has_state {
                format!(
                    "{flag} {d}: the recurrent-state layers' {} in {d} ({} bytes an element)",
                    if flag == "--mamba-cache-dtype" {
                        "conv state, and their SSM state where neither --mamba-ssm-cache-dtype nor the model's config sets it,"
                    } else {
                        "SSM state"
                    },
                    d.bytes()
                )
            } else {
                format!("{flag} {d}: the model has no recurrent-state layers, so it changes nothing")
            });
        }
        let vl_without_rule = c
            .state
            .is_some_and(|s| s.ssm_rule_from_0_20 && !opts.nemotron_h_vl_ssm_rule);
        if has_state
            && engine.kind == crate::engine::EngineKind::Vllm
            && self.mamba_ssm_cache_dtype.is_none()
            && vl_without_rule
        {
            notes.push(format!(
                "vLLM {} runs no SSM-dtype rule for {} (NemotronHNanoVLV2Config; from 0.20.0 it reads the config's mamba_ssm_cache_dtype): its SSM state is in the Mamba cache dtype",
                engine.version, c.architecture
            ));
        } else if has_state
            && engine.kind == crate::engine::EngineKind::Vllm
            && self.mamba_ssm_cache_dtype.is_none()
            && c.state.is_some_and(|s| s.ssm_engine_default)
        {
            notes.push(format!(
                "the config names no mamba_ssm_cache_dtype: vLLM {} keeps this Nemotron-H model's SSM state in {} (vLLM 0.19 float16, 0.20.0 on float32)",
                engine.version, opts.nemotron_h_ssm_default
            ));
        }
        if kv_spec.block_size != block_size {
            notes.push(format!(
                "block size {} (not {block_size}): an attention page must hold a recurrent state (vLLM `_align_hybrid_block_size`)",
                kv_spec.block_size
            ));
        }
        // vLLM turns the hybrid manager off for chunked local attention (`VllmConfig`), so
        // those layers are sized as full attention.
        let hybrid_manager = !c
            .layers
            .iter()
            .any(|k| matches!(k, crate::config::LayerKind::Chunked(_)));
        if !hybrid_manager {
            notes.push("chunked local attention: the hybrid KV-cache manager is off by default, so those layers are sized as full attention".into());
        }
        let rules = engine.sizing(self.extras.pipeline_parallel.max(1), hybrid_manager);

        let quant = self.quantization.as_ref().or(c.quantization.as_ref());
        let weights = match (self.given_bytes(ConsumerKind::Weights), &self.model.checkpoint) {
            (Some(b), _) => Consumer::given(ConsumerKind::Weights, b, "given by the user"),
            (None, Some(s)) if self.quantization.is_none() => Consumer::new(
                ConsumerKind::Weights,
                s.per_rank_as(tp, db, c.quantization.is_some()),
                Provenance::Checkpoint {
                    basis: format!(
                        "safetensors headers: {} tensors, floating-point ones at {db} bytes, split over {tp} rank(s)",
                        s.tensors
                    ),
                },
            ),
            _ => {
                let b = crate::weights::weight_bytes(c, tp, db, quant)?;
                let q = quant
                    .map(|q| format!(", {} at {:.2} bits per weight", q.method, q.bits_per_weight))
                    .unwrap_or_default();
                Consumer::estimated(
                    ConsumerKind::Weights,
                    b,
                    format!("parameters from the architecture at {db} bytes{q}, per rank of {tp}"),
                )
            }
        };
        let graph_estimate = estimate::graph(c, &shape);
        let (graph, graph_plan, not_reserved) = if let Some(sel) = device_eager {
            notes.push(format!(
                "graphs: none reserved, as a measured start-up on this device would run eager ({})",
                sel.why
            ));
            (
                Consumer::not_reserved(
                    ConsumerKind::Graphs,
                    "the device cannot capture graphs: the engine runs eagerly",
                ),
                GraphPlan::new(
                    GraphMethod::Strategy(StrategyKind::None),
                    format!(
                        "{}: no graphs, the same choice a measured start-up on this device makes",
                        sel.why
                    ),
                ),
                false,
            )
        } else if self.enforce_eager {
            (
                Consumer::not_reserved(ConsumerKind::Graphs, "eager: no graphs"),
                GraphPlan::new(
                    GraphMethod::Strategy(memplan_planner::StrategyKind::None),
                    "the engine runs eagerly: no graphs",
                ),
                false,
            )
        } else {
            // The release's own rule: vLLM 0.19 prints its estimate without subtracting it;
            // 0.20 to 0.25 profile graphs on CUDA only (`determine_available_memory`); the V2
            // model runner profiles none before 0.29.
            let engine_subtracts = engine.subtracts_graphs_for(platform.as_deref(), v2);
            let graphs_given = self.given_bytes(ConsumerKind::Graphs);
            let reserve = match self.graph_reserve {
                GraphReserve::Engine if graphs_given.is_none() && !engine_subtracts => {
                    GraphReserve::None
                }
                GraphReserve::Engine => GraphReserve::Reserve,
                r => r,
            };
            let why_not = if self.graph_reserve == GraphReserve::None {
                "graph memory is not subtracted from the budget (as vLLM <= 0.19 does)".to_string()
            } else if v2 && engine.subtracts_graphs_on(platform.as_deref()) {
                format!(
                    "{engine} starts {} on its V2 model runner, which profiles no graph memory before 0.29: nothing is subtracted from the KV budget for graphs (its start-up would not either)",
                    c.architecture
                )
            } else {
                format!(
                    "{engine} does not subtract graph memory from the KV budget on {} (its start-up would not either)",
                    platform.as_deref().unwrap_or("cuda")
                )
            };
            match (reserve, graphs_given) {
                (GraphReserve::None, _) => (
                    Consumer::not_reserved(
                        ConsumerKind::Graphs,
                        "the engine does not subtract graph memory",
                    ),
                    GraphPlan::new(GraphMethod::NotReserved, why_not),
                    true,
                ),
                (GraphReserve::Reserve | GraphReserve::Engine, Some(b)) => (
                    Consumer::given(ConsumerKind::Graphs, b, "given by the user"),
                    GraphPlan::new(
                        GraphMethod::Given,
                        "the graph memory of an earlier start-up",
                    ),
                    false,
                ),
                (GraphReserve::Reserve | GraphReserve::Engine, None) => (
                    Consumer::estimated(
                        ConsumerKind::Graphs,
                        graph_estimate.bytes,
                        graph_estimate.basis.clone(),
                    ),
                    GraphPlan::new(
                        GraphMethod::Estimate,
                        match &selection {
                            Some(sel) => format!(
                                "dry run: the analytic estimate from the model (nothing is captured); a measured start-up on this device would use {} ({})",
                                sel.kind, sel.why
                            ),
                            None => "dry run: the analytic estimate from the model (nothing is captured)".into(),
                        },
                    ),
                    false,
                ),
            }
        };
        let limits = KvLimits::new(max_model_len, max_num_batched_tokens)
            .with_max_len_limit(max_model_len.max(model_len.unwrap_or(0)));
        let mut b = PlanBuilder::new(self.total, request, kv_spec, limits)
            .sizing_rules(rules)
            .engine(engine.to_string())
            .notes(notes)
            .model(self.model.name.clone())
            .max_num_seqs(max_num_seqs)
            .tensor_parallel(tp)
            .consumer(crate::consumers::adjust_weights(
                weights,
                &extra_weights,
                self.extras.cpu_offload,
            ))
            .consumer(crate::consumers::with_encoder(
                self.figure(ConsumerKind::Activation, estimate::activation(c, &shape)),
                self.given_bytes(ConsumerKind::Activation).is_none(),
                c,
                max_num_batched_tokens,
                db,
            ))
            .consumer(self.figure(
                ConsumerKind::NonAllocator,
                estimate::non_allocator(c, &shape),
            ))
            .consumer(graph)
            .graph(graph_plan);
        if let Some(d) = &self.device {
            b = b.device(d.clone());
        }
        if let Some(s) = self.snapshot {
            b = b.start_snapshot(s);
        }
        if not_reserved {
            b = b.warning(Warning::GraphMemoryNotReserved {
                estimate: graph_estimate.bytes,
            });
        }
        if let Some(m) = model_len.filter(|m| max_model_len > *m) {
            b = b.warning(Warning::MaxModelLenBeyondModel {
                max_model_len,
                max_position_embeddings: m,
            });
        }
        if tp > 1 {
            b = b.warning(Warning::FiguresPerRank { ranks: tp });
        }
        if let Some((conf, source)) = &self.allocator {
            b = b.allocator_config(conf.clone(), source.clone());
        }
        Ok(Resolved {
            builder: b,
            graph_estimate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{safetensors, ModelConfig, Source};
    use memplan_core::bytes::GIB;
    use memplan_core::kv::StartCheck;

    fn input(config: &str, checkpoint: Option<&str>, dtype: &str) -> DryRun {
        let config = ModelConfig::from_json_str(config).unwrap();
        let model = Model {
            name: "m".into(),
            source: Source::Path("m".into()),
            config,
            checkpoint: checkpoint.map(|h| safetensors::parse_header("h", h.as_bytes()).unwrap()),
        };
        DryRun::new(model, 24 * GIB)
            .engine("vllm@0.19".parse().unwrap())
            .block_size(Some(16))
            .dtype(dtype)
            .max_model_len(Some(4096))
            .enforce_eager(true)
    }

    fn run(d: &DryRun) -> Result<Plan> {
        d.plan()
    }

    const LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":1024,"num_hidden_layers":4,
        "num_attention_heads":8,"num_key_value_heads":8,"intermediate_size":4096,"vocab_size":32000,
        "max_position_embeddings":4096,"torch_dtype":"DTYPE"}"#;

    #[test]
    fn auto_dtype_downcasts_float32_checkpoints_like_the_engines() {
        let f32 = run(&input(&LLAMA.replace("DTYPE", "float32"), None, "auto")).unwrap();
        let bf16 = run(&input(&LLAMA.replace("DTYPE", "bfloat16"), None, "auto")).unwrap();
        assert_eq!(f32.kv_spec.dtype, KvDtype::Bf16);
        assert_eq!(
            f32.consumers.bytes(ConsumerKind::Weights),
            bf16.consumers.bytes(ConsumerKind::Weights)
        );
        assert_eq!(f32.kv.tokens, bf16.kv.tokens);
        // An explicit float32 is honoured.
        let forced = run(&input(&LLAMA.replace("DTYPE", "float32"), None, "float32")).unwrap();
        assert_eq!(forced.kv_spec.dtype, KvDtype::F32);
    }

    #[test]
    fn the_graph_reserve_follows_the_release_and_platform() {
        let cfg = LLAMA.replace("DTYPE", "bfloat16");
        let graphs = |engine: &str, platform: Option<&str>, reserve: GraphReserve| {
            let p = input(&cfg, None, "auto")
                .enforce_eager(false)
                .engine(engine.parse().unwrap())
                .platform(platform.map(str::to_string))
                .graph_reserve(reserve)
                .plan()
                .unwrap();
            (p.consumers.bytes(ConsumerKind::Graphs), p.graph.why)
        };
        // vLLM 0.19 printed its estimate and did not subtract it.
        let (b, why) = graphs("vllm@0.19", None, GraphReserve::Engine);
        assert_eq!(b, 0, "{why}");
        assert!(why.contains("vllm@0.19 does not subtract"), "{why}");
        // 0.20 and 0.21 profile graphs on CUDA only (the V1 runner, the only default).
        assert!(graphs("vllm@0.21", Some("cuda"), GraphReserve::Engine).0 > 0);
        assert_eq!(graphs("vllm@0.21", Some("rocm"), GraphReserve::Engine).0, 0);
        // 0.23 to 0.28 start a dense Llama on the V2 runner, which profiles no graphs.
        let (b, why) = graphs("vllm@0.27", Some("cuda"), GraphReserve::Engine);
        assert_eq!(b, 0, "{why}");
        assert!(why.contains("V2 model runner"), "{why}");
        // 0.29 profiles graphs on V2 too, on CUDA and ROCm.
        assert!(graphs("vllm@0.29", Some("cuda"), GraphReserve::Engine).0 > 0);
        assert!(graphs("vllm@0.29", Some("rocm"), GraphReserve::Engine).0 > 0);
        // A reserve asked for explicitly is kept.
        assert!(graphs("vllm@0.19", None, GraphReserve::Reserve).0 > 0);
    }

    #[test]
    fn absurd_capture_sizes_name_the_flag() {
        for sizes in [vec![0, 8], vec![1, u64::MAX]] {
            let mut i = input(&LLAMA.replace("DTYPE", "bfloat16"), None, "auto");
            i = i.enforce_eager(false).capture_sizes(Some(sizes));
            let e = run(&i).unwrap_err().to_string();
            assert!(e.starts_with("graph capture sizes"), "{e}");
        }
    }

    #[test]
    fn checkpoint_bytes_follow_the_loaded_dtype() {
        let h = r#"{"w":{"dtype":"BF16","shape":[1024,1024],"data_offsets":[0,2097152]}}"#;
        let cfg = LLAMA.replace("DTYPE", "bfloat16");
        let bf16 = run(&input(&cfg, Some(h), "auto")).unwrap();
        assert_eq!(
            (
                bf16.consumers
                    .get(ConsumerKind::Weights)
                    .unwrap()
                    .provenance
                    .label(),
                bf16.consumers.bytes(ConsumerKind::Weights)
            ),
            ("checkpoint", 2 << 20)
        );
        // Served in float32, the same tensors take twice the file's bytes.
        let f32 = run(&input(&cfg, Some(h), "float32")).unwrap();
        assert_eq!(f32.consumers.bytes(ConsumerKind::Weights), 4 << 20);
    }

    /// SGLang sizes its pool from the free memory it reads once its weights are loaded
    /// (`StartCheck::PoolOfFreeAfterWeights`: 0.5.9 `model_runner_kv_cache_mixin.py`
    /// `profile_max_num_token`, 0.5.23 `kv_cache_configurator.py` `_profile_available_bytes`).
    /// A measured start-up told the release takes that rule (`defaults::settings`); the dry run
    /// reads no such memory and plans within the request's share of the free memory at the
    /// start (`StartCheck::ShareOfFree`), its pipeline stages too.
    #[test]
    fn the_dry_run_plans_sglang_by_its_share_of_the_free_memory_at_the_start() {
        let cfg = LLAMA.replace("DTYPE", "bfloat16");
        let (total, free) = (24 * GIB, 12 * GIB);
        let snapshot = MemoryInfo::default()
            .with_driver(memplan_core::DriverMemory::new(Some(total), Some(free)));
        for engine in ["sglang@0.4.4", "sglang@0.5.9", "sglang@0.5.23"] {
            let d = input(&cfg, None, "auto")
                .engine(engine.parse().unwrap())
                .request(Request::Utilization(0.9))
                .device("a device half held by others", Some(snapshot));
            let settings = crate::defaults::settings(&d).unwrap();
            assert_eq!(
                settings.rules.start_check,
                StartCheck::PoolOfFreeAfterWeights,
                "{engine}"
            );
            let p = run(&d).unwrap();
            assert_eq!(
                p.sizing_rules.start_check,
                StartCheck::ShareOfFree,
                "{engine}"
            );
            // 0.9 of the 12 GiB free at the start, not the request of 0.9 of 24 GiB.
            let requested = memplan_planner::budget::requested_bytes(total, d.request).unwrap();
            assert_eq!(p.requested_bytes, requested / 2, "{engine}");
            assert_eq!(p.suggestions.engine_static_fraction, None, "{engine}");
            // Every rule but SGLang's pool rule as the release has it.
            assert_eq!(
                p.sizing_rules
                    .with_start_check(StartCheck::PoolOfFreeAfterWeights),
                settings.rules,
                "{engine}"
            );
            // A pipeline stage's dry run too.
            let stage = d.clone().extras(
                crate::consumers::Extras::default()
                    .with_pipeline_parallel(2)
                    .with_pipeline_stage(Some(1)),
            );
            let p = run(&stage).unwrap();
            assert_eq!(
                p.sizing_rules.start_check,
                StartCheck::ShareOfFree,
                "{engine}"
            );
            assert_eq!(
                crate::defaults::settings(&stage).unwrap().rules.start_check,
                StartCheck::PoolOfFreeAfterWeights,
                "{engine}"
            );
        }
        // vLLM's check needs no reading after the weights: it stands in both.
        let d = input(&cfg, None, "auto").engine("vllm@0.34".parse().unwrap());
        assert_eq!(
            run(&d).unwrap().sizing_rules.start_check,
            StartCheck::RefuseAboveFree
        );
    }
}
