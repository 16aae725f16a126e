//! `memplan-conformance --device ID [--json FILE]`: run the conformance suite against one
//! device, print a pass/fail table, write the JSON report. Exit 1 when a check fails, 2 on a
//! usage or device error. `cargo xtask conformance` wraps it. The suite's second process is
//! this binary again (`MEMPLAN_CONFORMANCE_HOLD` set: it holds memory on the device and exits).

use std::process::ExitCode;

const USAGE: &str = "usage: memplan-conformance --device ID [--json FILE]\n       memplan-conformance --list\n       memplan-conformance --capability-matrix";

fn main() -> ExitCode {
    // Started again by the suite as its second process: hold memory, then exit.
    memplan_conformance::serve_if_asked();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut device = None;
    let mut json = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--device" => device = it.next().cloned(),
            "--json" => json = it.next().cloned(),
            "--capability-matrix" => {
                print!(
                    "{}",
                    memplan_conformance::matrix::markdown(&memplan_conformance::matrix::rows())
                );
                return ExitCode::SUCCESS;
            }
            "--list" => {
                for r in memplan::survey() {
                    for d in r.devices {
                        println!("{}", d.id);
                    }
                }
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("memplan-conformance: unknown argument `{other}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(device) = device else {
        eprintln!("memplan-conformance: --device is required\n{USAGE}");
        return ExitCode::from(2);
    };
    let options = match memplan_conformance::SecondProcess::this_binary() {
        Ok(how) => memplan_conformance::Options::with_second_process(how),
        Err(e) => {
            eprintln!("memplan-conformance: this binary's own path is unknown ({e}): the locality checks are skipped");
            memplan_conformance::Options::default()
        }
    };
    let report =
        match memplan::open(&device).and_then(|d| memplan_conformance::run_with(&d, &options)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("memplan-conformance: {device}: {e}");
                return ExitCode::from(2);
            }
        };
    print!("{report}");
    if let Some(path) = json {
        let text = match serde_json::to_string_pretty(&report) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("memplan-conformance: encoding the report failed: {e}");
                return ExitCode::from(2);
            }
        };
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("memplan-conformance: {path}: {e}");
            return ExitCode::from(2);
        }
        println!("report written to {path}");
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
