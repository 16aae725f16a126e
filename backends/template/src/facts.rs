//! The facts the declaration is made from: what the runtime reported about one device at
//! open. Pure data, compiled without the `runtime` feature, so the capability matrix (and a
//! simulated profile of your platform, if you add one) declares through
//! [`crate::capability::declare`] on a machine without your library.

use std::fmt;

/// A runtime version as the runtime packs it: `major * 1000 + minor * 10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0 / 1000, (self.0 % 1000) / 10)
    }
}

/// What the runtime reported about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateFacts {
    /// `fake_get_version`.
    pub runtime_version: Version,
    /// Device attribute 1: virtual-memory management (`None`: could not be read).
    pub virtual_memory_attribute: Option<bool>,
    /// Device attribute 2: stream capture (`None`: could not be read).
    pub graph_capture_attribute: Option<bool>,
}
