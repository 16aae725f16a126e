//! The allocation probe: where no reading sees memory other processes hold (the plan says so
//! with [`Warning::OtherProcessesUnseen`](crate::Warning::OtherProcessesUnseen)), the session
//! checks the plan by allocating, once, what the engine still needs after it (the KV cache, the
//! activation peak, graphs still to capture, rounding slack; never more than the room the
//! request leaves for them, [`within_request`]) straight from the driver, and frees it at
//! once. When that fails, it searches for the largest allocation that succeeds (a search whose
//! tries succeed as seldom as they can, [`search`]: a device may keep memory of every free) and
//! caps the KV cache by it.
//!
//! Where the free reading cannot measure this process at all, the probe also measures what the
//! engine took outside its allocator: the largest allocation that succeeds before and after
//! each of the engine's steps ([`baseline`] opens the session) differ by what the step took;
//! less the allocator's growth in the step, it is the step's non-allocator growth
//! ([`step_growth`], within the probes' resolution, on the safe side), instead of a fixed
//! bound. What changes between steps belongs to other processes, as with readings.
//!
//! And where a reading's declared tolerance is what caps the plan (a free reading that may
//! over-state what is there by up to 512 MiB of graphics allocations it cannot see), the probe
//! checks the plan that takes the reading at its word ([`resolve_tolerance`]): what is
//! physically there replaces the tolerance.
//!
//! An allocation is the one device-wide measurement every backend offers: it fails when the
//! memory is not physically there, whoever holds it. Its limits: it holds the memory for an
//! instant (a neighbour allocating in that instant may fail), and it proves the memory only
//! where the driver commits memory when it allocates (discrete GPUs do; a driver that
//! allocates lazily would let it succeed). The plan records where it capped the plan
//! (`physical_check: probe`). Every other plan is verified by one allocation of what it still
//! needs, within the request ([`verify`]): a reading that over-states free memory cannot run
//! the engine out of memory.

use memplan_core::bytes::MIB;
use memplan_core::{Device, Error, Result};

use crate::calibrate::{alike, FreeLosses};
use crate::plan::PlanBuilder;

/// A reading's tolerance at most twice this is not worth an allocation probe
/// ([`resolve_tolerance`]), nor is a free reading's step ([`step_worth_probes`]).
const RESOLUTION: u64 = 16 * MIB;

/// Whether a free reading that moves in steps of `step` is coarse enough for `full` to
/// measure its graphs by allocation probes instead: a step more than twice [`RESOLUTION`],
/// the same line as a tolerance worth a probe ([`resolve_tolerance`]). Below it, the margin
/// the step costs is less than what a probe's instant of holding all free memory is worth.
pub(crate) fn step_worth_probes(step: u64) -> bool {
    step > 2 * RESOLUTION
}

/// A search ([`search`]) stops when its bracket is narrower than this or 1/[`BISECTION_SHARE`]
/// of the need: about sixteen halvings' worth, each try that succeeds freed at once. Each
/// probe around an engine step counts its resolution on the safe side, and a KV cache whose tensors an allocator rounds
/// to coarse granules loses a whole granule per tensor for a few MiB of such slack, so the
/// bracket is kept narrow: an allocation and its release cost far less than that. (At
/// 1/8192, two probed steps on a 12 GiB Arc B580 counted 4.8 MiB over the workspace they
/// measured, and a cache of 28 tensors rounded to 33.5 MiB granules, 2 MiB short of the
/// next granule, lost 938 MiB: 83% of the tokens that fitted. At 1/65536 the same steps
/// count 0.9 MiB.)
const MIN_RESOLUTION: u64 = MIB / 8;

/// See [`MIN_RESOLUTION`].
const BISECTION_SHARE: u64 = 65536;

/// Check `b` (a plan builder that [`PlanBuilder::is_blind`]) by an allocation probe on
/// `device`. A builder whose plan cannot be built is returned as it is (building it again
/// gives the refusal). The probe is held below the room the request leaves less `held_error` too (as
/// [`verify`]'s): where figures the plan counts as held were read through windows of a free
/// reading, they may read low by that much, and a probe that took the room whole would take
/// it past the request.
pub(crate) fn check(device: &Device, b: PlanBuilder, held_error: u64) -> Result<PlanBuilder> {
    let Ok(plan) = b.clone().build() else {
        return Ok(b);
    };
    let need = need_below_held_error(&b, &plan, held_error);
    let got = largest_allocatable(device, need)?;
    tracing::info!(need, got, "allocation probe at the last quiet point");
    Ok(b.probed(got, got >= need))
}

/// What an allocation probe that checks `plan` (built from `b`) allocates: what the engine
/// still needs after it ([`PlanBuilder::needs`]: the KV cache as its allocator rounds it, the
/// activation peak, graphs still to capture, and the physical cap's slack for the allocator's
/// rounding, 0.5% and at least 32 MiB), never more than the request leaves for it
/// ([`PlanBuilder::room_under_request`]: the memory the engine may use, less what the plan
/// counts as this process's already).
///
/// A probe holds what it allocates for an instant, and the process holds it: past the room,
/// the process would go past the memory the engine asked for before the plan is even handed
/// over, by the probe alone (the slack on a plan that fills its budget: 32 to 100 MiB on a
/// 24 GiB card, every run). The plan never gives the engine more than that room (its KV cache
/// is within the budget, by its own arithmetic), so the room, physically there, is all that
/// proves it fits; whether more is free beyond it says nothing about a plan held to the
/// request.
///
/// The room is taken down to a whole [`RAW_PAGE`]: the driver commits a raw allocation in
/// whole pages, so an allocation of the room itself would hold up to a page past it (an
/// eager plan on an H100 whose room was 36,972,999,476 B went 1.8 MiB past the request).
pub(crate) fn within_request(b: &PlanBuilder, plan: &crate::plan::Plan) -> u64 {
    let room = b.room_under_request(plan);
    b.needs(plan.kv_cache_bytes)
        .min(room.saturating_sub(room % RAW_PAGE))
}

/// What a probe that checks `plan` allocates ([`within_request`]), held below the room the
/// request leaves less `held_error` too; where the error would leave less than a page of the
/// room, the room alone (a check of nothing proves nothing).
fn need_below_held_error(b: &PlanBuilder, plan: &crate::plan::Plan, held_error: u64) -> u64 {
    match below_held_error(b, plan, held_error) {
        0 => within_request(b, plan),
        room => within_request(b, plan).min(room),
    }
}

/// The room the request leaves ([`PlanBuilder::room_under_request`]) less `held_error`, taken
/// down to a whole [`RAW_PAGE`] ([`verify`]).
fn below_held_error(b: &PlanBuilder, plan: &crate::plan::Plan, held_error: u64) -> u64 {
    let room = b.room_under_request(plan).saturating_sub(held_error);
    room.saturating_sub(room % RAW_PAGE)
}

/// The page a driver commits a raw allocation in: a discrete GPU's driver rounds a large raw
/// allocation up to 2 MiB pages (the minimum granularity its virtual-memory API reports for
/// device memory, `docs/measurement-protocol.md`, rule 8; the rounding calibration allows an
/// allocation, [`tolerance`](crate::calibrate::tolerance)); the simulator's raw allocations
/// round the same way (`RAW_ROUND` in `backends/sim`). A probe held within the request is
/// taken down to a whole page of it ([`within_request`]).
pub(crate) const RAW_PAGE: u64 = 2 * MIB;

/// Every plan not already checked by a probe is verified by one before it is handed over: the
/// engine's KV cache, activation and graphs still to capture are allocated once, at this quiet
/// point, never past the request ([`within_request`]), less `held_error`: how far the figures
/// the plan counts as this process's already may read low (the free reading's window error,
/// [`Profile::free_window_error`](crate::Profile::free_window_error)). The room the request
/// leaves is the request less those figures, so it may be over-stated by that much; the plan
/// keeps a margin for it ([`kept_window_error`](crate::strategy::kept_window_error)), but a
/// probe that takes the room whole takes what the margin did not keep too (three planned runs
/// in a sweep of 20,680 went 74 to 103 KiB past the request in this probe, on readings whose
/// windows were off by up to 491 KiB). A reading that over-states free memory (a process-local reading declared device-wide,
/// a stale one nobody caught) cannot then run the engine out of memory: where the allocation
/// fails, the plan is capped by what was there ([`check`]). The cost is one allocation where the
/// readings were right.
pub(crate) fn verify(device: &Device, b: PlanBuilder, held_error: u64) -> Result<PlanBuilder> {
    let Ok(plan) = b.clone().build() else {
        return Ok(b);
    };
    if plan.physical_check == Some(crate::plan::PhysicalCheck::Probe) {
        return Ok(b);
    }
    let need = need_below_held_error(&b, &plan, held_error);
    match fits(device, need) {
        Ok(true) => Ok(b),
        Ok(false) => check(device, b, held_error),
        // A device that cannot allocate (none of memplan's) keeps its readings' plan.
        Err(Error::Unsupported { .. }) => Ok(b),
        Err(e) => Err(e),
    }
}

