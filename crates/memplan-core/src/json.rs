//! Reading JSON text a user hands memplan (a model's `config.json`, a checkpoint's index, a
//! plan another rank wrote): one reader, so that every such error says where in the document
//! it is and not only at which line and column.
//!
//! serde_json alone reports a value it cannot read as `expected value at line 3 column 27`;
//! [`from_str`] adds the key path of that value (`text_config.num_hidden_layers`), for
//! syntax errors as for values of the wrong type, and says plainly what a `NaN`, `Infinity` or
//! `-Infinity` literal is (Python's `json.dumps` writes them by default; they are not JSON).

use std::fmt;

use serde::Deserialize;

/// A JSON document [`from_str`] could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JsonError {
    /// The key path of the value at fault (`text_config.num_hidden_layers`, `consumers[0]`),
    /// where the error is at or inside a value; `None` at the top level.
    pub path: Option<String>,
    /// Whether the text is not JSON at all (a syntax error, a `NaN` literal, text cut short),
    /// as opposed to JSON of the wrong shape.
    pub syntax: bool,
    /// What is wrong, with serde_json's line and column.
    pub detail: String,
}

impl JsonError {
    /// What is wrong, without the path: `not valid JSON: ...` for a syntax error, serde's
    /// message for a value of the wrong type.
    pub fn message(&self) -> String {
        if self.syntax {
            format!("not valid JSON: {}", self.detail)
        } else {
            self.detail.clone()
        }
    }

    /// The [`Error::InvalidFile`](crate::Error::InvalidFile) of the file `path` this text was
    /// read from: the key path as its `key`.
    pub fn in_file(self, path: impl Into<String>) -> crate::Error {
        let message = self.message();
        crate::Error::InvalidFile {
            path: path.into(),
            key: self.path,
            message: crate::error::bounded(message),
        }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.path {
            write!(f, "{p}: ")?;
        }
        f.write_str(&self.message())
    }
}

impl std::error::Error for JsonError {}

/// Parse `text` as one JSON document of type `T`; errors carry the key path where one is
/// known ([`JsonError`]).
pub fn from_str<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, JsonError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = match serde_path_to_error::deserialize(&mut de) {
        Ok(v) => v,
        Err(e) => {
            let path = key_path(e.path());
            return Err(describe(text, path, e.into_inner()));
        }
    };
    de.end().map_err(|e| describe(text, None, e))?;
    Ok(value)
}

/// `a.b[0].c`, as serde_path_to_error writes it, up to the first segment it could not name
/// (text cut short inside an object stops before its next key: `?`); `None` when empty.
fn key_path(path: &serde_path_to_error::Path) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => break,
        }
    }
    (!out.is_empty()).then_some(out)
}

fn describe(text: &str, path: Option<String>, e: serde_json::Error) -> JsonError {
    let syntax = !matches!(e.classify(), serde_json::error::Category::Data);
    let detail = match non_finite_at(text, e.line(), e.column()) {
        Some(literal) if syntax => format!(
            "NaN and infinity are not valid JSON numbers (`{literal}` at line {} column {})",
            e.line(),
            e.column()
        ),
        _ => e.to_string(),
    };
    JsonError {
        path,
        syntax,
        detail,
    }
}

/// The `NaN`, `Infinity`, `-Infinity` (or `inf`, `nan`) literal at or next to serde_json's
/// error position (1-based line, byte column), if that is what it stopped at.
fn non_finite_at(text: &str, line: usize, column: usize) -> Option<&str> {
    let start = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum::<usize>();
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphabetic() || b == b'-' || b == b'+';
    // The column names the byte it stopped at (1-based) or the one after it.
    let at = [start + column.saturating_sub(1), start + column]
        .into_iter()
        .find(|&i| i < bytes.len() && word(bytes[i]))?;
    let mut from = at;
    while from > 0 && word(bytes[from - 1]) {
        from -= 1;
    }
    let mut to = at;
    while to < bytes.len() && word(bytes[to]) {
        to += 1;
    }
    let literal = text.get(from..to)?;
    let bare = literal.trim_start_matches(['-', '+']).to_ascii_lowercase();
    ["nan", "inf", "infinity"]
        .contains(&bare.as_str())
        .then_some(literal)
}

/// The literals Python's `json.dumps` writes for non-finite floats (`allow_nan`, its default).
pub const NON_FINITE: [&str; 3] = ["NaN", "Infinity", "-Infinity"];

/// `text` with every `NaN`, `Infinity` and `-Infinity` literal outside a string quoted (the
/// JSON string of itself), or `None` where there is none. Python's `json.dumps` writes them and
/// `transformers` and the engines read them back, so a model's `config.json` may hold them in
/// keys nobody reads as a number (Mamba2's `time_step_limit: [0.0, Infinity]`): quoted, the
/// document parses, and a key that is read as a number fails as a string would, by name.
pub fn quote_non_finite(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_string, mut escaped, mut found) = (false, false, false);
    let mut last = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        // A value, not a key: after `:`, `[` or `,` (a bare word where a key belongs stays the
        // syntax error it is).
        let value_position = || text[..i].trim_end().ends_with([':', '[', ',']);
        if let Some(lit) = NON_FINITE
            .iter()
            .find(|l| bytes[i..].starts_with(l.as_bytes()))
            .filter(|_| value_position())
        {
            out.push_str(&text[last..i]);
            out.push('"');
            out.push_str(lit);
            out.push('"');
            i += lit.len();
            last = i;
            found = true;
            continue;
        }
        i += 1;
    }
    if !found {
        return None;
    }
    out.push_str(&text[last..]);
    Some(out)
}

