//! Calibration: check what a backend declares against what its device does.
//!
//! [`calibrate`] allocates known sizes (37 MiB, 64 MiB, 256 MiB, 1 GiB, bounded by a quarter of free
//! memory) straight from the driver, reads the driver layer right after allocating, again after
//! a synchronize, frees, reads again, synchronizes and reads again. From the expected and
//! observed deltas it confirms or downgrades the free reading (a reading that does not move is
//! unavailable; one that moves only after a synchronize is deferred; one that moves by the
//! wrong amount is approximate with the observed error as tolerance). When graph capture is
//! declared it captures one graph with a known allocation node and checks the graph-pool
//! attributes, when a destroyed graph's memory returns, and the per-capture memory nobody
//! declared; the graph has no allocation node when there are no graph-pool attributes to
//! check or the device cannot record one (capture itself is then still confirmed); a session
//! whose engine captures no graphs leaves the graph checks out (their test capture may keep
//! memory for good that such an engine alone never takes). When virtual
//! memory is declared it reserves, maps, unmaps and releases one granule (or as many as the
//! free reading's window error needs to see the mapping). The device-wide reading of available
//! memory, where it is declared to see the whole device, must move by one of those allocations
//! once synchronized; one that does not (a stale counter) is unavailable. The calibrated
//! capability is never stronger than the declared one.
//!
//! The free check also compares the synchronized free reading before each allocation with the
//! one after its free: a device whose every free keeps memory (a driver bug) loses about the
//! same in every pair, beyond what the reading moves by on the idle device
//! ([`CalibrationReport::kept_per_free`], see `checks::kept_per_free` for why noise, a
//! neighbour or a late release does not read as such a device). That is no error of the
//! reading: its windows over a free are judged against what the free gave back, and the
//! reading's reliability stays as the other checks leave it.
//!
//! Not checkable from one process: whether free memory includes *other* processes (a
//! process-local reading looks exact to its own allocations) and graphics allocations; the
//! report says so. Every allocation is freed on every path, errors included.

mod checks;
mod device_wide_check;
mod graph_checks;
mod report;
mod vmm_check;

pub(crate) use checks::{
    alike, coarse_step, combined_free, confirm_step, idle_range_of, kept_per_free, reading_step,
    tolerance, unified_pool, FreeLosses, KEPT_PAIRS,
};
pub use checks::{interquartile_mean, IDLE_READS};
pub(crate) use graph_checks::HIDDEN_PER_CAPTURE;
pub use report::{CalibrationReport, Evidence, Status, Verdict};

use memplan_core::bytes::{GIB, MIB};
use memplan_core::{Device, ProfilingCapability, Reading, Result};

/// The default allocation sizes: three that are multiples of common reading steps, and the
/// smallest of [`ODD_SIZES`] (37 MiB), which is none: a reading that moves in steps of up to
/// 64 MiB (or of 256 MiB) reads every window over the others exactly, and only a window over
/// a size that is no multiple of its step shows it (see the free check's step rule).
pub const SIZES: [u64; 4] = [37 * MIB, 64 * MIB, 256 * MIB, GIB];

/// The largest of [`SIZES`]: no check of the session's start allocates more at once (a request
/// is not known before the start, and a small one on a large device is passed by any check
/// sized by the device).
pub const LARGEST_SIZE: u64 = GIB;

/// Sizes that are no multiple of common reading steps (1, 2, 4, 16, 64 and 256 MiB; sizes
/// in MiB that are primes): a reading that only moves in steps looks exact to sizes that are
/// multiples of its step, and not to these. The conformance suite calibrates with them.
pub const ODD_SIZES: [u64; 3] = [37 * MIB, 163 * MIB, 613 * MIB];

/// Calibrate a device with the default sizes. See the module docs.
pub fn calibrate(device: &Device) -> Result<CalibrationReport> {
    calibrate_with(device, &SIZES)
}

/// Calibrate a device with these allocation sizes (those above a quarter of free memory are
/// skipped). See the module docs.
pub fn calibrate_with(device: &Device, sizes: &[u64]) -> Result<CalibrationReport> {
    calibrate_then(device, sizes, u64::MAX, true, &mut |_| Ok(()))
}

