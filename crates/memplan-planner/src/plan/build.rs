//! [`PlanBuilder`]: the one way a [`Plan`] is made (see the module docs of [`crate::plan`]).

use memplan_core::bytes::{fmt_bytes, MIB};
use memplan_core::kv::{
    KvAllocation, KvLimits, KvSizing, KvSpec, LongRequests, SizingRules, StartCheck,
};
use memplan_core::{
    AllocatorConfig, Error, MemoryInfo, MemoryNowCap, Param, Reading, Refusal, Reliability, Result,
    RoundingReserve,
};
use std::collections::BTreeMap;

use super::footprint::{
    expandable_page, fewest_divisions, fit_rounded, kv_fit_layout, power2_waste, Granule,
    KvTensors, ALLOCATOR_ROUNDING_BOUND, MID_SEGMENT, MIN_BLOCK,
};
use super::physical::{self, Physical, PhysicalCheck};
use super::{Consumer, ConsumerKind, Consumers, GraphMethod, GraphPlan, Plan, SCHEMA};
use crate::budget::{self, Request};
use crate::rank::Rank;
use crate::session::Profile;
use crate::strategy::StrategyKind;
use crate::warning::Warning;

/// How the non-allocator growth measured through the free reading is described.
const NON_ALLOCATOR_BASIS: &str =
    "driver used minus allocator reserved, growth during the engine's steps";

/// How far the non-allocator growth measured through the free reading may read low: the
/// reading's window error (the largest error seen on a window, kept as the graph strategies
/// keep it, [`kept_window_error`](crate::strategy::kept_window_error): about 3.6 standard
/// deviations of one window, within the declared tolerance; the declared tolerance where
/// nothing measured it; 0 for an exact reading) times the square root of the windows the
/// growth sums ([`Profile::non_allocator_windows`]): the windows' errors are independent
/// (quiet windows between them), so their sum's standard deviation is that of one window
/// times the square root of their number, and the margin stays at 3.6 of them.
///
/// Where the graph estimate is `full`'s or `post-capture`'s, its margin already keeps one
/// window's error for the engine's other memory measured through the free reading
/// ([`crate::strategy::keeps_a_window_for_other_memory`]): counting every window here as well
/// counted that one twice, so only what the windows' error exceeds it by is kept here,
/// `window * (sqrt(n) - 1)`, and that is added to the graph margin as the margin's own windows
/// are. The graph margin keeps its captures' capture-to-capture variation (`v`,
/// [`GraphEstimate::variation`](crate::strategy::GraphEstimate)) and its two windows' error
/// (`2 window`) in quadrature, `sqrt(v^2 + (2 window)^2)`: the captures' variation and the
/// reading's errors are independent, and each margin is a bound of about the same confidence
/// (`full`'s `independent_margin`). The other windows' error is the same reading's error, as
/// independent of the captures as those two windows are, so it joins them: the windows' errors
/// stay added whole among themselves, and the variation stays in quadrature with all of them,
/// `sqrt(v^2 + (2 window + rest)^2)`, of which this keeps what the graph margin does not. Added
/// beside the graph margin whole, the variation and every window were counted at their extreme
/// at once: on an APU whose reading's windows are good to 16.5 MiB, eight windows kept 30.2 MiB
/// beside a graph margin of 356 MiB where 5.9 MiB more bound both at the same confidence, and
/// the KV cache, its tensors rounded to a coarse segment, lost a whole step by the 26 MiB:
/// 88.9% of the tokens that fit. Only the window's statistical part joins the quadrature: the
/// error kept for what calibration saw (1.25 times the largest error seen, about 3.6 standard
/// deviations, [`kept_window_error`](crate::strategy::kept_window_error)). The rest of a window
/// (the granule's worth of slack kept beside it, a step the reading moves in, a declared
/// tolerance where nothing measured the error) is an allowance, not a draw of an independent
/// error, and nothing about chance lets it shrink: it stays added whole, and on a reading that
/// saw no error (all of its window is slack) nothing changes. Where the graph margin keeps no
/// variation (`v = 0`), this is the other windows' error whole.
///
/// Each window is taken at the error the graph margin kept for its own
/// ([`GraphEstimate::window`](crate::strategy::GraphEstimate)) where that is less than the
/// reading's window error: `full` keeps its windows at the step the graph phase's windows show
/// where every one of its idle windows (12 or 32 pairs of reads of unchanged memory) read
/// exactly 0 and each snapshot is a single read. The other windows are windows of the same
/// reading, and a reading that did not move by a byte with nothing done carries no error for
/// them either: the slack and the page rounding calibration read as an error (a 37 MiB raw
/// allocation reads 38 MiB in 2 MiB pages) stand for nothing their windows can be off by. Kept
/// at the reading's window error, a process-local reading's three other windows kept 1 MiB
/// beside a graph margin whose own windows kept 1 byte each, and the KV cache, in steps of 256
/// MiB, came out 1.1 MB short of its next step: 98.28% of the oracle. Not where a window
/// moved with nothing the engine did to explain it (a quiet window within the window error,
/// a step that read free memory growing, [`Profile::non_allocator_windows_moved`]): what it
/// read may be memory that moved rather than the reading's error, and the window error kept
/// is what stands for it.
fn non_allocator_windows_error(p: &Profile) -> u64 {
    let windows = p.non_allocator_windows as f64;
    let in_graph = p
        .graph
        .as_ref()
        .filter(|g| crate::strategy::keeps_a_window_for_other_memory(g.strategy));
    let reading = p.free_window_margin();
    let window = in_graph
        .and_then(|g| g.window)
        .filter(|_| p.non_allocator_windows_moved == 0)
        .map_or(reading, |w| w.min(reading)) as f64;
    let error = match in_graph {
        Some(g) => {
            let beyond = (windows.sqrt() - 1.0).max(0.0);
            // The statistical part of a window: what is kept for the error seen, within it.
            let seen = p.free_window_error.map_or(0, |e| {
                e.saturating_add(e / crate::strategy::WINDOW_ERROR_FACTOR_INVERSE_EXCESS)
            });
            let random = (seen as f64).min(window);
            let v = g.variation as f64;
            let own = 2.0 * window;
            let rest = random * beyond;
            (window - random) * beyond
                + ((v * v + (own + rest).powi(2)).sqrt() - (v * v + own * own).sqrt())
        }
        None => window * windows.sqrt(),
    };
    error.max(0.0).ceil() as u64
}

/// Add `bytes` no reading measured to the memory outside the engine's allocator in
/// `consumers`, `more` said after its basis (a consumer measured from nothing where there is
/// none yet); nothing where `bytes` is 0.
fn add_non_allocator(consumers: &mut Consumers, bytes: u64, more: &str) {
    if bytes == 0 {
        return;
    }
    let mut c = consumers
        .get(ConsumerKind::NonAllocator)
        .cloned()
        .unwrap_or_else(|| Consumer::measured(ConsumerKind::NonAllocator, 0, "engine steps", ""));
    c.bytes = c.bytes.saturating_add(bytes);
    match &mut c.provenance {
        super::Provenance::Measured { basis, .. }
        | super::Provenance::Checkpoint { basis }
        | super::Provenance::Given { basis }
        | super::Provenance::Estimated { basis }
        | super::Provenance::GraphStrategy { basis, .. }
        | super::Provenance::NotReserved { reason: basis } => basis.push_str(more),
    }
    consumers.set(c);
}

/// Reserved for memory held outside the allocator (library workspaces, context growth) when it
/// cannot be measured because the driver's free reading is unavailable: never taken as 0. In
/// the single-GPU vLLM start-up logs of `shared/data` this memory is 0.24-0.35 GiB; 512 MiB
/// covers it with margin (multi-GPU communication buffers can take more: measure them).
pub const UNMEASURED_NON_ALLOCATOR_BYTES: u64 = 512 * MIB;

/// What an engine that sizes its pool from its own free readings
/// ([`StartCheck::PoolOfFreeAfterWeights`]) adds to a plan's budget where the free memory at its
/// start is below the request: `pool_limit`, the most its pool takes by its own rule
/// ([`StartCheck::pool_limit`]), which bounds the KV cache; and `older`, the KV budget of the
/// older model of its rule ([`StartCheck::ShareOfFree`]: the request's share of the free memory
/// at the start for the whole process), or its refusal.
///
/// The older budget stands where the free memory now bounds the cache below the engine's pool
/// and the request (the plan's physical caps): the request then has no margin behind it, and
/// the engine's activations, graphs and serving land in the memory the plan's physical cap
/// counted exactly, which the allocator's history after the plan (the segments its warm-ups
/// and captures leave cached beside the cache, the burst's fresh segment) can exceed. The
/// older rule keeps the engine's own slack (`1 - fraction` of the free memory at its start,
/// what SGLang leaves outside its static memory for those) out of the plan there.
///
/// `most`: the most the engine's pool can take by its own rule, what it read free once its
/// weights were loaded (less what its readings may be off by), where that bounds the KV budget.
///
/// `unmodelled`: the free memory at the start is below the request, but the engine's own
/// readings cannot be modelled (`PlanBuilder::engine_free_readings`): the request bounds the
/// plan, and its notes say why.
#[derive(Default)]
struct EngineRule {
    pool_limit: Option<u64>,
    most: Option<u64>,
    older: Option<Result<u64>>,
    unmodelled: bool,
}

