use super::*;

fn gib(x: f64) -> u64 {
    (x * GIB as f64).round() as u64
}

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
    assert_eq!(f.weights, Some(gib(14.99)));
    assert_eq!(f.graph_actual, Some(gib(0.51)));
    assert_eq!(f.kv_available, Some(gib(26.93) * 2));
    assert_eq!(f.line("kv_tokens"), Some(2));
}

/// A current (0.2x/0.3x) V1 log as printed, worker prefixes included.
const CURRENT: &str = "\
(APIServer pid=1) INFO 08-14 14:06:01 [api_server.py:1000] vLLM API server version 0.27.1
(APIServer pid=1) INFO 08-14 14:06:01 [utils.py:300] non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768, 'gpu_memory_utilization': 0.82, 'tensor_parallel_size': 2}
(EngineCore pid=367) INFO 08-14 14:06:10 [core.py:90] Initializing a V1 LLM engine (v0.27.1) with config: model='Qwen/Qwen3-8B', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=2, quantization=None, enforce_eager=False, kv_cache_dtype=auto
(Worker_TP0 pid=447) INFO 08-14 14:06:40 [gpu_model_runner.py:4216] Model loading took 7.63 GiB memory and 20.1 seconds
(Worker_TP0 pid=447) INFO 08-14 14:07:20 [gpu_worker.py:400] Memory profiling takes 9.34 seconds. Total non KV cache memory: 9.62GiB; torch peak memory increase: 1.21GiB; total consumed (from mem_get_info): 8.41GiB; weights memory: 7.63GiB.
(Worker_TP1 pid=448) INFO 08-14 14:07:22 [gpu_model_runner.py:6806] Estimated CUDA graph memory: 0.36 GiB total
(Worker_TP0 pid=447) INFO 08-14 14:07:22 [gpu_worker.py:563] Available KV cache memory: 6.87 GiB
(Worker_TP0 pid=447) INFO 08-14 14:07:22 [gpu_worker.py:578] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.8200 is equivalent to --gpu-memory-utilization=0.8048 without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase --gpu-memory-utilization to 0.8352.
(EngineCore pid=367) INFO 08-14 14:07:23 [kv_cache_utils.py:1307] GPU KV cache size: 100,000 tokens
(EngineCore pid=367) INFO 08-14 14:07:23 [kv_cache_utils.py:1311] Maximum concurrency for 32,768 tokens per request: 3.05x
(Worker_TP0 pid=447) INFO 08-14 14:07:40 [gpu_model_runner.py:6243] Graph capturing finished in 9 secs, took 0.31 GiB
(Worker_TP0 pid=447) INFO 08-14 14:07:40 [gpu_worker.py:621] CUDA graph pool memory: 0.31 GiB (actual), 0.36 GiB (estimated), difference: 0.05 GiB (16.1%).
(Worker_TP0 pid=447) INFO 08-14 14:07:40 [gpu_worker.py:700] Free memory on device (22.45/23.99 GiB) on startup. Desired GPU memory utilization is (0.82, 19.67 GiB). Actual usage is 8.41 GiB for consumed memory (weights + non-torch), 1.57 GiB for peak activation, and 0.31 GiB for CUDAGraph memory.
";

#[test]
fn a_current_log_gives_every_figure_with_its_line() {
    let f = parse(CURRENT).unwrap();
    assert_eq!(f.engine, Some(EngineKind::Vllm));
    assert_eq!(f.version.as_deref(), Some("0.27.1"));
    assert_eq!(f.release().as_deref(), Some("0.27.1"));
    assert_eq!(f.model.as_deref(), Some("Qwen/Qwen3-8B"));
    assert_eq!(f.utilization, Some(0.82));
    assert_eq!(f.max_model_len, Some(32_768));
    assert_eq!(f.tensor_parallel, Some(2));
    assert_eq!(f.weights, Some(gib(7.63)));
    assert_eq!(f.activation, Some(gib(1.21)));
    assert_eq!(f.consumed, Some(gib(8.41)));
    assert_eq!(f.non_kv, Some(gib(9.62)));
    assert_eq!(f.graph_estimate, Some(gib(0.36)));
    assert_eq!(f.graph_actual, Some(gib(0.31)));
    assert!(f.graph_subtracted);
    assert_eq!(f.kv_available, Some(gib(6.87)));
    assert_eq!(f.kv_tokens, Some(100_000));
    assert_eq!(f.max_concurrency, Some(3.05));
    assert_eq!((f.free, f.total), (Some(gib(22.45)), Some(gib(23.99))));
    assert_eq!(f.line("total"), Some(13));
    assert_eq!(f.line("weights"), Some(4));
    assert_eq!(f.enforce_eager, Some(false));
}

#[test]
fn release_drops_pre_release_and_local_suffixes() {
    let f = LogFigures {
        version: Some("0.20.2rc1.dev9+g01d4d1ad3".into()),
        ..LogFigures::default()
    };
    assert_eq!(f.release().as_deref(), Some("0.20.2"));
    let f = LogFigures {
        version: Some("0.10.1.1".into()),
        ..LogFigures::default()
    };
    assert_eq!(f.release().as_deref(), Some("0.10.1"));
}

#[test]
fn v0_lines_with_sentence_punctuation_are_read() {
    // vLLM V0 printed the utilisation at the end of a sentence: the period is not a digit.
    let log = "INFO 12-13 worker.py:243] Memory profiling results: total_gpu_memory=79.22GiB initial_memory_usage=15.5GiB peak_torch_memory=16.22GiB memory_usage_post_profile=17.3GiB non_torch_memory=1.79GiB kv_cache_size=53.29GiB gpu_memory_utilization=0.90.\n\
               INFO loader.py] Loading model weights took 14.96 GB\n\
               INFO executor_base.py] # GPU blocks: 27284, # CPU blocks: 2048";
    let f = parse(log).unwrap();
    assert_eq!(f.utilization, Some(0.90));
    assert_eq!(f.total, Some(gib(79.22)));
    assert_eq!(f.kv_available, Some(gib(53.29)));
    assert_eq!(f.activation, Some(gib(16.22) - gib(14.96)));
    assert_eq!(f.kv_blocks, Some(27_284));
}

/// Every figure of the log through the same checks as its flag: each hostile value is an
/// error naming the line and the value as printed, never clamped, wrapped or read as 0.
#[test]
fn hostile_figures_are_refused_naming_the_line_and_value() {
    let cases: &[(&str, &str)] = &[
        (
            "INFO Defaulting max_num_seqs to 18446744073709551615 for OPENAI_API_SERVER",
            "18446744073709551615",
        ),
        (
            "INFO Defaulting max_num_seqs to 184467440737095516150000",
            "184467440737095516150000",
        ),
        ("INFO Defaulting max_num_seqs to 0", "0"),
        ("INFO Defaulting max_num_seqs to 2000000", "2000000"),
        (
            "INFO Free memory on device (1.0/99,999,999,999,999,999 GiB) on startup.",
            "99,999,999,999,999,999",
        ),
        ("INFO Model loading took -14.99 GiB memory", "-"),
        ("INFO Model loading took 1e308 GiB memory", "1e308"),
        (
            "INFO Graph capturing finished in 5 secs, took 1e308 GiB",
            "1e308",
        ),
        ("INFO Model loading took NaN GiB", "NaN"),
        // A unit glued to the word: still the figure, not a line without one.
        (
            "INFO worker init memory snapshot: free_memory=78.68GiB, total_memory=NaNGiB",
            "NaN",
        ),
        (
            "INFO worker init memory snapshot: free_memory=78.68GiB, total_memory=infGiB",
            "inf",
        ),
        ("INFO Model loading took -InfinityGiB memory", "-Infinity"),
        ("INFO non-default args: {'gpu_memory_utilization': 5}", "5"),
        ("INFO non-default args: {'gpu_memory_utilization': 0}", "0"),
        ("INFO gpu_memory_utilization=1.5.", "1.5"),
        ("INFO mem_fraction_static=-0.3", "-0.3"),
        (
            "INFO non-default args: {'max_model_len': 99999999999}",
            "99999999999",
        ),
        ("INFO non-default args: {'tensor_parallel_size': 0}", "0"),
        ("INFO non-default args: {'block_size': 1000000}", "1000000"),
        ("INFO max_num_batched_tokens=2.5", "2.5"),
        ("INFO GPU KV cache size: 1e9 tokens", "1e9"),
        (
            "INFO GPU KV cache size: 2,000,000,000,000,000,000 tokens",
            "2,000,000,000,000,000,000",
        ),
        (
            "INFO Maximum concurrency for 4096 tokens per request: 1e400x",
            "1e400",
        ),
        (
            "INFO Free memory on device (30.0/24.0 GiB) on startup.",
            "30",
        ),
        ("INFO Free memory on device (0.0/0.0 GiB) on startup.", "0"),
        ("INFO Available KV cache memory: 9e30 GiB", "9e30"),
        ("INFO torch peak memory increase: -1.2GiB", "-"),
    ];
    for (line, value) in cases {
        let log = format!(
            "INFO vLLM API server version 0.30.0\nINFO Model loading took 1.0 GiB\n{line}\n"
        );
        let e = match parse(&log) {
            Err(e) => e,
            Ok(f) => panic!("{line:?} was accepted: {f:?}"),
        };
        match &e {
            Error::InvalidInput { field, message } => {
                assert_eq!(field, "line 3", "{line}: {e}");
                assert!(message.contains(value), "{line}: {message}");
                assert!(!message.contains("--"), "names a flag: {message}");
            }
            other => panic!("{line}: {other:?}"),
        }
    }
}

/// A value too long to be a dtype, a quantization or a path is refused naming the line, not
/// read as absent (a KV cache dtype the engine printed, planned as `auto`); and a figure as
/// long as the log is quoted by its ends, not whole (an error line of 250 MiB).
#[test]
fn overlong_values_are_refused_and_quoted_by_their_ends() {
    let long = "k".repeat(5000);
    for line in [
        format!("INFO Initializing a V1 LLM engine (v0.30.0) with config: model='m', kv_cache_dtype={long}, enforce_eager=False"),
        format!("INFO non-default args: {{'model': 'm', 'quantization': '{long}'}}"),
        format!("INFO non-default args: {{'model': '{long}'}}"),
    ] {
        let log = format!("INFO vLLM API server version 0.30.0\nINFO Model loading took 1.0 GiB\n{line}\n");
        match parse(&log) {
            Err(Error::InvalidInput { field, message }) => {
                assert_eq!(field, "line 3", "{message}");
                assert!(message.contains("5000 bytes long"), "{message}");
            }
            other => panic!("{line:.80}: {other:?}"),
        }
    }
    let log = format!(
        "INFO vLLM API server version 0.30.0\nINFO Available KV cache memory: {} GiB\n",
        "9".repeat(1 << 20)
    );
    let e = parse(&log).unwrap_err().to_string();
    assert!(
        e.len() < 1024 && e.starts_with("line 2: "),
        "{} bytes",
        e.len()
    );
}

