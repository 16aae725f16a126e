//! The session measures the KV cache as the engine release allocates it: vLLM up to 0.28 one
//! tensor per layer (`vllm/v1/worker/gpu_model_runner.py`, `_allocate_kv_cache_tensors`: one
//! `torch.zeros(page_size_bytes * num_blocks)` per layer), vLLM 0.29.0 on one backing
//! allocation (`vllm/v1/worker/utils.py`, `allocate_kv_cache`: one
//! `torch.zeros(bytes_per_block * num_blocks)`), SGLang up to 0.5.22 a K and a V tensor per
//! layer (`MHATokenToKVPool._create_buffers`), each rounded by a PyTorch-like allocator.

#![cfg(feature = "sim")]

use std::collections::HashMap;

use memplan::kv::{
    AttentionKind, KvAllocation, KvDtype, KvLimits, KvSpec, LayerGroup, SizingRules,
};
use memplan::{
    AllocatorConfig, AllocatorStats, AllocatorView, Engine, RawAllocation, Request, Result,
    Session, SharedDevice, TensorId,
};

const MIB: u64 = 1 << 20;
/// PyTorch's rounding of a large request (`kRoundLarge`).
const GRANULE: u64 = 2 * MIB;
const LAYERS: u64 = 24;
/// 16 tokens x 8 KV heads x 128 x (K, V) x bf16.
const PAGE: u64 = 16 * 8 * 128 * 2 * 2;

/// An allocator that rounds every tensor up to [`GRANULE`] and records each request.
struct Rounding {
    dev: SharedDevice,
    held: HashMap<u64, (RawAllocation, u64, u64)>,
    next: u64,
    allocated: u64,
    reserved: u64,
    peak: u64,
    requests: Vec<u64>,
}

impl AllocatorView for Rounding {
    fn stats(&self) -> AllocatorStats {
        AllocatorStats::new(self.reserved, self.allocated, self.peak)
            .with_peak_reserved(Some(self.peak))
    }
    fn release_cached(&mut self) -> Result<()> {
        Ok(())
    }
    fn reset_peak(&mut self) {
        self.peak = self.reserved;
    }
    fn allocate_tensor(&mut self, bytes: u64) -> Result<Option<TensorId>> {
        self.requests.push(bytes);
        let rounded = bytes.div_ceil(GRANULE) * GRANULE;
        let raw = self.dev.allocate(rounded)?;
        self.next += 1;
        self.held.insert(self.next, (raw, bytes, rounded));
        self.allocated += bytes;
        self.reserved += rounded;
        self.peak = self.peak.max(self.reserved);
        Ok(Some(TensorId(self.next)))
    }
    fn free_tensor(&mut self, id: TensorId) -> Result<()> {
        let (raw, bytes, rounded) = self.held.remove(&id.0).expect("a held tensor");
        self.allocated -= bytes;
        self.reserved -= rounded;
        self.dev.free(raw).map_err(|f| f.error)?;
        Ok(())
    }
}

/// An engine without a KV hook whose allocator offers tensors: the session measures the cache
/// through them.
struct Engine0<A: AllocatorView> {
    alloc: A,
    weights: Vec<TensorId>,
}

impl<A: AllocatorView> Engine0<A> {
    fn load(&mut self) -> Result<()> {
        for _ in 0..8 {
            let t = self.alloc.allocate_tensor(128 * MIB)?.expect("offered");
            self.weights.push(t);
        }
        Ok(())
    }
    fn forward(&mut self) -> Result<()> {
        let t = self.alloc.allocate_tensor(255 * MIB)?.expect("offered");
        self.alloc.free_tensor(t)
    }
}

impl<A: AllocatorView> Drop for Engine0<A> {
    fn drop(&mut self) {
        for t in std::mem::take(&mut self.weights) {
            let _ = self.alloc.free_tensor(t);
        }
    }
}

