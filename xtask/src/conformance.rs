//! `cargo xtask conformance --device ID` and `cargo xtask capability-matrix [--check]`.
//!
//! Both run the `memplan-conformance` binary: the conformance suite with exactly the backend
//! the device id names (its `memplan` feature, from the one list of backends), the capability
//! matrix with every backend's pure declaration (no vendor library or header).

use crate::backends;
use crate::run::{capture, step};

const MATRIX_PATH: &str = "docs/capability-matrix.md";
const STRATEGY_PATH: &str = "docs/strategy-comparison.md";

/// Run the suite against one device (`--device ID`, optional `--json FILE`, default
/// `<target dir>/conformance-<id>.json`, the target dir being `CARGO_TARGET_DIR` when set).
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
    device_suite(&device, json)
}

/// The suite on `device`, its JSON report at `json` (default under the target dir).
pub fn device_suite(device: &str, json: Option<String>) -> Result<(), String> {
    let backend = backends::for_device(device)?;
    let json = match json {
        Some(j) => std::path::PathBuf::from(j),
        None => {
            let name: String = device
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            backends::target_dir().join(format!("conformance-{name}.json"))
        }
    };
    if let Some(dir) = json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let feature = format!("memplan/{}", backend.feature);
    let json = json.to_string_lossy().into_owned();
    step(
        &format!("conformance {device}"),
        &[
            "cargo",
            "run",
            "-q",
            "-p",
            "memplan-conformance",
            "--no-default-features",
            "--features",
            &feature,
            "--",
            "--device",
            device,
            "--json",
            &json,
        ],
    )
}

/// The suite on every backend's CI device (a device CI opens without hardware, from the one
/// list of backends).
pub fn ci_devices() -> Result<(), String> {
    for b in backends::list()? {
        if !b.ci_device.is_empty() {
            device_suite(&b.ci_device, None)?;
        }
    }
    Ok(())
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
    let path = backends::root().join(path);
    let shown = path.display();
    if args.iter().any(|a| a == "--check") {
        let committed = std::fs::read_to_string(&path).map_err(|e| format!("{shown}: {e}"))?;
        if committed != fresh {
            return Err(format!(
                "{shown} is out of date with the code: run `cargo xtask {task}` and commit it"
            ));
        }
        println!("==> [{task}] {shown} is current");
        return Ok(());
    }
    std::fs::write(&path, fresh).map_err(|e| format!("{shown}: {e}"))?;
    println!("wrote {shown}");
    Ok(())
}

/// The capability matrix of every backend (`docs/capability-matrix.md`), from the backends'
/// pure declarations (the `memplan-conformance` feature `matrix`): no vendor library or header.
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
            "--no-default-features",
            "--features",
            "matrix",
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
