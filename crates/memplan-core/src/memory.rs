//! `MemoryInfo`: one snapshot of every memory layer, and windows (differences of snapshots).
//!
//! The three layers must never be confused (see `docs/architecture.md`):
//! - **driver**: `total` / `free` as the driver reports them (device-wide on CUDA);
//! - **allocator**: `reserved` (segments the engine's caching allocator holds from the driver,
//!   cached or in use), `allocated` (in use), `peak_allocated` (since the last reset), for this
//!   process only;
//! - **graph pool**: memory the driver attributes to graph memory-allocation nodes;
//! - **device-wide**: memory physically available to new allocations, counting every process
//!   and API on the device, from a source other than the driver's free reading where that one
//!   is process-local or absent (DRM sysfs, the host's available memory on unified-memory
//!   APUs, Sysman; on CUDA the driver's own device-wide free).
//!
//! Every value is `Option`: a reading that could not be sourced is `None`, never 0.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::bytes::{fmt_opt, fmt_signed, signed};

/// Driver-level readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DriverMemory {
    /// Total device memory as the driver reports it.
    pub total: Option<u64>,
    /// Free device memory as the driver reports it.
    pub free: Option<u64>,
}

/// Allocator-level readings (this process, the engine's caching allocator).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AllocatorMemory {
    /// Bytes held from the driver (cached or in use).
    pub reserved: Option<u64>,
    /// Bytes in use.
    pub allocated: Option<u64>,
    /// Peak of `allocated` since the last reset.
    pub peak_allocated: Option<u64>,
    /// Peak of `reserved` since the last reset; absent when the allocator does not report it.
    #[serde(default)]
    pub peak_reserved: Option<u64>,
}

/// Graph-pool readings (graph memory-allocation nodes only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GraphPoolMemory {
    /// Bytes currently in use by graph allocation nodes.
    pub used: Option<u64>,
    /// Bytes currently reserved for graph allocations.
    pub reserved: Option<u64>,
    /// High-water mark of `used`.
    pub used_high: Option<u64>,
    /// High-water mark of `reserved`.
    pub reserved_high: Option<u64>,
}

/// Device-wide readings: a source that counts every process and API on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceWideMemory {
    /// Memory physically available to new allocations on this device, everyone's use
    /// counted. `None` where the device offers no such source (never 0 for unread).
    pub available: Option<u64>,
    /// The device's memory as a source other than the driver's total reports it (DRM sysfs
    /// `mem_info_vram_total` on a discrete card; NVML's framebuffer total less what it reports
    /// reserved for the driver and firmware): a second reading of [`DriverMemory::total`],
    /// which a driver total above it contradicts.
    /// `None` where no such source is read (absent in documents written before it existed).
    #[serde(default)]
    pub total: Option<u64>,
}

impl DeviceWideMemory {
    /// A device-wide reading of `available` bytes (`None` = not offered or not read), with no
    /// second total.
    pub const fn new(available: Option<u64>) -> Self {
        Self {
            available,
            total: None,
        }
    }

    /// The same reading with the device's memory as the second source reports it (see
    /// [`DeviceWideMemory::total`]).
    pub const fn with_total(mut self, total: Option<u64>) -> Self {
        self.total = total;
        self
    }
}

/// One snapshot of every layer, taken after a synchronize.
///
/// `#[non_exhaustive]` (as are its layers): build one with [`MemoryInfo::new`] or
/// `MemoryInfo::default()` and the `with_*` setters, so a new reading is not a breaking change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MemoryInfo {
    /// Driver layer.
    pub driver: DriverMemory,
    /// Allocator layer.
    pub allocator: AllocatorMemory,
    /// Graph-pool layer.
    pub graph_pool: GraphPoolMemory,
    /// Device-wide layer (absent in documents written before it existed).
    #[serde(default)]
    pub device: DeviceWideMemory,
}

