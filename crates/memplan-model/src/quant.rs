//! Checkpoint quantization (`quantization_config` in `config.json`, or vLLM's online
//! `--quantization fp8`): how many bytes a quantized linear weight takes, scales included, and
//! which parts of the model stay unquantized.
//!
//! Bytes per weight: `bits / 8` plus group scales (`scale_bits / group_size`, and zero points
//! for asymmetric int schemes). Embeddings, the LM head, norms and routers are never quantized.

use memplan_core::{Error, Result};
use serde_json::Value;

/// A weight quantization scheme.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Quantization {
    /// `quant_method` as written (`fp8`, `gptq`, `awq`, `mxfp4`, `compressed-tensors`, ...).
    pub method: String,
    /// Effective bits per quantized weight, scales and zero points included.
    pub bits_per_weight: f64,
    /// Whether attention projections (and hybrid models' Mamba / gated-DeltaNet projections)
    /// are quantized (gpt-oss keeps them in bf16).
    pub attention: bool,
    /// Whether shared experts are quantized (Qwen3.5's NVFP4 checkpoints keep them in bf16).
    pub shared_experts: bool,
}

impl Quantization {
    /// vLLM's online fp8 (`--quantization fp8`): 8-bit weights, per-tensor scales.
    pub fn fp8_online() -> Self {
        Quantization {
            method: "fp8".into(),
            bits_per_weight: 8.0,
            attention: true,
            shared_experts: true,
        }
    }

    /// Bytes of `params` quantized weights.
    pub fn bytes(&self, params: u64) -> u64 {
        (params as f64 * self.bits_per_weight / 8.0).ceil() as u64
    }

