//! The `sim` backend: enumerates every profile and opens devices by selector (the same
//! selector twice in one process gives the same GPU, see [`SimGpu::shared`]).

use memplan_core::{Backend, BackendKind, Device, DeviceDescriptor, Result};

use crate::gpu::SimGpu;
use crate::profile::profiles;

/// The simulated backend. Always available.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimBackend;

impl Backend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Sim
    }

    fn devices(&self) -> Result<Vec<DeviceDescriptor>> {
        Ok(profiles()
            .iter()
            .map(|p| SimGpu::new(p).shared.descriptor.clone())
            .collect())
    }

    fn open(&self, selector: &str) -> Result<Device> {
        Ok(SimGpu::shared(selector)?.device())
    }
}

#[cfg(feature = "register")]
fn create() -> Box<dyn Backend> {
    Box::new(SimBackend)
}

// Behind `register` (the facade's `sim` feature), like every backend's: crates that link the
// simulator for its types or declarations do not make `sim:` ids openable by themselves.
#[cfg(feature = "register")]
memplan_core::inventory::submit! {
    memplan_core::BackendRegistration::new(BackendKind::Sim, create)
}
