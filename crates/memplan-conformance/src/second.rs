//! The second process: a real, separate OS process that opens the same device (its
//! [`Device::shared_id`]) and holds an allocation while the suite reads, so a process-local
//! reading can be told from a device-wide one. The suite starts and stops it, on every path
//! (a guard kills it if it is still running), and waits for it at most [`READY_TIMEOUT`].
//!
//! Protocol: the suite runs a [`SecondProcess`] command with `MEMPLAN_CONFORMANCE_HOLD` set to
//! `BYTES DEVICE-ID`; that program's first act is [`serve_if_asked`], which opens the device,
//! allocates, prints `memplan-conformance-hold: ready` on stdout, waits until its stdin closes,
//! frees, prints `memplan-conformance-hold: released` and exits. The `memplan-conformance`
//! binary calls [`serve_if_asked`] first in `main` ([`SecondProcess::this_binary`]);
//! [`crate::conformance_test!`] calls it first in the test it makes and starts the test binary
//! again on that one test ([`SecondProcess::this_test`]).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use memplan::Device;

/// The environment variable that makes a program the second process.
pub const HOLD_ENV: &str = "MEMPLAN_CONFORMANCE_HOLD";
/// How long the second process may take to open the device and allocate (a real GPU's
/// context creation takes seconds).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const READY: &str = "memplan-conformance-hold: ready";
const RELEASED: &str = "memplan-conformance-hold: released";
const FAILED: &str = "memplan-conformance-hold: error";

/// How to start the second process: a program whose first act is [`serve_if_asked`].
#[derive(Debug, Clone)]
pub struct SecondProcess {
    program: PathBuf,
    args: Vec<String>,
}

impl SecondProcess {
    /// Any program and arguments (its `main` must call [`serve_if_asked`] first).
    pub fn command(program: impl Into<PathBuf>, args: Vec<String>) -> Self {
        SecondProcess {
            program: program.into(),
            args,
        }
    }

    /// This executable again (the `memplan-conformance` binary, whose `main` calls
    /// [`serve_if_asked`] first).
    pub fn this_binary() -> std::io::Result<Self> {
        Ok(Self::command(std::env::current_exe()?, Vec::new()))
    }

    /// This test binary again, running only the test at `path` (`module_path!()::name`; the
    /// crate's own name, the first segment, is dropped as libtest names tests without it),
    /// whose body calls [`serve_if_asked`] first.
    pub fn this_test(path: &str) -> std::io::Result<Self> {
        let name = path.split_once("::").map_or(path, |(_, rest)| rest);
        Ok(Self::command(
            std::env::current_exe()?,
            vec![
                name.to_string(),
                "--exact".into(),
                "--nocapture".into(),
                "--test-threads=1".into(),
            ],
        ))
    }
}

/// A running second process that holds memory on the device; killed when dropped.
pub struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

/// Start the second process on `device` holding `bytes`, and wait until it holds them. `Err`
/// says why it could not (it is killed then).
pub fn hold(how: &SecondProcess, device: &Device, bytes: u64) -> Result<Holder, String> {
    let id = device
        .shared_id()
        .map_err(|e| format!("the device gives no id for another process: {e}"))?;
    let mut child = Command::new(&how.program)
        .args(&how.args)
        .env(HOLD_ENV, format!("{bytes} {id}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", how.program.display()))?;
    let (tx, rx) = channel();
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(format!("stderr: {line}")).is_err() {
                    break;
                }
            }
        });
    }
    let stdin = child.stdin.take();
    let holder = Holder {
        child,
        stdin,
        lines: rx,
    };
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + READY_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match holder.lines.recv_timeout(left) {
            // A test harness may print its own text before ours on the same line.
            Ok(l) if l.contains(READY) => return Ok(holder),
            Ok(l) if l.contains(FAILED) => {
                return Err(format!("the second process ({id}) failed: {l}"))
            }
            Ok(l) => {
                seen.push(l);
                if seen.len() > 40 {
                    seen.remove(0);
                }
            }
            Err(_) => {
                let why = if left.is_zero() {
                    format!("did not hold {bytes} bytes within {READY_TIMEOUT:?}")
                } else {
                    "exited without holding memory".to_string()
                };
                return Err(format!(
                    "the second process ({id}) {why}; its last output: {}",
                    seen.join(" | ")
                ));
            }
        }
    }
}

impl Holder {
    /// Tell it to free and exit; wait for it (at most 30 s, then it is killed).
    pub fn release(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + EXIT_TIMEOUT;
        let mut released = false;
        while let Ok(l) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
        {
            released |= l.contains(RELEASED);
        }
        // Its output has ended; its exit status follows at once (or it hangs: killed on drop).
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break None,
            }
        };
        match status {
            Some(status) if status.success() && released => Ok(()),
            Some(status) => Err(format!("the second process exited with {status}")),
            None => Err("the second process did not exit when told to (killed)".into()),
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// When this process was started as the second process ([`HOLD_ENV`] set), hold memory as
/// asked and exit; otherwise return at once. Call it first in the `main` (or the test) that a
/// [`SecondProcess`] starts.
pub fn serve_if_asked() {
    let Ok(ask) = std::env::var(HOLD_ENV) else {
        return;
    };
    let code = match serve(&ask) {
        Ok(()) => 0,
        Err(e) => {
            println!("{FAILED}: {e}");
            3
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

fn serve(ask: &str) -> Result<(), String> {
    let (bytes, id) = ask
        .split_once(' ')
        .ok_or_else(|| format!("{HOLD_ENV}={ask:?}: expected `BYTES DEVICE-ID`"))?;
    let bytes: u64 = bytes
        .parse()
        .map_err(|_| format!("{HOLD_ENV}: {bytes:?} is not a byte count"))?;
    let device = memplan::open(id).map_err(|e| format!("opening {id}: {e}"))?;
    let held = device
        .allocate(bytes)
        .map_err(|e| format!("allocating {bytes} bytes on {id}: {e}"))?;
    device
        .synchronize()
        .map_err(|e| format!("synchronize: {e}"))?;
    println!("{READY} {bytes}");
    let _ = std::io::stdout().flush();
    // Hold until the suite closes stdin (or dies: then stdin closes too).
    let mut sink = String::new();
    while std::io::stdin()
        .read_line(&mut sink)
        .map(|n| n > 0)
        .unwrap_or(false)
    {
        sink.clear();
    }
    device.free(held).map_err(|e| format!("free: {e}"))?;
    device
        .synchronize()
        .map_err(|e| format!("synchronize: {e}"))?;
    drop(device);
    println!("{RELEASED}");
    Ok(())
}