    /// Parse a `quantization_config` object. Every field read is type- and range-checked
    /// against what the engines accept (vLLM `GPTQConfig`: 2, 3, 4 or 8 bits; `AWQConfig`: 4
    /// bits; `group_size` -1 or a positive integer), with the key in the error: a string
    /// `"bits": "8"` is an error, never silently the 4-bit default. Unknown methods are an
    /// error naming `quantization_config.quant_method`.
    pub fn from_config(v: &Value) -> Result<Self> {
        let field = "quantization_config.quant_method";
        let o = v
            .as_object()
            .ok_or_else(|| Error::invalid("quantization_config", "expected an object"))?;
        let method = match o.get("quant_method") {
            Some(Value::String(m)) => m.to_ascii_lowercase(),
            Some(other) => {
                return Err(Error::invalid(
                    field,
                    format!("expected a method name, found {other}"),
                ))
            }
            None => return Err(Error::invalid(field, "missing")),
        };
        let skip = o.get("modules_to_not_convert").or_else(|| o.get("ignore"));
        let skipped = || {
            skip.and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_ascii_lowercase)
        };
        // A token mixer's projections: attention's, and the Mamba mixer's in Nemotron-H, whose
        // blocks are all named `mixer` (ModelOpt's `exclude_modules` of
        // NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4 name `mixer.in_proj`, `mixer.q_proj`, ...).
        const MIXER: &[&str] = &[
            "attn", "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "in_proj", "out_proj",
            "conv1d",
        ];
        let mixer = |m: &str| MIXER.iter().any(|w| m.contains(w));
        let attention = !skipped().any(|s| mixer(&s));
        let shared_experts = !skipped().any(|s| s.contains("shared_expert"));
        // ModelOpt names its weight format in `quant_algo` (`FP8`, `NVFP4`; vLLM
        // `modelopt.py`: `ModelOptFp8Config`, `ModelOptNvFp4Config`).
        let algo = o
            .get("quant_algo")
            .and_then(Value::as_str)
            .map(str::to_ascii_uppercase);
        // Modules left unquantized beyond attention and other mixers, shared experts, the head
        // and the routers are weights memplan would count as quantized: 4.5 bits a weight
        // would then count them short, so such a checkpoint is counted at 8 bits, above what
        // it holds.
        // Shared experts and mixers left unquantized are counted in full precision (above).
        let mlp_kept = skipped().any(|m| {
            ["mlp", "expert", "mixer", "ffn", "feed_forward"]
                .iter()
                .any(|w| m.contains(w))
                && !m.contains("gate.")
                && !m.ends_with(".gate")
                && !m.ends_with("mlp.gate")
                && !m.contains("shared_expert")
                && !mixer(&m)
        });
        let bits_per_weight = match method.as_str() {
            "modelopt" if algo.as_deref() == Some("NVFP4") && !mlp_kept => 4.5,
            "fp8" | "fbgemm_fp8" | "modelopt" => 8.0,
            "mxfp4" => 4.25, // 4-bit values + one 8-bit scale per 32
            "nvfp4" | "modelopt_fp4" => 4.5,
            "gptq" | "awq" | "gptq_marlin" | "awq_marlin" => {
                let q = Keys {
                    map: o,
                    prefix: "quantization_config",
                };
                let (bkey, bits) = q.int_of(&["bits", "w_bit"])?.unwrap_or(("bits", 4));
                let allowed: &[i64] = if method.starts_with("awq") {
                    &[4]
                } else {
                    &[2, 3, 4, 8]
                };
                if !allowed.contains(&bits) {
                    return Err(q.bad(
                        bkey,
                        format!("{bits}-bit weights: {method} takes {allowed:?} bits"),
                    ));
                }
                let group = q.group(&["group_size", "q_group_size"])?;
                grouped(bits as f64, group, true)
            }
            "bitsandbytes" => {
                let q = Keys {
                    map: o,
                    prefix: "quantization_config",
                };
                if q.bool("load_in_8bit")? == Some(true) {
                    8.0
                } else {
                    // 4-bit values and one fp32 absmax per block of 64 (bitsandbytes
                    // `functional.quantize_4bit`, blocksize 64); with
                    // `bnb_4bit_use_double_quant` the absmax is itself 8-bit, with one fp32
                    // scale per 256 of them (`compress_statistics`: `quantize_blockwise(absmax,
                    // blocksize=256)`).
                    if q.bool("bnb_4bit_use_double_quant")? == Some(true) {
                        4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0)
                    } else {
                        4.0 + 32.0 / 64.0
                    }
                }
            }
            "compressed-tensors" => {
                let w = o
                    .get("config_groups")
                    .and_then(Value::as_object)
                    .and_then(|g| g.values().next())
                    .and_then(|g| g.get("weights"))
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        Error::invalid("quantization_config.config_groups", "no weights scheme")
                    })?;
                let q = Keys {
                    map: w,
                    prefix: "quantization_config.config_groups.*.weights",
                };
                let bits = match q.int_of(&["num_bits"])? {
                    None => 8,
                    Some((k, b)) if !(1..=16).contains(&b) => {
                        return Err(q.bad(k, format!("{b} is not a weight bit width (1 to 16)")))
                    }
                    Some((_, b)) => b,
                };
                let float = match w.get("type") {
                    None | Some(Value::Null) => false,
                    Some(Value::String(t)) if t == "float" => true,
                    Some(Value::String(t)) if t == "int" => false,
                    Some(t) => {
                        return Err(
                            q.bad("type", format!("expected \"int\" or \"float\", found {t}"))
                        )
                    }
                };
                let group = q.group(&["group_size"])?;
                let zero = q.bool("symmetric")? == Some(false);
                if float || group.is_none() {
                    bits as f64
                } else {
                    grouped(bits as f64, group, zero)
                }
            }
            other => {
                return Err(Error::invalid(
                    field,
                    format!("unknown quantization method {other:?}"),
                ))
            }
        };
        Ok(Quantization {
            method,
            bits_per_weight,
            attention,
            shared_experts,
        })
    }
}