/// Everything a plan is made from. Start with [`PlanBuilder::new`] (a dry run) or
/// [`PlanBuilder::from_profile`] (a measured start-up), override what you know better, then
/// [`build`](PlanBuilder::build).
#[derive(Debug, Clone)]
#[must_use]
pub struct PlanBuilder {
    total: u64,
    request: Request,
    kv_spec: KvSpec,
    limits: KvLimits,
    consumers: Consumers,
    graph: GraphPlan,
    start: Option<MemoryInfo>,
    /// How far the start snapshot's free figure may under-state free memory.
    start_tolerance: u64,
    /// The free memory the engine reads at its start and once its weights are loaded, where
    /// its own reading can be modelled by this session's ([`Self::engine_free_readings`]): what
    /// an engine whose pool is sized from them ([`StartCheck::pool_limit`]) reads.
    engine_free: Option<(u64, u64)>,
    /// What an allocation probe that got all it asked for allocated ([`Self::proven_for_kv`]).
    proven: Option<u64>,
    /// Why the free reading cannot be modelled as the engine reads it, where calibration
    /// found it unusable ([`Warning::EnginePoolUnmodelled`]).
    engine_free_unusable: Option<String>,
    free_now: Option<(u64, u64)>,
    available_now: Option<(u64, u64, PhysicalCheck)>,
    blind: bool,
    foreign: Option<i64>,
    warnings: Vec<Warning>,
    device: Option<String>,
    model: Option<String>,
    max_num_seqs: Option<u64>,
    tensor_parallel: u64,
    pipeline_parallel: u64,
    rank: Option<Rank>,
    rules: SizingRules,
    engine: Option<String>,
    notes: Vec<String>,
    /// Kept below the budget, per tensor of the KV cache, for the allocator's rounding of each
    /// (see [`build`](Self::build)).
    alloc_slack: u64,
    /// The KV cache is mapped in whole granules of this many bytes (post-capture).
    granularity: Option<u64>,
    /// How far the measured non-allocator growth may read low ([`non_allocator_windows_error`]):
    /// added to it where the KV cache is one backing allocation (see [`build`](Self::build)).
    non_allocator_error: u64,
    /// The granule kept for the KV cache's rounding is one the allocator's own sizes gave
    /// (every fixed granule divides it), not a default: see [`Granule`].
    rounding_divides: bool,
    /// The caching allocator's configuration the engine declared, and where it came from
    /// ([`Self::allocator_config`]); `None`: not declared (PyTorch's default rules).
    alloc_conf: Option<(AllocatorConfig, String)>,
}

impl PlanBuilder {
    /// A plan of a device of `total` bytes for `request`, sizing `kv_spec` under `limits`. No
    /// consumers yet, no graph strategy (`none`), no free-memory checks.
    pub fn new(total: u64, request: Request, kv_spec: KvSpec, limits: KvLimits) -> Self {
        PlanBuilder {
            total,
            request,
            kv_spec,
            limits,
            consumers: Consumers::new(),
            graph: GraphPlan::new(GraphMethod::Strategy(StrategyKind::None), "no graph phase"),
            start: None,
            start_tolerance: 0,
            engine_free: None,
            engine_free_unusable: None,
            proven: None,
            free_now: None,
            available_now: None,
            blind: false,
            foreign: None,
            warnings: Vec::new(),
            device: None,
            model: None,
            max_num_seqs: None,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            rank: None,
            rules: SizingRules::default(),
            engine: None,
            notes: Vec::new(),
            alloc_slack: 0,
            granularity: None,
            non_allocator_error: 0,
            rounding_divides: true,
            alloc_conf: None,
        }
    }

    /// A plan from a measured start-up: the device total of its baseline (or, where the
    /// device gives none, an absolute byte budget), every consumer it measured, its graph
    /// strategy (`why` says why it ran), the start-up check and the physical cap where the
    /// free reading measures this process, its warnings.
    pub fn from_profile(
        p: &Profile,
        why: impl Into<String>,
        request: Request,
        kv_spec: KvSpec,
        limits: KvLimits,
    ) -> Result<Self> {
        let total_reading = p.capability.reading(Reading::DriverTotal);
        let total = match (crate::budget::share_total(&p.baseline, &total_reading), request) {
            (Some(t), _) => t,
            (None, Request::Bytes(b)) => b,
            (None, r) => {
                return Err(Error::param(
                    r.param(),
                    format!(
                        "the device reports no usable total ({}): give an absolute memory budget instead",
                        p.capability.reading(Reading::DriverTotal)
                    ),
                ))
            }
        };
        // A total an allocation probe found more than allocatable is reported too low: the
        // share is taken of the least the device can have instead.
        let reported = total;
        let total = p.total_at_least(total);
        let mut b = PlanBuilder::new(total, request, kv_spec, limits);
        b.warnings = p.warnings.clone();
        if total > reported {
            b.warnings.push(Warning::TotalBelowAllocatable {
                reported,
                allocatable: p.probe_baseline.unwrap_or(0),
                total,
            });
        }
        if let (Reliability::Unavailable { reason }, Request::Utilization(_)) =
            (&total_reading, request)
        {
            // Only reached with a second total: without one, a share refused above.
            b.warnings.push(Warning::UtilizationOfDeviceTotal {
                device: total,
                why: reason.clone(),
            });
        } else if let (Some(driver), Some(device)) =
            (p.baseline.driver.total, p.baseline.device.total)
        {
            if driver > device && total == device {
                b.warnings
                    .push(Warning::DriverTotalAboveDevice { driver, device });
            }
        } else if let (Request::Utilization(_), None, true) =
            (request, p.baseline.device.total, total == reported)
        {
            // One source of the total and nothing that checks it: no second reading of the
            // device's memory, and nothing the session measures bounds a total from above
            // (each reading, held byte and allocation that succeeds shows only that the device
            // has at least so much; finding its end would fill a device others may share).
            // Said by name; a total an allocation probe raised is measured, and not said.
            b.warnings.push(Warning::UtilizationOfUncheckedTotal {
                reported_total: total,
                requested: crate::budget::requested_bytes(total, request)?,
            });
        }
        // A share of an approximate total is a share of the reported figure, as the engine
        // takes it (vLLM's V1 worker, `vllm/v1/worker/gpu_worker.py`, `Worker.init_device`:
        // `requested_memory = init_snapshot.total_memory * gpu_memory_utilization`, in the
        // 0.2x releases): said, not corrected.
        if let (
            Request::Utilization(_),
            Reliability::Approximate {
                tolerance_bytes,
                why,
            },
        ) = (request, p.capability.reading(Reading::DriverTotal))
        {
            b.warnings.push(Warning::UtilizationOfInexactTotal {
                reported_total: total,
                tolerance: tolerance_bytes,
                why,
            });
        }
        // A measured plan is held to the request: the engine's allocation of the KV cache may
        // be rounded up by its allocator (each per-layer tensor on its own), so that rounding
        // stays inside the budget.
        b.alloc_slack = ALLOCATOR_ROUNDING_BOUND;
        let weights = p.weights_held_bytes.ok_or_else(|| {
            Error::state(
                "plan",
                "the weights were not measured (load_weights did not run)",
            )
        })?;
        let act = p
            .activation_peak_bytes
            .ok_or_else(|| Error::state("plan", "the profile run did not run"))?;
        // The engine warms every size up again before its own capture, with its KV cache
        // allocated: where a warm-up took more than the profile run, that is the transient
        // peak beside the cache (not where the graphs were kept: they are captured already,
        // nor where the engine runs eagerly: it warms no graph size up, even where a graph
        // phase warmed sizes up before the device refused their capture).
        let to_capture = !p
            .graph
            .as_ref()
            .is_some_and(|g| g.kept || g.strategy == StrategyKind::None);
        // Where the engine's capture keeps the allocator's cache, the largest warm-up's segments
        // stay reserved through every capture and into serving, where a burst needs its own
        // peak beside them (a request larger than a cached block gets a segment of its own).
        // What stays cached is what the engine's warm-up sequence left there (its largest
        // warm-up's segments and a small warm-up's, measured), at least the largest warm-up.
        let kept_cache = p
            .warmup_peak_bytes
            .filter(|_| to_capture && p.capture_keeps_cache == Some(true))
            .map(|w| w.max(p.capture_cache_left_bytes.unwrap_or(0)));
        let larger_warmup = p.warmup_peak_bytes.filter(|w| *w > act && to_capture);
        // With expandable segments, the largest warm-up's pages are the free block at the end
        // of the pool's one segment (the KV cache was allocated before the engine's warm-ups),
        // and a burst larger than that block takes it and maps only the rest (PyTorch's
        // `find_expandable_block` extends the segment whose last block is free): beside the
        // burst stays only what the warm-ups left in other segments (a small warm-up's, in the
        // small requests' pool), what was left cached beyond the largest warm-up. Where the
        // largest warm-up itself peaked at a small request's size, its pages are the small
        // pool's, which a burst's large request never takes: all it left stays beside the
        // burst (an RTX 4090 whose four warm-ups of 128 KiB left one 2 MiB small segment went
        // 523 KiB past the request in serving).
        let expandable_kept = kept_cache
            .filter(|_| p.expandable_segments && !p.warmup_peak_small)
            .zip(p.warmup_peak_bytes)
            .map(|(kept, largest)| {
                act.max(largest)
                    .saturating_add(kept.saturating_sub(largest))
            });
        let activation = match (expandable_kept, kept_cache, larger_warmup) {
            (Some(e), _, _) => Consumer::measured(
                ConsumerKind::Activation,
                e,
                "capture_graphs",
                "the profile run's peak or the largest warm-up, whichever is larger (the engine's capture keeps the allocator's cache, but with expandable segments a burst takes the largest warm-up's free pages at the end of their segment), and beside it what the warm-ups left cached in segments of their own",
            ),
            (None, Some(w), _) => Consumer::measured(
                ConsumerKind::Activation,
                act.saturating_add(w),
                "capture_graphs",
                "the profile run's peak, and beside it what the engine's warm-ups leave cached (the largest warm-up's segments, and a small warm-up's in segments of their own): the engine's capture keeps the allocator's cache, so they stay reserved through serving",
            ),
            (None, None, Some(w)) => Consumer::measured(
                ConsumerKind::Activation,
                w,
                "capture_graphs",
                "what the allocator held for the graph phase's largest warm-up above where it stood before (reserved peak, at least the allocated peak): more than the profile run's peak, and the engine warms each size up again before its capture",
            ),
            (None, None, None) => Consumer::measured(
                ConsumerKind::Activation,
                act,
                "profile_run",
                "what the allocator held for the run's peak above where it stood before (reserved peak, at least the allocated peak)",
            ),
        };
        b = b
            .consumer(Consumer::measured(
                ConsumerKind::Weights,
                weights,
                "load_weights",
                "allocator reserved growth while loading (the weights as held)",
            ))
            .consumer(activation);
        let mut read_low = 0;
        let non_alloc = match p.non_allocator_growth {
            Some(g) if p.non_allocator_by_probe => Consumer::measured(
                ConsumerKind::NonAllocator,
                g.max(0) as u64,
                "allocation probes",
                "the largest allocation at the baseline less the largest now, less the allocator's growth (no reading measures this process; within the probes' resolution, on the safe side)",
            ),
            Some(g) => {
                // What the windows the growth sums may be off by, kept where nothing else in
                // the plan absorbs it (see `build`).
                read_low = non_allocator_windows_error(p);
                Consumer::measured(
                    ConsumerKind::NonAllocator,
                    g.max(0) as u64,
                    "engine steps",
                    NON_ALLOCATOR_BASIS,
                )
            }
            None => {
                b.warnings.push(Warning::NonAllocatorUnmeasured {
                    reserved: UNMEASURED_NON_ALLOCATOR_BYTES,
                });
                Consumer::estimated(
                    ConsumerKind::NonAllocator,
                    UNMEASURED_NON_ALLOCATOR_BYTES,
                    "bound: the driver free reading cannot measure memory outside the allocator",
                )
            }
        };
        b = b.consumer(non_alloc);
        b.non_allocator_error = read_low;
        b = match &p.graph {
            Some(g) => b
                .consumer(Consumer::new(
                    ConsumerKind::Graphs,
                    g.reserve,
                    super::Provenance::GraphStrategy {
                        strategy: g.strategy,
                        uncertainty_bytes: g.uncertainty,
                        basis: g.explanation.clone(),
                    },
                ))
                .graph(GraphPlan::from_estimate(g.clone(), why)),
            None => b
                .consumer(Consumer::not_reserved(
                    ConsumerKind::Graphs,
                    "no graph phase ran",
                ))
                .graph(GraphPlan::new(
                    GraphMethod::Strategy(StrategyKind::None),
                    why,
                )),
        };
        let free = p.capability.reading(Reading::DriverFree);
        if free.measures_own_usage() {
            b.start = Some(p.baseline);
            b.start_tolerance = free.tolerance_bytes();
            b.free_now = p.last.driver.free.map(|f| (f, free.tolerance_bytes()));
        }
        b.engine_free = Self::engine_free_readings(p);
        b.engine_free_unusable = match free {
            Reliability::Unavailable { reason } => Some(reason.clone()),
            _ => None,
        };
        // Memory other processes hold: where the free reading cannot see it, the device-wide
        // reading bounds the start and the KV cache; where neither can, say so by name (the
        // session then checks the plan with an allocation probe).
        match physical::judge(p) {
            Physical::FreeSeesAll => {}
            Physical::DeviceWide {
                baseline,
                last,
                tolerance,
            } => {
                if let Some(baseline) = baseline {
                    let mut start = b.start.unwrap_or(p.baseline);
                    if b.start.is_none() || baseline < start.driver.free.unwrap_or(u64::MAX) {
                        b.start_tolerance = tolerance;
                    }
                    start.driver.free = Some(baseline.min(start.driver.free.unwrap_or(u64::MAX)));
                    start.driver.total = start.driver.total.or(Some(total));
                    b.start = Some(start);
                }
                b.available_now = Some((last, tolerance, PhysicalCheck::DeviceAvailable));
            }
            Physical::Blind {
                free_reading,
                device_wide,
            } => {
                b.blind = true;
                b.warnings.push(Warning::OtherProcessesUnseen {
                    free_reading,
                    device_wide,
                });
            }
        }
        // The start-up check judges the free memory the engine found when it started: what
        // calibration's own test captures left held was free then (the budget still counts
        // it as this engine's).
        if let Some(s) = &mut b.start {
            s.driver.free = s
                .driver
                .free
                .map(|f| f.saturating_add(p.held_by_calibration));
        }
        b.foreign = Some(p.foreign_bytes);
        Ok(b)
    }

