//! Dependency rules, checked with `cargo tree`, and linkage rules, checked with `readelf`.

use crate::run::{capture, step};

/// Crates that load or bind a vendor library: what the backends' `runtime` feature pulls.
const VENDOR_LIBRARY_CRATES: &[&str] = &[
    "cudarc",
    "hip-runtime-sys",
    "level-zero-sys",
    "nvml-wrapper",
    "libloading",
];

/// Crates that talk to a vendor library, and the backend crates themselves (whose pure
/// declarations the simulator uses, but which nothing vendor-neutral should need).
const VENDOR_CRATES: &[&str] = &[
    "cudarc",
    "hip-runtime-sys",
    "level-zero-sys",
    "nvml-wrapper",
    "memplan-backend-cuda",
    "memplan-backend-rocm",
    "memplan-backend-xpu",
];

/// The test-bed: the simulated backend and the harness around it. What an engine ships (the
/// planner, the model specs) never depends on them, in any feature: the simulator is the
/// evidence against the planner, and must not share code or constants with it.
const TESTBED_CRATES: &[&str] = &["memplan-backend-sim", "memplan-testbed"];

/// (package, cargo tree flags, what it must not contain, why)
const RULES: &[(&str, &[&str], &[&str], &str)] = &[
    (
        "memplan-core",
        &[],
        VENDOR_CRATES,
        "the core depends on no vendor crate, ever",
    ),
    (
        "memplan-planner",
        &[],
        VENDOR_CRATES,
        "the planner decides from capabilities, not vendor code",
    ),
    (
        "memplan-model",
        &[],
        VENDOR_CRATES,
        "model specs are vendor-neutral",
    ),
    (
        "memplan-planner",
        &["--all-features"],
        TESTBED_CRATES,
        "the planner is judged by the simulator, so it does not depend on it",
    ),
    (
        "memplan-model",
        &["--all-features"],
        TESTBED_CRATES,
        "model specs ship to engines without the test-bed",
    ),
    (
        "memplan",
        &["--no-default-features"],
        VENDOR_CRATES,
        "the facade without features pulls no backend",
    ),
    (
        "memplan",
        &["--no-default-features", "--features", "sim"],
        VENDOR_LIBRARY_CRATES,
        "`sim` alone pulls no vendor library crate (only the backends' pure declarations)",
    ),
    (
        "memplan-backend-sim",
        &[],
        VENDOR_LIBRARY_CRATES,
        "the simulator declares through the backends without their `runtime` feature",
    ),
    (
        "memplan",
        &["--no-default-features", "--features", "cuda"],
        &["hip-runtime-sys", "level-zero-sys"],
        "`cuda` pulls only NVIDIA crates",
    ),
    (
        "memplan",
        &["--no-default-features", "--features", "rocm"],
        &["cudarc", "level-zero-sys"],
        "`rocm` pulls only AMD crates",
    ),
    (
        "memplan",
        &["--no-default-features", "--features", "xpu"],
        &["cudarc", "hip-runtime-sys"],
        "`xpu` pulls only Intel crates",
    ),
];

/// Check every dependency rule.
pub fn check() -> Result<(), String> {
    println!("\n==> [deps] dependency rules (cargo tree)");
    let mut failures = Vec::new();
    for (pkg, flags, forbidden, why) in RULES {
        let mut argv = vec![
            "cargo", "tree", "-q", "-e", "normal", "--prefix", "none", "-p", pkg,
        ];
        argv.extend_from_slice(flags);
        let tree = capture(&argv)?;
        let names: Vec<&str> = tree
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let hits: Vec<&&str> = forbidden.iter().filter(|f| names.contains(f)).collect();
        let label = format!("{pkg} {}", flags.join(" "));
        if hits.is_empty() {
            println!("  ok   {label:<50} {why}");
        } else {
            println!("  FAIL {label:<50} {why}: found {hits:?}");
            failures.push(label);
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("dependency rules broken: {}", failures.join("; ")))
    }
}

/// `cargo package --workspace --no-verify`: every crate packages on its own (no `include_str!`
/// reaching outside its crate, every path dependency with a version). Offline: the packages
/// are only assembled, nothing is fetched.
pub fn package() -> Result<(), String> {
    step(
        "package",
        &[
            "cargo",
            "package",
            "-q",
            "--workspace",
            "--no-verify",
            "--allow-dirty",
            "--offline",
        ],
    )?;
    licenses_packaged()
}

/// Every package carries both license texts its `license = "MIT OR Apache-2.0"` names (each
/// crate folder links to the root's `LICENSE-MIT` and `LICENSE-APACHE`; cargo packages the
/// link's target). Counted in `cargo package --list`: one `Cargo.toml.orig` per package.
fn licenses_packaged() -> Result<(), String> {
    let list = capture(&[
        "cargo",
        "package",
        "--list",
        "--workspace",
        "--allow-dirty",
        "--offline",
    ])?;
    let count = |name: &str| list.lines().filter(|l| l.trim() == name).count();
    let packages = count("Cargo.toml.orig");
    for license in ["LICENSE-MIT", "LICENSE-APACHE"] {
        let n = count(license);
        if n != packages {
            return Err(format!(
                "[package] {n} of {packages} packages include {license}: link it into every \
                 crate folder (ln -s ../../{license} crates/NAME/{license})"
            ));
        }
    }
    println!("    both license files in each of the {packages} packages");
    Ok(())
}

/// Build the CLI with every backend and check that no vendor library is NEEDED: a binary with
/// every runtime-loaded backend must start on a machine without them.
pub fn linkage() -> Result<(), String> {
    step(
        "linkage build",
        &[
            "cargo",
            "build",
            "-q",
            "-p",
            "memplan-cli",
            "--all-features",
        ],
    )?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let bin = format!("{target}/debug/memplan");
    let dynamic = capture(&["readelf", "-d", &bin])?;
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    let vendor = [
        "libcuda",
        "libnvidia-ml",
        "libnvrtc",
        "libamdhip64",
        "libhsa-runtime",
        "libze_loader",
    ];
    let bad: Vec<&&str> = needed
        .iter()
        .filter(|l| vendor.iter().any(|v| l.contains(v)))
        .collect();
    println!("\n==> [linkage] {bin} NEEDED:");
    for l in &needed {
        println!("  {}", l.trim());
    }
    if bad.is_empty() {
        println!("  ok: no vendor library is a hard dependency");
        Ok(())
    } else {
        Err(format!("vendor libraries linked at build time: {bad:?}"))
    }
}
