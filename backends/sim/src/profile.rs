//! `SimProfile`: a named simulated GPU, and the lookups over the catalogue.

use memplan_core::ProfilingCapability;

use crate::catalog::PROFILES;
use crate::declared::PlatformFacts;
use crate::quirks::Quirks;

/// A named, deterministic simulated GPU.
///
/// `total_bytes` is what the real driver reports for discrete GPUs. For unified-memory APUs
/// (`apu_aperture_bytes` is `Some`) it is the memory the GPU can really use, while the driver
/// (with [`Quirks::apu_wrong_pool`]) reports the aperture.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SimProfile {
    /// Selector name, e.g. `rtx4090`.
    pub name: &'static str,
    /// Vendor and platform for display only (never used for decisions).
    pub vendor_label: &'static str,
    /// Marketing name as the driver reports it.
    pub device_name: &'static str,
    /// Usable device memory in bytes (see the type docs).
    pub total_bytes: u64,
    /// Where `total_bytes` comes from.
    pub total_source: &'static str,
    /// Driver memory the process's context (and runtime libraries) holds from the start.
    pub context_overhead_bytes: u64,
    /// APUs: the VRAM aperture the driver wrongly reports as total (with `apu_wrong_pool`).
    pub apu_aperture_bytes: Option<u64>,
    /// The behaviours of the real platform.
    pub quirks: Quirks,
    /// The facts the real backend reads on this platform (its declaration is made from them:
    /// [`SimProfile::capability`]).
    pub declared: fn(&SimProfile) -> PlatformFacts,
    /// The device-wide source the real backend reads on this platform.
    pub device_wide: DeviceWideSource,
}

/// Where a platform's device-wide reading (every process and API counted) comes from, as the
/// real backend reads it. The simulator reproduces each from its own ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceWideSource {
    /// The driver's free reading is the device-wide source itself (CUDA `cuMemGetInfo`, Level
    /// Zero Sysman `zesMemoryGetState`): the same value, quirks included (Sysman missing
    /// gives nothing, i915's free == total gives the total).
    DriverFree,
    /// DRM sysfs `mem_info_vram_total - mem_info_vram_used`: counts every user of the VRAM,
    /// graphics included, whatever the runtime's free reading sees.
    DrmSysfs,
    /// Unified-memory APU: the host's `MemAvailable` (and the GTT counters), which every
    /// process's use of the shared memory lowers.
    HostAvailable,
    /// None on this platform (no DRM counters, not an APU, free not device-wide).
    None,
}

impl SimProfile {
    /// The facts the real backend reads on the platform this profile imitates.
    pub fn facts(&self) -> PlatformFacts {
        (self.declared)(self)
    }

    /// What the real backend declares for this platform: its own `capability::declare`, run on
    /// [`SimProfile::facts`].
    pub fn capability(&self) -> ProfilingCapability {
        self.facts().declare()
    }
}

/// Every profile, in catalogue order.
pub fn profiles() -> &'static [SimProfile] {
    PROFILES
}

/// A profile by name (case-insensitive).
pub fn profile(name: &str) -> Option<&'static SimProfile> {
    PROFILES.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// The profile names, comma separated (for error messages).
pub fn profile_names() -> String {
    PROFILES
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::{GIB, MIB};
    use memplan_core::{Reading, Reliability};

    #[test]
    fn required_profiles_exist_and_names_are_unique() {
        for n in [
            "rtx4090",
            "rtx3090",
            "a100-40gb",
            "a100-80gb",
            "h100-80gb",
            "h200",
            "l4",
            "mi300x",
            "rx7900xtx-rocm5.4",
            "rx7900xtx-rocm6.2",
            "strix-halo",
            "arc-a770",
            "max1550",
            "arc-b580-nosysman",
            "broken-stale",
        ] {
            assert!(profile(n).is_some(), "{n} missing");
        }
        let mut names: Vec<_> = profiles().iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), profiles().len());
    }

    #[test]
    fn totals_match_real_driver_reports() {
        let gib = |n: &str| profile(n).unwrap().total_bytes as f64 / GIB as f64;
        assert_eq!(format!("{:.2}", gib("h100-80gb")), "79.19");
        assert_eq!(format!("{:.2}", gib("rtx3090")), "23.58");
        assert_eq!(format!("{:.2}", gib("rx7900xtx-rocm6.2")), "23.98");
        assert_eq!(format!("{:.2}", gib("rtx4090")), "23.99");
        assert_eq!(profile("h200").unwrap().total_bytes, 143_771 * MIB);
    }

    #[test]
    fn declarations_match_quirks() {
        // The `broken-*` profiles lie on purpose (the conformance suite catches them).
        for p in profiles().iter().filter(|p| !p.name.starts_with("broken")) {
            let c = p.capability();
            let free = c.reading(Reading::DriverFree);
            let q = p.quirks;
            if q.free_process_local {
                assert!(
                    matches!(free, Reliability::ProcessLocal { .. }),
                    "{}",
                    p.name
                );
            }
            if crate::readings::composed_from_processes(&q) {
                // The backend composes free from Sysman's per-process query.
                assert!(
                    matches!(free, Reliability::ProcessLocal { .. }),
                    "{}",
                    p.name
                );
            } else if q.sysman_missing || q.apu_wrong_pool {
                assert!(
                    matches!(free, Reliability::Unavailable { .. }),
                    "{}",
                    p.name
                );
            } else if q.free_equals_total {
                // The real backend cannot tell: approximate within the whole size.
                assert!(free.tolerance_bytes() >= p.total_bytes, "{}", p.name);
            }
            if q.graph_pool_attrs_zero || q.no_graph_pool_query {
                assert!(
                    matches!(
                        c.reading(Reading::GraphPool),
                        Reliability::Unavailable { .. }
                    ),
                    "{}",
                    p.name
                );
            }
            assert!(!q.apu_wrong_pool || c.facts.unified_memory, "{}", p.name);
            // An aperture is an APU's; every unified-memory device reads the host's memory.
            assert!(
                p.apu_aperture_bytes.is_none() || c.facts.unified_memory,
                "{}",
                p.name
            );
            assert_eq!(
                c.facts.unified_memory,
                p.device_wide == DeviceWideSource::HostAvailable,
                "{}",
                p.name
            );
            if q.hidden_bytes_per_capture > 0 {
                assert_eq!(
                    c.facts.hidden_bytes_per_capture,
                    Some(q.hidden_bytes_per_capture),
                    "{}",
                    p.name
                );
            }
            assert!(p.context_overhead_bytes < p.total_bytes / 8, "{}", p.name);
        }
    }
}
