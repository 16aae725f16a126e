//! A device that cannot synchronize (Level Zero: `facts.synchronize` unsupported): the
//! simulator lets memory the engine released while its queue had work in flight go only when
//! the engine synchronizes its queue, and the session must wait through `Engine::synchronize`
//! before each reading, or say by name that it could not.

use memplan_backend_sim::{BlockId, SimAllocator, SimGpu};
use memplan_core::bytes::GIB;
use memplan_core::{AllocatorView, Result};
use memplan_planner::strategy::NoGraphs;
use memplan_planner::{Engine, Session, Warning};

/// An eager engine: weights, then a profile run that empties its cache at the end (as vLLM's
/// does) without waiting for its queue. `hook` says whether it implements `synchronize`.
struct Eager {
    alloc: SimAllocator,
    weights: Vec<BlockId>,
    hook: bool,
    syncs: usize,
}

impl Eager {
    fn on(gpu: &SimGpu, hook: bool) -> Self {
        Eager {
            alloc: gpu.allocator(),
            weights: Vec::new(),
            hook,
            syncs: 0,
        }
    }
}

impl Engine for Eager {
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
    fn synchronize(&mut self) -> Result<()> {
        if !self.hook {
            return Err(memplan_core::Error::unsupported(
                "engine synchronize",
                "this test engine has no hook",
            ));
        }
        self.syncs += 1;
        self.alloc.synchronize()
    }
}

const WEIGHTS: u64 = 8 * GIB;
const ACTIVATION: u64 = 3 * GIB;

/// Begin, load weights, profile run, no graphs: the measured non-allocator growth and the
/// warnings.
fn start_up(gpu: &SimGpu, e: &mut Eager) -> (Option<i64>, Vec<Warning>) {
    let device = gpu.device();
    let cap = device.capabilities().clone();
    let mut s = Session::begin(&device, e, cap).unwrap();
    s.load_weights(|e| {
        e.weights.push(e.alloc.malloc(WEIGHTS)?);
        Ok(())
    })
    .unwrap();
    s.profile_run(|e| {
        let a = e.alloc.malloc(ACTIVATION)?;
        e.alloc.free(a)?;
        e.alloc.empty_cache();
        Ok(())
    })
    .unwrap();
    s.graph_phase(&NoGraphs, "eager").unwrap();
    let w = s.warnings().to_vec();
    let (p, _) = s.into_parts();
    (p.non_allocator_growth, w)
}

#[test]
fn simulated_intel_releases_only_when_the_engine_queue_is_synchronized() {
    let gpu = SimGpu::open("max1550").unwrap();
    assert!(!gpu.device().capabilities().facts.synchronize.is_supported());
    let alloc = gpu.allocator();
    let b = alloc.malloc(ACTIVATION).unwrap();
    alloc.free(b).unwrap();
    let before = gpu.truth().free;
    alloc.empty_cache();
    assert_eq!(gpu.truth().queued_release, ACTIVATION);
    // memplan's synchronize on this device waits for nothing of the engine's.
    gpu.device().synchronize().unwrap();
    assert_eq!(
        gpu.truth().free,
        before,
        "released before the engine synchronized"
    );
    alloc.synchronize().unwrap();
    assert_eq!(gpu.truth().queued_release, 0);
    assert_eq!(gpu.truth().free, before + ACTIVATION);

    // A device-wide synchronize (CUDA) covers the engine's queue: released at once.
    let gpu = SimGpu::open("rtx4090").unwrap();
    assert!(gpu.device().capabilities().facts.synchronize.is_supported());
    let alloc = gpu.allocator();
    let b = alloc.malloc(ACTIVATION).unwrap();
    alloc.free(b).unwrap();
    alloc.empty_cache();
    assert_eq!(gpu.truth().queued_release, 0);
}

/// The engine's non-allocator growth on this eager start-up is zero (it allocates nothing
/// outside its allocator). Ignoring the engine's hook would count the activation segments that
/// were still in flight at the profile run's reading as non-allocator growth.
#[test]
fn the_session_synchronizes_the_engine_where_the_device_cannot() {
    let gpu = SimGpu::open("max1550").unwrap();
    let mut e = Eager::on(&gpu, true);
    let (growth, warnings) = start_up(&gpu, &mut e);
    assert_eq!(growth, Some(0), "warnings: {warnings:?}");
    assert!(
        e.syncs >= 3,
        "one engine synchronize per reading, got {}",
        e.syncs
    );
    assert!(
        !warnings
            .iter()
            .any(|w| matches!(w, Warning::ReadingsNotSynchronized { .. })),
        "{warnings:?}"
    );
}

#[test]
fn without_either_synchronize_the_session_warns_by_name() {
    let gpu = SimGpu::open("max1550").unwrap();
    let mut e = Eager::on(&gpu, false);
    let (growth, warnings) = start_up(&gpu, &mut e);
    let unsynced: Vec<_> = warnings
        .iter()
        .filter(|w| matches!(w, Warning::ReadingsNotSynchronized { .. }))
        .collect();
    assert_eq!(unsynced.len(), 1, "once per session: {warnings:?}");
    assert_eq!(unsynced[0].code(), "readings_not_synchronized");
    assert!(
        unsynced[0]
            .to_string()
            .contains("zeCommandQueueSynchronize"),
        "{}",
        unsynced[0]
    );
    // The consequence the warning is about: the released activation read as still held.
    assert_eq!(growth, Some(ACTIVATION as i64));
}

#[test]
fn a_device_that_synchronizes_never_calls_the_engine_hook() {
    let gpu = SimGpu::open("rtx4090").unwrap();
    let mut e = Eager::on(&gpu, true);
    let (growth, warnings) = start_up(&gpu, &mut e);
    assert_eq!(growth, Some(0));
    assert_eq!(e.syncs, 0);
    assert!(warnings.is_empty(), "{warnings:?}");
}
