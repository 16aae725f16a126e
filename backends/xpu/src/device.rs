//! [`XpuDevice`]: one opened root GPU with its own Level Zero context.
//!
//! Readings: total and free from Sysman (device-local modules), total from the core memory
//! properties when Sysman is unavailable, free then absent (never 0). Where Sysman's free
//! memory cannot be used (integrated, or free == total) but its per-process query lists this
//! process, free is the total less this process's `memSize`, declared process-local. The
//! Sysman reads are cached until the next synchronize, allocation, free or mapping change, so
//! one snapshot pays their ~150 ms once.
//!
//! `synchronize` submits nothing and waits for nothing: this backend never submits work
//! (raw allocations and frees are synchronous calls), and Level Zero has no device-wide
//! synchronize. The capability says so (`facts.synchronize` unsupported, with
//! [`NO_DEVICE_SYNCHRONIZE`](crate::capability::NO_DEVICE_SYNCHRONIZE) as the reason), and the
//! protocol waits for the engine's own queues through its hook before each reading. It does
//! mark the start of a snapshot by invalidating the cached Sysman reading.
//!
//! The core (`memplan_core::Device`) checks every handle passed back and releases what is
//! still held before this device is dropped; dropping it destroys the context.

use std::ffi::c_void;
use std::sync::Arc;

use level_zero_sys as ze;
use memplan_core::{
    DeviceDescriptor, DeviceWideMemory, DriverMemory, Error, HalDevice, HalVirtualMemory,
    ProfilingCapability, Result, Support,
};

use crate::capability::declare;
use crate::conv::{check, check_alloc, SysmanFree, SysmanProcesses};
use crate::facts::Facts;
use crate::loader::{Handle, Runtime};
use crate::sysman::{SysmanMemory, SysmanProcessMemory};

/// One opened Level Zero GPU.
#[derive(Debug)]
pub struct XpuDevice {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) index: usize,
    pub(crate) context: Handle,
    descriptor: DeviceDescriptor,
    caps: ProfilingCapability,
    sysman: Option<SysmanMemory>,
    /// This process's memory from the per-process query, where the free reading is composed
    /// from it.
    processes: Option<SysmanProcessMemory>,
}

/// The size probed with `zeVirtualMemQueryPageSize` at open and used for the granularity.
pub(crate) const VMM_PROBE_BYTES: usize = 1 << 30;

impl XpuDevice {
    /// Create a context on root device `index` of `rt`, probe virtual memory and Sysman, and
    /// declare the capability.
    pub(crate) fn open(rt: Arc<Runtime>, index: usize) -> Result<Self> {
        let core = rt.devices.get(index).ok_or_else(|| Error::UnknownDevice {
            id: format!("xpu:{index}"),
            available: format!("{} Level Zero device(s)", rt.devices.len()),
        })?;
        let desc = ze::ze_context_desc_t::new();
        let mut ctx = ze::null_handle();
        // SAFETY: valid driver handle from initialisation; `desc` is initialised; `ctx` is an
        // out-parameter.
        check("zeContextCreate", unsafe {
            (rt.api.zeContextCreate)(core.driver.0, &desc, &mut ctx)
        })?;
        let context = Handle(ctx);
        let mut page = 0usize;
        // SAFETY: valid context and device handles; `page` is an out-parameter.
        let rc = unsafe {
            (rt.api.zeVirtualMemQueryPageSize)(ctx, core.device.0, VMM_PROBE_BYTES, &mut page)
        };
        let virtual_memory = match check("zeVirtualMemQueryPageSize", rc) {
            Ok(()) if page > 0 => Support::Supported,
            Ok(()) => Support::no("zeVirtualMemQueryPageSize returned a page size of 0"),
            Err(e) => Support::no(e.to_string()),
        };
        let mut sysman = SysmanMemory::attach(&rt.api, &rt.sysman, core);
        let first = match &mut sysman {
            Ok(s) => s
                .read(&rt.api)
                .unwrap_or_else(|e| SysmanFree::unavailable(e.to_string())),
            Err(reason) => SysmanFree::unavailable(reason.clone()),
        };
        let (processes, own) = match SysmanProcessMemory::attach(&rt.api, &rt.sysman, core) {
            Ok((p, own)) => (Some(p), own),
            Err(reason) => (None, SysmanProcesses::unavailable(reason)),
        };
        let facts = Facts {
            processes: own,
            integrated: core.integrated,
            sysman: first,
            virtual_memory,
        };
        let caps = declare(&facts);
        let composed = matches!(
            caps.reading(memplan_core::Reading::DriverFree),
            memplan_core::Reliability::ProcessLocal { .. }
        );
        let processes = processes.filter(|_| composed);
        let sysman = match facts.sysman {
            SysmanFree::Readable { .. } => sysman.ok(),
            SysmanFree::Unavailable { .. } => None,
        };
        let descriptor = crate::backend::descriptor(&rt, index, core);
        tracing::debug!(device = %descriptor.id, sysman = sysman.is_some(), "xpu device opened");
        Ok(XpuDevice {
            rt,
            index,
            context,
            descriptor,
            caps,
            sysman,
            processes,
        })
    }