    /// The free memory an engine that sizes its pool from its own free readings
    /// ([`StartCheck::pool_limit`]) reads at its start and once its weights are loaded: the
    /// driver's free reading at the session's baseline or right before the `load_weights`
    /// step, whichever is larger, and after that step, the
    /// reading the engine takes itself (SGLang: the device's free memory as its framework
    /// reports it, after emptying the allocator's cache). `None` where calibration found that
    /// the reading does not follow this process's allocations (absent, never moving, or lagging them even after a
    /// synchronize: [`Reliability::Unavailable`](memplan_core::Reliability::Unavailable)):
    /// the engine's own reading is just as wrong, and a reading that lags allocations reads
    /// the memory the weights took as still free, so the engine's pool rule gives it at least
    /// the truth's pool and the request is what bounds the plan. A reading that is only coarse
    /// or approximate ([`Reliability::Approximate`](memplan_core::Reliability::Approximate))
    /// follows allocations within its tolerance, and the engine reads it as this session does.
    /// Also `None` where no weights were loaded yet.
    fn engine_free_readings(p: &Profile) -> Option<(u64, u64)> {
        if !p
            .capability
            .reading(Reading::DriverFree)
            .measures_own_usage()
        {
            return None;
        }
        let weights = p.steps.iter().rev().find(|s| s.name == "load_weights")?;
        // The engine reads its start where its release does: at its distributed set-up
        // (SGLang 0.5.9 `ModelRunner.init_torch_distributed`) or right before its weights
        // (0.5.22 `measure_pre_model_load_memory`). Memory that came free between the two
        // (other processes that left, calibration's checks given back) makes the second the
        // larger, and the larger start is the larger slack: the engine's pool is the smaller.
        let start = p.baseline.driver.free?.max(weights.before.driver.free?);
        let after = weights.after.driver.free?;
        Some((start, after))
    }

    /// How far what an engine that sizes its pool from its own free readings
    /// ([`Self::engine_free_readings`]) computes may be off: each of its two readings by the
    /// free reading's tolerance.
    fn engine_readings_error(&self) -> u64 {
        self.start_tolerance.saturating_mul(2)
    }

    /// The refusal the plan already owes before the engine's profile run, where there is one:
    /// the budget of a plan made from `p` now ([`from_profile`](Self::from_profile) under
    /// `rules`), its activation peak, not measured yet, counted as nothing, and no graph
    /// reserve. The activation peak and a graph reserve are at least 0, and what the session
    /// keeps beside them at the plan only adds to the budget's `used`; the weights are held
    /// as loaded, and the memory outside the allocator is counted as the plan counts it, with
    /// what its reading's windows may be off by. So a budget with no room for a KV cache now
    /// is one the plan refuses after the profile run too, and the engine need not run it: a
    /// profile run that needs memory another process took since the weights loaded runs out
    /// of memory where the refusal was certain all along. `None` where the budget has room,
    /// and where it cannot be judged yet (an error other than a refusal, which the plan names
    /// in its turn).
    pub fn refusal_before_profile(
        p: &Profile,
        request: Request,
        rules: SizingRules,
    ) -> Option<Error> {
        let mut now = p.clone();
        now.activation_peak_bytes = Some(now.activation_peak_bytes.unwrap_or(0));
        now.graph = None;
        // The budget reads no figure of the KV cache's layout or limits (they size the cache
        // inside the budget): an empty spec stands for them.
        let kv = KvSpec::new(Vec::new(), memplan_core::kv::KvDtype::Bf16, 1);
        let limits = KvLimits::new(1, 1);
        let b = Self::from_profile(&now, "before the profile run", request, kv, limits)
            .ok()?
            .sizing_rules(rules);
        b.budget().err().filter(|e| e.refusal().is_some())
    }

    /// Neither the free reading nor a device-wide source sees memory other processes hold:
    /// the plan should be checked by allocating what it still needs ([`Self::needs`]) once.
    pub fn is_blind(&self) -> bool {
        self.blind
    }

