//! [`Warning`]: everything a start-up or a plan wants a person to know but that does not stop
//! it. Each variant carries its figures; `Display` gives the sentence. In JSON a warning is an
//! object with a stable `code` (the variant's snake-case name), the `message` and the figures:
//! [`Warning::to_json`] for one, [`serialize_all`] for a list (what [`Plan`](crate::Plan) and
//! [`Profile`](crate::Profile) use); the derived `Serialize` alone gives the code and figures.

use memplan_core::bytes::{fmt_bytes, fmt_signed};
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

use crate::strategy::StrategyKind;

/// A warning. Codes are stable: a new situation gets a new variant, never a new wording of an
/// old code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Warning {
    /// Free memory grew while the engine was idle: another process released memory.
    ForeignMemoryReleased {
        /// Bytes released.
        bytes: u64,
    },
    /// Free memory grew inside an engine step beyond what the allocator released.
    FreeMemoryGrewInStep {
        /// The step.
        step: String,
        /// Bytes.
        bytes: u64,
    },
    /// Memory stayed held outside the allocator after graph teardown (counted as the
    /// engine's own).
    HeldAfterGraphTeardown {
        /// Bytes.
        bytes: u64,
    },
    /// Graph teardown did not bring the layers back to the phase's baseline.
    GraphTeardownIncomplete {
        /// What stayed above the baseline, one item per layer.
        leaks: Vec<String>,
    },
    /// Capturing every graph freed memory (kept negative in the record).
    NegativeCaptureWindow {
        /// Graphs captured.
        graphs: usize,
        /// The window (negative).
        bytes: i64,
    },
    /// One sample of the sampled strategy was negative despite the flush.
    NegativeSample {
        /// Graph size sampled.
        size: u32,
        /// The window (negative).
        bytes: i64,
    },
    /// The legacy strategy saw negative samples (the cache flush inside its window).
    LegacyNegativeSamples {
        /// The samples.
        samples: Vec<i64>,
    },
    /// The allocator's reserved memory shrank during a capture the conservative bound reads.
    AllocatorShrankDuringCapture {
        /// Graphs captured.
        graphs: usize,
        /// The change (negative).
        bytes: i64,
    },
    /// Where the engine's capture keeps the allocator's cache, its warm-ups, each in segments
    /// the others cannot reuse, took more than the device had free beside them: the allocator
    /// gave its cache back to serve one of them, and the engine's own capture, which keeps them
    /// all, would run at the device's limit. The plan counts what they took, whole.
    WarmUpsCachedPastDevice {
        /// What the warm-ups took in segments of their own, summed.
        took: u64,
        /// What the allocator still held cached after them (all that fitted).
        cached: u64,
    },
    /// Calibration found a declared reading or fact weaker than declared.
    CalibrationDowngrade {
        /// The reading or fact.
        item: String,
        /// What the backend declared.
        declared: String,
        /// What calibration observed.
        observed: String,
    },
    /// Memory outside the allocator could not be measured; a bound was reserved instead.
    NonAllocatorUnmeasured {
        /// The bound reserved.
        reserved: u64,
    },
    /// The engine's allocator reports no peak of reserved memory: the activation peak is the
    /// allocated peak rounded up to a documented bound of the allocator's segment rounding.
    ReservedPeakUnreported {
        /// The rounding bound used.
        bound: u64,
    },
    /// Free memory capped the KV cache below the budget.
    KvCappedByFreeMemory {
        /// The cap.
        cap: u64,
        /// What the budget allowed.
        budget: u64,
        /// Bytes others took (+) or released (-) while profiling.
        foreign: i64,
    },
    /// The device-wide reading or an allocation probe capped the KV cache below the budget:
    /// memory held outside this engine (other processes the free reading cannot see).
    KvCappedByAvailableMemory {
        /// The cap.
        cap: u64,
        /// What the budget allowed.
        budget: u64,
        /// What measured the available memory.
        source: crate::plan::PhysicalCheck,
    },
    /// Neither the driver's free reading nor a device-wide source can see memory other
    /// processes hold: the plan cannot be bounded by what is physically available from
    /// readings (a session checks it with an allocation probe instead).
    OtherProcessesUnseen {
        /// Why the free reading cannot see them.
        free_reading: String,
        /// Why no device-wide reading can.
        device_wide: String,
    },
    /// Other processes changed their memory while profiling (attributed to them).
    ForeignMemoryChanged {
        /// Bytes (+ taken, - released).
        bytes: i64,
    },
    /// Graph memory is not reserved in the budget although the engine captures graphs.
    GraphMemoryNotReserved {
        /// What capture is estimated to take outside the budget.
        estimate: u64,
    },
    /// The request is a share of the device's total memory (`gpu_memory_utilization`), but
    /// the total reading is approximate (declared so, or found so by calibration): the share
    /// is taken of the reported total, as the engine takes it, which may be off by the
    /// reading's tolerance; a byte budget says what is meant.
    UtilizationOfInexactTotal {
        /// The total the share was taken of.
        reported_total: u64,
        /// How far the reading may be off (0: not known).
        tolerance: u64,
        /// Why the reading is approximate.
        why: String,
    },
    /// The driver reports more memory than the device has as a second source reads it
    /// ([`DeviceWideMemory::total`](memplan_core::DeviceWideMemory::total): DRM sysfs
    /// `mem_info_vram_total`, NVML's framebuffer total): a misreported total, whose share could ask for memory the
    /// device does not have. The plan takes the second source's figure as the device's total.
    DriverTotalAboveDevice {
        /// The driver's total.
        driver: u64,
        /// The device's memory as the second source reads it (the total the share was taken of).
        device: u64,
    },
    /// An allocation probe found more memory allocatable than the total the plan would take a
    /// share of (the driver's, or the second source's where it stood in): that total is
    /// reported too low (a runtime or driver bug, or a partition's figure), since nothing can
    /// be allocated past the memory a device has. Where no reading measures this process, the
    /// session searches past the reported total for what it can allocate, and the plan takes
    /// the device's total as that plus what this process's allocator held then: the least the
    /// device can have (memory other processes and the context hold is not in it), so a share
    /// of it never asks for memory that is not there. Taken at the reported figure, the plan
    /// was a share of memory the device does not limit the engine to, and the probes that
    /// measure the engine's steps stopped at it and read them short.
    TotalBelowAllocatable {
        /// The total as reported.
        reported: u64,
        /// The largest allocation that succeeded.
        allocatable: u64,
        /// The total the share was taken of: `allocatable` plus what this process's allocator
        /// held.
        total: u64,
    },
    /// The request is a share of the device's total memory (`gpu_memory_utilization`), and that
    /// total has one source: the driver's reading, which nothing else checks. The backend's
    /// device-wide layer reads no total of its own (no DRM counters, no NVML, or a driver whose
    /// total already is the management layer's), and nothing the session measures bounds a
    /// total from above without filling the device: a free reading, the memory this process
    /// holds and an allocation that succeeds each show only that the device has at least so
    /// much. A driver that reports more than the device has (a runtime bug) is then told from
    /// memory another process or the runtime's context holds by nothing read at start-up, and
    /// the share, taken of the reported total as the engine takes it, asks for that share of
    /// the difference past the device's memory. Not given where an allocation probe found the
    /// total reported too low (the share is then of a measured figure,
    /// [`Warning::TotalBelowAllocatable`]). A byte budget says what is meant.
    UtilizationOfUncheckedTotal {
        /// The total the share was taken of, as the driver reports it.
        reported_total: u64,
        /// The memory the request asks for: the share of `reported_total`.
        requested: u64,
    },
    /// The driver's total is unusable (calibration made it unavailable: an APU's runtime that
    /// reports its VRAM aperture while the GPU allocates from system memory), and the share of
    /// the device (`gpu_memory_utilization`) was taken of the device's memory as a second
    /// source reads it ([`DeviceWideMemory::total`](memplan_core::DeviceWideMemory::total):
    /// DRM sysfs `mem_info_gtt_total + mem_info_vram_total` on an APU) instead of refusing.
    UtilizationOfDeviceTotal {
        /// The device's memory as the second source reads it (the total the share was taken of).
        device: u64,
        /// Why the driver's total could not be used.
        why: String,
    },
    /// The max model length exceeds what the model was trained for.
    MaxModelLenBeyondModel {
        /// Asked for.
        max_model_len: u64,
        /// The model's `max_position_embeddings`.
        max_position_embeddings: u64,
    },
    /// Figures are per rank; the engine sizes every rank like the smallest.
    FiguresPerRank {
        /// Tensor-parallel ranks.
        ranks: u64,
    },
    /// Several rank plans were combined: this one limits the rest.
    LimitingRank {
        /// Its index.
        rank: usize,
        /// Ranks combined.
        ranks: usize,
        /// Its device.
        device: String,
    },
    /// The device cannot synchronize and the engine has no synchronize hook: readings were
    /// taken without waiting for work in flight (memory the engine released may still show as
    /// held, and a window may count it against the wrong step).
    ReadingsNotSynchronized {
        /// Why the device cannot synchronize (the backend's declaration).
        device: String,
        /// Why the engine did not (its hook's answer).
        engine: String,
    },
    /// A strategy chosen by hand is not the one the capabilities call for.
    StrategyOverridden {
        /// The strategy that ran.
        chosen: StrategyKind,
        /// The automatic choice.
        automatic: StrategyKind,
    },
    /// The sampled estimate's margin would have taken too much of the KV cache's room: every
    /// size was captured and measured instead (a slower start-up).
    SampledMarginTooCostly {
        /// The sampled margin.
        margin: u64,
        /// Room the request left for the KV cache after the sampled reserve.
        kv_room: u64,
    },
    /// A plan from an engine's start-up log does not reproduce the KV tokens the log reports
    /// (by more than one block): `term` names the budget term that differs most, with the
    /// log's and the plan's figure.
    LogDisagrees {
        /// The KV tokens the log reports.
        logged_tokens: u64,
        /// The KV tokens planned.
        planned_tokens: u64,
        /// The term that differs (`weights`, `KV cache bytes per token`, ...).
        term: String,
        /// The term's figure in the log (bytes).
        logged: u64,
        /// The term's figure in the plan (bytes).
        planned: u64,
    },
    /// A plan from an engine's start-up log is for another model than the one the log names:
    /// the log's figures (weights, activation, the KV cache) are that model's.
    LogModelDiffers {
        /// The model planned (`--model`).
        given: String,
        /// The model the log names.
        logged: String,
    },
    /// The same graph captured again did not cost the same: the reserve keeps a margin for the
    /// variation measured, which a later capture can still exceed (the variation is the
    /// runtime's, not a figure memplan can bound).
    GraphCaptureVaries {
        /// The largest difference between repeats, per mille of their mean.
        spread_per_mille: u64,
        /// The margin kept for it.
        margin: u64,
    },
    /// The engine's KV cache of the planned blocks took more than the plan kept for it (its
    /// allocator rounds each tensor): the session had it allocate fewer blocks.
    KvCacheShrunk {
        /// Blocks the plan gave.
        planned_blocks: u64,
        /// Blocks allocated.
        blocks: u64,
        /// What the planned blocks took, or would take once rounded to the allocator's granule
        /// measured on smaller caches (then they were never allocated).
        taken: u64,
        /// What the plan kept for the KV cache.
        room: u64,
    },
    /// The engine allocates its KV cache after the session, and neither it (no KV hook) nor
    /// its allocator (no tensor allocation) let the session measure what that allocation takes:
    /// the blocks handed over are the plan's, which kept room for rounding each KV tensor up to
    /// `granule`, a bound from the engine's own allocations during the start-up
    /// ([`granule_bound`](crate::plan::granule_bound)), not a measurement of the cache's. An
    /// allocator that rounds the cache's tensors otherwise than it rounded the engine's own can
    /// take more than the plan kept.
    KvAllocationUnmeasured {
        /// Blocks handed over (the plan's).
        blocks: u64,
        /// The rounding the plan kept per KV tensor.
        granule: u64,
    },
    /// A reading showed the graphs taking more than the analytic bound allowed: the bound was
    /// wrong for this device, and the reading replaced it.
    GraphBoundContradicted {
        /// The analytic bound (before its margin).
        bound: u64,
        /// What the reading showed the graphs taking.
        measured: u64,
        /// Which reading.
        reading: String,
    },
    /// The device refused to record the engine's graphs although the capability declared
    /// capture supported: the plan reserves no graph memory and the engine runs eagerly.
    GraphCaptureUnsupported {
        /// The device's error.
        reason: String,
    },
    /// The KV cache cannot hold one request of `max_model_len` tokens, and the engine's release
    /// starts anyway and admits only shorter requests
    /// ([`LongRequests::CapByPool`](memplan_core::kv::LongRequests::CapByPool), SGLang): the
    /// plan stands, and longer requests are refused or truncated when they arrive.
    RequestsCappedByPool {
        /// The longest request (prompt and output, tokens) the pool admits.
        longest: u64,
        /// Tokens the pool holds.
        pool_tokens: u64,
        /// The max model length asked for.
        max_model_len: u64,
        /// The longest `max_model_len` for which one request fits, by the release's sizing.
        max_model_len_fit: Option<u64>,
    },
    /// The engine sizes its KV pool from its own readings of the free memory (SGLang's
    /// `mem_fraction_static` of the free memory at its start, taken off what is free once its
    /// weights are loaded: [`StartCheck::PoolOfFreeAfterWeights`](memplan_core::kv::StartCheck::PoolOfFreeAfterWeights)),
    /// and calibration found that reading does not follow this process's allocations: the plan
    /// cannot say what the engine's rule keeps, nor which static fraction lets it reach the
    /// plan. A reading that lags reads the weights' memory as still free, and the engine's
    /// pool is then at least the plan's; one stuck below the memory really free (an APU's
    /// carve-out) keeps the engine's pool below the plan, whatever it is told.
    EnginePoolUnmodelled {
        /// Why calibration found the free reading unusable.
        reason: String,
    },
    /// The device kept part of every raw allocation this process freed (a driver that does not
    /// give all of a freed allocation back; calibration's allocate/free pairs, or the session's
    /// own windows over allocations where nothing calibrated, each lost about this much,
    /// [`CalibrationReport::kept_per_free`](crate::calibrate::CalibrationReport)).
    /// Every free the engine makes from now on takes that much more, and how many it makes
    /// while serving (an allocator releasing its cache, a library freeing a workspace) is the
    /// engine's to decide: no plan made before serving can bound it. The plan keeps room for
    /// the frees the session itself makes after its last reading.
    DeviceKeepsMemoryOnFree {
        /// Bytes kept per free.
        bytes_per_free: u64,
        /// Whether the figure is a bound, not a measure: every round of the session's own
        /// frees lost more than its measurements can tell apart, but the rounds did not lose
        /// alike, so a free keeps at least this much (the least one lost), and the plan's
        /// figures take no keep per free from it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        at_least: bool,
    },
    /// No reading measures this process's memory (a stale, absent or lost free reading), so
    /// the session measures what is free by the largest allocation that succeeds
    /// ([`Profile::probe_baseline`](crate::Profile::probe_baseline)): at its start and around
    /// each of the engine's steps, its allocation probes hold, for an instant, everything that
    /// is free (up to the device's total). Where more is free than the request leaves, the
    /// process goes past the request by that probe, before any plan exists; nothing that does
    /// not read free memory can hold a probe under a request it cannot measure against. Also
    /// where the free reading moves in steps too coarse for the graphs `full` measures: their
    /// pass and repeats are measured by such probes instead, around their captures.
    /// `largest` is the largest allocation a probe of this session held (updated as probes
    /// run): the most a probe put on top of what the process held.
    ProbesTakeFreeMemory {
        /// The largest allocation one of the session's probes held.
        largest: u64,
    },
    /// The request is below the memory the device held in use before the session's start (its
    /// total less its free reading): whatever of that is this process's own (its runtime's
    /// context, made before any session) is past the request before anything is loaded, and
    /// the start's checks, up to `largest` at once, go past it further. No device-wide reading
    /// tells this process's own memory from other processes', so the start cannot tell whether
    /// it is past the request; such a request leaves an engine room only where other processes
    /// hold most of what is in use. Raised by [`Session::start_for`](crate::Session::start_for)
    /// and [`Session::begin_for`](crate::Session::begin_for), which know the request.
    RequestBelowMemoryInUse {
        /// The bytes the request asks for.
        requested: u64,
        /// The device's memory in use before the start (total less free).
        in_use: u64,
        /// The most the start's checks hold at once: their largest allocation, or what
        /// calibration's test capture held as measured, where that is more.
        largest: u64,
    },
    /// The session's own checks left memory held for good (measured): a runtime that keeps
    /// memory of every graph capture kept that of calibration's test capture and of the
    /// captures a strategy made to measure graphs and tore down
    /// ([`Warning::HeldAfterGraphTeardown`]); a check whose allocations the device did not
    /// give back. The plan counts it as this engine's memory, so nothing after the plan goes
    /// past the request for it; but it is held from the check that made it on, before the
    /// engine's own steps (its weights, profile run, captures) show whether the request leaves
    /// room for them, and where they take the request, this goes past it too.
    ChecksLeftHeld {
        /// Bytes the session's checks left held, in all, as its readings measured them.
        bytes: u64,
        /// How far that figure may read low: the free reading's window error, once per window
        /// that measured a part of it (a window that read nothing held is counted too: a
        /// reading in coarse steps reads a leftover smaller than a step as nothing).
        within: u64,
    },
    /// A warning of a code this build does not know, read from a plan of a newer memplan of
    /// the same schema version: its code and message as read (written back unchanged).
    #[serde(skip)]
    Unrecognized {
        /// The code as read.
        code: String,
        /// The message as read.
        message: String,
    },
}

