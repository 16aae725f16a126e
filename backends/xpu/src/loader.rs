//! Loading `libze_loader.so.1` and initialising Level Zero for GPUs only.
//!
//! [`init`] opens the loader (a missing file is [`Error::LibraryNotFound`], a missing symbol
//! [`Error::MissingSymbol`]), initialises GPU drivers (`zeInitDrivers` with
//! `ZE_INIT_DRIVER_TYPE_FLAG_GPU` when the loader has it, otherwise
//! `zeInit(ZE_INIT_FLAG_GPU_ONLY)`; always `zeInit` when the process was started with
//! `ZES_ENABLE_SYSMAN=1`, the documented way to enable Sysman on core handles), enumerates
//! drivers and their root devices, and finds the Sysman route. A failing call is an
//! [`Error::DriverCall`] with the loader's own result code by name.
//!
//! The library name can be overridden with `MEMPLAN_LEVEL_ZERO_LOADER` (a file name or path),
//! for installations outside the linker's search path and to test the "no loader" path.

use level_zero_sys as ze;
use memplan_core::{BackendKind, Error, Result};

use crate::conv::{check, uuid_string};
use crate::sysman::Route;

/// Environment variable that overrides the loader's file name (read, never written).
pub const LIBRARY_ENV: &str = "MEMPLAN_LEVEL_ZERO_LOADER";

/// The loader file name to open: `MEMPLAN_LEVEL_ZERO_LOADER`, or `libze_loader.so.1`.
pub fn library_name() -> String {
    std::env::var(LIBRARY_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| ze::LOADER_LIBRARY.to_string())
}

/// A Level Zero handle that may cross threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle(pub *mut ze::_ze_opaque);

// SAFETY: Level Zero handles are opaque driver-owned identifiers; the spec makes every call
// used here free-threaded (only command lists, which this backend does not use, are not).
unsafe impl Send for Handle {}
// SAFETY: as above; sharing a handle only lets other threads pass it to thread-safe calls.
unsafe impl Sync for Handle {}

/// One root GPU device as enumerated.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CoreDevice {
    /// Its driver.
    pub driver: Handle,
    /// The device.
    pub device: Handle,
    /// Name.
    pub name: String,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// PCI device id.
    pub device_id: u32,
    /// UUID.
    pub uuid: [u8; 16],
    /// `ZE_DEVICE_PROPERTY_FLAG_INTEGRATED`.
    pub integrated: bool,
    /// Sub-devices (tiles).
    pub sub_devices: u32,
    /// (name, totalSize) per memory of the device.
    pub memories: Vec<(String, u64)>,
    /// Driver version (vendor encoding).
    pub driver_version: u32,
    /// API version the driver supports.
    pub api_version: ze::ze_api_version_t,
}

impl CoreDevice {
    /// Total device memory from the core properties (sum over its memories); `None` when the
    /// driver lists none.
    pub fn core_total(&self) -> Option<u64> {
        if self.memories.is_empty() {
            None
        } else {
            Some(
                self.memories
                    .iter()
                    .map(|(_, b)| *b)
                    .fold(0u64, u64::saturating_add),
            )
        }
    }

    /// The UUID as text.
    pub fn uuid_text(&self) -> String {
        uuid_string(&self.uuid)
    }
}

/// The initialised library: its functions, root GPU devices and Sysman route.
#[derive(Debug)]
#[non_exhaustive]
pub struct Runtime {
    /// The loader.
    pub api: ze::LevelZero,
    /// Root GPU devices in enumeration order (the ordinal is the index).
    pub devices: Vec<CoreDevice>,
    /// How Sysman is reached (or why not).
    pub sysman: Route,
}

/// Call a count-then-fill enumeration (`pCount` in, array out) and return the array.
pub(crate) fn enumerate<T: Copy>(
    call: &str,
    fill: T,
    mut f: impl FnMut(*mut u32, *mut T) -> ze::ze_result_t,
) -> Result<Vec<T>> {
    let mut n = 0u32;
    check(call, f(&mut n, std::ptr::null_mut()))?;
    let mut v = vec![fill; n as usize];
    if n > 0 {
        check(call, f(&mut n, v.as_mut_ptr()))?;
        v.truncate(n as usize);
    }
    Ok(v)
}

fn load_error(e: ze::LoadError) -> Error {
    match e {
        ze::LoadError::Library { library, detail } => Error::LibraryNotFound { library, detail },
        ze::LoadError::Symbol {
            library,
            symbol,
            detail,
        } => Error::MissingSymbol {
            library,
            symbol: symbol.into(),
            detail,
        },
    }
}

