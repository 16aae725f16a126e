//! The graph and virtual-memory checks of calibration.

use memplan_core::bytes::{fmt_bytes, signed, MIB};
use memplan_core::{
    CaptureWork, Device, Error, GraphId, GraphPoolMemory, GraphRelease, ProfilingCapability,
    Reading, Reliability, Result, Support,
};

use super::checks::{diff, tolerance, verdict_reading, Observed};
use super::report::{Evidence, Status, Verdict};
use crate::strategy::{wait_for_release, Trim, SETTLE_SYNCHRONIZES};
/// Kernel nodes and allocation-node bytes of the calibration graph.
const NODES: u32 = 64;
const ALLOC: u64 = 32 * MIB;

/// The test capture's allocation node: [`ALLOC`], no larger than `most` (the most one
/// allocation of calibration may hold, whole MiB, at least one): a start for a request under
/// 64 MiB holds no more than half of it at once in its capture either.
fn node_size(most: u64) -> u64 {
    (ALLOC.min(most) / MIB).max(1) * MIB
}

/// The verdict's item for per-capture memory a runtime keeps
/// ([`facts.hidden_bytes_per_capture`](memplan_core::ProfilingCapability)).
pub(crate) const HIDDEN_PER_CAPTURE: &str = "hidden_per_capture";

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

pub(super) fn free(device: &Device, sync: bool) -> Result<Option<i64>> {
    if sync {
        device.synchronize()?;
    }
    Ok(device.driver_memory()?.free.map(signed))
}

fn pool_growth(p0: &GraphPoolMemory, p1: &GraphPoolMemory) -> Option<i64> {
    let grow = |a: Option<u64>, b: Option<u64>| diff(b.map(signed), a.map(signed));
    [
        grow(p0.reserved_high, p1.reserved_high),
        grow(p0.used_high, p1.used_high),
        grow(p0.reserved, p1.reserved),
    ]
    .into_iter()
    .flatten()
    .max()
}

/// Capture, replay and destroy one graph (with a known allocation node when it could record
/// one).
struct GraphRun {
    /// Why no allocation node was recorded, when none was.
    no_node: Option<String>,
    f0: Option<i64>,
    f1: Option<i64>,
    f_destroyed: Option<i64>,
    f_synced: Option<i64>,
    f_released: Option<i64>,
    pool_growth: Option<i64>,
}

/// The calibration graph as recorded, and the readings right before its capture.
struct Recorded {
    graph: GraphId,
    no_node: Option<String>,
    f0: Option<i64>,
    p0: GraphPoolMemory,
}

/// Record the calibration graph with an allocation node, falling back to none when the device
/// cannot record one (a runtime without stream-ordered allocation); the baseline is read right
/// before the capture that is kept.
fn record_graph(device: &Device, alloc: u64) -> Result<Recorded> {
    let recorded = |device: &Device, alloc_node: u64, no_node: Option<String>| {
        let f0 = free(device, true)?;
        let p0 = device.graph_pool_memory()?;
        let work = CaptureWork::new(NODES).with_alloc_node(alloc_node);
        let graph = device.graph_capture()?.capture_once(&work)?;
        Ok(Recorded {
            graph,
            no_node,
            f0,
            p0,
        })
    };
    let no_node = match recorded(device, alloc, None) {
        Err(e @ Error::Unsupported { .. }) => {
            format!("the device cannot record a graph allocation node: {e}")
        }
        done => return done,
    };
    recorded(device, 0, Some(no_node))
}

