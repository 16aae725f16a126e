//! The individual checks. Each returns [`Check`]s with the evidence; none panics on a device
//! that misbehaves.

use memplan::bytes::{fmt_bytes, MIB};
use memplan::protocol::snapshot;
use memplan::{
    AllocatorView, CaptureWork, Device, Error, OwnAccounting, Reading, Reliability, Result,
};
use memplan_planner::CalibrationReport;

use crate::report::Check;

/// Readings: consistency, absent-not-zero, declared-available-is-present.
pub fn readings(device: &Device) -> Result<Vec<Check>> {
    let cap = device.capabilities().clone();
    let snap = snapshot(device, None)?;
    let mut out = Vec::new();
    let (total, free) = (snap.driver.total, snap.driver.free);
    out.push(match (total, free) {
        (Some(t), Some(f)) => Check::new(
            "readings.free_le_total",
            f <= t,
            format!("free {} <= total {}", fmt_bytes(f), fmt_bytes(t)),
        ),
        _ => Check::skip("readings.free_le_total", "free or total is absent"),
    });
    for (reading, value) in [
        (Reading::DriverTotal, total),
        (Reading::DriverFree, free),
        (Reading::GraphPool, snap.graph_pool.used),
    ] {
        let declared = cap.reading(reading);
        let name = format!("readings.{}_present_as_declared", reading.name());
        out.push(match (&declared, value) {
            (Reliability::Unavailable { .. }, None) => Check::new(&name, true, "declared unavailable, absent"),
            (Reliability::Unavailable { .. }, Some(v)) => Check::new(
                &name,
                false,
                format!("declared unavailable but returned {v} bytes: an unreadable value must be absent, not a number"),
            ),
            (_, Some(v)) => Check::new(&name, true, format!("declared {}, read {}", declared.label(), fmt_bytes(v))),
            (_, None) => Check::new(&name, false, format!("declared {} but absent", declared.label())),
        });
    }
    if !cap.facts.graph_pool_attributes.is_supported() {
        let g = snap.graph_pool;
        let any = [g.used, g.reserved, g.used_high, g.reserved_high]
            .iter()
            .any(Option::is_some);
        out.push(Check::new(
            "readings.graph_pool_absent_without_query",
            !any,
            if any {
                "graph-pool attributes declared unsupported but values returned"
            } else {
                "absent, as declared"
            },
        ));
    }
    Ok(out)
}

/// Calibration: no declaration may be downgraded.
pub fn calibration(report: &CalibrationReport) -> Check {
    let downgrades = report.downgrades();
    if downgrades.is_empty() {
        return Check::new(
            "calibration.declared_holds",
            true,
            format!(
                "{} declarations confirmed or not checkable",
                report.verdicts.len()
            ),
        );
    }
    let evidence: Vec<String> = downgrades
        .iter()
        .map(|v| {
            let bad: Vec<String> = v
                .evidence
                .iter()
                .filter(|e| !e.ok)
                .map(|e| {
                    format!(
                        "{}: expected {}, observed {}",
                        e.check,
                        signed(e.expected),
                        signed(e.observed)
                    )
                })
                .collect();
            format!(
                "{} declared {} but behaves {} [{}]",
                v.item,
                v.declared,
                v.calibrated,
                bad.join("; ")
            )
        })
        .collect();
    Check::new("calibration.declared_holds", false, evidence.join(" | "))
}

/// Raw allocations of several sizes, accounted by memplan's own accounting.
pub fn raw_allocations(device: &Device) -> Check {
    let name = "allocator.raw_allocations_accounted";
    let mut acct = OwnAccounting::default();
    let mut held = Vec::new();
    let mut result = Ok(());
    for bytes in [MIB, 16 * MIB, 64 * MIB] {
        match device.allocate(bytes) {
            Ok(a) => {
                acct.add(a.bytes());
                held.push(a);
            }
            Err(e) => {
                result = Err(format!("allocate({}) failed: {e}", fmt_bytes(bytes)));
                break;
            }
        }
        let s = acct.stats();
        if s.allocated > s.reserved {
            result = Err(format!(
                "allocated {} > reserved {}",
                s.allocated, s.reserved
            ));
            break;
        }
    }
    let peak = acct.stats().peak_allocated;
    for a in held {
        let bytes = a.bytes();
        if let Err(e) = device.free(a) {
            result = result.and(Err(format!("free failed: {e}")));
        }
        acct.remove(bytes);
    }
    match result {
        Ok(()) if acct.stats().allocated == 0 => Check::new(
            name,
            true,
            format!("peak {} accounted, all freed", fmt_bytes(peak)),
        ),
        Ok(()) => Check::new(name, false, "allocations left after freeing"),
        Err(e) => Check::new(name, false, e),
    }
}

