//! # memplan-backend-cuda
//!
//! memplan's NVIDIA backend: the CUDA driver API through cudarc 0.19, loaded at run time, so a
//! binary that includes it builds anywhere and starts on machines without NVIDIA's driver.
//!
//! ## The contract
//!
//! - **No panic without a driver.** cudarc's loader panics on a missing library or symbol, so
//!   memplan calls the driver through its own wrappers ([`ffi`]), resolved from the library
//!   [`loader`] found (the names cudarc tries, in its order), after checking the symbols and the
//!   driver version (`cuDriverGetVersion`) against a table ([`loader::Feature`]). A missing library is
//!   [`Error::LibraryNotFound`](memplan_core::Error::LibraryNotFound) naming `libcuda.so.1`; an
//!   old driver is `DriverTooOld`; a failing call is `DriverCall { call, code, name }` with the
//!   `CUresult` name; an allocation that does not fit is `OutOfMemory`.
//! - **Primary context.** A device retains the primary context (the one the CUDA runtime and
//!   PyTorch use), so in-process use shares the engine's context and costs nothing extra.
//! - **Readings.** `cuMemGetInfo` (exact, device-wide; the instance's memory under MIG);
//!   graph-pool attributes `USED/RESERVED_MEM_CURRENT/HIGH` (`cuDeviceGetGraphMemAttribute`,
//!   CUDA >= 11.4, graph allocation nodes only). The allocator layer is not the backend's: it
//!   comes from the engine's allocator view or memplan's own accounting.
//! - **Capability from facts** ([`capability`]): driver version, `VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`,
//!   `MEMORY_POOLS_SUPPORTED`, `INTEGRATED` (unified memory), the MIG profile in the device name.
//! - **Operations.** Raw allocations (`cuMemAlloc`), graph capture ([`graph`]: stream capture of
//!   a trivial kernel and a graph allocation node into the graph pool, trimmed with
//!   `cuDeviceGraphMemTrim`), virtual memory ([`vmm`]: reserve / create / map / set access).
//!   Everything memplan creates is destroyed when the device is dropped.
//! - **NVML** ([`nvml`]), optional: driver-reserved framebuffer and other processes' memory, as
//!   descriptor properties, and the framebuffer less its reserve as the device-wide reading's
//!   second total (what a `cuMemGetInfo` total above it misreports). Absent NVML is not an
//!   error: there is no second total then.
//!
//! ## Known limits
//!
//! - cudarc's bindings type `CUresult` as a Rust enum, where a code the bindings do not know
//!   would be undefined behaviour; [`ffi`] reads every result as an integer instead, and
//!   [`conv`] names the codes of CUDA 13.4 and calls any other `unknown code N`. cudarc
//!   supplies the handle and struct types only.
//! - Other processes' memory and the driver-reserved framebuffer come only from NVML; in a
//!   container with its own PID namespace NVML cannot tell this process from others.
//! - Not yet run on NVIDIA hardware: `docs/gpu-check.md` says how to check it in one go.
//!
//! ## Features
//!
//! - `runtime` (default): everything that touches the driver (cudarc, libloading, [`ffi`],
//!   [`loader`], the device, graphs, virtual memory, NVML).
//! - `register` (the facade's `cuda` feature): `runtime` plus the registration with the core.
//!   Separate, because the simulator links this crate for its declaration and cargo unifies
//!   features over a workspace build.
//! - Without it (`default-features = false`) only the pure declaration compiles:
//!   [`capability`] ([`facts::CudaFacts`] and [`capability::declare`]) and [`facts`]
//!   (the driver version and its feature table). The simulator builds its NVIDIA profiles'
//!   capabilities through these, so a simulated profile declares what this backend would.
//!
//! The layout is the same in every backend folder: `loader`, `backend`, `device`, `capability`,
//! `facts`, `graph`, `vmm`, `conv` (plus `kernel` and `nvml` here). Tests that need a GPU are marked
//! `#[ignore = "needs an NVIDIA GPU"]` and run by `scripts/gpu-check.sh` with `--ignored`.

pub mod capability;
pub mod facts;

#[cfg(feature = "runtime")]
pub mod backend;
#[cfg(feature = "runtime")]
pub mod conv;
#[cfg(feature = "runtime")]
pub mod device;
#[cfg(feature = "runtime")]
pub mod ffi;
#[cfg(feature = "runtime")]
pub mod graph;
#[cfg(feature = "runtime")]
pub mod kernel;
#[cfg(feature = "runtime")]
pub mod loader;
#[cfg(feature = "runtime")]
pub mod nvml;
#[cfg(feature = "runtime")]
pub mod vmm;

#[cfg(all(test, feature = "runtime"))]
mod gpu_tests;

#[cfg(feature = "runtime")]
pub use backend::CudaBackend;
#[cfg(feature = "runtime")]
pub use device::CudaDevice;

#[cfg(feature = "register")]
memplan_core::inventory::submit! {
    memplan_core::BackendRegistration::new(memplan_core::BackendKind::Cuda, create)
}

#[cfg(feature = "register")]
fn create() -> Box<dyn memplan_core::Backend> {
    Box::new(CudaBackend)
}

/// Referenced by the facade so the linker keeps this crate's registration.
pub fn link() {}