/// A line per worker, per model or per pasted command, each a new one (a log of a million
/// workers' lines), is read in time linear in the log: each line once, never a search of
/// every earlier worker or model. Names of one length with a long common start make such a
/// search cost its full quadratic price (it took minutes here; hours at the size cap).
#[test]
fn a_new_worker_or_model_on_every_line_is_read_in_linear_time() {
    const LINES: usize = 30_000;
    let head = "INFO vLLM API server version 0.30.0\nINFO Model loading took 1.0 GiB\n";
    let name = |i: usize| format!("org/{}{i:08}", "x".repeat(200));
    let worker = |i: usize| format!("Worker_{}{i:08}", "w".repeat(90));
    type LineOf = Box<dyn Fn(usize) -> String>;
    let kinds: [(&str, LineOf); 3] = [
        (
            "workers",
            Box::new(move |i| {
                format!(
                    "({} pid={i}) INFO [gpu_worker.py:1] Available KV cache memory: {}.5 GiB\n",
                    worker(i),
                    1 + i % 7
                )
            }),
        ),
        (
            "models",
            Box::new(move |i| format!("INFO non-default args: {{'model': '{}'}}\n", name(i))),
        ),
        (
            "commands",
            Box::new(move |i| format!("$ vllm serve {} --tp 2\n", name(i))),
        ),
    ];
    for (what, line) in kinds {
        let log: String = std::iter::once(head.to_string())
            .chain((0..LINES).map(line))
            .collect();
        let start = std::time::Instant::now();
        let f = parse(&log).unwrap();
        let took = start.elapsed();
        assert!(took.as_secs() < 10, "{what}: {took:?}");
        if what == "workers" {
            assert_eq!(f.kv_available, Some(gib(1.5)), "{what}");
        } else {
            assert_eq!(f.models.len(), LINES, "{what}");
        }
    }
}

/// A line noted on each of thousands of lines (a graph capture that freed memory, once per
/// restart) gives 8 such notes and one that counts the rest, not a note per line.
#[test]
fn a_note_repeated_on_every_line_is_given_8_times_and_counted() {
    let mut log = String::from(
        "INFO vLLM API server version 0.30.0\nINFO Model loading took 1.0 GiB\n\
         INFO Available KV cache memory: 20.0 GiB\n",
    );
    for i in 0..5000 {
        log.push_str(&format!(
            "INFO Graph capturing finished in 5 secs, took -0.{} GiB\n",
            10 + i % 90
        ));
    }
    let f = parse(&log).unwrap();
    let alike = f
        .notes
        .iter()
        .filter(|n| n.contains("capture freed memory"))
        .count();
    assert_eq!(alike, 8, "{:?}", f.notes);
    assert!(
        f.notes
            .iter()
            .any(|n| n.starts_with("4992 more note(s) like the one above")),
        "{:?}",
        f.notes
    );
    assert!(f.notes.len() < 20, "{}", f.notes.len());
}

#[test]
fn negative_windows_engines_print_are_left_out_and_said() {
    let log = "INFO Model loading took 1.5 GiB\n\
               INFO Available KV cache memory: -0.41 GiB\n\
               INFO CUDA graph pool memory: -0.19 GiB (actual), 2.43 GiB (estimated), difference: 2.62 GiB";
    let f = parse(log).unwrap();
    assert_eq!(f.kv_available, None);
    assert_eq!(f.graph_actual, None);
    assert_eq!(f.graph_estimate, Some(gib(2.43)));
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("line 2") && n.contains("-419")),
        "{:?}",
        f.notes
    );
    assert!(
        f.notes.iter().any(|n| n.starts_with("line 3")),
        "{:?}",
        f.notes
    );
}

#[test]
fn a_file_error_names_the_file_and_the_line() {
    let dir = std::env::temp_dir().join(format!("memplan-fromlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("vllm.log");
    std::fs::write(
        &p,
        "INFO Model loading took 1.0 GiB\nINFO Defaulting max_num_seqs to 18446744073709551615\n",
    )
    .unwrap();
    let e = read(&p).unwrap_err();
    assert!(matches!(e, Error::InvalidFile { .. }), "{e:?}");
    let s = e.to_string();
    assert!(
        s.contains("vllm.log: line 2: max_num_seqs 18446744073709551615"),
        "{s}"
    );
    std::fs::write(&p, "nothing here").unwrap();
    let s = read(&p).unwrap_err().to_string();
    assert!(
        s.contains("vllm.log: not a recognised engine start-up log"),
        "{s}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Mutated copies of a real log: never a panic; every outcome is figures or a one-line error.
#[test]
fn mutated_logs_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let bytes = CURRENT.as_bytes();
    let junk = [
        "-",
        "e",
        "9",
        ",",
        ".",
        "1e999",
        "18446744073709551616",
        "(",
        "/",
        "\n",
        "é",
    ];
    for _ in 0..2000 {
        let mut s = String::from_utf8_lossy(bytes).into_owned();
        for _ in 0..1 + next() % 4 {
            let mut at = (next() as usize) % s.len();
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            s.insert_str(at, junk[(next() as usize) % junk.len()]);
        }
        match parse(&s) {
            Ok(_) => {}
            Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
        }
    }
}

#[test]
fn the_utilisation_pair_gives_the_device_total() {
    // gpustack/runner#251 (vLLM 0.27.1): 0.36 GiB / (0.8200 - 0.8048) = 23.7 GiB.
    let log = "INFO [gpu_model_runner.py:6806] Estimated CUDA graph memory: 0.36 GiB total\n\
               INFO [gpu_worker.py:578] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.8200 is equivalent to --gpu-memory-utilization=0.8048 without CUDA graph memory profiling.\n\
               INFO [gpu_worker.py:563] Available KV cache memory: 6.87 GiB";
    let f = parse(log).unwrap();
    assert_eq!(f.utilization, Some(0.82));
    assert_eq!(f.utilization_without_graphs, Some(0.8048));
    let t = f.derived_total().unwrap() as f64 / GIB as f64;
    assert!((t - 23.68).abs() < 0.01, "{t}");
    // Too small a difference to divide by: no total.
    let f = parse(&log.replace("0.8048", "0.8200")).unwrap();
    assert_eq!(f.derived_total(), None);
}

#[test]
fn figures_larger_than_the_device_are_refused_and_auto_length_is_not_a_figure() {
    let log = "INFO Model loading took 30.0 GiB memory\n\
               INFO Free memory on device (22.45/23.99 GiB) on startup.\n";
    let e = parse(log).unwrap_err().to_string();
    assert!(
        e.starts_with("line 1: weights 30") && e.contains("device total"),
        "{e}"
    );
    let log = "INFO Available KV cache memory: 25.00 GiB\n\
               INFO Free memory on device (22.45/23.99 GiB) on startup.\n";
    let e = parse(log).unwrap_err().to_string();
    assert!(e.starts_with("line 1: kv available"), "{e}");
    // `--max-model-len -1` (fit the longest) is vLLM's auto, not a bad length.
    let f = parse("INFO non-default args: {'model': 'm', 'max_model_len': -1}\nINFO Model loading took 1.0 GiB\n").unwrap();
    assert_eq!(f.max_model_len, None);
}

#[test]
fn the_extensible_caches_final_size_is_read() {
    // vLLM 0.34 (`v1/worker/extensible_kv_cache.py`, `v1/core/kv_cache_utils.py`
    // `update_kv_cache_capacity`): the capacity line is printed after the post-warmup sizing.
    let log = "INFO vLLM API server version 0.34.0\n\
               INFO [gpu_worker.py:795] Available KV cache memory: 20.00 GiB\n\
               INFO [extensible_kv_cache.py:537] Extended KV cache to 9720 blocks (18.98 GiB).\n\
               INFO [kv_cache_utils.py:1169] GPU KV cache size: 622,080 tokens, Maximum concurrency for 8,192 tokens per request: 75.94x\n";
    let f = parse(log).unwrap();
    assert_eq!(f.kv_final, Some(gib(18.98)));
    assert_eq!(f.kv_blocks, Some(9720));
    assert_eq!(f.kv_tokens, Some(622_080));
    assert_eq!(f.max_model_len, Some(8192));
    assert_eq!(f.max_concurrency, Some(75.94));
    let f = parse("INFO Memory after warmup: 3.10 GiB free, 60.25 GiB committed to the KV cache, 1.2 GiB kept\nINFO Model loading took 1 GiB\n").unwrap();
    assert_eq!(f.kv_final, Some(gib(60.25)));
}

#[test]
fn a_report_wrapped_onto_lines_of_its_own_is_read() {
    // vLLM's one post-start line as a person pasted it, one clause per line.
    let log = "Free memory on device (114.54/121.69 GiB) on startup.
Desired GPU memory utilization is (0.6, 73.01 GiB).
Actual usage is 3.35 GiB for consumed memory (weights + non-torch)
Current kv cache memory in use is 69.4 GiB
GPU KV cache size: 649,728 tokens";
    let f = parse(log).unwrap();
    assert_eq!(f.total, Some(gib(121.69)));
    assert_eq!(f.utilization, Some(0.6));
    assert_eq!(f.consumed, Some(gib(3.35)));
    assert_eq!(f.kv_available, Some(gib(69.4)));
    assert_eq!(f.kv_tokens, Some(649_728));
    assert_eq!(f.line("utilization"), Some(2));
}

/// With several ranks the KV cache follows the smallest rank's figure (vLLM sizes every worker
/// by the fewest blocks); one rank alone, or the engine core's lines, change nothing.
#[test]
fn several_ranks_take_the_smallest_figure() {
    let two = "(Worker_TP0 pid=1) INFO [gpu_worker.py:586] Available KV cache memory: 19.09 GiB\n\
               (Worker_TP0 pid=1) INFO [gpu_worker.py:817] Free memory on device (23.09/23.47 GiB) on startup. Current kv cache memory in use is 19.09 GiB.\n\
               (Worker_TP1 pid=2) INFO [gpu_worker.py:817] Free memory on device (23.09/23.46 GiB) on startup. Current kv cache memory in use is 19.08 GiB.\n";
    let f = parse(two).unwrap();
    assert_eq!(f.kv_available, Some(gib(19.08)));
    // Cited by its own line, not the first worker's.
    assert_eq!(f.line("kv_available"), Some(3));
    assert!(
        f.notes.iter().any(|n| n.contains("Worker_TP1")),
        "{:?}",
        f.notes
    );
    let one = two.lines().take(2).collect::<Vec<_>>().join("\n");
    let f = parse(&one).unwrap();
    assert_eq!(f.kv_available, Some(gib(19.09)));
}

/// Ray's workers print under `(RayWorkerWrapper pid=.., ip=..)` and V0's driver worker
/// unprefixed; vLLM sizes every worker by the fewest blocks, so the smallest figure of every
/// process is the one that counts, and what Ray's de-duplication folded is named. The excerpt
/// is a real vLLM 0.8.3 V0 start-up of DeepSeek-V2.5 at TP 8 x PP 2 over Ray on two 8x
/// A100-SXM4-40GB nodes (2025-04-20; public repository file, code index id 17822999525, the
/// index does not name the repository), its memory lines as printed, NCCL lines left out.
#[test]
fn ray_workers_and_the_driver_take_the_smallest_figure() {
    let log = "INFO 04-20 16:46:54 [api_server.py:1034] vLLM API server version 0.8.3\n\
INFO 04-20 17:00:47 [model_runner.py:1146] Model loading took 27.6330 GiB and 763.166885 seconds\n\
(RayWorkerWrapper pid=629, ip=10.244.1.107) INFO 04-20 17:00:08 [model_runner.py:1146] Model loading took 28.4772 GiB and 723.639309 seconds [repeated 12x across cluster]\n\
INFO 04-20 17:00:56 [worker.py:267] Memory profiling takes 8.55 seconds\n\
INFO 04-20 17:00:56 [worker.py:267] the current vLLM instance can use total_gpu_memory (39.49GiB) x gpu_memory_utilization (0.90) = 35.55GiB\n\
INFO 04-20 17:00:56 [worker.py:267] model weights take 27.63GiB; non_torch_memory takes 0.93GiB; PyTorch activation peak memory takes 1.27GiB; the rest of the memory reserved for KV Cache is 5.71GiB.\n\
(RayWorkerWrapper pid=627, ip=10.244.1.107) INFO 04-20 17:00:56 [worker.py:267] Memory profiling takes 8.59 seconds\n\
(RayWorkerWrapper pid=627, ip=10.244.1.107) INFO 04-20 17:00:56 [worker.py:267] the current vLLM instance can use total_gpu_memory (39.49GiB) x gpu_memory_utilization (0.90) = 35.55GiB\n\
(RayWorkerWrapper pid=627, ip=10.244.1.107) INFO 04-20 17:00:56 [worker.py:267] model weights take 28.48GiB; non_torch_memory takes 2.15GiB; PyTorch activation peak memory takes 1.35GiB; the rest of the memory reserved for KV Cache is 3.58GiB.\n\
INFO 04-20 17:00:56 [executor_base.py:112] # cuda blocks: 5302, # CPU blocks: 7767\n\
INFO 04-20 17:00:56 [executor_base.py:117] Maximum concurrency for 8192 tokens per request: 10.36x\n\
(RayWorkerWrapper pid=661) INFO 04-20 17:00:56 [worker.py:267] Memory profiling takes 8.62 seconds [repeated 14x across cluster]\n\
(RayWorkerWrapper pid=661) INFO 04-20 17:00:56 [worker.py:267] the current vLLM instance can use total_gpu_memory (39.49GiB) x gpu_memory_utilization (0.90) = 35.55GiB [repeated 14x across cluster]\n\
(RayWorkerWrapper pid=661) INFO 04-20 17:00:56 [worker.py:267] model weights take 27.63GiB; non_torch_memory takes 1.07GiB; PyTorch activation peak memory takes 1.27GiB; the rest of the memory reserved for KV Cache is 5.57GiB. [repeated 14x across cluster]\n";
    let f = parse(log).unwrap();
    assert_eq!(f.version.as_deref(), Some("0.8.3"));
    assert_eq!(f.total, Some(gib(39.49)));
    // The driver's figure is printed first; the Ray worker on the second node has less.
    assert_eq!(f.kv_available, Some(gib(3.58)));
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("RayWorkerWrapper pid=627, ip=10.244.1.107")
                && n.contains("3 workers")),
        "{:?}",
        f.notes
    );
    // The 14 folded lines' figures are not in the log: said so, not guessed.
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("folded 14 workers") && n.contains("RAY_DEDUP_LOGS=0")),
        "{:?}",
        f.notes
    );
    // The driver alone: its own figure, nothing folded.
    let driver: String = log
        .lines()
        .filter(|l| !l.starts_with('('))
        .collect::<Vec<_>>()
        .join("\n");
    let f = parse(&driver).unwrap();
    assert_eq!(f.kv_available, Some(gib(5.71)));
    assert!(
        !f.notes.iter().any(|n| n.contains("folded")),
        "{:?}",
        f.notes
    );
}

