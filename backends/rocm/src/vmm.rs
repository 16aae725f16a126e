//! HIP virtual-memory management: hipMemAddressReserve, hipMemCreate + hipMemMap +
//! hipMemSetAccess, and their inverses. Only offered where the capability table says the
//! device supports it (`hipDeviceAttributeVirtualMemoryManagementSupported` and the symbols).
//!
//! The structs handed to HIP (`hipMemAllocationProp`, `hipMemLocation`, `hipMemAccessDesc`)
//! are hip-runtime-sys's; memplan only writes them, never reads an enum field back, and
//! tests/layout.rs compares their layout with the installed header.
//!
//! Ranges and mappings passed back by the caller are checked against the ones this device
//! handed out (a stale or foreign handle is an error, never a HIP call on it), a mapping may
//! not overlap a live one, and whatever is still held is released on drop.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

use hip_runtime_sys::{
    hipMemAccessDesc, hipMemAccessFlags, hipMemAllocationHandleType, hipMemAllocationProp,
    hipMemAllocationType, hipMemLocation, hipMemLocationType,
};
use memplan_core::{Error, Mapping, Result, VaRange, VirtualMemory};

use crate::conv::{check, check_alloc, GRANULARITY_MINIMUM};
use crate::loader::{Api, Handle};

/// Virtual-memory operations of one device.
pub struct RocmVmm {
    api: Arc<Api>,
    ordinal: c_int,
    /// Live reservations: base -> bytes.
    ranges: BTreeMap<u64, u64>,
    /// Live mappings: physical handle -> (address, bytes).
    mappings: BTreeMap<u64, (u64, u64)>,
}

/// The allocation properties for pinned device memory on `ordinal`.
pub fn device_prop(ordinal: c_int) -> hipMemAllocationProp {
    hipMemAllocationProp {
        type_: hipMemAllocationType::hipMemAllocationTypePinned,
        requestedHandleType: hipMemAllocationHandleType::hipMemHandleTypeNone,
        location: hipMemLocation {
            type_: hipMemLocationType::hipMemLocationTypeDevice,
            id: ordinal,
        },
        win32HandleMetaData: null_mut(),
        allocFlags: Default::default(),
    }
}

/// Read-write access for `ordinal`.
pub fn device_access(ordinal: c_int) -> hipMemAccessDesc {
    hipMemAccessDesc {
        location: hipMemLocation {
            type_: hipMemLocationType::hipMemLocationTypeDevice,
            id: ordinal,
        },
        flags: hipMemAccessFlags::hipMemAccessFlagsProtReadWrite,
    }
}

fn size(field: &str, v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid(field, format!("{v} exceeds the address space")))
}

impl RocmVmm {
    /// Operations on device `ordinal`.
    pub fn new(api: Arc<Api>, ordinal: c_int) -> Self {
        RocmVmm {
            api,
            ordinal,
            ranges: BTreeMap::new(),
            mappings: BTreeMap::new(),
        }
    }

    fn live_range(&self, range: &VaRange) -> Result<()> {
        memplan_core::device::ensure_owned(
            "range",
            "reservation",
            range.handle,
            self.ranges.get(&range.handle),
            &range.bytes,
        )
    }

    fn sym<T: Copy>(&self, f: Option<T>, name: &str) -> Result<T> {
        self.api.need(f, name, "virtual memory")
    }
}

impl VirtualMemory for RocmVmm {
    fn granularity(&mut self) -> Result<u64> {
        let f = self.sym(
            self.api.sym.hipMemGetAllocationGranularity,
            "hipMemGetAllocationGranularity",
        )?;
        self.api.set_device(self.ordinal)?;
        let prop = device_prop(self.ordinal);
        let mut g: usize = 0;
        // SAFETY: `prop` is a fully initialised hipMemAllocationProp; writes one size_t.
        let rc = unsafe {
            f(
                &mut g,
                (&prop as *const hipMemAllocationProp).cast::<c_void>(),
                GRANULARITY_MINIMUM,
            )
        };
        check("hipMemGetAllocationGranularity", rc)?;
        if g == 0 {
            return Err(Error::Measurement(
                "hipMemGetAllocationGranularity returned 0".into(),
            ));
        }
        Ok(g as u64)
    }

    fn reserve(&mut self, bytes: u64) -> Result<VaRange> {
        let g = self.granularity()?;
        let rounded = bytes
            .div_ceil(g)
            .checked_mul(g)
            .ok_or_else(|| Error::invalid("bytes", "overflows"))?;
        let f = self.sym(self.api.sym.hipMemAddressReserve, "hipMemAddressReserve")?;
        let mut p: *mut c_void = null_mut();
        let n = size("bytes", rounded)?;
        // SAFETY: writes one pointer; no fixed address requested, flags 0 as documented.
        let rc = unsafe { f(&mut p, n, 0, null_mut(), 0) };
        check_alloc("hipMemAddressReserve", rc, rounded)?;
        self.ranges.insert(p as u64, rounded);
        Ok(VaRange {
            handle: p as u64,
            bytes: rounded,
        })
    }

