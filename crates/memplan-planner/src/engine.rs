//! What memplan needs from an inference engine during start-up.
//!
//! The engine owns its model, its caching allocator and its graphs; memplan owns the order of
//! operations. [`Session`](crate::Session) calls back into the engine through this trait to
//! capture graphs and to tear them down, and reads the engine's allocator through
//! [`AllocatorView`]. Loading weights and the profile run are closures the engine hands to the
//! session's steps, so the engine keeps full control of *what* runs while memplan controls
//! *when* it is measured.
//!
//! Five methods are required (four for an engine without graphs); the rest are optional
//! knowledge, and [`Engine::synchronize`], which a device without a device-wide synchronize
//! needs before each reading. An engine that can capture its graphs against a KV cache whose memory is mapped
//! later says so ([`Engine::supports_post_capture`]) and receives the cache's address range
//! before the first capture ([`Engine::bind_kv_range`]).

use memplan_core::{AllocatorView, Error, Result};

use crate::kv_range::KvRange;

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
    /// Where nothing will measure the engine's allocation of its KV cache (no hook, no tensors
    /// from its allocator, no mapped range), memplan also calls it before the plan for a few
    /// odd sizes of at most `max_num_batched_tokens` that are not graph sizes, to learn the
    /// allocator's rounding from what each makes it reserve (the session's `rounding` module):
    /// a forward pass of that many tokens, as an engine's dummy run does.
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

    /// Wait until every queue the engine submitted work to is idle (its framework's device
    /// synchronize on its own streams or queues). memplan calls it before each reading only
    /// where the device cannot synchronize itself (the capability's `facts.synchronize` is
    /// unsupported): without it a reading may see work still in flight (memory the engine
    /// released but its queue has not let go of yet). The default says the engine has no such
    /// hook; the session then warns
    /// ([`Warning::ReadingsNotSynchronized`](crate::Warning::ReadingsNotSynchronized)).
    fn synchronize(&mut self) -> Result<()> {
        Err(Error::unsupported(
            "engine synchronize",
            "the engine does not synchronize its own queues for memplan",
        ))
    }

    /// Whether the engine can size its KV cache after capturing its graphs: it takes the KV
    /// cache's address range before capture ([`bind_kv_range`](Engine::bind_kv_range)) and
    /// gets memory mapped there once the plan says how much. Enables the `post-capture`
    /// strategy.
    fn supports_post_capture(&self) -> bool {
        false
    }

    /// Post-capture: the KV cache's reserved address range, before any graph is captured, so
    /// the engine's graphs can point into its KV cache (its address is
    /// [`KvRange::address`]). Physical memory is mapped there when the session ends
    /// ([`Session::into_kv_cache`](crate::Session::into_kv_cache)), which also hands the
    /// engine the range itself. An error stops the graph phase (the range is released).
    fn bind_kv_range(&mut self, _range: &KvRange) -> Result<()> {
        Err(Error::unsupported(
            "post-capture sizing",
            "the engine does not bind a KV address range before capture",
        ))
    }

    /// Allocate the KV cache of `blocks` blocks as the engine allocates it when serving (its
    /// own layout and allocator: one tensor per layer in vLLM, each rounded by the caching
    /// allocator), inside [`Session::into_kv_cache`](crate::Session::into_kv_cache), which
    /// measures what it took. `Ok(true)`: allocated and kept by the engine; `Ok(false)` (the
    /// default): not offered, the engine allocates after the session. The session may call
    /// [`release_kv_cache`](Engine::release_kv_cache) and ask again for fewer blocks. An engine
    /// that does not offer it can still have its allocator's rounding measured, on the plan's
    /// layout, by offering tensors from its allocator
    /// ([`AllocatorView::allocate_tensor`]).
    fn allocate_kv_cache(&mut self, _blocks: u64) -> Result<bool> {
        Ok(false)
    }

    /// Free what [`allocate_kv_cache`](Engine::allocate_kv_cache) allocated (its cache
    /// included), so the session can ask again for fewer blocks.
    fn release_kv_cache(&mut self) -> Result<()> {
        Ok(())
    }

    /// Kernel nodes of the graph of one size, when the engine knows it. Used only by the
    /// `conservative` bound (each kernel node's executable object costs driver memory).
    fn kernel_nodes_hint(&self, _size: u32) -> Option<u32> {
        None
    }

    /// Bytes of graph memory-allocation nodes (memory the driver's graph pool holds, not the
    /// engine's allocator) in the graph of one size, when the engine knows it. Used by the
    /// `conservative` bound, only where the device's graph-pool reading cannot be trusted, and
    /// where calibration found the device refusing graph allocation nodes (a graph with such
    /// nodes cannot record there: the session plans the engine eagerly without warming a graph
    /// up to find out); `Some(0)` says the engine creates no such nodes (allocations inside its
    /// graphs come from its own private pool, which memplan measures).
    fn alloc_node_bytes_hint(&self, _size: u32) -> Option<u64> {
        None
    }
}
