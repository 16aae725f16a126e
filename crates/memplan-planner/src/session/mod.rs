//! The measurement protocol as an engine runs it: [`Session`].
//!
//! An engine opens a session on its device ([`Session::start`]: calibrate, release cached
//! memory, baseline; or [`Session::begin`] with a capability it already has), then runs its
//! start-up through the session's steps: [`Session::load_weights`], [`Session::profile_run`]
//! (activation peak), [`Session::capture_graphs`] (the graph strategy chosen from the
//! capability measures or bounds graph memory; teardown on every path), [`Session::plan`],
//! and finally [`Session::into_kv_cache`], which ends the session and, after post-capture,
//! maps the KV cache into the range the engine was given before capture.
//!
//! The session borrows the engine for its whole life (steps hand it to closures) and holds a
//! clone of the device. Rules it enforces, whatever the engine or strategy does:
//! - every reading is a [`snapshot`](memplan_core::protocol::snapshot) (synchronize, then read
//!   every layer); windows are differences of snapshots and keep their sign. Where one read of
//!   the free memory moves by more than the allocator's rounding, each snapshot combines
//!   [`FREE_READS`] reads (their interquartile mean, each after a synchronize), where that
//!   measurably narrows a window ([`Profile::free_reads`]), and [`MORE_FREE_READS`] where 64
//!   still leave a window off by more than that rounding and narrow it further. Where the device
//!   cannot synchronize (its capability's `facts.synchronize` is unsupported), the engine's
//!   queues are synchronized through [`Engine::synchronize`] before each reading; an engine
//!   without that hook gets
//!   [`Warning::ReadingsNotSynchronized`] (once) and the readings go ahead;
//! - before each step a *settle* snapshot closes a quiet window in which the engine did
//!   nothing: any change of non-allocator memory there belongs to other processes and is
//!   attributed to them, not to the engine (a neighbour acting *inside* a step cannot be told
//!   apart from the engine and is counted as the engine's, which errs on the safe side);
//! - free memory that grows without the allocator releasing anything (a neighbour freed memory)
//!   is a warning, never a crash, and the negative window is kept in the record;
//! - a session dropped before [`Session::into_kv_cache`] (an error, an early return) tears
//!   down what it holds: graphs kept by post-capture are released through the engine, then the
//!   KV address range is released.

mod graphs;
mod kv_cache;
mod kv_granule;
mod kv_tensors;
pub(crate) mod probe;
mod recorder;
mod rounding;
mod steps;

use memplan_core::{AllocatorConfig, Error, MemoryInfo, ProfilingCapability, Result, SharedDevice};

use crate::budget::Request;
use crate::calibrate::{calibrate_then, CalibrationReport, SIZES};
use crate::engine::Engine;
use crate::kv_range::KvRange;
use crate::plan::{Plan, PlanBuilder};
pub use crate::profile::{Profile, StepRecord};
use crate::rank::Rank;
use crate::warning::Warning;
pub use kv_cache::KvCache;
use kv_cache::Planned;
use memplan_core::bytes::{fmt_bytes, fmt_signed, signed, MIB};
use memplan_core::kv::{KvAllocation, KvLimits, KvSpec, SizingRules};
pub(crate) use recorder::Recorder;
pub use steps::Step;
use steps::Steps;

/// A start-up being measured. See the module docs.
pub struct Session<'e, E: AsDynEngine + ?Sized> {
    rec: Recorder,
    engine: &'e mut E,
    why: String,
    calibration: Option<CalibrationReport>,
    done: bool,
    /// The request [`check_request`](Self::check_request) saw, for the automatic graph phase.
    request: Option<Request>,
    /// Which steps ran (see [`Step`]).
    steps: Steps,
    /// Where this process sits in the deployment.
    rank: Rank,
    /// What the last plan gave this rank.
    planned: Option<Planned>,
    /// The KV sizing rules and the engine release they are (default: the newest release's).
    sizing: Option<(SizingRules, String)>,
    /// Whether the engine's allocator offers tensors, through which the session can measure
    /// the KV cache's allocation where the engine allocates it after the session.
    offers_tensors: bool,
    /// The rounding per KV tensor the last plan kept where the KV cache's allocation may go
    /// unmeasured ([`PlanBuilder::unmeasured_kv_allocation`]).
    unmeasured_granule: u64,
    /// Whether the warm-ups that narrow the granule's bound ran ([`rounding`]).
    granule_narrowed: bool,
    /// Whether the session knows the device records the engine's graphs: the trial capture
    /// recorded one, or the device records graph allocation nodes, the one thing it refuses
    /// them for (each is asked once a session).
    graphs_record: bool,
    /// Whether the graph phase's refusal check ran, before the first phase that captures
    /// (it runs once a session, on what the profile run left).
    graph_room_checked: bool,
    /// The engine's caching-allocator configuration and where it came from
    /// ([`with_allocator_config`](Self::with_allocator_config)).
    alloc_conf: Option<(AllocatorConfig, String)>,
    /// The KV cache the plan will be asked for, where the caller said before the profile run
    /// ([`with_kv`](Self::with_kv)).
    kv: Option<(KvSpec, KvLimits)>,
}

/// How far `b` is above `a` (0 where it is not), where both were read; `None` where either
/// was not.
fn grown(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    }
}

/// Reads each snapshot combines where a window of single reads of the free memory is off by
/// more than the caching allocator's rounding of one large request
/// ([`ALLOCATOR_ROUNDING_BOUND`](crate::plan::ALLOCATOR_ROUNDING_BOUND); see
/// [`Profile::free_reads`]): the interquartile mean of 64 reads
/// of a reading whose reads vary independently has about a sixth of one read's standard
/// deviation where the noise is uniform, about a seventh where it is normal (a third and a
/// quarter for 16 reads: a synchronize and a read of an idle device cost microseconds, so
/// the narrower window is cheap); what it does on
/// this device is measured, not assumed (`Session::begin` measures the window error of
/// combined reads the way it measures single ones, and keeps them only where it is smaller).
pub const FREE_READS: usize = 64;

/// Reads each snapshot combines where [`FREE_READS`] still leave a window off by more than the
/// allocator's rounding of one large request, and this many measurably narrow it further: the
/// interquartile mean of four times the reads has about half the standard deviation.
pub const MORE_FREE_READS: usize = 256;

/// The automatic graph phase measures every size instead of keeping a sampled estimate whose
/// margin would take more than this share (in per mille) of the room left for the KV cache:
/// start-up time is cheaper than a KV cache the model's uncertainty shrank.
pub const SAMPLED_MARGIN_LIMIT_PER_MILLE: u64 = 10;

impl<'e, E: AsDynEngine + ?Sized> Session<'e, E> {
    /// Calibrate the device (checking what its backend declares), then [`begin`](Self::begin)
    /// with the calibrated capability; calibration downgrades become warnings. Call it before
    /// the engine allocates anything: calibration allocates a quarter of free memory at most,
    /// and no more than 1 GiB at once ([`LARGEST_SIZE`](crate::calibrate::LARGEST_SIZE)); where
    /// the request may be smaller than that, [`start_for`](Self::start_for) keeps the start's
    /// checks within it.
    ///
    /// Memory calibration leaves held outside the allocator (per-capture memory a runtime
    /// keeps after its test captures) is this process's from then on: the window from before
    /// calibration to the baseline is accounted like an engine step named `calibration`. The
    /// reading before calibration combines [`MORE_FREE_READS`] reads: how far one read is off
    /// is not known before calibration measures it, and a single noisy read there would put
    /// its whole error into the step (a window the strategies' margins, sized for combined
    /// reads, do not cover). Where calibration finds the free reading unable to measure this
    /// process, that window reads nothing: an allocation probe right before calibration's
    /// captures, against the probe that opens the session, measures it instead
    /// ([`Profile::probe_growth`]).
    ///
    /// Where calibration (or the session's own windows over allocations) saw the device keep
    /// memory of every raw free ([`CalibrationReport::kept_per_free`]), the session warns
    /// ([`Warning::DeviceKeepsMemoryOnFree`]) and the plan keeps room for what its own frees
    /// after the last reading keep (its allocation probe).
    ///
    /// Refused ([`Error::InvalidInput`] on `device`) when the engine's allocator works on
    /// another GPU than `device` (both name their GPU and the names differ); so is
    /// [`begin`](Self::begin).
    pub fn start(device: &SharedDevice, engine: &'e mut E) -> Result<Self> {
        Self::start_within(device, engine, probe::start_most(None))
    }

    /// [`start`](Self::start) for an engine whose `request` is known before the start: no check
    /// of the start (calibration's allocations, the windows over allocations of a known size)
    /// holds more than half of what the request asks for at once, so a small request on a
    /// large device (a 2 GiB budget on a 141 GB card, a 3% share) is not passed before the
    /// engine loads anything. The request is still checked by
    /// [`check_request`](Self::check_request), after the engine's rules are given.
    ///
    /// Errors as [`requested_bytes`](crate::budget::requested_bytes) does for a malformed
    /// request (a utilisation outside (0, 1], a zero byte budget), before anything is
    /// allocated; otherwise as [`start`](Self::start).
    ///
    /// Where the request is below the memory the device holds in use before the start, the
    /// session says so by name ([`Warning::RequestBelowMemoryInUse`]): part of that may be this
    /// process's own, already past the request, and the start's checks go past it further.
    pub fn start_for(device: &SharedDevice, engine: &'e mut E, request: Request) -> Result<Self> {
        let r = StartRequest::read(device, request)?;
        let mut s = Self::start_within(device, engine, r.most)?;
        // Calibration's test capture holds its runtime's objects beside its allocation node:
        // the most the start held at once is the larger of the two, as measured.
        let held = s.calibration.as_ref().and_then(|c| c.test_capture_held);
        if let Some(w) = r.below_in_use(r.most.max(held.unwrap_or(0))) {
            s.rec.warn(w);
        }
        Ok(s)
    }

    /// [`begin`](Self::begin) for an engine whose `request` is known before the start: the
    /// start's checks hold no more than half of it at once, as [`start_for`](Self::start_for)'s.
    pub fn begin_for(
        device: &SharedDevice,
        engine: &'e mut E,
        capability: ProfilingCapability,
        request: Request,
    ) -> Result<Self> {
        let r = StartRequest::read(device, request)?;
        let mut s = Self::open(device, engine, capability, false, r.most, None, None, 0)?;
        if let Some(w) = r.below_in_use(r.most) {
            s.rec.warn(w);
        }
        Ok(s)
    }

    /// [`start`](Self::start), no allocation of its checks above `most` bytes.
    fn start_within(device: &SharedDevice, engine: &'e mut E, most: u64) -> Result<Self> {
        check_same_gpu(device, engine.as_dyn())?;
        // The session's own raw frees start here: calibration's are its own too.
        let frees_at_start = device.raw_frees();
        let pre = recorder::combined_snapshot(
            device,
            Some(&*engine.as_dyn().allocator()),
            MORE_FREE_READS,
            None,
        )?;
        // Where calibration finds that the free reading cannot measure this process (a stale
        // one, a wrong pool), the window above reads nothing of what its test capture and
        // mapping leave held, and the session's allocation probes start at its baseline,
        // after them: a probe right before those checks, against the probe that opens the
        // session, measures it (see `calibrated_by_probe`).
        // (what was allocatable, the ceiling searched up to, the raw frees its figure shows)
        let mut probed: Option<(u64, u64, u64)> = None;
        // An eager engine's calibration leaves out the test capture: what it may keep held
        // for good, such an engine alone never takes (`calibrate_then`).
        let graphs = !engine.as_dyn().graph_sizes().is_empty();
        let report = calibrate_then(device, &SIZES, most, graphs, &mut |cal| {
            if cal
                .reading(memplan_core::Reading::DriverFree)
                .measures_own_usage()
            {
                return Ok(());
            }
            let snap = memplan_core::protocol::snapshot(device, None)?;
            let Some(ceiling) = probe_ceiling(cal, &snap) else {
                return Ok(());
            };
            probed = probe::baseline(device, Some(ceiling))?.map(|(b, f)| (b, ceiling, f));
            Ok(())
        })?;
        let hint = probed.map(|(b, _, _)| b);
        let mut s = Self::open(
            device,
            engine,
            report.calibrated.clone(),
            true,
            most,
            hint,
            report.kept_per_free,
            report.free_step.unwrap_or(0),
        )?;
        s.rec.own_frees.start = frees_at_start;
        s.rec.before_baseline("calibration", pre, None);
        s.calibrated_by_probe(probed, &pre);
        for w in report.downgrade_warnings() {
            s.rec.warn(w);
        }
        // Calibration's windows are of single reads: where the session combines several
        // reads per snapshot, its own measurement of such windows (`begin`) stands.
        if report.free_window_error.is_some() && s.rec.p.free_reads == 1 {
            s.rec.p.free_window_error = report.free_window_error;
        }
        s.rec.p.free_step = s.rec.p.free_step.max(report.free_step.unwrap_or(0));
        // A device whose frees keep memory: said by name (the engine's own frees while serving
        // are beyond any plan), and the plan keeps room for the session's own later frees.
        if let Some(k) = report.kept_per_free.max(s.rec.p.kept_per_free) {
            s.rec.p.kept_per_free = Some(k);
            s.rec.warn(Warning::DeviceKeepsMemoryOnFree {
                bytes_per_free: k,
                at_least: false,
            });
        }
        s.calibration = Some(report);
        Ok(s)
    }

