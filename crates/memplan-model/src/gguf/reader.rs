//! The bounded GGUF reader: a file's header (metadata and tensor infos) read into memory in
//! growing chunks, never past [`MAX_HEADER`] bytes or the end of the file, and checked as
//! llama.cpp's loader checks it (`gguf_init_from_reader` in `ggml/src/gguf.cpp`, and the
//! file-bounds check of `llama_tensor_weight` in `src/llama-model-loader.h`; ggml-org/llama.cpp
//! at 067d44f6):
//!
//! - magic `GGUF`, version 2 or 3;
//! - every metadata key non-empty and given once; no array of arrays; a string or array no
//!   longer than what is left of the file;
//! - `general.alignment`, when present, a `u32` that is a power of two (default 32);
//! - every tensor name shorter than 64 bytes (`GGML_MAX_NAME`) and given once; at most 4
//!   dimensions (`GGML_MAX_DIMS`), each below 2^63, their product too; a known ggml type whose
//!   block size divides the first dimension;
//! - tensors tile the data section in order: each offset is the previous tensor's end padded
//!   to the alignment (so offsets are aligned, and tensors neither overlap nor leave gaps);
//! - the data section starts at the header's end padded to the alignment, and every tensor's
//!   data lies within the file (a truncated download is refused, as llama.cpp refuses it).
//!
//! Arrays are read in one slice per array (numbers) or one pass over length-prefixed strings,
//! so the time is linear in the header's bytes; only the first [`KEEP`] elements of a numeric
//! array are kept as values.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use memplan_core::{Error, Result};
use serde_json::{json, Value};

use super::types::{ggml_type, GgmlType};

/// The most metadata + tensor-info bytes read. Real headers: a 262k-token vocabulary with its
/// scores, types and merges is about 15 MiB; 64 MiB keeps the read, and the time to walk it,
/// small (well under a second).
pub const MAX_HEADER: u64 = 64 << 20;
/// Elements of a numeric array kept as values (per-layer head counts); longer arrays keep
/// their length only.
pub const KEEP: u64 = 4096;
/// Most tensors and metadata keys of one file.
pub const MAX_TENSORS: u64 = 1 << 20;
/// See [`MAX_TENSORS`].
pub const MAX_KEYS: u64 = 1 << 16;
/// llama.cpp's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// llama.cpp's `GGML_MAX_NAME`: a tensor name is shorter.
pub const MAX_NAME: u64 = 64;
/// llama.cpp's `GGUF_DEFAULT_ALIGNMENT`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// First chunk read; the buffer doubles as the header needs.
const CHUNK: u64 = 1 << 20;

/// One tensor's info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// Its ggml type.
    pub ty: GgmlType,
    /// Its bytes.
    pub bytes: u64,
}

/// A file's header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Metadata: numbers, strings, short numeric arrays; other arrays as `{"len": n}`.
    pub meta: BTreeMap<String, Value>,
    /// Tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
}

/// The reader of a file (or of bytes in memory): the header bytes read so far and the
/// position in them.
pub struct Reader<R: Read> {
    file: R,
    buf: Vec<u8>,
    pos: usize,
    size: u64,
    path: String,
}

impl<R: Read> Reader<R> {
    /// A reader of `file` (`size` bytes), named `path` in errors.
    pub fn new(file: R, size: u64, path: String) -> Self {
        Reader {
            file,
            buf: Vec::new(),
            pos: 0,
            size,
            path,
        }
    }