    /// The largest tolerance a physical cap subtracts (how far the free or device-wide reading
    /// may over-state what is there).
    pub fn cap_tolerance(&self) -> u64 {
        let free = self.free_now.map_or(0, |f| f.1);
        let device = self.available_now.map_or(0, |a| a.1);
        free.max(device)
    }

    /// The same plan with its physical caps taking the readings at their word (no tolerance
    /// subtracted), to be checked by an allocation probe instead ([`Self::probed`]): where a
    /// reading's tolerance is wide, a probe resolves what it leaves open.
    pub fn without_cap_tolerance(mut self) -> Self {
        if let Some(f) = &mut self.free_now {
            f.1 = 0;
        }
        if let Some(a) = &mut self.available_now {
            a.1 = 0;
        }
        self
    }

    /// Cap the KV cache by what an allocation probe found physically available at the last
    /// quiet point: `bytes`, the largest allocation that succeeded; `complete` when that was
    /// all the plan still needs ([`Self::needs`]), which leaves the plan as it is.
    ///
    /// A device-wide cap already in the builder stays (taken at its word: the probe checked
    /// the plan it gave), lowered to what the probe found.
    pub fn probed(mut self, bytes: u64, complete: bool) -> Self {
        if complete {
            self.proven = Some(bytes);
        }
        let found = if complete { u64::MAX } else { bytes };
        let avail = match self.available_now {
            Some((a, tol, _)) => a.saturating_sub(tol).min(found),
            None => found,
        };
        self.available_now = Some((avail, 0, PhysicalCheck::Probe));
        self
    }

    /// What an allocation probe that got all it asked for ([`Self::probed`], complete) proved
    /// is there for the KV cache: what it allocated less what the engine needs beside the cache
    /// ([`Self::needs_beside_kv`]). A probe proves the memory for the KV cache as the plan
    /// rounds its tensors; an allocator that rounds them more takes what the probe did not
    /// prove. `None` where no probe got all it asked for.
    pub(crate) fn proven_for_kv(&self) -> Option<u64> {
        self.proven
            .map(|p| p.saturating_sub(self.needs_beside_kv()))
    }

    /// What the engine still allocates after the plan, for a KV cache of `kv_bytes`: the KV
    /// cache with its allocator's rounding of each tensor, the activation peak and the graph reserve still to capture, plus the slack the
    /// physical cap keeps for allocator rounding. An allocation probe of this size proves it
    /// is there.
    pub fn needs(&self, kv_bytes: u64) -> u64 {
        let n = self
            .rounded_kv(kv_bytes)
            .saturating_add(self.needs_beside_kv());
        n.saturating_add(physical::rounding_slack(n))
    }

    /// What the request leaves for everything the engine still allocates after `plan` (built
    /// from this builder): the KV cache's budget and what [`Self::needs_beside_kv`] counts
    /// (the activation peak, graphs still to capture), that is the memory the engine may use
    /// less everything the plan counts as this process's already. An allocation probe that
    /// checks the plan never needs more ([`Self::needs`] adds a rounding slack on top, which
    /// past a plan that fills its budget would take the process past the request for the
    /// probe's instant): the plan keeps its KV cache within this room by its own arithmetic,
    /// so proving the room is there proves the plan fits.
    ///
    /// `u64::MAX` (no room to keep within) where the request names the KV cache's size rather
    /// than an amount of memory ([`Request::KvCacheBytes`]): the cache of that size is what the
    /// engine allocates, with its allocator's rounding on top, so the probe checks all of it.
    pub fn room_under_request(&self, plan: &Plan) -> u64 {
        if matches!(self.request, Request::KvCacheBytes(_)) {
            return u64::MAX;
        }
        plan.kv_budget_bytes.saturating_add(self.needs_beside_kv())
    }

    /// What the request leaves, before the plan, for memory the engine takes for an instant
    /// beside everything the plan counts as this process's: as [`Self::room_under_request`],
    /// the KV cache's budget and what [`Self::needs_beside_kv`] counts; 0 where what the plan
    /// counts already leaves no room for a KV cache (the plan refuses), `None` where the request
    /// names the KV cache's size rather than an amount of memory.
    pub fn room_before_plan(&self) -> Option<u64> {
        if matches!(self.request, Request::KvCacheBytes(_)) {
            return None;
        }
        Some(match self.budget() {
            Ok((_, _, b, _)) => b.kv_budget.saturating_add(self.needs_beside_kv()),
            Err(_) => 0,
        })
    }

    /// The engine's KV tensors where its allocator rounds each on its own ([`KvTensors`]: a
    /// cache of `n` blocks is that many tensors of at most an even share of its bytes each).
    /// `None` in a dry run (no slack), where the cache is mapped in whole granules
    /// (post-capture: one mapping), or where the engine's tensors are not known. vLLM v1 up to
    /// 0.28 allocates one tensor per layer of a KV-cache group
    /// (`GPUModelRunner._allocate_kv_cache_tensors`, one `torch.zeros` per tensor of
    /// `page_size * num_blocks`; a layer's own page where layers of different pages form one
    /// group), each rounded by the caching allocator; from 0.29.0 one
    /// backing allocation of `bytes_per_block * num_blocks` (`vllm/v1/worker/utils.py`
    /// `allocate_kv_cache`), whatever the pages ([`KvAllocation::OneBacking`]: one tensor of
    /// the block's bytes); SGLang a K and a V tensor per layer (or one of both, 0.5.23), in a
    /// pool per kind of layer where some layers slide (`kv_fit_layout`).
    fn kv_tensors(&self) -> Option<KvTensors> {
        if self.alloc_slack == 0 || self.granularity.is_some() {
            return None;
        }
        let s = self.kv_spec.size_with(0, &self.limits, &self.rules).ok()?;
        kv_fit_layout(&self.kv_spec, &s, &self.rules)
    }

    /// What a KV cache of `kv_bytes` takes once the allocator rounded its tensors (each as
    /// [`tensors_footprint`] says: a large one at most [`ALLOCATOR_ROUNDING_BOUND`] more, small
    /// and mid-sized ones their share of the segments they share; the bound once per layer
    /// where the layout is not known).
    fn rounded_kv(&self, kv_bytes: u64) -> u64 {
        let g = self.granule();
        let a = self.alloc();
        match self.kv_tensors() {
            Some(t) => {
                let blocks = kv_bytes / t.block_bytes.max(1);
                t.footprint(blocks, g, a).max(kv_bytes)
            }
            None => kv_bytes
                .saturating_add(self.kv_rounding_bound())
                .saturating_add(power2_waste(kv_bytes, a)),
        }
    }

    /// The caching allocator's configuration the plan takes ([`Self::allocator_config`];
    /// PyTorch's default where none was declared).
    fn alloc(&self) -> &AllocatorConfig {
        static DEFAULT: std::sync::OnceLock<AllocatorConfig> = std::sync::OnceLock::new();
        match &self.alloc_conf {
            Some((a, _)) => a,
            None => DEFAULT.get_or_init(AllocatorConfig::default),
        }
    }

    /// The allocator's rounding bound kept once per allocation the engine makes: per layer, per
    /// K and per V where it allocates them apart ([`KvAllocation::allocations`]), once where
    /// the cache is mapped or is one backing allocation ([`KvAllocation::OneBacking`]).
    fn kv_rounding_bound(&self) -> u64 {
        if self.granularity.is_some() {
            return self.alloc_slack;
        }
        let allocations = self.rules.kv_allocation.allocations(&self.kv_spec.groups);
        let per_allocation = self.alloc_slack.saturating_mul(allocations.max(1));
        // Expandable segments pack every tensor into one segment: one page past their sum
        // (and each rounded to 512 bytes), whatever the rounding of one request (a granule
        // read off the allocator's sizes there is the page, not a rounding per tensor).
        if self.alloc_slack > 0 && self.alloc().expandable_segments {
            return expandable_page(self.alloc())
                .saturating_add(MIN_BLOCK.saturating_mul(allocations.max(1)));
        }
        per_allocation
    }

