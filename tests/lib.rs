//! Workspace-level tests of memplan (no library code): see `every_profile.rs` (the whole
//! engine start-up, plan and real run on every simulated profile) and `architecture.rs` (the
//! layout and documentation rules the project keeps).

/// The repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_default()
}
