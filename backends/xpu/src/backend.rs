//! [`XpuBackend`]: loads the Level Zero loader on first use, enumerates root GPU devices and
//! opens them by ordinal (`xpu:0`). Creating the backend loads nothing.
//!
//! A successfully initialised loader is kept for the life of the process (one per library
//! name), like the driver it stands for: `zeInit` is process-wide anyway, and unloading the
//! loader (and with it the GPU driver it loaded) while other code may still hold Level Zero
//! handles is not something drivers are tested for. A failed initialisation is not kept: the
//! next call tries again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use level_zero_sys as ze;
use memplan_core::{Backend, BackendKind, Device, DeviceDescriptor, DeviceId, Error, Result};

use crate::device::XpuDevice;
use crate::loader::{self, CoreDevice, Runtime};

/// The Level Zero backend.
#[derive(Debug)]
pub struct XpuBackend {
    library: String,
}

/// Initialised runtimes by library name, for the life of the process.
fn runtimes() -> &'static Mutex<HashMap<String, Arc<Runtime>>> {
    static RUNTIMES: OnceLock<Mutex<HashMap<String, Arc<Runtime>>>> = OnceLock::new();
    RUNTIMES.get_or_init(Default::default)
}

impl Default for XpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl XpuBackend {
    /// A backend that will open `libze_loader.so.1` (or `MEMPLAN_LEVEL_ZERO_LOADER`).
    pub fn new() -> Self {
        Self::with_library(loader::library_name())
    }

    /// A backend that will open `library` (a file name or a path) instead.
    pub fn with_library(library: impl Into<String>) -> Self {
        XpuBackend {
            library: library.into(),
        }
    }

    /// The initialised runtime, initialising it on first use. A failure is not cached: the
    /// next call tries again (the calls are cheap when they fail).
    fn runtime(&self) -> Result<Arc<Runtime>> {
        let mut map = runtimes().lock().map_err(|_| Error::BackendUnavailable {
            backend: BackendKind::Xpu,
            reason: "a previous Level Zero initialisation panicked".into(),
        })?;
        if let Some(rt) = map.get(&self.library) {
            return Ok(rt.clone());
        }
        let rt = Arc::new(loader::init(&self.library)?);
        map.insert(self.library.clone(), rt.clone());
        Ok(rt)
    }
}

/// The descriptor of root device `ordinal`.
pub(crate) fn descriptor(rt: &Runtime, ordinal: usize, d: &CoreDevice) -> DeviceDescriptor {
    let mems: Vec<String> = d.memories.iter().map(|(n, b)| format!("{n}={b}")).collect();
    let properties = vec![
        ("vendor_id".into(), format!("{:#06x}", d.vendor_id)),
        ("device_id".into(), format!("{:#06x}", d.device_id)),
        ("uuid".into(), d.uuid_text()),
        (
            "kind".into(),
            if d.integrated {
                "integrated"
            } else {
                "discrete"
            }
            .into(),
        ),
        ("sub_devices".into(), d.sub_devices.to_string()),
        (
            "memories".into(),
            if mems.is_empty() {
                "none listed".into()
            } else {
                mems.join(", ")
            },
        ),
        ("driver_version".into(), d.driver_version.to_string()),
        (
            "api_version".into(),
            format!(
                "{}.{}",
                ze::api_major(d.api_version),
                ze::api_minor(d.api_version)
            ),
        ),
        ("sysman".into(), rt.sysman.to_string()),
        ("loader".into(), rt.api.library().to_string()),
    ];
    DeviceDescriptor::new(
        DeviceId::new(BackendKind::Xpu, ordinal.to_string()),
        d.name.clone(),
        d.core_total(),
    )
    .with_properties(properties)
}

impl Backend for XpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Xpu
    }

    fn devices(&self) -> Result<Vec<DeviceDescriptor>> {
        let rt = self.runtime()?;
        Ok(rt
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| descriptor(&rt, i, d))
            .collect())
    }

    fn open(&self, selector: &str) -> Result<Device> {
        let id = DeviceId::new(BackendKind::Xpu, selector);
        let ordinal = id.ordinal()?;
        let rt = self.runtime()?;
        if ordinal >= rt.devices.len() {
            return Err(Error::UnknownDevice {
                id: id.to_string(),
                available: match rt.devices.len() {
                    0 => "none (no Level Zero GPU device)".into(),
                    n => format!("xpu:0 .. xpu:{}", n - 1),
                },
            });
        }
        Ok(Device::new(XpuDevice::open(rt, ordinal)?))
    }
}
