//! `memplan devices`: every compiled-in backend, its devices (id, name, total) or the reason
//! it cannot run here. Always exits 0 when the survey ran: an unavailable backend is a
//! finding, not an error.
//!
//! Also home of [`DescriptorView`], the JSON shape of a device descriptor that `probe` shares.

use std::collections::BTreeMap;
use std::fmt::Write;

use memplan::bytes::fmt_opt;
use memplan::{BackendStatus, DeviceDescriptor};
use serde::Serialize;

use crate::contract::{schema, Failure};
use crate::Report;

/// Flags of `memplan devices`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object `{"backends": [...]}` instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A device descriptor as the CLI prints it: the id as one string, properties as a map.
#[derive(Debug, Serialize)]
pub struct DescriptorView {
    /// `backend:selector`.
    pub id: String,
    /// Marketing name.
    pub name: String,
    /// Total memory as the driver reports it; `null` when it could not be read.
    pub total_bytes: Option<u64>,
    /// Backend-specific facts.
    pub properties: BTreeMap<String, String>,
}

impl From<&DeviceDescriptor> for DescriptorView {
    fn from(d: &DeviceDescriptor) -> Self {
        DescriptorView {
            id: d.id.to_string(),
            name: d.name.clone(),
            total_bytes: d.total_bytes,
            properties: d.properties.iter().cloned().collect(),
        }
    }
}

#[derive(Serialize)]
struct BackendView {
    backend: &'static str,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    devices: Vec<DescriptorView>,
}

#[derive(Serialize)]
struct DevicesView {
    backends: Vec<BackendView>,
}

fn survey() -> DevicesView {
    let backends = memplan::survey()
        .into_iter()
        .map(|r| {
            let (status, reason) = match r.status {
                BackendStatus::Available => ("available", None),
                BackendStatus::Unavailable { reason } => ("unavailable", Some(reason)),
            };
            BackendView {
                backend: r.backend.name(),
                status,
                reason,
                devices: r.devices.iter().map(DescriptorView::from).collect(),
            }
        })
        .collect();
    DevicesView { backends }
}

#[allow(unused_must_use)] // writing to a String cannot fail
fn table(v: &DevicesView) -> String {
    let mut o = String::new();
    if v.backends.is_empty() {
        let features: Vec<&str> = memplan::BackendKind::ALL
            .iter()
            .map(|k| k.feature())
            .collect();
        writeln!(
            o,
            "no backend is compiled in: rebuild with a feature of the `memplan` crate, one per backend ({}), e.g. `--features memplan/{}`",
            features.join(", "),
            features[0]
        );
    }
    for b in &v.backends {
        match &b.reason {
            Some(reason) => writeln!(o, "{}: unavailable: {reason}", b.backend),
            None => writeln!(o, "{}: available, {} device(s)", b.backend, b.devices.len()),
        };
        if b.devices.is_empty() {
            continue;
        }
        let w = b
            .devices
            .iter()
            .map(|d| d.id.len())
            .max()
            .unwrap_or(0)
            .max(2);
        let n = b
            .devices
            .iter()
            .map(|d| d.name.len())
            .max()
            .unwrap_or(0)
            .max(4);
        writeln!(o, "  {:<w$}  {:<n$}  {:>12}", "ID", "NAME", "TOTAL");
        for d in &b.devices {
            writeln!(
                o,
                "  {:<w$}  {:<n$}  {:>12}",
                d.id,
                d.name,
                fmt_opt(d.total_bytes)
            );
        }
    }
    o
}

/// Run `memplan devices`.
pub fn run(_args: Args) -> Result<Report, Failure> {
    let v = survey();
    let json = serde_json::to_value(&v).map_err(|e| Failure::of("internal", e.to_string()))?;
    Ok(Report::new(schema::DEVICES, json, table(&v)))
}
