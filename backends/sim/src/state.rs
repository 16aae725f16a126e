//! The mutable world of one simulated GPU: the clock, other processes, this process's driver
//! allocations (context, raw, allocator segments, graph exec objects, graph pool, mappings)
//! and the deferred releases. Every driver-side growth goes through [`State::take`], which
//! fails with `OutOfMemory` when the device is really full.

use std::collections::BTreeMap;

use memplan_core::{Error, Result};

use crate::heap::{BlockId, Heap, Pool};
use crate::profile::SimProfile;

/// A live graph.
#[derive(Debug, Clone)]
pub(crate) struct GraphRecord {
    /// Exec object bytes (driver only).
    pub exec: u64,
    /// Graph allocation-node bytes (graph pool).
    pub alloc_node: u64,
    /// The graph's output block in the allocator's private pool (engine graphs only).
    pub output: Option<BlockId>,
    /// An engine graph: it holds the allocator's private pool (a device-level capture does not).
    pub engine: bool,
}

/// A capture in progress.
#[derive(Debug, Clone, Default)]
pub(crate) struct Capture {
    /// Engine capture (allocations go to the private pool) rather than a device capture.
    pub engine: bool,
    /// Kernel nodes recorded so far (device captures).
    pub kernel_nodes: u64,
    /// Allocation-node bytes recorded so far (device captures).
    pub alloc_node: u64,
}

/// Driver memory of a destroyed graph, returned after `syncs_left` more synchronizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub exec: u64,
    pub alloc_node: u64,
    pub syncs_left: u32,
}

/// Everything that changes.
#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    pub tick: u64,
    pub other: u64,
    pub graphics: u64,
    /// Scheduled changes of other processes' memory: (tick, bytes), applied at synchronize.
    pub schedule: Vec<(u64, u64)>,
    pub raw: BTreeMap<u64, u64>,
    pub next_handle: u64,
    pub heap: Heap,
    pub graphs: BTreeMap<u64, GraphRecord>,
    pub next_graph: u64,
    pub capture: Option<Capture>,
    pub exec: u64,
    pub hidden: u64,
    /// Memory a library took on the engine's first capture and keeps.
    pub lazy: u64,
    /// Whether the engine captured before (the lazy allocation happened).
    pub lazy_done: bool,
    /// Captures instantiated so far (the jitter of the n-th one is drawn from n).
    pub captures: u64,
    pub gp_used: u64,
    pub gp_reserved: u64,
    pub gp_used_high: u64,
    pub gp_reserved_high: u64,
    pub pending: Vec<Pending>,
    /// Reservations: base -> bytes.
    pub vmm_ranges: BTreeMap<u64, u64>,
    /// Physical memory for mappings: handle -> bytes (held from creation to destruction).
    pub vmm_physical: BTreeMap<u64, u64>,
    /// Mappings: address -> (bytes, physical handle).
    pub vmm_maps: BTreeMap<u64, (u64, u64)>,
    /// Segments the engine gave back while its queue still had work in flight: held on the
    /// driver until the engine synchronizes its queue (platforms without a device-wide
    /// synchronize; elsewhere memplan's synchronize waits for them, so they return at once).
    pub queued_release: u64,
    /// Stale free: (value reported now, value to report after the next synchronize).
    /// Absent readings stay absent through the lag.
    pub stale: Option<(Option<u64>, Option<u64>)>,
    /// Memory the other processes sharing this device hold (`world=DIR`), as of the last lock.
    pub world_others: u64,
    /// Memory a leaking `free` or `destroy_physical` kept (the `leak-per-*` quirks): held by
    /// this process for good.
    pub leaked: u64,
    /// The most this process held since [`SimGpu::watch_peak`](crate::SimGpu::watch_peak)
    /// (`None`: not watched), updated each time the state is released after a driver call.
    pub peak: Option<u64>,
}

