//! What a HIP runtime and device can be trusted with: every version and device rule of
//! DESIGN.md's AMD column as one data table, [`RULES`].
//!
//! [`declare`] walks the table in order; each row whose condition holds overrides what the
//! rows before it set, and its `why` becomes a note of the declared capability, so a user sees
//! which rule produced each value. The device code asks the result ([`Declared`]) how to read
//! free memory ([`FreeSource`]) and whether graph-pool attributes mean anything
//! ([`PoolAttrs`]); it never compares versions itself.

use memplan_core::bytes::MIB;
use memplan_core::{GraphRelease, ProfilingCapability, Reading, Reliability, Support};

use crate::facts::{ApiFamily, HipVersion, Inputs};

/// When a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Always (the default a later row may override).
    Always,
    /// The runtime is at least this `(major, minor)` release.
    Since(u32, u32),
    /// The runtime is older than this `(major, minor)` release.
    Before(u32, u32),
    /// The device is an APU.
    Integrated,
    /// DRM sysfs VRAM counters exist for the device.
    DrmVram,
    /// The device says it supports virtual-memory management.
    VmmAttribute,
    /// The runtime lacks a function of this family.
    Lacks(ApiFamily),
}

/// Where driver free/total come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeSource {
    /// hipMemGetInfo, which counts only this process (ROCm <= 5.4).
    HipProcessLocal,
    /// hipMemGetInfo, device-wide but blind to graphics (DRM) allocations (ROCm >= 5.5).
    HipDeviceWide,
    /// The smaller of hipMemGetInfo's free and DRM sysfs `vram_total - vram_used`, which counts
    /// every user of the VRAM.
    HipAndDrm,
    /// APU: VRAM carve-out plus GTT, bounded by the host's MemAvailable (not the aperture
    /// hipMemGetInfo reports).
    HostBounded,
}

/// What the graph-pool attribute query returns on this runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAttrs {
    /// The function does not exist.
    Absent,
    /// A stub that returns 0 (ROCm 5.3 - 5.5.1): reading it would invent a 0.
    Stub,
    /// Real values.
    Real,
}

/// What a rule sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    /// The free-memory source and, for approximate sources, the tolerance in bytes.
    Free(FreeSource, u64),
    /// Graph-pool attributes.
    Pool(PoolAttrs),
    /// When a destroyed graph's memory returns.
    Release(GraphRelease),
    /// Memory hidden per capture (bytes).
    HiddenPerCapture(u64),
    /// Graph capture support.
    Capture(bool),
    /// Virtual-memory support.
    Vmm(bool),
    /// Unified memory (APU).
    Unified,
}

