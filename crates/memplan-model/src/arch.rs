//! Per-architecture parsing: which keys, which defaults, which layers slide.

use memplan_core::{Error, Result};
use serde_json::{Map, Value};

use crate::config::{Family, Fields, Mla, ModelConfig, Moe, Vision};

/// Architectures accepted by [`ModelConfig::from_json_str`].
pub const KNOWN: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Phi3ForCausalLM",
    "PhiForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
    "PixtralForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
];

pub(crate) fn parse(arch: &str, f: &Fields<'_>, top: &Map<String, Value>) -> Result<ModelConfig> {
    let a = arch.to_string();
    let mut c = match arch {
        "LlamaForCausalLM" | "MistralForCausalLM" | "Phi3ForCausalLM" | "Qwen3ForCausalLM" => {
            let mut c = ModelConfig::dense(a, Family::Dense, f)?;
            c.sliding = uniform_window(f, c.num_layers)?;
            c
        }
        "Qwen2ForCausalLM" => {
            let mut c = ModelConfig::dense(a, Family::Dense, f)?;
            c.qkv_bias = true;
            c.sliding = qwen2_window(f, c.num_layers)?;
            c
        }
        "PixtralForConditionalGeneration" | "Mistral3ForConditionalGeneration" => {
            let mut c = ModelConfig::dense(a, Family::Dense, f)?;
            c.sliding = uniform_window(f, c.num_layers)?;
            c.vision = vision(top, true)?;
            c
        }
        "MixtralForCausalLM" => {
            let mut c = ModelConfig::dense(a, Family::Moe, f)?;
            c.sliding = uniform_window(f, c.num_layers)?;
            let e = f.positive("num_local_experts")?;
            c.moe = Some(Moe {
                num_experts: e,
                top_k: f.positive("num_experts_per_tok")?,
                expert_intermediate: c.intermediate_size,
                shared_intermediate: 0,
                dense_layers: 0,
            });
            c
        }
        "Qwen3MoeForCausalLM" => {
            let mut c = ModelConfig::dense(a, Family::Moe, f)?;
            let dense_layers = match f.get("mlp_only_layers").and_then(Value::as_array) {
                Some(l) => l.len() as u64,
                None => 0,
            };
            c.moe = Some(Moe {
                num_experts: f.positive("num_experts")?,
                top_k: f.positive("num_experts_per_tok")?,
                expert_intermediate: f.positive("moe_intermediate_size")?,
                shared_intermediate: 0,
                dense_layers,
            });
            c
        }
        "GptOssForCausalLM" => {
            let mut c = ModelConfig::dense(a, Family::Moe, f)?;
            c.qkv_bias = true;
            let top_k = match f.opt_u64("num_experts_per_tok")? {
                Some(k) => k,
                None => f.positive("experts_per_token")?,
            };
            c.moe = Some(Moe {
                num_experts: f.positive("num_local_experts")?,
                top_k,
                expert_intermediate: c.intermediate_size,
                shared_intermediate: 0,
                dense_layers: 0,
            });
            c.sliding = layer_types(f, c.num_layers)?.ok_or_else(|| {
                Error::invalid(
                    "layer_types",
                    "missing (gpt-oss alternates sliding and full layers)",
                )
            })?;
            c
        }
        "Gemma2ForCausalLM" | "Gemma3ForCausalLM" | "Gemma3ForConditionalGeneration" => {
            return gemma(a, f, top)
        }
        "DeepseekV2ForCausalLM" | "DeepseekV3ForCausalLM" => {
            let mut c = ModelConfig::dense(a, Family::DeepSeek, f)?;
            let q = f.opt_u64("q_lora_rank")?.unwrap_or(0);
            c.mla = Some(Mla {
                kv_lora_rank: f.positive("kv_lora_rank")?,
                q_lora_rank: q,
                qk_rope_head_dim: f.positive("qk_rope_head_dim")?,
                qk_nope_head_dim: f.positive("qk_nope_head_dim")?,
                v_head_dim: f.positive("v_head_dim")?,
            });
            let shared = f.opt_u64("n_shared_experts")?.unwrap_or(0);
            let ei = f.positive("moe_intermediate_size")?;
            c.moe = Some(Moe {
                num_experts: f.positive("n_routed_experts")?,
                top_k: f.positive("num_experts_per_tok")?,
                expert_intermediate: ei,
                shared_intermediate: shared * ei,
                dense_layers: f
                    .opt_u64("first_k_dense_replace")?
                    .unwrap_or(0)
                    .min(c.num_layers),
            });
            c
        }
        "PhiForCausalLM" => {
            let mut c = ModelConfig::dense(a, Family::Phi2, f)?;
            c.qkv_bias = true;
            c
        }
        other => {
            return Err(Error::invalid(
                "architectures",
                format!(
                    "unknown architecture {other:?}; memplan knows {}",
                    KNOWN.join(", ")
                ),
            ));
        }
    };
    if let Some(t) = layer_types(f, c.num_layers)? {
        c.sliding = t;
    }
    Ok(c)
}

