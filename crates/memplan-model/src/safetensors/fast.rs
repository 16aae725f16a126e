//! A fast path for headers in the form writers produce: one object of tensors, each
//! `{"dtype":"..","shape":[..],"data_offsets":[a,b]}` (keys in any order), names without escapes,
//! `__metadata__` an object of plain strings, whitespace anywhere JSON allows it (the format
//! pads headers with spaces). It accepts a strict subset of JSON and nothing else: on any
//! other form (escapes, other keys or key orders, floats, negative or huge numbers) it gives
//! up and the caller parses the header with serde_json, which also words every error. What it
//! accepts it reads exactly as the general path would.

use std::borrow::Cow;

use super::header::{Ints, Tensor};

/// The entries of `text`, or `None` when it is not in the form this path reads.
pub(super) fn entries(text: &str) -> Option<Vec<(Cow<'_, str>, Option<Tensor<'_>>)>> {
    let mut c = Cursor {
        t: text,
        s: text.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    c.eat(b'{')?;
    if !c.next_is(b'}') {
        loop {
            let name = c.string()?;
            c.eat(b':')?;
            if name == "__metadata__" {
                c.metadata()?;
                out.push((Cow::Borrowed(name), None));
            } else {
                let t = c.tensor()?;
                out.push((Cow::Borrowed(name), Some(t)));
            }
            if !c.next_is(b',') {
                break;
            }
        }
        c.eat(b'}')?;
    }
    c.ws();
    (c.i == c.s.len()).then_some(out)
}

struct Cursor<'a> {
    t: &'a str,
    s: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.i) == Some(&b)).then(|| self.i += 1)
    }

    /// Consume `b` (after whitespace) if it comes next.
    fn next_is(&mut self, b: u8) -> bool {
        self.eat(b).is_some()
    }

    /// A string without escapes or control characters (the text is UTF-8 already). Scans
    /// eight bytes at a time for a quote, a backslash or a control character.
    fn string(&mut self) -> Option<&'a str> {
        const ONES: u64 = u64::from_ne_bytes([1; 8]);
        const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
        // Bytes of `v` that are zero (exactly: the high bit of each such byte).
        let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
        self.eat(b'"')?;
        let start = self.i;
        while let Some(chunk) = self.s.get(self.i..self.i + 8) {
            let v = u64::from_ne_bytes(chunk.try_into().ok()?);
            let stop = zero(v ^ (ONES * u64::from(b'"')))
                | zero(v ^ (ONES * u64::from(b'\\')))
                | (v.wrapping_sub(ONES * 0x20) & !v & HIGH);
            if stop != 0 {
                break;
            }
            self.i += 8;
        }
        loop {
            match *self.s.get(self.i)? {
                b'"' => break,
                b'\\' | 0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
        self.i += 1;
        self.t.get(start..self.i - 1)
    }

    /// A non-negative integer that fits in 64 bits, written as JSON writes one.
    fn int(&mut self) -> Option<u64> {
        self.ws();
        let start = self.i;
        let mut v: u64 = 0;
        // Nineteen digits cannot overflow 64 bits; a twentieth is checked.
        while let Some(&b) = self.s.get(self.i) {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            v = if self.i - start < 19 {
                v * 10 + u64::from(d)
            } else {
                v.checked_mul(10)?.checked_add(u64::from(d))?
            };
            self.i += 1;
        }
        let n = self.i - start;
        if n == 0
            || n > 1 && self.s[start] == b'0'
            || matches!(self.s.get(self.i), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        Some(v)
    }

    fn ints(&mut self) -> Option<Ints> {
        self.eat(b'[')?;
        let (mut count, mut first, mut second, mut product) = (0u64, 0u64, 0u64, Some(1u64));
        if !self.next_is(b']') {
            loop {
                let v = self.int()?;
                match count {
                    0 => first = v,
                    1 => second = v,
                    _ => {}
                }
                count += 1;
                product = product.and_then(|p| p.checked_mul(v));
                if !self.next_is(b',') {
                    break;
                }
            }
            self.eat(b']')?;
        }
        Some(Ints::Ok {
            count,
            first,
            second,
            product,
        })
    }

    /// `{"dtype":..,"shape":[..],"data_offsets":[..]}`, the three keys once each in any order
    /// (the reference writer orders them so, a writer that sorts keys does not).
    fn tensor(&mut self) -> Option<Tensor<'a>> {
        self.eat(b'{')?;
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        for i in 0..3 {
            if i > 0 {
                self.eat(b',')?;
            }
            self.ws();
            // The three keys are matched whole rather than scanned.
            let rest = self.s.get(self.i..)?;
            if rest.starts_with(b"\"dtype\"") && dtype.is_none() {
                self.i += 7;
                self.eat(b':')?;
                dtype = Some(self.string()?);
            } else if rest.starts_with(b"\"shape\"") && shape.is_none() {
                self.i += 7;
                self.eat(b':')?;
                shape = Some(self.ints()?);
            } else if rest.starts_with(b"\"data_offsets\"") && offsets.is_none() {
                self.i += 14;
                self.eat(b':')?;
                offsets = Some(self.ints()?);
            } else {
                return None;
            }
        }
        self.eat(b'}')?;
        Some(Tensor {
            dtype: Some(Cow::Borrowed(dtype?)),
            shape: shape?,
            offsets: offsets?,
        })
    }

    /// `__metadata__`: an object of plain strings.
    fn metadata(&mut self) -> Option<()> {
        self.eat(b'{')?;
        if self.next_is(b'}') {
            return Some(());
        }
        loop {
            self.string()?;
            self.eat(b':')?;
            self.string()?;
            if !self.next_is(b',') {
                break;
            }
        }
        self.eat(b'}')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the fast path reads, as (name, dtype, shape, offsets) per entry.
    fn read(text: &str) -> Option<Vec<String>> {
        entries(text).map(|e| {
            e.iter()
                .map(|(n, t)| match t {
                    None => format!("{n}: metadata"),
                    Some(t) => format!("{n}: {:?} {:?} {:?}", t.dtype, t.shape, t.offsets),
                })
                .collect()
        })
    }

    #[test]
    fn reads_what_the_general_path_reads() {
        let mut big = String::from(r#"{"__metadata__":{"format":"pt","k":"v"},"#);
        for i in 0..500u64 {
            big += &format!(
                r#" "model.layers.{i}.w" : {{ "dtype" : "F8_E4M3", "shape" : [ {}, 7 ], "data_offsets" : [{}, {}] }},"#,
                i + 1,
                i * 1000,
                i * 1000 + 7 * (i + 1)
            );
        }
        big += r#""z":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,0]}}"#;
        for text in [big.as_str(), "{}", r#"{"__metadata__":{}}"#] {
            let fast = entries(text).unwrap();
            let slow = crate::safetensors::header::slow_entries(text).unwrap();
            let show = |e: &[(Cow<'_, str>, Option<Tensor<'_>>)]| {
                e.iter()
                    .map(|(n, t)| {
                        let t = t
                            .as_ref()
                            .map(|t| format!("{:?} {:?} {:?}", t.dtype, t.shape, t.offsets));
                        format!("{n} {t:?}")
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(show(&fast), show(&slow));
        }
    }

    #[test]
    fn reads_the_written_form_and_gives_up_on_anything_else() {
        let ok = r#" { "__metadata__" : {"format":"pt"} , "a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[],"data_offsets":[12,16]} }   "#;
        let got = read(ok).unwrap();
        assert_eq!(got.len(), 3);
        let sorted = r#"{"a":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}}"#;
        assert_eq!(read(sorted).unwrap().len(), 1);
        assert!(
            got[1].contains("count: 2, first: 2, second: 3, product: Some(6)"),
            "{got:?}"
        );
        assert_eq!(read("{}").unwrap().len(), 0);
        for other in [
            r#"{"a\"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"shape":[1],"dtype":"F32","shape":[1]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1e2],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#,
            r#"{"__metadata__":{"n":1}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},}"#,
            r#"{"a":{"dtype":"F32","shape":[1,],"data_offsets":[0,4]}}"#,
            "{\"a\t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
            r#"[]"#,
            "",
        ] {
            assert!(read(other).is_none(), "{other}");
        }
    }
}