/// Every process prefix vLLM and Ray print names its process: Ray's `(pid=..)` before the
/// actor is named, a V1 Ray worker, V0's multiprocess worker, older V1 workers with a rank, a
/// terminal colour code and a container prefix before it; a parenthesis without `pid=` is not
/// a prefix.
#[test]
fn process_prefixes_of_every_executor() {
    for (line, process) in [
        (
            "(pid=776, ip=7.242.96.68) INFO 07-31 19:35:15 [__init__.py:39] x",
            Some("pid=776, ip=7.242.96.68"),
        ),
        (
            "(RayWorkerWrapper pid=13210) INFO 07-31 19:35:31 [gpu_worker.py:1] x",
            Some("RayWorkerWrapper pid=13210"),
        ),
        (
            "(VllmWorkerProcess pid=3357) INFO 09-13 16:32:25 [worker.py:1] x",
            Some("VllmWorkerProcess pid=3357"),
        ),
        (
            "(VllmWorker rank=1 pid=12) INFO [gpu_worker.py:1] x",
            Some("VllmWorker rank=1 pid=12"),
        ),
        (
            "\u{1b}[36m(RayWorkerWrapper pid=123, ip=10.0.0.2)\u{1b}[0m INFO x",
            Some("RayWorkerWrapper pid=123, ip=10.0.0.2"),
        ),
        (
            "vllm-1  | (EngineCore_DP0 pid=88) INFO x",
            Some("EngineCore_DP0 pid=88"),
        ),
        (
            "INFO 04-20 17:00:56 [worker.py:267] model weights take 27.63GiB (total)",
            None,
        ),
        ("INFO x", None),
    ] {
        assert_eq!(super::process_of(line), process, "{line}");
    }
    assert_eq!(
        super::ray_folded("x [repeated 14x across cluster]"),
        Some(14)
    );
    assert_eq!(super::ray_folded("x [repeated"), None);
}

/// Two V1 Ray workers that print their own available KV memory: the smaller one counts.
/// Constructed in the real format (`(RayWorkerWrapper pid=.., ip=..)` prefixes of a V1 Ray
/// start-up; the figures are made up).
#[test]
fn v1_ray_workers_take_the_smallest_figure() {
    let log = "(RayWorkerWrapper pid=13210) INFO 07-31 19:40:01 [gpu_worker.py:276] Available KV cache memory: 21.40 GiB\n\
(RayWorkerWrapper pid=776, ip=7.242.96.68) INFO 07-31 19:40:01 [gpu_worker.py:276] Available KV cache memory: 20.95 GiB\n\
INFO 07-31 19:40:02 [kv_cache_utils.py:716] GPU KV cache size: 1,234,560 tokens\n";
    let f = parse(log).unwrap();
    assert_eq!(f.kv_available, Some(gib(20.95)));
}

/// The compile cache as the log states it before the KV cache is sized (vLLM 0.27.1
/// `compilation/backends.py` `CompilerManager.compile`'s two messages); a graph of a single
/// size compiled after the KV cache was sized does not make a warm start-up cold.
#[test]
fn compile_cache_state_from_the_log() {
    let warm = "(EngineCore pid=1) INFO [backends.py:292] Directly load the compiled graph(s) for compile range (1, 2048) from the cache, took 1.120 s\n\
(EngineCore pid=1) INFO [gpu_worker.py:563] Available KV cache memory: 18.65 GiB\n\
(EngineCore pid=1) INFO [backends.py:393] Compiling a graph for compile range (8, 8) takes 3.10 s\n";
    let f = parse(warm).unwrap();
    assert_eq!(f.compile_cache, Some(CompileCache::Warm));
    assert_eq!(f.line("compile_cache"), Some(1));
    assert!(!f.notes.iter().any(|n| n.contains("cold")), "{:?}", f.notes);
    let cold = "(EngineCore pid=1) INFO [backends.py:393] Compiling a graph for compile range (1, 2048) takes 21.57 s\n\
(EngineCore pid=1) INFO [gpu_worker.py:563] Available KV cache memory: 18.65 GiB\n";
    let f = parse(cold).unwrap();
    assert_eq!(f.compile_cache, Some(CompileCache::Cold));
    assert!(
        f.notes
            .iter()
            .any(|n| n.starts_with("line 1: a cold torch.compile cache")),
        "{:?}",
        f.notes
    );
    // AOT compilation loaded from disk is warm; no compile line at all is unknown.
    let aot = "INFO [decorators.py:312] Directly load AOT compilation from path /root/.cache/vllm/x/model\n\
INFO [gpu_worker.py:563] Available KV cache memory: 18.65 GiB\n";
    assert_eq!(parse(aot).unwrap().compile_cache, Some(CompileCache::Warm));
    let none = "INFO [gpu_worker.py:563] Available KV cache memory: 18.65 GiB\n";
    assert_eq!(parse(none).unwrap().compile_cache, None);
}

/// A log of two start-ups (the first refused, the user restarted with other settings): the
/// second start-up's processes are not workers of the first, whose figure stays.
#[test]
fn a_second_start_up_adds_no_worker_to_the_first() {
    let log = "(APIServer pid=1) INFO [api_server.py:1] vLLM API server version 0.27.1\n\
(EngineCore pid=2) INFO [gpu_worker.py:563] Available KV cache memory: 18.65 GiB\n\
(APIServer pid=7) INFO [api_server.py:1] vLLM API server version 0.27.1\n\
(EngineCore pid=8) INFO [gpu_worker.py:563] Available KV cache memory: 10.20 GiB\n";
    let f = parse(log).unwrap();
    assert_eq!(f.kv_available, Some(gib(18.65)));
    assert!(
        f.notes
            .iter()
            .any(|n| n.starts_with("line 3: another start-up")),
        "{:?}",
        f.notes
    );
}

#[test]
fn a_multibyte_character_across_the_prefix_window_is_no_panic() {
    // The worker prefix is looked for in a line's first 160 bytes: a character that straddles
    // byte 160 (found by the fuzz driver in a mutated log) must not split.
    for pad in 150..165 {
        let line = format!(
            "{}€ (Worker_TP0 pid=1) INFO Available KV cache memory: 1.00 GiB",
            "x".repeat(pad)
        );
        let _ = process_of(&line);
        assert_eq!(
            process_of(&format!("(Worker_TP1 pid=2) {line}")),
            Some("Worker_TP1 pid=2")
        );
    }
}

#[test]
fn a_banner_whose_spaces_a_page_collapsed_names_the_release() {
    // A blog's copy of a vLLM 0.19.0 start-up (myoceane.fr, "vLLM 部署地端模型系統訊息記錄
    // A100", gpt-oss-20b): the page collapsed the banner's run of spaces to one.
    let log = "(APIServer pid=6539) INFO 04-18 20:22:57 [utils.py:299] ▄▄ ▄█ █ █ █ ▀▄▀ █ version 0.19.0\n\
               (APIServer pid=6539) INFO 04-18 20:22:57 [utils.py:233] non-default args: {'model_tag': 'openai/gpt-oss-20b', 'port': 10000, 'model': 'openai/gpt-oss-20b', 'trust_remote_code': True, 'max_model_len': 131072, 'gpu_memory_utilization': 0.65}\n\
               Model loading took 13.72 GiB memory and 62.336108 seconds\n\
               Available KV cache memory: 36.56 GiB";
    let f = parse(log).unwrap();
    assert_eq!(f.version.as_deref(), Some("0.19.0"));
    assert_eq!(f.utilization, Some(0.65));
    assert_eq!(f.kv_available, Some(gib(36.56)));
}