impl Set {
    /// Which property of the capability the effect sets (rows setting the same one override
    /// each other).
    fn property(self) -> u8 {
        match self {
            Set::Free(..) => 0,
            Set::Pool(_) => 1,
            Set::Release(_) => 2,
            Set::HiddenPerCapture(_) => 3,
            Set::Capture(_) => 4,
            Set::Vmm(_) => 5,
            Set::Unified => 6,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Condition.
    pub when: When,
    /// Effect.
    pub set: Set,
    /// Why (becomes a note when the row applies).
    pub why: &'static str,
}

const fn rule(when: When, set: Set, why: &'static str) -> Rule {
    Rule { when, set, why }
}

/// Tolerance of hipMemGetInfo where it misses graphics (DRM) allocations: a desktop session
/// or a compositor commonly holds a few hundred MiB of VRAM that HIP cannot see.
const BLIND_TO_GRAPHICS_TOLERANCE: u64 = 512 * MIB;
/// Tolerance of combining two non-atomic readings (HIP and sysfs) of a device others use.
const TWO_SOURCE_TOLERANCE: u64 = 16 * MIB;
/// Tolerance for an APU: the GTT limit and the host's page cache move with host load.
const HOST_BOUNDED_TOLERANCE: u64 = 256 * MIB;

/// Every rule, applied top to bottom; a later row overrides an earlier one.
pub const RULES: &[Rule] = &[
    rule(When::Always, Set::Free(FreeSource::HipProcessLocal, 0), "ROCm <= 5.4: hipMemGetInfo counts only this process"),
    rule(When::Since(5, 5), Set::Free(FreeSource::HipDeviceWide, BLIND_TO_GRAPHICS_TOLERANCE), "ROCm >= 5.5: hipMemGetInfo is device-wide but blind to graphics (DRM) allocations"),
    rule(When::DrmVram, Set::Free(FreeSource::HipAndDrm, TWO_SOURCE_TOLERANCE), "DRM sysfs mem_info_vram_used counts every user of the VRAM: free is the smaller of it and hipMemGetInfo"),
    rule(When::Integrated, Set::Free(FreeSource::HostBounded, HOST_BOUNDED_TOLERANCE), "APU: usable memory is bounded by the host's MemAvailable, not the VRAM aperture hipMemGetInfo reports"),
    rule(When::Integrated, Set::Unified, "APU: device memory is host memory"),
    rule(When::Always, Set::Pool(PoolAttrs::Absent), "ROCm < 5.3: no hipDeviceGetGraphMemAttribute"),
    rule(When::Since(5, 3), Set::Pool(PoolAttrs::Stub), "ROCm 5.3 - 5.5.1: hipDeviceGetGraphMemAttribute is a stub returning 0"),
    rule(When::Since(5, 6), Set::Pool(PoolAttrs::Real), "ROCm >= 5.6: graph-pool attributes are real"),
    rule(When::Lacks(ApiFamily::GraphPoolQuery), Set::Pool(PoolAttrs::Absent), "this runtime exports no hipDeviceGetGraphMemAttribute"),
    rule(When::Always, Set::Release(GraphRelease::Immediate), "ROCm < 6.2: destroying a graph frees its memory at once"),
    rule(When::Since(6, 2), Set::Release(GraphRelease::AtNextSync), "ROCm >= 6.2: a destroyed graph's memory returns only at the next synchronize"),
    rule(When::Since(6, 2), Set::HiddenPerCapture(4 * MIB), "ROCm >= 6.2: ~4 MiB per capture stays in the fragment allocator"),
    rule(When::Always, Set::Capture(true), "HIP stream capture"),
    rule(When::Lacks(ApiFamily::Capture), Set::Capture(false), "this runtime lacks a stream-capture function"),
    rule(When::Always, Set::Vmm(false), "hipDeviceAttributeVirtualMemoryManagementSupported is 0 or unreadable"),
    rule(When::VmmAttribute, Set::Vmm(true), "the device supports virtual-memory management"),
    rule(When::Lacks(ApiFamily::VirtualMemory), Set::Vmm(false), "this runtime lacks a virtual-memory function"),
    rule(When::Before(5, 4), Set::Vmm(false), "HIP < 5.4 lays out hipMemAllocationProp differently (compressionType first); memplan passes the 5.4+ layout only"),
];

/// The declared capability plus the reading policy the device follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// What memplan's core sees.
    pub capability: ProfilingCapability,
    /// How the device reads driver free/total.
    pub free: FreeSource,
    /// Whether graph-pool attributes are read.
    pub pool: PoolAttrs,
}

fn holds(when: When, i: &Inputs) -> bool {
    match when {
        When::Always => true,
        When::Since(major, minor) => i.runtime.release() >= (major, minor),
        When::Before(major, minor) => i.runtime.release() < (major, minor),
        When::Integrated => i.integrated,
        When::DrmVram => i.drm_vram,
        When::VmmAttribute => i.vmm_attribute,
        When::Lacks(f) => i.lacks.contains(&f),
    }
}

/// Apply [`RULES`] to `inputs`.
pub fn declare(inputs: &Inputs) -> Declared {
    declare_with(RULES, inputs)
}

/// The platforms this backend's row of the capability matrix shows (`docs/capability-matrix.md`),
/// each a label and what [`declare`] makes of its facts: every HIP release a rule changes at,
/// discrete with and without DRM sysfs, APUs.
pub fn platforms() -> Vec<(&'static str, ProfilingCapability)> {
    let input = |major, minor, integrated, drm_vram, vmm_attribute| Inputs {
        runtime: HipVersion::new(major, minor, 0),
        integrated,
        drm_vram,
        vmm_attribute,
        lacks: Vec::new(),
    };
    let cases = [
        ("HIP 5.2, discrete", input(5, 2, false, false, false)),
        ("HIP 5.4, discrete", input(5, 4, false, false, false)),
        ("HIP 5.5, discrete", input(5, 5, false, false, false)),
        (
            "HIP 5.6, discrete with DRM sysfs",
            input(5, 6, false, true, true),
        ),
        (
            "HIP 6.2, discrete with DRM sysfs",
            input(6, 2, false, true, true),
        ),
        ("HIP 7.0, discrete", input(7, 0, false, false, true)),
        ("HIP 6.2, APU", input(6, 2, true, false, false)),
        (
            "HIP 6.2, APU with DRM sysfs",
            input(6, 2, true, true, false),
        ),
    ];
    cases
        .into_iter()
        .map(|(p, i)| (p, declare(&i).capability))
        .collect()
}

/// Apply `rules` (a table in [`RULES`]'s format) to `inputs`.
pub fn declare_with(rules: &[Rule], inputs: &Inputs) -> Declared {
    let mut cap = ProfilingCapability::exact_discrete();
    let (mut free, mut tolerance, mut pool) = (FreeSource::HipProcessLocal, 0, PoolAttrs::Absent);
    let (mut free_why, mut pool_why) = ("", "");
    let mut capture_why = "";
    let mut vmm_why = "";
    cap.notes.push(format!("HIP runtime {}", inputs.runtime));
    let mut winners: Vec<(u8, &str)> = Vec::new();
    for r in rules.iter().filter(|r| holds(r.when, inputs)) {
        match r.set {
            Set::Free(s, t) => (free, tolerance, free_why) = (s, t, r.why),
            Set::Pool(p) => (pool, pool_why) = (p, r.why),
            Set::Release(g) => cap.facts.graph_release = g,
            Set::HiddenPerCapture(b) => cap.facts.hidden_bytes_per_capture = Some(b),
            Set::Capture(c) => (cap.facts.graph_capture, capture_why) = (support(c), r.why),
            Set::Vmm(v) => (cap.facts.virtual_memory, vmm_why) = (support(v), r.why),
            Set::Unified => cap.facts.unified_memory = true,
        }
        // Only the rule in effect for each property is a note: a later row replaces the
        // note of the row it overrides.
        winners.retain(|(k, _)| *k != r.set.property());
        winners.push((r.set.property(), r.why));
    }
    cap.notes
        .extend(winners.iter().map(|(_, why)| why.to_string()));
    let why = free_why.to_string();
    let free_rel = match free {
        FreeSource::HipProcessLocal => Reliability::process_local(tolerance, why),
        _ => Reliability::Approximate {
            tolerance_bytes: tolerance,
            why,
        },
    };
    cap.set(Reading::DriverFree, free_rel);
    if free == FreeSource::HostBounded {
        let why =
            "APU: VRAM carve-out plus GTT (or host MemTotal), shared with the CPU".to_string();
        cap.set(
            Reading::DriverTotal,
            Reliability::Approximate {
                tolerance_bytes: HOST_BOUNDED_TOLERANCE,
                why,
            },
        );
    }
    let pool_rel = match pool {
        PoolAttrs::Real => Reliability::Exact,
        _ => Reliability::Unavailable {
            reason: pool_why.to_string(),
        },
    };
    cap.set(Reading::GraphPool, pool_rel);
    cap.set(Reading::DeviceAvailable, device_available(inputs));
    cap.facts.graph_pool_attributes = if pool == PoolAttrs::Real {
        Support::Supported
    } else {
        Support::no(pool_why)
    };
    if !cap.facts.graph_capture.is_supported() {
        cap.facts.graph_capture = Support::no(capture_why);
    }
    if !cap.facts.virtual_memory.is_supported() {
        cap.facts.virtual_memory = Support::no(vmm_why);
    }
    Declared {
        capability: cap,
        free,
        pool,
    }
}

/// The device-wide source, from what the system offers: on an APU the host's `MemAvailable`
/// (with the GTT counters where DRM has them), on a discrete card the DRM sysfs VRAM counters,
/// which count every process and graphics allocation; otherwise none.
fn device_available(i: &Inputs) -> Reliability {
    if i.integrated {
        Reliability::Approximate {
            tolerance_bytes: HOST_BOUNDED_TOLERANCE,
            why: "APU: host /proc/meminfo MemAvailable (and DRM sysfs GTT counters): every process's use of the shared memory".into(),
        }
    } else if i.drm_vram {
        Reliability::Approximate {
            tolerance_bytes: TWO_SOURCE_TOLERANCE,
            why: "DRM sysfs mem_info_vram_total - mem_info_vram_used: every user of the VRAM, graphics included".into(),
        }
    } else {
        Reliability::Unavailable {
            reason: "no DRM sysfs mem_info_vram_used for this device and not an APU: nothing device-wide to read".into(),
        }
    }
}

fn support(yes: bool) -> Support {
    if yes {
        Support::Supported
    } else {
        Support::no("")
    }
}

#[cfg(test)]
#[path = "capability_tests.rs"]
mod tests;
