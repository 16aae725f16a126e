//! The Python package (`python/`): clippy of its native crate, then the wheel built with
//! maturin in a fresh virtual environment, installed, and its pytest suite run against the
//! CLI binary of the default features, built in a target folder of its own.
//!
//! The wheel is a dev-profile build into the workspace's `target/` (the crates the matrix
//! compiled are reused; `--release` would rebuild everything optimized, minutes on 2 cores).
//! The hand check, `maturin build --release` in `python/`, builds the same crate.
//! maturin, pytest, mypy and Ray (for the local-cluster tests of `memplan.ray`) come from
//! PyPI into the throwaway environment; mypy --strict
//! checks the tests against the installed wheel's types (its `py.typed` and stubs). pytest's exit code 5
//! (no test collected) fails the step like any other non-zero code.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run::step;

/// Where the environment and the wheel go (inside the ignored `target/`).
const WORK: &str = "target/python-ci";

/// The Ray release the cluster tests run (`python/tests/test_ray_cluster.py`: a local cluster
/// of simulated GPU nodes on the loopback), pinned so CI does not drift: a CPython 3.11
/// manylinux x86_64 wheel, ~20 s to install. The package's `ray` extra takes any 2.x from 2.9.
const RAY: &str = "ray==2.60.0";

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// `python3 -m venv` needs the venv and ensurepip modules (Debian: python3-venv).
fn ensure_venv_module(py: &str) -> Result<(), String> {
    let ok = Command::new(py)
        .args(["-c", "import venv, ensurepip"])
        .status()
        .map(|s| s.success())
        .map_err(|e| {
            format!("[python] could not start {py}: {e} (set PYTHON to a CPython >= 3.9)")
        })?;
    if ok {
        return Ok(());
    }
    let root = crate::prereq::is_root() && Path::new("/usr/bin/apt-get").exists();
    if !root {
        return Err(format!(
            "[python] {py} cannot create virtual environments: install python3-venv"
        ));
    }
    crate::prereq::apt_install(&["python3-venv"])
}

fn s(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("[python] path {} is not UTF-8", p.display()))
}

/// clippy, wheel, install, pytest.
pub fn check() -> Result<(), String> {
    step(
        "python clippy",
        &[
            "cargo",
            "clippy",
            "-p",
            "memplan-python",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    let py = python();
    ensure_venv_module(&py)?;
    let root = std::env::current_dir().map_err(|e| format!("[python] current dir: {e}"))?;
    let work = root.join(WORK);
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|e| format!("[python] {}: {e}", work.display()))?;
    }
    let venv = work.join("venv");
    let wheels = work.join("wheels");
    let bin = venv.join("bin");
    step("python venv", &[&py, "-m", "venv", s(&venv)?])?;
    let pip = bin.join("pip");
    step(
        "python pip install maturin pytest mypy ray",
        &[
            s(&pip)?,
            "install",
            "-q",
            "--disable-pip-version-check",
            "maturin>=1.9.4,<2",
            "pytest",
            "mypy",
            RAY,
        ],
    )?;
    // The Rust binary the tests compare the wheel with, in a target folder of its own: the
    // workspace's `target/debug/memplan` is whichever feature set built it last (the matrix
    // builds every backend; the wheel and this binary have the default set), and a fresh
    // build of another feature set has been seen to leave it as it was.
    let cli_target = work.join("cli-target");
    step(
        "python cli binary",
        &[
            "cargo",
            "build",
            "-q",
            "-p",
            "memplan-cli",
            "--target-dir",
            s(&cli_target)?,
        ],
    )?;
    let manifest = root.join("python/Cargo.toml");
    step(
        "python wheel (maturin, dev profile)",
        &[
            s(&bin.join("maturin"))?,
            "build",
            "--quiet",
            "--strip",
            "-m",
            s(&manifest)?,
            "-i",
            s(&bin.join("python"))?,
            "-o",
            s(&wheels)?,
        ],
    )?;
    let wheel = only_wheel(&wheels)?;
    step(
        "python pip install wheel",
        &[
            s(&pip)?,
            "install",
            "-q",
            "--disable-pip-version-check",
            s(&wheel)?,
        ],
    )?;
    // The Rust binary to compare with, built above.
    let cli = cli_target.join("debug/memplan");
    let tests = root.join("python/tests");
    // Run from the work folder so `import memplan` finds the installed wheel, not python/.
    let cache = format!("cache_dir={}", s(&work.join("pytest-cache"))?);
    let pytest = bin.join("pytest");
    let argv = [
        "env",
        &format!("MEMPLAN_CLI={}", s(&cli)?),
        // Ray was installed above: its tests must run, not skip.
        "MEMPLAN_RAY_REQUIRED=1",
        s(&pytest)?,
        "-q",
        "-o",
        &cache,
        "--rootdir",
        s(&tests)?,
        s(&tests)?,
    ];
    let prev = std::env::current_dir().map_err(|e| e.to_string())?;
    std::env::set_current_dir(&work).map_err(|e| format!("[python] {}: {e}", work.display()))?;
    let mut r = step("python pytest", &argv);
    if r.is_ok() {
        // The wheel's typing as an editor sees it: the installed package (py.typed, stubs)
        // and the tests that call it, strict.
        let mypy_cache = work.join("mypy-cache");
        r = step(
            "python mypy --strict",
            &[
                s(&bin.join("mypy"))?,
                "--strict",
                "--cache-dir",
                s(&mypy_cache)?,
                s(&tests)?,
            ],
        );
    }
    std::env::set_current_dir(prev).map_err(|e| e.to_string())?;
    r
}

fn only_wheel(dir: &Path) -> Result<PathBuf, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("[python] {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(format!(
            "[python] expected one wheel in {}, found {n}",
            dir.display()
        )),
    }
}
