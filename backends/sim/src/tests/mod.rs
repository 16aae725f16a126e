//! Behaviour tests of the simulated GPUs: one per quirk (showing the raw readings it
//! produces), the caching allocator, graph capture, virtual memory, the clock and the backend.

mod allocator;
mod device;
mod graph_quirks;
mod graphs;
mod legacy;
mod quirks;

use memplan_core::bytes::{GIB, MIB};
use memplan_core::Device;

use crate::{profile, SimGpu};

/// A device at nominal physics (the quirk tests compare readings to the byte).
pub(crate) fn gpu(name: &str) -> SimGpu {
    SimGpu::open(&format!("{name},physics=nominal")).expect("profile exists")
}

/// Synchronize and read the (masked) driver free.
pub(crate) fn free_after_sync(g: &mut SimGpu) -> Option<u64> {
    g.synchronize().expect("no capture in progress");
    g.driver_memory().expect("sim readings never fail").free
}

pub(crate) fn total(name: &str) -> u64 {
    profile(name).expect("profile exists").total_bytes
}

pub(crate) const G: u64 = GIB;
pub(crate) const M: u64 = MIB;
