//! `GroundTruth`: the real numbers behind a simulated GPU's readings, per owner, for tests and
//! oracles (what a perfect measurement would find).

use serde::{Deserialize, Serialize};

use crate::gpu::SimGpu;
use crate::heap::Pool;

/// The real numbers behind the readings, for tests and oracles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroundTruth {
    /// Synchronizes so far.
    pub tick: u64,
    /// Memory the GPU can really use.
    pub total: u64,
    /// Really free memory.
    pub free: u64,
    /// This process's context and runtime libraries.
    pub context: u64,
    /// Memory held by other processes.
    pub other_processes: u64,
    /// Graphics (DRM) allocations.
    pub graphics: u64,
    /// Raw allocations (`Device::allocate`), after the driver's 2 MiB rounding.
    pub raw_allocations: u64,
    /// Caching-allocator segments of the default pool.
    pub allocator_reserved: u64,
    /// Live blocks of the default pool.
    pub allocator_allocated: u64,
    /// Caching-allocator segments of the graph private pool.
    pub private_pool_reserved: u64,
    /// Live blocks of the graph private pool.
    pub private_pool_allocated: u64,
    /// Exec objects of live graphs (no allocator sees them).
    pub graph_exec: u64,
    /// Per-capture memory kept by the runtime and never returned.
    pub hidden_capture: u64,
    /// Memory a library allocated on the engine's first capture and keeps (cuBLAS workspace
    /// and the like).
    #[serde(default)]
    pub library_lazy: u64,
    /// Memory reserved for graph allocation nodes.
    pub graph_pool_reserved: u64,
    /// Physical memory mapped into reserved virtual ranges.
    pub vmm_mapped: u64,
    /// Reserved virtual address ranges not yet released.
    pub vmm_ranges: usize,
    /// Exec objects of destroyed graphs that return at the next synchronize.
    pub pending_release: u64,
    /// Live graphs.
    pub live_graphs: usize,
    /// Segments the engine gave back that wait for its queue's synchronize (platforms
    /// without a device-wide synchronize).
    pub queued_release: u64,
    /// Memory a leaking `free` or `destroy_physical` kept (the `leak-per-*` quirks).
    pub leaked: u64,
}

impl GroundTruth {
    /// Everything this process holds on the device.
    pub fn this_process(&self) -> u64 {
        self.context
            + self.raw_allocations
            + self.allocator_reserved
            + self.private_pool_reserved
            + self.graph_exec
            + self.hidden_capture
            + self.library_lazy
            + self.graph_pool_reserved
            + self.vmm_mapped
            + self.pending_release
            + self.queued_release
            + self.leaked
    }
}

impl SimGpu {
    /// Start watching this process's high-water mark: from now on, every driver call that
    /// changes what the process holds raises it ([`SimGpu::peak`]). Starts at what the process
    /// holds now; a second call starts again.
    pub fn watch_peak(&self) {
        let mut s = self.lock();
        let now = s.this_process(&self.shared.profile);
        s.peak = Some(now);
    }

    /// The most this process held on the device (context included) since
    /// [`SimGpu::watch_peak`], ground truth; `None` when nothing watches it.
    pub fn peak(&self) -> Option<u64> {
        let s = self.lock();
        let now = s.this_process(&self.shared.profile);
        s.peak.map(|p| p.max(now))
    }

    /// The real numbers.
    pub fn truth(&self) -> GroundTruth {
        let s = self.lock();
        let p = &self.shared.profile;
        GroundTruth {
            tick: s.tick,
            total: p.total_bytes,
            free: s.real_free(p),
            context: p.context_overhead_bytes,
            other_processes: s.other.saturating_add(s.world_others),
            graphics: s.graphics,
            raw_allocations: s.raw_bytes(),
            allocator_reserved: s.heap.reserved(Some(Pool::Default)),
            allocator_allocated: s.heap.allocated(Some(Pool::Default)),
            private_pool_reserved: s.heap.reserved(Some(Pool::Private)),
            private_pool_allocated: s.heap.allocated(Some(Pool::Private)),
            graph_exec: s.exec,
            hidden_capture: s.hidden,
            library_lazy: s.lazy,
            graph_pool_reserved: s.gp_reserved,
            vmm_mapped: s.vmm_mapped(),
            vmm_ranges: s.vmm_ranges.len(),
            pending_release: s.pending.iter().map(|x| x.exec).sum(),
            live_graphs: s.graphs.len(),
            queued_release: s.queued_release,
            leaked: s.leaked,
        }
    }
}
