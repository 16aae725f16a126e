//! Virtual-memory management on CUDA: `cuMemAddressReserve` reserves address space,
//! `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` back part of it with device memory, and
//! `cuMemUnmap` + `cuMemRelease` / `cuMemAddressFree` undo both.
//!
//! Sizes and offsets must be multiples of the granularity (`cuMemGetAllocationGranularity`,
//! minimum); a violation is an `InvalidInput` naming the field, checked before any call. Every
//! range and mapping still live when the device is dropped is released by [`CudaVmm::teardown`].

use std::collections::BTreeMap;

use cudarc::driver::sys;
use memplan_core::{Error, Mapping, Result, VaRange, VirtualMemory};

use crate::conv::{check, check_alloc};
use crate::device::Ctx;
use crate::ffi;
use crate::loader::{Driver, Feature};

/// Virtual-memory state of one device.
pub(crate) struct CudaVmm {
    ctx: Ctx,
    granularity: Option<u64>,
    ranges: BTreeMap<u64, u64>,
    /// physical handle -> (address, bytes)
    mappings: BTreeMap<u64, (u64, u64)>,
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

/// Check that `value` (named `field`) is a positive multiple of `granularity`.
pub fn check_multiple(field: &str, value: u64, granularity: u64, allow_zero: bool) -> Result<()> {
    if value == 0 && !allow_zero {
        return Err(Error::invalid(field, "must be > 0"));
    }
    if granularity == 0 || !value.is_multiple_of(granularity) {
        return Err(Error::invalid(
            field,
            format!("{value} is not a multiple of the granularity {granularity}"),
        ));
    }
    Ok(())
}

/// The first of `live` mappings (address, bytes) that overlaps `[addr, addr + bytes)`.
pub fn overlapping<'a>(
    live: impl IntoIterator<Item = &'a (u64, u64)>,
    addr: u64,
    bytes: u64,
) -> Option<(u64, u64)> {
    let end = addr.saturating_add(bytes);
    live.into_iter()
        .copied()
        .find(|&(a, n)| a < end && addr < a.saturating_add(n))
}

fn size(v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid("bytes", "larger than the address space"))
}

impl CudaVmm {
    /// Check the driver and bind the context.
    pub(crate) fn new(ctx: Ctx, driver: &Driver) -> Result<Self> {
        driver.require(Feature::VirtualMemory)?;
        ctx.bind()?;
        Ok(CudaVmm {
            ctx,
            granularity: None,
            ranges: BTreeMap::new(),
            mappings: BTreeMap::new(),
        })
    }

    /// Unmap and release everything still live. Errors are logged: this runs on drop.
    pub(crate) fn teardown(&mut self) {
        let mut errors = Vec::new();
        for (handle, (addr, bytes)) in std::mem::take(&mut self.mappings) {
            errors.extend(unmap_release(handle, addr, bytes).err());
        }
        for (addr, bytes) in std::mem::take(&mut self.ranges) {
            // SAFETY: reserved by `reserve`, freed once (taken out of the map).
            errors.extend(
                check("cuMemAddressFree", unsafe {
                    ffi::cuMemAddressFree(addr, bytes as usize)
                })
                .err(),
            );
        }
        for e in errors {
            tracing::warn!("virtual-memory teardown: {e}");
        }
    }
}

fn unmap_release(handle: u64, addr: u64, bytes: u64) -> Result<()> {
    // SAFETY: `addr..addr+bytes` was mapped by `map` and is unmapped once.
    let a = check("cuMemUnmap", unsafe {
        ffi::cuMemUnmap(addr, bytes as usize)
    });
    // SAFETY: `handle` came from cuMemCreate and is released once.
    let b = check("cuMemRelease", unsafe { ffi::cuMemRelease(handle) });
    a.and(b)
}

impl VirtualMemory for CudaVmm {
    fn granularity(&mut self) -> Result<u64> {
        if let Some(g) = self.granularity {
            return Ok(g);
        }
        self.ctx.bind()?;
        let prop = properties(self.ctx.dev);
        let mut g: usize = 0;
        let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: `prop` is fully initialised; `g` is a valid out-pointer.
        check("cuMemGetAllocationGranularity", unsafe {
            ffi::cuMemGetAllocationGranularity(&mut g, &prop, flag)
        })?;
        let g = g as u64;
        self.granularity = Some(g);
        Ok(g)
    }

    fn reserve(&mut self, bytes: u64) -> Result<VaRange> {
        check_multiple("bytes", bytes, self.granularity()?, false)?;
        self.ctx.bind()?;
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: context bound; no fixed address, default alignment, no flags.
        let res = unsafe { ffi::cuMemAddressReserve(&mut addr, size(bytes)?, 0, 0, 0) };
        check_alloc("cuMemAddressReserve", res, bytes)?;
        self.ranges.insert(addr, bytes);
        Ok(VaRange {
            handle: addr,
            bytes,
        })
    }

