//! Reading a Hugging Face `config.json` into a [`ModelConfig`]: the facts memplan needs
//! (layer counts, heads, dims, vocab, dtype, MoE, MLA, sliding-window layout, quantization).
//!
//! Architectures are data, not one match arm per name ([`crate::arch`]): any decoder config
//! with the standard keys plans (the plan notes which rule read it); multimodal wrappers are
//! read through their language model (`text_config`, `llm_config`, `language_config`);
//! layer kinds (full, sliding, chunked local, recurrent state, cross-attention, none) come
//! from `layer_types` or the family's own pattern keys; layers with their own head counts and
//! MLP widths (Nemotron-NAS `block_configs`, OpenELM) keep them per layer
//! ([`ModelConfig::layer_shapes`]), and per-layer structure no reader consumed is refused
//! naming its key ([`crate::arch::guard`]).
//!
//! Every missing required key, wrong type or absurd value is a one-line error naming the key.

use memplan_core::{Error, Result};
use serde_json::{Map, Value};

use crate::quant::Quantization;

/// Architecture families memplan knows how to size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Llama, Mistral, Qwen2/3, Phi-3: dense decoder, gated MLP.
    Dense,
    /// Mixtral, Qwen3-MoE, gpt-oss: routed experts.
    Moe,
    /// DeepSeek-V2/V3: MLA attention, routed + shared experts.
    DeepSeek,
    /// Gemma 2/3: dense, interleaved sliding-window layers, tied embeddings.
    Gemma,
    /// Phi-2: dense, plain (non-gated) MLP, LayerNorm with bias.
    Phi2,
}

/// What one decoder layer keeps in the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "tokens", rename_all = "snake_case")]
pub enum LayerKind {
    /// Full attention (or MLA when the config has MLA).
    Full,
    /// Sliding-window attention of this many tokens.
    Sliding(u64),
    /// Chunked local attention with chunks of this many tokens.
    Chunked(u64),
    /// A recurrent state (Mamba, gated DeltaNet): see [`ModelConfig::state`].
    State,
    /// Cross-attention to this many encoder tokens (Mllama).
    Cross(u64),
    /// Nothing cached (MLP-only blocks, layers that reuse another layer's KV).
    None,
}

/// One layer's own shape, where the config describes layers individually (Nemotron-NAS
/// `block_configs`, per-layer head or MLP lists such as OpenELM's and Gemma 3n's). A model
/// whose layers all share the model-wide shape has no per-layer shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LayerShape {
    /// Query heads (0: the layer has no attention).
    pub heads: u64,
    /// KV heads (0: the layer has no attention).
    pub kv_heads: u64,
    /// Dense MLP intermediate size (0: the layer has no MLP).
    pub intermediate: u64,
    /// The layer's own head size (0: the model's, [`ModelConfig::head_dim`]).
    pub head_dim: u64,
}

impl LayerShape {
    /// A layer of `heads` query and `kv_heads` KV heads and an MLP of `intermediate`, with the
    /// model's head size.
    pub const fn new(heads: u64, kv_heads: u64, intermediate: u64) -> Self {
        Self {
            heads,
            kv_heads,
            intermediate,
            head_dim: 0,
        }
    }

    /// The same layer with heads of `head_dim`.
    pub const fn with_head_dim(mut self, head_dim: u64) -> Self {
        self.head_dim = head_dim;
        self
    }

    /// The layer's head size: its own, else the model's `model`.
    pub const fn head_dim_or(&self, model: u64) -> u64 {
        if self.head_dim > 0 {
            self.head_dim
        } else {
            model
        }
    }

    /// Whether the layer attends (and so keeps a KV cache).
    pub const fn has_attention(&self) -> bool {
        self.kv_heads > 0
    }
}