impl State {
    /// Driver memory this process holds, context included.
    pub fn this_process(&self, p: &SimProfile) -> u64 {
        [
            self.raw_bytes(),
            self.heap.reserved(None),
            self.exec,
            self.hidden,
            self.lazy,
            self.gp_reserved,
            self.vmm_mapped(),
            self.pending.iter().map(|x| x.exec).sum::<u64>(),
            self.queued_release,
            self.leaked,
        ]
        .into_iter()
        .fold(p.context_overhead_bytes, u64::saturating_add)
    }

    /// Driver memory held by everyone. Saturating: other processes and graphics allocations
    /// are set from user input (`other=`, `graphics=`), and an absurd figure must read as a
    /// full device, not overflow.
    pub fn used(&self, p: &SimProfile) -> u64 {
        self.this_process(p)
            .saturating_add(self.other)
            .saturating_add(self.world_others)
            .saturating_add(self.graphics)
    }

    /// The real free memory.
    pub fn real_free(&self, p: &SimProfile) -> u64 {
        p.total_bytes.saturating_sub(self.used(p))
    }

    /// Bytes of raw allocations.
    pub fn raw_bytes(&self) -> u64 {
        self.raw.values().sum()
    }

    /// Bytes of physical memory created for mappings (mapped or not yet destroyed).
    pub fn vmm_mapped(&self) -> u64 {
        self.vmm_physical.values().sum()
    }

    /// The engine's first capture: a library takes `bytes` for good (once per process).
    pub fn first_capture(&mut self, p: &SimProfile, bytes: u64) -> Result<()> {
        if self.lazy_done {
            return Ok(());
        }
        self.take(p, bytes, "library allocation on the first capture")?;
        self.lazy_done = true;
        self.lazy = bytes;
        Ok(())
    }

    /// Check that `bytes` more fit on the device.
    pub fn take(&self, p: &SimProfile, bytes: u64, call: &str) -> Result<()> {
        if bytes > self.real_free(p) {
            return Err(Error::OutOfMemory {
                call: call.into(),
                requested: bytes,
            });
        }
        Ok(())
    }

    /// Fail when a capture is in progress (global capture mode forbids the operation).
    pub fn no_capture(&self, what: &str) -> Result<()> {
        match self.capture {
            Some(_) => Err(Error::state(
                what,
                "a graph capture is in progress (global capture mode forbids it)",
            )),
            None => Ok(()),
        }
    }

    /// One tick: apply scheduled changes and count down deferred releases (those that reach
    /// zero return).
    pub fn synchronize(&mut self) {
        self.tick += 1;
        let tick = self.tick;
        let (due, later): (Vec<_>, Vec<_>) = self.schedule.iter().partition(|(t, _)| *t <= tick);
        if let Some((_, bytes)) = due.last() {
            self.other = *bytes;
        }
        self.schedule = later;
        let mut still = Vec::new();
        for mut p in std::mem::take(&mut self.pending) {
            p.syncs_left = p.syncs_left.saturating_sub(1);
            if p.syncs_left == 0 {
                self.gp_used = self.gp_used.saturating_sub(p.alloc_node);
            } else {
                still.push(p);
            }
        }
        self.pending = still;
    }

    /// Instantiate a graph: its exec object (`exec` bytes: kernel nodes at the drawn per-node
    /// figure and jitter), hidden per-capture bytes and allocation nodes.
    pub fn instantiate(
        &mut self,
        p: &SimProfile,
        exec: u64,
        alloc_node: u64,
        hidden: u64,
    ) -> Result<u64> {
        // Saturating: absurd node or hidden sizes (user input) are out-of-memory errors, and
        // once `take` accepts the sum every part is below the device total.
        let pool_growth = self
            .gp_used
            .saturating_add(alloc_node)
            .saturating_sub(self.gp_reserved);
        let needed = exec.saturating_add(hidden).saturating_add(pool_growth);
        self.take(p, needed, "graph instantiate")?;
        self.exec += exec;
        self.hidden += hidden;
        self.captures += 1;
        self.gp_used += alloc_node;
        self.gp_reserved += pool_growth;
        self.gp_used_high = self.gp_used_high.max(self.gp_used);
        self.gp_reserved_high = self.gp_reserved_high.max(self.gp_reserved);
        let id = self.next_graph;
        self.next_graph += 1;
        self.graphs.insert(
            id,
            GraphRecord {
                exec,
                alloc_node,
                output: None,
                engine: false,
            },
        );
        Ok(id)
    }

