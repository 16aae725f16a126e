//! System prerequisites of `cargo xtask ci`: the vendor headers and tools the tests use
//! without any GPU. On Debian as root (a CI machine, a fresh container) missing packages are
//! installed with apt-get; elsewhere the task stops with the exact command to run.

use std::path::Path;
use std::process::Command;

use crate::run::step;

/// (file that must exist — `lib:NAME` for a shared library the dynamic loader must know —,
/// Debian package that provides it, what needs it)
const NEEDS: &[(&str, &str, &str)] = &[
    (
        "/usr/include/hip/hip_runtime_api.h",
        "libamdhip64-dev",
        "hip-runtime-sys's build script and the ROCm layout test",
    ),
    (
        "/usr/include/level_zero/ze_api.h",
        "libze-dev",
        "the Level Zero layout tests",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libze_loader.so.1",
        "libze1",
        "the XPU backend's test against the real loader",
    ),
    ("/usr/bin/readelf", "binutils", "the no-hard-link check"),
    (
        "/usr/bin/cc",
        "gcc",
        "the layout tests and the fake vendor libraries",
    ),
];

fn missing() -> Vec<&'static str> {
    let mut pkgs: Vec<&str> = NEEDS
        .iter()
        .filter(|(f, _, _)| !Path::new(f).exists())
        .map(|(_, p, _)| *p)
        .collect();
    pkgs.dedup();
    pkgs
}

/// Whether this process runs as root (apt-get can install).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

/// `apt-get update`, then install `pkgs` without prompts or recommended packages (as root).
pub fn apt_install(pkgs: &[&str]) -> Result<(), String> {
    step("apt-get update", &["apt-get", "update", "-qq"])?;
    let mut argv = vec![
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
    ];
    argv.extend(pkgs.iter().copied());
    step("apt-get install", &argv)
}

/// Make sure every prerequisite is there, installing it where that is possible.
pub fn ensure() -> Result<(), String> {
    let pkgs = missing();
    if pkgs.is_empty() {
        return Ok(());
    }
    let apt = Path::new("/usr/bin/apt-get").exists();
    if !(apt && is_root()) {
        let why: Vec<String> = NEEDS
            .iter()
            .filter(|(_, p, _)| pkgs.contains(p))
            .map(|(f, p, w)| format!("  {p}: {f} ({w})"))
            .collect();
        return Err(format!(
            "missing system packages:\n{}\ninstall them with: sudo apt-get install -y {}",
            why.join("\n"),
            pkgs.join(" ")
        ));
    }
    println!("==> [prereq] installing {}", pkgs.join(" "));
    apt_install(&pkgs)?;
    let still = missing();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "still missing after apt-get install: {}",
            still.join(" ")
        ))
    }
}
