//! Reading configs: the shipped presets and malformed input.
use crate::presets;
use crate::ModelConfig;
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
    assert!(q
        .layers
        .iter()
        .all(|k| *k == crate::config::LayerKind::Full));
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
    // An architecture outside the table is read by the generic rule: a missing key is
    // named, not the architecture.
    assert!(parse_err(r#"{"architectures":["MambaForCausalLM"]}"#).starts_with("hidden_size"));
    let base = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"vocab_size":32000"#;
    assert!(
        parse_err(&format!("{base}}}").replace("\"vocab_size\":32000", "\"vocab_size\":-1"))
            .starts_with("vocab_size")
    );
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
    // The library names the concept; the CLI maps `Param::TensorParallel` to its flag.
    assert!(matches!(
        ok.kv_spec(KvDtype::Bf16, 16, 3),
        Err(memplan_core::Error::InvalidParam {
            param: memplan_core::Param::TensorParallel,
            ..
        })
    ));
}

#[test]
fn config_values_are_type_and_range_checked() {
    let base = r#"{"architectures":["MixtralForCausalLM"],"hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":32000,"num_local_experts":8,"num_experts_per_tok":2"#;
    assert!(ModelConfig::from_json_str(&format!("{base}}}")).is_ok());
    // More experts per token than experts.
    let e = parse_err(
        &format!("{base}}}").replace("\"num_experts_per_tok\":2", "\"num_experts_per_tok\":9"),
    );
    assert!(
        e.starts_with("num_experts_per_tok") && e.contains("only 8"),
        "{e}"
    );
    // The value as written, not a value the user never wrote.
    let e = parse_err(&format!("{base}}}").replace("\"vocab_size\":32000", "\"vocab_size\":1e30"));
    assert!(
        e.contains("1e+30") && !e.contains("18446744073709551615"),
        "{e}"
    );
    // A dtype that is not one, or not a string.
    for d in ["\"int3\"", "5", "[]"] {
        let e = parse_err(&format!("{base},\"torch_dtype\":{d}}}"));
        assert!(e.starts_with("torch_dtype"), "{d}: {e}");
    }
    // Quantization fields are typed: "8" is not silently the 4-bit default.
    let e = parse_err(&format!(
        "{base},\"quantization_config\":{{\"quant_method\":\"gptq\",\"bits\":\"8\"}}}}"
    ));
    assert!(e.starts_with("quantization_config.bits"), "{e}");
}

/// Set `key` of a JSON object (one level deep with `section.key`) to `value`.
fn with(json: &str, key: &str, value: serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
    match key.split_once('.') {
        Some((s, k)) => v[s][k] = value,
        None => v[key] = value,
    }
    v.to_string()
}

/// A dimension of 0 the model's arithmetic needs positive is refused naming the key that
/// held it (an alias too), in every family's reader; keys whose 0 means "none" still read.
#[test]
fn a_dimension_of_zero_is_refused_naming_its_key() {
    let llama = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"head_dim":128}"#;
    let qwen3_moe = r#"{"architectures":["Qwen3MoeForCausalLM"],"model_type":"qwen3_moe","hidden_size":2048,"num_hidden_layers":48,"num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,"intermediate_size":6144,"moe_intermediate_size":768,"num_experts":128,"num_experts_per_tok":8,"vocab_size":151936}"#;
    let jamba = r#"{"architectures":["JambaForCausalLM"],"model_type":"jamba","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"num_experts":16,"num_experts_per_tok":2,"attn_layer_period":8,"attn_layer_offset":4,"mamba_d_state":16,"mamba_d_conv":4,"mamba_expand":2,"vocab_size":65536}"#;
    let gpt2 = r#"{"architectures":["GPT2LMHeadModel"],"model_type":"gpt2","n_embd":768,"n_layer":12,"n_head":12,"n_inner":3072,"vocab_size":50257}"#;
    for (base, key) in [
        (llama, "intermediate_size"),
        (llama, "hidden_size"),
        (llama, "num_hidden_layers"),
        (llama, "num_attention_heads"),
        (llama, "num_key_value_heads"),
        (llama, "head_dim"),
        (llama, "vocab_size"),
        (qwen3_moe, "moe_intermediate_size"),
        (qwen3_moe, "num_experts_per_tok"),
        (jamba, "mamba_d_state"),
        (jamba, "mamba_d_conv"),
        (jamba, "mamba_expand"),
        (gpt2, "n_inner"),
        (gpt2, "n_embd"),
        (gpt2, "n_head"),
    ] {
        assert!(ModelConfig::from_json_str(base).is_ok(), "{key}");
        let e = parse_err(&with(base, key, 0.into()));
        assert!(e.starts_with(&format!("{key}: must be > 0")), "{key}: {e}");
    }
    // Every layer of this Qwen3-MoE has experts: its dense width is read by no layer.
    let c = ModelConfig::from_json_str(&with(qwen3_moe, "intermediate_size", 0.into())).unwrap();
    assert_eq!(c.moe.unwrap().expert_intermediate, 768);
    // ... but one dense layer reads it.
    let one_dense = with(qwen3_moe, "mlp_only_layers", serde_json::json!([0]));
    let e = parse_err(&with(&one_dense, "intermediate_size", 0.into()));
    assert!(e.starts_with("intermediate_size: must be > 0"), "{e}");
    // 0 meaning "none": no experts (a dense model), no Q compression, no sliding window.
    let c = ModelConfig::from_json_str(&with(qwen3_moe, "num_experts", 0.into())).unwrap();
    assert!(c.moe.is_none());
    assert!(ModelConfig::from_json_str(&with(llama, "num_kv_shared_layers", 0.into())).is_ok());
    // `null` is absent: the head size is derived.
    let c = ModelConfig::from_json_str(&with(llama, "head_dim", serde_json::Value::Null)).unwrap();
    assert_eq!(c.head_dim, 128);
}

