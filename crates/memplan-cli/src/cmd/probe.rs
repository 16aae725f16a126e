//! `memplan probe DEVICE`: one snapshot of every memory layer (synchronize, then read driver,
//! allocator and graph pool together) and the declared capability.
//!
//! The allocator layer comes from memplan's own accounting ([`OwnAccounting`]): `probe` runs
//! no engine, so it reads what memplan itself holds (nothing), never a guess. Absent readings
//! stay absent (`absent` in the table, `null` in JSON).
//!
//! Layout for extension (e.g. a `--calibrate` flag): [`ProbeReport`] gathers everything, then
//! [`table`] or JSON prints it; a new section is a new optional field and a new block.

use std::fmt::Write;

use memplan::bytes::fmt_signed;
use memplan::protocol::snapshot;
use memplan::{Device, MemoryInfo, OwnAccounting, ProfilingCapability};
use serde::Serialize;

use super::devices::DescriptorView;
use crate::contract::{schema, Failure};
use crate::Report;

/// Flags of `memplan probe`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Device id (`BACKEND:SELECTOR`; `memplan devices` lists them).
    #[arg(value_name = "DEVICE", help = device_help())]
    pub device: String,
    /// Print one JSON object `{device, descriptor, memory, derived, capability}`.
    #[arg(long)]
    pub json: bool,
    /// Also calibrate: allocate known sizes, capture a graph, map virtual memory, and confirm
    /// or downgrade each declared reading with the evidence (`calibration` in JSON).
    #[arg(long)]
    pub calibrate: bool,
}

/// The help of a device id, from the one list of backends: an example id of each.
pub fn device_help() -> String {
    let ids: Vec<String> = memplan::BackendKind::ALL
        .iter()
        .map(|k| format!("`{}`", k.info().example_id()))
        .collect();
    format!(
        "Device id: {}, `sim:arc-a770,declare-exact` (`memplan devices` lists them)",
        ids.join(", ")
    )
}

/// Values derived from the snapshot (absent when an input is absent).
#[derive(Debug, Serialize)]
pub struct Derived {
    /// `total - free`.
    pub driver_used: Option<u64>,
    /// `driver_used - allocator reserved` (signed: a process-local reading can make it negative).
    pub non_allocator: Option<i64>,
}

/// Everything `probe` reports.
#[derive(Debug, Serialize)]
pub struct ProbeReport {
    /// The id as given.
    pub device: String,
    /// The device's descriptor.
    pub descriptor: DescriptorView,
    /// The snapshot.
    pub memory: MemoryInfo,
    /// Derived values.
    pub derived: Derived,
    /// The capability as declared by the backend.
    pub capability: ProfilingCapability,
    /// The calibration, with `--calibrate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<memplan_planner::CalibrationReport>,
}

/// Open the device and gather the report.
pub fn gather(id: &str) -> Result<(Device, ProbeReport), memplan::Error> {
    let dev = memplan::open(id)?;
    let own = OwnAccounting::default();
    let memory = snapshot(&dev, Some(&own))?;
    let report = ProbeReport {
        device: id.to_string(),
        descriptor: DescriptorView::from(dev.descriptor()),
        derived: Derived {
            driver_used: memory.driver_used(),
            non_allocator: memory.non_allocator(),
        },
        memory,
        capability: dev.capabilities().clone(),
        calibration: None,
    };
    Ok((dev, report))
}

/// The report as a table.
#[allow(unused_must_use)] // writing to a String cannot fail
pub fn table(r: &ProbeReport) -> String {
    let mut o = String::new();
    writeln!(o, "device {} ({})", r.descriptor.id, r.descriptor.name);
    for (k, v) in &r.descriptor.properties {
        if !v.is_empty() {
            writeln!(o, "  {k:<24} {v}");
        }
    }
    writeln!(o);
    writeln!(
        o,
        "memory (one snapshot after a synchronize; allocator = memplan's own accounting)"
    );
    write!(o, "{}", r.memory);
    if let Some(n) = r.derived.non_allocator {
        if n < 0 {
            writeln!(
                o,
                "  note: non-allocator is negative ({}): the free reading misses memory",
                fmt_signed(n)
            );
        }
    }
    writeln!(o);
    writeln!(o, "capability (declared by the backend, not calibrated)");
    write!(o, "{}", r.capability);
    if let Some(c) = &r.calibration {
        writeln!(o);
        write!(o, "{c}");
    }
    o
}

/// Run `memplan probe`.
pub fn run(args: Args) -> Result<Report, Failure> {
    let (dev, mut report) = gather(&args.device)?;
    if args.calibrate {
        report.calibration = Some(memplan_planner::calibrate(&dev)?);
    }
    let json = serde_json::to_value(&report).map_err(|e| Failure::of("internal", e.to_string()))?;
    Ok(Report::new(schema::PROBE, json, table(&report)))
}
