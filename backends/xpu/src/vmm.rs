//! Virtual memory on Level Zero: `zeVirtualMemReserve` reserves address space,
//! `zePhysicalMemCreate` + `zeVirtualMemMap` back part of it with device memory later.
//!
//! Supported when `zeVirtualMemQueryPageSize` succeeds at open (the capability records the
//! error otherwise). The granularity is the page size the driver returns for a 1 GiB request,
//! the largest page a KV cache would use: sizes and offsets that are multiples of it are
//! multiples of every smaller page size too (page sizes are powers of two). Every map and
//! unmap invalidates the cached Sysman reading. One Level Zero call per primitive: sizes,
//! offsets, overlaps, ordering and undo are the core's (`memplan_core::VirtualMemory`).

use std::ffi::c_void;

use level_zero_sys as ze;
use memplan_core::{Error, HalVirtualMemory, Result};

use crate::conv::{check, check_alloc};
use crate::device::{XpuDevice, VMM_PROBE_BYTES};

fn size_t(field: &str, v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid(field, format!("{v} does not fit in size_t")))
}

impl HalVirtualMemory for XpuDevice {
    fn granularity(&mut self) -> Result<u64> {
        let mut page = 0usize;
        // SAFETY: valid context and device; `page` is an out-parameter.
        let rc = unsafe {
            (self.rt.api.zeVirtualMemQueryPageSize)(
                self.context.0,
                self.device_handle().0,
                VMM_PROBE_BYTES,
                &mut page,
            )
        };
        check("zeVirtualMemQueryPageSize", rc)?;
        Ok(page as u64)
    }

    fn reserve(&mut self, bytes: u64) -> Result<u64> {
        let size = size_t("bytes", bytes)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid context; no placement hint (null); `ptr` is an out-parameter.
        let rc = unsafe {
            (self.rt.api.zeVirtualMemReserve)(self.context.0, std::ptr::null(), size, &mut ptr)
        };
        check_alloc("zeVirtualMemReserve", rc, bytes)?;
        Ok(ptr as u64)
    }

    unsafe fn free_range(&mut self, base: u64, bytes: u64) -> Result<()> {
        let size = size_t("bytes", bytes)?;
        // SAFETY: the caller guarantees a live, fully unmapped reservation of this context.
        check("zeVirtualMemFree", unsafe {
            (self.rt.api.zeVirtualMemFree)(self.context.0, base as *const c_void, size)
        })
    }

    fn create_physical(&mut self, bytes: u64) -> Result<u64> {
        let mut desc = ze::ze_physical_mem_desc_t::new();
        desc.size = size_t("bytes", bytes)?;
        let mut phys: ze::ze_physical_mem_handle_t = ze::null_handle();
        // SAFETY: valid context and device; `desc` initialised; `phys` is an out-parameter.
        let rc = unsafe {
            (self.rt.api.zePhysicalMemCreate)(
                self.context.0,
                self.device_handle().0,
                &mut desc,
                &mut phys,
            )
        };
        check_alloc("zePhysicalMemCreate", rc, bytes)?;
        self.invalidate();
        Ok(phys as u64)
    }

    unsafe fn destroy_physical(&mut self, physical: u64, _bytes: u64) -> Result<()> {
        let phys = physical as ze::ze_physical_mem_handle_t;
        // SAFETY: the caller guarantees physical memory of this context, mapped nowhere.
        let destroyed = check("zePhysicalMemDestroy", unsafe {
            (self.rt.api.zePhysicalMemDestroy)(self.context.0, phys)
        });
        self.invalidate();
        destroyed
    }

    unsafe fn map(&mut self, address: u64, bytes: u64, physical: u64) -> Result<()> {
        let size = size_t("bytes", bytes)?;
        // SAFETY: the caller guarantees the target lies in a live reservation of this context
        // and overlaps no mapping, and `physical` has exactly `size` bytes.
        let rc = unsafe {
            (self.rt.api.zeVirtualMemMap)(
                self.context.0,
                address as *const c_void,
                size,
                physical as ze::ze_physical_mem_handle_t,
                0,
                ze::ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE,
            )
        };
        check("zeVirtualMemMap", rc)
    }

    unsafe fn unmap(&mut self, address: u64, bytes: u64) -> Result<()> {
        let size = size_t("bytes", bytes)?;
        // SAFETY: the caller guarantees exactly one live mapping of this context.
        check("zeVirtualMemUnmap", unsafe {
            (self.rt.api.zeVirtualMemUnmap)(self.context.0, address as *const c_void, size)
        })
    }
}
