//! `memplan plan --from-log FILE` without `--model`: the model is the one the log names; a
//! log that names none or several is a usage error asking for `--model`, and a `--model`
//! that is not the log's is planned with a warning.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memplan"))
        .args(args)
        .env_remove("MEMPLAN_LOG")
        .output()
        .expect("the binary runs");
    (
        out.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tmp(name: &str, text: &str) -> PathBuf {
    // Scratch space cargo gives integration tests (inside the target directory), per process.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-from-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The corpus quote of llm-d-incubation/llm-d-planner#205 (vLLM 0.19.0, Llama-3.1-8B-Instruct
/// on an H100; its non-default args name the model).
fn llm_d_quote() -> String {
    let line = include_str!("../../memplan-model/tests/data/engine-startup-logs.jsonl")
        .lines()
        .find(|l| l.contains("476,016"))
        .unwrap();
    let e: Value = serde_json::from_str(line).unwrap();
    e["quote"].as_str().unwrap().to_string()
}

#[test]
fn a_log_that_names_its_model_needs_no_model_flag() {
    let log = tmp("llm-d.log", &llm_d_quote());
    let (code, out, err) = run(&["plan", "--from-log", log.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    let notes: Vec<&str> = j["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("model from the log: meta-llama/Llama-3.1-8B-Instruct")),
        "{notes:?}"
    );
    // The logged 476,016 tokens, within one 16-token block.
    let t = j["kv_cache_tokens"].as_u64().unwrap();
    assert!(t.abs_diff(476_016) <= 16, "{t}");
    // The same model named by its preset: no warning that the log is another model's.
    let (code, out, err) = run(&[
        "plan",
        "--model",
        "llama-3.1-8b-instruct",
        "--from-log",
        log.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("log_model_differs"), "{out}");
}

#[test]
fn another_model_than_the_logs_is_planned_with_a_warning() {
    let log = tmp("llm-d-other.log", &llm_d_quote());
    let (code, out, err) = run(&[
        "plan",
        "--model",
        "qwen3-8b",
        "--from-log",
        log.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    let w = j["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["code"] == "log_model_differs")
        .unwrap_or_else(|| panic!("{}", j["warnings"]));
    assert_eq!(w["given"], "qwen3-8b");
    assert_eq!(w["logged"], "meta-llama/Llama-3.1-8B-Instruct");
}

#[test]
fn a_log_that_names_no_model_or_several_asks_for_the_flag() {
    // vllm-project/vllm#25350 (the reporter's trimmed lines: no model named).
    let none = tmp(
        "none.log",
        "Available KV cache memory: 10.55 GiB\nGPU KV cache size: 230,528 tokens\n",
    );
    let (code, _, err) = run(&[
        "plan",
        "--from-log",
        none.to_str().unwrap(),
        "--total-memory",
        "24GiB",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("has none of them") && err.contains("pass --model"),
        "{err}"
    );
    // Two start-ups of different models pasted together.
    let two = tmp(
        "two.log",
        &format!(
            "{}\nINFO non-default args: {{'model': 'Qwen/Qwen3-8B'}}\n",
            llm_d_quote()
        ),
    );
    let (code, _, err) = run(&["plan", "--from-log", two.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("names 2 models")
            && err.contains("meta-llama/Llama-3.1-8B-Instruct, Qwen/Qwen3-8B")
            && err.contains("pass --model"),
        "{err}"
    );
    // A Hugging Face cache snapshot of another machine is its model id here (a Turing
    // fork's campaign notes, validation corpus, code index id 67109588529).
    let snapshot = tmp(
        "snapshot.log",
        "INFO 09-07 00:14:16 [api_utils.py:286] non-default args: {'dtype': 'float16', 'max_model_len': 4096, 'model': '/home/dconnolly/.cache/huggingface/hub/models--Qwen--Qwen2.5-1.5B-Instruct/snapshots/989aa7980e4cf806f80c7fef2b1adb7bc71aa306'}
         (EngineCore pid=120706) INFO 09-07 00:14:25 [gpu_worker.py:586] Available KV cache memory: 17.36 GiB
",
    );
    let (code, out, err) = run(&[
        "plan",
        "--from-log",
        snapshot.to_str().unwrap(),
        "--total-memory",
        "23.47GiB",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("its Hugging Face id Qwen/Qwen2.5-1.5B-Instruct"),
        "{out}"
    );
    // A model the log names without a config memplan can read is the log's content (exit 1,
    // naming the file and the model).
    let local = tmp(
        "local.log",
        "INFO non-default args: {'model': '/model', 'max_model_len': 4096}
         Available KV cache memory: 10.55 GiB
",
    );
    let (code, _, err) = run(&[
        "plan",
        "--from-log",
        local.to_str().unwrap(),
        "--total-memory",
        "24GiB",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("local.log") && err.contains("/model"), "{err}");
    // Without --from-log, --model is required as before.
    let (code, _, err) = run(&["plan", "--total-memory", "24GiB"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--model"), "{err}");
}
