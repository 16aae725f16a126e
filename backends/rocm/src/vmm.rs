//! HIP virtual-memory management: hipMemAddressReserve, hipMemCreate + hipMemMap +
//! hipMemSetAccess, and their inverses. Only offered where the capability table says the
//! device supports it (`hipDeviceAttributeVirtualMemoryManagementSupported` and the symbols).
//!
//! The structs handed to HIP (`hipMemAllocationProp`, `hipMemLocation`, `hipMemAccessDesc`)
//! are hip-runtime-sys's; memplan only writes them, never reads an enum field back, and
//! tests/layout.rs compares their layout with the installed header.
//!
//! One HIP call per primitive: sizes, offsets, overlaps, ordering and undo are the core's
//! (`memplan_core::VirtualMemory`), which also releases what is still held before the device
//! is dropped.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

use hip_runtime_sys::{
    hipMemAccessDesc, hipMemAccessFlags, hipMemAllocationHandleType, hipMemAllocationProp,
    hipMemAllocationType, hipMemLocation, hipMemLocationType,
};
use memplan_core::{Error, HalVirtualMemory, Result};

use crate::conv::{check, check_alloc, GRANULARITY_MINIMUM};
use crate::loader::{Api, Handle};

/// Virtual-memory primitives of one device.
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

    /// A virtual-memory symbol, made current on this device, or `Unsupported` naming it.
    fn sym<T: Copy>(&self, f: Option<T>, name: &str) -> Result<T> {
        let f = self.api.need(f, name, "virtual memory")?;
        self.api.set_device(self.ordinal)?;
        Ok(f)
    }
}

fn ptr(address: u64) -> *mut c_void {
    address as usize as *mut c_void
}

impl HalVirtualMemory for RocmVmm {
    fn granularity(&mut self) -> Result<u64> {
        let f = self.sym(
            self.api.sym.hipMemGetAllocationGranularity,
            "hipMemGetAllocationGranularity",
        )?;
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
        Ok(g as u64)
    }

    fn reserve(&mut self, bytes: u64) -> Result<u64> {
        let f = self.sym(self.api.sym.hipMemAddressReserve, "hipMemAddressReserve")?;
        let mut p: *mut c_void = null_mut();
        // SAFETY: writes one pointer; no fixed address requested, flags 0 as documented.
        let rc = unsafe { f(&mut p, size("bytes", bytes)?, 0, null_mut(), 0) };
        check_alloc("hipMemAddressReserve", rc, bytes)?;
        Ok(p as u64)
    }

    unsafe fn free_range(&mut self, base: u64, bytes: u64) -> Result<()> {
        let f = self.sym(self.api.sym.hipMemAddressFree, "hipMemAddressFree")?;
        // SAFETY: the caller guarantees a live reservation with nothing mapped in it.
        check("hipMemAddressFree", unsafe {
            f(ptr(base), size("bytes", bytes)?)
        })
    }

    fn create_physical(&mut self, bytes: u64) -> Result<u64> {
        let create = self.sym(self.api.sym.hipMemCreate, "hipMemCreate")?;
        let prop = device_prop(self.ordinal);
        let mut handle: Handle = null_mut();
        // SAFETY: `prop` is initialised; writes one allocation handle.
        let rc = unsafe {
            create(
                &mut handle,
                size("bytes", bytes)?,
                (&prop as *const hipMemAllocationProp).cast::<c_void>(),
                0,
            )
        };
        check_alloc("hipMemCreate", rc, bytes)?;
        Ok(handle as u64)
    }

    unsafe fn destroy_physical(&mut self, physical: u64, _bytes: u64) -> Result<()> {
        let release = self.sym(self.api.sym.hipMemRelease, "hipMemRelease")?;
        // SAFETY: the caller guarantees a live handle from hipMemCreate, mapped nowhere.
        check("hipMemRelease", unsafe {
            release(physical as usize as Handle)
        })
    }

    unsafe fn map(&mut self, address: u64, bytes: u64, physical: u64) -> Result<()> {
        let map = self.sym(self.api.sym.hipMemMap, "hipMemMap")?;
        // SAFETY: the caller guarantees the target lies in a live reservation and overlaps no
        // mapping, and `physical` is an unmapped handle of `bytes`; offset into the physical
        // allocation 0 and flags 0 as documented.
        check("hipMemMap", unsafe {
            map(
                ptr(address),
                size("bytes", bytes)?,
                0,
                physical as usize as Handle,
                0,
            )
        })
    }

    unsafe fn set_access(&mut self, address: u64, bytes: u64) -> Result<()> {
        let access = self.sym(self.api.sym.hipMemSetAccess, "hipMemSetAccess")?;
        let desc = device_access(self.ordinal);
        // SAFETY: one initialised access descriptor for a range just mapped (the caller's
        // guarantee).
        check("hipMemSetAccess", unsafe {
            access(
                ptr(address),
                size("bytes", bytes)?,
                (&desc as *const hipMemAccessDesc).cast::<c_void>(),
                1,
            )
        })
    }

    unsafe fn unmap(&mut self, address: u64, bytes: u64) -> Result<()> {
        let unmap = self.sym(self.api.sym.hipMemUnmap, "hipMemUnmap")?;
        // SAFETY: the caller guarantees exactly one live mapping at this address and size.
        check("hipMemUnmap", unsafe {
            unmap(ptr(address), size("bytes", bytes)?)
        })
    }
}