    fn map(&mut self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping> {
        let g = self.granularity()?;
        memplan_core::device::ensure_owned(
            "range",
            "reservation",
            range.handle,
            self.ranges.get(&range.handle),
            &range.bytes,
        )?;
        check_multiple("offset", offset, g, true)?;
        check_multiple("bytes", bytes, g, false)?;
        if !matches!(offset.checked_add(bytes), Some(end) if end <= range.bytes) {
            return Err(Error::invalid(
                "bytes",
                format!(
                    "offset {offset} + {bytes} exceeds the range of {}",
                    range.bytes
                ),
            ));
        }
        let addr = range.handle + offset;
        if let Some((a, n)) = overlapping(self.mappings.values(), addr, bytes) {
            return Err(Error::invalid(
                "offset",
                format!(
                    "[{addr:#x}, +{bytes}) overlaps the live mapping [{a:#x}, +{n}); unmap it first"
                ),
            ));
        }
        self.ctx.bind()?;
        let prop = properties(self.ctx.dev);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let len = size(bytes)?;
        // SAFETY: `prop` is initialised; `handle` is a valid out-pointer; size is a granularity multiple.
        let res = unsafe { ffi::cuMemCreate(&mut handle, len, &prop, 0) };
        check_alloc("cuMemCreate", res, bytes)?;
        // SAFETY: the target lies inside a live reservation and overlaps no live mapping
        // (both checked above).
        if let Err(e) = check("cuMemMap", unsafe {
            ffi::cuMemMap(addr, len, 0, handle, 0)
        }) {
            // SAFETY: the handle was created above and is mapped nowhere. Nothing is unmapped:
            // the failed map mapped nothing, and the address may belong to someone else.
            let _ = unsafe { ffi::cuMemRelease(handle) };
            return Err(e);
        }
        let desc = sys::CUmemAccessDesc {
            location: location(self.ctx.dev),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one descriptor is passed.
        if let Err(e) = check("cuMemSetAccess", unsafe {
            ffi::cuMemSetAccess(addr, len, &desc, 1)
        }) {
            // SAFETY: undoing exactly this call's own map and create on its error path.
            unsafe {
                let _ = ffi::cuMemUnmap(addr, len);
                let _ = ffi::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.mappings.insert(handle, (addr, bytes));
        Ok(Mapping {
            handle,
            range: range.handle,
            offset,
            bytes,
        })
    }

    fn unmap(&mut self, mapping: Mapping) -> Result<()> {
        let addr = mapping.range.wrapping_add(mapping.offset);
        memplan_core::device::ensure_owned(
            "mapping",
            "mapping",
            mapping.handle,
            self.mappings.get(&mapping.handle),
            &(addr, mapping.bytes),
        )?;
        self.ctx.bind()?;
        // SAFETY: a live mapping made by `map` at this address and size (checked above).
        // When unmapping fails the mapping stays tracked (and its handle unreleased), so its
        // range is not freed under it and teardown tries again.
        check("cuMemUnmap", unsafe {
            ffi::cuMemUnmap(addr, mapping.bytes as usize)
        })?;
        self.mappings.remove(&mapping.handle);
        // SAFETY: the handle came from cuMemCreate, is now unmapped, and is released once.
        check("cuMemRelease", unsafe { ffi::cuMemRelease(mapping.handle) })
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
            .any(|(a, _)| *a >= range.handle && *a < end)
        {
            return Err(Error::invalid(
                "range",
                "unmap every mapping in the range before releasing it",
            ));
        }
        self.ctx.bind()?;
        // SAFETY: a live reservation with no mappings left, freed once (removed below).
        check("cuMemAddressFree", unsafe {
            ffi::cuMemAddressFree(range.handle, range.bytes as usize)
        })?;
        self.ranges.remove(&range.handle);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_must_be_granularity_multiples() {
        let g = 2 << 20;
        assert!(check_multiple("bytes", 4 << 20, g, false).is_ok());
        let e = check_multiple("bytes", (4 << 20) + 1, g, false).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidInput { field, .. } if field == "bytes"),
            "{e}"
        );
        assert!(check_multiple("bytes", 0, g, false).is_err());
        assert!(check_multiple("offset", 0, g, true).is_ok());
        assert!(check_multiple("offset", 1, 0, true).is_err());
    }

    #[test]
    fn overlap_of_mappings() {
        let live = [(100, 10), (200, 50)];
        assert_eq!(overlapping(&live, 100, 10), Some((100, 10)));
        assert_eq!(overlapping(&live, 105, 100), Some((100, 10)));
        assert_eq!(overlapping(&live, 190, 11), Some((200, 50)));
        assert_eq!(
            overlapping(&live, 110, 90),
            None,
            "touching ends do not overlap"
        );
        assert_eq!(overlapping(&live, 250, 10), None);
    }

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
