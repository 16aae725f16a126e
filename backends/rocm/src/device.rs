//! One HIP device: its description, its declared capability, and the readings and primitive
//! operations memplan's protocol drives.
//!
//! HIP's current device is per thread, so every operation first makes this device current
//! (`hipSetDevice`). Handles are kept as integers so the device is `Send` without any claim
//! about raw pointers. The core (`memplan_core::Device`) checks every handle passed back and
//! releases what is still held; this backend only makes the HIP calls.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use memplan_core::{
    DeviceDescriptor, DeviceWideMemory, DriverMemory, Error, GraphPoolMemory, HalDevice, HalGraphs,
    HalVirtualMemory, ProfilingCapability, Result,
};

use crate::capability::{declare, Declared, FreeSource, PoolAttrs};
use crate::conv::{check, check_alloc, GRAPH_MEM_ATTRS};
use crate::free::{compose, device_wide, HipMemInfo};
use crate::graph::RocmGraphs;
use crate::loader::Api;
use crate::probe::probe;
use crate::sysfs::{DrmCard, SysRoot};
use crate::vmm::RocmVmm;

/// An opened HIP device.
pub struct RocmDevice {
    api: Arc<Api>,
    ordinal: c_int,
    descriptor: DeviceDescriptor,
    declared: Declared,
    drm: Option<DrmCard>,
    sys: SysRoot,
    graphs: RocmGraphs,
    vmm: RocmVmm,
}

impl RocmDevice {
    /// Open device `ordinal`: probe it and declare its capability from [`crate::capability::RULES`].
    pub fn open(api: Arc<Api>, ordinal: c_int, sys: SysRoot) -> Result<Self> {
        let p = probe(&api, ordinal, &sys)?;
        let declared = declare(&p.inputs);
        tracing::debug!(device = ordinal, free = ?declared.free, pool = ?declared.pool, "declared capability");
        Ok(RocmDevice {
            graphs: RocmGraphs::new(api.clone(), ordinal),
            vmm: RocmVmm::new(api.clone(), ordinal),
            api,
            ordinal,
            descriptor: p.descriptor,
            declared,
            drm: p.drm,
            sys,
        })
    }
}

impl HalDevice for RocmDevice {
    fn descriptor(&self) -> &DeviceDescriptor {
        &self.descriptor
    }

    fn capabilities(&self) -> &ProfilingCapability {
        &self.declared.capability
    }

    fn driver_memory(&mut self) -> Result<DriverMemory> {
        self.api.set_device(self.ordinal)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t through valid pointers.
        check("hipMemGetInfo", unsafe {
            (self.api.sym.hipMemGetInfo)(&mut free, &mut total)
        })?;
        let hip = HipMemInfo {
            total: total as u64,
            free: free as u64,
        };
        let source = self.declared.free;
        let drm = match source {
            FreeSource::HipAndDrm | FreeSource::HostBounded => {
                self.drm.as_ref().and_then(|c| c.read())
            }
            _ => None,
        };
        let host = (source == FreeSource::HostBounded)
            .then(|| self.sys.host_memory())
            .flatten();
        Ok(compose(source, hip, drm, host))
    }

    fn device_wide_memory(&mut self) -> Result<DeviceWideMemory> {
        let integrated = self.declared.capability.facts.unified_memory;
        let drm = self.drm.as_ref().and_then(|c| c.read());
        let host = integrated.then(|| self.sys.host_memory()).flatten();
        let d = device_wide(integrated, drm, host);
        if d.available.is_none() && (self.drm.is_some() || integrated) {
            tracing::warn!("DRM sysfs / host meminfo unreadable: device-wide reading left absent");
        }
        Ok(d)
    }

    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        let f = match (
            self.declared.pool,
            self.api.sym.hipDeviceGetGraphMemAttribute,
        ) {
            (PoolAttrs::Real, Some(f)) => f,
            _ => return Ok(GraphPoolMemory::default()),
        };
        let mut v = [None; 4];
        for (slot, attr) in v.iter_mut().zip(GRAPH_MEM_ATTRS) {
            let mut value = 0u64;
            // SAFETY: the out value is a zero-initialised u64 (older runtimes write only 4
            // bytes, so the upper half must start at 0).
            let rc = unsafe {
                f(
                    self.ordinal,
                    attr,
                    (&mut value as *mut u64).cast::<c_void>(),
                )
            };
            // One attribute that cannot be read is absent, not 0 and not the end of the
            // snapshot: the others stay.
            match check("hipDeviceGetGraphMemAttribute", rc) {
                Ok(()) => *slot = Some(value),
                Err(e) => tracing::warn!(attribute = attr, "{e}: reading left absent"),
            }
        }
        Ok(GraphPoolMemory::new(v[0], v[2]).with_high_water(v[1], v[3]))
    }

    fn synchronize(&mut self) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        // SAFETY: plain call, no arguments.
        check("hipDeviceSynchronize", unsafe {
            (self.api.sym.hipDeviceSynchronize)()
        })
    }

    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        let size = usize::try_from(bytes)
            .map_err(|_| Error::invalid("bytes", format!("{bytes} exceeds the address space")))?;
        self.api.set_device(self.ordinal)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: hipMalloc writes one pointer through a valid out pointer.
        let rc = unsafe { (self.api.sym.hipMalloc)(&mut p, size) };
        check_alloc("hipMalloc", rc, bytes)?;
        Ok(p as u64)
    }

    unsafe fn free(&mut self, address: u64, _bytes: u64) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        // SAFETY: the caller guarantees a live pointer from hipMalloc in `allocate`.
        check("hipFree", unsafe {
            (self.api.sym.hipFree)(address as usize as *mut c_void)
        })
    }

    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        Ok(&mut self.graphs)
    }

    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        Ok(&mut self.vmm)
    }
}