    /// An error at the current position.
    pub fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::file(
            self.path.clone(),
            format!("GGUF at byte {}: {msg}", self.pos),
        )
    }

    fn take(&mut self, n: u64) -> Result<&[u8]> {
        let end = (self.pos as u64).checked_add(n).filter(|e| *e <= self.size);
        let Some(end) = end else {
            return Err(self.err(format!(
                "{n} bytes run past the end of the file ({} bytes)",
                self.size
            )));
        };
        if end > MAX_HEADER {
            return Err(self.err(format!(
                "metadata and tensor infos run past {MAX_HEADER} bytes (memplan's cap; real headers take a few MiB)"
            )));
        }
        while (self.buf.len() as u64) < end {
            let have = self.buf.len() as u64;
            let want = end
                .max(have.saturating_mul(2))
                .max(CHUNK)
                .min(self.size)
                .min(MAX_HEADER);
            let got = (&mut self.file)
                .take(want - have)
                .read_to_end(&mut self.buf)
                .map_err(|e| self.err(e))?;
            if got == 0 {
                return Err(self.err("the file ended early (it shrank while it was read)"));
            }
        }
        let start = self.pos;
        self.pos = end as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    /// One scalar of GGUF type `t` (0..=12 except 9, the array type).
    fn scalar(&mut self, t: u32) -> Result<Value> {
        Ok(match t {
            0 => json!(self.array::<1>()?[0]),
            1 => json!(self.array::<1>()?[0] as i8),
            2 => json!(u16::from_le_bytes(self.array()?)),
            3 => json!(i16::from_le_bytes(self.array()?)),
            4 => json!(self.u32()?),
            5 => json!(self.u32()? as i32),
            6 => json!(f32::from_bits(self.u32()?)),
            7 => json!(self.array::<1>()?[0] != 0),
            8 => json!(self.string()?),
            10 => json!(self.u64()?),
            11 => json!(self.u64()? as i64),
            12 => json!(f64::from_bits(self.u64()?)),
            other => return Err(self.err(format!("unknown value type {other}"))),
        })
    }

    /// An array: element type, count, elements. Numbers are taken as one slice (the first
    /// [`KEEP`] decoded); strings are walked once, not kept.
    fn array_value(&mut self, key: &str) -> Result<Value> {
        let et = self.u32()?;
        let n = self.u64()?;
        let width = match et {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => {
                let left = self.size.saturating_sub(self.pos as u64);
                // Each string takes at least its 8-byte length.
                if n > left / 8 {
                    return Err(self.err(format!(
                        "{key}: an array of {n} strings is longer than the rest of the file"
                    )));
                }
                for _ in 0..n {
                    let len = self.u64()?;
                    self.take(len)?;
                }
                return Ok(json!({ "len": n }));
            }
            9 => return Err(self.err(format!("{key}: an array of arrays (llama.cpp refuses it)"))),
            other => return Err(self.err(format!("{key}: unknown array element type {other}"))),
        };
        let bytes = n
            .checked_mul(width)
            .filter(|b| *b <= self.size.saturating_sub(self.pos as u64))
            .ok_or_else(|| {
                self.err(format!(
                    "{key}: an array of {n} elements is longer than the rest of the file"
                ))
            })?;
        let start = self.pos;
        self.take(bytes)?;
        if n > KEEP {
            return Ok(json!({ "len": n }));
        }
        // Decode the kept elements from the slice just taken.
        let end = self.pos;
        self.pos = start;
        let mut keep = Vec::with_capacity(n as usize);
        for _ in 0..n {
            keep.push(self.scalar(et)?);
        }
        debug_assert_eq!(self.pos, end);
        Ok(Value::Array(keep))
    }

    /// The whole header, checked (see the module docs). Returns it and the offset where the
    /// data section starts.
    pub fn header(&mut self) -> Result<(Header, u64)> {
        if self.take(4)? != b"GGUF" {
            self.pos = 0;
            return Err(self.err("not a GGUF file (no GGUF magic)"));
        }
        let version = self.u32()?;
        if !(2..=3).contains(&version) {
            return Err(self.err(format!(
                "GGUF version {version} (llama.cpp and memplan read 2 and 3)"
            )));
        }
        let tensors = self.u64()?;
        let kvs = self.u64()?;
        if tensors > MAX_TENSORS || kvs > MAX_KEYS {
            return Err(self.err(format!(
                "{tensors} tensors / {kvs} metadata keys is not plausible (at most {MAX_TENSORS} / {MAX_KEYS})"
            )));
        }
        let mut meta = BTreeMap::new();
        for _ in 0..kvs {
            let k = self.string()?;
            if k.is_empty() {
                return Err(self.err("a metadata key is empty (llama.cpp refuses it)"));
            }
            if meta.contains_key(&k) {
                return Err(self.err(format!(
                    "metadata key {k:?} is given twice (llama.cpp refuses duplicate keys)"
                )));
            }
            let t = self.u32()?;
            let v = match t {
                9 => self.array_value(&k)?,
                t => self.scalar(t)?,
            };
            if k == "general.alignment" && t != 4 {
                return Err(self.err(format!(
                    "general.alignment must be a u32 (GGUF type 4), found type {t}"
                )));
            }
            meta.insert(k, v);
        }
        let alignment = match meta.get("general.alignment").and_then(Value::as_u64) {
            None => DEFAULT_ALIGNMENT,
            Some(a) if a.is_power_of_two() => a,
            Some(a) => {
                return Err(self.err(format!(
                    "general.alignment = {a} is not a power of two (llama.cpp refuses it)"
                )))
            }
        };
        let mut infos = Vec::with_capacity(tensors.min(4096) as usize);
        let mut names = BTreeSet::new();
        let mut next = 0u64; // where the next tensor must start
        let mut end = 0u64; // the end of the last tensor's data
        for _ in 0..tensors {
            let (info, offset) = self.tensor_info()?;
            if !names.insert(info.name.clone()) {
                return Err(self.err(format!(
                    "tensor {:?} is given twice (llama.cpp refuses duplicate names)",
                    info.name
                )));
            }
            if offset != next {
                return Err(self.err(format!(
                    "tensor {:?} starts at data offset {offset}, but must start at {next} (the previous tensor's end padded to the {alignment}-byte alignment): tensors are misaligned, overlap or leave gaps",
                    info.name
                )));
            }
            end = offset
                .checked_add(info.bytes)
                .and_then(|e| pad(e, alignment).map(|n| (e, n)))
                .map(|(e, n)| {
                    next = n;
                    e
                })
                .ok_or_else(|| self.err("tensor sizes overflow 64 bits"))?;
            infos.push(info);
        }
        if tensors == 0 {
            return Err(self.err("the file holds no tensors (no weights to plan)"));
        }
        let data = pad(self.pos as u64, alignment)
            .ok_or_else(|| self.err("the data section's offset overflows"))?;
        let need = data.checked_add(end);
        if need.is_none_or(|n| n > self.size) {
            let last = infos.last().map_or("", |t| t.name.as_str());
            return Err(self.err(format!(
                "tensor data runs past the end of the file: the tensors end at byte {} but the file has {} (tensor {last:?} is not within the file: truncated or incomplete?)",
                need.map_or_else(|| "2^64+".to_string(), |n| n.to_string()),
                self.size
            )));
        }
        Ok((
            Header {
                meta,
                tensors: infos,
            },
            data,
        ))
    }

    fn tensor_info(&mut self) -> Result<(TensorInfo, u64)> {
        let name = self.string()?;
        if name.len() as u64 >= MAX_NAME {
            let shown: String = name.chars().take(80).collect();
            return Err(self.err(format!(
                "tensor name {shown:?} is {} bytes; llama.cpp takes fewer than {MAX_NAME}",
                name.len()
            )));
        }
        let dims = self.u32()?;
        if dims > MAX_DIMS {
            return Err(self.err(format!(
                "tensor {name:?} has {dims} dimensions (at most {MAX_DIMS})"
            )));
        }
        let mut ne = [1u64; MAX_DIMS as usize];
        let mut elements: u64 = 1;
        for d in ne.iter_mut().take(dims as usize) {
            *d = self.u64()?;
            elements = elements
                .checked_mul(*d)
                .filter(|e| *e <= i64::MAX as u64)
                .ok_or_else(|| self.err(format!("tensor {name:?}: its element count overflows")))?;
        }
        let t = self.u32()?;
        let ty = ggml_type(t)
            .ok_or_else(|| self.err(format!("tensor {name:?} has unknown ggml type {t}")))?;
        if ne[0] % ty.block != 0 {
            return Err(self.err(format!(
                "tensor {name:?} of type {}: {} elements per row is not a multiple of the block size {}",
                ty.name, ne[0], ty.block
            )));
        }
        let bytes = (elements / ty.block)
            .checked_mul(ty.block_bytes)
            .filter(|b| *b <= self.size)
            .ok_or_else(|| self.err(format!("tensor {name:?} is larger than the file")))?;
        let offset = self.u64()?;
        Ok((TensorInfo { name, ty, bytes }, offset))
    }
}

/// `n` rounded up to a multiple of `align` (a power of two), `None` on overflow.
pub fn pad(n: u64, align: u64) -> Option<u64> {
    n.checked_add(align - 1).map(|m| m & !(align - 1))
}
