//! post-capture through the public API only: the engine gets its KV cache's address range
//! before any capture, and its KV cache is later mapped at exactly that address on the
//! simulated device (checked against the simulator's own record of its mappings, not
//! memplan's). A session dropped half-way gives back the graphs and the range.

#![cfg(feature = "sim")]

use memplan::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan::{
    AllocatorView, CaptureWork, Engine, GraphId, KvRange, OwnAccounting, Request, Result, Session,
    SharedDevice, StrategyKind,
};

/// An engine that records, at each capture, the KV address it had been given.
struct Recording {
    dev: SharedDevice,
    acct: OwnAccounting,
    graphs: Vec<GraphId>,
    weights: Vec<memplan::RawAllocation>,
    bound: Option<u64>,
    seen_at_capture: Vec<Option<u64>>,
}

impl Recording {
    fn new(dev: SharedDevice) -> Self {
        Recording {
            dev,
            acct: OwnAccounting::default(),
            graphs: Vec::new(),
            weights: Vec::new(),
            bound: None,
            seen_at_capture: Vec::new(),
        }
    }

    fn load(&mut self) -> Result<()> {
        let w = self.dev.allocate(2 << 30)?;
        self.acct.add(w.bytes());
        self.weights.push(w);
        Ok(())
    }
}

impl Engine for Recording {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.acct
    }
    fn graph_sizes(&self) -> Vec<u32> {
        vec![8, 4, 2, 1]
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        self.seen_at_capture.push(self.bound);
        let work = CaptureWork::new(16);
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
        self.bound = Some(kv.address());
        Ok(())
    }
}

fn spec() -> (KvSpec, KvLimits) {
    let g = LayerGroup::new(AttentionKind::Full, 24, 8, 128);
    let spec = KvSpec::new(vec![g], KvDtype::Bf16, 16);
    let limits = KvLimits::new(8192, 2048);
    (spec, limits)
}

#[test]
fn the_kv_cache_is_mapped_where_the_engine_was_told_before_capture() {
    // A selector no other test in this binary opens: the sim registry shares devices by id.
    let dev = memplan::open_shared("sim:h100-80gb").unwrap();
    // The simulated GPU behind the device (the simulator's own record of its mappings).
    let gpu = memplan::sim::gpu(&dev).unwrap();
    let mut engine = Recording::new(dev.clone());
    let mut s = Session::start(&dev, &mut engine).unwrap();
    s.load_weights(Recording::load).unwrap();
    s.profile_run(|_| Ok(())).unwrap();
    let est = s.capture_graphs().unwrap();
    assert_eq!(est.strategy, StrategyKind::PostCapture);
    let (spec, limits) = spec();
    let plan = s.plan(Request::Utilization(0.9), &spec, limits).unwrap();
    let cache = s.into_kv_cache(&plan).unwrap();
    assert_eq!(cache.num_blocks, plan.kv.num_blocks);
    assert_eq!(cache.bytes, plan.kv.used_bytes);
    let kv = cache.range.expect("post-capture");

    let bound = engine.bound.expect("the engine was given its KV range");
    // Every capture happened after the engine knew the address.
    assert_eq!(engine.seen_at_capture, vec![Some(bound); 4]);
    // The simulator's own record: one mapping, at offset 0 of the range the engine was given.
    let maps = gpu.vmm_mappings();
    assert_eq!(maps, vec![(bound, 0, kv.mapped_bytes())], "{maps:?}");
    // Every block mapped, rounded up to the 2 MiB granularity, inside the planned bytes.
    assert!(
        kv.mapped_bytes() >= plan.kv.used_bytes
            && kv.mapped_bytes() < plan.kv.used_bytes + (2 << 20)
            && kv.mapped_bytes() <= plan.kv_cache_bytes,
        "{} mapped for {} bytes of blocks",
        kv.mapped_bytes(),
        plan.kv.used_bytes
    );
    assert_eq!(
        gpu.truth().live_graphs,
        4,
        "the graphs stay with the engine"
    );

    // The engine owns the range: dropping it unmaps and releases.
    drop(kv);
    let t = gpu.truth();
    assert_eq!((t.vmm_ranges, t.vmm_mapped), (0, 0));
}

#[test]
fn a_session_dropped_half_way_gives_back_its_graphs_and_range() {
    let dev = memplan::open_shared("sim:rtx4090,other=1GiB").unwrap();
    let gpu = memplan::sim::gpu(&dev).unwrap();
    let mut engine = Recording::new(dev.clone());
    {
        let mut s = Session::start(&dev, &mut engine).unwrap();
        s.load_weights(Recording::load).unwrap();
        s.profile_run(|_| Ok(())).unwrap();
        s.capture_graphs().unwrap();
        assert!(s.kv_range().is_some() && s.kept_graphs());
        assert_eq!(gpu.truth().vmm_ranges, 1);
        // An error in the engine's own code here: the session goes out of scope.
    }
    let t = gpu.truth();
    assert_eq!(
        (t.live_graphs, t.vmm_ranges, t.vmm_mapped),
        (0, 0, 0),
        "graphs released, then the range"
    );
    assert!(engine.graphs.is_empty());
}