#[test]
fn the_report_before_the_consumed_accounting_gives_its_parts() {
    // vLLM 0.26.0 (a grading harness's copy of a container log, code index id 60449471537):
    // "W GiB for weight, A GiB for peak activation, N GiB for non-torch memory, and G GiB for
    // CUDAGraph memory"; 15.2 - 0.88 - 0.26 - 0.16 - 0.58 (the estimate) = 13.32.
    let log = "(EngineCore pid=79) INFO 07-30 07:11:00 [gpu_worker.py:560] Available KV cache memory: 13.33 GiB\n\
               (EngineCore pid=79) INFO 07-30 07:11:20 [gpu_worker.py:857] Free memory on device (15.89/16.0 GiB) on startup. Desired GPU memory utilization is (0.95, 15.2 GiB). Actual usage is 0.88 GiB for weight, 0.26 GiB for peak activation, 0.16 GiB for non-torch memory, and 0.24 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=14514713805` (13.52 GiB) to fit into requested memory, or `--kv-cache-memory=15258363904` (14.21 GiB) to fully utilize gpu memory. Current kv cache memory in use is 13.33 GiB.";
    let f = parse(log).unwrap();
    assert_eq!(f.weights, Some(gib(0.88)));
    assert_eq!(f.activation, Some(gib(0.26)));
    assert_eq!(f.non_torch, Some(gib(0.16)));
    assert_eq!(f.graph_actual, Some(gib(0.24)));
    assert_eq!(f.total, Some(gib(16.0)));
    assert_eq!(f.line("activation"), Some(2));

    // The same report wrapped by its author (study notes serving Qwen3-8B-FP8, code index id
    // 34681159919), the KV memory in bytes.
    let log = "(EngineCore_DP0 pid=2552931) INFO 09-28 21:12:51 [v1/worker/gpu_worker.py:391] Free memory on device (23.08/23.53 GiB) on startup. Desired GPU memory utilization is (0.8, 18.82 GiB). \n\
               \n\
               Actual usage is \n\
               8.8 GiB for weight, \n\
               1.4 GiB for peak activation,\n\
               0.02 GiB for non-torch memory, and \n\
               0.68 GiB for CUDAGraph memory. \n\
               \n\
               Current kv cache memory in use is 9232221491 bytes.";
    let f = parse(log).unwrap();
    assert_eq!(
        (f.weights, f.activation, f.non_torch, f.graph_actual),
        (
            Some(gib(8.8)),
            Some(gib(1.4)),
            Some(gib(0.02)),
            Some(gib(0.68))
        )
    );
    assert_eq!(f.kv_available, Some(9_232_221_491));

    // A non-torch growth below zero (a boot with the cumem sleep-mode allocator, code index id
    // 62145020194) is the engine's figure but no memory anything holds: said, not used.
    let log = "Available KV cache memory: 11.06 GiB\n\
               Free memory on device (21.83/22.06 GiB) on startup.\n  Desired GPU memory utilization is (0.8, 17.65 GiB).\n  Actual usage is 8.28 GiB for weight, 1.02 GiB for peak activation,\n  -3.58 GiB for non-torch memory, and 0.68 GiB for CUDAGraph memory.";
    let f = parse(log).unwrap();
    assert_eq!(f.weights, Some(gib(8.28)));
    assert_eq!(f.activation, Some(gib(1.02)));
    assert_eq!(f.non_torch, None);
    assert!(f.notes.iter().any(|n| n.contains("-3.58")), "{:?}", f.notes);

    // vllm-ascend's NPU worker (vllm-project/vllm-ascend#8289) prints "weights" and "NPU
    // graph memory", and is named as a platform memplan's rules do not describe.
    let log = "(EngineCore pid=2884597) INFO 04-15 06:30:01 [worker.py:575] Free memory on device (60.86/61.27 GiB) on startup. Desired GPU memory utilization is (0.9, 55.14 GiB). Actual usage: 1.14 GiB for weights, 0.22 GiB for peak activation, 0.13 GiB for non-torch memory, 0.04 GiB for NPU graph memory. Replace gpu_memory_utilization with `--kv-cache-memory=57403864576` (53.46 GiB) to fit in";
    let f = parse(log).unwrap();
    assert_eq!(
        (f.weights, f.activation, f.non_torch, f.graph_actual),
        (
            Some(gib(1.14)),
            Some(gib(0.22)),
            Some(gib(0.13)),
            Some(gib(0.04))
        )
    );
    assert!(
        f.notes.iter().any(|n| n.contains("Ascend NPU")),
        "{:?}",
        f.notes
    );

    // The consumed report's "peak activation" (0.27+) is not the torch peak: not read.
    let log = "Actual usage is 19.47 GiB for consumed memory (weights + non-torch), 0.6 GiB for peak activation, and 0.1 GiB for CUDAGraph memory.";
    let f = parse(&format!("Available KV cache memory: 1.95 GiB\n{log}")).unwrap();
    assert_eq!((f.activation, f.weights), (None, None));
    assert_eq!(f.consumed, Some(gib(19.47)));
}

#[test]
fn sglangs_mla_pool_prints_one_size() {
    // sgl-project/sglang#13466 (Kimi-K2-Instruct-0905, TP 8): `MLATokenToKVPool`.
    let f =
        parse("[2025-11-21 04:11:02 TP5] KV Cache is allocated. #tokens: 8050, KV size: 0.53 GB")
            .unwrap();
    assert_eq!(f.engine, Some(EngineKind::Sglang));
    assert_eq!(f.kv_tokens, Some(8050));
    assert_eq!(f.kv_available, Some(gib(0.53)));
}

#[test]
fn refusals_give_the_length_and_what_fit() {
    // V0 (QwenLM/Qwen3#295, Qwen1.5-7B-Chat): the KV tokens of every block.
    let log = " raise ValueError(\nValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.";
    let f = parse(log).unwrap();
    assert_eq!(f.engine, Some(EngineKind::Vllm));
    assert_eq!((f.kv_tokens, f.max_model_len), (Some(7344), Some(32_768)));
    assert_eq!((f.refused, f.legacy_line), (Some(2), Some(2)));

    // V1 (vllm-project/vllm#44376, DeepSeek-V4-Flash on two GH200), and a terminal's wrap.
    let log = "(EngineCore pid=2739502) ERROR 06-03 14:24:40 [core.py:1165] ValueError: To serve at least one request with the model's max seq len (30000), (6.66 GiB KV cache is needed, which is larger than the available KV cache memory (5.44 GiB). Based on the available memory, the estimated maximum model length is 13528. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.";
    let f = parse(log).unwrap();
    assert_eq!(
        (f.kv_available, f.max_model_len),
        (Some(gib(5.44)), Some(30_000))
    );
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("refused") && n.contains("13528")),
        "{:?}",
        f.notes
    );
    assert_eq!(f.legacy_line, None);
    let wrapped = "(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB KV cach\ne is needed, which is larger than the available KV cache memory (4.25 GiB). Based on the avai";
    let f = parse(wrapped).unwrap();
    assert_eq!(
        (f.kv_available, f.max_model_len),
        (Some(gib(4.25)), Some(100_000))
    );
}

#[test]
fn v0_executors_name_the_device_and_zero_blocks_is_no_room() {
    // vllm-project/vllm#13882 (a quantized Qwen2.5-7B on an 8 GB RTX 4060): V0's executor
    // prints `current_platform.device_name`, and a start-up with no room prints 0 blocks.
    let log = "INFO 02-26 09:54:02 model_runner.py:1115] Loading model weights took 5.2032 GB\n\
               INFO 02-26 09:54:05 worker.py:267] the current vLLM instance can use total_gpu_memory (8.00GiB) x gpu_memory_utilization (0.70) = 5.60GiB\n\
               INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.\n\
               INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 0, # CPU blocks: 4681";
    let f = parse(log).unwrap();
    assert_eq!(f.kv_blocks, None);
    assert!(
        f.notes.iter().any(|n| n.contains("0 KV cache blocks")),
        "{:?}",
        f.notes
    );
    assert_eq!(f.legacy_line, Some(1));
    let f =
        parse("INFO 01-01 00:00:00 executor_base.py:111] # cuda blocks: 1952, # CPU blocks: 2048")
            .unwrap();
    assert_eq!(f.kv_blocks, Some(1952));
}

#[test]
fn the_models_a_log_names_are_collected() {
    // llm-d-incubation/llm-d-planner#205 (vLLM 0.19 logs committed in the PR): the
    // non-default args name the model; a Turing fork's campaign notes (validation corpus,
    // code index id 67109588529) name it in the args and the engine config alike.
    let log = "[entrypoints/utils.py:233] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 8192, 'gpu_memory_utilization': 0.95, 'enable_prefix_caching': False}\n\
               [v1/worker/gpu_worker.py:436] Available KV cache memory: 58.11 GiB\n";
    let f = parse(log).unwrap();
    assert_eq!(f.model.as_deref(), Some("meta-llama/Llama-3.1-8B-Instruct"));
    assert_eq!(f.models, ["meta-llama/Llama-3.1-8B-Instruct"]);
    assert_eq!(f.line("model"), Some(1));
    let path = "/home/dconnolly/.cache/huggingface/hub/models--Qwen--Qwen2.5-1.5B-Instruct/snapshots/989aa7980e4cf806f80c7fef2b1adb7bc71aa306";
    let log = format!(
        "INFO 09-07 00:14:16 [api_utils.py:286] non-default args: {{'dtype': 'float16', 'max_model_len': 4096, 'model': '{path}'}}\n\
         (EngineCore pid=120706) INFO 09-07 00:14:19 [core.py:123] Initializing a V1 LLM engine (v0.28.1rc1.dev50+gcac8a75a7.d20260828) with config: model='{path}', speculative_config=None\n\
         (EngineCore pid=120706) INFO 09-07 00:14:25 [gpu_worker.py:586] Available KV cache memory: 17.36 GiB\n"
    );
    assert_eq!(parse(&log).unwrap().models, [path]);
    // Two start-ups of different models in one paste name two; a request line naming the
    // served model is not a start-up line.
    let two = format!(
        "{log}INFO non-default args: {{'model': 'Qwen/Qwen3-8B'}}\nINFO Received request chatcmpl-1: model='other'\n"
    );
    let f = parse(&two).unwrap();
    assert_eq!(f.models, [path, "Qwen/Qwen3-8B"]);
    assert_eq!(f.model.as_deref(), Some(path));
    // No model line: none.
    assert!(parse("Available KV cache memory: 10.55 GiB\n")
        .unwrap()
        .models
        .is_empty());
}

