//! The hardware abstraction layer: the raw primitives a backend implements.
//!
//! This is the split of wgpu-hal under wgpu-core, or of cubecl's `ComputeStorage` under its
//! memory management: a backend makes vendor calls and nothing else. It keeps no table of what
//! it handed out, checks no handle, decides no ordering and undoes nothing it was not asked to.
//! The core's [`Device`](crate::Device) does all of that once, for every backend, and is the
//! only caller of these traits in memplan: it mints the opaque handles callers see, checks
//! every handle passed back against its tables, refuses zero sizes and misaligned offsets,
//! orders unmap before release, undoes a half-done mapping, keeps whatever a failed call left
//! behind tracked, and releases everything still live when the device is dropped.
//!
//! Methods that take an address or a handle back are `unsafe`: their precondition (the value
//! came from this backend and is live in the state the call expects) is what the core's tables
//! guarantee and what a caller outside the core could get wrong, e.g. freeing an engine's own
//! allocation through memplan. Safe code never reaches them with a value it made up.
//!
//! # Rules for an implementation
//!
//! - **One primitive, one vendor operation.** Where the vendor needs two calls for one
//!   primitive (end a capture, then instantiate it), a failure of the second undoes the first
//!   inside the primitive: a primitive that fails leaves nothing behind that the core does not
//!   know of.
//! - **Never panic** (nothing may unwind across the vendor library). Every error names the
//!   vendor call and its code ([`Error::DriverCall`]); an allocation
//!   the device cannot satisfy is [`Error::OutOfMemory`] naming the
//!   call; an operation the device lacks is [`Error::Unsupported`]
//!   with the reason.
//! - **Trust the caller.** Sizes arrive non-zero, offsets and sizes of virtual-memory calls are
//!   multiples of [`HalVirtualMemory::granularity`], addresses lie in live reservations, and no
//!   capture is in progress unless the call is about the capture. A backend need not check
//!   any of it again.
//! - **`Drop` releases only what the backend made for itself** (a stream, a kernel module, a
//!   scratch buffer, its context). Everything it handed out has been released by the core
//!   before the backend is dropped.
//! - Readings obey the crate's rule: a value that could not be read is `None` (with the reason
//!   logged), never 0.

use std::any::Any;

use crate::backend::{DeviceDescriptor, DeviceId};
use crate::capability::ProfilingCapability;
use crate::error::{Error, Result};
use crate::graph::CaptureWork;
use crate::memory::{DeviceWideMemory, DriverMemory, GraphPoolMemory};

/// One opened device, as a backend sees it.
///
/// The core wraps it in a [`Device`](crate::Device) (`Device::new`) and calls it with its lock
/// held, so calls never overlap.
pub trait HalDevice: Any + Send {
    /// Static description.
    fn descriptor(&self) -> &DeviceDescriptor;

    /// The capability as the backend declares it (before calibration). Read once, when the
    /// core wraps the device.
    fn capabilities(&self) -> &ProfilingCapability;

    /// Driver total/free. Absent values stay `None`. Does not synchronize.
    fn driver_memory(&mut self) -> Result<DriverMemory>;

    /// Graph-pool attributes; all `None` where the device has no such query (the default).
    /// One attribute that cannot be read is `None` (reason logged), not an error for all.
    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        Ok(GraphPoolMemory::default())
    }

    /// Device-wide memory from a source that counts every process and API (DRM sysfs, the
    /// host's available memory on a unified-memory APU, Sysman, a device-wide driver free).
    /// Default: not offered (`None`). A source that exists but cannot be read right now is
    /// `None` too (reason logged), never 0. The declaration's
    /// [`Reading::DeviceAvailable`](crate::Reading::DeviceAvailable) says how far it is trusted.
    fn device_wide_memory(&mut self) -> Result<DeviceWideMemory> {
        Ok(DeviceWideMemory::default())
    }

    /// The id another process opens to reach this same device: what the conformance suite's
    /// second process opens to tell a process-local reading from a device-wide one. Default:
    /// the descriptor's id (an ordinal names the same GPU in every process). A backend whose
    /// device lives inside this process (a fake runtime) keeps the default: a second process
    /// then opens a device of its own, which is the truth about such a device.
    fn shared_id(&mut self) -> Result<DeviceId> {
        Ok(self.descriptor().id.clone())
    }

    /// Wait for all work on the device (and deferred releases) to finish. A backend that can
    /// only wait for its own work declares `facts.synchronize` unsupported, with the reason.
    fn synchronize(&mut self) -> Result<()>;

    /// Allocate `bytes` (> 0) of device memory directly from the driver, no caching
    /// allocator. Returns its non-null device address.
    fn allocate(&mut self, bytes: u64) -> Result<u64>;

    /// Free a raw allocation.
    ///
    /// # Safety
    ///
    /// `address` was returned by [`HalDevice::allocate`] of this device for `bytes` and has
    /// not been freed since.
    unsafe fn free(&mut self, address: u64, bytes: u64) -> Result<()>;

    /// Graph capture. Called before every graph primitive, so it may create what capture
    /// needs (a stream, a kernel) on first use. Default: unsupported.
    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        Err(Error::unsupported(
            "graph capture",
            "this backend does not implement graph capture",
        ))
    }

    /// Virtual-memory management. Called before every virtual-memory primitive. Default:
    /// unsupported.
    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        Err(Error::unsupported(
            "virtual memory",
            "this backend does not implement virtual memory",
        ))
    }

    /// Which physical GPU this is, as the engine's allocator would name it
    /// ([`AllocatorView::gpu_id`](crate::AllocatorView::gpu_id)): two handles with the same id
    /// work on the same GPU. Read once, when the core wraps the device. Default: unknown
    /// (`None`), and nothing is checked.
    fn gpu_id(&self) -> Option<String> {
        None
    }
}

