//! Where a wrapper keeps its language model, and the transformers config-class defaults for
//! keys a `config.json` may omit (multimodal `text_config`s often name only what differs
//! from `LlamaConfig`, `MistralConfig`, ...). vLLM reads configs through those classes, so a
//! missing key is the class default, not an error.

use memplan_core::{Error, Result};
use serde_json::{Map, Value};

/// Keys that hold a wrapper's language model, in the order vLLM's `get_hf_text_config`
/// and the model classes look for them.
pub const LANGUAGE_KEYS: &[&str] = &["text_config", "llm_config", "language_config"];

/// A config section and the key it was under (`None`: the top level).
pub type Section<'a> = (Option<&'a Map<String, Value>>, Option<String>);

/// The language-model section of a config, and the key it was under (`None`: top level).
pub fn language_section(top: &Map<String, Value>) -> Result<Section<'_>> {
    for key in LANGUAGE_KEYS {
        match top.get(*key) {
            Some(Value::Object(t)) => return Ok((Some(t), Some((*key).to_string()))),
            Some(Value::Null) | None => {}
            Some(_) => return Err(Error::invalid(*key, "expected an object")),
        }
    }
    // Qwen2.5-Omni / Qwen3-Omni keep it one level deeper.
    if let Some(Value::Object(t)) = top.get("thinker_config") {
        if let Some(Value::Object(text)) = t.get("text_config") {
            return Ok((Some(text), Some("thinker_config.text_config".into())));
        }
    }
    Ok((None, None))
}

/// Defaults of the transformers config class for a `model_type` (only keys memplan reads).
fn class_defaults(model_type: &str) -> &'static [(&'static str, i64)] {
    match model_type {
        // LlamaConfig (Llava's text_config, InternLM3, Vicuna-based wrappers).
        "llama" => &[
            ("hidden_size", 4096),
            ("intermediate_size", 11008),
            ("num_hidden_layers", 32),
            ("num_attention_heads", 32),
            ("vocab_size", 32000),
            ("max_position_embeddings", 2048),
        ],
        // MistralConfig (Pixtral-HF, Llava-Next-Mistral).
        "mistral" => &[
            ("hidden_size", 4096),
            ("intermediate_size", 14336),
            ("num_hidden_layers", 32),
            ("num_attention_heads", 32),
            ("num_key_value_heads", 8),
            ("vocab_size", 32000),
            ("max_position_embeddings", 131_072),
        ],
        // Qwen2Config.
        "qwen2" => &[
            ("hidden_size", 4096),
            ("intermediate_size", 22016),
            ("num_hidden_layers", 32),
            ("num_attention_heads", 32),
            ("num_key_value_heads", 32),
            ("vocab_size", 151_936),
            ("max_position_embeddings", 32768),
        ],
        // MllamaTextConfig.
        "mllama_text_model" => &[
            ("hidden_size", 4096),
            ("intermediate_size", 14336),
            ("num_hidden_layers", 40),
            ("num_attention_heads", 32),
            ("num_key_value_heads", 8),
            ("vocab_size", 128_256),
            ("max_position_embeddings", 131_072),
        ],
        _ => &[],
    }
}

/// `section` with the class defaults of its `model_type` added for absent keys (a key set
/// at the top level of a wrapper counts as present).
pub fn with_defaults(section: &Map<String, Value>, top: &Map<String, Value>) -> Map<String, Value> {
    let mut out = section.clone();
    let model_type = section
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    for (k, v) in class_defaults(model_type) {
        let absent = |m: &Map<String, Value>| m.get(*k).is_none_or(Value::is_null);
        if absent(section) && (std::ptr::eq(section, top) || absent(top)) {
            out.insert((*k).to_string(), Value::from(*v));
        }
    }
    out
}
