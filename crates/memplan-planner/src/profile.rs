//! [`Profile`]: everything a [`Session`](crate::Session) measured, ready to be planned.

use memplan_core::{MemoryInfo, MemoryWindow, ProfilingCapability};
use serde::Serialize;

use crate::strategy::GraphEstimate;
use crate::warning::{self, Warning};

/// One measured step: the snapshots around it and their window.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct StepRecord {
    /// Step name (`baseline`, `load_weights`, `profile_run`, `graph_phase`, `quiet`).
    pub name: String,
    /// Snapshot before.
    pub before: MemoryInfo,
    /// Snapshot after.
    pub after: MemoryInfo,
    /// `after - before`.
    pub window: MemoryWindow,
}

/// Everything the session measured, ready to be planned
/// ([`PlanBuilder::from_profile`](crate::PlanBuilder::from_profile)).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Profile {
    /// The capability the session trusted (declared or calibrated).
    pub capability: ProfilingCapability,
    /// The first snapshot (after releasing cached memory).
    pub baseline: MemoryInfo,
    /// The last snapshot.
    pub last: MemoryInfo,
    /// Every step and quiet window, in order.
    pub steps: Vec<StepRecord>,
    /// Warnings raised while profiling.
    #[serde(serialize_with = "warning::serialize_all")]
    pub warnings: Vec<Warning>,
    /// Bytes other processes took (+) or released (-) during profiling, seen in quiet windows.
    pub foreign_bytes: i64,
    /// Weights: allocator `allocated` growth while loading.
    pub weights_bytes: Option<u64>,
    /// Memory the weights hold from the driver: allocator `reserved` growth while loading
    /// (the weights plus the allocator's rounding around them). The budget counts this.
    pub weights_held_bytes: Option<u64>,
    /// Activation peak of the profile run (peak allocated minus allocated before it).
    pub activation_peak_bytes: Option<u64>,
    /// The most any eager warm-up of the graph phase made the engine's allocator hold above
    /// where it stood before it (its reserved peak growth, at least its allocated peak
    /// growth); absent where no warm-up ran. The engine warms each size up again before its
    /// own capture, after its KV cache exists: a warm-up that takes more than the profile run
    /// needs that much beside the cache.
    pub warmup_peak_bytes: Option<u64>,
    /// Whether every warm-up that held [`warmup_peak_bytes`](Self::warmup_peak_bytes) peaked at
    /// a small request's size or less (PyTorch's `kSmallSize`, 1 MiB): its segments are then the
    /// small requests' pool's, which no burst's large request takes.
    pub warmup_peak_small: bool,
    /// Whether the engine's capture left in place the memory its allocator had cached from the
    /// warm-up before it (PyTorch's graph-capture context empties the cache on entering; an engine
    /// or framework that does not keeps every warm-up's segments through its captures and into
    /// serving, beside the activation peak a burst then needs); absent where not checked.
    pub capture_keeps_cache: Option<bool>,
    /// Where the engine's capture keeps the cache: what the allocator still held cached after
    /// warm-ups of the smallest and the largest size and a capture, with nothing released in
    /// between (the warm-ups' segments in every pool they were served from: the smallest
    /// warm-up's request may be one the largest warm-up's cached block cannot serve, a small
    /// request served from small segments only), or after every size warmed up and captured in
    /// the engine's order where the strategy captures them so (`conservative`); where the
    /// allocator gave its cache back to serve one of those warm-ups (their segments did not fit
    /// on the device), what each of them took, summed; absent where not checked or not kept.
    pub capture_cache_left_bytes: Option<u64>,
    /// Whether the engine declared that its caching allocator maps expandable segments
    /// (`expandable_segments:True`, `Session::with_allocator_config`): one segment per stream
    /// and pool, grown by mapping pages at its end, so a request larger than the free block at
    /// a segment's end takes that block and maps only the rest.
    pub expandable_segments: bool,
    /// Growth of memory outside the allocator during the engine's steps (context, library
    /// workspaces), signed. Absent when the driver free reading cannot measure it.
    pub non_allocator_growth: Option<i64>,
    /// Windows of the free reading whose non-allocator change `non_allocator_growth` sums (one
    /// per engine step that grew it, and the graph phase's teardown where it left memory
    /// held): each is a difference of two snapshots, off by up to the reading's window error,
    /// and quiet windows between them (another process's, [`Self::foreign_bytes`]) keep their
    /// errors from cancelling.
    pub non_allocator_windows: u64,
    /// Of [`Self::non_allocator_windows`], those that moved with nothing the engine did to
    /// explain it: quiet windows that moved within the reading's window error (attributed to
    /// nobody) and engine steps that read free memory growing. What they read may be memory
    /// that moved (a late release, a lazy allocation, a neighbour), not the reading's error, so
    /// the plan keeps the reading's whole window error on every window where there is one
    /// (`plan::build`), even where the reading's own idle windows showed it quiet.
    pub non_allocator_windows_moved: u64,
    /// The graph-memory phase's result.
    pub graph: Option<GraphEstimate>,
    /// The largest error seen on a window of the free reading: calibration's (see
    /// [`CalibrationReport::free_window_error`](crate::calibrate::CalibrationReport)), the
    /// session's own windows of the idle device where nothing calibrated, and an engine step's
    /// window that can only be the reading's error (a reading of this process's memory alone
    /// that read memory outside the allocator freed); absent where none was measured.
    pub free_window_error: Option<u64>,
    /// Where no reading measures this process: the largest allocation that succeeded at the
    /// baseline (the allocation probe, `session/probe.rs`); the engine's steps are then
    /// measured by a probe before and after each.
    pub probe_baseline: Option<u64>,
    /// Where the probe at the baseline found more allocatable than the total the plan would
    /// take a share of: that figure plus what this process's allocator held then, the least
    /// the device can have ([`Warning::TotalBelowAllocatable`](crate::Warning)).
    pub allocatable_total: Option<u64>,
    /// What the probes around the engine's steps found them taking outside the allocator
    /// (their sum, each within the probes' resolution, on the safe side), with what
    /// calibration's captures left held where a probe before them measured it
    /// ([`Session::start`](crate::Session::start)).
    pub probe_growth: Option<i64>,
    /// The non-allocator growth was measured by allocation probes (at the baseline and at the
    /// plan), within their resolution, rather than by a reading.
    pub non_allocator_by_probe: bool,
    /// What this process's own calibration left held outside the allocator (per-capture
    /// memory and library workspaces its test captures made a runtime keep), as the free
    /// reading measured it. The engine's start-up check compares its request with the free
    /// memory it finds when it starts, before any of that existed, so the session's check of
    /// the request gives it back ([`Session::start`](crate::Session::start)); the plan still
    /// counts it as this engine's memory.
    pub held_by_calibration: u64,
    /// What the device keeps of every raw allocation it frees, as calibration saw it
    /// ([`CalibrationReport::kept_per_free`](crate::calibrate::CalibrationReport)), or where
    /// nothing calibrated as the session's own windows over allocations saw it; absent where
    /// nothing was seen kept. The plan keeps room for the frees the
    /// session makes after its last reading (and, where it measures by allocation probes, for
    /// those outside the windows its probes measured), and warns
    /// ([`Warning::DeviceKeepsMemoryOnFree`]).
    pub kept_per_free: Option<u64>,
    /// The step the free reading moves in where it is a MiB or more, as calibration (or,
    /// where nothing calibrated, the session's own windows over allocations) saw it: every
    /// window of the free reading is kept off by up to it (the strategies' and the plan's margins);
    /// 0 where its reads count bytes or nothing measured them.
    pub free_step: u64,
    /// Where nothing was seen kept per free ([`Profile::kept_per_free`] absent) but the free
    /// reading's noise could hide it: the most a free may keep that the session's windows over
    /// allocations would not have shown (their least loss plus what two reads of the idle device
    /// differ by, the tightest of the session's measurements). The plan keeps room for that
    /// much per raw free the session makes after its last reading (and, where it measures by
    /// allocation probes, outside the windows its probes measured); nothing is warned (nothing
    /// was seen). Absent where no window measured it (an exact reading calibration checked, a
    /// reading whose windows missed their allocations).
    pub unseen_kept_per_free: Option<u64>,
    /// Where the session's own windows over allocations saw a keep per free
    /// ([`Profile::kept_per_free`]): the most a free may have kept as they bound it (each
    /// pair's loss is the keep give or take what two reads of the same memory differ by). The
    /// figure seen is a mean, and where each pair's loss is within a reading's step it is the
    /// loss over all the frees shared among them, which may sit up to the step shared among
    /// the frees below what each kept: the room for the session's own frees takes this bound.
    pub most_kept_per_free: Option<u64>,
    /// Reads of the free and device-wide readings each snapshot of the session combines (their
    /// interquartile mean, each read after a synchronize): 1 where one read is good to its
    /// window error; more where the reading moves from one read to the next by more than the
    /// allocator's rounding and reading it again narrows what a window may be off by
    /// ([`Session::begin`](crate::Session::begin) measures both).
    pub free_reads: usize,
    /// What the engine's allocator made of its own allocations before the plan, one
    /// `(bytes allocated, bytes reserved)` pair per step that grew its reserved memory: the
    /// weights' growth while loading, and the peak and reserved growth of the profile run and
    /// of each warm-up of the graph phase whose peak was a large request
    /// ([`is_large_request`](crate::plan::is_large_request)). The allocator reserves
    /// whole segments, so these say how coarsely it rounds (see
    /// [`granule_bound`](crate::plan::granule_bound)).
    pub segment_readings: Vec<(u64, u64)>,
    /// Which of [`segment_readings`](Self::segment_readings) is the weights' (their index):
    /// a model's weights are hundreds of tensors of many sizes, never one request (see
    /// [`granule_bound_beside`](crate::plan::granule_bound_beside)).
    pub weights_reading: Option<usize>,
}

