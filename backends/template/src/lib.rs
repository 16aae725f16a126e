//! # memplan-backend-template
//!
//! A complete minimal backend, over a fake runtime that lives in this process ([`fake`]): the
//! starting point of a new backend, and the crate `docs/adding-a-backend.md` walks through
//! (the guide's code is this crate's, checked by a test). CI builds it and runs the
//! conformance suite on `template:0`.
//!
//! ## The contract
//!
//! - **Loading** ([`loader`]): creating [`backend::TemplateBackend`] loads nothing; the first
//!   `devices()`/`open()` initialises the runtime and checks its version. A missing runtime is
//!   [`Error::LibraryNotFound`](memplan_core::Error::LibraryNotFound) naming the library
//!   (`MEMPLAN_TEMPLATE_RUNTIME=absent` shows it), never a panic.
//! - **Readings** ([`device`]): `fake_mem_get_info` gives total and free; the graph-pool
//!   attributes come from `fake_graph_mem_get` where capture is declared. A value that cannot
//!   be read is an error or `None`, never 0.
//! - **Capability from facts** ([`capability`], [`facts`]): the runtime version and two device
//!   attributes; free is process-local (the device lives in this process).
//! - **Primitives**: raw allocations ([`device`]), graph capture ([`graph`]) and virtual
//!   memory ([`vmm`]), each one runtime call, errors naming the call ([`conv`]). The core's
//!   `Device` keeps every table; the device releases only its own context when dropped.
//!
//! ## Features
//!
//! - `runtime` (default): everything that touches the runtime.
//! - `register` (the facade's `template` feature): `runtime` plus the registration with the
//!   core.
//! - Without them (`default-features = false`) only [`capability`] and [`facts`] compile: the
//!   capability matrix is built from them with no vendor library.

pub mod capability;
pub mod facts;

#[cfg(feature = "runtime")]
pub mod backend;
#[cfg(feature = "runtime")]
pub mod conv;
#[cfg(feature = "runtime")]
pub mod device;
#[cfg(feature = "runtime")]
pub mod fake;
#[cfg(feature = "runtime")]
pub mod graph;
#[cfg(feature = "runtime")]
pub mod loader;
#[cfg(feature = "runtime")]
pub mod vmm;

// guide:begin register
#[cfg(feature = "register")]
memplan_core::inventory::submit! {
    memplan_core::BackendRegistration::new(memplan_core::BackendKind::Template, || {
        Box::new(backend::TemplateBackend)
    })
}

/// Referenced by the facade so the linker keeps the registration.
pub fn link() {}
// guide:end register
