//! Structs from `ze_api.h` and `zes_api.h` (spec 1.x), `#[repr(C)]` and checked field by field
//! against the real headers by `tests/layout.rs`. Each struct with an `stype` has a `new()`
//! that sets it (and a null `pNext`), which is what the library expects before it fills the
//! rest. C enum fields are `u32` (see [`crate::types`]); a field named `type` in C is `type_`.

use std::ffi::c_void;

use crate::types::*;

/// `ze_device_uuid_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ze_device_uuid_t {
    /// The 16 bytes.
    pub id: [u8; ZE_MAX_DEVICE_UUID_SIZE],
}

/// `ze_driver_uuid_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ze_driver_uuid_t {
    /// The 16 bytes.
    pub id: [u8; ZE_MAX_DRIVER_UUID_SIZE],
}

/// Implements `new()`: zeroed, `stype` set, `pNext` null.
macro_rules! with_stype {
    ($t:ident, $stype:expr) => {
        impl $t {
            /// Zeroed, with `stype` set and a null `pNext`, ready to pass to the library.
            pub fn new() -> Self {
                // SAFETY: every field is an integer, a byte array or a raw pointer, for which
                // all-zero bytes are a valid value (null for the pointer).
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.stype = $stype;
                s
            }
        }
        impl Default for $t {
            fn default() -> Self {
                Self::new()
            }
        }
    };
}

/// `ze_init_driver_type_desc_t` (spec 1.10; absent from 1.4-era headers, so its layout is
/// checked against the spec's definition only).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_init_driver_type_desc_t {
    /// `ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC`.
    pub stype: ze_structure_type_t,
    /// Extension chain.
    pub pNext: *const c_void,
    /// Driver types to initialise.
    pub flags: ze_init_driver_type_flags_t,
}
with_stype!(
    ze_init_driver_type_desc_t,
    ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC
);

/// `ze_driver_properties_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_driver_properties_t {
    /// `ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES`.
    pub stype: ze_structure_type_t,
    /// Extension chain.
    pub pNext: *mut c_void,
    /// Driver UUID.
    pub uuid: ze_driver_uuid_t,
    /// Driver version (vendor-specific encoding).
    pub driverVersion: u32,
}
with_stype!(ze_driver_properties_t, ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES);

/// `ze_device_properties_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_device_properties_t {
    /// `ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES`.
    pub stype: ze_structure_type_t,
    /// Extension chain.
    pub pNext: *mut c_void,
    /// `ZE_DEVICE_TYPE_*`.
    pub type_: ze_device_type_t,
    /// PCI vendor id.
    pub vendorId: u32,
    /// PCI device id.
    pub deviceId: u32,
    /// `ZE_DEVICE_PROPERTY_FLAG_*`.
    pub flags: ze_device_property_flags_t,
    /// Sub-device id (valid with `ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE`).
    pub subdeviceId: u32,
    /// Core clock (MHz).
    pub coreClockRate: u32,
    /// Largest single allocation.
    pub maxMemAllocSize: u64,
    /// Hardware contexts.
    pub maxHardwareContexts: u32,
    /// Highest command-queue priority.
    pub maxCommandQueuePriority: u32,
    /// Threads per EU.
    pub numThreadsPerEU: u32,
    /// EU SIMD width.
    pub physicalEUSimdWidth: u32,
    /// EUs per sub-slice.
    pub numEUsPerSubslice: u32,
    /// Sub-slices per slice.
    pub numSubslicesPerSlice: u32,
    /// Slices.
    pub numSlices: u32,
    /// Timer resolution.
    pub timerResolution: u64,
    /// Valid timestamp bits.
    pub timestampValidBits: u32,
    /// Valid kernel timestamp bits.
    pub kernelTimestampValidBits: u32,
    /// Device UUID (the key that matches Sysman devices to core devices).
    pub uuid: ze_device_uuid_t,
    /// NUL-terminated device name.
    pub name: [u8; ZE_MAX_DEVICE_NAME],
}
with_stype!(ze_device_properties_t, ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES);

/// `ze_device_memory_properties_t`: one memory of a device.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_device_memory_properties_t {
    /// `ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES`.
    pub stype: ze_structure_type_t,
    /// Extension chain.
    pub pNext: *mut c_void,
    /// Flags.
    pub flags: ze_device_memory_property_flags_t,
    /// Clock (MHz).
    pub maxClockRate: u32,
    /// Bus width (bits).
    pub maxBusWidth: u32,
    /// Bytes.
    pub totalSize: u64,
    /// NUL-terminated name ("HBM", "DDR").
    pub name: [u8; ZE_MAX_DEVICE_NAME],
}
with_stype!(
    ze_device_memory_properties_t,
    ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES
);