fn run_graph(device: &Device, alloc: u64) -> Result<GraphRun> {
    let Recorded {
        graph: g,
        no_node,
        f0,
        p0,
    } = record_graph(device, alloc)?;
    let measured = (|| -> Result<(Option<i64>, GraphPoolMemory)> {
        device.graph_capture()?.replay(g)?;
        let f1 = free(device, true)?;
        Ok((f1, device.graph_pool_memory()?))
    })();
    // Teardown on every path, a failed reading included: destroy, synchronize (a device whose
    // destroyed graphs release memory only at the next synchronize gives it back there), wait
    // for releases a runtime defers past more synchronizes (`SETTLE_SYNCHRONIZES`, as the graph
    // phase does, [`wait_for_release`]), then trim the pool (after the releases: a trim before them leaves the allocation
    // node's memory reserved, [`trim_pool`]): what is still held then never comes back, and
    // memory that came back later would otherwise be counted as this process's and then seen
    // as another process releasing it.
    let destroyed = device.graph_capture().and_then(|gc| gc.destroy(g));
    let f_destroyed = free(device, false);
    let f_synced = free(device, true);
    let settled = wait_for_release(device, SETTLE_SYNCHRONIZES, Trim::AtEnd, |_| Ok(false));
    let f_released = match (free(device, true), f0) {
        (Ok(Some(f)), Some(f0)) => late_release(device, f, f0, alloc),
        (other, _) => other,
    };
    let (f1, p1) = measured?;
    destroyed?;
    settled?;
    Ok(GraphRun {
        no_node,
        f0,
        f1,
        f_destroyed: f_destroyed?,
        f_synced: f_synced?,
        f_released: f_released?,
        pool_growth: pool_growth(&p0, &p1),
    })
}

/// The free reading once a destroyed graph's memory is back: where the reading `f` after the
/// settle is still below where it stood before the capture (`f0`, beyond a calibration
/// window's rounding), synchronize up to
/// [`LATE_RELEASE_SYNCHRONIZES`](crate::strategy::LATE_RELEASE_SYNCHRONIZES) more times until it
/// is back (a runtime may give it back after more synchronizes than the settle waits for, as
/// the graph phase allows for). What is still out then is per-capture memory the runtime
/// keeps; counting a late release as such would make every capture seem to keep it.
fn late_release(device: &Device, f: i64, f0: i64, alloc: u64) -> Result<Option<i64>> {
    let back = |f: i64| f >= f0.saturating_sub(tolerance(alloc) as i64);
    let mut last = Some(f);
    wait_for_release(
        device,
        crate::strategy::LATE_RELEASE_SYNCHRONIZES,
        Trim::EachSynchronize,
        |n| {
            if n > 0 {
                last = free(device, false)?;
            }
            Ok(last.is_none_or(back))
        },
    )?;
    Ok(last)
}

/// The graph checks left out, for an engine that captures no graphs: calibration's test
/// capture is the one check that may leave memory held for good (the per-capture memory a
/// runtime keeps, see docs/measurement-protocol.md, Calibration, for the public reports), and
/// an eager engine alone never takes it. Held through the engine's profile run, it is memory
/// the engine has less than it would have alone: with another process arriving before that
/// run, an eager engine that fits alone ran out of memory in it, within a window as wide as
/// what the test capture kept. Nothing of what the capture would check (capture, the graph-pool reading,
/// release timing, per-capture memory) is used where no graph is captured (the strategy is
/// `none`), so the declared capability is left as it is and said unchecked.
pub(super) fn skipped(cal: &mut ProfilingCapability) -> Vec<Verdict> {
    const WHY: &str = "not checked: the engine captures no graphs, and a test capture may leave memory held for good that the engine alone never takes";
    let declared_capture = cal.facts.graph_capture.to_string();
    let capture = fact(
        "graph_capture",
        declared_capture.clone(),
        declared_capture,
        Status::NotChecked,
        vec![],
        WHY,
    );
    let pool = unchecked_pool(cal, WHY.into());
    vec![capture, pool]
}

/// The graph-pool reading's verdict where no allocation node went into the pool: its
/// attributes are left as declared and said unchecked, for the reason in `note`.
fn unchecked_pool(cal: &mut ProfilingCapability, note: String) -> Verdict {
    verdict_reading(
        cal,
        Reading::GraphPool,
        Observed {
            checked: false,
            reliability: None,
            evidence: vec![],
            note,
            window_error: None,
            kept_per_free: None,
            step: 0,
        },
    )
}