/// One block of a model built of single-purpose blocks (Nemotron-H's
/// `hybrid_override_pattern`, one character per block: vLLM `nemotron_h.py`,
/// `ALL_DECODER_LAYER_TYPES`): each block holds one norm and one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    /// `M`: a Mamba2 mixer (`NemotronHMambaDecoderLayer`).
    Mamba,
    /// `*`: attention (`NemotronHAttentionDecoderLayer`).
    Attention,
    /// `-`: a dense MLP (`NemotronHMLPDecoderLayer`).
    Mlp,
    /// `E`: routed experts (`NemotronHMoEDecoderLayer`).
    Moe,
}

/// Routed-expert facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Moe {
    /// Routed experts per MoE layer.
    pub num_experts: u64,
    /// Experts per token.
    pub top_k: u64,
    /// Intermediate size of one expert.
    pub expert_intermediate: u64,
    /// Intermediate size of the shared experts together (0 when none).
    pub shared_intermediate: u64,
    /// Layers without routed experts (DeepSeek's `first_k_dense_replace`, Jamba's and Llama 4's
    /// interleaves, Qwen's `mlp_only_layers`).
    pub dense_layers: u64,
    /// The width the experts run at when it is not the hidden size (Nemotron-H's latent MoE,
    /// `moe_latent_size`: `fc1_latent_proj` / `fc2_latent_proj` around the experts); 0: the
    /// hidden size.
    pub latent_size: u64,
}

/// Multi-head latent attention facts (DeepSeek-V2/V3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Mla {
    /// Rank of the compressed KV (the cached latent).
    pub kv_lora_rank: u64,
    /// Rank of the compressed Q (0 = no Q compression).
    pub q_lora_rank: u64,
    /// Rotary part of the QK head dim (cached beside the latent).
    pub qk_rope_head_dim: u64,
    /// Non-rotary part of the QK head dim.
    pub qk_nope_head_dim: u64,
    /// V head dim.
    pub v_head_dim: u64,
}

/// A vision tower attached to a multimodal wrapper (weights only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Vision {
    /// Hidden size.
    pub hidden: u64,
    /// Layers.
    pub layers: u64,
    /// MLP intermediate size.
    pub intermediate: u64,
    /// Patch size (pixels).
    pub patch: u64,
    /// Gated MLP (Pixtral) or plain (SigLIP).
    pub gated: bool,
    /// Parameters of the tower and its projector to the language model, counted from the
    /// modules vLLM builds for the family (`arch::vision`).
    pub params: u64,
}