    /// Where calibration measured what was allocatable right before its checks that may leave
    /// memory held for good (`probed`: the largest allocation that succeeded and the ceiling it
    /// searched up to), and the session measures by allocation probes: what those checks left
    /// held is the difference from the probe at the baseline, less the allocator's growth since
    /// `pre` (the snapshot before calibration), counted as this engine's memory outside its
    /// allocator as any probed step's growth is ([`Profile::probe_growth`]). Memory a runtime
    /// keeps of calibration's test capture (its per-capture memory) stays held through serving;
    /// with the free reading unable to see it and the session's probes starting after it, an
    /// eager plan went 2.9 MiB past the request and a conservative one 1% past the oracle.
    ///
    /// `probed` also gives the raw frees its figure shows: the session's frees between it and
    /// the baseline's probe are in the window measured here ([`recorder::OwnFrees`]).
    fn calibrated_by_probe(&mut self, probed: Option<(u64, u64, u64)>, pre: &MemoryInfo) {
        if let Some((before, _, _)) = probed {
            self.rec.probed(before);
        }
        let (Some((before, ceiling, frees)), Some(after)) = (probed, self.rec.p.probe_baseline)
        else {
            return;
        };
        let own = &mut self.rec.own_frees;
        own.measured = own
            .measured
            .saturating_add(own.at_last_probe.saturating_sub(frees));
        let p = &mut self.rec.p;
        let grown = match (pre.allocator.reserved, p.baseline.allocator.reserved) {
            (Some(x), Some(y)) => signed(y).saturating_sub(signed(x)),
            _ => 0,
        };
        // Another process releasing memory meanwhile reads as a negative growth: nothing of
        // calibration's, and nothing given back by it.
        let g = probe::step_growth(before, after, ceiling, grown).max(0);
        tracing::info!(
            before,
            after,
            growth = g,
            "allocation probes around calibration's captures"
        );
        p.probe_growth = Some(p.probe_growth.unwrap_or(0).saturating_add(g));
        self.rec.left_held(g.unsigned_abs(), false);
    }

    /// Release the engine's cached memory, then take the baseline snapshot, trusting
    /// `capability` (the device's declared one, or a calibrated one).
    pub fn begin(
        device: &SharedDevice,
        engine: &'e mut E,
        capability: ProfilingCapability,
    ) -> Result<Self> {
        Self::open(
            device,
            engine,
            capability,
            false,
            probe::start_most(None),
            None,
            None,
            0,
        )
    }

    /// [`Session::begin`]; `calibrated`: calibration checked the free reading's windows over
    /// known allocations already (an exact reading is then only read again on the idle device);
    /// `most`: the most one of its windows over allocations holds ([`probe::start_most`]);
    /// `hint`: what calibration's probe found allocatable before its checks, where it probed
    /// (the baseline's probe searches from it, see [`probe::baseline_from`]); `known_kept`:
    /// what calibration saw the device keep of every raw free, where it did (the session's
    /// windows then do not measure it again, [`probe::window_error_and_step`]); `known_step`:
    /// the step calibration confirmed the free reading moves in, 0 for none (the session's
    /// windows then do not confirm theirs again).
    #[allow(clippy::too_many_arguments)]
    fn open(
        device: &SharedDevice,
        engine: &'e mut E,
        mut capability: ProfilingCapability,
        calibrated: bool,
        most: u64,
        hint: Option<u64>,
        known_kept: Option<u64>,
        known_step: u64,
    ) -> Result<Self> {
        let span = tracing::info_span!("baseline", device = %device.descriptor().id);
        let _e = span.enter();
        let device = device.clone();
        // The session's own raw frees start here (where it calibrated, `start` counts from
        // before calibration).
        let frees_at_open = device.raw_frees();
        let freed_at_open = device.raw_freed_bytes();
        let live_at_open = device.live();
        let e = engine.as_dyn();
        check_same_gpu(&device, e)?;
        // Asked before the baseline (the cache release below gives back what the question took).
        let offers_tensors = kv_cache::offers_tensors(e.allocator());
        e.allocator().release_cached()?;
        let unsynced = recorder::sync_engine(&capability, e)?;
        // A free reading trusted as exact that moves while the device is idle, or whose
        // windows over known allocations do not show them, is not exact (a declaration
        // calibration did not check, or a device that changed since): its window error is
        // measured as an approximate reading's is, and the plan says so. Checked before the
        // baseline; where the check allocates (nothing calibrated), what it left held is
        // accounted as calibration's is (an engine step up to the baseline).
        // The window-error measurement below allocates too, and a runtime whose frees keep
        // memory keeps some of it: where nothing calibrated, that is accounted the same way.
        // (Calibration's own step, from before calibration to the baseline, covers it where
        // the session calibrated.)
        let checked = (!calibrated)
            .then(|| memplan_core::protocol::snapshot(&device, Some(&*e.allocator())))
            .transpose()?;
        // Unified memory nothing calibrated: calibration's check of the pool (one allocation
        // larger than the free reading says is left). Where it fits, the runtime's free and
        // total describe another pool (an APU's aperture): both become unavailable, so the
        // probes measure instead and a share of the device is taken of the device's memory as
        // its own counters read it. An APU declared exact whose runtime reported its 512 MiB
        // aperture refused a 30 GiB model as "more than the device total".
        let pool: Vec<Warning> = if calibrated {
            Vec::new()
        } else {
            crate::calibrate::unified_pool(&device, &mut capability)?
                .iter()
                .filter_map(crate::calibrate::Verdict::downgrade_warning)
                .collect()
        };
        let total = device.driver_memory()?.total;
        let (moved, moved_windows) =
            exact_free_that_moves(&device, &mut capability, total, !calibrated, most)?;
        let mut baseline = memplan_core::protocol::snapshot(&device, Some(&*e.allocator()))?;
        tracing::info!(free = ?baseline.driver.free, total = ?baseline.driver.total, "baseline");
        // A free reading declared usable that the driver does not give measures nothing:
        // unavailable, as calibration makes it, before anything chooses by the declaration.
        let absent = if calibrated {
            None
        } else {
            absent_free_reading(&mut capability, baseline.driver.free)
        };
        // No reading measures this process: what is allocatable now is the baseline of the
        // allocation probe that measures the engine's memory outside its allocator at the plan.
        // A free reading declared to measure it that gives nothing at the baseline measures
        // nothing either (a declaration for a reading the device does not grant, e.g. Level
        // Zero's Sysman memory state where Sysman is not enabled): the probe measures instead.
        // Where nothing before the engine's first step needs that figure (no probe of
        // calibration's, `hint`, whose checks it closes), the probe is owed and made at that
        // step, after its settle, as the step's own probe before it
        // ([`Session::load_weights`]): a probe here measures nothing of this engine's (memory
        // that changes between here and there is another process's either way), and on a
        // device that keeps memory of every raw free its free would keep a free's worth for
        // good before the engine's weights and profile run, which need every byte the engine
        // alone has (with it, four frees of 128 MiB came before the profile run of an Arc B580
        // with no free reading, and the run, which fitted the engine alone with 493 MiB to
        // spare beside a neighbour that arrived just before it, ran out of memory).
        let by_probes = !(capability
            .reading(memplan_core::Reading::DriverFree)
            .measures_own_usage()
            && baseline.driver.free.is_some());
        let owe = |capability: &ProfilingCapability| {
            hint.is_none() && probe_ceiling(capability, &baseline).is_some()
        };
        let mut baseline_owed = by_probes && owe(&capability);
        let probe_baseline = if !by_probes || baseline_owed {
            None
        } else {
            probe::baseline_from(&device, probe_ceiling(&capability, &baseline), hint)?
        };
        // An approximate free reading nothing calibrated: its window error measured by a few
        // allocations of a known size (the strategies' margins are twice it, not the declared
        // tolerance, which often covers an offset a window cancels).
        let tolerance = capability
            .reading(memplan_core::Reading::DriverFree)
            .tolerance_bytes();
        let mut single_read = probe::window_error_and_step(
            &device,
            tolerance,
            baseline.driver.free,
            1,
            most,
            known_kept,
            // The step the windows above confirmed for the same single reads, where they ran
            // and calibration did not (each confirmation is one more free).
            match known_step {
                0 => moved_windows.map_or(0, |w| crate::calibrate::coarse_step(w.step)),
                known => known,
            },
        )?;
        // Windows whose reads never moved while allocations came and went: the reading does not
        // follow allocations at all (free reported as total, a stale or wrong pool), and no
        // tolerance makes its windows usable: unavailable, calibration's rule for a reading that
        // never moved. Memory outside the allocator is then measured by the allocation probe.
        let lost = if calibrated {
            None
        } else {
            lost_free_reading(
                &mut capability,
                single_read.map(|w| (w.error, w.step)),
                baseline.driver.free,
                tolerance,
                most,
            )
        };
        let probe_baseline = match (&lost, probe_baseline) {
            (Some(_), None) if !baseline_owed && owe(&capability) => {
                baseline_owed = true;
                None
            }
            (Some(_), None) if !baseline_owed => {
                probe::baseline(&device, probe_ceiling(&capability, &baseline))?
            }
            (_, b) => b,
        };
        if lost.is_some() {
            single_read = None;
        }
        // A probe that found more allocatable than the total it searched up to contradicts
        // that total (`probe::baseline`): the least the device can have is what was
        // allocatable and what this process's allocator held.
        let allocatable_total = probe_baseline.and_then(|(b, _)| {
            total_from_probe(
                b,
                probe_ceiling(&capability, &baseline),
                baseline.allocator.reserved,
            )
        });
        // What the device kept of each allocation the windows above (and the combined ones
        // below) freed, the largest figure any of them showed: their windows are judged against
        // what a free gave back, so what a free keeps must be counted here (beside
        // calibration's figure where it ran, `start`: calibration's single reads may not see
        // what the session's combined ones do).
        let mut kept_per_free = single_read
            .and_then(|w| w.kept)
            .max(moved_windows.and_then(|w| w.kept));
        // The most a free may keep that the windows could not show (their reads' noise hides
        // it): every measurement bounds it, the tightest stands.
        let mut unseen_kept = least(
            single_read.and_then(|w| w.unseen_kept),
            moved_windows.and_then(|w| w.unseen_kept),
        );
        // The most a free may keep, seen or not, as the windows bound it (`Windows::most_kept`):
        // every measurement bounds it, the tightest stands. It names what the session's own
        // checks left held (below).
        let mut most_kept = least(
            single_read.and_then(|w| w.most_kept),
            moved_windows.and_then(|w| w.most_kept),
        );
        // No reading measures this process (a stale, absent or lost free reading): no window
        // above saw what a free keeps, and allocation probes around raw frees measure it
        // instead (`probe::kept_by_probes`), after the engine's profile run
        // (`recorder::KeepTest`: what the test's frees keep must not take the room of the
        // engine's own steps).
        let keep_test = (probe_baseline.is_some() || baseline_owed) && kept_per_free.is_none();
        let mut free_window_error = single_read.map(|w| w.error);
        // Combining reads narrows a window of a reading that varies from read to read; of a
        // reading that moves in steps, it narrows one only where the reads' noise carries
        // them across a step, which depends on where free memory stands between two steps
        // and so changes from window to window: where the noise does not reach the next
        // step, every read rounds the same way and a window of combined reads is off by up to
        // the step as a single read's is. So a combined read's window error is never taken
        // below the step single reads moved in (a reading in 256 MiB steps whose combined
        // reads were off by 6 MiB on the windows measured here read the engine's captures,
        // later, as 0 and 256 MiB).
        let step = single_read.map_or(0, |w| w.step);
        // A reading that moves from one read to the next by more than the allocator's rounding:
        // every snapshot combines FREE_READS reads where that measurably narrows a window
        // (measured the same way, with combined reads), and the baseline is taken again so.
        let mut free_reads = 1;
        let mut still = None;
        let single = free_window_error;
        // Where the window error is no more than that step, no combined read can narrow it
        // (a combined window's error is taken at the step at least, below), and a pass would
        // only make more allocate/free pairs: on a device whose raw frees each keep memory,
        // every pair leaves its keep held for good, counted as this process's memory though
        // an engine alone never takes it (an L4 whose reading moves in 256 MiB steps and
        // keeping 32 MiB a free left 1.25 GiB held after the start's checks with a combined
        // pass that could not narrow a window error of exactly the step, 768 MiB without it).
        for reads in [FREE_READS, MORE_FREE_READS] {
            let Some(narrowest) = free_window_error
                .filter(|e| *e > crate::plan::ALLOCATOR_ROUNDING_BOUND && *e > step)
            else {
                break;
            };
            // A keep the windows so far showed (or calibration's) is not measured again.
            let combined = probe::window_error_and_step(
                &device,
                tolerance,
                baseline.driver.free,
                reads,
                most,
                kept_per_free.or(known_kept),
                match crate::calibrate::coarse_step(step) {
                    0 => known_step,
                    shown => shown,
                },
            )?;
            kept_per_free = kept_per_free.max(combined.and_then(|w| w.kept));
            unseen_kept = least(unseen_kept, combined.and_then(|w| w.unseen_kept));
            most_kept = least(most_kept, combined.and_then(|w| w.most_kept));
            let (Some(c), Some(single)) = (combined.map(|w| w.error.max(step)), single) else {
                break;
            };
            if c >= narrowest {
                break;
            }
            free_reads = reads;
            free_window_error = Some(c);
            // Single reads of the idle device moved by up to `single`: a take whose
            // reads spread further saw memory move (the window error's allowance).
            still = Some(crate::strategy::kept_window_error(single));
        }
        // The baseline is taken again after the measurements above, combined where reads are:
        // what their allocations left held (a runtime whose frees keep memory) is then before
        // it, in the step that accounts for the session's own checks, not in the first idle
        // window after it, where it would read as another process taking memory.
        baseline = recorder::combined_snapshot(&device, Some(&*e.allocator()), free_reads, still)?;
        // Where nothing calibrated, a window seen off by more than an approximate reading's
        // declared tolerance contradicts the declaration (a reading in coarser steps than
        // declared): the measurement stands, as calibration's would.
        let widened = if calibrated {
            None
        } else {
            measured_beyond_declared(&mut capability, free_window_error)
        };
        let mut profile = Profile::new(capability, baseline);
        profile.probe_baseline = probe_baseline.map(|(b, _)| b);
        profile.allocatable_total = allocatable_total;
        profile.free_window_error = free_window_error;
        profile.free_reads = free_reads;
        profile.kept_per_free = kept_per_free;
        profile.free_step = crate::calibrate::coarse_step(step);
        profile.unseen_kept_per_free = unseen_kept.filter(|_| kept_per_free.is_none());
        // Where these windows saw the keep themselves (not where they only judged against
        // calibration's figure, whose pairs each lost it beyond the reading's spread).
        profile.most_kept_per_free = most_kept.filter(|_| kept_per_free.is_some());
        let mut rec = Recorder::new(device, profile);
        rec.baseline_owed = baseline_owed;
        rec.still = still;
        rec.last_probe = probe_baseline.map(|(b, _)| (b, rec.p.baseline.allocator.reserved));
        rec.own_frees = recorder::OwnFrees {
            start: frees_at_open,
            measured: 0,
            at_last_probe: probe_baseline.map_or(0, |(_, f)| f),
        };
        rec.keep_test = keep_test.then(|| recorder::KeepTest {
            named_frees: checked
                .is_some()
                .then(|| rec.device.raw_frees().saturating_sub(frees_at_open)),
        });
        if let Some(w) = unsynced {
            rec.warn_unsynced(w);
        }
        for w in pool {
            rec.warn(w);
        }
        if let Some(w) = moved {
            rec.warn(w);
        }
        if let Some(w) = widened {
            rec.warn(w);
        }
        if let Some(w) = absent.or(lost) {
            rec.warn(w);
        }
        if let Some((b, _)) = probe_baseline {
            rec.probed(b);
        }
        // Said once: here where nothing calibrates, in `start` (with calibration's figure) else.
        if let Some(k) = kept_per_free.filter(|_| !calibrated) {
            rec.warn(Warning::DeviceKeepsMemoryOnFree {
                bytes_per_free: k,
                at_least: false,
            });
        }
        if let Some(pre) = checked {
            // The check is raw allocations of known sizes, each freed again (nothing of it is
            // live at the baseline): it can have left held no more than those allocations held,
            // nor more than its frees times the most the windows bound a free's keep by, where
            // they bound it. A larger drop of a reading that sees the whole device is another
            // process's ([`recorder::Recorder::before_baseline`]).
            let frees = rec.device.raw_frees().saturating_sub(frees_at_open);
            // The most the windows bound a free's keep by, never below what was seen.
            let bounded = most_kept.max(rec.p.kept_per_free);
            let own_most = (rec.device.live() == live_at_open).then(|| {
                let freed = rec.device.raw_freed_bytes().saturating_sub(freed_at_open);
                // Only where the windows bound it (what was seen alone bounds nothing).
                most_kept
                    .and(bounded)
                    .map_or(freed, |k| k.saturating_mul(frees).min(freed))
            });
            rec.before_baseline("free reading check", pre, own_most);
            // The check's allocations were freed raw, and each free may have kept up to the
            // most the windows bound a free's keep by (seen or not), else what the device was
            // seen to keep per free, else the most a free may keep that the windows could not
            // show: what they left is named at least as that bound times the frees (their
            // window reads it only within its error, which a leak of 256 KiB a free over 12
            // frees passed on reading noise: 3 MiB held, 2.25 MiB named). The figure seen is
            // a mean of noisy losses and no bound: 16 frees keeping 1 MiB each were named as
            // 16 times 1009 KiB, and the weights went 16 MiB past the request.
            if let Some(k) = bounded.or(rec.p.unseen_kept_per_free) {
                rec.left_held_at_least(k.saturating_mul(frees));
            }
        }
        Ok(Session {
            rec,
            engine,
            why: "no graph phase ran".into(),
            calibration: None,
            done: false,
            request: None,
            steps: Steps::new(),
            rank: Rank::SINGLE,
            planned: None,
            sizing: None,
            offers_tensors,
            unmeasured_granule: crate::plan::ALLOCATOR_ROUNDING_BOUND,
            granule_narrowed: false,
            graphs_record: false,
            graph_room_checked: false,
            alloc_conf: None,
            kv: None,
        })
    }

