//! The total, cross-checked: the backend's enumeration, the opened device's descriptor and the
//! driver's reading must agree; what is not available at start must be accounted for by a
//! context (measured by the second process where a device-wide reading sees it, else bounded);
//! and the total must hold what the allocation probe could allocate. A total too high makes a
//! plan larger than the device; one too low wastes it.

use memplan::bytes::{fmt_bytes, fmt_signed, GIB, MIB};
use memplan::{Device, Reading, Reliability};

use crate::locality::Context;
use crate::probe::{Capacity, STEP};
use crate::report::Check;

/// Slack of the accounting: what a process's context takes varies a little between two
/// processes of the same program (library loads, page rounding).
const CONTEXT_SLACK: u64 = 64 * MIB;

/// Without a measured context: the most an idle device may hold that this process cannot
/// allocate (its own context, the runtime's libraries, the driver's reservations). CUDA
/// contexts take 0.3 to 0.6 GiB (DESIGN.md; the simulator's profiles model 256 to 512 MiB),
/// so 2 GiB is generous, and a total several GiB too high still fails.
pub const MAX_UNACCOUNTED: u64 = 2 * GIB;

/// The declared tolerance of the total (0 when exact).
fn tolerance(device: &Device) -> u64 {
    device
        .capabilities()
        .reading(Reading::DriverTotal)
        .tolerance_bytes()
}

/// The total as the driver reads it now, or the descriptor's.
pub fn total(device: &Device) -> Option<u64> {
    device
        .driver_memory()
        .ok()
        .and_then(|d| d.total)
        .or(device.descriptor().total_bytes)
}

/// `total.sources_agree`: enumeration, descriptor and reading.
pub fn sources_agree(device: &Device) -> Check {
    let name = "total.sources_agree";
    let id = device.descriptor().id.clone();
    let enumerated = memplan::backend(id.backend)
        .and_then(|b| b.devices())
        .ok()
        .and_then(|ds| ds.into_iter().find(|d| d.id == id))
        .and_then(|d| d.total_bytes);
    let reading = device.driver_memory().ok().and_then(|d| d.total);
    let sources = [
        ("enumeration", enumerated),
        ("descriptor", device.descriptor().total_bytes),
        ("driver reading", reading),
    ];
    let present: Vec<(&str, u64)> = sources
        .iter()
        .filter_map(|(n, v)| v.map(|v| (*n, v)))
        .collect();
    let shown: Vec<String> = present
        .iter()
        .map(|(n, v)| format!("{n} {}", fmt_bytes(*v)))
        .collect();
    if present.len() < 2 {
        return Check::skip(
            name,
            format!("fewer than two sources of the total ({})", shown.join(", ")),
        );
    }
    let lo = present.iter().map(|p| p.1).min().unwrap_or(0);
    let hi = present.iter().map(|p| p.1).max().unwrap_or(0);
    let tol = tolerance(device);
    Check::new(
        name,
        hi - lo <= tol,
        format!("{} (declared within {})", shown.join(", "), fmt_bytes(tol)),
    )
}

/// `total.accounted`, where the second process measured a context: what is not available at
/// start (total less the device-wide reading) is this process's context, as large as the
/// second process's.
pub fn accounted_by_context(device: &Device, ctx: &Context) -> Check {
    let name = "total.accounted";
    let Some(t) = total(device) else {
        return Check::skip(name, "no total to account for");
    };
    let used = i128::from(t) - i128::from(ctx.available_before);
    let diff = used - i128::from(ctx.bytes);
    let allowed = CONTEXT_SLACK
        .saturating_add(ctx.uncertainty)
        .saturating_add(ctx.tolerance)
        .saturating_add(tolerance(device));
    let shown = |v: i128| fmt_signed(v.clamp(i64::MIN.into(), i64::MAX.into()) as i64);
    let ok = diff.unsigned_abs() <= u128::from(allowed);
    let verdict = if ok {
        "accounted".to_string()
    } else if diff > 0 {
        format!(
            "{} unaccounted: the total is too high (or another process holds memory: run the suite on an idle device)",
            shown(diff)
        )
    } else {
        format!("{} less than a context: the total is too low", shown(-diff))
    };
    Check::new(
        name,
        ok,
        format!(
            "total {} less {} available ({}) = {} held at start; a second process's context took {}; allowed ±{}: {verdict}",
            fmt_bytes(t),
            fmt_bytes(ctx.available_before),
            ctx.reading.name(),
            shown(used),
            fmt_bytes(ctx.bytes),
            fmt_bytes(allowed)
        ),
    )
}

