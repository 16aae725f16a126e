//! Architectures as data. One generic reader handles every decoder config with the standard
//! keys (vLLM's `ModelArchConfigConvertorBase`: `hidden_size`, `num_hidden_layers`,
//! `num_attention_heads`, the KV-head aliases, `head_dim`); [`QUIRKS`] lists the few facts a
//! family's keys do not carry (which state calculator, default heads, a QKV bias),
//! [`layers`] reads the layer pattern, `per_layer` the layers' own head counts and MLP widths
//! (Nemotron-NAS `block_configs`, per-layer lists), and [`guard`] refuses, naming the key, a
//! config with per-layer structure none of them read. The plan's notes name the rule used.

pub mod defaults;
pub(crate) mod global;
pub mod guard;
pub mod layers;
pub(crate) mod per_layer;
pub mod state;
pub(crate) mod vision;

use memplan_core::{Error, Result};
use serde_json::{Map, Value};

use crate::config::{Family, Fields, LayerKind, Mla, ModelConfig, Moe, Vision};
use state::StateKind;

/// Facts a family's config does not state, keyed by architecture name (or `model_type`).
#[non_exhaustive]
pub struct Quirk {
    /// `architectures[0]` names (or `model_type`s) this row covers.
    pub names: &'static [&'static str],
    /// Recurrent-state calculator for `State` layers.
    pub state: Option<StateKind>,
    /// vLLM's family rule takes the SSM state's dtype from the config's
    /// `mamba_ssm_cache_dtype` (Nemotron-H), else the release's default
    /// ([`SpecOptions::nemotron_h_ssm_default`](crate::kvspec::SpecOptions::nemotron_h_ssm_default)).
    pub ssm_f32: bool,
    /// QKV projections carry biases.
    pub qkv_bias: bool,
    /// Config-class defaults for keys the file may omit.
    pub defaults: &'static [(&'static str, i64)],
    /// The last vLLM release that serves it, when current vLLM no longer does.
    pub last_vllm: Option<&'static str>,
}

const Q: Quirk = Quirk {
    names: &[],
    state: None,
    ssm_f32: false,
    qkv_bias: false,
    defaults: &[],
    last_vllm: None,
};

/// The quirks table (everything else is the generic rule).
pub const QUIRKS: &[Quirk] = &[
    Quirk {
        names: &[
            "Qwen2ForCausalLM",
            "Qwen2MoeForCausalLM",
            "Qwen2VLForConditionalGeneration",
            "Qwen2_5_VLForConditionalGeneration",
            "GptOssForCausalLM",
            "MiniCPMV",
        ],
        qkv_bias: true,
        ..Q
    },
    Quirk {
        names: &[
            "Lfm2ForCausalLM",
            "Lfm2MoeForCausalLM",
            "Lfm2VlForConditionalGeneration",
        ],
        state: Some(StateKind::ShortConv),
        ..Q
    },
    Quirk {
        names: &["JambaForCausalLM"],
        state: Some(StateKind::Mamba1),
        ..Q
    },
    Quirk {
        names: &["BambaForCausalLM"],
        state: Some(StateKind::Mamba2),
        last_vllm: Some("0.23.0"),
        ..Q
    },
    Quirk {
        names: &["NemotronHForCausalLM", "NemotronH_Nano_VL_V2"],
        state: Some(StateKind::Mamba2),
        ssm_f32: true,
        ..Q
    },
    Quirk {
        names: &[
            "GraniteMoeHybridForCausalLM",
            "FalconH1ForCausalLM",
            "Zamba2ForCausalLM",
        ],
        state: Some(StateKind::Mamba2),
        ..Q
    },
    Quirk {
        names: &[
            "Qwen3NextForCausalLM",
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
        ],
        state: Some(StateKind::GatedDeltaNet),
        ..Q
    },
    Quirk {
        names: &["MllamaForConditionalGeneration"],
        last_vllm: Some("0.10.2"),
        ..Q
    },
    Quirk {
        names: &["Phi4MultimodalForCausalLM"],
        last_vllm: Some("0.12.0"),
        ..Q
    },
    // Gemma2Config / Gemma3TextConfig defaults: 8 heads, 4 KV heads, head dim 256 (not
    // hidden_size / heads), window 4096, tied embeddings.
    Quirk {
        names: &["gemma2"],
        defaults: &[
            ("num_attention_heads", 8),
            ("num_key_value_heads", 4),
            ("head_dim", 256),
            ("sliding_window", 4096),
        ],
        ..Q
    },
    Quirk {
        names: &["gemma3", "gemma3_text"],
        defaults: &[
            ("num_attention_heads", 8),
            ("num_key_value_heads", 4),
            ("head_dim", 256),
            ("sliding_window", 4096),
            ("vocab_size", 262_208),
            ("max_position_embeddings", 131_072),
        ],
        ..Q
    },
];

fn quirk(arch: &str, model_type: &str) -> Option<&'static Quirk> {
    QUIRKS
        .iter()
        .find(|q| q.names.contains(&arch))
        .or_else(|| QUIRKS.iter().find(|q| q.names.contains(&model_type)))
}

