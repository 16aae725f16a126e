//! [`LevelZero`]: the loader library opened at run time and the functions memplan uses.
//!
//! Required functions (spec 1.0 core and Sysman) must all resolve or [`LevelZero::load`] fails
//! with [`LoadError::Symbol`]. Functions added in later spec versions (`zeInitDrivers` 1.10,
//! `zesInit`/`zesDriverGet`/`zesDeviceGet` 1.5) are `Option`: `None` when the installed
//! loader predates them; so is `zesDeviceProcessesGetState` (spec 1.0, but a per-process
//! reading memplan can live without, so a loader that lacks it still loads). Calling any of them is `unsafe`: the caller upholds the Level Zero
//! rules for each call (valid handles, out-pointers sized as the spec says).

use std::ffi::c_void;
use std::fmt;

use crate::result::ze_result_t;
use crate::structs::*;
use crate::types::*;

/// The loader's file name on Linux.
pub const LOADER_LIBRARY: &str = "libze_loader.so.1";

/// Why the loader could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` failed.
    Library {
        /// The file name tried.
        library: String,
        /// What the dynamic loader said.
        detail: String,
    },
    /// A required symbol is missing.
    Symbol {
        /// The library.
        library: String,
        /// The symbol.
        symbol: &'static str,
        /// What the dynamic loader said.
        detail: String,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Library { library, detail } => {
                write!(f, "could not load {library}: {detail}")
            }
            LoadError::Symbol {
                library,
                symbol,
                detail,
            } => write!(f, "{library} has no symbol `{symbol}`: {detail}"),
        }
    }
}

impl std::error::Error for LoadError {}

macro_rules! api {
    (
        required { $($r:ident : fn($($ra:ty),*);)* }
        optional { $($o:ident : fn($($oa:ty),*);)* }
    ) => {
        /// The opened loader and its resolved functions (valid as long as this value lives).
        pub struct LevelZero {
            library: String,
            $(
                #[doc = concat!("`", stringify!($r), "`")]
                pub $r: unsafe extern "C" fn($($ra),*) -> ze_result_t,
            )*
            $(
                #[doc = concat!("`", stringify!($o), "`, when the loader has it")]
                pub $o: Option<unsafe extern "C" fn($($oa),*) -> ze_result_t>,
            )*
            _lib: libloading::Library,
        }

        impl LevelZero {
            /// Open `library` (a file name searched by the dynamic loader, or a path) and
            /// resolve every function. Never panics.
            pub fn load_from(library: &str) -> Result<Self, LoadError> {
                // SAFETY: loading the Level Zero loader runs its ELF initialisers, which only
                // set up the loader's own state; the library name comes from the caller.
                let lib = unsafe { libloading::Library::new(library) }
                    .map_err(|e| LoadError::Library { library: library.to_string(), detail: e.to_string() })?;
                $(
                    // SAFETY: the symbol has this C signature in ze_api.h / zes_api.h; the
                    // pointer is copied out and stays valid while `_lib` (kept below) lives.
                    let $r = unsafe {
                        lib.get::<unsafe extern "C" fn($($ra),*) -> ze_result_t>(concat!(stringify!($r), "\0").as_bytes())
                    }
                    .map(|s| *s)
                    .map_err(|e| LoadError::Symbol {
                        library: library.to_string(),
                        symbol: stringify!($r),
                        detail: e.to_string(),
                    })?;
                )*
                $(
                    // SAFETY: as above; a missing optional symbol is `None`.
                    let $o = unsafe {
                        lib.get::<unsafe extern "C" fn($($oa),*) -> ze_result_t>(concat!(stringify!($o), "\0").as_bytes())
                    }
                    .map(|s| *s)
                    .ok();
                )*
                Ok(LevelZero { library: library.to_string(), $($r,)* $($o,)* _lib: lib })
            }
        }
    };
}

