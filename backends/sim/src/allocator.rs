//! `SimAllocator`: the engine's caching allocator on a simulated GPU (PyTorch-like, see
//! `heap.rs` for the block rules), with engine-style graph capture into a private pool shared
//! by every graph.

use memplan_core::{AllocatorStats, AllocatorView, Error, Result, TensorId};
use serde::{Deserialize, Serialize};

use crate::gpu::SimGpu;
use crate::heap::{round_request, BlockId, Pool};
use crate::state::Capture;

/// A graph the simulated engine captured ([`SimAllocator::end_graph_capture`]): the engine's
/// own id, not one of memplan's (those are minted by the core's `Device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineGraph(pub u64);

/// One engine graph, as the simulator costs it.
///
/// Costs: the driver sees `kernel_nodes` times the drawn per-node figure of exec object (no allocator sees it) plus
/// the platform's hidden per-capture bytes; `intermediate_bytes` are allocated and freed in the
/// private pool during capture (the pool keeps them cached, so it grows to the largest graph's
/// need, not the sum); each graph keeps an output buffer of `intermediate_bytes / 16` (rounded
/// to 512 B) live in the pool until it is destroyed (the per-graph allocator part);
/// `alloc_node_bytes` go to the driver's graph pool (graph-pool attributes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GraphSpec {
    /// Kernel nodes of the graph.
    pub kernel_nodes: u32,
    /// Intermediate activations allocated into the private pool while capturing.
    pub intermediate_bytes: u64,
    /// Bytes of graph memory-allocation nodes (graph pool).
    pub alloc_node_bytes: u64,
}

impl GraphSpec {
    /// A graph of `kernel_nodes` kernels whose capture allocates `intermediate_bytes` in the
    /// private pool, without graph memory-allocation nodes.
    pub const fn new(kernel_nodes: u32, intermediate_bytes: u64) -> Self {
        Self {
            kernel_nodes,
            intermediate_bytes,
            alloc_node_bytes: 0,
        }
    }

    /// The same graph with `bytes` of graph memory-allocation nodes (graph pool).
    pub const fn with_alloc_nodes(mut self, bytes: u64) -> Self {
        self.alloc_node_bytes = bytes;
        self
    }

    /// The output buffer each graph keeps in the private pool.
    pub fn output_bytes(&self) -> u64 {
        if self.intermediate_bytes == 0 {
            0
        } else {
            round_request(self.intermediate_bytes / 16)
        }
    }
}

/// The caching allocator frozen at one moment ([`SimAllocator::snapshot`]).
#[derive(Debug, Clone)]
pub struct AllocatorSnapshot {
    heap: crate::heap::Heap,
}

impl AllocatorSnapshot {
    /// How much the allocator's reserved memory would grow if `count` allocations of `bytes`
    /// each were made from it now (cached blocks reused, segments shared and rounded by its
    /// rules, exactly as [`SimAllocator::malloc`] would).
    pub fn growth(&self, count: u64, bytes: u64) -> u64 {
        self.growth_of(&[(count, bytes)])
    }

    /// How much the allocator's reserved memory would grow if the allocations of `runs` were
    /// made from it now, in order: `count` allocations of `bytes` each per run.
    pub fn growth_of(&self, runs: &[(u64, u64)]) -> u64 {
        let mut h = self.heap.clone();
        let before = h.reserved(None);
        for &(count, bytes) in runs {
            let rounded = h.rules.round_request(bytes);
            for _ in 0..count {
                if h.place_cached(Pool::Default, rounded).is_none() {
                    let grown = h.growth(Pool::Default, rounded);
                    h.place_grown(Pool::Default, rounded, grown);
                }
            }
        }
        h.reserved(None).saturating_sub(before)
    }
}

/// The engine's caching allocator. Clones share the same allocator (one per GPU).
#[derive(Clone, Debug)]
pub struct SimAllocator {
    gpu: SimGpu,
}

impl SimAllocator {
    pub(crate) fn new(gpu: SimGpu) -> Self {
        SimAllocator { gpu }
    }

    /// The GPU it allocates on.
    pub fn gpu(&self) -> &SimGpu {
        &self.gpu
    }

    /// Ground truth for the test-bed's oracle: the bytes of segment a request of `bytes`
    /// takes when no cached block fits it (the allocator's rounding rules, as drawn).
    pub fn fresh_segment_bytes(&self, bytes: u64) -> u64 {
        let s = self.gpu.lock();
        s.heap.segment_size(s.heap.rules.round_request(bytes))
    }

    /// Ground truth for the test-bed's oracle: the allocator as it is now, to ask what more
    /// allocations would take ([`AllocatorSnapshot::growth`]) without making them.
    pub fn snapshot(&self) -> AllocatorSnapshot {
        AllocatorSnapshot {
            heap: self.gpu.lock().heap.clone(),
        }
    }

    /// Allocate `bytes` (rounded up to 512 B). Inside an engine capture the block comes from
    /// the private pool. `Error::OutOfMemory` when the device is full even after giving back
    /// what PyTorch's retry gives back (a live graph's pool only its oversize blocks, inside a
    /// capture; nothing else inside a capture).
    pub fn malloc(&self, bytes: u64) -> Result<BlockId> {
        let mut s = self.gpu.lock();
        let pool = match &s.capture {
            None => Pool::Default,
            Some(Capture { engine: true, .. }) => Pool::Private,
            Some(_) => {
                return Err(Error::state(
                    "allocator malloc",
                    "a device-level graph capture is in progress",
                ))
            }
        };
        s.malloc(&self.gpu.shared.profile, pool, bytes)
    }

