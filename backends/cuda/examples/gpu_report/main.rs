//! `gpu_report`: the measuring pieces of the GPU check (`scripts/gpu-check.sh`), prebuilt by
//! `cargo xtask gpu-check` so that a GPU machine needs no Rust toolchain.
//!
//! - `gpu_report graphs [--device N]`: capture real graphs of several sizes on `cuda:N` and
//!   compare memplan's graph-memory measurement (graph-pool window) with the drop in driver
//!   free memory, per graph and for several graphs alive together (shared pool). JSON on stdout.
//! - `gpu_report hold [--device N]`: open the device, print `{"free":…,"total":…}`, wait for a
//!   line on stdin, print a second reading, exit. Lets another process (PyTorch) read
//!   `mem_get_info` while memplan holds its context, so both see the same device state.
//! - `gpu_report assemble --out FILE NAME=PATH...`: join the pieces into one JSON report. Each
//!   piece is embedded as JSON when it parses, else as text, with its exit code from
//!   `PATH.rc` when present (a piece without one did not run). Exit 0 when the report is
//!   written and no check failed, 3 when it is written and a check failed, 1 otherwise.

mod assemble;
mod graphs;

use std::io::BufRead;

use memplan_backend_cuda::CudaBackend;
use memplan_core::{protocol::snapshot, Device};
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("graphs") => open(&args).and_then(|d| graphs::run(&d)),
        Some("hold") => open(&args).and_then(|d| hold(&d)),
        Some("assemble") => match assemble::run(&args[1..]) {
            Ok(true) => Ok(()),
            // The report is written; a check in it failed.
            Ok(false) => std::process::exit(3),
            Err(e) => Err(e),
        },
        _ => Err(
            "usage: gpu_report graphs|hold [--device N] | assemble --out FILE NAME=PATH...".into(),
        ),
    };
    if let Err(e) = result {
        eprintln!("gpu_report: {e}");
        std::process::exit(1);
    }
}

fn open(args: &[String]) -> Result<Device, String> {
    let dev = match args.iter().position(|a| a == "--device") {
        Some(i) => args.get(i + 1).cloned().ok_or("--device needs a value")?,
        None => "0".to_string(),
    };
    CudaBackend
        .open_cuda(&dev)
        .map(Device::new)
        .map_err(|e| e.to_string())
}

fn reading(d: &Device) -> Result<serde_json::Value, String> {
    let m = snapshot(d, None).map_err(|e| e.to_string())?;
    Ok(json!({ "free": m.driver.free, "total": m.driver.total }))
}

fn hold(d: &Device) -> Result<(), String> {
    println!("{}", reading(d)?);
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    println!("{}", reading(d)?);
    Ok(())
}
