//! [`SharedDevice`]: one opened device that several owners hold at once.
//!
//! A start-up has several owners of the same device: the engine (its allocations and graphs),
//! the measurement session, and guards that must give memory back when they are dropped (the
//! KV cache's reserved address range). `SharedDevice` is a cheap clonable handle on one
//! `Box<dyn Device>` behind a mutex; it is itself a [`Device`] (and a [`GraphCapture`] and
//! [`VirtualMemory`] where the device has them), so everything that takes `&mut dyn Device`
//! takes it. Each call locks the device for that call only: no lock is held across an engine
//! callback, so an engine that holds a clone can use it inside memplan's steps.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::capability::ProfilingCapability;
use crate::device::{Device, DeviceDescriptor, RawAllocation};
use crate::error::Result;
use crate::graph::{CaptureWork, GraphCapture, GraphId};
use crate::memory::{DriverMemory, GraphPoolMemory};
use crate::vmm::{Mapping, VaRange, VirtualMemory};

/// A clonable handle on one opened device; clones share it. See the module docs.
#[derive(Clone)]
pub struct SharedDevice {
    inner: Arc<Mutex<Box<dyn Device>>>,
    descriptor: DeviceDescriptor,
    capability: ProfilingCapability,
}

impl SharedDevice {
    /// Share a device.
    pub fn new(device: impl Device + 'static) -> Self {
        Self::from_box(Box::new(device))
    }

    /// Share a boxed device (what `memplan::open` returns).
    pub fn from_box(device: Box<dyn Device>) -> Self {
        SharedDevice {
            descriptor: device.descriptor().clone(),
            capability: device.capabilities().clone(),
            inner: Arc::new(Mutex::new(device)),
        }
    }

    /// Lock the device for several calls in a row. Do not hold the guard across a call that
    /// uses another clone of this handle (it would wait for itself).
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn Device>> {
        // A panic in another holder leaves the device as the backend left it; the backend's
        // own bookkeeping stays consistent per call, so keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether two handles share one device.
    pub fn same_device(&self, other: &SharedDevice) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl From<Box<dyn Device>> for SharedDevice {
    fn from(device: Box<dyn Device>) -> Self {
        Self::from_box(device)
    }
}

impl std::fmt::Debug for SharedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedDevice")
            .field("id", &self.descriptor.id.to_string())
            .field("owners", &Arc::strong_count(&self.inner))
            .finish()
    }
}

impl Device for SharedDevice {
    fn descriptor(&self) -> &DeviceDescriptor {
        &self.descriptor
    }

    fn capabilities(&self) -> &ProfilingCapability {
        &self.capability
    }

    fn driver_memory(&mut self) -> Result<DriverMemory> {
        self.lock().driver_memory()
    }

    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        self.lock().graph_pool_memory()
    }

    fn synchronize(&mut self) -> Result<()> {
        self.lock().synchronize()
    }

    fn allocate(&mut self, bytes: u64) -> Result<RawAllocation> {
        self.lock().allocate(bytes)
    }

    fn free(&mut self, allocation: RawAllocation) -> Result<()> {
        self.lock().free(allocation)
    }

    fn graph_capture(&mut self) -> Result<&mut dyn GraphCapture> {
        // Supported or not is the device's answer; the calls themselves go through `self`.
        self.lock().graph_capture().map(|_| ())?;
        Ok(self)
    }

    fn virtual_memory(&mut self) -> Result<&mut dyn VirtualMemory> {
        self.lock().virtual_memory().map(|_| ())?;
        Ok(self)
    }
}

impl GraphCapture for SharedDevice {
    fn begin_capture(&mut self) -> Result<()> {
        self.lock().graph_capture()?.begin_capture()
    }
    fn record(&mut self, work: &CaptureWork) -> Result<()> {
        self.lock().graph_capture()?.record(work)
    }
    fn end_capture(&mut self) -> Result<GraphId> {
        self.lock().graph_capture()?.end_capture()
    }
    fn abort_capture(&mut self) -> Result<()> {
        self.lock().graph_capture()?.abort_capture()
    }
    fn replay(&mut self, graph: GraphId) -> Result<()> {
        self.lock().graph_capture()?.replay(graph)
    }
    fn destroy(&mut self, graph: GraphId) -> Result<()> {
        self.lock().graph_capture()?.destroy(graph)
    }
    fn release_pool(&mut self) -> Result<()> {
        self.lock().graph_capture()?.release_pool()
    }
}

impl VirtualMemory for SharedDevice {
    fn granularity(&mut self) -> Result<u64> {
        self.lock().virtual_memory()?.granularity()
    }
    fn reserve(&mut self, bytes: u64) -> Result<VaRange> {
        self.lock().virtual_memory()?.reserve(bytes)
    }
    fn map(&mut self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping> {
        self.lock().virtual_memory()?.map(range, offset, bytes)
    }
    fn unmap(&mut self, mapping: Mapping) -> Result<()> {
        self.lock().virtual_memory()?.unmap(mapping)
    }
    fn release(&mut self, range: VaRange) -> Result<()> {
        self.lock().virtual_memory()?.release(range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{BackendKind, DeviceId};

    /// A device that counts synchronizes and supports nothing optional.
    struct Counter {
        d: DeviceDescriptor,
        c: ProfilingCapability,
        syncs: u32,
    }

    impl Device for Counter {
        fn descriptor(&self) -> &DeviceDescriptor {
            &self.d
        }
        fn capabilities(&self) -> &ProfilingCapability {
            &self.c
        }
        fn driver_memory(&mut self) -> Result<DriverMemory> {
            Ok(DriverMemory {
                total: Some(u64::from(self.syncs)),
                free: None,
            })
        }
        fn synchronize(&mut self) -> Result<()> {
            self.syncs += 1;
            Ok(())
        }
        fn allocate(&mut self, bytes: u64) -> Result<RawAllocation> {
            Ok(RawAllocation { handle: 1, bytes })
        }
        fn free(&mut self, _: RawAllocation) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn clones_share_one_device_and_optional_parts_stay_optional() {
        let a = SharedDevice::new(Counter {
            d: DeviceDescriptor {
                id: DeviceId::new(BackendKind::Sim, "t"),
                name: "t".into(),
                total_bytes: None,
                properties: Vec::new(),
            },
            c: ProfilingCapability::exact_discrete(),
            syncs: 0,
        });
        let mut b = a.clone();
        b.synchronize().unwrap();
        let mut a2 = a.clone();
        assert_eq!(a2.driver_memory().unwrap().total, Some(1));
        assert!(a.same_device(&b));
        assert!(matches!(
            a2.graph_capture().err(),
            Some(crate::Error::Unsupported { .. })
        ));
        assert!(a2.virtual_memory().is_err());
        assert_eq!(a.descriptor().id.to_string(), "sim:t");
    }
}
