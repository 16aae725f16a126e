//! `memplan plan`: a dry run before launching the engine. Will this model fit, how many KV
//! tokens and concurrent requests will it get, and which engine flags pin that budget?
//!
//! The device's total (and free memory, for the start-up check) come from the device, real or
//! simulated, or from `--total-memory`. Figures the user measured in an earlier start-up
//! (`--weights-bytes`, ...) replace the estimates; every byte flag takes plain bytes or units.

mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use memplan::bytes::parse_bytes;
use memplan::kv::KvDtype;
use memplan::{DriverMemory, Error, MemoryInfo};
use memplan_model::dryrun::{self, GraphReserve, Measured, PlanInput};
use memplan_model::engine::{EngineKind, EngineRules};
use memplan_model::{Model, Quantization};
use memplan_planner::budget::Request;

fn bytes(flag: &'static str) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s| parse_bytes(flag, s).map_err(|e| e.to_string())
}

/// Engines whose flags `--emit-args` can print.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Engine {
    /// vLLM (`--kv-cache-memory-bytes`, `--max-model-len`, ...).
    Vllm,
    /// SGLang (`--max-total-tokens`, `--mem-fraction-static`, ...).
    Sglang,
}

/// `--emit-args vllm[@VERSION]`: the same spelling as `--engine`.
fn emit_engine(s: &str) -> Result<(Engine, String), String> {
    let rules: EngineRules = s.parse().map_err(|e: Error| e.to_string())?;
    let kind = match rules.kind {
        EngineKind::Vllm => Engine::Vllm,
        EngineKind::Sglang => Engine::Sglang,
    };
    Ok((kind, s.to_string()))
}

/// The engine release: `--engine`, else the one `--emit-args` names, else the newest vLLM.
fn engine_rules(a: &Flags) -> Result<EngineRules, Error> {
    match (&a.engine, &a.emit_args) {
        (Some(e), _) => e.parse(),
        (None, Some((_, e))) => e.parse(),
        (None, None) => Ok(EngineRules::newest_vllm().clone()),
    }
}

/// Graph-memory strategies (a dry run captures nothing: every strategy but `none` reserves the
/// measured `--graph-bytes`, else the analytic estimate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Chosen from capabilities; in a dry run the conservative analytic reserve.
    Auto,
    /// Reserve address space, capture, then map (needs a device run).
    PostCapture,
    /// Capture every size into a throwaway pool (needs a device run).
    Full,
    /// Capture a few sizes with a correct flush (needs a device run).
    Sampled,
    /// Analytic bound plus margin.
    Conservative,
    /// Reserve nothing (eager, or an engine that does not subtract graph memory).
    None,
    /// vLLM's legacy sampling (comparison only; needs a device run).
    VllmLegacy,
}

/// Flags of `memplan plan` (boxed: the subcommand enum stays small).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    flags: Box<Flags>,
}

