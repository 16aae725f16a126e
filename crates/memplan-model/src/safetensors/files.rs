//! A checkpoint on disk: the files to read (the index's, else every `*.safetensors` of the
//! directory), each one's header read without its tensors, and the checks that the files
//! account for their bytes and for each tensor once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use memplan_core::input::{self, SAFETENSORS_INDEX};
use memplan_core::{Error, Result};
use serde_json::Value;

use super::header::{header_len, parse, short_file, Header};
use super::Summary;

/// The index of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// Most files one checkpoint may have (the largest public ones have a few hundred shards).
pub const MAX_SHARDS: usize = 4096;

/// Most tensors one checkpoint may have, all files together (DeepSeek-V3 with its fp8 scales
/// has about 150,000).
pub const MAX_TENSORS: u64 = 1 << 20;

/// Read the header of one file, without reading its tensors, and check that the file is
/// exactly as long as the header says (`8 + header + the end of the last tensor`).
pub fn read_file(path: &Path) -> Result<Summary> {
    read_header(path).map(|h| h.summary)
}

fn read_header(path: &Path) -> Result<Header> {
    let name = path.display().to_string();
    let (mut f, file_len) = input::open_regular(path, "safetensors file")?;
    let io = |source| Error::Io {
        path: name.clone(),
        source,
    };
    let mut len = [0u8; 8];
    if file_len < 8 {
        return Err(short_file(&name, file_len));
    }
    f.read_exact(&mut len).map_err(io)?;
    let n = header_len(&name, len, file_len - 8)?;
    let mut buf = Vec::with_capacity(n as usize);
    f.take(n).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 != n {
        // The file shrank since its size was read.
        return Err(Error::file(
            &name,
            format!(
                "the file ends inside its safetensors header ({} of {n} bytes)",
                buf.len()
            ),
        ));
    }
    let h = parse(&name, &buf)?;
    // The tensors tile the data section from 0 (checked by the parser), so their total is the
    // end of the data section: the file must end exactly there, as the reference reader
    // requires.
    let data = file_len - 8 - n;
    let want = h.summary.total();
    if data < want {
        return Err(Error::file(
            &name,
            format!(
                "is truncated: its header describes {want} bytes of tensors but only {data} follow the header (an incomplete download?)"
            ),
        ));
    }
    if data > want {
        return Err(Error::file(
            &name,
            format!(
                "has {} bytes after its last tensor (header describes {want} bytes of tensors, {data} follow it); safetensors files end with their last tensor",
                data - want
            ),
        ));
    }
    Ok(h)
}

/// Read every `*.safetensors` header of a checkpoint directory; `None` when it has none.
///
/// When the directory has an [`INDEX`], exactly the files its `weight_map` names are read, as
/// engines load them: repositories such as Mistral's ship the same weights twice
/// (`consolidated.safetensors` beside the Hugging Face shards). Every name the index gives
/// must stay inside the directory; it is checked before any file is opened.
///
/// Errors: a file that does not account for its bytes, a tensor in two files (both named), a
/// checkpoint without tensors, more than [`MAX_SHARDS`] files or [`MAX_TENSORS`] tensors.
pub fn read_dir(dir: &Path) -> Result<Option<Summary>> {
    read_dir_within(dir, None)
}

