//! The CUDA [`Device`](memplan_core::Device): readings, synchronize, raw allocations, and access to graph capture and
//! virtual memory.
//!
//! A device holds a reference on the device's *primary* context (`cuDevicePrimaryCtxRetain`),
//! the one the CUDA runtime and PyTorch use, so in-process use shares the engine's context and
//! costs no extra memory. Every call makes that context current on the calling thread first,
//! so a device may move between threads. The core releases what memplan handed out (raw
//! allocations, graphs, mappings, ranges) before the backend is dropped; dropping it destroys
//! the capture stream and module and releases the context reference.

use cudarc::driver::sys::{self, CUgraphMem_attribute as G};
use memplan_core::{
    DeviceDescriptor, DeviceWideMemory, DriverMemory, Error, GraphPoolMemory, HalDevice, HalGraphs,
    HalVirtualMemory, ProfilingCapability, Result,
};

use crate::backend::Described;
use crate::capability::{self, declare};
use crate::conv::{self, check, check_alloc};
use crate::ffi;
use crate::graph::CudaGraphs;
use crate::loader::{Driver, Feature};
use crate::nvml;
use crate::vmm::CudaVmm;

/// A device handle and its retained primary context.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx {
    pub(crate) dev: sys::CUdevice,
    pub(crate) ctx: sys::CUcontext,
}

// SAFETY: a CUDA context may be used from any thread once made current there, which `bind`
// does before every call; the handle itself is an opaque pointer the driver owns.
unsafe impl Send for Ctx {}

impl Ctx {
    /// Make the context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context, valid until the device is dropped.
        check("cuCtxSetCurrent", unsafe { ffi::cuCtxSetCurrent(self.ctx) })
    }
}

/// One opened NVIDIA device.
pub struct CudaDevice {
    descriptor: DeviceDescriptor,
    caps: ProfilingCapability,
    ctx: Ctx,
    driver: &'static Driver,
    compute_capability: (i32, i32),
    graphs: Option<CudaGraphs>,
    vmm: Option<CudaVmm>,
    nvml: Option<nvml::NvmlMemory>,
}

impl CudaDevice {
    /// Retain the primary context of a described device and declare its capability.
    pub(crate) fn open(driver: &'static Driver, d: Described) -> Result<Self> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `d.handle` came from cuDeviceGet; `ctx` is a valid out-pointer.
        check("cuDevicePrimaryCtxRetain", unsafe {
            ffi::cuDevicePrimaryCtxRetain(&mut ctx, d.handle)
        })?;
        let ctx = Ctx { dev: d.handle, ctx };
        let mut descriptor = d.descriptor;
        let mut caps = declare(&d.facts);
        capability::require_exports(
            &mut caps,
            driver.supports(Feature::GraphMemory),
            driver.supports(Feature::GraphCapture),
            driver.supports(Feature::VirtualMemory),
        );
        let nvml = d.uuid.as_deref().and_then(nvml::memory);
        match &nvml {
            Some(m) => {
                descriptor.properties.extend(m.properties());
                caps.notes.push("NVML: driver-reserved framebuffer and other processes' memory in the properties".into());
            }
            None => caps
                .notes
                .push("NVML not available: other processes' memory is not itemised".into()),
        }
        let dev = CudaDevice {
            descriptor,
            caps,
            ctx,
            driver,
            compute_capability: d.compute_capability,
            graphs: None,
            vmm: None,
            nvml,
        };
        dev.ctx.bind()?;
        Ok(dev)
    }

    /// NVML's view of this device when NVML could be loaded (read at open time).
    pub fn nvml_memory(&self) -> Option<&nvml::NvmlMemory> {
        self.nvml.as_ref()
    }

    /// Where the capture kernel came from (`nvrtc` or `embedded PTX`), once graph capture ran.
    pub fn kernel_source(&self) -> Option<&str> {
        self.graphs.as_ref().and_then(|g| g.kernel_source())
    }

