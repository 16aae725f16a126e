//! Free device memory through Sysman, the only place Level Zero reports it.
//!
//! Two routes, chosen once per process ([`Route::discover`]):
//! - **`ZES_ENABLE_SYSMAN=1`** in the environment *before* the process starts: `zeInit`
//!   then enables Sysman on core handles, and a core device handle is used as the Sysman
//!   device. Preferred when set, because it needs no matching.
//! - **`zesInit`** (spec 1.5+ loaders): Sysman gets its own drivers and devices, matched to
//!   core devices by UUID (`zes_device_properties_t.core.uuid`).
//!
//! With neither (Debian bookworm's loader 1.8.12 has no `zesInit`; the variable unset),
//! free memory is unavailable and the reason tells the user to start the engine with
//! `ZES_ENABLE_SYSMAN=1`. memplan never sets the variable itself: changing the process
//! environment behind the engine's back would change how every other Level Zero user in
//! the process initialises.
//!
//! A Sysman memory read costs ~150 ms on some drivers. [`SysmanMemory`] caches the reading
//! until [`SysmanMemory::invalidate`] (called by the device at synchronize, allocate, free and
//! mapping changes, i.e. at the start of every snapshot), so one snapshot pays once.

use level_zero_sys as ze;
use memplan_core::Result;
use std::fmt;

use crate::conv::{check, result_name, translate, ModuleReading, SysmanFree};
use crate::facts::SysmanProcesses;
use crate::loader::{enumerate, CoreDevice, Handle};

/// The environment variable that enables Sysman on core handles (read, never written).
pub const ENABLE_ENV: &str = "ZES_ENABLE_SYSMAN";

/// Whether the process was started with `ZES_ENABLE_SYSMAN=1`.
pub fn env_enabled() -> bool {
    std::env::var(ENABLE_ENV)
        .map(|v| v.trim() == "1")
        .unwrap_or(false)
}

/// How Sysman is reached in this process.
#[derive(Debug)]
pub enum Route {
    /// `ZES_ENABLE_SYSMAN=1`: core handles are Sysman handles.
    EnvVar,
    /// `zesInit`: Sysman devices with their core UUIDs.
    ZesInit {
        /// (core UUID, Sysman device).
        devices: Vec<([u8; 16], Handle)>,
    },
    /// Not reachable.
    Off {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::EnvVar => write!(f, "{ENABLE_ENV}=1 (core handles)"),
            Route::ZesInit { devices } => write!(
                f,
                "zesInit ({} Sysman device(s), matched by UUID)",
                devices.len()
            ),
            Route::Off { reason } => write!(f, "unavailable: {reason}"),
        }
    }
}

impl Route {
    /// Choose the route: the environment variable when set, else `zesInit` when the loader
    /// has it, else off with the reason.
    pub fn discover(api: &ze::LevelZero) -> Route {
        if env_enabled() {
            return Route::EnvVar;
        }
        let (Some(zes_init), Some(driver_get), Some(device_get)) =
            (api.zesInit, api.zesDriverGet, api.zesDeviceGet)
        else {
            return Route::Off {
                reason: format!(
                    "{} has no zesInit (Level Zero spec < 1.5) and {ENABLE_ENV} is not 1; start the engine with \
                     {ENABLE_ENV}=1 (memplan does not change the process environment)",
                    api.library()
                ),
            };
        };
        // SAFETY: zesInit takes flags only (0 = default).
        let rc = unsafe { zes_init(0) };
        if rc != ze::ZE_RESULT_SUCCESS {
            return Route::Off {
                reason: format!("zesInit failed: {} ({rc:#x})", result_name(rc)),
            };
        }
        match zes_devices(api, driver_get, device_get) {
            Ok(devices) => Route::ZesInit { devices },
            Err(e) => Route::Off {
                reason: e.to_string(),
            },
        }
    }

