//! Virtual-memory primitives on CUDA: `cuMemAddressReserve` / `cuMemAddressFree` for address
//! space, `cuMemCreate` / `cuMemRelease` for physical memory, `cuMemMap` + `cuMemSetAccess` /
//! `cuMemUnmap` to back part of a range with it. One driver call per primitive: sizes,
//! offsets, overlaps, ordering and undo are the core's (`memplan_core::VirtualMemory`).

use cudarc::driver::sys;
use memplan_core::{Error, HalVirtualMemory, Result};

use crate::conv::{check, check_alloc};
use crate::device::Ctx;
use crate::ffi;
use crate::loader::{Driver, Feature};

/// Virtual-memory primitives of one device.
pub(crate) struct CudaVmm {
    ctx: Ctx,
}

fn location(dev: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        __bindgen_anon_1: sys::CUmemLocation_st__bindgen_ty_1 { id: dev },
    }
}

fn properties(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: the struct is plain data (integers, a null pointer, flags) for which all-zero is
    // the documented default; the needed fields are set below.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    p.location = location(dev);
    p
}

fn size(v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid("bytes", "larger than the address space"))
}

impl CudaVmm {
    /// Check the driver and bind the context.
    pub(crate) fn new(ctx: Ctx, driver: &Driver) -> Result<Self> {
        driver.require(Feature::VirtualMemory)?;
        ctx.bind()?;
        Ok(CudaVmm { ctx })
    }
}

impl HalVirtualMemory for CudaVmm {
    fn granularity(&mut self) -> Result<u64> {
        self.ctx.bind()?;
        let prop = properties(self.ctx.dev);
        let mut g: usize = 0;
        let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: `prop` is fully initialised; `g` is a valid out-pointer.
        check("cuMemGetAllocationGranularity", unsafe {
            ffi::cuMemGetAllocationGranularity(&mut g, &prop, flag)
        })?;
        Ok(g as u64)
    }

    fn reserve(&mut self, bytes: u64) -> Result<u64> {
        self.ctx.bind()?;
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: context bound; no fixed address, default alignment, no flags.
        let res = unsafe { ffi::cuMemAddressReserve(&mut addr, size(bytes)?, 0, 0, 0) };
        check_alloc("cuMemAddressReserve", res, bytes)?;
        Ok(addr)
    }

    unsafe fn free_range(&mut self, base: u64, bytes: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees a live reservation with nothing mapped in it.
        check("cuMemAddressFree", unsafe {
            ffi::cuMemAddressFree(base, size(bytes)?)
        })
    }

    fn create_physical(&mut self, bytes: u64) -> Result<u64> {
        self.ctx.bind()?;
        let prop = properties(self.ctx.dev);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is initialised; `handle` is a valid out-pointer; the size is a
        // granularity multiple (the caller's guarantee).
        let res = unsafe { ffi::cuMemCreate(&mut handle, size(bytes)?, &prop, 0) };
        check_alloc("cuMemCreate", res, bytes)?;
        Ok(handle)
    }

    unsafe fn destroy_physical(&mut self, physical: u64, _bytes: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees a live handle from cuMemCreate, mapped nowhere.
        check("cuMemRelease", unsafe { ffi::cuMemRelease(physical) })
    }

    unsafe fn map(&mut self, address: u64, bytes: u64, physical: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees the target lies in a live reservation, overlaps no
        // live mapping, and `physical` is an unmapped handle of exactly `bytes`.
        check("cuMemMap", unsafe {
            ffi::cuMemMap(address, size(bytes)?, 0, physical, 0)
        })
    }

    unsafe fn set_access(&mut self, address: u64, bytes: u64) -> Result<()> {
        self.ctx.bind()?;
        let desc = sys::CUmemAccessDesc {
            location: location(self.ctx.dev),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped (the caller's guarantee); one descriptor.
        check("cuMemSetAccess", unsafe {
            ffi::cuMemSetAccess(address, size(bytes)?, &desc, 1)
        })
    }

    unsafe fn unmap(&mut self, address: u64, bytes: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees exactly one live mapping at this address and size.
        check("cuMemUnmap", unsafe {
            ffi::cuMemUnmap(address, size(bytes)?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_properties_name_the_device() {
        let p = properties(3);
        assert_eq!(
            p.type_,
            sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        );
        assert_eq!(
            p.location.type_,
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        // SAFETY: the union was written through its `id` field.
        assert_eq!(unsafe { p.location.__bindgen_anon_1.id }, 3);
    }
}
