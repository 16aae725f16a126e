//! A fake backend for the core's own tests: records every primitive it is called with, fails
//! the ones it is told to, and counts what is live at its level (what a driver would hold).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::backend::{BackendKind, DeviceDescriptor, DeviceId};
use crate::capability::ProfilingCapability;
use crate::error::{Error, Result};
use crate::graph::CaptureWork;
use crate::hal::{HalDevice, HalGraph, HalGraphs, HalVirtualMemory};
use crate::memory::DriverMemory;

/// What the fake driver holds and was asked.
#[derive(Debug, Default)]
pub(crate) struct Driver {
    pub calls: Vec<&'static str>,
    pub fail: BTreeSet<&'static str>,
    pub allocations: BTreeMap<u64, u64>,
    pub ranges: BTreeMap<u64, u64>,
    pub physical: BTreeMap<u64, u64>,
    pub mapped: BTreeMap<u64, u64>,
    pub next: u64,
}

/// A handle on the fake driver's state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Calls(Arc<Mutex<Driver>>);

impl Calls {
    /// The calls so far, clearing them.
    pub fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut self.0.lock().unwrap().calls)
    }
    /// Fail every later call named `call` until `heal`.
    pub fn fail(&self, call: &'static str) {
        self.0.lock().unwrap().fail.insert(call);
    }
    /// Stop failing `call`.
    pub fn heal(&self, call: &'static str) {
        self.0.lock().unwrap().fail.remove(call);
    }
    /// Read the driver state.
    pub fn with<R>(&self, f: impl FnOnce(&Driver) -> R) -> R {
        f(&self.0.lock().unwrap())
    }
}

/// The fake device.
pub(crate) struct FakeHal {
    descriptor: DeviceDescriptor,
    pub caps: ProfilingCapability,
    calls: Calls,
    pub granularity: u64,
}

impl FakeHal {
    pub fn new() -> (Self, Calls) {
        let calls = Calls::default();
        let hal = FakeHal {
            descriptor: DeviceDescriptor {
                id: DeviceId::new(BackendKind::Sim, "fake"),
                name: "fake".into(),
                total_bytes: Some(1 << 30),
                properties: Vec::new(),
            },
            caps: ProfilingCapability::exact_discrete(),
            calls: calls.clone(),
            granularity: 2,
        };
        (hal, calls)
    }

    fn call(&self, name: &'static str) -> Result<std::sync::MutexGuard<'_, Driver>> {
        let mut d = self.calls.0.lock().unwrap();
        d.calls.push(name);
        if d.fail.contains(name) {
            return Err(Error::DriverCall {
                call: name.into(),
                code: 1,
                name: "FAKE_ERROR".into(),
            });
        }
        d.next += 0x1000;
        Ok(d)
    }
}

impl HalDevice for FakeHal {
    fn descriptor(&self) -> &DeviceDescriptor {
        &self.descriptor
    }
    fn capabilities(&self) -> &ProfilingCapability {
        &self.caps
    }
    fn driver_memory(&mut self) -> Result<DriverMemory> {
        Ok(DriverMemory::default())
    }
    fn synchronize(&mut self) -> Result<()> {
        self.call("synchronize").map(drop)
    }
    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        let mut d = self.call("allocate")?;
        let a = d.next;
        d.allocations.insert(a, bytes);
        Ok(a)
    }
    unsafe fn free(&mut self, address: u64, bytes: u64) -> Result<()> {
        let mut d = self.call("free")?;
        assert_eq!(d.allocations.remove(&address), Some(bytes), "bad free");
        Ok(())
    }
    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        Ok(self)
    }
    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        Ok(self)
    }
}

impl HalGraphs for FakeHal {
    fn begin_capture(&mut self) -> Result<()> {
        self.call("begin").map(drop)
    }
    fn record(&mut self, _: &CaptureWork) -> Result<()> {
        self.call("record")
            .map(drop)
            .map_err(|_| Error::unsupported("graph allocation nodes", "fake"))
    }
    fn end_capture(&mut self) -> Result<HalGraph> {
        let d = self.call("end")?;
        Ok(HalGraph {
            graph: d.next,
            exec: d.next + 1,
        })
    }
    fn abort_capture(&mut self) -> Result<()> {
        self.call("abort").map(drop)
    }
    unsafe fn replay(&mut self, _: HalGraph) -> Result<()> {
        self.call("replay").map(drop)
    }
    unsafe fn destroy_exec(&mut self, _: u64) -> Result<()> {
        self.call("destroy_exec").map(drop)
    }
    unsafe fn destroy_graph(&mut self, _: u64) -> Result<()> {
        self.call("destroy_graph").map(drop)
    }
    fn release_pool(&mut self) -> Result<()> {
        self.call("release_pool").map(drop)
    }
}

impl HalVirtualMemory for FakeHal {
    fn granularity(&mut self) -> Result<u64> {
        let g = self.granularity;
        self.call("granularity").map(|_| g)
    }
    fn reserve(&mut self, bytes: u64) -> Result<u64> {
        let mut d = self.call("reserve")?;
        let base = d.next << 20;
        d.ranges.insert(base, bytes);
        Ok(base)
    }
    unsafe fn free_range(&mut self, base: u64, bytes: u64) -> Result<()> {
        let mut d = self.call("free_range")?;
        let inside = d.mapped.keys().any(|a| (base..base + bytes).contains(a));
        assert!(!inside, "a range freed under a mapping");
        assert_eq!(d.ranges.remove(&base), Some(bytes), "bad free_range");
        Ok(())
    }
    fn create_physical(&mut self, bytes: u64) -> Result<u64> {
        let mut d = self.call("create_physical")?;
        let p = d.next;
        d.physical.insert(p, bytes);
        Ok(p)
    }
    unsafe fn destroy_physical(&mut self, physical: u64, bytes: u64) -> Result<()> {
        let mut d = self.call("destroy_physical")?;
        assert_eq!(d.physical.remove(&physical), Some(bytes), "bad destroy");
        Ok(())
    }
    unsafe fn map(&mut self, address: u64, bytes: u64, _: u64) -> Result<()> {
        let mut d = self.call("map")?;
        assert!(d.mapped.insert(address, bytes).is_none(), "mapped twice");
        Ok(())
    }
    unsafe fn set_access(&mut self, _: u64, _: u64) -> Result<()> {
        self.call("set_access").map(drop)
    }
    unsafe fn unmap(&mut self, address: u64, bytes: u64) -> Result<()> {
        let mut d = self.call("unmap")?;
        assert_eq!(d.mapped.remove(&address), Some(bytes), "bad unmap");
        Ok(())
    }
}
