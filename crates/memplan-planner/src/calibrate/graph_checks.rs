//! The graph and virtual-memory checks of calibration.

use memplan_core::bytes::{fmt_bytes, MIB};
use memplan_core::{
    CaptureWork, Device, GraphId, GraphPoolMemory, GraphRelease, ProfilingCapability, Reading,
    Reliability, Result, Support,
};

use super::checks::{tolerance, verdict_reading, Observed};
use super::report::{Evidence, Status, Verdict};
use crate::strategy::EXEC_BYTES_PER_KERNEL_NODE;

/// Kernel nodes and allocation-node bytes of the calibration graph.
const NODES: u32 = 64;
const ALLOC: u64 = 32 * MIB;

pub(super) fn fact(
    item: &str,
    declared: String,
    calibrated: String,
    status: Status,
    evidence: Vec<Evidence>,
    note: &str,
) -> Verdict {
    Verdict {
        item: item.into(),
        declared,
        calibrated,
        status,
        evidence,
        note: note.into(),
    }
}

pub(super) fn free(device: &mut dyn Device, sync: bool) -> Result<Option<i64>> {
    if sync {
        device.synchronize()?;
    }
    Ok(device.driver_memory()?.free.map(|f| f as i64))
}

fn pool_growth(p0: &GraphPoolMemory, p1: &GraphPoolMemory) -> Option<i64> {
    let grow = |a: Option<u64>, b: Option<u64>| Some(b? as i64 - a? as i64);
    [
        grow(p0.reserved_high, p1.reserved_high),
        grow(p0.used_high, p1.used_high),
        grow(p0.reserved, p1.reserved),
    ]
    .into_iter()
    .flatten()
    .max()
}

/// Capture, replay and destroy one graph with a known allocation node.
struct GraphRun {
    f0: Option<i64>,
    f1: Option<i64>,
    f_destroyed: Option<i64>,
    f_synced: Option<i64>,
    f_released: Option<i64>,
    pool_growth: Option<i64>,
}

fn capture_once(device: &mut dyn Device) -> Result<GraphRun> {
    let f0 = free(device, true)?;
    let p0 = device.graph_pool_memory()?;
    let gc = device.graph_capture()?;
    gc.begin_capture()?;
    let recorded = gc
        .record(&CaptureWork {
            kernel_nodes: NODES,
            alloc_node_bytes: ALLOC,
        })
        .and_then(|_| gc.end_capture());
    let g: GraphId = match recorded {
        Ok(g) => g,
        Err(e) => {
            let _ = gc.abort_capture();
            return Err(e);
        }
    };
    let measured = (|| -> Result<(Option<i64>, GraphPoolMemory)> {
        device.graph_capture()?.replay(g)?;
        let f1 = free(device, true)?;
        Ok((f1, device.graph_pool_memory()?))
    })();
    // Teardown on every path: destroy, then release the pool.
    let destroyed = device.graph_capture().and_then(|gc| gc.destroy(g));
    let f_destroyed = free(device, false)?;
    let f_synced = free(device, true)?;
    let released = device.graph_capture().and_then(|gc| gc.release_pool());
    let f_released = free(device, true)?;
    let (f1, p1) = measured?;
    destroyed?;
    released?;
    Ok(GraphRun {
        f0,
        f1,
        f_destroyed,
        f_synced,
        f_released,
        pool_growth: pool_growth(&p0, &p1),
    })
}

