//! A `memplan` binary built with `rocm` must start where no HIP runtime exists: `libamdhip64`
//! must not be a NEEDED entry (`readelf -d`), and `memplan devices` must report the backend
//! unavailable with the reason, exit 0, no panic.
//!
//! The binary is `$MEMPLAN_BIN`, else `memplan` next to this test's target directory. Build it
//! first: `HIP_PATH=/usr cargo build -p memplan-cli --features rocm` (same target dir), then
//! `cargo test -p memplan-backend-rocm --test no_hard_link`. Without the binary, or with one
//! built without `rocm`, the test prints why it checked nothing. The same check by hand:
//! `readelf -d BIN | grep NEEDED` must not list libamdhip64.

use std::path::{Path, PathBuf};
use std::process::Command;

fn memplan_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MEMPLAN_BIN") {
        return Some(PathBuf::from(p));
    }
    // target/<profile>/deps/no_hard_link-<hash> -> target/<profile>/memplan
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("memplan");
    bin.is_file().then_some(bin)
}

/// The NEEDED entries of `bin`, or `None` when readelf cannot run.
fn needed(bin: &Path) -> Option<Vec<String>> {
    let out = Command::new("readelf").arg("-d").arg(bin).output().ok()?;
    assert!(
        out.status.success(),
        "readelf -d {} failed: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    Some(
        text.lines()
            .filter(|l| l.contains("(NEEDED)"))
            .map(|l| l.trim().to_string())
            .collect(),
    )
}

fn check_binary(bin: &Path) {
    let Some(needed) = needed(bin) else {
        eprintln!("SKIPPED: readelf is not installed (binutils)");
        return;
    };
    assert!(
        !needed.is_empty(),
        "{} has no NEEDED entries: not a dynamic ELF binary?",
        bin.display()
    );
    let hard: Vec<_> = needed.iter().filter(|l| l.contains("amdhip64")).collect();
    assert!(
        hard.is_empty(),
        "{} links the HIP runtime at load time: {hard:?}",
        bin.display()
    );
    eprintln!("{}: NEEDED {:?}", bin.display(), needed);
}

/// Run `memplan devices` with `env`, expecting exit 0, no panic, and a rocm line containing
/// one of `reasons`.
fn devices_reports_rocm(bin: &Path, env: &[(&str, &str)], reasons: &[&str]) {
    let out = Command::new(bin)
        .arg("devices")
        .envs(env.iter().copied())
        .output()
        .expect("run memplan devices");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !all.contains("panicked"),
        "memplan devices panicked:\n{all}"
    );
    assert!(
        out.status.success(),
        "memplan devices exited {:?} with {env:?}:\n{all}",
        out.status.code()
    );
    let rocm: Vec<&str> = all
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("rocm"))
        .collect();
    assert!(!rocm.is_empty(), "no rocm line in memplan devices:\n{all}");
    assert!(
        reasons.iter().any(|r| all.contains(r)),
        "rocm line gives none of {reasons:?}:\n{all}"
    );
    eprintln!("memplan devices with {env:?}:\n{all}");
}

#[test]
fn memplan_binary_does_not_need_libamdhip64() {
    let Some(bin) = memplan_binary() else {
        eprintln!("SKIPPED: no memplan binary; build it with `cargo build -p memplan-cli --features rocm` or set MEMPLAN_BIN");
        return;
    };
    check_binary(&bin);
    // Whether rocm is compiled in, the binary says (`memplan devices --json` lists every
    // registered backend); the library's name alone is in every binary (the list of
    // backends names the libraries each one loads).
    let out = Command::new(&bin)
        .args(["devices", "--json"])
        .output()
        .expect("run memplan devices --json");
    let listed = String::from_utf8_lossy(&out.stdout);
    if !listed.contains("\"backend\":\"rocm\"") && !listed.contains("\"backend\": \"rocm\"") {
        eprintln!(
            "SKIPPED the run checks: {} was built without the rocm backend",
            bin.display()
        );
        return;
    }
    // No runtime at all (the library name points nowhere): unavailable, names the library.
    devices_reports_rocm(
        &bin,
        &[("MEMPLAN_HIP_LIBRARY", "/nonexistent/libamdhip64.so")],
        &["libamdhip64"],
    );
    // Whatever this machine has: a GPU, the runtime without a GPU (the runtime's own error), or
    // nothing.
    devices_reports_rocm(
        &bin,
        &[],
        &["hipError", "unknown code", "libamdhip64", "rocm:0"],
    );
}
