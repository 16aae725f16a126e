//! Locality: does a reading declared to see the whole device see another process's memory?
//! A second process ([`crate::second`]) opens the same device and holds an allocation while
//! the suite reads; a device-wide reading must drop by at least that much, a process-local
//! one need not. The drop also measures a context (what opening the device costs a process),
//! which [`crate::total`] uses to account for the total.

use memplan::bytes::{fmt_bytes, fmt_signed, MIB};
use memplan::{Device, Reading, Reliability};

use crate::report::Check;
use crate::second::{hold, SecondProcess};

/// Bookkeeping slack of a comparison between two readings: page rounding of the allocation
/// and of the second process's context.
const SLACK: u64 = 8 * MIB;

/// What the second process showed, for the total's accounting.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// What the second process's context took (its drop less its allocation).
    pub bytes: u64,
    /// How far that may be off (the reading's tolerance, twice, and the slack).
    pub uncertainty: u64,
    /// The reading that measured it, as read before the second process started.
    pub available_before: u64,
    /// That reading's tolerance.
    pub tolerance: u64,
    /// Which reading it was.
    pub reading: Reading,
}

/// The locality checks and, where a device-wide reading saw the second process, its context.
pub struct Locality {
    /// `locality.driver_free`, `locality.device_available`.
    pub checks: Vec<Check>,
    /// The context the second process measured.
    pub context: Option<Context>,
}

fn name(r: Reading) -> String {
    format!("locality.{}", r.name())
}

fn read(device: &Device, r: Reading) -> Option<u64> {
    device.synchronize().ok()?;
    match r {
        Reading::DriverFree => device.driver_memory().ok()?.free,
        _ => device.device_wide_memory().ok()?.available,
    }
}

/// Run the second process against `device` (skipped, with the reason, without `how`).
pub fn check(device: &Device, how: Option<&SecondProcess>) -> Locality {
    let cap = device.capabilities().clone();
    let readings: Vec<(Reading, Reliability)> = [Reading::DriverFree, Reading::DeviceAvailable]
        .into_iter()
        .map(|r| (r, cap.reading(r)))
        .filter(|(_, rel)| !matches!(rel, Reliability::Unavailable { .. }))
        .collect();
    let skip_all = |why: &str| Locality {
        checks: [Reading::DriverFree, Reading::DeviceAvailable]
            .into_iter()
            .map(|r| Check::skip(&name(r), why))
            .collect(),
        context: None,
    };
    if readings.is_empty() {
        return skip_all("neither a free nor a device-wide reading is declared");
    }
    let Some(how) = how else {
        return skip_all(
            "needs a second process: run the suite through the `memplan-conformance` binary \
             (`cargo xtask conformance --device ID`) or `conformance_test!`",
        );
    };
    let tol_max = readings
        .iter()
        .map(|(_, rel)| rel.tolerance_bytes())
        .max()
        .unwrap_or(0);
    // Large enough that a device-wide reading's noise cannot hide it, and not a multiple of
    // any common reading step.
    let bytes = (259 * MIB).max(
        tol_max
            .saturating_mul(8)
            .saturating_add(32 * MIB)
            .div_ceil(MIB)
            .saturating_mul(MIB)
            .saturating_add(3 * MIB),
    );
    let before: Vec<Option<u64>> = readings.iter().map(|(r, _)| read(device, *r)).collect();
    if let Some(free) = before.iter().flatten().min() {
        if bytes > free / 4 {
            return skip_all(&format!(
                "a second process would hold {} to tell the readings apart at their tolerance, more than a quarter of the {} available",
                fmt_bytes(bytes),
                fmt_bytes(*free)
            ));
        }
    }
    let holder = match hold(how, device, bytes) {
        Ok(h) => h,
        Err(e) => return skip_all(&format!("no second process: {e}")),
    };
    let during: Vec<Option<u64>> = readings.iter().map(|(r, _)| read(device, *r)).collect();
    let released = holder.release();
    let after: Vec<Option<u64>> = readings.iter().map(|(r, _)| read(device, *r)).collect();
    let mut out = Locality {
        checks: Vec::new(),
        context: None,
    };
    for (i, (r, rel)) in readings.iter().enumerate() {
        let n = name(*r);
        let (Some(b), Some(d), Some(a)) = (before[i], during[i], after[i]) else {
            out.checks.push(Check::new(
                &n,
                false,
                format!(
                    "declared {} but absent while the second process ran",
                    rel.label()
                ),
            ));
            continue;
        };
        let tol = rel.tolerance_bytes();
        let noise = tol.saturating_mul(2).saturating_add(SLACK);
        let drop = i128::from(b) - i128::from(d);
        let back = i128::from(b) - i128::from(a);
        let seen = drop >= i128::from(bytes) - i128::from(noise);
        let moved = format!(
            "a second process holding {} moved it by {} (seen at {} or more; ±{} noise)",
            fmt_bytes(bytes),
            fmt_signed(drop.clamp(i64::MIN.into(), i64::MAX.into()) as i64),
            fmt_bytes(bytes.saturating_sub(noise)),
            fmt_bytes(noise)
        );
        let returned = back.unsigned_abs() <= u128::from(noise);
        let release_note = match &released {
            Ok(()) => String::new(),
            Err(e) => format!("; {e}"),
        };
        if rel.sees_whole_device() {
            let ok = seen && returned;
            let why = if !seen {
                format!(
                    "declared {} (sees every process) but {moved}: it counts only this process; declare it process-local",
                    rel.label()
                )
            } else if !returned {
                format!(
                    "{moved}, but it stayed {} lower after the second process exited",
                    fmt_bytes(back.unsigned_abs().min(u128::from(u64::MAX)) as u64)
                )
            } else {
                format!("declared {}: {moved}", rel.label())
            };
            out.checks
                .push(Check::new(&n, ok, format!("{why}{release_note}")));
            if ok && out.context.is_none() {
                let ctx = drop.saturating_sub(i128::from(bytes)).max(0);
                out.context = Some(Context {
                    bytes: ctx.min(i128::from(u64::MAX)) as u64,
                    uncertainty: noise,
                    available_before: b,
                    tolerance: tol,
                    reading: *r,
                });
            }
        } else {
            let what = if seen {
                "it does see other processes: it could be declared device-wide"
            } else {
                "unmoved, as declared"
            };
            out.checks.push(Check::new(
                &n,
                true,
                format!("declared {}: {moved}; {what}{release_note}", rel.label()),
            ));
        }
    }
    for r in [Reading::DriverFree, Reading::DeviceAvailable] {
        if !readings.iter().any(|(x, _)| *x == r) {
            out.checks.push(Check::skip(
                &name(r),
                "declared unavailable: nothing to read",
            ));
        }
    }
    out
}