impl<A: AllocatorView> Engine for Engine0<A> {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.alloc
    }
    fn graph_sizes(&self) -> Vec<u32> {
        Vec::new()
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        Ok(())
    }
    fn release_graphs(&mut self) -> Result<()> {
        Ok(())
    }
}

/// How many of the KV tensor `requests` were of `bytes`.
fn requests_of(requests: &[u64], bytes: u64) -> usize {
    requests.iter().filter(|b| **b == bytes).count()
}

/// The devices of the two tests (no other process on either; distinct ids, distinct GPUs).
const ONE_BACKING_DEVICE: &str = "sim:rtx4090,other=0";
const K_AND_V_DEVICE: &str = "sim:rtx4090,other=0B";

/// The plan's blocks, the blocks handed over, and the KV tensor requests of the measurement,
/// on the simulated GPU `device` (tests run in parallel: each test opens a device of its own
/// id, or one test's calibration capture would forbid another's synchronize).
fn measured(device: &str, rules: SizingRules, release: &str) -> (u64, u64, Vec<u64>) {
    let dev = memplan::open(device).unwrap();
    let mut e = Engine0 {
        alloc: Rounding {
            dev: dev.clone(),
            held: HashMap::new(),
            next: 0,
            allocated: 0,
            reserved: 0,
            peak: 0,
            requests: Vec::new(),
        },
        weights: Vec::new(),
    };
    let spec = KvSpec::new(
        vec![LayerGroup::new(AttentionKind::Full, LAYERS as u32, 8, 128)],
        KvDtype::Bf16,
        16,
    );
    let limits = KvLimits::new(4096, 2048);
    let (plan, kv) = {
        let mut s = Session::start(&dev, &mut e)
            .unwrap()
            .with_sizing_rules(rules, release);
        s.load_weights(Engine0::load).unwrap();
        s.profile_run(Engine0::forward).unwrap();
        let plan = s.plan(Request::Utilization(0.9), &spec, limits).unwrap();
        let kv = s.into_kv_cache(&plan).unwrap();
        (plan, kv)
    };
    assert!(
        !kv.allocated,
        "the engine allocates its cache after the session"
    );
    assert!(kv.warnings.is_empty(), "{:?}", kv.warnings);
    assert_eq!(plan.kv.block_bytes, LAYERS * PAGE);
    // The requests but the session's question (one byte), the weights and the activation:
    // the session's KV measurement.
    let kv_requests = e
        .alloc
        .requests
        .iter()
        .copied()
        .filter(|b| ![1, 128 * MIB, 255 * MIB].contains(b))
        .collect();
    (plan.kv.num_blocks, kv.num_blocks, kv_requests)
}

#[test]
fn the_session_measures_one_backing_allocation_where_the_release_makes_one() {
    let (old_planned, old_blocks, old) = measured(
        ONE_BACKING_DEVICE,
        SizingRules::newest(1).with_kv_allocation(KvAllocation::PerTensor),
        "vllm@0.28",
    );
    let (new_planned, new_blocks, new) =
        measured(ONE_BACKING_DEVICE, SizingRules::newest(1), "vllm@0.29");
    // 0.28: tensors of n pages (one of the planned size read alone first, then the caches),
    // the cache handed over allocated whole: 24 of them.
    assert!(
        !old.is_empty() && old.iter().all(|b| b % PAGE == 0),
        "{old:?}"
    );
    assert!(
        requests_of(&old, old_blocks * PAGE) >= LAYERS as usize,
        "{old:?}"
    );
    // 0.29: one tensor of n blocks of 24 pages each.
    assert!(!new.is_empty());
    assert!(new.iter().all(|b| b % (LAYERS * PAGE) == 0), "{new:?}");
    assert!(new.iter().any(|b| *b == new_blocks * LAYERS * PAGE));
    // The plan kept one rounding where there is one allocation: more blocks.
    assert_eq!((old_blocks, new_blocks), (old_planned, new_planned));
    assert!(new_blocks > old_blocks, "{old_blocks} vs {new_blocks}");
}