    /// The KV cache's allocations as the plan keeps room for their rounding, in words, for a
    /// refusal where that room is what the cache lacked ([`RoundingReserve`]); `tensors` is the
    /// layout the plan fits ([`Self::kv_tensors`]), `None` where it keeps `bound` instead, the
    /// bound once per allocation ([`Self::kv_rounding_bound`]).
    fn rounding_words(&self, tensors: Option<&KvTensors>, bound: u64) -> RoundingWords {
        let a = self.alloc();
        let groups = &self.kv_spec.groups;
        let layers: u64 = groups.iter().map(|g| u64::from(g.num_layers)).sum();
        let kind = self.rules.kv_allocation;
        let allocations = match tensors {
            Some(t) => t.count,
            None => kind.allocations(groups).max(1),
        };
        let mut layout = match (kind, tensors) {
            (KvAllocation::OneBacking, _) => "one backing allocation every layer views".to_string(),
            (KvAllocation::PerTensor, Some(_)) => {
                "one tensor per layer of a KV-cache group".to_string()
            }
            (KvAllocation::PerTensor, None) => format!("a tensor for each of {layers} layers"),
            (KvAllocation::SplitKv, _) => {
                format!("a K and a V tensor for each of {layers} layers, allocated apart")
            }
            (KvAllocation::PairedKv, _) => {
                format!("a tensor for each of {layers} layers, K and V apart where they differ")
            }
        };
        if tensors.is_none() && kind != KvAllocation::OneBacking {
            layout.push_str(
                "; their sizes are not modelled for this cache, so each keeps a whole granule",
            );
        }
        let expandable = a.expandable_segments;
        let granule = if expandable {
            expandable_page(a)
        } else {
            self.alloc_slack
        };
        if expandable {
            layout.push_str(", packed into an expandable segment mapped in pages");
        } else if tensors.is_some() {
            // `footprint`: tensors under `kMinLargeAlloc` share the allocator's segments.
            layout.push_str(", each rounded on its own or sharing the allocator's segments");
        }
        let mut fewer = Vec::new();
        if !expandable && kind != KvAllocation::OneBacking {
            fewer.push(
                "an allocator with expandable segments (PyTorch's `expandable_segments:True`, declared to memplan) packs the tensors into pages, one page of rounding in all"
                    .to_string(),
            );
        }
        // SGLang 0.5.23 allocates K and V of one shape as one tensor per layer (engine-rules.md).
        if kind == KvAllocation::SplitKv
            && KvAllocation::PairedKv.allocations(groups) < kind.allocations(groups)
        {
            fewer.push(format!(
                "an engine release that keeps K and V in one tensor per layer (SGLang 0.5.23 on) has {} allocations to round",
                KvAllocation::PairedKv.allocations(groups)
            ));
        }
        // A layout the plan fits rounds each tensor up by less than the granule (or packs them
        // into pages, one page past their sum).
        let most = match tensors {
            None => bound,
            Some(_) if expandable => granule.saturating_add(MIN_BLOCK.saturating_mul(allocations)),
            Some(_) => granule.saturating_mul(allocations),
        };
        // Power-of-two divisions round each tensor up first, by under `1/d` of itself
        // (`power2_waste`, which the fit keeps): named, and counted in `most` once the cache's
        // bytes are known (`RoundingWords::reserve`).
        let divisions = fewest_divisions(a);
        if let Some(d) = divisions {
            layout.push_str(&format!(
                "; each first rounded up to its power-of-two division (`roundup_power2_divisions`, {d} at the coarsest), by up to 1/{d} of itself"
            ));
        }
        RoundingWords {
            allocations,
            granule,
            most,
            divisions,
            layout,
            fewer: fewer.join("; "),
        }
    }

    /// What the engine still needs once its KV cache is allocated: the activation peak and the
    /// graphs still to capture (no rounding slack: the KV cache's rounding is what takes it).
    pub fn needs_beside_kv(&self) -> u64 {
        let to_capture = if self.graph.kept {
            0
        } else {
            self.consumers.bytes(ConsumerKind::Graphs)
        };
        self.consumers
            .bytes(ConsumerKind::Activation)
            .saturating_add(to_capture)
    }

    /// Keep room for what the device kept of `frees` raw frees this start-up made after its
    /// last reading (its allocation probe), `bytes` in all: a device that keeps memory per free
    /// ([`Warning::DeviceKeepsMemoryOnFree`]) holds that much more than any reading measured,
    /// outside the engine's allocator, so it is added to that consumer (its measured figure
    /// and what the readings' windows may be off by stay as they were).
    pub fn kept_by_own_frees(self, bytes: u64, frees: u64) -> Self {
        let more = format!(
            "; plus {} the device keeps of the {frees} raw free(s) this start-up made after its last reading",
            fmt_bytes(bytes)
        );
        self.non_allocator_beyond_readings(bytes, more)
    }

    /// Keep room for what the device may keep of `frees` raw frees this start-up made after its
    /// last reading, `bytes` in all, where none was seen kept but the free reading's noise
    /// could hide it ([`Profile::unseen_kept_per_free`](crate::Profile)); added as
    /// [`kept_by_own_frees`](Self::kept_by_own_frees) adds what was seen.
    pub fn unseen_kept_by_own_frees(self, bytes: u64, frees: u64) -> Self {
        let more = format!(
            "; plus {} the device may keep, unseen within its free reading's noise, of the {frees} raw free(s) this start-up made after its last reading",
            fmt_bytes(bytes)
        );
        self.non_allocator_beyond_readings(bytes, more)
    }

    /// Keep room for what the device kept of `frees` raw frees this start-up made where it
    /// measured by allocation probes, outside every window two of its probes measured (before
    /// its first probe; between the probe that closed one step and the one that opened the
    /// next, a window attributed to other processes), `bytes` in all: `seen`, the figure the
    /// device was seen to keep per free, else the most a free may keep unseen. That memory is
    /// this process's and no figure counted it, so it is added to the memory outside the
    /// allocator. The probes after those frees found less allocatable by it, so no cap is
    /// lowered.
    pub fn kept_by_frees_between_probes(mut self, bytes: u64, frees: u64, seen: bool) -> Self {
        let how = if seen {
            "the device keeps"
        } else {
            "the device may keep, unseen within its probes' slack,"
        };
        let more = format!(
            "; plus {} {how} of the {frees} raw free(s) this start-up made outside the windows its allocation probes measured",
            fmt_bytes(bytes)
        );
        add_non_allocator(&mut self.consumers, bytes, &more);
        self
    }

    /// Add `bytes` no reading measured to the memory outside the engine's allocator, `more`
    /// said after its basis ([`add_non_allocator`]).
    ///
    /// The frees came after the last reading and after the allocation probe (their own tries
    /// are those frees): what free or available memory the physical caps took from them
    /// (`free_now`, `available_now`) was there before the frees kept their share, so each cap
    /// is lowered by it too. A plan capped by its probe to 1.2 MB of what the probe found lost
    /// the 4 MiB its last try's free kept, and the engine ran out of memory in its first burst.
    fn non_allocator_beyond_readings(mut self, bytes: u64, more: String) -> Self {
        add_non_allocator(&mut self.consumers, bytes, &more);
        if let Some(f) = &mut self.free_now {
            f.0 = f.0.saturating_sub(bytes);
        }
        if let Some(a) = &mut self.available_now {
            a.0 = a.0.saturating_sub(bytes);
        }
        self
    }

    /// Add a consumer, replacing the one of its kind (a figure the caller knows better).
    pub fn consumer(mut self, c: Consumer) -> Self {
        if c.kind == ConsumerKind::NonAllocator {
            self.non_allocator_error = 0;
        }
        self.consumers.set(c);
        self
    }

    /// How graph memory entered the plan.
    pub fn graph(mut self, g: GraphPlan) -> Self {
        self.graph = g;
        self
    }

    /// Refuse when free memory in this snapshot (taken before the engine loaded anything) is
    /// below the requested memory.
    pub fn start_snapshot(mut self, s: MemoryInfo) -> Self {
        self.start = Some(s);
        self
    }

    /// Cap the KV cache by what is free now (after the engine's steps), `tolerance` being how
    /// far the reading may over-state it.
    pub fn free_now(mut self, free: u64, tolerance: u64) -> Self {
        self.free_now = Some((free, tolerance));
        self
    }

    /// The KV cache will be mapped in whole granules of `bytes` (post-capture: the device's
    /// mapping granularity), as one region at the start of its range (`session::kv_cache::map`):
    /// the KV cache granted is rounded down to whole granules, so its blocks, rounded up to a
    /// granule when mapped, stay inside it. A cache mapped in several regions (K and V, or
    /// each layer, apart) would round each up and needs a granule per region besides.
    pub fn mapping_granularity(mut self, bytes: u64) -> Self {
        self.granularity = Some(bytes);
        self
    }

    /// Add a warning.
    pub fn warning(mut self, w: Warning) -> Self {
        self.warnings.push(w);
        self
    }

    /// The device's name for people.
    pub fn device(mut self, label: impl Into<String>) -> Self {
        self.device = Some(label.into());
        self
    }

    /// The model's name.
    pub fn model(mut self, name: impl Into<String>) -> Self {
        self.model = Some(name.into());
        self
    }

    /// Requests per step (reported, and used by engine flags).
    pub fn max_num_seqs(mut self, n: u64) -> Self {
        self.max_num_seqs = Some(n);
        self
    }

    /// Tensor-parallel ranks the per-rank figures belong to.
    pub fn tensor_parallel(mut self, ranks: u64) -> Self {
        self.tensor_parallel = ranks;
        self
    }

    /// Pipeline stages of the deployment (the figures are one stage's).
    pub fn pipeline_parallel(mut self, stages: u64) -> Self {
        self.pipeline_parallel = stages;
        self
    }

    /// The rank the plan is for (a measured start-up's): its tensor- and pipeline-parallel
    /// sizes become the plan's.
    pub fn rank(mut self, rank: Rank) -> Self {
        self.tensor_parallel = rank.tensor_parallel_size;
        self.pipeline_parallel = rank.pipeline_parallel_size;
        self.rank = Some(rank);
        self
    }

    /// The engine release's KV sizing rules (default: vLLM 0.19's, [`SizingRules::default`]).
    pub fn sizing_rules(mut self, rules: SizingRules) -> Self {
        self.rules = rules;
        self
    }

    /// The engine release the plan is for (`vllm@0.34`).
    pub fn engine(mut self, e: impl Into<String>) -> Self {
        self.engine = Some(e.into());
        self
    }

    /// Notes for people: which rule read the config, which engine rules applied.
    pub fn notes(mut self, notes: Vec<String>) -> Self {
        self.notes.extend(notes);
        self
    }