/// What the graph checks found beside their verdicts.
#[derive(Debug, Default)]
pub(super) struct GraphFindings {
    /// What the test capture held at once, as the free reading measured it after its replay
    /// (its node, the runtime's executable object, anything a first capture allocates), where
    /// it read one.
    pub held: Option<u64>,
    /// The device refused the test capture's allocation node (captured without one).
    pub alloc_nodes_refused: bool,
}

/// Graph capture, graph-pool attributes, graph release timing and per-capture memory; the
/// test capture's allocation node no larger than `most` ([`node_size`]), and what the checks
/// found beside their verdicts ([`GraphFindings`]).
pub(super) fn graphs(
    device: &Device,
    cal: &mut ProfilingCapability,
    most: u64,
) -> Result<(Vec<Verdict>, GraphFindings)> {
    let alloc = node_size(most);
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
                window_error: None,
                kept_per_free: None,
                step: 0,
            },
        );
        return Ok((
            vec![
                fact(
                    "graph_capture",
                    declared_capture.to_string(),
                    declared_capture.to_string(),
                    Status::NotChecked,
                    vec![],
                    "declared unsupported",
                ),
                pool,
            ],
            GraphFindings::default(),
        ));
    }
    // The test capture asks for an allocation node wherever capture is supported, also where
    // graph-pool attributes are declared unsupported and nothing checks the node's growth:
    // whether the device records one at all is what the graph phase needs to know (an engine
    // whose graphs allocate in such nodes cannot capture them where it does not, and finds out
    // only after warming up its first, largest size).
    let pool_unchecked = (!cal.facts.graph_pool_attributes.is_supported()
        && !cal.reading(Reading::GraphPool).measures_own_usage())
    .then(|| {
        format!(
            "graph-pool attributes are declared unsupported ({}): nothing to check with the allocation node",
            cal.facts.graph_pool_attributes
        )
    });
    let run = match run_graph(device, alloc) {
        Ok(r) => r,
        // A full device says nothing about graph capture: out of memory, not a missing
        // capability.
        Err(e) if e.is_out_of_memory() => {
            return Err(e.during("calibration (graph capture; the device is out of memory)"))
        }
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
            return Ok((vec![v], GraphFindings::default()));
        }
    };
    let captured = match &run.no_node {
        None => format!(
            "captured, replayed and destroyed one graph with a {} allocation node",
            fmt_bytes(alloc)
        ),
        Some(why) => {
            format!("captured, replayed and destroyed one graph without an allocation node ({why})")
        }
    };
    let mut out = vec![fact(
        "graph_capture",
        "yes".into(),
        "yes".into(),
        Status::Confirmed,
        vec![],
        &captured,
    )];

    if let Some(why) = run.no_node.as_ref().or(pool_unchecked.as_ref()) {
        // Nothing went into the graph pool, or nothing reads it: its attributes could not be
        // checked.
        out.push(unchecked_pool(cal, format!("not checked: {why}")));
    } else {
        out.push(pool_verdict(cal, run.pool_growth, alloc));
    }

    release_and_hidden(cal, &run, alloc, &mut out);
    let findings = GraphFindings {
        held: diff(run.f0, run.f1).and_then(|c| u64::try_from(c).ok()),
        alloc_nodes_refused: run.no_node.is_some(),
    };
    Ok((out, findings))
}

