//! Backends, device ids and descriptions.
//!
//! A [`Backend`] enumerates devices and opens them into a [`Device`]: the core's checked
//! device over the backend's raw primitives ([`crate::hal`]).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::device::Device;
use crate::error::{Error, Result};

/// Every backend memplan knows, compiled in or not (so every name parses in every build).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Simulated GPUs that reproduce each vendor's behaviour.
    Sim,
    /// NVIDIA CUDA (driver API through cudarc).
    Cuda,
    /// AMD ROCm (HIP runtime).
    Rocm,
    /// Intel GPUs through Level Zero.
    Xpu,
}

impl BackendKind {
    /// Every backend.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Sim,
        BackendKind::Cuda,
        BackendKind::Rocm,
        BackendKind::Xpu,
    ];

    /// The name used in device ids (`cuda:0`).
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sim => "sim",
            BackendKind::Cuda => "cuda",
            BackendKind::Rocm => "rocm",
            BackendKind::Xpu => "xpu",
        }
    }

    /// The cargo feature of the `memplan` facade that compiles it in.
    pub fn feature(self) -> &'static str {
        self.name()
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let l = s.to_ascii_lowercase();
        BackendKind::ALL
            .into_iter()
            .find(|k| {
                k.name() == l
                    || (l == "hip" && *k == BackendKind::Rocm)
                    || (l == "level-zero" && *k == BackendKind::Xpu)
            })
            .ok_or_else(|| Error::UnknownBackend {
                name: s.to_string(),
                known: BackendKind::ALL.map(|k| k.name()).join(", "),
            })
    }
}

/// A device id: `backend:selector`, e.g. `cuda:0`, `sim:rtx4090`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceId {
    /// The backend.
    pub backend: BackendKind,
    /// Backend-specific selector: an ordinal for real backends, a profile name for `sim`.
    pub selector: String,
}

impl DeviceId {
    /// A device id.
    pub fn new(backend: BackendKind, selector: impl Into<String>) -> Self {
        DeviceId {
            backend,
            selector: selector.into(),
        }
    }

    /// The selector as an ordinal, or an `UnknownDevice` error.
    pub fn ordinal(&self) -> Result<usize> {
        self.selector.parse().map_err(|_| Error::UnknownDevice {
            id: self.to_string(),
            available: format!("{}:N with N a device ordinal", self.backend),
        })
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.selector)
    }
}

impl FromStr for DeviceId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (b, sel) = s.split_once(':').unwrap_or((s, "0"));
        let backend: BackendKind = b.parse()?;
        if sel.is_empty() {
            return Err(Error::UnknownDevice {
                id: s.into(),
                available: format!("{backend}:N"),
            });
        }
        Ok(DeviceId::new(backend, sel))
    }
}

/// Static description of a device, as enumerated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceDescriptor {
    /// Its id.
    pub id: DeviceId,
    /// Marketing name as the driver reports it.
    pub name: String,
    /// Total memory as the driver reports it, when it could be read.
    pub total_bytes: Option<u64>,
    /// Free-form facts (compute capability, gfx arch, driver/runtime version, MIG, UUID...).
    pub properties: Vec<(String, String)>,
}

impl DeviceDescriptor {
    /// A descriptor with no properties.
    pub fn new(id: DeviceId, name: impl Into<String>, total_bytes: Option<u64>) -> Self {
        Self {
            id,
            name: name.into(),
            total_bytes,
            properties: Vec::new(),
        }
    }

    /// The same descriptor with `properties` in place of its properties.
    pub fn with_properties(mut self, properties: Vec<(String, String)>) -> Self {
        self.properties = properties;
        self
    }

    /// The same descriptor with one more property.
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }
}

/// Whether a compiled-in backend can run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BackendStatus {
    /// It loaded and can enumerate devices.
    Available,
    /// It cannot run here; `reason` names the library, the call and what it returned.
    Unavailable {
        /// Why not.
        reason: String,
    },
}

/// A backend: one vendor API.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Load the vendor library and enumerate devices. Never panics: a missing library or a
    /// failing init call is an `Err` naming the library, the call and the returned code.
    /// Cost: loads libraries on first call; cheap afterwards.
    fn devices(&self) -> Result<Vec<DeviceDescriptor>>;

    /// Open a device by selector (ordinal, or profile name for `sim`): the backend's
    /// [`HalDevice`](crate::hal::HalDevice) wrapped in the core's [`Device`] (`Device::new`).
    fn open(&self, selector: &str) -> Result<Device>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ids() {
        let d: DeviceId = "sim:rtx4090".parse().unwrap();
        assert_eq!(d.backend, BackendKind::Sim);
        assert_eq!(d.selector, "rtx4090");
        let c: DeviceId = "cuda".parse().unwrap();
        assert_eq!(c.to_string(), "cuda:0");
        assert_eq!(c.ordinal().unwrap(), 0);
        assert_eq!(
            "HIP:1".parse::<DeviceId>().unwrap().backend,
            BackendKind::Rocm
        );
        let e = "metal:0".parse::<DeviceId>().unwrap_err().to_string();
        assert!(
            e.contains("unknown backend `metal`") && e.contains("cuda"),
            "{e}"
        );
        assert!("cuda:".parse::<DeviceId>().is_err());
        assert!("cuda:x".parse::<DeviceId>().unwrap().ordinal().is_err());
    }
}