/// The flags themselves.
#[derive(clap::Args, Debug, Clone)]
pub struct Flags {
    /// Model: a shipped preset (`qwen2.5-1.5b-instruct`), a directory with config.json (and
    /// *.safetensors, whose headers give the exact weights) or a config.json path.
    #[arg(long, value_name = "NAME|PATH")]
    pub model: String,
    /// Device to plan for (`sim:rtx4090`, `cuda:0`); optional with --total-memory.
    #[arg(long, value_name = "ID")]
    pub device: Option<String>,
    /// Plan for a device of this total instead of reading one (e.g. 79.19GiB).
    #[arg(long, value_name = "BYTES", value_parser = bytes("--total-memory"))]
    pub total_memory: Option<u64>,
    /// Fraction of the device the engine may use, in (0, 1] (default: the engine release's).
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory_utilization: Option<f64>,
    /// The engine and release whose sizing rules and defaults apply: vllm[@VERSION] or
    /// sglang[@VERSION] (default: the newest vLLM memplan knows; docs/engine-rules.md).
    #[arg(long, value_name = "ENGINE[@VERSION]")]
    pub engine: Option<String>,
    /// Fix the KV cache size instead of deriving it from the utilisation.
    #[arg(long, value_name = "BYTES", value_parser = bytes("--kv-cache-memory-bytes"))]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Model dtype: auto (from the config), bfloat16, float16, float32.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// KV-cache dtype: auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2, int8.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
    /// Online weight quantization (fp8), as the engine's --quantization.
    #[arg(long, value_name = "METHOD")]
    pub quantization: Option<String>,
    /// Longest request in tokens (default: the model's max_position_embeddings).
    #[arg(long)]
    pub max_model_len: Option<u64>,
    /// Requests per step (default: the engine's, by device size).
    #[arg(long)]
    pub max_num_seqs: Option<u64>,
    /// Tokens per step (default: the engine's, by device size).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u64>,
    /// Tokens per KV block (default: the engine release's).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Tensor-parallel ranks (figures are per rank).
    #[arg(long, visible_alias = "tp", default_value_t = 1)]
    pub tensor_parallel_size: u64,
    /// Graph capture sizes, comma-separated (default: the engine's).
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    pub cudagraph_capture_sizes: Option<Vec<u64>>,
    /// No graphs.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Graph-memory strategy.
    #[arg(long, value_enum, default_value_t = Strategy::Auto)]
    pub graph_strategy: Strategy,
    /// Measured weights per rank (from an earlier start-up log).
    #[arg(long, value_name = "BYTES", value_parser = bytes("--weights-bytes"))]
    pub weights_bytes: Option<u64>,
    /// Measured activation peak per rank.
    #[arg(long, value_name = "BYTES", value_parser = bytes("--activation-bytes"))]
    pub activation_bytes: Option<u64>,
    /// Measured non-torch (non-allocator) memory growth per rank.
    #[arg(long, value_name = "BYTES", value_parser = bytes("--non-torch-bytes"))]
    pub non_torch_bytes: Option<u64>,
    /// Measured graph memory per rank.
    #[arg(long, value_name = "BYTES", value_parser = bytes("--graph-bytes"))]
    pub graph_bytes: Option<u64>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a stacked-bar picture of the device memory to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Print only ready-to-paste flags that pin the planned KV cache in an engine.
    #[arg(long, value_name = "ENGINE[@VERSION]", value_parser = emit_engine)]
    pub emit_args: Option<(Engine, String)>,
}

/// Where the total came from: a device (name, snapshot) or the flag.
struct Target {
    label: String,
    /// The device's own name (batch defaults depend on it), empty with --total-memory.
    name: String,
    total: u64,
    snapshot: Option<MemoryInfo>,
}

fn target(a: &Flags) -> Result<Target, Error> {
    if let Some(total) = a.total_memory {
        let label = a.device.clone().map_or_else(
            || "total-memory".to_string(),
            |d| format!("{d} (total from --total-memory)"),
        );
        return Ok(Target {
            label,
            name: String::new(),
            total,
            snapshot: None,
        });
    }
    let Some(id) = &a.device else {
        return Err(Error::invalid(
            "--device",
            "pass a device (e.g. sim:rtx4090, cuda:0) or --total-memory",
        ));
    };
    let mut dev = memplan::open(id)?;
    dev.synchronize()?;
    let driver: DriverMemory = dev.driver_memory()?;
    let total = driver
        .total
        .or(dev.descriptor().total_bytes)
        .ok_or_else(|| {
            Error::invalid(
                "--device",
                format!("{id} does not report its total memory; pass --total-memory"),
            )
        })?;
    let label = format!("{id} ({})", dev.descriptor().name);
    Ok(Target {
        label,
        name: dev.descriptor().name.clone(),
        total,
        snapshot: Some(MemoryInfo {
            driver,
            ..Default::default()
        }),
    })
}