#[test]
fn a_log_without_a_version_line_is_dated_by_its_own_lines() {
    // vLLM 0.26.0's report before the consumed accounting (validation corpus, code index id
    // 69421856836), its version line left out: 0.26 at the newest.
    let log = "(EngineCore pid=6113) INFO 08-02 07:03:47 [gpu_worker.py:560] Available KV cache memory: 11.94 GiB\n\
               (EngineCore pid=6113) INFO 08-02 07:03:49 [gpu_worker.py:857] Free memory on device (15.32/15.55 GiB) on startup. Desired GPU memory utilization is (0.9, 13.99 GiB). Actual usage is 0.93 GiB for weight, 1.06 GiB for peak activation, 0.07 GiB for non-torch memory, and 0.4 GiB for CUDAGraph memory.\n";
    let b = parse(log).unwrap().release_bounds();
    assert_eq!(b.newest.map(|b| (b.release, b.line)), Some(("0.26", 2)));
    assert_eq!(b.oldest, None);
    // The consumed accounting (noonghunna/club-3090#1087): 0.27 at the oldest.
    let log = "(Worker_TP0 pid=223) INFO 08-22 04:42:13 [gpu_worker.py:789] Free memory on device (30.27/31.4 GiB) on startup. Desired GPU memory utilization is (0.92, 28.88 GiB). Actual usage is 15.03 GiB for consumed memory (weights + non-torch), 1.59 GiB for peak activation, and 0.09 GiB for CUDAGraph memory.\n";
    let b = parse(log).unwrap().release_bounds();
    assert_eq!(b.oldest.map(|b| (b.release, b.line)), Some(("0.27", 1)));
    assert_eq!(b.newest, None);
    // 0.34's extensible KV cache: 0.34 at the oldest, and its blocks give the block size.
    let log = "INFO [gpu_worker.py:795] Available KV cache memory: 20.00 GiB\n\
               INFO [extensible_kv_cache.py:537] Extended KV cache to 9720 blocks (18.98 GiB).\n\
               INFO [kv_cache_utils.py:1169] GPU KV cache size: 622,080 tokens, Maximum concurrency for 8,192 tokens per request: 75.94x\n";
    let f = parse(log).unwrap();
    assert_eq!(f.release_bounds().oldest.map(|b| b.release), Some("0.34"));
    assert_eq!(f.block_size, Some(64));
    // llm-d-incubation/llm-d-planner#205 (vLLM 0.19 at DEBUG level): the profile result
    // before the consumed accounting, and "num_gpu_blocks is" beside the KV tokens.
    let log = "[v1/worker/gpu_worker.py:435] Memory profiling takes 17.96 seconds. Total non KV cache memory: 17.12GiB; torch peak memory increase: 1.89GiB; non-torch forward increase memory: 0.25GiB; weights memory: 14.99GiB.\n\
               [v1/worker/gpu_worker.py:436] Available KV cache memory: 58.11 GiB\n\
               [v1/core/kv_cache_utils.py:1319] GPU KV cache size: 476,016 tokens\n\
               [v1/metrics/loggers.py:273] Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 29751\n";
    let f = parse(log).unwrap();
    assert_eq!(
        f.release_bounds().newest.map(|b| (b.release, b.line)),
        Some(("0.26", 1))
    );
    assert_eq!(f.block_size, Some(16));
    assert_eq!(f.line("block_size"), Some(4));
    assert!(
        f.notes.iter().any(|n| n.starts_with("block size 16:")),
        "{:?}",
        f.notes
    );
    // Tokens that are no whole multiple of the blocks give no block size.
    let f = parse("GPU KV cache size: 476,017 tokens\nnum_gpu_blocks is: 29751\n").unwrap();
    assert_eq!(f.block_size, None);
    // A line of 0.27+ beside one of 0.26 and earlier (a fork's backport): the bounds
    // contradict each other and date nothing.
    let log = "Memory profiling takes 1 seconds. non-torch forward increase memory: 0.25GiB\n\
               Available KV cache memory: 5 GiB\n\
               Actual usage is 15.03 GiB for consumed memory (weights + non-torch)\n";
    assert!(parse(log).unwrap().release_bounds().contradict());
    // A log whose lines every V1 release prints: no bound.
    let b = parse("Available KV cache memory: 10.55 GiB\nGPU KV cache size: 230,528 tokens\n")
        .unwrap()
        .release_bounds();
    assert_eq!(b, ReleaseBounds::default());
}

#[test]
fn a_cpu_backend_log_is_refused_naming_why() {
    // A public vLLM 0.9.2 CPU-backend log (Qwen3-0.6B, a demo script's output; a repository
    // file found through a code index, its URL not known), lines as printed. V0 on the CPU
    // backend makes VLLM_CPU_KVCACHE_SPACE (4 GiB by default, `platforms/cpu.py`) into
    // `space // cache_block_size` blocks (`worker/cpu_worker.py`
    // `CPUWorker.determine_num_available_blocks`): no GPU budget applies.
    let v0 = "WARNING 07-15 21:27:10 [cpu.py:131] Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using 4 by default.\n\
              INFO 07-15 21:27:10 [llm_engine.py:230] Initializing a V0 LLM engine (v0.9.2) with config: model='Qwen/Qwen3-0.6B', speculative_config=None, tokenizer='Qwen/Qwen3-0.6B', dtype=torch.float16, max_seq_len=2048, tensor_parallel_size=1, pipeline_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto,  device_config=cpu, seed=0\n\
              INFO 07-15 21:27:12 [default_loader.py:272] Loading weights took 0.68 seconds\n\
              INFO 07-15 21:27:12 [executor_base.py:113] # cpu blocks: 2340, # CPU blocks: 0\n\
              INFO 07-15 21:27:12 [executor_base.py:118] Maximum concurrency for 2048 tokens per request: 18.28x\n";
    let e = parse(v0).unwrap_err().to_string();
    assert!(
        e.starts_with("line 1: a vLLM CPU-backend start-up")
            && e.contains("VLLM_CPU_KVCACHE_SPACE, 4 GiB, the default (line 1)")
            && e.contains("memplan plans GPU memory")
            && e.contains("CPUWorker.determine_num_available_blocks")
            && e.contains("this start-up's 2340 blocks (line 4)"),
        "{e}"
    );
    // A public V1 log of the CPU backend (a vLLM development build on a Mac, facebook/opt-125m;
    // a repository file found through a code index, its URL not known): 0.19.0 takes the space
    // as its available KV memory (`v1/worker/cpu_worker.py`
    // `CPUWorker.determine_available_memory`), half the host's memory when unset.
    let v1 = "WARNING 03-30 22:28:09 [cpu.py:136] VLLM_CPU_KVCACHE_SPACE not set. Using 16.0 GiB for KV cache.\n\
              (EngineCore pid=11747) INFO 03-30 22:28:15 [core.py:105] Initializing a V1 LLM engine (v0.1.dev14592+gb7332b058) with config: model='facebook/opt-125m', speculative_config=None, tokenizer='facebook/opt-125m', dtype=torch.float32, max_seq_len=2048, tensor_parallel_size=1, quantization=None, enforce_eager=True, kv_cache_dtype=auto, device_config=cpu, seed=0\n\
              (EngineCore pid=11747) INFO 03-30 22:28:17 [kv_cache_utils.py:1319] GPU KV cache size: 232,960 tokens\n\
              (EngineCore pid=11747) INFO 03-30 22:28:17 [kv_cache_utils.py:1324] Maximum concurrency for 2,048 tokens per request: 113.75x\n";
    let e = parse(v1).unwrap_err().to_string();
    assert!(
        e.starts_with("line 1: a vLLM CPU-backend start-up")
            && e.contains("VLLM_CPU_KVCACHE_SPACE, 16.0 GiB (line 1)")
            && e.contains("this start-up's 232960 KV tokens (line 3)"),
        "{e}"
    );
    // A vllm-metal log (v0.23.0 on an Apple GPU; a repository file found through a code
    // index, its URL not known) prints `device_config=cpu` and is no CPU-backend log, nor is
    // one that names its platform plugin beside a CPU line.
    let metal = "INFO 06-15 16:52:26 [__init__.py:238] Platform plugin metal is activated\n\
                 (EngineCore pid=69652) INFO 06-15 16:52:27 [core.py:113] Initializing a V1 LLM engine (v0.23.0) with config: model='Qwen/Qwen3-0.6B', speculative_config=None, tokenizer='Qwen/Qwen3-0.6B', kv_cache_dtype=auto, device_config=cpu, seed=0\n\
                 (EngineCore pid=69652) INFO 06-15 16:52:29 [kv_cache_utils.py:1744] GPU KV cache size: 7,664 tokens\n";
    assert_eq!(parse(metal).unwrap().kv_tokens, Some(7_664));
    // (The same with the CPU platform's space line added, as a plugin built on it may print.)
    let with_space = format!(
        "{metal}WARNING 06-15 16:52:26 [cpu.py:136] VLLM_CPU_KVCACHE_SPACE not set. Using 2.0 GiB for KV cache.\n"
    );
    assert!(parse(&with_space).is_ok());
    // A GPU log's swap-space count ("# CPU blocks") is not the CPU backend.
    let gpu = "INFO 12-06 11:39:36 gpu_executor.py:113] # GPU blocks: 1207, # CPU blocks: 1365\n";
    assert_eq!(parse(gpu).unwrap().kv_blocks, Some(1207));
    // Pasted logs mix processes: a client or a Ray head without an accelerator detects the
    // CPU platform beside the engine's accelerator start-up. The accelerator's is planned,
    // and a note names the CPU line, whichever comes first.
    let cuda = "INFO 03-30 22:28:09 [__init__.py:235] Automatically detected platform cuda.\n\
                (EngineCore pid=11747) INFO 03-30 22:28:17 [kv_cache_utils.py:1319] GPU KV cache size: 232,960 tokens\n";
    let cpu = "INFO 03-30 22:27:01 [__init__.py:235] Automatically detected platform cpu.\n";
    for mixed in [format!("{cpu}{cuda}"), format!("{cuda}{cpu}")] {
        let f = parse(&mixed).unwrap();
        assert_eq!(f.kv_tokens, Some(232_960));
        assert!(
            f.notes
                .iter()
                .any(|n| n
                    .contains("a line of vLLM's CPU backend, beside an accelerator's start-up")),
            "{:?}",
            f.notes
        );
    }
    // V0's block count on an accelerator is such a line too; the CPU line alone is refused.
    assert!(parse(&format!("{cpu}{gpu}")).is_ok());
    let alone = format!("{cpu}(EngineCore pid=11747) INFO 03-30 22:28:17 [kv_cache_utils.py:1319] GPU KV cache size: 232,960 tokens\n");
    assert!(parse(&alone)
        .unwrap_err()
        .to_string()
        .contains("a vLLM CPU-backend start-up"));
}

