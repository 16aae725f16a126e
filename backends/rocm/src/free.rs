//! Composing the driver layer from its sources: hipMemGetInfo, the DRM sysfs counters and the
//! host's meminfo, as the [`FreeSource`] the capability table chose says.
//!
//! Pure functions of the readings, so every policy is tested without a GPU. A value that no
//! source can give is `None`: an APU's free memory is never the VRAM aperture stood in for
//! what the host can really give.

use memplan_core::{DeviceWideMemory, DriverMemory};

use crate::capability::FreeSource;
use crate::sysfs::{DrmMemory, HostMemory};

/// hipMemGetInfo's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HipMemInfo {
    /// Total bytes.
    pub total: u64,
    /// Free bytes.
    pub free: u64,
}

/// Compose total/free from the sources `source` uses. `drm` and `host` are what could be read
/// at this moment (`None` when unreadable).
pub fn compose(
    source: FreeSource,
    hip: HipMemInfo,
    drm: Option<DrmMemory>,
    host: Option<HostMemory>,
) -> DriverMemory {
    match source {
        FreeSource::HipProcessLocal | FreeSource::HipDeviceWide => {
            DriverMemory::new(Some(hip.total), Some(hip.free))
        }
        FreeSource::HipAndDrm => {
            let drm_free = drm.and_then(|d| d.vram_free());
            if drm_free.is_none() {
                tracing::warn!(
                    "DRM sysfs VRAM counters unreadable: free memory is hipMemGetInfo's alone"
                );
            }
            let free = drm_free.map_or(hip.free, |d| d.min(hip.free));
            DriverMemory::new(Some(hip.total), Some(free))
        }
        FreeSource::HostBounded => host_bounded(hip, drm, host),
    }
}

/// The device-wide reading: memory available to new allocations counting every process and
/// API, from the DRM counters (`mem_info_vram_total - mem_info_vram_used`) on a discrete card,
/// and on an APU from the VRAM carve-out plus the GTT free memory bounded by the host's
/// `MemAvailable` (or `MemAvailable` alone without DRM counters). `None` when the files are
/// absent or unreadable: never 0 for what could not be read. The DRM counters also read the
/// device's memory a second time ([`DeviceWideMemory::total`]): on a discrete card
/// `mem_info_vram_total`, which a hipMemGetInfo total above it contradicts; on an APU
/// `mem_info_gtt_total + mem_info_vram_total` (the GTT limit the GPU may map of system memory
/// plus the carve-out), which stands for the device's memory where the runtime's total
/// describes the aperture alone. Without the GTT counters an APU has no second total (the
/// host's MemTotal is not what the GPU may map).
pub fn device_wide(
    integrated: bool,
    drm: Option<DrmMemory>,
    host: Option<HostMemory>,
) -> DeviceWideMemory {
    let available = if integrated {
        match drm {
            Some(d) => {
                let gtt = d.gtt_free().map(|g| host.map_or(g, |h| g.min(h.available)));
                match (d.vram_free(), gtt) {
                    (Some(v), Some(g)) => v.checked_add(g),
                    (Some(v), None) => host.and_then(|h| v.checked_add(h.available)),
                    (None, _) => None,
                }
            }
            None => host.map(|h| h.available),
        }
    } else {
        drm.and_then(|d| d.vram_free())
    };
    let total = drm.and_then(|d| {
        if integrated {
            d.gtt_total?.checked_add(d.vram_total)
        } else {
            Some(d.vram_total)
        }
    });
    DeviceWideMemory::new(available).with_total(total)
}

