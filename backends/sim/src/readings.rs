//! Translation of the simulated world into the raw readings a driver would give, quirk by quirk
//! (the `conv.rs` of this backend), and the masking of readings the declaration says cannot be
//! sourced.

use memplan_core::{
    DeviceWideMemory, DriverMemory, GraphPoolMemory, ProfilingCapability, Reading, Reliability,
};

use crate::physics::Physics;
use crate::profile::{DeviceWideSource, SimProfile};
use crate::quirks::Quirks;
use crate::state::State;

/// Total as the driver reports it: the aperture on APUs with `apu_wrong_pool`.
pub(crate) fn reported_total(p: &SimProfile, q: &Quirks) -> u64 {
    let total = match (q.apu_wrong_pool, p.apu_aperture_bytes) {
        (true, Some(aperture)) => aperture,
        _ => p.total_bytes,
    };
    total
        .saturating_add(q.total_over)
        .saturating_sub(q.total_under)
}

/// Whether the real backend composes free from Sysman's per-process query: Sysman's own free
/// reading is unusable (absent, or free == total) and the query lists this process.
pub(crate) fn composed_from_processes(q: &Quirks) -> bool {
    q.sysman_processes && (q.sysman_missing || q.free_equals_total)
}

/// Free as the backend would report it right now (before the stale-free lag): the vendor's
/// reading, or where the backend composes it from Sysman's per-process query, the total less
/// this process's memory.
pub(crate) fn fresh_free(p: &SimProfile, q: &Quirks, ph: &Physics, s: &State) -> Option<u64> {
    if composed_from_processes(q) {
        let own = p.total_bytes.saturating_sub(s.this_process(p));
        let noisy =
            (own as i128 + i128::from(ph.noise(s.tick))).clamp(0, i128::from(p.total_bytes));
        return Some(noisy as u64);
    }
    vendor_free(p, q, ph, s)
}

/// Free as the vendor's own call reports it (Sysman's, hipMemGetInfo, cuMemGetInfo).
fn vendor_free(p: &SimProfile, q: &Quirks, ph: &Physics, s: &State) -> Option<u64> {
    if q.sysman_missing {
        return None;
    }
    let total = reported_total(p, q);
    if q.free_equals_total {
        return Some(total);
    }
    if q.apu_wrong_pool {
        // The carve-out holds the context; the GPU's allocations land in GTT (system memory),
        // so the reading stays where it was whatever the process allocates.
        return Some(total.saturating_sub(p.context_overhead_bytes.min(total)));
    }
    let mut free = if q.free_process_local {
        p.total_bytes.saturating_sub(s.this_process(p))
    } else {
        s.real_free(p)
    };
    if q.free_blind_to_graphics && !q.free_process_local {
        free = free.saturating_add(s.graphics).min(p.total_bytes);
    }
    // Noise within the declared tolerance (approximate readings only), one draw per tick.
    let noisy = (free as i128 + i128::from(ph.noise(s.tick))).clamp(0, i128::from(p.total_bytes));
    let noisy = noisy as u64;
    // A reading counted in steps (rounded down).
    Some(match q.free_step {
        0 => noisy,
        step => noisy / step * step,
    })
}

/// The raw driver reading, quirks applied, nothing masked.
pub(crate) fn raw_driver(p: &SimProfile, q: &Quirks, ph: &Physics, s: &State) -> DriverMemory {
    let free = match (q.stale_free, s.stale) {
        (true, Some((reported, _))) => reported,
        _ => fresh_free(p, q, ph, s),
    };
    DriverMemory::new(Some(reported_total(p, q)), free)
}

