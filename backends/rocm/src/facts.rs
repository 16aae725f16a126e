//! The facts a ROCm declaration is made from ([`Inputs`]: the runtime and device facts the
//! rules look at) and what they need without a runtime: the HIP version and how
//! `hipRuntimeGetVersion` encodes it. Pure data, compiled without the `runtime` feature, so
//! the simulator declares its AMD profiles through [`crate::capability::declare`] on a machine
//! without ROCm; `conv` (with `runtime`) re-exports it.

use std::ffi::c_int;
use std::fmt;

/// A HIP runtime or driver version, decoded from `HIP_VERSION`'s encoding
/// `major * 10_000_000 + minor * 100_000 + patch` (patch is a build number, e.g. 5.2.21153).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct HipVersion {
    /// Major (the ROCm major release).
    pub major: u32,
    /// Minor (the ROCm minor release).
    pub minor: u32,
    /// Patch / build number.
    pub patch: u32,
}

impl HipVersion {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        HipVersion {
            major,
            minor,
            patch,
        }
    }

    /// Decode the integer `hipRuntimeGetVersion` / `hipDriverGetVersion` return. Negative
    /// values are not versions.
    pub fn from_int(v: c_int) -> Option<Self> {
        let v = u32::try_from(v).ok()?;
        Some(HipVersion {
            major: v / 10_000_000,
            minor: (v / 100_000) % 100,
            patch: v % 100_000,
        })
    }

    /// `(major, minor)`, the granularity the capability table works at.
    pub fn release(self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

impl fmt::Display for HipVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Facts about one runtime and device that the rules look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    /// `hipRuntimeGetVersion`.
    pub runtime: HipVersion,
    /// `hipDeviceAttributeIntegrated` (an APU).
    pub integrated: bool,
    /// DRM sysfs `mem_info_vram_used`/`_total` exist for this device.
    pub drm_vram: bool,
    /// `hipDeviceAttributeVirtualMemoryManagementSupported` is 1 (false when 0 or unreadable).
    pub vmm_attribute: bool,
    /// Runtime families this runtime lacks some symbol of.
    pub lacks: Vec<ApiFamily>,
}

/// A group of HIP functions that is present or absent together for a rule's purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFamily {
    /// Stream capture, instantiate, launch, destroy.
    Capture,
    /// `hipDeviceGetGraphMemAttribute`.
    GraphPoolQuery,
    /// hipMemAddressReserve / hipMemCreate / hipMemMap / hipMemSetAccess and their inverses.
    VirtualMemory,
}