/// `ze_context_desc_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_context_desc_t {
    /// `ZE_STRUCTURE_TYPE_CONTEXT_DESC`.
    pub stype: ze_structure_type_t,
    /// Extension chain.
    pub pNext: *const c_void,
    /// Flags (0).
    pub flags: ze_context_flags_t,
}
with_stype!(ze_context_desc_t, ZE_STRUCTURE_TYPE_CONTEXT_DESC);

/// `ze_device_mem_alloc_desc_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_device_mem_alloc_desc_t {
    /// `ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC`.
    pub stype: ze_structure_type_t,
    /// Extension chain.
    pub pNext: *const c_void,
    /// Flags (0).
    pub flags: ze_device_mem_alloc_flags_t,
    /// Memory ordinal (index into `zeDeviceGetMemoryProperties`).
    pub ordinal: u32,
}
with_stype!(
    ze_device_mem_alloc_desc_t,
    ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC
);

/// `ze_physical_mem_desc_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_physical_mem_desc_t {
    /// `ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC`.
    pub stype: ze_structure_type_t,
    /// Extension chain.
    pub pNext: *const c_void,
    /// Flags (0).
    pub flags: ze_physical_mem_flags_t,
    /// Bytes (a multiple of the page size from `zeVirtualMemQueryPageSize`).
    pub size: usize,
}
with_stype!(ze_physical_mem_desc_t, ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC);

/// `zes_device_properties_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zes_device_properties_t {
    /// `ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES`.
    pub stype: zes_structure_type_t,
    /// Extension chain.
    pub pNext: *mut c_void,
    /// Core properties (its `uuid` matches the core device).
    pub core: ze_device_properties_t,
    /// Sub-devices.
    pub numSubdevices: u32,
    /// Serial number.
    pub serialNumber: [u8; ZES_STRING_PROPERTY_SIZE],
    /// Board number.
    pub boardNumber: [u8; ZES_STRING_PROPERTY_SIZE],
    /// Brand.
    pub brandName: [u8; ZES_STRING_PROPERTY_SIZE],
    /// Model.
    pub modelName: [u8; ZES_STRING_PROPERTY_SIZE],
    /// Vendor.
    pub vendorName: [u8; ZES_STRING_PROPERTY_SIZE],
    /// Driver version string.
    pub driverVersion: [u8; ZES_STRING_PROPERTY_SIZE],
}
with_stype!(
    zes_device_properties_t,
    ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES
);

/// `zes_mem_properties_t`: one memory module.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zes_mem_properties_t {
    /// `ZES_STRUCTURE_TYPE_MEM_PROPERTIES`.
    pub stype: zes_structure_type_t,
    /// Extension chain.
    pub pNext: *mut c_void,
    /// `ZES_MEM_TYPE_*`.
    pub type_: zes_mem_type_t,
    /// Whether the module belongs to a sub-device.
    pub onSubdevice: ze_bool_t,
    /// Its sub-device id.
    pub subdeviceId: u32,
    /// `ZES_MEM_LOC_SYSTEM` or `ZES_MEM_LOC_DEVICE`.
    pub location: zes_mem_loc_t,
    /// Physical bytes (0 when unknown).
    pub physicalSize: u64,
    /// Bus width (-1 when unknown).
    pub busWidth: i32,
    /// Channels (-1 when unknown).
    pub numChannels: i32,
}
with_stype!(zes_mem_properties_t, ZES_STRUCTURE_TYPE_MEM_PROPERTIES);

/// `zes_mem_state_t`: free and total bytes of one module.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zes_mem_state_t {
    /// `ZES_STRUCTURE_TYPE_MEM_STATE`.
    pub stype: zes_structure_type_t,
    /// Extension chain.
    pub pNext: *const c_void,
    /// `ZES_MEM_HEALTH_*`.
    pub health: zes_mem_health_t,
    /// Free bytes.
    pub free: u64,
    /// Allocatable bytes.
    pub size: u64,
}
with_stype!(zes_mem_state_t, ZES_STRUCTURE_TYPE_MEM_STATE);

/// `zes_process_state_t`: one host process using the device (`zesDeviceProcessesGetState`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zes_process_state_t {
    /// `ZES_STRUCTURE_TYPE_PROCESS_STATE`.
    pub stype: zes_structure_type_t,
    /// Extension chain.
    pub pNext: *const c_void,
    /// Host OS process id.
    pub processId: u32,
    /// Device memory this process allocated (not necessarily resident at the time).
    pub memSize: u64,
    /// Shared device memory mapped into this process.
    pub sharedSize: u64,
    /// `ZES_ENGINE_TYPE_FLAG_*` the process uses.
    pub engines: zes_engine_type_flags_t,
}
with_stype!(zes_process_state_t, ZES_STRUCTURE_TYPE_PROCESS_STATE);
