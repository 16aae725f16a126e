//! An engine whose hooks answer nonsense (statistics that contradict each other or jump to
//! 2^64 - 1, graph sizes of 0 or 2^32 - 1, hints at their types' maximum, hooks that fail
//! or do nothing) drives a whole start-up: every step ends in a plan or an error, never a
//! panic. The Python package hands its engines' answers to these same steps, so a panic
//! here would reach Python as an internal error.
//!
//! Generated: `MEMPLAN_FUZZ_SEED` picks another deterministic run, `MEMPLAN_FUZZ_SCALE=N`
//! runs N times as many engines.

#![cfg(feature = "sim")]

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use memplan::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan::{AllocatorStats, AllocatorView, Engine, Error, KvRange, Request, Result, Session};

/// splitmix64.
#[derive(Clone)]
struct Rng(Cell<u64>);
impl Rng {
    fn next(&self) -> u64 {
        let s = self.0.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.0.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&self) -> u64 {
        [
            0,
            1,
            1 << 20,
            1 << 30,
            1 << 40,
            1 << 62,
            u64::MAX - 1,
            u64::MAX,
            self.next(),
        ][self.below(9) as usize]
    }
    fn size(&self) -> u32 {
        [0, 1, 2, 8, 512, 1 << 20, u32::MAX][self.below(7) as usize]
    }
}

/// Answers drawn from `rng` at every call.
struct Hostile {
    rng: Rng,
    /// Percent of hook calls that fail.
    fail: u64,
    /// Percent of statistics and answers that are nonsense (the rest are plausible).
    nonsense: u64,
}

impl Hostile {
    fn maybe_fail(&self, hook: &str) -> Result<()> {
        if self.rng.below(100) < self.fail {
            return Err(Error::Measurement(format!("{hook} failed")));
        }
        Ok(())
    }
}

impl AllocatorView for Hostile {
    fn stats(&self) -> AllocatorStats {
        let r = &self.rng;
        if r.below(100) >= self.nonsense {
            return AllocatorStats::new(1 << 30, 1 << 30, 1 << 30)
                .with_peak_reserved(Some(1 << 30));
        }
        AllocatorStats::new(r.bytes(), r.bytes(), r.bytes())
            .with_peak_reserved((r.below(2) == 0).then(|| r.bytes()))
    }
    fn release_cached(&mut self) -> Result<()> {
        self.maybe_fail("release_cached")
    }
    fn reset_peak(&mut self) {}
}

impl Engine for Hostile {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        self
    }
    fn graph_sizes(&self) -> Vec<u32> {
        if self.rng.below(100) >= self.nonsense {
            return vec![8, 4, 2, 1];
        }
        let n = [0, 1, 3, 67, 2000][self.rng.below(5) as usize];
        (0..n).map(|_| self.rng.size()).collect()
    }
    fn warm_up(&mut self, _size: u32) -> Result<()> {
        self.maybe_fail("warm_up")
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        self.maybe_fail("capture_graph")
    }
    fn release_graphs(&mut self) -> Result<()> {
        self.maybe_fail("release_graphs")
    }
    fn supports_post_capture(&self) -> bool {
        self.rng.below(2) == 0
    }
    fn bind_kv_range(&mut self, _range: &KvRange) -> Result<()> {
        self.maybe_fail("bind_kv_range")
    }
    fn kernel_nodes_hint(&self, _size: u32) -> Option<u32> {
        [None, Some(0), Some(u32::MAX), Some(self.rng.next() as u32)][self.rng.below(4) as usize]
    }
    fn alloc_node_bytes_hint(&self, _size: u32) -> Option<u64> {
        [None, Some(0), Some(u64::MAX), Some(self.rng.bytes())][self.rng.below(4) as usize]
    }
}

fn kv() -> (KvSpec, KvLimits) {
    let g = LayerGroup::new(AttentionKind::Full, 24, 8, 128);
    (
        KvSpec::new(vec![g], KvDtype::Bf16, 16),
        KvLimits::new(4096, 2048),
    )
}

/// One whole start-up; which step ended it (`plan` when it planned).
fn start_up(dev: &memplan::SharedDevice, e: &mut Hostile) -> &'static str {
    let (spec, limits) = kv();
    let req = [
        Request::Utilization(0.9),
        Request::Utilization(1.0),
        Request::KvCacheBytes(1 << 30),
        Request::KvCacheBytes(u64::MAX),
    ][e.rng.below(4) as usize];
    let Ok(mut s) = Session::start(dev, e) else {
        return "start";
    };
    if s.check_request(req).is_err() {
        return "check_request";
    }
    if s.load_weights(|e| e.maybe_fail("load_weights")).is_err() {
        return "load_weights";
    }
    if s.profile_run(|e| e.maybe_fail("profile_run")).is_err() {
        return "profile_run";
    }
    if s.capture_graphs().is_err() {
        return "capture_graphs";
    }
    match s.plan(req, &spec, limits) {
        Ok(p) => {
            let _ = s.into_kv_cache(&p);
            "plan"
        }
        Err(_) => "plan refused",
    }
}

#[test]
fn nonsense_from_every_hook_is_an_error_never_a_panic() {
    let seed = std::env::var("MEMPLAN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0068_6f73_7469_6c65_u64);
    let scale: u64 = std::env::var("MEMPLAN_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut panics = Vec::new();
    let mut ends = std::collections::BTreeMap::new();
    for i in 0..200 * scale {
        let dev = memplan::open("sim:rtx4090,other=0").unwrap();
        let mut e = Hostile {
            rng: Rng(Cell::new(seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d))),
            fail: [0, 0, 5, 50][(i % 4) as usize],
            nonsense: [0, 2, 10, 30, 100][(i / 4 % 5) as usize],
        };
        match catch_unwind(AssertUnwindSafe(|| start_up(&dev, &mut e))) {
            Ok(end) => *ends.entry(end).or_insert(0) += 1,
            Err(p) => panics.push(format!(
                "engine {i}: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        }
    }
    assert!(
        panics.is_empty(),
        "{} panic(s):\n{}",
        panics.len(),
        panics.join("\n")
    );
    // Not vacuous: plausible engines plan, nonsense is refused at every step.
    assert!(ends.get("plan").is_some_and(|n| *n > 10), "{ends:?}");
    assert!(ends.len() >= 5, "{ends:?}");
}
