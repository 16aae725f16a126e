//! Safetensors header reader: exact checkpoint bytes per dtype, reading only the header (an
//! 8-byte little-endian length, then that many bytes of JSON), never the tensors.
//!
//! Every tensor entry is checked as the reference implementation checks it: a known dtype, a
//! shape whose element count times the dtype's bit size is a whole number of bytes equal to its
//! byte range (sub-byte dtypes included), a tensor name that appears once, and byte ranges that
//! tile the data section from 0 without gaps or overlaps (so the sum of the ranges is the end
//! of the last one and cannot overflow). Headers above 100 MiB are refused (the format's own
//! limit).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use memplan_core::{Error, Result};
use serde_json::Value;

/// Largest header accepted (the safetensors reference implementation's limit).
pub const MAX_HEADER: u64 = 100 * 1024 * 1024;

/// What a set of safetensors headers say about the weights.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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
    fn merge(&mut self, other: Summary) -> Option<()> {
        self.total().checked_add(other.total())?;
        for (k, v) in other.bytes_by_dtype {
            *self.bytes_by_dtype.entry(k).or_default() += v;
        }
        self.replicated_bytes += other.replicated_bytes;
        self.tensors += other.tensors;
        Some(())
    }
}

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

/// Parse a header's JSON text.
pub fn parse_header(name: &str, json: &[u8]) -> Result<Summary> {
    let bad = |m: String| Error::invalid(name, m);
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
    for r in ranges {
        let len = r.end - r.start;
        *s.bytes_by_dtype.entry(r.dtype.to_string()).or_default() += len;
        if r.replicated {
            s.replicated_bytes += len;
        }
        s.tensors += 1;
    }
    Ok(s)
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
/// same checks as [`read_file`]; bytes after the header are ignored.
pub fn parse_prefixed(name: &str, bytes: &[u8]) -> Result<Summary> {
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(Error::invalid(
            name,
            "shorter than the 8-byte safetensors header length",
        ));
    };
    let n = u64::from_le_bytes(*len);
    if n > MAX_HEADER {
        return Err(Error::invalid(
            name,
            format!("safetensors header of {n} bytes exceeds the {MAX_HEADER}-byte limit"),
        ));
    }
    let json = rest.get(..n as usize).ok_or_else(|| {
        Error::invalid(
            name,
            format!(
                "file ends inside the safetensors header ({} of {n} bytes)",
                rest.len()
            ),
        )
    })?;
    parse_header(name, json)
}

/// Read the header of one file, without reading its tensors.
pub fn read_file(path: &Path) -> Result<Summary> {
    let name = path.display().to_string();
    let io = |e| Error::Io {
        path: name.clone(),
        source: e,
    };
    let mut f = File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(io)?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(Error::invalid(
            &name,
            format!("safetensors header of {n} bytes exceeds the {MAX_HEADER}-byte limit"),
        ));
    }
    let mut buf = Vec::with_capacity(n as usize);
    f.take(n).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 != n {
        return Err(Error::invalid(
            &name,
            format!(
                "file ends inside the safetensors header ({} of {n} bytes)",
                buf.len()
            ),
        ));
    }
    parse_header(&name, &buf)
}

/// The index of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// Read every `*.safetensors` header in a directory; `None` when there is none.
///
/// When the directory has a [`INDEX`], only the files its `weight_map` names are read, as
/// engines load them: repositories such as Mistral's ship the same weights twice
/// (`consolidated.safetensors` beside the Hugging Face shards).
pub fn read_dir(dir: &Path) -> Result<Option<Summary>> {
    let io = |e| Error::Io {
        path: dir.display().to_string(),
        source: e,
    };
    let listed = indexed_files(dir)?;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .filter(|p| {
            listed.as_ref().is_none_or(|l| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| l.contains(n))
            })
        })
        .collect();
    if let Some(l) = &listed {
        // A shard the index names but the directory lacks would silently shrink the weights.
        if let Some(missing) = l.iter().find(|n| !dir.join(n).is_file()) {
            return Err(Error::invalid(
                dir.join(INDEX).display().to_string(),
                format!("names {missing:?}, which is not in the directory"),
            ));
        }
    }
    if files.is_empty() {
        return Ok(None);
    }
    files.sort();
    let mut s = Summary::default();
    for f in files {
        s.merge(read_file(&f)?).ok_or_else(|| {
            Error::invalid(
                dir.display().to_string(),
                "safetensors sizes overflow 64 bits",
            )
        })?;
    }
    Ok(Some(s))
}