    /// The engine's caching allocator runs with `conf` (PyTorch's option string, parsed by
    /// [`AllocatorConfig::parse`]); `source` says where the plan got it (a flag, an
    /// environment variable, the engine). Where the plan keeps room for the allocator's
    /// rounding of the KV cache's tensors (a measured start-up), it takes them to round and
    /// share segments as `conf` says (`footprint` in `plan/build.rs`): expandable segments,
    /// power-of-two divisions, `max_split_size_mb`, `large_segment_size_mb`. A note says which
    /// configuration the plan took, and from where. Not declared: PyTorch's default rules,
    /// the same figures as declaring the default configuration.
    pub fn allocator_config(mut self, conf: AllocatorConfig, source: impl Into<String>) -> Self {
        self.alloc_conf = Some((conf, source.into()));
        self
    }

    /// The caching allocator's configuration declared ([`Self::allocator_config`]).
    pub fn declared_allocator_config(&self) -> Option<&AllocatorConfig> {
        self.alloc_conf.as_ref().map(|(a, _)| a)
    }

    /// Where the declared configuration packs the KV cache into expandable segments whose page
    /// the plan takes at a declared `large_segment_size_mb` coarser than PyTorch's 20 MiB
    /// `kLargeBuffer` (a release may map either, [`expandable_page`]): that coarse page, and
    /// this builder with the 20 MiB page (the declaration without `large_segment_size_mb`), whose
    /// plan is the one a session that measured the finer page would have made. `None` elsewhere.
    pub(crate) fn with_finer_page(&self) -> Option<(u64, PlanBuilder)> {
        let (conf, source) = self.alloc_conf.as_ref()?;
        let coarse = expandable_page(conf);
        if !conf.expandable_segments || coarse <= MID_SEGMENT {
            return None;
        }
        let mut fine = conf.clone();
        fine.large_segment_size = None;
        let mut b = self.clone();
        b.alloc_conf = Some((fine, source.clone()));
        Some((coarse, b))
    }

    /// Nothing will measure the engine's allocation of its KV cache: a measured plan keeps, per
    /// KV tensor, room for rounding it up to `granule` (a bound from the engine's own
    /// allocations, [`granule_bound`](super::granule_bound); at least [`ALLOCATOR_ROUNDING_BOUND`]), or where nothing
    /// bounds it (`None`), to the 20 MiB segment PyTorch's rules give every request below
    /// `kMinLargeAlloc`, the coarsest they give one request. Returns the granule kept (0 in a
    /// dry run, which keeps none).
    pub fn unmeasured_kv_allocation(&mut self, granule: Option<u64>) -> u64 {
        if self.alloc_slack > 0 {
            // The coarsest PyTorch's rules give one request: the mid-sized segment
            // (`large_segment_size_mb` where declared larger), which is also an expandable
            // segment's page.
            let coarsest = MID_SEGMENT.max(self.alloc().mid_segment());
            self.alloc_slack = self.alloc_slack.max(granule.unwrap_or(coarsest));
            // A default granule bounds the rounding, not its steps (see [`Granule`]); nor does
            // the bound read off the allocator's sizes where they mix size classes (weights in
            // shared 20 MiB segments beside a 1.2 GiB activation rounded to the granule gave
            // 10 MiB of 3,400 and 1,230 MiB where the granule is 6 MiB). One backing allocation
            // keeps the whole bound beside it (one granule, at most); a tensor per layer keeps
            // each rounded up to the bound, the model the sweeps hold it to (keeping the whole
            // bound per tensor cost the unmeasured group 19 runs below the floor of 500).
            self.rounding_divides = granule == Some(self.alloc_slack)
                && self.rules.kv_allocation != KvAllocation::OneBacking;
        }
        self.alloc_slack
    }

    /// [`unmeasured_kv_allocation`](Self::unmeasured_kv_allocation) where the engine's own
    /// allocations bound the granule by `bound` without showing that it divides it
    /// ([`GranuleBound::AtMost`](super::GranuleBound::AtMost)): each KV tensor keeps room for
    /// a rounding up by less than the bound, never a rounding to a multiple of it.
    pub fn unmeasured_kv_allocation_at_most(&mut self, bound: u64) -> u64 {
        let kept = self.unmeasured_kv_allocation(Some(bound));
        self.rounding_divides = false;
        kept
    }

    /// The KV cache's rounding as the plan keeps room for it ([`Granule`]).
    fn granule(&self) -> Granule {
        if self.rounding_divides {
            Granule::Multiple(self.alloc_slack)
        } else {
            Granule::AtMost(self.alloc_slack)
        }
    }

    /// The consumers so far.
    pub fn consumers(&self) -> &Consumers {
        &self.consumers
    }

    /// The KV cache to size.
    pub fn kv_spec(&self) -> &KvSpec {
        &self.kv_spec
    }

    /// The request-shape limits.
    pub fn limits(&self) -> KvLimits {
        self.limits
    }

    /// The engine release's KV sizing rules.
    pub fn rules(&self) -> SizingRules {
        self.rules
    }

    /// The engine release the plan is for, when set.
    pub fn engine_release(&self) -> Option<&str> {
        self.engine.as_deref()
    }

    /// Requests per step, when set.
    pub fn requests_per_step(&self) -> Option<u64> {
        self.max_num_seqs
    }

    /// The notes so far.
    pub fn notes_so_far(&self) -> &[String] {
        &self.notes
    }

    /// The budget of the plan this builder makes ([`budget::compute_within`]): its consumers
    /// (the measured memory outside the allocator with what its reading's windows may be off
    /// by), the memory the engine's own start-up check lets it use where that is below its
    /// request ([`budget::start_check`]), and the budget; refused ([`Error::DoesNotFit`]) where
    /// the consumers leave no room for a KV cache.
    fn budget(&self) -> Result<(Consumers, Option<u64>, budget::Budget, EngineRule)> {
        let fixed_kv = matches!(self.request, Request::KvCacheBytes(_));
        // What is left of the budget after the KV cache is under a block and (where the cache
        // is rounded once, as one backing allocation, tensors packed into an expandable
        // segment, or a range mapped after capture) under a granule, and a free reading that read the engine's memory outside
        // the allocator low would hand that memory to the cache and take the engine past the
        // request. The plan keeps what the reading's windows may be off by (beyond the window a
        // measured graph reserve's margin keeps for them, `non_allocator_windows_error`),
        // whatever the cache's layout: a tensor per layer was once taken to absorb it in the
        // rounding of its tensors, but a few tensors on a fine granule absorb nothing (an eager
        // engine with four KV tensors on a reading in 32 MiB steps went up to 16 MiB past the
        // request).
        let mut consumers = self.consumers.clone();
        if !fixed_kv {
            // Added to the measured consumer as what the session's own frees keep is, so its
            // basis keeps saying that too.
            add_non_allocator(
                &mut consumers,
                self.non_allocator_error,
                &format!(
                    ", plus what the free reading's windows may be off by beyond what the graph reserve's margin keeps for them ({})",
                    fmt_bytes(self.non_allocator_error)
                ),
            );
        }
        // The engine's own start-up check (`SizingRules::start_check`): vLLM refuses a request
        // above the free memory; SGLang takes its fraction of the free memory, so where that is
        // below the request the plan is made within the request's share of it.
        let mut within = None;
        if let (Some(s), false) = (&self.start, fixed_kv) {
            let requested = budget::requested_bytes(self.total, self.request)?;
            within = budget::start_check(
                self.rules.start_check,
                s,
                self.total,
                requested,
                &self.request,
                self.start_tolerance,
            )?;
        }
        let mut b =
            budget::compute_within(self.total, self.request, &consumers, within).map_err(|e| {
                budget::with_free_at_start(e, self.start.as_ref().and_then(|s| s.driver.free))
            })?;
        // An engine that sizes its pool from its own free readings (SGLang: the free memory
        // after its weights less its slack, `StartCheck::pool_limit`) keeps no more than that,
        // whatever `--max-total-tokens` asks; the plan does not take that pool as a bound but
        // gives the engine the fraction whose pool reaches the plan's KV cache
        // (`Suggestions::engine_static_fraction`, in `build`). The request and the memory free
        // now bound the plan, as for every engine. The pool the request's own share would give
        // is noted where the free memory at the start is below the request.
        // Where the engine's readings cannot be modelled (`engine_free_readings`), the request
        // alone bounds it.
        let mut rule = EngineRule::default();
        if let (Some(s), false, StartCheck::PoolOfFreeAfterWeights) =
            (&self.start, fixed_kv, self.rules.start_check)
        {
            // Whatever its fraction, the engine's pool is at most what it read free once its
            // weights were loaded (a fraction of 1): memory that came free later (other
            // processes that left) is not in it.
            if let Some((_, after)) = self.engine_free {
                let most = after.saturating_sub(self.engine_readings_error());
                if most < b.kv_budget {
                    b.kv_budget = most;
                    rule.most = Some(most);
                }
            }
            let older_within = budget::start_check(
                StartCheck::ShareOfFree,
                s,
                self.total,
                b.requested,
                &self.request,
                self.start_tolerance,
            )?;
            match (older_within, self.engine_free) {
                (Some(_), None) => rule.unmodelled = true,
                (Some(w), Some((start, after))) => {
                    rule.pool_limit =
                        self.rules
                            .start_check
                            .pool_limit(b.requested, self.total, start, after);
                    // Where the free memory now bounds the cache below that (`build`'s physical
                    // caps), the older rule's budget stands instead: see `EngineRule`.
                    rule.older = Some(
                        budget::compute_within(self.total, self.request, &consumers, Some(w))
                            .map(|o| o.kv_budget)
                            .map_err(|e| budget::with_free_at_start(e, s.driver.free)),
                    );
                }
                (None, _) => {}
            }
        }
        Ok((consumers, within, b, rule))
    }

