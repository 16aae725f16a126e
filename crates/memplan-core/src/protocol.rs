//! The snapshot primitive of the measurement protocol: synchronize, then read every layer in
//! one go. Windows are differences of snapshots ([`MemoryInfo::window_to`]). The ordered
//! multi-step protocol (release before baseline, teardown on every path) is built on this in
//! `memplan-planner`.

use crate::allocator::AllocatorView;
use crate::device::Device;
use crate::error::Result;
use crate::memory::{AllocatorMemory, MemoryInfo};

/// Synchronize the device, then read driver, graph-pool, device-wide and allocator layers into
/// one [`MemoryInfo`]. Without an allocator view, the allocator layer is absent. Where the device
/// cannot synchronize (`facts.synchronize` unsupported), the caller waits for the engine's
/// queues first (memplan-planner's session does, through `Engine::synchronize`).
pub fn snapshot(device: &Device, allocator: Option<&dyn AllocatorView>) -> Result<MemoryInfo> {
    let span = tracing::debug_span!("snapshot", device = %device.descriptor().id);
    let _e = span.enter();
    device.synchronize()?;
    let driver = device.driver_memory()?;
    let graph_pool = device.graph_pool_memory()?;
    let device_wide = device.device_wide_memory()?;
    let allocator = allocator
        .map(|a| {
            let s = a.stats();
            AllocatorMemory {
                reserved: Some(s.reserved),
                allocated: Some(s.allocated),
                peak_allocated: Some(s.peak_allocated),
                peak_reserved: s.peak_reserved,
            }
        })
        .unwrap_or_default();
    let info = MemoryInfo {
        driver,
        allocator,
        graph_pool,
        device: device_wide,
    };
    tracing::debug!(free = ?info.driver.free, reserved = ?info.allocator.reserved, "snapshot taken");
    Ok(info)
}