    /// The Sysman device for a core device, or why there is none.
    pub fn device_for(&self, core: &CoreDevice) -> std::result::Result<Handle, String> {
        match self {
            Route::EnvVar => Ok(core.device),
            Route::ZesInit { devices } => devices
                .iter()
                .find(|(uuid, _)| *uuid == core.uuid)
                .map(|(_, h)| *h)
                .ok_or_else(|| {
                    format!(
                        "no Sysman device has the UUID {} of this device",
                        core.uuid_text()
                    )
                }),
            Route::Off { reason } => Err(reason.clone()),
        }
    }
}

type DriverGet = unsafe extern "C" fn(*mut u32, *mut ze::zes_driver_handle_t) -> ze::ze_result_t;
type DeviceGet = unsafe extern "C" fn(
    ze::zes_driver_handle_t,
    *mut u32,
    *mut ze::zes_device_handle_t,
) -> ze::ze_result_t;

fn zes_devices(
    api: &ze::LevelZero,
    driver_get: DriverGet,
    device_get: DeviceGet,
) -> Result<Vec<([u8; 16], Handle)>> {
    let mut out = Vec::new();
    let drivers = enumerate("zesDriverGet", ze::null_handle(), |n, p| {
        // SAFETY: count-then-fill protocol of zesDriverGet after a successful zesInit.
        unsafe { driver_get(n, p) }
    })?;
    for d in drivers {
        let devices = enumerate("zesDeviceGet", ze::null_handle(), |n, p| {
            // SAFETY: count-then-fill protocol of zesDeviceGet on a Sysman driver handle.
            unsafe { device_get(d, n, p) }
        })?;
        for h in devices {
            let mut p = ze::zes_device_properties_t::new();
            // SAFETY: Sysman device handle from zesDeviceGet; initialised out-struct.
            check("zesDeviceGetProperties", unsafe {
                (api.zesDeviceGetProperties)(h, &mut p)
            })?;
            out.push((p.core.uuid.id, Handle(h)));
        }
    }
    Ok(out)
}

/// The memory modules of one device and the cached reading.
#[derive(Debug)]
pub struct SysmanMemory {
    modules: Vec<(Handle, u32)>,
    integrated: bool,
    cache: Option<SysmanFree>,
}

impl SysmanMemory {
    /// Enumerate the Sysman memory modules of `core`. `Err` is the reason free memory is
    /// unavailable (route off, no matching device, a failing call, by name).
    pub fn attach(
        api: &ze::LevelZero,
        route: &Route,
        core: &CoreDevice,
    ) -> std::result::Result<Self, String> {
        let dev = route.device_for(core)?;
        let handles = enumerate("zesDeviceEnumMemoryModules", ze::null_handle(), |n, p| {
            // SAFETY: count-then-fill protocol of zesDeviceEnumMemoryModules on a Sysman handle.
            unsafe { (api.zesDeviceEnumMemoryModules)(dev.0, n, p) }
        })
        .map_err(|e| e.to_string())?;
        let mut modules = Vec::with_capacity(handles.len());
        for h in handles {
            let mut p = ze::zes_mem_properties_t::new();
            // SAFETY: module handle from zesDeviceEnumMemoryModules; initialised out-struct.
            check("zesMemoryGetProperties", unsafe {
                (api.zesMemoryGetProperties)(h, &mut p)
            })
            .map_err(|e| e.to_string())?;
            modules.push((Handle(h), p.location));
        }
        Ok(SysmanMemory {
            modules,
            integrated: core.integrated,
            cache: None,
        })
    }

    /// The free-memory reading, from the cache when nothing invalidated it. A failing call is
    /// an error naming the call and the code.
    pub fn read(&mut self, api: &ze::LevelZero) -> Result<SysmanFree> {
        if let Some(c) = &self.cache {
            return Ok(c.clone());
        }
        let mut readings = Vec::with_capacity(self.modules.len());
        for (h, location) in &self.modules {
            let mut s = ze::zes_mem_state_t::new();
            // SAFETY: module handle from zesDeviceEnumMemoryModules; initialised out-struct.
            check("zesMemoryGetState", unsafe {
                (api.zesMemoryGetState)(h.0, &mut s)
            })?;
            readings.push(ModuleReading {
                location: *location,
                free: s.free,
                size: s.size,
            });
        }
        let r = translate(self.integrated, &readings);
        self.cache = Some(r.clone());
        Ok(r)
    }

