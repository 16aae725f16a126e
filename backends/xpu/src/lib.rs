//! # memplan-backend-xpu
//!
//! Intel GPUs through Level Zero, loaded at run time (`libze_loader.so.1`, through this
//! workspace's own [`level_zero_sys`]). A binary with this backend starts on a machine without
//! the loader and reports the backend unavailable with the reason.
//!
//! ## The contract
//!
//! - **Loading.** Creating [`XpuBackend`] loads nothing. The first `devices()`/`open()` opens
//!   the loader (`MEMPLAN_LEVEL_ZERO_LOADER` overrides the file name), initialises GPU drivers
//!   only (`zeInitDrivers` where the loader has it, else `zeInit(ZE_INIT_FLAG_GPU_ONLY)`) and
//!   enumerates root devices; the ordinal of `xpu:N` counts root GPU devices over all drivers.
//!   Sub-devices (tiles) are listed in the descriptor, not opened separately.
//! - **Errors** carry the call and the `ze_result_t` by name ([`Error::DriverCall`]): with
//!   the loader installed but no GPU driver, `zeInit` fails with the loader's own code
//!   (`ZE_RESULT_ERROR_UNINITIALIZED`). A missing loader is [`Error::LibraryNotFound`].
//! - **Readings** ([`device`], [`sysman`]): total from Sysman's device-local modules, or from
//!   `zeDeviceGetMemoryProperties` when Sysman is unavailable; free only from Sysman, absent
//!   (never 0) otherwise. Sysman is reached through `ZES_ENABLE_SYSMAN=1` when the process was
//!   started with it, else through `zesInit` (spec 1.5+) matched by UUID; memplan never sets
//!   the variable. A Sysman read (~150 ms) is cached until the next synchronize, allocation,
//!   free or mapping change, so one snapshot pays once.
//! - **Capabilities** ([`capability`]): the known traps are declarations, not numbers: Sysman
//!   unavailable, integrated GPU (free unavailable, unified memory), free == total with a
//!   context open (the i915 non-root report: approximate and suspect until calibration).
//!   No graph-memory query exists on Level Zero and record/replay is not implemented
//!   ([`graph`]): graph capture and graph-pool attributes are unsupported, with the reason.
//!   Virtual memory ([`vmm`]) is supported when `zeVirtualMemQueryPageSize` succeeds.
//! - **Primitive operations**: raw allocations are `zeMemAllocDevice` in the device's own
//!   context; `synchronize` submits and waits for nothing (this backend never submits work;
//!   Level Zero has no device-wide synchronize) and starts a new snapshot's cache. The
//!   capability declares it (`facts.synchronize` unsupported, with the reason), so the
//!   protocol synchronizes the engine's own queues through `Engine::synchronize` before each
//!   reading instead. Everything a device still holds is released when it is dropped.
//!
//! ## Features
//!
//! - `runtime` (default): everything that touches the loader (level-zero-sys, [`loader`],
//!   the device, Sysman, virtual memory).
//! - `register` (the facade's `xpu` feature): `runtime` plus the registration with the core.
//!   Separate, because the simulator links this crate for its declaration and cargo unifies
//!   features over a workspace build.
//! - Without it (`default-features = false`) only the pure declaration compiles:
//!   [`capability`] ([`facts::Facts`], [`capability::declare`]), [`facts`] (what Sysman
//!   gave) and [`graph`] (what Level Zero offers for graphs). The simulator builds its Intel
//!   profiles' capabilities through these, so a simulated profile declares what this backend
//!   would.
//!
//! Registered with `inventory` as `BackendKind::Xpu` (with `register`); the `memplan` facade
//! calls [`link`].

pub mod capability;
pub mod facts;
pub mod graph;

#[cfg(feature = "runtime")]
pub mod backend;
#[cfg(feature = "runtime")]
pub mod conv;
#[cfg(feature = "runtime")]
pub mod device;
#[cfg(feature = "runtime")]
pub mod loader;
#[cfg(feature = "runtime")]
pub mod sysman;
#[cfg(feature = "runtime")]
pub mod vmm;

#[cfg(feature = "runtime")]
pub use backend::XpuBackend;
#[cfg(feature = "runtime")]
pub use device::XpuDevice;

#[cfg(all(doc, feature = "runtime"))]
use memplan_core::Error;
#[cfg(feature = "register")]
use memplan_core::{Backend, BackendKind, BackendRegistration};

#[cfg(feature = "register")]
fn create() -> Box<dyn Backend> {
    Box::new(XpuBackend::new())
}

#[cfg(feature = "register")]
memplan_core::inventory::submit! {
    BackendRegistration::new(BackendKind::Xpu, create)
}

/// Referenced by the facade so the linker keeps this crate's registration.
pub fn link() {}

#[cfg(all(test, feature = "runtime"))]
mod tests {
    use super::*;
    use memplan_core::{Backend, BackendKind, Error};

    #[test]
    fn missing_loader_is_library_not_found() {
        let b = XpuBackend::with_library("/nonexistent/libze_loader.so.1");
        let e = b.devices().unwrap_err();
        assert!(
            matches!(&e, Error::LibraryNotFound { library, .. } if library.contains("nonexistent")),
            "{e}"
        );
        let e = b.open("0").expect_err("no loader, no device");
        assert!(matches!(e, Error::LibraryNotFound { .. }), "{e}");
    }

    #[test]
    fn bad_selector_is_a_clear_error() {
        let e = XpuBackend::with_library("/nonexistent/x.so")
            .open("first")
            .expect_err("not an ordinal");
        assert!(e.to_string().contains("xpu:first"), "{e}");
    }

    /// Whatever this machine has, the answer is typed: devices, the loader's own code by name,
    /// or a missing library when the loader is not installed.
    #[test]
    fn real_loader_answers_with_a_named_code() {
        let loader_installed = [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/lib",
        ]
        .iter()
        .any(|d| {
            std::path::Path::new(d)
                .join(level_zero_sys::LOADER_LIBRARY)
                .exists()
        });
        match XpuBackend::with_library(level_zero_sys::LOADER_LIBRARY).devices() {
            Ok(devices) => assert!(devices.iter().all(|d| d.id.backend == BackendKind::Xpu)),
            Err(Error::DriverCall { call, name, .. }) => {
                assert!(loader_installed);
                assert!(name.starts_with("ZE_RESULT_"), "{call}: {name}");
            }
            Err(Error::BackendUnavailable { reason, .. }) => {
                assert!(reason.contains("no Level Zero GPU driver"), "{reason}")
            }
            Err(Error::LibraryNotFound { .. }) => {
                assert!(!loader_installed, "loader present but not loadable")
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