/// Bits per weight with group scales: a 16-bit scale per group (and a zero point of `bits`
/// bits for asymmetric schemes); `group` -1 (per channel) makes them negligible, `None` is
/// the common 128.
/// A quantization file beside a config (`hf_quant_config.json`, `quantize_config.json`),
/// read under the same rules as a config (regular file, 16 MiB cap): its name for errors and
/// its JSON.
pub fn read_json(path: &std::path::Path) -> Result<(String, Value)> {
    let name = path.display().to_string();
    let text = memplan_core::input::read_text(path, memplan_core::input::CONFIG_JSON)?;
    crate::config::check_json_shape(&text).map_err(|e| match e {
        Error::InvalidInput { message, .. } => Error::file(name.clone(), message),
        other => other,
    })?;
    let v: Value = memplan_core::json::from_str(&text).map_err(|e| e.in_file(&name))?;
    Ok((name, v))
}

/// The KV-cache algorithm a ModelOpt checkpoint's `hf_quant_config.json` (beside its
/// `config.json`) names at `quantization.kv_cache_quant_algo` (`FP8`), lower-cased; `None`
/// when it names none; `v` is that file read as JSON ([`read_json`]), `name` its path. A value
/// that is not a short name is an error naming the file, the key and the value.
pub fn modelopt_kv_algo(v: &Value, name: &str) -> Result<Option<String>> {
    let key = "quantization.kv_cache_quant_algo";
    match v.pointer("/quantization/kv_cache_quant_algo") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(a))
            if !a.is_empty()
                && a.len() <= 32
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c)) =>
        {
            Ok(Some(a.to_ascii_lowercase()))
        }
        Some(other) => {
            let shown: String = other.to_string().chars().take(80).collect();
            Err(Error::file_key(
                name,
                key,
                format!("{shown} is not a KV-cache algorithm name (such as \"FP8\")"),
            ))
        }
    }
}

/// The weight quantization a ModelOpt checkpoint's `hf_quant_config.json` names at
/// `quantization.quant_algo` (`FP8`, `NVFP4`) where its `config.json` has no
/// `quantization_config` (vLLM reads the file in that case: `modelopt.py`
/// `ModelOptQuantConfigBase.from_config` takes its `quantization` section); `None` when it
/// names none; `v` is that file read as JSON ([`read_json`]), `name` its path. The file's
/// modules left unquantized (`exclude_modules`) keep attention in full precision where they
/// name it.
pub fn modelopt_weights(v: &Value, name: &str) -> Result<Option<Quantization>> {
    let Some(q) = v.get("quantization").and_then(Value::as_object) else {
        return Ok(None);
    };
    if q.get("quant_algo").is_none_or(Value::is_null) {
        return Ok(None);
    }
    let mut section = q.clone();
    section.insert("quant_method".into(), Value::from("modelopt"));
    if let Some(x) = q.get("exclude_modules") {
        section.insert("ignore".into(), x.clone());
    }
    Quantization::from_config(&Value::Object(section))
        .map(Some)
        .map_err(|e| Error::file_key(name, "quantization.quant_algo", e.to_string()))
}

/// The weight quantization an AutoGPTQ checkpoint's `quantize_config.json` (beside a
/// `config.json` without `quantization_config`) gives: `bits` and `group_size`, as vLLM's
/// `GPTQConfig.get_config_filenames` reads it; `None` when it names no bits.
pub fn gptq_file(path: &std::path::Path) -> Result<Option<Quantization>> {
    let (name, v) = read_json(path)?;
    let Some(o) = v.as_object().filter(|o| o.contains_key("bits")) else {
        return Ok(None);
    };
    let mut section = o.clone();
    section
        .entry("quant_method")
        .or_insert_with(|| Value::from("gptq"));
    Quantization::from_config(&Value::Object(section))
        .map(Some)
        .map_err(|e| Error::file_key(&name, "bits", e.to_string()))
}

fn grouped(bits: f64, group: Option<i64>, zero: bool) -> f64 {
    match group.unwrap_or(128) {
        g if g > 0 => bits + (16.0 + if zero { bits } else { 0.0 }) / g as f64,
        _ => bits,
    }
}

/// Typed reads of one object of a `quantization_config`, with errors naming the full key.
struct Keys<'a> {
    map: &'a serde_json::Map<String, Value>,
    prefix: &'static str,
}

