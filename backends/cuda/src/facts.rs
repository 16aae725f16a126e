//! The facts a CUDA declaration is made from ([`CudaFacts`]: what the driver reported about
//! one device) and what they need without a driver: the packed driver version and the table
//! of which driver version (and which symbols) each group of entry points needs.
//! Pure data and functions, compiled without the `runtime` feature, so the simulator declares
//! its NVIDIA profiles through [`crate::capability::declare`] on a machine without a driver;
//! `loader` (with `runtime`) re-exports them for its run-time checks.

use memplan_core::{Error, Result};

/// A CUDA version as packed by `cuDriverGetVersion` (`1000 * major + 10 * minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion(pub i32);

impl CudaVersion {
    /// Major version.
    pub fn major(self) -> i32 {
        self.0 / 1000
    }
    /// Minor version.
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// A group of driver entry points with one minimum driver version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Enumeration, primary context, memory info, raw allocations (CUDA 11.0: the bindings call
    /// `cuDevicePrimaryCtxRelease_v2`).
    Basic,
    /// `cuDeviceGetUuid_v2` (CUDA 11.4).
    Uuid,
    /// `cuDeviceGetGraphMemAttribute` and `cuDeviceGraphMemTrim` (CUDA 11.4).
    GraphMemory,
    /// Stream capture with graph allocation nodes: `cuGraphInstantiateWithFlags`,
    /// `cuMemAllocAsync`/`cuMemFreeAsync` (CUDA 11.4; stream-ordered allocation is 11.2).
    GraphCapture,
    /// Virtual-memory management: `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`... (CUDA 10.2).
    VirtualMemory,
}

impl Feature {
    /// Every feature, for tables and tests.
    pub const ALL: [Feature; 5] = [
        Feature::Basic,
        Feature::Uuid,
        Feature::GraphMemory,
        Feature::GraphCapture,
        Feature::VirtualMemory,
    ];

    /// What the feature is, for error messages.
    pub fn what(self) -> &'static str {
        match self {
            Feature::Basic => "the CUDA backend",
            Feature::Uuid => "device UUIDs (cuDeviceGetUuid_v2)",
            Feature::GraphMemory => "graph-pool attributes (cuDeviceGetGraphMemAttribute)",
            Feature::GraphCapture => "graph capture with allocation nodes",
            Feature::VirtualMemory => "virtual-memory management (cuMemAddressReserve/cuMemMap)",
        }
    }
}

/// The oldest driver (as `cuDriverGetVersion` reports it) that has every symbol of `f`.
pub fn min_version(f: Feature) -> CudaVersion {
    CudaVersion(match f {
        Feature::Basic => 11000,
        Feature::Uuid | Feature::GraphMemory | Feature::GraphCapture => 11040,
        Feature::VirtualMemory => 10020,
    })
}

/// The symbols memplan calls for `f`.
pub fn symbols(f: Feature) -> impl Iterator<Item = &'static str> {
    let list = match f {
        Feature::Basic => {
            "cuInit cuDriverGetVersion cuGetErrorName cuDeviceGetCount cuDeviceGet cuDeviceGetName \
             cuDeviceTotalMem_v2 cuDeviceGetAttribute cuDevicePrimaryCtxRetain \
             cuDevicePrimaryCtxRelease_v2 cuCtxSetCurrent cuCtxSynchronize cuMemGetInfo_v2 \
             cuMemAlloc_v2 cuMemFree_v2"
        }
        Feature::Uuid => "cuDeviceGetUuid_v2",
        Feature::GraphMemory => "cuDeviceGetGraphMemAttribute cuDeviceGraphMemTrim",
        Feature::GraphCapture => {
            "cuStreamCreate cuStreamDestroy_v2 cuStreamSynchronize cuStreamBeginCapture_v2 \
             cuStreamEndCapture cuStreamIsCapturing cuGraphInstantiateWithFlags cuGraphLaunch \
             cuGraphExecDestroy cuGraphDestroy cuMemAllocAsync cuMemFreeAsync cuModuleLoadData \
             cuModuleGetFunction cuModuleUnload cuLaunchKernel"
        }
        Feature::VirtualMemory => {
            "cuMemGetAllocationGranularity cuMemAddressReserve cuMemAddressFree cuMemCreate \
             cuMemRelease cuMemMap cuMemUnmap cuMemSetAccess"
        }
    };
    list.split_whitespace()
}

/// `Ok` when a driver of version `have` is new enough for `f`, else [`Error::DriverTooOld`].
pub fn check_version(have: CudaVersion, f: Feature) -> Result<()> {
    let need = min_version(f);
    if have >= need {
        Ok(())
    } else {
        Err(Error::DriverTooOld {
            have: have.to_string(),
            need: need.to_string(),
            what: f.what().to_string(),
        })
    }
}

/// What the driver reported about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaFacts {
    /// `cuDriverGetVersion`.
    pub driver_version: CudaVersion,
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`.
    pub integrated: bool,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`; `None` when unreadable.
    pub vmm_attribute: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`; `None` when unreadable.
    pub memory_pools_attribute: Option<bool>,
    /// The MIG profile when the device is a MIG instance (`1g.10gb`).
    pub mig_profile: Option<String>,
    /// Total memory, used to state the tolerance of approximate readings.
    pub total_bytes: Option<u64>,
}
