//! [`TemplateDevice`]: one device's readings and raw primitives ([`HalDevice`]), each one
//! runtime call. The core's `Device` wraps it and keeps every table; this file keeps none.

use memplan_core::{
    BackendKind, DeviceDescriptor, DeviceId, DriverMemory, Error, GraphPoolMemory, HalDevice,
    HalGraphs, HalVirtualMemory, ProfilingCapability, Result, Support,
};

use crate::capability::declare;
use crate::conv::{check, check_alloc};
use crate::facts::TemplateFacts;
use crate::fake;
use crate::loader::Runtime;

/// One open device: its context is retained while this lives.
#[derive(Debug)]
pub struct TemplateDevice {
    pub(crate) ordinal: i32,
    descriptor: DeviceDescriptor,
    capability: ProfilingCapability,
}

/// A device attribute, `None` when it cannot be read (the reason logged), never a guess.
fn attribute(ordinal: i32, attribute: i32) -> Option<bool> {
    let mut v = 0;
    match check(
        "fake_device_attribute",
        fake::fake_device_attribute(ordinal, attribute, &mut v),
    ) {
        Ok(()) => Some(v != 0),
        Err(e) => {
            tracing::warn!(%e, attribute, "device attribute unreadable");
            None
        }
    }
}

impl TemplateDevice {
    /// Open device `ordinal`: retain its context, read the facts, declare.
    pub fn open(rt: &Runtime, ordinal: usize) -> Result<Self> {
        let ord = i32::try_from(ordinal).map_err(|_| Error::UnknownDevice {
            id: format!("template:{ordinal}"),
            available: "template:0".into(),
        })?;
        check("fake_ctx_retain", fake::fake_ctx_retain(ord))?;
        let facts = TemplateFacts {
            runtime_version: rt.version,
            virtual_memory_attribute: attribute(ord, 1),
            graph_capture_attribute: attribute(ord, 2),
        };
        let (mut free, mut total) = (0, 0);
        let total = check(
            "fake_mem_get_info",
            fake::fake_mem_get_info(ord, &mut free, &mut total),
        )
        .ok()
        .map(|()| total);
        let descriptor = DeviceDescriptor::new(
            DeviceId::new(BackendKind::Template, ordinal.to_string()),
            "Fake GPU (template backend)",
            total,
        )
        .with_property("runtime", facts.runtime_version.to_string())
        .with_property("library", crate::loader::LIBRARY);
        Ok(TemplateDevice {
            ordinal: ord,
            descriptor,
            capability: declare(&facts),
        })
    }
}

impl Drop for TemplateDevice {
    fn drop(&mut self) {
        if let Err(e) = check("fake_ctx_release", fake::fake_ctx_release(self.ordinal)) {
            tracing::warn!(%e, "releasing the context failed");
        }
    }
}

// guide:begin device
impl HalDevice for TemplateDevice {
    fn descriptor(&self) -> &DeviceDescriptor {
        &self.descriptor
    }

    fn capabilities(&self) -> &ProfilingCapability {
        &self.capability
    }

    fn driver_memory(&mut self) -> Result<DriverMemory> {
        let (mut free, mut total) = (0, 0);
        check(
            "fake_mem_get_info",
            fake::fake_mem_get_info(self.ordinal, &mut free, &mut total),
        )?;
        Ok(DriverMemory::new(Some(total), Some(free)))
    }

    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        if !self.capability.facts.graph_pool_attributes.is_supported() {
            return Ok(GraphPoolMemory::default());
        }
        let (mut used, mut reserved) = (0, 0);
        check(
            "fake_graph_mem_get",
            fake::fake_graph_mem_get(self.ordinal, &mut used, &mut reserved),
        )?;
        Ok(GraphPoolMemory::new(Some(used), Some(reserved)))
    }

    fn synchronize(&mut self) -> Result<()> {
        check("fake_synchronize", fake::fake_synchronize(self.ordinal))
    }

    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        let mut address = 0;
        check_alloc(
            "fake_malloc",
            fake::fake_malloc(self.ordinal, bytes, &mut address),
            bytes,
        )?;
        Ok(address)
    }

    unsafe fn free(&mut self, address: u64, _bytes: u64) -> Result<()> {
        check("fake_free", fake::fake_free(self.ordinal, address))
    }

    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        match &self.capability.facts.graph_capture {
            Support::Supported => Ok(self),
            Support::Unsupported { reason } => {
                Err(Error::unsupported("graph capture", reason.clone()))
            }
        }
    }

    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        match &self.capability.facts.virtual_memory {
            Support::Supported => Ok(self),
            Support::Unsupported { reason } => {
                Err(Error::unsupported("virtual memory", reason.clone()))
            }
        }
    }
}
// guide:end device