impl Profile {
    /// What the plan keeps room for per raw free of the session's own where a keep per free
    /// was seen: the figure seen ([`Self::kept_per_free`]), or the most the windows bound a
    /// free's keep by ([`Self::most_kept_per_free`]) where that is larger. `None` where no
    /// keep was seen.
    pub(crate) fn keep_per_free_bound(&self) -> Option<u64> {
        self.kept_per_free
            .map(|k| k.max(self.most_kept_per_free.unwrap_or(0)))
    }

    /// `total`, or where an allocation probe found more allocatable than the total searched
    /// up to, the least the device can have ([`Self::allocatable_total`]) where that is more.
    pub(crate) fn total_at_least(&self, total: u64) -> u64 {
        self.allocatable_total.map_or(total, |t| t.max(total))
    }

    /// How far a window of the free reading may be off ([`crate::strategy::window_error`] of
    /// the reading's declared tolerance, the largest error measured on one, and the step it
    /// moves in): what the strategies' margins, the plan's margin on memory outside the
    /// allocator and the session's quiet windows all take one window's error to be.
    pub(crate) fn free_window_margin(&self) -> u64 {
        crate::strategy::window_error(
            self.capability
                .reading(memplan_core::Reading::DriverFree)
                .tolerance_bytes(),
            self.free_window_error,
            self.free_step,
        )
    }