impl Warning {
    /// The stable code (the variant's snake-case name, as in JSON); `unrecognized` for a
    /// warning read with a code this build does not know (its own code is in the variant).
    pub fn code(&self) -> &'static str {
        match self {
            Warning::ForeignMemoryReleased { .. } => "foreign_memory_released",
            Warning::FreeMemoryGrewInStep { .. } => "free_memory_grew_in_step",
            Warning::HeldAfterGraphTeardown { .. } => "held_after_graph_teardown",
            Warning::GraphTeardownIncomplete { .. } => "graph_teardown_incomplete",
            Warning::NegativeCaptureWindow { .. } => "negative_capture_window",
            Warning::NegativeSample { .. } => "negative_sample",
            Warning::LegacyNegativeSamples { .. } => "legacy_negative_samples",
            Warning::AllocatorShrankDuringCapture { .. } => "allocator_shrank_during_capture",
            Warning::WarmUpsCachedPastDevice { .. } => "warm_ups_cached_past_device",
            Warning::CalibrationDowngrade { .. } => "calibration_downgrade",
            Warning::NonAllocatorUnmeasured { .. } => "non_allocator_unmeasured",
            Warning::ReservedPeakUnreported { .. } => "reserved_peak_unreported",
            Warning::KvCappedByFreeMemory { .. } => "kv_capped_by_free_memory",
            Warning::KvCappedByAvailableMemory { .. } => "kv_capped_by_available_memory",
            Warning::OtherProcessesUnseen { .. } => "other_processes_unseen",
            Warning::ForeignMemoryChanged { .. } => "foreign_memory_changed",
            Warning::GraphMemoryNotReserved { .. } => "graph_memory_not_reserved",
            Warning::MaxModelLenBeyondModel { .. } => "max_model_len_beyond_model",
            Warning::UtilizationOfInexactTotal { .. } => "utilization_of_inexact_total",
            Warning::DriverTotalAboveDevice { .. } => "driver_total_above_device",
            Warning::TotalBelowAllocatable { .. } => "total_below_allocatable",
            Warning::UtilizationOfDeviceTotal { .. } => "utilization_of_device_total",
            Warning::UtilizationOfUncheckedTotal { .. } => "utilization_of_unchecked_total",
            Warning::DeviceKeepsMemoryOnFree { .. } => "device_keeps_memory_on_free",
            Warning::ProbesTakeFreeMemory { .. } => "probes_take_free_memory",
            Warning::RequestBelowMemoryInUse { .. } => "request_below_memory_in_use",
            Warning::ChecksLeftHeld { .. } => "checks_left_held",
            Warning::FiguresPerRank { .. } => "figures_per_rank",
            Warning::LimitingRank { .. } => "limiting_rank",
            Warning::ReadingsNotSynchronized { .. } => "readings_not_synchronized",
            Warning::StrategyOverridden { .. } => "strategy_overridden",
            Warning::SampledMarginTooCostly { .. } => "sampled_margin_too_costly",
            Warning::LogDisagrees { .. } => "log_disagrees",
            Warning::LogModelDiffers { .. } => "log_model_differs",
            Warning::GraphCaptureVaries { .. } => "graph_capture_varies",
            Warning::KvCacheShrunk { .. } => "kv_cache_shrunk",
            Warning::KvAllocationUnmeasured { .. } => "kv_allocation_unmeasured",
            Warning::GraphBoundContradicted { .. } => "graph_bound_contradicted",
            Warning::GraphCaptureUnsupported { .. } => "graph_capture_unsupported",
            Warning::RequestsCappedByPool { .. } => "requests_capped_by_pool",
            Warning::EnginePoolUnmodelled { .. } => "engine_pool_unmodelled",
            Warning::Unrecognized { .. } => "unrecognized",
        }
    }

    /// The JSON object: `code`, `message` and the figures.
    pub fn to_json(&self) -> serde_json::Value {
        if let Warning::Unrecognized { code, message } = self {
            return serde_json::json!({ "code": code, "message": message });
        }
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("message".into(), self.to_string().into());
        }
        v
    }
}

