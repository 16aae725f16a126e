//! The oracle: the largest KV cache that would have fit, computed only from the simulator's
//! ground truth ([`GroundTruth`]) and the scenario's true inputs.
//!
//! Written apart from the planner on purpose: nothing here calls planner code (no budget
//! arithmetic, no KV sizing, no plan figure). What the engine's parts really take is measured by
//! running the engine *alone* on a fresh device with the same seed ([`engine_alone`]): no
//! profiling, no calibration, only the engine's own steps, each read from the ground truth. The
//! KV page arithmetic is its own, from the scenario's model shape ([`tokens_in`]).
//!
//! The oracle of one run ([`oracle_bytes`]) is the smaller of
//! - the room within the requested memory: `requested` (a fraction of the true total, or the
//!   byte budget) less the weights, activation, library workspace and graph memory the engine
//!   alone takes, less the per-capture memory the run's own profiling left held for good;
//! - the physical room at the moment the plan was made: the true free memory less the peak the
//!   engine still needs after allocating its KV cache (capturing its graphs with their
//!   warm-ups, then a burst at full concurrency).

use memplan_backend_sim::{GroundTruth, SimGpu};
use memplan_core::Result;

use crate::engine::SimEngine;
use crate::run::{graph_truth, open};
use crate::setup::Setup;

/// What the engine's parts take when it runs alone (bytes, from the ground truth).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineAlone {
    /// Allocator segments holding the weights.
    pub weights: u64,
    /// Segments the activation peak needs above the weights.
    pub activation: u64,
    /// Driver memory of the library workspace (outside the allocator).
    pub workspace: u64,
    /// Graph memory of capturing every size (pool, executable objects, allocation nodes,
    /// per-capture memory).
    pub graph: u64,
    /// Peak growth of the process while capturing every graph (warm-ups included) and then
    /// serving a burst, above where it stood before the first warm-up.
    pub capture_and_burst_peak: u64,
}

/// Run the engine alone on a fresh device of the scenario (same selector and seed, the other
/// processes present at start) and read what each part takes from the ground truth.
pub fn engine_alone(setup: &Setup) -> Result<EngineAlone> {
    let gpu = open(setup)?;
    let mut e = SimEngine::new(gpu.clone(), setup.clone());
    let alloc = gpu.allocator();
    let t0 = gpu.truth();
    e.load_weights()?;
    let t1 = gpu.truth();
    let b = alloc.malloc(setup.activation_peak.max(1))?;
    let activation = gpu.truth().allocator_reserved - t1.allocator_reserved;
    alloc.free(b)?;
    alloc.empty_cache();
    // The engine waits for its own queue after the profile run (on a platform without a
    // device-wide synchronize, the segments return only then).
    alloc.synchronize()?;
    let mut workspace = 0;
    let mut _held = None;
    if setup.workspace > 0 {
        let r0 = gpu.truth().raw_allocations;
        _held = Some(e.device().allocate(setup.workspace)?);
        workspace = gpu.truth().raw_allocations - r0;
    }
    let base = gpu.truth().this_process();
    let g0 = graph_truth(&gpu.truth());
    let mut peak = 0u64;
    let mut see = |gpu: &SimGpu| peak = peak.max(gpu.truth().this_process().saturating_sub(base));
    for s in setup.sizes.clone() {
        memplan_planner::Engine::warm_up(&mut e, s)?;
        see(&gpu);
        match memplan_planner::Engine::capture_graph(&mut e, s) {
            // The device cannot capture: the engine runs eagerly, no graph memory.
            Err(memplan_core::Error::Unsupported { .. }) => {
                memplan_planner::Engine::release_graphs(&mut e)?;
                break;
            }
            r => r?,
        }
        see(&gpu);
    }
    let graph = graph_truth(&gpu.truth()).saturating_sub(g0);
    let b = alloc.malloc(setup.activation_peak.max(1))?;
    see(&gpu);
    alloc.free(b)?;
    Ok(EngineAlone {
        weights: t1.allocator_reserved - t0.allocator_reserved,
        activation,
        workspace,
        graph,
        capture_and_burst_peak: peak,
    })
}

