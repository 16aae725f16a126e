//! GGUF files (llama.cpp): the metadata gives the architecture, the tensor infos give the
//! exact weight bytes (per layer, so a partial offload can be sized), and [`fit`] answers the
//! llama.cpp question: which `-c` and how many GPU layers (`-ngl`) fit.
//!
//! A small bounded reader (no GGUF crate on crates.io reads tensor infos without pulling in
//! a tensor library): every count and length is checked against what is left of the file
//! and against fixed caps before anything is allocated, so a corrupt or hostile file is an
//! error naming the offset, never a huge allocation or a panic.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use memplan_core::{Error, Result};
use serde_json::{json, Map, Value};

use crate::{safetensors::Summary, Model, ModelConfig, Source};

/// The most metadata + tensor-info bytes read (vocabularies of 250k tokens are ~10 MiB).
const MAX_HEADER: u64 = 256 << 20;

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

struct Reader<R: Read> {
    r: R,
    pos: u64,
    size: u64,
    path: String,
}

impl<R: Read> Reader<R> {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::file(
            self.path.clone(),
            format!("GGUF at byte {}: {msg}", self.pos),
        )
    }
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>> {
        if n > self.size.saturating_sub(self.pos) || self.pos + n > MAX_HEADER {
            return Err(self.err(format!(
                "{n} bytes run past the file or the {MAX_HEADER}-byte header cap"
            )));
        }
        let mut b = vec![0; n as usize];
        self.r.read_exact(&mut b).map_err(|e| self.err(e))?;
        self.pos += n;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        let b = self.bytes(n)?;
        String::from_utf8(b).map_err(|_| self.err("a string is not UTF-8"))
    }
    /// One value of GGUF type `t`; arrays become their length (`{"len": n}`) unless short.
    fn value(&mut self, t: u32, depth: u32) -> Result<Value> {
        Ok(match t {
            0 => json!(self.bytes(1)?[0]),
            1 => json!(self.bytes(1)?[0] as i8),
            2 => json!(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2"))),
            3 => json!(i16::from_le_bytes(self.bytes(2)?.try_into().expect("2"))),
            4 => json!(self.u32()?),
            5 => json!(self.u32()? as i32),
            6 => json!(f32::from_bits(self.u32()?)),
            7 => json!(self.bytes(1)?[0] != 0),
            8 => json!(self.string()?),
            9 if depth == 0 => {
                let et = self.u32()?;
                let n = self.u64()?;
                // Every element takes at least one byte: the count is bounded by the file.
                if n > self.size.saturating_sub(self.pos) {
                    return Err(self.err(format!("array of {n} elements is longer than the file")));
                }
                let mut keep = Vec::new();
                for i in 0..n {
                    let v = self.value(et, 1)?;
                    if i < 4096 && et != 8 {
                        keep.push(v);
                    }
                }
                if keep.len() as u64 == n {
                    Value::Array(keep)
                } else {
                    json!({ "len": n })
                }
            }
            10 => json!(self.u64()?),
            11 => json!(self.u64()? as i64),
            12 => json!(f64::from_bits(self.u64()?)),
            other => return Err(self.err(format!("unknown value type {other}"))),
        })
    }
}

/// (bytes per block, elements per block) of a ggml type, and its name.
fn ggml_type(t: u32) -> Option<(u64, u64, &'static str)> {
    Some(match t {
        0 => (4, 1, "F32"),
        1 => (2, 1, "F16"),
        2 => (18, 32, "Q4_0"),
        3 => (20, 32, "Q4_1"),
        6 => (22, 32, "Q5_0"),
        7 => (24, 32, "Q5_1"),
        8 => (34, 32, "Q8_0"),
        9 => (36, 32, "Q8_1"),
        10 => (84, 256, "Q2_K"),
        11 => (110, 256, "Q3_K"),
        12 => (144, 256, "Q4_K"),
        13 => (176, 256, "Q5_K"),
        14 => (210, 256, "Q6_K"),
        15 => (292, 256, "Q8_K"),
        16 => (66, 256, "IQ2_XXS"),
        17 => (74, 256, "IQ2_XS"),
        18 => (98, 256, "IQ3_XXS"),
        19 => (50, 256, "IQ1_S"),
        20 => (18, 32, "IQ4_NL"),
        21 => (110, 256, "IQ3_S"),
        22 => (82, 256, "IQ2_S"),
        23 => (136, 256, "IQ4_XS"),
        24 => (1, 1, "I8"),
        25 => (2, 1, "I16"),
        26 => (4, 1, "I32"),
        27 => (8, 1, "I64"),
        28 => (8, 1, "F64"),
        29 => (56, 256, "IQ1_M"),
        30 => (2, 1, "BF16"),
        34 => (54, 256, "TQ1_0"),
        35 => (66, 256, "TQ2_0"),
        39 => (17, 32, "MXFP4"),
        _ => return None,
    })
}