/// Where a reading's tolerance is what caps the plan (it may over-state free memory by that
/// much: graphics allocations a runtime cannot see, a host figure that moves), and it is wider
/// than a probe's resolution, check the plan that takes the reading at its word with an
/// allocation probe instead: what is physically there replaces the tolerance. So too where the
/// tolerance refuses the plan and the reading at its word holds one (an Arc 140V capped by its
/// device-wide reading less 256 MiB beside a neighbour of 12 GiB refused where the device held
/// 83-100% of the engine alone's KV cache). A builder whose caps do not bind is returned as it
/// is. The probe is held below the room the request leaves
/// less `held_error`, as [`verify`]'s is.
pub(crate) fn resolve_tolerance(
    device: &Device,
    b: PlanBuilder,
    held_error: u64,
) -> Result<PlanBuilder> {
    if b.cap_tolerance() <= 2 * RESOLUTION {
        return Ok(b);
    }
    // A plan the tolerance refused is checked as one it caps is: where the reading at its word
    // holds a plan, the refusal was the tolerance's.
    let plan = match b.clone().build() {
        Ok(plan) if plan.capped_by_free_bytes.is_some() => Some(plan),
        Err(e) if e.refusal().is_some() => None,
        _ => return Ok(b),
    };
    let optimistic = b.clone().without_cap_tolerance();
    let Ok(better) = optimistic.clone().build() else {
        return Ok(b);
    };
    if plan.is_some_and(|p| better.kv_cache_bytes <= p.kv_cache_bytes) {
        return Ok(b);
    }
    match check(device, optimistic, held_error) {
        Ok(probed) => Ok(probed),
        // A device that cannot allocate keeps the tolerance.
        Err(Error::Unsupported { .. }) => Ok(b),
        Err(e) => Err(e),
    }
}