    fn map(&mut self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping> {
        self.live_range(range)?;
        let g = self.granularity()?;
        if !offset.is_multiple_of(g) || !bytes.is_multiple_of(g) || bytes == 0 {
            return Err(Error::invalid(
                "offset/bytes",
                format!("must be non-zero multiples of the granularity {g}"),
            ));
        }
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > range.bytes)
        {
            return Err(Error::invalid(
                "offset/bytes",
                format!("{offset}+{bytes} exceeds the range of {}", range.bytes),
            ));
        }
        let addr = range.handle + offset;
        if let Some((a, n)) = self
            .mappings
            .values()
            .copied()
            .find(|&(a, n)| a < addr + bytes && addr < a + n)
        {
            return Err(Error::invalid(
                "offset/bytes",
                format!("[{addr:#x}, +{bytes}) overlaps the live mapping [{a:#x}, +{n})"),
            ));
        }
        let create = self.sym(self.api.sym.hipMemCreate, "hipMemCreate")?;
        let map = self.sym(self.api.sym.hipMemMap, "hipMemMap")?;
        let access = self.sym(self.api.sym.hipMemSetAccess, "hipMemSetAccess")?;
        let unmap = self.sym(self.api.sym.hipMemUnmap, "hipMemUnmap")?;
        let release = self.sym(self.api.sym.hipMemRelease, "hipMemRelease")?;
        let (n, at) = (size("bytes", bytes)?, addr as usize as *mut c_void);
        let prop = device_prop(self.ordinal);
        let mut handle: Handle = null_mut();
        // SAFETY: `prop` is initialised; writes one allocation handle.
        let rc = unsafe {
            create(
                &mut handle,
                n,
                (&prop as *const hipMemAllocationProp).cast::<c_void>(),
                0,
            )
        };
        check_alloc("hipMemCreate", rc, bytes)?;
        // SAFETY: `at..at+n` lies inside the reserved range (checked above); offset into the
        // physical allocation 0 and flags 0 as documented.
        if let Err(e) = check("hipMemMap", unsafe { map(at, n, 0, handle, 0) }) {
            // SAFETY: releases the allocation just created, which is mapped nowhere.
            unsafe { release(handle) };
            return Err(e);
        }
        let desc = device_access(self.ordinal);
        // SAFETY: one initialised access descriptor for the range just mapped.
        if let Err(e) = check("hipMemSetAccess", unsafe {
            access(
                at,
                n,
                (&desc as *const hipMemAccessDesc).cast::<c_void>(),
                1,
            )
        }) {
            // SAFETY: undo the mapping and the allocation made above.
            unsafe {
                unmap(at, n);
                release(handle);
            }
            return Err(e);
        }
        self.mappings.insert(handle as u64, (addr, bytes));
        Ok(Mapping {
            handle: handle as u64,
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
        let unmap = self.sym(self.api.sym.hipMemUnmap, "hipMemUnmap")?;
        let release = self.sym(self.api.sym.hipMemRelease, "hipMemRelease")?;
        let n = size("bytes", mapping.bytes)?;
        // SAFETY: a live mapping made by `map` at this address and size (checked above).
        check("hipMemUnmap", unsafe {
            unmap(addr as usize as *mut c_void, n)
        })?;
        self.mappings.remove(&mapping.handle);
        // SAFETY: the handle came from hipMemCreate in `map`, now unmapped, released once.
        check("hipMemRelease", unsafe {
            release(mapping.handle as usize as Handle)
        })
    }

    fn release(&mut self, range: VaRange) -> Result<()> {
        self.live_range(&range)?;
        let end = range.handle + range.bytes;
        if self
            .mappings
            .values()
            .any(|&(a, _)| a >= range.handle && a < end)
        {
            return Err(Error::invalid(
                "range",
                "unmap every mapping in the range before releasing it",
            ));
        }
        let free = self.sym(self.api.sym.hipMemAddressFree, "hipMemAddressFree")?;
        // SAFETY: a live reservation from hipMemAddressReserve with no mapping left (checked
        // above), removed from the table once freed.
        check("hipMemAddressFree", unsafe {
            free(
                range.handle as usize as *mut c_void,
                size("bytes", range.bytes)?,
            )
        })?;
        self.ranges.remove(&range.handle);
        Ok(())
    }
}

impl Drop for RocmVmm {
    fn drop(&mut self) {
        if self.mappings.is_empty() && self.ranges.is_empty() {
            return;
        }
        let s = &self.api.sym;
        let (Some(unmap), Some(release), Some(free)) =
            (s.hipMemUnmap, s.hipMemRelease, s.hipMemAddressFree)
        else {
            return; // nothing was ever mapped or reserved without these
        };
        if let Err(e) = self.api.set_device(self.ordinal) {
            tracing::warn!(%e, "cannot release virtual memory");
            return;
        }
        let mut codes = Vec::new();
        for (handle, (addr, bytes)) in std::mem::take(&mut self.mappings) {
            // SAFETY: a live mapping made by `map`, unmapped once (taken out of the table).
            codes.push(("hipMemUnmap", unsafe {
                unmap(addr as usize as *mut c_void, bytes as usize)
            }));
            // SAFETY: its physical allocation from hipMemCreate, released once.
            codes.push(("hipMemRelease", unsafe {
                release(handle as usize as Handle)
            }));
        }
        for (base, bytes) in std::mem::take(&mut self.ranges) {
            // SAFETY: a live reservation of `reserve`, unmapped above, freed once.
            codes.push(("hipMemAddressFree", unsafe {
                free(base as usize as *mut c_void, bytes as usize)
            }));
        }
        for (call, rc) in codes {
            if let Err(e) = check(call, rc) {
                tracing::warn!(%e, "virtual-memory teardown");
            }
        }
    }
}