/// The requested memory, from the true total: `ceil(total * utilization)` or the byte budget.
pub fn requested(total: u64, utilization: Option<f64>, budget: Option<u64>) -> Option<u64> {
    match (utilization, budget) {
        (Some(u), None) if u > 0.0 && u <= 1.0 => Some(((total as f64) * u).ceil() as u64),
        (None, Some(b)) => Some(b),
        _ => None,
    }
}

/// Where the run stood when its plan was made.
#[derive(Debug, Clone, Copy)]
pub struct AtPlan {
    /// Ground truth at device open (before the engine did anything).
    pub start: GroundTruth,
    /// Ground truth right after the plan (before the KV cache).
    pub plan: GroundTruth,
    /// The strategy kept its graphs (post-capture): nothing left to capture.
    pub graphs_kept: bool,
    /// The engine runs eagerly: no graphs at all.
    pub eager: bool,
}

/// The largest KV cache (bytes) that would have fit from the plan's moment on.
pub fn oracle_bytes(setup: &Setup, alone: &EngineAlone, at: &AtPlan) -> Option<u64> {
    let req = &setup.scenario.request;
    let budget = match &req.memory_budget {
        Some(b) => Some(b.bytes("memory_budget").ok()?),
        None => None,
    };
    let requested = requested(at.start.total, req.gpu_memory_utilization, budget)?;
    let graph = if at.eager { 0 } else { alone.graph };
    // Per-capture memory the run's own measuring captures left held (never returned): the
    // process holds it whatever it plans next. Kept graphs' memory is their graph memory.
    let leftover = if at.graphs_kept {
        0
    } else {
        at.plan
            .hidden_capture
            .saturating_sub(at.start.hidden_capture)
    };
    let in_request = [
        alone.weights,
        alone.activation,
        alone.workspace,
        leftover,
        graph,
    ]
    .iter()
    .fold(requested, |room, x| room.saturating_sub(*x));
    let still_needed = if at.graphs_kept || at.eager {
        alone.activation
    } else {
        alone.capture_and_burst_peak
    };
    let physical = at.plan.free.saturating_sub(still_needed);
    Some(largest_kv_allocation(
        in_request.min(physical),
        at.graphs_kept,
    ))
}

/// The largest KV cache whose allocation takes at most `room`: mapped into a reserved range
/// (post-capture) it takes its own bytes (the engine maps whole pages, rounding down); from
/// the caching allocator it takes a fresh segment, rounded up by the allocator's rules.
fn largest_kv_allocation(room: u64, mapped: bool) -> u64 {
    if mapped {
        return room;
    }
    // The segment size is monotonic in the request: bisect for the largest request that fits.
    let (mut lo, mut hi) = (0u64, room);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if memplan_backend_sim::SimAllocator::fresh_segment_bytes(mid) <= room {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Tokens a KV cache of `bytes` holds, from the scenario's model shape: one block holds
/// `block_size` tokens of K and V for every layer and KV head (int8 adds one f32 scale per token
/// and head for K and for V); one block is the engine's null block.
pub fn tokens_in(setup: &Setup, bytes: u64) -> Option<u64> {
    let k = &setup.scenario.kv;
    let (elem, scale) = match k.dtype.to_ascii_lowercase().as_str() {
        "fp32" | "float32" | "float" => (4u64, 0u64),
        "fp16" | "float16" | "half" | "bf16" | "bfloat16" => (2, 0),
        "int8" => (1, 4),
        d if d.starts_with("fp8") || d.starts_with("float8") => (1, 0),
        _ => return None,
    };
    let per_token_head = 2 * (u64::from(k.head_dim) * elem + scale);
    let block = u64::from(k.layers)
        .checked_mul(u64::from(k.kv_heads))?
        .checked_mul(u64::from(k.block_size))?
        .checked_mul(per_token_head)?;
    if block == 0 {
        return None;
    }
    Some((bytes / block).saturating_sub(1) * u64::from(k.block_size))
}
