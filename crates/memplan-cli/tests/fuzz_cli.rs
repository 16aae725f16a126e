//! A fuzz and property layer for the command line itself: the built binary runs on generated
//! argument vectors, generated model directories (config.json, safetensors, index) and
//! generated scenario files, and every run must
//!
//! - exit 0, 1 or 2 (never a panic's 101, never a signal),
//! - print no panic text,
//! - end within 10 s, under a 4 GiB address-space limit (`ulimit -v`),
//! - under `--json`, print exactly one JSON object with a `schema` key,
//! - name, in a usage error about a value clap refused, the flag as the user typed it;
//! - for model files (GGUF of every class the reader refuses, a Hugging Face cache whose
//!   entries lead out of it, to FIFOs and devices), exit 1 for a file's fault, never 2; for
//!   start-up logs with hostile figures, never blame a flag the user did not pass.
//!
//! Deterministic (a fixed seed; `MEMPLAN_FUZZ_SEED` picks another, `MEMPLAN_FUZZ_SCALE=N`
//! runs N times as many cases). Default cost in CI: 240 argument vectors, 80 model
//! directories, 16 scenarios, 38 model files and cache entries, 24 logs, about 25 s on 2
//! cores with the debug binary.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// splitmix64: small, deterministic, good enough to pick cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T: ?Sized>(&mut self, xs: &[&'a T]) -> &'a T {
        xs[self.below(xs.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "7",
    "16",
    "256",
    "4096",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-0",
    "NaN",
    "inf",
    "0.5",
    "1.0000001",
    "",
    " ",
    "0x10",
    "1_000",
    "12abc",
    "\u{1}",
    "😀",
];
const BYTES: &[&str] = &[
    "24GiB",
    "79.19GiB",
    "1",
    "0",
    "-1GiB",
    "2PiB",
    "20000TiB",
    "1e3GiB",
    "1.5",
    "NaN GiB",
    "18446744073709551615",
    "512MiB",
    "1TB",
    "99999999999999999999",
    "GiB",
    "1 parsec",
];
const DEVICES: &[&str] = &[
    "sim:rtx4090",
    "sim:h100-80gb",
    "sim:strix-halo",
    "sim:arc-a770,declare-exact",
    "sim:rtx4090,other=4GiB",
    "sim:rtx4090,ohter=2GiB",
    "sim:rtx4090,other=-1",
    "sim:rtx4090,stale-free=maybe",
    "sim:nope",
    "sim:",
    "cuda:0",
    "rocm:3",
    "xpu:0",
    "nonsense:0",
    "sim:rtx4090,hidden-bytes-per-capture=18446744073709551615",
    "",
    "sim:rtx4090\u{7}<svg>",
    ":::",
];
const MODELS: &[&str] = &[
    "qwen2.5-0.5b-instruct",
    "qwen3-8b",
    "gpt-oss-20b",
    "gemma-3-27b-it",
    "phi-2",
    "nope",
    "/dev/zero",
    "/dev/null",
    "/",
    "/etc",
    "",
    "QWEN3-8B",
];
const DTYPES: &[&str] = &[
    "auto", "AUTO", "bf16", "fp8", "FP8_E5M2", "int8", "fp32", "fp4", "float16", "",
];
const FLAGS: &[&str] = &[
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--tp",
    "--cudagraph-capture-sizes",
    "--weights-bytes",
    "--activation-bytes",
    "--non-torch-bytes",
    "--graph-bytes",
    "--dtype",
    "--kv-cache-dtype",
    "--mamba-cache-dtype",
    "--mamba-ssm-cache-dtype",
    "--quantization",
    "--graph-strategy",
    "--emit-args",
    "--enforce-eager",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--json",
    "--total-memory",
    "--device",
    "--svg",
    "--bogus",
    "--",
    "--pp",
    "--speculative-model",
    "--num-speculative-tokens",
    "--max-loras",
    "--max-lora-rank",
    "--cpu-offload-gb",
    "--engine",
    "--help",
];

fn scale() -> usize {
    std::env::var("MEMPLAN_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn seed() -> u64 {
    std::env::var("MEMPLAN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x006d_656d_706c_616e)
}

fn value_for(flag: &str, r: &mut Rng, dir: &Path) -> String {
    match flag {
        "--gpu-memory-utilization"
        | "--max-model-len"
        | "--max-num-seqs"
        | "--max-num-batched-tokens"
        | "--block-size"
        | "--tp"
        | "--pp"
        | "--num-speculative-tokens"
        | "--max-loras"
        | "--max-lora-rank"
        | "--cpu-offload-gb" => {
            if r.chance(50) {
                r.pick(NUMBERS).to_string()
            } else {
                (1 + r.below(70_000)).to_string()
            }
        }
        "--cudagraph-capture-sizes" => (0..1 + r.below(6))
            .map(|_| r.pick(NUMBERS).to_string())
            .collect::<Vec<_>>()
            .join(","),
        "--dtype" | "--kv-cache-dtype" | "--mamba-cache-dtype" | "--mamba-ssm-cache-dtype" => {
            r.pick(DTYPES).to_string()
        }
        "--quantization" => r.pick(&["fp8", "none", "awq", "FP8", ""]).to_string(),
        "--graph-strategy" => r
            .pick(&["auto", "none", "full", "vllm-legacy", "bogus"])
            .to_string(),
        "--emit-args" | "--engine" => r
            .pick(&[
                "vllm",
                "sglang",
                "tensorrt",
                "vllm@0.19",
                "vllm@0.34.1",
                "vllm@0.35",
                "sglang@0.5.23",
                "vllm@",
                "vllm@99999999999999999999.1",
                "VLLM@0.27.1",
            ])
            .to_string(),
        "--speculative-model" => r.pick(MODELS).to_string(),
        "--device" => r.pick(DEVICES).to_string(),
        "--svg" => dir.join("out.svg").display().to_string(),
        _ => r.pick(BYTES).to_string(),
    }
}

fn argv(r: &mut Rng, dir: &Path) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    match r.below(10) {
        0 => a.push(
            r.pick(&["devices", "probe", "completions", "help", "bogus", ""])
                .to_string(),
        ),
        1 => {
            a.push("probe".into());
            a.push(r.pick(DEVICES).to_string());
        }
        2 => {
            a.push("simulate".into());
            for _ in 0..r.below(4) {
                a.push(
                    r.pick(&[
                        "--list",
                        "--json",
                        "--scenario",
                        "--strategy",
                        "fp8-24g",
                        "all",
                        "bogus",
                        "/dev/zero",
                    ])
                    .to_string(),
                );
            }
        }
        _ => {
            a.push("plan".into());
            if r.chance(90) {
                a.push("--model".into());
                a.push(r.pick(MODELS).to_string());
            }
            if r.chance(70) {
                a.push("--total-memory".into());
                a.push(r.pick(BYTES).to_string());
            } else if r.chance(80) {
                a.push("--device".into());
                a.push(r.pick(DEVICES).to_string());
            }
            for _ in 0..r.below(6) {
                let f = r.pick(FLAGS);
                a.push(f.to_string());
                if !matches!(
                    f,
                    "--enforce-eager"
                        | "--enable-prefix-caching"
                        | "--no-enable-prefix-caching"
                        | "--json"
                        | "--bogus"
                        | "--"
                        | "--help"
                ) {
                    a.push(value_for(f, r, dir));
                }
            }
        }
    }
    if r.chance(40) {
        a.push("--json".into());
    }
    a
}

/// A model directory: a preset's config with hostile edits, maybe a safetensors file and an
/// index that lie.
fn model_dir(r: &mut Rng, dir: &Path, presets: &[Value]) -> PathBuf {
    let d = dir.join(format!("m{}", r.next() % 1_000_000));
    std::fs::create_dir_all(&d).unwrap();
    let mut cfg = presets[r.below(presets.len())].clone();
    let hostile = [
        Value::from(-8),
        Value::from(0),
        Value::from(1u64 << 50),
        Value::from(u64::MAX),
        Value::from(1e300),
        Value::from(-1.5),
        Value::from("8"),
        Value::Null,
        Value::Bool(true),
        serde_json::json!([1, 2]),
        serde_json::json!({}),
    ];
    if let Some(obj) = cfg.as_object_mut() {
        let keys: Vec<String> = obj.keys().cloned().collect();
        for _ in 0..1 + r.below(3) {
            let k = &keys[r.below(keys.len())];
            if r.chance(20) {
                obj.remove(k);
            } else {
                obj.insert(k.clone(), hostile[r.below(hostile.len())].clone());
            }
        }
        if r.chance(30) {
            let q = serde_json::json!([
                {"quant_method": "gptq", "bits": "8", "group_size": 128},
                {"quant_method": "gptq", "bits": hostile[r.below(hostile.len())], "group_size": hostile[r.below(hostile.len())]},
                {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": -8, "type": "int"}}}},
                {"quant_method": "awq", "bits": 4, "group_size": 0},
                {"quant_method": 7},
            ])[r.below(5)]
            .clone();
            obj.insert("quantization_config".into(), q);
        }
        if r.chance(20) {
            obj.insert("num_experts_per_tok".into(), Value::from(1 + r.below(300)));
            obj.insert("num_local_experts".into(), Value::from(r.below(16)));
        }
    }
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    if r.chance(40) {
        let n = 1 + r.below(1 << 12) as u64;
        let h = format!(
            r#"{{"model.embed_tokens.weight":{{"dtype":"BF16","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
            2 * n
        );
        let mut f = (h.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(h.as_bytes());
        let data = match r.below(4) {
            0 => 2 * n as usize,
            1 => r.below(2 * n as usize),
            2 => 2 * n as usize + 1 + r.below(9),
            _ => 0,
        };
        f.resize(f.len() + data, 0);
        if r.chance(10) {
            f.truncate(r.below(f.len()));
        }
        std::fs::write(d.join("model.safetensors"), f).unwrap();
    }
    if r.chance(15) {
        let target = r.pick(&[
            "model.safetensors",
            "../x.safetensors",
            "/dev/zero",
            "nope.safetensors",
            "",
        ]);
        std::fs::write(
            d.join("model.safetensors.index.json"),
            format!(r#"{{"weight_map":{{"w":{target:?}}}}}"#),
        )
        .unwrap();
    }
    d
}

/// A shipped scenario with hostile edits to its numbers.
fn scenario(r: &mut Rng, dir: &Path, shipped: &[String]) -> PathBuf {
    let text = &shipped[r.below(shipped.len())];
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for _ in 0..1 + r.below(3) {
        let i = r.below(lines.len());
        if let Some((k, _)) = lines[i].split_once('=') {
            let v = r.pick(&[
                "0",
                "-1",
                "4294967295",
                "18446744073709551615",
                "1e309",
                "nan",
                "\"2PiB\"",
                "\"-3MiB\"",
                "[1, 1, 1, 0]",
                "[4294967295]",
                "true",
                "\"\"",
                "0.0",
                "1.5",
            ]);
            lines[i] = format!("{k}= {v}");
        }
    }
    let p = dir.join(format!("s{}.toml", r.next() % 1_000_000));
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

/// Run one case and check the properties; returns a description on violation.
fn check(args: &[String]) -> Result<i32, String> {
    check_with(args, &[]).map(|(code, _)| code)
}

/// [`check`] with environment variables set (`HF_HUB_CACHE`); the exit code and stderr.
fn check_with(args: &[String], env: &[(&str, String)]) -> Result<(i32, String), String> {
    let json = args
        .iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    let bin = env!("CARGO_BIN_EXE_memplan");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4194304 2>/dev/null; exec \"$0\" \"$@\"")
        .arg(bin)
        .args(args)
        .env_remove("MEMPLAN_LOG")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut o = Vec::new();
        let _ = out.read_to_end(&mut o);
        o
    });
    let ereader = std::thread::spawn(move || {
        let mut e = Vec::new();
        let _ = err.read_to_end(&mut e);
        e
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{args:?}: still running after 10 s"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&ereader.join().unwrap()).to_string();
    let code = status.code();
    if !matches!(code, Some(0..=2)) {
        return Err(format!("{args:?}: exit {status}: {stderr}"));
    }
    if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
        return Err(format!("{args:?}: panic: {stderr}"));
    }
    // A value clap refused names the flag as the user typed it (an alias stays an alias).
    if let Some(flag) = stderr
        .split("for '")
        .nth(1)
        .and_then(|r| r.split([' ', '\'']).next())
        .filter(|f| f.starts_with("--") && code == Some(2))
    {
        let typed = args
            .iter()
            .take_while(|a| *a != "--")
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        if !typed {
            return Err(format!(
                "{args:?}: the usage error names {flag}, which was not passed: {stderr}"
            ));
        }
    }
    // Completions print a script even beside --json; everything else prints JSON (`--help`
    // and `--version` a `memplan.help/1` object).
    let text_only = args.iter().any(|a| a == "completions");
    if json && (code != Some(0) || !text_only) {
        match serde_json::from_slice::<Value>(&stdout) {
            Ok(Value::Object(m)) if m.get("schema").is_some_and(Value::is_string) => {}
            _ if code == Some(0) && stdout.is_empty() => {}
            _ => {
                return Err(format!(
                    "{args:?}: exit {code:?} under --json without one JSON object: {}\n{stderr}",
                    String::from_utf8_lossy(&stdout)
                ))
            }
        }
    }
    Ok((code.unwrap_or(-1), stderr))
}

/// Run every case on two threads; returns how many exited 0, 1 and 2.
fn run_all(name: &str, cases: Vec<Vec<String>>) -> [usize; 3] {
    let n = cases.len();
    let start = Instant::now();
    let cases = std::sync::Arc::new(std::sync::Mutex::new(cases));
    let failures = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let codes = std::sync::Arc::new(std::sync::Mutex::new([0usize; 3]));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (cases, failures, codes) = (cases.clone(), failures.clone(), codes.clone());
            std::thread::spawn(move || loop {
                let Some(c) = cases.lock().unwrap().pop() else {
                    break;
                };
                match check(&c) {
                    Ok(code) => codes.lock().unwrap()[code as usize] += 1,
                    Err(e) => failures.lock().unwrap().push(e),
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let f = failures.lock().unwrap();
    assert!(f.is_empty(), "{} violation(s):\n{}", f.len(), f.join("\n"));
    let c = *codes.lock().unwrap();
    eprintln!(
        "{name}: {n} cases in {:.1} s: {} exit 0, {} exit 1, {} exit 2",
        start.elapsed().as_secs_f64(),
        c[0],
        c[1],
        c[2]
    );
    c
}

fn tmp(name: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn generated_argument_vectors() {
    let dir = tmp("argv");
    let mut r = Rng(seed());
    let cases = (0..240 * scale()).map(|_| argv(&mut r, &dir)).collect();
    let c = run_all("argv", cases);
    // Not vacuous: the generator reaches success, failures and usage errors.
    assert!(c.iter().all(|n| *n > 0), "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generated_model_directories() {
    let dir = tmp("models");
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../memplan-model/models/model-configs.jsonl");
    let presets: Vec<Value> = std::fs::read_to_string(&root)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v.get("config").cloned())
        .collect();
    let mut r = Rng(seed() ^ 1);
    let cases = (0..80 * scale())
        .map(|_| {
            let d = model_dir(&mut r, &dir, &presets);
            let mut a = vec![
                "plan".to_string(),
                "--model".into(),
                d.display().to_string(),
                "--total-memory".into(),
                "80GiB".into(),
            ];
            if r.chance(50) {
                a.push("--json".into());
            }
            if r.chance(30) {
                a.push("--emit-args".into());
                a.push(r.pick(&["vllm", "sglang"]).to_string());
            }
            a
        })
        .collect();
    let c = run_all("model directories", cases);
    assert!(c[0] > 0 && c[1] > 0, "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// GGUF files of every class the reader refuses, and well-formed ones with extreme heads.
fn gguf_files(r: &mut Rng, dir: &Path) -> Vec<PathBuf> {
    use memplan_model::gguf::Builder;
    let good = |kv: u32, key: u32| {
        Builder::new("llama")
            .u32("llama.block_count", 2)
            .u32("llama.embedding_length", 256)
            .u32("llama.attention.head_count", 4)
            .u32("llama.attention.head_count_kv", kv)
            .u32("llama.attention.key_length", key)
            .u32("llama.feed_forward_length", 512)
            .u32("llama.context_length", 4096)
            .u32("llama.vocab_size", 1000)
            .tensor("token_embd.weight", &[256, 1000], 8)
            .tensor("blk.0.attn_q.weight", &[256, 256], 8)
            .tensor("blk.1.attn_q.weight", &[256, 256], 12)
            .tensor("output.weight", &[256, 1000], 14)
    };
    let mut files = Vec::new();
    let mut put = |name: String, bytes: Vec<u8>| {
        let p = dir.join(format!("{name}.gguf"));
        std::fs::write(&p, bytes).unwrap();
        files.push(p);
    };
    put("good".into(), good(2, 64).bytes());
    for (kv, key) in [(u32::MAX, u32::MAX), (1 << 20, 1 << 20), (8, u32::MAX)] {
        put(format!("heads{kv}-{key}"), good(kv, key).bytes());
    }
    for a in [0, 3, 48, u32::MAX] {
        put(format!("align{a}"), good(2, 64).alignment(a).bytes());
    }
    put(
        "dup".into(),
        good(2, 64).tensor("blk.0.attn_q.weight", &[256], 0).bytes(),
    );
    put(
        "offsets".into(),
        good(2, 64).offsets(vec![0, 0, 1 << 40, 7]).bytes(),
    );
    let whole = good(2, 64).bytes();
    for _ in 0..4 {
        let cut = r.below(whole.len());
        put(format!("cut{cut}"), whole[..cut].to_vec());
    }
    let dir_named = dir.join("dir.gguf");
    std::fs::create_dir_all(&dir_named).unwrap();
    std::fs::write(dir_named.join("config.json"), "{}").unwrap();
    files.push(dir_named);
    let zero = dir.join("zero.gguf");
    let _ = std::os::unix::fs::symlink("/dev/zero", &zero);
    files.push(zero);
    files
}

/// A Hugging Face cache whose entries `Org/E0..` are each hostile in one way (`Org/Good` is
/// not); returns the cache and the ids.
fn hostile_cache(dir: &Path) -> (PathBuf, Vec<String>) {
    const C: &str = "0123abcd0123abcd0123abcd0123abcd0123abcd";
    let hub = dir.join("hub");
    let outside = dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(
        outside.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":56,"num_hidden_layers":2,"num_attention_heads":7,"num_key_value_heads":7,"vocab_size":100,"max_position_embeddings":256}"#,
    )
    .unwrap();
    let fifo = outside.join("fifo");
    let has_fifo = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let entry = |name: &str| {
        let repo = hub.join(format!("models--Org--{name}"));
        let snap = repo.join("snapshots").join(C);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), C).unwrap();
        std::fs::write(
            snap.join("config.json"),
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"max_position_embeddings":256}"#,
        )
        .unwrap();
        repo
    };
    let link = |target: &Path, at: &Path| {
        let _ = std::fs::remove_file(at);
        let _ = std::fs::remove_dir_all(at);
        std::os::unix::fs::symlink(target, at).unwrap();
    };
    entry("Good");
    let mut ids = Vec::new();
    let mut add = |name: &str| {
        ids.push(format!("Org/{name}"));
        entry(name)
    };
    for (i, r) in ["../../../outside", "/etc", "", "main", "0123/abcd"]
        .iter()
        .enumerate()
    {
        let repo = add(&format!("Ref{i}"));
        std::fs::write(repo.join("refs/main"), r).unwrap();
    }
    let repo = add("RefZero");
    link(Path::new("/dev/zero"), &repo.join("refs/main"));
    if has_fifo {
        let repo = add("RefFifo");
        link(&fifo, &repo.join("refs/main"));
        let repo = add("ConfigFifo");
        link(&fifo, &repo.join("snapshots").join(C).join("config.json"));
    }
    let repo = add("ConfigOut");
    link(
        &outside.join("config.json"),
        &repo.join("snapshots").join(C).join("config.json"),
    );
    let repo = add("SnapOut");
    link(&outside, &repo.join("snapshots").join(C));
    (hub, ids)
}

/// Arguments, environment, the exit code expected (`None`: any but 2).
type Case = (Vec<String>, Vec<(&'static str, String)>, Option<i32>);

#[test]
fn generated_model_files_and_caches() {
    let dir = tmp("files");
    let mut r = Rng(seed() ^ 3);
    let mut cases: Vec<Case> = Vec::new();
    // GGUF: a file's content is never a usage error.
    for f in gguf_files(&mut r, &dir) {
        let mut a = vec![
            "plan".to_string(),
            "--model".into(),
            f.display().to_string(),
            "--total-memory".into(),
            "24GiB".into(),
        ];
        if r.chance(50) {
            a.push("--json".into());
        }
        cases.push((a, vec![], None));
    }
    // The Hugging Face cache: every hostile entry is the file's fault (exit 1), as --model
    // and as --speculative-model; the good one plans.
    let (hub, ids) = hostile_cache(&dir);
    let env = vec![("HF_HUB_CACHE", hub.display().to_string())];
    let plan = |flag: &str, id: &str| -> Vec<String> {
        let mut a = vec!["plan".to_string(), "--total-memory".into(), "24GiB".into()];
        if flag == "--model" {
            a.extend(["--model".into(), id.to_string()]);
        } else {
            a.extend([
                "--model".into(),
                "qwen2.5-0.5b-instruct".into(),
                flag.to_string(),
                id.to_string(),
            ]);
        }
        a
    };
    for flag in ["--model", "--speculative-model"] {
        cases.push((plan(flag, "Org/Good"), env.clone(), Some(0)));
        for id in &ids {
            cases.push((plan(flag, id), env.clone(), Some(1)));
        }
    }
    // Start-up logs with hostile figures: bad content names the file (exit 1); a usage error
    // may only name a flag that was passed.
    let logs = include_str!("../../memplan-model/tests/data/engine-startup-logs.jsonl");
    let quotes: Vec<String> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["quote"].as_str().map(str::to_string))
        .filter(|q| !q.is_empty())
        .collect();
    let mut log_cases = Vec::new();
    for i in 0..24 * scale() {
        let q = &quotes[r.below(quotes.len())];
        let mut words: Vec<String> = q.split(' ').map(str::to_string).collect();
        for _ in 0..1 + r.below(3) {
            let at = r.below(words.len());
            if words[at].chars().any(|c| c.is_ascii_digit()) {
                words[at] = r.pick(NUMBERS).to_string();
            }
        }
        let f = dir.join(format!("log{i}.txt"));
        std::fs::write(&f, words.join(" ")).unwrap();
        let mut a = vec![
            "plan".to_string(),
            "--model".into(),
            "qwen3-8b".into(),
            "--from-log".into(),
            f.display().to_string(),
        ];
        if r.chance(50) {
            a.extend(["--total-memory".into(), "80GiB".into()]);
        }
        log_cases.push(a);
    }
    let n = cases.len() + log_cases.len();
    let start = Instant::now();
    let mut failures = Vec::new();
    for (args, env, want) in &cases {
        match check_with(args, env) {
            Ok((code, _)) if want.is_some_and(|w| w != code) => failures.push(format!(
                "{args:?}: exit {code}, expected {}",
                want.unwrap_or_default()
            )),
            Ok((2, _)) if want.is_none() => failures.push(format!(
                "{args:?}: a file's content was a usage error (exit 2)"
            )),
            Ok(_) => {}
            Err(e) => failures.push(e),
        }
    }
    for args in &log_cases {
        match check_with(args, &[]) {
            Ok((2, stderr)) => {
                let named = stderr
                    .trim_start_matches("memplan: error: ")
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .to_string();
                // Naming a flag to add ("pass a device ... or --total-memory") is the hint a
                // missing figure needs; blaming a flag nobody passed for a value is the fault.
                let hint = stderr.contains("pass a") || stderr.contains("pass --");
                if named.starts_with("--") && !args.contains(&named) && !hint {
                    failures.push(format!(
                        "{args:?}: the usage error names {named}, which was not passed: {stderr}"
                    ));
                }
            }
            Ok(_) => {}
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} violation(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "model files and caches: {n} cases in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generated_scenarios() {
    let dir = tmp("scenarios");
    let sdir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../memplan-testbed/scenarios");
    let shipped: Vec<String> = std::fs::read_dir(&sdir)
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    let mut r = Rng(seed() ^ 2);
    let cases = (0..16 * scale())
        .map(|_| {
            let p = scenario(&mut r, &dir, &shipped);
            let mut a = vec![
                "simulate".to_string(),
                "--scenario".into(),
                p.display().to_string(),
            ];
            if r.chance(50) {
                a.push("--json".into());
            }
            a
        })
        .collect();
    let c = run_all("scenarios", cases);
    assert!(c[1] > 0, "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