#[test]
fn vllm_ascends_block_size_is_the_logs() {
    // The vllm-ascend installation docs' single-NPU check (vLLM 0.18.0), lines as printed:
    // vllm-ascend prints "Block size is set to 128 ..." where it sets the block size
    // (`vllm_ascend/utils.py` `refresh_block_size`, prefix caching or chunked prefill on),
    // whatever the arguments asked for; 284,416 tokens are 2,222 blocks of 128.
    let log = "INFO 05-12 11:29:29 [utils.py:1186] Block size is set to 128 if prefix cache or chunked prefill is enabled.\n\
               (EngineCore pid=970) INFO 05-12 11:29:29 [core.py:103] Initializing a V1 LLM engine (v0.18.0) with config: model='Qwen/Qwen3-0.6B', speculative_config=None, tokenizer='Qwen/Qwen3-0.6B', dtype=torch.bfloat16, max_seq_len=40960, tensor_parallel_size=1\n\
               (EngineCore pid=970) INFO 05-12 11:34:57 [model_runner_v1.py:2599] Loading model weights took 15.2859 GB\n\
               (EngineCore pid=970) INFO 05-12 11:35:44 [worker.py:357] Available KV cache memory: 39.06 GiB\n\
               (EngineCore pid=970) INFO 05-12 11:35:44 [kv_cache_utils.py:1316] GPU KV cache size: 284,416 tokens\n";
    let f = parse(log).unwrap();
    assert_eq!(f.block_size, Some(128));
    assert_eq!(f.line("block_size"), Some(1));
    assert!(
        f.notes.iter().any(|n| n.contains("an Ascend NPU start-up")),
        "{:?}",
        f.notes
    );
    // Arguments that asked for 16 are overridden, and the note says so.
    let asked = log.replace(
        "tensor_parallel_size=1",
        "tensor_parallel_size=1, 'block_size': 16",
    );
    let f = parse(&asked).unwrap();
    assert_eq!(f.block_size, Some(128));
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("block size 16 in the arguments; vllm-ascend set it to 128")),
        "{:?}",
        f.notes
    );
}

/// vllm-ascend's worker prints its available KV memory and the device total in bytes
/// (`vllm_ascend/worker/worker_v1.py` `NPUWorker.determine_available_memory`: "Available
/// memory: {available}, total memory: {total}"). A public vllm-ascend v0.10.2rc1 start-up of
/// Qwen2.5-0.5B-Instruct on a 48 GB NPU (a report copied into a public repository, code index id
/// 55763524705), lines as printed: 40,178,937,036 bytes over 24 layers x 2 KV heads x 64 x
/// (K + V) x 2 bytes x 128 tokens = 1,572,864 bytes a block = 25,545 blocks, the 3,269,760
/// tokens logged. No block size is printed: vllm-ascend's default, 128.
#[test]
fn vllm_ascends_available_memory_line_is_exact_bytes_and_the_total() {
    let log = "(EngineCore_DP0 pid=6903) INFO 10-09 01:30:33 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='/home/h00643489/data/Qwen2.5-0.5B-Instruct', dtype=torch.float16, max_seq_len=32768, tensor_parallel_size=1, quantization=None, enforce_eager=True, kv_cache_dtype=auto, device_config=npu\n\
               (EngineCore_DP0 pid=6903) INFO 10-09 01:31:09 [model_runner_v1.py:2373] Loading model weights took 0.9299 GB\n\
               (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [worker_v1.py:198] Available memory: 40178937036, total memory: 49602220032\n\
               (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [kv_cache_utils.py:864] GPU KV cache size: 3,269,760 tokens\n\
               (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 99.79x\n";
    let f = parse(log).unwrap();
    assert_eq!(f.total, Some(49_602_220_032));
    assert_eq!(f.kv_available, Some(40_178_937_036));
    assert_eq!(f.kv_available_rounding, Some(0));
    assert_eq!(
        (f.line("total"), f.line("kv_available")),
        (Some(3), Some(3))
    );
    assert_eq!(f.kv_tokens, Some(3_269_760));
    assert_eq!(f.block_size, Some(128));
    assert!(
        f.notes.iter().any(|n| n.contains("an Ascend NPU start-up"))
            && f.notes.iter().any(|n| n.contains("vllm-ascend's default")),
        "{:?}",
        f.notes
    );
    // A block size the log sets stays; a decimal or a unit is not this line's figure; the
    // available memory may not exceed the total.
    let f = parse(&log.replace(
        "tensor_parallel_size=1",
        "tensor_parallel_size=1, 'block_size': 64",
    ))
    .unwrap();
    assert_eq!(f.block_size, Some(64));
    let f = parse(&log.replace(
        "Available memory: 40178937036",
        "Available memory: 37.42 GiB",
    ))
    .unwrap();
    assert_eq!((f.total, f.kv_available), (None, None));
    let e = parse(&log.replace(
        "Available memory: 40178937036",
        "Available memory: 49602220033",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("line 3") && e.contains("more than the device total"),
        "{e}"
    );
    // A start-up with no room: 0 bytes is said, not a figure.
    let f = parse(&log.replace("Available memory: 40178937036", "Available memory: 0")).unwrap();
    assert_eq!(f.kv_available, None);
    assert!(
        f.notes.iter().any(|n| n.contains("0 bytes")),
        "{:?}",
        f.notes
    );
}

/// vLLM up to 0.10 logs each worker's KV cache ("GPU KV cache size", one line per worker, from
/// the engine core) before it sizes every worker by the fewest blocks
/// (`v1/core/kv_cache_utils.py` `unify_kv_cache_configs`), and each worker's report ends with
/// its available KV memory in bytes ("Current kv cache memory in use is N bytes",
/// `v1/worker/gpu_worker.py` `compile_or_warm_up_model`). A public vLLM 0.10.2 start-up of
/// Qwen3-235B-A22B-Instruct-2507-FP8 at TP 8 on L40S (public repository file, code index id
/// 38962983769), three workers' lines as printed: the smallest worker's 11,423,138,508 bytes
/// over 94 layers x 1 KV head x 128 x (K + V) x 2 bytes x 16 tokens = 770,048 bytes a block
/// are 14,834 blocks, the engine's "num_gpu_blocks is: 14834" and 237,344 tokens.
#[test]
fn per_worker_reports_take_the_smallest_and_bytes_over_rounded_figures() {
    let log = "(APIServer pid=1624) INFO 09-24 20:45:41 [api_server.py:1896] vLLM API server version 0.10.2\n\
               (Worker_TP6_EP6 pid=2084) INFO 09-24 20:53:40 [gpu_worker.py:298] Available KV cache memory: 10.64 GiB\n\
               (Worker_TP0_EP0 pid=2078) INFO 09-24 20:53:40 [gpu_worker.py:298] Available KV cache memory: 10.68 GiB\n\
               (Worker_TP2_EP2 pid=2080) INFO 09-24 20:53:40 [gpu_worker.py:298] Available KV cache memory: 10.64 GiB\n\
               (EngineCore_DP0 pid=1944) INFO 09-24 20:53:41 [kv_cache_utils.py:864] GPU KV cache size: 238,208 tokens\n\
               (EngineCore_DP0 pid=1944) INFO 09-24 20:53:41 [kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 7.27x\n\
               (EngineCore_DP0 pid=1944) INFO 09-24 20:53:41 [kv_cache_utils.py:864] GPU KV cache size: 237,344 tokens\n\
               (EngineCore_DP0 pid=1944) INFO 09-24 20:53:41 [kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 7.24x\n\
               (EngineCore_DP0 pid=1944) INFO 09-24 20:53:41 [kv_cache_utils.py:864] GPU KV cache size: 238,256 tokens\n\
               (Worker_TP2_EP2 pid=2080) INFO 09-24 20:54:35 [gpu_worker.py:391] Free memory on device (43.93/44.42 GiB) on startup. Desired GPU memory utilization is (0.9, 39.98 GiB). Actual usage is 27.72 GiB for weight, 1.4 GiB for peak activation, 0.21 GiB for non-torch memory, and 3.45 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=7564378828` to fit into requested memory, or `--kv-cache-memory=11809093120` to fully utilize gpu memory. Current kv cache memory in use is 11423138508 bytes.\n\
               (Worker_TP0_EP0 pid=2078) INFO 09-24 20:54:36 [gpu_worker.py:391] Free memory on device (43.93/44.42 GiB) on startup. Desired GPU memory utilization is (0.9, 39.98 GiB). Actual usage is 27.72 GiB for weight, 1.4 GiB for peak activation, 0.18 GiB for non-torch memory, and 3.45 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=7606321868` to fit into requested memory, or `--kv-cache-memory=11851036160` to fully utilize gpu memory. Current kv cache memory in use is 11465081548 bytes.\n\
               (APIServer pid=1624) INFO 09-24 20:54:37 [loggers.py:142] Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 14834\n";
    let f = parse(log).unwrap();
    assert_eq!(f.kv_tokens, Some(237_344));
    assert_eq!(f.line("kv_tokens"), Some(7));
    assert_eq!(f.kv_blocks, Some(14_834));
    // TP6's figure stays rounded (no bytes line of its own); TP2's bytes replace its 10.64 GiB
    // and are the smallest.
    assert_eq!(f.kv_available, Some(11_423_138_508));
    assert_eq!(f.kv_available_rounding, Some(0));
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("the smallest of 3 \"GPU KV cache size\" lines"))
            && f.notes
                .iter()
                .any(|n| n.contains("Worker_TP2_EP2") && n.contains("in bytes")),
        "{:?}",
        f.notes
    );
    // Data-parallel engines each size their own cache: another process's smaller line is not
    // this engine's.
    let dp = log.replace(
        "(EngineCore_DP0 pid=1944) INFO 09-24 20:53:41 [kv_cache_utils.py:864] GPU KV cache size: 237,344",
        "(EngineCore_DP1 pid=1945) INFO 09-24 20:53:41 [kv_cache_utils.py:864] GPU KV cache size: 237,344",
    );
    assert_eq!(parse(&dp).unwrap().kv_tokens, Some(238_208));
    // A bytes figure outside the rounding of the worker's printed one is not its twin.
    let far = log.replace("in use is 11423138508 bytes", "in use is 11323138508 bytes");
    let f = parse(&far).unwrap();
    assert_eq!(f.kv_available_rounding, None);
    assert_eq!(f.kv_available, Some(gib(10.64)));
}

/// SGLang prints its pool as "K size: X GB, V size: Y GB", each to 0.01 GB: their sum is known
/// to 0.01 GB, twice one figure's rounding.
#[test]
fn sglangs_k_and_v_sizes_are_known_to_a_hundredth() {
    let log = "[2026-02-04 11:30:29] Load weight end. elapsed=0.38 s, type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=77.45 GB, mem usage=0.98 GB.\n\
               [2026-02-04 11:30:29] KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB\n";
    let f = parse(log).unwrap();
    assert_eq!(f.kv_available, Some(gib(0.12) * 2));
    assert_eq!(f.kv_available_rounding, Some(GIB / 100));
    // One figure ("KV size", the MLA pool) keeps the usual half-hundredth.
    let f = parse(
        "[2026-02-26 16:41:18 TP0] KV Cache is allocated. #tokens: 2454421, KV size: 160.63 GB\n",
    )
    .unwrap();
    assert_eq!(f.kv_available_rounding, None);
}

