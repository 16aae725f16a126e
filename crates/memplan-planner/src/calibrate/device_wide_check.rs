//! The device-wide reading of available memory (every process's use counted) against one of
//! calibration's allocations: it must move by the allocation once the device is synchronized.
//!
//! A plan caps its KV cache by this reading where the free reading cannot see other processes
//! (`plan::physical`): a device-wide reading that lags allocations (the same stale driver
//! counters a lagging free reading comes from) reads the memory of a process that has just
//! left as still taken, and a plan capped by it kept to the room a departed neighbour left: 27
//! to 57% of what fitted. One that does not follow calibration's allocation is unavailable, and
//! the session checks its plan with an allocation probe at the plan's quiet point instead.

use memplan_core::bytes::{fmt_bytes, fmt_signed, signed};
use memplan_core::{Device, Error, Reading, Reliability, Result};

use super::checks::{tolerance, Observed};
use super::report::Evidence;

/// Check the device-wide reading with the largest of `sizes` that allocates and that a window
/// of the reading can show (at least four times its declared tolerance and the rounding a
/// window allows): synchronized reads before and after allocating it. Not checked where the
/// reading is not declared to see the whole device, where no size is large enough, or where
/// the device returned no value.
pub(super) fn device_wide(device: &Device, sizes: &[u64]) -> Result<Observed> {
    let declared = device.capabilities().reading(Reading::DeviceAvailable);
    if !declared.sees_whole_device() {
        return Ok(unchecked(
            "the reading is not declared to see the whole device",
        ));
    }
    let tol = declared.tolerance_bytes();
    let mut order: Vec<u64> = sizes
        .iter()
        .copied()
        .filter(|&s| s / 4 > tol.saturating_add(tolerance(s)))
        .collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    for size in order {
        device.synchronize()?;
        let Some(before) = device.device_wide_memory()?.available else {
            return Ok(unchecked("the device returned no device-wide reading"));
        };
        let alloc = match device.allocate(size) {
            Ok(a) => a,
            Err(Error::OutOfMemory { .. }) => continue,
            Err(e) => return Err(e),
        };
        let read = (|| -> Result<Option<u64>> {
            device.synchronize()?;
            Ok(device.device_wide_memory()?.available)
        })();
        device.free(alloc)?;
        let Some(after) = read? else {
            return Ok(unchecked("the device returned no device-wide reading"));
        };
        let moved = signed(before).saturating_sub(signed(after));
        let half = size / 2;
        let reliability = (moved < signed(half)).then(|| Reliability::Unavailable {
            reason: format!(
                "device-wide available memory moved by {} for a {} allocation, synchronized (stale?)",
                fmt_signed(moved),
                fmt_bytes(size)
            ),
        });
        return Ok(Observed {
            checked: true,
            reliability,
            evidence: vec![Evidence::bytes(
                format!(
                    "device-wide available memory drop after allocating {}, synchronized (at least half of it)",
                    fmt_bytes(size)
                ),
                signed(size),
                Some(moved),
                half,
            )],
            note: String::new(),
            window_error: None,
            kept_per_free: None,
            step: 0,
        });
    }
    Ok(unchecked(
        "no calibration allocation both fitted and was large enough for the reading's tolerance",
    ))
}

fn unchecked(note: &str) -> Observed {
    Observed {
        checked: false,
        reliability: None,
        evidence: vec![],
        note: note.into(),
        window_error: None,
        kept_per_free: None,
        step: 0,
    }
}
