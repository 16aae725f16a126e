//! Keeping `cargo xtask ci` small on disk, and saying so when the disk fills anyway.
//!
//! A clean run builds four feature sets of the workspace (debug), a release build for the
//! sweep, the Python wheel and a venv with Ray. With cargo's dev defaults (full debug info,
//! incremental compilation) that took about 13.7 GB on a 2-core machine, most of it debug
//! info in test binaries (up to 170 MB each) and 3.5 GB of incremental caches that a one-shot
//! CI build never reuses; a CI machine with less free disk stopped in the debug test build
//! with rustc's "No space left on device". CI therefore builds without incremental caches and
//! without debug info (cargo then strips the standard library's debug info from every binary
//! too; a panic still names its file and line), unless the caller set either variable itself.
//! With line tables only instead, a clean run took 5.3 GB.

use std::process::Command;

use crate::backends::target_dir;

/// Cargo settings for the CI build: (variable, value), each applied only where unset.
const CI_BUILD_ENV: &[(&str, &str)] =
    &[("CARGO_INCREMENTAL", "0"), ("CARGO_PROFILE_DEV_DEBUG", "0")];

/// Free space below which a failed step is reported as a full disk.
const FULL_BELOW_MIB: u64 = 1024;

/// Apply [`CI_BUILD_ENV`] to this process (inherited by every step) and print the free disk.
pub fn prepare_ci() {
    for (var, value) in CI_BUILD_ENV {
        if std::env::var_os(var).is_none() {
            // Edition 2021: set before any thread is spawned (the steps run one at a time).
            std::env::set_var(var, value);
        }
        println!("ci build: {var}={}", std::env::var(var).unwrap_or_default());
    }
    match free_mib() {
        Some(mib) => println!(
            "ci build: {:.1} GiB free under {}",
            mib as f64 / 1024.0,
            target_dir().display()
        ),
        None => println!(
            "ci build: free disk under {} unknown (df)",
            target_dir().display()
        ),
    }
}

/// Free MiB on the file system of the target directory (or its nearest existing parent), by
/// `df -Pm`; `None` when df cannot tell.
pub fn free_mib() -> Option<u64> {
    let mut dir = target_dir();
    while !dir.exists() {
        dir = dir.parent()?.to_path_buf();
    }
    let out = Command::new("df").arg("-Pm").arg(&dir).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // POSIX format: a header, then `fs blocks used available capacity mount`.
    text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()
}

/// A note for a failed step's error when the disk is (nearly) full, else nothing.
pub fn full_note() -> String {
    match free_mib() {
        Some(mib) if mib < FULL_BELOW_MIB => format!(
            " (the disk is full: {mib} MiB free under {}; CI needs several GB)",
            target_dir().display()
        ),
        _ => String::new(),
    }
}
