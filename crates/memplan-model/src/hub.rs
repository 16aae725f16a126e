//! Models where users have them: `--model ORG/NAME` resolved from the local Hugging Face
//! cache, without network. The cache root is `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub` (the `huggingface_hub` library's order).
//!
//! The cache layout (`huggingface_hub`'s `file_download.py`): a model's folder is
//! `models--ORG--NAME`; `refs/main` holds the commit hash of the snapshot the `main` branch
//! points at; `snapshots/<commit>/` holds the files, usually as links into `blobs/`.
//!
//! Everything in the cache is input like any other file, read under the same rules
//! ([`memplan_core::input`]):
//! - `refs/main` is a regular file of at most [`HF_REF`] bytes (a FIFO or a link to
//!   `/dev/zero` is refused before it is opened), and holds one commit hash: 7 to 64 hex
//!   digits, nothing else (no path separator, no `..`), so it names a folder of `snapshots/`
//!   and nothing else;
//! - the model folder, the snapshot and every file read from it (config, quantization
//!   sidecar, safetensors index and files) are resolved to their real paths and must stay
//!   inside the model's folder of the cache (links into `blobs/` do): a link that leads
//!   anywhere else is an error naming the file and where it leads, never a plan of another
//!   model.

use std::path::{Path, PathBuf};

use memplan_core::input::{self, HF_REF};
use memplan_core::{Error, Param, Result};

/// The cache root the Hugging Face tools use, if one can be named.
pub fn cache_root() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = var("HF_HUB_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(h) = var("HF_HOME") {
        return Some(PathBuf::from(h).join("hub"));
    }
    var("HOME").map(|h| {
        PathBuf::from(h)
            .join(".cache")
            .join("huggingface")
            .join("hub")
    })
}

/// Does `name` look like a hub id (`ORG/NAME`, two non-empty parts, no path syntax)?
pub fn is_repo_id(name: &str) -> bool {
    let mut parts = name.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.len() <= 96
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// A cached model: its snapshot folder, and the real path of its cache folder, inside which
/// every file read for it must stay.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// `<cache>/models--ORG--NAME/snapshots/<commit>` (as the cache names it, not resolved).
    pub dir: PathBuf,
    /// The real path of `<cache>/models--ORG--NAME`.
    pub boundary: PathBuf,
}

/// Whether `s` is a commit hash as a ref holds it: 7 to 64 hex digits (git's abbreviated to
/// SHA-256 lengths; the hub writes 40).
pub fn is_commit(s: &str) -> bool {
    (7..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The metadata of `path` (links followed), `None` when nothing is there.
fn stat(path: &Path) -> Result<Option<std::fs::Metadata>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

/// Whether anything is at `path`, a dangling link included (which is then an error where it
/// is followed, naming it, rather than an absent file).
fn present(path: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(path)(e)),
    }
}

/// The snapshot a cached model's `refs/main` names, `Ok(None)` when the model is not in the
/// cache (no folder, no `refs/main`, no `config.json` in the snapshot). A cache entry that
/// breaks the rules of this module's docs is an error naming the file.
pub fn snapshot(repo_id: &str) -> Result<Option<Snapshot>> {
    let Some(root) = cache_root() else {
        return Ok(None);
    };
    snapshot_in(&root, repo_id)
}

/// [`snapshot`] in the cache at `root`.
pub fn snapshot_in(root: &Path, repo_id: &str) -> Result<Option<Snapshot>> {
    if !is_repo_id(repo_id) {
        return Ok(None);
    }
    let folder = root.join(format!("models--{}", repo_id.replace('/', "--")));
    let Some(meta) = stat(&folder)? else {
        return Ok(None);
    };
    if !meta.is_dir() {
        return Err(Error::file(
            folder.display().to_string(),
            "is not a folder (a Hugging Face cache entry is a folder with refs/ and snapshots/)",
        ));
    }
    // The cache root may itself be a link (a cache on another disk); the model's folder must
    // resolve inside wherever it leads.
    let real_root = std::fs::canonicalize(root).map_err(io(root))?;
    let boundary = input::confined(&folder, &real_root, "the Hugging Face cache")?;
    let refs = folder.join("refs").join("main");
    if !present(&refs)? {
        return Ok(None);
    }
    input::confined(&refs, &boundary, "the model's cache folder")?;
    let text = input::read_text(&refs, HF_REF)?;
    let commit = text.trim();
    if !is_commit(commit) {
        let shown: String = commit.chars().take(80).collect();
        return Err(Error::file(
            refs.display().to_string(),
            format!(
                "holds {shown:?}, not a commit hash (7 to 64 hex digits naming a folder of snapshots/)"
            ),
        ));
    }
    let dir = folder.join("snapshots").join(commit);
    if present(&dir)? {
        input::confined(&dir, &boundary, "the model's cache folder")?;
    }
    match stat(&dir)? {
        None => {
            return Err(Error::file(
                refs.display().to_string(),
                format!(
                    "names snapshot {commit}, but {} does not exist (an interrupted download? download the model again)",
                    dir.display()
                ),
            ))
        }
        Some(m) if !m.is_dir() => {
            return Err(Error::file(
                dir.display().to_string(),
                "is not a folder (a snapshot is a folder of the model's files)",
            ))
        }
        Some(_) => {}
    }
    if !present(&dir.join("config.json"))? {
        return Ok(None);
    }
    Ok(Some(Snapshot { dir, boundary }))
}

/// The error for a hub id that is neither cached nor a preset: where memplan looked and how
/// to download it.
pub fn not_cached(repo_id: &str) -> Error {
    let root = cache_root().map_or_else(
        || "(no HF_HUB_CACHE, HF_HOME or HOME set)".to_string(),
        |r| r.display().to_string(),
    );
    Error::param(
        Param::Model,
        format!(
            "{repo_id} is not a shipped preset and not in the Hugging Face cache at {root} \
             (memplan reads refs/main and snapshots/ there, never the network); download its \
             config and checkpoint headers with `huggingface-cli download {repo_id} --include \
             config.json '*.safetensors*' '*.json'`, or pass a model directory"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        assert!(is_repo_id("Qwen/Qwen2.5-7B-Instruct"));
        for bad in ["qwen3-8b", "./a/b", "a/b/c", "/abs", "a/", "../x", "a b/c"] {
            assert!(!is_repo_id(bad), "{bad}");
        }
    }

    #[test]
    fn commits_are_hex_names_without_path_syntax() {
        assert!(is_commit("0123abcd"));
        assert!(is_commit(&"a".repeat(40)) && is_commit(&"F".repeat(64)));
        for bad in [
            "",
            "abc",
            "../../../x",
            "/etc",
            "0123abc/",
            "0123abcg",
            "main",
            &"a".repeat(65),
            "0123 abcd",
            "0123abcd\0",
        ] {
            assert!(!is_commit(bad), "{bad:?}");
        }
    }
}