/// [`read_dir`]; with `within` (a real path, from [`std::fs::canonicalize`]), the index and
/// every file are first resolved (links followed) and must lie inside it: a cached Hugging
/// Face model links its files into the cache's `blobs/`, and a link that leads anywhere else
/// is an error naming the file, read never.
pub fn read_dir_within(dir: &Path, within: Option<&Path>) -> Result<Option<Summary>> {
    let confine = |f: &Path| match within {
        Some(root) => input::confined(f, root, "the model's Hugging Face cache folder").map(drop),
        None => Ok(()),
    };
    let files = match indexed_files(dir, &confine)? {
        Some(listed) => listed,
        None => listed_files(dir)?,
    };
    if files.is_empty() {
        return Ok(None);
    }
    for f in &files {
        confine(f)?;
    }
    let mut s = Summary::default();
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let h = read_header(f)?;
        for t in h.names {
            if let Some(&j) = owner.get(&t) {
                return Err(Error::file(
                    dir.display().to_string(),
                    format!(
                        "tensor {t:?} is in both {} and {}; a checkpoint holds each tensor once",
                        files[j].display(),
                        f.display()
                    ),
                ));
            }
            owner.insert(t, i);
        }
        s.merge(h.summary).ok_or_else(|| {
            Error::file(
                dir.display().to_string(),
                "safetensors sizes overflow 64 bits",
            )
        })?;
        if s.tensors > MAX_TENSORS {
            return Err(Error::file(
                dir.display().to_string(),
                format!("more than {MAX_TENSORS} tensors in one checkpoint"),
            ));
        }
    }
    if s.tensors == 0 || s.total() == 0 {
        return Err(Error::file(
            dir.display().to_string(),
            format!(
                "the checkpoint holds no weights ({} tensors, {} bytes in {} safetensors file(s))",
                s.tensors,
                s.total(),
                files.len()
            ),
        ));
    }
    Ok(Some(s))
}

/// Every `*.safetensors` entry of the directory, sorted.
fn listed_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| Error::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let p = e.map_err(io)?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            files.push(p);
            if files.len() > MAX_SHARDS {
                return Err(too_many_shards(dir));
            }
        }
    }
    files.sort();
    Ok(files)
}

fn too_many_shards(dir: &Path) -> Error {
    Error::file(
        dir.display().to_string(),
        format!("more than {MAX_SHARDS} safetensors files in one checkpoint"),
    )
}

/// The files a directory's [`INDEX`] maps tensors to, each checked to be a plain relative
/// path inside the directory; `None` without an index.
fn indexed_files(
    dir: &Path,
    confine: &dyn Fn(&Path) -> Result<()>,
) -> Result<Option<Vec<PathBuf>>> {
    let path = dir.join(INDEX);
    let name = path.display().to_string();
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::Io {
                path: name,
                source: e,
            })
        }
        Ok(_) => {}
    }
    confine(&path)?;
    let text = input::read_text(&path, SAFETENSORS_INDEX)?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::file(&name, format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::file_key(&name, "weight_map", "missing or not an object"))?;
    if map.is_empty() {
        return Err(Error::file_key(
            &name,
            "weight_map",
            "is empty: the index names no tensor",
        ));
    }
    let mut names = BTreeSet::new();
    for (tensor, f) in map {
        let f = f.as_str().ok_or_else(|| {
            Error::file_key(
                &name,
                "weight_map",
                format!("tensor {tensor:?}: file names must be strings, found {f}"),
            )
        })?;
        inside(f).map_err(|why| {
            Error::file_key(
                &name,
                "weight_map",
                format!("tensor {tensor:?} is mapped to {f:?}, {why}"),
            )
        })?;
        names.insert(f);
        if names.len() > MAX_SHARDS {
            return Err(too_many_shards(dir));
        }
    }
    let files: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    // A shard the index names but the directory lacks would silently shrink the weights.
    if let Some((missing, _)) = names.iter().zip(&files).find(|(_, p)| !p.exists()) {
        return Err(Error::file_key(
            &name,
            "weight_map",
            format!("names {missing:?}, which is not in the directory"),
        ));
    }
    Ok(Some(files))
}

/// Whether an index entry names a `.safetensors` file inside the model directory: relative,
/// without `..`, a root or a drive prefix. Checked on the text alone (links inside the
/// directory, as in the Hugging Face cache, stay allowed).
fn inside(f: &str) -> std::result::Result<(), &'static str> {
    let p = Path::new(f);
    if f.is_empty() || p.file_name().is_none() {
        return Err("which names no file");
    }
    if !p
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(
            "outside the model directory (index entries must be relative paths without `..`)",
        );
    }
    if p.extension().is_none_or(|x| x != "safetensors") {
        return Err("which is not a .safetensors file");
    }
    Ok(())
}