/// Gemma 2/3: tied embeddings, sliding layers interleaved with full ones, defaults from
/// transformers' config classes for keys the file may omit (Gemma 3's `text_config`).
fn gemma(a: String, f: &Fields<'_>, top: &Map<String, Value>) -> Result<ModelConfig> {
    let v3 = a.starts_with("Gemma3");
    let mut map = f.map.clone();
    // Both config classes default to 8 heads, 4 KV heads and a head dim of 256 (not
    // hidden_size / heads); Gemma 3's multimodal configs omit them from `text_config`.
    let defaults: &[(&str, Value)] = if v3 {
        &[
            ("vocab_size", Value::from(262_208)),
            ("max_position_embeddings", Value::from(131_072)),
            ("sliding_window", Value::from(4096)),
            ("tie_word_embeddings", Value::from(true)),
            ("num_attention_heads", Value::from(8)),
            ("num_key_value_heads", Value::from(4)),
            ("head_dim", Value::from(256)),
        ]
    } else {
        &[
            ("sliding_window", Value::from(4096)),
            ("tie_word_embeddings", Value::from(true)),
            ("num_attention_heads", Value::from(8)),
            ("num_key_value_heads", Value::from(4)),
            ("head_dim", Value::from(256)),
        ]
    };
    for (k, v) in defaults {
        let absent = |v: Option<&Value>| v.is_none_or(Value::is_null);
        if absent(map.get(*k)) && absent(f.outer.and_then(|o| o.get(*k))) {
            map.insert((*k).to_string(), v.clone());
        }
    }
    let g = Fields {
        map: &map,
        outer: f.outer,
    };
    let mut c = ModelConfig::dense(a, Family::Gemma, &g)?;
    let window = g.positive("sliding_window")?;
    c.sliding = match layer_types(&g, c.num_layers)? {
        Some(t) => t,
        None if v3 => {
            let pattern = g.opt_u64("sliding_window_pattern")?.unwrap_or(6).max(1);
            (0..c.num_layers)
                .map(|i| ((i + 1) % pattern != 0).then_some(window))
                .collect()
        }
        None => (0..c.num_layers)
            .map(|i| (i % 2 == 0).then_some(window))
            .collect(),
    };
    if v3 {
        c.vision = vision(top, false)?;
    }
    Ok(c)
}

/// `sliding_window` applies to every layer when set (Mistral v0.1, Phi-3), unless
/// `use_sliding_window` is false.
fn uniform_window(f: &Fields<'_>, layers: u64) -> Result<Vec<Option<u64>>> {
    let on = f
        .get("use_sliding_window")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let w = if on {
        f.opt_u64("sliding_window")?.filter(|w| *w > 0)
    } else {
        None
    };
    Ok(vec![w; layers as usize])
}