/// The key paths of `v`'s strings that are a [`NON_FINITE`] literal (`time_step_limit[1]`),
/// as [`quote_non_finite`] leaves them, each with its literal.
pub fn non_finite_paths(v: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(v: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::String(s) if NON_FINITE.contains(&s.as_str()) => {
                out.push((at.to_string(), s.clone()))
            }
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, &format!("{at}[{i}]"), out);
                }
            }
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let p = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    walk(x, &p, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn non_finite_literals_are_quoted_outside_strings_only() {
        let text = r#"{"time_step_limit": [0.0, Infinity], "a": -Infinity, "b": NaN, "s": "NaN \" Infinity"}"#;
        let q = quote_non_finite(text).expect("literals");
        let v: Value = from_str(&q).unwrap();
        assert_eq!(v["time_step_limit"][1], "Infinity");
        assert_eq!(v["a"], "-Infinity");
        assert_eq!(v["b"], "NaN");
        assert_eq!(v["s"], "NaN \" Infinity");
        let mut paths: Vec<String> = non_finite_paths(&v).into_iter().map(|(p, _)| p).collect();
        paths.sort();
        assert_eq!(paths, ["a", "b", "time_step_limit[1]"]);
        assert_eq!(quote_non_finite(r#"{"a": "NaN", "b": 1}"#), None);
        // In a key's place it stays a syntax error.
        assert_eq!(quote_non_finite(r#"{NaN: 1}"#), None);
    }

    #[test]
    fn a_non_finite_literal_names_its_key_path() {
        for (text, path, literal) in [
            (r#"{"num_hidden_layers": NaN}"#, "num_hidden_layers", "NaN"),
            (
                "{\"text_config\": {\n  \"hidden_size\": 4096,\n  \"num_hidden_layers\": Infinity}}",
                "text_config.num_hidden_layers",
                "Infinity",
            ),
            (
                r#"{"a": [1, 2, -Infinity]}"#,
                "a[2]",
                "-Infinity",
            ),
            (r#"{"a":{"b":[{"c":nan}]}}"#, "a.b[0].c", "nan"),
        ] {
            let e = from_str::<Value>(text).unwrap_err();
            assert_eq!(e.path.as_deref(), Some(path), "{text}: {e}");
            assert!(e.syntax, "{text}: {e}");
            let m = e.to_string();
            assert!(
                m.starts_with(&format!("{path}: not valid JSON: "))
                    && m.contains("NaN and infinity are not valid JSON numbers")
                    && m.contains(&format!("`{literal}`")),
                "{text}: {m}"
            );
        }
        // At the top level there is no path.
        let e = from_str::<Value>("NaN").unwrap_err();
        assert_eq!(e.path, None);
        assert!(e.to_string().contains("NaN and infinity"), "{e}");
    }

    #[test]
    fn other_syntax_errors_keep_serdes_message_and_gain_the_path() {
        let e = from_str::<Value>(r#"{"a": {"b": tru}}"#).unwrap_err();
        assert_eq!(e.path.as_deref(), Some("a.b"), "{e}");
        assert!(e.syntax && e.to_string().contains("line 1"), "{e}");
        assert!(!e.to_string().contains("NaN"), "{e}");
        // A string holding "NaN" is a string.
        assert!(from_str::<Value>(r#"{"a": "NaN"}"#).is_ok());
        // A key path that is a word next to the error is no NaN: `Nano` is not `NaN`.
        let e = from_str::<Value>(r#"{"a": Nano}"#).unwrap_err();
        assert!(!e.to_string().contains("infinity"), "{e}");
        // Text cut short, trailing text.
        let e = from_str::<Value>("{").unwrap_err();
        assert!(
            e.syntax && e.to_string().starts_with("not valid JSON: "),
            "{e}"
        );
        let e = from_str::<Value>("{} x").unwrap_err();
        assert!(e.syntax && e.path.is_none(), "{e}");
        let e = from_str::<Value>(r#"{"a": {"b": 1"#).unwrap_err();
        assert_eq!(e.path.as_deref(), Some("a"), "{e}");
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_path() {
        #[derive(Debug, Deserialize)]
        struct Inner {
            #[allow(dead_code)]
            n: u64,
        }
        #[derive(Debug, Deserialize)]
        struct Outer {
            #[allow(dead_code)]
            inner: Vec<Inner>,
        }
        let e = from_str::<Outer>(r#"{"inner": [{"n": 1}, {"n": "x"}]}"#).unwrap_err();
        assert_eq!(e.path.as_deref(), Some("inner[1].n"), "{e}");
        assert!(!e.syntax && e.to_string().contains("invalid type"), "{e}");
        // A NaN where a number goes is still named as what it is.
        let e = from_str::<Outer>(r#"{"inner": [{"n": NaN}]}"#).unwrap_err();
        assert_eq!(e.path.as_deref(), Some("inner[0].n"), "{e}");
        assert!(e.to_string().contains("NaN and infinity"), "{e}");
    }
}