/// Try to allocate `bytes`: `Ok(true)` when it succeeded (and was freed again), `Ok(false)`
/// when the device is out of memory, the error otherwise.
pub(crate) fn fits(device: &Device, bytes: u64) -> Result<bool> {
    match device.allocate(bytes) {
        Ok(a) => {
            device.free(a)?;
            Ok(true)
        }
        Err(Error::OutOfMemory { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The search's resolution for a search up to `need`.
pub(crate) fn resolution(need: u64) -> u64 {
    MIN_RESOLUTION.max(need / BISECTION_SHARE)
}

/// How far apart two steps' takes can be and still read alike, each measured by a window of
/// two probes searching up to `limit` (what became unallocatable between them): the least
/// range repeated windows can show. The largest raw allocation that succeeds is a whole
/// number of [`RAW_PAGE`]s, so a probe moves in page steps while what a step takes
/// (executable objects, a pool's blocks) need not fill one, and a search reads it up to its
/// [`resolution`] low. Two windows from one starting point read alike where their probes
/// after the steps do: within one page (a search's error cannot make up a whole page where its
/// resolution is finer), or, where the resolution is a page or more, within the whole pages
/// the two searches' errors can make up, and one more. Counted at the search's resolution
/// alone, twelve probed repeats of a 206 MB capture whose executable object varied by up to
/// 2 MB from capture to capture all read 205,874,622 B (one page), the margin for 36 graphs
/// kept 4.5 MB for a variation it could not see, and the engine's later captures took 5.3 MB
/// past the reserve.
pub(crate) fn alike_within(limit: u64) -> u64 {
    (resolution(limit) / RAW_PAGE)
        .saturating_add(1)
        .saturating_mul(RAW_PAGE)
}

/// At the baseline, where no reading measures this process: the largest allocation that
/// succeeds, up to the device's `total`, with the raw frees that figure shows
/// ([`frees_shown`](super::recorder::frees_shown)); `None` where the device cannot allocate,
/// or gives no total to search up to.
pub(crate) fn baseline(device: &Device, total: Option<u64>) -> Result<Option<(u64, u64)>> {
    baseline_from(device, total, None)
}

/// [`baseline`], where a probe found `hint` allocatable just before (calibration's, before its
/// checks that may leave memory held): what those checks and that probe's own last free kept
/// lies a few steps below it, so the baseline descends from it in steps of the keep test's
/// slack ([`allocatable_by_descent`]: tries that fail cost nothing, and the first that succeeds
/// ends it, within a step of what was allocatable), where a search from the total gallops down
/// to a first success up to as far below what is allocatable as the total is above it, and its
/// refinement succeeds again. On a device that keeps memory of every raw free, that second
/// success is a free the engine loses for good before its own steps: a 12 GiB Arc B580 keeping
/// 32 MiB a free, beside a neighbour that left the engine alone 235 MiB to spare in its profile
/// run, ran it out of memory after eight frees (256 MiB), two of them this probe's. The figure
/// lies up to a step lower than a search's (its resolution), and it reads what calibration's
/// checks left held that much higher: the safe side.
pub(crate) fn baseline_from(
    device: &Device,
    total: Option<u64>,
    hint: Option<u64>,
) -> Result<Option<(u64, u64)>> {
    let Some(total) = total.filter(|t| *t > 0) else {
        return Ok(None);
    };
    let frees = device.raw_frees();
    let largest = |need: u64| -> Result<u64> {
        match hint.filter(|h| *h > 0 && *h < need) {
            // Calibration's probe found `h` before its checks: what they and that probe's own
            // free kept lies a few steps below it, found by descending (one success).
            Some(h) => allocatable_by_descent(device, need, Some(need), h, keep_slack(need)),
            None => largest_allocatable(device, need),
        }
    };
    let found = largest(total).and_then(|b| {
        if b >= total {
            past_total(device, total)
        } else {
            Ok(b)
        }
    });
    match found {
        Ok(b) => Ok(Some((
            b,
            super::recorder::frees_shown(frees, device.raw_frees()),
        ))),
        Err(Error::Unsupported { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where an allocation of the whole reported `total` succeeded: nothing can be allocated past
/// the memory a device has, and this process holds some of it (its context at least), so the
/// total is reported too low. What is allocatable is searched past it, up to twice it: the
/// largest allocation that succeeds. A device where even twice its reported total can be
/// allocated does not commit memory when it allocates (a lazy driver, or a unified pool
/// lent from system memory), so no allocation measures it: the reported total is kept, as
/// before. Stopped at the reported total, the probe read exactly the total at the baseline,
/// the probe after the engine's first step, which searches past it, read the difference as
/// memory given back (an Arc B580 whose runtime reported its total 1 GiB low read 809 MB given
/// back outside the allocator while its weights loaded, and its plan held 66% of the KV
/// cache that fitted).
fn past_total(device: &Device, total: u64) -> Result<u64> {
    let top = total.saturating_mul(2);
    if fits(device, top)? {
        return Ok(total);
    }
    search(device, total, top, None, resolution(total))
}

/// The most one allocation of the session's start may hold at once (its checks' windows over
/// allocations of a known size, calibration's sizes): calibration's largest allocation
/// ([`LARGEST_SIZE`](crate::calibrate::LARGEST_SIZE)), and where the request is known before
/// the start ([`Session::start_for`](super::Session::start_for)), half of what it asks for
/// (`requested`), the rest left for what the process holds already (its runtime's context). A
/// start that sized its windows by the device alone went 287 MiB past a 3% share of a 24 GiB
/// card, before the engine had loaded anything.
pub(crate) fn start_most(requested: Option<u64>) -> u64 {
    let most = crate::calibrate::LARGEST_SIZE;
    requested.map_or(most, |r| most.min(r / 2))
}

/// Allocations whose windows measure the free reading's window error where nothing
/// calibrated it ([`window_error_and_step`]).
const WINDOW_ALLOCATIONS: usize = 4;

/// The most allocations [`window_error_and_step`] makes where its windows show a step
/// ([`shown_step`]) larger than the idle spread and no keep was seen: what a free may keep
/// unseen is then bounded by the step shared among the frees, a quarter of it over
/// [`WINDOW_ALLOCATIONS`] (16 MiB a free in 64 MiB steps, kept for each of the session's own
/// raw frees after its last reading), a sixteenth over these.
const STEPPED_WINDOW_ALLOCATIONS: usize = 16;

/// The size of the allocations [`window_error_and_step`] measures windows over, with `free` free and a
/// reading's `tolerance`: well above the reading's step, small beside what is free, an odd
/// number of 2 MiB pages: no multiple of a step of 4 MiB or more, so that a reading that moves
/// in such steps reads a window over it off (a multiple of the step would read exactly). At
/// most `most`, the most the session's start holds at once ([`start_most`]).
pub(crate) fn window_size(free: u64, tolerance: u64, most: u64) -> u64 {
    let pages = (free / 8).min(tolerance.max(64 * MIB)).min(most) / (2 * MIB);
    let odd = if pages > 1 && pages.is_multiple_of(2) {
        pages - 1
    } else {
        pages
    };
    odd * (2 * MIB)
}

/// How far a window of an approximate free reading is off, measured: the spread of
/// [`IDLE_READS`](crate::calibrate::IDLE_READS) synchronized reads of the idle device, and
/// [`WINDOW_ALLOCATIONS`] raw allocations of a known size (up to
/// [`STEPPED_WINDOW_ALLOCATIONS`] where a step hides what a free keeps), the reading taken (synchronized)
/// before each, after it and after it is freed; the largest difference between what a window
/// showed and the size (or what two idle reads differ by). A
/// declared tolerance often covers a constant offset (graphics allocations the reading cannot
/// see), which a window cancels; what the reading does from one read to the next does not.
/// `None` where the reading is exact, absent, or the device cannot allocate.
///
/// `reads`: how many reads each reading combines ([`Profile::free_reads`](crate::Profile));
/// `most`: the most one allocation may take ([`start_most`]); `known_kept`: what the device
/// was already seen to keep of every raw free (calibration's pairs, or the session's earlier
/// windows), where it was. Each further pair on such a device keeps as much again for good,
/// counted as this engine's memory though the engine alone never takes it, and the windows
/// would only measure the keep again: they are then cut to
/// [`KEPT_PAIRS`](crate::calibrate::KEPT_PAIRS), what still tells the window error and the
/// step (an A100 keeping 64 MiB a free held 248 MiB more after the start's four windows where
/// calibration had measured the keep already). `known_step`: the step calibration (or the
/// session's earlier windows) confirmed the same reading moves in, 0 for none
/// ([`confirm_step`](crate::calibrate::confirm_step)); where it is known, the windows' step is
/// not confirmed again by an allocation of its own, and is at most it.
///
/// Returns what the windows showed ([`Windows`]).
pub(crate) fn window_error_and_step(
    device: &Device,
    tolerance: u64,
    free: Option<u64>,
    reads: usize,
    most: u64,
    known_kept: Option<u64>,
    known_step: u64,
) -> Result<Option<Windows>> {
    let Some(free) = free.filter(|_| tolerance > 0) else {
        return Ok(None);
    };
    let size = window_size(free, tolerance, most);
    if size == 0 {
        return Ok(None);
    }
    let read = || crate::calibrate::combined_free(device, reads);
    // One window over a known allocation: free memory read before allocating `size`, while
    // holding it and after freeing it; `None` where the allocation did not fit, the device
    // makes none, or a reading is absent.
    let window = |size: u64| -> Result<Option<[u64; 3]>> {
        let Some(before) = read()? else {
            return Ok(None);
        };
        let a = match device.allocate(size) {
            Ok(a) => a,
            Err(Error::Unsupported { .. } | Error::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let held = read();
        device.free(a)?;
        let (Some(held), Some(after)) = (held?, read()?) else {
            return Ok(None);
        };
        Ok(Some([before, held, after]))
    };
    // The reading's spread on the idle device (see `calibrate`'s idle reads), then windows over
    // known allocations.
    let Some(idle) = crate::calibrate::idle_range_of(device, reads)? else {
        return Ok(None);
    };
    let mut worst = idle;
    // Every reading the windows are made of (see the step rule below).
    let mut reads: Vec<u64> = Vec::with_capacity(3 * STEPPED_WINDOW_ALLOCATIONS);
    let mut windows: Vec<(u64, u64, u64)> = Vec::with_capacity(STEPPED_WINDOW_ALLOCATIONS);
    for made in 0..STEPPED_WINDOW_ALLOCATIONS {
        // Past the first few, only while a step hides what a free keeps: a device that was
        // seen to keep memory is not made to keep more of the session's start.
        if made >= WINDOW_ALLOCATIONS && !keep_hidden_by_step(&windows, &reads, size, idle) {
            break;
        }
        if made >= crate::calibrate::KEPT_PAIRS && known_kept.is_some() {
            break;
        }
        let Some([before, held, after]) = window(size)? else {
            return Ok(None);
        };
        reads.extend([before, held, after]);
        windows.push((before, held, after));
    }
    // The reads' common divisor is only an upper bound on the step the reading moves in
    // (calibration's `confirm_step`): where the windows show it, an allocation of half of it
    // shows a finer one (windows of 1022 MiB on a reading in 512 MiB steps read 1 GiB each,
    // and every read fell on an even multiple of the step).
    // A step confirmed before on the same reading (`known_step`) bounds it already: every read
    // is a multiple of the true step, and so is that one.
    // What a free keeps, where the windows (or calibration) showed it: each confirmation is a
    // free of its own, made only where it may take off more than that.
    let shown = shown_step(&windows, size, crate::calibrate::reading_step(&reads));
    if known_step == 0 && shown > crate::calibrate::tolerance(0) {
        let pairs: Vec<(u64, u64)> = windows.iter().map(|(b, _, a)| (*b, *a)).collect();
        let noise = idle.max(shown);
        let kept = known_kept
            .or_else(|| crate::calibrate::kept_per_free(&pairs, noise))
            .or_else(|| kept_over_all_frees(&pairs, noise))
            .unwrap_or(0);
        crate::calibrate::confirm_step(&mut reads, most, kept, &mut |half| window(half))?;
    }
    // What two reads of the same memory may differ by, for the rules below that read what a
    // free keeps from the windows' pairs of reads: the idle spread, and the step the reading is
    // shown to move in ([`shown_step`]).
    let step = match crate::calibrate::reading_step(&reads) {
        0 => 0,
        divisor => crate::plan::gcd(divisor, known_step),
    };
    let noise = idle.max(shown_step(&windows, size, step));
    // Only where every window saw its allocation (a reading that lags or misses allocations
    // says nothing about what a free gave back).
    let followed = windows.iter().all(|(b, h, _)| {
        (i128::from(*b) - i128::from(*h) - i128::from(size)).unsigned_abs()
            <= u128::from(crate::calibrate::tolerance(size).saturating_add(noise))
    });
    let pairs: Vec<(u64, u64)> = windows.iter().map(|(b, _, a)| (*b, *a)).collect();
    let kept = if followed {
        crate::calibrate::kept_per_free(&pairs, noise)
            .or_else(|| kept_over_all_frees(&pairs, noise))
    } else {
        None
    };
    // What a free gave back is judged against the keep seen here, else the one known: two
    // windows under a reading's noise may not show it again.
    let judged_kept = kept.or(known_kept.filter(|_| followed));
    let unseen_kept = if followed && kept.is_none() {
        unseen_kept_per_free(&pairs, noise)
    } else {
        None
    };
    // The most a free may keep, seen or not: each pair's loss is the keep give or take what
    // two reads of the same memory differ by, which a nonzero idle spread only samples: a later
    // pair can differ by more, and the bound takes the error kept for a spread seen
    // ([`kept_window_error`](crate::strategy::kept_window_error)). With the spread as seen, an
    // MI300X keeping 16 MiB a free, its idle reads 4.9 MiB apart and one pair 5.2 MiB under the
    // keep, was bounded at 15.73 MiB a free: the start's twelve frees left 192 MiB held where
    // the plan named 188.8 MiB, and the engine's profile run went past the request by the rest.
    // Idle reads that never moved sample no spread to widen, and a step the windows show is
    // no sample either: what a read can be off by in steps is the step.
    let spread_kept = if idle > 0 {
        crate::strategy::kept_window_error(idle)
    } else {
        0
    };
    let most_kept = followed
        .then(|| unseen_kept_per_free(&pairs, spread_kept.max(noise)))
        .flatten()
        .map(|m| m.max(kept.unwrap_or(0)));
    tracing::debug!(
        ?windows,
        idle,
        noise,
        followed,
        ?kept,
        ?unseen_kept,
        ?most_kept,
        size,
        "windows over allocations of a known size"
    );
    for (before, held, after) in windows {
        let dropped = i128::from(before) - i128::from(held);
        let regained = i128::from(after) - i128::from(held);
        // Nothing of an allocation no larger than the keep comes back.
        let back = (i128::from(size) - i128::from(judged_kept.unwrap_or(0))).max(0);
        for (seen, expected) in [(dropped, i128::from(size)), (regained, back)] {
            let err = (seen - expected).unsigned_abs();
            worst = worst.max(u64::try_from(err).unwrap_or(u64::MAX));
        }
    }
    // A window off while every reading was a multiple of a larger step: another window can be
    // off by up to the step (calibration's rule, `reading_step`).
    if worst > 0 {
        worst = worst.max(step);
    }
    Ok(Some(Windows {
        error: worst,
        step,
        kept,
        unseen_kept,
        most_kept,
    }))
}

/// The step a free reading is shown to move in by `windows` (the reads before, while holding
/// and after freeing each allocation of `size`, [`window_error_and_step`]'s) whose reads all
/// share `step` (their common divisor, [`reading_step`](crate::calibrate::reading_step)): the
/// step where it is coarse ([`coarse_step`](crate::calibrate::coarse_step)) and a window read
/// its allocation off, else 0. The windows' size is an odd number of 2 MiB pages
/// ([`window_size`]), which no step of 4 MiB or more divides: a reading in such steps reads
/// every one of them off (a 62 MiB allocation as 0 or 64 MiB), so two reads of the same
/// memory may differ by up to the step, and a device that keeps less than the step of each
/// raw free shows pairs that lost 0 or a step (64, 0, 64 and 64 MiB for 48 MiB kept). An
/// exact reading reads them exactly, whatever divisor its reads share (an idle RTX 4090's
/// exact reads of round sizes share 14 MiB): the divisor alone is no step, and naming the
/// session's frees by it would warn on every such session. A reading in steps of a page
/// reads such windows exactly too, and is told from an exact one by nothing here.
fn shown_step(windows: &[(u64, u64, u64)], size: u64, step: u64) -> u64 {
    let off = windows
        .iter()
        .any(|(b, h, _)| i128::from(*b) - i128::from(*h) != i128::from(size));
    if off {
        crate::calibrate::coarse_step(step)
    } else {
        0
    }
}

/// Whether `windows` over allocations of `size` (whose `reads` they are, with an idle spread
/// of `idle`) show a step larger than the idle spread ([`shown_step`]) and, read against it,
/// no keep per free: more pairs narrow what a free may keep unseen.
fn keep_hidden_by_step(windows: &[(u64, u64, u64)], reads: &[u64], size: u64, idle: u64) -> bool {
    let step = shown_step(windows, size, crate::calibrate::reading_step(reads));
    if step <= idle {
        return false;
    }
    let pairs: Vec<(u64, u64)> = windows.iter().map(|(b, _, a)| (*b, *a)).collect();
    crate::calibrate::kept_per_free(&pairs, step)
        .or_else(|| kept_over_all_frees(&pairs, step))
        .is_none()
}

/// What [`window_error_and_step`] measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Windows {
    /// The window error: the largest difference between what a window showed and the size
    /// (or what two idle reads differ by).
    pub error: u64,
    /// The step the readings the windows were made of moved in (`reading_step`: 0 where they
    /// never moved, a few bytes where they count bytes).
    pub step: u64,
    /// What the device kept of each allocation freed
    /// ([`kept_per_free`](crate::calibrate::kept_per_free) of the reads before each
    /// allocation and after its free, calibration's rule; a window over a free is then judged
    /// against what the free gave back: memory a driver keeps is no error of the reading).
    pub kept: Option<u64>,
    /// Where nothing was seen kept ([`Windows::kept`] absent) though every window saw its
    /// allocation: the most a free may keep that the windows could not show
    /// ([`unseen_kept_per_free`]).
    pub unseen_kept: Option<u64>,
    /// Where every window saw its allocation: the most a free may have kept, seen or not
    /// ([`unseen_kept_per_free`] of the idle spread, or of the step the reading is shown to move
    /// in where that is larger, [`shown_step`]), never below [`Windows::kept`]. `kept` is the mean
    /// of noisy losses and may be below what each free kept (1009 KiB for a device keeping
    /// 1 MiB); what the session's own checks left held is named by this bound.
    pub most_kept: Option<u64>,
}

/// What a device keeps of every raw allocation it frees, from `pairs` of synchronized free
/// readings made one after the other with nothing else allocated between them (the reading
/// before each allocation, the one after its free), where each pair's loss alone is within the
/// reading's `noise` ([`kept_per_free`] needs every pair to lose more than it): from the first
/// reading to the last, free memory lost what every free kept, give or take what two reads
/// differ by (the noise once, not once per pair). Seen where that loss is more than the noise
/// and the pairs lost alike ([`kept_per_free`]'s rule against one pair's loss: another
/// process allocating, a late release); the figure is the loss shared among the frees,
/// rounded up. Four pairs of a free reading that moves by 0.5 MiB from read to read lost
/// -89 KiB to 573 KiB each, 1 MiB from first to last: a device keeping 256 KiB per free.
///
/// `None` with fewer than [`KEPT_PAIRS`](crate::calibrate::KEPT_PAIRS) pairs, or where the
/// loss is within the noise.
///
/// [`kept_per_free`]: crate::calibrate::kept_per_free
pub(crate) fn kept_over_all_frees(pairs: &[(u64, u64)], noise: u64) -> Option<u64> {
    if pairs.len() < crate::calibrate::KEPT_PAIRS {
        return None;
    }
    let losses = FreeLosses::of(pairs)?;
    let (least, most) = losses.range();
    let noise = i128::from(noise);
    let lost = losses.over_all();
    if !alike(least, most, noise) || lost <= noise {
        return None;
    }
    let n = losses.len();
    u64::try_from((lost + n - 1) / n).ok()
}

/// The most a device may keep of every raw allocation it frees that `pairs` of synchronized
/// free readings (the one before each allocation, the one after its free) cannot show, with
/// reads of the idle device that differ by up to `noise` ([`kept_per_free`] sees a figure
/// only where every pair lost more than the noise). Every pair lost what a free keeps, give or
/// take what two reads differ by, so what a free keeps is at most the least loss plus the
/// noise; and the pairs made one after the other lost from the first reading to the last what
/// every free kept give or take the noise once ([`kept_over_all_frees`]), so it is at most that
/// loss plus the noise, shared among the frees. The smaller of the two, rounded up (0 where it
/// is below 0: the readings gained). `None` without pairs.
///
/// A reading whose noise is larger than what a free keeps hides it from the rules that warn;
/// this bound is what the plan keeps room for per raw free the session makes after its last
/// reading.
///
/// [`kept_per_free`]: crate::calibrate::kept_per_free
pub(crate) fn unseen_kept_per_free(pairs: &[(u64, u64)], noise: u64) -> Option<u64> {
    let noise = i128::from(noise);
    let losses = FreeLosses::of(pairs)?;
    let (least, _) = losses.range();
    let n = losses.len();
    let over_all = (losses.over_all() + noise + n - 1).div_euclid(n);
    let most = (least + noise).min(over_all).max(0);
    Some(u64::try_from(most).unwrap_or(u64::MAX))
}

/// The most raw frees [`kept_by_probes`] makes to see what each keeps: a keep is seen where the
/// frees lost four times what two probes may differ by (the search's resolution and an
/// allocation's rounding: 3.3 MiB on an 80 GiB device), so 128 frees see 104 KiB a free there.
const KEEP_TEST_FREES: u64 = 128;

/// The size of each allocation [`kept_by_probes`] frees: no larger than a window's
/// ([`window_size`]'s 64 MiB), well above what a driver was seen to keep of a free (4 MiB).
const KEEP_TEST_SIZE: u64 = 32 * MIB;

/// What [`kept_by_probes`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbedKeep {
    /// What the last probe found allocatable (after the test frees: the session's probes go on
    /// from it).
    pub allocatable: u64,
    /// The raw frees that figure shows (every one but its last try's,
    /// [`frees_shown`](super::recorder::frees_shown)).
    pub frees_shown: u64,
    /// What each raw free kept, where two rounds of frees each lost more than the probes can
    /// tell apart, and alike.
    pub kept: Option<u64>,
    /// Where nothing was seen: the most a free may keep that the probes could not show.
    pub unseen: Option<u64>,
    /// Where two rounds lost, but not alike: the most one of the session's probes' own frees
    /// may keep ([`unseen_of_round`]; each such free is as large as what was allocatable,
    /// larger than the test's, and a free keeps at most what it held).
    pub unseen_large: Option<u64>,
    /// Where both rounds lost more than the probes can tell apart, but not alike: the least
    /// one of their frees lost, less the slack two measurements may differ by (a free keeps at
    /// least that much; no figure for the plan).
    pub lost_least: Option<u64>,
}

/// Where no reading measures this process (stale, absent, or lost), the windows that see what
/// each raw free keeps ([`window_error_and_step`]) read nothing, yet the device may keep memory
/// of every free, which then goes unseen and unwarned (an H100 with a stale reading keeping
/// 1 MiB per free went 8 MiB past the request while serving, its engine's frees beyond any
/// plan, with no warning naming why). Allocation probes see it instead: what is allocatable
/// (`from`, found by the probe the session just made) is measured again after raw frees of
/// [`KEEP_TEST_SIZE`] (one, then doubling, up to [`KEEP_TEST_FREES`] in all, each probe's own
/// successful tries counted as frees too: [`Device::raw_frees`] before its last try). Each
/// measurement is within the search's resolution and an allocation's rounding (2 MiB,
/// calibration's allowance) of what was there, so two differ by up to that slack either way;
/// a loss beyond four times it is memory the frees kept (an H100 keeping 1 MiB per free lost
/// 7.1 and 3.2 MB over two rounds of five frees: twice the slack is too close to tell); it is
/// the figure where a second round of as many frees loses more than twice the slack, alike
/// (calibration's rule against a neighbour allocating during one round: rounds that lose
/// alike, within their slack), shared among the frees and rounded up. Where nothing is seen, the loss plus the
/// slack, shared among the frees, is the most a free may keep unseen. The cost: a few frees
/// where a free keeps MiBs (seen at once), 128 small ones where it keeps nothing.
pub(crate) fn kept_by_probes(
    device: &Device,
    limit: u64,
    ceiling: Option<u64>,
    from: u64,
) -> Result<ProbedKeep> {
    let slack_step = keep_slack(limit);
    let slack = i128::from(slack_step);
    let size = KEEP_TEST_SIZE.min(from / 8);
    let mut at = (from, device.raw_frees().saturating_sub(1));
    let none = |(allocatable, frees_shown)| ProbedKeep {
        allocatable,
        frees_shown,
        kept: None,
        unseen: None,
        unseen_large: None,
        lost_least: None,
    };
    if size == 0 {
        return Ok(none(at));
    }
    // Frees made, then measured: (what was lost, over how many frees), from `at`.
    let round = |start: (u64, u64), frees: u64| -> Result<Option<(u64, u64, i128, i128)>> {
        for _ in 0..frees {
            if !fits(device, size)? {
                return Ok(None);
            }
        }
        let hint = start.0.saturating_sub(frees.saturating_mul(size / 8));
        let now = allocatable_by_descent(device, limit, ceiling, hint, slack_step)?;
        let n = device.raw_frees().saturating_sub(1);
        let lost = i128::from(start.0) - i128::from(now);
        let over = i128::from(n.saturating_sub(start.1)).max(1);
        Ok(Some((now, n, lost, over)))
    };
    let first = at;
    let mut made = 0;
    let mut frees = 1;
    loop {
        let Some((now, n, _, _)) = round(at, frees)? else {
            return Ok(none(at));
        };
        made += frees;
        at = (now, n);
        let lost = i128::from(first.0) - i128::from(now);
        let over = i128::from(n.saturating_sub(first.1)).max(1);
        if lost > 4 * slack {
            // Seen: a second round of as many frees (the probes' own tries counted) must lose
            // alike.
            let again = u64::try_from(over).unwrap_or(made).min(2 * KEEP_TEST_FREES);
            let Some((now2, n2, lost2, over2)) = round(at, again)? else {
                return Ok(none(at));
            };
            let alike = lost2 > 2 * slack
                && (lost / over - lost2 / over2).abs() <= 2 * slack / over.min(over2);
            tracing::debug!(
                lost,
                over,
                lost2,
                over2,
                alike,
                "raw frees between allocation probes"
            );
            let kept = alike.then(|| {
                let l = lost + lost2;
                let o = over + over2;
                u64::try_from((l + o - 1) / o).unwrap_or(u64::MAX)
            });
            // Rounds that did not lose alike show no figure; the first round's loss still
            // bounds what a free may keep.
            let unseen = kept
                .is_none()
                .then(|| u64::try_from((lost + slack + over - 1) / over).unwrap_or(u64::MAX));
            // What one of the probes' own frees may keep (each as large as what was
            // allocatable), where the test's smaller frees may not show it: where the rounds
            // did not lose alike, or where one lost more than its frees could have kept had
            // each held a test allocation ([`unseen_of_round`]). Both rounds end on a
            // descent's first success ([`allocatable_by_descent`]), within a step of what was
            // allocatable; the first starts from the figure of the probe that closed the
            // profile run, which may lie further below what was allocatable (its refinement
            // fails on its own first success's keep), so a round may read less than its frees
            // kept, not more: the larger of the two stands, not the lesser.
            let rounds = [(lost, over, made), (lost2, over2, again)];
            let size_i = i128::from(size);
            let saturated = rounds
                .iter()
                .any(|(l, o, _)| l + slack > size_i.saturating_mul(*o));
            let large = (kept.is_none() || saturated).then(|| {
                rounds
                    .iter()
                    .map(|(l, o, t)| unseen_of_round(*l, *o, i128::from(*t), size, slack))
                    .max()
                    .unwrap_or(0)
            });
            let lost_least = (kept.is_none() && lost2 > 2 * slack).then(|| {
                rounds
                    .iter()
                    .map(|(l, o, _)| (l - slack).max(0) / o)
                    .min()
                    .map_or(0, |b| u64::try_from(b).unwrap_or(0))
            });
            return Ok(ProbedKeep {
                allocatable: now2,
                frees_shown: n2,
                kept,
                unseen,
                unseen_large: large,
                lost_least: lost_least.filter(|b| *b > 0),
            });
        }
        if made >= KEEP_TEST_FREES {
            let unseen = u64::try_from(((lost + slack + over - 1) / over).max(0)).unwrap_or(0);
            tracing::debug!(
                lost,
                over,
                unseen,
                "raw frees between allocation probes: none seen kept"
            );
            return Ok(ProbedKeep {
                allocatable: now,
                frees_shown: n,
                kept: None,
                unseen: Some(unseen),
                unseen_large: None,
                lost_least: None,
            });
        }
        frees = made.min(KEEP_TEST_FREES - made);
    }
}

/// How far one probe of a search up to `limit` may read below what was allocatable: the
/// search's resolution and a raw allocation's rounding ([`tolerance`](crate::calibrate::tolerance)
/// of nothing). The keep test's rounds, and the descents that find what is allocatable from a
/// figure just found ([`allocatable_by_descent`]), step by it.
fn keep_slack(limit: u64) -> u64 {
    slack_of(resolution(limit))
}

/// A probe's slack where its search resolves to `res`: that resolution and a raw allocation's
/// rounding ([`keep_slack`]).
fn slack_of(res: u64) -> u64 {
    res.saturating_add(crate::calibrate::tolerance(0))
}

/// The most tries [`allocatable_by_descent`] makes before it gallops instead: 256 steps of
/// the keep test's slack (2.2 MB on a 12 GiB device) descend 560 MB, more than four raw frees
/// of the largest keep seen (128 MiB) lose beside the test's own.
const DESCENT_TRIES: u64 = 256;

/// What is allocatable now, for a round of [`kept_by_probes`]: from `hint` (above what is
/// expected), tries in steps of `step` down until one succeeds, so that the figure is within a
/// step of what was allocatable. The search ([`allocatable_now`]) gallops down and then refines
/// above its first success; on a device that keeps memory of every raw free the refinement
/// fails on that success's own keep, so its figure lies up to its last gallop step below what
/// was allocatable (49 MB on an Arc B580 keeping 96 MiB a free), and two rounds of the test,
/// each differing from the last by its error, read 53.5 MB over two frees and 206.4 MB over
/// three. A try that fails frees nothing and costs nothing the device keeps. Where the hint
/// itself fits (memory was released since) or the descent finds nothing within
/// [`DESCENT_TRIES`], the search decides.
fn allocatable_by_descent(
    device: &Device,
    limit: u64,
    ceiling: Option<u64>,
    hint: u64,
    step: u64,
) -> Result<u64> {
    let step = step.max(1);
    let top = ceiling.unwrap_or(limit).max(limit);
    if hint == 0 || hint >= top {
        return allocatable_now(device, limit, ceiling, Some(hint));
    }
    if fits(device, hint)? {
        // Memory was released since, or each free keeps less than the hint allowed for: the
        // search gallops up from the hint, known to fit, without trying it again (a try that
        // succeeds is one more free, and its keep).
        return narrow(device, hint, top, true, resolution(limit));
    }
    let mut x = hint;
    for _ in 0..DESCENT_TRIES {
        x = x.saturating_sub(step);
        if x == 0 {
            return Ok(0);
        }
        if fits(device, x)? {
            return Ok(x);
        }
    }
    allocatable_now(device, limit, ceiling, Some(x))
}

/// The most a raw free may keep, from one round of [`kept_by_probes`] that lost `lost` over
/// `over` frees, `test` of them the test's own of `size` (the others the probes' tries, each as
/// large as what was allocatable), each probe within `slack`: the loss and the slack shared
/// among the frees, rounded up. A free keeps at most what it held, so where the round lost more
/// than all its frees could had each held a test allocation, the test's frees cannot have kept
/// it: counted as keeping all they held, the rest was kept by the probes' larger frees and is
/// shared among those (the session's own probes, which this bound is kept for, free large
/// allocations too). An Arc B580 keeping 96 MiB of a free (at most all of a smaller one) lost
/// 206 MB over two 32 MiB test frees and one probe's: the round read 69 MB a free, its one
/// large free kept 100.66 MB, and the plan, keeping 28 MB (the other round's figure) for each
/// free after its last probe, ran out of memory in the serve burst.
fn unseen_of_round(lost: i128, over: i128, test: i128, size: u64, slack: i128) -> u64 {
    let over = over.max(1);
    let lost = (lost + slack).max(0);
    let held = i128::from(size).saturating_mul(test.min(over));
    let per_free = if lost > i128::from(size).saturating_mul(over) && over > test {
        let others = over - test;
        (lost - held + others - 1) / others
    } else {
        (lost + over - 1) / over
    };
    u64::try_from(per_free).unwrap_or(u64::MAX)
}

/// What a step took outside the allocator: `before` allocatable before it, `after` after it
/// (both within the resolution of a search up to `limit`, counted on the safe side), less
/// the allocator's growth in the step.
///
/// A [`RAW_PAGE`] is counted on the safe side too: the largest raw allocation that succeeds
/// is a whole number of pages, so it moves in page steps while the memory a step takes
/// (executable objects, a pool's blocks) need not fill one, and the difference of two probes
/// may fall short of what the step took by up to a page beyond the searches' resolution.
/// Without it, twelve probed repeats of one capture all read 157,292,262 B where each took
/// 159,031,179 B (a 140 MiB private pool, a 9 MiB graph pool, 2.8 MB of executable
/// objects), and `conservative`'s reserve came out 0.6 MB below the engine's graphs.
pub(crate) fn step_growth(before: u64, after: u64, limit: u64, allocator_growth: i64) -> i64 {
    let taken = before
        .saturating_add(resolution(limit))
        .saturating_add(RAW_PAGE)
        .saturating_sub(after);
    i64::try_from(taken)
        .unwrap_or(i64::MAX)
        .saturating_sub(allocator_growth)
}

/// Where the session measures by allocation probes, what is allocatable now, for a step's
/// before or after: the largest allocation that succeeds, searched up to `ceiling` (the
/// device's total where read) even past the baseline's `limit`, at the resolution of a search
/// up to `limit` (which [`step_growth`] counts on the safe side). Capped at the baseline, a
/// probe taken after another process released memory would read the baseline where more is
/// there, and a step's growth measured from it would come out short by what was released.
///
/// `hint`: what the caller expects to find (the last probe's figure, less what the engine's
/// allocator took since), where the search starts ([`search`]).
pub(crate) fn allocatable_now(
    device: &Device,
    limit: u64,
    ceiling: Option<u64>,
    hint: Option<u64>,
) -> Result<u64> {
    let res = resolution(limit);
    let top = ceiling.unwrap_or(limit).max(limit);
    if top == 0 || fits(device, top)? {
        return Ok(top);
    }
    search(device, 0, top, hint, res)
}

/// How much each level of [`search`] narrows its bracket, and how much its gallop up widens
/// each try: at most this many failed tries per level, one that succeeds.
const FAN: u64 = 16;

/// How [`search`]'s gallop down steps: [`GALLOP_DOWN_STEPS`] steps of a probe's slack (a
/// search's resolution and a raw allocation's rounding, what two probes of the same memory may
/// differ by), then steps that each grow by a [`GALLOP_DOWN_STEPS`]th, so that a step stays
/// about a [`GALLOP_DOWN_STEPS`]th of the distance descended. The first success then lies less
/// than a step below what was allocatable, and the refinement above it succeeds again only
/// where a free keeps less than that step: on a device that keeps memory of every raw free,
/// that success's own free keeps a free's worth, so what is allocatable after it lies below
/// it, and the refinement's tries fail and cost nothing. Galloping by doubling (each try twice
/// as far below), the first success lay up to as far below what was allocatable as the search
/// had gone, and the refinement succeeded again, where the gallop had gone further than a free
/// keeps: on a 12 GiB Arc B580 keeping 32 MiB a free, beside a neighbour of 7.4 GiB that
/// arrived just before the profile run, the probe before it succeeded at 958,014,428 B and
/// again 243 KB higher, and the profile run, which fitted the engine alone with room for five
/// of the start-up's frees, ran out of memory after seven (calibration's probe, from the
/// device's total 377 MB above what was allocatable, had made two the same way). (Galloping
/// [`FAN`] times further each try, a B580 keeping 128 MiB a free made two frees in each of its
/// four probes before the profile run: the reason the gallop down was made finer than the
/// gallop up.) A try that fails costs a call that returns an error at once: a search down a
/// whole 12 GiB device makes about a thousand (by doubling, about thirty), none of them a
/// free.
const GALLOP_DOWN_STEPS: u64 = 256;

/// The largest allocation in `lo..hi` that succeeds (`lo` known to, or 0; `hi` known not to),
/// to within `res`, searched from `hint` (what the caller expects to find, e.g. what the last
/// probe found, less what a step allocated since) where it lies between them.
///
/// A try that succeeds is freed at once, and a device that keeps memory of every raw free (a
/// driver bug, [`Warning::DeviceKeepsMemoryOnFree`](crate::Warning)) keeps some of each, for
/// good: the memory is gone before the engine's own steps, and a session that probes around
/// every step of a start-up with no free reading made about forty such frees before the
/// profile run (a 12 GiB Arc B580 keeping 4 MiB per free lost 160 MiB, and the profile run,
/// which fitted the engine alone, ran out of memory). A try that fails costs nothing. So the
/// search is built to succeed as seldom as it can: from the hint (or from `hi`), it gallops
/// down (in steps a [`GALLOP_DOWN_STEPS`]th of the distance at most, after the first few)
/// until one succeeds, then narrows the bracket by descending in steps of a [`FAN`]th of it,
/// stopping at the first that succeeds: one success per level on a device that keeps nothing
/// of a free (a bisection succeeds on about half of its sixteen tries), and one in all where a
/// free keeps more than the step the gallop's success came in. Where the hint itself succeeds
/// (memory was released since), it gallops up instead.
fn search(device: &Device, lo: u64, mut hi: u64, hint: Option<u64>, res: u64) -> Result<u64> {
    let res = res.max(1);
    if hi <= lo {
        return Ok(lo);
    }
    if let Some(h) = hint.filter(|h| *h > lo && *h < hi) {
        if fits(device, h)? {
            return narrow(device, h, hi, true, res);
        }
        hi = h;
    }
    narrow(device, lo, hi, false, res)
}

/// [`search`] once it knows `lo` fits and `hi` does not: galloping up from `lo` (`up`: `lo`
/// was the hint, and it fitted) or down from `hi`, then narrowing the bracket.
fn narrow(device: &Device, mut lo: u64, mut hi: u64, up: bool, res: u64) -> Result<u64> {
    let res = res.max(1);
    // Down: steps of a probe's slack, then a growing share of the distance (`GALLOP_DOWN_STEPS`).
    let mut d = if up { res } else { slack_of(res) };
    let mut tries = 0u64;
    while hi - lo > res {
        if up {
            let x = lo.saturating_add(d);
            if x >= hi {
                break;
            }
            if fits(device, x)? {
                lo = x;
            } else {
                hi = x;
                break;
            }
        } else {
            let x = hi.saturating_sub(d);
            if x <= lo {
                break;
            }
            if fits(device, x)? {
                lo = x;
                break;
            }
            hi = x;
        }
        d = if up {
            d.saturating_mul(FAN)
        } else {
            tries += 1;
            if tries < GALLOP_DOWN_STEPS {
                d
            } else {
                d.saturating_add(d.div_ceil(GALLOP_DOWN_STEPS))
            }
        };
    }
    while hi - lo > res {
        let step = res.max((hi - lo).div_ceil(FAN));
        let mut failed = hi;
        loop {
            let x = failed.saturating_sub(step);
            if x <= lo {
                break;
            }
            if fits(device, x)? {
                lo = x;
                break;
            }
            failed = x;
        }
        hi = failed;
    }
    Ok(lo)
}

/// The largest allocation up to `need` that succeeds now (within the resolution; 0 when
/// none does).
pub(crate) fn largest_allocatable(device: &Device, need: u64) -> Result<u64> {
    if need == 0 || fits(device, need)? {
        return Ok(need);
    }
    search(device, 0, need, None, resolution(need))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    use memplan_core::backend::{BackendKind, DeviceDescriptor, DeviceId};
    use memplan_core::bytes::GIB;
    use memplan_core::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
    use memplan_core::{AllocatorMemory, DriverMemory, HalDevice, MemoryInfo, ProfilingCapability};

    use crate::budget::Request;
    use crate::session::Profile;

    /// A device with `free` bytes free for raw allocations (shared, so that a test can take
    /// memory as a capture does, in any number of bytes), committed in whole `page`s: an
    /// allocation whose pages do not fit in what is free, beside what is live, fails; every
    /// size asked for is recorded.
    struct Fake {
        descriptor: DeviceDescriptor,
        caps: ProfilingCapability,
        free: Arc<Mutex<u64>>,
        page: u64,
        asked: Arc<Mutex<Vec<u64>>>,
        live: u64,
        /// What the device keeps for good of every raw free (at most what it frees).
        keeps: u64,
    }

    /// What a test can see of a [`Fake`]: what is free, the sizes asked for.
    type Shared = (Arc<Mutex<u64>>, Arc<Mutex<Vec<u64>>>);

    impl Fake {
        fn device(free: u64, page: u64) -> (Device, Shared) {
            Self::keeping(free, page, 0)
        }

        /// [`Fake::device`], keeping `keeps` of every raw free for good.
        fn keeping(free: u64, page: u64, keeps: u64) -> (Device, Shared) {
            let (shared, asked) = (Arc::new(Mutex::new(free)), Arc::new(Mutex::new(Vec::new())));
            let hal = Fake {
                descriptor: DeviceDescriptor::new(
                    DeviceId::new(BackendKind::Sim, "probe-test"),
                    "probe test",
                    Some(24 * GIB),
                ),
                caps: ProfilingCapability::exact_discrete(),
                free: shared.clone(),
                page,
                asked: asked.clone(),
                live: 0,
                keeps,
            };
            (Device::new(hal), (shared, asked))
        }

        fn committed(&self, bytes: u64) -> u64 {
            bytes.div_ceil(self.page) * self.page
        }
    }

    /// A device with `free` bytes free, allocated to the byte ([`Fake`]).
    fn free_device(free: u64) -> (Device, Arc<Mutex<Vec<u64>>>) {
        let (device, (_, asked)) = Fake::device(free, 1);
        (device, asked)
    }

    /// A device whose driver commits raw allocations in whole [`RAW_PAGE`]s ([`Fake`]), with
    /// what is free to change.
    fn paged_device(free: u64) -> (Device, Arc<Mutex<u64>>) {
        let (device, (free, _)) = Fake::device(free, RAW_PAGE);
        (device, free)
    }

    impl HalDevice for Fake {
        fn descriptor(&self) -> &DeviceDescriptor {
            &self.descriptor
        }
        fn capabilities(&self) -> &ProfilingCapability {
            &self.caps
        }
        fn driver_memory(&mut self) -> Result<DriverMemory> {
            let free = *self.free.lock().unwrap();
            Ok(DriverMemory::new(Some(24 * GIB), Some(free - self.live)))
        }
        fn synchronize(&mut self) -> Result<()> {
            Ok(())
        }
        fn allocate(&mut self, bytes: u64) -> Result<u64> {
            self.asked.lock().unwrap().push(bytes);
            let committed = self.committed(bytes);
            if self.live + committed > *self.free.lock().unwrap() {
                return Err(Error::OutOfMemory {
                    call: "allocate".into(),
                    requested: bytes,
                });
            }
            self.live += committed;
            Ok(0x1000)
        }
        unsafe fn free(&mut self, _: u64, bytes: u64) -> Result<()> {
            let committed = self.committed(bytes);
            self.live -= committed;
            *self.free.lock().unwrap() -= self.keeps.min(committed);
            Ok(())
        }
    }

    /// A probe from the last probe's figure on a device that keeps `keeps` of every raw free
    /// (the last probe's own free left that much less allocatable): its search succeeds once,
    /// its gallop down from the figure stopping within twice the distance. Galloping sixteen
    /// times further each try, the first success landed up to fifteen times the distance below
    /// and the refinement succeeded again: on an Arc B580 keeping 128 MiB a free, the four
    /// probes before the profile run made 8 frees, and the profile run, which fitted the
    /// engine alone beside a neighbour, ran out of memory.
    #[test]
    fn a_probe_from_the_last_figure_succeeds_once_where_each_free_keeps_memory() {
        let keeps = 128 * MIB;
        let limit = 12 * GIB;
        let (device, (free, _)) = Fake::keeping(11 * GIB, 1, keeps);
        let mut last = allocatable_now(&device, limit, Some(limit), None).unwrap();
        for _ in 0..4 {
            let frees = device.raw_frees();
            let truth = *free.lock().unwrap();
            let got = allocatable_now(&device, limit, Some(limit), Some(last)).unwrap();
            assert_eq!(device.raw_frees() - frees, 1, "{got} of {truth}");
            assert!(got <= truth && truth - got <= keeps, "{got} of {truth}");
            last = got;
        }
    }

    /// A probe whose hint lies far above what is allocatable (a neighbour took gigabytes since
    /// the last probe), and a search from the device's total, on a device that keeps 32 MiB of
    /// every raw free: each succeeds once, its figure within a step of the gallop of what was
    /// there. Galloping by doubling, the first success lay up to as far below as the search had
    /// gone and the refinement succeeded again: on an Arc B580 beside a neighbour of 7.4 GiB
    /// that arrived just before the profile run, the probe before it made two frees, and the
    /// profile run, which fitted the engine alone, ran out of memory.
    #[test]
    fn a_probe_far_above_what_is_allocatable_succeeds_once_where_each_free_keeps_memory() {
        let keeps = 32 * MIB;
        let limit = 12 * GIB;
        for neighbour in [GIB, 4 * GIB, 7417 * MIB] {
            let (device, (free, _)) = Fake::keeping(limit - 377 * MIB, 1, keeps);
            let frees = device.raw_frees();
            let truth = *free.lock().unwrap();
            let last = allocatable_now(&device, limit, Some(limit), None).unwrap();
            assert_eq!(
                device.raw_frees() - frees,
                1,
                "from the total: {last} of {truth}"
            );
            assert!(
                last <= truth && truth - last <= keep_slack(limit),
                "{last} of {truth}"
            );
            *free.lock().unwrap() -= neighbour;
            let frees = device.raw_frees();
            let truth = *free.lock().unwrap();
            let got = allocatable_now(&device, limit, Some(limit), Some(last)).unwrap();
            assert_eq!(
                device.raw_frees() - frees,
                1,
                "{neighbour}: {got} of {truth}"
            );
            let step = (last - truth) / GALLOP_DOWN_STEPS + keep_slack(limit);
            assert!(got <= truth && truth - got <= step, "{got} of {truth}");
        }
    }

    #[test]
    fn a_baseline_from_calibrations_figure_succeeds_once_where_each_free_keeps_memory() {
        let keeps = 32 * MIB;
        let total = 12 * GIB;
        let (device, (free, _)) = Fake::keeping(total - 300 * MIB, 1, keeps);
        let (before, _) = baseline(&device, Some(total)).unwrap().unwrap();
        // Calibration's checks leave 13 MiB held between the two probes.
        *free.lock().unwrap() -= 13 * MIB;
        let truth = *free.lock().unwrap();
        let frees = device.raw_frees();
        let (got, _) = baseline_from(&device, Some(total), Some(before))
            .unwrap()
            .unwrap();
        assert_eq!(device.raw_frees() - frees, 1, "{got} of {truth}");
        let step = keep_slack(total);
        assert!(got <= truth && truth - got <= step, "{got} of {truth}");
    }

    #[test]
    fn probes_read_captures_up_to_a_page_apart_alike_and_say_so() {
        // Free memory 2,000,000 B past a whole page; two captures of one size whose
        // executable objects differ by 1.9 MiB (a capture-to-capture variation).
        let start = 9_000 * RAW_PAGE + 2_000_000;
        let limit = 24 * GIB;
        let takes = [98 * RAW_PAGE, 98 * RAW_PAGE + 1_992_294];
        let (device, free) = paged_device(start);
        let windows: Vec<(u64, u64)> = takes
            .iter()
            .map(|t| {
                *free.lock().unwrap() = start;
                let before = allocatable_now(&device, limit, None, None).unwrap();
                *free.lock().unwrap() = start - t;
                let after = allocatable_now(&device, limit, None, None).unwrap();
                (before, after)
            })
            .collect();
        let read: Vec<u64> = windows.iter().map(|(b, a)| b - a).collect();
        // Both fall in one page bracket: the probes read them exactly alike.
        assert_eq!(read[0], read[1]);
        // They differ by more than the search's resolution: a range of equal windows is no
        // figure of a variation below it, only below a page.
        let apart = takes[1] - takes[0];
        assert!(apart > resolution(limit), "{apart}");
        assert!(apart < alike_within(limit), "{apart}");
        assert_eq!(alike_within(limit), RAW_PAGE);
        // A search coarser than a page: its errors can make up whole pages, and one more.
        assert_eq!(alike_within(400 * GIB), 4 * RAW_PAGE);
        // Each window, its resolution counted on the safe side, covers what was taken.
        for ((before, after), t) in windows.iter().zip(takes) {
            assert!(step_growth(*before, *after, limit, 0) >= i64::try_from(t).unwrap());
        }
    }

    /// A plan of a 24 GiB device asking for 90% of it (21.6 GiB), 3 GiB of weights and a 1 GiB
    /// activation peak held to it, the exact free reading showing `free` at the plan: the
    /// budget (17.6 GiB for the KV cache) binds wherever `free` leaves more.
    fn builder(free: u64) -> PlanBuilder {
        builder_for(free, Request::Utilization(0.9))
    }

    /// [`builder`] with another request.
    fn builder_for(free: u64, request: Request) -> PlanBuilder {
        let snap = |free: u64| {
            MemoryInfo::default()
                .with_driver(DriverMemory::new(Some(24 * GIB), Some(free)))
                .with_allocator(
                    AllocatorMemory::new(Some(0), Some(0), Some(0)).with_peak_reserved(Some(0)),
                )
        };
        let mut p = Profile::new(ProfilingCapability::exact_discrete(), snap(23 * GIB));
        p.last = snap(free);
        p.weights_bytes = Some(3 * GIB);
        p.weights_held_bytes = Some(3 * GIB);
        p.activation_peak_bytes = Some(GIB);
        p.non_allocator_growth = Some(0);
        let spec = KvSpec::new(
            vec![LayerGroup::new(AttentionKind::Full, 28, 2, 128)],
            KvDtype::Bf16,
            16,
        );
        let limits = KvLimits::new(4096, 8192).with_max_len_limit(1 << 20);
        PlanBuilder::from_profile(&p, "test", request, spec, limits).unwrap()
    }

    #[test]
    fn the_check_of_a_plan_that_fills_its_budget_never_allocates_past_the_request() {
        // 20 GiB free: more than the 18.6 GiB the request leaves (the KV budget and the
        // activation peak), so the budget is what caps the plan.
        let b = builder(20 * GIB);
        let plan = b.clone().build().unwrap();
        assert_eq!(plan.capped_by_free_bytes, None);
        let room = b.room_under_request(&plan);
        assert_eq!(room, plan.requested_bytes - 3 * GIB);
        // What the engine still needs, with the physical cap's rounding slack, is past the
        // room: a check that allocates all of it holds that slack past the request.
        assert!(b.needs(plan.kv_cache_bytes) > room);
        let (device, asked) = free_device(20 * GIB);
        let checked = verify(&device, b, 0).unwrap().build().unwrap();
        let asked = asked.lock().unwrap().clone();
        assert!(!asked.is_empty(), "the plan was checked");
        // Each allocation within the room, in the whole pages the driver commits too.
        assert!(
            asked
                .iter()
                .all(|a| a.div_ceil(RAW_PAGE) * RAW_PAGE <= room),
            "asked {asked:?}, the room under the request is {room}"
        );
        // The room was there: the plan stands as it was.
        assert_eq!(checked.kv_cache_bytes, plan.kv_cache_bytes);
        assert_eq!(checked.physical_check, plan.physical_check);
    }

    #[test]
    fn the_check_stays_within_the_room_less_what_the_held_figures_may_read_low() {
        // The room is the request less what the plan counts as held; a reading whose windows
        // may be off by 3 MiB may have counted that much too little, and a check that takes
        // the room whole would go past the request by it.
        let b = builder(20 * GIB);
        let plan = b.clone().build().unwrap();
        let room = b.room_under_request(&plan);
        let error = 3 * MIB;
        let (device, asked) = free_device(20 * GIB);
        let checked = verify(&device, b, error).unwrap().build().unwrap();
        let asked = asked.lock().unwrap().clone();
        assert!(!asked.is_empty(), "the plan was checked");
        assert!(
            asked
                .iter()
                .all(|a| a.div_ceil(RAW_PAGE) * RAW_PAGE <= room - error),
            "asked {asked:?}, the room less the error is {}",
            room - error
        );
        assert_eq!(checked.kv_cache_bytes, plan.kv_cache_bytes);
        assert_eq!(checked.physical_check, plan.physical_check);
    }

    #[test]
    fn a_check_that_finds_less_than_the_room_caps_the_plan_and_searches_within_the_request() {
        // The free reading over-states what is there: 20 GiB read, 12 GiB physically free.
        let b = builder(20 * GIB);
        let plan = b.clone().build().unwrap();
        let room = b.room_under_request(&plan);
        let (device, asked) = free_device(12 * GIB);
        let checked = verify(&device, b, 0).unwrap().build().unwrap();
        assert!(asked.lock().unwrap().iter().all(|a| *a <= room));
        assert_eq!(
            checked.physical_check,
            Some(crate::plan::PhysicalCheck::Probe)
        );
        // Capped by what was there: the cache, the activation peak and the slack within 12 GiB.
        assert!(checked.kv_cache_bytes + GIB <= 12 * GIB);
        assert!(checked.kv_cache_bytes < plan.kv_cache_bytes);
    }

    #[test]
    fn the_probe_of_a_plan_capped_below_its_budget_checks_all_it_needs() {
        // 8 GiB read free at the plan: the free reading caps the cache well below the budget,
        // and the check allocates what the plan needs, its slack included (all under the
        // room); 9 GiB are physically there, so it stands.
        let b = builder(8 * GIB);
        let plan = b.clone().build().unwrap();
        assert!(plan.capped_by_free_bytes.is_some());
        let need = b.needs(plan.kv_cache_bytes);
        assert!(need < b.room_under_request(&plan));
        assert_eq!(within_request(&b, &plan), need);
        let (device, asked) = free_device(9 * GIB);
        let checked = verify(&device, b, 0).unwrap().build().unwrap();
        assert_eq!(asked.lock().unwrap().as_slice(), &[need]);
        assert_eq!(checked.kv_cache_bytes, plan.kv_cache_bytes);
    }

    #[test]
    fn a_fixed_kv_cache_is_checked_whole_rounding_slack_included() {
        // A request of the KV cache's size names no amount of memory to keep within: the
        // engine allocates the cache with its allocator's rounding, and the check proves all of
        // it.
        let b = builder_for(20 * GIB, Request::KvCacheBytes(4 * GIB));
        let plan = b.clone().build().unwrap();
        assert_eq!(b.room_under_request(&plan), u64::MAX);
        assert_eq!(within_request(&b, &plan), b.needs(plan.kv_cache_bytes));
    }

    /// A simulated MI300X whose frees keep 256 KiB each, its free reading moving by up to
    /// 471,335 B from read to read on the idle device (seed 45 of an uncalibrated eager
    /// start-up): the four pairs (the reading before each allocation, the one after its free)
    /// lost 586,394, 214,502, -26,089 and -91,064 B, each within the noise, and 1,058,726 B
    /// from the first reading to the last.
    #[test]
    fn memory_each_free_keeps_under_the_noise_shows_over_all_the_frees() {
        let noisy = [
            (205_561_928_131, 205_561_341_737),
            (205_561_330_104, 205_561_115_602),
            (205_561_103_863, 205_561_129_952),
            (205_560_778_341, 205_560_869_405),
        ];
        let idle = 471_335;
        // Each pair alone is within the noise: the per-pair rule sees nothing.
        assert_eq!(crate::calibrate::kept_per_free(&noisy, idle), None);
        // From the first reading to the last: 1,058,726 B over four frees, 264,682 B each.
        assert_eq!(kept_over_all_frees(&noisy, idle), Some(264_682));
    }

    #[test]
    fn a_round_that_lost_more_than_its_test_frees_held_is_the_probes_frees_keep() {
        let slack = i128::from(2 * MIB);
        let mb = 1_000_000;
        // An Arc B580 keeping 96 MiB of each free, all of a 32 MiB test free: two test frees
        // and one probe's lost 167.8 MB; per free that is 56 MB, the probe's kept 100.66 MB.
        let lost = 2 * 33_554_432 + 100_663_296;
        let got = unseen_of_round(lost, 3, 2, 32 * MIB, slack);
        assert!(got >= 100_663_296, "{got}");
        assert!(got <= 100_663_296 + 3 * MIB, "{got}");
        // A round whose frees could have kept its loss at the test's size: shared among all.
        assert_eq!(
            unseen_of_round(10 * mb, 5, 4, 32 * MIB, slack),
            u64::try_from((10 * mb + slack + 4) / 5).unwrap()
        );
        // Only test frees: no larger free to put the loss on.
        assert_eq!(
            unseen_of_round(300 * mb, 2, 2, 32 * MIB, slack),
            u64::try_from((300 * mb + slack + 1) / 2).unwrap()
        );
    }

    /// A simulated H100 whose free reading moves in 64 MiB steps, its idle reads never moving,
    /// and whose frees keep 48 MiB each (an uncalibrated start-up): four windows over 62 MiB
    /// read 64, 64, 64 and 0 MiB, and the pairs lost 64, 64, 64 and 0 MiB. Against the idle
    /// spread (0) nothing was seen or bounded, and the plan kept no room for its probe's free
    /// (serving ran out of memory); against the step the windows show, the loss over all is
    /// the figure. An exact reading of round sizes whose reads share 14 MiB shows no step.
    #[test]
    fn frees_keeping_less_than_a_shown_step_are_read_against_the_step() {
        use crate::calibrate::{kept_per_free, reading_step};
        let size = 62 * MIB;
        let stepped = [
            (79_993_765_888, 79_926_657_024, 79_926_657_024),
            (79_926_657_024, 79_859_548_160, 79_859_548_160),
            (79_859_548_160, 79_792_439_296, 79_792_439_296),
            (79_792_439_296, 79_792_439_296, 79_792_439_296),
        ];
        let reads: Vec<u64> = stepped.iter().flat_map(|(b, h, a)| [*b, *h, *a]).collect();
        let step = reading_step(&reads);
        assert_eq!(step, 64 * MIB);
        assert_eq!(shown_step(&stepped, size, step), step);
        let pairs: Vec<(u64, u64)> = stepped.iter().map(|(b, _, a)| (*b, *a)).collect();
        // Against the idle spread alone: nothing seen, nothing a free may keep unseen.
        assert_eq!(kept_per_free(&pairs, 0), None);
        assert_eq!(kept_over_all_frees(&pairs, 0), None);
        assert_eq!(unseen_kept_per_free(&pairs, 0), Some(0));
        // Against the step: 192 MiB lost over four frees, and no more windows are made.
        assert_eq!(kept_over_all_frees(&pairs, step), Some(48 * MIB));
        assert!(!keep_hidden_by_step(&stepped, &reads, size, 0));
        // The same reading where frees keep nothing: every read comes back, and a free may
        // keep up to a quarter of the step unseen (the loss over all plus the step, shared).
        let f = 1192 * 64 * MIB;
        let clean = [(f, f - 64 * MIB, f); 4];
        let reads: Vec<u64> = clean.iter().flat_map(|(b, h, a)| [*b, *h, *a]).collect();
        let step = shown_step(&clean, size, reading_step(&reads));
        assert_eq!(step, 64 * MIB);
        let pairs: Vec<(u64, u64)> = clean.iter().map(|(b, _, a)| (*b, *a)).collect();
        assert_eq!(kept_over_all_frees(&pairs, step), None);
        assert_eq!(unseen_kept_per_free(&pairs, step), Some(16 * MIB));
        // More windows narrow that: sixteen bound a free by 4 MiB.
        assert!(keep_hidden_by_step(&clean, &reads, size, 0));
        let more = vec![(f, f - 64 * MIB, f); STEPPED_WINDOW_ALLOCATIONS];
        let pairs: Vec<(u64, u64)> = more.iter().map(|(b, _, a)| (*b, *a)).collect();
        assert_eq!(unseen_kept_per_free(&pairs, step), Some(4 * MIB));
        // An exact reading of 434 MiB windows (217 pages) from 21,000 MiB free: its reads share
        // 14 MiB, and read every window exactly, so no step is shown.
        let (f, size) = (1500 * 14 * MIB, 434 * MIB);
        let exact = [(f, f - size, f); 4];
        let reads: Vec<u64> = exact.iter().flat_map(|(b, h, a)| [*b, *h, *a]).collect();
        assert_eq!(reading_step(&reads), 14 * MIB);
        assert_eq!(shown_step(&exact, size, reading_step(&reads)), 0);
        assert!(!keep_hidden_by_step(&exact, &reads, size, 0));
    }

    #[test]
    fn noise_alone_or_one_pair_that_moved_is_nothing_kept_over_all_frees() {
        let f = 200 * MIB;
        // The readings wandered within the noise and came back: nothing kept.
        let wander = [
            (f, f - 300_000),
            (f - 250_000, f + 100_000),
            (f, f - 200_000),
        ];
        assert_eq!(kept_over_all_frees(&wander, 471_335), None);
        // One pair lost 40 MiB (another process allocated, a late release): not alike.
        let one = [(f, f), (f, f - 40 * MIB), (f - 40 * MIB, f - 40 * MIB)];
        assert_eq!(kept_over_all_frees(&one, 471_335), None);
        // One pair is no figure: a first allocation may make the runtime take memory once.
        assert_eq!(kept_over_all_frees(&[(f, f - 4 * MIB)], 0), None);
    }

    #[test]
    fn what_a_free_may_keep_unseen_is_bounded_by_the_least_loss_and_the_loss_over_all() {
        let f = 200 * MIB;
        let noise = 200_000;
        // Losses of 100, 50 and 150 KB, 300 KB from first to last: the least loss bounds a
        // free by 250 KB, the loss over all of them by (300 + 200) KB / 3, rounded up.
        let p = [
            (f, f - 100_000),
            (f - 100_000, f - 150_000),
            (f - 150_000, f - 300_000),
        ];
        assert_eq!(unseen_kept_per_free(&p, noise), Some(166_667));
        // Losses of 0, 300 and 300 KB: the least loss bounds it tighter, by the noise.
        let p = [(f, f), (f, f - 300_000), (f - 300_000, f - 600_000)];
        assert_eq!(unseen_kept_per_free(&p, noise), Some(noise));
        // The readings gained more than the noise: nothing can have been kept.
        let gained = [(f, f + MIB), (f + MIB, f + 2 * MIB)];
        assert_eq!(unseen_kept_per_free(&gained, noise), Some(0));
        assert_eq!(unseen_kept_per_free(&[], noise), None);
    }

    #[test]
    fn a_baseline_that_allocates_the_whole_reported_total_searches_past_it() {
        // A runtime that reports 20 GiB where 22 GiB can be allocated: the probe at the
        // baseline finds what is there, within its resolution, not the reported figure.
        let (device, _) = free_device(22 * GIB);
        let (found, _) = baseline(&device, Some(20 * GIB)).unwrap().unwrap();
        assert!(found > 20 * GIB, "{found}");
        assert!(
            found <= 22 * GIB && 22 * GIB - found <= resolution(20 * GIB),
            "{found}"
        );
        // Where even twice the reported total can be allocated, allocations do not measure
        // the device (a driver that commits lazily): the reported total stands.
        let (device, _) = free_device(50 * GIB);
        assert_eq!(
            baseline(&device, Some(20 * GIB)).unwrap().unwrap().0,
            20 * GIB
        );
        // Below the total, the search is as before.
        let (device, _) = free_device(18 * GIB);
        let (found, _) = baseline(&device, Some(20 * GIB)).unwrap().unwrap();
        assert!(
            found <= 18 * GIB && 18 * GIB - found <= resolution(20 * GIB),
            "{found}"
        );
    }

    /// Where calibration (or the session's earlier windows) already saw the device keep memory
    /// of every raw free, the windows are cut to the pairs that still tell the window error:
    /// each further pair keeps as much again for good (an A100 keeping 64 MiB a free held
    /// 248 MiB more after four windows that measured calibration's figure again).
    #[test]
    fn a_keep_already_seen_is_not_measured_again() {
        let keeps = 8 * MIB;
        let (device, (_, asked)) = Fake::keeping(20 * GIB, 1, keeps);
        let w = window_error_and_step(&device, 16 * MIB, Some(20 * GIB), 1, GIB, Some(keeps), 0)
            .unwrap()
            .unwrap();
        assert_eq!(asked.lock().unwrap().len(), crate::calibrate::KEPT_PAIRS);
        assert_eq!((w.kept, w.error), (Some(keeps), 0));
        // Not known: the windows measure it.
        let (device, (_, asked)) = Fake::keeping(20 * GIB, 1, keeps);
        let w = window_error_and_step(&device, 16 * MIB, Some(20 * GIB), 1, GIB, None, 0)
            .unwrap()
            .unwrap();
        assert_eq!(asked.lock().unwrap().len(), WINDOW_ALLOCATIONS);
        assert_eq!((w.kept, w.error), (Some(keeps), 0));
        // A keep larger than the windows: each gave nothing back, which is no error of the
        // reading.
        let (device, (_, asked)) = Fake::keeping(20 * GIB, 1, GIB);
        let w = window_error_and_step(&device, 16 * MIB, Some(20 * GIB), 1, GIB, Some(GIB), 0)
            .unwrap()
            .unwrap();
        assert_eq!(asked.lock().unwrap().len(), crate::calibrate::KEPT_PAIRS);
        assert_eq!(w.error, 0);
    }
}