    /// Forget the cached reading (the next [`read`](Self::read) calls Sysman again).
    pub fn invalidate(&mut self) {
        self.cache = None;
    }
}

/// This process's device memory from Sysman's per-process query, cached per snapshot like
/// [`SysmanMemory`].
#[derive(Debug)]
pub struct SysmanProcessMemory {
    device: Handle,
    cache: Option<SysmanProcesses>,
}

impl SysmanProcessMemory {
    /// The per-process reader of `core`'s Sysman device and its first reading. `Err` is the
    /// reason there is none (Sysman unreachable, the loader lacks the call, the call refused,
    /// this process not listed).
    pub fn attach(
        api: &ze::LevelZero,
        route: &Route,
        core: &CoreDevice,
    ) -> std::result::Result<(Self, SysmanProcesses), String> {
        let device = route.device_for(core)?;
        let mut r = SysmanProcessMemory {
            device,
            cache: None,
        };
        match r.read(api) {
            Ok(p @ SysmanProcesses::Readable { .. }) => Ok((r, p)),
            Ok(SysmanProcesses::Unavailable { reason }) => Err(reason),
            Err(e) => Err(e.to_string()),
        }
    }

    /// This process's reading, from the cache when nothing invalidated it.
    pub fn read(&mut self, api: &ze::LevelZero) -> Result<SysmanProcesses> {
        if let Some(c) = &self.cache {
            return Ok(c.clone());
        }
        let Some(get) = api.zesDeviceProcessesGetState else {
            return Ok(SysmanProcesses::unavailable(format!(
                "{} has no zesDeviceProcessesGetState",
                api.library()
            )));
        };
        let dev = self.device.0;
        let call = |n: &mut u32, p: *mut ze::zes_process_state_t| {
            // SAFETY: Sysman device handle from the route; count-then-fill protocol of
            // zesDeviceProcessesGetState, `p` null or holding `*n` initialised entries.
            unsafe { get(dev, n, p) }
        };
        let mut count = 0u32;
        let rc = call(&mut count, std::ptr::null_mut());
        let states = if rc != ze::ZE_RESULT_SUCCESS {
            Err(crate::conv::call_error("zesDeviceProcessesGetState", rc))
        } else {
            // Processes come and go between the count and the fill: room for a few more, and
            // one retry with more when the list still grew.
            let mut out = Err(crate::conv::call_error(
                "zesDeviceProcessesGetState",
                ze::ZE_RESULT_ERROR_INVALID_SIZE,
            ));
            for extra in [8u32, 256] {
                let mut n = count.saturating_add(extra);
                let mut v = vec![ze::zes_process_state_t::new(); n as usize];
                match call(&mut n, v.as_mut_ptr()) {
                    ze::ZE_RESULT_SUCCESS => {
                        v.truncate(n as usize);
                        out = Ok(v);
                        break;
                    }
                    ze::ZE_RESULT_ERROR_INVALID_SIZE => count = n,
                    rc => {
                        out = Err(crate::conv::call_error("zesDeviceProcessesGetState", rc));
                        break;
                    }
                }
            }
            out
        };
        let r = match states {
            Ok(v) => crate::conv::own_process(
                std::process::id(),
                &v.iter()
                    .map(|p| (p.processId, p.memSize))
                    .collect::<Vec<_>>(),
            ),
            // Refused (not permitted for this user) or failed: a reason, never 0.
            Err(e) => SysmanProcesses::unavailable(e.to_string()),
        };
        self.cache = Some(r.clone());
        Ok(r)
    }

    /// Forget the cached reading.
    pub fn invalidate(&mut self) {
        self.cache = None;
    }
}
