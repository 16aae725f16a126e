//! Hostile inputs an outside battery found getting through (each case failed before its fix):
//! the built binary must refuse them with the documented exit code and a message that names
//! the file, line, key or device at fault, never a flag the user did not pass.

use std::path::PathBuf;
use std::process::Command;

/// Exit code and stderr of `memplan ARGS`.
fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memplan"))
        .args(args)
        .env_remove("MEMPLAN_LOG")
        .env_remove("RUST_LOG")
        .output()
        .expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    (out.status.code().expect("exited, not killed"), err)
}

fn tmp(name: &str) -> PathBuf {
    // Scratch space cargo gives integration tests (inside the target directory), per process.
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A figure the log prints as `NaN` or `inf` with its unit written on is refused naming the
/// line, not skipped (which let a total derived from other lines stand in for it).
#[test]
fn a_log_figure_of_nan_with_its_unit_is_refused() {
    for (name, value) in [("nan.log", "NaNGiB"), ("inf.log", "infGiB")] {
        let log = tmp(name);
        std::fs::write(
            &log,
            format!(
                "[v1/worker/gpu_worker.py:284] worker init memory snapshot: torch_peak=0.0GiB, \
                 free_memory=78.68GiB, total_memory={value}, cuda_memory=0.51GiB\n\
                 [v1/worker/gpu_model_runner.py:4820] Model loading took 14.99 GiB memory\n\
                 [v1/worker/gpu_worker.py:436] Available KV cache memory: 58.11 GiB\n\
                 [v1/core/kv_cache_utils.py:1319] GPU KV cache size: 476,016 tokens\n"
            ),
        )
        .unwrap();
        let (code, err) = run(&[
            "plan",
            "--model",
            "llama-3.1-8b-instruct",
            "--from-log",
            log.to_str().unwrap(),
        ]);
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

/// Config dimensions each within range whose product is not are the file's fault (exit 1,
/// the file and the key named), not a usage error naming no file.
#[test]
fn config_dimensions_that_do_not_compute_name_the_file() {
    let cfg = tmp("big-hidden.json");
    std::fs::write(
        &cfg,
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":1000000000000,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
        "intermediate_size":14336,"vocab_size":128256,"torch_dtype":"bfloat16"}"#,
    )
    .unwrap();
    let (code, err) = run(&[
        "plan",
        "--model",
        cfg.to_str().unwrap(),
        "--device",
        "sim:h100-80gb",
    ]);
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
    let cfg = tmp("nan-layers.json");
    std::fs::write(
        &cfg,
        "{\"architectures\":[\"LlavaForConditionalGeneration\"],\"model_type\":\"llava\",\n\
         \"text_config\":{\"hidden_size\":4096,\n\"num_hidden_layers\":NaN}}",
    )
    .unwrap();
    let (code, err) = run(&[
        "plan",
        "--model",
        cfg.to_str().unwrap(),
        "--device",
        "sim:h100-80gb",
    ]);
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