/// vLLM's XPU worker (0.9 to 0.10) prints its own profile: the total and the weights before
/// the profile run, the peak (torch peak plus the non-torch growth) after it, in MB of 2^20
/// bytes (`v1/worker/xpu_worker.py` `XPUWorker.determine_available_memory`, KV memory
/// `total * utilization - peak`). A public vLLM 0.10.1rc2 XPU start-up of Llama-2-7b-chat-hf
/// on an Intel Data Center GPU Max tile (public repository file, code index id 7031462013),
/// lines as printed: 0.9 x 65,520 MB - 13,552.69 MB = 45,415.31 MB over 32 MiB blocks of 64
/// tokens = 1,419 blocks, the logged num_gpu_blocks.
#[test]
fn the_xpu_workers_profile_gives_total_weights_and_peak() {
    let log = "(EngineCore_0 pid=207574) INFO 11-06 18:41:02 [core.py:74] Initializing a V1 LLM engine (v0.10.1rc2.dev189+ge2db1164a) with config: model='meta-llama/Llama-2-7b-chat-hf', dtype=torch.float16, max_seq_len=4096, tensor_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=xpu\n\
               (EngineCore_0 pid=207574) INFO 11-06 18:41:09 [xpu_worker.py:104] Before memory profiling run, total GPU memory: 65520.00 MB, model load takes 12870.74 MB, free gpu memory is 52435.44 MB.\n\
               (EngineCore_0 pid=207574) INFO 11-06 18:41:10 [xpu_worker.py:139] After memory profiling run, peak memory usage is 13552.69 MB,torch mem is 12870.74 MB, non-torch mem is 426.94 MB, free gpu memory is 51896.32 MB.\n\
               (EngineCore_0 pid=207574) INFO 11-06 18:41:10 [kv_cache_utils.py:849] GPU KV cache size: 90,816 tokens\n\
               (APIServer pid=206609) INFO 11-06 18:41:10 [loggers.py:142] Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 1419\n";
    let mib = |x: f64| (x * MIB as f64).round() as u64;
    let f = parse(log).unwrap();
    assert_eq!(f.engine, Some(EngineKind::Vllm));
    assert_eq!(f.total, Some(mib(65_520.0)));
    assert_eq!(f.weights, Some(mib(12_870.74)));
    assert_eq!(f.non_torch, Some(mib(426.94)));
    // 13,552.69 - 426.94 - 12,870.74 = 255.01 MB of torch peak increase.
    assert_eq!(
        f.activation,
        Some(mib(13_552.69) - mib(426.94) - mib(12_870.74))
    );
    assert_eq!((f.line("total"), f.line("activation")), (Some(2), Some(3)));
    assert_eq!(f.block_size, Some(64));
    // The lines alone name the engine.
    let f = parse(&log.lines().skip(1).take(2).collect::<Vec<_>>().join("\n")).unwrap();
    assert_eq!(f.engine, Some(EngineKind::Vllm));
    assert!(f.activation.is_some());
}

/// Pasted logs often begin with the command that launched the engine, or (SGLang) name the
/// checkpoint they load: those name the model where no argument or config line does. Lines
/// as printed in public logs: a vllm-ascend report (Qwen3-4B on a 310P, code index id
/// 55963192249), an SGLang `bench_one_batch` run of granite-4.0-h-micro, an SGLang docs build
/// of Qwen2.5-0.5B (`srt/model_loader/weight_utils.py`: "Found local HF snapshot for X at P").
#[test]
fn a_pasted_command_or_snapshot_line_names_the_model() {
    let kv = "Available KV cache memory: 10.55 GiB\nGPU KV cache size: 230,528 tokens\n";
    let model = |head: &str| parse(&format!("{head}\n{kv}")).unwrap().model;
    assert_eq!(
        model("vllm serve /home/models/Qwen3/Qwen3-4B --served-model-name qwen2.5_7b --tensor-parallel-size 1 --max-model-len 4096 --gpu-memory-utilization 0.8 --enforce-eager --port 8080 --host 0.0.0.0").as_deref(),
        Some("/home/models/Qwen3/Qwen3-4B")
    );
    assert_eq!(
        model("❯ python -m sglang.bench_one_batch --model-path ibm-granite/granite-4.0-h-micro --batch 4").as_deref(),
        Some("ibm-granite/granite-4.0-h-micro")
    );
    assert_eq!(
        model("python3 -m vllm.entrypoints.openai.api_server --model=Qwen/Qwen3-8B --port 8000")
            .as_deref(),
        Some("Qwen/Qwen3-8B")
    );
    assert_eq!(
        model("[2026-02-04 11:30:29] Found local HF snapshot for qwen/qwen2.5-0.5b-instruct at /hf_home/hub/models--qwen--qwen2.5-0.5b-instruct/snapshots/7ae557604adf67be50417f59c2c2f167def9a775; skipping download.").as_deref(),
        Some("qwen/qwen2.5-0.5b-instruct")
    );
    // A flag named in prose is no command; a flag where the model should be is no model.
    assert_eq!(
        model("WARNING use --model NAME to pick another checkpoint"),
        None
    );
    assert_eq!(
        model("vllm serve --model Qwen/Qwen3-8B").as_deref(),
        Some("Qwen/Qwen3-8B")
    );
    // The engine's own arguments name the model as it resolved it, and win.
    let f = parse(&format!(
        "vllm serve /mnt/ckpt --port 8000\nINFO non-default args: {{'model': 'Qwen/Qwen3-8B'}}\n{kv}"
    ))
    .unwrap();
    assert_eq!(f.model.as_deref(), Some("Qwen/Qwen3-8B"));
    assert_eq!(f.models, vec!["Qwen/Qwen3-8B".to_string()]);
}

/// A start-up whose `cudagraph_mode` is NONE captures no graphs whatever `enforce_eager` says
/// (`v1/worker/gpu_model_runner.py` `capture_model` returns 0 after "Skipping CUDA graph
/// capture"): the engine config says so before (0.10's `"cudagraph_mode":0`, 0.11+'s
/// `<CUDAGraphMode.NONE: 0>`) and the capture after. Lines as printed by a public vLLM
/// 0.10.1rc2 XPU start-up (code index id 7031462013) and vLLM 0.19's config line.
#[test]
fn a_graph_mode_of_none_is_read_as_no_graphs() {
    let kv = "Available KV cache memory: 10.55 GiB\n";
    let at = |line: &str| parse(&format!("{kv}{line}\n")).unwrap().no_graphs;
    assert_eq!(
        at("(EngineCore_0 pid=207574) WARNING 11-06 18:41:10 [_logger.py:68] Skipping CUDA graph capture. To turn on CUDA graph capture, ensure `cudagraph_mode` was not manually set to `NONE`"),
        Some(2)
    );
    assert_eq!(
        at("INFO Initializing a V1 LLM engine (v0.10.1rc2) with config: model='m', enforce_eager=False, compilation_config={\"level\":0,\"cudagraph_mode\":0,\"use_cudagraph\":true}"),
        Some(2)
    );
    assert_eq!(
        at("INFO Initializing a V1 LLM engine (v0.19.0) with config: model='m', compilation_config={'mode': <CompilationMode.NONE: 0>, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 1}"),
        Some(2)
    );
    // Other modes capture graphs.
    assert_eq!(
        at("INFO with config: model='m', compilation_config={\"level\":3,\"cudagraph_mode\":1,\"use_cudagraph\":true}"),
        None
    );
    assert_eq!(
        at("INFO with config: model='m', compilation_config={'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}"),
        None
    );
}

/// SGLang prints one line per graph it captures ("Capture target prefill CUDA graph end.
/// elapsed=X s, mem usage=Y GB, ..."), per rank: the rank's graph memory is their sum. Lines
/// as printed in public SGLang logs (a 2026-08 single-GPU start-up with prefill and decode
/// graphs; a TP 3 start-up's decode lines, as SGLang's own `srt/planner/graphmem.py` tests
/// quote them).
#[test]
fn sglangs_graph_captures_of_a_rank_are_summed() {
    let one = "[2026-08-27 03:46:00] KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB\n\
               [2026-08-27 03:46:18] Capture target prefill CUDA graph end. elapsed=22.96 s, mem usage=1.71 GB, avail mem=10.88 GB.\n\
               [2026-08-27 03:46:18] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4], avail mem=10.88 GB\n\
               [2026-08-27 03:46:25] Capture target decode CUDA graph end. elapsed=6.10 s, mem usage=0.43 GB, avail mem=10.45 GB.\n";
    let f = parse(one).unwrap();
    assert_eq!(f.engine, Some(EngineKind::Sglang));
    assert_eq!(f.graph_actual, Some(gib(1.71) + gib(0.43)));
    assert_eq!(f.line("graph_actual"), Some(2));
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("over the 2 graph captures")),
        "{:?}",
        f.notes
    );
    let tp3 = "[2026-07-21 13:35:00 TP0] KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB\n\
               [2026-07-21 13:35:33 TP1] Capture target decode CUDA graph end. elapsed=4.81 s, mem usage=0.27 GB, avail mem=5.34 GB.\n\
               [2026-07-21 13:35:33 TP2] Capture target decode CUDA graph end. elapsed=4.82 s, mem usage=0.27 GB, avail mem=5.47 GB.\n\
               [2026-07-21 13:35:33 TP0] Capture target decode CUDA graph end. elapsed=4.83 s, mem usage=0.24 GB, avail mem=7.28 GB.\n";
    let f = parse(tp3).unwrap();
    assert_eq!(f.graph_actual, Some(gib(0.27)));
    // The older single line is read as before, and not added to.
    let old = "KV Cache is allocated. #tokens: 441168, K size: 26.93 GB, V size: 26.93 GB\n\
               Capture cuda graph end. Time elapsed: 3.21 s. mem usage=0.51 GB. avail mem=7.20 GB.\n";
    assert_eq!(parse(old).unwrap().graph_actual, Some(gib(0.51)));
    assert_eq!(sglang_rank("[2026-01-15 13:56:49 DP1 TP1] x"), Some("TP1"));
    assert_eq!(sglang_rank("[2026-01-15 13:56:49] x"), None);
}

/// SGLang 0.5.9's own capture lines (`srt/model_executor/model_runner.py`
/// `init_device_graphs` and `init_piecewise_cuda_graphs`, `srt/speculative/eagle_worker.py`):
/// the decode, piecewise prefill and draft graphs of a rank are one graph memory.
#[test]
fn sglang_0_5_capture_lines_of_every_runner_are_summed() {
    let log = "[2025-11-30 12:50:10] KV Cache is allocated. #tokens: 2243474, K size: 59.91 GB, V size: 59.91 GB\n\
               [2025-11-30 12:50:15] Capture cuda graph end. Time elapsed: 5.37 s. mem usage=1.44 GB. avail mem=38.05 GB.\n\
               [2025-11-30 12:50:30] Capture piecewise CUDA graph end. Time elapsed: 14.02 s. mem usage=0.61 GB. avail mem=37.44 GB.\n\
               [2025-11-30 12:50:33] Capture draft cuda graph end. Time elapsed: 2.10 s. mem usage=0.20 GB. avail mem=37.24 GB.\n";
    let f = parse(log).unwrap();
    assert_eq!(f.graph_actual, Some(gib(1.44) + gib(0.61) + gib(0.20)));
    assert_eq!(f.line("graph_actual"), Some(2));
}