impl DriverMemory {
    /// A driver reading: `total` and `free` as the driver reports them (`None` = not sourced).
    pub const fn new(total: Option<u64>, free: Option<u64>) -> Self {
        Self { total, free }
    }
}

impl AllocatorMemory {
    /// An allocator reading: bytes `reserved` from the driver, `allocated` (in use) and
    /// `peak_allocated` since the last reset.
    pub const fn new(
        reserved: Option<u64>,
        allocated: Option<u64>,
        peak_allocated: Option<u64>,
    ) -> Self {
        Self {
            reserved,
            allocated,
            peak_allocated,
            peak_reserved: None,
        }
    }

    /// With the peak of `reserved` since the last reset (`None`: not reported).
    pub const fn with_peak_reserved(mut self, peak_reserved: Option<u64>) -> Self {
        self.peak_reserved = peak_reserved;
        self
    }
}

impl GraphPoolMemory {
    /// The current graph-pool reading, `used` and `reserved`; the high-water marks are absent
    /// until [`GraphPoolMemory::with_high_water`] sets them.
    pub const fn new(used: Option<u64>, reserved: Option<u64>) -> Self {
        Self {
            used,
            reserved,
            used_high: None,
            reserved_high: None,
        }
    }

    /// The same reading with the high-water marks of `used` and `reserved`.
    pub const fn with_high_water(
        mut self,
        used_high: Option<u64>,
        reserved_high: Option<u64>,
    ) -> Self {
        self.used_high = used_high;
        self.reserved_high = reserved_high;
        self
    }
}

impl MemoryInfo {
    /// A snapshot of the driver, allocator and graph-pool layers; the device-wide layer is
    /// absent until [`MemoryInfo::with_device`] sets it.
    pub const fn new(
        driver: DriverMemory,
        allocator: AllocatorMemory,
        graph_pool: GraphPoolMemory,
    ) -> Self {
        Self {
            driver,
            allocator,
            graph_pool,
            device: DeviceWideMemory::new(None),
        }
    }

    /// The same snapshot with another device-wide reading.
    pub const fn with_device(mut self, device: DeviceWideMemory) -> Self {
        self.device = device;
        self
    }

    /// The same snapshot with another driver reading.
    pub const fn with_driver(mut self, driver: DriverMemory) -> Self {
        self.driver = driver;
        self
    }

    /// The same snapshot with another allocator reading.
    pub const fn with_allocator(mut self, allocator: AllocatorMemory) -> Self {
        self.allocator = allocator;
        self
    }

    /// The same snapshot with another graph-pool reading.
    pub const fn with_graph_pool(mut self, graph_pool: GraphPoolMemory) -> Self {
        self.graph_pool = graph_pool;
        self
    }

    /// `total - free`: everything the device holds (all processes, where the driver is
    /// device-wide). `None` when either reading is absent or the driver reports free > total.
    pub fn driver_used(&self) -> Option<u64> {
        self.driver.total?.checked_sub(self.driver.free?)
    }

    /// `driver_used - reserved`: context, library workspaces, graph exec objects, other
    /// processes. Signed, because a process-local driver reading can make it negative, which is
    /// evidence, not something to clamp.
    pub fn non_allocator(&self) -> Option<i64> {
        Some(signed(self.driver_used()?) - signed(self.allocator.reserved?))
    }

    /// The window from `self` (earlier) to `later`.
    ///
    /// The change of `driver_used` is the change of total less the change of free, so a
    /// window is read even where a driver reports free above total (a total that
    /// understates the device by a constant, which a window cancels): only a snapshot's own
    /// [`driver_used`](Self::driver_used) is absent then.
    pub fn window_to(&self, later: &MemoryInfo) -> MemoryWindow {
        let driver_used = delta(self.driver.total, later.driver.total)
            .zip(delta(self.driver.free, later.driver.free))
            .map(|(total, free)| total.saturating_sub(free));
        MemoryWindow {
            driver_free: delta(self.driver.free, later.driver.free),
            driver_used,
            allocator_reserved: delta(self.allocator.reserved, later.allocator.reserved),
            allocator_allocated: delta(self.allocator.allocated, later.allocator.allocated),
            graph_pool_used: delta(self.graph_pool.used, later.graph_pool.used),
            graph_pool_reserved: delta(self.graph_pool.reserved, later.graph_pool.reserved),
            // Saturating: both sides may be near the ends of i64 (readings above i64::MAX
            // saturate there), and the sign of the change is what must survive.
            non_allocator: driver_used
                .zip(delta(self.allocator.reserved, later.allocator.reserved))
                .map(|(used, reserved)| used.saturating_sub(reserved)),
        }
    }
}

