//! Virtual memory on Level Zero: `zeVirtualMemReserve` reserves address space,
//! `zePhysicalMemCreate` + `zeVirtualMemMap` back part of it with device memory later.
//!
//! Supported when `zeVirtualMemQueryPageSize` succeeds at open (the capability records the
//! error otherwise). The granularity is the page size the driver returns for a 1 GiB request,
//! the largest page a KV cache would use: sizes and offsets that are multiples of it are
//! multiples of every smaller page size too (page sizes are powers of two). Every map and
//! unmap invalidates the cached Sysman reading.

use std::ffi::c_void;

use level_zero_sys as ze;
use memplan_core::{Error, Mapping, Result, VaRange, VirtualMemory};

use crate::conv::{check, check_alloc};
use crate::device::{XpuDevice, VMM_PROBE_BYTES};

fn size_t(field: &str, v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid(field, format!("{v} does not fit in size_t")))
}

impl XpuDevice {
    fn page_size(&self, bytes: usize) -> Result<u64> {
        let mut page = 0usize;
        // SAFETY: valid context and device; `page` is an out-parameter.
        let rc = unsafe {
            (self.rt.api.zeVirtualMemQueryPageSize)(
                self.context.0,
                self.device_handle().0,
                bytes,
                &mut page,
            )
        };
        check("zeVirtualMemQueryPageSize", rc)?;
        match page {
            0 => Err(Error::Measurement(
                "zeVirtualMemQueryPageSize returned 0".into(),
            )),
            p => Ok(p as u64),
        }
    }

    fn aligned(&self, field: &str, v: u64) -> Result<()> {
        let g = self.page_size(VMM_PROBE_BYTES)?;
        if !v.is_multiple_of(g) {
            return Err(Error::invalid(
                field,
                format!("{v} is not a multiple of the page size {g}"),
            ));
        }
        Ok(())
    }
}

impl VirtualMemory for XpuDevice {
    fn granularity(&mut self) -> Result<u64> {
        self.page_size(VMM_PROBE_BYTES)
    }

    fn reserve(&mut self, bytes: u64) -> Result<VaRange> {
        if bytes == 0 {
            return Err(Error::invalid("bytes", "a reservation must not be empty"));
        }
        self.aligned("bytes", bytes)?;
        let size = size_t("bytes", bytes)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid context; no placement hint (null); `ptr` is an out-parameter.
        let rc = unsafe {
            (self.rt.api.zeVirtualMemReserve)(self.context.0, std::ptr::null(), size, &mut ptr)
        };
        check("zeVirtualMemReserve", rc)?;
        if ptr.is_null() {
            return Err(Error::Measurement(
                "zeVirtualMemReserve succeeded but returned a null address".into(),
            ));
        }
        self.ranges.insert(ptr as u64, bytes);
        Ok(VaRange {
            handle: ptr as u64,
            bytes,
        })
    }

    fn map(&mut self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping> {
        memplan_core::device::ensure_owned(
            "range",
            "reservation",
            range.handle,
            self.ranges.get(&range.handle),
            &range.bytes,
        )?;
        if bytes == 0
            || offset
                .checked_add(bytes)
                .is_none_or(|end| end > range.bytes)
        {
            return Err(Error::invalid(
                "bytes",
                format!(
                    "[{offset}, +{bytes}) is empty or outside the range of {}",
                    range.bytes
                ),
            ));
        }
        self.aligned("offset", offset)?;
        self.aligned("bytes", bytes)?;
        let size = size_t("bytes", bytes)?;
        let mut desc = ze::ze_physical_mem_desc_t::new();
        desc.size = size;
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
        let va = range.handle + offset;
        // SAFETY: `va..va+size` lies inside a live reservation of this context (checked above);
        // `phys` was just created with exactly `size` bytes.
        let rc = unsafe {
            (self.rt.api.zeVirtualMemMap)(
                self.context.0,
                va as *const c_void,
                size,
                phys,
                0,
                ze::ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE,
            )
        };
        if let Err(e) = check("zeVirtualMemMap", rc) {
            // SAFETY: `phys` was created above and is not mapped.
            let _ = unsafe { (self.rt.api.zePhysicalMemDestroy)(self.context.0, phys) };
            return Err(e);
        }
        self.mappings.insert(phys as u64, (va, bytes));
        self.invalidate();
        Ok(Mapping {
            handle: phys as u64,
            range: range.handle,
            offset,
            bytes,
        })
    }

    fn unmap(&mut self, mapping: Mapping) -> Result<()> {
        let va = mapping.range.wrapping_add(mapping.offset);
        memplan_core::device::ensure_owned(
            "mapping",
            "mapping",
            mapping.handle,
            self.mappings.get(&mapping.handle),
            &(va, mapping.bytes),
        )?;
        let size = size_t("bytes", mapping.bytes)?;
        // SAFETY: a live mapping of this context (checked above).
        check("zeVirtualMemUnmap", unsafe {
            (self.rt.api.zeVirtualMemUnmap)(self.context.0, va as *const c_void, size)
        })?;
        self.mappings.remove(&mapping.handle);
        let phys = mapping.handle as ze::ze_physical_mem_handle_t;
        // SAFETY: physical memory created by this device, unmapped just above.
        check("zePhysicalMemDestroy", unsafe {
            (self.rt.api.zePhysicalMemDestroy)(self.context.0, phys)
        })?;
        self.invalidate();
        Ok(())
    }

    fn release(&mut self, range: VaRange) -> Result<()> {
        memplan_core::device::ensure_owned(
            "range",
            "reservation",
            range.handle,
            self.ranges.get(&range.handle),
            &range.bytes,
        )?;
        let end = range.handle + range.bytes;
        if self
            .mappings
            .values()
            .any(|(va, _)| *va >= range.handle && *va < end)
        {
            return Err(Error::invalid(
                "range",
                "unmap every mapping in the range before releasing it",
            ));
        }
        let size = size_t("bytes", range.bytes)?;
        // SAFETY: a live, fully unmapped reservation of this context (checked above).
        check("zeVirtualMemFree", unsafe {
            (self.rt.api.zeVirtualMemFree)(self.context.0, range.handle as *const c_void, size)
        })?;
        self.ranges.remove(&range.handle);
        Ok(())
    }
}
