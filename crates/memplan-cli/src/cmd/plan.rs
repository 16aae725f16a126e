//! `memplan plan`: a dry run before launching the engine. Will this model fit, how many KV
//! tokens and concurrent requests will it get, and which engine flags pin that budget?
//!
//! The device's total (and free memory, for the start-up check) come from the device, real or
//! simulated, or from `--total-memory`. Figures the user measured in an earlier start-up
//! (`--weights-bytes`, ...) replace the estimates; every byte flag takes plain bytes or units.
//! The result is the planner's [`Plan`] (the same type `memplan simulate` prints), rendered by
//! the planner's renderer with this command's flag names.

mod render_args;

use std::path::PathBuf;
use std::process::ExitCode;

use memplan::bytes::parse_bytes;
use memplan::kv::KvDtype;
use memplan::{DriverMemory, Error, MemoryInfo, Param, ProfilingCapability};
use memplan_model::dryrun::{DryRun, GraphReserve};
use memplan_model::engine::{EngineKind, EngineRules};
use memplan_model::{Model, Quantization};
use memplan_planner::budget::Request;
use memplan_planner::plan::render;
use memplan_planner::{combine_ranks, ConsumerKind, GraphMethod, Plan, SelectionPolicy};

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

/// How a dry run counts graph memory. A dry run captures nothing: the strategies that measure
/// (post-capture, full, sampled, conservative) run in an engine start-up (the `memplan` crate's
/// `Session`) or in `memplan simulate`, not here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Reserve `--graph-bytes` if given, else the analytic estimate; with `--device`, the plan
    /// also says which strategy a measured start-up on that device would use.
    Auto,
    /// Reserve the analytic estimate from the model (or `--graph-bytes`).
    Estimate,
    /// Reserve nothing (an engine that does not subtract graph memory, as vLLM <= 0.19).
    None,
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
    /// How graph memory is counted in this dry run.
    #[arg(long, value_enum, default_value_t = Strategy::Auto)]
    pub graph_strategy: Strategy,
    /// Measured weights per rank (from an earlier start-up log).
    #[arg(long, value_name = "BYTES", value_parser = bytes("--weights-bytes"))]
    pub weights_bytes: Option<u64>,
    /// Measured activation peak per rank.
    #[arg(long, value_name = "BYTES", value_parser = bytes("--activation-bytes"))]
    pub activation_bytes: Option<u64>,
    /// Measured non-torch (non-allocator) memory growth per rank (vLLM's "non-torch memory").
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

/// Where the total came from: a device (name, snapshot, capability) or the flag.
struct Target {
    label: String,
    /// The device's own name (batch defaults depend on it), empty with --total-memory.
    name: String,
    total: u64,
    snapshot: Option<MemoryInfo>,
    capability: Option<ProfilingCapability>,
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
            capability: None,
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
        capability: Some(dev.capabilities().clone()),
    })
}

fn input(a: &Flags, t: &Target) -> Result<DryRun, Error> {
    let model = Model::load(&a.model)?;
    let kv_cache_dtype = match a.kv_cache_dtype.as_str() {
        "auto" => None,
        s => Some(s.parse::<KvDtype>()?),
    };
    let quantization = match a.quantization.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("none") => None,
        Some("fp8") => Some(Quantization::fp8_online()),
        Some(q) => return Err(Error::param(Param::Quantization, format!("{q:?}: a dry run knows online fp8; quantized checkpoints are read from their config"))),
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
    Ok(DryRun::new(model, t.total)
        .device(t.label.clone(), t.snapshot)
        .request(request)
        .dtype(a.dtype.clone())
        .kv_cache_dtype(kv_cache_dtype)
        .quantization(quantization)
        .max_model_len(a.max_model_len)
        .max_num_seqs(a.max_num_seqs)
        .max_num_batched_tokens(a.max_num_batched_tokens)
        .block_size(a.block_size)
        .engine(engine)
        .device_name(t.name.clone())
        .tensor_parallel(a.tensor_parallel_size)
        .capture_sizes(a.cudagraph_capture_sizes.clone())
        .enforce_eager(a.enforce_eager)
        .graph_reserve(graph_reserve)
        .given(ConsumerKind::Weights, a.weights_bytes)
        .given(ConsumerKind::Activation, a.activation_bytes)
        .given(ConsumerKind::NonAllocator, a.non_torch_bytes)
        .given(ConsumerKind::Graphs, a.graph_bytes))
}

