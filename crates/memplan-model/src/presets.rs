//! Model presets shipped with memplan (`crates/memplan-model/models/model-configs.jsonl`, embedded at build time):
//! found by full Hugging Face id or by the part after `/`, case-insensitively.

use memplan_core::{Error, Param, Result};
use serde_json::Value;

use crate::config::ModelConfig;

const PRESETS: &str = include_str!("../models/model-configs.jsonl");

/// A shipped preset.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Preset {
    /// Hugging Face id.
    pub model: String,
    /// Where the config comes from.
    pub source: String,
    /// The parsed config.
    pub config: ModelConfig,
}

fn entries() -> impl Iterator<Item = (usize, Value)> {
    entries_of(PRESETS)
}

fn entries_of(text: &str) -> impl Iterator<Item = (usize, Value)> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .filter_map(|(i, l)| serde_json::from_str(l).ok().map(|v| (i, v)))
}

fn id_of(v: &Value) -> Option<&str> {
    v.get("model").and_then(Value::as_str)
}

/// Every preset id.
pub fn names() -> Vec<String> {
    entries()
        .filter_map(|(_, v)| id_of(&v).map(str::to_string))
        .collect()
}

fn matches(id: &str, query: &str) -> bool {
    let q = query.to_ascii_lowercase();
    let id = id.to_ascii_lowercase();
    id == q || id.rsplit('/').next() == Some(q.as_str())
}

/// The preset named `name`, or an error listing the presets.
pub fn find(name: &str) -> Result<Preset> {
    match find_in(PRESETS, name)? {
        Some(p) => Ok(p),
        None => Err(not_found(name)),
    }
}

/// Look `name` up in a JSONL text with the presets' layout (`{"model", "source", "config"}`
/// per line), e.g. configs of held-back logs. `Ok(None)` when no line names it.
///
/// A line that is not JSON is an error naming it, not skipped: a skipped line would leave the
/// logs of its model unchecked without a word.
pub fn find_in(text: &str, name: &str) -> Result<Option<Preset>> {
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        memplan_core::json::from_str::<Value>(l)
            .map_err(|e| Error::invalid("model configs", format!("line {}: {e}", i + 1)))?;
    }
    for (line, v) in entries_of(text) {
        let Some(id) = id_of(&v) else { continue };
        if !matches(id, name) {
            continue;
        }
        let config = v
            .get("config")
            .ok_or_else(|| {
                Error::invalid(
                    "crates/memplan-model/models/model-configs.jsonl",
                    format!("line {}: no config", line + 1),
                )
            })
            .and_then(ModelConfig::from_value)
            .map_err(|e| Error::invalid(format!("config of {id}"), e.to_string()))?;
        let source = v
            .get("source")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        return Ok(Some(Preset {
            model: id.to_string(),
            source,
            config,
        }));
    }
    Ok(None)
}

fn not_found(name: &str) -> Error {
    let short: Vec<String> = names()
        .iter()
        .map(|n| n.rsplit('/').next().unwrap_or(n).to_ascii_lowercase())
        .collect();
    Error::param(
        Param::Model,
        format!(
            "{name:?} is neither a path nor a shipped preset; presets: {}",
            short.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses() {
        let n = names();
        assert!(n.len() >= 17, "{n:?}");
        for name in n {
            let p = find(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(p.config.num_layers > 0);
        }
    }

    #[test]
    fn a_broken_line_of_extra_configs_is_an_error() {
        let text = "{\"model\":\"a/b\",\"config\":{}}\n{not json\n";
        let e = find_in(text, "x/y").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn lookup_by_short_name() {
        assert_eq!(
            find("QWEN2.5-1.5B-INSTRUCT").unwrap().model,
            "Qwen/Qwen2.5-1.5B-Instruct"
        );
        let e = find("no-such-model").unwrap_err().to_string();
        assert!(
            e.starts_with("model:") && e.contains("qwen2.5-0.5b-instruct"),
            "{e}"
        );
    }
}