/// Parse a config: `f` reads the language model (with the wrapper as fallback), `top` is
/// the whole file, `key` where the language model was found.
pub(crate) fn parse(
    arch: &str,
    f: &Fields<'_>,
    top: &Map<String, Value>,
    key: Option<String>,
) -> Result<ModelConfig> {
    let model_type = f
        .map
        .get("model_type")
        .or_else(|| top.get("model_type"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // Configs without a model_type: the family from the architecture name.
    let model_type = match (model_type.as_str(), arch) {
        ("", a) if a.starts_with("Gemma2") => "gemma2".to_string(),
        ("", a) if a.starts_with("Gemma3") => "gemma3".to_string(),
        ("", a) if a.starts_with("Cohere2") => "cohere2".to_string(),
        _ => model_type,
    };
    let q = quirk(arch, &model_type);
    // Class defaults for absent keys (Gemma's text_config names only what differs).
    let mut map = f.map.clone();
    for (k, v) in q.map_or(&[][..], |q| q.defaults) {
        let absent = |m: Option<&Value>| m.is_none_or(Value::is_null);
        if absent(map.get(*k)) && absent(f.outer.and_then(|o| o.get(*k))) {
            map.insert((*k).to_string(), Value::from(*v));
        }
    }
    uniform_lists(&mut map)?;
    let block_list = if model_type == "nemotron_h" || arch == "NemotronHForCausalLM" {
        nemotron_block_list(&mut map, f.outer)?
    } else {
        None
    };
    // MiMo-V2-Flash (vLLM `mimo_v2_flash.py`, `MiMoV2FlashDecoderLayer.__init__`): a layer whose
    // `hybrid_layer_pattern` entry is 1 is sliding-window attention with the `swa_*` heads, a 0
    // full attention with the model-wide ones, K heads of `head_dim` and V heads of
    // `v_head_dim`. vLLM 0.19.0 pads V to K's size in the cache (`MiMoV2Attention.forward`,
    // `Attention(..., head_dim)`); later releases cache V at its own size
    // (`FlashAttentionDiffKVBackend`, `head_size_v`), from a release memplan's rules do not
    // name. The page of every layer depends on which, so the config is refused by its key
    // (before the list-valued `moe_layer_freq`, which would be refused as a malformed figure).
    if let Some(p) = map
        .get("hybrid_layer_pattern")
        .or_else(|| f.outer.and_then(|o| o.get("hybrid_layer_pattern")))
        .filter(|v| !v.is_null())
    {
        let swa = p
            .as_array()
            .map_or(0, |a| a.iter().filter(|x| x.as_u64() == Some(1)).count());
        let n = p.as_array().map_or(0, Vec::len);
        return Err(Error::invalid(
            "hybrid_layer_pattern",
            format!(
                "makes {swa} of {n} layers sliding-window attention with heads of their own (`swa_num_key_value_heads`, `swa_head_dim`) and the rest full attention (mimo_v2_flash.py, `MiMoV2FlashDecoderLayer`); with V heads of another size than K (`v_head_dim`), vLLM 0.19.0 caches V padded to K's size and later releases at its own (`FlashAttentionDiffKVBackend`), from a release memplan's rules do not name, so memplan refuses the config rather than plan either cache"
            ),
        ));
    }
    if map.get("use_cla").and_then(Value::as_bool) == Some(true)
        && map
            .get("cla_share_factor")
            .map_or(1.0, |v| v.as_f64().unwrap_or(f64::INFINITY))
            > 1.0
    {
        return Err(Error::invalid(
            "use_cla",
            "layers share the K and V of the layer before them (cross-layer attention: hunyuan_v1.py, `HunYuanCrossAttention` takes the previous layer's `kv_states`), which memplan does not size",
        ));
    }
    // Layers described one by one: their model-wide figures go in place of the lists, for the
    // generic reader; the shapes are kept per layer.
    let per_layer = per_layer::read(arch, &model_type, &map, f.outer)?;
    let section = map.clone();
    for (k, v) in per_layer.iter().flat_map(|p| &p.scalars) {
        map.insert((*k).to_string(), v.clone());
    }
    if model_type == "lfm2" {
        let width = lfm2_mlp_width(&Fields {
            map: &map,
            outer: f.outer,
        })?;
        map.insert("intermediate_size".into(), Value::from(width));
    }
    let f = Fields {
        map: &map,
        outer: f.outer,
    };
    let gemma = model_type.starts_with("gemma");
    let family = if arch == "PhiForCausalLM" {
        Family::Phi2
    } else if gemma {
        Family::Gemma
    } else {
        Family::Dense
    };
    let mut c = ModelConfig::dense(arch.to_string(), family, &f)?;
    // A config that omits `tie_word_embeddings` takes its class's default, which vLLM reads
    // (`config.tie_word_embeddings`): tied for Gemma and SmolLM3 (transformers `GemmaConfig`,
    // `SmolLM3Config`: `tie_word_embeddings = True`).
    if (gemma || model_type == "smollm3") && f.get("tie_word_embeddings").is_none() {
        c.tie_word_embeddings = true;
    }
    // LFM2 ties its head whatever the config says (vLLM `lfm2.py` / `lfm2_moe.py`:
    // `self.lm_head.tie_weights(self.model.embed_tokens)` unconditionally).
    if model_type.starts_with("lfm2") {
        c.tie_word_embeddings = true;
    }
    // Molmo (vLLM `molmo.py`, `LanguageModelMLP`): `intermediate_size` is the fused
    // gate + up width (`ff_proj`), each projection `intermediate_size // 2`; the vision
    // backbone's shape is not in config.json but vLLM's `VisionBackboneConfig` defaults (a
    // CLIP ViT-L/14 of 23 layers, 1024 wide, MLP 4096).
    if arch == "MolmoForCausalLM" {
        c.intermediate_size /= 2;
    }
    if q.is_some_and(|q| q.qkv_bias) || arch == "PhiForCausalLM" {
        c.qkv_bias = true;
    }
    c.mla = mla(&f)?;
    if c.mla.is_some() {
        c.family = Family::DeepSeek;
        c.indexer_head_dim = f
            .opt_u64("index_head_dim")?
            .filter(|_| f.get("index_topk").is_some());
    }
    // Gemma 3n / Gemma 4 (gemma3n.py, gemma4.py): a per-layer input embedding of
    // `vocab_size_per_layer_input x layers x hidden_size_per_layer_input`, with a projection
    // of the hidden state to it and, in every layer, a gate and a projection back.
    c.per_layer_input = match f.opt_u64("hidden_size_per_layer_input")?.filter(|w| *w > 0) {
        Some(w) => Some((
            f.opt_u64("vocab_size_per_layer_input")?
                .unwrap_or(c.vocab_size),
            w,
        )),
        None => None,
    };
    if let Some((m, at)) = moe(&f, &c)? {
        c.moe = Some(m);
        c.moe_layers = at;
    }
    if c.moe.is_some() && c.family == Family::Dense {
        c.family = Family::Moe;
    }
    let (layers, rule) = layers::read(&f, c.num_layers, &model_type)?;
    c.layers = layers;
    c.blocks = blocks(&f, c.num_layers)?;
    agree(&c.blocks, &c.layers)?;
    c.notes.extend(block_list);
    if !c.blocks.is_empty() {
        let routed = c
            .blocks
            .iter()
            .filter(|b| **b == crate::config::Block::Moe)
            .count() as u64;
        if let Some(m) = c.moe.as_mut() {
            m.dense_layers = c.num_layers - routed.min(c.num_layers);
            c.moe_layers = c
                .blocks
                .iter()
                .map(|b| *b == crate::config::Block::Moe)
                .collect();
        }
    }
    // qwen3_next.py `Qwen3NextAttention`: `getattr(config, "attn_output_gate", True)`.
    c.attn_output_gate = q.is_some_and(|q| q.state == Some(StateKind::GatedDeltaNet))
        && f.bool("attn_output_gate", true)?;
    let mut read: Vec<&str> = rule.keys.to_vec();
    read.extend(MOE_KEYS);
    let mut rule_name = rule.name.to_string();
    if let Some(p) = per_layer {
        read.extend(&p.keys);
        rule_name = format!("{}, attention pattern by {rule_name}", p.rule);
        c.notes.extend(p.note.map(String::from));
        if !p.shapes.is_empty() {
            // A layer without attention keeps nothing in the KV cache.
            for (k, s) in c.layers.iter_mut().zip(&p.shapes) {
                if !s.has_attention() {
                    *k = LayerKind::None;
                }
            }
            c.layer_shapes = p.shapes;
        }
    }
    if let Some(shapes) = global::shapes(
        &f,
        &c.layers,
        (c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size),
    )? {
        if !c.layer_shapes.is_empty() {
            return Err(Error::invalid(
                "global_head_dim",
                format!("full-attention layers of their own shape beside layers described one by one ({rule_name}): memplan reads one or the other"),
            ));
        }
        read.extend(global::KEYS);
        rule_name = format!("{rule_name}, {}", global::RULE);
        c.layer_shapes = shapes;
    }
    guard::check(
        &section,
        f.outer,
        c.num_layers,
        &read,
        rule.explicit,
        &rule_name,
    )?;
    if c.layers.contains(&LayerKind::State) {
        let kind = match q.and_then(|q| q.state) {
            Some(k) => k,
            None if f.get("linear_num_value_heads").is_some() => StateKind::GatedDeltaNet,
            None if f
                .first(&["mamba_n_heads", "mamba_num_heads", "n_mamba_heads"])?
                .is_some() =>
            {
                StateKind::Mamba2
            }
            None if f.get("conv_L_cache").is_some() => StateKind::ShortConv,
            None if ["mamba_d_state", "mamba_expand", "mamba_d_conv", "mamba_d_inner"]
                .iter()
                .any(|k| f.get(k).is_some()) =>
            {
                StateKind::Mamba1
            }
            // Which recurrence a state layer runs decides its size; guessing one would plan
            // another model.
            None => {
                return Err(Error::invalid(
                    rule.keys.first().copied().unwrap_or("layer_types"),
                    "has recurrent-state (linear attention / SSM) layers, but the config states no Mamba, gated-DeltaNet or short-convolution dimensions memplan can size them by",
                ))
            }
        };
        // The SSM state's dtype where the family's rule reads it from the config while
        // `--mamba-ssm-cache-dtype` is `auto` (vLLM 0.19.0 `model_executor/models/config.py`
        // `verify_and_update_config`): Nemotron-H's `mamba_ssm_cache_dtype`
        // (`NemotronHForCausalLMConfig`; when absent the release's default decides:
        // `SpecOptions::nemotron_h_ssm_default`), Qwen3.5's `mamba_ssm_dtype` (`Qwen3_5ForConditionalGenerationConfig`, both Qwen3.5
        // architectures; every released Qwen3.5 and 3.6 config says "float32", which makes
        // the temporal state twice its bf16 size: `mamba_utils.py`
        // `gated_delta_net_state_dtype`).
        let qwen35 = matches!(
            arch,
            "Qwen3_5ForConditionalGeneration" | "Qwen3_5MoeForConditionalGeneration"
        );
        let ssm_key = if q.is_some_and(|q| q.ssm_f32) {
            Some("mamba_ssm_cache_dtype")
        } else if qwen35 {
            Some("mamba_ssm_dtype")
        } else {
            None
        };
        let ssm_bytes = match ssm_key.map(|k| (k, f.str(k))) {
            Some((k, Some(name))) => Some(state::config_dtype_bytes(k, name)?),
            _ => None,
        };
        let mut shape = state::read(kind, &f, c.hidden_size, ssm_bytes)?;
        shape.ssm_engine_default = ssm_key == Some("mamba_ssm_cache_dtype") && ssm_bytes.is_none();
        shape.ssm_rule_from_0_20 =
            ssm_key == Some("mamba_ssm_cache_dtype") && arch == "NemotronH_Nano_VL_V2";
        c.state = Some(shape);
    }
    c.vision = vision::read(top, arch, c.hidden_size);
    if arch == "MolmoForCausalLM" && c.vision.is_none() {
        // `MolmoVisionBackbone`: `image_pooling_2d` (wq, wk, wv over the two ViT layers it
        // reads, 2 x 1024 wide, and wo, all with biases), `image_projector` (a gated MLP from
        // 1024 to the model's width with the language model's MLP width) and `pad_embed`.
        let (vh, inter, h) = (1024, c.intermediate_size, c.hidden_size);
        let pooling = 3 * (2 * vh * vh + vh) + vh * vh + vh;
        let projector = pooling + vh * 2 * inter + inter * h + 2 * 2 * vh;
        c.vision = Some(Vision {
            hidden: vh,
            layers: 23,
            intermediate: 4096,
            patch: 14,
            gated: false,
            params: vision::generic(vh, 23, 4096, 14, false) as u64 + projector,
        });
    }
    c.language_key = key.clone();
    c.rule = match q {
        Some(_) => format!("{arch}: generic decoder keys + family facts, layers by {rule_name}"),
        None => format!(
            "{arch}: generic decoder keys (not in memplan's family table), layers by {rule_name}"
        ),
    };
    if let Some(k) = &key {
        c.notes.push(format!(
            "multimodal wrapper: the language model is read from `{k}`; the vision encoder's weights and profiling memory are estimated"
        ));
    } else if c.vision.is_some() {
        c.notes
            .push("the vision encoder's profiling memory is estimated".into());
    }
    if let Some(v) = q.and_then(|q| q.last_vllm) {
        c.notes.push(format!("{arch} was last served by vLLM {v}; current releases refuse it (sized with the rules selected)"));
    }
    c.kv_cache_quant = kv_cache_quant(top);
    c.derived_max_len = Some(derived_max_len(&f, &model_type)?);
    Ok(c)
}

/// Nemotron-H's blocks, one per character of `hybrid_override_pattern` (vLLM `nemotron_h.py`,
/// `ALL_DECODER_LAYER_TYPES`: `M` Mamba2, `*` attention, `-` MLP, `E` routed experts); no
/// pattern, no blocks. The checkpoint's `NemotronHConfig` asserts
/// `len(hybrid_override_pattern) == num_hidden_layers` and vLLM builds one block per character
/// (`make_layers(len(config.hybrid_override_pattern), ...)`), so a pattern of another length
/// is refused: the weights are counted block by block, and a short pattern would leave layers
/// out.
fn blocks(f: &Fields<'_>, layers: u64) -> Result<Vec<crate::config::Block>> {
    use crate::config::Block;
    let Some(p) = f.str("hybrid_override_pattern") else {
        return Ok(Vec::new());
    };
    let len = p.chars().count() as u64;
    if len != layers {
        return Err(Error::invalid(
            "hybrid_override_pattern",
            format!(
                "{len} blocks for {layers} layers (`num_hidden_layers`): one character per layer"
            ),
        ));
    }
    p.chars()
        .map(|ch| match ch {
            'M' => Ok(Block::Mamba),
            '*' => Ok(Block::Attention),
            '-' => Ok(Block::Mlp),
            'E' => Ok(Block::Moe),
            _ => Err(Error::invalid(
                "hybrid_override_pattern",
                format!("has the block `{ch}`; nemotron_h.py builds only `M` (Mamba2), `*` (attention), `-` (MLP) and `E` (routed experts)"),
            )),
        })
        .collect()
}

/// Nemotron-H's blocks as transformers 5 writes them: `layers_block_type`, one name per layer
/// and no `hybrid_override_pattern` (Nemotron-3-Ultra; transformers' `NemotronHConfig` works
/// `num_hidden_layers` out from the list's length). vLLM 0.19.0's `nemotron_h.py` reads only
/// the pattern (`NemotronHModel.__init__`: `ALL_DECODER_LAYER_TYPES[config.hybrid_override_pattern[layer_idx]]`),
/// which the config class gives back from the list one character per name
/// (`NemotronHConfig._list_to_pattern`: `mamba` M, `attention` *, `mlp` -, `moe` E; the names
/// vLLM's own `NemotronHConfig.layers_block_type` writes, in `transformers_utils/configs/nemotron_h.py`;
/// newer transformers spell the first two `linear_attention` and `full_attention`,
/// `remap_legacy_layer_types`). The pattern is put in the config's place, and the layer count
/// where the config gives none, so the layers, the caches and the weights are read from it
/// as from a written pattern. A list beside a pattern that says otherwise, or beside a
/// `num_hidden_layers` of another length, is refused: which one the engine follows is not
/// the config's to say. Returns the note naming the list, when one was read.
fn nemotron_block_list(
    map: &mut Map<String, Value>,
    outer: Option<&Map<String, Value>>,
) -> Result<Option<String>> {
    const KEY: &str = "layers_block_type";
    let Some(v) = map.get(KEY).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Value::Array(names) = v else {
        return Err(Error::invalid(
            KEY,
            format!("expected a list of block names, found {v}"),
        ));
    };
    if names.is_empty() {
        return Err(Error::invalid(KEY, "is empty: it names no layers"));
    }
    let mut pattern = String::with_capacity(names.len());
    for (i, t) in names.iter().enumerate() {
        pattern.push(match t.as_str() {
            Some("mamba" | "linear_attention") => 'M',
            Some("attention" | "full_attention") => '*',
            Some("mlp") => '-',
            Some("moe") => 'E',
            _ => {
                return Err(Error::invalid(
                    KEY,
                    format!("entry {i} is {t}; Nemotron-H's blocks are \"mamba\" (or \"linear_attention\"), \"attention\" (or \"full_attention\"), \"mlp\" and \"moe\""),
                ))
            }
        });
    }
    let n = names.len() as u64;
    let f = Fields { map: &*map, outer };
    if let Some(written) = f.get("hybrid_override_pattern") {
        let Some(written) = written.as_str() else {
            return Err(Error::invalid(
                "hybrid_override_pattern",
                format!("expected a string of block characters, found {written}"),
            ));
        };
        if written != pattern {
            let at = written
                .chars()
                .zip(pattern.chars())
                .position(|(a, b)| a != b);
            let why = match at {
                Some(i) => format!(
                    "block {i} is `{}` but `{KEY}` makes it `{}` ({})",
                    written.chars().nth(i).unwrap_or(' '),
                    pattern.chars().nth(i).unwrap_or(' '),
                    names[i]
                ),
                None => format!("{} blocks but `{KEY}` names {n}", written.chars().count()),
            };
            return Err(Error::invalid(
                "hybrid_override_pattern",
                format!("{why}: the config gives its blocks twice and the two forms disagree, so memplan cannot tell which model the engine builds"),
            ));
        }
    }
    let count = f.get("num_hidden_layers").cloned();
    match count {
        Some(l) if l.as_u64() != Some(n) => {
            return Err(Error::invalid(
                KEY,
                format!("names {n} blocks but `num_hidden_layers` is {l}: one name per layer"),
            ))
        }
        Some(_) => {}
        None => {
            map.insert("num_hidden_layers".into(), Value::from(n));
        }
    }
    map.insert("hybrid_override_pattern".into(), Value::from(pattern));
    Ok(Some(format!(
        "Nemotron-H blocks read from `{KEY}` ({n} layers), as the pattern transformers' `NemotronHConfig` gives back for it"
    )))
}

/// Refuse a `hybrid_override_pattern` that disagrees with the layer kinds read from another key
/// (`layer_types`, which the layer reader takes first): the KV cache would follow one and the
/// weights the other. A Mamba2 block is a recurrent-state layer, an attention block an
/// attention layer, an MLP or MoE block a layer without a cache.
fn agree(blocks: &[crate::config::Block], layers: &[LayerKind]) -> Result<()> {
    use crate::config::Block;
    for (i, (b, k)) in blocks.iter().zip(layers).enumerate() {
        let same = match b {
            Block::Mamba => *k == LayerKind::State,
            Block::Attention => matches!(
                k,
                LayerKind::Full | LayerKind::Sliding(_) | LayerKind::Chunked(_)
            ),
            Block::Mlp | Block::Moe => *k == LayerKind::None,
        };
        if !same {
            return Err(Error::invalid(
                "hybrid_override_pattern",
                format!("block {i} is {b:?} but `layer_types` makes layer {i} {k:?}: the two keys disagree, and memplan would size the KV cache by one and the weights by the other"),
            ));
        }
    }
    Ok(())
}

/// LFM2's MLP width (vLLM `lfm2.py`, `Lfm2MLP.__init__`): transformers' `Lfm2Config` takes
/// `block_ff_dim` over `intermediate_size`; with `block_auto_adjust_ff_dim` (the default) the
/// layer keeps two thirds of it, times `block_ffn_dim_multiplier`, rounded up to
/// `block_multiple_of` (LFM2-1.2B: 12288 -> 8192).
fn lfm2_mlp_width(f: &Fields<'_>) -> Result<u64> {
    let Some(mut w) = f.first(&["block_ff_dim", "intermediate_size"])? else {
        return Err(Error::invalid(
            "intermediate_size",
            "missing from config.json",
        ));
    };
    if f.bool("block_auto_adjust_ff_dim", true)? {
        w = 2 * w / 3;
        if let Some(m) = f.get("block_ffn_dim_multiplier").and_then(Value::as_f64) {
            if !(m > 0.0 && m * (w as f64) < 1e12) {
                return Err(Error::invalid(
                    "block_ffn_dim_multiplier",
                    format!("{m} is not a positive multiplier"),
                ));
            }
            w = (m * w as f64) as u64;
        }
        let of = f.opt_u64("block_multiple_of")?.unwrap_or(256).max(1);
        w = w.div_ceil(of) * of;
    }
    Ok(w)
}

fn mla(f: &Fields<'_>) -> Result<Option<Mla>> {
    let Some(rank) = f.opt_u64("kv_lora_rank")?.filter(|r| *r > 0) else {
        return Ok(None);
    };
    Ok(Some(Mla {
        kv_lora_rank: rank,
        q_lora_rank: f.opt_u64("q_lora_rank")?.unwrap_or(0),
        qk_rope_head_dim: f.positive("qk_rope_head_dim")?,
        qk_nope_head_dim: f.opt_u64("qk_nope_head_dim")?.unwrap_or(0),
        v_head_dim: f.opt_u64("v_head_dim")?.unwrap_or(0),
    }))
}

/// Routed-expert figures some families write as a list with one entry per layer (Hunyuan's
/// `moe_topk`, `moe_intermediate_size` and `num_shared_expert`: hunyuan_v1.py,
/// `HunYuanSparseMoeBlock.__init__`, indexes each by the layer's id).
const PER_LAYER_MOE: &[&str] = &["moe_topk", "moe_intermediate_size", "num_shared_expert"];

/// Put the one value of a [`PER_LAYER_MOE`] list whose entries are all alike in its place:
/// every layer then has the same figure, as a scalar says. A list whose entries differ is
/// refused by name (the weights would differ layer by layer, which memplan does not add up).
fn uniform_lists(map: &mut Map<String, Value>) -> Result<()> {
    for k in PER_LAYER_MOE {
        let Some(Value::Array(a)) = map.get(*k) else {
            continue;
        };
        let first = a.first().cloned();
        match first {
            Some(v) if v.is_u64() && a.iter().all(|x| *x == v) => {
                map.insert((*k).to_string(), v);
            }
            Some(_) => {
                return Err(Error::invalid(
                    *k,
                    format!("varies by layer ({} entries, not all alike): memplan reads a per-layer list of this figure only where every layer has the same value", a.len()),
                ))
            }
            None => {
                map.remove(*k);
            }
        }
    }
    Ok(())
}

/// Routed experts with vLLM's key aliases (`CONFIG_FIELD_ALIASES`), and which layers have
/// them ([`moe_layers`]).
fn moe(f: &Fields<'_>, c: &ModelConfig) -> Result<Option<(Moe, Vec<bool>)>> {
    let experts = f.first(&[
        "num_experts",
        "moe_num_experts",
        "n_routed_experts",
        "num_local_experts",
    ])?;
    let Some(experts) = experts.filter(|e| *e > 1) else {
        return Ok(None);
    };
    // A token routed to 0 experts would skip the MoE block: no engine runs that (vLLM's
    // `FusedMoE` selects `top_k` experts and sizes its buffers by it), so 0 is refused.
    let top_k = f
        .first_positive(&[
            "num_experts_per_tok",
            "num_experts_per_token",
            "experts_per_token",
            "moe_topk",
            "moe_top_k",
            "top_k",
            "top_k_experts",
        ])?
        .unwrap_or(1);
    if top_k > experts {
        // vLLM's fused MoE selects top_k of the routed experts: more than there are is
        // nonsense, not a model.
        return Err(Error::invalid(
            "num_experts_per_tok",
            format!("{top_k} experts per token, but the model has only {experts} routed experts"),
        ));
    }
    // Experts of no width hold no weights (and the intermediate_size they fall back to is
    // checked where the dense layers need it, `check_positive_widths`).
    let ei = f
        .first_positive(&["moe_intermediate_size", "expert_intermediate_size"])?
        .unwrap_or(c.intermediate_size);
    if ei == 0 {
        return Err(crate::config::zero("intermediate_size"));
    }
    // Hunyuan: a shared MLP of `intermediate_size x num_shared_expert` where
    // `use_mixed_mlp_moe` (hunyuan_v1.py, `HunYuanSparseMoeBlock.__init__`).
    let mixed = f
        .get("use_mixed_mlp_moe")
        .is_some_and(|v| v.as_bool() == Some(true) || v.as_u64().is_some_and(|n| n > 0));
    let shared = match f.first(&["shared_expert_intermediate_size"])? {
        Some(s) => s,
        // Nemotron-H (nemotron_h.py, `NemotronHMoE.__init__`): the shared MLP is
        // `moe_shared_expert_intermediate_size * n_shared_experts` wide.
        None if f.get("moe_shared_expert_intermediate_size").is_some() => f
            .u64("moe_shared_expert_intermediate_size")?
            .checked_mul(f.opt_u64("n_shared_experts")?.unwrap_or(1))
            .ok_or_else(|| Error::invalid("n_shared_experts", "too large"))?,
        // Gemma 4's MoE block runs beside the layer's dense MLP, not instead of it (gemma4.py,
        // `Gemma4DecoderLayer`: `self.mlp` always, `self.moe` with `enable_moe_block`): a
        // dense MLP of `intermediate_size` in every layer, as a shared expert's weights are.
        None if f.bool("enable_moe_block", false)? || f.bool("use_second_mlp_block", false)? => {
            c.intermediate_size
        }
        None if f.get("num_shared_expert").is_some() => {
            if mixed {
                f.u64("num_shared_expert")?
                    .checked_mul(c.intermediate_size)
                    .ok_or_else(|| Error::invalid("num_shared_expert", "too large"))?
            } else {
                0
            }
        }
        None => {
            f.first(&[
                "n_shared_experts",
                "moe_num_shared_experts",
                "num_shared_experts",
            ])?
            .unwrap_or(0)
                * ei
        }
    };
    let at = moe_layers(f, c.num_layers)?;
    let dense_layers = at.iter().filter(|m| !**m).count() as u64;
    Ok(Some((
        Moe {
            num_experts: experts,
            top_k,
            expert_intermediate: ei,
            shared_intermediate: shared,
            dense_layers: dense_layers.min(c.num_layers),
            latent_size: f.opt_u64("moe_latent_size")?.unwrap_or(0),
        },
        at,
    )))
}

/// Keys that say which layers have routed experts (read by [`moe_layers`]).
const MOE_KEYS: &[&str] = &[
    "moe_layers",
    "moe_layers_enum",
    "mlp_layer_types",
    "mlp_only_layers",
    "first_k_dense_replace",
    "moe_layer_start_index",
    "moe_layer_end_index",
    "num_dense_layers",
    "expert_layer_period",
    "expert_layer_offset",
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "moe_layer_interval",
    "moe_layer_freq",
];

/// Which of `layers` layers have routed experts, layer by layer, by each family's own
/// predicate in vLLM's decoder-layer constructor:
/// - an explicit list: `moe_layers`; Step-3's comma-separated `moe_layers_enum`
///   (step3_text.py); `mlp_layer_types` "sparse"/"dense" (exaone_moe.py, cohere2_moe.py);
/// - else every layer where all of these hold (a key that is absent holds everywhere):
///   - `layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0`
///     (qwen2_moe.py `Qwen2MoeDecoderLayer`, qwen3_moe.py `Qwen3MoeDecoderLayer`,
///     qwen3_next.py `Qwen3NextDecoderLayer`);
///   - `(layer_idx + 1) % interleave_moe_layer_step == 0` (llama4.py `Llama4DecoderLayer`);
///   - `moe_layer_start_index <= layer_idx <= moe_layer_end_index` and
///     `(layer_idx + 1) % moe_layer_interval == 0` (ernie45_moe.py
///     `Ernie4_5_MoeDecoderLayer`);
///   - `layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0`
///     (deepseek_v2.py `DeepseekV2DecoderLayer`; a list of one 0/1 per layer is read as
///     such, mimo_v2_flash.py); `num_dense_layers` leading dense layers
///     (lfm2_moe.py `Lfm2MoeDecoderLayer`);
///   - `layer_idx % expert_layer_period == expert_layer_offset` (jamba.py `JambaModel`,
///     through transformers' `JambaConfig.layers_num_experts`).
fn moe_layers(f: &Fields<'_>, layers: u64) -> Result<Vec<bool>> {
    // Step-3 writes the MoE layers as a comma-separated string (step3_text.py).
    if let Some(e) = f.get("moe_layers_enum") {
        let bad = || {
            Error::invalid(
                "moe_layers_enum",
                format!("{e} is not a comma-separated list of layer indices below {layers}"),
            )
        };
        let ix = e
            .as_str()
            .ok_or_else(bad)?
            .split(',')
            .map(|i| {
                i.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|i| *i < layers)
                    .ok_or_else(bad)
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(at_indices(&ix, layers));
    }
    if let Some(ix) = layers::indices(f, "moe_layers", layers)? {
        return Ok(at_indices(&ix, layers));
    }
    // MiMo-V2-Flash writes `moe_layer_freq` as one 0/1 entry per layer
    // (mimo_v2_flash.py `MiMoV2FlashDecoderLayer.is_moe_layer`: `not
    // isinstance(config.moe_layer_freq, int) and config.moe_layer_freq[layer_idx]`).
    if let Some(v) = f.get("moe_layer_freq").filter(|v| v.is_array()) {
        let bad = || {
            Error::invalid(
                "moe_layer_freq",
                format!("a list must give one 0 or 1 per layer ({layers}), found {v}"),
            )
        };
        let a = v
            .as_array()
            .filter(|a| a.len() as u64 == layers)
            .ok_or_else(bad)?;
        return a
            .iter()
            .map(|x| match (x.as_u64(), x.as_bool()) {
                (Some(0), _) | (_, Some(false)) => Ok(false),
                (Some(1), _) | (_, Some(true)) => Ok(true),
                _ => Err(bad()),
            })
            .collect();
    }
    if let Some(v) = f.get("mlp_layer_types") {
        let types = v
            .as_array()
            .filter(|a| a.len() as u64 == layers)
            .ok_or_else(|| {
                Error::invalid(
                    "mlp_layer_types",
                    format!("expected one entry per layer ({layers}), found {v}"),
                )
            })?;
        let mut at = Vec::with_capacity(types.len());
        for t in types {
            match t.as_str() {
                Some("sparse") => at.push(true),
                Some("dense") => at.push(false),
                _ => {
                    return Err(Error::invalid(
                        "mlp_layer_types",
                        format!("{t} is not \"sparse\" or \"dense\""),
                    ))
                }
            }
        }
        return Ok(at);
    }
    let only = layers::indices(f, "mlp_only_layers", layers)?.unwrap_or_default();
    let first = f
        .first(&[
            "first_k_dense_replace",
            "moe_layer_start_index",
            "num_dense_layers",
        ])?
        .unwrap_or(0);
    let last = f.opt_u64("moe_layer_end_index")?.unwrap_or(u64::MAX);
    let step = |k: &str| -> Result<Option<u64>> { Ok(f.opt_u64(k)?.filter(|s| *s > 1)) };
    let period = step("expert_layer_period")?;
    let offset = f.opt_u64("expert_layer_offset")?.unwrap_or(0);
    let every = match step("decoder_sparse_step")? {
        Some(s) => Some(s),
        None => match step("interleave_moe_layer_step")? {
            Some(s) => Some(s),
            None => step("moe_layer_interval")?,
        },
    };
    let freq = step("moe_layer_freq")?;
    Ok((0..layers)
        .map(|i| {
            !only.contains(&i)
                && i >= first
                && i <= last
                && period.is_none_or(|p| i % p == offset)
                && every.is_none_or(|s| (i + 1) % s == 0)
                && freq.is_none_or(|q| i % q == 0)
        })
        .collect())
}

/// `true` at each of `ix` (indices below `layers`).
fn at_indices(ix: &[u64], layers: u64) -> Vec<bool> {
    let mut at = vec![false; layers as usize];
    for &i in ix {
        at[i as usize] = true;
    }
    at
}

/// ModelOpt / compressed-tensors checkpoints that ask for an fp8 KV cache (vLLM
/// `resolve_kv_cache_dtype_string` → `get_kv_cache_quant_algo_string`).
fn kv_cache_quant(top: &Map<String, Value>) -> Option<String> {
    let q = top.get("quantization_config")?;
    let algo = q
        .get("kv_cache_quant_algo")
        .or_else(|| {
            q.get("quantization")
                .and_then(|x| x.get("kv_cache_quant_algo"))
        })
        .and_then(Value::as_str);
    if let Some(a) = algo {
        return Some(a.to_ascii_lowercase());
    }
    q.get("kv_cache_scheme")
        .filter(|s| !s.is_null())
        .map(|_| "fp8".into())
}

/// vLLM `_get_and_verify_max_len` without a user value: the smallest length key, the RoPE
/// scaling factor applied (except YaRN/llama3/longrope types and Gemma 3), LongRoPE's
/// original length, 2048 when nothing is stated.
fn derived_max_len(f: &Fields<'_>, model_type: &str) -> Result<u64> {
    let keys = [
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "model_max_length",
        "max_target_positions",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    ];
    let mut len: Option<u64> = None;
    for k in keys {
        if let Some(v) = f.opt_u64(k)? {
            len = Some(len.map_or(v, |l| l.min(v)));
        }
    }
    if let Some(m) = f.opt_u64("model_max_length")? {
        len = Some(m);
    }
    let mut len = len.unwrap_or(2048) as f64;
    // The key the scaling was read from, once its factor multiplied the length.
    let mut scaled_by: Option<(&str, f64)> = None;
    let rope_key = if f.get("rope_scaling").is_some() {
        "rope_scaling"
    } else {
        "rope_parameters"
    };
    let rope = f.get(rope_key);
    if let Some(Value::Object(r)) = rope {
        let ty = r
            .get("rope_type")
            .or_else(|| r.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if ty == "longrope" {
            if let Some(o) = f.opt_u64("original_max_position_embeddings")? {
                return Ok(o);
            }
        }
        let scaled = ![
            "su",
            "longrope",
            "llama3",
            "yarn",
            "deepseek_yarn",
            "deepseek_llama_scaling",
            "default",
            "mrope",
        ]
        .contains(&ty);
        if scaled && !model_type.contains("gemma3") {
            // vLLM multiplies the length by it (`_get_and_verify_max_len`): 0 or a negative
            // factor makes no length, so it is refused rather than skipped.
            if let Some(factor) = r.get("factor").and_then(Value::as_f64) {
                if !(factor > 0.0 && factor.is_finite()) {
                    return Err(Error::invalid(
                        format!("{rope_key}.factor"),
                        format!("must be a positive number (it multiplies the {ty} RoPE length), found {factor}"),
                    ));
                }
                len *= factor;
                scaled_by = Some((rope_key, factor));
            }
        }
    }
    if !(1.0..1e12).contains(&len) {
        return Err(match scaled_by {
            Some((key, factor)) => Error::invalid(
                format!("{key}.factor"),
                format!(
                    "{} times the model's length makes {len:e} tokens, not a plausible length (at most 10^12)",
                    if factor.abs() >= 1e6 { format!("{factor:e}") } else { factor.to_string() }
                ),
            ),
            None => Error::invalid(
                "max_position_embeddings",
                format!("{len} is not a plausible length"),
            ),
        });
    }
    Ok(len as u64)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_families;
#[cfg(test)]
mod tests_per_layer;
#[cfg(test)]
pub(crate) mod tests_weights;