/// One rank's plan. With `--graph-strategy auto` on a device, the plan says which strategy a
/// measured start-up there would use (selected from the device's declared capability).
fn plan_one(a: &Flags, t: &Target) -> Result<Plan, Error> {
    let mut plan = input(a, t)?.plan()?;
    if let (Some(cap), Strategy::Auto, GraphMethod::Estimate) =
        (&t.capability, a.graph_strategy, plan.graph.strategy)
    {
        let sizes = match &a.cudagraph_capture_sizes {
            Some(s) => s.len(),
            None => {
                memplan_model::estimate::default_capture_sizes(plan.max_num_seqs.unwrap_or(256))
                    .len()
            }
        };
        let sel = memplan_planner::select(cap, sizes, true, SelectionPolicy::default());
        plan.graph.why = format!(
            "{}; a measured start-up on this device would use {} ({})",
            plan.graph.why, sel.kind, sel.why
        );
    }
    for e in [Engine::Vllm, Engine::Sglang] {
        if let Ok(args) = render_args::engine_args(&plan, a.enforce_eager, e) {
            plan.engine_args.insert(e.name().into(), args);
        }
    }
    Ok(plan)
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

/// One dry run per rank; the engine sizes every rank like the one with the smallest KV cache.
fn plan_ranks(a: &Flags) -> Result<Plan, Error> {
    let plans = targets(a)?
        .iter()
        .map(|t| plan_one(a, t))
        .collect::<Result<Vec<_>, _>>()?;
    combine_ranks(plans)
}

/// Run `memplan plan`.
pub fn run(a: Args) -> Result<ExitCode, Error> {
    let a = *a.flags;
    let plan = plan_ranks(&a)?;
    if let Some(path) = &a.svg {
        std::fs::write(path, render::svg(&plan)).map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: e,
        })?;
    }
    if a.json {
        crate::output::print_json(&plan)?;
    } else if let Some((engine, _)) = a.emit_args.clone() {
        println!(
            "{}",
            render_args::engine_args(&plan, a.enforce_eager, engine)?
        );
    } else {
        print!("{}", render::text(&plan, &crate::flags::flag_name));
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

    fn flags(flags: &str) -> Flags {
        *Cli::try_parse_from(std::iter::once("plan").chain(flags.split_whitespace()))
            .unwrap()
            .args
            .flags
    }

    fn plan(f: &str) -> Result<serde_json::Value, Error> {
        let p = plan_ranks(&flags(f))?;
        Ok(serde_json::to_value(&p).unwrap())
    }

    fn err(f: &str) -> String {
        crate::flags::describe(&plan(f).unwrap_err())
    }

    #[test]
    fn json_has_every_documented_key() {
        let j = plan("--model qwen2.5-1.5b-instruct --total-memory 24GiB --max-model-len 8192")
            .unwrap();
        for k in [
            "schema",
            "device",
            "model",
            "total_bytes",
            "requested_bytes",
            "consumers",
            "graph",
            "kv_budget_bytes",
            "kv_cache_bytes",
            "kv_cache_tokens",
            "kv",
            "limits",
            "suggestions",
            "engine_args",
            "warnings",
        ] {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        assert_eq!(j["schema"], "memplan.plan/1");
        assert_eq!(j["graph"]["strategy"], "estimate");
        for k in [
            "num_blocks",
            "usable_blocks",
            "max_concurrency",
            "max_model_len_fit",
        ] {
            assert!(j["kv"].get(k).is_some(), "missing kv.{k}");
        }
        let kinds: Vec<_> = j["consumers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["kind"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(kinds, ["weights", "activation", "non_allocator", "graphs"]);
        assert_eq!(j["consumers"][0]["provenance"]["kind"], "estimated");
        assert!(j["engine_args"]["vllm"].is_string());
    }

    #[test]
    fn measured_values_reproduce_the_h100_log() {
        // vLLM 0.19, Llama-3.1-8B on H100: 476,016 tokens logged; the printed figures allow
        // 475,776..476,096 (see memplan_model::validation).
        let j = plan("--model llama-3.1-8b-instruct --total-memory 79.19GiB --gpu-memory-utilization 0.95 --max-model-len 8192 --weights-bytes 14.99GiB --activation-bytes 1.89GiB --non-torch-bytes 0.25GiB --graph-strategy none").unwrap();
        let t = j["kv_cache_tokens"].as_u64().unwrap();
        assert!((475_776..=476_096).contains(&t), "{t}");
        assert_eq!(j["consumers"][3]["bytes"], 0);
        assert_eq!(j["graph"]["strategy"], "not-reserved");
        assert_eq!(j["consumers"][0]["provenance"]["kind"], "given");
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
        let a = flags(
            "--model llama-3.1-8b-instruct --device sim:h100-80gb --tp 2 --max-model-len 8192",
        );
        let p = plan_ranks(&a).unwrap();
        assert!(p.device.as_deref().unwrap().starts_with("sim:h100-80gb"));
        assert!(
            p.warnings
                .iter()
                .any(|w| matches!(w, memplan_planner::Warning::FiguresPerRank { ranks: 2 })),
            "{:?}",
            p.warnings
        );
        assert_eq!(p.kv_spec.groups[0].kv_heads, 4);
        // On a device, the plan says which strategy a measured start-up would use.
        assert!(
            p.graph.why.contains("would use post-capture"),
            "{}",
            p.graph.why
        );
    }

    #[test]
    fn errors_say_what_would_fit() {
        let e = plan("--model qwen3-8b --total-memory 24GiB --max-model-len 200000").unwrap_err();
        assert!(
            matches!(
                e.refusal(),
                Some(memplan::Refusal::RequestDoesNotFit {
                    max_model_len_fit: Some(_),
                    ..
                })
            ),
            "{e}"
        );
        let e = err("--model qwen3-8b --total-memory 24GiB --max-model-len 200000");
        assert!(e.contains("largest --max-model-len that fits"), "{e}");
        let e = err("--model qwen3-8b --total-memory 18GiB --gpu-memory-utilization 0.9");
        assert!(e.contains("--gpu-memory-utilization 0.9"), "{e}");
        assert!(err("--model qwen3-8b").contains("--device"));
        assert!(
            err("--model qwen3-8b --total-memory 24GiB --quantization awq")
                .starts_with("--quantization")
        );
        assert!(
            err("--model qwen3-8b --total-memory 24GiB --gpu-memory-utilization 1.5")
                .starts_with("--gpu-memory-utilization")
        );
    }

    #[test]
    fn emitted_args_pin_the_budget() {
        let a = flags(
            "--model qwen3-8b --total-memory 80GiB --max-model-len 8192 --kv-cache-dtype fp8 --engine vllm@0.19",
        );
        let p = plan_ranks(&a).unwrap();
        let vllm = render_args::engine_args(&p, false, Engine::Vllm).unwrap();
        assert!(
            vllm.contains(&format!("--kv-cache-memory-bytes {} ", p.kv_budget))
                && vllm.contains("--kv-cache-dtype fp8_e4m3"),
            "{vllm}"
        );
        let sg = render_args::engine_args(&p, false, Engine::Sglang).unwrap();
        assert!(
            sg.contains(&format!("--max-total-tokens {} ", p.kv.tokens)),
            "{sg}"
        );
        let table = render::text(&p, &crate::flags::flag_name);
        assert!(render::svg(&p).starts_with("<svg") && table.contains("KV cache tokens"));
        assert!(table.contains("--kv-cache-memory-bytes"), "{table}");
        // SGLang's fraction is the planned request (0.9 by default), not weights + KV alone:
        // its pool is `free - total * (1 - fraction)`, so a smaller fraction leaves the pool
        // short of --max-total-tokens by the engine's context and workspaces.
        assert!(sg.contains("--mem-fraction-static 0.900 "), "{sg}");
    }

    fn emitted(f: &str, e: Engine) -> Result<String, Error> {
        let a = flags(f);
        render_args::engine_args(&plan_ranks(&a).unwrap(), a.enforce_eager, e)
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
