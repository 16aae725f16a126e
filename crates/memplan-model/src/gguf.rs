//! GGUF files (llama.cpp): the metadata gives the architecture, the tensor infos give the
//! exact weight bytes (per layer, so a partial offload can be sized), and [`fit`] answers the
//! llama.cpp question: which `-c` and how many GPU layers (`-ngl`) fit.
//!
//! A small bounded reader ([`reader`]; no GGUF crate on crates.io reads tensor infos without
//! pulling in a tensor library): it refuses what llama.cpp's loader refuses (bad alignment,
//! duplicate keys or tensor names, misaligned, overlapping or out-of-file tensors), reads at
//! most [`reader::MAX_HEADER`] bytes in time linear in them, and checks every count and
//! length against what is left of the file before anything is allocated, so a corrupt or
//! hostile file is an error naming the offset, never a huge allocation, a hang or a panic.

mod builder;
mod fit;
pub mod reader;
mod types;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memplan_core::{Error, Result};
use serde_json::{json, Map, Value};

use crate::{safetensors::Summary, Model, ModelConfig, Source};

pub use builder::Builder;
pub use fit::{fit, kv_type_bytes, Fit};
pub use types::{ggml_type, GgmlType};

/// Most layers (`blk.N.`) of one file.
pub const MAX_LAYERS: usize = 4096;

/// What a GGUF file holds, for sizing.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Info {
    /// `general.architecture`.
    pub arch: String,
    /// Scalar metadata (numbers, strings, array lengths as `len`).
    pub meta: BTreeMap<String, Value>,
    /// Weight bytes of each `blk.N.` layer.
    pub layer_bytes: Vec<u64>,
    /// Bytes of the output head (`output.weight`, `output_norm`), offloaded with the last
    /// `-ngl` step.
    pub output_bytes: u64,
    /// Bytes of everything else (token embeddings stay in host memory in llama.cpp).
    pub other_bytes: u64,
    /// Bytes per ggml type name.
    pub bytes_by_type: BTreeMap<String, u64>,
    /// Tensors.
    pub tensors: u64,
}

/// Read a GGUF file's metadata and tensor infos (never the tensor data), checked as
/// llama.cpp's loader checks them ([`reader`]).
pub fn read(path: &Path) -> Result<Info> {
    let (file, size) = memplan_core::input::open_regular(path, "GGUF file")?;
    info_from(reader::Reader::new(file, size, path.display().to_string()))
}

/// [`read`] on a file's bytes in memory, named `name` in errors (fuzzing, tests).
pub fn read_bytes(name: &str, bytes: &[u8]) -> Result<Info> {
    info_from(reader::Reader::new(
        bytes,
        bytes.len() as u64,
        name.to_string(),
    ))
}

fn info_from<R: std::io::Read>(mut r: reader::Reader<R>) -> Result<Info> {
    let (header, _data) = r.header()?;
    let arch = header
        .meta
        .get("general.architecture")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| r.err("no general.architecture (a string naming the model's architecture)"))?
        .to_string();
    let mut info = Info {
        arch,
        meta: header.meta,
        layer_bytes: Vec::new(),
        output_bytes: 0,
        other_bytes: 0,
        bytes_by_type: BTreeMap::new(),
        tensors: header.tensors.len() as u64,
    };
    // The tensors tile the data section inside the file (checked by the reader), so these
    // sums stay below the file's size.
    for t in &header.tensors {
        let by_type = info.bytes_by_type.entry(t.ty.name.to_string()).or_default();
        *by_type = by_type.saturating_add(t.bytes);
        if let Some(rest) = t.name.strip_prefix("blk.") {
            let i: usize = rest
                .split('.')
                .next()
                .and_then(|s| s.parse().ok())
                .filter(|i| *i < MAX_LAYERS)
                .ok_or_else(|| {
                    r.err(format!(
                        "tensor {:?}: the layer index is not a number below {MAX_LAYERS}",
                        t.name
                    ))
                })?;
            if info.layer_bytes.len() <= i {
                info.layer_bytes.resize(i + 1, 0);
            }
            info.layer_bytes[i] = info.layer_bytes[i].saturating_add(t.bytes);
        } else if t.name.starts_with("output") {
            info.output_bytes = info.output_bytes.saturating_add(t.bytes);
        } else {
            info.other_bytes = info.other_bytes.saturating_add(t.bytes);
        }
    }
    Ok(info)
}

impl Info {
    fn num(&self, key: &str) -> Option<u64> {
        let v = self.meta.get(&format!("{}.{key}", self.arch))?;
        v.as_u64().or_else(|| {
            // Per-layer arrays (head_count_kv in some files): the largest entry.
            v.as_array()
                .and_then(|a| a.iter().filter_map(Value::as_u64).max())
        })
    }

    /// A `config.json` equivalent of the metadata, for the generic reader.
    pub fn config_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<u64>| {
            if let Some(v) = v {
                m.insert(k.into(), json!(v));
            }
        };
        put("hidden_size", self.num("embedding_length"));
        put("num_hidden_layers", self.num("block_count"));
        put("num_attention_heads", self.num("attention.head_count"));
        put("num_key_value_heads", self.num("attention.head_count_kv"));
        put("head_dim", self.num("attention.key_length"));
        put("intermediate_size", self.num("feed_forward_length"));
        put("max_position_embeddings", self.num("context_length"));
        put("sliding_window", self.num("attention.sliding_window"));
        let vocab = self.num("vocab_size").or_else(|| {
            self.meta.get("tokenizer.ggml.tokens").and_then(|v| {
                v.get("len")
                    .and_then(Value::as_u64)
                    .or_else(|| v.as_array().map(|a| a.len() as u64))
            })
        });
        put("vocab_size", vocab);
        m.insert(
            "architectures".into(),
            json!([format!("gguf:{}", self.arch)]),
        );
        m.insert("model_type".into(), json!(self.arch));
        m.insert("torch_dtype".into(), json!("float16"));
        Value::Object(m)
    }
}

/// Load a GGUF file as a model: config from the metadata, exact weights from the tensors.
pub fn load(path: &Path) -> Result<Model> {
    let info = read(path)?;
    let config = ModelConfig::from_value(&info.config_json())
        .map_err(|e| Error::file(path.display().to_string(), format!("metadata: {e}")))?;
    let checkpoint = Summary {
        bytes_by_dtype: info
            .bytes_by_type
            .iter()
            .map(|(k, v)| (format!("GGUF_{k}"), *v))
            .collect(),
        replicated_bytes: 0,
        tensors: info.tensors,
    };
    let name = path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    Ok(Model {
        name,
        source: Source::Gguf(PathBuf::from(path)),
        config,
        checkpoint: Some(checkpoint),
    })
}

#[cfg(test)]
mod tests;
