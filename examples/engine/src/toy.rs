// A toy engine that runs on any device memplan opens: its "model" is raw device allocations,
// its graphs are device graphs, and it counts its own memory (memplan's `OwnAccounting`). A
// real engine has its own allocator (a `torch.cuda` caching allocator) and its own graphs; the
// memplan-facing part is the same.

use memplan::{
    AllocatorView, CaptureWork, Engine, GraphId, KvRange, OwnAccounting, RawAllocation, Result,
    SharedDevice,
};

const MIB: u64 = 1 << 20;

/// The engine: weights, graphs, and where its KV cache lives.
pub struct ToyEngine {
    dev: SharedDevice,
    acct: OwnAccounting,
    weights: Vec<RawAllocation>,
    /// The model is split over this many ranks (each loads its share of the weights).
    shards: u64,
    graphs: Vec<GraphId>,
    /// The address the graphs were captured against (post-capture), before any memory was
    /// mapped there.
    pub kv_address: Option<u64>,
}

impl ToyEngine {
    /// An engine on `dev`.
    pub fn new(dev: SharedDevice) -> Self {
        ToyEngine {
            dev,
            acct: OwnAccounting::default(),
            weights: Vec::new(),
            shards: 1,
            graphs: Vec::new(),
            kv_address: None,
        }
    }

    /// One rank of an engine whose model is split over `shards` ranks.
    #[allow(dead_code)] // the multi-rank start-up's; the facade's doc example shows one GPU
    pub fn sharded(dev: SharedDevice, shards: u64) -> Self {
        ToyEngine {
            shards: shards.max(1),
            ..ToyEngine::new(dev)
        }
    }

    /// Allocate from the device and count it.
    pub fn alloc(&mut self, bytes: u64) -> Result<RawAllocation> {
        let a = self.dev.allocate(bytes)?;
        self.acct.add(bytes);
        Ok(a)
    }

    /// Load 3 GiB of weights (this rank's share of them).
    pub fn load(&mut self) -> Result<()> {
        for _ in 0..(24 / self.shards).max(1) {
            let w = self.alloc(128 * MIB)?;
            self.weights.push(w);
        }
        Ok(())
    }

    /// One forward pass over `tokens` tokens: 256 KiB of activations each, freed at the end.
    pub fn forward(&mut self, tokens: u64) -> Result<()> {
        let a = self.alloc(tokens * MIB / 4)?;
        self.acct.remove(a.bytes());
        Ok(self.dev.free(a)?)
    }

    /// Live graphs.
    pub fn graphs(&self) -> usize {
        self.graphs.len()
    }
}

// The memplan-facing part: the hooks memplan calls.
impl Engine for ToyEngine {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.acct
    }
    fn graph_sizes(&self) -> Vec<u32> {
        vec![64, 32, 16, 8, 4, 2, 1]
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        let work = CaptureWork::new(64);
        let g = self.dev.graph_capture()?.capture_once(&work)?;
        self.graphs.push(g);
        Ok(())
    }
    fn release_graphs(&mut self) -> Result<()> {
        match self.graphs.is_empty() {
            true => Ok(()), // nothing captured (maybe a device without graph capture)
            false => {
                let gc = self.dev.graph_capture()?;
                self.graphs.drain(..).try_for_each(|g| gc.destroy(g))
            }
        }
    }
    fn supports_post_capture(&self) -> bool {
        true
    }
    fn bind_kv_range(&mut self, kv: &KvRange) -> Result<()> {
        self.kv_address = Some(kv.address()); // the graphs will point here
        Ok(())
    }
    fn synchronize(&mut self) -> Result<()> {
        // Called before each reading on a device that cannot synchronize itself (Level
        // Zero). This engine allocates and frees synchronously and queues no work of its
        // own, so nothing is in flight; a real engine waits for its queues here.
        Ok(())
    }
}