/// The file names a directory's [`INDEX`] maps tensors to; `None` without an index.
fn indexed_files(dir: &Path) -> Result<Option<std::collections::BTreeSet<String>>> {
    let path = dir.join(INDEX);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::Io {
                path: path.display().to_string(),
                source: e,
            })
        }
    };
    let name = path.display().to_string();
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::invalid(&name, format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::invalid(format!("{name}: weight_map"), "missing or not an object"))?;
    map.values()
        .map(|f| {
            f.as_str().map(str::to_string).ok_or_else(|| {
                Error::invalid(
                    format!("{name}: weight_map"),
                    format!("file names must be strings, found {f}"),
                )
            })
        })
        .collect::<Result<_>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> Vec<u8> {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v
    }

    #[test]
    fn sums_by_dtype() {
        let h = r#"{"__metadata__":{"format":"pt"},
            "a.weight":{"dtype":"BF16","shape":[4,8],"data_offsets":[0,64]},
            "model.norm.weight":{"dtype":"BF16","shape":[8],"data_offsets":[64,80]},
            "b.weight":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[80,96]}}"#;
        let s = parse_header("x", h.as_bytes()).unwrap();
        assert_eq!(s.total(), 96);
        assert_eq!(s.bytes_by_dtype["BF16"], 80);
        assert_eq!(s.replicated_bytes, 16);
        assert_eq!(s.per_rank(2), 16 + 40);
    }

    #[test]
    fn floats_are_counted_at_the_loaded_dtype() {
        let h = r#"{"w":{"dtype":"F32","shape":[4,8],"data_offsets":[0,128]},
            "q":{"dtype":"I8","shape":[16],"data_offsets":[128,144]}}"#;
        let s = parse_header("x", h.as_bytes()).unwrap();
        assert_eq!(s.per_rank_as(1, 4, false), 144);
        // float32 served in bfloat16: half of the F32 bytes; int8 unchanged.
        assert_eq!(s.per_rank_as(1, 2, false), 64 + 16);
        // In a quantized checkpoint float32 tensors are scales, kept as they are.
        assert_eq!(s.per_rank_as(1, 2, true), 144);
        let h = r#"{"w":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]}}"#;
        let s = parse_header("x", h.as_bytes()).unwrap();
        assert_eq!(s.per_rank_as(2, 4, false), 16);
        assert_eq!(Summary::default().per_rank_as(1, 2, false), 0);
    }

    #[test]
    fn rejects_lies() {
        for h in [
            r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,7]}}"#,
            r#"{"a":{"dtype":"Q9","shape":[4],"data_offsets":[0,8]}}"#,
            r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[8,0]}}"#,
            r#"{"a":{"dtype":"BF16","shape":[18446744073709551615,4],"data_offsets":[0,8]}}"#,
            r#"[1,2]"#,
            r#"{"a":{"dtype":"BF16"}}"#,
        ] {
            assert!(
                parse_header("w.safetensors", h.as_bytes())
                    .unwrap_err()
                    .to_string()
                    .contains("w.safetensors"),
                "{h}"
            );
        }
    }

    #[test]
    fn sizes_that_would_overflow_are_an_error_not_a_panic() {
        // Nine U8 tensors of 2^61 - 1 bytes each: every entry is consistent on its own, but
        // their sum overflows 64 bits. They overlap, so the header is invalid.
        let n = (1u64 << 61) - 1;
        let body: Vec<String> = (0..9)
            .map(|i| format!(r#""t{i}":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}}"#))
            .collect();
        let h = format!("{{{}}}", body.join(","));
        let e = parse_header("w.safetensors", h.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("gaps or overlaps"), "{e}");
        // Several files whose sums overflow together.
        let mut s = Summary::default();
        let big = |b: u64| Summary {
            bytes_by_dtype: [("U8".to_string(), b)].into(),
            replicated_bytes: 0,
            tensors: 1,
        };
        assert!(s.merge(big(u64::MAX - 1)).is_some());
        assert!(s.merge(big(2)).is_none());
        assert_eq!(s.total(), u64::MAX - 1);
    }

    #[test]
    fn duplicate_names_gaps_and_overlaps_are_refused() {
        for (h, why) in [
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
                "appears twice",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
                "gaps or overlaps",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                "gaps or overlaps",
            ),
        ] {
            let e = parse_header("w.safetensors", h.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{h}: {e}");
        }
        // Zero-sized tensors and any order of entries are fine.
        let ok = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let s = parse_header("w.safetensors", ok.as_bytes()).unwrap();
        assert_eq!((s.total(), s.tensors), (16, 3));
    }

    #[test]
    fn sub_byte_dtypes_have_their_real_size() {
        // F6 is 6 bits: 4 elements are 3 bytes; F4 packs 2 per byte.
        let f6 = r#"{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}"#;
        assert_eq!(parse_header("x", f6.as_bytes()).unwrap().total(), 3);
        let f4 = r#"{"a":{"dtype":"F4","shape":[2,4],"data_offsets":[0,4]}}"#;
        assert_eq!(parse_header("x", f4.as_bytes()).unwrap().total(), 4);
        for lie in [
            r#"{"a":{"dtype":"F4","shape":[8],"data_offsets":[0,100]}}"#,
            r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
        ] {
            assert!(parse_header("x", lie.as_bytes()).is_err(), "{lie}");
        }
        let c64 = r#"{"a":{"dtype":"C64","shape":[2],"data_offsets":[0,16]}}"#;
        assert_eq!(parse_header("x", c64.as_bytes()).unwrap().total(), 16);
    }

    #[test]
    fn an_index_limits_the_files_read() {
        // Mistral's repositories: HF shards listed in the index, plus consolidated.safetensors
        // holding the same weights again.
        let dir = std::env::temp_dir().join(format!("memplan-st-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shard = file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
        std::fs::write(dir.join("model-00001-of-00001.safetensors"), &shard).unwrap();
        std::fs::write(dir.join("consolidated.safetensors"), &shard).unwrap();
        assert_eq!(read_dir(&dir).unwrap().unwrap().total(), 16);
        std::fs::write(
            dir.join(INDEX),
            r#"{"metadata":{"total_size":8},"weight_map":{"w":"model-00001-of-00001.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(read_dir(&dir).unwrap().unwrap().total(), 8);
        std::fs::write(
            dir.join(INDEX),
            r#"{"weight_map":{"w":"model-00001-of-00001.safetensors","v":"model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let e = read_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
        std::fs::write(dir.join(INDEX), r#"{"weight_map":[1]}"#).unwrap();
        let e = read_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("weight_map"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_only_the_header() {
        let dir = std::env::temp_dir().join(format!("memplan-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
        bytes.extend_from_slice(&[0u8; 8]);
        std::fs::write(dir.join("m.safetensors"), &bytes).unwrap();
        assert_eq!(read_dir(&dir).unwrap().unwrap().total(), 8);
        std::fs::write(dir.join("m.safetensors"), 1u64.to_le_bytes().repeat(2)).unwrap();
        assert!(read_dir(&dir).is_err());
        std::fs::write(dir.join("m.safetensors"), u64::MAX.to_le_bytes()).unwrap();
        assert!(read_dir(&dir).unwrap_err().to_string().contains("limit"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
