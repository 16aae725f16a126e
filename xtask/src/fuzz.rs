//! `cargo xtask fuzz`: the fuzz targets of `fuzz/` for a fixed time.
//!
//! - Default (the CI step): the stable in-process driver
//!   (`crates/memplan-model/tests/fuzz_stable.rs`) runs every target's body on mutated seeds
//!   for `--seconds` per target. It reuses the debug build the matrix made, so the step costs
//!   the fuzzing time and little more.
//! - `--libfuzzer`: the same targets under cargo-fuzz (libFuzzer, AddressSanitizer, coverage
//!   guided), `cargo install cargo-fuzz` first. The stable toolchain runs it with
//!   `RUSTC_BOOTSTRAP=1` (which this task sets); the first build takes minutes (an optimized,
//!   instrumented build of the model crate), so CI uses the driver and long campaigns use this.

use crate::run::step;

/// Every target, as named in `fuzz/Cargo.toml` and `fuzz/seeds/`.
pub const TARGETS: &[&str] = &[
    "config_json",
    "safetensors_header",
    "from_log",
    "gguf",
    "hf_cache",
];

/// Seconds per target in `cargo xtask ci`.
pub const CI_SECONDS: u64 = 6;

/// Run the fuzz targets; `args`: `[--seconds N] [--libfuzzer]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut seconds = CI_SECONDS;
    let mut libfuzzer = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s| *s > 0)
                    .ok_or("--seconds takes a whole number of seconds above 0")?;
            }
            "--libfuzzer" => libfuzzer = true,
            other => return Err(format!("fuzz: unknown argument {other:?}")),
        }
    }
    if !libfuzzer {
        return step(
            &format!("fuzz (stable driver, {seconds} s per target)"),
            &[
                "env",
                &format!("MEMPLAN_FUZZ_SECONDS={seconds}"),
                "cargo",
                "test",
                "-q",
                "-p",
                "memplan-model",
                "--test",
                "fuzz_stable",
                "--",
                "--nocapture",
            ],
        );
    }
    let max_time = format!("-max_total_time={seconds}");
    for t in TARGETS {
        let corpus = format!("fuzz/corpus/{t}");
        std::fs::create_dir_all(&corpus).map_err(|e| format!("[fuzz] {corpus}: {e}"))?;
        let seeds = format!("fuzz/seeds/{t}");
        step(
            &format!("fuzz {t} (libFuzzer, {seconds} s)"),
            &[
                "env",
                "RUSTC_BOOTSTRAP=1",
                "cargo",
                "fuzz",
                "run",
                "--fuzz-dir",
                "fuzz",
                "-O",
                t,
                &corpus,
                &seeds,
                "--",
                &max_time,
                "-rss_limit_mb=2048",
                "-timeout=10",
            ],
        )?;
        remove_leftovers();
    }
    Ok(())
}

/// The `hf_cache` body builds its caches under `/dev/shm/memplan-fuzz-<pid>` (else the temp
/// dir); the stable driver removes its own at the end, libFuzzer has no such hook: remove the
/// folders of fuzz processes that have exited.
fn remove_leftovers() {
    for base in [std::path::PathBuf::from("/dev/shm"), std::env::temp_dir()] {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("memplan-fuzz-") else {
                continue;
            };
            let exited = pid.parse::<u32>().is_ok()
                && !std::path::Path::new(&format!("/proc/{pid}")).exists();
            if exited {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
