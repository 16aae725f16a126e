//! [`SimEngine`]: a small inference engine over the simulated caching allocator, enough to run
//! a start-up through memplan and then do what a real engine does next: allocate the KV cache
//! the plan allows, capture every graph, serve a burst.
//!
//! Memory behaviour (per scenario): weights as `weight_tensors` allocations; the profile run
//! allocates the activation peak, takes a library workspace outside the allocator and empties
//! the cache at the end (as engines do); each graph size is warmed up eagerly
//! (`warmup_per_token * size`, left cached) and captured with `kernel_nodes`,
//! `intermediate_per_token * size` of intermediates in the shared private pool and
//! `alloc_node_bytes` of graph allocation nodes.

use memplan_backend_sim::EngineGraph;
use memplan_backend_sim::{BlockId, GraphSpec, SimAllocator, SimGpu};
use memplan_core::{AllocatorView, Device, Error, RawAllocation, Result};

use crate::setup::Setup;
use memplan_planner::{Engine, KvRange};

/// The engine.
pub struct SimEngine {
    gpu: SimGpu,
    /// The checked device memplan's session uses too (clones share its tables), so the KV
    /// cache can be mapped into the range the session reserved.
    device: Device,
    alloc: SimAllocator,
    setup: Setup,
    weights: Vec<BlockId>,
    workspace: Option<RawAllocation>,
    graphs: Vec<EngineGraph>,
    capturing: bool,
    kv_block: Option<BlockId>,
    kv_map: Option<KvRange>,
    /// The KV range's address the engine was given before capture (post-capture).
    pub kv_address: Option<u64>,
    /// Fail the n-th capture (0-based) after it began: for teardown tests.
    pub fail_capture_at: Option<usize>,
    captures: usize,
}

impl SimEngine {
    /// An engine on `gpu` running the scenario's model.
    pub fn new(gpu: SimGpu, setup: Setup) -> Self {
        let alloc = gpu.allocator();
        SimEngine {
            device: gpu.device(),
            gpu,
            alloc,
            setup,
            weights: Vec::new(),
            workspace: None,
            graphs: Vec::new(),
            capturing: false,
            kv_block: None,
            kv_map: None,
            kv_address: None,
            fail_capture_at: None,
            captures: 0,
        }
    }

    /// The graph of one size.
    pub fn spec(&self, size: u32) -> GraphSpec {
        GraphSpec::new(
            self.setup.kernel_nodes,
            self.setup
                .intermediate_per_token
                .saturating_mul(u64::from(size)),
        )
        .with_alloc_nodes(self.setup.alloc_node_bytes)
    }

    /// Load the weights.
    pub fn load_weights(&mut self) -> Result<()> {
        let n = u64::from(self.setup.weight_tensors);
        let each = self.setup.weights / n;
        for i in 0..n {
            let last = i + 1 == n;
            let bytes = if last {
                self.setup.weights - each * (n - 1)
            } else {
                each
            };
            if bytes > 0 {
                self.weights.push(self.alloc.malloc(bytes)?);
            }
        }
        Ok(())
    }

    /// The profile run: activation peak, library workspace, cache emptied at the end.
    pub fn profile_run(&mut self) -> Result<()> {
        let act = self.alloc.malloc(self.setup.activation_peak.max(1))?;
        if self.setup.workspace > 0 && self.workspace.is_none() {
            self.workspace = Some(self.device.allocate(self.setup.workspace)?);
        }
        self.alloc.free(act)?;
        self.alloc.empty_cache();
        Ok(())
    }

    /// Allocate the KV cache: mapped into the reserved range when there is one (rounded down
    /// to the granularity), else from the allocator.
    pub fn allocate_kv(&mut self, bytes: u64, range: Option<KvRange>) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        match range {
            Some(mut r) => {
                if bytes >= memplan_backend_sim::GRANULARITY {
                    r.map(bytes)?;
                }
                self.kv_map = Some(r);
            }
            None => self.kv_block = Some(self.alloc.malloc(bytes)?),
        }
        Ok(())
    }

    /// Capture every graph for real (after the KV cache exists).
    pub fn capture_all(&mut self) -> Result<()> {
        for s in self.setup.sizes.clone() {
            self.warm_up(s)?;
            self.capture_graph(s)?;
        }
        Ok(())
    }

    /// A burst at full concurrency: the activation peak once more.
    pub fn serve_burst(&mut self) -> Result<()> {
        let b = self.alloc.malloc(self.setup.activation_peak.max(1))?;
        self.alloc.free(b)
    }

    /// The checked device on the engine's GPU (a session on this engine uses a clone).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The simulated GPU.
    pub fn gpu(&self) -> &SimGpu {
        &self.gpu
    }

    /// Live graphs.
    pub fn live_graphs(&self) -> usize {
        self.graphs.len()
    }
}

impl Engine for SimEngine {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.alloc
    }

    fn graph_sizes(&self) -> Vec<u32> {
        self.setup.sizes.clone()
    }

    fn warm_up(&mut self, size: u32) -> Result<()> {
        // How much of the warm-up stays cached is part of the device's drawn physics.
        let left = self.gpu.physics().warmup_left_cached_permille;
        let bytes = self.setup.warmup_per_token.saturating_mul(u64::from(size)) / 1000 * left;
        if bytes > 0 {
            let b = self.alloc.malloc(bytes)?;
            self.alloc.free(b)?;
        }
        Ok(())
    }

    fn capture_graph(&mut self, size: u32) -> Result<()> {
        self.alloc.begin_graph_capture()?;
        self.capturing = true;
        let n = self.captures;
        self.captures += 1;
        if self.fail_capture_at == Some(n) {
            return Err(Error::Measurement(format!(
                "injected failure in the capture of size {size}"
            )));
        }
        let g = self.alloc.end_graph_capture(&self.spec(size));
        self.capturing = false;
        self.graphs.push(g?);
        Ok(())
    }

    fn release_graphs(&mut self) -> Result<()> {
        if self.capturing {
            self.alloc.abort_graph_capture();
            self.capturing = false;
        }
        let mut first_err = None;
        for g in std::mem::take(&mut self.graphs) {
            if let Err(e) = self.alloc.destroy_graph(g) {
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = self.alloc.release_private_pools() {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Waits for the engine's queue: what its `empty_cache` gave back while work was in flight
    /// returns to the driver (on platforms without a device-wide synchronize).
    fn synchronize(&mut self) -> Result<()> {
        self.alloc.synchronize()
    }

    fn bind_kv_range(&mut self, range: &KvRange) -> Result<()> {
        self.kv_address = Some(range.address());
        Ok(())
    }

    fn supports_post_capture(&self) -> bool {
        self.setup.scenario.graphs.post_capture
    }

    fn kernel_nodes_hint(&self, _size: u32) -> Option<u32> {
        self.setup.hints.then_some(self.setup.kernel_nodes)
    }

    fn alloc_node_bytes_hint(&self, _size: u32) -> Option<u64> {
        self.setup.hints.then_some(self.setup.alloc_node_bytes)
    }
}