/// Qwen2: sliding only with `use_sliding_window`, and only for layers >= `max_window_layers`.
fn qwen2_window(f: &Fields<'_>, layers: u64) -> Result<Vec<Option<u64>>> {
    if f.get("use_sliding_window").and_then(Value::as_bool) != Some(true) {
        return Ok(vec![None; layers as usize]);
    }
    let w = f.positive("sliding_window")?;
    let from = f.opt_u64("max_window_layers")?.unwrap_or(layers);
    Ok((0..layers).map(|i| (i >= from).then_some(w)).collect())
}

/// An explicit `layer_types` list, when present.
fn layer_types(f: &Fields<'_>, layers: u64) -> Result<Option<Vec<Option<u64>>>> {
    let Some(list) = f.get("layer_types") else {
        return Ok(None);
    };
    let list = list
        .as_array()
        .ok_or_else(|| Error::invalid("layer_types", "expected a list"))?;
    if list.len() as u64 != layers {
        return Err(Error::invalid(
            "layer_types",
            format!("{} entries for {layers} layers", list.len()),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for t in list {
        out.push(match t.as_str() {
            Some("full_attention") => None,
            Some("sliding_attention") => Some(f.positive("sliding_window")?),
            _ => {
                return Err(Error::invalid(
                    "layer_types",
                    format!(
                        "unsupported layer type {t} (memplan sizes full and sliding attention)"
                    ),
                ))
            }
        });
    }
    Ok(Some(out))
}

fn vision(top: &Map<String, Value>, gated: bool) -> Result<Option<Vision>> {
    let Some(Value::Object(v)) = top.get("vision_config") else {
        return Ok(None);
    };
    let f = Fields {
        map: v,
        outer: None,
    };
    Ok(Some(Vision {
        hidden: f.positive("hidden_size")?,
        layers: f.positive("num_hidden_layers")?,
        intermediate: f.positive("intermediate_size")?,
        patch: f.opt_u64("patch_size")?.unwrap_or(14),
        gated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;
    use memplan_core::kv::{AttentionKind, KvDtype};

    fn parse_err(json: &str) -> String {
        ModelConfig::from_json_str(json).unwrap_err().to_string()
    }

    #[test]
    fn gemma3_interleaves_five_sliding_per_full() {
        let c = presets::find("gemma-3-27b-it").unwrap().config;
        assert_eq!((c.num_layers, c.vocab_size, c.head_dim), (62, 262_208, 128));
        let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
        let counts: Vec<_> = spec
            .groups
            .iter()
            .map(|g| (g.attention, g.num_layers))
            .collect();
        assert_eq!(
            counts,
            vec![
                (AttentionKind::SlidingWindow { window: 1024 }, 52),
                (AttentionKind::Full, 10)
            ]
        );
        assert!(c.vision.is_some());
    }

    #[test]
    fn gemma_head_defaults_are_the_config_classes() {
        // Gemma 3 4B's config.json: the text_config names only what differs from
        // Gemma3TextConfig's defaults (8 heads, 4 KV heads, head dim 256).
        let g3 = r#"{"architectures":["Gemma3ForConditionalGeneration"],
            "text_config":{"hidden_size":2560,"intermediate_size":10240,"model_type":"gemma3_text",
            "num_hidden_layers":34,"sliding_window":1024},"torch_dtype":"bfloat16"}"#;
        let c = ModelConfig::from_json_str(g3).unwrap();
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (8, 4, 256));
        let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
        assert_eq!(spec.groups.len(), 2);
        assert_eq!(spec.groups[0].head_dim_k, 256);
        // Gemma 2 without head_dim: 256, not hidden_size / heads (3584 / 16 = 224).
        let g2 = r#"{"architectures":["Gemma2ForCausalLM"],"hidden_size":3584,"num_hidden_layers":42,
            "num_attention_heads":16,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":256000}"#;
        assert_eq!(ModelConfig::from_json_str(g2).unwrap().head_dim, 256);
    }

    #[test]
    fn gpt_oss_and_qwen_windows() {
        let c = presets::find("gpt-oss-20b").unwrap().config;
        let spec = c.kv_spec(KvDtype::Bf16, 16, 1).unwrap();
        assert_eq!(spec.groups.len(), 2);
        assert_eq!(spec.groups[0].num_layers, 12);
        // Qwen2.5 has sliding_window set but use_sliding_window false: all full.
        let q = presets::find("qwen2.5-7b-instruct").unwrap().config;
        assert!(q.sliding.iter().all(Option::is_none));
        assert_eq!(
            q.kv_spec(KvDtype::Bf16, 16, 2).unwrap().groups[0].kv_heads,
            2
        );
    }

    #[test]
    fn deepseek_mla_and_phi2() {
        let ds = r#"{"architectures":["DeepseekV2ForCausalLM"],"hidden_size":5120,"num_hidden_layers":60,
            "num_attention_heads":128,"num_key_value_heads":128,"intermediate_size":12288,"vocab_size":102400,
            "kv_lora_rank":512,"q_lora_rank":1536,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,
            "moe_intermediate_size":1536,"n_routed_experts":160,"n_shared_experts":2,"num_experts_per_tok":6,
            "first_k_dense_replace":1,"torch_dtype":"bfloat16"}"#;
        let c = ModelConfig::from_json_str(ds).unwrap();
        let spec = c.kv_spec(KvDtype::Bf16, 64, 8).unwrap();
        assert_eq!(
            (
                spec.groups[0].attention,
                spec.groups[0].head_dim_k,
                spec.groups[0].kv_heads
            ),
            (AttentionKind::Mla, 576, 1)
        );
        let p = crate::weights::params_per_rank(&c, 1).unwrap().total() as f64;
        assert!(
            (230e9..245e9).contains(&p),
            "DeepSeek-V2 has 236B parameters, got {p}"
        );
        let phi2 = presets::find("phi-2").unwrap().config;
        assert_eq!(
            (phi2.hidden_size, phi2.num_kv_heads, phi2.intermediate_size),
            (2560, 32, 10240)
        );
        let p = crate::weights::params_per_rank(&phi2, 1).unwrap().total() as f64;
        assert!(
            (2.7e9..2.8e9).contains(&p),
            "phi-2 has 2.78B parameters, got {p}"
        );
    }

    #[test]
    fn malformed_configs_name_the_key() {
        assert!(parse_err("{").contains("config.json"));
        assert!(parse_err("[]").contains("config.json"));
        assert!(parse_err(r#"{"hidden_size":1}"#).starts_with("architectures"));
        assert!(
            parse_err(r#"{"architectures":["MambaForCausalLM"]}"#).contains("unknown architecture")
        );
        let base = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"vocab_size":32000"#;
        assert!(parse_err(
            &format!("{base}}}").replace("\"vocab_size\":32000", "\"vocab_size\":-1")
        )
        .starts_with("vocab_size"));
        assert!(parse_err(&format!("{base},\"num_key_value_heads\":5}}"))
            .starts_with("num_key_value_heads"));
        assert!(parse_err(&format!("{base},\"num_hidden_layers\":99999}}"))
            .starts_with("num_hidden_layers"));
        assert!(parse_err(&format!("{base},\"head_dim\":\"x\"}}")).starts_with("head_dim"));
        assert!(
            parse_err(&format!("{base},\"layer_types\":[\"full_attention\"]}}"))
                .starts_with("layer_types")
        );
        assert!(parse_err(&format!(
            "{base},\"quantization_config\":{{\"quant_method\":\"zz\"}}}}"
        ))
        .contains("quant_method"));
        let ok = ModelConfig::from_json_str(&format!("{base}}}")).unwrap();
        assert!(ok
            .kv_spec(KvDtype::Bf16, 16, 3)
            .unwrap_err()
            .to_string()
            .contains("tensor-parallel-size"));
    }
}
