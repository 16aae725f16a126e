//! Reading the one list of backends (`backends.rs`) as text, with the standard library only:
//! xtask (std-only, outside the workspace) includes this file to read the list, and a test of
//! `memplan-core` parses the list with it and compares every entry with
//! [`BackendKind`](crate::BackendKind), so the text xtask reads and the enum the code uses
//! cannot disagree.

// Each includer uses part of it.
#![allow(dead_code)]

/// One backend's entry, as written in the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The `BackendKind` variant.
    pub variant: String,
    /// The id prefix.
    pub name: String,
    /// Other accepted prefixes.
    pub aliases: Vec<String>,
    /// The `memplan` facade's feature.
    pub feature: String,
    /// The crate, as a Rust path (`memplan_backend_cuda`).
    pub krate: String,
    /// Vendor libraries loaded at run time.
    pub libraries: Vec<String>,
    /// `hal` or `simulator`.
    pub layout: String,
    /// A device CI can open without hardware (empty: none).
    pub ci_device: String,
    /// One line for tables and help.
    pub description: String,
}

impl Entry {
    /// The package name (`memplan-backend-cuda`).
    pub fn package(&self) -> String {
        self.krate.replace('_', "-")
    }

    /// The folder, relative to the repository root.
    pub fn folder(&self) -> String {
        format!("backends/{}", self.name)
    }
}

const FIELDS: [&str; 8] = [
    "name",
    "aliases",
    "feature",
    "krate",
    "libraries",
    "layout",
    "ci_device",
    "description",
];

fn string(v: &str, line: usize) -> Result<String, String> {
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .filter(|s| !s.contains('"') && !s.contains('\\'))
        .map(str::to_string)
        .ok_or_else(|| format!("line {line}: expected a plain string literal, found `{v}`"))
}

fn strings(v: &str, line: usize) -> Result<Vec<String>, String> {
    let inner = v
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .ok_or_else(|| format!("line {line}: expected [\"...\", ...], found `{v}`"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| string(s, line))
        .collect()
}

fn ident(v: &str, line: usize) -> Result<String, String> {
    let ok = !v.is_empty()
        && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !v.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!("line {line}: expected an identifier, found `{v}`"))
    }
}

/// Parse the list's source text: every entry inside `backend_list!`, in order. Errors name the
/// line.
pub fn parse(source: &str) -> Result<Vec<Entry>, String> {
    let first = source
        .lines()
        .position(|l| l.trim() == "$then! {")
        .ok_or("the list has no line `$then! {`")?;
    let mut out = Vec::new();
    let mut current: Option<(String, Vec<(String, String)>)> = None;
    for (i, raw) in source.lines().enumerate().skip(first + 1) {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        match &mut current {
            None if t == "}" => break,
            None => {
                let variant = t
                    .strip_suffix('{')
                    .map(str::trim)
                    .ok_or_else(|| format!("line {line}: expected `Variant {{`, found `{t}`"))?;
                current = Some((ident(variant, line)?, Vec::new()));
            }
            Some((variant, fields)) if t == "}" => {
                let get = |k: &str| -> Result<String, String> {
                    fields
                        .iter()
                        .find(|(f, _)| f == k)
                        .map(|(_, v)| v.clone())
                        .ok_or_else(|| format!("{variant}: no `{k}` field"))
                };
                let names: Vec<&str> = fields.iter().map(|(f, _)| f.as_str()).collect();
                if names != FIELDS {
                    return Err(format!(
                        "{variant}: fields {names:?}, expected exactly {FIELDS:?} in that order"
                    ));
                }
                out.push(Entry {
                    variant: variant.clone(),
                    name: string(&get("name")?, line)?,
                    aliases: strings(&get("aliases")?, line)?,
                    feature: string(&get("feature")?, line)?,
                    krate: ident(&get("krate")?, line)?,
                    libraries: strings(&get("libraries")?, line)?,
                    layout: ident(&get("layout")?, line)?,
                    ci_device: string(&get("ci_device")?, line)?,
                    description: string(&get("description")?, line)?,
                });
                current = None;
            }
            Some((_, fields)) => {
                let (k, v) = t
                    .split_once(':')
                    .ok_or_else(|| format!("line {line}: expected `field: value,`, found `{t}`"))?;
                let v = v.trim().strip_suffix(',').ok_or_else(|| {
                    format!("line {line}: a field ends with a comma on its own line: `{t}`")
                })?;
                fields.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
    }
    if out.is_empty() {
        return Err("the list names no backend".into());
    }
    Ok(out)
}
