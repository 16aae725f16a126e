//! Capture real graphs and compare memplan's graph-memory measurement (the graph-pool window
//! of two snapshots) with the drop in driver free memory.
//!
//! Protocol per sample (the core's rule): trim the pool, synchronize and snapshot (baseline),
//! capture + instantiate, snapshot, replay, snapshot, destroy + trim, snapshot. The free drop
//! after replay minus the pool window is what no pool counts: graph exec objects and kernel
//! nodes (one public data point: ~64 KiB per kernel node).

use memplan_backend_cuda::CudaDevice;
use memplan_core::{protocol::snapshot, CaptureWork, Device, GraphId, MemoryInfo};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

/// (kernel nodes, allocation-node bytes) of the single-graph samples.
const SAMPLES: [(u32, u64); 7] = [
    (1, 0),
    (64, 0),
    (512, 0),
    (8, 4 * MIB),
    (8, 64 * MIB),
    (8, 512 * MIB),
    (128, 64 * MIB),
];
/// Allocation-node sizes of the graphs kept alive together (shared-pool experiment).
const SHARED: [u64; 3] = [64 * MIB, 128 * MIB, 256 * MIB];

fn snap(d: &Device) -> Result<MemoryInfo, String> {
    snapshot(d, None).map_err(|e| e.to_string())
}

/// Driver free memory; `None` when unreadable (never a stand-in number).
fn free(m: &MemoryInfo) -> Option<i64> {
    m.driver.free.and_then(|f| i64::try_from(f).ok())
}

/// `a - b` when both were read (JSON `null` otherwise).
fn sub(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a?.checked_sub(b?)
}

fn pool(m: &MemoryInfo) -> Option<i64> {
    m.graph_pool.reserved.map(|v| v as i64)
}

fn capture(d: &Device, work: CaptureWork) -> Result<GraphId, String> {
    let g = d.graph_capture().map_err(|e| e.to_string())?;
    g.begin_capture().map_err(|e| e.to_string())?;
    let recorded = g.record(&work);
    if let Err(e) = recorded {
        let _ = g.abort_capture();
        return Err(e.to_string());
    }
    g.end_capture().map_err(|e| e.to_string())
}

fn trim(d: &Device) -> Result<(), String> {
    d.graph_capture()
        .and_then(|g| g.release_pool())
        .map_err(|e| e.to_string())
}

fn sample(d: &Device, kernels: u32, alloc: u64) -> Result<Value, String> {
    trim(d)?;
    let base = snap(d)?;
    let id = capture(d, CaptureWork::new(kernels).with_alloc_node(alloc))?;
    let inst = snap(d)?;
    d.graph_capture()
        .and_then(|g| g.replay(id))
        .map_err(|e| e.to_string())?;
    let run = snap(d)?;
    d.graph_capture()
        .and_then(|g| g.destroy(id))
        .map_err(|e| e.to_string())?;
    trim(d)?;
    let end = snap(d)?;
    let pool_run = sub(pool(&run), pool(&base));
    let drop_run = sub(free(&base), free(&run));
    Ok(json!({
        "kernel_nodes": kernels,
        "alloc_node_bytes": alloc,
        "after_instantiate": { "free_drop": sub(free(&base), free(&inst)), "graph_pool_reserved": sub(pool(&inst), pool(&base)) },
        "after_replay": { "free_drop": drop_run, "graph_pool_reserved": pool_run, "graph_pool_used_high": run.graph_pool.used_high },
        "not_in_pool": sub(drop_run, pool_run),
        "not_in_pool_per_kernel_node": sub(drop_run, pool_run).map(|n| n / i64::from(kernels.max(1))),
        "pool_covers_alloc_node": pool_run.map(|p| p >= alloc as i64),
        "free_after_teardown_minus_baseline": sub(free(&end), free(&base)),
        "window_after_replay": (run - base).to_string(),
    }))
}

