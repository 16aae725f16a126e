//! Simulated GPUs (work in progress: see issue 2).

/// Referenced by the facade so the linker keeps this crate's registration.
pub fn link() {}
