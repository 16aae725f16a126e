//! A minimal GGUF writer: metadata, tensor infos laid out as llama.cpp requires (each offset
//! the previous tensor's end padded to the alignment), zero-filled data. For tests, fuzz seeds
//! and hostile-input generators; nothing in a plan writes GGUF.

use super::reader::{pad, DEFAULT_ALIGNMENT};

/// A GGUF file under construction.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    meta: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32)>,
    alignment: Option<u32>,
    offsets: Option<Vec<u64>>,
    version: Option<u32>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Builder {
    /// A file whose `general.architecture` is `arch`.
    pub fn new(arch: &str) -> Self {
        Builder::default().string("general.architecture", arch)
    }

    /// A metadata entry of GGUF type `t` whose value is `payload`, as written (for entries
    /// the typed methods cannot express, hostile ones included).
    pub fn raw(mut self, key: &str, t: u32, payload: Vec<u8>) -> Self {
        self.meta.push((key.to_string(), t, payload));
        self
    }

    /// A `u32` entry.
    pub fn u32(self, key: &str, v: u32) -> Self {
        self.raw(key, 4, v.to_le_bytes().to_vec())
    }

    /// A `u64` entry.
    pub fn u64(self, key: &str, v: u64) -> Self {
        self.raw(key, 10, v.to_le_bytes().to_vec())
    }

    /// A string entry.
    pub fn string(self, key: &str, v: &str) -> Self {
        let mut p = Vec::new();
        string(&mut p, v);
        self.raw(key, 8, p)
    }

    /// An array of `u32`.
    pub fn u32s(self, key: &str, v: &[u32]) -> Self {
        let mut p = 4u32.to_le_bytes().to_vec();
        p.extend((v.len() as u64).to_le_bytes());
        for x in v {
            p.extend(x.to_le_bytes());
        }
        self.raw(key, 9, p)
    }

    /// An array of strings.
    pub fn strings<S: AsRef<str>>(self, key: &str, v: &[S]) -> Self {
        let mut p = 8u32.to_le_bytes().to_vec();
        p.extend((v.len() as u64).to_le_bytes());
        for x in v {
            string(&mut p, x.as_ref());
        }
        self.raw(key, 9, p)
    }

    /// `general.alignment` (a `u32`), and the layout follows it.
    pub fn alignment(mut self, a: u32) -> Self {
        self.alignment = Some(a);
        self.u32("general.alignment", a)
    }

    /// The GGUF version written (default 3).
    pub fn version(mut self, v: u32) -> Self {
        self.version = Some(v);
        self
    }

    /// A tensor of ggml type `t` and shape `dims` (innermost first).
    pub fn tensor(mut self, name: &str, dims: &[u64], t: u32) -> Self {
        self.tensors.push((name.to_string(), dims.to_vec(), t));
        self
    }

    /// Write these data offsets instead of the laid-out ones (hostile files).
    pub fn offsets(mut self, offsets: Vec<u64>) -> Self {
        self.offsets = Some(offsets);
        self
    }

    /// The file: header, padding to the alignment, every tensor's data (zeros), each padded
    /// (as laid out, whatever [`Builder::offsets`] says). Tensors of unknown types take 0
    /// bytes of data.
    pub fn bytes(&self) -> Vec<u8> {
        let align = u64::from(self.alignment.unwrap_or(DEFAULT_ALIGNMENT as u32)).max(1);
        let pad_to = |n: u64| {
            if align.is_power_of_two() {
                pad(n, align).unwrap_or(n)
            } else {
                n
            }
        };
        let mut o = b"GGUF".to_vec();
        o.extend(self.version.unwrap_or(3).to_le_bytes());
        o.extend((self.tensors.len() as u64).to_le_bytes());
        o.extend((self.meta.len() as u64).to_le_bytes());
        for (k, t, p) in &self.meta {
            string(&mut o, k);
            o.extend(t.to_le_bytes());
            o.extend(p);
        }
        // Where each tensor goes when laid out; the data written is that long even when
        // `offsets` makes the header lie about where tensors are.
        let mut next = 0u64;
        let mut end = 0u64;
        for (i, (name, dims, t)) in self.tensors.iter().enumerate() {
            string(&mut o, name);
            o.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                o.extend(d.to_le_bytes());
            }
            o.extend(t.to_le_bytes());
            let bytes = super::types::ggml_type(*t).map_or(0, |ty| {
                dims.iter()
                    .try_fold(1u64, |a, d| a.checked_mul(*d))
                    .map_or(0, |n| n / ty.block * ty.block_bytes)
            });
            let offset = self
                .offsets
                .as_ref()
                .and_then(|v| v.get(i).copied())
                .unwrap_or(next);
            o.extend(offset.to_le_bytes());
            end = next.saturating_add(bytes);
            next = pad_to(end);
        }
        let data = pad_to(o.len() as u64);
        // Zero data up to the last tensor's end (bounded: builders describe small files).
        let len = data.saturating_add(end).min(1 << 30);
        o.resize(len as usize, 0);
        o
    }
}