#[test]
fn the_session_measures_k_and_v_apart_where_sglang_allocates_them_so() {
    // SGLang 0.5.1 to 0.5.22 (`python/sglang/srt/mem_cache/memory_pool.py`,
    // `MHATokenToKVPool._create_buffers`): a `k_buffer` and a `v_buffer` per layer, each one
    // `torch.zeros((size + page_size, head_num, head_dim))`; 0.5.23 K and V as the halves of one
    // `torch.zeros((2, rows, head_num, head_dim))` per layer where their shapes match.
    let rules = |a: KvAllocation| SizingRules::default().with_kv_allocation(a);
    let (one_planned, one_blocks, one) = measured(
        K_AND_V_DEVICE,
        rules(KvAllocation::PairedKv),
        "sglang@0.5.23",
    );
    let (two_planned, two_blocks, two) =
        measured(K_AND_V_DEVICE, rules(KvAllocation::SplitKv), "sglang@0.5.9");
    // The session's measurement: one tensor of the planned size read alone, then whole caches;
    // the cache handed over among them. 0.5.23: 24 tensors of n pages, as one per layer.
    assert!(
        !one.is_empty() && one.iter().all(|b| b % PAGE == 0),
        "{one:?}"
    );
    assert!(
        requests_of(&one, one_blocks * PAGE) >= LAYERS as usize,
        "{one:?}"
    );
    // Before: 48 tensors of n half pages, a K and a V per layer.
    let half = PAGE / 2;
    assert!(
        !two.is_empty() && two.iter().all(|b| b % half == 0),
        "{two:?}"
    );
    assert!(
        requests_of(&two, two_blocks * half) >= 2 * LAYERS as usize,
        "{two:?}"
    );
    // Room for 48 roundings, not 24: on this device 13,856 blocks are 24 tensors of 866 MiB
    // (433 granules each), whose 48 halves of 433 MiB would each round up a megabyte; the plan
    // of K and V apart holds 13,824, halves of 432 MiB.
    assert_eq!((one_blocks, two_blocks), (one_planned, two_planned));
    assert!(two_blocks < one_blocks, "{one_blocks} vs {two_blocks}");
    let up = |x: u64| x.div_ceil(GRANULE) * GRANULE;
    assert!(2 * up(one_blocks * half) > up(one_blocks * PAGE));
}

/// A page of an expandable segment of large requests (PyTorch's `kLargeBuffer`, 20 MiB,
/// `find_expandable_block`).
const MAPPED_PAGE: u64 = 20 * MIB;

/// An allocator with expandable segments (`expandable_segments:True`): every tensor is split
/// off the free tail of one segment, so they lie one after another (each rounded to 512 bytes,
/// `kMinBlockSize`), and the segment grows by mapping whole pages of [`MAPPED_PAGE`]; released,
/// it unmaps the free pages at its end.
struct Pages {
    dev: SharedDevice,
    pages: Vec<RawAllocation>,
    /// Each held tensor's offset in the segment and bytes.
    held: HashMap<u64, (u64, u64)>,
    next: u64,
    allocated: u64,
    peak: u64,
}

impl Pages {
    fn reserved(&self) -> u64 {
        self.pages.len() as u64 * MAPPED_PAGE
    }
    /// Where the last held tensor ends.
    fn end(&self) -> u64 {
        self.held.values().map(|(at, b)| at + b).max().unwrap_or(0)
    }
}