api! {
    required {
        zeInit: fn(ze_init_flags_t);
        zeDriverGet: fn(*mut u32, *mut ze_driver_handle_t);
        zeDriverGetProperties: fn(ze_driver_handle_t, *mut ze_driver_properties_t);
        zeDriverGetApiVersion: fn(ze_driver_handle_t, *mut ze_api_version_t);
        zeDeviceGet: fn(ze_driver_handle_t, *mut u32, *mut ze_device_handle_t);
        zeDeviceGetSubDevices: fn(ze_device_handle_t, *mut u32, *mut ze_device_handle_t);
        zeDeviceGetProperties: fn(ze_device_handle_t, *mut ze_device_properties_t);
        zeDeviceGetMemoryProperties: fn(ze_device_handle_t, *mut u32, *mut ze_device_memory_properties_t);
        zeContextCreate: fn(ze_driver_handle_t, *const ze_context_desc_t, *mut ze_context_handle_t);
        zeContextDestroy: fn(ze_context_handle_t);
        zeMemAllocDevice: fn(ze_context_handle_t, *const ze_device_mem_alloc_desc_t, usize, usize, ze_device_handle_t, *mut *mut c_void);
        zeMemFree: fn(ze_context_handle_t, *mut c_void);
        zeVirtualMemReserve: fn(ze_context_handle_t, *const c_void, usize, *mut *mut c_void);
        zeVirtualMemFree: fn(ze_context_handle_t, *const c_void, usize);
        zeVirtualMemQueryPageSize: fn(ze_context_handle_t, ze_device_handle_t, usize, *mut usize);
        zePhysicalMemCreate: fn(ze_context_handle_t, ze_device_handle_t, *mut ze_physical_mem_desc_t, *mut ze_physical_mem_handle_t);
        zePhysicalMemDestroy: fn(ze_context_handle_t, ze_physical_mem_handle_t);
        zeVirtualMemMap: fn(ze_context_handle_t, *const c_void, usize, ze_physical_mem_handle_t, usize, ze_memory_access_attribute_t);
        zeVirtualMemUnmap: fn(ze_context_handle_t, *const c_void, usize);
        zeVirtualMemSetAccessAttribute: fn(ze_context_handle_t, *const c_void, usize, ze_memory_access_attribute_t);
        zesDeviceGetProperties: fn(zes_device_handle_t, *mut zes_device_properties_t);
        zesDeviceEnumMemoryModules: fn(zes_device_handle_t, *mut u32, *mut zes_mem_handle_t);
        zesMemoryGetProperties: fn(zes_mem_handle_t, *mut zes_mem_properties_t);
        zesMemoryGetState: fn(zes_mem_handle_t, *mut zes_mem_state_t);
    }
    optional {
        zeInitDrivers: fn(*mut u32, *mut ze_driver_handle_t, *mut ze_init_driver_type_desc_t);
        zesInit: fn(zes_init_flags_t);
        zesDriverGet: fn(*mut u32, *mut zes_driver_handle_t);
        zesDeviceGet: fn(zes_driver_handle_t, *mut u32, *mut zes_device_handle_t);
        zesDeviceProcessesGetState: fn(zes_device_handle_t, *mut u32, *mut zes_process_state_t);
    }
}

impl LevelZero {
    /// Open [`LOADER_LIBRARY`].
    pub fn load() -> Result<Self, LoadError> {
        Self::load_from(LOADER_LIBRARY)
    }

    /// The library name this was loaded from.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Whether the Sysman `zesInit` route (spec 1.5) is available in this loader.
    pub fn has_zes_init(&self) -> bool {
        self.zesInit.is_some() && self.zesDriverGet.is_some() && self.zesDeviceGet.is_some()
    }
}

impl fmt::Debug for LevelZero {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LevelZero")
            .field("library", &self.library)
            .field("zeInitDrivers", &self.zeInitDrivers.is_some())
            .field("zesInit", &self.zesInit.is_some())
            .finish()
    }
}

/// `ZE_MAJOR_VERSION(v)`.
pub fn api_major(v: ze_api_version_t) -> u32 {
    v >> 16
}

/// `ZE_MINOR_VERSION(v)`.
pub fn api_minor(v: ze_api_version_t) -> u32 {
    v & 0xffff
}
