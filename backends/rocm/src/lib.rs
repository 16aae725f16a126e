//! # memplan-backend-rocm
//!
//! memplan's backend for AMD GPUs and APUs through the HIP runtime (`rocm:N`, alias `hip:N`).
//!
//! ## The contract
//!
//! - **Loaded at run time.** `libamdhip64` is opened with libloading on the first call
//!   ([`loader`]); a binary built with `rocm` starts on a machine without it, and the backend
//!   reports itself unavailable with the reason: the library it could not load, the symbol it
//!   lacks, or the call that failed with its hipError_t code and name (`hipGetDeviceCount
//!   failed: hipErrorNoDevice (100)`). hip-runtime-sys supplies types and struct layouts only;
//!   return codes are read as integers ([`conv`]), never into its HIP 5.4 enums.
//! - **Capabilities are data.** Every version and device rule of DESIGN.md's AMD column is
//!   one row of [`capability::RULES`]: ROCm <= 5.4 free memory is process-local; >= 5.5 it is
//!   device-wide but blind to graphics allocations (approximate), and where the amdgpu DRM
//!   counters exist ([`sysfs`]) free is the smaller of both; graph-pool attributes are absent
//!   before 5.3, a stub returning 0 until 5.5.1 and real from 5.6 (read into a zeroed u64,
//!   since older runtimes write 4 bytes); from 6.2 a destroyed graph's memory returns only at
//!   the next synchronize and ~4 MiB per capture stays hidden; APUs have unified memory bounded
//!   by the host's MemAvailable, not the VRAM aperture ([`free`]).
//! - **Readings and primitives only.** A device ([`device::RocmDevice`]) reads memory,
//!   synchronizes, allocates raw memory (hipMalloc), captures graphs ([`graph`]) and maps
//!   virtual memory ([`vmm`]) where supported. It never decides when to measure: the core's
//!   protocol and the planner do.
//! - **Errors, not panics.** Out of memory is [`memplan_core::Error::OutOfMemory`]; a failed
//!   call is `DriverCall { call, code, name }` (unknown codes are `unknown code N`); an
//!   optional operation the runtime or device lacks is `Unsupported` with the reason.
//!
//! ## Features
//!
//! - `runtime` (default): everything that touches the HIP runtime (libloading,
//!   hip-runtime-sys, the loader, the device, graphs, virtual memory, the sysfs and host
//!   readings).
//! - `register` (the facade's `rocm` feature): `runtime` plus the registration with the core.
//!   Separate, because the simulator links this crate for its declaration and cargo unifies
//!   features over a workspace build.
//! - Without it (`default-features = false`) only the pure declaration compiles:
//!   [`capability`] ([`facts::Inputs`], [`capability::declare`] and its rule table) and
//!   [`facts`] (the HIP version). The simulator builds its AMD profiles' capabilities through
//!   these, so a simulated profile declares what this backend would; no HIP headers are needed.
//!
//! ## Building
//!
//! hip-runtime-sys's build script needs the HIP headers: Debian's `libamdhip64-dev` with
//! `HIP_PATH=/usr`, or a ROCm install under `/opt/rocm`. The runtime itself is not needed to
//! build, and `libamdhip64` must not appear in `readelf -d` of the binary
//! (`tests/no_hard_link.rs`).

pub mod capability;
pub mod facts;

#[cfg(feature = "runtime")]
pub mod backend;
#[cfg(feature = "runtime")]
pub mod conv;
#[cfg(feature = "runtime")]
pub mod device;
#[cfg(feature = "runtime")]
pub mod free;
#[cfg(feature = "runtime")]
pub mod graph;
#[cfg(feature = "runtime")]
pub mod loader;
#[cfg(feature = "runtime")]
pub mod probe;
#[cfg(feature = "runtime")]
pub mod sysfs;
#[cfg(feature = "runtime")]
pub mod vmm;

#[cfg(feature = "runtime")]
pub use backend::RocmBackend;

#[cfg(feature = "register")]
memplan_core::inventory::submit! {
    memplan_core::BackendRegistration::new(memplan_core::BackendKind::Rocm, create_backend)
}

#[cfg(feature = "register")]
fn create_backend() -> Box<dyn memplan_core::Backend> {
    Box::new(RocmBackend::new())
}

/// Referenced by the facade so the linker keeps this crate's registration.
pub fn link() {}
