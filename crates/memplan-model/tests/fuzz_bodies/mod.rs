//! The bodies of the fuzz targets, shared by the cargo-fuzz targets in `fuzz/` (libFuzzer)
//! and the stable in-process driver `tests/fuzz_stable.rs` (every `cargo test`, and the CI
//! fuzz step): each `run` takes one input and panics only when a property breaks.
//! Properties: no panic, bounded time and memory (checked by the drivers), and never a plan
//! from outside the model's folder.

pub mod config_json;
pub mod from_log;
pub mod gguf;
pub mod hf_cache;
pub mod safetensors_header;
