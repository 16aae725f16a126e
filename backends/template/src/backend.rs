//! [`TemplateBackend`]: loads the runtime on first use, enumerates its devices and opens them
//! by ordinal (`template:0`). Creating the backend loads nothing; a failed load is not kept
//! (the next call tries again).

use std::sync::{Arc, Mutex};

use memplan_core::{Backend, BackendKind, Device, DeviceDescriptor, DeviceId, HalDevice, Result};

use crate::conv::check;
use crate::device::TemplateDevice;
use crate::fake;
use crate::loader::{self, Runtime};

/// The template backend.
#[derive(Debug, Default)]
pub struct TemplateBackend;

/// The runtime, loaded once per process (as a driver is).
fn runtime() -> Result<Arc<Runtime>> {
    static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = slot.as_ref() {
        return Ok(rt.clone());
    }
    let rt = Arc::new(loader::load()?);
    *slot = Some(rt.clone());
    Ok(rt)
}

fn count() -> Result<usize> {
    let mut n = 0;
    check("fake_device_count", fake::fake_device_count(&mut n))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

// guide:begin backend
impl Backend for TemplateBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Template
    }

    fn devices(&self) -> Result<Vec<DeviceDescriptor>> {
        let rt = runtime()?;
        (0..count()?)
            .map(|i| Ok(TemplateDevice::open(&rt, i)?.descriptor().clone()))
            .collect()
    }

    fn open(&self, selector: &str) -> Result<Device> {
        let rt = runtime()?;
        let ordinal = DeviceId::new(BackendKind::Template, selector).ordinal()?;
        if ordinal >= count()? {
            return Err(memplan_core::Error::UnknownDevice {
                id: format!("template:{selector}"),
                available: format!("template:0 to template:{}", count()?.saturating_sub(1)),
            });
        }
        Ok(Device::new(TemplateDevice::open(&rt, ordinal)?))
    }
}
// guide:end backend
