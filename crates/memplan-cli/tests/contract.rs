//! The output contract, checked on the built binary: exit codes, JSON outputs validated
//! against the schemas in docs/schemas/, errors as JSON under `--json`, quiet endings on a
//! closed or full stdout, no escape codes on a redirected stderr, help with examples,
//! completions.

use std::io::Read;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn memplan() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memplan"));
    c.env_remove("MEMPLAN_LOG")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    c
}

fn run(args: &[&str]) -> Output {
    memplan().args(args).output().expect("the binary runs")
}

fn schema(kind: &str) -> jsonschema::Validator {
    let path = format!(
        "{}/../../docs/schemas/{kind}.schema.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    jsonschema::validator_for(&v).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Run, expect `code`, parse stdout as one JSON object and validate it against its schema.
fn json_of(args: &[&str], code: i32, kind: &str) -> Value {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON value ({e}): {stderr}"));
    assert_eq!(v["schema"], format!("memplan.{kind}/1"), "{args:?}: {v}");
    let errors: Vec<String> = schema(kind)
        .iter_errors(&v)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{args:?} does not match {kind}: {errors:#?}\n{v}"
    );
    v
}

#[test]
fn every_json_output_matches_its_schema() {
    json_of(&["devices", "--json"], 0, "devices");
    // --help and --version under --json: the same text in one object, not bare text.
    for args in [
        &["--help", "--json"][..],
        &["plan", "--help", "--json"],
        &["simulate", "--json", "-h"],
        &["--version", "--json"],
    ] {
        let h = json_of(args, 0, "help");
        assert!(h["text"].as_str().unwrap().contains("memplan"), "{h}");
    }
    json_of(&["probe", "sim:rtx4090", "--json"], 0, "probe");
    json_of(&["probe", "sim:strix-halo", "--json"], 0, "probe");
    let p = json_of(
        &[
            "plan",
            "--model",
            "qwen2.5-1.5b-instruct",
            "--device",
            "sim:rtx4090",
            "--json",
        ],
        0,
        "plan",
    );
    assert!(p["kv_cache_tokens"].as_u64().unwrap() > 0);
    json_of(
        &[
            "plan",
            "--model",
            "qwen3-8b",
            "--total-memory",
            "80GiB",
            "--tp",
            "2",
            "--kv-cache-dtype",
            "fp8",
            "--json",
        ],
        0,
        "plan",
    );
    json_of(&["simulate", "--list", "--json"], 0, "scenarios");
    json_of(
        &["simulate", "--scenario", "fp8-24g", "--json"],
        0,
        "simulate",
    );
}

#[test]
fn failures_under_json_are_one_error_object() {
    // (args, exit code, kind)
    let cases: &[(&[&str], i32, &str)] = &[
        (&["plan", "--model", "nope", "--json"], 2, "usage"),
        (&["plan", "--model", "qwen3-8b", "--json"], 2, "usage"),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "24GiB",
                "--max-model-len",
                "100000000",
                "--json",
            ],
            1,
            "does_not_fit",
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "24GiB",
                "--gpu-memory-utilization",
                "NaN",
                "--json",
            ],
            2,
            "usage",
        ),
        (
            &[
                "plan", "--model", "qwen3-8b", "--device", "sim:nope", "--json",
            ],
            2,
            "unknown_device",
        ),
        (
            &[
                "plan",
                "--model",
                "/dev/zero",
                "--total-memory",
                "24GiB",
                "--json",
            ],
            1,
            "invalid_file",
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "80GiB",
                "--block-size",
                "7",
                "--emit-args",
                "vllm",
                "--json",
            ],
            2,
            "usage",
        ),
        (
            &["simulate", "--scenario", "no-such-scenario", "--json"],
            2,
            "usage",
        ),
        (
            &[
                "simulate",
                "--scenario",
                "fp8-24g",
                "--strategy",
                "bogus",
                "--json",
            ],
            2,
            "usage",
        ),
        (&["probe", "--json"], 2, "usage"),
        (&["bogus", "--json"], 2, "usage"),
    ];
    for (args, code, kind) in cases {
        let v = json_of(args, *code, "error");
        assert_eq!(v["error"]["kind"], *kind, "{args:?}: {v}");
        assert_eq!(v["error"]["exit_code"], *code, "{args:?}: {v}");
    }
    let v = json_of(
        &[
            "plan",
            "--model",
            "qwen3-8b",
            "--total-memory",
            "24GiB",
            "--max-model-len",
            "100000000",
            "--json",
        ],
        1,
        "error",
    );
    assert!(
        v["error"]["help"]["max_model_len_fit"].as_u64().unwrap() > 1000,
        "{v}"
    );
    // Without --emit-args, the plan's JSON says which engine would refuse it (null).
    let v = json_of(
        &[
            "plan",
            "--model",
            "qwen3-8b",
            "--total-memory",
            "80GiB",
            "--block-size",
            "7",
            "--json",
        ],
        0,
        "plan",
    );
    assert!(
        v["engine_args"]["vllm"].is_null() && v["engine_args"]["sglang"].is_string(),
        "{v}"
    );
    let v = json_of(&["plan", "--model", "nope", "--json"], 2, "error");
    assert!(
        v["error"]["help"]["presets"].as_array().unwrap().len() > 10,
        "{v}"
    );
}