    /// Free a block (it stays cached in its segment).
    pub fn free(&self, b: BlockId) -> Result<()> {
        self.gpu
            .lock()
            .heap
            .free(b)
            .map(|_| ())
            .ok_or_else(|| Error::invalid("block", format!("no live block {}", b.0)))
    }

    /// Give every wholly free segment of the default pool back to the driver. Where the
    /// platform has no device-wide synchronize, the driver lets go of them only when the
    /// engine synchronizes its queue ([`SimAllocator::synchronize`]): work submitted before
    /// the release may still use them.
    pub fn empty_cache(&self) {
        let mut s = self.gpu.lock();
        let freed = s.heap.release_free(Pool::Default);
        self.gpu.engine_release(&mut s, freed);
    }

    /// The engine synchronizes its own queue (`torch.xpu.synchronize()`): segments it gave
    /// back while work was in flight return to the driver.
    pub fn synchronize(&self) -> Result<()> {
        let mut s = self.gpu.lock();
        s.no_capture("engine synchronize")?;
        s.queued_release = 0;
        Ok(())
    }

    /// Start an engine graph capture (`torch.cuda.graph`-like): empties the cache first when
    /// `capture_empties_cache` is on; later mallocs go to the shared private pool.
    pub fn begin_graph_capture(&self) -> Result<()> {
        self.gpu.capture_support()?;
        let mut s = self.gpu.lock();
        s.no_capture("begin_graph_capture")?;
        if self.gpu.shared.quirks.capture_empties_cache {
            s.heap.release_free(Pool::Default);
        }
        s.capture = Some(Capture {
            engine: true,
            ..Capture::default()
        });
        Ok(())
    }

    /// End the engine capture: allocate the spec's intermediates and output into the private
    /// pool, instantiate the graph (exec object, hidden bytes, allocation nodes). On error the
    /// capture is abandoned and what it allocated is freed.
    pub fn end_graph_capture(&self, spec: &GraphSpec) -> Result<EngineGraph> {
        let p = &self.gpu.shared.profile;
        let hidden = self.gpu.shared.quirks.hidden_bytes_per_capture;
        let nodes_ok = self.gpu.alloc_node_support(spec.alloc_node_bytes);
        let mut s = self.gpu.lock();
        if !matches!(s.capture, Some(Capture { engine: true, .. })) {
            return Err(Error::invalid(
                "end_graph_capture",
                "no engine graph capture in progress",
            ));
        }
        s.capture = None;
        nodes_ok?;
        // A library's lazy allocation on the engine's first capture (cuBLAS workspace and the
        // like), kept for good.
        s.first_capture(p, self.gpu.shared.physics.lazy_first_capture_bytes)?;
        let mut output = None;
        if spec.intermediate_bytes > 0 {
            let tmp = s.malloc(p, Pool::Private, spec.intermediate_bytes)?;
            let out = s.malloc(p, Pool::Private, spec.output_bytes());
            s.heap.free(tmp);
            output = Some(out?);
        }
        let exec = self
            .gpu
            .shared
            .physics
            .exec_bytes(u64::from(spec.kernel_nodes), s.captures);
        match s.instantiate(p, exec, spec.alloc_node_bytes, hidden) {
            Ok(id) => {
                if let Some(g) = s.graphs.get_mut(&id) {
                    g.output = output;
                    g.engine = true;
                }
                Ok(EngineGraph(id))
            }
            Err(e) => {
                if let Some(b) = output {
                    s.heap.free(b);
                }
                Err(e)
            }
        }
    }

    /// Abandon an engine capture in progress (a no-op when none is).
    pub fn abort_graph_capture(&self) {
        let mut s = self.gpu.lock();
        if matches!(s.capture, Some(Capture { engine: true, .. })) {
            s.capture = None;
        }
    }

    /// Destroy a graph: its output returns to the private pool at once; its driver memory now,
    /// or after the drawn number of synchronizes.
    pub fn destroy_graph(&self, g: EngineGraph) -> Result<()> {
        let deferred = self.gpu.deferred_release();
        self.gpu.lock().destroy(g.0, deferred)
    }

    /// Give the private pool's wholly free segments back to the driver.
    pub fn release_private_pools(&self) -> Result<()> {
        let mut s = self.gpu.lock();
        s.no_capture("release_private_pools")?;
        let freed = s.heap.release_free(Pool::Private);
        self.gpu.engine_release(&mut s, freed);
        Ok(())
    }
}

impl AllocatorView for SimAllocator {
    fn stats(&self) -> AllocatorStats {
        let s = self.gpu.lock();
        AllocatorStats::new(s.heap.reserved(None), s.heap.allocated(None), s.heap.peak())
            .with_peak_reserved(Some(s.heap.peak_reserved()))
    }

    fn release_cached(&mut self) -> Result<()> {
        self.empty_cache();
        Ok(())
    }

    fn reset_peak(&mut self) {
        self.gpu.lock().heap.reset_peak();
    }

    fn gpu_id(&self) -> Option<String> {
        Some(self.gpu.gpu_id())
    }

    /// One block of the default pool ([`SimAllocator::malloc`], outside a capture), rounded
    /// by the drawn rules like any other.
    fn allocate_tensor(&mut self, bytes: u64) -> Result<Option<TensorId>> {
        if self.gpu.lock().capture.is_some() {
            return Err(Error::state(
                "allocator tensor",
                "a graph capture is in progress: a tensor allocated now would go to its pool",
            ));
        }
        self.malloc(bytes).map(|b| Some(TensorId(b.0)))
    }

    fn free_tensor(&mut self, id: TensorId) -> Result<()> {
        self.free(BlockId(id.0))
    }
}
