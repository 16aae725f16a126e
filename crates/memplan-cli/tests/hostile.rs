//! Hostile inputs an outside battery found getting through (each case failed before its fix):
//! the built binary must refuse them with the documented exit code and a message that names
//! the file, line, key or device at fault, never a flag the user did not pass.

use std::path::PathBuf;
use std::process::Command;

/// Exit code and stderr of `memplan ARGS`.
fn run(args: &[&str]) -> (i32, String) {
    run_with(args, &[])
}

/// [`run`] with environment variables set (as bytes, which need not be UTF-8).
fn run_with(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> (i32, String) {
    let (code, _, err) = output(args, env);
    (code, err)
}

/// `memplan ARGS` with `env` set and no logging or allocator variables of the caller's:
/// exit code, stdout and stderr.
fn output(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memplan"));
    cmd.args(args)
        .env_remove("MEMPLAN_LOG")
        .env_remove("RUST_LOG");
    for var in [
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_HIP_ALLOC_CONF",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    (
        out.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

fn tmp(name: &str) -> PathBuf {
    // Scratch space cargo gives integration tests (inside the target directory), per process.
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// `text` written to the scratch file `name`, then `memplan plan --model FILE --device
/// sim:h100-80gb` (a config that must be read to plan): exit code, stdout and stderr.
fn plan_config(name: &str, text: &str) -> (i32, String, String) {
    let cfg = tmp(name);
    std::fs::write(&cfg, text).unwrap();
    let path = cfg.to_str().unwrap();
    run_out(&["plan", "--model", path, "--device", "sim:h100-80gb"])
}

/// `text` written to the scratch file `name`, then `memplan plan --model MODEL --from-log
/// FILE FLAGS`: exit code, stdout and stderr.
fn plan_log(name: &str, text: &str, model: &str, flags: &[&str]) -> (i32, String, String) {
    let log = tmp(name);
    std::fs::write(&log, text).unwrap();
    let mut args = vec![
        "plan",
        "--model",
        model,
        "--from-log",
        log.to_str().unwrap(),
    ];
    args.extend(flags);
    run_out(&args)
}

/// A figure the log prints as `NaN` or `inf` with its unit written on is refused naming the
/// line, not skipped (which let a total derived from other lines stand in for it).
#[test]
fn a_log_figure_of_nan_with_its_unit_is_refused() {
    for (name, value) in [("nan.log", "NaNGiB"), ("inf.log", "infGiB")] {
        let text = format!(
            "[v1/worker/gpu_worker.py:284] worker init memory snapshot: torch_peak=0.0GiB, \
             free_memory=78.68GiB, total_memory={value}, cuda_memory=0.51GiB\n\
             [v1/worker/gpu_model_runner.py:4820] Model loading took 14.99 GiB memory\n\
             [v1/worker/gpu_worker.py:436] Available KV cache memory: 58.11 GiB\n\
             [v1/core/kv_cache_utils.py:1319] GPU KV cache size: 476,016 tokens\n"
        );
        let (code, _, err) = plan_log(name, &text, "llama-3.1-8b-instruct", &[]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(name) && err.contains("line 1"), "{err}");
        assert!(!err.contains("--"), "blames a flag: {err}");
    }
}

/// A hardware device id selects by ordinal: `cuda:-1` is no id, even where the device is
/// never opened (beside --total-memory).
#[test]
fn a_hardware_device_id_without_an_ordinal_is_refused() {
    for id in ["cuda:-1", "cuda:x", "rocm:99999999999999999999"] {
        let (code, err) = run(&[
            "plan",
            "--model",
            "qwen2.5-1.5b-instruct",
            "--device",
            id,
            "--total-memory",
            "24GiB",
        ]);
        assert_eq!(code, 2, "{id}: {err}");
        assert!(err.contains(id) && err.contains("--device"), "{id}: {err}");
    }
}

/// A `sim:` id without a profile (`sim:`, `sim`) is refused as typed, listing the
/// simulator's profiles (it takes a profile name and modifiers, not the ordinal a hardware id
/// takes), by `probe` and by `plan --device`, even beside `--total-memory`.
#[test]
fn a_sim_id_without_a_profile_lists_the_profiles() {
    let checks = [
        run(&["probe", "sim:"]),
        run(&["probe", "sim"]),
        run(&[
            "plan",
            "--model",
            "qwen2.5-1.5b-instruct",
            "--device",
            "sim:",
            "--total-memory",
            "24GiB",
        ]),
    ];
    for (code, err) in checks {
        assert_eq!(code, 2, "{err}");
        assert!(
            (err.contains("`sim:`") || err.contains("`sim`"))
                && !err.contains("sim:0")
                && err.contains("rtx4090")
                && err.contains("h100-80gb")
                && err.contains("sim:h100-80gb,seed=3")
                && !err.contains("ordinal"),
            "{err}"
        );
    }
    // The example the message gives opens.
    let (code, err) = run(&["probe", "sim:h100-80gb,seed=3"]);
    assert_eq!(code, 0, "{err}");
}

/// `--emit-args vllm` with fewer batched tokens than sequences is refused; where the count of
/// sequences is the one memplan writes by itself, the message says so and asks to pass
/// `--max-num-seqs`, not to lower a flag that was never given.
#[test]
fn too_few_batched_tokens_for_vllm_name_the_sequences_nobody_set() {
    let base = [
        "plan",
        "--model",
        "qwen2.5-1.5b-instruct",
        "--device",
        "sim:rtx4090",
        "--max-num-batched-tokens",
        "100",
        "--emit-args",
        "vllm",
    ];
    let (code, err) = run(&base);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("max-num-seqs (256, written since no --max-num-seqs was given)")
            && err.contains("pass --max-num-seqs 100 or less")
            && !err.contains("lower --max-num-seqs"),
        "{err}"
    );
    let mut given = base.to_vec();
    given.extend(["--max-num-seqs", "200"]);
    let (code, err) = run(&given);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("max-num-seqs (200)") && err.contains("lower --max-num-seqs 100 or less"),
        "{err}"
    );
}

/// Config dimensions each within range whose product is not are the file's fault (exit 1,
/// the file and the key named), not a usage error naming no file.
#[test]
fn config_dimensions_that_do_not_compute_name_the_file() {
    let (code, _, err) = plan_config(
        "big-hidden.json",
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":1000000000000,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
        "intermediate_size":14336,"vocab_size":128256,"torch_dtype":"bfloat16"}"#,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("big-hidden.json") && err.contains("hidden_size"),
        "{err}"
    );
}

/// A device that reports a total of 0 bytes (a simulated misreport larger than the card), or
/// more than the 1 PiB --total-memory takes, is the device's failure: not planned for, and
/// not a `--total-memory` the user never passed.
#[test]
fn a_device_reporting_an_absurd_total_is_refused_naming_it() {
    for modifier in [
        "total-under=24GiB",
        "total-over=1PiB",
        "total-over=16000000TiB",
    ] {
        let id = format!("sim:rtx4090,{modifier}");
        let (code, err) = run(&["plan", "--model", "qwen2.5-1.5b-instruct", "--device", &id]);
        assert_eq!(code, 1, "{id}: {err}");
        assert!(
            err.to_lowercase().contains(&id.to_lowercase()) && err.contains("reports a total"),
            "{id}: {err}"
        );
        assert!(!err.contains("--total-memory:"), "blames a flag: {err}");
    }
}

/// A config.json with a `NaN` or `Infinity` literal (not JSON; Python's `json.dumps` writes
/// it) names the file, the key path of the value and what the literal is.
#[test]
fn a_non_finite_literal_in_a_config_names_the_file_and_key() {
    let (code, _, err) = plan_config(
        "nan-layers.json",
        "{\"architectures\":[\"LlavaForConditionalGeneration\"],\"model_type\":\"llava\",\n\
         \"text_config\":{\"hidden_size\":4096,\n\"num_hidden_layers\":NaN}}",
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("nan-layers.json")
            && err.contains("num_hidden_layers")
            && err.contains("NaN and infinity are not valid JSON numbers"),
        "{err}"
    );
}

/// A simulated device's modifier given twice is refused naming it, not the last one winning.
#[test]
fn a_sim_modifier_given_twice_is_refused_naming_it() {
    for (id, key) in [
        ("sim:h100-80gb,seed=1,seed=2", "seed"),
        ("sim:h100-80gb,stale-free,stale-free=off", "stale-free"),
        ("sim:h100-80gb,other=1GiB,physics=low,other=2GiB", "other"),
    ] {
        let (code, err) = run(&["plan", "--model", "qwen2.5-1.5b-instruct", "--device", id]);
        assert_eq!(code, 2, "{id}: {err}");
        assert!(
            err.contains(&format!("`{key}` is given twice")),
            "{id}: {err}"
        );
    }
}

/// A pasted launch command with full-width digits (`--max-model-len ４０９６`, as chat clients
/// write them) is a bad value naming the line and the flag, not a panic inside a character.
#[test]
fn full_width_digits_in_a_pasted_command_are_a_bad_value() {
    let (code, _, err) = plan_log(
        "full-width.log",
        "$ vllm serve m --max-model-len ４０９６\n\
         INFO 01-23 15:50:05 [gpu_worker.py:298] Available KV cache memory: 58.11 GiB\n",
        "llama-3.1-8b-instruct",
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("line 1") && err.contains("--max-model-len") && err.contains("４０９６"),
        "{err}"
    );
}

/// `PYTORCH_ALLOC_CONF` set to bytes that are not UTF-8 is set (PyTorch reads it, and not
/// the variables after it): a usage error naming it, not the next variable read instead.
#[cfg(unix)]
#[test]
fn an_allocator_variable_that_is_not_utf8_is_refused_naming_it() {
    use std::os::unix::ffi::OsStrExt;
    let (code, err) = run_with(
        &[
            "plan",
            "--model",
            "qwen2.5-1.5b-instruct",
            "--total-memory",
            "24GiB",
        ],
        &[
            (
                "PYTORCH_ALLOC_CONF",
                std::ffi::OsStr::from_bytes(b"expandable_segments:\xff"),
            ),
            (
                "PYTORCH_CUDA_ALLOC_CONF",
                std::ffi::OsStr::new("expandable_segments:True"),
            ),
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("PYTORCH_ALLOC_CONF") && err.contains("UTF-8"),
        "{err}"
    );
}

/// A figure as long as the log may be is refused naming its line, and the error quotes it by
/// its ends: one line of a few hundred bytes, not the megabytes of the value.
#[test]
fn a_figure_of_megabytes_is_quoted_by_its_ends() {
    let text = format!(
        "INFO vLLM API server version 0.30.0\n\
         INFO Model loading took 14.99 GiB memory\n\
         INFO Available KV cache memory: {} GiB\n",
        "9".repeat(4 << 20)
    );
    let (code, _, err) = plan_log("long-figure.log", &text, "llama-3.1-8b-instruct", &[]);
    assert_eq!(code, 1, "{err:.300}");
    assert!(err.len() < 2048, "{} bytes of stderr", err.len());
    assert!(
        err.contains("long-figure.log") && err.contains("line 3"),
        "{err}"
    );
}

/// A log naming thousands of models (one on each line) names the first 8 and how many more,
/// in the error without --model and in the warning with another one, never all of them.
#[test]
fn a_log_naming_thousands_of_models_lists_a_few() {
    let log = tmp("many-models.log");
    let mut text = String::from(
        "INFO vLLM API server version 0.30.0\n\
         INFO Model loading took 14.99 GiB memory\n\
         INFO Available KV cache memory: 58.11 GiB\n",
    );
    for i in 0..5000 {
        text.push_str(&format!("INFO non-default args: {{'model': 'org/m{i}'}}\n"));
    }
    std::fs::write(&log, text).unwrap();
    let path = log.to_str().unwrap();
    let (code, err) = run(&["plan", "--from-log", path, "--total-memory", "80GiB"]);
    assert_eq!(code, 2, "{err:.300}");
    assert!(
        err.contains("5000 models") && err.contains("org/m7 and 4992 more"),
        "{err:.300}"
    );
    assert!(!err.contains("org/m8"), "{err:.300}");
    let out = Command::new(env!("CARGO_BIN_EXE_memplan"))
        .args([
            "plan",
            "--from-log",
            path,
            "--model",
            "llama-3.1-8b-instruct",
            "--json",
        ])
        .output()
        .expect("the binary runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("and 4992 more"), "{:.300}", text);
    assert!(text.len() < 64 << 10, "{} bytes", text.len());
}

/// An argument that is not UTF-8 (a model directory's name) is refused naming its flag, not
/// as "one or more arguments".
#[cfg(unix)]
#[test]
fn an_argument_that_is_not_utf8_names_its_flag() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"/models/caf\xe9");
    for (args, flag) in [
        (vec!["plan", "--model"], "--model"),
        (
            vec!["plan", "--total-memory", "80GiB", "--kv-cache-dtype"],
            "--kv-cache-dtype",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_memplan"))
            .args(&args)
            .arg(bad)
            .args(["--total-memory", "80GiB"])
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(flag) && err.contains("not UTF-8"), "{err}");
    }
    let mut eq = std::ffi::OsString::from("--model=");
    eq.push(bad);
    let out = Command::new(env!("CARGO_BIN_EXE_memplan"))
        .args(["plan", "--total-memory", "80GiB"])
        .arg(&eq)
        .output()
        .expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--model") && err.contains("not UTF-8"),
        "{err}"
    );
}

