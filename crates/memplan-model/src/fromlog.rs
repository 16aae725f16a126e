//! `memplan plan --from-log FILE`: the measured figures of an engine's start-up log, so a
//! start-up can be reproduced without retyping. Formats read: vLLM V0 ("Memory profiling
//! results: ..."), vLLM V1 0.10 to current ("Model loading took", "torch peak memory
//! increase", "Available KV cache memory", "GPU KV cache size"), and SGLang ("Load weight
//! end ... mem usage", "KV Cache is allocated", "Capture cuda graph end ... mem usage").
//! A log with none of these lines is an error that says what was looked for.

use memplan_core::bytes::GIB;
use memplan_core::{Error, Param, Result};

use crate::engine::EngineKind;

/// Figures read from a log; `None` where the log does not print them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LogFigures {
    /// Which engine wrote it.
    pub engine: Option<EngineKind>,
    /// The version it printed (`0.10.1.1`).
    pub version: Option<String>,
    /// `model` of the non-default args (or SGLang's `model_path`).
    pub model: Option<String>,
    /// Device total (bytes).
    pub total: Option<u64>,
    /// `gpu_memory_utilization` (or SGLang's `mem_fraction_static`).
    pub utilization: Option<f64>,
    /// Weights per rank.
    pub weights: Option<u64>,
    /// Activation peak per rank (torch peak increase).
    pub activation: Option<u64>,
    /// Non-torch memory growth per rank.
    pub non_torch: Option<u64>,
    /// The engine's graph-memory estimate.
    pub graph_estimate: Option<u64>,
    /// Graph memory measured after capture.
    pub graph_actual: Option<u64>,
    /// Whether the estimate was subtracted ("Total non KV cache memory" includes it).
    pub graph_subtracted: bool,
    /// "Available KV cache memory".
    pub kv_available: Option<u64>,
    /// "GPU KV cache size" tokens (SGLang: the allocated #tokens).
    pub kv_tokens: Option<u64>,
    /// `max_model_len`.
    pub max_model_len: Option<u64>,
    /// Tensor-parallel ranks.
    pub tensor_parallel: Option<u64>,
    /// `kv_cache_dtype`.
    pub kv_cache_dtype: Option<String>,
    /// `quantization`.
    pub quantization: Option<String>,
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u64>,
    /// `max_num_seqs`.
    pub max_num_seqs: Option<u64>,
}

/// The number right after `key` in `text` (digits, `,` and `.`), and its unit if any.
fn after<'a>(text: &'a str, key: &str) -> Option<(f64, &'a str)> {
    let i = text.find(key)? + key.len();
    let rest = text[i..].trim_start_matches([' ', '=', ':', '\'', '"']);
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',' || c == '-'))
        .unwrap_or(rest.len());
    let n: f64 = rest[..end].replace(',', "").parse().ok()?;
    Some((n, rest[end..].trim_start()))
}

fn gib(text: &str, key: &str) -> Option<u64> {
    // vLLM prints GiB; V0 and SGLang print "GB" for the same 2^30 figure.
    after(text, key).map(|(n, _)| (n.max(0.0) * GIB as f64) as u64)
}

fn int(text: &str, key: &str) -> Option<u64> {
    after(text, key).map(|(n, _)| n as u64)
}

/// A quoted argument of the "non-default args" dictionary (`'model': 'X'`).
fn arg(text: &str, key: &str) -> Option<String> {
    let i = text.find(&format!("'{key}': "))? + key.len() + 4;
    let rest = &text[i..];
    let v = rest.split([',', '}']).next()?.trim().trim_matches('\'');
    Some(v.to_string())
}

