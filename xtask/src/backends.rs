//! The one list of backends, read from `crates/memplan-core/src/backends.rs` (the list the
//! code's `BackendKind` is generated from) with the parser a test of `memplan-core` also runs
//! on it: xtask names no backend of its own.

use std::path::{Path, PathBuf};

#[path = "../../crates/memplan-core/src/backend_list_format.rs"]
mod format;

pub use format::Entry;

/// The repository root (xtask's parent folder).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Every backend in the list, in order.
pub fn list() -> Result<Vec<Entry>, String> {
    let path = root().join("crates/memplan-core/src/backends.rs");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    format::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The backend a device id names (`cuda:0`, `hip:1`, `sim:rtx4090,other=2GiB`), by name or alias.
pub fn for_device(device: &str) -> Result<Entry, String> {
    let prefix = device.split(':').next().unwrap_or("").to_ascii_lowercase();
    let list = list()?;
    list.iter()
        .find(|e| e.name == prefix || e.aliases.contains(&prefix))
        .cloned()
        .ok_or_else(|| {
            let known: Vec<&str> = list.iter().map(|e| e.name.as_str()).collect();
            format!(
                "unknown backend `{prefix}` in device id `{device}` (known: {})",
                known.join(", ")
            )
        })
}

/// The cargo target directory, absolute: `CARGO_TARGET_DIR` (relative to the current
/// directory, as cargo reads it) or `target/` under the repository root.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().unwrap_or_default().join(dir)
            }
        }
        None => root().join("target"),
    }
}