/// `memplan ARGS`: exit code, stdout and stderr.
fn run_out(args: &[&str]) -> (i32, String, String) {
    output(args, &[])
}

/// A shipped scenario with one line changed, written to a scratch file.
fn scenario_with(name: &str, from: &str, to: &str) -> PathBuf {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../memplan-testbed/scenarios/bf16-24g.toml"
    ))
    .unwrap();
    assert!(shipped.contains(from), "{from}");
    let path = tmp(name);
    std::fs::write(&path, shipped.replace(from, to)).unwrap();
    path
}

/// A scenario whose engine cannot start in any run (weights larger than the device; a device
/// that misreports a total of 0 bytes) simulated nothing: exit 1 with the reason on stderr,
/// and under `--json` a `memplan.error/1` that still holds the report. A strategy that runs
/// out of memory beside others that start is a result (exit 0).
#[test]
fn a_scenario_whose_engine_cannot_start_fails_the_command() {
    let too_big = scenario_with(
        "too-big.toml",
        "weights = \"2.88GiB\"",
        "weights = \"30GiB\"",
    );
    let zero_total = scenario_with(
        "zero-total.toml",
        "device = \"rtx4090\"",
        "device = \"rtx4090,total-under=24GiB\"",
    );
    for (path, why) in [
        (&too_big, "does not fit on the device"),
        (&zero_total, "device total"),
    ] {
        let p = path.to_str().unwrap();
        for strategy in ["auto", "all", "full"] {
            let (code, _, err) = run_out(&["simulate", "--scenario", p, "--strategy", strategy]);
            assert_eq!(code, 1, "{p} {strategy}: {err}");
            assert!(
                err.contains(p) && err.contains("did not start") && err.contains(why),
                "{p}: {err}"
            );
        }
        let (code, out, err) = run_out(&["simulate", "--scenario", p, "--json"]);
        assert_eq!(code, 1, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["schema"], "memplan.error/1", "{out}");
        assert_eq!(v["error"]["kind"], "did_not_start", "{out}");
        assert_eq!(v["error"]["exit_code"], 1, "{out}");
        assert!(v["error"]["help"]["simulation"]["runs"][0]["failed"].is_string());
    }
    // A scenario that runs is a result, whatever each strategy's outcome.
    let (code, out, err) = run_out(&["simulate", "--scenario", "bf16-24g", "--strategy", "all"]);
    assert_eq!(code, 0, "{out}{err}");
}