impl std::ops::Sub for MemoryInfo {
    type Output = MemoryWindow;
    /// `later - earlier` is the window from `earlier` to `later`.
    fn sub(self, earlier: MemoryInfo) -> MemoryWindow {
        earlier.window_to(&self)
    }
}

fn delta(a: Option<u64>, b: Option<u64>) -> Option<i64> {
    Some(signed(b?).saturating_sub(signed(a?)))
}

/// Differences between two snapshots (later minus earlier). Absent when either side is absent.
/// Negative values are kept: a negative window is evidence of a broken protocol or a
/// neighbour freeing memory, and is reported, never clamped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MemoryWindow {
    /// Change of driver free memory (negative = memory was taken).
    pub driver_free: Option<i64>,
    /// Change of `driver_used`.
    pub driver_used: Option<i64>,
    /// Change of allocator reserved bytes.
    pub allocator_reserved: Option<i64>,
    /// Change of allocator allocated bytes.
    pub allocator_allocated: Option<i64>,
    /// Change of graph-pool used bytes.
    pub graph_pool_used: Option<i64>,
    /// Change of graph-pool reserved bytes.
    pub graph_pool_reserved: Option<i64>,
    /// Change of memory held outside the allocator.
    pub non_allocator: Option<i64>,
}

impl MemoryWindow {
    /// Memory the device lost during the window according to the driver (`-driver_free`).
    pub fn driver_taken(&self) -> Option<i64> {
        self.driver_free.map(|d| -d)
    }
}

fn fmt_delta(d: Option<i64>) -> String {
    d.map(fmt_signed).unwrap_or_else(|| "absent".into())
}

impl fmt::Display for MemoryInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: [(&str, String); 13] = [
            ("driver total", fmt_opt(self.driver.total)),
            ("driver free", fmt_opt(self.driver.free)),
            ("driver used", fmt_opt(self.driver_used())),
            ("allocator reserved", fmt_opt(self.allocator.reserved)),
            ("allocator allocated", fmt_opt(self.allocator.allocated)),
            ("allocator peak", fmt_opt(self.allocator.peak_allocated)),
            (
                "allocator peak reserved",
                fmt_opt(self.allocator.peak_reserved),
            ),
            (
                "non-allocator",
                fmt_delta(self.non_allocator())
                    .trim_start_matches('+')
                    .to_string(),
            ),
            ("graph pool used", fmt_opt(self.graph_pool.used)),
            ("graph pool reserved", fmt_opt(self.graph_pool.reserved)),
            ("graph pool used (high)", fmt_opt(self.graph_pool.used_high)),
            ("device-wide available", fmt_opt(self.device.available)),
            ("device-wide total", fmt_opt(self.device.total)),
        ];
        for (k, v) in rows {
            writeln!(f, "  {k:<24} {v:>14}")?;
        }
        Ok(())
    }
}