#[test]
fn exit_codes_follow_the_contract_without_json() {
    let cases: &[(&[&str], i32)] = &[
        (&["devices"], 0),
        (
            &[
                "plan",
                "--model",
                "qwen2.5-1.5b-instruct",
                "--total-memory",
                "24GiB",
            ],
            0,
        ),
        // Usage errors found by clap and found later both exit 2.
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "24GiB",
                "--max-num-seqs",
                "9223372036854775808",
            ],
            2,
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "24GiB",
                "--kv-cache-dtype",
                "fp4",
            ],
            2,
        ),
        (&["plan", "--model", "qwen3-8b"], 2),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "24GiB",
                "--tp",
                "3",
            ],
            2,
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--device",
                "sim:rtx4090,ohter=2GiB",
            ],
            2,
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "24GiB",
                "--enforce-eager",
                "--graph-bytes",
                "1GiB",
            ],
            2,
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "80GiB",
                "--kv-cache-dtype",
                "fp32",
                "--emit-args",
                "vllm",
            ],
            2,
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "80GiB",
                "--block-size",
                "7",
                "--emit-args",
                "vllm",
            ],
            2,
        ),
        (
            &[
                "plan",
                "--model",
                "qwen3-8b",
                "--total-memory",
                "80GiB",
                "--max-num-seqs",
                "4096",
                "--max-num-batched-tokens",
                "2048",
                "--emit-args",
                "vllm",
            ],
            2,
        ),
        (
            &["plan", "--model", "qwen3-8b", "--total-memory", "1GiB"],
            1,
        ),
        (&[], 2),
        (&["--help"], 0),
        (&["--version"], 0),
    ];
    for (args, code) in cases {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // `AUTO` just works; a typo of a sim modifier says which one was meant.
    let out = run(&[
        "plan",
        "--model",
        "qwen3-8b",
        "--total-memory",
        "80GiB",
        "--kv-cache-dtype",
        "AUTO",
    ]);
    assert!(out.status.success());
    let e = String::from_utf8_lossy(
        &run(&[
            "plan",
            "--model",
            "qwen3-8b",
            "--device",
            "sim:rtx4090,ohter=2GiB",
        ])
        .stderr,
    )
    .to_string();
    assert!(
        e.contains("unknown modifier `ohter`") && e.contains("did you mean `other`"),
        "{e}"
    );
}

