//! # memplan-core
//!
//! The backend-neutral heart of memplan: the memory model, the capabilities, the backend
//! traits and the snapshot primitive. It depends on no vendor crate, ever (`cargo xtask ci`
//! checks this with `cargo tree`).
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
//! - A [`Backend`] enumerates and opens devices. A [`Device`] supplies readings and primitive
//!   operations (synchronize, raw allocate/free); graph capture ([`GraphCapture`]) and virtual
//!   memory ([`VirtualMemory`]) are optional and default to [`Error::Unsupported`].
//!   Backends never decide *when* to measure: that is [`protocol`] and the planner.
//!   [`SharedDevice`] is a clonable handle on one opened device, for the several owners of a
//!   start-up (the engine, the measurement session, guards that give memory back on drop).
//! - Backends register with `inventory` ([`registry`]); the `memplan` facade selects them with
//!   cargo features and references each one so the linker keeps its registration. Every
//!   [`BackendKind`] parses in every build; one not compiled in is
//!   [`Error::BackendNotCompiled`].
//!
//! Dispatch is dynamic (`Box<dyn Device>`): a start-up tool makes a few hundred calls, so
//! the cost is irrelevant and one binary can carry every backend.

pub mod allocator;
pub mod bytes;
pub mod capability;
pub mod device;
pub mod error;
pub mod graph;
pub mod input;
pub mod kv;
pub mod memory;
pub mod protocol;
pub mod refusal;
pub mod registry;
pub mod shared;
pub mod vmm;

pub use allocator::{AllocatorStats, AllocatorView, OwnAccounting};
pub use capability::{
    DeviceFacts, GraphRelease, ProfilingCapability, Reading, Reliability, Support,
};
pub use device::{
    Backend, BackendKind, BackendStatus, Device, DeviceDescriptor, DeviceId, RawAllocation,
};
pub use error::{Error, ErrorClass, Result};
pub use graph::{CaptureWork, GraphCapture, GraphId};
pub use memory::{AllocatorMemory, DriverMemory, GraphPoolMemory, MemoryInfo, MemoryWindow};
pub use refusal::{Param, Refusal};
pub use registry::BackendRegistration;
pub use shared::SharedDevice;
pub use vmm::{Mapping, VaRange, VirtualMemory};

pub use inventory;
