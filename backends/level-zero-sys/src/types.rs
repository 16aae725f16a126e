//! Handles and flag/enum constants from `ze_api.h` and `zes_api.h` (spec 1.x).
//!
//! Every C enum is a `u32` type alias plus constants: values that come from the library may be
//! newer than this crate, and an unknown value must stay representable.

use std::ptr;

/// Opaque handle behind every `*_handle_t`.
#[repr(C)]
#[derive(Debug)]
pub struct _ze_opaque {
    _private: [u8; 0],
}

/// `ze_driver_handle_t`.
pub type ze_driver_handle_t = *mut _ze_opaque;
/// `ze_device_handle_t`.
pub type ze_device_handle_t = *mut _ze_opaque;
/// `ze_context_handle_t`.
pub type ze_context_handle_t = *mut _ze_opaque;
/// `ze_physical_mem_handle_t`.
pub type ze_physical_mem_handle_t = *mut _ze_opaque;
/// `zes_driver_handle_t` (spec 1.5, `zesInit` route).
pub type zes_driver_handle_t = *mut _ze_opaque;
/// `zes_device_handle_t`. With `ZES_ENABLE_SYSMAN=1` set before `zeInit`, a core
/// `ze_device_handle_t` may be passed where this is expected.
pub type zes_device_handle_t = *mut _ze_opaque;
/// `zes_mem_handle_t`.
pub type zes_mem_handle_t = *mut _ze_opaque;

/// `ze_bool_t` (`uint8_t`).
pub type ze_bool_t = u8;
/// `ze_structure_type_t`.
pub type ze_structure_type_t = u32;
/// `zes_structure_type_t`.
pub type zes_structure_type_t = u32;
/// `zes_engine_type_flags_t`.
pub type zes_engine_type_flags_t = u32;
/// `ze_init_flags_t`.
pub type ze_init_flags_t = u32;
/// `zes_init_flags_t` (spec 1.5).
pub type zes_init_flags_t = u32;
/// `ze_init_driver_type_flags_t` (spec 1.10).
pub type ze_init_driver_type_flags_t = u32;
/// `ze_api_version_t`: major in the upper 16 bits, minor in the lower 16.
pub type ze_api_version_t = u32;
/// `ze_device_type_t`.
pub type ze_device_type_t = u32;
/// `ze_device_property_flags_t`.
pub type ze_device_property_flags_t = u32;
/// `ze_device_memory_property_flags_t`.
pub type ze_device_memory_property_flags_t = u32;
/// `ze_context_flags_t`.
pub type ze_context_flags_t = u32;
/// `ze_device_mem_alloc_flags_t`.
pub type ze_device_mem_alloc_flags_t = u32;
/// `ze_physical_mem_flags_t`.
pub type ze_physical_mem_flags_t = u32;
/// `ze_memory_access_attribute_t`.
pub type ze_memory_access_attribute_t = u32;
/// `zes_mem_type_t`.
pub type zes_mem_type_t = u32;
/// `zes_mem_loc_t`.
pub type zes_mem_loc_t = u32;
/// `zes_mem_health_t`.
pub type zes_mem_health_t = u32;

/// `ZE_INIT_FLAG_GPU_ONLY`: initialise GPU drivers only.
pub const ZE_INIT_FLAG_GPU_ONLY: ze_init_flags_t = 1;
/// `ZE_INIT_DRIVER_TYPE_FLAG_GPU` (spec 1.10).
pub const ZE_INIT_DRIVER_TYPE_FLAG_GPU: ze_init_driver_type_flags_t = 1;
/// `ZE_DEVICE_TYPE_GPU`.
pub const ZE_DEVICE_TYPE_GPU: ze_device_type_t = 1;
/// `ZE_DEVICE_PROPERTY_FLAG_INTEGRATED`: the device shares memory with the host.
pub const ZE_DEVICE_PROPERTY_FLAG_INTEGRATED: ze_device_property_flags_t = 1 << 0;
/// `ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE`: the handle is a sub-device (tile).
pub const ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE: ze_device_property_flags_t = 1 << 1;
/// `ZE_DEVICE_PROPERTY_FLAG_ECC`.
pub const ZE_DEVICE_PROPERTY_FLAG_ECC: ze_device_property_flags_t = 1 << 2;
/// `ZE_DEVICE_PROPERTY_FLAG_ONDEMANDPAGING`.
pub const ZE_DEVICE_PROPERTY_FLAG_ONDEMANDPAGING: ze_device_property_flags_t = 1 << 3;
/// `ZE_MEMORY_ACCESS_ATTRIBUTE_NONE`.
pub const ZE_MEMORY_ACCESS_ATTRIBUTE_NONE: ze_memory_access_attribute_t = 0;
/// `ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE`.
pub const ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE: ze_memory_access_attribute_t = 1;
/// `ZES_MEM_LOC_SYSTEM`: the module is system memory.
pub const ZES_MEM_LOC_SYSTEM: zes_mem_loc_t = 0;
/// `ZES_MEM_LOC_DEVICE`: the module is device-local memory.
pub const ZES_MEM_LOC_DEVICE: zes_mem_loc_t = 1;
/// `ZES_MEM_HEALTH_UNKNOWN`.
pub const ZES_MEM_HEALTH_UNKNOWN: zes_mem_health_t = 0;
/// `ZES_MEM_HEALTH_OK`.
pub const ZES_MEM_HEALTH_OK: zes_mem_health_t = 1;

/// `ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES`.
pub const ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES: ze_structure_type_t = 0x1;
/// `ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES`.
pub const ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES: ze_structure_type_t = 0x3;
/// `ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES`.
pub const ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES: ze_structure_type_t = 0x7;
/// `ZE_STRUCTURE_TYPE_CONTEXT_DESC`.
pub const ZE_STRUCTURE_TYPE_CONTEXT_DESC: ze_structure_type_t = 0xd;
/// `ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC`.
pub const ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC: ze_structure_type_t = 0x15;
/// `ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC`.
pub const ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC: ze_structure_type_t = 0x20;
/// `ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC` (spec 1.10).
pub const ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC: ze_structure_type_t = 0x0002_0021;
/// `ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES`.
pub const ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES: zes_structure_type_t = 0x1;
/// `ZES_STRUCTURE_TYPE_MEM_PROPERTIES`.
pub const ZES_STRUCTURE_TYPE_MEM_PROPERTIES: zes_structure_type_t = 0xb;
/// `ZES_STRUCTURE_TYPE_MEM_STATE`.
pub const ZES_STRUCTURE_TYPE_MEM_STATE: zes_structure_type_t = 0x1e;
/// `ZES_STRUCTURE_TYPE_PROCESS_STATE`.
pub const ZES_STRUCTURE_TYPE_PROCESS_STATE: zes_structure_type_t = 0x16;

/// `ZE_MAX_DEVICE_NAME`.
pub const ZE_MAX_DEVICE_NAME: usize = 256;
/// `ZE_MAX_DEVICE_UUID_SIZE`.
pub const ZE_MAX_DEVICE_UUID_SIZE: usize = 16;
/// `ZE_MAX_DRIVER_UUID_SIZE`.
pub const ZE_MAX_DRIVER_UUID_SIZE: usize = 16;
/// `ZES_STRING_PROPERTY_SIZE`.
pub const ZES_STRING_PROPERTY_SIZE: usize = 64;

/// The text of a NUL-terminated `char[N]` field (lossy UTF-8; stops at the first NUL or at N).
pub fn c_chars(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// A null handle, for out-parameters.
pub fn null_handle() -> *mut _ze_opaque {
    ptr::null_mut()
}