/// The normalised facts of a model config.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct ModelConfig {
    /// `architectures[0]`.
    pub architecture: String,
    /// Family.
    pub family: Family,
    /// Hidden size.
    pub hidden_size: u64,
    /// Decoder layers.
    pub num_layers: u64,
    /// Attention (query) heads.
    pub num_heads: u64,
    /// KV heads (= heads without GQA).
    pub num_kv_heads: u64,
    /// Head dim (explicit or hidden / heads).
    pub head_dim: u64,
    /// Dense MLP intermediate size.
    pub intermediate_size: u64,
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Input and output embeddings shared.
    pub tie_word_embeddings: bool,
    /// `torch_dtype` / `dtype` as written (`bfloat16`), if any.
    pub torch_dtype: Option<String>,
    /// Context length the model was trained for.
    pub max_position_embeddings: Option<u64>,
    /// Biases on the QKV projections (Qwen2, gpt-oss).
    pub qkv_bias: bool,
    /// Whether the MLP is gated (gate, up and down projections, as Llama's), or two matrices
    /// (Falcon, GPT-NeoX, GPT-2, GPT-J, BLOOM, OPT, MPT, StarCoder / StarCoder2, Phi-2).
    pub gated_mlp: bool,
    /// Per decoder layer: what it keeps in the KV cache.
    pub layers: Vec<LayerKind>,
    /// Per decoder layer: its own head counts and MLP size, where the config describes layers
    /// individually; empty when every layer has the model-wide shape (`num_heads`,
    /// `num_kv_heads`, `intermediate_size`).
    pub layer_shapes: Vec<LayerShape>,
    /// The recurrent state of [`LayerKind::State`] layers (Mamba, gated DeltaNet). Its mixer's
    /// projections take the place of attention's in those layers' weights.
    pub state: Option<crate::arch::state::StateShape>,
    /// Per decoder block, what it holds, where the model is built of single-purpose blocks
    /// (Nemotron-H); empty when every layer has a mixer (attention or state) and an MLP.
    pub blocks: Vec<Block>,
    /// Per decoder layer: whether its feed-forward block is the routed experts, by the
    /// config's own rule (`decoder_sparse_step`, `mlp_only_layers`, `moe_layer_freq`, ...);
    /// empty without routed experts. A pipeline stage holds its own layers' experts.
    #[serde(skip)]
    pub moe_layers: Vec<bool>,
    /// Attention's query projection also produces an output gate as wide as the queries
    /// (Qwen3-Next / Qwen3.5 `attn_output_gate`: qwen3_next.py, `Qwen3NextAttention`).
    pub attn_output_gate: bool,
    /// DeepSeek-V3.2's indexer head dim (an indexer cache beside every MLA layer).
    pub indexer_head_dim: Option<u64>,
    /// Per-layer input embeddings (Gemma 3n, Gemma 4 E2B/E4B: `vocab_size_per_layer_input`,
    /// `hidden_size_per_layer_input`): `(vocabulary, width per layer)`, a table of
    /// `vocabulary x layers x width` beside the token embedding.
    pub per_layer_input: Option<(u64, u64)>,
    /// KV-cache dtype the checkpoint asks for when `--kv-cache-dtype auto` (ModelOpt
    /// `kv_cache_quant_algo: FP8`, compressed-tensors `kv_cache_scheme`).
    pub kv_cache_quant: Option<String>,
    /// Which rule read the config (shown in the plan's notes).
    pub rule: String,
    /// Where the language model was found in a multimodal wrapper (`text_config`, ...).
    pub language_key: Option<String>,
    /// Notes for the user (estimated parts, engine support).
    pub notes: Vec<String>,
    /// The engine's default `max_model_len` derived from the config (vLLM
    /// `_get_and_verify_max_len`: the smallest length key, RoPE scaling factor applied).
    pub derived_max_len: Option<u64>,
    /// Routed experts, if any.
    pub moe: Option<Moe>,
    /// MLA, if any.
    pub mla: Option<Mla>,
    /// Checkpoint quantization, if any.
    pub quantization: Option<Quantization>,
    /// Vision tower of a multimodal wrapper, if any.
    pub vision: Option<Vision>,
}

/// Field access with errors that name the key.
pub(crate) struct Fields<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) outer: Option<&'a Map<String, Value>>,
}