fn input(a: &Flags, t: &Target) -> Result<PlanInput, Error> {
    let model = Model::load(&a.model)?;
    let kv_cache_dtype = match a.kv_cache_dtype.as_str() {
        "auto" => None,
        s => Some(s.parse::<KvDtype>()?),
    };
    let quantization = match a.quantization.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("none") => None,
        Some("fp8") => Some(Quantization::fp8_online()),
        Some(q) => return Err(Error::invalid("--quantization", format!("{q:?}: a dry run knows online fp8; quantized checkpoints are read from their config"))),
    };
    let engine = engine_rules(a)?;
    // vLLM 0.34: utilisation 1.0 with the extensible KV cache (sized from memory measured
    // after graph capture), else the release's default (`resolved_gpu_memory_utilization`).
    // With the extensible cache the engine takes what is free when it starts, so a device
    // read now gives free / total.
    let default_util = if engine.extensible_kv_cache {
        match t.snapshot.as_ref().and_then(|s| s.driver.free) {
            Some(free) if t.total > 0 && free < t.total => free as f64 / t.total as f64,
            _ => 1.0,
        }
    } else {
        engine.gpu_memory_utilization
    };
    let request = match a.kv_cache_memory_bytes {
        Some(b) => Request::KvCacheBytes(b),
        None => Request::Utilization(a.gpu_memory_utilization.unwrap_or(default_util)),
    };
    let graph_reserve = if a.graph_strategy == Strategy::None {
        GraphReserve::None
    } else {
        GraphReserve::Reserve
    };
    Ok(PlanInput {
        model,
        total: t.total,
        snapshot: t.snapshot,
        request,
        dtype: Some(a.dtype.clone()),
        kv_cache_dtype,
        quantization,
        max_model_len: a.max_model_len,
        max_num_seqs: a.max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        block_size: a.block_size,
        engine,
        device_name: t.name.clone(),
        tensor_parallel: a.tensor_parallel_size,
        capture_sizes: a.cudagraph_capture_sizes.clone(),
        enforce_eager: a.enforce_eager,
        graph_reserve,
        measured: Measured {
            weights: a.weights_bytes,
            activation: a.activation_bytes,
            non_torch: a.non_torch_bytes,
            graph: a.graph_bytes,
        },
    })
}

/// The devices of every rank: with `--tensor-parallel-size N` and an ordinal (`cuda:0`), the
/// N devices from that ordinal on; otherwise one device that stands for every rank.
fn targets(a: &Flags) -> Result<Vec<Target>, Error> {
    let first = target(a)?;
    let tp = a.tensor_parallel_size;
    let ordinal = match (&a.device, a.total_memory) {
        (Some(id), None) => id
            .parse::<memplan::DeviceId>()
            .ok()
            .and_then(|d| d.ordinal().ok().map(|o| (d, o))),
        _ => None,
    };
    let Some((id, start)) = ordinal.filter(|_| tp > 1) else {
        return Ok(vec![first]);
    };
    let mut all = vec![first];
    for rank in 1..tp {
        let device = format!("{}:{}", id.backend, start as u64 + rank);
        let one = Flags {
            device: Some(device),
            ..a.clone()
        };
        all.push(target(&one)?);
    }
    Ok(all)
}

/// One dry run per rank; the engine sizes every rank like the one with the smallest KV budget.
fn plan_ranks(a: &Flags) -> Result<(Target, PlanInput, dryrun::DryRun), Error> {
    let mut runs = Vec::new();
    for t in targets(a)? {
        let inp = input(a, &t)?;
        let plan = dryrun::run(&inp)?;
        runs.push((t, inp, plan));
    }
    let budgets: Vec<_> = runs.iter().map(|r| r.2.budget).collect();
    let (i, _) = memplan_planner::budget::combine_ranks(&budgets)?;
    let n = runs.len();
    let (t, inp, mut plan) = runs.swap_remove(i);
    if n > 1 {
        plan.warnings.push(format!("rank {i} ({}) has the smallest KV budget of {n} ranks; the engine sizes every rank like it", t.label));
    }
    Ok((t, inp, plan))
}

