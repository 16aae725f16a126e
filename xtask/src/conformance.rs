//! `cargo xtask conformance --device ID` and `cargo xtask capability-matrix [--check]`.
//!
//! Both run the `memplan-conformance` binary with the backend features the device id needs.

use crate::run::{capture, step};

const MATRIX_PATH: &str = "docs/capability-matrix.md";
const STRATEGY_PATH: &str = "docs/strategy-comparison.md";

fn features_for(device: &str) -> Result<&'static str, String> {
    let backend = device.split(':').next().unwrap_or("");
    Ok(match backend {
        "sim" => "sim",
        "cuda" => "cuda",
        "rocm" | "hip" => "rocm",
        "xpu" | "level-zero" => "xpu",
        other => {
            return Err(format!(
                "unknown backend `{other}` in device id `{device}` (sim, cuda, rocm, xpu)"
            ))
        }
    })
}

/// Run the suite against one device (`--device ID`, optional `--json FILE`, default
/// `target/conformance-<id>.json`); `--all-sim` runs every simulated profile.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut device = None;
    let mut json = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--device" => device = it.next().cloned(),
            "--json" => json = it.next().cloned(),
            other => {
                return Err(format!(
                    "conformance: unknown argument `{other}` (--device ID [--json FILE])"
                ))
            }
        }
    }
    let device = device.ok_or("conformance: --device ID is required (e.g. sim:rtx4090, cuda:0)")?;
    let features = features_for(&device)?;
    let json = json.unwrap_or_else(|| {
        format!(
            "target/conformance-{}.json",
            device.replace([':', ','], "_")
        )
    });
    step(
        &format!("conformance {device}"),
        &[
            "cargo",
            "run",
            "-q",
            "-p",
            "memplan-conformance",
            "--features",
            features,
            "--",
            "--device",
            &device,
            "--json",
            &json,
        ],
    )
}

/// Write a generated document, or with `--check` fail when the committed one differs.
fn generated(args: &[String], path: &str, task: &str, argv: &[&str]) -> Result<(), String> {
    let t = std::time::Instant::now();
    let fresh = capture(argv)?;
    println!(
        "==> [{task}] `{}` took {:.1}s",
        argv.join(" "),
        t.elapsed().as_secs_f64()
    );
    if args.iter().any(|a| a == "--check") {
        let committed = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        if committed != fresh {
            return Err(format!(
                "{path} is out of date with the code: run `cargo xtask {task}` and commit it"
            ));
        }
        println!("==> [{task}] {path} is current");
        return Ok(());
    }
    std::fs::write(path, fresh).map_err(|e| format!("{path}: {e}"))?;
    println!("wrote {path}");
    Ok(())
}

/// The capability matrix of every backend (`docs/capability-matrix.md`).
pub fn capability_matrix(args: &[String]) -> Result<(), String> {
    generated(
        args,
        MATRIX_PATH,
        "capability-matrix",
        &[
            "cargo",
            "run",
            "-q",
            "-p",
            "memplan-conformance",
            "--all-features",
            "--",
            "--capability-matrix",
        ],
    )
}

/// The seeded sweep (`docs/strategy-comparison.md`): every strategy on every shipped
/// scenario, the automatic choice on every profile and on generated scenarios, over many seeds
/// of the simulator's physics. Release build (the sweep is ~25,000 start-ups); the sweep exits
/// non-zero when an acceptance check fails, which fails this step.
pub fn strategy_table(args: &[String]) -> Result<(), String> {
    generated(
        args,
        STRATEGY_PATH,
        "strategy-table",
        &[
            "cargo",
            "run",
            "-q",
            "--release",
            "-p",
            "memplan-testbed",
            "--example",
            "sweep",
        ],
    )
}