/// Read the figures of an engine start-up log.
pub fn parse(text: &str) -> Result<LogFigures> {
    let mut f = LogFigures::default();
    let sglang = text.contains("KV Cache is allocated") || text.contains("Load weight end");
    let vllm_v1 = text.contains("Available KV cache memory") || text.contains("Model loading took");
    let vllm_v0 =
        text.contains("Memory profiling results") || text.contains("Loading model weights took");
    if !(sglang || vllm_v1 || vllm_v0) {
        return Err(Error::param(
            Param::EngineLog,
            "found none of vLLM's \"Model loading took\" / \
             \"Available KV cache memory\" / \"Memory profiling results\" lines nor SGLang's \
             \"Load weight end\" / \"KV Cache is allocated\" lines",
        ));
    }
    if sglang {
        f.engine = Some(EngineKind::Sglang);
        f.weights = text
            .split("Load weight end")
            .nth(1)
            .and_then(|t| gib(t, "mem usage="));
        f.kv_tokens = int(text, "#tokens:");
        f.graph_actual = text
            .split("Capture cuda graph end")
            .nth(1)
            .and_then(|t| gib(t, "mem usage="));
        f.utilization = after(text, "mem_fraction_static=").map(|x| x.0);
        f.max_model_len = int(text, "context_len=");
        f.model = text
            .split("model_path='")
            .nth(1)
            .and_then(|t| t.split('\'').next())
            .map(str::to_string);
        f.tensor_parallel = int(text, "tp_size=");
        return Ok(f);
    }
    f.engine = Some(EngineKind::Vllm);
    f.version = text
        .split("version ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .map(str::to_string);
    f.model = arg(text, "model");
    f.max_model_len = arg(text, "max_model_len").and_then(|v| v.parse().ok());
    f.tensor_parallel = arg(text, "tensor_parallel_size").and_then(|v| v.parse().ok());
    f.utilization = arg(text, "gpu_memory_utilization").and_then(|v| v.parse().ok());
    f.kv_cache_dtype = arg(text, "kv_cache_dtype");
    f.quantization = arg(text, "quantization");
    f.max_num_batched_tokens = int(text, "max_num_batched_tokens=");
    f.max_num_seqs = int(text, "Defaulting max_num_seqs to ")
        .or_else(|| arg(text, "max_num_seqs").and_then(|v| v.parse().ok()));
    f.total = gib(text, "total_memory=").or_else(|| gib(text, "total_gpu_memory="));
    f.weights = gib(text, "Model loading took")
        .or_else(|| gib(text, "weights memory:"))
        .or_else(|| gib(text, "Loading model weights took"));
    f.activation = gib(text, "torch peak memory increase:");
    f.non_torch = gib(text, "non-torch forward increase memory:");
    f.graph_estimate = gib(text, "Estimated CUDA graph memory:");
    f.graph_actual = text
        .split("Graph capturing finished")
        .nth(1)
        .and_then(|t| gib(t, "took"));
    f.kv_available = gib(text, "Available KV cache memory:");
    f.kv_tokens = int(text, "KV cache size:");
    if vllm_v0 {
        // V0: peak_torch_memory includes the weights; utilisation printed in the line.
        if let (Some(peak), Some(w)) = (gib(text, "peak_torch_memory="), f.weights) {
            f.activation = Some(peak.saturating_sub(w));
        }
        f.non_torch = f.non_torch.or_else(|| gib(text, "non_torch_memory="));
        f.utilization = f
            .utilization
            .or_else(|| after(text, "gpu_memory_utilization=").map(|x| x.0));
        f.kv_available = f.kv_available.or_else(|| gib(text, "kv_cache_size="));
    }
    // Was the graph estimate subtracted? "Total non KV cache memory" = weights + activation
    // + non-torch (+ graph when subtracted).
    if let (Some(total), Some(w), Some(a), Some(n), Some(g)) = (
        gib(text, "Total non KV cache memory:"),
        f.weights,
        f.activation,
        f.non_torch,
        f.graph_estimate,
    ) {
        let base = (w + a + n) as f64;
        f.graph_subtracted =
            ((total as f64) - base - g as f64).abs() < ((total as f64) - base).abs();
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unrecognised_logs_are_clear_errors() {
        let e = parse("hello\nworld").unwrap_err().to_string();
        assert!(
            e.starts_with("engine start-up log: found none of")
                && e.contains("Available KV cache memory"),
            "{e}"
        );
    }

    #[test]
    fn sglang_lines() {
        let log = "[2025-01-01] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.41 GB, mem usage=14.99 GB.\n\
                   KV Cache is allocated. #tokens: 441168, K size: 26.93 GB, V size: 26.93 GB\n\
                   Capture cuda graph end. Time elapsed: 3.21 s. mem usage=0.51 GB. avail mem=7.20 GB.";
        let f = parse(log).unwrap();
        assert_eq!(f.engine, Some(EngineKind::Sglang));
        assert_eq!(f.kv_tokens, Some(441_168));
        assert_eq!(f.weights, Some((14.99 * GIB as f64) as u64));
        assert_eq!(f.graph_actual, Some((0.51 * GIB as f64) as u64));
    }
}
