//! # memplan-model
//!
//! Model specs for memplan's dry run: what a model needs on each tensor-parallel rank before
//! the KV cache gets the rest.
//!
//! ## The contract
//!
//! - [`Model::load`] takes a path (a model directory or its `config.json`) or the name of a
//!   shipped preset ([`presets`]); a directory's `*.safetensors` headers are read (never the
//!   tensors) for the exact checkpoint bytes ([`safetensors`]).
//! - [`ModelConfig`] holds the facts of `config.json`; malformed configs, unknown
//!   architectures and absurd values are one-line [`Error::InvalidInput`]s naming the key.
//! - [`ModelConfig::kv_spec`] gives the KV layout of one rank (full, sliding-window and MLA
//!   layer groups) for `memplan_core::kv` sizing.
//! - [`weights::weight_bytes`] computes weights from the architecture; [`estimate`] gives the
//!   activation peak, non-allocator growth and graph memory, each an [`estimate::Estimate`]
//!   labelled with its basis. Measured values always win over these.
//! - Tensor parallelism divides what it divides: attention heads, MLP and expert columns,
//!   vocab-parallel embeddings; norms, routers and too-few KV heads are replicated.

pub mod accuracy;
pub mod arch;
pub mod config;
pub mod consumers;
pub mod defaults;
pub mod device;
pub mod dryrun;
pub mod engine;
pub mod estimate;
pub mod fromlog;
pub mod gguf;
pub mod hub;
pub mod kvspec;
pub mod limits;
pub mod presets;
pub mod quant;
pub mod safetensors;
pub mod validation;
pub mod weights;

use std::path::{Path, PathBuf};

use memplan_core::input;

pub use config::{Family, ModelConfig};
pub use estimate::{EngineShape, Estimate};
pub use memplan_core::Error;
use memplan_core::Result;
pub use quant::Quantization;

/// Where a model's config came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Source {
    /// A shipped preset (Hugging Face id).
    Preset(String),
    /// A file or directory on disk.
    Path(PathBuf),
    /// A snapshot in the local Hugging Face cache.
    HubCache {
        /// `ORG/NAME`.
        repo: String,
        /// The snapshot directory.
        snapshot: PathBuf,
    },
    /// A GGUF file.
    Gguf(PathBuf),
}

/// A loaded model.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Model {
    /// Display name.
    pub name: String,
    /// Where it came from.
    pub source: Source,
    /// Its config.
    pub config: ModelConfig,
    /// Safetensors headers, when the directory has them.
    pub checkpoint: Option<safetensors::Summary>,
}

impl Model {
    /// Load from a path (directory, `config.json` or `.gguf` file), else a Hugging Face id
    /// from the local cache ([`hub`]), else a shipped preset by name.
    ///
    /// A path whose name ends in `.gguf` (any case) is a GGUF file and nothing else: a
    /// directory or special file of that name is refused, not read as a model directory.
    /// A cached Hugging Face model is read only from inside its cache folder ([`hub`]).
    pub fn load(name_or_path: &str) -> Result<Self> {
        let p = Path::new(name_or_path);
        // A path is there when its own entry is, links not followed: a link that leads
        // nowhere (dangling, or a loop of links) is a path whose reading fails naming it,
        // not a preset name that was not found.
        let present = std::fs::symlink_metadata(p).is_ok();
        if is_gguf_name(p) && present {
            return gguf::load(p);
        }
        if !present && hub::is_repo_id(name_or_path) {
            if let Some(root) = hub::cache_root() {
                if let Some(m) = Model::load_from_cache(&root, name_or_path)? {
                    return Ok(m);
                }
            }
            return presets::find(name_or_path)
                .map(|preset| Model {
                    name: preset.model.clone(),
                    source: Source::Preset(preset.model),
                    config: preset.config,
                    checkpoint: None,
                })
                .map_err(|_| hub::not_cached(name_or_path));
        }
        if !present {
            let preset = presets::find(name_or_path)?;
            return Ok(Model {
                name: preset.model.clone(),
                source: Source::Preset(preset.model),
                config: preset.config,
                checkpoint: None,
            });
        }
        Model::load_path(p, name_or_path, None)
    }