    /// A profile that starts at `baseline`: nothing measured yet.
    pub fn new(capability: ProfilingCapability, baseline: MemoryInfo) -> Self {
        Profile {
            capability,
            baseline,
            last: baseline,
            steps: Vec::new(),
            warnings: Vec::new(),
            foreign_bytes: 0,
            weights_bytes: None,
            weights_held_bytes: None,
            activation_peak_bytes: None,
            warmup_peak_bytes: None,
            warmup_peak_small: false,
            capture_keeps_cache: None,
            capture_cache_left_bytes: None,
            expandable_segments: false,
            non_allocator_growth: None,
            non_allocator_windows: 0,
            non_allocator_windows_moved: 0,
            graph: None,
            free_window_error: None,
            probe_baseline: None,
            allocatable_total: None,
            probe_growth: None,
            non_allocator_by_probe: false,
            held_by_calibration: 0,
            kept_per_free: None,
            free_step: 0,
            unseen_kept_per_free: None,
            most_kept_per_free: None,
            free_reads: 1,
            segment_readings: Vec::new(),
            weights_reading: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::MIB;

    /// A keep seen under a reading's step is a mean of the pairs' losses: 16 windows of a
    /// reading in 256 MiB steps on a device keeping 32 MiB a free lost 546 MiB over all, read
    /// as 34.13 MiB a free, and a figure read the same way can sit up to 16 MiB (the step over
    /// the frees) under what each free kept. The room for the session's own frees takes the
    /// windows' bound; where none is known, the figure seen; where nothing was seen, nothing.
    #[test]
    fn the_room_for_the_sessions_own_frees_takes_the_windows_bound() {
        let mut p = Profile::new(ProfilingCapability::exact_discrete(), MemoryInfo::default());
        assert_eq!(p.keep_per_free_bound(), None);
        p.most_kept_per_free = Some(50 * MIB);
        assert_eq!(p.keep_per_free_bound(), None);
        p.kept_per_free = Some(34 * MIB);
        assert_eq!(p.keep_per_free_bound(), Some(50 * MIB));
        p.most_kept_per_free = None;
        assert_eq!(p.keep_per_free_bound(), Some(34 * MIB));
        p.most_kept_per_free = Some(MIB);
        assert_eq!(p.keep_per_free_bound(), Some(34 * MIB));
    }
}