impl Keys<'_> {
    fn bad(&self, key: &str, message: String) -> Error {
        Error::invalid(format!("{}.{key}", self.prefix), message)
    }

    /// The first present key of `keys` as an integer (`8`, or `8.0`); a string, a fraction
    /// or any other type is an error.
    fn int_of<'k>(&self, keys: &[&'k str]) -> Result<Option<(&'k str, i64)>> {
        for k in keys {
            match self.map.get(*k) {
                None | Some(Value::Null) => continue,
                Some(v) => {
                    let n = v.as_i64().or_else(|| {
                        v.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                            .map(|f| f as i64)
                    });
                    return match n {
                        Some(n) => Ok(Some((k, n))),
                        None => Err(self.bad(k, format!("expected an integer, found {v}"))),
                    };
                }
            }
        }
        Ok(None)
    }

    /// A group size: -1 (per channel) or a positive integer.
    fn group(&self, keys: &[&str]) -> Result<Option<i64>> {
        match self.int_of(keys)? {
            None => Ok(None),
            Some((_, g)) if g == -1 || g > 0 => Ok(Some(g)),
            Some((k, g)) => Err(self.bad(
                k,
                format!("{g} is not a group size (-1 for per channel, or a positive integer)"),
            )),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(key, format!("expected true or false, found {v}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn methods() {
        let q = Quantization::from_config(
            &json!({"quant_method": "gptq", "bits": 4, "group_size": 128}),
        )
        .unwrap();
        assert!((q.bits_per_weight - (4.0 + 20.0 / 128.0)).abs() < 1e-9);
        let q = Quantization::from_config(&json!({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]})).unwrap();
        assert_eq!((q.bits_per_weight, q.attention), (4.25, false));
        assert_eq!(Quantization::fp8_online().bytes(1000), 1000);
        let e = Quantization::from_config(&json!({"quant_method": "magic"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("quant_method") && e.contains("magic"), "{e}");
        assert!(Quantization::from_config(&json!({"quant_method": "awq", "bits": 99})).is_err());
        assert!(Quantization::from_config(&json!([1])).is_err());
    }

    #[test]
    fn fields_are_type_and_range_checked_naming_the_key() {
        for (cfg, key) in [
            // A string is not silently the 4-bit default.
            (
                json!({"quant_method": "gptq", "bits": "8"}),
                "quantization_config.bits",
            ),
            (
                json!({"quant_method": "gptq", "bits": 5}),
                "quantization_config.bits",
            ),
            (
                json!({"quant_method": "gptq", "bits": 4.5}),
                "quantization_config.bits",
            ),
            (
                json!({"quant_method": "awq", "w_bit": 8}),
                "quantization_config.w_bit",
            ),
            (
                json!({"quant_method": "gptq", "bits": 4, "group_size": 0}),
                "quantization_config.group_size",
            ),
            (
                json!({"quant_method": "gptq", "bits": 4, "group_size": "128"}),
                "quantization_config.group_size",
            ),
            (
                json!({"quant_method": 7}),
                "quantization_config.quant_method",
            ),
            (
                json!({"quant_method": "bitsandbytes", "load_in_8bit": "yes"}),
                "quantization_config.load_in_8bit",
            ),
            (
                json!({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": -8, "type": "int"}}}}),
                "quantization_config.config_groups.*.weights.num_bits",
            ),
            (
                json!({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8, "type": 3}}}}),
                "quantization_config.config_groups.*.weights.type",
            ),
        ] {
            let e = Quantization::from_config(&cfg).unwrap_err().to_string();
            assert!(e.starts_with(key), "{cfg}: {e}");
        }
        let q = Quantization::from_config(
            &json!({"quant_method": "gptq", "bits": 8, "group_size": -1}),
        )
        .unwrap();
        assert_eq!(q.bits_per_weight, 8.0);
        let q = Quantization::from_config(&json!({"quant_method": "gptq", "bits": 8.0})).unwrap();
        assert!(q.bits_per_weight > 8.0);
    }
}