    /// Load `repo_id` (`ORG/NAME`) from the Hugging Face cache at `root`, `Ok(None)` when it
    /// is not cached there; every file read stays inside its cache folder ([`hub`]).
    pub fn load_from_cache(root: &Path, repo_id: &str) -> Result<Option<Self>> {
        let Some(snap) = hub::snapshot_in(root, repo_id)? else {
            return Ok(None);
        };
        let mut m = Model::load_path(&snap.dir, repo_id, Some(&snap.boundary))?;
        m.name = repo_id.to_string();
        m.source = Source::HubCache {
            repo: repo_id.to_string(),
            snapshot: snap.dir,
        };
        Ok(Some(m))
    }

    /// Load a model directory or `config.json`; with `within` (a real path), every file read
    /// must resolve inside it.
    fn load_path(p: &Path, name_or_path: &str, within: Option<&Path>) -> Result<Self> {
        let confine = |f: &Path| match within {
            Some(root) => {
                input::confined(f, root, "the model's Hugging Face cache folder").map(drop)
            }
            None => Ok(()),
        };
        let (config_path, dir) = if p.is_dir() {
            (p.join("config.json"), Some(p))
        } else {
            (p.to_path_buf(), None)
        };
        if config_path.extension().is_some_and(|x| x == "safetensors") {
            return Err(Error::file(
                config_path.display().to_string(),
                "is a safetensors checkpoint; pass the model directory (its config.json and \
                 *.safetensors headers are read) or its config.json",
            ));
        }
        confine(&config_path)?;
        let text = input::read_text(&config_path, input::CONFIG_JSON)?;
        let mut config = ModelConfig::from_json_str(&text).map_err(|e| match e {
            Error::InvalidInput { field, message } => {
                let key = (field != "config.json").then_some(field);
                Error::InvalidFile {
                    path: config_path.display().to_string(),
                    key,
                    message,
                }
            }
            other => other,
        })?;
        // ModelOpt checkpoints name their KV cache (and, where the config has no
        // `quantization_config`, their weights) in `hf_quant_config.json` beside the config;
        // AutoGPTQ ones their weights in `quantize_config.json`.
        if let Some(d) = dir {
            let q = d.join("hf_quant_config.json");
            let wanted = config.kv_cache_quant.is_none() || config.quantization.is_none();
            if wanted && std::fs::symlink_metadata(&q).is_ok() {
                confine(&q)?;
                // Read once for both figures.
                let (name, v) = quant::read_json(&q)?;
                if config.kv_cache_quant.is_none() {
                    config.kv_cache_quant = quant::modelopt_kv_algo(&v, &name)?;
                }
                if config.quantization.is_none() {
                    config.quantization = quant::modelopt_weights(&v, &name)?;
                }
            }
            let g = d.join("quantize_config.json");
            if config.quantization.is_none() && std::fs::symlink_metadata(&g).is_ok() {
                confine(&g)?;
                config.quantization = quant::gptq_file(&g)?;
            }
        }
        let checkpoint = match dir {
            Some(d) => safetensors::read_dir_within(d, within)?,
            None => None,
        };
        // A `config.json` named by its path is the model of the folder it is in.
        let named = match dir {
            Some(d) => d,
            None if p.file_name().is_some_and(|n| n == "config.json") => {
                p.parent().filter(|d| d.file_name().is_some()).unwrap_or(p)
            }
            None => p,
        };
        let name = named
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| name_or_path.to_string());
        Ok(Model {
            name,
            source: Source::Path(p.to_path_buf()),
            config,
            checkpoint,
        })
    }
}

/// Whether a path names a GGUF file by its extension (`.gguf`, any case).
pub fn is_gguf_name(p: &Path) -> bool {
    p.extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
}

