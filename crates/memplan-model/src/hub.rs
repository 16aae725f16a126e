//! Models where users have them: `--model ORG/NAME` resolved from the local Hugging Face
//! cache, without network. The cache root is `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub` (the `huggingface_hub` library's order); inside it the
//! `hf-hub` crate (no default features: no HTTP client) follows `refs/main` to the snapshot.

use std::path::PathBuf;

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
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The snapshot directory of a cached model (its `config.json`'s folder), `Ok(None)` when
/// the model is not in the cache.
pub fn snapshot(repo_id: &str) -> Result<Option<PathBuf>> {
    let Some(root) = cache_root() else {
        return Ok(None);
    };
    let cache = hf_hub::Cache::new(root);
    let repo = cache.model(repo_id.to_string());
    Ok(repo
        .get("config.json")
        .and_then(|p| p.parent().map(PathBuf::from)))
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
}
