//! What memplan needs from an inference engine during start-up.
//!
//! The engine owns its model, its caching allocator and its graphs; memplan owns the order of
//! operations. [`Session`](crate::Session) calls back into the engine through this trait to
//! capture graphs and to tear them down, and reads the engine's allocator through
//! [`AllocatorView`]. Loading weights and the profile run are closures the engine hands to the
//! session's steps, so the engine keeps full control of *what* runs while memplan controls
//! *when* it is measured.

use memplan_core::{AllocatorView, Result};

/// The hooks an engine implements so memplan can run its graph-memory phase.
pub trait Engine {
    /// The engine's caching allocator (reserved / allocated / peak, release-cached).
    fn allocator(&mut self) -> &mut dyn AllocatorView;

    /// The graph sizes (batch sizes) the engine will capture when serving, in the order it
    /// captures them (largest first, as engines do). Empty when the engine runs eagerly.
    fn graph_sizes(&self) -> Vec<u32>;

    /// Warm up one size before its capture (eager runs that size's forward pass; the memory it
    /// frees stays in the allocator's cache). memplan calls it right before
    /// [`capture_graph`](Engine::capture_graph) and takes the capture's baseline in between.
    fn warm_up(&mut self, _size: u32) -> Result<()> {
        Ok(())
    }

    /// Capture the graph of one size (after its warm-up), keeping it alive until
    /// [`release_graphs`](Engine::release_graphs). Memory the capture takes goes to the
    /// engine's graph pool. On error the engine may leave a capture half-open: memplan always
    /// calls `release_graphs` afterwards, which must close it.
    fn capture_graph(&mut self, size: u32) -> Result<()>;

    /// Destroy every graph captured so far, abort a capture in progress, and release the
    /// private pool they used. Must succeed when nothing was captured. memplan synchronizes
    /// the device afterwards (deferred releases complete there).
    fn release_graphs(&mut self) -> Result<()>;

    /// Whether the engine can size its KV cache after capturing its graphs (it binds the KV
    /// cache's reserved address range before capture and maps memory later). Enables the
    /// `post-capture` strategy.
    fn supports_post_capture(&self) -> bool {
        false
    }

    /// Kernel nodes of the graph of one size, when the engine knows it. Used only by the
    /// `conservative` bound (each kernel node's executable object costs driver memory).
    fn kernel_nodes_hint(&self, _size: u32) -> Option<u32> {
        None
    }

    /// Bytes of graph memory-allocation nodes (memory the driver's graph pool holds, not the
    /// engine's allocator) in the graph of one size, when the engine knows it. Used only by
    /// the `conservative` bound, and only where the device's graph-pool reading cannot be
    /// trusted; `Some(0)` says the engine creates no such nodes (allocations inside its graphs
    /// come from its own private pool, which memplan measures).
    fn alloc_node_bytes_hint(&self, _size: u32) -> Option<u64> {
        None
    }
}
