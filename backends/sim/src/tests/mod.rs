//! Behaviour tests of the simulated GPUs: one per quirk (showing the raw readings it
//! produces), the caching allocator, graph capture, virtual memory, the clock and the backend.

mod allocator;
mod device;
mod device_wide;
mod graph_quirks;
mod graphs;
mod legacy;
mod liars;
mod quirks;

use std::ops::Deref;

use memplan_core::bytes::{GIB, MIB};
use memplan_core::{
    Device, DriverMemory, GraphCapture, GraphPoolMemory, ProfilingCapability, RawAllocation,
    Result, VirtualMemory,
};

use crate::{profile, SimGpu};

/// A simulated GPU and one checked device on it: the device's operations go through the
/// core's tables, as memplan uses them; the GPU's world and truth through `Deref`.
#[derive(Clone)]
pub(crate) struct Gpu {
    pub sim: SimGpu,
    pub dev: Device,
}

impl Deref for Gpu {
    type Target = SimGpu;
    fn deref(&self) -> &SimGpu {
        &self.sim
    }
}

impl Gpu {
    pub fn of(sim: SimGpu) -> Self {
        Gpu {
            dev: sim.device(),
            sim,
        }
    }
    pub fn allocate(&self, bytes: u64) -> Result<RawAllocation> {
        self.dev.allocate(bytes)
    }
    pub fn free(&self, a: RawAllocation) -> Result<()> {
        Ok(self.dev.free(a)?)
    }
    pub fn synchronize(&self) -> Result<()> {
        self.dev.synchronize()
    }
    pub fn driver_memory(&self) -> Result<DriverMemory> {
        self.dev.driver_memory()
    }
    pub fn graph_pool_memory(&self) -> Result<GraphPoolMemory> {
        self.dev.graph_pool_memory()
    }
    pub fn device_wide_memory(&self) -> Result<memplan_core::DeviceWideMemory> {
        self.dev.device_wide_memory()
    }
    pub fn capabilities(&self) -> &ProfilingCapability {
        self.dev.capabilities()
    }
    pub fn graph_capture(&self) -> Result<GraphCapture<'_>> {
        self.dev.graph_capture()
    }
    pub fn virtual_memory(&self) -> Result<VirtualMemory<'_>> {
        self.dev.virtual_memory()
    }
}

/// A device at nominal physics (the quirk tests compare readings to the byte).
pub(crate) fn gpu(name: &str) -> Gpu {
    Gpu::of(SimGpu::open(&format!("{name},physics=nominal")).expect("profile exists"))
}

/// Synchronize and read the (masked) driver free.
pub(crate) fn free_after_sync(g: &Gpu) -> Option<u64> {
    g.synchronize().expect("no capture in progress");
    g.driver_memory().expect("sim readings never fail").free
}

pub(crate) fn total(name: &str) -> u64 {
    profile(name).expect("profile exists").total_bytes
}

pub(crate) const G: u64 = GIB;
pub(crate) const M: u64 = MIB;