/// The raw device-wide reading of the platform's source ([`DeviceWideSource`]), nothing
/// masked: the driver's own free where that is the source (its quirks included), otherwise
/// the memory really free on the device (every process, graphics included) with the source's
/// own noise.
pub(crate) fn raw_device_wide(
    p: &SimProfile,
    q: &Quirks,
    ph: &Physics,
    s: &State,
) -> DeviceWideMemory {
    let available = match p.device_wide {
        DeviceWideSource::None => None,
        // Sysman's own free reading, not what the backend composed from the per-process query.
        DeviceWideSource::DriverFree if composed_from_processes(q) => vendor_free(p, q, ph, s),
        DeviceWideSource::DriverFree => raw_driver(p, q, ph, s).free,
        DeviceWideSource::DrmSysfs | DeviceWideSource::HostAvailable => {
            let free = i128::from(s.real_free(p)) + i128::from(ph.device_noise(s.tick));
            Some(free.clamp(0, i128::from(p.total_bytes)) as u64)
        }
    };
    DeviceWideMemory::new(available).with_total(second_total(p, q))
}

/// The second reading of the device's memory the real backend takes beside the runtime's
/// total, which a runtime's total misreported (`total-over`/`total-under`) leaves as it is:
/// DRM's `mem_info_vram_total` on a card with the DRM counters; on an APU whose DRM counters
/// the backend reads (its facts say so), `mem_info_gtt_total + mem_info_vram_total`, the
/// memory the GPU may use (the profile's total), whatever aperture the runtime reports; on a
/// CUDA platform where NVML loads (not `no-nvml`), NVML's framebuffer total less the
/// framebuffer it reports reserved for the driver and firmware
/// (`memplan_backend_cuda::nvml::NvmlMemory::device_total`), the memory `cuMemGetInfo`
/// counts. The simulated device has no reserve of its own, so each is its real memory. No
/// other platform has one.
fn second_total(p: &SimProfile, q: &Quirks) -> Option<u64> {
    let read = match p.device_wide {
        DeviceWideSource::DrmSysfs => true,
        DeviceWideSource::HostAvailable => {
            matches!(p.facts(), crate::declared::PlatformFacts::Rocm(f) if f.drm_vram)
        }
        DeviceWideSource::DriverFree => {
            !q.no_nvml && matches!(p.facts(), crate::declared::PlatformFacts::Cuda(_))
        }
        DeviceWideSource::None => false,
    };
    read.then_some(p.total_bytes)
}

/// The raw graph-pool reading: absent without a query, 0 with the stub.
pub(crate) fn raw_graph_pool(q: &Quirks, s: &State) -> GraphPoolMemory {
    if q.no_graph_pool_query {
        return GraphPoolMemory::default();
    }
    if q.graph_pool_attrs_zero {
        return GraphPoolMemory::new(Some(0), Some(0)).with_high_water(Some(0), Some(0));
    }
    GraphPoolMemory::new(Some(s.gp_used), Some(s.gp_reserved))
        .with_high_water(Some(s.gp_used_high), Some(s.gp_reserved_high))
}

fn unavailable(c: &ProfilingCapability, r: Reading) -> bool {
    matches!(c.reading(r), Reliability::Unavailable { .. })
}

/// A backend does not source what it declares unavailable: those readings become `None`.
pub(crate) fn mask_driver(c: &ProfilingCapability, mut d: DriverMemory) -> DriverMemory {
    if unavailable(c, Reading::DriverTotal) {
        d.total = None;
    }
    if unavailable(c, Reading::DriverFree) {
        d.free = None;
    }
    d
}

/// As [`mask_driver`], for the device-wide reading.
pub(crate) fn mask_device_wide(c: &ProfilingCapability, d: DeviceWideMemory) -> DeviceWideMemory {
    if unavailable(c, Reading::DeviceAvailable) {
        DeviceWideMemory::default()
    } else {
        d
    }
}

/// As [`mask_driver`], for the graph pool.
pub(crate) fn mask_graph_pool(c: &ProfilingCapability, g: GraphPoolMemory) -> GraphPoolMemory {
    if unavailable(c, Reading::GraphPool) {
        GraphPoolMemory::default()
    } else {
        g
    }
}
