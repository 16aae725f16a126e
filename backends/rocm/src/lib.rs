//! memplan backend `rocm` (being built).

/// Referenced by the facade so the linker keeps this crate's registration.
pub fn link() {}