/// A config whose architecture name holds terminal sequences (ESC, a C1 CSI, a
/// right-to-left override), or a file name that does, is shown with those characters
/// escaped on stdout and stderr, never sent to the terminal as they are.
#[test]
fn terminal_sequences_from_inputs_are_shown_escaped() {
    let config = |arch: &str, hidden: u64| {
        serde_json::json!({
            "architectures": [arch], "hidden_size": hidden, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 64,
            "vocab_size": 1000, "torch_dtype": "bfloat16"
        })
        .to_string()
    };
    let arch = "\u{1b}]0;title\u{7}\u{1b}[2J\u{9b}31m\u{202e}ForCausalLM";
    let (code, out, err) = plan_config("esc-arch.json", &config(arch, 64));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\\u{1b}[2J") && out.contains("\\u{202e}"),
        "{out}"
    );
    // A file name with ESC, refused for its content: the error line quotes it escaped.
    let (code, out2, err2) = plan_config("x\u{1b}[2Jy.json", &config("LlamaForCausalLM", 0));
    assert_eq!(code, 1, "{err2}");
    assert!(err2.contains("x\\u{1b}[2Jy.json"), "{err2}");
    for text in [&out, &err, &out2, &err2] {
        assert!(
            !text.contains(['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}']),
            "{text:?}"
        );
    }
}

