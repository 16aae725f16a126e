//! One safetensors header: the JSON after the 8-byte length, checked entry by entry.

use memplan_core::{Error, Result};
use serde_json::Value;

use super::{Summary, MAX_HEADER};

/// Bits per element of a safetensors dtype (the reference implementation's `Dtype::bitsize`).
fn dtype_bits(d: &str) -> Option<u64> {
    Some(match d {
        "F64" | "I64" | "U64" | "C64" => 64,
        "F32" | "I32" | "U32" => 32,
        "F16" | "BF16" | "I16" | "U16" => 16,
        "F8_E4M3" | "F8_E5M2" | "F8_E8M0" | "I8" | "U8" | "BOOL" => 8,
        "F6_E2M3" | "F6_E3M2" => 6,
        "F4" => 4,
        _ => return None,
    })
}

/// The header's top-level entries in file order, duplicates kept (a `serde_json::Map` would
/// silently keep only the last of two entries with the same name).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = m.next_entry::<String, Value>()? {
                    out.push(e);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A parsed header: the summary and the tensor names, in file order.
pub(crate) struct Header {
    /// Bytes per dtype and the rest.
    pub(crate) summary: Summary,
    /// Every tensor's name (`__metadata__` excluded).
    pub(crate) names: Vec<String>,
}

/// Parse a header's JSON text.
pub fn parse_header(name: &str, json: &[u8]) -> Result<Summary> {
    parse(name, json).map(|h| h.summary)
}

/// [`parse_header`], keeping the tensor names.
pub(crate) fn parse(name: &str, json: &[u8]) -> Result<Header> {
    let bad = |m: String| Error::file(name, m);
    let Entries(entries) = serde_json::from_slice(json).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => bad("safetensors header is not a JSON object".into()),
        _ => bad(format!("safetensors header is not JSON: {e}")),
    })?;
    let mut s = Summary::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut ranges: Vec<Range<'_>> = Vec::with_capacity(entries.len());
    for (tensor, info) in &entries {
        if !seen.insert(tensor.as_str()) {
            return Err(bad(format!(
                "tensor {tensor:?} appears twice in the header"
            )));
        }
        if tensor == "__metadata__" {
            continue;
        }
        let what = |m: &str| bad(format!("tensor {tensor:?}: {m}"));
        let dtype = info
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| what("no dtype"))?;
        let bits = dtype_bits(dtype).ok_or_else(|| what(&format!("unknown dtype {dtype:?}")))?;
        let offs = info
            .get("data_offsets")
            .and_then(Value::as_array)
            .ok_or_else(|| what("no data_offsets"))?;
        let (Some(a), Some(b), 2) = (
            offs.first().and_then(Value::as_u64),
            offs.get(1).and_then(Value::as_u64),
            offs.len(),
        ) else {
            return Err(what("data_offsets must be two integers"));
        };
        let len = b
            .checked_sub(a)
            .ok_or_else(|| what("data_offsets end before they start"))?;
        let shape = info
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| what("no shape"))?;
        let mut elems: u64 = 1;
        for d in shape {
            let d = d
                .as_u64()
                .ok_or_else(|| what("shape entries must be integers"))?;
            elems = elems
                .checked_mul(d)
                .ok_or_else(|| what("shape overflows 64 bits"))?;
        }
        let nbits = elems
            .checked_mul(bits)
            .ok_or_else(|| what("size overflows 64 bits"))?;
        if nbits % 8 != 0 {
            return Err(what(&format!(
                "{elems} elements of {bits} bits are not a whole number of bytes"
            )));
        }
        let expect = nbits / 8;
        if expect != len {
            return Err(what(&format!(
                "shape needs {expect} bytes but data_offsets span {len}"
            )));
        }
        let replicated = shape.len() <= 1 && (tensor.contains("norm") || tensor.contains("scale"))
            || tensor.contains("router")
            || tensor.ends_with(".gate.weight");
        ranges.push(Range {
            start: a,
            end: b,
            tensor,
            dtype,
            replicated,
        });
    }
    // Sorted by range, every tensor starts where the previous one ended, the first at 0. Only
    // then are the lengths summed: they add up to the end of the last range, within u64.
    ranges.sort_unstable_by_key(|r| (r.start, r.end));
    let mut end = 0u64;
    for r in &ranges {
        if r.start != end {
            return Err(bad(format!(
                "tensor {:?}: data_offsets start at {} but the previous tensor ends at {end} (tensor data must follow without gaps or overlaps)",
                r.tensor, r.start
            )));
        }
        end = r.end;
    }
    let names = ranges.iter().map(|r| r.tensor.to_string()).collect();
    for r in ranges {
        let len = r.end - r.start;
        *s.bytes_by_dtype.entry(r.dtype.to_string()).or_default() += len;
        if r.replicated {
            s.replicated_bytes += len;
        }
        s.tensors += 1;
    }
    Ok(Header { summary: s, names })
}

/// One tensor's byte range, for the tiling check.
struct Range<'a> {
    start: u64,
    end: u64,
    tensor: &'a str,
    dtype: &'a str,
    replicated: bool,
}

/// Parse a header from the first bytes of a file (8-byte length, then the JSON), with the
/// same header checks as [`read_file`](super::read_file); bytes after the header are ignored
/// (this reader does not know the file's size).
pub fn parse_prefixed(name: &str, bytes: &[u8]) -> Result<Summary> {
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(short_file(name, bytes.len() as u64));
    };
    let n = header_len(name, *len, rest.len() as u64)?;
    parse_header(name, &rest[..n as usize])
}

/// The error for a file too short to hold the 8-byte header length.
pub(crate) fn short_file(name: &str, len: u64) -> Error {
    let what = if len == 0 {
        "is empty".to_string()
    } else {
        format!("is {len} bytes")
    };
    Error::file(
        name,
        format!("{what}: too short for a safetensors file (8-byte header length, header, tensors); an incomplete download?"),
    )
}

/// The header length from its 8 bytes, checked against the format's limit and against the
/// `available` bytes that follow it.
pub(crate) fn header_len(name: &str, len: [u8; 8], available: u64) -> Result<u64> {
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(Error::file(
            name,
            format!("safetensors header of {n} bytes exceeds the format's {MAX_HEADER}-byte limit (not a safetensors file?)"),
        ));
    }
    if n > available {
        return Err(Error::file(
            name,
            format!("the file ends inside its safetensors header ({available} of {n} bytes); an incomplete download?"),
        ));
    }
    Ok(n)
}