/// Run `memplan plan`.
pub fn run(a: Args) -> Result<ExitCode, Error> {
    let a = *a.flags;
    let (t, inp, mut plan) = plan_ranks(&a)?;
    if matches!(
        a.graph_strategy,
        Strategy::PostCapture | Strategy::Full | Strategy::Sampled | Strategy::VllmLegacy
    ) {
        plan.warnings.push(format!("--graph-strategy {:?} needs a device run (the engine API or `memplan simulate`); this dry run reserves the measured or analytic figure instead", a.graph_strategy));
    }
    let view = render::View::new(&t.label, &inp, &plan, &a);
    if let Some(path) = &a.svg {
        std::fs::write(path, render::svg(&view)).map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: e,
        })?;
    }
    if a.json {
        crate::output::print_json(&view.json())?;
    } else if let Some((engine, _)) = a.emit_args.clone() {
        println!("{}", render::engine_args(&view, engine)?);
    } else {
        print!("{}", render::table(&view));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn plan(flags: &str) -> Result<serde_json::Value, Error> {
        let a = Cli::try_parse_from(std::iter::once("plan").chain(flags.split_whitespace()))
            .map_err(|e| Error::invalid("flags", e.to_string()))?
            .args
            .flags;
        let t = target(&a)?;
        let inp = input(&a, &t)?;
        let p = dryrun::run(&inp)?;
        Ok(render::View::new(&t.label, &inp, &p, &a).json())
    }

    #[test]
    fn json_has_every_documented_key() {
        let j = plan("--model qwen2.5-1.5b-instruct --total-memory 24GiB --max-model-len 8192")
            .unwrap();
        for k in [
            "device",
            "total_bytes",
            "requested_bytes",
            "weights_bytes",
            "activation_bytes",
            "non_torch_bytes",
            "graph_reserve_bytes",
            "graph_strategy",
            "kv_cache_bytes",
            "num_blocks",
            "kv_cache_tokens",
            "max_concurrency",
            "max_model_len_fit",
            "warnings",
        ] {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        assert_eq!(j["graph_strategy"], "conservative");
    }

    #[test]
    fn measured_values_reproduce_the_h100_log() {
        // vLLM 0.19, Llama-3.1-8B on H100: 476,016 tokens logged; the printed figures allow
        // 475,776..476,096 (see memplan_model::validation).
        let j = plan("--model llama-3.1-8b-instruct --total-memory 79.19GiB --gpu-memory-utilization 0.95 --max-model-len 8192 --weights-bytes 14.99GiB --activation-bytes 1.89GiB --non-torch-bytes 0.25GiB --graph-strategy none").unwrap();
        let t = j["kv_cache_tokens"].as_u64().unwrap();
        assert!((475_776..=476_096).contains(&t), "{t}");
        assert_eq!(j["graph_reserve_bytes"], 0);
    }

    #[test]
    fn qwen_0_5b_fp8_on_a_24_gib_card() {
        // The engine reported 3.52 M tokens at 0.95 on an RTX 4090 (23.99 GiB).
        let j = plan("--model qwen2.5-0.5b-instruct --total-memory 23.99GiB --gpu-memory-utilization 0.95 --kv-cache-dtype fp8").unwrap();
        let t = j["kv_cache_tokens"].as_u64().unwrap() as f64;
        assert!((3.4e6..3.7e6).contains(&t), "{t}");
    }

    #[test]
    fn one_simulated_device_stands_for_every_rank() {
        let a = Cli::try_parse_from(
            "plan --model llama-3.1-8b-instruct --device sim:h100-80gb --tp 2 --max-model-len 8192"
                .split_whitespace(),
        )
        .unwrap()
        .args
        .flags;
        let (t, _, p) = plan_ranks(&a).unwrap();
        assert!(t.label.starts_with("sim:h100-80gb") && t.snapshot.is_some());
        assert!(
            p.warnings.iter().any(|w| w.contains("per rank")),
            "{:?}",
            p.warnings
        );
        assert_eq!(p.kv_spec.groups[0].kv_heads, 4);
    }

    #[test]
    fn errors_say_what_would_fit() {
        let e = plan("--model qwen3-8b --total-memory 24GiB --max-model-len 200000")
            .unwrap_err()
            .to_string();
        assert!(e.contains("largest --max-model-len that fits"), "{e}");
        let e = plan("--model qwen3-8b --total-memory 18GiB --gpu-memory-utilization 0.9")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--gpu-memory-utilization 0.9"), "{e}");
        assert!(plan("--model qwen3-8b")
            .unwrap_err()
            .to_string()
            .contains("--device"));
        assert!(
            plan("--model qwen3-8b --total-memory 24GiB --quantization awq")
                .unwrap_err()
                .to_string()
                .contains("--quantization")
        );
    }

    #[test]
    fn emitted_args_pin_the_budget() {
        let a = Cli::try_parse_from(
            "plan --model qwen3-8b --total-memory 80GiB --max-model-len 8192 --kv-cache-dtype fp8 --engine vllm@0.19"
                .split_whitespace(),
        )
        .unwrap()
        .args
        .flags;
        let t = target(&a).unwrap();
        let inp = input(&a, &t).unwrap();
        let p = dryrun::run(&inp).unwrap();
        let v = render::View::new(&t.label, &inp, &p, &a);
        let vllm = render::engine_args(&v, Engine::Vllm).unwrap();
        assert!(
            vllm.contains(&format!("--kv-cache-memory-bytes {} ", p.budget.kv_budget))
                && vllm.contains("--kv-cache-dtype fp8_e4m3"),
            "{vllm}"
        );
        let sg = render::engine_args(&v, Engine::Sglang).unwrap();
        assert!(
            sg.contains(&format!("--max-total-tokens {} ", p.sizing.tokens)),
            "{sg}"
        );
        assert!(
            render::svg(&v).starts_with("<svg") && render::table(&v).contains("KV cache tokens")
        );
        // SGLang's fraction is the planned request (0.9 by default), not weights + KV alone:
        // its pool is `free - total * (1 - fraction)`, so a smaller fraction leaves the pool
        // short of --max-total-tokens by the engine's context and workspaces.
        assert!(sg.contains("--mem-fraction-static 0.900 "), "{sg}");
    }

    fn emitted(flags: &str, e: Engine) -> Result<String, Error> {
        let a = Cli::try_parse_from(std::iter::once("plan").chain(flags.split_whitespace()))
            .unwrap()
            .args
            .flags;
        let t = target(&a).unwrap();
        let inp = input(&a, &t).unwrap();
        let p = dryrun::run(&inp).unwrap();
        render::engine_args(&render::View::new(&t.label, &inp, &p, &a), e)
    }

    #[test]
    fn emitted_kv_dtypes_are_the_engines_own_names() {
        let f = "--model qwen3-8b --total-memory 80GiB --max-model-len 8192 --kv-cache-dtype";
        // vLLM spells its int8 cache (per-token-head scales, memplan's int8 layout) so.
        let v = emitted(&format!("{f} int8"), Engine::Vllm).unwrap();
        assert!(v.ends_with("--kv-cache-dtype int8_per_token_head"), "{v}");
        // SGLang has no int8 cache: a clear error, not a silent bf16 cache of other size.
        let e = emitted(&format!("{f} int8"), Engine::Sglang)
            .unwrap_err()
            .to_string();
        assert!(e.contains("int8") && e.contains("--emit-args"), "{e}");
        let s = emitted(&format!("{f} fp8_e5m2"), Engine::Sglang).unwrap();
        assert!(s.ends_with("--kv-cache-dtype fp8_e5m2"), "{s}");
        let v = emitted(&format!("{f} auto"), Engine::Vllm).unwrap();
        assert!(v.ends_with("--kv-cache-dtype auto"), "{v}");
    }
}
