//! Leaks: after every free and every virtual-memory release the device must be back where it
//! started. Checked two ways, neither trusting memplan's own bookkeeping:
//! - the free reading after each of [`CYCLES`] allocate/free (or reserve/map/unmap/release)
//!   cycles, within a tolerance below the allocation granularity (plus the reading's declared
//!   tolerance), so a leak smaller than one granule per cycle still adds up to a failure;
//! - the allocation probe ([`crate::probe`]) before and after the cycles: memory that no
//!   longer fits is gone, whatever the readings say, which also works where the free reading
//!   is declared unavailable.

use memplan::bytes::{fmt_bytes, fmt_signed, KIB, MIB};
use memplan::{Device, Error, Reading};

use crate::probe::{Capacity, STEP};
use crate::report::Check;

/// Cycles of each kind.
pub const CYCLES: usize = 16;

/// Size of each raw allocation: not a multiple of common reading or page steps.
const RAW_BYTES: u64 = 67 * MIB + 4 * KIB;

/// How far the free reading may be from its baseline after a cycle: half a granule (below
/// the granularity, so one leaked granule fails) plus twice the declared tolerance.
fn allowed(device: &Device, granule: u64) -> u64 {
    let tol = device
        .capabilities()
        .reading(Reading::DriverFree)
        .tolerance_bytes();
    (granule / 2).saturating_add(tol.saturating_mul(2))
}

fn free_now(device: &Device) -> Result<Option<u64>, Error> {
    device.synchronize()?;
    Ok(device.driver_memory()?.free)
}

/// Compare the free reading after each cycle with the baseline; `cycle` runs one cycle.
fn cycles(
    device: &Device,
    name: &str,
    what: &str,
    granule: u64,
    mut cycle: impl FnMut() -> Result<(), Error>,
) -> Check {
    let readable = device
        .capabilities()
        .reading(Reading::DriverFree)
        .measures_own_usage();
    let base = match free_now(device) {
        Ok(f) => f.filter(|_| readable),
        Err(e) => return Check::new(name, false, format!("reading free failed: {e}")),
    };
    let allowed = allowed(device, granule);
    // Every cycle runs even after the reading showed a leak, so the probe that follows sees
    // all of it.
    let mut first_leak = None;
    for i in 1..=CYCLES {
        if let Err(e) = cycle() {
            let why = if e.is_out_of_memory() {
                " (the device is full: memory given back earlier did not return; the allocation probe measures how much)"
            } else {
                ""
            };
            return Check::new(name, false, format!("cycle {i} of {what} failed: {e}{why}"));
        }
        let Some(b) = base else { continue };
        let now = match free_now(device) {
            Ok(Some(f)) => f,
            Ok(None) => return Check::new(name, false, format!("free absent after cycle {i}")),
            Err(e) => return Check::new(name, false, format!("reading free failed: {e}")),
        };
        let drift = i128::from(b) - i128::from(now);
        if first_leak.is_none() && drift.unsigned_abs() > u128::from(allowed) {
            first_leak = Some(format!(
                "after cycle {i} of {what}, free is {} from its baseline {} (allowed ±{}): {}",
                fmt_signed(drift.clamp(i64::MIN.into(), i64::MAX.into()) as i64),
                fmt_bytes(b),
                fmt_bytes(allowed),
                if drift > 0 {
                    "memory was not given back"
                } else {
                    "free grew: the reading is not tracking this process"
                }
            ));
        }
    }
    match (base, first_leak) {
        (_, Some(leak)) => Check::new(name, false, leak),
        (Some(_), None) => Check::new(
            name,
            true,
            format!(
                "{CYCLES} cycles of {what}: free back at its baseline (±{}) after each",
                fmt_bytes(allowed)
            ),
        ),
        (None, None) => Check::skip(
            name,
            format!("free declared unavailable: {CYCLES} cycles of {what} ran, the allocation probe judges them"),
        ),
    }
}

/// `leaks.free_returns_memory`: raw allocate/free cycles.
pub fn free_cycles(device: &Device) -> Check {
    cycles(
        device,
        "leaks.free_returns_memory",
        &format!("allocate {} / free", fmt_bytes(RAW_BYTES)),
        STEP,
        || {
            let a = device.allocate(RAW_BYTES)?;
            device.free(a).map_err(Error::from)
        },
    )
}

/// `leaks.vm_release_returns_memory`: reserve two granules, map them, unmap, release.
pub fn vm_cycles(device: &Device) -> Check {
    let name = "leaks.vm_release_returns_memory";
    if !device.capabilities().facts.virtual_memory.is_supported() {
        return Check::skip(name, "virtual memory not declared");
    }
    let granule = match device.virtual_memory().and_then(|vm| vm.granularity()) {
        Ok(g) if g > 0 && g <= 1 << 30 => g,
        Ok(g) => {
            return Check::new(
                name,
                false,
                format!("granularity of {g} bytes is not a usable size"),
            )
        }
        Err(e) => return Check::new(name, false, format!("granularity failed: {e}")),
    };
    cycles(
        device,
        name,
        &format!(
            "reserve / map / unmap / release of 2 x {}",
            fmt_bytes(granule)
        ),
        granule,
        || {
            let vm = device.virtual_memory()?;
            let range = vm.reserve(2 * granule)?;
            let mapped = vm.map(&range, 0, 2 * granule);
            let unmapped = match mapped {
                Ok(m) => vm.unmap(m).map_err(Error::from),
                Err(e) => Err(e),
            };
            let released = vm.release(range).map_err(Error::from);
            unmapped.and(released)
        },
    )
}

/// `leaks.capacity_after_*`: the probe after the cycles found as much as before them.
pub fn capacity_kept(
    name: &str,
    what: &str,
    before: &Result<Capacity, String>,
    after: &Result<Capacity, String>,
) -> Check {
    let (b, a) = match (before, after) {
        (Ok(b), Ok(a)) => (b, a),
        (Err(e), _) | (_, Err(e)) => {
            return Check::new(name, false, format!("the allocation probe failed: {e}"))
        }
    };
    let lost = i128::from(b.bytes) - i128::from(a.bytes);
    let allowed = 4 * STEP;
    Check::new(
        name,
        lost <= i128::from(allowed),
        format!(
            "the allocation probe found {} before {what} (and its own {} allocate/free), {} after: {} lost (allowed {}){}",
            fmt_bytes(b.bytes),
            b.allocations,
            fmt_bytes(a.bytes),
            fmt_signed(lost.clamp(i64::MIN.into(), i64::MAX.into()) as i64),
            fmt_bytes(allowed),
            if lost > i128::from(allowed) { ": memory that was freed never came back" } else { "" }
        ),
    )
}
