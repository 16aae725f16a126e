//! The allocation probe: where no reading sees memory other processes hold (the plan says so
//! with [`Warning::OtherProcessesUnseen`](crate::Warning::OtherProcessesUnseen)), the session
//! checks the plan by allocating, once, what the engine still needs after it (the KV cache, the
//! activation peak, graphs still to capture, rounding slack) straight from the driver, and
//! frees it at once. When that fails, it bisects for the largest allocation that succeeds and
//! caps the KV cache by it.
//!
//! An allocation is the one device-wide measurement every backend offers: it fails when the
//! memory is not physically there, whoever holds it. Its limits: it holds the memory for an
//! instant (a neighbour allocating in that instant may fail), and it proves the memory only
//! where the driver commits memory when it allocates (discrete GPUs do; a driver that
//! allocates lazily would let it succeed). It runs only where nothing else can see, and the
//! plan records it (`physical_check: probe`).

use memplan_core::bytes::MIB;
use memplan_core::{Device, Error, Result};

use crate::plan::PlanBuilder;

/// Bisection stops when the bracket is narrower than this (or 1/512 of the need): about ten
/// allocations, each freed at once.
const RESOLUTION: u64 = 16 * MIB;

/// Check `b` (a plan builder that [`PlanBuilder::is_blind`]) by an allocation probe on
/// `device`. A builder whose plan cannot be built is returned as it is (building it again
/// gives the refusal).
pub(crate) fn check(device: &Device, b: PlanBuilder) -> Result<PlanBuilder> {
    let Ok(plan) = b.clone().build() else {
        return Ok(b);
    };
    let need = b.needs(plan.kv_cache_bytes);
    let got = largest_allocatable(device, need)?;
    tracing::info!(need, got, "allocation probe at the last quiet point");
    Ok(b.probed(got, got >= need))
}

/// Try to allocate `bytes`: `Ok(true)` when it succeeded (and was freed again), `Ok(false)`
/// when the device is out of memory, the error otherwise.
fn fits(device: &Device, bytes: u64) -> Result<bool> {
    match device.allocate(bytes) {
        Ok(a) => {
            device.free(a)?;
            Ok(true)
        }
        Err(Error::OutOfMemory { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The largest allocation up to `need` that succeeds now (within the resolution; 0 when
/// none does).
pub(crate) fn largest_allocatable(device: &Device, need: u64) -> Result<u64> {
    if need == 0 || fits(device, need)? {
        return Ok(need);
    }
    let res = RESOLUTION.max(need / 512);
    let (mut lo, mut hi) = (0u64, need);
    while hi - lo > res {
        let mid = lo + (hi - lo) / 2;
        if fits(device, mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}
