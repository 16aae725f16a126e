//! One pass over a log line that finds every key the reader looks for, so the reader's many
//! checks cost a look-up in a short list rather than a search of the line each.
//!
//! A line is scanned once, byte pair by byte pair: a 64 Ki-bit table says whether some key
//! starts with that pair, and only there are the keys of that pair compared. A server that
//! ran for days appends millions of request and throughput lines that hold no key, so a log
//! at the reader's size cap is read in linear time, dominated by this one scan. Every key the
//! reader passes to a line must be in [`KEYS`] (checked in debug builds and by a test), or
//! the scan would not report it.

use std::sync::OnceLock;

/// Every key the reader looks for in a whole log line.
pub(super) const KEYS: &[&str] = &[
    // Engine detection.
    "KV Cache is allocated",
    "Load weight end",
    "ServerArgs(",
    "Available KV cache memory",
    "larger than the available KV cache memory",
    "Model loading took",
    "Memory profiling results",
    "Loading model weights took",
    "GPU KV cache size",
    "Memory profiling takes",
    "# GPU blocks",
    "# CUDA blocks",
    "Free memory on device",
    "CUDA graph pool memory",
    "Estimated CUDA graph memory",
    "Maximum concurrency for",
    // The release.
    "vLLM API server version ",
    "LLM engine (v",
    "\u{2588}  version ",
    "\u{2588} version ",
    "vLLM ",
    "vLLM version ",
    "vllm version ",
    "sglang version ",
    "SGLang version ",
    "vLLM:",
    // Device, utilisation.
    "utilization is",
    "desired GPU memory utilization",
    "Current kv cache memory in use is",
    "Desired GPU memory utilization is",
    "total_gpu_memory",
    "total_memory=",
    "current --gpu-memory-utilization=",
    "equivalent to --gpu-memory-utilization",
    "current --gpu",
    "gpu_memory_utilization",
    "mem_fraction_static",
    "CUDA graph memory profiling is enabled",
    "increase --gpu-memory-utilization from",
    "equivalent to --gpu-memory-utilization=",
    "for consumed memory",
    "Actual usage is",
    // The report before the consumed accounting (figure first, then its name).
    " GiB for weight",
    " GiB for peak activation",
    " GiB for non-torch memory",
    " GiB for CUDAGraph memory",
    " GiB for NPU graph memory",
    // Weights, activation, non-torch, non-KV.
    "model weights take",
    "weights memory:",
    "torch peak memory increase:",
    "PyTorch activation peak memory takes",
    "PyTorch activation peak memory",
    "peak_torch_memory=",
    "non-torch forward increase memory:",
    "non_torch_memory takes",
    "non_torch_memory",
    "snapshot",
    "total consumed (from mem_get_info):",
    "Total non KV cache memory:",
    // Graphs.
    "Estimated CUDA graph memory:",
    "CUDA graph pool memory:",
    "Graph capturing finished",
    "cuda graph end",
    "CUDA graph end",
    "npu graph end",
    "NPU graph end",
    "mem usage",
    // KV memory, tokens, blocks.
    "Available KV cache memory:",
    "available_kv_cache_memory",
    "the rest of the memory reserved for KV Cache is",
    "kv_cache_size=",
    // The torch.compile cache.
    "Compiling a graph for",
    "Directly load the compiled graph",
    "Directly load AOT compilation",
    " tokens",
    "KV cache size:",
    "Extended KV cache to",
    "Memory after warmup:",
    "# GPU blocks:",
    "# CUDA blocks:",
    "# cuda blocks:",
    "# rocm blocks:",
    "# xpu blocks:",
    "# HPU blocks:",
    "# TPU blocks:",
    "# cpu blocks:",
    "num_gpu_blocks is:",
    "#tokens:",
    "K size:",
    "V size:",
    "KV size:",
    // Refusals: one request of `max_model_len` does not fit.
    "maximum number of tokens that can be stored in KV cache",
    "max seq len (",
    "estimated maximum model length is",
    // The CPU backend (refused), other platforms, and vllm-ascend's block size.
    "Automatically detected platform cpu",
    "Automatically detected platform cuda",
    "Automatically detected platform rocm",
    "Automatically detected platform xpu",
    "Automatically detected platform tpu",
    "Automatically detected platform hpu",
    "Platform plugin ",
    "VLLM_CPU_KVCACHE_SPACE",
    "Block size is set to",
    "Available memory:",
    "Before memory profiling run, total GPU memory:",
    "After memory profiling run, peak memory usage is",
    // Settings.
    "'max_model_len': -1",
    "max_model_len=-1",
    "'max_model_len'",
    "max_seq_len",
    "context_len",
    "'max_num_batched_tokens'",
    "max_num_batched_tokens",
    "Defaulting max_num_seqs to",
    "'max_num_seqs'",
    "max_num_seqs",
    "server_args=",
    "'block_size'",
    "block_size",
    "page_size",
    "'tensor_parallel_size'",
    "tensor_parallel_size",
    "tp_size",
    "'model':",
    "model=",
    "model_path=",
    "\u{2588}  model ",
    "\u{2588} model ",
    "Starting to load model ",
    "vllm serve ",
    "--model ",
    "--model=",
    "--model-path ",
    "--model-path=",
    "Found local HF snapshot for ",
    "'kv_cache_dtype':",
    "kv_cache_dtype=",
    "'mamba_cache_dtype':",
    "mamba_cache_dtype=",
    "'mamba_ssm_cache_dtype':",
    "mamba_ssm_cache_dtype=",
    "'quantization':",
    "quantization=",
    "Skipping CUDA graph capture",
    "\"cudagraph_mode\":0,",
    "'cudagraph_mode': <CUDAGraphMode.NONE",
    "'enforce_eager':",
    "enforce_eager=",
    "'enable_prefix_caching':",
    "enable_prefix_caching=",
    "disable_cuda_graph=",
    "'pipeline_parallel_size'",
    "pipeline_parallel_size",
    "pp_size",
];

