//! HIP virtual-memory management: hipMemAddressReserve, hipMemCreate + hipMemMap +
//! hipMemSetAccess, and their inverses. Only offered where the capability table says the
//! device supports it (`hipDeviceAttributeVirtualMemoryManagementSupported` and the symbols).
//!
//! The structs handed to HIP (`hipMemAllocationProp`, `hipMemLocation`, `hipMemAccessDesc`)
//! are hip-runtime-sys's; memplan only writes them, never reads an enum field back, and
//! tests/layout.rs compares their layout with the installed header.

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
        RocmVmm { api, ordinal }
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
        Ok(VaRange {
            handle: p as u64,
            bytes: rounded,
        })
    }

    fn map(&mut self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping> {
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
        let create = self.sym(self.api.sym.hipMemCreate, "hipMemCreate")?;
        let map = self.sym(self.api.sym.hipMemMap, "hipMemMap")?;
        let access = self.sym(self.api.sym.hipMemSetAccess, "hipMemSetAccess")?;
        let unmap = self.sym(self.api.sym.hipMemUnmap, "hipMemUnmap")?;
        let release = self.sym(self.api.sym.hipMemRelease, "hipMemRelease")?;
        let (n, at) = (
            size("bytes", bytes)?,
            (range.handle + offset) as usize as *mut c_void,
        );
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
        Ok(Mapping {
            handle: handle as u64,
            range: range.handle,
            offset,
            bytes,
        })
    }

    fn unmap(&mut self, mapping: Mapping) -> Result<()> {
        let unmap = self.sym(self.api.sym.hipMemUnmap, "hipMemUnmap")?;
        let release = self.sym(self.api.sym.hipMemRelease, "hipMemRelease")?;
        let at = (mapping.range + mapping.offset) as usize as *mut c_void;
        // SAFETY: the mapping was made by `map` at this address and size, and is consumed.
        check("hipMemUnmap", unsafe {
            unmap(at, size("bytes", mapping.bytes)?)
        })?;
        // SAFETY: the handle came from hipMemCreate in `map`, now unmapped.
        check("hipMemRelease", unsafe {
            release(mapping.handle as usize as Handle)
        })
    }

    fn release(&mut self, range: VaRange) -> Result<()> {
        let free = self.sym(self.api.sym.hipMemAddressFree, "hipMemAddressFree")?;
        // SAFETY: the range came from hipMemAddressReserve in `reserve` and is consumed.
        check("hipMemAddressFree", unsafe {
            free(
                range.handle as usize as *mut c_void,
                size("bytes", range.bytes)?,
            )
        })
    }
}
