//! Running commands with a visible header and a clear failure.

use std::process::Command;
use std::time::Instant;

/// Run a command, streaming its output; fail with the step's name.
pub fn step(name: &str, argv: &[&str]) -> Result<(), String> {
    println!("\n==> [{name}] {}", argv.join(" "));
    let t = Instant::now();
    let status = Command::new(argv[0])
        .args(&argv[1..])
        .status()
        .map_err(|e| format!("[{name}] could not start {}: {e}", argv[0]))?;
    println!(
        "<== [{name}] {} in {:.1}s",
        if status.success() { "ok" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "[{name}] `{}` failed with {status}{}",
            argv.join(" "),
            crate::disk::full_note()
        ))
    }
}

/// Run a command and capture its stdout.
pub fn capture(argv: &[&str]) -> Result<String, String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|e| format!("could not start {}: {e}", argv[0]))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
