//! Graphs on Level Zero: what exists and what this backend declares.
//!
//! Level Zero has no graph-memory query (nothing like CUDA's `cuDeviceGetGraphMemAttribute`),
//! so the graph-pool reading is unavailable and the planner's fallback applies. Record/replay
//! (command lists recorded once and replayed, or the newer graph extensions on recent
//! drivers) is not implemented here: doing it honestly needs a compiled kernel module and a
//! driver to test on, and even then its memory is visible only as a drop in Sysman free
//! memory. Capture is therefore declared unsupported, with that reason, and
//! [`Device::graph_capture`](memplan_core::Device::graph_capture) returns
//! [`Error::Unsupported`](memplan_core::Error::Unsupported) saying so.

use memplan_core::{Reliability, Support};

/// Why capture is unsupported by this backend.
pub const CAPTURE_UNSUPPORTED: &str = "Level Zero record/replay is not implemented by memplan's xpu backend, \
     and Level Zero cannot report graph memory; the planner runs eager or uses a conservative reserve";

/// Why there is no graph-pool reading.
pub const NO_GRAPH_POOL_QUERY: &str = "Level Zero has no graph-memory query";

/// Graph capture support on this backend.
pub fn capture_support() -> Support {
    Support::no(CAPTURE_UNSUPPORTED)
}

/// Graph-pool attributes on this backend.
pub fn pool_attributes() -> Support {
    Support::no(NO_GRAPH_POOL_QUERY)
}

/// Reliability of the graph-pool reading.
pub fn pool_reading() -> Reliability {
    Reliability::Unavailable {
        reason: NO_GRAPH_POOL_QUERY.into(),
    }
}