    /// The early start-up check, right after [`begin`](Self::begin): free memory at the
    /// baseline below what `request` asks for is refused
    /// ([`Refusal::FreeBelowRequested`](memplan_core::Refusal::FreeBelowRequested)), before
    /// the engine loads anything, where the engine's own check refuses it (vLLM's; an engine
    /// whose fraction is of the memory free at its start, SGLang, refuses none and the plan is
    /// made within that share: [`SizingRules::start_check`]); where the free reading cannot see other processes, the
    /// device-wide reading is what is checked. Skipped where neither can measure it, or the
    /// request depends on what the engine will measure (a fixed KV size; [`plan`](Self::plan)
    /// checks it then).
    ///
    /// The session remembers `request`: the automatic graph phase
    /// ([`capture_graphs`](Self::capture_graphs)) judges with it whether a sampled estimate's
    /// margin is worth a full capture.
    pub fn check_request(&mut self, request: Request) -> Result<()> {
        self.steps.check(Step::CheckRequest)?;
        self.check_free(request)?;
        self.request = Some(request);
        self.steps.succeeded(Step::CheckRequest);
        Ok(())
    }

    fn check_free(&self, request: Request) -> Result<()> {
        let p = &self.rec.p;
        let mut measures = p
            .capability
            .reading(memplan_core::Reading::DriverFree)
            .measures_own_usage();
        // Where the free reading cannot see other processes, the device-wide reading makes
        // the check (as the plan's start-up check does).
        let free_reading = p.capability.reading(memplan_core::Reading::DriverFree);
        let mut tolerance = if measures {
            free_reading.tolerance_bytes()
        } else {
            0
        };
        let mut start = p.baseline;
        if let crate::plan::physical::Physical::DeviceWide {
            baseline: Some(b),
            tolerance: t,
            ..
        } = crate::plan::physical::judge(p)
        {
            if b < start.driver.free.unwrap_or(u64::MAX) {
                tolerance = t;
            }
            start.driver.free = Some(b.min(start.driver.free.unwrap_or(u64::MAX)));
            measures = true;
        }
        // What calibration's own test captures left held was free when the engine started.
        start.driver.free = start
            .driver
            .free
            .map(|f| f.saturating_add(p.held_by_calibration));
        let total_reading = p.capability.reading(memplan_core::Reading::DriverTotal);
        match (crate::budget::share_total(&start, &total_reading), request) {
            (Some(total), Request::Utilization(_) | Request::Bytes(_)) if measures => {
                let requested = crate::budget::requested_bytes(total, request)?;
                // The engine's own check (`SizingRules::start_check`): an engine whose fraction
                // is of the free memory at its start refuses none (the plan is made within it).
                let check = self
                    .sizing
                    .as_ref()
                    .map(|(r, _)| r.start_check)
                    .unwrap_or_default();
                crate::budget::start_check(check, &start, total, requested, &request, tolerance)
                    .map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// This session's place in a tensor- and pipeline-parallel deployment (default
    /// [`Rank::SINGLE`]): its plans carry it, and [`into_kv_cache`](Self::into_kv_cache)
    /// finds this rank's figures in a combined plan by it.
    pub fn with_rank(mut self, rank: Rank) -> Self {
        self.rank = rank;
        self
    }

    /// Size the KV cache with an engine release's `rules` (`release` names it, `vllm@0.19`;
    /// the dry run's table is `memplan_model::engine::EngineRules::sizing`). Default: the
    /// newest release memplan knows ([`SizingRules::newest`] for this rank's pipeline
    /// stages), the same default as the dry run's, except that the KV cache is taken as one
    /// tensor per layer (room for each one's rounding, as engines before vLLM 0.29.0 need);
    /// the plan names the release either way.
    pub fn with_sizing_rules(mut self, rules: SizingRules, release: impl Into<String>) -> Self {
        self.sizing = Some((rules, release.into()));
        self
    }

    /// The KV cache the plan will be asked for (`kv`, `limits`: what [`plan`](Self::plan) will
    /// be given), known before the engine's profile run: an engine knows its model's layers and
    /// the longest request it serves when it starts. Where the profile run runs out of memory,
    /// the session judges with it whether the memory its own checks' frees kept could have
    /// left the engine the room for one such request ([`Self::profile_run`]); nothing else
    /// reads it, and [`plan`](Self::plan) takes its own.
    pub fn with_kv(mut self, kv: &KvSpec, limits: KvLimits) -> Self {
        self.kv = Some((kv.clone(), limits));
        self
    }

    /// The engine's caching allocator runs with `conf` (PyTorch's `PYTORCH_ALLOC_CONF` option
    /// string, parsed by [`AllocatorConfig::parse`]; [`AllocatorConfig::from_env`] reads it the
    /// way PyTorch does); `source` says where it came from (`"the environment variable
    /// PYTORCH_ALLOC_CONF"`, `"the engine"`). The plan takes the KV cache's tensors to round
    /// and share the allocator's segments as it says ([`PlanBuilder::allocator_config`]) and
    /// notes it. Not declared: PyTorch's default configuration, with the same figures as
    /// declaring the default.
    pub fn with_allocator_config(
        mut self,
        conf: AllocatorConfig,
        source: impl Into<String>,
    ) -> Self {
        self.rec.max_split_declared = conf.max_split_size.is_some();
        self.rec.p.expandable_segments = conf.expandable_segments;
        self.alloc_conf = Some((conf, source.into()));
        self
    }

    /// This session's rank ([`with_rank`](Self::with_rank)).
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The last step that succeeded (see [`Step`] for the order the steps run in).
    pub fn last_step(&self) -> Step {
        self.steps.done()
    }

    /// The capability the session trusts.
    pub fn capability(&self) -> &ProfilingCapability {
        &self.rec.p.capability
    }

    /// The calibration, when [`start`](Self::start) ran one.
    pub fn calibration(&self) -> Option<&CalibrationReport> {
        self.calibration.as_ref()
    }

    /// The baseline snapshot.
    pub fn baseline(&self) -> &MemoryInfo {
        &self.rec.p.baseline
    }

    /// Warnings so far.
    pub fn warnings(&self) -> &[Warning] {
        &self.rec.p.warnings
    }

    /// Record a warning (also emitted as a `tracing` warning).
    pub fn warn(&mut self, w: Warning) {
        self.rec.warn(w);
    }

    /// The engine, between steps.
    pub fn engine(&mut self) -> &mut E {
        self.engine
    }

    /// The device.
    pub fn device(&self) -> &SharedDevice {
        &self.rec.device
    }

    /// Load the weights: `load` runs between two snapshots; weights are the growth of the
    /// allocator's `allocated`, held memory the growth of its `reserved`. Returns the bytes
    /// this call loaded.
    ///
    /// May run several times before [`profile_run`](Self::profile_run) (a model loaded in
    /// parts, a draft model beside it): the plan's weights are the sum of every load. After
    /// the profile run it is refused ([`Step`]); an error inside `load` ends the session's
    /// measurements (later steps are refused).
    pub fn load_weights(&mut self, load: impl FnOnce(&mut E) -> Result<()>) -> Result<u64> {
        self.steps.check(Step::LoadWeights)?;
        let span = tracing::info_span!("load_weights");
        let _e = span.enter();
        let out = match self.load_weights_inner(load) {
            Ok(w) => Ok(w),
            Err(e) => Err(self.in_step(Step::LoadWeights, e)),
        };
        match &out {
            Ok(_) => self.steps.succeeded(Step::LoadWeights),
            Err(e) => self.steps.poisoned(Step::LoadWeights, e),
        }
        out
    }

    fn load_weights_inner(&mut self, load: impl FnOnce(&mut E) -> Result<()>) -> Result<u64> {
        let before = self.rec.settle(self.engine.as_dyn())?;
        let probed = self.probe_allocatable(&before)?;
        load(&mut *self.engine)?;
        let after = self.rec.snap(self.engine.as_dyn())?;
        self.probe_step(probed, &before, &after)?;
        let w = self.rec.engine_step("load_weights", before, after);
        let grown = w.allocator_allocated.unwrap_or(0);
        let weights = u64::try_from(grown).map_err(|_| {
            Error::Measurement(format!(
                "allocated memory shrank by {} while loading weights",
                fmt_signed(grown)
            ))
        })?;
        let held = u64::try_from(w.allocator_reserved.unwrap_or(grown))
            .unwrap_or(0)
            .max(weights);
        tracing::info!(weights, held, "weights loaded");
        let p = &mut self.rec.p;
        if let Some(r) = w.allocator_reserved.and_then(|r| u64::try_from(r).ok()) {
            if r > 0 {
                p.weights_reading = Some(p.segment_readings.len());
                p.segment_readings.push((weights, r));
            }
        }
        p.weights_bytes = Some(p.weights_bytes.unwrap_or(0).saturating_add(weights));
        p.weights_held_bytes = Some(p.weights_held_bytes.unwrap_or(0).saturating_add(held));
        Ok(weights)
    }

    /// Where the session measures by allocation probes ([`Profile::probe_baseline`]): what is
    /// allocatable now, with the raw frees that figure shows ([`recorder::frees_shown`]).
    fn probe_allocatable(&mut self, before: &MemoryInfo) -> Result<Option<(u64, u64)>> {
        if self.rec.baseline_owed {
            return self.owed_baseline(before);
        }
        let ceiling = probe_ceiling(&self.rec.p.capability, &self.rec.p.last);
        let got = self.rec.probe_now(before.allocator.reserved, ceiling)?;
        Ok(got.map(|g| (g, self.rec.own_frees.at_last_probe)))
    }

    /// The baseline's probe, owed since the start ([`Recorder::baseline_owed`]): made now,
    /// `before` the engine's first step (after its settle), as the start's would have been
    /// (searched from the device's total, past it where all of it is allocatable,
    /// [`probe::baseline`]); its figure is that step's probe before it. `None` where the
    /// device cannot allocate: the session then does not measure by probes.
    fn owed_baseline(&mut self, before: &MemoryInfo) -> Result<Option<(u64, u64)>> {
        self.rec.baseline_owed = false;
        let ceiling = probe_ceiling(&self.rec.p.capability, before);
        let Some((b, frees)) = probe::baseline(&self.rec.device, ceiling)? else {
            return Ok(None);
        };
        tracing::info!(
            allocatable = b,
            "allocation probe at the baseline, before the first step"
        );
        let p = &mut self.rec.p;
        p.probe_baseline = Some(b);
        // A probe that found more allocatable than the total it searched up to contradicts
        // that total, as at the start ([`Session::begin`]).
        if let Some(t) = total_from_probe(b, ceiling, before.allocator.reserved) {
            p.allocatable_total = Some(t);
        }
        self.rec.last_probe = Some((b, before.allocator.reserved));
        self.rec.own_frees.at_last_probe = frees;
        self.rec.probed(b);
        Ok(Some((b, frees)))
    }

    /// After an engine step measured by probes (`before_probe`, from
    /// [`probe_allocatable`](Self::probe_allocatable)): what it took outside the allocator,
    /// added to [`Profile::probe_growth`]. The session's own raw frees between the two probes
    /// are in that figure ([`recorder::OwnFrees`]).
    fn probe_step(
        &mut self,
        before_probe: Option<(u64, u64)>,
        before: &MemoryInfo,
        after: &MemoryInfo,
    ) -> Result<()> {
        let (Some((a, frees)), Some(limit)) = (before_probe, self.rec.p.probe_baseline) else {
            return Ok(());
        };
        let ceiling = probe_ceiling(&self.rec.p.capability, after);
        let Some(b) = self.rec.probe_now(after.allocator.reserved, ceiling)? else {
            return Ok(());
        };
        let own = &mut self.rec.own_frees;
        let inside = own.at_last_probe.saturating_sub(frees);
        own.measured = own.measured.saturating_add(inside);
        let grown = match (before.allocator.reserved, after.allocator.reserved) {
            (Some(x), Some(y)) => signed(y).saturating_sub(signed(x)),
            _ => 0,
        };
        let g = probe::step_growth(a, b, limit, grown);
        if let Some(g) = u64::try_from(g).ok().filter(|_| inside > 0) {
            let bound = g.saturating_add(probe::RAW_PAGE);
            self.rec.free_keep_bound = least(self.rec.free_keep_bound, Some(bound));
        }
        tracing::info!(
            before = a,
            after = b,
            growth = g,
            "allocation probes around a step"
        );
        let p = &mut self.rec.p;
        p.probe_growth = Some(p.probe_growth.unwrap_or(0).saturating_add(g));
        Ok(())
    }

    /// The profile run: the peaks are reset before `run`; the activation peak is what the
    /// allocator had to hold for it above where it stood before: the larger of the peak of
    /// `allocated` above `allocated` before, and the peak of `reserved` above `reserved`
    /// before (the segments the peak made it hold, rounding and fragmentation included).
    /// Where the allocator reports no reserved peak, the allocated figure is rounded up by
    /// [`ALLOCATOR_ROUNDING_BOUND`](crate::plan::ALLOCATOR_ROUNDING_BOUND) and a warning says
    /// so. An allocator that reports no allocated peak is an error: the activation is never
    /// taken as 0.
    ///
    /// Runs once, after [`load_weights`](Self::load_weights) and before the graph phase
    /// ([`Step`]); an error inside `run` ends the session's measurements.
    pub fn profile_run(&mut self, run: impl FnOnce(&mut E) -> Result<()>) -> Result<u64> {
        self.steps.check(Step::ProfileRun)?;
        let span = tracing::info_span!("profile_run");
        let _e = span.enter();
        let out = match self.profile_run_inner(run) {
            Ok(a) => Ok(a),
            Err(e) => Err(self.in_step(Step::ProfileRun, e)),
        };
        match &out {
            Ok(_) => self.steps.succeeded(Step::ProfileRun),
            Err(e) => self.steps.poisoned(Step::ProfileRun, e),
        }
        out
    }

    fn profile_run_inner(&mut self, run: impl FnOnce(&mut E) -> Result<()>) -> Result<u64> {
        let before = self.rec.settle(self.engine.as_dyn())?;
        self.refusal_before_profile()?;
        let probed = self.probe_allocatable(&before)?;
        self.engine.as_dyn().allocator().reset_peak();
        if let Err(e) = run(&mut *self.engine) {
            return Err(self.refusal_after_failed_profile(e, &before, probed));
        }
        let after = self.rec.snap(self.engine.as_dyn())?;
        self.probe_step(probed, &before, &after)?;
        self.rec.engine_step("profile_run", before, after);
        self.keep_test()?;
        let (base, peak) =
            match (before.allocator.allocated, after.allocator.peak_allocated) {
                (Some(b), Some(p)) => (b, p),
                _ => return Err(Error::state(
                    "profile_run",
                    "the engine's allocator reported no allocated bytes or no allocated peak, so \
                     the activation peak cannot be measured",
                )),
            };
        let by_allocated = peak.saturating_sub(base);
        let act = match (before.allocator.reserved, after.allocator.peak_reserved) {
            (Some(r0), Some(pr)) => {
                if pr > r0 && crate::plan::is_large_request(by_allocated) {
                    self.rec.p.segment_readings.push((by_allocated, pr - r0));
                }
                by_allocated.max(pr.saturating_sub(r0))
            }
            _ => {
                let bound = crate::plan::ALLOCATOR_ROUNDING_BOUND;
                self.rec
                    .warn(crate::Warning::ReservedPeakUnreported { bound });
                by_allocated.div_ceil(bound).saturating_mul(bound)
            }
        };
        tracing::info!(activation_peak = act, by_allocated, "profile run done");
        self.rec.p.activation_peak_bytes = Some(act);
        Ok(act)
    }

    /// The engine's profile run failed with `e`, having started at `before`: where it ran out
    /// of memory after its activation had already grown past what the request leaves a KV
    /// cache (the allocator's peak above where it stood before the run, a part of the
    /// activation peak: the run only adds to it), the plan's refusal
    /// ([`PlanBuilder::refusal_before_profile`] on that figure), which the run could not have
    /// changed, naming the out-of-memory; `e` elsewhere. The engine alone needs that memory
    /// too, and a start-up whose own checks kept memory for good (a device that keeps some of
    /// every raw free, where allocation probes measure) may run out a few MiB before it: on a
    /// device keeping 2 MiB of every free, a 5.5 GiB request whose weights held 4.6 GiB and
    /// whose profile run had taken 1.2 GiB more when its 3 GB workspace did not fit (the engine
    /// alone fitted it; calibration had left 7.8 MiB held for good, the probes' frees more)
    /// ended in an out-of-memory where the plan was to refuse it. The allocation that failed
    /// counts in that figure: the run needed at least its bytes above where it started. Where the request has room
    /// for what was measured, the out-of-memory stands: nothing measured says the plan would
    /// refuse.
    ///
    /// Where the request had room, the device may not have: see
    /// [`refusal_beside_own_keeps`](Self::refusal_beside_own_keeps) (`probed`: the allocation
    /// probe taken before the run).
    fn refusal_after_failed_profile(
        &mut self,
        e: Error,
        before: &MemoryInfo,
        probed: Option<(u64, u64)>,
    ) -> Error {
        let Some(request) = self.request.filter(|_| e.is_out_of_memory()) else {
            return e;
        };
        let Ok(now) = self.rec.snap(self.engine.as_dyn()) else {
            return e;
        };
        // The allocation that failed is part of the activation too: the run needed it on top
        // of whatever it held then, so it bounds the peak from below where the allocator's
        // peak, which never counted it, stayed small (a 1.5 GiB workspace refused at once).
        let reached = grown(before.allocator.allocated, now.allocator.peak_allocated)
            .max(grown(
                before.allocator.reserved,
                now.allocator.peak_reserved,
            ))
            .max(e.requested_bytes());
        let Some(reached) = reached.filter(|r| *r > 0) else {
            return e;
        };
        let mut p = self.profile_to_plan();
        p.activation_peak_bytes = Some(reached);
        match PlanBuilder::refusal_before_profile(&p, request, self.plan_rules()) {
            Some(refusal) => {
                tracing::info!(reached, "profile run out of memory past the request's room");
                refusal.during(format!(
                    "the engine's profile run ran out of memory ({e}) after its activation had \
                     taken {} above the weights, which already leaves the request no room for a \
                     KV cache",
                    memplan_core::bytes::fmt_bytes(reached)
                ))
            }
            None => {
                // What the run held when it failed, and the allocation that failed on top of
                // it (a library's workspace outside the allocator fails beside the activation
                // the allocator holds): the least the run needed.
                let need = grown(before.allocator.allocated, now.allocator.allocated)
                    .map_or(0, |g| g.saturating_add(e.requested_bytes().unwrap_or(0)))
                    .max(reached);
                let probed = match probed {
                    Some(p) => Some(p),
                    None => self.allocatable_before_failed_run(before, &now),
                };
                self.refusal_beside_own_keeps(e, need, &now, probed)
            }
        }
    }

    /// After a profile run that ran out of memory (`e`, having needed at least `reached` above
    /// where it started; `now` read after it) where the request had room and the session
    /// measures by allocation probes (no reading measures this process), `probed` having found
    /// what was allocatable before the run: the device had less than the run needed. On a
    /// device that keeps memory of every raw free, the session's own frees (its checks' and
    /// its probes') kept some of it for good, and the engine alone would have had that much
    /// more: on a 12 GiB Arc B580 keeping 8 MiB a free beside another process's 7.5 GiB, ten
    /// frees before the profile run left it 6 MB short where the engine alone had 62 MiB to
    /// spare. What a free keeps is measured now where nothing measured it yet (the keep test,
    /// otherwise run after the profile run), and every raw free the session made before what
    /// was allocatable was found is given back at that figure (the larger bound for a probe's
    /// own free where there is one, at most what an engine step's window that held one of its
    /// frees grew by, [`Recorder::free_keep_bound`]; the engine's own frees, where the device
    /// counts them, are given back too: the safe side for the engine alone's room). The
    /// probe's own last try is freed after its figure, and the run saw what that free kept
    /// gone: given back, it read an engine alone 61 MiB past a 614 MiB activation, no room for
    /// a 128 MiB request, as 160 MiB past it, and the out-of-memory stood where the plan owed a
    /// refusal. Where, with all of it given back, what was allocatable
    /// less the run's need still leaves no room for one request of the KV cache the caller
    /// named ([`with_kv`](Self::with_kv)), the plan's physical cap at that figure refuses: the
    /// engine alone would have had no room for it either, and the refusal, naming the
    /// out-of-memory, is what the plan owed. Elsewhere `e` stands: the session's own frees may
    /// have taken room the engine alone had.
    fn refusal_beside_own_keeps(
        &mut self,
        e: Error,
        reached: u64,
        now: &MemoryInfo,
        probed: Option<(u64, u64)>,
    ) -> Error {
        let (Some((kv, limits)), Some(request), Some((allocatable, shown)), Some(limit)) = (
            self.kv.clone(),
            self.request,
            probed,
            self.rec
                .p
                .probe_baseline
                .or_else(|| probe_ceiling(&self.rec.p.capability, now)),
        ) else {
            return e;
        };
        // The frees that figure shows: not the probe's own last try's, whose free came after
        // it (the run saw that free's keep gone, and the figure did not).
        let frees = shown.saturating_sub(self.rec.own_frees.start);
        let Ok(per_free) = self.own_keep_per_free(now) else {
            return e;
        };
        // No free kept more than an engine step's window that held one showed
        // ([`Recorder::free_keep_bound`]): where the keep test bounds a free's keep only
        // loosely (rounds that lost, but not alike), that window bounds it tighter.
        let per_free = self
            .rec
            .free_keep_bound
            .map_or(per_free, |b| b.min(per_free));
        let given_back = per_free.saturating_mul(frees);
        // The probe's figure lies within its resolution and a raw page below what was there.
        let upper = allocatable
            .saturating_add(probe::resolution(limit))
            .saturating_add(2 * MIB)
            .saturating_add(given_back);
        let mut p = self.profile_to_plan();
        p.activation_peak_bytes = Some(reached);
        p.graph = None;
        let Ok(b) = PlanBuilder::from_profile(&p, self.why.clone(), request, kv, limits) else {
            return e;
        };
        // The cap keeps a slack for the allocator's rounding: given back here, so that the
        // refusal stands only where one request has no room at all.
        let cap = upper.saturating_add(crate::plan::physical::rounding_slack(upper));
        let b = b.sizing_rules(self.plan_rules()).probed(cap, false);
        match b.build() {
            Err(r) if r.refusal().is_some() => {
                tracing::info!(
                    reached,
                    allocatable,
                    frees,
                    per_free,
                    "profile run out of memory with no room for one request beside what the \
                     session's own frees kept"
                );
                r.during(format!(
                    "the engine's profile run ran out of memory ({e}) after its activation had \
                     taken {} above the weights; {} was allocatable before it, and the {frees} \
                     raw frees this start-up made kept at most {} ({} each): with all of it \
                     given back, the device leaves no room for one request beside the \
                     activation",
                    fmt_bytes(reached),
                    fmt_bytes(allocatable),
                    fmt_bytes(given_back),
                    fmt_bytes(per_free)
                ))
            }
            _ => e,
        }
    }

    /// Where the session does not measure by allocation probes (a free reading measures this
    /// process) but the device was seen keeping memory of every raw free and the session made
    /// raw frees of its own: what was allocatable before the profile run that failed (from
    /// `before`; `now` read after it), for
    /// [`refusal_beside_own_keeps`](Self::refusal_beside_own_keeps), with the raw frees that
    /// figure shows; `None` elsewhere. A reading that measures this process need not see
    /// another process's memory (one composed from a per-process query, the total less this
    /// process's memory, reads the same beside a neighbour of 111 GiB as on an idle device), so
    /// only an allocation can tell what the device had: one probe now, plus what this process
    /// took in the run and still holds (the larger of its free reading's drop and its
    /// allocator's growth). The start-up ends here, so the probe's frees take nothing the
    /// engine needs, and they are given back with the session's others.
    fn allocatable_before_failed_run(
        &mut self,
        before: &MemoryInfo,
        now: &MemoryInfo,
    ) -> Option<(u64, u64)> {
        let made = self.rec.device.raw_frees() > self.rec.own_frees.start;
        if self.rec.p.probe_baseline.is_some() || self.rec.p.kept_per_free.is_none() || !made {
            return None;
        }
        let ceiling = probe_ceiling(&self.rec.p.capability, now)?;
        let frees = self.rec.device.raw_frees();
        let got = probe::allocatable_now(&self.rec.device, ceiling, Some(ceiling), None).ok()?;
        self.rec.probed(got);
        let held = grown(now.driver.free, before.driver.free)
            .unwrap_or(0)
            .max(grown(before.allocator.reserved, now.allocator.reserved).unwrap_or(0));
        let shown = recorder::frees_shown(frees, self.rec.device.raw_frees());
        Some((got.saturating_add(held), shown))
    }

    /// What one of the session's raw frees keeps at most, as measured: where nothing has
    /// measured it yet (the keep test is still owed), a probe now (`now`: the engine's memory
    /// as read) and the keep test from it; the larger of the test's figures and the bound for
    /// a probe's own free.
    fn own_keep_per_free(&mut self, now: &MemoryInfo) -> Result<u64> {
        if self.rec.keep_test.is_some() {
            let ceiling = probe_ceiling(&self.rec.p.capability, now);
            self.rec.probe_now(now.allocator.reserved, ceiling)?;
            self.keep_test()?;
        }
        let p = &self.rec.p;
        Ok([
            p.keep_per_free_bound(),
            p.unseen_kept_per_free,
            self.rec.probe_free_keep,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0))
    }

    /// After the engine's profile run, where the session measures by allocation probes and
    /// nothing has seen what a raw free keeps: the test that measures it by probes around raw
    /// frees ([`probe::kept_by_probes`], from what the probe that closed the profile run
    /// found), deferred from the start ([`recorder::KeepTest`]). What it finds is said by name
    /// ([`Warning::DeviceKeepsMemoryOnFree`]) as at the start, and the frees the start named
    /// its checks' leftovers by are named again at that figure, with the test's own.
    fn keep_test(&mut self) -> Result<()> {
        let Some(test) = self.rec.keep_test.take() else {
            return Ok(());
        };
        let (Some(limit), Some((from, reserved))) =
            (self.rec.p.probe_baseline, self.rec.last_probe)
        else {
            return Ok(());
        };
        let ceiling = probe_ceiling(&self.rec.p.capability, &self.rec.p.last);
        let frees_before = self.rec.device.raw_frees();
        let k = probe::kept_by_probes(&self.rec.device, limit, ceiling, from)?;
        let test_frees = self.rec.device.raw_frees().saturating_sub(frees_before);
        self.rec.last_probe = Some((k.allocatable, reserved));
        self.rec.own_frees.at_last_probe = k.frees_shown;
        self.rec.probe_free_keep = k.unseen_large;
        let p = &mut self.rec.p;
        let seen = p.kept_per_free.max(k.kept);
        p.unseen_kept_per_free = least(p.unseen_kept_per_free, k.unseen).filter(|_| seen.is_none());
        if let Some(bytes) = seen.filter(|_| k.kept.is_some()) {
            p.kept_per_free = Some(bytes);
            let named = p.warnings.iter_mut().find_map(|w| match w {
                Warning::DeviceKeepsMemoryOnFree {
                    bytes_per_free,
                    at_least,
                } => {
                    *at_least = false;
                    Some(bytes_per_free)
                }
                _ => None,
            });
            match named {
                Some(b) => *b = bytes,
                None => self.rec.warn(Warning::DeviceKeepsMemoryOnFree {
                    bytes_per_free: bytes,
                    at_least: false,
                }),
            }
        } else if let Some(bytes) = k.lost_least.filter(|_| seen.is_none()) {
            // Every round lost more than the probes tell apart, but not alike: no figure for
            // the plan, yet the device may keep memory of every free, the engine's frees while
            // serving included; said by name, at the least a free lost.
            let named = self
                .rec
                .p
                .warnings
                .iter()
                .any(|w| matches!(w, Warning::DeviceKeepsMemoryOnFree { .. }));
            if !named {
                tracing::debug!(
                    target: "memplan_planner::session::keep_at_least",
                    bytes,
                    "raw frees lost in every round, not alike: warned at least"
                );
                self.rec.warn(Warning::DeviceKeepsMemoryOnFree {
                    bytes_per_free: bytes,
                    at_least: true,
                });
            }
        }
        if let Some(frees) = test.named_frees {
            let per_free = self.rec.p.kept_per_free.or(self.rec.p.unseen_kept_per_free);
            if let Some(k) = per_free {
                self.rec
                    .left_held_at_least(k.saturating_mul(frees.saturating_add(test_frees)));
            }
        }
        Ok(())
    }

    /// Everything measured so far.
    pub fn profile(&self) -> Profile {
        self.rec.profile()
    }

    /// Everything measured so far, as a plan reads it: where nothing read the engine's memory
    /// outside its allocator, the probes around its steps measured it.
    fn profile_to_plan(&self) -> Profile {
        let mut profile = self.profile();
        if let (None, Some(g)) = (profile.non_allocator_growth, profile.probe_growth) {
            profile.non_allocator_growth = Some(g.max(0));
            profile.non_allocator_by_probe = true;
        }
        profile
    }

    /// The sizing rules this session's plan is made under: those of the release the caller
    /// chose ([`with_sizing_rules`](Self::with_sizing_rules)), else those for no release named.
    fn plan_rules(&self) -> SizingRules {
        match &self.sizing {
            Some((rules, _)) => *rules,
            None => unnamed_release_rules(self.rank.pipeline_parallel_size),
        }
    }

    /// Before the engine's profile run: where the budget of the request the session checked
    /// ([`check_request`](Self::check_request)) has no room for a KV cache on what the engine
    /// holds already, its activation peak counted as nothing, the plan's refusal
    /// ([`PlanBuilder::refusal_before_profile`]), said before the engine runs. The run could
    /// only add to what the budget counts, and it needs memory another process may have taken
    /// since the weights loaded: a neighbour's 60 MiB left an engine whose weights already
    /// held more than its request out of memory in its profile run, where the plan was to
    /// refuse it all along.
    fn refusal_before_profile(&self) -> Result<()> {
        self.refusal_owed(
            "before the engine ran it, what it holds already leaves no room for a KV cache \
             (its activation peak, not measured yet, counted as nothing: a utilisation \
             named is the least that could leave room, the activation peak comes on top)",
        )
    }

    /// The plan's refusal where the budget of the request the session checked has no room for
    /// a KV cache on what was measured so far ([`PlanBuilder::refusal_before_profile`]: an
    /// activation peak not measured yet and the graphs counted as nothing), said `during` a
    /// step that has not run yet; `Ok` where there is room or no request.
    fn refusal_owed(&self, during: &'static str) -> Result<()> {
        let Some(request) = self.request else {
            return Ok(());
        };
        let p = self.profile_to_plan();
        match PlanBuilder::refusal_before_profile(&p, request, self.plan_rules()) {
            Some(e) => Err(e.during(during)),
            None => Ok(()),
        }
    }

    /// A plan builder filled from this start-up (see [`PlanBuilder::from_profile`]) for this
    /// session's [`Rank`]; override figures on it, then [`plan_with`](Self::plan_with). Where
    /// no reading sees memory other processes hold, this allocates what the plan still needs
    /// once and frees it (the allocation probe, `session/probe.rs`), capping the KV cache by
    /// what was physically there.
    ///
    /// Refused ([`Error::InvalidState`] naming `plan`) before the profile run, and when the
    /// engine captures graphs ([`Engine::graph_sizes`]) but no graph phase ran: their memory
    /// would go unreserved. An engine that wants no graph reserve says so with
    /// [`capture_graphs_with`](Self::capture_graphs_with)`(StrategyKind::None)`.
    pub fn plan_builder(
        &mut self,
        request: Request,
        kv: &KvSpec,
        limits: KvLimits,
    ) -> Result<PlanBuilder> {
        self.steps.check(Step::Plan)?;
        if self.rec.p.graph.is_none() {
            let sizes = self.engine.as_dyn().graph_sizes();
            if !sizes.is_empty() {
                return Err(Error::state(
                    Step::Plan.name(),
                    format!(
                        "the engine captures graphs for {} batch sizes but no graph phase ran, \
                         so their memory would not be reserved: call capture_graphs first \
                         (or capture_graphs_with(StrategyKind::None) to plan without a graph \
                         reserve on purpose)",
                        sizes.len()
                    ),
                ));
            }
        }
        // The plan opens the way every engine step does: a synchronized reading closes the
        // quiet window since the last step (the graph phase's teardown), and what another
        // process took or released in it is attributed to it. The cap by free memory is then
        // what is free now, not what was free before that window: a neighbour that released
        // 4 GiB after the teardown left a plan capped by the older reading with no room for one
        // request (an RTX 4090 refused where 65k tokens fitted), and one that took memory was
        // seen only by the allocation probe.
        self.rec.settle(self.engine.as_dyn())?;
        let rules = self.plan_rules();
        self.measure_erred_reading(request, kv, limits, rules)?;
        // Tensors from the engine's allocator measure the cache only where its layout is
        // tensors of one size (`kv_cache::measurable_layout`); otherwise the plan keeps room
        // for the rounding as where they are not offered.
        let measurable = self.offers_tensors && kv_cache::measurable_layout(kv, &limits, &rules);
        if self.rec.kv_range.is_none() && !measurable {
            // The warm-ups are held to what the request leaves beside what the plan counts as
            // this process's (see `rounding`): the same budget the plan is made from.
            let room = self.room_before_plan(request, kv, limits, rules)?;
            self.narrow_granule_bound(limits.max_num_batched_tokens, room)?;
        }
        let profile = self.profile_to_plan();
        let d = self.rec.device.descriptor();
        let b = PlanBuilder::from_profile(&profile, self.why.clone(), request, kv.clone(), limits)?
            .device(format!("{} ({})", d.id, d.name))
            .rank(self.rank);
        let b = match &self.alloc_conf {
            Some((conf, source)) => b.allocator_config(conf.clone(), source.clone()),
            None => b,
        };
        let b = match &self.sizing {
            Some((rules, release)) => b
                .sizing_rules(*rules)
                .engine(release.clone())
                .notes(vec![format!("KV sizing: the rules of {release}, as the caller chose")]),
            None => b
                .sizing_rules(rules)
                .engine(SizingRules::NEWEST_RELEASE)
                .notes(vec![format!(
                    "KV sizing: the rules of {}, the newest engine release memplan knows (the dry run's default too; Session::with_sizing_rules picks another), but room for rounding one KV tensor per layer: with no release named, the cache may be allocated as older releases do",
                    SizingRules::NEWEST_RELEASE
                )]),
        };
        let b = match &self.rec.kv_range {
            Some(r) => b.mapping_granularity(r.granularity()),
            None if measurable => b,
            None => self.unmeasured_rounding(b, &profile),
        };
        let frees = self.rec.device.raw_frees();
        let b = self.kept_by_frees_between_probes(b, frees);
        let held_error = self.rec.held_error();
        let b = if b.is_blind() {
            // Nothing reads memory other processes hold: allocate what the plan still needs
            // once, at this quiet point, and cap the KV cache by what was there.
            probe::check(&self.rec.device, b, held_error)?
        } else {
            let b = probe::resolve_tolerance(&self.rec.device, b, held_error)?;
            probe::verify(&self.rec.device, b, held_error)?
        };
        Ok(self.kept_by_own_frees(b, frees))
    }

    /// What the request leaves before the plan beside what the plan made from what was
    /// measured so far counts as this process's ([`PlanBuilder::room_before_plan`]), under the
    /// sizing rules the caller chose, else `rules`.
    fn room_before_plan(
        &self,
        request: Request,
        kv: &KvSpec,
        limits: KvLimits,
        rules: SizingRules,
    ) -> Result<Option<u64>> {
        let sizing = self.sizing.as_ref().map_or(rules, |(r, _)| *r);
        Ok(PlanBuilder::from_profile(
            &self.profile_to_plan(),
            self.why.clone(),
            request,
            kv.clone(),
            limits,
        )?
        .sizing_rules(sizing)
        .room_before_plan())
    }

    /// A free reading of this process's memory alone, declared exact and never measured (no
    /// calibration; the session's own windows measure only approximate readings), whose engine
    /// steps read memory outside the allocator freed ([`Profile::free_window_error`], set by
    /// the recorder): the declaration is contradicted, and one window's error says nothing of
    /// how far another may be off. Its windows are measured here, at the plan's quiet point, as
    /// the session's start measures an approximate reading's
    /// ([`probe::window_error_and_step`], with the error seen as the tolerance: allocations of
    /// an odd number of 2 MiB pages, which a reading moving in a power-of-two step reads off by
    /// up to the step), and the window error and step it showed are kept for the plan's
    /// margins and the last probe. The allocations hold at most half the room the request
    /// leaves before the plan ([`probe::start_most`]), so that they stay within the request. A
    /// reading moving in 64 MiB steps, which the start's 1 GiB check read as exact, read an
    /// engine's load of weights as 20 MiB freed, while what a library took on its first
    /// capture, read as nothing, was larger: a probe held below the request by 20 MiB still
    /// went up to 9 MiB past it.
    ///
    /// The measurement comes before the reading the plan is made from: on a device that keeps
    /// memory of every raw free, its four frees of up to 64 MiB each kept what no reading
    /// before them shows (32 MiB each: a plan made from the earlier reading went 88 MB past
    /// the request), so the reading is taken again after them and the window between the two
    /// is accounted as the session's own step.
    fn measure_erred_reading(
        &mut self,
        request: Request,
        kv: &KvSpec,
        limits: KvLimits,
        rules: SizingRules,
    ) -> Result<()> {
        let r = self
            .rec
            .p
            .capability
            .reading(memplan_core::Reading::DriverFree);
        let Some(seen) = self.rec.p.free_window_error.filter(|e| *e > 0) else {
            return Ok(());
        };
        if r.tolerance_bytes() > 0
            || !r.measures_own_usage()
            || r.sees_whole_device()
            || self.rec.p.free_step > 0
            || self.rec.p.probe_baseline.is_some()
        {
            return Ok(());
        }
        let room = self.room_before_plan(request, kv, limits, rules)?;
        let most = probe::start_most(room);
        let read = self.rec.p.last;
        let frees = self.rec.device.raw_frees();
        let reads = self.rec.p.free_reads;
        let measured = probe::window_error_and_step(
            &self.rec.device,
            seen,
            read.driver.free,
            reads,
            most,
            self.rec.p.kept_per_free,
            0,
        )?;
        if let Some(w) = measured {
            let step = crate::calibrate::coarse_step(w.step);
            let error = seen.max(w.error).max(step);
            tracing::info!(
                seen,
                measured = w.error,
                step = w.step,
                window_error = error,
                "a process-local reading that erred, measured at the plan's quiet point"
            );
            self.rec.p.free_window_error = Some(error);
            self.rec.p.free_step = self.rec.p.free_step.max(step);
        }
        // The measurement's allocations were freed raw after the reading the plan was to be
        // made from, and a device that keeps memory of every raw free keeps some of what they
        // held, this process's from then on, which that reading cannot show: the plan is made
        // from a reading taken after them instead, and the window from the earlier one is a
        // step of the session's own (nothing else of this process ran in it, and the reading
        // counts this process alone), counted as this process's and named as the session's
        // start counts and names its own check's ([`recorder::Recorder::before_baseline`]),
        // at the window error just measured.
        if self.rec.device.raw_frees() > frees {
            let after = self.rec.snap(self.engine.as_dyn())?;
            let w = self
                .rec
                .engine_step("free reading measurement", read, after);
            if let Some(held) = w.non_allocator.filter(|d| *d > 0) {
                self.rec.left_held(held.unsigned_abs(), true);
            }
        }
        Ok(())
    }

    /// Where the device keeps memory per free ([`Profile::kept_per_free`]): room for what the
    /// raw frees this session made since `frees_before` (its allocation probes, after the last
    /// reading) kept. The plan it checked was larger, so the smaller one fits what the probes
    /// found. The engine's own frees after the plan are its own; the warning says so.
    ///
    /// Where nothing was seen kept but the free reading's noise could hide what a free keeps
    /// ([`Profile::unseen_kept_per_free`]), room for that bound per such free: the session's
    /// own probe would otherwise leave the engine that much short, unwarned (no warning is
    /// given: nothing was seen).
    fn kept_by_own_frees(&self, b: PlanBuilder, frees_before: u64) -> PlanBuilder {
        let n = self.rec.device.raw_frees().saturating_sub(frees_before);
        let p = &self.rec.p;
        // Those frees are the probes' own, as large as what was allocatable: where the keep
        // test bounds what such a free keeps apart from its smaller frees
        // (`Recorder::probe_free_keep`), that bound stands where it is larger.
        let large = self.rec.probe_free_keep;
        tracing::debug!(frees = n, kept = ?p.kept_per_free, unseen = ?p.unseen_kept_per_free, ?large, "raw frees after the last reading");
        match (p.keep_per_free_bound(), p.unseen_kept_per_free) {
            (Some(k), _) => {
                let k = k.max(large.unwrap_or(0));
                b.kept_by_own_frees(k.saturating_mul(n), n)
            }
            (None, Some(u)) => {
                let u = u.max(large.unwrap_or(0));
                b.unseen_kept_by_own_frees(u.saturating_mul(n), n)
            }
            (None, None) => b,
        }
    }

    /// Where the session measures by allocation probes ([`Profile::probe_baseline`]): room
    /// for what the device kept of the session's own raw frees up to `frees_now` (the device's
    /// count) that no window between two probes measured ([`recorder::OwnFrees`]): calibration's
    /// before its first probe, and the last try of each probe that closed a step, which comes
    /// before the probe that opens the next one, in a window attributed to other processes.
    /// The figure per free is what the device was seen to keep ([`Profile::kept_per_free`]),
    /// else the most a free may keep unseen ([`Profile::unseen_kept_per_free`]). An RTX 4090
    /// whose stale reading made the session probe, keeping 4 MiB per free, made 12 such frees
    /// in a conservative start-up (6 of calibration's, one between each two of its 6 probed
    /// steps) and went 31.8 MiB past the request while serving, with no warning naming why.
    fn kept_by_frees_between_probes(&self, b: PlanBuilder, frees_now: u64) -> PlanBuilder {
        if self.rec.p.probe_baseline.is_none() {
            return b;
        }
        let n = self.rec.own_frees.unmeasured(frees_now);
        let p = &self.rec.p;
        tracing::debug!(frees = n, own = ?self.rec.own_frees, kept = ?p.kept_per_free, unseen = ?p.unseen_kept_per_free, "raw frees outside the windows probes measured");
        match (p.keep_per_free_bound(), p.unseen_kept_per_free) {
            (Some(k), _) => b.kept_by_frees_between_probes(k.saturating_mul(n), n, true),
            (None, Some(u)) => b.kept_by_frees_between_probes(u.saturating_mul(n), n, false),
            (None, None) => b,
        }
    }

    /// Where nothing may measure the engine's allocation of its KV cache (no range to map, no
    /// tensors from its allocator; an engine's hook, [`Engine::allocate_kv_cache`], is known
    /// only when it is called): the plan keeps, per KV tensor, room for the coarsest rounding
    /// the engine's own allocations allow ([`crate::plan::granule_bound`]).
    fn unmeasured_rounding(&mut self, mut b: PlanBuilder, profile: &Profile) -> PlanBuilder {
        let mid = self
            .alloc_conf
            .as_ref()
            .map_or(20 * MIB, |(c, _)| c.mid_segment());
        let bound = crate::plan::granule_bound_of_segments(
            &profile.segment_readings,
            profile.weights_reading,
            mid,
        );
        let kept = match bound {
            Some(crate::plan::GranuleBound::AtMost(g)) => b.unmeasured_kv_allocation_at_most(g),
            bound => b.unmeasured_kv_allocation(bound.map(crate::plan::GranuleBound::bytes)),
        };
        tracing::info!(readings = ?profile.segment_readings, bound = ?bound, kept, "the allocator's rounding, bounded from its own allocations (the KV cache's allocation may go unmeasured)");
        self.unmeasured_granule = kept;
        b
    }

    /// Build `builder` (from [`plan_builder`](Self::plan_builder)) as this session's plan:
    /// [`into_kv_cache`](Self::into_kv_cache) checks the plan it gets against it.
    pub fn plan_with(&mut self, builder: PlanBuilder) -> Result<Plan> {
        self.steps.check(Step::Plan)?;
        let after_kv = builder.needs_beside_kv();
        // The count the same plan holds with a finer page than the coarse one it keeps for a
        // cache packed into pages, which the cache's measured allocation may show it can grow
        // to (`kv_cache::finer_count`).
        let finer = builder
            .with_finer_page()
            .and_then(|(coarse, b)| b.build().ok().map(|fine| (fine.kv.num_blocks, coarse)));
        let proven = builder.proven_for_kv();
        let plan = builder.build()?;
        let mut planned = Planned::of(&plan, self.rank, after_kv);
        // Where an allocation probe was the physical check and got all it asked for, it proved
        // the KV cache as the plan rounds its tensors and no more (no reading sees the memory
        // other processes hold): a cache the engine's allocator rounds more is kept only where
        // what the engine needs beside it is still allocatable, as under a physical cap. An
        // eager engine on a device whose only free reading is process-local took 235 MB more
        // for its cache than the probe proved, judged against the request's budget alone, and
        // a 2 GiB neighbour left serving without its activation.
        if let (Some(p), None) = (proven, plan.capped_by_free_bytes) {
            planned.room = planned.room.min(p.max(plan.kv_cache_bytes));
            planned.capped = Some((plan.kv_budget_bytes.max(plan.kv_cache_bytes), after_kv));
        }
        planned.finer = finer.filter(|(fine, _)| *fine > plan.kv.num_blocks);
        self.planned = Some(planned);
        self.steps.succeeded(Step::Plan);
        Ok(plan)
    }

    /// Plan the KV cache from this start-up (see [`crate::plan`]). May run again (another
    /// request or KV spec); the last plan is the one [`into_kv_cache`](Self::into_kv_cache)
    /// holds others to.
    pub fn plan(&mut self, request: Request, kv: &KvSpec, limits: KvLimits) -> Result<Plan> {
        let b = self.plan_builder(request, kv, limits)?;
        self.plan_with(b)
    }

    /// End the session with `plan`: this session's own plan, or the plan combined from every
    /// rank's ([`crate::plan::combine_ranks`]). This rank gets the plan's blocks in its own block
    /// layout ([`KvCache`]); a plan with more blocks than this session planned is refused
    /// ([`Error::InvalidInput`] on `plan`), and so is a call before [`plan`](Self::plan)
    /// ([`Error::InvalidState`]). On any error the session is dropped, which tears down what
    /// it holds.
    ///
    /// After post-capture the blocks' bytes (rounded up to the mapping granularity) are mapped
    /// into the range the engine was given before capture, which [`KvCache::range`] hands
    /// over (it releases the memory on drop); graphs kept by post-capture stay with the
    /// engine. Otherwise an engine that offers [`Engine::allocate_kv_cache`] allocates the
    /// blocks here, measured, and fewer where its layout and allocator take more than the plan
    /// kept ([`KvCache::allocated`], [`Warning::KvCacheShrunk`]); any other engine allocates
    /// [`KvCache::bytes`] itself. Where the allocator's granule, measured, is finer than the
    /// rounding the plan kept room for, a session given its own plan hands over the blocks that
    /// fit in what that plan kept with the measured granule, more than planned; a combined
    /// plan's count is never exceeded.
    pub fn into_kv_cache(mut self, plan: &Plan) -> Result<KvCache> {
        self.steps.check(Step::IntoKvCache)?;
        let own = self
            .planned
            .ok_or_else(|| Error::state(Step::IntoKvCache.name(), "no plan was made"))?;
        let num_blocks = own.blocks_of(plan)?;
        let bytes = num_blocks
            .checked_mul(own.block_bytes)
            .ok_or_else(|| Error::invalid("plan", "the KV cache's bytes overflow 64 bits"))?;
        let (num_blocks, bytes, range, allocated, warnings) = match self.rec.kv_range.take() {
            Some(mut r) => match kv_cache::map(&mut r, bytes) {
                Ok(_) => (num_blocks, bytes, Some(r), false, Vec::new()),
                Err(e) => {
                    // Dropped with the session: the kept graphs go first, then the range.
                    self.rec.kv_range = Some(r);
                    return Err(self.in_step(Step::IntoKvCache, e.during("mapping the KV cache")));
                }
            },
            None => {
                let got = match kv_cache::allocate_measured(
                    &mut self.rec,
                    self.engine.as_dyn(),
                    num_blocks,
                    (own.block_bytes, own.page_bytes),
                    kv_cache::Kept {
                        room: own.room,
                        capped: own.capped,
                        grow: own.grows(plan, num_blocks),
                        granule: self.unmeasured_granule,
                        after_kv: own.after_kv,
                        packed: self
                            .alloc_conf
                            .as_ref()
                            .is_some_and(|(c, _)| c.expandable_segments),
                        finer: own.finer,
                    },
                ) {
                    Ok(got) => got,
                    Err(e) => {
                        let e = e.during("allocating the KV cache");
                        return Err(self.in_step(Step::IntoKvCache, e));
                    }
                };
                match got {
                    Some(m) => {
                        for w in &m.warnings {
                            self.rec.warn(w.clone());
                        }
                        (
                            m.blocks,
                            m.blocks.saturating_mul(own.block_bytes),
                            None,
                            m.held,
                            m.warnings,
                        )
                    }
                    None => {
                        let w = Warning::KvAllocationUnmeasured {
                            blocks: num_blocks,
                            granule: self.unmeasured_granule,
                        };
                        self.rec.warn(w.clone());
                        (num_blocks, bytes, None, false, vec![w])
                    }
                }
            }
        };
        self.done = true;
        self.steps.succeeded(Step::IntoKvCache);
        Ok(KvCache {
            num_blocks,
            bytes,
            range,
            allocated,
            warnings,
        })
    }

    /// End the session without a plan: the profile and the KV range (post-capture), unmapped.
    /// For test-beds and tools that plan and map on their own; an engine ends with
    /// [`into_kv_cache`](Self::into_kv_cache).
    pub fn into_parts(mut self) -> (Profile, Option<KvRange>) {
        self.done = true;
        (self.rec.profile(), self.rec.kv_range.take())
    }
}

/// The rules a session plans with where no release was named
/// ([`Session::with_sizing_rules`]): the newest release's ([`SizingRules::newest`]), except
/// that the KV cache is taken as one tensor per layer ([`KvAllocation::PerTensor`]), each
/// rounded by the allocator: an engine older than vLLM 0.29.0 allocates it so, and room for one
/// rounding where it rounds one per layer would not hold it.
fn unnamed_release_rules(pipeline_stages: u64) -> SizingRules {
    SizingRules::newest(pipeline_stages).with_kv_allocation(KvAllocation::PerTensor)
}

/// Set the free reading unavailable for `reason`; the downgrade's `observed` text.
fn free_unavailable(capability: &mut ProfilingCapability, reason: String) -> String {
    let observed = format!("unavailable ({reason})");
    capability.set(
        memplan_core::Reading::DriverFree,
        memplan_core::Reliability::Unavailable { reason },
    );
    observed
}

/// Set the free reading approximate within `tolerance` for `why`; the downgrade's `observed`
/// text.
fn free_approximate(capability: &mut ProfilingCapability, tolerance: u64, why: String) -> String {
    let observed = format!(
        "approximate (±{}: {why})",
        memplan_core::bytes::fmt_bytes(tolerance)
    );
    capability.set(
        memplan_core::Reading::DriverFree,
        memplan_core::Reliability::Approximate {
            tolerance_bytes: tolerance,
            why,
        },
    );
    observed
}

/// The most an allocation probe searches up to in `snap`: the driver's total, or where the
/// capability says that total is unavailable (calibration found it describes another pool: an
/// APU's runtime reporting the VRAM aperture while the GPU allocates from system memory), the
/// device-wide reading of what is available. A probe capped at the aperture read 512 MiB before
/// and after every step, so it measured nothing the engine held outside its allocator, and a
/// plan went 0.8% past the oracle.
///
/// The device-wide reading is itself a reading, off by its noise whatever it declares, and a
/// probe whose whole search fits reads its ceiling, not what is allocatable. The probes' steps
/// add up from the first probe to the last, so the first one's error stays in the sum: capped
/// at a reading 11 MiB low, the probe before calibration's captures read 11 MiB less
/// allocatable than there was, the memory the engine held outside its allocator came out short
/// by about that, and an eager plan on an APU went 0.56% past the oracle (declared exact or
/// approximate alike). So the ceiling is the device-wide total where one is read (the GPU's
/// memory: no allocation passes it, and the search finds what fits below it), else that
/// reading plus its tolerance.
pub(crate) fn probe_ceiling(capability: &ProfilingCapability, snap: &MemoryInfo) -> Option<u64> {
    use memplan_core::{Reading, Reliability};
    match capability.reading(Reading::DriverTotal) {
        Reliability::Unavailable { .. } => {
            let tolerance = capability
                .reading(Reading::DeviceAvailable)
                .tolerance_bytes();
            match (snap.device.available, snap.device.total) {
                (Some(a), Some(t)) => Some(t.max(a)),
                (Some(a), None) => Some(a.saturating_add(tolerance)),
                (None, t) => t,
            }
        }
        _ => snap.driver.total,
    }
}

/// Where nothing calibrated, a free reading the capability declares usable (exact, approximate,
/// deferred or process-local) that the driver returned no value for at the baseline: it becomes
/// unavailable, calibration's rule for an absent reading, and the downgrade names it; `None`
/// otherwise. An RTX 4090 whose free reading was absent while declared exact had the
/// post-capture strategy measure its graphs through a reading that gave nothing: 112-117% of
/// the oracle.
fn absent_free_reading(capability: &mut ProfilingCapability, free: Option<u64>) -> Option<Warning> {
    use memplan_core::{Reading, Reliability};
    let declared = capability.reading(Reading::DriverFree);
    if free.is_some() || matches!(declared, Reliability::Unavailable { .. }) {
        return None;
    }
    let observed = free_unavailable(
        capability,
        "the driver returned no free-memory value".to_string(),
    );
    Some(Warning::CalibrationDowngrade {
        item: "driver_free".into(),
        declared: declared.to_string(),
        observed,
    })
}

/// What `request` asks for on `device` before the session's start, for sizing its checks
/// ([`probe::start_most`]): a byte budget as given, a share of the device of its total reading;
/// `None` where that is not known (no total reading) or the request is the KV cache's alone
/// (the engine's other memory comes on top of it). A malformed request is an error.
fn start_requested(device: &SharedDevice, request: Request) -> Result<Option<u64>> {
    match request {
        Request::Utilization(_) => match device.driver_memory()?.total {
            Some(total) => crate::budget::requested_bytes(total, request).map(Some),
            None => crate::budget::requested_bytes(u64::MAX, request).map(|_| None),
        },
        Request::Bytes(_) => crate::budget::requested_bytes(u64::MAX, request).map(Some),
        Request::KvCacheBytes(_) => Ok(None),
    }
}

/// What a start for a known request reads before it allocates anything: the most any of its
/// checks may hold at once ([`probe::start_most`]), and the requested bytes with the memory
/// the device holds in use (its total less its free reading) where the request is below it.
struct StartRequest {
    most: u64,
    /// (requested, in use) where both readings were read and the request is below the use.
    below: Option<(u64, u64)>,
}

impl StartRequest {
    /// Errors as [`start_requested`] does for a malformed request, before anything is
    /// allocated.
    fn read(device: &SharedDevice, request: Request) -> Result<Self> {
        let requested = start_requested(device, request)?;
        let most = probe::start_most(requested);
        let below = match requested {
            Some(requested) => {
                let d = device.driver_memory()?;
                d.total
                    .zip(d.free)
                    .map(|(t, f)| t.saturating_sub(f))
                    .filter(|&in_use| requested < in_use)
                    .map(|in_use| (requested, in_use))
            }
            None => None,
        };
        Ok(Self { most, below })
    }

    /// [`Warning::RequestBelowMemoryInUse`] where the request is below the memory in use, the
    /// start's checks having held up to `largest` at once. A utilisation of 0.001 of a 24 GiB
    /// card (24.6 MiB) is below the runtime's context alone, and the start's smallest check
    /// went 10 MiB past that before the engine refused: said by name, since nothing the start
    /// reads tells the context from other processes' memory.
    fn below_in_use(&self, largest: u64) -> Option<Warning> {
        self.below
            .map(|(requested, in_use)| Warning::RequestBelowMemoryInUse {
                requested,
                in_use,
                largest,
            })
    }
}

/// Where nothing calibrated, windows of the free reading over allocations of a known size
/// (`measured`: the largest error and the step the reads moved in, [`probe::window_error_and_step`])
/// whose reads never moved, off by half the allocation or more: the reading does not follow
/// allocations (free reported as total, a stale or wrong pool), whatever tolerance was declared
/// (a tolerance bounds how far a reading is off, not a reading that stands still). It becomes
/// unavailable, as calibration makes a reading that never moved, and the downgrade names it;
/// `None` otherwise. A free reading declared good to 16 MiB that reported the total whatever was
/// allocated sized a post-capture cache from windows that read nothing of the engine's graphs:
/// 1.4 GiB past the request; one declared good to 256 MiB on an APU, 1.2 GiB past it.
fn lost_free_reading(
    capability: &mut ProfilingCapability,
    measured: Option<(u64, u64)>,
    free: Option<u64>,
    tolerance: u64,
    most: u64,
) -> Option<Warning> {
    use memplan_core::Reading;
    let (error, step) = measured?;
    let size = probe::window_size(free?, tolerance, most);
    if step != 0 || size == 0 || error < size / 2 {
        return None;
    }
    let declared = capability.reading(Reading::DriverFree).to_string();
    let reason = format!(
        "free memory does not move when memory is allocated (stale, wrong pool, or free reported as total): windows over allocations of {} read none of them",
        memplan_core::bytes::fmt_bytes(size)
    );
    let observed = free_unavailable(capability, reason);
    Some(Warning::CalibrationDowngrade {
        item: "driver_free".into(),
        declared,
        observed,
    })
}

/// An approximate free reading's window error, measured by the session where nothing calibrated
/// (`measured`), beyond its declared tolerance: the tolerance becomes the measured error and a
/// downgrade names it. A reading that moves in 64 MiB steps declared good to 16 MiB went over
/// the request (by up to 18 MiB) where the strategies' margins took the declaration's 16 MiB.
fn measured_beyond_declared(
    capability: &mut ProfilingCapability,
    measured: Option<u64>,
) -> Option<Warning> {
    use memplan_core::bytes::fmt_bytes;
    use memplan_core::{Reading, Reliability};
    let e = measured?;
    let Reliability::Approximate {
        tolerance_bytes: declared,
        ..
    } = capability.reading(Reading::DriverFree)
    else {
        return None;
    };
    if e <= declared {
        return None;
    }
    let why = format!(
        "windows over allocations of a known size were off by up to {}",
        fmt_bytes(e)
    );
    let observed = free_approximate(capability, e, why);
    Some(Warning::CalibrationDowngrade {
        item: "driver_free".into(),
        declared: format!("approximate (±{})", fmt_bytes(declared)),
        observed,
    })
}

/// The least the device's total can be where a probe found `found` allocatable past the
/// `ceiling` it searched up to (`probe::baseline`): what was allocatable and what this
/// process's allocator held (`reserved`). `None` where the probe found no more than the
/// ceiling, or searched without one.
fn total_from_probe(found: u64, ceiling: Option<u64>, reserved: Option<u64>) -> Option<u64> {
    ceiling
        .is_some_and(|c| found > c)
        .then(|| found.saturating_add(reserved.unwrap_or(0)))
}

/// Where `capability` trusts the free reading as exact, read it [`IDLE_READS`] times on the
/// idle device (each after a synchronize): a reading that moves is not exact, whatever was
/// declared. It becomes approximate, within the largest error a window then shows (the idle
/// spread and windows over allocations of a known size, [`probe::window_error_and_step`] searched up to
/// the device's `total` or calibration's largest allocation, whichever is less), and the
/// warning names it. With `windows` (a session nothing
/// calibrated), the windows over allocations are read even where the idle reads did not move:
/// a reading that lags a synchronize reads the idle device steadily and none of an allocation;
/// it is unavailable where a window read less than half the allocation (calibration's rule),
/// else approximate within what the windows showed. Calibration runs the same checks. A
/// reading declared process-local is read over the same windows where nothing calibrated, and
/// only that rule applies to it: one that read none of the allocations (a runtime reporting
/// another pool) measures nothing of this process.
///
/// Also returns what its windows over allocations showed (what a free keeps, seen or not).
///
/// [`IDLE_READS`]: crate::calibrate::IDLE_READS
fn exact_free_that_moves(
    device: &memplan_core::Device,
    capability: &mut ProfilingCapability,
    total: Option<u64>,
    windows: bool,
    most: u64,
) -> Result<(Option<Warning>, Option<probe::Windows>)> {
    use memplan_core::{Reading, Reliability};
    let declared = capability.reading(Reading::DriverFree);
    // A process-local reading is checked only for following allocations at all (it cannot be
    // told from a device-wide one by moving while idle: other processes do not move it).
    let process_local = matches!(declared, Reliability::ProcessLocal { .. });
    if declared != Reliability::Exact && !(process_local && windows) {
        return Ok((None, None));
    }
    let Some(spread) = crate::calibrate::idle_range_of(device, 1)? else {
        return Ok((None, None));
    };
    if spread == 0 && !windows {
        return Ok((None, None));
    }
    let free = device.driver_memory()?.free;
    // Windows no larger than `most` (calibration's largest allocation, or half a request
    // known before the start; `probe::window_size` bounds them by it): the session's start
    // holds no more for an instant than calibration would. Windows of an eighth of free
    // memory went 5.9 GB past a 12 GiB budget on a 141 GB device, before the engine had
    // loaded anything.
    let cap = total.unwrap_or(u64::MAX);
    // The windows also say what the device kept of each allocation they freed (judged apart
    // from the reading's error, see `probe::window_error_and_step`): returned as they are.
    let checked = probe::window_error_and_step(device, cap, free, 1, most, None, 0)?;
    let worst = checked.map_or(spread, |w| w.error).max(spread);
    // Read only on windows over allocations (the idle reads did not move): an error within what
    // calibration allows a window for a raw allocation's rounding keeps the declaration.
    if worst == 0 || (spread == 0 && worst <= crate::calibrate::tolerance(0)) {
        return Ok((None, checked));
    }
    // Windows over an allocation that read less than half of it: the reading does not follow
    // allocations (one that reports the previous synchronize's memory reads none of it), and
    // no tolerance makes its windows usable (calibration's rule for a lost reading). A reading
    // that also moves a little while idle (one composed with what other users of the VRAM
    // hold moves by a few hundred KiB) is no less stale: only an idle spread of half the
    // window or more, which alone could explain the windows' error, leaves it approximate. Kept
    // approximate within the windows' error, a stale reading's tolerance was most of the
    // device (±5.91 GiB on a 24 GiB card) and the plan refused a cache the device held.
    let size = free.map_or(0, |f| probe::window_size(f, cap, most));
    let observed = if spread.saturating_mul(2) < size && size > 0 && worst >= size / 2 {
        let reason = format!(
            "free memory did not follow allocations of {} after a synchronize (stale?): off by up to {}",
            memplan_core::bytes::fmt_bytes(size),
            memplan_core::bytes::fmt_bytes(worst)
        );
        free_unavailable(capability, reason)
    } else if process_local {
        return Ok((None, checked));
    } else {
        let why = if spread > 0 {
            format!(
                "free moved by {} over {} synchronized reads of the idle device",
                memplan_core::bytes::fmt_bytes(spread),
                crate::calibrate::IDLE_READS
            )
        } else {
            format!(
                "windows over allocations of {} were off by up to {}",
                memplan_core::bytes::fmt_bytes(size),
                memplan_core::bytes::fmt_bytes(worst)
            )
        };
        free_approximate(capability, worst, why)
    };
    Ok((
        Some(Warning::CalibrationDowngrade {
            item: "driver_free".into(),
            declared: declared.to_string(),
            observed,
        }),
        checked,
    ))
}

impl<E: AsDynEngine + ?Sized> Drop for Session<'_, E> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.kept_graphs() {
            // The engine's graphs point into the KV range: they go first, and their release
            // completes before the pool is trimmed and the range released. A runtime may defer
            // it past more synchronizes than the settle waits for, and nothing measured here
            // says how many: an abandoned session waits the most the priming capture would
            // (`LATE_RELEASE_SYNCHRONIZES` of an idle device cost next to nothing).
            let syncs = self
                .rec
                .settle_synchronizes
                .max(crate::strategy::LATE_RELEASE_SYNCHRONIZES);
            let e = self.engine.as_dyn();
            if let Err(err) = crate::strategy::release_all(e, &self.rec.device, syncs) {
                tracing::error!(error = %err, "releasing kept graphs of an abandoned session failed");
            }
        }
        drop(self.rec.kv_range.take());
    }
}

