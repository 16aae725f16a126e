//! Backends, devices and device ids.
//!
//! A [`Backend`] enumerates devices and opens them; a [`Device`] gives driver and graph-pool
//! readings, its declared [`ProfilingCapability`], synchronize, raw allocations (for
//! calibration), and optionally graph capture ([`GraphCapture`]) and virtual memory
//! ([`VirtualMemory`]). Backends only supply readings and primitive operations: when to
//! synchronize, release caches and snapshot is decided by the core's protocol.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::capability::ProfilingCapability;
use crate::error::{Error, Result};
use crate::graph::GraphCapture;
use crate::memory::{DriverMemory, GraphPoolMemory};
use crate::vmm::VirtualMemory;

/// Every backend memplan knows, compiled in or not (so every name parses in every build).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Simulated GPUs that reproduce each vendor's behaviour.
    Sim,
    /// NVIDIA CUDA (driver API through cudarc).
    Cuda,
    /// AMD ROCm (HIP runtime).
    Rocm,
    /// Intel GPUs through Level Zero.
    Xpu,
}

impl BackendKind {
    /// Every backend.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Sim,
        BackendKind::Cuda,
        BackendKind::Rocm,
        BackendKind::Xpu,
    ];

    /// The name used in device ids (`cuda:0`).
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sim => "sim",
            BackendKind::Cuda => "cuda",
            BackendKind::Rocm => "rocm",
            BackendKind::Xpu => "xpu",
        }
    }

    /// The cargo feature of the `memplan` facade that compiles it in.
    pub fn feature(self) -> &'static str {
        self.name()
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let l = s.to_ascii_lowercase();
        BackendKind::ALL
            .into_iter()
            .find(|k| {
                k.name() == l
                    || (l == "hip" && *k == BackendKind::Rocm)
                    || (l == "level-zero" && *k == BackendKind::Xpu)
            })
            .ok_or_else(|| Error::UnknownBackend {
                name: s.to_string(),
                known: BackendKind::ALL.map(|k| k.name()).join(", "),
            })
    }
}

/// A device id: `backend:selector`, e.g. `cuda:0`, `sim:rtx4090`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceId {
    /// The backend.
    pub backend: BackendKind,
    /// Backend-specific selector: an ordinal for real backends, a profile name for `sim`.
    pub selector: String,
}

impl DeviceId {
    /// A device id.
    pub fn new(backend: BackendKind, selector: impl Into<String>) -> Self {
        DeviceId {
            backend,
            selector: selector.into(),
        }
    }

    /// The selector as an ordinal, or an `UnknownDevice` error.
    pub fn ordinal(&self) -> Result<usize> {
        self.selector.parse().map_err(|_| Error::UnknownDevice {
            id: self.to_string(),
            available: format!("{}:N with N a device ordinal", self.backend),
        })
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.selector)
    }
}

impl FromStr for DeviceId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (b, sel) = s.split_once(':').unwrap_or((s, "0"));
        let backend: BackendKind = b.parse()?;
        if sel.is_empty() {
            return Err(Error::UnknownDevice {
                id: s.into(),
                available: format!("{backend}:N"),
            });
        }
        Ok(DeviceId::new(backend, sel))
    }
}

/// Static description of a device, as enumerated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDescriptor {
    /// Its id.
    pub id: DeviceId,
    /// Marketing name as the driver reports it.
    pub name: String,
    /// Total memory as the driver reports it, when it could be read.
    pub total_bytes: Option<u64>,
    /// Free-form facts (compute capability, gfx arch, driver/runtime version, MIG, UUID...).
    pub properties: Vec<(String, String)>,
}

/// Whether a compiled-in backend can run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BackendStatus {
    /// It loaded and can enumerate devices.
    Available,
    /// It cannot run here; `reason` names the library, the call and what it returned.
    Unavailable {
        /// Why not.
        reason: String,
    },
}

/// A backend: one vendor API.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Load the vendor library and enumerate devices. Never panics: a missing library or a
    /// failing init call is an `Err` naming the library, the call and the returned code.
    /// Cost: loads libraries on first call; cheap afterwards.
    fn devices(&self) -> Result<Vec<DeviceDescriptor>>;

    /// Open a device by selector (ordinal, or profile name for `sim`).
    fn open(&self, selector: &str) -> Result<Box<dyn Device>>;
}

