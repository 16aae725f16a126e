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
pub struct Quantization {
    /// `quant_method` as written (`fp8`, `gptq`, `awq`, `mxfp4`, `compressed-tensors`, ...).
    pub method: String,
    /// Effective bits per quantized weight, scales and zero points included.
    pub bits_per_weight: f64,
    /// Whether attention projections are quantized (gpt-oss keeps them in bf16).
    pub attention: bool,
}

impl Quantization {
    /// vLLM's online fp8 (`--quantization fp8`): 8-bit weights, per-tensor scales.
    pub fn fp8_online() -> Self {
        Quantization {
            method: "fp8".into(),
            bits_per_weight: 8.0,
            attention: true,
        }
    }

    /// Bytes of `params` quantized weights.
    pub fn bytes(&self, params: u64) -> u64 {
        (params as f64 * self.bits_per_weight / 8.0).ceil() as u64
    }

    /// Parse a `quantization_config` object. Unknown methods are an error naming
    /// `quantization_config.quant_method`.
    pub fn from_config(v: &Value) -> Result<Self> {
        let field = "quantization_config.quant_method";
        let o = v
            .as_object()
            .ok_or_else(|| Error::invalid("quantization_config", "expected an object"))?;
        let method = o
            .get("quant_method")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::invalid(field, "missing"))?
            .to_ascii_lowercase();
        let num = |k: &str| o.get(k).and_then(Value::as_f64);
        let skip = o.get("modules_to_not_convert").or_else(|| o.get("ignore"));
        let attention = !skip.and_then(Value::as_array).is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|s| s.contains("self_attn") || s.contains("attn"))
        });
        let grouped = |bits: f64, group: Option<f64>, zero: bool| -> Result<f64> {
            let g = group.unwrap_or(128.0);
            // group_size -1 means per-channel: scales are negligible.
            let per_group = if g <= 0.0 {
                0.0
            } else {
                (16.0 + if zero { bits } else { 0.0 }) / g
            };
            if !(1.0..=16.0).contains(&bits) {
                return Err(Error::invalid(
                    "quantization_config.bits",
                    format!("{bits} is not a weight bit width"),
                ));
            }
            Ok(bits + per_group)
        };
        let bits_per_weight = match method.as_str() {
            "fp8" | "fbgemm_fp8" | "modelopt" => 8.0,
            "mxfp4" => 4.25, // 4-bit values + one 8-bit scale per 32
            "nvfp4" | "modelopt_fp4" => 4.5,
            "gptq" | "awq" | "gptq_marlin" | "awq_marlin" => {
                let bits = num("bits").or_else(|| num("w_bit")).unwrap_or(4.0);
                grouped(
                    bits,
                    num("group_size").or_else(|| num("q_group_size")),
                    true,
                )?
            }
            "bitsandbytes" => {
                if o.get("load_in_8bit").and_then(Value::as_bool) == Some(true) {
                    8.0
                } else {
                    4.0 + 32.0 / 64.0 / 8.0 // nf4 with one fp32 absmax per 64 (double-quant ignored)
                }
            }
            "compressed-tensors" => {
                let w = o
                    .get("config_groups")
                    .and_then(Value::as_object)
                    .and_then(|g| g.values().next())
                    .and_then(|g| g.get("weights"))
                    .ok_or_else(|| {
                        Error::invalid("quantization_config.config_groups", "no weights scheme")
                    })?;
                let bits = w.get("num_bits").and_then(Value::as_f64).unwrap_or(8.0);
                let float = w.get("type").and_then(Value::as_str) == Some("float");
                let group = w.get("group_size").and_then(Value::as_f64);
                let zero = w.get("symmetric").and_then(Value::as_bool) == Some(false);
                if float || group.is_none() {
                    bits
                } else {
                    grouped(bits, group, zero)?
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
        })
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
}
