//! One HIP device: its description, its declared capability, and the readings and primitive
//! operations memplan's protocol drives.
//!
//! HIP's current device is per thread, so every operation first makes this device current
//! (`hipSetDevice`). Handles are kept as integers so the device is `Send` without any claim
//! about raw pointers. Handles passed back by the caller are checked against what this device
//! handed out, so a stale or foreign handle is an error, never a HIP call on a bad pointer;
//! everything still held is released when the device is dropped.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use memplan_core::{
    Device, DeviceDescriptor, DriverMemory, Error, GraphCapture, GraphPoolMemory,
    ProfilingCapability, RawAllocation, Result, VirtualMemory,
};

use crate::capability::{declare, Declared, FreeSource, PoolAttrs};
use crate::conv::{check, check_alloc, GRAPH_MEM_ATTRS};
use crate::free::{compose, HipMemInfo};
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
    /// Live raw allocations: pointer -> bytes.
    allocations: BTreeMap<u64, u64>,
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
            allocations: BTreeMap::new(),
        })
    }
}

impl Device for RocmDevice {
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

    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        let f = match (
            self.declared.pool,
            self.api.sym.hipDeviceGetGraphMemAttribute,
        ) {
            (PoolAttrs::Real, Some(f)) => f,
            _ => return Ok(GraphPoolMemory::default()),
        };
        let mut v = [0u64; 4];
        for (slot, attr) in v.iter_mut().zip(GRAPH_MEM_ATTRS) {
            // SAFETY: the out value is a zero-initialised u64 (older runtimes write only 4
            // bytes, so the upper half must start at 0).
            let rc = unsafe { f(self.ordinal, attr, (slot as *mut u64).cast::<c_void>()) };
            check("hipDeviceGetGraphMemAttribute", rc)?;
        }
        Ok(GraphPoolMemory {
            used: Some(v[0]),
            used_high: Some(v[1]),
            reserved: Some(v[2]),
            reserved_high: Some(v[3]),
        })
    }

    fn synchronize(&mut self) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        // SAFETY: plain call, no arguments.
        check("hipDeviceSynchronize", unsafe {
            (self.api.sym.hipDeviceSynchronize)()
        })
    }

    fn allocate(&mut self, bytes: u64) -> Result<RawAllocation> {
        if bytes == 0 {
            return Err(Error::invalid(
                "bytes",
                "a raw allocation must be at least 1 byte",
            ));
        }
        let size = usize::try_from(bytes)
            .map_err(|_| Error::invalid("bytes", format!("{bytes} exceeds the address space")))?;
        self.api.set_device(self.ordinal)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: hipMalloc writes one pointer through a valid out pointer.
        let rc = unsafe { (self.api.sym.hipMalloc)(&mut p, size) };
        check_alloc("hipMalloc", rc, bytes)?;
        let handle = p as u64;
        self.allocations.insert(handle, bytes);
        Ok(RawAllocation { handle, bytes })
    }

    fn free(&mut self, allocation: RawAllocation) -> Result<()> {
        memplan_core::device::ensure_owned(
            "allocation",
            "allocation",
            allocation.handle,
            self.allocations.get(&allocation.handle),
            &allocation.bytes,
        )?;
        self.api.set_device(self.ordinal)?;
        // SAFETY: the handle came from hipMalloc in `allocate` and is still live (checked
        // above); it is removed from the table once freed.
        check("hipFree", unsafe {
            (self.api.sym.hipFree)(allocation.handle as usize as *mut c_void)
        })?;
        self.allocations.remove(&allocation.handle);
        Ok(())
    }

    fn graph_capture(&mut self) -> Result<&mut dyn GraphCapture> {
        match &self.declared.capability.facts.graph_capture {
            memplan_core::Support::Supported => Ok(&mut self.graphs),
            memplan_core::Support::Unsupported { reason } => {
                Err(Error::unsupported("graph capture", reason.clone()))
            }
        }
    }

    fn virtual_memory(&mut self) -> Result<&mut dyn VirtualMemory> {
        match &self.declared.capability.facts.virtual_memory {
            memplan_core::Support::Supported => Ok(&mut self.vmm),
            memplan_core::Support::Unsupported { reason } => {
                Err(Error::unsupported("virtual memory", reason.clone()))
            }
        }
    }
}

impl Drop for RocmDevice {
    fn drop(&mut self) {
        if self.allocations.is_empty() {
            return;
        }
        if let Err(e) = self.api.set_device(self.ordinal) {
            tracing::warn!(%e, "cannot free the raw allocations of {}", self.descriptor.id);
            return;
        }
        for (ptr, _) in std::mem::take(&mut self.allocations) {
            // SAFETY: a live allocation made by hipMalloc in `allocate`, freed once.
            let rc = unsafe { (self.api.sym.hipFree)(ptr as usize as *mut c_void) };
            if let Err(e) = check("hipFree", rc) {
                tracing::warn!(%e, "raw allocation teardown");
            }
        }
    }
}