fn init_drivers(api: &ze::LevelZero) -> Result<Vec<Handle>> {
    let env_sysman = crate::sysman::env_enabled();
    let handles = match api.zeInitDrivers {
        Some(init_drivers) if !env_sysman => {
            let mut desc = ze::ze_init_driver_type_desc_t::new();
            desc.flags = ze::ZE_INIT_DRIVER_TYPE_FLAG_GPU;
            enumerate(
                "zeInitDrivers(ZE_INIT_DRIVER_TYPE_FLAG_GPU)",
                ze::null_handle(),
                |n, p| {
                    // SAFETY: count-then-fill protocol of zeInitDrivers; `desc` is a valid
                    // descriptor and the array has `*n` elements when non-null.
                    unsafe { init_drivers(n, p, &mut desc) }
                },
            )?
        }
        _ => {
            // SAFETY: zeInit takes flags only; it may be called more than once.
            check("zeInit(ZE_INIT_FLAG_GPU_ONLY)", unsafe {
                (api.zeInit)(ze::ZE_INIT_FLAG_GPU_ONLY)
            })?;
            enumerate("zeDriverGet", ze::null_handle(), |n, p| {
                // SAFETY: count-then-fill protocol of zeDriverGet.
                unsafe { (api.zeDriverGet)(n, p) }
            })?
        }
    };
    Ok(handles.into_iter().map(Handle).collect())
}

fn describe(api: &ze::LevelZero, driver: Handle, device: Handle) -> Result<Option<CoreDevice>> {
    let mut p = ze::ze_device_properties_t::new();
    // SAFETY: valid device handle from zeDeviceGet; `p` is an initialised out-struct.
    check("zeDeviceGetProperties", unsafe {
        (api.zeDeviceGetProperties)(device.0, &mut p)
    })?;
    if p.type_ != ze::ZE_DEVICE_TYPE_GPU {
        return Ok(None);
    }
    let fill = ze::ze_device_memory_properties_t::new();
    let mems = enumerate("zeDeviceGetMemoryProperties", fill, |n, m| {
        // SAFETY: count-then-fill protocol; every element is initialised with its stype.
        unsafe { (api.zeDeviceGetMemoryProperties)(device.0, n, m) }
    })?;
    let mut sub = 0u32;
    // SAFETY: count query only (null array).
    check("zeDeviceGetSubDevices", unsafe {
        (api.zeDeviceGetSubDevices)(device.0, &mut sub, std::ptr::null_mut())
    })?;
    let mut dp = ze::ze_driver_properties_t::new();
    // SAFETY: valid driver handle; initialised out-struct.
    check("zeDriverGetProperties", unsafe {
        (api.zeDriverGetProperties)(driver.0, &mut dp)
    })?;
    let mut version: ze::ze_api_version_t = 0;
    // SAFETY: valid driver handle; plain integer out-parameter.
    check("zeDriverGetApiVersion", unsafe {
        (api.zeDriverGetApiVersion)(driver.0, &mut version)
    })?;
    Ok(Some(CoreDevice {
        driver,
        device,
        name: ze::c_chars(&p.name),
        vendor_id: p.vendorId,
        device_id: p.deviceId,
        uuid: p.uuid.id,
        integrated: p.flags & ze::ZE_DEVICE_PROPERTY_FLAG_INTEGRATED != 0,
        sub_devices: sub,
        memories: mems
            .iter()
            .map(|m| (ze::c_chars(&m.name), m.totalSize))
            .collect(),
        driver_version: dp.driverVersion,
        api_version: version,
    }))
}

/// Open the loader named `library`, initialise GPU drivers and enumerate root GPU devices.
pub fn init(library: &str) -> Result<Runtime> {
    let api = ze::LevelZero::load_from(library).map_err(load_error)?;
    let drivers = init_drivers(&api)?;
    if drivers.is_empty() {
        return Err(Error::BackendUnavailable {
            backend: BackendKind::Xpu,
            reason: format!(
                "{library} found no Level Zero GPU driver (is intel-level-zero-gpu installed?)"
            ),
        });
    }
    let mut devices = Vec::new();
    for d in drivers {
        let handles = enumerate("zeDeviceGet", ze::null_handle(), |n, p| {
            // SAFETY: count-then-fill protocol of zeDeviceGet on a driver handle from init.
            unsafe { (api.zeDeviceGet)(d.0, n, p) }
        })?;
        for h in handles {
            devices.extend(describe(&api, d, Handle(h))?);
        }
    }
    let sysman = Route::discover(&api);
    tracing::debug!(library, devices = devices.len(), sysman = %sysman, "level zero initialised");
    Ok(Runtime {
        api,
        devices,
        sysman,
    })
}