/// A config of many tiny keys or values (each a `serde_json::Value` in memory, copied where
/// sections merge) or nested past serde_json's limit is refused before it is parsed, naming
/// the limit; one at the limit still reads.
#[test]
fn a_config_past_its_keys_or_nesting_limit_is_refused_before_parsing() {
    use crate::config::{MAX_JSON_DEPTH, MAX_JSON_ITEMS};
    let llama = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256"#;
    let keys = |n: usize| -> String {
        let extra: String = (0..n).map(|i| format!(",\"k{i:x}\":0")).collect();
        format!("{llama}{extra}}}")
    };
    let base_items = 19;
    assert!(ModelConfig::from_json_str(&keys((MAX_JSON_ITEMS - base_items) / 2)).is_ok());
    let e = parse_err(&keys(MAX_JSON_ITEMS / 2 + 1));
    assert!(
        e.contains(&format!("more than {MAX_JSON_ITEMS} keys and values")),
        "{e}"
    );
    let zeros = vec!["0"; MAX_JSON_ITEMS].join(",");
    let e = parse_err(&format!("{llama},\"a\":[{zeros}]}}"));
    assert!(e.contains("keys and values"), "{e}");
    // Strings with escaped quotes and brackets inside count once.
    assert!(ModelConfig::from_json_str(&format!("{llama},\"s\":\"[[{{\\\"\\\\\"}}")).is_ok());
    let deep = format!(
        "{llama},\"d\":{}{}}}",
        "[".repeat(MAX_JSON_DEPTH),
        "]".repeat(MAX_JSON_DEPTH)
    );
    let e = parse_err(&deep);
    assert!(
        e.contains(&format!("more than {MAX_JSON_DEPTH} deep")),
        "{e}"
    );
}

/// A RoPE scaling factor that multiplies the length (`linear`, `dynamic`) must be a positive
/// number: 0 or a negative factor is refused naming it, not skipped; a factor that makes
/// an absurd length names the factor, not `max_position_embeddings`.
#[test]
fn a_rope_factor_that_makes_no_length_is_refused_naming_it() {
    let llama = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":8192}"#;
    let rope = |factor: serde_json::Value| {
        with(
            llama,
            "rope_scaling",
            serde_json::json!({"rope_type": "linear", "factor": factor}),
        )
    };
    for factor in [0.into(), (-4).into(), serde_json::json!(-0.5)] {
        let e = parse_err(&rope(factor));
        assert!(
            e.starts_with("rope_scaling.factor: must be a positive number"),
            "{e}"
        );
    }
    let e = parse_err(&rope(serde_json::json!(1e300)));
    assert!(e.starts_with("rope_scaling.factor: 1e300 times"), "{e}");
    let c = ModelConfig::from_json_str(&rope(serde_json::json!(4.0))).unwrap();
    assert_eq!(c.derived_max_len, Some(32_768));
}
