//! One safetensors header: the JSON after the 8-byte length, checked entry by entry.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use memplan_core::{Error, Result};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

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

/// A parsed header: the summary and the tensor names (borrowed from the header's bytes where
/// they have no escapes), in the order of their byte ranges.
pub(crate) struct Header<'a> {
    /// Bytes per dtype and the rest.
    pub(crate) summary: Summary,
    /// Every tensor's name (`__metadata__` excluded).
    pub(crate) names: Vec<Cow<'a, str>>,
}

/// Parse a header's JSON text.
pub fn parse_header(name: &str, json: &[u8]) -> Result<Summary> {
    parse(name, json, true).map(|h| h.summary)
}

/// [`parse_header`], keeping the tensor names.
///
/// One pass over the JSON with visitors that keep only what is checked (the dtype, the
/// shape's element count and rank, the two offsets), borrowing names from `json`: no value
/// tree, no allocation per tensor. Then one sort of the byte ranges. Linear in the tensors
/// but for the sort.
///
/// `unique_names`: check here that no name appears twice (a caller that checks the names of
/// several files together passes `false` and finds the same duplicates itself, hashing each
/// name once).
pub(crate) fn parse<'a>(name: &str, json: &'a [u8], unique_names: bool) -> Result<Header<'a>> {
    let bad = |m: String| Error::file(name, m);
    // UTF-8 checked once for the whole header (safetensors headers are UTF-8 JSON), not
    // string by string.
    let text = std::str::from_utf8(json).map_err(|e| {
        bad(format!(
            "safetensors header is not JSON: invalid UTF-8 at byte {}",
            e.valid_up_to()
        ))
    })?;
    // The form writers produce is read by a strict fast path; anything else by serde_json.
    let entries = match super::fast::entries(text) {
        Some(e) => e,
        None => {
            memplan_core::json::from_str::<Entries>(text)
                .map_err(|e| {
                    if e.syntax {
                        bad(format!("safetensors header: {e}"))
                    } else {
                        bad("safetensors header is not a JSON object".into())
                    }
                })?
                .0
        }
    };
    let mut seen: HashSet<&str> =
        HashSet::with_capacity(if unique_names { entries.len() } else { 0 });
    let mut ranges: Vec<Range<'_>> = Vec::with_capacity(entries.len());
    for (entry, (tensor, info)) in entries.iter().enumerate() {
        if unique_names && !seen.insert(tensor) {
            return Err(bad(format!(
                "tensor {tensor:?} appears twice in the header"
            )));
        }
        // `__metadata__` (free-form strings) has no entry.
        let Some(info) = info else { continue };
        let what = |m: &str| bad(format!("tensor {tensor:?}: {m}"));
        let dtype = info.dtype.as_deref().ok_or_else(|| what("no dtype"))?;
        let bits = dtype_bits(dtype).ok_or_else(|| what(&format!("unknown dtype {dtype:?}")))?;
        let (a, b) = match info.offsets {
            Ints::Missing => return Err(what("no data_offsets")),
            Ints::Ok {
                count: 2,
                first,
                second,
                ..
            } => (first, second),
            _ => return Err(what("data_offsets must be two integers")),
        };
        let len = b
            .checked_sub(a)
            .ok_or_else(|| what("data_offsets end before they start"))?;
        let (elems, rank) = match info.shape {
            Ints::Missing => return Err(what("no shape")),
            Ints::Bad => return Err(what("shape entries must be integers")),
            Ints::Ok {
                count,
                product: Some(p),
                ..
            } => (p, count),
            Ints::Ok { product: None, .. } => return Err(what("shape overflows 64 bits")),
        };
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
        let replicated = rank <= 1 && (tensor.contains("norm") || tensor.contains("scale"))
            || tensor.contains("router")
            || tensor.ends_with(".gate.weight");
        ranges.push(Range {
            start: a,
            end: b,
            entry,
            dtype,
            replicated,
        });
    }
    // Sorted by range, every tensor starts where the previous one ended, the first at 0. Only
    // then are the lengths summed: they add up to the end of the last range, within u64.
    // Writers lay tensors out in the order they list them: usually nothing to sort.
    if !ranges.is_sorted_by_key(|r| (r.start, r.end)) {
        ranges.sort_unstable_by_key(|r| (r.start, r.end));
    }
    let mut end = 0u64;
    for r in &ranges {
        if r.start != end {
            return Err(bad(format!(
                "tensor {:?}: data_offsets start at {} but the previous tensor ends at {end} (tensor data must follow without gaps or overlaps)",
                entries[r.entry].0, r.start
            )));
        }
        end = r.end;
    }
    // A handful of dtypes: summed in a short list, then into the map.
    let mut by_dtype: Vec<(&str, u64)> = Vec::new();
    let mut s = Summary::default();
    for r in &ranges {
        let len = r.end - r.start;
        match by_dtype.iter_mut().find(|(d, _)| *d == r.dtype) {
            Some((_, b)) => *b += len,
            None => by_dtype.push((r.dtype, len)),
        }
        if r.replicated {
            s.replicated_bytes += len;
        }
    }
    s.tensors = ranges.len() as u64;
    for (d, b) in by_dtype {
        s.bytes_by_dtype.insert(d.to_string(), b);
    }
    let order: Vec<usize> = ranges.iter().map(|r| r.entry).collect();
    drop(ranges);
    let mut entries: Vec<Option<Cow<'a, str>>> =
        entries.into_iter().map(|(n, _)| Some(n)).collect();
    let names = order
        .into_iter()
        .filter_map(|i| entries[i].take())
        .collect();
    Ok(Header { summary: s, names })
}