/// Graph capture, graph-pool attributes, graph release timing and per-capture memory.
pub(super) fn graphs(
    device: &mut dyn Device,
    cal: &mut ProfilingCapability,
) -> Result<Vec<Verdict>> {
    let declared_capture = cal.facts.graph_capture.clone();
    if !declared_capture.is_supported() {
        let pool = verdict_reading(
            cal,
            Reading::GraphPool,
            Observed {
                checked: true,
                reliability: None,
                evidence: vec![],
                note: "no graph capture".into(),
            },
        );
        return Ok(vec![
            fact(
                "graph_capture",
                declared_capture.to_string(),
                declared_capture.to_string(),
                Status::NotChecked,
                vec![],
                "declared unsupported",
            ),
            pool,
        ]);
    }
    let run = match capture_once(device) {
        Ok(r) => r,
        Err(e) => {
            cal.facts.graph_capture = Support::no(format!("calibration capture failed: {e}"));
            cal.set(
                Reading::GraphPool,
                Reliability::Unavailable {
                    reason: "graph capture failed".into(),
                },
            );
            let v = fact(
                "graph_capture",
                declared_capture.to_string(),
                cal.facts.graph_capture.to_string(),
                Status::Downgraded,
                vec![],
                "",
            );
            return Ok(vec![v]);
        }
    };
    let mut out = vec![fact(
        "graph_capture",
        "yes".into(),
        "yes".into(),
        Status::Confirmed,
        vec![],
        "captured, replayed and destroyed one graph",
    )];

    // Graph-pool attributes must move with an allocation node.
    let ev = vec![Evidence::bytes(
        format!(
            "graph pool growth for a {} allocation node",
            fmt_bytes(ALLOC)
        ),
        ALLOC as i64,
        run.pool_growth,
        ALLOC / 2,
    )];
    let pool_rel = match run.pool_growth {
        None => Some(Reliability::Unavailable {
            reason: "the device returned no graph-pool attribute".into(),
        }),
        Some(g) if g < (ALLOC / 2) as i64 => Some(Reliability::Unavailable {
            reason: format!(
                "graph-pool attributes moved by {} for a {} allocation node (a stub?)",
                fmt_bytes(g.max(0) as u64),
                fmt_bytes(ALLOC)
            ),
        }),
        _ => None,
    };
    let pool_verdict = verdict_reading(
        cal,
        Reading::GraphPool,
        Observed {
            checked: true,
            reliability: pool_rel,
            evidence: ev,
            note: String::new(),
        },
    );
    if pool_verdict.status == Status::Downgraded {
        cal.facts.graph_pool_attributes = Support::no(pool_verdict.calibrated.clone());
    }
    out.push(pool_verdict);

    if !cal.reading(Reading::DriverFree).measures_own_usage() {
        out.push(fact(
            "graph_release",
            "-".into(),
            "-".into(),
            Status::NotChecked,
            vec![],
            "driver free cannot measure it",
        ));
        return Ok(out);
    }
    // When does a destroyed graph's memory come back?
    let cost = run.f0.zip(run.f1).map(|(a, b)| a - b);
    let now = run.f_destroyed.zip(run.f1).map(|(a, b)| a - b);
    let synced = run.f_synced.zip(run.f1).map(|(a, b)| a - b);
    let deferred = matches!((now, synced), (Some(n), Some(s)) if s - n > (MIB / 2) as i64);
    let declared_rel = cal.facts.graph_release;
    let ev = vec![
        Evidence {
            check: "memory back right after destroy (no synchronize)".into(),
            expected: synced,
            observed: now,
            ok: !deferred,
        },
        Evidence::bytes(
            "memory back after destroy, release pool, synchronize",
            cost.unwrap_or(0),
            run.f_released.zip(run.f1).map(|(a, b)| a - b),
            tolerance(ALLOC),
        ),
    ];
    let status = if deferred && declared_rel == GraphRelease::Immediate {
        cal.facts.graph_release = GraphRelease::AtNextSync;
        Status::Downgraded
    } else {
        Status::Confirmed
    };
    let name = |r: GraphRelease| {
        if r == GraphRelease::Immediate {
            "immediate"
        } else {
            "at next synchronize"
        }
        .to_string()
    };
    out.push(fact(
        "graph_release",
        name(declared_rel),
        name(cal.facts.graph_release),
        status,
        ev,
        "",
    ));

    // Per-capture memory beyond the allocation node and the executable object.
    let expected = (ALLOC + u64::from(NODES) * EXEC_BYTES_PER_KERNEL_NODE) as i64;
    let hidden = cost.map(|c| {
        c - run.pool_growth.unwrap_or(ALLOC as i64).max(ALLOC as i64) - (expected - ALLOC as i64)
    });
    let declared_hidden = cal.facts.hidden_bytes_per_capture.unwrap_or(0) as i64;
    let ev = vec![Evidence::bytes(
        "capture cost beyond the allocation node and 64 KiB per kernel node",
        declared_hidden,
        hidden,
        MIB,
    )];
    let status = match hidden {
        Some(h) if h > declared_hidden + MIB as i64 => {
            cal.facts.hidden_bytes_per_capture = Some(h as u64);
            Status::Downgraded
        }
        _ => Status::Confirmed,
    };
    let show = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_else(|| "none".into());
    out.push(fact(
        "hidden_per_capture",
        show(Some(declared_hidden as u64)),
        show(cal.facts.hidden_bytes_per_capture),
        status,
        ev,
        "",
    ));
    Ok(out)
}