/// The smaller of two bounds, either of which may be absent (the other stands).
fn least(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The engine's allocator must allocate on the device the session reads: where both name
/// their GPU ([`memplan_core::Device::gpu_id`], [`memplan_core::AllocatorView::gpu_id`]) and
/// the names differ, nothing the engine allocates would show in the readings.
fn check_same_gpu(device: &SharedDevice, engine: &mut dyn Engine) -> Result<()> {
    match (device.gpu_id(), engine.allocator().gpu_id()) {
        (Some(d), Some(a)) if d != a => Err(Error::invalid(
            "device",
            format!(
                "the engine's allocator allocates on GPU {a} but the session reads GPU {d}: \
                 what the engine allocates would not show in the readings; open the device \
                 and the allocator from one id (for a simulated GPU: memplan::open(id) and \
                 memplan::sim::allocator(&device))"
            ),
        )),
        _ => Ok(()),
    }
}

/// `&mut E` to `&mut dyn Engine` for sized and unsized engines alike.
pub trait AsDynEngine {
    /// This engine as a trait object.
    fn as_dyn(&mut self) -> &mut dyn Engine;
}

impl<E: Engine> AsDynEngine for E {
    fn as_dyn(&mut self) -> &mut dyn Engine {
        self
    }
}

impl AsDynEngine for dyn Engine + '_ {
    fn as_dyn(&mut self) -> &mut dyn Engine {
        self
    }
}