impl fmt::Display for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "free {} | used {} | reserved {} | allocated {} | graph pool {} | non-allocator {}",
            fmt_delta(self.driver_free),
            fmt_delta(self.driver_used),
            fmt_delta(self.allocator_reserved),
            fmt_delta(self.allocator_allocated),
            fmt_delta(self.graph_pool_used),
            fmt_delta(self.non_allocator),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{GIB, MIB};

    fn snap(total: u64, free: u64, reserved: Option<u64>) -> MemoryInfo {
        MemoryInfo {
            driver: DriverMemory {
                total: Some(total),
                free: Some(free),
            },
            allocator: AllocatorMemory {
                reserved,
                allocated: reserved,
                peak_allocated: reserved,
                peak_reserved: reserved,
            },
            graph_pool: GraphPoolMemory::default(),
            device: DeviceWideMemory::default(),
        }
    }

    #[test]
    fn derived_values() {
        let s = snap(24 * GIB, 20 * GIB, Some(3 * GIB));
        assert_eq!(s.driver_used(), Some(4 * GIB));
        assert_eq!(s.non_allocator(), Some(GIB as i64));
    }

    #[test]
    fn absent_stays_absent() {
        let s = MemoryInfo {
            driver: DriverMemory {
                total: Some(GIB),
                free: None,
            },
            ..Default::default()
        };
        assert_eq!(s.driver_used(), None);
        assert_eq!(s.non_allocator(), None);
        let w = s.window_to(&s);
        assert_eq!(w.driver_free, None);
        assert_eq!(w.allocator_reserved, None);
        assert!(s.to_string().contains("absent"));
    }

    #[test]
    fn free_above_total_is_not_a_number() {
        let s = snap(GIB, 2 * GIB, None);
        assert_eq!(s.driver_used(), None);
    }

    #[test]
    fn a_window_reads_through_a_total_below_free() {
        // A driver whose total understates the device by 1 GiB: idle free reads above it.
        // What a step took is still the change of free; the constant cancels.
        let before = snap(80 * GIB, 80 * GIB + 512 * MIB, Some(0));
        let after = snap(80 * GIB, 78 * GIB, Some(GIB));
        assert_eq!(before.driver_used(), None);
        let w = before.window_to(&after);
        assert_eq!(w.driver_used, Some((2 * GIB + 512 * MIB) as i64));
        assert_eq!(w.non_allocator, Some((GIB + 512 * MIB) as i64));
        // A total that moves is counted in the window, as before.
        let moved = snap(81 * GIB, 78 * GIB, Some(GIB));
        assert_eq!(
            before.window_to(&moved).driver_used,
            Some((3 * GIB + 512 * MIB) as i64)
        );
    }

    #[test]
    fn negative_windows_are_kept() {
        // The vLLM failure: the cache flush inside the window releases 22 MiB.
        let before = snap(24 * GIB, 10 * GIB, Some(5 * GIB));
        let after = snap(24 * GIB, 10 * GIB + 22 * MIB, Some(5 * GIB - 22 * MIB));
        let w = after - before;
        assert_eq!(w.driver_taken(), Some(-22 * MIB as i64));
        assert_eq!(w.allocator_reserved, Some(-22 * MIB as i64));
        assert_eq!(w.non_allocator, Some(0));
    }

    #[test]
    fn non_allocator_can_be_negative() {
        // Process-local free readings can understate use.
        let s = snap(24 * GIB, 23 * GIB, Some(2 * GIB));
        assert_eq!(s.non_allocator(), Some(-(GIB as i64)));
    }

    #[test]
    fn absurd_readings_do_not_overflow_a_window() {
        // An allocator view reporting more than the device holds, then a full device.
        let before = snap(u64::MAX, u64::MAX, Some(u64::MAX));
        let after = snap(u64::MAX, 0, Some(0));
        let w = before.window_to(&after);
        assert_eq!(w.non_allocator, Some(i64::MAX), "saturates, keeps the sign");
        assert_eq!(w.driver_used, Some(i64::MAX));
        let back = after.window_to(&before);
        assert!(back.non_allocator.is_some_and(|d| d < 0));
    }

    #[test]
    fn serde_round_trip() {
        let s = snap(24 * GIB, 20 * GIB, None);
        let j = serde_json::to_string(&s).unwrap();
        assert!(j.contains("\"reserved\":null"));
        let back: MemoryInfo = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
    }
}