impl AllocatorView for Pages {
    fn stats(&self) -> AllocatorStats {
        AllocatorStats::new(self.reserved(), self.allocated, self.peak)
            .with_peak_reserved(Some(self.peak))
    }
    fn release_cached(&mut self) -> Result<()> {
        let end = self.end();
        while self.reserved() >= end + MAPPED_PAGE {
            let page = self.pages.pop().expect("a mapped page");
            self.dev.free(page).map_err(|f| f.error)?;
        }
        Ok(())
    }
    fn reset_peak(&mut self) {
        self.peak = self.reserved();
    }
    fn allocate_tensor(&mut self, bytes: u64) -> Result<Option<TensorId>> {
        let bytes = bytes.div_ceil(512) * 512;
        let at = self.end();
        while self.reserved() < at + bytes {
            let page = self.dev.allocate(MAPPED_PAGE)?;
            self.pages.push(page);
        }
        self.next += 1;
        self.held.insert(self.next, (at, bytes));
        self.allocated += bytes;
        self.peak = self.peak.max(self.reserved());
        Ok(Some(TensorId(self.next)))
    }
    fn free_tensor(&mut self, id: TensorId) -> Result<()> {
        let (_, bytes) = self.held.remove(&id.0).expect("a held tensor");
        self.allocated -= bytes;
        Ok(())
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        for page in self.pages.drain(..) {
            let _ = self.dev.free(page);
        }
    }
}

/// An engine that declares expandable segments with a `large_segment_size_mb` of 1 GiB: a
/// release may map pages of that size, so the plan keeps room for the KV cache's tensors'
/// sum rounded up to 1 GiB. This allocator maps 20 MiB pages (PyTorch's `kLargeBuffer`,
/// whatever `large_segment_size_mb` says), and the session's measure of the cache, allocated
/// whole, shows it (no whole number of 1 GiB pages): the count grows to the plan's own with
/// 20 MiB pages. Kept at the plan's count, a cache of 14 GiB stood in a room of 14.25 GiB
/// (98.3% of what fitted).
#[test]
fn a_cache_packed_into_pages_finer_than_the_plan_kept_grows_to_its_room() {
    let dev = memplan::open("sim:rtx4090,other=0KiB").unwrap();
    let mut e = Engine0 {
        alloc: Pages {
            dev: dev.clone(),
            pages: Vec::new(),
            held: HashMap::new(),
            next: 0,
            allocated: 0,
            peak: 0,
        },
        weights: Vec::new(),
    };
    let conf = AllocatorConfig::parse("expandable_segments:True,large_segment_size_mb:1024")
        .expect("a valid configuration");
    let spec = KvSpec::new(
        vec![LayerGroup::new(AttentionKind::Full, LAYERS as u32, 8, 128)],
        KvDtype::Bf16,
        16,
    );
    let rules = SizingRules::newest(1).with_kv_allocation(KvAllocation::PerTensor);
    let (plan, kv) = {
        let mut s = Session::start(&dev, &mut e)
            .unwrap()
            .with_sizing_rules(rules, "vllm@0.28")
            .with_allocator_config(conf, "the test's PYTORCH_ALLOC_CONF");
        s.load_weights(Engine0::load).unwrap();
        s.profile_run(Engine0::forward).unwrap();
        let plan = s
            .plan(Request::Utilization(0.9), &spec, KvLimits::new(4096, 2048))
            .unwrap();
        let kv = s.into_kv_cache(&plan).unwrap();
        (plan, kv)
    };
    assert!(!kv.allocated && kv.warnings.is_empty(), "{kv:?}");
    let block = plan.kv.block_bytes;
    assert_eq!(block, LAYERS * PAGE);
    // The plan's count: its tensors' sum within whole pages of 1 GiB of its room.
    let gib = 1024 * MIB;
    let room = plan.kv_budget_bytes;
    assert!(plan.kv.num_blocks * block <= room / gib * gib);
    // Grown past it, to the plan's count with 20 MiB pages: the most blocks whose tensors'
    // sum is within whole 20 MiB pages of the room.
    assert!(
        kv.num_blocks > plan.kv.num_blocks,
        "{} planned, {} handed over",
        plan.kv.num_blocks,
        kv.num_blocks
    );
    let pages = room / MAPPED_PAGE * MAPPED_PAGE;
    assert!(kv.num_blocks * block <= pages, "{kv:?} in {pages}");
    assert!((kv.num_blocks + 1) * block > pages, "{kv:?} in {pages}");
}
