//! Safetensors header reader: exact checkpoint bytes per dtype, reading only the header (an
//! 8-byte little-endian length, then that many bytes of JSON), never the tensors.
//!
//! Every tensor entry is checked: a known dtype, a shape whose element count times the dtype
//! size equals its byte range (packed 4-bit dtypes excepted: their range must be non-empty),
//! ranges inside `u64`. Headers above 100 MiB are refused (the format's own limit).

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

    fn merge(&mut self, other: Summary) {
        for (k, v) in other.bytes_by_dtype {
            *self.bytes_by_dtype.entry(k).or_default() += v;
        }
        self.replicated_bytes += other.replicated_bytes;
        self.tensors += other.tensors;
    }
}

fn dtype_bits(d: &str) -> Option<u64> {
    Some(match d {
        "F64" | "I64" | "U64" => 64,
        "F32" | "I32" | "U32" => 32,
        "F16" | "BF16" | "I16" | "U16" => 16,
        "F8_E4M3" | "F8_E5M2" | "F8_E8M0" | "I8" | "U8" | "BOOL" => 8,
        "F4" | "F6_E2M3" | "F6_E3M2" => 4,
        _ => return None,
    })
}

/// Parse a header's JSON text.
pub fn parse_header(name: &str, json: &[u8]) -> Result<Summary> {
    let bad = |m: String| Error::invalid(name, m);
    let v: Value = serde_json::from_slice(json)
        .map_err(|e| bad(format!("safetensors header is not JSON: {e}")))?;
    let o = v
        .as_object()
        .ok_or_else(|| bad("safetensors header is not a JSON object".into()))?;
    let mut s = Summary::default();
    for (tensor, info) in o {
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
        let expect = elems
            .checked_mul(bits)
            .ok_or_else(|| what("size overflows 64 bits"))?
            .div_ceil(8);
        if bits >= 8 && expect != len {
            return Err(what(&format!(
                "shape needs {expect} bytes but data_offsets span {len}"
            )));
        }
        *s.bytes_by_dtype.entry(dtype.to_string()).or_default() += len;
        if shape.len() <= 1 && (tensor.contains("norm") || tensor.contains("scale"))
            || tensor.contains("router")
            || tensor.ends_with(".gate.weight")
        {
            s.replicated_bytes += len;
        }
        s.tensors += 1;
    }
    Ok(s)
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

/// Read every `*.safetensors` header in a directory; `None` when there is none.
pub fn read_dir(dir: &Path) -> Result<Option<Summary>> {
    let io = |e| Error::Io {
        path: dir.display().to_string(),
        source: e,
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    if files.is_empty() {
        return Ok(None);
    }
    files.sort();
    let mut s = Summary::default();
    for f in files {
        s.merge(read_file(&f)?);
    }
    Ok(Some(s))
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
