//! # memplan-core
//!
//! The backend-neutral heart of memplan: the memory model, the capabilities, the checked
//! device over the backends' raw primitives, and the snapshot primitive. It depends on no
//! vendor crate, ever (`cargo xtask ci` checks this with `cargo tree`).
//!
//! ## The contract
//!
//! - [`MemoryInfo`] is one snapshot of three layers that must never be confused: the driver
//!   (total/free), the engine's caching allocator (reserved/allocated/peak, this process only)
//!   and the graph pool (graph allocation nodes only). A value that could not be read is
//!   `None`, never 0. Windows ([`MemoryWindow`]) are differences of snapshots and keep their
//!   sign: a negative window is evidence, not something to clamp.
//! - [`ProfilingCapability`] says, per reading, how far it can be trusted ([`Reliability`]:
//!   exact, approximate within a tolerance, deferred until a synchronize, process-local,
//!   unavailable with a reason) and what the device can do ([`DeviceFacts`]). Backends declare
//!   it from facts; calibration confirms or downgrades it.
//! - **Backends supply raw primitives only** ([`hal`]: [`HalDevice`], [`HalGraphs`],
//!   [`HalVirtualMemory`]), in the style of wgpu-hal under wgpu-core: readings, synchronize,
//!   allocate/free a pointer, reserve/map/unmap/free an address range, begin/record/end a
//!   capture, destroy a graph. They keep no tables and trust their caller; primitives that take
//!   an address back are `unsafe`.
//! - **The core does the bookkeeping once** ([`Device`]): it wraps a backend's device, mints
//!   opaque handles ([`RawAllocation`], [`VaRange`], [`Mapping`], [`GraphId`]) that safe code
//!   cannot forge, checks every handle passed back, refuses zero sizes, misaligned offsets,
//!   overlapping mappings, release before unmap and any call a capture in progress forbids,
//!   undoes a half-done mapping, keeps whatever a failed release left behind tracked (a failed
//!   release gives the handle back in [`Failed`] so it can be retried), and releases everything
//!   still live, in order, when the last clone of the device is dropped. Graph capture
//!   ([`GraphCapture`]) and virtual memory ([`VirtualMemory`]) are optional and give
//!   [`Error::Unsupported`] with the declared reason where the device lacks them.
//! - Backends never decide *when* to measure: that is [`protocol`] and the planner. A
//!   [`Device`] is a cheap clonable handle (clones share one device and its tables), for the
//!   several owners of a start-up: the engine, the measurement session, and guards that give
//!   memory back on drop ([`SharedDevice`] is its older name).
//! - A [`Backend`] enumerates and opens devices. Backends register with `inventory`
//!   ([`registry`]); the `memplan` facade selects them with cargo features and references each
//!   one so the linker keeps its registration. Every [`BackendKind`] parses in every build; one
//!   not compiled in is [`Error::BackendNotCompiled`].
//!
//! Dispatch is dynamic (`Box<dyn HalDevice>` inside a [`Device`]): a start-up tool makes a few
//! hundred calls, so the cost is irrelevant and one binary can carry every backend.
//!
//! Handles cannot be made outside the core:
//!
//! ```compile_fail
//! let forged = memplan_core::RawAllocation { address: 0x7000_0000, bytes: 4096 };
//! ```

pub mod alloc_conf;
pub mod allocator;
pub mod backend;
#[cfg(test)]
mod backend_list_format;
mod backends;
pub mod bytes;
pub mod capability;
pub mod device;
pub mod error;
pub mod graph;
pub mod hal;
pub mod handle;
pub mod input;
pub mod json;
pub mod kv;
pub mod memory;
pub mod protocol;
pub mod refusal;
pub mod registry;
pub mod tables;
pub mod vmm;

#[cfg(test)]
#[path = "device_tests.rs"]
mod device_tests;
#[cfg(test)]
mod testing;

pub use alloc_conf::AllocatorConfig;
pub use allocator::{AllocatorStats, AllocatorView, OwnAccounting, TensorId};
pub use backend::{
    Backend, BackendInfo, BackendKind, BackendStatus, DeviceDescriptor, DeviceId, Layout,
};
pub use capability::{
    DeviceFacts, GraphRelease, ProfilingCapability, Reading, Reliability, Support,
};
pub use device::{Device, SharedDevice};
pub use error::{Error, ErrorClass, Result};
pub use graph::{CaptureWork, GraphCapture};
pub use hal::{HalDevice, HalGraph, HalGraphs, HalVirtualMemory};
pub use handle::{Failed, GraphId, Mapping, RawAllocation, VaRange};
pub use memory::{
    AllocatorMemory, DeviceWideMemory, DriverMemory, GraphPoolMemory, MemoryInfo, MemoryWindow,
};
pub use refusal::{MemoryNowCap, Param, Refusal, RoundingReserve};
pub use registry::BackendRegistration;
pub use tables::Live;
pub use vmm::VirtualMemory;

pub use inventory;