    /// Make the plan. Errors: a bad request (naming the [`Param`]), overflow, and
    /// [`Error::DoesNotFit`] with a [`Refusal`]: free memory below the request at the start,
    /// consumers beyond the request or the device, one request of the max model length not
    /// fitting (with the longest that fits).
    pub fn build(self) -> Result<Plan> {
        let span = tracing::info_span!("plan");
        let _e = span.enter();
        if self.tensor_parallel == 0 {
            return Err(Error::param(Param::TensorParallel, "must be > 0"));
        }
        if self.pipeline_parallel == 0 {
            return Err(Error::param(Param::PipelineParallel, "must be > 0"));
        }
        if let Some(r) = &self.rank {
            r.validate()?;
        }
        let fixed_kv = matches!(self.request, Request::KvCacheBytes(_));
        // A measured plan fits the KV cache's tensors, each rounded by the allocator, in what it
        // keeps for the cache (see `fit_rounded`); a mapped cache is rounded down to whole
        // granules of its mapping.
        let per_tensor = !fixed_kv && self.alloc_slack > 0 && self.granularity.is_none();
        let fit = (self.granule(), self.kv_tensors(), self.kv_rounding_bound());
        let rounding_words = per_tensor.then(|| self.rounding_words(fit.1.as_ref(), fit.2));
        let alloc = self.alloc().clone();
        let readings_error = self.engine_readings_error();
        let (consumers, within, b, engine_rule) = self.budget()?;
        let pool_limit = engine_rule.pool_limit;
        let mut notes = self.notes;
        if let Some((a, source)) = &self.alloc_conf {
            notes.push(alloc_conf_note(
                a,
                source,
                self.alloc_slack > 0,
                self.granularity.is_some(),
            ));
        }
        if let (Some(w), Some(free)) = (within, self.start.as_ref().and_then(|s| s.driver.free)) {
            notes.push(format!(
                "free memory at the start ({}) is below the request ({}); the engine takes its fraction of the memory free at its start and refuses no request for it, so the plan is made within the request's share of that free memory, {}",
                fmt_bytes(free),
                self.request.describe(),
                fmt_bytes(w)
            ));
        }
        if let Some(most) = engine_rule.most {
            notes.push(format!(
                "the engine sizes its pool from the free memory it reads once its weights are loaded, whatever its static fraction: at most {}, which bounds the plan (memory that came free later is not in it)",
                fmt_bytes(most)
            ));
        }
        if engine_rule.unmodelled {
            notes.push(
                "free memory at the start is below the request, and the engine sizes its pool from its own free readings, but calibration found the free reading not following this process's allocations: the engine's readings are as wrong (one that lags reads the weights' memory as still free, so its pool is not the smaller), and the request bounds the plan".to_string(),
            );
        }
        if let (Some(s), true) = (&self.start, fixed_kv) {
            budget::check_free(s, b.requested, &self.request, self.start_tolerance)?;
        }
        let mut warnings = self.warnings;
        if let (Some(reason), false, StartCheck::PoolOfFreeAfterWeights) =
            (&self.engine_free_unusable, fixed_kv, self.rules.start_check)
        {
            warnings.push(Warning::EnginePoolUnmodelled {
                reason: reason.clone(),
            });
        }
        // The whole budget: a tensor-by-tensor fit counts its allocator's rounding below
        // (`fit_rounded`), and a mapped cache (post-capture) is rounded down to whole granules,
        // its blocks, mapped rounded up to a granule, staying inside them. Keeping a granule
        // besides lost up to two granules' blocks (a 117 MB budget on a 2 MiB granularity held
        // 109 blocks of 1 MB where 111 fit in its 55 granules).
        let mut kv_bytes = b.kv_budget;
        // What the memory physically there capped the KV cache at, and what found it.
        let mut capped_by: Option<(u64, PhysicalCheck)> = None;
        let mut physical_check = None;
        let to_capture = if self.graph.kept { 0 } else { b.graph_reserve };
        let activation = consumers.bytes(ConsumerKind::Activation);
        // Where the plan warns that the engine's later capture may exceed its graph reserve
        // (`graph_capture_varies`), the reserve keeps one capture's bound on the variation: past
        // the request, what a later capture takes beyond it is an over-request the warning
        // names; past the memory physically there, it is an out-of-memory no warning excuses.
        // So a physical cap keeps the bound on the difference between two captures that the
        // strategies keep where they do not warn, `sqrt(2)` times one capture's: the rest of it
        // on top. A full capture of 67 sizes varying by 20% from one capture to the next,
        // capped by the free memory beside another process, took 87 MB more in the engine's
        // capture than the measured pass, and the serving burst ran out of memory.
        let warned_margin = warnings.iter().find_map(|w| match w {
            Warning::GraphCaptureVaries { margin, .. } if to_capture > 0 => Some(*margin),
            _ => None,
        });
        let beyond_warned = warned_margin.map_or(0, |m| {
            (m as f64 * (std::f64::consts::SQRT_2 - 1.0)).ceil() as u64
        });
        let cap_of = |avail: u64, tol: u64| {
            let cap = avail
                .saturating_sub(activation)
                .saturating_sub(to_capture)
                .saturating_sub(beyond_warned)
                .saturating_sub(tol);
            // Slack for the allocator's rounding of the allocations still to come: a cap that
            // is met exactly leaves a large allocation nowhere to go. Where the KV cache is fitted
            // tensor by tensor as the allocator rounds each (`fit_rounded`), its rounding is
            // counted there, and the activation peak and the graphs are what the allocator held
            // for them (reserved, so rounded already): no slack on top.
            if per_tensor {
                cap
            } else {
                cap.saturating_sub(physical::rounding_slack(cap))
            }
        };
        if let Some((free, tol)) = self.free_now {
            let cap = cap_of(free, tol);
            // A free reading that cannot see other processes still bounds the plan from above,
            // but it is not what checked it physically.
            physical_check = (!self.blind).then_some(PhysicalCheck::DriverFree);
            if cap < kv_bytes {
                warnings.push(Warning::KvCappedByFreeMemory {
                    cap,
                    budget: kv_bytes,
                    foreign: self.foreign.unwrap_or(0),
                });
                kv_bytes = cap;
                capped_by = Some((cap, PhysicalCheck::DriverFree));
            }
        }
        if let Some((avail, tol, check)) = self.available_now {
            let cap = cap_of(avail, tol);
            physical_check = Some(check);
            if cap < kv_bytes {
                warnings.push(Warning::KvCappedByAvailableMemory {
                    cap,
                    budget: kv_bytes,
                    source: check,
                });
                kv_bytes = cap;
                capped_by = Some((cap, check));
            }
        }
        // Whether the engine starts with a cache of `bytes`, fitted as the plan fits it: one
        // request of the max model length, or a shorter pool the engine admits requests from.
        let starts = |bytes: u64| {
            let fitted = match self.granularity.filter(|g| *g > 1) {
                _ if per_tensor => fit_rounded(bytes, fit.0, fit.1.as_ref(), fit.2, &alloc),
                Some(g) => bytes / g * g,
                None => bytes,
            };
            self.kv_spec
                .size_with(fitted, &self.limits, &self.rules)
                .is_ok_and(|k| {
                    k.max_concurrency >= 1.0
                        || self
                            .rules
                            .long_requests
                            .longest_admitted(k.tokens, self.limits.max_model_len)
                            .is_some()
                })
        };
        // The engine's own pool rule where the free memory at its start is below the request
        // (`EngineRule`): where the free memory now, not the request or the engine's pool,
        // bounds the cache, the older rule's budget stands, as a margin below the physical
        // cap. It is no rule of the engine's (SGLang refuses no request for the free memory,
        // only a pool it cannot start with): where it leaves the engine no pool to start with
        // (the consumers alone past its share, or a cache shorter than the engine's least),
        // it would turn a plan the free memory holds into a refusal, and the physical cap
        // stands, which keeps the bound on two captures' difference and names the variation
        // (`graph_capture_varies`). An L4 beside 3 GiB of others, graphs varying by 40%: the
        // share refused by 718 MiB where the engine alone held 29,120 tokens.
        if let (Some(older), true) = (
            engine_rule.older,
            capped_by.is_some() && warned_margin.is_some(),
        ) {
            match older {
                Ok(older) if older < kv_bytes && starts(older) => {
                    notes.push(format!(
                        "the free memory now bounds the KV cache below the engine's own pool: the plan keeps the request's share of the free memory at the start for the whole process, {} for the KV cache",
                        fmt_bytes(older)
                    ));
                    kv_bytes = older;
                }
                Ok(older) if older < kv_bytes => notes.push(format!(
                    "the free memory now bounds the KV cache below the engine's own pool; the request's share of the free memory at the start would leave the KV cache {}, too little for the engine to start with, so the free memory bounds the plan",
                    fmt_bytes(older)
                )),
                Ok(_) => {}
                Err(_) => notes.push(
                    "the free memory now bounds the KV cache below the engine's own pool; the request's share of the free memory at the start would leave it no room (the consumers alone take more), so the free memory bounds the plan".to_string(),
                ),
            }
        }
        if let Some(g) = self.granularity.filter(|g| *g > 1) {
            kv_bytes = kv_bytes / g * g;
        }
        let room = kv_bytes;
        if per_tensor {
            kv_bytes = fit_rounded(kv_bytes, fit.0, fit.1.as_ref(), fit.2, &alloc);
        }
        if let Some(f) = self.foreign.filter(|f| *f != 0) {
            warnings.push(Warning::ForeignMemoryChanged { bytes: f });
        }
        let kv = self
            .kv_spec
            .size_with(kv_bytes, &self.limits, &self.rules)?;
        // A refusal names the memory there where it, not the request, left the cache too
        // small: the request's budget alone held a cache the engine starts with.
        let capped = || {
            let (cap, source) = capped_by?;
            starts(b.kv_budget).then(|| MemoryNowCap {
                budget: b.kv_budget,
                cap,
                source: source.to_string(),
            })
        };
        // One request of `max_model_len` does not fit: vLLM refuses to start; an engine that
        // admits shorter requests (SGLang) starts where its pool holds its least, warned.
        if kv.max_concurrency < 1.0 {
            let rule = self.rules.long_requests;
            let max_model_len = self.limits.max_model_len;
            let starts = |s: &KvSizing| {
                s.max_concurrency >= 1.0 || rule.longest_admitted(s.tokens, max_model_len).is_some()
            };
            // The room kept for the allocator's rounding is named where it is what the cache
            // lacked: the room without it holds more blocks, and either none were left or the
            // engine would start with them.
            let rounding = rounding_words.filter(|_| kv_bytes < room).and_then(|w| {
                let without = self
                    .kv_spec
                    .size_with(room, &self.limits, &self.rules)
                    .ok()?;
                (without.usable_blocks > kv.usable_blocks
                    && (kv.usable_blocks == 0 || starts(&without)))
                .then(|| w.reserve(room, kv_bytes))
            });
            match (rule, rule.longest_admitted(kv.tokens, max_model_len)) {
                (LongRequests::Refuse, _) => {
                    return Err(Error::does_not_fit(Refusal::RequestDoesNotFit {
                        max_model_len,
                        blocks_per_request: kv.blocks_per_request,
                        usable_blocks: kv.usable_blocks,
                        kv_bytes,
                        max_model_len_fit: kv.max_model_len_fit,
                        rounding,
                        capped: capped(),
                    }))
                }
                (_, Some(longest)) => warnings.push(Warning::RequestsCappedByPool {
                    longest,
                    pool_tokens: kv.tokens,
                    max_model_len,
                    max_model_len_fit: kv.max_model_len_fit,
                }),
                // An engine that starts with a pool shorter than one request is refused by its
                // own start rule, an empty pool (not one block) included: it asks for a pool of
                // its least tokens, not for one request of the max model length.
                (LongRequests::CapByPool { least_tokens }, None) => {
                    return Err(Error::does_not_fit(Refusal::PoolTooSmall {
                        pool_tokens: kv.tokens,
                        least_tokens,
                        kv_bytes,
                        rounding,
                        capped: capped(),
                    }))
                }
            }
        }
        // The fraction that lets an engine sizing its pool from its own readings reach the
        // plan's KV cache (`Suggestions::engine_static_fraction`): its pool must hold the
        // cache's bytes and what its two readings may each be off by.
        let mut suggestions = b.suggestions;
        if let (Some((start, after)), false) = (self.engine_free, fixed_kv) {
            let need = kv_bytes.saturating_add(readings_error);
            // The request's share as `--emit-args` writes it.
            let share = budget::fraction_thousandths(b.requested, b.total, 1.0);
            if let Some(k) = self
                .rules
                .start_check
                .thousandths_for_pool(need, start, after)
            {
                let k = k.max(share);
                suggestions.engine_static_fraction = Some(f64::from(k) / 1000.0);
                notes.push(format!(
                    "the engine sizes its pool from the free memory it reads once its weights are loaded ({}) less the free memory it read at its start ({}) times one less its static fraction: {:.3} lets that pool hold the plan's KV cache{}",
                    fmt_bytes(after),
                    fmt_bytes(start),
                    f64::from(k) / 1000.0,
                    match pool_limit {
                        Some(l) if l < kv_bytes => format!(
                            " (the request's share of the device would give it {})",
                            fmt_bytes(l)
                        ),
                        _ => String::new(),
                    }
                ));
            }
        }
        let plan = Plan {
            schema: SCHEMA,
            device: self.device,
            model: self.model,
            request: self.request,
            total_bytes: b.total,
            requested_bytes: b.requested,
            consumers,
            graph: self.graph,
            kv_budget_bytes: b.kv_budget,
            kv_cache_bytes: kv_bytes,
            capped_by_free_bytes: capped_by.map(|(cap, _)| cap),
            physical_check,
            kv_spec: self.kv_spec,
            limits: self.limits,
            max_num_seqs: self.max_num_seqs,
            tensor_parallel_size: self.tensor_parallel,
            pipeline_parallel_size: self.pipeline_parallel,
            rank: self.rank,
            kv_cache_tokens: kv.tokens,
            kv,
            sizing_rules: self.rules,
            suggestions,
            foreign_bytes: self.foreign,
            ranks: None,
            engine: self.engine,
            engine_args: BTreeMap::new(),
            notes,
            warnings,
        };
        tracing::info!(kv_bytes = plan.kv_cache_bytes, tokens = plan.kv.tokens, strategy = %plan.graph.strategy, "plan ready");
        tracing::debug!(requested = plan.requested_bytes, kv_budget = plan.kv_budget_bytes, consumers = ?plan.consumers, "plan's budget");
        Ok(plan)
    }
}