/// Keys that yield nothing on their own: each qualifies a figure read under another key of
/// the same line (a line with only these is skipped).
const PARTNERS: &[&str] = &[
    " tokens",
    "mem usage",
    "snapshot",
    "current --gpu",
    "equivalent to --gpu-memory-utilization",
    "Actual usage is",
    "K size:",
    "V size:",
    "#tokens:",
    "utilization is",
    "desired GPU memory utilization",
    "'max_model_len': -1",
    "max_model_len=-1",
    "server_args=",
];

/// Keys of the release line, in the order the reader tries them, read once and never checked
/// again.
pub(super) const RELEASE: &[&str] = &[
    "vLLM API server version ",
    "LLM engine (v",
    // The start-up banner (0.2x+): `█ ▀▄▀ █  version 0.22.1`; a blog or a rendered page
    // collapses the run of spaces to one (`█ ▀▄▀ █ version 0.19.0`).
    "\u{2588}  version ",
    "\u{2588} version ",
    "vLLM ",
    "vLLM version ",
    "vllm version ",
    "sglang version ",
    "SGLang version ",
    // A report's environment section: `vLLM: 0.20.2rc1...`.
    "vLLM:",
];

/// Keys of the model's name, read once and never checked again (a server's request lines
/// name the model on every request).
const MODEL: &[&str] = &[
    "'model':",
    "model=",
    "model_path=",
    "\u{2588}  model ",
    "\u{2588} model ",
    "Starting to load model ",
    "vllm serve ",
    "--model ",
    "--model=",
    "--model-path ",
    "--model-path=",
    "Found local HF snapshot for ",
];

/// The model keys of the start-up banner (`█  model   Qwen/Qwen3-14B`, collapsed to one space
/// on a rendered page), of V0's "Starting to load model X...", of a command line pasted with
/// the log (`vllm serve X`, `--model X`, `--model-path X`: see [`COMMAND_MODEL`]) and of
/// SGLang's "Found local HF snapshot for X at P" (`srt/model_loader/weight_utils.py`): read
/// only where no argument or config line names the model.
pub(super) const BANNER_MODEL: [&str; 9] = [
    "\u{2588}  model ",
    "\u{2588} model ",
    "Starting to load model ",
    "vllm serve ",
    "--model ",
    "--model=",
    "--model-path ",
    "--model-path=",
    "Found local HF snapshot for ",
];

/// The flags of a command line (`--model X`, `--model-path X`): read only on a line that
/// launches an engine ([`LAUNCHERS`]), as other lines may name the flag in prose.
pub(super) const COMMAND_MODEL: [&str; 4] =
    ["--model ", "--model=", "--model-path ", "--model-path="];

/// What a line that launches vLLM or SGLang holds.
pub(super) const LAUNCHERS: [&str; 6] = [
    "vllm serve",
    "vllm.entrypoints",
    "sglang.launch_server",
    "sglang.bench_",
    "sglang serve",
    "sglang.srt",
];