/// A launch command pasted over several lines (`vllm serve \` with the model and the flags
/// on the lines after it) names its model; the `\` is no model.
#[test]
fn a_command_continued_over_lines_names_its_model() {
    let kv = "Available KV cache memory: 10.55 GiB\nGPU KV cache size: 230,528 tokens\n";
    let model = |head: &str| parse(&format!("{head}\n{kv}")).unwrap().models;
    assert_eq!(
        model("vllm serve \\\n    Qwen/Qwen2.5-7B-Instruct \\\n    --port 8000"),
        vec!["Qwen/Qwen2.5-7B-Instruct".to_string()]
    );
    assert_eq!(
        model("python -m vllm.entrypoints.openai.api_server \\\n  --port 8000 \\\n  --model 'Qwen/Qwen3-8B' \\\n  --max-model-len 4096"),
        vec!["Qwen/Qwen3-8B".to_string()]
    );
    // A `--model` in prose after a finished command is still no command.
    assert_eq!(
        model("vllm serve Qwen/Qwen3-8B\nWARNING use --model NAME to pick another checkpoint"),
        vec!["Qwen/Qwen3-8B".to_string()]
    );
    assert!(model("vllm serve \\\n  --port 8000").is_empty());
}

/// Two pasted commands of different models: the log does not say which one its figures are
/// of, so it names both (the CLI asks for `--model`); the same model twice is one.
#[test]
fn commands_naming_different_models_name_both() {
    let kv = "Available KV cache memory: 10.55 GiB\nGPU KV cache size: 230,528 tokens\n";
    let f = parse(&format!(
        "vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000\nvllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000\n{kv}"
    ))
    .unwrap();
    assert_eq!(
        f.models,
        vec![
            "Qwen/Qwen2.5-7B-Instruct".to_string(),
            "meta-llama/Llama-3.1-8B-Instruct".to_string()
        ]
    );
    let f = parse(&format!(
        "python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --model meta-llama/Llama-3.1-8B-Instruct\n{kv}"
    ))
    .unwrap();
    assert_eq!(f.models.len(), 2, "{:?}", f.models);
    let f = parse(&format!(
        "vllm serve Qwen/Qwen3-8B\nvllm serve qwen/qwen3-8b --port 8001\n{kv}"
    ))
    .unwrap();
    assert_eq!(f.models, vec!["Qwen/Qwen3-8B".to_string()]);
    // The engine's banner names what it loaded, over a pasted command.
    let f = parse(&format!(
        "vllm serve /mnt/other\n\u{2588}  model   Qwen/Qwen3-8B\n{kv}"
    ))
    .unwrap();
    assert_eq!(f.models, vec!["Qwen/Qwen3-8B".to_string()]);
}

/// vllm-ascend prints `int(total * utilization - peak)`, below 0 where the profile's peak
/// passed the budget: that start-up had no room for a KV cache (as a 0 says), and the device
/// total on the line is still read, not the whole line passed over.
#[test]
fn an_ascend_figure_below_zero_is_no_room_not_an_unread_line() {
    let weights = "INFO [model_runner_v1.py:2661] Loading model weights took 7.5553 GB\n";
    let f = parse(&format!(
        "{weights}INFO [worker_v1.py:234] Available memory: -1954181529, total memory: 46431260672\n"
    ))
    .unwrap();
    assert_eq!(f.total, Some(46_431_260_672));
    assert_eq!(f.kv_available, None);
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("below 0") && n.contains("no room")),
        "{:?}",
        f.notes
    );
    // A figure that is no number at all is still no figure.
    let f = parse(&format!(
        "{weights}INFO [worker_v1.py:234] Available memory: -, total memory: 46431260672\n"
    ))
    .unwrap();
    assert_eq!(f.total, None);
}

/// A process's KV figure in bytes that is not its own rounded figure (more than the rounding
/// apart) is named in a note, not dropped unseen; the rounded figure is kept.
#[test]
fn a_bytes_figure_that_contradicts_the_rounded_one_is_named() {
    let f = parse(
        "INFO [gpu_worker.py:276] Available KV cache memory: 10.55 GiB\n\
         INFO [gpu_worker.py:300] Free memory on device (40.0/44.42 GiB) on startup. Current kv cache memory in use is 22000000000 bytes.\n\
         INFO [kv_cache_utils.py:1087] GPU KV cache size: 230,528 tokens\n",
    )
    .unwrap();
    assert_eq!(f.kv_available, Some((10.55 * GIB as f64).round() as u64));
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("line 2") && n.contains("20.49 GiB") && n.contains("rounded")),
        "{:?}",
        f.notes
    );
}

/// A launch command pasted above the log gives the flags the engine's lines do not print
/// (public copies: the outside14 battery's log 30, `$ vllm serve ... -tp 2` above a V0
/// "Memory profiling results" table; the outside16 battery's log 03, vllm-ascend 0.11.0rc0,
/// whose worker prints no arguments). Before, only the model was read from such a line.
#[test]
fn a_pasted_launch_command_gives_the_flags_the_engine_does_not_print() {
    let v0 = "$ vllm serve meta-llama/Meta-Llama-3-8B -tp 2\n\
              INFO 12-13 19:55:25 worker.py:243] Memory profiling results:\n\
              INFO 12-13 19:55:25 worker.py:243] total_gpu_memory     79.22GiB\n\
              INFO 12-13 19:55:25 worker.py:243] gpu_memory_utilization       0.90\n\
              INFO 12-13 19:55:25 worker.py:243] model weights take   7.48GiB\n";
    let f = parse(v0).unwrap();
    assert_eq!(f.tensor_parallel, Some(2));
    assert_eq!(f.line("tensor_parallel"), Some(1));
    assert_eq!(f.utilization, Some(0.90));
    assert!(
        f.notes
            .iter()
            .any(|n| n.starts_with("line 1: from the pasted `vllm serve` command: -tp 2")),
        "{:?}",
        f.notes
    );
    let ascend = "vllm serve /home/models/Qwen3/Qwen3-4B --served-model-name qwen2.5_7b --tensor-parallel-size 1 --max-model-len 4096 --gpu-memory-utilization 0.8 --enforce-eager --port 8080 --host 0.0.0.0\n\
                  (EngineCore_DP0 pid=3132) INFO 10-15 16:32:15 [kv_cache_utils.py:1087] GPU KV cache size: 182,784 tokens\n\
                  (EngineCore_DP0 pid=3132) INFO 10-15 16:32:15 [kv_cache_utils.py:1091] Maximum concurrency for 4,096 tokens per request: 44.62x\n";
    let f = parse(ascend).unwrap();
    assert_eq!(f.utilization, Some(0.8));
    assert_eq!(f.enforce_eager, Some(true));
    assert_eq!(f.tensor_parallel, Some(1));
    // The engine printed the same length: no disagreement.
    assert_eq!(f.max_model_len, Some(4096));
    assert_eq!(f.line("max_model_len"), Some(3));
    assert!(
        !f.notes.iter().any(|n| n.contains("differs")),
        "{:?}",
        f.notes
    );
    assert_eq!(f.model.as_deref(), Some("/home/models/Qwen3/Qwen3-4B"));
}

/// The engine's printed arguments win over a pasted command's (public copy: the outside14
/// battery's log 06, vLLM 0.10.2, `docker ... vllm serve ... --enforce-eager
/// --gpu-memory-utilization 0.85`; the command here asks for 0.9 as a stale paste would, and
/// is written across lines as a shell script would, with `--flag=value` and quotes).
#[test]
fn the_engines_printed_arguments_win_over_a_pasted_command() {
    let log = "python -m vllm.entrypoints.openai.api_server \\\n\
               \x20   --model 'meta-llama/Llama-3.1-8B-Instruct' \\\n\
               \x20   --gpu_memory_utilization=0.9 --max-num-seqs \"64\" --pipeline-parallel-size 2 --no-enforce-eager --no-enable-prefix-caching  # comment --max-model-len 8\n\
               (APIServer pid=387) INFO 09-21 21:36:07 [utils.py:328] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'host': '0.0.0.0', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'enforce_eager': True, 'gpu_memory_utilization': 0.85}\n\
               (EngineCore_DP0 pid=575) INFO 09-21 21:36:40 [gpu_worker.py:298] Available KV cache memory: 110.31 GiB\n";
    let f = parse(log).unwrap();
    assert_eq!(f.utilization, Some(0.85));
    assert_eq!(f.line("utilization"), Some(4));
    assert_eq!(f.enforce_eager, Some(true));
    assert_eq!(f.max_num_seqs, Some(64));
    assert_eq!(f.pipeline_parallel, Some(2));
    assert_eq!(f.enable_prefix_caching, Some(false));
    assert_eq!(f.line("max_num_seqs"), Some(1));
    assert_eq!(f.max_model_len, None);
    let differ: Vec<&String> = f.notes.iter().filter(|n| n.contains("differs")).collect();
    assert_eq!(differ.len(), 2, "{:?}", f.notes);
    assert!(
        differ[0].contains(
            "--gpu-memory-utilization 0.9 differs from the engine's printed 0.85 (line 4)"
        ),
        "{differ:?}"
    );
    assert!(
        differ[1].contains("--no-enforce-eager false differs"),
        "{differ:?}"
    );
    // A malformed value of a flag that changes the plan is an error naming it.
    let bad =
        "$ vllm serve m --max-model-len 32x\nINFO 12-13 19:55:25 worker.py:243] Memory profiling results:\n";
    let e = parse(bad).unwrap_err().to_string();
    assert!(
        e.contains("line 1") && e.contains("--max-model-len \"32x\" is not a whole number"),
        "{e}"
    );
}

/// A whole number too long for 64 bits is still a whole number: out of range, stated with
/// the range (a count) or the most any device holds (bytes), in a log line and in a pasted
/// command alike; a negative count in a command is out of range too, not "not a whole number".
#[test]
fn numbers_past_64_bits_are_out_of_range_with_the_range() {
    let huge = "99999999999999999999999";
    let e = parse(&format!(
        "INFO vLLM API server version 0.30.0\nINFO Model loading took 1.0 GiB\n\
         INFO GPU KV cache size: {huge} tokens\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(&format!("{huge} is outside 1..=")) && !e.contains("64 bits"),
        "{e}"
    );
    let ascend = format!(
        "(EngineCore_DP0 pid=6903) INFO 10-09 01:30:33 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='m', dtype=torch.float16, max_seq_len=32768, tensor_parallel_size=1, quantization=None, enforce_eager=True, kv_cache_dtype=auto, device_config=npu\n\
         (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [worker_v1.py:198] Available memory: {huge}, total memory: 49602220032\n\
         (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [kv_cache_utils.py:864] GPU KV cache size: 3,269,760 tokens\n"
    );
    let e = parse(&ascend).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "{huge} bytes is more than any device holds (at most"
        )) && !e.contains("64 bits"),
        "{e}"
    );
    // (`-1` is vLLM's "the longest that fits"; `-2` is no length.)
    for v in [huge, "-2", "+99999999999999999999999"] {
        let e = parse(&format!(
            "$ vllm serve m --max-model-len {v}\nINFO 12-13 19:55:25 worker.py:243] Memory profiling results:\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 1") && e.contains(&format!("--max-model-len \"{v}\" is outside 1..=")),
            "{v}: {e}"
        );
    }
    // With vLLM's unit suffixes too (`human_readable_int`): past 64 bits is out of range.
    for v in ["99999999999999999999k", "99999999999999999999K"] {
        let e = parse(&format!(
            "$ vllm serve m --max-num-batched-tokens {v}\nINFO 12-13 19:55:25 worker.py:243] Memory profiling results:\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!("--max-num-batched-tokens \"{v}\" is outside 1..="))
                && !e.contains("whole number"),
            "{v}: {e}"
        );
    }
}