    fn graph_attribute(&self, attr: G) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: the graph-memory feature was checked (version and symbol) before the
        // capability declared the attributes supported; the attribute value is a cuuint64_t.
        let res = unsafe {
            ffi::cuDeviceGetGraphMemAttribute(self.ctx.dev, attr, (&mut v as *mut u64).cast())
        };
        match check("cuDeviceGetGraphMemAttribute", res) {
            Ok(()) => Some(v),
            Err(e) => {
                tracing::warn!(attribute = ?attr, "{e}: reading left absent");
                None
            }
        }
    }
}

impl HalDevice for CudaDevice {
    fn descriptor(&self) -> &DeviceDescriptor {
        &self.descriptor
    }

    fn capabilities(&self) -> &ProfilingCapability {
        &self.caps
    }

    fn driver_memory(&mut self) -> Result<DriverMemory> {
        self.ctx.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context current; both out-pointers valid.
        check("cuMemGetInfo_v2", unsafe {
            ffi::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(conv::driver_memory(free, total))
    }

    /// cuMemGetInfo is device-wide (every process and API): the device-wide reading is its
    /// free memory, read again so the two layers are each a whole reading. Where NVML was
    /// read, its framebuffer total less the framebuffer it reports reserved for the driver and
    /// firmware is the second reading of the device's memory
    /// ([`NvmlMemory::device_total`](nvml::NvmlMemory::device_total)): a cuMemGetInfo total
    /// above it is a misreport. Without NVML (the library absent or failing) there is none.
    fn device_wide_memory(&mut self) -> Result<DeviceWideMemory> {
        let total = self.nvml.as_ref().and_then(nvml::NvmlMemory::device_total);
        Ok(DeviceWideMemory::new(self.driver_memory()?.free).with_total(total))
    }

    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        if !self.caps.facts.graph_pool_attributes.is_supported() {
            return Ok(GraphPoolMemory::default());
        }
        self.ctx.bind()?;
        Ok(conv::graph_pool(
            self.graph_attribute(G::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
            self.graph_attribute(G::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH),
            self.graph_attribute(G::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
            self.graph_attribute(G::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH),
        ))
    }

    fn synchronize(&mut self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: context current.
        check("cuCtxSynchronize", unsafe { ffi::cuCtxSynchronize() })
    }

    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        let size = usize::try_from(bytes)
            .map_err(|_| Error::invalid("bytes", "larger than the address space"))?;
        self.ctx.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: context current; `ptr` is a valid out-pointer.
        let res = unsafe { ffi::cuMemAlloc_v2(&mut ptr, size) };
        check_alloc("cuMemAlloc_v2", res, bytes)?;
        Ok(ptr)
    }

    unsafe fn free(&mut self, address: u64, _bytes: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees a pointer from cuMemAlloc_v2 on this context, not
        // freed yet.
        check("cuMemFree_v2", unsafe { ffi::cuMemFree_v2(address) })
    }

    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        // Created on first use; `take` + `insert` hands out the slot without a branch that
        // cannot happen.
        let g = match self.graphs.take() {
            Some(g) => g,
            None => CudaGraphs::new(self.ctx, self.driver, self.compute_capability)?,
        };
        Ok(self.graphs.insert(g))
    }

    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        let v = match self.vmm.take() {
            Some(v) => v,
            None => CudaVmm::new(self.ctx, self.driver)?,
        };
        Ok(self.vmm.insert(v))
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        match self.ctx.bind() {
            Ok(()) => {
                if let Some(mut g) = self.graphs.take() {
                    g.teardown();
                }
            }
            // The context reference is still released below, so the last release destroys
            // the context and with it the stream and module.
            Err(e) => tracing::warn!(
                "cannot destroy the capture stream on {}: {e}",
                self.descriptor.id
            ),
        }
        // SAFETY: balances the cuDevicePrimaryCtxRetain of `open`; needs no current context.
        if let Err(e) = check("cuDevicePrimaryCtxRelease_v2", unsafe {
            ffi::cuDevicePrimaryCtxRelease_v2(self.ctx.dev)
        }) {
            tracing::warn!("{e}");
        }
    }
}
