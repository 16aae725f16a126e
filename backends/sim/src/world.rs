//! One simulated GPU shared by several OS processes, as a real GPU is: each process that opens
//! it with `world=DIR` writes what it holds on the device (its context and every allocation:
//! [`crate::GroundTruth::this_process`]) to its own file in `DIR`, and reads the others' files
//! for the memory other processes hold. Device-wide readings and out-of-memory then see every
//! process; a process-local reading sees only its own.
//!
//! This is how the conformance suite's second process (a real, separate process) reaches a
//! simulated device: [`crate::SimGpu`]'s `shared_id` creates the directory on first use and
//! gives the selector with `world=DIR` that the other process opens.
//!
//! Files: `DIR/<pid>`, the process's bytes in decimal, replaced atomically (written to a
//! temporary file, then renamed). A file whose process no longer runs is ignored (Linux
//! `/proc/<pid>`); a file that cannot be read is skipped with a warning. The process that
//! created the directory removes it when its GPU is dropped; every other process removes its
//! own file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use memplan_core::{Error, Result};

/// This process's membership of a shared simulated GPU.
#[derive(Debug)]
pub(crate) struct World {
    dir: PathBuf,
    /// Created by this process: removed when dropped.
    owner: bool,
    /// What this process last wrote (`None` before the first write).
    published: Mutex<Option<u64>>,
}

fn own_pid() -> u32 {
    std::process::id()
}

fn alive(pid: u32) -> bool {
    let proc_fs = Path::new("/proc/self");
    // Without /proc (not Linux), every file counts: a process that ended removed its own.
    !proc_fs.exists() || Path::new("/proc").join(pid.to_string()).exists()
}

impl World {
    /// A new world in the system's temporary directory, owned by this process.
    pub fn create() -> Result<World> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("memplan-sim-world-{}-{n}-{nanos}", own_pid()));
        let text = dir.to_string_lossy();
        if text.contains(',') || text.contains('=') {
            return Err(Error::invalid(
                "world",
                format!(
                    "the temporary directory {text} contains `,` or `=`, which a sim selector cannot carry; set TMPDIR to another directory"
                ),
            ));
        }
        std::fs::create_dir(&dir)
            .map_err(|e| Error::invalid("world", format!("creating {}: {e}", dir.display())))?;
        Ok(World {
            dir,
            owner: true,
            published: Mutex::new(None),
        })
    }

    /// Join the world another process created.
    pub fn join(dir: &Path) -> Result<World> {
        if !dir.is_dir() {
            return Err(Error::invalid(
                "world",
                format!(
                    "{} is not a directory: `world=DIR` names the directory of a simulated GPU another process shares",
                    dir.display()
                ),
            ));
        }
        Ok(World {
            dir: dir.to_path_buf(),
            owner: false,
            published: Mutex::new(None),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes every other live process holds on the device.
    pub fn others(&self) -> u64 {
        let me = own_pid();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut sum = 0u64;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(pid) = name.parse::<u32>() else {
                continue;
            };
            if pid == me || !alive(pid) {
                continue;
            }
            match std::fs::read_to_string(e.path())
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
            {
                Some(b) => sum = sum.saturating_add(b),
                None => {
                    tracing::warn!(file = %e.path().display(), "sim world: unreadable entry skipped")
                }
            }
        }
        sum
    }

    /// Write what this process holds, when it changed.
    pub fn publish(&self, bytes: u64) {
        let mut last = self.published.lock().unwrap_or_else(|e| e.into_inner());
        if *last == Some(bytes) {
            return;
        }
        let tmp = self.dir.join(format!(".{}.tmp", own_pid()));
        let file = self.dir.join(own_pid().to_string());
        let written =
            std::fs::write(&tmp, bytes.to_string()).and_then(|_| std::fs::rename(&tmp, &file));
        match written {
            Ok(()) => *last = Some(bytes),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "sim world: could not publish this process's memory")
            }
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            let _ = std::fs::remove_file(self.dir.join(own_pid().to_string()));
        }
    }
}
