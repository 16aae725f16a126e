//! The `rocm` backend object: loads the HIP runtime on first use and enumerates devices.

use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use memplan_core::{Backend, BackendKind, Device, DeviceDescriptor, Error, Result};

use crate::conv::check;
use crate::device::RocmDevice;
use crate::loader::Api;
use crate::probe::probe;
use crate::sysfs::SysRoot;

/// The ROCm backend. Creating it is free; the HIP runtime loads on the first call.
pub struct RocmBackend {
    api: Mutex<Option<Arc<Api>>>,
    library: Option<String>,
    sys: SysRoot,
}

impl RocmBackend {
    /// A backend that reads the real `/sys` and `/proc`.
    pub fn new() -> Self {
        RocmBackend {
            api: Mutex::new(None),
            library: None,
            sys: SysRoot::system(),
        }
    }

    /// A backend loading exactly `library` (instead of `MEMPLAN_HIP_LIBRARY` or the soname
    /// candidates) and reading sysfs and meminfo under `sys` (tests, unusual installs).
    pub fn with(library: impl Into<String>, sys: SysRoot) -> Self {
        RocmBackend {
            api: Mutex::new(None),
            library: Some(library.into()),
            sys,
        }
    }

    /// The loaded runtime (loading it on first call; a failed load is retried next time).
    pub fn api(&self) -> Result<Arc<Api>> {
        let mut slot = self
            .api
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(a) = slot.as_ref() {
            return Ok(a.clone());
        }
        let a = match &self.library {
            Some(l) => Api::load_from(std::slice::from_ref(l))?,
            None => Api::load()?,
        };
        *slot = Some(a.clone());
        Ok(a)
    }

    fn count(api: &Api) -> Result<c_int> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        let rc = unsafe { (api.sym.hipGetDeviceCount)(&mut n) };
        check("hipGetDeviceCount", rc)?;
        Ok(n)
    }
}

impl Default for RocmBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for RocmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Rocm
    }

    fn devices(&self) -> Result<Vec<DeviceDescriptor>> {
        let api = self.api()?;
        let n = Self::count(&api)?;
        (0..n)
            .map(|i| probe(&api, i, &self.sys).map(|p| p.descriptor))
            .collect()
    }

    fn open(&self, selector: &str) -> Result<Device> {
        let id = memplan_core::DeviceId::new(BackendKind::Rocm, selector);
        let ordinal = id.ordinal()?;
        let api = self.api()?;
        let n = Self::count(&api)?;
        let ordinal = c_int::try_from(ordinal)
            .ok()
            .filter(|o| *o < n)
            .ok_or_else(|| Error::UnknownDevice {
                id: id.to_string(),
                available: if n == 1 {
                    "rocm:0".into()
                } else {
                    format!("rocm:0 .. rocm:{}", n - 1)
                },
            })?;
        Ok(Device::new(RocmDevice::open(
            api,
            ordinal,
            self.sys.clone(),
        )?))
    }
}
