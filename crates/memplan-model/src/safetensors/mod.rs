//! Safetensors header reader: exact checkpoint bytes per dtype, reading only the header (an
//! 8-byte little-endian length, then that many bytes of JSON), never the tensors.
//!
//! Every tensor entry is checked as the reference implementation checks it (this module's
//! `header.rs`): a known dtype, a shape whose element count times the dtype's bit size is a whole
//! number of bytes equal to its byte range (sub-byte dtypes included), a tensor name that appears
//! once, and byte ranges that tile the data section from 0 without gaps or overlaps (so the sum of
//! the ranges is the end of the last one and cannot overflow). Headers above 100 MiB are refused
//! (the format's own limit).
//!
//! A checkpoint on disk must also account for its bytes (this module's `files.rs`): each file is a
//! regular file exactly `8 + header + tensors` bytes long (a truncated download is an error naming
//! the file), an index names only files inside the model directory (checked before any is opened),
//! a tensor appears in one file only, and the checkpoint holds at least one tensor. Counts are
//! capped: [`MAX_SHARDS`] files, [`MAX_TENSORS`] tensors.
//!
//! Cost grows linearly with the tensors (a DeepSeek-V3-sized checkpoint has about 92,000):
//! each header and the index are read in one pass without a value tree, names borrowed from
//! the bytes read (headers in the form writers produce through a strict fast path, anything
//! else through serde_json), one hash per name for the cross-file check, the only sort being
//! of each header's byte ranges when they are out of order. Headers of many shards are read
//! on several threads, while a large index is parsed. `cargo run --release -p memplan-model
//! --example plan_bench` measures it.

use std::collections::BTreeMap;

mod fast;
mod files;
mod header;

pub use files::{read_dir, read_dir_within, read_file, INDEX, MAX_SHARDS, MAX_TENSORS};
pub use header::{parse_header, parse_prefixed};

/// Largest header accepted (the safetensors reference implementation's limit).
pub const MAX_HEADER: u64 = 100 * 1024 * 1024;

/// What a set of safetensors headers say about the weights.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// Bytes per dtype name (`BF16`, `F8_E4M3`, ...).
    pub bytes_by_dtype: BTreeMap<String, u64>,
    /// Bytes of tensors every rank keeps whole (norms, biases of norms, routers, scales).
    pub replicated_bytes: u64,
    /// Number of tensors.
    pub tensors: u64,
}

impl Summary {
    /// All bytes.
    pub fn total(&self) -> u64 {
        self.bytes_by_dtype.values().sum()
    }

    /// Bytes one of `tp` ranks loads: replicated tensors whole, the rest split.
    pub fn per_rank(&self, tp: u64) -> u64 {
        let split = self.total() - self.replicated_bytes;
        self.replicated_bytes + split.div_ceil(tp.max(1))
    }

    /// [`Summary::per_rank`] with the checkpoint's floating-point tensors at the dtype the
    /// engine loads them in (`dtype_bytes` per element): a float32 checkpoint served in
    /// bfloat16 takes half its file size, a bfloat16 one served in float32 twice. In a
    /// `quantized` checkpoint the float32 tensors are scales the engine keeps as they are, so
    /// only 16-bit tensors are converted.
    pub fn per_rank_as(&self, tp: u64, dtype_bytes: u64, quantized: bool) -> u64 {
        let total = self.total();
        if total == 0 {
            return 0;
        }
        let as_loaded: u128 = self
            .bytes_by_dtype
            .iter()
            .map(|(d, &b)| {
                let b = u128::from(b);
                match d.as_str() {
                    "F16" | "BF16" => b * u128::from(dtype_bytes) / 2,
                    "F32" if !quantized => b * u128::from(dtype_bytes) / 4,
                    _ => b,
                }
            })
            .sum();
        // Scale the per-rank figure by the same ratio (replicated tensors are floats too).
        let scaled = u128::from(self.per_rank(tp)) * as_loaded / u128::from(total);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// Add another file's summary; `None` when the sums would overflow 64 bits.
    pub(crate) fn merge(&mut self, other: Summary) -> Option<()> {
        self.total().checked_add(other.total())?;
        for (k, v) in other.bytes_by_dtype {
            *self.bytes_by_dtype.entry(k).or_default() += v;
        }
        self.replicated_bytes += other.replicated_bytes;
        self.tensors += other.tensors;
        Some(())
    }
}

#[cfg(test)]
mod tests;
