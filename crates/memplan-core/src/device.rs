//! [`Device`]: the core's checked device over a backend's raw primitives.
//!
//! Backends implement [`HalDevice`] and trust their caller; `Device` is that caller. It holds
//! the backend behind a lock with the bookkeeping ([`crate::tables`]) of everything it handed
//! out, mints the opaque handles ([`crate::handle`]), checks every handle passed back, refuses
//! operations the protocol forbids while a capture is in progress, and releases what is still
//! live, in order, when the last clone is dropped. Readings pass straight through.
//!
//! A `Device` is a cheap clonable handle: clones share one device and one set of tables, so an
//! engine and memplan's session can both hold it, and a guard can release a range it owns
//! while the session holds the device. Handles of one `Device` (and its clones) mean nothing
//! to another `Device`, even on the same GPU.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::DeviceDescriptor;
use crate::capability::{ProfilingCapability, Support};
use crate::error::{Error, Result};
use crate::graph::GraphCapture;
use crate::hal::HalDevice;
use crate::handle::{Failed, HandleId, RawAllocation};
use crate::memory::{DeviceWideMemory, DriverMemory, GraphPoolMemory};
use crate::tables::{Live, Tables};
use crate::vmm::VirtualMemory;

/// The backend and the tables, under one lock.
pub(crate) struct Inner {
    pub hal: Box<dyn HalDevice>,
    pub t: Tables,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.t.teardown(&mut *self.hal);
    }
}

struct Shared {
    descriptor: DeviceDescriptor,
    capability: ProfilingCapability,
    gpu_id: Option<String>,
    inner: Mutex<Inner>,
}

/// One opened device. See the module docs.
#[derive(Clone)]
pub struct Device {
    shared: Arc<Shared>,
}

/// The name the engine-facing API first gave the clonable handle on one device; every
/// [`Device`] is one now.
pub type SharedDevice = Device;

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.shared.descriptor.id.to_string())
            .field("live", &self.live())
            .finish()
    }
}

