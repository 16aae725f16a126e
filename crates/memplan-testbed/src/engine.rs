//! [`SimEngine`]: a small inference engine over the simulated caching allocator, enough to run
//! a start-up through memplan and then do what a real engine does next: allocate the KV cache
//! the plan allows, capture every graph, serve a burst.
//!
//! Memory behaviour (per scenario): weights as `weight_tensors` allocations; the profile run
//! allocates the activation peak, takes a library workspace outside the allocator and empties
//! the cache at the end (as engines do); each graph size is warmed up eagerly
//! (`warmup_per_token * size`, left cached) and captured with the scenario's `kernel_nodes`
//! (varying with the size by the device's drawn spread), `intermediate_per_token * size` of
//! intermediates in the shared private pool (give or take the drawn jitter) and
//! `alloc_node_bytes` of graph allocation nodes. The KV cache is sized by the engine's own
//! arithmetic ([`crate::kv`]) from the plan's block count: vLLM's tensors for its layer groups.

use memplan_backend_sim::EngineGraph;
use memplan_backend_sim::{BlockId, GraphSpec, SimAllocator, SimGpu};
use memplan_core::{AllocatorView, Device, Error, RawAllocation, Result};

use crate::kv::EngineKv;
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
    kv_blocks: Vec<BlockId>,
    kv_map: Option<KvRange>,
    /// The same allocator without tensors for the session, where the setup says so.
    stats_only: StatsOnly,
    /// The KV range's address the engine was given before capture (post-capture).
    pub kv_address: Option<u64>,
    /// Fail the n-th capture (0-based) after it began: for teardown tests.
    pub fail_capture_at: Option<usize>,
    captures: usize,
    /// The free memory the engine read before and after loading its weights, where it sizes
    /// its pool from them (SGLang, [`SimEngine::own_free_readings`]).
    own_free: (Option<u64>, Option<u64>),
    /// Neighbour changes still to land between this step's captures: `(after_capture, bytes)`
    /// ([`SimEngine::arm_neighbour`]).
    neighbour: Vec<(u32, u64)>,
    /// Captures since the changes were armed.
    armed_captures: u32,
}

impl SimEngine {
    /// An engine on `gpu` running the scenario's model.
    pub fn new(gpu: SimGpu, setup: Setup) -> Self {
        let alloc = gpu.allocator();
        SimEngine {
            stats_only: StatsOnly(alloc.clone()),
            device: gpu.device(),
            gpu,
            alloc,
            setup,
            weights: Vec::new(),
            workspace: None,
            graphs: Vec::new(),
            capturing: false,
            kv_blocks: Vec::new(),
            kv_map: None,
            kv_address: None,
            fail_capture_at: None,
            captures: 0,
            own_free: (None, None),
            neighbour: Vec::new(),
            armed_captures: 0,
        }
    }

    /// Another process changes what it holds between this step's captures: each `(k, bytes)`
    /// lands right after the `k`-th capture from now (a capture that completed; one that
    /// failed ends the step), at once ([`crate::run::others_now`]).
    pub fn arm_neighbour(&mut self, changes: Vec<(u32, u64)>) {
        self.neighbour = changes;
        self.armed_captures = 0;
    }

    /// The changes armed that no capture reached, in order (they land as the step ends);
    /// nothing stays armed.
    pub fn disarm_neighbour(&mut self) -> Vec<u64> {
        self.armed_captures = 0;
        std::mem::take(&mut self.neighbour)
            .into_iter()
            .map(|(_, b)| b)
            .collect()
    }

    /// The graph of one size: the scenario's figures as the device's physics vary them.
    pub fn spec(&self, size: u32) -> GraphSpec {
        let p = self.gpu.physics();
        let largest = self.setup.sizes.first().copied().unwrap_or(size);
        GraphSpec::new(
            p.kernel_nodes(self.setup.kernel_nodes, size, largest),
            p.intermediate(self.setup.intermediate_per_token, size),
        )
        .with_alloc_nodes(self.setup.alloc_node_bytes)
    }

    /// What the engine read of the device's free memory right before and right after loading
    /// its weights, where it sizes its KV pool from those readings (an SGLang start rule;
    /// `None` elsewhere, or where the device gives no free reading). SGLang reads it through
    /// `get_available_gpu_memory` (`srt/utils/common.py`: `torch.cuda.empty_cache()` then
    /// `torch.cuda.mem_get_info`): before the weights as `pre_model_load_memory` (0.5.22
    /// `srt/distributed/bootstrap.py` `measure_pre_model_load_memory`; 0.5.9
    /// `ModelRunner.init_torch_distributed`'s `min_per_gpu_memory`), after them in
    /// `profile_max_num_token` (0.5.9 `model_runner_kv_cache_mixin.py`) or
    /// `_profile_available_bytes` (0.5.22 `mem_cache/kv_cache_configurator.py`). The device's
    /// reading as its driver gives it (quirks and all), the framework reading nothing else.
    pub fn own_free_readings(&self) -> Option<(u64, u64)> {
        match self.own_free {
            (Some(start), Some(after)) => Some((start, after)),
            _ => None,
        }
    }