/// `total.accounted` without a measured context: an idle device holds at most
/// [`MAX_UNACCOUNTED`] that this process cannot allocate.
pub fn accounted_by_capacity(device: &Device, cap: &Capacity) -> Check {
    let name = "total.accounted";
    let Some(t) = total(device) else {
        return Check::skip(name, "no total to account for");
    };
    let unaccounted = i128::from(t) - i128::from(cap.bytes);
    let allowed = MAX_UNACCOUNTED.saturating_add(tolerance(device));
    let ok = unaccounted <= i128::from(allowed);
    Check::new(
        name,
        ok,
        format!(
            "total {} less the {} the allocation probe could allocate = {} this process cannot allocate on an idle device (no reading saw a second process's context, so at most {} is allowed){}",
            fmt_bytes(t),
            fmt_bytes(cap.bytes),
            fmt_signed(unaccounted.clamp(i64::MIN.into(), i64::MAX.into()) as i64),
            fmt_bytes(allowed),
            if ok { "" } else { ": the total is too high (or another process holds memory: run on an idle device)" }
        ),
    )
}

/// `total.holds_what_fits`: the total is at least what the probe could allocate.
pub fn holds_what_fits(device: &Device, cap: &Capacity) -> Check {
    let name = "total.holds_what_fits";
    let Some(t) = total(device) else {
        return Check::skip(name, "no total");
    };
    let ok = t.saturating_add(tolerance(device)).saturating_add(STEP) >= cap.bytes;
    Check::new(
        name,
        ok,
        format!(
            "total {}; the allocation probe allocated {}{}",
            fmt_bytes(t),
            fmt_bytes(cap.bytes),
            if ok { "" } else { ": the total is too low" }
        ),
    )
}

/// `free.matches_capacity`: the free reading says what the probe could allocate, within its
/// tolerance (more fits: free under-reports; less: it over-reports, and plans overrun).
pub fn free_matches_capacity(free: Option<u64>, rel: &Reliability, cap: &Capacity) -> Check {
    let name = "free.matches_capacity";
    if matches!(rel, Reliability::Unavailable { .. }) {
        return Check::skip(name, "free declared unavailable");
    }
    let Some(f) = free else {
        return Check::new(name, false, format!("declared {} but absent", rel.label()));
    };
    let allowed = rel
        .tolerance_bytes()
        .saturating_add(CONTEXT_SLACK)
        .saturating_add(STEP);
    let diff = i128::from(cap.bytes) - i128::from(f);
    let ok = diff.unsigned_abs() <= u128::from(allowed);
    let verdict = match (ok, diff > 0) {
        (true, _) => "as read",
        (false, true) => "more fits than free says: free under-reports",
        (false, false) => {
            "less fits than free says: free over-reports, and a plan sized by it runs out of memory"
        }
    };
    Check::new(
        name,
        ok,
        format!(
            "free read {}; the allocation probe allocated {} in {} allocations ({}; declared {}, allowed ±{}): {verdict}",
            fmt_bytes(f),
            fmt_bytes(cap.bytes),
            cap.allocations,
            fmt_signed(diff.clamp(i64::MIN.into(), i64::MAX.into()) as i64),
            rel.label(),
            fmt_bytes(allowed)
        ),
    )
}
