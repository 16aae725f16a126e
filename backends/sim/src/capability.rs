//! The simulator's rows of the capability matrix (`docs/capability-matrix.md`): every profile
//! and what it declares (the real backend's own declaration, run on the profile's facts).

use memplan_core::ProfilingCapability;

/// Every profile's name and declared capability, in catalogue order.
pub fn platforms() -> Vec<(&'static str, ProfilingCapability)> {
    crate::profiles()
        .iter()
        .map(|p| (p.name, p.capability()))
        .collect()
}