/// One opened device.
///
/// Readings come from the device; the allocator layer comes from an
/// [`AllocatorView`](crate::allocator::AllocatorView) supplied by the engine (or memplan's own
/// accounting), and the two are joined into one [`MemoryInfo`](crate::MemoryInfo) by
/// [`snapshot`](crate::protocol::snapshot).
pub trait Device: Send {
    /// Static description.
    fn descriptor(&self) -> &DeviceDescriptor;

    /// The capability as the backend declares it (before calibration).
    fn capabilities(&self) -> &ProfilingCapability;

    /// Driver total/free. Absent values stay `None`. Does not synchronize.
    fn driver_memory(&mut self) -> Result<DriverMemory>;

    /// Graph-pool attributes; all `None` where the device has no such query (the default).
    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        Ok(GraphPoolMemory::default())
    }

    /// Wait for all work on the device (and deferred releases) to finish.
    fn synchronize(&mut self) -> Result<()>;

    /// Allocate `bytes` of device memory directly from the driver (no caching allocator).
    /// Used by calibration: the caller knows exactly what it asked for.
    fn allocate(&mut self, bytes: u64) -> Result<RawAllocation>;

    /// Free a raw allocation.
    fn free(&mut self, allocation: RawAllocation) -> Result<()>;

    /// Graph capture, when the device supports it.
    fn graph_capture(&mut self) -> Result<&mut dyn GraphCapture> {
        Err(Error::unsupported(
            "graph capture",
            "this backend does not implement graph capture",
        ))
    }

    /// Virtual-memory management, when the device supports it.
    fn virtual_memory(&mut self) -> Result<&mut dyn VirtualMemory> {
        Err(Error::unsupported(
            "virtual memory",
            "this backend does not implement virtual memory",
        ))
    }
}

/// Refuse a handle this device did not hand out, or whose recorded size or place differs
/// from what the caller passes back, before it reaches a vendor library: the handle types
/// have public fields, so safe code can forge one. `tracked` is the backend's record of
/// `handle`; the error names `field` and says the handle is not a live `noun` of this device.
pub fn ensure_owned<V: PartialEq>(
    field: &str,
    noun: &str,
    handle: u64,
    tracked: Option<&V>,
    expected: &V,
) -> Result<()> {
    if tracked == Some(expected) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("{handle:#x} is not a live {noun} of this device"),
        ))
    }
}

/// A raw device allocation made by [`Device::allocate`].
#[derive(Debug, PartialEq, Eq)]
pub struct RawAllocation {
    /// Opaque handle (a device pointer for real backends).
    pub handle: u64,
    /// Bytes asked for.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_handles_are_refused_by_name() {
        assert!(ensure_owned("range", "reservation", 0x10, Some(&4u64), &4).is_ok());
        let e = ensure_owned("range", "reservation", 0x10, Some(&4u64), &8)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "range: 0x10 is not a live reservation of this device");
        assert!(ensure_owned::<u64>("allocation", "allocation", 0x20, None, &1).is_err());
    }

    #[test]
    fn parses_ids() {
        let d: DeviceId = "sim:rtx4090".parse().unwrap();
        assert_eq!(d.backend, BackendKind::Sim);
        assert_eq!(d.selector, "rtx4090");
        let c: DeviceId = "cuda".parse().unwrap();
        assert_eq!(c.to_string(), "cuda:0");
        assert_eq!(c.ordinal().unwrap(), 0);
        assert_eq!(
            "HIP:1".parse::<DeviceId>().unwrap().backend,
            BackendKind::Rocm
        );
        let e = "metal:0".parse::<DeviceId>().unwrap_err().to_string();
        assert!(
            e.contains("unknown backend `metal`") && e.contains("cuda"),
            "{e}"
        );
        assert!("cuda:".parse::<DeviceId>().is_err());
        assert!("cuda:x".parse::<DeviceId>().unwrap().ordinal().is_err());
    }
}