impl Device {
    /// Wrap a backend's device. Its descriptor and declared capability are read once, here.
    pub fn new(hal: impl HalDevice) -> Device {
        Device {
            shared: Arc::new(Shared {
                descriptor: hal.descriptor().clone(),
                capability: hal.capabilities().clone(),
                gpu_id: hal.gpu_id(),
                inner: Mutex::new(Inner {
                    hal: Box::new(hal),
                    t: Tables::default(),
                }),
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // The tables are updated only after the backend call they record returns, so a panic
        // elsewhere cannot leave them describing something that did not happen.
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Static description.
    pub fn descriptor(&self) -> &DeviceDescriptor {
        &self.shared.descriptor
    }

    /// Which physical GPU this is, when its backend can tell ([`HalDevice::gpu_id`]); an
    /// engine's allocator that names another GPU is refused by a measurement session.
    pub fn gpu_id(&self) -> Option<&str> {
        self.shared.gpu_id.as_deref()
    }

    /// The capability as the backend declares it (before calibration).
    pub fn capabilities(&self) -> &ProfilingCapability {
        &self.shared.capability
    }

    /// Driver total/free. Absent values stay `None`. Does not synchronize.
    pub fn driver_memory(&self) -> Result<DriverMemory> {
        self.lock().hal.driver_memory()
    }

    /// Graph-pool attributes; all `None` where the device has no such query.
    pub fn graph_pool_memory(&self) -> Result<GraphPoolMemory> {
        self.lock().hal.graph_pool_memory()
    }

    /// Device-wide readings (every process and API counted); all `None` where the device
    /// offers no such source.
    pub fn device_wide_memory(&self) -> Result<DeviceWideMemory> {
        self.lock().hal.device_wide_memory()
    }

    /// The id another process opens to reach this same device
    /// ([`HalDevice::shared_id`]).
    pub fn shared_id(&self) -> Result<crate::DeviceId> {
        self.lock().hal.shared_id()
    }

    /// Wait for all work on the device (and deferred releases) to finish, where the capability
    /// declares `facts.synchronize` supported. Where it is unsupported (Level Zero has no
    /// device-wide wait), this waits only for what the backend itself submitted; the
    /// protocol then waits for the engine's queues through the engine (memplan-planner's
    /// `Engine::synchronize`).
    pub fn synchronize(&self) -> Result<()> {
        let mut g = self.lock();
        g.t.no_capture("synchronize")?;
        g.hal.synchronize()
    }

    /// Allocate `bytes` (> 0) of device memory directly from the driver (no caching
    /// allocator). Used by calibration: the caller knows exactly what it asked for.
    pub fn allocate(&self, bytes: u64) -> Result<RawAllocation> {
        if bytes == 0 {
            return Err(Error::invalid(
                "bytes",
                "a raw allocation must be at least 1 byte",
            ));
        }
        let mut g = self.lock();
        g.t.no_capture("raw allocation")?;
        let address = g.hal.allocate(bytes)?;
        let id = HandleId::mint();
        g.t.allocations.insert(id, (address, bytes));
        if address == 0 {
            // Tracked all the same: the driver may hold memory behind it.
            return Err(Error::Measurement(
                "the raw allocation succeeded but returned a null address".into(),
            ));
        }
        Ok(RawAllocation { id, address, bytes })
    }

    /// Free a raw allocation. On failure it stays live and is given back in the error.
    pub fn free(&self, allocation: RawAllocation) -> Result<(), Failed<RawAllocation>> {
        let mut g = self.lock();
        if let Err(e) = g.t.no_capture("free") {
            return Err(Failed::new(allocation, e));
        }
        let Some(&(address, bytes)) = g.t.allocations.get(&allocation.id) else {
            let e = not_live("allocation", "raw allocation");
            return Err(Failed::new(allocation, e));
        };
        // SAFETY: the table says this address/size came from the backend's allocate and was
        // not freed (it is removed below once freed).
        match unsafe { g.hal.free(address, bytes) } {
            Ok(()) => {
                g.t.allocations.remove(&allocation.id);
                g.t.raw_frees += 1;
                g.t.raw_freed_bytes = g.t.raw_freed_bytes.saturating_add(bytes);
                Ok(())
            }
            Err(e) => Err(Failed::new(allocation, e)),
        }
    }

    /// Graph capture, when the device supports it: [`Error::Unsupported`] with the declared
    /// reason otherwise, or the backend's error when preparing capture fails.
    pub fn graph_capture(&self) -> Result<GraphCapture<'_>> {
        supported("graph capture", &self.capabilities().facts.graph_capture)?;
        self.lock().hal.graphs()?;
        Ok(GraphCapture::new(self))
    }

    /// Virtual-memory management, when the device supports it (as for
    /// [`Device::graph_capture`]).
    pub fn virtual_memory(&self) -> Result<VirtualMemory<'_>> {
        supported("virtual memory", &self.capabilities().facts.virtual_memory)?;
        self.lock().hal.virtual_memory()?;
        Ok(VirtualMemory::new(self))
    }

    /// Whether two handles share one device (and its tables).
    pub fn same_device(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// How many raw allocations ([`Device::allocate`]) were freed through this device so far:
    /// a caller that knows how much the device keeps per free (a driver that does not give
    /// all of a freed allocation back) counts what its own frees kept.
    pub fn raw_frees(&self) -> u64 {
        self.lock().t.raw_frees
    }

    /// The bytes of the raw allocations freed through this device so far (those
    /// [`Device::raw_frees`] counts): however much a driver keeps of a free, it cannot keep
    /// more than the allocation held, so this bounds what a caller's own allocate/free pairs
    /// can have left held.
    pub fn raw_freed_bytes(&self) -> u64 {
        self.lock().t.raw_freed_bytes
    }

    /// What this device holds for its callers right now (for leak checks).
    pub fn live(&self) -> Live {
        self.lock().t.live()
    }

    /// Read backend-specific extras of the device, when its backend type is `T` (e.g. the
    /// CUDA backend's NVML reading). `None` for another backend.
    pub fn inspect<T: HalDevice, R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let g = self.lock();
        let any: &dyn Any = &*g.hal;
        any.downcast_ref::<T>().map(f)
    }
}

fn supported(what: &'static str, s: &Support) -> Result<()> {
    match s {
        Support::Supported => Ok(()),
        Support::Unsupported { reason } => Err(Error::unsupported(what, reason.clone())),
    }
}

/// A handle this device does not hold (already released, or another device's).
pub(crate) fn not_live(field: &str, noun: &str) -> Error {
    Error::invalid(
        field,
        format!("not a live {noun} of this device (released already, or another device's)"),
    )
}