/// A KV cache's allocations in words ([`PlanBuilder::rounding_words`]), made into a
/// [`RoundingReserve`] once the room and the cache that fits are known.
struct RoundingWords {
    allocations: u64,
    granule: u64,
    /// The granules' rounding of every allocation, together.
    most: u64,
    /// The fewest power-of-two divisions the allocator rounds a tensor to, where it does.
    divisions: Option<u64>,
    layout: String,
    fewer: String,
}

impl RoundingWords {
    /// The reserve where `room` was left for the KV cache and `kv_bytes` of it fit: the most
    /// the rounding takes is the granules' beside what the power-of-two divisions add to
    /// tensors of `kv_bytes` in all (under `1/d` of them).
    fn reserve(self, room: u64, kv_bytes: u64) -> RoundingReserve {
        let divided = self.divisions.map_or(0, |d| kv_bytes.div_ceil(d));
        RoundingReserve {
            room,
            reserve: room.saturating_sub(kv_bytes),
            allocations: self.allocations,
            granule: self.granule,
            most: self.most.saturating_add(divided),
            layout: self.layout,
            fewer: self.fewer,
        }
    }
}

/// The plan's note on the caching allocator's configuration `a` the engine declared (from
/// `source`): what it changes of the KV cache's footprint, and whether this plan keeps room
/// for that rounding at all (`rounds`: a measured start-up; `mapped`: a cache mapped in
/// granules, which no allocator rounds).
fn alloc_conf_note(a: &AllocatorConfig, source: &str, rounds: bool, mapped: bool) -> String {
    let shown = a.to_string();
    let shown = if shown.is_empty() {
        "the default configuration".to_string()
    } else {
        format!("`{shown}`")
    };
    let mut effects: Vec<String> = Vec::new();
    if a.expandable_segments {
        effects.push(format!(
            "expandable segments: the KV cache's tensors packed one after another into a segment mapped in pages of {} (2 MiB for tensors up to 1 MiB)",
            fmt_bytes(expandable_page(a))
        ));
    }
    if let Some(d) = fewest_divisions(a) {
        effects.push(format!(
            "each tensor first rounded up to its power-of-two division ({d} divisions at the coarsest)"
        ));
    }
    if let Some(m) = a.max_split_size {
        effects.push(format!(
            "blocks of {} or more neither split nor shared",
            fmt_bytes(m)
        ));
    }
    if let Some(l) = a.large_segment_size {
        effects.push(format!(
            "tensors over 1 MiB and under 10 MiB in shared segments of {}",
            fmt_bytes(l)
        ));
    }
    if let Some(b) = &a.backend {
        effects.push(format!(
            "backend {b}: the driver's own pool, whose rounding the plan does not model (it keeps the caching allocator's)"
        ));
    }
    let mut note = format!("caching allocator: {shown}, from {source}");
    if effects.is_empty() {
        note.push_str(": PyTorch's default rules for the KV cache's footprint");
    } else {
        note.push_str(&format!(": {}", effects.join("; ")));
    }
    let kept: Vec<&str> = a
        .other
        .iter()
        .map(|(k, _)| k.as_str())
        .chain(
            a.garbage_collection_threshold
                .map(|_| "garbage_collection_threshold"),
        )
        .chain(
            a.max_non_split_rounding
                .map(|_| "max_non_split_rounding_mb"),
        )
        .collect();
    if !kept.is_empty() {
        note.push_str(&format!(
            " ({} do not change the KV cache's footprint)",
            kept.join(", ")
        ));
    }
    if mapped {
        note.push_str("; the KV cache is mapped in whole granules, which no allocator rounds");
    } else if !rounds {
        note.push_str("; a dry run keeps no room for the allocator's rounding of the KV cache, whatever its configuration (a measured start-up does)");
    }
    note
}
