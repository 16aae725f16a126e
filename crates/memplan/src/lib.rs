//! # memplan
//!
//! The facade engines depend on. Backends are chosen with cargo features:
//!
//! | feature | backend | default |
//! |---|---|---|
//! | `sim`  | simulated GPUs (`sim:rtx4090`, ...) | yes |
//! | `cuda` | NVIDIA, driver loaded at run time  | no (on in the CLI) |
//! | `rocm` | AMD HIP runtime, loaded at run time | no |
//! | `xpu`  | Intel Level Zero, loaded at run time | no |
//!
//! Every backend name parses in every build; asking for one that is not compiled in returns
//! [`Error::BackendNotCompiled`] naming the feature. A binary with every runtime-loaded backend
//! starts on a machine with no vendor library and reports each one unavailable with the reason.

pub use memplan_core::*;

/// Reference every compiled-in backend crate so the linker keeps its `inventory` registration.
fn link_backends() {
    #[cfg(feature = "sim")]
    memplan_backend_sim::link();
    #[cfg(feature = "cuda")]
    memplan_backend_cuda::link();
    #[cfg(feature = "rocm")]
    memplan_backend_rocm::link();
    #[cfg(feature = "xpu")]
    memplan_backend_xpu::link();
}

/// The backends compiled into this build.
pub fn compiled_backends() -> Vec<BackendKind> {
    link_backends();
    memplan_core::registry::registered()
        .iter()
        .map(|r| r.kind)
        .collect()
}

/// Create a compiled-in backend, or a typed error when it is not compiled in.
pub fn backend(kind: BackendKind) -> Result<Box<dyn Backend>> {
    link_backends();
    memplan_core::registry::registered()
        .into_iter()
        .find(|r| r.kind == kind)
        .map(|r| (r.create)())
        .ok_or_else(|| Error::BackendNotCompiled {
            backend: kind,
            feature: kind.feature(),
            compiled: compiled_list(),
        })
}

fn compiled_list() -> String {
    let v: Vec<_> = compiled_backends().iter().map(|k| k.name()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Open a device by id (`sim:rtx4090`, `cuda:0`).
pub fn open(id: &str) -> Result<Box<dyn Device>> {
    let id: DeviceId = id.parse()?;
    let span = tracing::debug_span!("open", device = %id);
    let _e = span.enter();
    backend(id.backend)?.open(&id.selector)
}

/// Open a device by id as a [`SharedDevice`]: the engine, the measurement session and the
/// guards that give memory back on drop each hold a clone of one device.
pub fn open_shared(id: &str) -> Result<SharedDevice> {
    open(id).map(SharedDevice::from_box)
}

/// One backend's report for `memplan devices`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackendReport {
    /// Which backend.
    pub backend: BackendKind,
    /// Available, or why not.
    #[serde(flatten)]
    pub status: BackendStatus,
    /// Its devices (empty when unavailable).
    pub devices: Vec<DeviceDescriptor>,
}

/// Enumerate every compiled-in backend and its devices. Never fails: a backend that cannot
/// run is reported unavailable with its reason.
pub fn survey() -> Vec<BackendReport> {
    link_backends();
    memplan_core::registry::registered()
        .into_iter()
        .map(|r| {
            let b = (r.create)();
            match b.devices() {
                Ok(devices) => BackendReport {
                    backend: r.kind,
                    status: BackendStatus::Available,
                    devices,
                },
                Err(e) => BackendReport {
                    backend: r.kind,
                    status: BackendStatus::Unavailable {
                        reason: e.to_string(),
                    },
                    devices: Vec::new(),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_backend_is_a_typed_error() {
        // `xpu` is never in the default feature set of this crate's tests.
        if compiled_backends().contains(&BackendKind::Xpu) {
            return;
        }
        let e = open("xpu:0").err().expect("xpu is not compiled in");
        assert!(matches!(e, Error::BackendNotCompiled { .. }), "{e}");
        assert!(e.to_string().contains("--features xpu"), "{e}");
    }
}