/// Whether a line's keys include one that names the model.
pub(super) fn has_model_key(found: &[(&'static str, usize)]) -> bool {
    found.iter().any(|(k, _)| MODEL.contains(k))
}

/// Whether a line whose keys are `found` can yield a figure, once the release (`version`)
/// and the model (`model`) are known or not.
pub(super) fn worth_reading(found: &[(&'static str, usize)], version: bool, model: bool) -> bool {
    found.iter().any(|(k, _)| {
        let spent = (version && RELEASE.contains(k)) || (model && MODEL.contains(k));
        !(PARTNERS.contains(k) || spent)
    })
}

/// The keys by an anchor: the byte pair of each key least likely in other text.
struct Table {
    /// Bit `(b0 << 8) | b1` is set when some key's anchor is the byte pair `b0 b1`.
    pairs: Vec<u64>,
    /// `(anchor pair, anchor offset in the key, key)`, sorted by anchor pair.
    keys: Vec<(usize, usize, &'static str)>,
    /// Where the keys of each anchor pair start in `keys` (65,537 entries).
    start: Vec<u16>,
}

fn pair(b0: u8, b1: u8) -> usize {
    (usize::from(b0) << 8) | usize::from(b1)
}

/// How common a byte pair is in log text: pairs of lowercase letters and spaces are the
/// most common, pairs with capitals, digits or punctuation the least.
fn commonness(b0: u8, b1: u8) -> u8 {
    let plain = |b: u8| b.is_ascii_lowercase() || b == b' ';
    u8::from(plain(b0)) + u8::from(plain(b1))
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let mut keys: Vec<(usize, usize, &'static str)> = KEYS
            .iter()
            .map(|k| {
                let b = k.as_bytes();
                let j = (0..b.len() - 1)
                    .min_by_key(|&j| commonness(b[j], b[j + 1]))
                    .unwrap_or(0);
                (pair(b[j], b[j + 1]), j, *k)
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut pairs = vec![0u64; 1024];
        let mut start = vec![0u16; 65_537];
        for (p, _, _) in &keys {
            pairs[p >> 6] |= 1 << (p & 63);
            start[p + 1] += 1;
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        Table { pairs, keys, start }
    })
}

/// Every key of [`KEYS`] that occurs in `line`, each once with the byte offset of its first
/// occurrence, into `found` (cleared first).
pub(super) fn keys_in(line: &str, found: &mut Vec<(&'static str, usize)>) {
    found.clear();
    let t = table();
    let (b, pairs) = (line.as_bytes(), &t.pairs[..]);
    let mut i = 0;
    while i + 1 < b.len() {
        let p = pair(b[i], b[i + 1]);
        if pairs[p >> 6] & (1 << (p & 63)) != 0 {
            for &(_, j, k) in &t.keys[usize::from(t.start[p])..usize::from(t.start[p + 1])] {
                if i >= j
                    && b[i - j..].starts_with(k.as_bytes())
                    && !found.iter().any(|(f, _)| *f == k)
                {
                    found.push((k, i - j));
                }
            }
        }
        i += 1;
    }
}

/// Whether `key` is one of [`KEYS`].
#[cfg(test)]
pub(super) fn is_key(key: &str) -> bool {
    static SORTED: OnceLock<Vec<&'static str>> = OnceLock::new();
    SORTED
        .get_or_init(|| {
            let mut v = KEYS.to_vec();
            v.sort_unstable();
            v
        })
        .binary_search(&key)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_key_and_only_keys() {
        let mut found = Vec::new();
        for k in KEYS {
            assert!(k.len() >= 2, "{k:?}: a key has at least two bytes");
            keys_in(&format!("xx {k} yy"), &mut found);
            assert!(
                found.iter().any(|(f, at)| f == k && *at == 3),
                "{k:?} not found"
            );
        }
        keys_in(
            "INFO Engine 000: Avg prompt throughput: 1.0 tokens/s, GPU KV cache usage: 4%",
            &mut found,
        );
        assert_eq!(found, vec![(" tokens", 43)]);
        keys_in("", &mut found);
        assert!(found.is_empty());
        keys_in("Model loading took 1 GiB; Model loading took 2", &mut found);
        assert_eq!(found, vec![("Model loading took", 0)]);
        // A key at the very start and at the very end of a line.
        keys_in("tp_size", &mut found);
        assert_eq!(found, vec![("tp_size", 0)]);
        assert!(is_key("KV cache size:") && !is_key("KV cache"));
        for k in PARTNERS
            .iter()
            .chain(RELEASE)
            .chain(MODEL)
            .chain(&super::super::V0_BLOCK_LINES)
            .chain(&super::super::CPU_BACKEND)
            .chain(&super::super::PLATFORM_DETECTED)
            .chain([
                &super::super::ASCEND_BLOCK,
                &super::super::ASCEND_AVAILABLE,
                &super::super::XPU_BEFORE,
                &super::super::XPU_AFTER,
            ])
            .chain(&super::super::NO_GRAPHS)
            .chain(&super::super::GRAPH_END)
        {
            assert!(is_key(k), "{k:?}");
        }
        assert!(!worth_reading(&[(" tokens", 0)], false, false));
        assert!(worth_reading(&[("model=", 0)], true, false));
        assert!(!worth_reading(&[("model=", 0), ("vLLM ", 9)], true, true));
        assert!(worth_reading(
            &[("model=", 0), ("KV cache size:", 9)],
            true,
            true
        ));
    }
}