impl<'a> Fields<'a> {
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map
            .get(key)
            .filter(|v| !v.is_null())
            .or_else(|| self.outer.and_then(|o| o.get(key)).filter(|v| !v.is_null()))
    }

    /// A positive integer below 2^40 (anything bigger is absurd for a model dimension).
    pub(crate) fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if let Some(lit) = v
            .as_str()
            .filter(|s| memplan_core::json::NON_FINITE.contains(s))
        {
            return Err(Error::invalid(
                key,
                format!("is {lit}: NaN and infinity are not valid JSON numbers (`{lit}`), and memplan needs a number here"),
            ));
        }
        let n = v
            .as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                    .map(|f| if f >= 1e19 { u64::MAX } else { f as u64 })
            })
            .ok_or_else(|| {
                Error::invalid(key, format!("expected a non-negative integer, found {v}"))
            })?;
        if n >= 1 << 40 {
            // The value as written (a float such as 1e30 would print as u64::MAX).
            return Err(Error::invalid(
                key,
                format!("{v} is not a plausible value (at most 2^40)"),
            ));
        }
        Ok(Some(n))
    }

    pub(crate) fn u64(&self, key: &str) -> Result<u64> {
        self.opt_u64(key)?
            .ok_or_else(|| Error::invalid(key, "missing from config.json"))
    }

    pub(crate) fn positive(&self, key: &str) -> Result<u64> {
        match self.u64(key)? {
            0 => Err(zero(key)),
            n => Ok(n),
        }
    }

    /// The first of several alias keys that is present.
    pub(crate) fn first(&self, keys: &[&str]) -> Result<Option<u64>> {
        Ok(self.first_key(keys)?.map(|(_, v)| v))
    }

    /// The first of several alias keys that is present, with the key that gave it.
    pub(crate) fn first_key<'k>(&self, keys: &[&'k str]) -> Result<Option<(&'k str, u64)>> {
        for k in keys {
            if let Some(v) = self.opt_u64(k)? {
                return Ok(Some((k, v)));
            }
        }
        Ok(None)
    }

    /// As [`Fields::first`], for a dimension the arithmetic divides by or multiplies a layer's
    /// size with, where no engine reads 0 as "none": 0 is refused naming the key that held it.
    pub(crate) fn first_positive(&self, keys: &[&str]) -> Result<Option<u64>> {
        match self.first_key(keys)? {
            Some((k, 0)) => Err(zero(k)),
            other => Ok(other.map(|(_, v)| v)),
        }
    }

    pub(crate) fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| Error::invalid(key, format!("expected true or false, found {v}"))),
        }
    }

    pub(crate) fn str(&self, key: &str) -> Option<&'a str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// The most keys and values together (each key, string, number, literal, object and array
/// counts one) that a model's `config.json`, or a quantization file beside it, may hold. The
/// largest real configs hold about 2,500 (Llama-3.1-Nemotron-Ultra-253B's per-layer
/// `block_configs`, in `tests/data/per-layer-configs.jsonl`); a quantization section that
/// lists every linear layer of a 256-expert, 61-layer model (ModelOpt's mixed-precision
/// `quantized_layers`) would hold about 150,000 (3 per entry, estimated). Every
/// one becomes a `serde_json::Value` of 32 bytes plus its map entry, copied where the config's
/// sections and class defaults are merged, so a 16 MiB file of tiny keys took 0.84 GB of memory
/// before this limit (and an array of 8 million zeros 1.08 GB).
pub const MAX_JSON_ITEMS: usize = 262_144;

/// The deepest nesting of objects and arrays in a config or quantization file (serde_json's
/// own recursion limit, which refuses deeper text with a syntax error; real configs nest at
/// most 5 deep).
pub const MAX_JSON_DEPTH: usize = 128;