    /// Destroy a graph: its output block at once, its driver memory now (`release_after_syncs`
    /// 0) or after that many synchronizes.
    pub fn destroy(&mut self, id: u64, release_after_syncs: u32) -> Result<()> {
        let g = self
            .graphs
            .remove(&id)
            .ok_or_else(|| Error::invalid("graph", format!("no live graph with id {id}")))?;
        if let Some(b) = g.output {
            self.heap.free(b);
        }
        self.exec -= g.exec;
        if release_after_syncs > 0 {
            self.pending.push(Pending {
                exec: g.exec,
                alloc_node: g.alloc_node,
                syncs_left: release_after_syncs,
            });
        } else {
            self.gp_used = self.gp_used.saturating_sub(g.alloc_node);
        }
        Ok(())
    }

    /// Trim the graph pool to what live graphs use.
    /// Memory of destroyed graphs awaiting a synchronize is still in use and stays.
    pub fn trim_graph_pool(&mut self) {
        self.gp_reserved = self.gp_used;
    }

    /// Whether a live engine graph or a capture holds the private pool (an allocation into
    /// `pool` = private is one made by a capture).
    fn private_pool_in_use(&self, pool: Pool) -> bool {
        pool == Pool::Private
            || self.capture.as_ref().is_some_and(|c| c.engine)
            || self.graphs.values().any(|g| g.engine)
    }

    /// Allocate from the caching allocator into `pool`, growing it from the driver.
    pub fn malloc(&mut self, p: &SimProfile, pool: Pool, bytes: u64) -> Result<BlockId> {
        let rounded = self.heap.rules.round_request(bytes);
        if let Some(b) = self.heap.place_cached(pool, rounded) {
            return Ok(b);
        }
        let mut seg = self.heap.growth(pool, rounded);
        if self.take(p, seg, "SimAllocator::malloc").is_err() {
            let oom = || Error::OutOfMemory {
                call: "SimAllocator::malloc".into(),
                requested: bytes,
            };
            // Like PyTorch's `DeviceCachingAllocator::malloc` (c10/cuda/CUDACachingAllocator.cpp
            // at commit 001074d25084fdb87a799823e395a50f5ec044d3): first give back just enough
            // oversize blocks of the request's own pool (`release_available_cached_blocks`,
            // under `max_split_size_mb` only) and retry.
            if self.heap.release_oversize(pool, rounded) {
                seg = self.heap.growth(pool, rounded);
                if self.take(p, seg, "SimAllocator::malloc").is_ok() {
                    return Ok(self.heap.place_grown(pool, rounded, seg));
                }
            }
            // Then, only where no capture is under way (`captures_underway.empty()`: an
            // allocation into the private pool is a capture's), synchronize (what the engine's
            // queue still held returns), give the cached segments back and retry once. The
            // private pool's free segments go back only while no engine graph holds the pool:
            // `release_cached_blocks` releases the default pools' blocks and those of
            // `graph_pools_freeable` only, the pools whose `use_count` `releasePool` brought to
            // 0 when their last graph was destroyed.
            if pool == Pool::Private {
                return Err(oom());
            }
            self.queued_release = 0;
            self.heap.release_free(Pool::Default);
            if !self.private_pool_in_use(pool) {
                self.heap.release_free(Pool::Private);
            }
            // An expandable segment may have unmapped its free tail: what it needs again.
            seg = self.heap.growth(pool, rounded);
            self.take(p, seg, "SimAllocator::malloc")
                .map_err(|_| oom())?;
        }
        Ok(self.heap.place_grown(pool, rounded, seg))
    }
}
