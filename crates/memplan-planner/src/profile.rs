//! [`Profile`]: everything a [`Session`](crate::Session) measured, ready to be planned.

use memplan_core::{MemoryInfo, MemoryWindow, ProfilingCapability, VaRange};
use serde::Serialize;

use crate::strategy::GraphEstimate;

/// One measured step: the snapshots around it and their window.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    /// Step name (`baseline`, `load_weights`, `profile_run`, `graph_phase`, `quiet`).
    pub name: String,
    /// Snapshot before.
    pub before: MemoryInfo,
    /// Snapshot after.
    pub after: MemoryInfo,
    /// `after - before`.
    pub window: MemoryWindow,
}

/// Everything the session measured, ready to be planned.
#[derive(Debug, Serialize)]
pub struct Profile {
    /// The capability the session trusted (declared or calibrated).
    pub capability: ProfilingCapability,
    /// The first snapshot (after releasing cached memory).
    pub baseline: MemoryInfo,
    /// The last snapshot.
    pub last: MemoryInfo,
    /// Every step and quiet window, in order.
    pub steps: Vec<StepRecord>,
    /// Warnings raised while profiling.
    pub warnings: Vec<String>,
    /// Bytes other processes took (+) or released (-) during profiling, seen in quiet windows.
    pub foreign_bytes: i64,
    /// Weights: allocator `allocated` growth while loading.
    pub weights_bytes: Option<u64>,
    /// Memory the weights hold from the driver: allocator `reserved` growth while loading
    /// (the weights plus the allocator's rounding around them). The budget counts this.
    pub weights_held_bytes: Option<u64>,
    /// Activation peak of the profile run (peak allocated minus allocated before it).
    pub activation_peak_bytes: Option<u64>,
    /// Growth of memory outside the allocator during the engine's steps (context, library
    /// workspaces), signed. Absent when the driver free reading cannot measure it.
    pub non_allocator_growth: Option<i64>,
    /// The graph-memory phase's result.
    pub graph: Option<GraphEstimate>,
    /// The KV cache's reserved address range (post-capture strategy), to be mapped by the
    /// engine once the plan says how much.
    #[serde(skip)]
    pub kv_reservation: Option<VaRange>,
}