/// Graph-pool attributes must move with an allocation node.
fn pool_verdict(cal: &mut ProfilingCapability, pool_growth: Option<i64>, alloc: u64) -> Verdict {
    let ev = vec![Evidence::bytes(
        format!(
            "graph pool growth for a {} allocation node",
            fmt_bytes(alloc)
        ),
        alloc as i64,
        pool_growth,
        alloc / 2,
    )];
    let pool_rel = match pool_growth {
        None => Some(Reliability::Unavailable {
            reason: "the device returned no graph-pool attribute".into(),
        }),
        Some(g) if g < (alloc / 2) as i64 => Some(Reliability::Unavailable {
            reason: format!(
                "graph-pool attributes moved by {} for a {} allocation node (a stub?)",
                fmt_bytes(g.max(0) as u64),
                fmt_bytes(alloc)
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
            window_error: None,
            kept_per_free: None,
            step: 0,
        },
    );
    if pool_verdict.status == Status::Downgraded {
        cal.facts.graph_pool_attributes = Support::no(pool_verdict.calibrated.clone());
    }
    pool_verdict
}

/// When a destroyed graph's memory returns, and the per-capture memory nobody declared.
fn release_and_hidden(
    cal: &mut ProfilingCapability,
    run: &GraphRun,
    alloc: u64,
    out: &mut Vec<Verdict>,
) {
    if !cal.reading(Reading::DriverFree).measures_own_usage() {
        out.push(fact(
            "graph_release",
            "-".into(),
            "-".into(),
            Status::NotChecked,
            vec![],
            "driver free cannot measure it",
        ));
        return;
    }
    // When does a destroyed graph's memory come back?
    let cost = diff(run.f0, run.f1);
    let now = diff(run.f_destroyed, run.f1);
    let synced = diff(run.f_synced, run.f1);
    let deferred = matches!(diff(synced, now), Some(d) if d > (MIB / 2) as i64);
    let declared_rel = cal.facts.graph_release;
    let ev = vec![
        Evidence {
            check: "memory back right after destroy (no synchronize)".into(),
            expected: synced,
            observed: now,
            ok: !deferred,
        },
        back_after_release(cost, diff(run.f_released, run.f1), alloc),
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

    // Per-capture memory the runtime keeps: what the capture cost and never came back after
    // destroy, synchronize and pool release. Measured, so no figure for the executable object
    // (which varies with driver and graph shape) is assumed.
    let back = diff(run.f_released, run.f1);
    let hidden = cost.zip(back).map(|(c, b)| c.saturating_sub(b));
    let declared_hidden = signed(cal.facts.hidden_bytes_per_capture.unwrap_or(0));
    let ev = vec![Evidence::bytes(
        "capture cost that never came back (destroy, synchronize, release pool)",
        declared_hidden,
        hidden,
        MIB,
    )];
    let status = match hidden {
        Some(h) if h > declared_hidden.saturating_add(MIB as i64) => {
            cal.facts.hidden_bytes_per_capture = Some(h as u64);
            Status::Downgraded
        }
        _ => Status::Confirmed,
    };
    let show = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_else(|| "none".into());
    out.push(fact(
        HIDDEN_PER_CAPTURE,
        show(Some(declared_hidden as u64)),
        show(cal.facts.hidden_bytes_per_capture),
        status,
        ev,
        "",
    ));
}

/// The memory a capture cost must all be back after destroy, pool release and a synchronize.
/// Without a cost (free absent before or after the capture) there is nothing to expect, and
/// the evidence says so instead of expecting 0.
fn back_after_release(cost: Option<i64>, back: Option<i64>, alloc: u64) -> Evidence {
    let check = "memory back after destroy, synchronize, release pool";
    match cost {
        Some(c) => Evidence::bytes(check, c, back, tolerance(alloc)),
        None => Evidence {
            check: format!("{check} (capture cost unreadable)"),
            expected: None,
            observed: back,
            ok: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_captures_node_is_no_larger_than_the_start_holds() {
        assert_eq!(node_size(u64::MAX), ALLOC);
        assert_eq!(node_size(crate::calibrate::LARGEST_SIZE), ALLOC);
        assert_eq!(node_size(12 * MIB + 300 * 1024), 12 * MIB);
        assert_eq!(node_size(0), MIB);
    }
}