fn shared(d: &Device) -> Result<Value, String> {
    trim(d)?;
    let base = snap(d)?;
    let mut ids = Vec::new();
    for bytes in SHARED {
        ids.push(capture(d, CaptureWork::new(8).with_alloc_node(bytes))?);
    }
    for id in &ids {
        d.graph_capture()
            .and_then(|g| g.replay(*id))
            .map_err(|e| e.to_string())?;
    }
    let run = snap(d)?;
    for id in ids {
        d.graph_capture()
            .and_then(|g| g.destroy(id))
            .map_err(|e| e.to_string())?;
    }
    trim(d)?;
    let end = snap(d)?;
    Ok(json!({
        "alloc_node_bytes": SHARED,
        "sum_of_alloc_nodes": SHARED.iter().sum::<u64>(),
        "max_of_alloc_nodes": SHARED.iter().max(),
        "graph_pool_reserved": sub(pool(&run), pool(&base)),
        "free_drop": sub(free(&base), free(&run)),
        "free_after_teardown_minus_baseline": sub(free(&end), free(&base)),
    }))
}

/// Run every sample that fits in free memory; JSON on stdout.
pub fn run(dev: &Device) -> Result<(), String> {
    let report = measure(dev)?;
    // The test fake (tests/fake/fake_cuda.c) exports this symbol; a real driver does not.
    let fake = memplan_backend_cuda::loader::driver()
        .map(|d| d.has_symbol("fake_cuda_state"))
        .unwrap_or(false);
    let report = json!({
        "driver_is_test_fake": fake,
        "kernel_source": dev.inspect(|c: &CudaDevice| c.kernel_source().map(str::to_string)).flatten(),
        "nvml": dev.inspect(|c: &CudaDevice| c.nvml_memory().map(|m| json!({ "total": m.total, "reserved": m.reserved, "used": m.used,
            "other_processes": m.other_processes, "other_processes_bytes": m.other_processes_bytes }))).flatten(),
        "graphs": report,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn measure(d: &Device) -> Result<Value, String> {
    let caps = d.capabilities().clone();
    if !caps.facts.graph_capture.is_supported() {
        return Err(format!("graph capture: {}", caps.facts.graph_capture));
    }
    let start = snap(d)?;
    let room = start.driver.free.unwrap_or(0).saturating_sub(256 * MIB);
    let mut samples = Vec::new();
    for (k, a) in SAMPLES {
        if a > room {
            samples.push(json!({ "kernel_nodes": k, "alloc_node_bytes": a, "skipped": "does not fit in free memory" }));
            continue;
        }
        samples.push(
            sample(d, k, a).unwrap_or_else(
                |e| json!({ "kernel_nodes": k, "alloc_node_bytes": a, "error": e }),
            ),
        );
    }
    let shared = if SHARED.iter().sum::<u64>() <= room {
        shared(d).unwrap_or_else(|e| json!({ "error": e }))
    } else {
        json!({ "skipped": "does not fit" })
    };
    let covered: Vec<bool> = samples
        .iter()
        .filter_map(|s| s["pool_covers_alloc_node"].as_bool())
        .collect();
    // A sample that failed is not a sample that passed: say so, for the check to fail.
    let errors = samples
        .iter()
        .chain(std::iter::once(&shared))
        .filter(|s| s.get("error").is_some())
        .count();
    Ok(json!({
        "device": d.descriptor(),
        "declared": caps,
        "baseline": start,
        "samples": samples,
        "shared_pool": shared,
        "all_pool_windows_cover_alloc_nodes": !covered.is_empty() && covered.iter().all(|c| *c),
        "sample_errors": errors,
        "all_samples_ran": errors == 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_value_is_null_not_a_sentinel() {
        assert_eq!(sub(Some(10), Some(3)), Some(7));
        assert_eq!(
            sub(Some(3), Some(10)),
            Some(-7),
            "a negative window keeps its sign"
        );
        assert_eq!(sub(None, Some(3)), None);
        assert_eq!(sub(Some(3), None), None);
        assert_eq!(sub(Some(i64::MIN), Some(1)), None, "no overflow panic");
    }
}