/// The general path's entries of `text` (to check the fast path against it).
#[cfg(test)]
pub(super) fn slow_entries(text: &str) -> Option<Vec<(Cow<'_, str>, Option<Tensor<'_>>)>> {
    let mut de = serde_json::Deserializer::from_str(text);
    Entries::deserialize(&mut de)
        .and_then(|e| de.end().map(|()| e.0))
        .ok()
}

/// One tensor's byte range, for the tiling check.
struct Range<'a> {
    start: u64,
    end: u64,
    /// Index of its entry.
    entry: usize,
    dtype: &'a str,
    replicated: bool,
}

/// The header's top-level entries in file order, duplicates kept (a map would silently keep
/// only the last of two entries with the same name); `None` for `__metadata__`.
struct Entries<'a>(Vec<(Cow<'a, str>, Option<Tensor<'a>>)>);

impl<'de> Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries<'de>, A::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0));
                while let Some(Str(k)) = m.next_key::<Str<'de>>()? {
                    if k == "__metadata__" {
                        m.next_value::<IgnoredAny>()?;
                        out.push((k, None));
                    } else {
                        let t = m.next_value::<Tensor<'de>>()?;
                        out.push((k, Some(t)));
                    }
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A string, borrowed from the input when it has no escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(
                self,
                v: &'de str,
            ) -> std::result::Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// What one tensor entry says, as far as the checks need it. A value of the wrong type reads
/// as absent, as a lookup in a JSON object would.
#[derive(Default)]
pub(super) struct Tensor<'a> {
    pub(super) dtype: Option<Cow<'a, str>>,
    pub(super) shape: Ints,
    pub(super) offsets: Ints,
}

/// A list of integers, reduced to what is checked: how many, the first two, their product
/// (`None` on overflow).
#[derive(Debug, Default, Clone, Copy)]
pub(super) enum Ints {
    /// Absent, or not a list.
    #[default]
    Missing,
    /// A list with an entry that is not a non-negative integer.
    Bad,
    /// A list of non-negative integers.
    Ok {
        count: u64,
        first: u64,
        second: u64,
        product: Option<u64>,
    },
}

/// Consume any JSON value (the wrong-typed ones the visitors do not keep).
macro_rules! skip_other {
    ($value:ty) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> std::result::Result<$value, E> {
            Ok(Default::default())
        }
    };
}

impl<'de> Deserialize<'de> for Tensor<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tensor<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tensor entry")
            }
            skip_other!(Tensor<'de>);
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Tensor<'de>, E> {
                Ok(Tensor::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Tensor<'de>, E> {
                Ok(Tensor::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<Tensor<'de>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Tensor::default())
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Tensor<'de>, A::Error> {
                let mut t = Tensor::default();
                while let Some(Str(k)) = m.next_key::<Str<'de>>()? {
                    match &*k {
                        "dtype" => t.dtype = m.next_value::<MaybeStr<'de>>()?.0,
                        "shape" => t.shape = m.next_value::<Ints>()?,
                        "data_offsets" => t.offsets = m.next_value::<Ints>()?,
                        _ => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(t)
            }
        }
        d.deserialize_any(V)
    }
}

/// A string, or `None` for a value of another type.
#[derive(Default)]
struct MaybeStr<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for MaybeStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MaybeStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            skip_other!(MaybeStr<'de>);
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<MaybeStr<'de>, E> {
                Ok(MaybeStr(None))
            }
            fn visit_borrowed_str<E: de::Error>(
                self,
                v: &'de str,
            ) -> std::result::Result<MaybeStr<'de>, E> {
                Ok(MaybeStr(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<MaybeStr<'de>, E> {
                Ok(MaybeStr(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<MaybeStr<'de>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(MaybeStr(None))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<MaybeStr<'de>, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(MaybeStr(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A non-negative integer, or `None` for anything else.
#[derive(Default)]
struct MaybeU64(Option<u64>);

impl<'de> Deserialize<'de> for MaybeU64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MaybeU64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            skip_other!(MaybeU64);
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<MaybeU64, E> {
                Ok(MaybeU64(Some(v)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<MaybeU64, E> {
                Ok(MaybeU64(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<MaybeU64, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(MaybeU64(None))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<MaybeU64, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(MaybeU64(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Ints {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ints;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of integers")
            }
            skip_other!(Ints);
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Ints, E> {
                Ok(Ints::Missing)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Ints, E> {
                Ok(Ints::Missing)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Ints, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Ints::Missing)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> std::result::Result<Ints, A::Error> {
                let (mut count, mut first, mut second, mut product, mut ok) =
                    (0u64, 0u64, 0u64, Some(1u64), true);
                while let Some(MaybeU64(v)) = a.next_element::<MaybeU64>()? {
                    let Some(v) = v else {
                        ok = false;
                        continue;
                    };
                    match count {
                        0 => first = v,
                        1 => second = v,
                        _ => {}
                    }
                    count += 1;
                    product = product.and_then(|p| p.checked_mul(v));
                }
                Ok(if ok {
                    Ints::Ok {
                        count,
                        first,
                        second,
                        product,
                    }
                } else {
                    Ints::Bad
                })
            }
        }
        d.deserialize_any(V)
    }
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