/// [`calibrate_with`], calling `before_captures` with the capability calibrated so far (the
/// driver's free and total readings judged) right before the checks that may leave memory
/// held for good (the graph capture's per-capture memory, a mapping's release; not called
/// where neither runs): where the free reading came out unable to measure this process, a
/// session measures what those checks leave held another way (an allocation probe,
/// `Session::start`).
///
/// No allocation of its own above `most` bytes (sizes above it are left out).
///
/// With `graphs` false (the engine captures none) the graph checks are left out and said
/// unchecked (`graph_checks::skipped`): their test capture may leave memory held for good
/// that such an engine alone never takes.
pub(crate) fn calibrate_then(
    device: &Device,
    sizes: &[u64],
    most: u64,
    graphs: bool,
    before_captures: &mut dyn FnMut(&ProfilingCapability) -> Result<()>,
) -> Result<CalibrationReport> {
    let span = tracing::info_span!("calibrate", device = %device.descriptor().id);
    let _e = span.enter();
    let declared = device.capabilities().clone();
    device.synchronize()?;
    let start = device.driver_memory()?;
    let cap = (start.free.or(start.total).unwrap_or(4 * GIB) / 4).min(most);
    let mut sizes: Vec<u64> = sizes
        .iter()
        .copied()
        .filter(|s| *s <= cap && *s > 0)
        .collect();
    if sizes.is_empty() {
        sizes.push((cap / MIB).max(1) * MIB);
    }
    let mut calibrated = declared.clone();
    let mut verdicts = Vec::new();

    let free_observed = checks::driver_free(device, &sizes)?;
    let free_window_error = free_observed.window_error;
    let kept_per_free = free_observed.kept_per_free;
    let free_step = Some(free_observed.step).filter(|s| *s > 0);
    verdicts.push(checks::verdict_reading(
        &mut calibrated,
        Reading::DriverFree,
        free_observed,
    ));
    verdicts.push(checks::driver_total(device, &mut calibrated, &start)?);
    verdicts.extend(checks::unified_pool(device, &mut calibrated)?);
    // Only where a check below may leave memory held for good: a test capture (an engine that
    // captures graphs) or a mapping (a device declared to map virtual memory). The session's
    // measurement there is an allocation probe, whose tries that succeed are raw frees, and a
    // device may keep memory of every raw free for good: around checks that hold nothing, the
    // probe measures only what its own frees kept (an Arc B580 keeping 32 MiB a free named
    // 62-98 MiB held for good by checks that held none), held before the engine's weights,
    // where the engine's profile run may need every byte the engine alone has. (The
    // device-wide check's one raw free, as the free check's, is one of the session's frees no
    // probe measured: the plan keeps room for it.)
    if graphs || calibrated.facts.virtual_memory.is_supported() {
        before_captures(&calibrated)?;
    }
    let mut found = graph_checks::GraphFindings::default();
    if graphs {
        let (v, f) = checks::graphs(device, &mut calibrated, most)?;
        verdicts.extend(v);
        found = f;
    } else {
        verdicts.extend(graph_checks::skipped(&mut calibrated));
    }
    let largest = sizes.iter().copied().max().unwrap_or(cap);
    verdicts.push(checks::virtual_memory(
        device,
        &mut calibrated,
        free_window_error,
        largest,
    )?);
    // Last, after the graph checks: its synchronizes only give a late-released graph pool
    // more time, never less of the count those checks wait for.
    verdicts.push(checks::verdict_reading(
        &mut calibrated,
        Reading::DeviceAvailable,
        device_wide_check::device_wide(device, &sizes)?,
    ));

    let report = CalibrationReport {
        device: device.descriptor().id.to_string(),
        sizes,
        declared,
        calibrated,
        verdicts,
        free_window_error,
        kept_per_free,
        free_step,
        test_capture_held: found.held,
        graph_alloc_nodes_refused: found.alloc_nodes_refused,
    };
    for line in report.downgrade_lines() {
        tracing::warn!("{line}");
    }
    Ok(report)
}
