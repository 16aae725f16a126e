//! `cargo xtask`: memplan's CI entry point and maintenance tasks.
//!
//! - `ci`: rustfmt check, then for every feature combination of the matrix clippy with
//!   warnings denied and the tests; the downstream engine `examples/engine` on a simulated
//!   GPU; every crate's documentation with rustdoc's warnings denied; then the dependency rules (`cargo tree`), packaging
//!   (`cargo package --workspace --no-verify`), the
//!   no-hard-link rule for runtime-loaded vendor libraries, the conformance suite on every
//!   backend's CI device, and the checks that generated files are current.
//!   It builds without incremental caches and without debug info (`disk.rs`: a clean run
//!   otherwise needs about 13.7 GB of disk).
//! - `matrix`: print the feature matrix.
//! - `deps`: only the dependency rules.
//! - `gpu-check`: build the pieces `scripts/gpu-check.sh` runs on an NVIDIA machine.
//! - `python`: the Python package's wheel, built, installed in a fresh venv and tested (also a
//!   step of `ci`).
//! - `fuzz`: the fuzz targets for a fixed time (also a step of `ci`, the stable driver).
//!
//! std only, so it builds before anything else and never pulls a vendor crate.

mod backends;
mod conformance;
mod deps;
mod disk;
mod fuzz;
mod gpu_check;
mod matrix;
mod prereq;
mod python;
mod run;

use std::process::ExitCode;

const HELP: &str = "\
cargo xtask <task>

tasks:
  ci                 fmt check, clippy -D warnings and tests for every matrix entry,
                     dependency rules, linkage rules, generated-file checks; installs the
                     Debian packages the tests need when run as root (else says which)
  matrix             print the feature matrix
  prereq             install (as root, with apt-get) or name the system packages the tests need
  deps               check the dependency rules only (cargo tree)
  package            check that every crate packages (cargo package --workspace --no-verify)
  linkage            check that no vendor library is a hard (NEEDED) dependency
  conformance --device ID [--json FILE]
                     run the backend conformance suite against one device (any backend of
                     the list in crates/memplan-core/src/backends.rs; the JSON report goes to
                     FILE, else to $CARGO_TARGET_DIR or target/, conformance-<id>.json)
  capability-matrix [--check]
                     regenerate docs/capability-matrix.md (or check it is current)
  strategy-table [--check]
                     run the seeded sweep (release build) and regenerate
                     docs/strategy-comparison.md (or check it is current); fails when an
                     acceptance check of the sweep fails
  gpu-check [ARGS]   build the GPU check bundle (see docs/gpu-check.md)
  python             the Python package: clippy, wheel (maturin) in a fresh venv, pytest
  fuzz [--seconds N] [--libfuzzer]
                     the fuzz targets of fuzz/ for N seconds each (default 6): the stable
                     in-process driver, or cargo-fuzz's libFuzzer (RUSTC_BOOTSTRAP=1)
  help               this text

environment:
  XTASK_ONLY=NAME    run only the matrix entry NAME in `ci` (`python`: only the Python step,
                     `fuzz`: only the fuzz step)
  PYTHON=PATH        the interpreter that creates the Python step's venv (default python3)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "ci" => ci(),
        "matrix" => {
            matrix::print();
            Ok(())
        }
        "deps" => deps::check(),
        "package" => deps::package(),
        "prereq" => prereq::ensure(),
        "linkage" => deps::linkage(),
        "conformance" => conformance::run(&args[1..]),
        "capability-matrix" => conformance::capability_matrix(&args[1..]),
        "strategy-table" => conformance::strategy_table(&args[1..]),
        "gpu-check" => gpu_check::run(&args[1..]),
        "python" => python::check(),
        "fuzz" => fuzz::run(&args[1..]),
        "help" | "-h" | "--help" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown task `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ci() -> Result<(), String> {
    disk::prepare_ci();
    prereq::ensure()?;
    run::step("rustfmt", &["cargo", "fmt", "--all", "--check"])?;
    run::step(
        "rustfmt xtask",
        &[
            "cargo",
            "fmt",
            "--manifest-path",
            "xtask/Cargo.toml",
            "--check",
        ],
    )?;
    run::step(
        "clippy xtask",
        &[
            "cargo",
            "clippy",
            "-q",
            "--manifest-path",
            "xtask/Cargo.toml",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    let only = std::env::var("XTASK_ONLY").ok();
    matrix::print();
    for entry in matrix::ENTRIES {
        if only.as_deref().is_some_and(|o| o != entry.name) {
            continue;
        }
        entry.run()?;
    }
    // Every crate's documentation, with rustdoc's warnings (a broken or private intra-doc
    // link) as errors: the crate docs state each contract, and a link that goes nowhere says
    // nothing. The Python package's crate links against an interpreter and has its own step.
    if only.is_none() {
        run::step(
            "rustdoc",
            &[
                "env",
                "RUSTDOCFLAGS=-D warnings",
                "cargo",
                "doc",
                "-q",
                "--no-deps",
                "--workspace",
                "--exclude",
                "memplan-python",
            ],
        )?;
    }
    // The downstream engine (examples/engine): a whole measured start-up through the facade on
    // a simulated GPU. A few seconds: the matrix above built everything it needs.
    run::step(
        "example engine",
        &["cargo", "run", "-q", "-p", "memplan-example-engine"],
    )?;
    // The same engine as 2 tensor-parallel ranks in 2 processes exchanging their plans as
    // JSON: every rank maps the combined (fewest) blocks. About 3 seconds.
    run::step(
        "example engine, 2 ranks in 2 processes",
        &[
            "cargo",
            "run",
            "-q",
            "-p",
            "memplan-example-engine",
            "--",
            "--ranks",
            "2",
        ],
    )?;
    if only.as_deref().is_none_or(|o| o == "python") {
        python::check()?;
    }
    // The fuzz targets' bodies for a fixed time (the debug build above is reused).
    if only.as_deref().is_none_or(|o| o == "fuzz") {
        fuzz::run(&[])?;
    }
    deps::check()?;
    deps::package()?;
    deps::linkage()?;
    // The conformance suite, through this command, on every backend's CI device (the one
    // list's `ci_device`: devices CI opens without hardware).
    conformance::ci_devices()?;
    conformance::capability_matrix(&["--check".to_string()])?;
    conformance::strategy_table(&["--check".to_string()])?;
    println!("xtask ci: all steps passed");
    Ok(())
}