/// Graph capture lifecycle, or the typed error when not declared.
pub fn graph_capture(device: &Device) -> Check {
    let name = "graph_capture.lifecycle";
    let declared = device.capabilities().facts.graph_capture.clone();
    if !declared.is_supported() {
        return expect_unsupported(name, device.graph_capture().map(|_| ()));
    }
    let before = match device
        .synchronize()
        .and_then(|_| device.graph_pool_memory())
    {
        Ok(g) => g,
        Err(e) => return Check::new(name, false, format!("reading the graph pool failed: {e}")),
    };
    let mut work = CaptureWork::new(8).with_alloc_node(16 * MIB);
    // A runtime without stream-ordered allocation refuses the allocation node, not the
    // capture: capture without one then (the check says so).
    let mut no_node = None;
    let r: Result<()> = (|| {
        let gc = device.graph_capture()?;
        let g = match gc.capture_once(&work) {
            Err(e @ Error::Unsupported { .. }) if work.alloc_node_bytes > 0 => {
                no_node = Some(e.to_string());
                work.alloc_node_bytes = 0;
                gc.capture_once(&work)?
            }
            other => other?,
        };
        let replayed = gc.replay(g);
        gc.destroy(g)?;
        replayed?;
        Ok(())
    })();
    // Destroyed graphs may give their memory back only at the next synchronize (declared as
    // `graph_release: at_next_sync`), so the pool is trimmed after one.
    let r = r
        .and_then(|_| device.synchronize())
        .and_then(|_| device.graph_capture()?.release_pool());
    if let Err(e) = r {
        return Check::new(
            name,
            false,
            format!("capture/replay/destroy/release failed: {e}"),
        );
    }
    let after = match device
        .synchronize()
        .and_then(|_| device.graph_pool_memory())
    {
        Ok(g) => g,
        Err(e) => return Check::new(name, false, format!("reading the graph pool failed: {e}")),
    };
    if after.used == before.used && after.reserved == before.reserved {
        let node = match no_node {
            None => format!("{} alloc node", fmt_bytes(work.alloc_node_bytes)),
            Some(why) => format!("no alloc node ({why})"),
        };
        Check::new(
            name,
            true,
            format!(
                "captured {} kernels + {node}, replayed, destroyed, pool released",
                work.kernel_nodes,
            ),
        )
    } else {
        Check::new(
            name,
            false,
            format!(
                "graph pool not restored: used {:?} -> {:?}, reserved {:?} -> {:?}",
                before.used, after.used, before.reserved, after.reserved
            ),
        )
    }
}

/// Virtual memory lifecycle, or the typed error when not declared.
pub fn virtual_memory(device: &Device) -> Check {
    let name = "virtual_memory.lifecycle";
    if !device.capabilities().facts.virtual_memory.is_supported() {
        return expect_unsupported(name, device.virtual_memory().map(|_| ()));
    }
    let free_before = device
        .synchronize()
        .and_then(|_| device.driver_memory())
        .ok()
        .and_then(|d| d.free);
    let r: Result<u64> = (|| {
        let vm = device.virtual_memory()?;
        let g = vm.granularity()?;
        let span = g.checked_mul(4).ok_or_else(|| {
            Error::Measurement(format!(
                "granularity {g} bytes: 4 granules overflow 64 bits"
            ))
        })?;
        let range = vm.reserve(span)?;
        let mapped = vm.map(&range, g, g);
        let m = match mapped {
            Ok(m) => m,
            Err(e) => {
                let _ = vm.release(range);
                return Err(e);
            }
        };
        let unmapped = vm.unmap(m);
        vm.release(range)?;
        unmapped?;
        Ok(g)
    })();
    let g = match r {
        Ok(g) => g,
        Err(e) => {
            return Check::new(
                name,
                false,
                format!("reserve/map/unmap/release failed: {e}"),
            )
        }
    };
    let free_after = device
        .synchronize()
        .and_then(|_| device.driver_memory())
        .ok()
        .and_then(|d| d.free);
    match (free_before, free_after) {
        (Some(b), Some(a))
            if a != b
                && device
                    .capabilities()
                    .reading(Reading::DriverFree)
                    .is_exact() =>
        {
            Check::new(
                name,
                false,
                format!(
                    "free memory not restored after unmap: {} -> {}",
                    fmt_bytes(b),
                    fmt_bytes(a)
                ),
            )
        }
        _ => Check::new(
            name,
            true,
            format!(
                "reserved 4 x {}, mapped 1, unmapped, released",
                fmt_bytes(g)
            ),
        ),
    }
}

/// An impossible allocation must be a typed error that names the call.
pub fn errors_name_the_call(device: &Device) -> Check {
    let name = "errors.name_the_call";
    let total = device.descriptor().total_bytes.unwrap_or(1 << 40);
    let absurd = total.saturating_mul(64).max(1 << 50);
    match device.allocate(absurd) {
        Ok(a) => {
            let _ = device.free(a);
            Check::new(
                name,
                false,
                format!("allocating {} succeeded", fmt_bytes(absurd)),
            )
        }
        Err(Error::OutOfMemory { call, .. }) | Err(Error::DriverCall { call, .. })
            if !call.is_empty() =>
        {
            Check::new(
                name,
                true,
                format!("impossible allocation refused by `{call}`"),
            )
        }
        Err(e) => Check::new(
            name,
            false,
            format!("impossible allocation gave an error that names no call: {e}"),
        ),
    }
}

fn signed(v: Option<i64>) -> String {
    v.map(memplan::bytes::fmt_signed)
        .unwrap_or_else(|| "absent".into())
}

fn expect_unsupported(name: &str, r: Result<()>) -> Check {
    match r {
        Err(Error::Unsupported { operation, reason }) => Check::new(
            name,
            true,
            format!("not declared; {operation} unsupported: {reason}"),
        ),
        Err(e) => Check::new(
            name,
            false,
            format!("not declared, but the error is not the typed `Unsupported`: {e}"),
        ),
        Ok(()) => Check::new(name, false, "not declared, but the operation is offered"),
    }
}