/// A captured, instantiated graph: the backend's two objects, opaque to the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HalGraph {
    /// The captured graph (`CUgraph`, `hipGraph_t`).
    pub graph: u64,
    /// Its executable form (`CUgraphExec`, `hipGraphExec_t`).
    pub exec: u64,
}

impl HalGraph {
    /// A captured graph and its executable form, as the backend's handles.
    pub const fn new(graph: u64, exec: u64) -> Self {
        Self { graph, exec }
    }
}

/// Graph capture on one device's stream.
///
/// The core calls `begin_capture`, then `record` any number of times, then `end_capture` or
/// `abort_capture`, and nothing else of the device in between. It destroys each graph it got
/// from `end_capture` exactly once: `destroy_exec`, then `destroy_graph`.
pub trait HalGraphs {
    /// Start capturing on the device's stream.
    fn begin_capture(&mut self) -> Result<()>;

    /// Record work into the capture in progress.
    fn record(&mut self, work: &CaptureWork) -> Result<()>;

    /// End the capture in progress and instantiate the graph. The capture is over whether or
    /// not this succeeds; on error no part of the graph is left.
    fn end_capture(&mut self) -> Result<HalGraph>;

    /// Abandon the capture in progress (the core calls it only while one is). Leaves the
    /// stream out of capture mode and destroys any partial graph, also when the driver had
    /// already invalidated the capture.
    fn abort_capture(&mut self) -> Result<()>;

    /// Launch a graph once and wait for it.
    ///
    /// # Safety
    ///
    /// `graph` came from [`HalGraphs::end_capture`] of this device and neither of its objects
    /// was destroyed.
    unsafe fn replay(&mut self, graph: HalGraph) -> Result<()>;

    /// Destroy a graph's executable.
    ///
    /// # Safety
    ///
    /// `exec` is the `exec` of a graph from [`HalGraphs::end_capture`] of this device, not
    /// destroyed yet.
    unsafe fn destroy_exec(&mut self, exec: u64) -> Result<()>;

    /// Destroy a captured graph (after its executable).
    ///
    /// # Safety
    ///
    /// `graph` is the `graph` of a graph from [`HalGraphs::end_capture`] of this device, not
    /// destroyed yet.
    unsafe fn destroy_graph(&mut self, graph: u64) -> Result<()>;

    /// Return the graph pool's unused memory to the driver (after a synchronize of the
    /// backend's own, where the trim waits for nothing).
    fn release_pool(&mut self) -> Result<()>;
}

/// Virtual-memory primitives of one device.
///
/// The core maps by `create_physical`, `map`, `set_access`, and unmaps by `unmap`, then
/// `destroy_physical`; a range is freed only once nothing is mapped in it.
pub trait HalVirtualMemory {
    /// Allocation granularity: every size and offset the core passes is a multiple of it. The
    /// core asks once and caches a non-zero answer.
    fn granularity(&mut self) -> Result<u64>;

    /// Reserve `bytes` of address space (no physical memory). Returns the non-null base.
    fn reserve(&mut self, bytes: u64) -> Result<u64>;

    /// Free a reservation.
    ///
    /// # Safety
    ///
    /// `base`/`bytes` came from [`HalVirtualMemory::reserve`] of this device, not freed yet,
    /// and nothing is mapped in it.
    unsafe fn free_range(&mut self, base: u64, bytes: u64) -> Result<()>;

    /// Create `bytes` of physical device memory, mapped nowhere. Returns its handle.
    fn create_physical(&mut self, bytes: u64) -> Result<u64>;

    /// Release physical memory.
    ///
    /// # Safety
    ///
    /// `physical` came from [`HalVirtualMemory::create_physical`] of this device for `bytes`,
    /// is not destroyed yet and is mapped nowhere.
    unsafe fn destroy_physical(&mut self, physical: u64, bytes: u64) -> Result<()>;

    /// Map all of `physical` at `address`.
    ///
    /// # Safety
    ///
    /// `[address, address + bytes)` lies inside a live reservation of this device and
    /// overlaps no live mapping; `physical` is a live, unmapped handle of exactly `bytes`.
    unsafe fn map(&mut self, address: u64, bytes: u64, physical: u64) -> Result<()>;

    /// Make a mapping readable and writable by the device. Default: nothing to do (the
    /// vendor's map already grants access).
    ///
    /// # Safety
    ///
    /// `[address, address + bytes)` was just mapped by [`HalVirtualMemory::map`].
    unsafe fn set_access(&mut self, address: u64, bytes: u64) -> Result<()> {
        let _ = (address, bytes);
        Ok(())
    }

    /// Unmap a mapping (its physical memory stays, for `destroy_physical`).
    ///
    /// # Safety
    ///
    /// `[address, address + bytes)` is exactly one live mapping made by
    /// [`HalVirtualMemory::map`] of this device.
    unsafe fn unmap(&mut self, address: u64, bytes: u64) -> Result<()>;
}
