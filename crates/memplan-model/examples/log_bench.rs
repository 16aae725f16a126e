//! Benchmark: read engine start-up logs as large as `--from-log` accepts. Run with
//! `cargo run --release -p memplan-model --example log_bench [MIB]` (or without `--release`
//! for the debug build); prints the median of 3 reads of each log of MIB MiB (default 64; the
//! reader's cap is 256):
//!
//! - `served`: a real vLLM start-up followed by what a server that ran for days appends (the
//!   periodic throughput/KV-usage line, request lines, access log);
//! - `figures`: every line a figure line the reader takes apart (`Available KV cache memory`,
//!   `non-default args`, engine config): the worst case per byte;
//! - `one line`: the whole log on one line with a figure at its end.
//!
//! Not a timed test: CI only builds it.

use std::time::Instant;

use memplan_model::fromlog::parse;

const START: &str = "\
(APIServer pid=1) INFO 10-06 17:00:01 [api_utils.py:273] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 131072, 'gpu_memory_utilization': 0.92}
(EngineCore pid=326) INFO 10-06 17:00:02 [core.py:123] Initializing a V1 LLM engine (v0.31.0) with config: model='meta-llama/Llama-3.1-8B-Instruct', dtype=torch.bfloat16, max_seq_len=131072, tensor_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto
(EngineCore pid=326) INFO 10-06 17:00:11 [model_runner.py:407] Model loading took 15.0 GiB memory and 5.420225 seconds
(EngineCore pid=326) INFO 10-06 17:00:33 [gpu_worker.py:692] Available KV cache memory: 56.21 GiB
(EngineCore pid=326) INFO 10-06 17:00:33 [kv_cache_utils.py:2464] GPU KV cache size: 460,496 tokens, Maximum concurrency for 131,072 tokens per request: 3.51x
(EngineCore pid=326) INFO 10-06 17:00:41 [gpu_worker.py:955] Free memory on device (78.84/79.25 GiB) on startup. Desired GPU memory utilization is (0.92, 72.91 GiB). Actual usage is 15.26 GiB for consumed memory (weights + non-torch), 1.44 GiB for peak activation, and 0.23 GiB for CUDAGraph memory.
";

const SERVED: &[&str] = &[
    "(APIServer pid=1) INFO 10-06 17:05:41 [loggers.py:259] Engine 000: Avg prompt throughput: 2514.3 tokens/s, Avg generation throughput: 412.7 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 4.1%, Prefix cache hit rate: 37.2%",
    "(APIServer pid=1) INFO 10-06 17:05:42 [logger.py:41] Received request chatcmpl-9f1c2e: prompt: '<|begin_of_text|>...', params: SamplingParams(n=1, temperature=0.7, top_p=0.95, max_tokens=512), model='meta-llama/Llama-3.1-8B-Instruct', lora_request: None.",
    "(APIServer pid=1) INFO:     10.0.0.12:53412 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
];

const FIGURES: &[&str] = &[
    "(EngineCore pid=326) INFO 10-06 17:00:33 [gpu_worker.py:692] Available KV cache memory: 56.21 GiB",
    "(APIServer pid=1) INFO 10-06 17:00:01 [api_utils.py:273] non-default args: {'model': 'm', 'max_model_len': 131072, 'max_num_seqs': 256, 'max_num_batched_tokens': 8192, 'block_size': 16, 'tensor_parallel_size': 1, 'kv_cache_dtype': 'fp8', 'quantization': 'fp8', 'enforce_eager': False, 'gpu_memory_utilization': 0.92}",
    "(EngineCore pid=326) INFO 10-06 17:00:41 [gpu_worker.py:955] Free memory on device (78.84/79.25 GiB) on startup. Desired GPU memory utilization is (0.92, 72.91 GiB). Actual usage is 15.26 GiB for consumed memory (weights + non-torch), 1.44 GiB for peak activation, and 0.23 GiB for CUDAGraph memory.",
];

fn build(size: usize, lines: &[&str]) -> String {
    let mut s = String::with_capacity(size + 4096);
    s.push_str(START);
    let mut i = 0;
    while s.len() < size {
        s.push_str(lines[i % lines.len()]);
        s.push('\n');
        i += 1;
    }
    s
}

fn time(name: &str, text: &str) {
    let mut runs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let f = parse(text).expect("the log reads");
        runs.push(t.elapsed().as_secs_f64());
        assert!(f.kv_available.is_some());
    }
    runs.sort_by(f64::total_cmp);
    let mib = text.len() as f64 / (1 << 20) as f64;
    println!(
        "{name:>9}: {mib:6.1} MiB in {:7.3} s ({:6.3} s per 10 MiB)",
        runs[1],
        runs[1] / mib * 10.0
    );
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(64);
    let size = mib << 20;
    time("served", &build(size, SERVED));
    time("figures", &build(size, FIGURES));
    let mut one = "x".repeat(size);
    one.push_str(" Available KV cache memory: 1.00 GiB\n");
    time("one line", &one);
}