/// Bytes per element of a model dtype name (`bfloat16`, `float16`, `float32`, short forms).
pub fn dtype_bytes(name: &str) -> Result<u64> {
    match name.to_ascii_lowercase().as_str() {
        "bfloat16" | "bf16" | "float16" | "fp16" | "half" => Ok(2),
        "float32" | "fp32" | "float" => Ok(4),
        other => Err(Error::invalid(
            "dtype",
            format!("unknown dtype {other:?}; expected auto, bfloat16, float16 or float32"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_file_or_a_special_file_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("memplan-model-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A sparse 3 GB file: named as a checkpoint, never read.
        let f = std::fs::File::create(dir.join("model.safetensors")).unwrap();
        f.set_len(3 << 30).unwrap();
        let e = Model::load(dir.join("model.safetensors").to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("safetensors checkpoint") && e.contains("config.json"),
            "{e}"
        );
        let e = Model::load("/dev/zero").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_gguf_name_is_a_gguf_file_or_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("memplan-model-gguf-{}", std::process::id()));
        // A model directory named like a GGUF file: refused as what it is, not loaded as a
        // directory (whose llama.cpp answer would then fail).
        for name in ["x.gguf", "Y.GGUF"] {
            let d = dir.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("config.json"), "{}").unwrap();
            let e = Model::load(d.to_str().unwrap()).unwrap_err();
            assert!(matches!(e, Error::InvalidFile { .. }), "{e:?}");
            assert!(
                e.to_string().contains(name) && e.to_string().contains("directory"),
                "{e}"
            );
        }
        std::os::unix::fs::symlink("/dev/zero", dir.join("z.gguf")).unwrap();
        let e = Model::load(dir.join("z.gguf").to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        std::os::unix::fs::symlink(dir.join("none"), dir.join("dangling.gguf")).unwrap();
        let e = Model::load(dir.join("dangling.gguf").to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("dangling.gguf"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loads_a_directory_with_its_checkpoint_headers() {
        let dir = std::env::temp_dir().join(format!("memplan-model-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":128,"vocab_size":100,
            "max_position_embeddings":256,"torch_dtype":"bfloat16"}"#;
        std::fs::write(dir.join("config.json"), cfg).unwrap();
        let h = r#"{"model.embed_tokens.weight":{"dtype":"BF16","shape":[100,64],"data_offsets":[0,12800]}}"#;
        let mut st = (h.len() as u64).to_le_bytes().to_vec();
        st.extend_from_slice(h.as_bytes());
        st.resize(st.len() + 12800, 0);
        std::fs::write(dir.join("model.safetensors"), &st).unwrap();
        let m = Model::load(dir.to_str().unwrap()).unwrap();
        assert_eq!(m.checkpoint.as_ref().map(|c| c.total()), Some(12800));
        assert_eq!(m.config.num_kv_heads, 2);
        // The config file alone works too, without checkpoint figures.
        let f = Model::load(dir.join("config.json").to_str().unwrap()).unwrap();
        assert!(f.checkpoint.is_none());
        // Named after its folder, as the folder would be, not "config.json".
        assert_eq!(f.name, m.name);
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures":["LlamaForCausalLM"]}"#,
        )
        .unwrap();
        let e = Model::load(dir.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("config.json: hidden_size"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(dtype_bytes("int3")
            .unwrap_err()
            .to_string()
            .starts_with("dtype"));
    }

    /// Weights quantized as a file beside the config says: ModelOpt's `hf_quant_config.json`
    /// (NVFP4: 4.5 bits a weight, the FP8 group scales counted) and AutoGPTQ's
    /// `quantize_config.json` (4 bits in groups of 128).
    #[test]
    fn quantization_files_beside_the_config_size_the_weights() {
        let dir = std::env::temp_dir().join(format!("memplan-model-qfiles-{}", std::process::id()));
        let cfg = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_hidden_layers":32,
            "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
            "max_position_embeddings":8192,"intermediate_size":14336,"torch_dtype":"bfloat16"}"#;
        for (sub, file, text, bits) in [
            (
                "nvfp4",
                "hf_quant_config.json",
                r#"{"producer":{"name":"modelopt"},"quantization":{"quant_algo":"NVFP4","kv_cache_quant_algo":"FP8","group_size":16,"exclude_modules":["lm_head"]}}"#,
                4.5,
            ),
            (
                "fp8",
                "hf_quant_config.json",
                r#"{"quantization":{"quant_algo":"FP8","kv_cache_quant_algo":null}}"#,
                8.0,
            ),
            (
                "gptq",
                "quantize_config.json",
                r#"{"bits":4,"group_size":128,"desc_act":false,"sym":true}"#,
                4.0 + 20.0 / 128.0,
            ),
        ] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("config.json"), cfg).unwrap();
            std::fs::write(d.join(file), text).unwrap();
            let m = Model::load(d.to_str().unwrap()).unwrap_or_else(|e| panic!("{sub}: {e}"));
            let q = m
                .config
                .quantization
                .unwrap_or_else(|| panic!("{sub}: no quantization"));
            assert!((q.bits_per_weight - bits).abs() < 1e-9, "{sub}: {q:?}");
        }
        // NVFP4 named in config.json's own quantization_config is 4.5 bits, not ModelOpt's 8;
        // shared experts left unquantized are counted in full precision beside 4.5-bit routed
        // experts; other MLP parts left unquantized count everything at 8 (never short of
        // the checkpoint).
        let q = quant::Quantization::from_config(
            &serde_json::json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", "model.layers.0.mlp.gate"]}),
        )
        .unwrap();
        assert_eq!(q.bits_per_weight, 4.5);
        let q = quant::Quantization::from_config(
            &serde_json::json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", "model.layers.0.mlp.shared_expert*"]}),
        )
        .unwrap();
        assert_eq!((q.bits_per_weight, q.shared_experts), (4.5, false));
        let q = quant::Quantization::from_config(
            &serde_json::json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", "model.layers.0.mlp.down_proj"]}),
        )
        .unwrap();
        assert_eq!(q.bits_per_weight, 8.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Dimensions each plausible on its own whose KV page, head size or parameter count
    /// cannot be computed are the config file's fault: an error naming the file and a key,
    /// when it is loaded, not a usage error without a file when a plan is made.
    #[test]
    fn dimensions_that_do_not_compute_are_the_files_error() {
        let dir = std::env::temp_dir().join(format!("memplan-model-dims-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = r#""architectures":["LlamaForCausalLM"],"intermediate_size":14336,
            "vocab_size":128256,"max_position_embeddings":8192,"torch_dtype":"bfloat16""#;
        let p2 = 1u64 << 31;
        for (name, dims, key) in [
            // hidden_size / heads = 31,250,000,000: no head size (at most 2^32 - 1).
            ("derived-head", r#""num_hidden_layers":32,"hidden_size":1000000000000,"num_attention_heads":32,"num_key_value_heads":8"#.to_string(), "hidden_size"),
            ("head-dim", r#""num_hidden_layers":32,"hidden_size":4096,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":1000000000000"#.to_string(), "head_dim"),
            // 2^31 KV heads of 2^31: a page past 64 bits.
            ("page", format!(r#""num_hidden_layers":32,"hidden_size":4096,"num_attention_heads":{p2},"num_key_value_heads":{p2},"head_dim":{p2}"#), "KV heads"),
            // Each page fits, but not 4,096 layers of them in one block of the largest size.
            ("block", format!(r#""num_hidden_layers":4096,"hidden_size":4096,"num_attention_heads":{p2},"num_key_value_heads":{p2},"head_dim":128"#), "num_key_value_heads"),
        ] {
            let f = dir.join(format!("{name}.json"));
            std::fs::write(&f, format!("{{{base},{dims}}}")).unwrap();
            let e = Model::load(f.to_str().unwrap()).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, Error::InvalidFile { .. }), "{name}: {e:?}");
            assert!(text.contains(&format!("{name}.json")) && text.contains(key), "{name}: {text}");
            assert!(!text.contains('{'), "{name}: a Rust value in the message: {text}");
        }
        // 10^12 experts of a Mixtral: a parameter count past 2^62.
        let f = dir.join("experts.json");
        std::fs::write(
            &f,
            r#"{"architectures":["MixtralForCausalLM"],"model_type":"mixtral","hidden_size":4096,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
            "intermediate_size":14336,"vocab_size":32000,"num_local_experts":1000000000000,
            "num_experts_per_tok":2}"#,
        )
        .unwrap();
        let e = Model::load(f.to_str().unwrap()).unwrap_err();
        assert!(matches!(e, Error::InvalidFile { .. }), "{e:?}");
        assert!(e.to_string().contains("experts.json"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A config whose text holds a `NaN` or `Infinity` literal (not JSON, though Python's
    /// `json.dumps` writes it) names the file, the key path and what the literal is; so does
    /// a ModelOpt `hf_quant_config.json` beside it.
    #[test]
    fn a_non_finite_literal_in_a_config_names_the_file_and_key() {
        let dir = std::env::temp_dir().join(format!("memplan-model-nan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let llama = r#""architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"max_position_embeddings":8192,"intermediate_size":14336"#;
        let base = r#""architectures":["LlavaForConditionalGeneration"],"model_type":"llava""#;
        // A key memplan reads as a figure: refused naming it and the literal.
        for (name, text, key, literal) in [
            ("nan.json", format!("{{{llama},\"num_hidden_layers\": NaN}}"), "num_hidden_layers", "NaN"),
            (
                "nested.json",
                format!("{{{base},\n\"text_config\": {{\"hidden_size\": 4096,\n \"num_hidden_layers\": Infinity}}}}"),
                "text_config.num_hidden_layers",
                "Infinity",
            ),
            // A figure read off the document directly (a RoPE factor) is refused too.
            (
                "rope.json",
                format!("{{{llama},\"num_hidden_layers\":32,\"rope_scaling\":{{\"rope_type\":\"yarn\",\"factor\":Infinity}}}}"),
                "rope_scaling.factor",
                "Infinity",
            ),
        ] {
            let f = dir.join(name);
            std::fs::write(&f, text).unwrap();
            let e = Model::load(f.to_str().unwrap()).unwrap_err();
            let Error::InvalidFile { path, key: Some(k), message } = &e else {
                panic!("{name}: {e:?}");
            };
            assert!(path.ends_with(name) && k == key, "{name}: {e}");
            assert!(
                message.contains("NaN and infinity are not valid JSON numbers")
                    && message.contains(&format!("`{literal}`")),
                "{name}: {e}"
            );
        }
        // A key nobody reads as a figure, as Python's json writes Mamba2's
        // `time_step_limit`: the config loads, and its notes say where the literals were.
        let f = dir.join("unread.json");
        std::fs::write(
            &f,
            format!("{{{llama},\"num_hidden_layers\":32,\"time_step_limit\":[0.0, Infinity],\"clip_qkv\":-Infinity}}"),
        )
        .unwrap();
        let m = Model::load(f.to_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            m.config
                .notes
                .iter()
                .any(|n| n.contains("time_step_limit[1]") && n.contains("clip_qkv")),
            "{:?}",
            m.config.notes
        );
        // The quantization file beside a model directory's config.
        let m = dir.join("modelopt");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(
            m.join("config.json"),
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_hidden_layers":32,
            "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
            "max_position_embeddings":8192,"intermediate_size":14336}"#,
        )
        .unwrap();
        std::fs::write(
            m.join("hf_quant_config.json"),
            r#"{"quantization":{"kv_cache_quant_algo":"FP8","group_size":NaN}}"#,
        )
        .unwrap();
        let e = Model::load(m.to_str().unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("hf_quant_config.json")
                && e.contains("quantization.group_size")
                && e.contains("NaN and infinity"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
