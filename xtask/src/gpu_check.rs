//! `cargo xtask gpu-check [--out DIR] [--debug]`: build the GPU check bundle.
//!
//! A GPU machine may have no Rust toolchain, so everything `scripts/gpu-check.sh` runs is built
//! here and copied into one folder (default `target/gpu-check/`):
//!
//! - `memplan`: the CLI (`-p memplan-cli --features cuda`),
//! - `gpu_report`: the CUDA backend's measuring example (graphs, hold, report assembly),
//! - `memplan-backend-cuda-tests`: the backend's test binary (`cargo test --no-run`), whose
//!   `#[ignore = "needs an NVIDIA GPU"]` tests the script runs with `--ignored`,
//! - `memplan-conformance`: the backend conformance suite with `cuda` (optional: left out,
//!   with a warning, when it does not build),
//! - `memplan-*.whl` and `torch_engine.py`: the Python package and its PyTorch engine (the
//!   `python_engine` step), where `maturin` is installed (left out, with a warning, else),
//! - `gpu-check.sh`: the script itself.
//!
//! Copy the folder to the GPU machine and run `./gpu-check.sh`; see `docs/gpu-check.md`.
//! Binaries link glibc dynamically and load the CUDA driver at run time: build on a machine
//! whose glibc is not newer than the GPU machine's.

use std::path::{Path, PathBuf};
use std::process::Command;

const TESTS_NAME: &str = "memplan-backend-cuda-tests";

fn root() -> PathBuf {
    let xtask = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().map(Path::to_path_buf).unwrap_or(xtask)
}

fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => {
            let t = PathBuf::from(t);
            if t.is_absolute() {
                t
            } else {
                root.join(t)
            }
        }
        None => root.join("target"),
    }
}

fn cargo(root: &Path, args: &[&str]) -> Result<String, String> {
    println!("\n==> [gpu-check] cargo {}", args.join(" "));
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo {}` failed with {}",
            args.join(" "),
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of `"key":"…"` in one line of cargo's JSON messages (paths need no unescaping
/// beyond `\\` and `\"`).
fn json_string(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let mut out = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    None
}

/// The test executable of the `memplan-backend-cuda` library among cargo's JSON messages.
fn test_executable(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"")
                && l.contains("\"name\":\"memplan_backend_cuda\"")
        })
        .filter(|l| l.contains("\"kind\":[\"lib\"]"))
        .find_map(|l| json_string(l, "executable"))
        .map(PathBuf::from)
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mut p = std::fs::metadata(to)
            .map_err(|e| e.to_string())?
            .permissions();
        p.set_mode(0o755);
        std::fs::set_permissions(to, p).map_err(|e| format!("chmod {}: {e}", to.display()))?;
    }
    println!("    {}", to.display());
    Ok(())
}

/// Build the bundle. Arguments: `--out DIR` (default `target/gpu-check`), `--debug` (debug
/// profile instead of release, faster to build).
pub fn run(args: &[String]) -> Result<(), String> {
    let root = root();
    let mut out = target_dir(&root).join("gpu-check");
    let mut release = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a folder")?),
            "--debug" => release = false,
            other => {
                return Err(format!(
                    "gpu-check: unknown argument `{other}` (use --out DIR, --debug)"
                ))
            }
        }
    }
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    let with = |base: &[&str]| -> Vec<String> {
        base.iter().chain(profile).map(|s| s.to_string()).collect()
    };
    let run_cargo =
        |v: Vec<String>| cargo(&root, &v.iter().map(String::as_str).collect::<Vec<_>>());

    run_cargo(with(&["build", "-p", "memplan-cli", "--features", "cuda"]))?;
    run_cargo(with(&[
        "build",
        "-p",
        "memplan-backend-cuda",
        "--example",
        "gpu_report",
    ]))?;
    // The conformance suite (another crate) is optional in the bundle: a failure to build it
    // is reported and the script skips that step.
    let conformance = run_cargo(with(&[
        "build",
        "-p",
        "memplan-conformance",
        "--features",
        "cuda",
    ]))
    .map_err(|e| println!("warning: gpu-check: the bundle will have no conformance suite: {e}"))
    .is_ok();
    let messages = run_cargo(with(&[
        "test",
        "-p",
        "memplan-backend-cuda",
        "--lib",
        "--no-run",
        "--message-format=json",
    ]))?;
    let tests = test_executable(&messages)
        .ok_or("could not find the memplan-backend-cuda test executable in cargo's output")?;

    let bin = target_dir(&root).join(if release { "release" } else { "debug" });
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    println!("\n==> [gpu-check] bundle in {}", out.display());
    copy(&bin.join(exe("memplan")), &out.join(exe("memplan")))?;
    copy(
        &bin.join("examples").join(exe("gpu_report")),
        &out.join(exe("gpu_report")),
    )?;
    copy(&tests, &out.join(exe(TESTS_NAME)))?;
    if conformance {
        copy(
            &bin.join(exe("memplan-conformance")),
            &out.join(exe("memplan-conformance")),
        )?;
    }
    python_wheel(&root, &out, release);
    copy(
        &root.join("scripts").join("gpu-check.sh"),
        &out.join("gpu-check.sh"),
    )?;
    println!(
        "\ngpu-check: copy {} to an NVIDIA machine and run `./gpu-check.sh --out gpu-report.json` there \
         (see docs/gpu-check.md)",
        out.display()
    );
    Ok(())
}

/// The Python package's wheel and its PyTorch engine, for the `python_engine` step. Optional:
/// without `maturin` (pip install maturin) the bundle has no wheel and the script skips the
/// step, saying why.
fn python_wheel(root: &Path, out: &Path, release: bool) {
    let manifest = root.join("python").join("Cargo.toml");
    let mut argv = vec!["build".to_string(), "--quiet".to_string()];
    if release {
        argv.push("--release".to_string());
    }
    argv.extend([
        "-m".to_string(),
        manifest.display().to_string(),
        "-o".to_string(),
        out.display().to_string(),
    ]);
    let built = Command::new("maturin")
        .args(&argv)
        .status()
        .map(|s| s.success());
    let example = root.join("python").join("examples").join("torch_engine.py");
    match built {
        Ok(true) => {
            if let Err(e) = copy(&example, &out.join("torch_engine.py")) {
                println!("warning: gpu-check: {e}");
            }
        }
        Ok(false) => println!("warning: gpu-check: `maturin build` failed: the bundle has no Python wheel"),
        Err(e) => println!(
            "warning: gpu-check: maturin not found ({e}): the bundle has no Python wheel (pip install maturin)"
        ),
    }
}

fn exe(name: &str) -> String {
    format!("{name}{}", std::env::consts::EXE_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_lib_test_executable() {
        let msgs = concat!(
            r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"memplan_core"},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"kind":["example"],"name":"gpu_report"},"executable":"/t/examples/gpu_report-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"crate_types":["lib"],"name":"memplan_backend_cuda"},"executable":"/t/deps/memplan_backend_cuda-abc"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            test_executable(msgs),
            Some(PathBuf::from("/t/deps/memplan_backend_cuda-abc"))
        );
        assert_eq!(test_executable(r#"{"reason":"build-finished"}"#), None);
    }

    #[test]
    fn json_strings_unescape_quotes_and_backslashes() {
        assert_eq!(
            json_string(r#"{"executable":"C:\\t\\a \"b\""}"#, "executable").as_deref(),
            Some(r#"C:\t\a "b""#)
        );
        assert_eq!(json_string(r#"{"executable":null}"#, "executable"), None);
    }
}