/// A `--model` path that is a link leading nowhere (dangling, or a loop of links) is a path
/// whose reading fails naming it (exit 1), not an unknown preset name (exit 2).
#[test]
fn a_model_link_that_leads_nowhere_is_named_as_a_path() {
    let dangling = tmp("dangling-config.json");
    let _ = std::fs::remove_file(&dangling);
    std::os::unix::fs::symlink(tmp("no-such-target.json"), &dangling).unwrap();
    let (a, b) = (tmp("loop-a"), tmp("loop-b"));
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    for link in [&dangling, &a] {
        let p = link.to_str().unwrap();
        let (code, err) = run(&["plan", "--model", p, "--device", "sim:h100-80gb"]);
        assert_eq!(code, 1, "{p}: {err}");
        assert!(
            err.contains(p) && !err.contains("neither a path nor a shipped preset"),
            "{p}: {err}"
        );
    }
}

/// A config that starts with a UTF-8 byte-order mark is refused saying so, not as "expected
/// value at line 1 column 1".
#[test]
fn a_config_with_a_byte_order_mark_is_refused_naming_it() {
    let (code, _, err) = plan_config(
        "bom-config.json",
        "\u{feff}{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64}",
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("bom-config.json") && err.contains("byte-order mark"),
        "{err}"
    );
}