/// Read a GGUF file's metadata and tensor infos (never the tensor data).
pub fn read(path: &Path) -> Result<Info> {
    let (file, size) = memplan_core::input::open_regular(path, "GGUF file")?;
    let mut r = Reader {
        r: BufReader::new(file),
        pos: 0,
        size,
        path: path.display().to_string(),
    };
    if r.bytes(4)? != b"GGUF" {
        return Err(r.err("not a GGUF file (no GGUF magic)"));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(r.err(format!("GGUF version {version} (memplan reads 2 and 3)")));
    }
    let tensors = r.u64()?;
    let kvs = r.u64()?;
    if tensors > 1 << 20 || kvs > 1 << 16 {
        return Err(r.err(format!(
            "{tensors} tensors / {kvs} metadata keys is not plausible"
        )));
    }
    let mut meta = BTreeMap::new();
    for _ in 0..kvs {
        let k = r.string()?;
        let t = r.u32()?;
        let v = r.value(t, 0)?;
        meta.insert(k, v);
    }
    let arch = meta
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| r.err("no general.architecture"))?
        .to_string();
    let mut info = Info {
        arch,
        meta,
        layer_bytes: Vec::new(),
        output_bytes: 0,
        other_bytes: 0,
        bytes_by_type: BTreeMap::new(),
        tensors,
    };
    for _ in 0..tensors {
        let name = r.string()?;
        let dims = r.u32()?;
        if dims > 8 {
            return Err(r.err(format!("tensor {name} has {dims} dimensions")));
        }
        let mut n: u64 = 1;
        for _ in 0..dims {
            n = n
                .checked_mul(r.u64()?)
                .ok_or_else(|| r.err(format!("tensor {name}'s element count overflows")))?;
        }
        let t = r.u32()?;
        let _offset = r.u64()?;
        let (bb, be, tn) = ggml_type(t)
            .ok_or_else(|| r.err(format!("tensor {name} has unknown ggml type {t}")))?;
        let bytes = n
            .div_ceil(be)
            .checked_mul(bb)
            .filter(|b| *b <= size)
            .ok_or_else(|| r.err(format!("tensor {name} is larger than the file")))?;
        *info.bytes_by_type.entry(tn.to_string()).or_default() += bytes;
        if let Some(rest) = name.strip_prefix("blk.") {
            let i: usize = rest
                .split('.')
                .next()
                .and_then(|s| s.parse().ok())
                .filter(|i| *i < 4096)
                .ok_or_else(|| r.err(format!("tensor {name}: bad layer index")))?;
            if info.layer_bytes.len() <= i {
                info.layer_bytes.resize(i + 1, 0);
            }
            info.layer_bytes[i] += bytes;
        } else if name.starts_with("output") {
            info.output_bytes += bytes;
        } else {
            info.other_bytes += bytes;
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

/// llama.cpp's KV cache types: bytes per element (`ggml_type_size / ggml_blck_size`) as a
/// fraction (numerator, denominator).
pub fn kv_type_bytes(t: &str) -> Result<(u64, u64)> {
    Ok(match t {
        "f16" => (2, 1),
        "q8_0" => (34, 32),
        "q4_0" => (18, 32),
        other => {
            return Err(Error::invalid(
                "llama.cpp KV cache type",
                format!("{other:?}: llama.cpp KV types are f16, q8_0, q4_0"),
            ))
        }
    })
}

/// A llama.cpp answer: the longest `-c` with every layer on the GPU, else the most layers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Fit {
    /// Layers on the GPU (`-ngl`); `n_layers + 1` means the output head too.
    pub ngl: u64,
    /// Context (`-c`).
    pub ctx: u64,
    /// Bytes on the GPU for weights.
    pub weight_bytes: u64,
    /// Bytes of KV cache on the GPU.
    pub kv_bytes: u64,
}

/// What fits in `budget` GPU bytes for `ctx` tokens (or the longest context with all
/// layers offloaded when it is below `ctx`): KV per layer and token is
/// `kv_heads * (k + v) * bytes(kv_type)`; `overhead` (compute buffers) is subtracted first.
pub fn fit(
    info: &Info,
    c: &ModelConfig,
    budget: u64,
    overhead: u64,
    kv_type: &str,
    ctx: u64,
) -> Result<Fit> {
    let (num, den) = kv_type_bytes(kv_type)?;
    let per_layer_token = (c.num_kv_heads * c.head_dim * 2 * num).div_ceil(den);
    let n = info.layer_bytes.len() as u64;
    let avail = budget.saturating_sub(overhead);
    let need = |ngl: u64, ctx: u64| -> u64 {
        let layers = ngl.min(n);
        let w: u64 = info.layer_bytes.iter().take(layers as usize).sum::<u64>()
            + if ngl > n { info.output_bytes } else { 0 };
        w + layers * per_layer_token * ctx
    };
    let all = n + 1;
    if need(all, ctx) <= avail {
        // Everything fits at the requested context: report the longest context that fits.
        let w = need(all, 0);
        let longest = (avail - w) / (n.max(1) * per_layer_token.max(1));
        let ctx = longest.min(c.derived_max_len.unwrap_or(longest)).max(ctx);
        return Ok(Fit {
            ngl: all,
            ctx,
            weight_bytes: w,
            kv_bytes: need(all, ctx) - w,
        });
    }
    let ngl = (0..=all)
        .rev()
        .find(|g| need(*g, ctx) <= avail)
        .unwrap_or(0);
    let w = need(ngl, 0);
    Ok(Fit {
        ngl,
        ctx,
        weight_bytes: w,
        kv_bytes: need(ngl, ctx) - w,
    })
}

#[cfg(test)]
mod tests;