    /// The engine's own free reading, as SGLang takes it (see [`Self::own_free_readings`]);
    /// nothing for an engine that sizes its pool otherwise.
    fn read_own_free(&mut self) -> Option<u64> {
        if self.setup.start_rule == crate::scenario::StartRule::Vllm {
            return None;
        }
        self.alloc.empty_cache();
        self.gpu.raw_driver_memory().free
    }

    /// Load the weights.
    pub fn load_weights(&mut self) -> Result<()> {
        self.own_free = (self.read_own_free(), None);
        self.load_weight_tensors()?;
        self.own_free.1 = self.read_own_free();
        Ok(())
    }

    fn load_weight_tensors(&mut self) -> Result<()> {
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

    /// The engine's KV layout for its model.
    fn kv_layout(&self) -> Result<EngineKv> {
        EngineKv::of_setup(&self.setup).ok_or_else(|| {
            Error::invalid(
                "kv.dtype",
                format!(
                    "the engine has no KV layout for {:?}",
                    self.setup.scenario.kv.dtype
                ),
            )
        })
    }

    /// Allocate a KV cache of `blocks` blocks by the engine's own arithmetic ([`EngineKv`]):
    /// the tensors vLLM allocates (one per layer, or one per layer of a group shared across
    /// the groups of a hybrid model) from the caching allocator, each rounded by its rules. What is
    /// already allocated stays (tensors that fit before an out-of-memory are held until
    /// [`free_kv`](Self::free_kv)).
    pub fn allocate_kv(&mut self, blocks: u64) -> Result<()> {
        let kv = self.kv_layout()?;
        if blocks == 0 {
            return Ok(());
        }
        let runs = kv.tensor_runs(blocks).ok_or_else(|| {
            Error::invalid("KV cache", format!("{blocks} blocks overflow 64 bits"))
        })?;
        for (count, each) in runs {
            for _ in 0..count {
                let b = self.alloc.malloc(each)?;
                self.kv_blocks.push(b);
            }
        }
        Ok(())
    }

    /// Free the KV cache's tensors and give their segments back.
    pub fn free_kv(&mut self) -> Result<()> {
        for b in std::mem::take(&mut self.kv_blocks) {
            self.alloc.free(b)?;
        }
        self.alloc.empty_cache();
        Ok(())
    }

    /// Take the KV cache the session mapped (post-capture): the engine's own layout of
    /// `blocks` blocks must fit in what is mapped, or the engine would write past it (an
    /// out-of-memory of the engine's layout).
    pub fn adopt_kv(&mut self, blocks: u64, range: KvRange) -> Result<()> {
        let need = self.kv_layout()?.total_bytes(blocks).ok_or_else(|| {
            Error::invalid("KV cache", format!("{blocks} blocks overflow 64 bits"))
        })?;
        if need > range.mapped_bytes() {
            return Err(Error::OutOfMemory {
                call: format!(
                    "the engine's KV layout of {blocks} blocks in the {} mapped",
                    memplan_core::bytes::fmt_bytes(range.mapped_bytes())
                ),
                requested: need,
            });
        }
        self.kv_map = Some(range);
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
        if self.setup.allocator_tensors {
            &mut self.alloc
        } else {
            &mut self.stats_only
        }
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
        if !self.neighbour.is_empty() {
            self.armed_captures += 1;
            let now = self.armed_captures;
            while let Some(&(_, bytes)) = self.neighbour.first().filter(|(at, _)| *at <= now) {
                crate::run::others_now(&self.gpu, bytes);
                self.neighbour.remove(0);
            }
        }
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

    /// The session allocates the KV cache through the engine's own arithmetic and measures it;
    /// not offered where the setup says the engine has no hook (it allocates after the session).
    fn allocate_kv_cache(&mut self, blocks: u64) -> Result<bool> {
        if !self.setup.kv_hook {
            return Ok(false);
        }
        self.allocate_kv(blocks)?;
        Ok(true)
    }

    fn release_kv_cache(&mut self) -> Result<()> {
        self.free_kv()
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

/// The engine's allocator as an engine that offers the session no tensors shows it: its
/// statistics, cache release and peaks, and nothing else.
struct StatsOnly(SimAllocator);

impl AllocatorView for StatsOnly {
    fn stats(&self) -> memplan_core::AllocatorStats {
        self.0.stats()
    }

    fn release_cached(&mut self) -> Result<()> {
        self.0.release_cached()
    }

    fn reset_peak(&mut self) {
        self.0.reset_peak()
    }

    fn gpu_id(&self) -> Option<String> {
        self.0.gpu_id()
    }
}