    /// The core device handle.
    pub(crate) fn device_handle(&self) -> Handle {
        self.rt.devices[self.index].device
    }

    /// Forget the cached Sysman reading.
    pub(crate) fn invalidate(&mut self) {
        if let Some(s) = &mut self.sysman {
            s.invalidate();
        }
        if let Some(p) = &mut self.processes {
            p.invalidate();
        }
    }
}

impl HalDevice for XpuDevice {
    fn descriptor(&self) -> &DeviceDescriptor {
        &self.descriptor
    }

    fn capabilities(&self) -> &ProfilingCapability {
        &self.caps
    }

    fn driver_memory(&mut self) -> Result<DriverMemory> {
        let core_total = self.rt.devices[self.index].core_total();
        if let Some(p) = &mut self.processes {
            // Process-local: the total less this process's own device memory.
            let total = match self
                .sysman
                .as_mut()
                .map(|s| s.read(&self.rt.api))
                .transpose()?
            {
                Some(SysmanFree::Readable { size, .. }) => Some(size),
                _ => core_total,
            };
            return Ok(match p.read(&self.rt.api)? {
                SysmanProcesses::Readable { own, .. } => {
                    DriverMemory::new(total, total.map(|t| t.saturating_sub(own)))
                }
                SysmanProcesses::Unavailable { reason } => {
                    tracing::warn!(device = %self.descriptor.id, %reason, "Sysman per-process memory became unreadable");
                    DriverMemory::new(total, None)
                }
            });
        }
        let Some(s) = &mut self.sysman else {
            return Ok(DriverMemory::new(core_total, None));
        };
        Ok(match s.read(&self.rt.api)? {
            SysmanFree::Readable { free, size, .. } => DriverMemory::new(Some(size), Some(free)),
            SysmanFree::Unavailable { reason } => {
                tracing::warn!(device = %self.descriptor.id, %reason, "Sysman free memory became unreadable");
                DriverMemory::new(core_total, None)
            }
        })
    }

    /// Discrete: Sysman's free memory (device-wide, the same cached read as the driver layer);
    /// integrated: the host's `MemAvailable`, which every process's use of the shared memory
    /// lowers. Absent where neither can be read.
    fn device_wide_memory(&mut self) -> Result<DeviceWideMemory> {
        if self.caps.facts.unified_memory {
            return Ok(DeviceWideMemory::new(crate::conv::host_available(
                std::fs::read_to_string("/proc/meminfo").ok().as_deref(),
            )));
        }
        let Some(s) = &mut self.sysman else {
            return Ok(DeviceWideMemory::default());
        };
        Ok(DeviceWideMemory::new(match s.read(&self.rt.api)? {
            SysmanFree::Readable { free, .. } => Some(free),
            SysmanFree::Unavailable { .. } => None,
        }))
    }

    /// Waits for nothing (declared: `facts.synchronize` is unsupported); starts a new
    /// snapshot's Sysman cache.
    fn synchronize(&mut self) -> Result<()> {
        self.invalidate();
        Ok(())
    }

    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        let size = usize::try_from(bytes)
            .map_err(|_| Error::invalid("bytes", format!("{bytes} does not fit in size_t")))?;
        let desc = ze::ze_device_mem_alloc_desc_t::new();
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid context and device; `desc` initialised (ordinal 0, the first memory);
        // alignment 0 lets the driver choose; `ptr` is an out-parameter.
        let rc = unsafe {
            (self.rt.api.zeMemAllocDevice)(
                self.context.0,
                &desc,
                size,
                0,
                self.device_handle().0,
                &mut ptr,
            )
        };
        check_alloc("zeMemAllocDevice", rc, bytes)?;
        self.invalidate();
        Ok(ptr as u64)
    }

    unsafe fn free(&mut self, address: u64, _bytes: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live pointer from zeMemAllocDevice in this context;
        // no work of ours references it.
        let freed = check("zeMemFree", unsafe {
            (self.rt.api.zeMemFree)(self.context.0, address as *mut c_void)
        });
        self.invalidate();
        freed
    }

    /// Only reached where the capability declares virtual memory supported (the core checks).
    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        Ok(self)
    }
}

impl Drop for XpuDevice {
    fn drop(&mut self) {
        // SAFETY: the context was created in `open`; the core released everything in it.
        log_teardown("zeContextDestroy", unsafe {
            (self.rt.api.zeContextDestroy)(self.context.0)
        });
    }
}

fn log_teardown(call: &str, rc: ze::ze_result_t) {
    if let Err(e) = check(call, rc) {
        tracing::warn!(error = %e, "xpu teardown");
    }
}