/// A scenario value of the wrong type or range for TOML (a negative layer count, a head size
/// past 32 bits) is one line naming the file, its line and column and the key path, in
/// words rather than a Rust type; a scenario link that leads nowhere is named as a file.
#[test]
fn a_scenario_type_error_is_one_line_naming_the_key() {
    for (from, to, key, line) in [
        ("layers = 28", "layers = -28", "kv.layers", "line 19"),
        (
            "head_dim = 128",
            "head_dim = 4294967296",
            "kv.head_dim",
            "line 21",
        ),
    ] {
        let path = scenario_with("typed.toml", from, to);
        let (code, out, err) = run_out(&["simulate", "--scenario", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(out.is_empty(), "{out}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("typed.toml") && err.contains(key) && err.contains(line),
            "{err}"
        );
        assert!(
            err.contains("whole number") && !err.contains("u32"),
            "{err}"
        );
    }
    let link = tmp("dangling-scenario.toml");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(tmp("no-such-scenario.toml"), &link).unwrap();
    let p = link.to_str().unwrap();
    let (code, err) = run(&["simulate", "--scenario", p]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(p) && !err.contains("neither a shipped scenario"),
        "{err}"
    );
}

/// A log whose start-up had 0 bytes for its KV cache (printed `0.00 GiB`, or a figure that
/// rounds to no byte) is the same failed start-up as a negative one: the figure is left out
/// with a note, never planned as a `--kv-cache-memory-bytes` of 0 the user did not pass.
#[test]
fn a_log_with_no_kv_memory_is_planned_as_a_failed_start_up() {
    for (name, figure) in [("kv-zero.log", "0.00"), ("kv-tiny.log", "1e-320")] {
        let text = format!(
            "INFO 05-12 11:29:29 [core.py:103] Initializing a V1 LLM engine (v0.18.0) with config: model='Qwen/Qwen3-8B', dtype=torch.bfloat16, max_seq_len=40960, tensor_parallel_size=1\n\
             INFO 05-12 11:34:57 [gpu_model_runner.py:2599] Model loading took 15.2859 GiB memory\n\
             INFO 05-12 11:35:44 [gpu_worker.py:357] Available KV cache memory: {figure} GiB\n"
        );
        let (code, out, err) = plan_log(name, &text, "qwen3-8b", &["--total-memory", "80GiB"]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(out.contains("no room for a KV cache"), "{name}: {out}");
        assert!(!err.contains("--kv-cache-memory-bytes"), "{name}: {err}");
    }
}
