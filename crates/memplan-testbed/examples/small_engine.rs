//! A small inference engine running its start-up through memplan on a simulated GPU.
//!
//! The engine owns a caching allocator (the simulator's, PyTorch-like), loads weights, runs a
//! profile pass, and captures one graph per batch size. memplan calibrates the device, decides
//! the graph strategy from the calibrated capability, measures each step with the protocol
//! (release cached memory, synchronize, snapshot every layer, teardown on every path), and
//! returns the plan. Then the engine does what it would do for real: allocate the KV cache the
//! plan allows, capture its graphs, serve.
//!
//! Run: `cargo run -p memplan-testbed --example small_engine [-- DEVICE]` (default
//! `rtx4090`; try `rx7900xtx-rocm6.2,declare-exact` or `arc-a770`).

use memplan_backend_sim::{BlockId, GraphSpec, SimAllocator, SimGpu};
use memplan_core::bytes::{GIB, KIB, MIB};
use memplan_core::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan_core::{AllocatorView, GraphId, Result};
use memplan_planner::budget::Request;
use memplan_planner::{calibrate, plan, select, Engine, PlanInputs, SelectionPolicy, Session};

/// The engine: its allocator, weights and graphs.
struct SmallEngine {
    alloc: SimAllocator,
    weights: Vec<BlockId>,
    graphs: Vec<GraphId>,
    capturing: bool,
}

impl SmallEngine {
    fn load(&mut self) -> Result<()> {
        for _ in 0..64 {
            self.weights.push(self.alloc.malloc(48 * MIB)?);
        }
        Ok(())
    }

    fn dummy_run(&mut self) -> Result<()> {
        let act = self.alloc.malloc(GIB)?;
        self.alloc.free(act)?;
        self.alloc.empty_cache();
        Ok(())
    }
}

impl Engine for SmallEngine {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.alloc
    }

    fn graph_sizes(&self) -> Vec<u32> {
        let mut v = vec![1, 2, 4];
        v.extend((8..=256).step_by(8));
        v.reverse();
        v
    }

    fn warm_up(&mut self, size: u32) -> Result<()> {
        let b = self.alloc.malloc(u64::from(size) * 256 * KIB)?;
        self.alloc.free(b)
    }

    fn capture_graph(&mut self, size: u32) -> Result<()> {
        self.alloc.begin_graph_capture()?;
        self.capturing = true;
        let spec = GraphSpec {
            kernel_nodes: 64,
            intermediate_bytes: u64::from(size) * 128 * KIB,
            alloc_node_bytes: 4 * MIB,
        };
        let g = self.alloc.end_graph_capture(&spec);
        self.capturing = false;
        self.graphs.push(g?);
        Ok(())
    }

    fn release_graphs(&mut self) -> Result<()> {
        if self.capturing {
            self.alloc.abort_graph_capture();
            self.capturing = false;
        }
        for g in std::mem::take(&mut self.graphs) {
            self.alloc.destroy_graph(g)?;
        }
        self.alloc.release_private_pools()
    }
}

fn main() -> Result<()> {
    let selector = std::env::args().nth(1).unwrap_or_else(|| "rtx4090".into());
    let gpu = SimGpu::open(&selector)?;
    let mut engine = SmallEngine {
        alloc: gpu.allocator(),
        weights: Vec::new(),
        graphs: Vec::new(),
        capturing: false,
    };

    // 1. Check what the backend declares.
    let report = calibrate(&mut gpu.clone())?;
    print!("{report}");

    // 2. Profile the start-up through memplan's protocol.
    let mut device = gpu.clone();
    let mut s = Session::begin(&mut device, &mut engine, report.calibrated.clone())?;
    s.load_weights(&mut engine, |e| e.load())?;
    s.profile_run(&mut engine, |e| e.dummy_run())?;
    let sel = select(
        s.capability(),
        engine.graph_sizes().len(),
        engine.supports_post_capture(),
        SelectionPolicy::default(),
    );
    s.graph_phase(&mut engine, &*sel.kind.strategy())?;
    let profile = s.finish();

    // 3. Plan the KV cache of a 28-layer, 2-KV-head model.
    let inputs = PlanInputs {
        request: Request::Utilization(0.9),
        kv: KvSpec {
            groups: vec![LayerGroup {
                attention: AttentionKind::Full,
                num_layers: 28,
                kv_heads: 2,
                head_dim_k: 128,
                head_dim_v: 128,
            }],
            dtype: KvDtype::Bf16,
            block_size: 16,
        },
        limits: KvLimits {
            max_model_len: 32768,
            max_num_batched_tokens: 8192,
            max_len_limit: 131072,
        },
    };
    let plan = plan(&profile, sel.why, &inputs)?;
    println!("\n{plan}");

    // 4. What the engine does next: the KV cache, the real graphs, a burst.
    let kv = engine.alloc.malloc(plan.kv_bytes)?;
    for size in engine.graph_sizes() {
        engine.warm_up(size)?;
        engine.capture_graph(size)?;
    }
    engine.dummy_run()?;
    println!(
        "served: KV cache of {} MiB, {} graphs, no out-of-memory",
        plan.kv_bytes / MIB,
        engine.graphs.len()
    );
    engine.alloc.free(kv)?;
    Ok(())
}
