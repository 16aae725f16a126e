//! The allocation probe: how much the device lets this process allocate right now, found by
//! allocating until it refuses, then freeing everything. It trusts no reading and none of
//! memplan's bookkeeping, only whether the driver grants memory, so it measures a leak where
//! the free reading is unavailable or lies, and bounds the total from below.
//!
//! Allocations are [`STEP`]-multiples: first chunks of about 1/32 of the hint, then, each time
//! one is refused, half as large, down to one step; so the capacity is found to within one
//! step in a few dozen allocations.

use memplan::bytes::{fmt_bytes, MIB};
use memplan::{Device, Error};

/// The probe's resolution: the granularity of large raw allocations on current drivers
/// (cuMemAlloc and hipMalloc hand out 2 MiB pages).
pub const STEP: u64 = 2 * MIB;

/// At most this many allocations held at once: a device that grants 2 MiB forever (a driver
/// that grants what it does not have) ends the probe with an error instead of a hang.
const MAX_HELD: usize = 1 << 14;

/// What the probe found.
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    /// Bytes allocated before the device refused one more step.
    pub bytes: u64,
    /// Allocations made.
    pub allocations: usize,
}

/// Does this error mean "no more memory" (the device refused), rather than a failure?
fn refused(e: &Error) -> bool {
    e.is_out_of_memory() || matches!(e, Error::DriverCall { .. })
}

/// Fill the device, then free everything. `hint` (free, device-wide or total memory) sizes the
/// first chunks; without one the probe starts at 1 GiB. `Err` when an allocation fails other
/// than by running out, or a free fails.
pub fn capacity(device: &Device, hint: Option<u64>) -> Result<Capacity, String> {
    let hint = hint.unwrap_or(32 << 30);
    let mut chunk = (hint / 32 / STEP).max(1) * STEP;
    let mut held = Vec::new();
    let mut bytes = 0u64;
    let mut error = None;
    loop {
        if held.len() >= MAX_HELD {
            error = Some(format!(
                "the device granted {} allocations ({}) and still did not refuse",
                held.len(),
                fmt_bytes(bytes)
            ));
            break;
        }
        match device.allocate(chunk) {
            Ok(a) => {
                bytes = bytes.saturating_add(chunk);
                held.push(a);
            }
            Err(e) if refused(&e) => {
                if chunk == STEP {
                    break;
                }
                chunk = (chunk / 2 / STEP).max(1) * STEP;
            }
            Err(e) => {
                error = Some(format!("allocate({}) failed: {e}", fmt_bytes(chunk)));
                break;
            }
        }
    }
    let allocations = held.len();
    for a in held {
        if let Err(e) = device.free(a) {
            error.get_or_insert(format!("free failed: {e}"));
        }
    }
    if let Err(e) = device.synchronize() {
        error.get_or_insert(format!("synchronize failed: {e}"));
    }
    match error {
        Some(e) => Err(e),
        None => Ok(Capacity { bytes, allocations }),
    }
}