/// Serialize warnings as `code`, `message` and figures (`#[serde(serialize_with)]`).
pub fn serialize_all<S: serde::Serializer>(w: &[Warning], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(w.iter().map(Warning::to_json))
}

/// Read warnings as [`serialize_all`] writes them (`#[serde(deserialize_with)]`): a known code
/// with figures that do not fit it is an error; an unknown code (a newer memplan's) is kept as
/// [`Warning::Unrecognized`].
pub fn deserialize_all<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Warning>, D::Error> {
    use serde::de::Error as _;
    let list = Vec::<serde_json::Value>::deserialize(d)?;
    list.into_iter()
        .map(|v| {
            let code = v
                .get("code")
                .and_then(|c| c.as_str())
                .ok_or_else(|| D::Error::custom("a warning without a code"))?
                .to_string();
            match Warning::deserialize(&v) {
                Ok(w) => Ok(w),
                Err(e) if e.to_string().starts_with("unknown variant") => {
                    Ok(Warning::Unrecognized {
                        message: v
                            .get("message")
                            .and_then(|m| m.as_str())
                            .unwrap_or(&code)
                            .to_string(),
                        code,
                    })
                }
                Err(e) => Err(D::Error::custom(format!("warning {code}: {e}"))),
            }
        })
        .collect()
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::ForeignMemoryReleased { bytes } => write!(f, "free memory grew by {} while the engine was idle: another process released memory; attributed to it", fmt_bytes(*bytes)),
            Warning::FreeMemoryGrewInStep { step, bytes } => write!(f, "free memory grew by {} during {step} beyond what the allocator released: another process freed memory (window kept, not clamped)", fmt_bytes(*bytes)),
            Warning::HeldAfterGraphTeardown { bytes } => write!(f, "{} stayed held outside the allocator after graph teardown: counted as this engine's non-allocator memory", fmt_bytes(*bytes)),
            Warning::GraphTeardownIncomplete { leaks } => write!(f, "graph teardown did not restore memory: {}", leaks.join("; ")),
            Warning::NegativeCaptureWindow { graphs, bytes } => write!(f, "capturing {graphs} graphs freed {}: the cache flush was not complete or another process freed memory (kept negative in the record)", fmt_signed(*bytes)),
            Warning::NegativeSample { size, bytes } => write!(f, "sample of size {size} is negative ({}) despite the flush: another process freed memory", fmt_signed(*bytes)),
            Warning::LegacyNegativeSamples { samples } => {
                let s: Vec<String> = samples.iter().map(|d| fmt_signed(*d)).collect();
                write!(f, "vllm-legacy saw negative samples [{}]: the capture emptied the allocator cache inside the sampling window", s.join(", "))
            }
            Warning::AllocatorShrankDuringCapture { graphs, bytes } => write!(f, "the allocator's reserved memory changed by {} while capturing {graphs} graphs: the engine released memory inside the window (the bound counts no private pool)", fmt_signed(*bytes)),
            Warning::WarmUpsCachedPastDevice { took, cached } => write!(f, "the engine's warm-ups, which its capture keeps cached, took {} in segments of their own, more than the device had free beside them: the allocator gave its cache back to serve them and held {} after them; the engine's own capture would run at the device's limit, where a graph's instantiation finds no memory, so the plan counts all {} beside its KV cache", fmt_bytes(*took), fmt_bytes(*cached), fmt_bytes(*took)),
            Warning::CalibrationDowngrade { item, declared, observed } => write!(f, "calibration downgraded {item}: declared {declared}, observed {observed}"),
            Warning::NonAllocatorUnmeasured { reserved } => write!(f, "non-allocator growth could not be measured (driver free unreliable): reserved the conservative bound {}", fmt_bytes(*reserved)),
            Warning::ReservedPeakUnreported { bound } => write!(f, "the engine's allocator reports no reserved peak: the activation peak is its allocated peak rounded up to {} (segment rounding bound); report `peak_reserved` for a measured figure", fmt_bytes(*bound)),
            Warning::KvCappedByFreeMemory { cap, budget, foreign } => write!(f, "free memory caps the KV cache at {} (the budget allowed {}): memory held outside this engine ({} taken by others while profiling)", fmt_bytes(*cap), fmt_bytes(*budget), fmt_signed(*foreign)),
            Warning::KvCappedByAvailableMemory { cap, budget, source } => write!(f, "{source} caps the KV cache at {} (the budget allowed {}): memory held outside this engine, e.g. by processes the free reading cannot see", fmt_bytes(*cap), fmt_bytes(*budget)),
            Warning::OtherProcessesUnseen { free_reading, device_wide } => write!(f, "memory other processes hold is invisible to this device's readings: driver free is {free_reading}; device-wide reading: {device_wide}"),
            Warning::ForeignMemoryChanged { bytes } => write!(f, "other processes changed their memory by {} while profiling: attributed to them, not to this engine", fmt_signed(*bytes)),
            Warning::GraphMemoryNotReserved { estimate } => write!(f, "graph memory is not reserved; capture will take about {} outside the budget", fmt_bytes(*estimate)),
            Warning::DeviceKeepsMemoryOnFree { bytes_per_free, at_least: true } => write!(f, "the device keeps at least {} of every raw allocation it frees (every round of this start-up's own allocate/free checks lost more than its measurements can tell apart, though not alike: the figure is the least a free lost, not a measure, and the plan's figures take no keep from it): every free the engine makes while serving takes that much or more, and how many it makes is the engine's: no plan made before serving can bound it", fmt_bytes(*bytes_per_free)),
            Warning::DeviceKeepsMemoryOnFree { bytes_per_free, at_least: false } => write!(f, "the device keeps {} of every raw allocation it frees (each allocate/free pair its checks made left about that much held): the plan keeps room for the frees this start-up makes after its last reading, but every free the engine makes while serving takes {} more, and how many it makes is the engine's: no plan made before serving can bound it", fmt_bytes(*bytes_per_free), fmt_bytes(*bytes_per_free)),
            Warning::ProbesTakeFreeMemory { largest } => write!(f, "the session measures free memory by the largest allocation that succeeds (where no reading measures this process's memory, at its start and around each of the engine's steps; where the free reading moves in steps too coarse for the graphs, around their captures), and each such probe holds what is free for an instant (the largest held {}): where more is free than the request leaves, the process goes past the request by the probe, which it cannot bound", fmt_bytes(*largest)),
            Warning::RequestBelowMemoryInUse { requested, in_use, largest } => write!(f, "the request ({}) is below the memory the device held in use before the session's start ({}): what of that is this process's own (its runtime's context) is past the request already, and the start's checks, up to {} at once, go past it further; no device-wide reading tells this process's memory from other processes', so nothing before the engine's own steps can tell whether the request leaves it room", fmt_bytes(*requested), fmt_bytes(*in_use), fmt_bytes(*largest)),
            Warning::ChecksLeftHeld { bytes, within } => write!(f, "the session's own checks (calibration's test capture, captures torn down after measuring) left {} held for good (measured within {}): counted as this engine's memory in the plan, but held before the engine's own steps showed whether the request leaves room for them, and past the request where those take it", fmt_bytes(*bytes), fmt_bytes(*within)),
            Warning::TotalBelowAllocatable { reported, allocatable, total } => write!(f, "the device reports a total of {} but an allocation of {} succeeded: the total is reported too low, and the plan takes the device's total as {} (what was allocatable and what this process held), the least it can have; a share of the device (GPU memory utilisation) is a share of that", fmt_bytes(*reported), fmt_bytes(*allocatable), fmt_bytes(*total)),
            Warning::DriverTotalAboveDevice { driver, device } => write!(f, "the driver reports a total of {} where the device's own counters read {} ({} more than the device has): the plan takes the device's total as {}, and a share of the device (GPU memory utilisation) is a share of that", fmt_bytes(*driver), fmt_bytes(*device), fmt_bytes(driver.saturating_sub(*device)), fmt_bytes(*device)),
            Warning::UtilizationOfDeviceTotal { device, why } => write!(f, "the driver's total memory is unusable ({why}): the share of the device (GPU memory utilisation) is taken of the device's memory as its own counters read it, {}; give a byte budget if the engine takes its share of another figure", fmt_bytes(*device)),
            Warning::UtilizationOfUncheckedTotal { reported_total, requested } => write!(f, "the request is a share of the device's total memory, and the total ({}) is the driver's reading alone: nothing else this backend reads gives the device's memory (no device-wide total), and nothing measured at start-up (free readings, this process's own allocations) can show a total too high without filling the device, so a driver that reports more than the device has cannot be told from memory held by other processes or the runtime's context; the plan asks for {}, the share of the reported total as the engine takes it, and would go past the device's real share by the same share of any excess; give a byte budget to size the plan by what is meant", fmt_bytes(*reported_total), fmt_bytes(*requested)),
            Warning::UtilizationOfInexactTotal { reported_total, tolerance, why } => write!(f, "the request is a share of the device's total memory, but its total reading ({}) is approximate ({}{why}): the share is taken of the reported total, as the engine takes it; give a byte budget to size the plan by what is meant", fmt_bytes(*reported_total), if *tolerance > 0 { format!("good to {}: ", fmt_bytes(*tolerance)) } else { String::new() }),
            Warning::MaxModelLenBeyondModel { max_model_len, max_position_embeddings } => write!(f, "the max model length {max_model_len} exceeds the model's max_position_embeddings ({max_position_embeddings})"),
            Warning::FiguresPerRank { ranks } => write!(f, "figures are per rank; the engine sizes all {ranks} ranks like the smallest"),
            Warning::LimitingRank { rank, ranks, device } => write!(f, "rank {rank} ({device}) has the smallest KV cache of {ranks} ranks; the engine sizes every rank like it"),
            Warning::ReadingsNotSynchronized { device, engine } => write!(f, "readings were taken without a synchronize: the device cannot synchronize ({device}) and {engine}; memory the engine released may still read as held"),
            Warning::LogDisagrees { logged_tokens, planned_tokens, term, logged, planned } => write!(f, "the plan has {planned_tokens} KV tokens, the log {logged_tokens}: {term} differs most ({} in the plan, {} in the log, {})", fmt_bytes(*planned), fmt_bytes(*logged), fmt_signed((*planned as i64).saturating_sub(*logged as i64))),
            Warning::LogModelDiffers { given, logged } => write!(f, "the log was written for {logged}, the plan is for {given} (--model): the log's figures are {logged}'s"),
            Warning::SampledMarginTooCostly { margin, kv_room: 0 } => write!(f, "the sampled graph estimate's margin ({}) would take memory the request does not leave: no room is left for the KV cache after the sampled reserve; every size was captured and measured instead", fmt_bytes(*margin)),
            Warning::SampledMarginTooCostly { margin, kv_room } => write!(f, "the sampled graph estimate's margin ({}) would take {:.1}% of the {} left for the KV cache: every size was captured and measured instead", fmt_bytes(*margin), *margin as f64 * 100.0 / *kv_room as f64, fmt_bytes(*kv_room)),
            Warning::GraphCaptureVaries { spread_per_mille, margin } => write!(f, "the same graph captured again cost up to {:.1}% more or less: the graph reserve keeps {} for that variation, which a later capture can still exceed", *spread_per_mille as f64 / 10.0, fmt_bytes(*margin)),
            Warning::KvCacheShrunk { planned_blocks, blocks, taken, room } => write!(f, "the engine's KV cache of {planned_blocks} blocks takes {} once its allocator rounds each tensor (measured), more than the {} the plan kept for it: {blocks} blocks instead", fmt_bytes(*taken), fmt_bytes(*room)),
            Warning::KvAllocationUnmeasured { blocks, granule } => write!(f, "the engine allocates its KV cache of {blocks} blocks after the session, and neither the engine (no KV allocation hook) nor its allocator (no tensor allocation) lets memplan measure how its allocator rounds the cache's tensors: the plan kept room for rounding each up to {}, the coarsest granule the engine's own allocations during the start-up allow; an allocator that rounds the cache's tensors otherwise can take more than the plan kept", fmt_bytes(*granule)),
            Warning::GraphBoundContradicted { bound, measured, reading } => write!(f, "the {reading} showed the graphs taking {}, more than the analytic bound of {}: the measurement replaces the bound", fmt_bytes(*measured), fmt_bytes(*bound)),
            Warning::GraphCaptureUnsupported { reason } => write!(f, "the device could not record the engine's graphs ({reason}): no graph memory is reserved and the engine must run eagerly (enforce eager)"),
            Warning::StrategyOverridden { chosen, automatic } => write!(f, "graph strategy {chosen} was chosen by hand; the capabilities call for {automatic}"),
            Warning::EnginePoolUnmodelled { reason } => write!(f, "the engine sizes its KV pool from its own free-memory readings, and calibration found the free reading does not follow this process's allocations ({reason}): memplan cannot say what the engine's own rule keeps, and where its reading is below the memory really free, the engine keeps fewer tokens than planned whatever its static fraction; an engine that takes the plan's tokens as its pool is not bound by its rule"),
            Warning::RequestsCappedByPool { longest, pool_tokens, max_model_len, max_model_len_fit } => write!(f, "the KV cache holds {pool_tokens} tokens, less than one request of the max model length {max_model_len} needs: this engine release starts anyway and admits requests of at most {longest} tokens (longer ones are refused or truncated when they arrive){}; give the KV cache more memory to serve the max model length", max_model_len_fit.map_or_else(String::new, |n| format!("; a max model length of {n} would fit one request"))),
            Warning::Unrecognized { message, .. } => f.write_str(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_a_stable_code_a_message_and_the_figures() {
        let w = Warning::NegativeSample {
            size: 8,
            bytes: -(22 << 20),
        };
        let j = w.to_json();
        assert_eq!(j["code"], "negative_sample");
        assert_eq!(j["size"], 8);
        assert_eq!(j["message"], w.to_string());
        assert!(w.to_string().contains("-22.00 MiB"), "{w}");
        assert_eq!(w.code(), "negative_sample");
    }

    /// A sampled margin weighed against no room at all says so, not a share of 0 B.
    #[test]
    fn a_margin_against_no_room_names_no_share() {
        let none = Warning::SampledMarginTooCostly {
            margin: 64 << 20,
            kv_room: 0,
        }
        .to_string();
        assert!(!none.contains('%'), "{none}");
        assert!(none.contains("no room is left"), "{none}");
        let some = Warning::SampledMarginTooCostly {
            margin: 64 << 20,
            kv_room: 1 << 30,
        }
        .to_string();
        assert!(some.contains("6.2% of the 1.00 GiB"), "{some}");
    }

    /// One warning of every variant (a new variant must be added here: `code()` is matched
    /// against the JSON tag below).
    fn every() -> Vec<Warning> {
        use crate::plan::PhysicalCheck;
        let s = || "x".to_string();
        vec![
            Warning::ForeignMemoryReleased { bytes: 1 },
            Warning::FreeMemoryGrewInStep {
                step: s(),
                bytes: 1,
            },
            Warning::HeldAfterGraphTeardown { bytes: 1 },
            Warning::GraphTeardownIncomplete { leaks: vec![s()] },
            Warning::NegativeCaptureWindow {
                graphs: 1,
                bytes: -1,
            },
            Warning::NegativeSample { size: 1, bytes: -1 },
            Warning::LegacyNegativeSamples { samples: vec![-1] },
            Warning::AllocatorShrankDuringCapture {
                graphs: 1,
                bytes: -1,
            },
            Warning::WarmUpsCachedPastDevice { took: 2, cached: 1 },
            Warning::CalibrationDowngrade {
                item: s(),
                declared: s(),
                observed: s(),
            },
            Warning::NonAllocatorUnmeasured { reserved: 1 },
            Warning::ReservedPeakUnreported { bound: 1 },
            Warning::KvCappedByFreeMemory {
                cap: 1,
                budget: 2,
                foreign: 0,
            },
            Warning::KvCappedByAvailableMemory {
                cap: 1,
                budget: 2,
                source: PhysicalCheck::Probe,
            },
            Warning::OtherProcessesUnseen {
                free_reading: s(),
                device_wide: s(),
            },
            Warning::ForeignMemoryChanged { bytes: 1 },
            Warning::GraphMemoryNotReserved { estimate: 1 },
            Warning::MaxModelLenBeyondModel {
                max_model_len: 2,
                max_position_embeddings: 1,
            },
            Warning::DriverTotalAboveDevice {
                driver: 2,
                device: 1,
            },
            Warning::TotalBelowAllocatable {
                reported: 1,
                allocatable: 2,
                total: 3,
            },
            Warning::UtilizationOfDeviceTotal {
                device: 1,
                why: s(),
            },
            Warning::DeviceKeepsMemoryOnFree {
                bytes_per_free: 1,
                at_least: false,
            },
            Warning::DeviceKeepsMemoryOnFree {
                bytes_per_free: 1,
                at_least: true,
            },
            Warning::ProbesTakeFreeMemory { largest: 1 },
            Warning::ChecksLeftHeld {
                bytes: 1,
                within: 1,
            },
            Warning::RequestBelowMemoryInUse {
                requested: 1,
                in_use: 2,
                largest: 1,
            },
            Warning::UtilizationOfInexactTotal {
                reported_total: 2,
                tolerance: 1,
                why: s(),
            },
            Warning::UtilizationOfUncheckedTotal {
                reported_total: 2,
                requested: 1,
            },
            Warning::KvAllocationUnmeasured {
                blocks: 1,
                granule: 1,
            },
            Warning::EnginePoolUnmodelled { reason: s() },
            Warning::RequestsCappedByPool {
                longest: 1,
                pool_tokens: 2,
                max_model_len: 3,
                max_model_len_fit: Some(2),
            },
            Warning::FiguresPerRank { ranks: 2 },
            Warning::LimitingRank {
                rank: 1,
                ranks: 2,
                device: s(),
            },
            Warning::ReadingsNotSynchronized {
                device: s(),
                engine: s(),
            },
            Warning::StrategyOverridden {
                chosen: StrategyKind::Full,
                automatic: StrategyKind::Sampled,
            },
            Warning::SampledMarginTooCostly {
                margin: 1,
                kv_room: 2,
            },
            Warning::LogDisagrees {
                logged_tokens: 1,
                planned_tokens: 2,
                term: s(),
                logged: 1,
                planned: 2,
            },
            Warning::LogModelDiffers {
                given: s(),
                logged: s(),
            },
        ]
    }

    #[test]
    fn codes_are_the_json_tags_and_every_warning_reads_back() {
        for w in every() {
            let j = w.to_json();
            assert_eq!(j["code"], w.code(), "{w:?}");
            let back = deserialize_all(serde_json::json!([j])).unwrap();
            assert_eq!(back, vec![w]);
        }
    }

    #[test]
    fn an_unknown_code_is_kept_and_bad_figures_are_an_error() {
        let v = serde_json::json!([{"code": "from_the_future", "message": "later", "n": 1}]);
        let w = deserialize_all(v).unwrap();
        assert_eq!(w[0].code(), "unrecognized");
        assert_eq!(w[0].to_string(), "later");
        assert_eq!(w[0].to_json()["code"], "from_the_future");
        let bad = serde_json::json!([{"code": "negative_sample", "size": "eight"}]);
        let e = deserialize_all(bad).unwrap_err().to_string();
        assert!(e.contains("negative_sample"), "{e}");
        assert!(deserialize_all(serde_json::json!([{"message": "m"}])).is_err());
    }
}