/// APU: with DRM counters, VRAM carve-out plus GTT, the GTT part bounded by MemAvailable;
/// without them, the host's MemTotal/MemAvailable. Without either, free is absent.
fn host_bounded(hip: HipMemInfo, drm: Option<DrmMemory>, host: Option<HostMemory>) -> DriverMemory {
    if let Some(d) = drm {
        let vram_free = d.vram_free();
        let gtt_free = d.gtt_free().map(|g| host.map_or(g, |h| g.min(h.available)));
        let total = d
            .gtt_total
            .and_then(|g| g.checked_add(d.vram_total))
            .unwrap_or(d.vram_total)
            .max(hip.total);
        let free = match (vram_free, gtt_free) {
            (Some(v), Some(g)) => v.checked_add(g),
            (Some(v), None) => host.map(|h| v.saturating_add(h.available)),
            (None, _) => None,
        };
        return DriverMemory::new(Some(total), free);
    }
    match host {
        Some(h) => DriverMemory::new(Some(h.total.max(hip.total)), Some(h.available)),
        None => DriverMemory::new(Some(hip.total), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::{GIB, MIB};

    const HIP: HipMemInfo = HipMemInfo {
        total: 24 * GIB,
        free: 20 * GIB,
    };

    fn drm(total: u64, used: u64, gtt: Option<(u64, u64)>) -> DrmMemory {
        DrmMemory {
            vram_total: total,
            vram_used: used,
            gtt_total: gtt.map(|g| g.0),
            gtt_used: gtt.map(|g| g.1),
        }
    }

    #[test]
    fn device_wide_from_drm_or_host_never_zero_for_unread() {
        // Discrete: sysfs sees the 6 GiB another process holds.
        let d = device_wide(false, Some(drm(24 * GIB, 6 * GIB, None)), None);
        assert_eq!(d.available, Some(18 * GIB));
        // ... and reads the card's memory a second time, beside hipMemGetInfo's total.
        assert_eq!(d.total, Some(24 * GIB));
        assert_eq!(device_wide(false, None, None).total, None);
        // No counters (files absent): not offered, not 0.
        assert_eq!(device_wide(false, None, None).available, None);
        // Inconsistent counters (used above total) are not a reading either.
        assert_eq!(
            device_wide(false, Some(drm(GIB, 2 * GIB, None)), None).available,
            None
        );
        // APU: carve-out free plus GTT free bounded by MemAvailable.
        let host = HostMemory {
            total: 128 * GIB,
            available: 30 * GIB,
        };
        let apu = Some(drm(512 * MIB, 256 * MIB, Some((64 * GIB, 20 * GIB))));
        assert_eq!(
            device_wide(true, apu, Some(host)).available,
            Some(256 * MIB + 30 * GIB)
        );
        assert_eq!(
            device_wide(true, None, Some(host)).available,
            Some(30 * GIB)
        );
        assert_eq!(device_wide(true, None, None).available, None);
        // An APU's carve-out alone is not the memory the GPU can use: its second total is the
        // GTT limit plus the carve-out, and without the GTT counters there is none (the host's
        // MemTotal is not what the GPU may map).
        assert_eq!(
            device_wide(true, apu, Some(host)).total,
            Some(64 * GIB + 512 * MIB)
        );
        let no_gtt = Some(drm(512 * MIB, 256 * MIB, None));
        assert_eq!(device_wide(true, no_gtt, Some(host)).total, None);
        assert_eq!(device_wide(true, None, Some(host)).total, None);
    }

    #[test]
    fn hip_only_sources_pass_hip_through() {
        for s in [FreeSource::HipProcessLocal, FreeSource::HipDeviceWide] {
            let m = compose(s, HIP, Some(drm(24 * GIB, 10 * GIB, None)), None);
            assert_eq!(m, DriverMemory::new(Some(24 * GIB), Some(20 * GIB)));
        }
    }

    #[test]
    fn drm_sees_the_compositor_hip_misses() {
        // A desktop holds 600 MiB of VRAM HIP cannot see.
        let used = 4 * GIB + 600 * MIB;
        let m = compose(
            FreeSource::HipAndDrm,
            HIP,
            Some(drm(24 * GIB, used, None)),
            None,
        );
        assert_eq!(m.free, Some(24 * GIB - used));
        // When HIP is the smaller, HIP wins.
        let m = compose(
            FreeSource::HipAndDrm,
            HIP,
            Some(drm(24 * GIB, GIB, None)),
            None,
        );
        assert_eq!(m.free, Some(20 * GIB));
        // Unreadable counters fall back to HIP, not to 0.
        let m = compose(FreeSource::HipAndDrm, HIP, None, None);
        assert_eq!(m.free, Some(20 * GIB));
    }

    #[test]
    fn apu_is_bounded_by_host_available_not_the_aperture() {
        // 512 MiB carve-out reported by HIP; 32 GiB GTT; host has 12 GiB available.
        let hip = HipMemInfo {
            total: 512 * MIB,
            free: 400 * MIB,
        };
        let host = HostMemory {
            total: 64 * GIB,
            available: 12 * GIB,
        };
        let d = drm(512 * MIB, 112 * MIB, Some((32 * GIB, 2 * GIB)));
        let m = compose(FreeSource::HostBounded, hip, Some(d), Some(host));
        assert_eq!(m.total, Some(32 * GIB + 512 * MIB));
        assert_eq!(m.free, Some(400 * MIB + 12 * GIB));
        // Plenty of host memory: the GTT limit binds.
        let roomy = HostMemory {
            total: 64 * GIB,
            available: 60 * GIB,
        };
        assert_eq!(
            compose(FreeSource::HostBounded, hip, Some(d), Some(roomy)).free,
            Some(400 * MIB + 30 * GIB)
        );
        // No DRM: the host's numbers.
        let m = compose(FreeSource::HostBounded, hip, None, Some(host));
        assert_eq!(m, DriverMemory::new(Some(64 * GIB), Some(12 * GIB)));
        // Nothing but HIP: free is absent, not the aperture.
        let m = compose(FreeSource::HostBounded, hip, None, None);
        assert_eq!(m, DriverMemory::new(Some(512 * MIB), None));
    }
}