/// Count the keys and values of JSON `text`, and its nesting, without building anything:
/// refuse it before it is parsed when either is past [`MAX_JSON_ITEMS`] or
/// [`MAX_JSON_DEPTH`] (or it starts with a byte-order mark, named as such), so that no file under its size cap makes the reader take hundreds of
/// megabytes. Linear in the text; the text need not be valid (the parser says what is wrong
/// with it).
pub fn check_json_shape(text: &str) -> Result<()> {
    if text.starts_with('\u{feff}') {
        // serde_json stops at it with "expected value at line 1 column 1".
        return Err(Error::invalid(
            "config.json",
            "starts with a UTF-8 byte-order mark (U+FEFF), which JSON does not allow and Python's json (transformers, the engines) refuses too: save it as UTF-8 without a BOM",
        ));
    }
    let b = text.as_bytes();
    let (mut items, mut depth, mut i) = (0usize, 0usize, 0usize);
    while i < b.len() {
        match b[i] {
            b'"' => {
                items += 1;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => {
                items += 1;
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(Error::invalid(
                        "config.json",
                        format!("nests objects and arrays more than {MAX_JSON_DEPTH} deep (real configs nest at most 5): not a model's description"),
                    ));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            c if c == b'-' || c.is_ascii_alphanumeric() => {
                items += 1;
                while i + 1 < b.len()
                    && (b[i + 1].is_ascii_alphanumeric() || matches!(b[i + 1], b'.' | b'+' | b'-'))
                {
                    i += 1;
                }
            }
            _ => {}
        }
        if items > MAX_JSON_ITEMS {
            return Err(Error::invalid(
                "config.json",
                format!("holds more than {MAX_JSON_ITEMS} keys and values (the largest real configs hold about 2,500, a quantization list of every layer of a large MoE about 150,000); memplan refuses it before reading it into memory: remove what does not describe the model"),
            ));
        }
        i += 1;
    }
    Ok(())
}

/// The error for a dimension of 0 where the model's arithmetic needs a positive one (a layer
/// of no width, heads of no size, a division by it).
pub(crate) fn zero(key: &str) -> Error {
    Error::invalid(
        key,
        "must be > 0: the model's sizes are computed from it, and 0 describes no model the engines can load; write the checkpoint's real value",
    )
}

/// Architectures whose MLP is two matrices, up and down with an activation between (vLLM
/// `falcon.py` `FalconMLP`, `gpt_neox.py` `GPTNeoXMLP`, `gpt2.py` `GPT2MLP`, `gpt_j.py`
/// `GPTJMLP`, `bloom.py` `BloomMLP`, `opt.py` `OPTDecoderLayer` fc1/fc2, `mpt.py` `MPTMLP`,
/// `gpt_bigcode.py` `GPTBigMLP`, `starcoder2.py` `Starcoder2MLP`, `phi.py` `PhiMLP`;
/// `nemotron_h.py` `NemotronHMLP`, whose routed experts are two matrices too:
/// `SharedFusedMoE(..., is_act_and_mul=False)`).
const TWO_MATRIX_MLP: &[&str] = &[
    "FalconForCausalLM",
    "RWForCausalLM",
    "GPTNeoXForCausalLM",
    "GPT2LMHeadModel",
    "GPTJForCausalLM",
    "BloomForCausalLM",
    "OPTForCausalLM",
    "MPTForCausalLM",
    "GPTBigCodeForCausalLM",
    "Starcoder2ForCausalLM",
    "PhiForCausalLM",
    "NemotronHForCausalLM",
    "NemotronH_Nano_VL_V2",
];

/// Whether a key path names something memplan may read as a figure: a segment (the key names,
/// indices left out) says size, dimension, count, factor, length or another shape word.
fn names_a_figure(path: &str) -> bool {
    const WORDS: &[&str] = &[
        "size",
        "dim",
        "factor",
        "len",
        "layer",
        "head",
        "expert",
        "window",
        "position",
        "vocab",
        "multiplier",
        "rank",
        "num",
        "ratio",
        "scaling",
        "rope",
        "block",
        "group",
        "interval",
        "period",
        "offset",
        "stride",
        "kernel",
        "patch",
        "embed",
        "width",
    ];
    path.split(['.', '['])
        .map(|s| s.trim_end_matches(']').to_ascii_lowercase())
        .any(|s| WORDS.iter().any(|w| s.contains(w)))
}

impl ModelConfig {
    /// Whether decoder layer `i` has routed experts: as [`ModelConfig::moe_layers`] says, or,
    /// where that is empty (a config not read from a file), every layer after the
    /// [`Moe::dense_layers`] leading dense ones.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        let Some(m) = self.moe else { return false };
        match self.moe_layers.get(i) {
            Some(at) => *at,
            None => self.moe_layers.is_empty() && i as u64 >= m.dense_layers,
        }
    }

    /// Parse the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<Self> {
        check_json_shape(text)?;
        let strict = |e: memplan_core::json::JsonError| {
            // A syntax error inside a value (a `NaN` literal) names the key it is at.
            Error::invalid(e.path.as_deref().unwrap_or("config.json"), e.message())
        };
        let e = match memplan_core::json::from_str::<Value>(text) {
            Ok(v) => return Self::from_value(&v),
            Err(e) => e,
        };
        // Python's json writes `NaN` / `Infinity` for non-finite floats and transformers and
        // the engines read them back: Mamba2's config holds `time_step_limit: [0.0,
        // Infinity]`. Quoted, they stay out of the way of the keys memplan reads, and a key
        // it reads as a figure that holds one is refused by name ([`Fields::opt_u64`]); the
        // plan's notes list where they were.
        let Some(quoted) = memplan_core::json::quote_non_finite(text) else {
            return Err(strict(e));
        };
        let v: Value = memplan_core::json::from_str(&quoted).map_err(|_| strict(e))?;
        let at = memplan_core::json::non_finite_paths(&v);
        // Some figures are read off the document directly (a RoPE scaling factor, a vision
        // tower's widths), where a string would read as absent: a literal under a key whose
        // name says it is a size, count, factor or length is refused as JSON's error.
        if let Some((p, lit)) = at.iter().find(|(p, _)| names_a_figure(p)) {
            return Err(Error::invalid(
                p.clone(),
                format!("is {lit}: NaN and infinity are not valid JSON numbers (`{lit}`), and this key names a figure memplan may read"),
            ));
        }
        let mut c = Self::from_value(&v)?;
        if !at.is_empty() {
            let shown: Vec<&str> = at.iter().take(8).map(|(p, _)| p.as_str()).collect();
            let more = at.len().saturating_sub(shown.len());
            c.notes.push(format!(
                "config.json holds NaN or infinity (Python's json writes them; they are not JSON) at {}{}: keys memplan does not read as figures",
                shown.join(", "),
                if more > 0 { format!(" and {more} more") } else { String::new() }
            ));
        }
        Ok(c)
    }

    /// Parse a parsed `config.json`.
    pub fn from_value(v: &Value) -> Result<Self> {
        let top = v
            .as_object()
            .ok_or_else(|| Error::invalid("config.json", "expected a JSON object"))?;
        let arch = top
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .ok_or_else(|| Error::invalid("architectures", "missing or not a list of names"))?
            .to_string();
        // Multimodal wrappers keep the language model in a sub-config; top-level keys are
        // fallbacks. Keys the file omits take the config class's defaults (by model_type).
        let (text, key) = crate::arch::defaults::language_section(top)?;
        let merged = crate::arch::defaults::with_defaults(text.unwrap_or(top), top);
        let f = Fields {
            map: &merged,
            outer: text.map(|_| top),
        };
        let config = crate::arch::parse(&arch, &f, top, key)?;
        config.check_mlp_width(&f)?;
        config.check_dimensions()?;
        Ok(config)
    }

    /// A model-wide MLP width of 0 is refused where a layer has a dense MLP of that width (a
    /// layer that is not routed experts and has no width of its own, a Nemotron-H MLP block):
    /// such a layer would hold no MLP weights. Where every layer has experts or its own width
    /// (Nemotron-NAS `block_configs`, whose 0 means "no MLP"), the key is not read, and 0
    /// stays as harmless as any other value.
    fn check_mlp_width(&self, f: &Fields<'_>) -> Result<()> {
        if self.intermediate_size > 0 {
            return Ok(());
        }
        let dense = if self.blocks.is_empty() {
            (0..self.layers.len().min(self.num_layers as usize))
                .any(|i| !self.is_moe_layer(i) && self.layer_shapes.get(i).is_none())
        } else {
            self.blocks.contains(&Block::Mlp)
        };
        if !dense {
            return Ok(());
        }
        let key = f
            .first_key(&[
                "intermediate_size",
                "n_inner",
                "ffn_hidden_size",
                "block_ff_dim",
            ])?
            .map_or("intermediate_size", |(k, _)| k);
        Err(zero(key))
    }

    /// The dimensions read must compute: a KV layout whose head sizes fit the KV spec's 32
    /// bits, whose pages (per layer and summed over the layers) fit 64 bits at the largest
    /// block size and widest dtype, and a parameter count the weight estimate can hold. Keys
    /// plausible one by one (each at most 2^40) can still multiply past that; found here,
    /// the error is the file's and names a key, not a failure of a later plan.
    fn check_dimensions(&self) -> Result<()> {
        let spec = self.kv_spec(memplan_core::kv::KvDtype::F32, 16, 1)?;
        let mut total: u64 = 0;
        for g in &spec.groups {
            let page = g
                .page_bytes(memplan_core::kv::KvDtype::F32, crate::limits::MAX_BLOCK)
                .ok()
                .and_then(|p| p.checked_mul(u64::from(g.num_layers)));
            total = match page.and_then(|p| total.checked_add(p)) {
                Some(t) => t,
                None => {
                    return Err(Error::invalid(
                        "num_key_value_heads",
                        format!(
                            "{} KV heads of head dim {} in {} layers make a KV block of {} tokens larger than 64 bits",
                            g.kv_heads,
                            g.head_dim_k.max(g.head_dim_v),
                            g.num_layers,
                            crate::limits::MAX_BLOCK
                        ),
                    ))
                }
            };
        }
        crate::weights::params_per_rank(self, 1)?;
        Ok(())
    }

    /// Parse the common dense-decoder keys (with Phi-2's alternative spellings).
    pub(crate) fn dense(architecture: String, family: Family, f: &Fields<'_>) -> Result<Self> {
        let hidden = f
            .first_positive(&["hidden_size", "n_embd", "d_model"])?
            .ok_or_else(|| Error::invalid("hidden_size", "missing from config.json"))?;
        let layers = match f.first_positive(&["num_hidden_layers", "n_layer", "num_layers"])? {
            Some(n) => n,
            // A config that gives its layers only as a per-layer list (Nemotron-H's
            // `layers_block_type` in transformers 5's form, which derives the count from it)
            // is missing no count but a reader: name the key that describes them.
            None => {
                return Err(match crate::arch::guard::PER_LAYER
                    .iter()
                    .find_map(|k| f.get(k).and_then(|v| v.as_array()).map(|a| (k, a.len())))
                {
                    Some((k, n)) => Error::invalid(
                        *k,
                        format!("describes the layers one by one ({n} entries) and the config gives no `num_hidden_layers`: memplan reads no layer count from this list, so it refuses the config"),
                    ),
                    None => Error::invalid("num_hidden_layers", "missing from config.json"),
                })
            }
        };
        let heads = match f.first_positive(&["num_attention_heads", "n_head"])? {
            Some(h) => h,
            // A pure state-space model (`MambaForCausalLM`, `Mamba2ForCausalLM`,
            // `FalconMambaForCausalLM`) has no attention to count heads of.
            None if ["state_size", "ssm_state_size", "d_state", "mamba_d_state"]
                .iter()
                .any(|k| f.get(k).is_some()) =>
            {
                return Err(Error::invalid(
                    "num_attention_heads",
                    format!("missing: {architecture} is a state-space (Mamba) model with no attention layers; memplan sizes attention layers' KV caches and, in hybrid models, the state beside them, not a model without attention"),
                ))
            }
            None => {
                return Err(Error::invalid(
                    "num_attention_heads",
                    "missing from config.json",
                ))
            }
        };
        if layers > 4096 {
            return Err(Error::invalid(
                "num_hidden_layers",
                format!("{layers} is not a plausible layer count"),
            ));
        }
        // vLLM `CONFIG_FIELD_ALIASES["total_num_kv_heads"]`; Falcon's `multi_query` means 1.
        let kv = match f.first_positive(&[
            "n_head_kv",
            "num_kv_heads",
            "num_key_value_heads",
            "multi_query_group_num",
            "num_attention_groups",
        ])? {
            Some(k) => k,
            None if f.bool("multi_query", false)? => 1,
            None => heads,
        };
        if heads % kv != 0 {
            return Err(Error::invalid(
                "num_key_value_heads",
                format!("{kv} does not divide num_attention_heads {heads}"),
            ));
        }
        // vLLM `ModelConfig.get_head_size` (vllm/config/model.py): head_dim when it is not
        // None, else hidden_size_per_head, else hidden_size / heads. A head_dim of 0 is taken
        // as given there (heads of no size), so it is refused here rather than derived; a
        // `null` one is absent.
        let head_dim = match f.first_key(&["head_dim", "hidden_size_per_head"])? {
            Some((_, d)) if d > 0 => d,
            Some((k, _)) if f.get("kv_lora_rank").is_none() => return Err(zero(k)),
            // MLA: vLLM's head size is the cached latent (kv_lora_rank + qk_rope_head_dim).
            _ if f.get("kv_lora_rank").is_some() => {
                f.opt_u64("kv_lora_rank")?.unwrap_or(0) + f.opt_u64("qk_rope_head_dim")?.unwrap_or(0)
            }
            _ if hidden % heads == 0 => hidden / heads,
            _ => return Err(Error::invalid("head_dim", format!("missing, and hidden_size {hidden} is not a multiple of num_attention_heads {heads}"))),
        };
        // The KV spec holds head sizes in 32 bits.
        if head_dim > u64::from(u32::MAX) {
            return Err(match f.first(&["head_dim", "hidden_size_per_head"])? {
                Some(d) if d > 0 => Error::invalid("head_dim", format!("{d} is not a plausible head size (at most 2^32 - 1)")),
                _ if f.get("kv_lora_rank").is_some() => Error::invalid("kv_lora_rank", format!("kv_lora_rank + qk_rope_head_dim = {head_dim} is not a plausible head size (at most 2^32 - 1)")),
                _ => Error::invalid("hidden_size", format!("hidden_size {hidden} / num_attention_heads {heads} = {head_dim} is not a plausible head size (at most 2^32 - 1)")),
            });
        }
        // ChatGLM / GLM-4-9B write `ffn_hidden_size` and `padded_vocab_size` (vLLM
        // `chatglm.py`: `GLMMLP` and `ChatGLMModel` read those).
        let intermediate = f
            .first(&["intermediate_size", "n_inner", "ffn_hidden_size"])?
            .unwrap_or(4 * hidden);
        let vocab = match f.get("vocab_size") {
            None if f.get("padded_vocab_size").is_some() => f.positive("padded_vocab_size")?,
            _ => f.positive("vocab_size")?,
        };
        let dtype = match ["torch_dtype", "dtype"]
            .into_iter()
            .find_map(|k| Some((k, f.get(k)?)))
        {
            None => None,
            // The engines load these in 16 or 32 bits; anything else is not a model dtype
            // memplan can size (and a non-string is not a dtype at all).
            Some((_, Value::String(d))) if crate::dtype_bytes(d).is_ok() => Some(d.clone()),
            Some((k, v)) => {
                return Err(Error::invalid(
                    k,
                    format!("{v} is not a model dtype (bfloat16, float16 or float32)"),
                ))
            }
        };
        let quantization = match f.get("quantization_config") {
            Some(q) => Some(Quantization::from_config(q)?),
            None => None,
        };
        let gated_mlp = !TWO_MATRIX_MLP.iter().any(|a| architecture.starts_with(a));
        Ok(ModelConfig {
            architecture,
            family,
            hidden_size: hidden,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim,
            intermediate_size: intermediate,
            vocab_size: vocab,
            tie_word_embeddings: f.bool("tie_word_embeddings", false)?,
            torch_dtype: dtype,
            max_position_embeddings: f.first(&[
                "max_position_embeddings",
                "n_positions",
                "max_seq_len",
            ])?,
            qkv_bias: f.bool("attention_bias", false)?,
            gated_mlp,
            layers: vec![LayerKind::Full; layers as usize],
            layer_shapes: Vec::new(),
            state: None,
            blocks: Vec::new(),
            moe_layers: Vec::new(),
            attn_output_gate: false,
            indexer_head_dim: None,
            per_layer_input: None,
            kv_cache_quant: None,
            rule: String::new(),
            language_key: None,
            notes: Vec::new(),
            derived_max_len: None,
            moe: None,
            mla: None,
            quantization,
            vision: None,
        })
    }
}