#[test]
fn a_closed_or_full_stdout_ends_quietly() {
    let loud = ["devices"];
    // Errors only: the simulated start-ups' warnings (deferred releases, a KV cache shrunk to
    // the allocator's rounding) are logged on stderr like any run's.
    let big = [
        "simulate",
        "--scenario",
        "shared-pool",
        "--strategy",
        "all",
        "--log",
        "error",
    ];
    // `| true`: the reader is gone before anything is written.
    for args in [&loud[..], &big[..]] {
        let mut child = memplan()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?} | true: {err}");
        assert!(err.is_empty(), "{args:?} | true: {err}");
    }
    // `| head -1`: one line read, then the pipe closes.
    let mut child = memplan()
        .args(big)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    // `> /dev/full`: a failure with a message, exit 1, no panic.
    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        for args in [
            &loud[..],
            &["devices", "--json"][..],
            &["completions", "bash"][..],
        ] {
            let out = memplan()
                .args(args)
                .stdout(full.try_clone().unwrap())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?} > /dev/full: {err}");
            assert!(
                err.contains("could not write") && !err.contains("panicked"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_redirected_stderr_has_no_escape_codes() {
    for (var, val) in [("RUST_LOG", "trace"), ("MEMPLAN_LOG", "debug")] {
        let out = memplan()
            .env(var, val)
            .args([
                "plan",
                "--model",
                "qwen2.5-1.5b-instruct",
                "--device",
                "sim:rtx4090",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            !err.contains('\u{1b}'),
            "escape codes on a redirected stderr: {err}"
        );
    }
    let out = run(&[
        "plan",
        "--model",
        "qwen3-8b",
        "--total-memory",
        "24GiB",
        "--bogus",
    ]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains('\u{1b}'));
}

#[test]
fn every_subcommand_has_examples_and_completions_generate() {
    for sub in ["devices", "probe", "plan", "simulate", "completions"] {
        let out = run(&[sub, "--help"]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Examples:"), "{sub} --help: {text}");
    }
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("memplan") && text.contains("kv-cache-dtype"),
            "{shell}"
        );
    }
    assert_eq!(run(&["completions", "tcsh"]).status.code(), Some(2));
}

#[test]
fn simulate_list_describes_each_scenario() {
    let out = run(&["simulate", "--list"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let mut parts = line.splitn(2, "  ");
        let (name, desc) = (parts.next().unwrap(), parts.next().unwrap_or("").trim());
        assert!(!desc.is_empty(), "{name} has no description: {text}");
    }
}

#[test]
fn the_library_entry_returns_the_cli_json() {
    let (code, v) = memplan_cli::run_json([
        "plan",
        "--model",
        "qwen2.5-1.5b-instruct",
        "--total-memory",
        "24GiB",
    ]);
    assert_eq!(code, 0);
    assert_eq!(v["schema"], "memplan.plan/1");
    let out = run(&[
        "plan",
        "--model",
        "qwen2.5-1.5b-instruct",
        "--total-memory",
        "24GiB",
        "--json",
    ]);
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, cli, "the library and the binary print the same JSON");
    let (code, v) = memplan_cli::run_json(["plan", "--model", "nope"]);
    assert_eq!((code, v["error"]["kind"].as_str()), (2, Some("usage")));
}

#[test]
fn the_svg_has_a_background_the_headline_and_the_requested_marker() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-contract-{}.svg", std::process::id()));
    let out = run(&[
        "plan",
        "--model",
        "qwen3-8b",
        "--device",
        "sim:rtx4090",
        "--max-model-len",
        "8192",
        "--svg",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        svg.contains("<rect x=\"0\" y=\"0\" width=\"920\" height=\"200\" fill=\"#ffffff\"/>"),
        "{svg}"
    );
    assert!(
        svg.contains("tokens; max concurrency") && svg.contains("longest max-model-len"),
        "{svg}"
    );
    assert!(
        svg.contains("stroke-dasharray") && svg.contains("ends here"),
        "{svg}"
    );
    assert!(!svg.chars().any(|c| c.is_control() && c != '\n'), "{svg}");
    // A full disk for the picture is a failure (exit 1), not a panic.
    let out = run(&[
        "plan",
        "--model",
        "qwen3-8b",
        "--total-memory",
        "80GiB",
        "--svg",
        "/dev/full",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn calibrating_a_full_device_says_out_of_memory() {
    let out = run(&[
        "probe",
        "sim:rtx4090,other=23.9GiB",
        "--calibrate",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "out_of_memory", "{v}");
}

#[test]
fn rust_log_is_honoured() {
    let out = memplan()
        .env("RUST_LOG", "info")
        .args([
            "plan",
            "--model",
            "qwen2.5-1.5b-instruct",
            "--device",
            "sim:rtx4090",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("INFO") && err.contains("plan ready"), "{err}");
    // --log wins over RUST_LOG.
    let out = memplan()
        .env("RUST_LOG", "info")
        .args([
            "--log",
            "error",
            "plan",
            "--model",
            "qwen2.5-1.5b-instruct",
            "--device",
            "sim:rtx4090",
        ])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("INFO"));
}

#[test]
fn a_run_that_ends_early_gives_no_empty_reason() {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../memplan-testbed/scenarios/fp8-24g.toml"
    ))
    .unwrap();
    // Weights larger than the device: the run ends at load_weights, before any choice.
    let text = shipped.replace("weights = \"2.88GiB\"", "weights = \"30GiB\"");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-early-{}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let out = run(&["simulate", "--scenario", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{stdout}");
    assert!(
        !stdout.contains("because \n") && !stdout.trim_end().ends_with("because"),
        "{stdout}"
    );
}
