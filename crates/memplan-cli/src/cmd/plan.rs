//! `memplan plan`: a dry run before launching the engine. Will this model fit, how many KV
//! tokens and concurrent requests will it get, and which engine flags pin that budget?
//!
//! The device's total (and free memory, for the start-up check) come from the device, real or
//! simulated, or from `--total-memory`. Figures the user measured in an earlier start-up
//! (`--weights-bytes`, ...) replace the estimates; every byte flag takes plain bytes or units.
//! The result is the planner's [`Plan`] (the same type `memplan simulate` prints), rendered by
//! the planner's renderer with this command's flag names.
//!
//! Order: flags are checked by clap (the `flags` module); the model is loaded before any device is
//! opened (so `--model nope` lists the presets on any machine); then the device, the dry run
//! per rank, and the rendering.

mod extras;
mod flags;
mod render_args;

use memplan::kv::KvDtype;
use memplan::{DriverMemory, Error, MemoryInfo, Param, ProfilingCapability};
use memplan_model::dryrun::{DryRun, GraphReserve};
use memplan_model::engine::{EngineRules, LoggedKvTokens};
use memplan_model::{dtype_bytes, Model, Quantization};
use memplan_planner::plan::render;
use memplan_planner::{combine_ranks, ConsumerKind, Plan};

pub use flags::{Engine, Flags, Strategy};

use crate::contract::{schema, Failure};
use crate::Report;

/// Examples shown by `memplan plan --help`.
pub const EXAMPLES: &str = "Examples:
  memplan plan --model qwen2.5-1.5b-instruct --device sim:rtx4090
  memplan plan --model ~/models/Llama-3.1-8B-Instruct --device cuda:0 --max-model-len 8192
  memplan plan --model llama-3.1-8b-instruct --total-memory 79.19GiB --gpu-memory-utilization 0.95 \\
      --weights-bytes 14.99GiB --activation-bytes 1.89GiB --non-torch-bytes 0.25GiB --graph-strategy none
  memplan plan --model qwen3-8b --device sim:h100-80gb --kv-cache-dtype fp8 --emit-args vllm
  memplan plan --model qwen3-8b --total-memory 24GiB --json --svg plan.svg
  memplan plan --model nope --total-memory 1GiB   # an unknown name lists the shipped presets";

/// The engine release: `--engine`, else the one `--emit-args` names, else the newest vLLM.
fn engine_rules(a: &Flags) -> Result<EngineRules, Error> {
    let named = a
        .engine
        .as_deref()
        .or(a.emit_args.as_ref().map(|(_, e)| e.as_str()));
    memplan_model::defaults::engine(named)
}

/// When the release asked for is not a row of the rules table (a patch release such as
/// `vllm@0.34.1`, or a release between two rule changes), the note saying whose rules apply.
fn engine_note(a: &Flags) -> Option<String> {
    let given = a
        .engine
        .as_deref()
        .or(a.emit_args.as_ref().map(|(_, e)| e.as_str()))?;
    let (_, version) = given.split_once('@')?;
    let rules = engine_rules(a).ok()?;
    (version != rules.version).then(|| {
        format!(
            "engine {given}: planned with the rules of {rules}, the last release memplan lists at or before it (sizing rules change only at the listed releases; a patch release keeps its minor version's rules)"
        )
    })
}

/// Flags of `memplan plan` (boxed: the subcommand enum stays small).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    flags: Box<Flags>,
}

impl Args {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        self.flags.json
    }
}

/// Where the total came from: a device (name, snapshot, capability) or the flag.
struct Target {
    label: String,
    name: String,
    total: u64,
    snapshot: Option<MemoryInfo>,
    capability: Option<ProfilingCapability>,
}

fn target(a: &Flags) -> Result<Target, Error> {
    if let Some(total) = a.total_memory {
        let label = match &a.device {
            None => "total-memory".to_string(),
            Some(d) => {
                // Parsed by clap; a simulated selector is opened too, so its modifiers are
                // checked (opening one touches no hardware).
                if d.parse::<memplan::DeviceId>()?.backend == memplan::BackendKind::Sim {
                    memplan::open(d)?;
                }
                format!("{d} (total from --total-memory)")
            }
        };
        return Ok(Target {
            label,
            name: String::new(),
            total,
            snapshot: None,
            capability: None,
        });
    }
    let Some(id) = &a.device else {
        let why = match &a.from_log {
            Some(p) => format!(
                "the log {} states no device total (no \"Free memory on device (F/T GiB)\" line, no utilisation pair with a graph estimate, no weights with the available KV memory); pass a device (e.g. sim:rtx4090, cuda:0) or --total-memory",
                p.display()
            ),
            None => "pass a device (e.g. sim:rtx4090, cuda:0) or --total-memory".to_string(),
        };
        return Err(Error::invalid("--device", why));
    };
    let dev = memplan::open(id)?;
    dev.synchronize()?;
    let driver: DriverMemory = dev.driver_memory()?;
    // A total of 0, or past the range --total-memory takes (1 byte to 1 PiB), is a
    // misreport, the device's failure: not a total to plan for (the planner would refuse a 0
    // as if --total-memory had said it), nor one to replace.
    if let Some(t) = driver
        .total
        .filter(|t| *t == 0 || *t > memplan_model::limits::MAX_BYTES)
    {
        return Err(Error::Measurement(format!(
            "{id} reports a total of {} ({t} bytes) of memory, outside 1 byte to {}; pass \
             --total-memory to plan for a total",
            memplan::bytes::fmt_bytes(t),
            memplan::bytes::fmt_bytes(memplan_model::limits::MAX_BYTES)
        )));
    }
    let usable = usable_memory(dev.descriptor()).filter(|_| driver.total.is_none());
    let total = driver
        .total
        .or(dev.descriptor().total_bytes)
        .or(usable)
        .ok_or_else(|| {
            Error::invalid(
                "--device",
                format!("{id} does not report its total memory; pass --total-memory"),
            )
        })?;
    let label = match usable {
        Some(u) if dev.descriptor().total_bytes.is_none() => format!(
            "{id} ({}; total = the usable memory the backend states, {})",
            dev.descriptor().name,
            memplan::bytes::fmt_bytes(u)
        ),
        _ => format!("{id} ({})", dev.descriptor().name),
    };
    Ok(Target {
        label,
        name: dev.descriptor().name.clone(),
        total,
        snapshot: Some(MemoryInfo::default().with_driver(driver)),
        capability: Some(dev.capabilities().clone()),
    })
}

/// The usable memory a backend states for a device whose driver total is not its memory (an
/// APU: the driver reports the VRAM carve-out, the GPU uses system memory), as `memplan probe`
/// shows it (`usable_memory`).
fn usable_memory(d: &memplan::DeviceDescriptor) -> Option<u64> {
    d.properties
        .iter()
        .find(|(k, _)| k == "usable_memory")
        .and_then(|(_, v)| memplan::bytes::parse_bytes("usable_memory", v).ok())
        .filter(|b| *b > 0)
}

/// The model, loaded before any device is opened.
fn model(a: &Flags) -> Result<Model, Failure> {
    // Required by clap unless --from-log is given, and then filled from the log
    // (`extras::apply_log`), which refuses a log that names no model or several.
    let name = a
        .model
        .as_deref()
        .ok_or_else(|| Failure::usage("pass --model NAME|PATH"))?;
    let m = Model::load(name).map_err(|e| match e {
        // A name that is no model (not a preset, not cached, not a path): list the presets.
        Error::InvalidParam {
            param: Param::Model,
            ..
        } => Failure::from(e).with_help("presets", memplan_model::presets::names()),
        other => Failure::from(other),
    })?;
    // vLLM refuses an online method that differs from the checkpoint's own
    // (`ModelConfig._verify_quantization`, vllm/config/model.py: "Quantization method
    // specified in the model config (...) does not match ...").
    if let (Some(q), Some(own)) = (&a.quantization.0, &m.config.quantization) {
        if own.method != *q {
            return Err(Failure::usage(format!(
                "--quantization {q}: the checkpoint is already quantized with {}; engines refuse a different method (omit --quantization)",
                own.method
            )));
        }
    }
    Ok(m)
}

/// The dtype the engine loads the model in: `--dtype`, else the config's, with float32
/// checkpoints served in bfloat16 and a config without one loaded as bfloat16 (as the
/// engines resolve `auto`).
fn model_dtype(a: &Flags, m: &Model) -> KvDtype {
    let name = match a.dtype.as_str() {
        "auto" => match m.config.torch_dtype.as_deref() {
            Some(d) if matches!(dtype_bytes(d), Ok(4)) => "bfloat16",
            Some(d) => d,
            None => "bfloat16",
        },
        d => d,
    };
    match dtype_bytes(name) {
        Ok(4) => KvDtype::F32,
        _ if name.to_ascii_lowercase().contains("bf") => KvDtype::Bf16,
        _ => KvDtype::F16,
    }
}

fn input(a: &Flags, model: &Model, t: &Target) -> Result<DryRun, Failure> {
    let engine = engine_rules(a)?;
    // The default request (and how a derived one was derived) is the measured start-up's:
    // one function for both (`memplan_model::defaults::request`).
    let (request, request_note) = memplan_model::defaults::request(
        &engine,
        t.total,
        t.snapshot.as_ref().and_then(|s| s.driver.free),
        (a.tensor_parallel_size, a.pipeline_parallel_size),
        // A fixed KV size wins over a utilisation (a log can give both).
        (
            a.gpu_memory_utilization
                .filter(|_| a.kv_cache_memory_bytes.is_none()),
            a.kv_cache_memory_bytes,
        ),
    )?;
    // The platform decides whether the release profiles (and subtracts) graph memory.
    let platform = a
        .device
        .as_deref()
        .and_then(|d| d.parse::<memplan::DeviceId>().ok())
        .map(|d| d.backend)
        .filter(|b| *b != memplan::BackendKind::Sim)
        .map(|b| b.to_string());
    let graph_reserve = match a.graph_strategy {
        Strategy::None => GraphReserve::None,
        Strategy::Estimate => GraphReserve::Reserve,
        Strategy::Auto => GraphReserve::Engine,
    };
    let mut dry = DryRun::new(model.clone(), t.total)
        .device(t.label.clone(), t.snapshot)
        .request(request)
        .dtype(a.dtype.clone())
        .kv_cache_dtype(a.kv_cache_dtype.0)
        .mamba_cache_dtype(a.mamba_cache_dtype.0)
        .mamba_ssm_cache_dtype(a.mamba_ssm_cache_dtype.0)
        .prefix_caching(a.prefix_caching())
        .quantization(
            a.quantization
                .0
                .as_ref()
                .map(|_| Quantization::fp8_online()),
        )
        .max_model_len(a.max_model_len)
        .max_num_seqs(a.max_num_seqs)
        .max_num_batched_tokens(a.max_num_batched_tokens)
        .block_size(a.block_size)
        .engine(engine)
        .device_name(t.name.clone())
        .tensor_parallel(a.tensor_parallel_size)
        .capture_sizes(a.capture_sizes().map_err(Failure::usage)?)
        .enforce_eager(a.enforce_eager)
        .graph_reserve(graph_reserve)
        .platform(platform)
        // `auto` follows the device: the selection a measured start-up makes (no graph
        // reserve where the device cannot capture); `estimate` and `none` are the user's.
        .capability(
            t.capability
                .clone()
                .filter(|_| a.graph_strategy == Strategy::Auto),
        )
        .given(ConsumerKind::Weights, a.weights_bytes)
        .given(ConsumerKind::Activation, a.activation_bytes)
        .given(ConsumerKind::NonAllocator, a.non_torch_bytes)
        .given(ConsumerKind::Graphs, a.graph_bytes)
        .notes(request_note.into_iter().collect())
        .extras(extras::extras(a)?);
    dry.allocator = allocator(a, |v| std::env::var_os(v))?;
    Ok(dry)
}

/// The engine's caching-allocator configuration: `--alloc-conf`, else the environment as
/// PyTorch reads it (`PYTORCH_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF`, else
/// `PYTORCH_HIP_ALLOC_CONF`: the first one set wins, `AllocatorConfig::from_vars`), with where
/// it came from. A malformed variable is a usage error naming it.
fn allocator(
    a: &Flags,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Option<(memplan::AllocatorConfig, String)>, Failure> {
    if let Some(c) = &a.alloc_conf {
        return Ok(Some((c.clone(), "--alloc-conf".into())));
    }
    let found =
        memplan::AllocatorConfig::from_vars(env).map_err(|e| Failure::usage(e.to_string()))?;
    Ok(found.map(|(c, var)| (c, format!("the environment variable {var}"))))
}

/// What `--emit-args` needs beyond the plan.
fn context(a: &Flags, m: &Model) -> Result<render_args::Context, Error> {
    Ok(render_args::Context {
        enforce_eager: a.enforce_eager,
        dtype: a.dtype.clone(),
        model_dtype: model_dtype(a, m),
        quantization: a.quantization.0.clone(),
        mamba_cache_dtype: a.mamba_cache_dtype.0,
        mamba_ssm_cache_dtype: a.mamba_ssm_cache_dtype.0,
        prefix_caching: a.prefix_caching(),
        max_num_seqs_given: a.max_num_seqs.is_some(),
        block_size: a.block_size.filter(|_| a.log_block_size.is_none()),
        log_block_size: a.log_block_size,
        version: engine_rules(a)?.version.to_string(),
        fraction_cut: engine_rules(a)?.static_fraction(&m.config.architecture, 1.0),
    })
}

fn plan_one(a: &Flags, model: &Model, t: &Target) -> Result<Plan, Failure> {
    let mut plan = input(a, model, t)?.plan()?;
    let ctx = context(a, model)?;
    for e in [Engine::Vllm, Engine::Sglang] {
        if let Ok(args) = render_args::engine_args(&plan, &ctx, e) {
            plan.engine_args.insert(e.name().into(), args);
        }
    }
    Ok(plan)
}

/// The devices of every rank: with `--tensor-parallel-size N` and an ordinal (`cuda:0`), the
/// N devices from that ordinal on; otherwise (or for one `--tensor-parallel-rank`) one device
/// that stands for every rank.
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
    let Some((id, start)) = ordinal.filter(|_| tp > 1 && a.tensor_parallel_rank.is_none()) else {
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

/// One dry run per rank's device; several combine to the fewest blocks of any (one device
/// standing for every rank is its own plan).
fn plan_ranks(a: &Flags) -> Result<(Model, Plan), Failure> {
    let model = model(a)?;
    let mut plans = targets(a)?
        .iter()
        .map(|t| plan_one(a, &model, t))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = match plans.len() {
        1 => plans.pop().expect("one plan"),
        _ => combine_ranks(plans)?,
    };
    Ok((model, plan))
}

/// A `--device` whose total is not the log's: a usage error naming both (the log's figure is
/// printed with 2 decimals of GiB; totals within 0.5 % are the same device).
fn check_device_total(
    t: &Target,
    dev: &str,
    logged: u64,
    line: Option<usize>,
) -> Result<(), Failure> {
    let d = t.total.abs_diff(logged) as f64;
    if d > (logged as f64 * 0.005).max(0.01 * (1u64 << 30) as f64) {
        let at = line.map(|n| format!(" (line {n})")).unwrap_or_default();
        return Err(Failure::usage(format!(
            "--device {dev}: its total {} differs from the log's device total {}{at}; plan the log's device (omit --device) or pass the device the log was written on",
            memplan::bytes::fmt_bytes(t.total),
            memplan::bytes::fmt_bytes(logged)
        )));
    }
    Ok(())
}

/// A plan from a log against the log's own KV count: its KV tokens ("GPU KV cache size: N
/// tokens", SGLang's "#tokens"), else its KV blocks (vLLM V0's "# GPU blocks: N", which every
/// executor prints, `executor/executor_base.py` `initialize_cache`; 0.10's "num_gpu_blocks
/// is: N"). The printed available KV memory has 2 decimals (±5 MiB): within that rounding the
/// KV cache that gives the logged count is taken (said in a note). The plan's tokens are
/// compared as the release prints them (`EngineRules::logged_kv_tokens`): vLLM up to 0.20.0
/// counts every block, the null block included, so the plan's `num_blocks` is the engine's
/// and its usable tokens one block (per group) fewer than the logged count (said in a note).
/// Where the plan still differs by more than one block, a
/// [`Warning::LogDisagrees`](memplan_planner::Warning::LogDisagrees) names the term that
/// differs most.
///
/// The logged blocks are `floor(available / block bytes)` (vLLM 0.6.6 `worker/worker.py`
/// `Worker.determine_num_available_blocks`: `int(available_kv_cache_memory //
/// cache_block_size)`, the available memory unrounded), the plan's `num_blocks`. V0 keeps no
/// null block: all N serve requests, `N x block_size` tokens (the executor's "Maximum
/// concurrency" is `num_gpu_blocks * block_size / max_model_len`), which a note states beside
/// the plan's usable count, which follows V1 (one null block).
fn reconcile(
    a: &mut Flags,
    f: &memplan_model::fromlog::LogFigures,
    log: &extras::LogContext,
    mut plan: Plan,
) -> Result<Plan, Failure> {
    let anchored = log.anchored;
    // The logged count, and the plan's figure it is compared with.
    let (logged, blocks) = match (f.kv_tokens, f.kv_blocks) {
        (Some(t), _) => (t, false),
        (None, Some(b)) if anchored || log.parts_rounding.is_some() => (b, true),
        _ => return Ok(plan),
    };
    // The plan's tokens as the release the log is planned with prints them: vLLM up to 0.20.0
    // counts the null block too (`EngineRules::logged_kv_tokens`).
    let rules = engine_rules(a)?;
    let count = |p: &Plan| {
        if blocks {
            p.kv.num_blocks
        } else {
            rules.logged_kv_tokens(&p.kv)
        }
    };
    let unit = if blocks { "blocks" } else { "tokens" };
    let block = u64::from(plan.kv_spec.block_size).max(1);
    // How far the printed KV memory may be from the engine's: half a hundredth of a GiB for
    // one figure of 2 decimals, a hundredth for SGLang's K and V sizes summed, nothing where
    // the log prints bytes (`LogFigures::kv_available_rounding`).
    let kv_rounding = match f.kv_final {
        Some(_) => (1u64 << 30) / 200,
        None => f.kv_available_rounding.unwrap_or((1u64 << 30) / 200),
    };
    // The budget to search around and how far: the printed KV memory within its rounding, or,
    // where the log prints no KV memory, the budget its printed parts give within theirs
    // (`LogContext::parts_rounding`).
    let window = match (anchored, log.parts_rounding) {
        (true, _) if kv_rounding > 0 => f.kv_final.or(f.kv_available).map(|kv| (kv, kv_rounding)),
        (false, Some(h)) => Some((plan.kv_budget_bytes, h)),
        _ => None,
    };
    if count(&plan).abs_diff(logged) > 0 {
        if let Some((kv, h)) = window {
            let (lo, hi) = (kv.saturating_sub(h), kv + h);
            let mut b = kv;
            for _ in 0..4 {
                if count(&plan) == logged || count(&plan) == 0 {
                    break;
                }
                let per_unit = if blocks {
                    plan.kv.block_bytes as f64
                } else {
                    plan.kv_budget_bytes as f64 / count(&plan) as f64
                };
                let step = (logged as f64 - count(&plan) as f64) * per_unit;
                let next = ((b as f64 + step).round() as u64).clamp(lo, hi);
                if next == b {
                    break;
                }
                let mut trial = a.clone();
                trial.kv_cache_memory_bytes = Some(next);
                let (_, p) = plan_ranks(&trial)?;
                if count(&p).abs_diff(logged) > count(&plan).abs_diff(logged) {
                    break;
                }
                b = next;
                plan = p;
                *a = trial;
            }
            if b != kv {
                let what = if count(&plan) == logged {
                    format!("gives the logged KV {unit}")
                } else {
                    format!(
                        "comes closest to the logged KV {unit} ({} planned, {logged} logged)",
                        count(&plan)
                    )
                };
                let printed = if !anchored {
                    "the parts of its KV budget (total, weights, activation, non-torch memory) to 0.01 GiB each"
                } else if h > (1u64 << 30) / 200 {
                    "its K and V sizes to 0.01 GB each"
                } else {
                    "the available KV memory to 0.01 GiB"
                };
                plan.notes.push(format!(
                    "the log prints {printed}: within that rounding, {} {what}",
                    memplan::bytes::fmt_bytes(b)
                ));
            }
        }
    }
    if blocks && f.legacy_line.is_some() {
        plan.notes.push(format!(
            "vLLM V0 keeps no null block: the logged {logged} blocks{} all serve requests, {} tokens of {block}-token blocks (the usable count here keeps vLLM V1's null block)",
            f.line("kv_blocks")
                .map(|n| format!(" (line {n})"))
                .unwrap_or_default(),
            logged.saturating_mul(block)
        ));
    }
    if !blocks && rules.logged_kv_tokens == LoggedKvTokens::AllBlocks && count(&plan) == logged {
        plan.notes.push(format!(
            "vLLM up to 0.20.0 prints the KV tokens of every block, the null block included (num_blocks // groups x block_size): the logged {logged} tokens{} are {} blocks, {} tokens usable",
            f.line("kv_tokens")
                .map(|n| format!(" (line {n})"))
                .unwrap_or_default(),
            plan.kv.num_blocks,
            plan.kv.tokens
        ));
    }
    // From here on both counts in tokens.
    let (logged, planned) = if blocks {
        (
            logged.saturating_mul(block),
            plan.kv.num_blocks.saturating_mul(block),
        )
    } else {
        (logged, count(&plan))
    };
    if planned.abs_diff(logged) <= block {
        return Ok(plan);
    }
    let c = &plan.consumers;
    let requested = match (f.total, f.utilization) {
        (Some(t), Some(u)) => Some((t as f64 * u).ceil() as u64),
        _ => None,
    };
    let per_token = |b: u64, t: u64| (t > 0).then(|| b / t);
    let mut terms: Vec<(&str, Option<u64>, u64)> = vec![
        ("weights", f.weights, c.bytes(ConsumerKind::Weights)),
        (
            "activation peak",
            a.activation_bytes,
            c.bytes(ConsumerKind::Activation),
        ),
        (
            "non-torch memory",
            a.non_torch_bytes,
            c.bytes(ConsumerKind::NonAllocator),
        ),
        ("requested memory", requested, plan.requested_bytes),
        (
            "KV cache memory",
            f.kv_final.or(f.kv_available),
            plan.kv_budget_bytes,
        ),
    ];
    if f.graph_subtracted {
        terms.push((
            "graph reserve",
            f.graph_estimate,
            c.bytes(ConsumerKind::Graphs),
        ));
    }
    let rounding = (1u64 << 30) / 50;
    let worst = terms
        .iter()
        .filter_map(|(n, l, p)| l.map(|l| (*n, l, *p)))
        .filter(|(_, l, p)| l.abs_diff(*p) > rounding)
        .max_by_key(|(_, l, p)| l.abs_diff(*p));
    let (term, lg, pl) = match worst {
        Some(w) => w,
        None => (
            "KV cache bytes per token",
            f.kv_final
                .or(f.kv_available)
                .and_then(|kv| per_token(kv, logged))
                .unwrap_or(0),
            per_token(plan.kv_budget_bytes, planned).unwrap_or(0),
        ),
    };
    plan.warnings.push(memplan_planner::Warning::LogDisagrees {
        logged_tokens: logged,
        planned_tokens: planned,
        term: term.to_string(),
        logged: lg,
        planned: pl,
    });
    Ok(plan)
}

/// Run `memplan plan`.
pub fn run(a: Args) -> Result<Report, Failure> {
    let mut a = *a.flags;
    if let Some(path) = &a.svg {
        memplan::input::check_output(path, "--svg picture")?;
    }
    let log = extras::apply_log(&mut a)?;
    if let (Some(f), Some(dev), None) = (&log.figures, &a.device, a.total_memory) {
        if let Some(logged) = f.total {
            check_device_total(&target(&a)?, dev, logged, f.line("total"))?;
        }
    }
    let (model, mut plan) = plan_ranks(&a).map_err(|e| log.blame(e))?;
    if let Some(f) = &log.figures {
        plan = reconcile(&mut a, f, &log, plan)?;
        extras::logged_graph_memory(&mut plan, f, log.graphs_as_logged);
    }
    if let (Some(logged), Some(given)) = (&log.model_differs, &a.model) {
        plan.warnings
            .push(memplan_planner::Warning::LogModelDiffers {
                given: given.clone(),
                logged: logged.clone(),
            });
    }
    plan.notes.extend(log.notes);
    plan.notes.extend(engine_note(&a));
    plan.notes
        .extend(extras::llama_cpp_answer(&a, &model, &plan)?);
    let text = match &a.emit_args {
        Some((engine, _)) => {
            let ctx = context(&a, &model)?;
            let args = render_args::engine_args(&plan, &ctx, *engine)?;
            // The pasted line holds flags only; why a block size is left out goes in the notes.
            plan.notes
                .extend(render_args::block_note(&plan, &ctx, *engine));
            format!("{args}\n")
        }
        None => render::text(&plan, &crate::flags::flag_name),
    };
    if let Some(path) = &a.svg {
        std::fs::write(path, render::svg(&plan)).map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: e,
        })?;
    }
    let json = serde_json::to_value(&plan).map_err(|e| Failure::of("internal", e.to_string()))?;
    Ok(Report::new(schema::PLAN, json, text))
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

    fn try_flags(flags: &str) -> Result<Flags, Failure> {
        let args: Vec<&str> = std::iter::once("plan")
            .chain(flags.split_whitespace())
            .collect();
        Cli::try_parse_from(&args)
            .map(|c| *c.args.flags)
            .map_err(|e| {
                crate::parse_failure(&e)
                    .expect("an error, not --help")
                    .as_passed(&args)
            })
    }

    fn flags(flags: &str) -> Flags {
        try_flags(flags).unwrap()
    }

    fn plan(f: &str) -> Result<serde_json::Value, Failure> {
        let (_, p) = plan_ranks(&try_flags(f)?)?;
        Ok(serde_json::to_value(&p).unwrap())
    }

    fn err(f: &str) -> String {
        plan(f).unwrap_err().message
    }

    #[test]
    fn from_log_reproduces_the_h100_start_up_without_retyping() {
        // The vLLM 0.19 Llama-3.1-8B log quote of shared/data: total, utilisation, weights,
        // activation, non-torch, max_model_len and the release come from the log; the printed
        // figures allow 475,776..476,096 tokens (476,016 logged).
        let line = include_str!("../../../memplan-model/tests/data/engine-startup-logs.jsonl")
            .lines()
            .find(|l| l.contains("476,016"))
            .unwrap();
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let path = log_file("h100", e["quote"].as_str().unwrap());
        let mut a = flags(&format!(
            "--model llama-3.1-8b-instruct --from-log {}",
            path.display()
        ));
        let log = extras::apply_log(&mut a).unwrap();
        assert_eq!(a.engine.as_deref(), Some("vllm@0.19"));
        let (_, p) = plan_ranks(&a).unwrap();
        assert!(
            (475_776..=476_096).contains(&p.kv.tokens),
            "{}",
            p.kv.tokens
        );
        assert!(
            log.notes.iter().any(|n| n.contains("476016")),
            "{:?}",
            log.notes
        );
        // Through `run`: the logged count within one block, no disagreement.
        let j = run_json(&format!(
            "--model llama-3.1-8b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        let t = j["kv_cache_tokens"].as_u64().unwrap();
        assert!(t.abs_diff(476_016) <= 16, "{t}");
        assert_eq!(
            j["warnings"]
                .as_array()
                .map(|w| w.iter().filter(|w| w["code"] == "log_disagrees").count()),
            Some(0),
            "{j}"
        );
        // The log's device is a 79.19 GiB H100: a 24 GiB device is a usage error naming both.
        let f = run_json(&format!(
            "--model llama-3.1-8b-instruct --device sim:rtx4090 --from-log {}",
            path.display()
        ))
        .unwrap_err();
        assert_eq!(f.class, crate::ExitClass::Usage, "{f:?}");
        assert!(
            f.message.contains("--device sim:rtx4090") && f.message.contains("79.19 GiB"),
            "{}",
            f.message
        );
        // A flag overrides the log, and the plan says so.
        let j = run_json(&format!(
            "--model llama-3.1-8b-instruct --gpu-memory-utilization 0.9 --from-log {}",
            path.display()
        ))
        .unwrap();
        assert!(
            j["notes"]
                .to_string()
                .contains("--gpu-memory-utilization 0.9 (given) overrides the log's 0.95"),
            "{}",
            j["notes"]
        );
        // Another model than the log's: the plan disagrees, and the warning names the term.
        let j = run_json(&format!(
            "--model qwen2.5-7b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        let w: Vec<_> = j["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["code"] == "log_disagrees")
            .collect();
        assert_eq!(w.len(), 1, "{j}");
        assert!(
            w[0]["term"]
                .as_str()
                .unwrap()
                .contains("KV cache bytes per token"),
            "{}",
            w[0]
        );
        std::fs::write(&path, "not a log").unwrap();
        let mut a = flags(&format!("--model qwen3-8b --from-log {}", path.display()));
        let e = extras::apply_log(&mut a).unwrap_err().message;
        assert!(e.contains("not a recognised engine start-up log"), "{e}");
        // Bad figures are bad file content: exit 1, naming the file, the line and the value.
        std::fs::write(&path, "INFO Model loading took 1.0 GiB\nINFO non-default args: {'gpu_memory_utilization': 5}\n").unwrap();
        let f = run_json(&format!("--model qwen3-8b --from-log {}", path.display())).unwrap_err();
        assert_eq!(f.class, crate::ExitClass::Failure, "{f:?}");
        assert!(
            f.message
                .contains("line 2: gpu_memory_utilization 5 is outside (0, 1]")
                && !f.message.contains("--gpu"),
            "{}",
            f.message
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_raw_current_log_plans_with_nothing_but_the_model() {
        // vLLM 0.27.1 lines as pasted in gpustack/runner#251 (no total printed): the release,
        // the utilisation, the graph estimate (subtracted) and the total they imply.
        let log = "(Worker_TP1 pid=448) INFO 08-14 14:07:22 [gpu_model_runner.py:6806] Estimated CUDA graph memory: 0.36 GiB total\n\
            (Worker_TP1 pid=448) INFO 08-14 14:07:22 [gpu_worker.py:578] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.8200 is equivalent to --gpu-memory-utilization=0.8048 without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase --gpu-memory-utilization to 0.8352.\n\
            (Worker_TP0 pid=447) INFO 08-14 14:07:22 [gpu_worker.py:563] Available KV cache memory: 6.87 GiB\n\
            INFO Initializing a V1 LLM engine (v0.27.1) with config: model='x'\n";
        let path = std::env::temp_dir().join(format!("memplan-log27-{}.txt", std::process::id()));
        std::fs::write(&path, log).unwrap();
        let j = run_json(&format!(
            "--model qwen2.5-0.5b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        std::fs::remove_file(&path).unwrap();
        let t = j["total_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        assert!((t - 23.68).abs() < 0.01, "{t}");
        assert_eq!(j["engine"], "vllm@0.27", "{j}");
        let kv = j["kv_budget_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        assert!((kv - 6.87).abs() < 0.001, "{kv}");
        let notes = j["notes"].to_string();
        assert!(
            notes.contains("prints no device total") && notes.contains("Available KV cache memory"),
            "{notes}"
        );
    }

    #[test]
    fn a_ray_log_plans_the_smallest_worker_and_names_a_cold_compile() {
        // The lines above as Ray's workers print them (`(RayWorkerWrapper pid=.., ip=..)`),
        // after a compile that missed the torch.compile cache: the smaller worker's KV memory
        // is the plan's, and the plan says which worker and that the compile was cold.
        let log = "INFO Initializing a V1 LLM engine (v0.27.1) with config: model='x'\n\
            (RayWorkerWrapper pid=447) INFO 08-14 14:07:02 [backends.py:393] Compiling a graph for compile range (1, 2048) takes 21.57 s\n\
            (RayWorkerWrapper pid=447) INFO 08-14 14:07:22 [gpu_model_runner.py:6806] Estimated CUDA graph memory: 0.36 GiB total\n\
            (RayWorkerWrapper pid=447) INFO 08-14 14:07:22 [gpu_worker.py:578] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.8200 is equivalent to --gpu-memory-utilization=0.8048 without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase --gpu-memory-utilization to 0.8352.\n\
            (RayWorkerWrapper pid=447) INFO 08-14 14:07:22 [gpu_worker.py:563] Available KV cache memory: 6.87 GiB\n\
            (RayWorkerWrapper pid=91, ip=10.0.0.2) INFO 08-14 14:07:22 [gpu_worker.py:563] Available KV cache memory: 6.79 GiB\n";
        let path = std::env::temp_dir().join(format!("memplan-logray-{}.txt", std::process::id()));
        std::fs::write(&path, log).unwrap();
        let j = run_json(&format!(
            "--model qwen2.5-0.5b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        std::fs::remove_file(&path).unwrap();
        let kv = j["kv_budget_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        assert!((kv - 6.79).abs() < 0.001, "{kv}");
        let notes = j["notes"].to_string();
        assert!(
            notes.contains("RayWorkerWrapper pid=91, ip=10.0.0.2")
                && notes.contains("cold torch.compile cache"),
            "{notes}"
        );
    }

    #[test]
    fn a_log_whose_figures_do_not_combine_is_the_logs_fault_not_a_flag() {
        // Each figure is in range, but 3 ranks do not divide Qwen3-8B's heads: the user
        // passed no --tensor-parallel-size, so the error is the file's (exit 1), naming it.
        let path = std::env::temp_dir().join(format!("memplan-logtp-{}.txt", std::process::id()));
        std::fs::write(
            &path,
            "INFO non-default args: {'model': 'Qwen/Qwen3-8B', 'tensor_parallel_size': 3}\n\
             INFO Free memory on device (22.45/23.99 GiB) on startup.\n",
        )
        .unwrap();
        let f = run_json(&format!("--model qwen3-8b --from-log {}", path.display())).unwrap_err();
        assert_eq!(f.class, crate::ExitClass::Failure, "{f:?}");
        assert!(
            f.message.contains(&path.display().to_string()) && f.message.contains("3"),
            "{}",
            f.message
        );
        // The same value passed on the command line stays the user's usage error.
        let f = run_json(&format!(
            "--model qwen3-8b --tp 3 --from-log {}",
            path.display()
        ))
        .unwrap_err();
        assert_eq!(f.class, crate::ExitClass::Usage, "{f:?}");
        std::fs::remove_file(&path).unwrap();
    }

    fn run_json(f: &str) -> Result<serde_json::Value, Failure> {
        let a = Args {
            flags: Box::new(try_flags(f)?),
        };
        Ok(run(a)?.json)
    }

    #[test]
    fn other_memory_users_and_pipeline_stages_from_flags() {
        let base = plan("--model llama-3.1-8b-instruct --total-memory 80GiB --max-model-len 8192")
            .unwrap();
        let pp =
            plan("--model llama-3.1-8b-instruct --total-memory 80GiB --max-model-len 8192 --pp 2")
                .unwrap();
        assert!(pp["kv"]["num_blocks"].as_u64() > base["kv"]["num_blocks"].as_u64());
        // One device's plan is not a combination (so it can still be combined with others'),
        // and a pipeline-parallel dry run says how many stages it planned.
        assert!(
            pp["ranks"].is_null() && base["ranks"].is_null(),
            "{}",
            pp["ranks"]
        );
        assert_eq!(pp["pipeline_parallel_size"], 2);
        let more = plan("--model llama-3.1-8b-instruct --total-memory 80GiB --max-model-len 8192 --max-loras 4 --speculative-model qwen2.5-0.5b-instruct").unwrap();
        assert!(more["kv_cache_tokens"].as_u64() < base["kv_cache_tokens"].as_u64());
        assert!(
            err("--model llama-3.1-8b-instruct --total-memory 80GiB --cpu-offload-gb=-1")
                .contains("cpu-offload-gb")
        );
        // One stage of two: the plan of that stage's ranks; the fewest blocks is the --pp plan.
        let stage = |i: u64| {
            plan(&format!("--model llama-3.1-8b-instruct --total-memory 80GiB --max-model-len 8192 --pp 2 --pipeline-stage {i}")).unwrap()["kv"]["num_blocks"].as_u64().unwrap()
        };
        assert_eq!(
            stage(0).min(stage(1)),
            pp["kv"]["num_blocks"].as_u64().unwrap()
        );
        let e = err("--model llama-3.1-8b-instruct --total-memory 80GiB --pp 2 --pipeline-stage 2");
        assert!(
            e.starts_with("--pipeline-stage 2: stages count from 0"),
            "{e}"
        );
        // A stage's plan says which rank it is (so the ranks' plans combine).
        let r = plan("--model llama-3.1-8b-instruct --total-memory 80GiB --max-model-len 8192 --tp 2 --pp 2 --pipeline-stage 1 --tensor-parallel-rank 1").unwrap();
        assert_eq!(
            r["rank"],
            serde_json::json!({"tensor_parallel_rank": 1, "tensor_parallel_size": 2, "pipeline_parallel_rank": 1, "pipeline_parallel_size": 2})
        );
        assert_eq!(r["pipeline_parallel_size"], 2);
        assert!(err(
            "--model llama-3.1-8b-instruct --total-memory 80GiB --tp 2 --tensor-parallel-rank 2"
        )
        .starts_with("--tensor-parallel-rank 2: ranks count from 0"));
        assert!(err(
            "--model llama-3.1-8b-instruct --total-memory 80GiB --pp 2 --tensor-parallel-rank 0"
        )
        .contains("needs --pipeline-stage"));
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
    fn a_refusal_names_the_flag_that_sets_non_torch_memory() {
        let e = err("--model llama-3.1-8b-instruct --total-memory 24GiB --gpu-memory-utilization 0.9 --max-model-len 8192 --weights-bytes 14.99GiB --activation-bytes 1.89GiB --non-torch-bytes 6GiB --graph-strategy none");
        assert!(
            e.contains("+ non-torch memory (--non-torch-bytes) 6.00 GiB +")
                && !e.contains("non_allocator"),
            "{e}"
        );
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
        let (_, p) = plan_ranks(&a).unwrap();
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
    fn a_device_that_cannot_capture_graphs_gets_no_graph_reserve() {
        // Level Zero on the A770 has no graph capture: a measured start-up there runs eager
        // (the planner's selection says `none`), and the dry run makes the same choice.
        let args = "--model qwen2.5-1.5b-instruct --max-model-len 8192 --device";
        let j = plan(&format!("{args} sim:arc-a770")).unwrap();
        assert_eq!(j["graph"]["strategy"], "none", "{}", j["graph"]);
        assert_eq!(j["consumers"][3]["kind"], "graphs");
        assert_eq!(j["consumers"][3]["bytes"], 0);
        let why = j["graph"]["why"].as_str().unwrap();
        assert!(why.contains("graph capture is not supported"), "{why}");
        let notes = j["notes"].to_string();
        assert!(notes.contains("would run eager"), "{notes}");
        // A device that captures keeps the estimate, and says which strategy would measure it.
        let j = plan(&format!("{args} sim:rtx4090")).unwrap();
        assert_eq!(j["graph"]["strategy"], "estimate");
        assert!(j["consumers"][3]["bytes"].as_u64().unwrap() > 0);
        // `--graph-strategy estimate` is the user's choice, device or not.
        let j = plan(&format!("{args} sim:arc-a770 --graph-strategy estimate")).unwrap();
        assert_eq!(j["graph"]["strategy"], "estimate");
    }

    #[test]
    fn library_concepts_become_this_command_lines_flags() {
        // The model crate names concepts ("tensor-parallel ranks", "pipeline-parallel
        // stages", "model"); the command line names the flag to change.
        let e = err("--model qwen2.5-0.5b-instruct --total-memory 24GiB --tp 4");
        assert!(
            e.starts_with("--tensor-parallel-size: 4 does not divide"),
            "{e}"
        );
        let e = err("--model qwen2.5-0.5b-instruct --total-memory 24GiB --pp 100");
        assert!(e.starts_with("--pipeline-parallel-size: 100 stages"), "{e}");
        let f = plan("--model no-such-model --total-memory 24GiB").unwrap_err();
        assert!(f.message.starts_with("--model: "), "{}", f.message);
        assert!(f.help.get("presets").is_some(), "{f:?}");
        let e = err("--model qwen2.5-0.5b-instruct --total-memory 24GiB --speculative-model nope");
        assert!(e.starts_with("--speculative-model: "), "{e}");
        let e = try_flags("--model qwen3-8b --total-memory 24GiB --engine vllm@0.1")
            .unwrap_err()
            .message;
        assert!(
            e.contains("--engine")
                && e.contains("older than memplan's rules")
                && !e.contains("engine release:"),
            "{e}"
        );
    }

    /// vLLM refuses to start where one request of `--max-model-len` does not fit
    /// (`_check_enough_kv_cache_memory`); SGLang starts and admits requests of at most its pool
    /// less one token (`srt/managers/tp_worker.py` `TpModelWorker`), so its plan stands, warned
    /// by name in the JSON and the text.
    #[test]
    fn sglang_plans_a_pool_shorter_than_the_context_and_names_the_cap() {
        let base = "--model qwen3-8b --total-memory 24GiB --max-model-len 200000";
        assert_eq!(plan(base).unwrap_err().kind, "does_not_fit");
        for engine in ["sglang@0.5.9", "sglang@0.5.14", "sglang"] {
            let j = plan(&format!("{base} --engine {engine}")).unwrap();
            let tokens = j["kv"]["tokens"].as_u64().unwrap();
            assert!(tokens > 0 && tokens < 200_000, "{engine}: {tokens}");
            let w = j["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["code"] == "requests_capped_by_pool")
                .unwrap_or_else(|| panic!("{engine}: {}", j["warnings"]));
            assert_eq!(w["longest"].as_u64(), Some(tokens - 1), "{engine}");
            assert_eq!(w["max_model_len"], 200_000);
            assert!(w["message"]
                .as_str()
                .unwrap()
                .contains("admits requests of at most"));
            assert!(j["sizing_rules"]["long_requests"]["cap_by_pool"]["least_tokens"].is_u64());
        }
        let (_, p) = plan_ranks(&flags(&format!("{base} --engine sglang"))).unwrap();
        let text = render::text(&p, &crate::flags::flag_name);
        assert!(text.contains("warning: the KV cache holds"), "{text}");
    }

    #[test]
    fn errors_say_what_would_fit() {
        let f = plan("--model qwen3-8b --total-memory 24GiB --max-model-len 200000").unwrap_err();
        assert_eq!(
            (f.kind, f.class),
            ("does_not_fit", crate::ExitClass::Failure)
        );
        assert!(f.help["max_model_len_fit"].as_u64().unwrap() > 0, "{f:?}");
        let e = err("--model qwen3-8b --total-memory 24GiB --max-model-len 200000");
        assert!(e.contains("longest --max-model-len that fits"), "{e}");
        let e = err("--model qwen3-8b --total-memory 18GiB --gpu-memory-utilization 0.9");
        assert!(e.contains("--gpu-memory-utilization 0.9"), "{e}");
        assert!(err("--model qwen3-8b").contains("--device"));
        assert!(
            err("--model qwen3-8b --total-memory 24GiB --quantization awq")
                .contains("'--quantization <METHOD>'")
        );
        assert!(
            err("--model qwen3-8b --total-memory 24GiB --gpu-memory-utilization 1.5")
                .contains("'--gpu-memory-utilization <FRACTION>'")
        );
    }

    #[test]
    fn memory_held_outside_the_engine_is_named_not_a_higher_utilisation() {
        // Another process holds 12 GiB of the simulated 24 GiB card: the 16.7 GiB the model
        // needs before any KV cache cannot fit in what is free, whatever the utilisation.
        let f = plan("--model qwen3-8b --device sim:rtx4090,other=12GiB").unwrap_err();
        assert_eq!(f.kind, "does_not_fit", "{f:?}");
        assert!(
            f.help["free_at_start_bytes"].as_u64().unwrap() < 12 << 30,
            "{f:?}"
        );
        assert!(f.message.contains("was free at the start"), "{}", f.message);
        assert!(
            !f.message.contains("--gpu-memory-utilization"),
            "{}",
            f.message
        );
        // With 2 GiB held, a higher utilisation is the way out and is named.
        let e =
            err("--model qwen3-8b --device sim:rtx4090,other=2GiB --gpu-memory-utilization 0.5");
        assert!(e.contains("--gpu-memory-utilization 0.7087 or more"), "{e}");
    }

    #[test]
    fn emitted_args_pin_the_budget() {
        let a = flags(
            "--model qwen3-8b --total-memory 80GiB --max-model-len 8192 --kv-cache-dtype fp8 --engine vllm@0.19",
        );
        let (m, p) = plan_ranks(&a).unwrap();
        let ctx = context(&a, &m).unwrap();
        let vllm = render_args::engine_args(&p, &ctx, Engine::Vllm).unwrap();
        assert!(
            vllm.contains(&format!("--kv-cache-memory-bytes {} ", p.kv_budget_bytes))
                && vllm.contains("--kv-cache-dtype fp8_e4m3"),
            "{vllm}"
        );
        let sg = render_args::engine_args(&p, &ctx, Engine::Sglang).unwrap();
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

    /// `--emit-args sglang` writes the static fraction a plan carries
    /// (`Suggestions::engine_static_fraction`: a measured start-up's, which SGLang's own pool
    /// rule needs to reach its cache, 0.5.9 `model_runner_kv_cache_mixin.py`
    /// `profile_max_num_token`, 0.5.23 `kv_cache_configurator.py` `_profile_available_bytes`),
    /// and the request's share where it carries none (a dry run); either over the cut of a
    /// multimodal model's fraction (SGLang 0.4.4 to 0.4.8, `ModelRunner.__init__`).
    #[test]
    fn emitted_sglang_args_write_the_static_fraction_the_plan_suggests() {
        let a = flags(
            "--model qwen3-8b --total-memory 80GiB --max-model-len 8192 --engine sglang@0.5.23 --gpu-memory-utilization 0.85",
        );
        let (m, mut p) = plan_ranks(&a).unwrap();
        let ctx = context(&a, &m).unwrap();
        // The fraction `--emit-args sglang` writes.
        let fraction = |p: &Plan, c: &render_args::Context| {
            let args = render_args::engine_args(p, c, Engine::Sglang).unwrap();
            let (_, rest) = args.split_once("--mem-fraction-static ").unwrap();
            rest.split(' ').next().unwrap().to_string()
        };
        assert_eq!(p.suggestions.engine_static_fraction, None);
        assert_eq!(fraction(&p, &ctx), "0.850");
        p.suggestions.engine_static_fraction = Some(0.912);
        assert_eq!(fraction(&p, &ctx), "0.912");
        let cut = render_args::Context {
            fraction_cut: 0.95,
            ..ctx.clone()
        };
        // 0.912 / 0.95 = 0.96; without the suggestion, 0.85 / 0.95 = 0.8947.. rounded up.
        assert_eq!(fraction(&p, &cut), "0.960");
        p.suggestions.engine_static_fraction = None;
        assert_eq!(fraction(&p, &cut), "0.895");
    }

    /// The dry run reads no free memory after the weights, so an SGLang plan on a device others
    /// hold memory on is made by the older model of its pool rule (`share_of_free`): within
    /// the request's share of the memory free at the start, with no static fraction of its
    /// own; the flags write the request's share.
    #[test]
    fn a_dry_run_of_sglang_beside_others_plans_within_the_share_of_the_free_memory() {
        let a = flags(
            "--model qwen2.5-1.5b-instruct --device sim:rtx4090,other=8GiB --max-model-len 8192 --engine sglang@0.5.23 --gpu-memory-utilization 0.9",
        );
        let (m, p) = plan_ranks(&a).unwrap();
        assert_eq!(
            p.sizing_rules.start_check,
            memplan::kv::StartCheck::ShareOfFree
        );
        let request = (p.total_bytes as f64 * 0.9).ceil() as u64;
        assert!(p.requested_bytes < request, "{}", p.requested_bytes);
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("within the request's share of that free memory")),
            "{:?}",
            p.notes
        );
        assert_eq!(p.suggestions.engine_static_fraction, None);
        let sg = render_args::engine_args(&p, &context(&a, &m).unwrap(), Engine::Sglang).unwrap();
        assert!(sg.contains("--mem-fraction-static 0.900 "), "{sg}");
    }

    /// The vllm-ascend installation docs' single-NPU check (vLLM 0.18.0), lines as printed:
    /// vllm-ascend set 128-token blocks (`vllm_ascend/utils.py` `refresh_block_size`); its
    /// config line says Qwen3-0.6B, its 36 layers and 15.29 GB of weights are Qwen3-8B's.
    const ASCEND_QWEN3_LOG: &str = "INFO 05-12 11:29:29 [utils.py:1186] Block size is set to 128 if prefix cache or chunked prefill is enabled.\n\
             (EngineCore pid=970) INFO 05-12 11:29:29 [core.py:103] Initializing a V1 LLM engine (v0.18.0) with config: model='Qwen/Qwen3-0.6B', speculative_config=None, tokenizer='Qwen/Qwen3-0.6B', dtype=torch.bfloat16, max_seq_len=40960, tensor_parallel_size=1\n\
             (EngineCore pid=970) INFO 05-12 11:34:57 [model_runner_v1.py:2599] Loading model weights took 15.2859 GB\n\
             (EngineCore pid=970) INFO 05-12 11:35:44 [worker.py:357] Available KV cache memory: 39.06 GiB\n\
             (EngineCore pid=970) INFO 05-12 11:35:44 [kv_cache_utils.py:1316] GPU KV cache size: 284,416 tokens\n";

    fn emitted(f: &str, e: Engine) -> Result<String, Error> {
        let a = flags(f);
        let (m, p) = plan_ranks(&a).unwrap();
        render_args::engine_args(&p, &context(&a, &m)?, e)
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

    #[test]
    fn mamba_dtype_flags_size_the_state_and_are_emitted() {
        use memplan::kv::AttentionKind;
        use memplan_model::arch::state::MambaDtype;
        // Nemotron-3-Nano-30B-A3B's real config (bf16, `mamba_ssm_cache_dtype` "float32"):
        // 23 Mamba2 layers of 64 heads of 64, 8 groups of state 128, kernel 4. Conv (4,096 +
        // 2 x 8 x 128) x 3 = 18,432 elements in bf16 = 36,864 B; SSM 64 x 64 x 128 =
        // 524,288 elements, in float32 (auto: the config's, vLLM 0.19.0
        // `NemotronHForCausalLMConfig.verify_and_update_config`) 2,097,152 B: 2,134,016; with
        // --mamba-ssm-cache-dtype float16 1,048,576 B: 1,085,440.
        let line = include_str!("../../../memplan-model/tests/data/weight-configs.jsonl")
            .lines()
            .find(|l| l.contains("\"nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16\""))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let dir = std::env::temp_dir().join(format!("memplan-nano-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("config.json");
        std::fs::write(&cfg, v["config"].to_string()).unwrap();
        let base = format!(
            "--model {} --total-memory 80GiB --max-model-len 4096 --engine vllm@0.19",
            cfg.display()
        );
        let state = |f: &str| {
            let (_, p) = plan_ranks(&flags(&format!("{base} {f}"))).unwrap();
            let bytes = p
                .kv_spec
                .groups
                .iter()
                .find_map(|g| match g.attention {
                    AttentionKind::State { bytes, .. } => Some(bytes),
                    _ => None,
                })
                .unwrap();
            (bytes, p.notes.clone())
        };
        assert_eq!(state("").0, 2_134_016);
        assert_eq!(state("--mamba-ssm-cache-dtype auto").0, 2_134_016);
        let (b, notes) = state("--mamba-ssm-cache-dtype float16");
        assert_eq!(b, 1_085_440);
        assert!(
            notes.iter().any(|n| n.starts_with(
                "--mamba-ssm-cache-dtype float16: the recurrent-state layers' SSM state"
            )),
            "{notes:?}"
        );
        // --mamba-cache-dtype float32: the conv state 18,432 x 4 = 73,728 B, the SSM state
        // still the config's float32: 2,170,880.
        assert_eq!(state("--mamba-cache-dtype FLOAT32").0, 2_170_880);
        // vLLM 0.19.0's `MambaDType` has no bfloat16: a usage error naming the flag.
        let e = try_flags(&format!("{base} --mamba-ssm-cache-dtype bfloat16")).unwrap_err();
        assert!(
            e.message.contains("--mamba-ssm-cache-dtype")
                && e.message.contains("auto, float32 or float16"),
            "{}",
            e.message
        );
        // Emitted for vLLM as given; SGLang has no flag for the conv state's dtype (only
        // SGLANG_MAMBA_CONV_DTYPE): refused.
        let f = format!("{base} --mamba-ssm-cache-dtype float16 --mamba-cache-dtype float32");
        let v = emitted(&f, Engine::Vllm).unwrap();
        assert!(
            v.contains(" --mamba-cache-dtype float32")
                && v.contains(" --mamba-ssm-cache-dtype float16"),
            "{v}"
        );
        let e = emitted(&f, Engine::Sglang).unwrap_err().to_string();
        assert!(e.contains("--mamba-cache-dtype is vLLM's flag"), "{e}");
        // The SSM state's alone: SGLang's --mamba-ssm-dtype (`srt/arg_groups/fields/exec_.py`
        // 0.5.23, `server_args.py` 0.5.14), which 0.5.1 lacks.
        let f = format!("{base} --mamba-ssm-cache-dtype float16");
        let s = emitted(&f, Engine::Sglang).unwrap();
        assert!(s.ends_with(" --mamba-ssm-dtype float16"), "{s}");
        let old = f.replace("--engine vllm@0.19", "--engine sglang@0.5.9");
        let e = emitted(&old, Engine::Sglang).unwrap_err().to_string();
        assert!(e.contains("from 0.5.14 on"), "{e}");
        let new = f.replace("--engine vllm@0.19", "--engine sglang@0.5.14");
        assert!(emitted(&new, Engine::Sglang)
            .unwrap()
            .ends_with(" --mamba-ssm-dtype float16"));
        // A model without recurrent-state layers: the flag changes nothing, and says so.
        let (_, p) = plan_ranks(&flags(
            "--model qwen3-8b --total-memory 80GiB --mamba-ssm-cache-dtype float16",
        ))
        .unwrap();
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("no recurrent-state layers")),
            "{:?}",
            p.notes
        );
        // --from-log: the start-up's non-default args fill both flags.
        let log_line = include_str!("../../../memplan-model/tests/data/engine-startup-logs.jsonl")
            .lines()
            .find(|l| l.contains("476,016"))
            .unwrap();
        let e: serde_json::Value = serde_json::from_str(log_line).unwrap();
        let text = format!(
            "(APIServer pid=1) INFO 04-20 17:00:40 [utils.py:233] non-default args: {{'mamba_cache_dtype': 'float32', 'mamba_ssm_cache_dtype': 'float16'}}\n{}",
            e["quote"].as_str().unwrap()
        );
        let path = log_file("mamba", &text);
        let mut a = flags(&format!(
            "--model llama-3.1-8b-instruct --from-log {}",
            path.display()
        ));
        let log = extras::apply_log(&mut a).unwrap();
        assert_eq!(
            (a.mamba_cache_dtype.0, a.mamba_ssm_cache_dtype.0),
            (Some(MambaDtype::Float32), Some(MambaDtype::Float16))
        );
        assert!(
            log.filled.contains(&"--mamba-ssm-cache-dtype")
                && log.filled.contains(&"--mamba-cache-dtype"),
            "{:?}",
            log.filled
        );
        // A flag on the command line wins over the log.
        let mut a = flags(&format!(
            "--model llama-3.1-8b-instruct --mamba-ssm-cache-dtype float32 --from-log {}",
            path.display()
        ));
        extras::apply_log(&mut a).unwrap();
        assert_eq!(a.mamba_ssm_cache_dtype.0, Some(MambaDtype::Float32));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_logged_prefix_cached_hybrid_start_up_keeps_two_state_pages() {
        // A public vLLM 0.23.1rc1.dev531 start-up of nvidia/Qwen3.6-27B-NVFP4 (code index id
        // 61544841280) with `enable_prefix_caching=True`: vLLM keeps the gated-DeltaNet states
        // in 'align' mode, 2 pages a request (`v1/kv_cache_interface.py`,
        // `MambaSpec.max_memory_usage_bytes`, 0.23.0). By hand: 64 layers, 16 full attention
        // with 4 KV heads of 256 in fp8 (2,048 B a token), 48 gated DeltaNet: conv (2 x 16 x
        // 128 + 48 x 128) x 3 = 30,720 bf16 = 61,440 B, recurrent 48 x 128 x 128 float32 =
        // 3,145,728 B: 3,207,168 B, so blocks of 16 x cdiv(3,207,168, 16 x 2,048) = 1,568
        // tokens, pages of 3,211,264 B. Groups of 16 layers: 1 attention + 3 state groups.
        // 47.84 GiB / (16 x 3,211,264) = 999 blocks. A request: cdiv(262,144, 1,568) = 168
        // attention blocks + 3 x 2 state pages = 174; int(999 / 174 x 262,144) = 1,505,068
        // tokens, as logged (one page a state, 171 a request, gives 1,531,472).
        let line = include_str!("../../../memplan-model/tests/data/weight-configs.jsonl")
            .lines()
            .find(|l| l.contains("\"nvidia/Qwen3.6-27B-NVFP4\""))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let dir = std::env::temp_dir().join(format!("memplan-q36-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), v["config"].to_string()).unwrap();
        let log = |prefix: &str| {
            format!(
                "(EngineCore pid=134) INFO 07-02 21:27:42 [core.py:114] Initializing a V1 LLM engine (v0.23.1rc1.dev531+ga65f93fb2) with config: model='nvidia/Qwen3.6-27B-NVFP4', dtype=torch.bfloat16, max_seq_len=262144, tensor_parallel_size=1, quantization=modelopt_mixed, enforce_eager=False, kv_cache_dtype=fp8, device_config=cuda, enable_prefix_caching={prefix}, enable_chunked_prefill=True\n\
                 (EngineCore pid=134) INFO 07-02 21:30:03 [gpu_model_runner.py:5255] Model loading took 19.78 GiB memory and 129.689615 seconds\n\
                 (EngineCore pid=134) INFO 07-02 21:30:03 [interface.py:773] Setting attention block size to 1568 tokens to ensure that attention page size is >= mamba page size.\n\
                 (EngineCore pid=134) INFO 07-02 21:33:32 [gpu_model_runner.py:6588] Estimated CUDA graph memory: 0.61 GiB total\n\
                 (EngineCore pid=134) INFO 07-02 21:33:32 [gpu_worker.py:515] Available KV cache memory: 47.84 GiB\n\
                 (EngineCore pid=134) INFO 07-02 21:33:32 [gpu_worker.py:530] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.7000 is equivalent to --gpu-memory-utilization=0.6950 without CUDA graph memory profiling.\n\
                 (EngineCore pid=134) INFO 07-02 21:33:32 [kv_cache_utils.py:2146] GPU KV cache size: 1,505,068 tokens\n\
                 (EngineCore pid=134) INFO 07-02 21:33:32 [kv_cache_utils.py:2147] Maximum concurrency for 262,144 tokens per request: 5.74x\n"
            )
        };
        let path = log_file("q36-prefix", &log("True"));
        let j = run_json(&format!(
            "--from-log {} --model {}",
            path.display(),
            dir.join("config.json").display()
        ))
        .unwrap();
        assert_eq!(j["kv"]["block_size"], 1568, "{j}");
        assert_eq!(j["kv"]["num_blocks"], 999, "{j}");
        assert_eq!(j["kv_cache_tokens"], 1_505_068, "{j}");
        let args = j["engine_args"]["vllm"].as_str().unwrap();
        assert!(args.ends_with(" --enable-prefix-caching"), "{args}");
        assert!(
            !j["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["code"] == "log_disagrees"),
            "{j}"
        );
        // The same start-up with prefix caching off keeps one page a state: 171 blocks a
        // request, int(999 / 171 x 262,144) = 1,531,472 (the log then disagrees).
        let off = log_file("q36-noprefix", &log("False"));
        let j = run_json(&format!(
            "--from-log {} --model {}",
            off.display(),
            dir.join("config.json").display()
        ))
        .unwrap();
        assert_eq!(j["kv_cache_tokens"], 1_531_472, "{j}");
        // The flag on the command line wins over the log, and vLLM's flag is emitted.
        let mut a = flags(&format!(
            "--from-log {} --model {} --no-enable-prefix-caching",
            path.display(),
            dir.join("config.json").display()
        ));
        extras::apply_log(&mut a).unwrap();
        assert_eq!(a.prefix_caching(), Some(false));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn nemotron_h_ssm_state_follows_the_release_default() {
        use memplan::kv::AttentionKind;
        // Nemotron-H-56B-Base-8K's real config names no `mamba_ssm_cache_dtype`. vLLM 0.19.0
        // (`model_executor/models/config.py`, `NemotronHForCausalLMConfig`
        // `.verify_and_update_config`) then uses `getattr(hf_config, "mamba_ssm_cache_dtype",
        // "float16")`; 0.20.0 on, `DEFAULT_MAMBA_SSM_CACHE_DTYPE = "float32"`. Per Mamba2
        // layer: conv (16,384 + 2 x 8 x 256) x 3 = 61,440 bf16 elements = 122,880 B; SSM 256
        // heads x 64 x 256 = 4,194,304 elements: float16 8,388,608 B (8,511,488 in all),
        // float32 16,777,216 B (16,900,096).
        let line = include_str!("../../../memplan-model/tests/data/weight-configs.jsonl")
            .lines()
            .find(|l| l.contains("\"nvidia/Nemotron-H-56B-Base-8K\""))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let dir = std::env::temp_dir().join(format!("memplan-56b-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("config.json");
        std::fs::write(&cfg, v["config"].to_string()).unwrap();
        let notes = |f: &str| {
            let (_, p) = plan_ranks(&flags(&format!(
                "--model {} --total-memory 2048GiB --max-model-len 4096 {f}",
                cfg.display()
            )))
            .unwrap();
            p.notes
        };
        assert!(
            notes("--engine vllm@0.19").iter().any(|n| n.contains(
                "names no mamba_ssm_cache_dtype: vLLM 0.19 keeps this Nemotron-H model's SSM state in float16"
            )),
            "{:?}",
            notes("--engine vllm@0.19")
        );
        let state = |f: &str| {
            let (_, p) = plan_ranks(&flags(&format!(
                "--model {} --total-memory 2048GiB --max-model-len 4096 {f}",
                cfg.display()
            )))
            .unwrap();
            p.kv_spec
                .groups
                .iter()
                .find_map(|g| match g.attention {
                    AttentionKind::State { bytes, .. } => Some(bytes),
                    _ => None,
                })
                .unwrap()
        };
        assert_eq!(state("--engine vllm@0.19"), 8_511_488);
        assert_eq!(state("--engine vllm@0.20.0"), 16_900_096);
        assert_eq!(state("--engine vllm@0.34"), 16_900_096);
        assert_eq!(state(""), 16_900_096);
        // The flag wins over the release's default.
        assert_eq!(
            state("--engine vllm@0.19 --mamba-ssm-cache-dtype float32"),
            16_900_096
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn emitted_args_are_only_what_the_engine_accepts() {
        let f = "--model qwen3-8b --total-memory 80GiB --max-model-len 8192";
        // vLLM 0.19 has no int8 cache (CacheDType, vllm/config/cache.py); 0.34 does.
        let e = emitted(
            &format!("{f} --kv-cache-dtype int8 --engine vllm@0.19"),
            Engine::Vllm,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no int8"), "{e}");
        // Block sizes: multiples of 16 for vLLM's attention backends.
        let e = emitted(&format!("{f} --block-size 7"), Engine::Vllm)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiples of 16"), "{e}");
        // max_num_batched_tokens >= max_num_seqs (SchedulerConfig).
        let e = emitted(
            &format!("{f} --max-num-seqs 4096 --max-num-batched-tokens 2048"),
            Engine::Vllm,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(">= max-num-seqs"), "{e}");
        // A float32 cache is not `auto` on a bfloat16 model: refused, or emitted with --dtype.
        let e = emitted(&format!("{f} --kv-cache-dtype fp32"), Engine::Vllm)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--dtype float32"), "{e}");
        let v = emitted(
            &format!("{f} --dtype float32 --kv-cache-dtype fp32"),
            Engine::Vllm,
        )
        .unwrap();
        assert!(
            v.contains("--kv-cache-dtype auto") && v.contains("--dtype float32"),
            "{v}"
        );
        // What changes the plan is emitted too.
        let v = emitted(
            &format!("{f} --quantization fp8 --enforce-eager"),
            Engine::Vllm,
        )
        .unwrap();
        assert!(
            v.contains("--quantization fp8") && v.contains("--enforce-eager"),
            "{v}"
        );
        let s = emitted(&format!("{f} --block-size 32"), Engine::Sglang).unwrap();
        assert!(s.contains("--page-size 32"), "{s}");
    }

    /// `--emit-args` writes a block size only where one was given (`--block-size`, or a log of
    /// the same engine that ran with one): a default the plan took is left to the engine,
    /// which picks it again, and is never written where the engine would refuse it or align
    /// it anew (an SGLang plan's 1-token pages for vLLM, a hybrid's aligned block).
    #[test]
    fn emitted_args_write_a_block_size_only_where_one_was_given() {
        let f = "--model qwen3-8b --total-memory 80GiB --max-model-len 8192";
        for (flags, e) in [
            (f.to_string(), Engine::Vllm),
            (f.to_string(), Engine::Sglang),
            (format!("{f} --engine vllm@0.19"), Engine::Sglang),
            // Planned by SGLang's rules: 1-token pages.
            (format!("{f} --engine sglang"), Engine::Vllm),
        ] {
            let v = emitted(&flags, e).unwrap();
            assert!(
                !v.contains("--block-size") && !v.contains("--page-size"),
                "{flags}: {v}"
            );
        }
        // Jamba under vLLM 0.19's rules: an 80-token block aligned to its Mamba state, which
        // vLLM aligns again by itself.
        let jamba = std::env::temp_dir().join(format!("memplan-jamba-{}.json", std::process::id()));
        std::fs::write(
            &jamba,
            r#"{"architectures":["JambaForCausalLM"],"model_type":"jamba","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"num_experts":16,"num_experts_per_tok":2,"attn_layer_period":8,"attn_layer_offset":4,"mamba_d_state":16,"mamba_d_conv":4,"mamba_expand":2,"vocab_size":65536,"max_position_embeddings":262144,"torch_dtype":"bfloat16"}"#,
        )
        .unwrap();
        let hybrid = format!(
            "--model {} --device sim:h200 --tensor-parallel-size 4 --engine vllm@0.19",
            jamba.display()
        );
        let (_, p) = plan_ranks(&flags(&hybrid)).unwrap();
        assert_eq!(p.kv_spec.block_size, 80);
        let v = emitted(&hybrid, Engine::Vllm).unwrap();
        assert!(!v.contains("--block-size"), "{v}");
        // The plan's notes say why (the line itself holds flags only).
        let j = run_json(&format!("{hybrid} --emit-args vllm")).unwrap();
        let said = j["notes"].as_array().unwrap().iter().any(|n| {
            n.as_str().unwrap().contains(&format!(
                "writes no --block-size: the plan's {}-token block is this hybrid's",
                p.kv_spec.block_size
            ))
        });
        assert!(said, "{}", j["notes"]);
        // A block size given is written as given (vLLM takes any positive size at parse time;
        // its backends want multiples of 16), and no note is added.
        let j = run_json(&format!("{hybrid} --block-size 48 --emit-args vllm")).unwrap();
        assert!(
            !j["notes"].to_string().contains("writes no --block-size"),
            "{}",
            j["notes"]
        );
        let v = emitted(&format!("{hybrid} --block-size 48"), Engine::Vllm).unwrap();
        let _ = std::fs::remove_file(&jamba);
        assert!(v.contains("--block-size 48"), "{v}");
        // A block size the user gives is written for either engine.
        let v = emitted(
            &format!("{f} --engine sglang --block-size 32"),
            Engine::Vllm,
        )
        .unwrap();
        assert!(v.contains("--block-size 32"), "{v}");
        // A vLLM log's block size is repeated for vLLM, not as SGLang's page size.
        let path = log_file("ascend-block", ASCEND_QWEN3_LOG);
        let j = run_json(&format!("--model qwen3-8b --from-log {}", path.display())).unwrap();
        let args = &j["engine_args"];
        assert!(
            args["vllm"].as_str().unwrap().contains("--block-size 128"),
            "{args}"
        );
        assert!(
            !args["sglang"].as_str().unwrap().contains("--page-size"),
            "{args}"
        );
    }

    #[test]
    fn an_apu_plans_from_its_usable_memory() {
        // The APU's total is bounded by the host's available memory (as the real backend
        // declares it), not the VRAM aperture: the plan uses the usable memory.
        let j = plan("--model qwen3-8b --device sim:strix-halo --max-model-len 8192").unwrap();
        assert_eq!(j["total_bytes"], 64u64 << 30, "{j}");
    }

    #[test]
    fn every_count_flag_outside_its_range_is_a_usage_error_naming_it() {
        let base = "--model qwen3-8b --total-memory 80GiB";
        let flags = [
            ("--pp", ""),
            ("--pipeline-parallel-size", ""),
            ("--max-loras", ""),
            ("--max-lora-rank", "--max-loras 1"),
            (
                "--num-speculative-tokens",
                "--speculative-model qwen2.5-0.5b-instruct",
            ),
            ("--cpu-offload-gb", ""),
            ("--tp", ""),
            ("--max-model-len", ""),
            ("--max-num-seqs", ""),
            ("--max-num-batched-tokens", ""),
            ("--block-size", ""),
        ];
        let values = [
            "-1",
            "18446744073709551615",
            "18446744073709551616",
            "1e308",
            "NaN",
            "inf",
            "0x10",
            "1_000",
        ];
        for (flag, extra) in flags {
            for v in values.iter().chain(
                // 0 is a valid amount of offloaded weights; a count of 0 is not.
                (flag != "--cpu-offload-gb").then_some(&"0"),
            ) {
                let f = format!("{base} {extra} {flag}={v}");
                let e = try_flags(&f).unwrap_err();
                assert_eq!(e.class, crate::ExitClass::Usage, "{f}: {e:?}");
                assert!(e.message.contains(flag), "{f}: {}", e.message);
            }
        }
        // Flags that only mean something beside another are refused without it.
        for f in ["--num-speculative-tokens 3", "--max-lora-rank 64"] {
            let e = try_flags(&format!("{base} {f}")).unwrap_err();
            assert_eq!(e.class, crate::ExitClass::Usage, "{f}: {e:?}");
        }
    }

    /// A negative value written after its flag with a space (as vLLM's `--max-model-len -1`
    /// is) is that flag's value, refused naming it, not the unknown argument `-1`.
    #[test]
    fn a_negative_value_after_a_space_is_refused_naming_its_flag() {
        for (flag, extra, value) in [
            ("--gpu-memory-utilization", "", "-0.5"),
            ("--gpu-memory-utilization", "", "-inf"),
            ("--max-model-len", "", "-1"),
            ("--max-num-seqs", "", "-1"),
            ("--max-num-batched-tokens", "", "-1"),
            ("--block-size", "", "-16"),
            ("--tp", "", "-2"),
            ("--pp", "", "-2"),
            ("--pipeline-stage", "--pp 2", "-1"),
            ("--tensor-parallel-rank", "--tp 2", "-1"),
            ("--cudagraph-capture-sizes", "", "-1"),
            ("--max-loras", "", "-1"),
            ("--max-lora-rank", "--max-loras 1", "-16"),
            ("--cpu-offload-gb", "", "-1"),
            ("--cpu-offload-gb", "", "-inf"),
            (
                "--num-speculative-tokens",
                "--speculative-model qwen2.5-0.5b-instruct",
                "-1",
            ),
            ("--device sim:rtx4090 --total-memory", "", "-80GiB"),
            ("--kv-cache-memory-bytes", "", "-1GiB"),
            ("--weights-bytes", "", "-1"),
            ("--activation-bytes", "", "-1GiB"),
            ("--non-torch-bytes", "", "-1MiB"),
            ("--graph-bytes", "", "-1GiB"),
        ] {
            let base = match flag.split_once(' ') {
                Some(_) => "--model qwen3-8b",
                None => "--model qwen3-8b --total-memory 80GiB",
            };
            let f = format!("{base} {extra} {flag} {value}");
            let flag = flag.rsplit(' ').next().unwrap_or(flag);
            let e = try_flags(&f).unwrap_err();
            assert_eq!(e.class, crate::ExitClass::Usage, "{f}: {e:?}");
            assert!(
                e.message.contains(flag) && e.message.contains(value),
                "{f}: {}",
                e.message
            );
            assert!(
                !e.message.contains("unexpected argument"),
                "{f}: {}",
                e.message
            );
        }
    }

    #[test]
    fn a_patch_release_takes_its_minor_versions_rules_and_says_so() {
        for (engine, rules) in [
            ("vllm@0.34.1", "vllm@0.34"),
            ("sglang@0.5.9", "sglang@0.5"),
            ("vllm@0.27.1", "vllm@0.27"),
        ] {
            let a = flags(&format!(
                "--model qwen3-8b --total-memory 80GiB --max-model-len 8192 --engine {engine}"
            ));
            let n = engine_note(&a).unwrap();
            assert!(n.contains(engine) && n.contains(rules), "{n}");
            assert!(plan_ranks(&a).is_ok());
        }
        let a = flags("--model qwen3-8b --total-memory 80GiB --engine vllm@0.34");
        assert_eq!(engine_note(&a), None);
        let e =
            try_flags("--model qwen3-8b --total-memory 80GiB --engine vllm@0.35.0").unwrap_err();
        assert!(
            e.message.contains("--engine") && e.message.contains("newer"),
            "{e:?}"
        );
    }

    #[test]
    fn a_device_held_entirely_by_other_processes_does_not_fit() {
        for engine in ["", "--engine vllm@0.32", "--engine sglang"] {
            let f = format!("--model qwen3-8b --device sim:rtx4090,other=24GiB {engine}");
            let e = plan(&f).unwrap_err();
            assert_eq!(
                (e.class, e.kind),
                (crate::ExitClass::Failure, "does_not_fit"),
                "{f}: {e:?}"
            );
            assert!(!e.message.contains("--gpu-memory-utilization:"), "{e:?}");
        }
    }

    #[test]
    fn bad_values_are_usage_errors_naming_the_flag() {
        for f in [
            "--model qwen3-8b --total-memory 24GiB --gpu-memory-utilization NaN",
            "--model qwen3-8b --total-memory 24GiB --max-num-seqs 9223372036854775808",
            "--model qwen3-8b --device sim:rtx4090,ohter=2GiB",
            "--model qwen3-8b --total-memory 24GiB --device sim:rtx4090,ohter=2GiB",
            "--model qwen3-8b --total-memory 24GiB --enforce-eager --graph-bytes 1GiB",
            "--model nope",
        ] {
            let e = plan(f).unwrap_err();
            assert_eq!(e.class, crate::ExitClass::Usage, "{f}: {e:?}");
        }
        let e = plan("--model nope").unwrap_err();
        assert!(e.help["presets"].as_array().unwrap().len() > 10, "{e:?}");
    }

    /// A log written for one test, removed when the test ends (the temporary directory is
    /// shared, and test runs should leave nothing in it).
    struct TempLog(std::path::PathBuf);

    impl std::ops::Deref for TempLog {
        type Target = std::path::Path;
        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl AsRef<std::path::Path> for TempLog {
        fn as_ref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for TempLog {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn log_file(tag: &str, text: &str) -> TempLog {
        let path =
            std::env::temp_dir().join(format!("memplan-log-{tag}-{}.txt", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempLog(path)
    }

    /// A log that prints no device total gives it from what its start-up used over the
    /// utilisation that start-up requested it with (its own, else the release's default); a
    /// --gpu-memory-utilization given now plans another request on that device, not another
    /// device (0.1 made the 118 GiB device of 106 GiB used at 0.9 a 1 TiB one).
    #[test]
    fn a_utilisation_given_now_does_not_change_the_device_a_log_gives() {
        let path = log_file(
            "no-total-utilisation",
            "INFO [api_server.py:1] vLLM API server version 0.11.0\n\
             INFO [utils.py:233] non-default args: {'model': 'Qwen/Qwen3-8B'}\n\
             INFO [gpu_model_runner.py:2653] Model loading took 15.27 GiB and 20.4 seconds\n\
             INFO [gpu_worker.py:298] Available KV cache memory: 50.00 GiB\n",
        );
        let log = format!("--model qwen3-8b --from-log {}", path.display());
        let total = |extra: &str| {
            run_json(&format!("{log} {extra}")).unwrap()["total_bytes"]
                .as_u64()
                .unwrap()
        };
        let logged = total("");
        for u in ["0.5", "0.95"] {
            assert_eq!(
                total(&format!("--gpu-memory-utilization {u}")),
                logged,
                "--gpu-memory-utilization {u}"
            );
        }
        // 0.1 of that device is less than the weights: no plan, not a larger device.
        let e = run_json(&format!("{log} --gpu-memory-utilization 0.1")).unwrap_err();
        assert_eq!(e.kind, "does_not_fit", "{e:?}");
    }

    #[test]
    fn a_logged_start_up_refused_for_free_memory_is_that_refusal() {
        // A public vLLM 0.19.0 log (Qwen3-0.6B, a 12 GB card holding 2.6 GiB of another
        // process's): the engine refused to start (`gpu_worker.py` `init_device`).
        let path = log_file(
            "free-refused",
            "(EngineCore pid=229) INFO 04-03 15:05:56 [core.py:105] Initializing a V1 LLM engine (v0.19.0) with config: model='Qwen/Qwen3-0.6B', tokenizer='Qwen/Qwen3-0.6B'\n\
             (EngineCore pid=229) ERROR 04-03 15:05:56 [core.py:1108] EngineCore failed to start.\n\
             (EngineCore pid=229) ERROR 04-03 15:05:56 [core.py:1108] ValueError: Free memory on device cuda:0 (9.02/11.63 GiB) on startup is less than desired GPU memory utilization (0.9, 10.47 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n",
        );
        let f = run_json(&format!("--from-log {}", path.display())).unwrap_err();
        assert_eq!(f.kind, "does_not_fit", "{f:?}");
        assert!(
            f.message.contains("line 3") && f.message.contains("at most 0.7755"),
            "{}",
            f.message
        );
        assert!(f.help["free_at_start_bytes"].as_u64().is_some(), "{f:?}");
        // The start-up's own report of the same figures (no refusal) plans.
        let ok = log_file(
            "free-ok",
            "Initializing a V1 LLM engine (v0.19.0) with config: model='Qwen/Qwen3-0.6B'\n\
             Free memory on device (11.20/11.63 GiB) on startup. Desired GPU memory utilization is (0.9, 10.47 GiB).\n",
        );
        assert!(run_json(&format!("--from-log {}", ok.display())).is_ok());
        // A utilisation given on the command line is another request: it plans.
        assert!(run_json(&format!(
            "--from-log {} --gpu-memory-utilization 0.75",
            path.display()
        ))
        .is_ok());
    }

    #[test]
    fn an_undated_log_whose_tokens_no_newest_block_divides_is_dated_by_them() {
        // Two public V1 logs with no version line (Qwen3-14B): 75,824 and 72,496 KV tokens
        // are no multiple of vLLM 0.34's 64-token blocks; 0.32's 16-token blocks give them.
        for tokens in ["75,824", "72,496"] {
            let path = log_file(
                "undated",
                &format!(
                    "INFO [gpu_worker.py:373] Available KV cache memory: 11.57 GiB\n\
                     INFO [kv_cache_utils.py:1307] GPU KV cache size: {tokens} tokens\n"
                ),
            );
            let j = run_json(&format!(
                "--model qwen3-14b --total-memory 44.99GiB --from-log {}",
                path.display()
            ))
            .unwrap();
            assert_eq!(j["engine"], "vllm@0.32", "{}", j["notes"]);
            assert_eq!(j["kv"]["block_size"], 16);
            assert!(
                j["notes"].to_string().contains("no multiple of vllm@0.34"),
                "{}",
                j["notes"]
            );
        }
    }

    #[test]
    fn vllm_019s_utilisation_advice_gives_the_device_total() {
        // A public vLLM 0.19.1 log (A100-SXM4-40GB, Qwen3-8B) prints no total; its advice to
        // raise the utilisation from 0.9000 to 0.9596 for a 2.35 GiB graph estimate gives
        // 2.35 / 0.0596 = 39.4 GiB (the card's 39.39 GiB), where the figures alone gave 38.48.
        let path = log_file(
            "advice",
            "INFO [core.py:105] Initializing a V1 LLM engine (v0.19.1) with config: model='Qwen/Qwen3-8B'\n\
             INFO [gpu_model_runner.py:5955] Estimated CUDA graph memory: 2.35 GiB total\n\
             INFO [gpu_worker.py:436] Available KV cache memory: 19.36 GiB\n\
             WARNING [gpu_worker.py:470] In v0.19, CUDA graph memory profiling will be enabled by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), which more accurately accounts for CUDA graph memory during KV cache allocation. To try it now, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 and increase --gpu-memory-utilization from 0.9000 to 0.9596 to maintain the same effective KV cache size.\n\
             INFO [kv_cache_utils.py:1319] GPU KV cache size: 140,960 tokens\n",
        );
        let j = run_json(&format!("--from-log {}", path.display())).unwrap();
        let t = j["total_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        assert!((39.3..39.6).contains(&t), "{t}");
    }

    /// The graph memory the plan's "not reserved" warning states, and the plan's notes.
    fn graph_warning(j: &serde_json::Value) -> (Option<u64>, String) {
        let w = j["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["code"] == "graph_memory_not_reserved")
            .map(|w| w["estimate"].as_u64().unwrap());
        (w, j["notes"].to_string())
    }

    #[test]
    fn the_graph_memory_outside_the_budget_is_the_logs_own() {
        // A public vLLM 0.19.1 log (A100-SXM4-40GB, Qwen3-8B; a repository file found through
        // a code index, its URL not known), lines as printed. vLLM 0.19.0 prints what capture
        // took (`v1/worker/gpu_model_runner.py` `GPUModelRunner.capture_model`: "Graph
        // capturing finished in %.0f secs, took %.2f GiB"; `v1/worker/gpu_worker.py`
        // `Worker.compile_or_warm_up_model`: "CUDA graph pool memory: %s GiB (actual), %s GiB
        // (estimated), ...") and, before the KV cache is sized, its own estimate
        // (`GPUModelRunner.profile_cudagraph_memory`: "Estimated CUDA graph memory: %.2f GiB
        // total"), which 0.19 does not subtract (`Worker.determine_available_memory`).
        let head = "(APIServer pid=3380144) INFO 06-25 17:21:29 [utils.py:233] non-default args: {'model_tag': 'Qwen/Qwen3-8B', 'host': '172.17.0.1', 'port': 8001, 'model': 'Qwen/Qwen3-8B', 'served_model_name': ['Qwen/Qwen3-8B']}\n\
             (EngineCore pid=3380462) INFO 06-25 17:21:40 [core.py:105] Initializing a V1 LLM engine (v0.19.1) with config: model='Qwen/Qwen3-8B', speculative_config=None, tokenizer='Qwen/Qwen3-8B', tensor_parallel_size=1, pipeline_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda\n\
             (EngineCore pid=3380462) INFO 06-25 17:21:58 [gpu_model_runner.py:5955] Estimated CUDA graph memory: 2.35 GiB total\n\
             (EngineCore pid=3380462) INFO 06-25 17:21:58 [gpu_worker.py:436] Available KV cache memory: 19.36 GiB\n\
             (EngineCore pid=3380462) INFO 06-25 17:21:58 [gpu_worker.py:470] In v0.19, CUDA graph memory profiling will be enabled by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), which more accurately accounts for CUDA graph memory during KV cache allocation. To try it now, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 and increase --gpu-memory-utilization from 0.9000 to 0.9596 to maintain the same effective KV cache size.\n\
             (EngineCore pid=3380462) INFO 06-25 17:21:58 [kv_cache_utils.py:1319] GPU KV cache size: 140,960 tokens\n";
        let tail = "(EngineCore pid=3380462) INFO 06-25 17:22:03 [gpu_model_runner.py:6046] Graph capturing finished in 4 secs, took 2.44 GiB\n\
             (EngineCore pid=3380462) INFO 06-25 17:22:03 [gpu_worker.py:597] CUDA graph pool memory: 2.44 GiB (actual), 2.35 GiB (estimated), difference: 0.09 GiB (3.6%).\n";
        // 2.44 GiB = 2.44 x 2^30 = 2,619,930,050.56 bytes; 2.35 GiB = 2,523,293,286.4.
        let path = log_file("graph-actual", &format!("{head}{tail}"));
        let j = run_json(&format!("--from-log {}", path.display())).unwrap();
        let (w, notes) = graph_warning(&j);
        assert_eq!(w, Some(2_619_930_051), "{notes}");
        // The engine's blocks: 19.36 GiB = 20,787,641,712 bytes over Qwen3-8B's 36 layers x 8
        // KV heads x 128 x (K + V) x 2 bytes x 16 tokens = 2,359,296 bytes a block = 8,810.95,
        // 8,810 blocks, which vLLM 0.19.0 prints with the null block (`kv_cache_utils.py`
        // `_report_kv_cache_config`, line 1319: `num_blocks // groups * block_size` = 140,960
        // tokens, as logged); 8,809 usable blocks serve 140,944 tokens.
        assert_eq!(j["kv"]["num_blocks"], 8_810, "{notes}");
        assert_eq!(j["kv"]["tokens"], 140_944, "{notes}");
        assert!(
            notes.contains(
                "the logged 140960 tokens (line 6) are 8810 blocks, 140944 tokens usable"
            ),
            "{notes}"
        );
        // The utilisation suggested for an engine that reserves no graph memory (this plan's
        // requested memory over the total) leaves capture outside it; the suggestion says so
        // with the warning's own figure. With the log's weights line too: requested = 15.27
        // GiB weights (16,396,037,652 bytes, as logged) + memplan's vLLM 0.19 activation and
        // non-torch estimates (586,481,664 + 75,161,927, the plan's consumers) + 19.36 GiB KV
        // (20,787,641,713) = 37,845,322,956 bytes over the total the log's utilisation pair
        // gives (2.35 GiB / (0.9596 - 0.9) = 39.43 GiB, 42,337,135,671 bytes) = 0.89390,
        // 0.8939; capture's 2.44 GiB = 2,619,930,051 bytes adds 0.06188: 0.95578, 0.9558
        // rounded up.
        let weights = "(EngineCore pid=3380462) INFO 06-25 17:21:52 [gpu_model_runner.py:4820] Model loading took 15.27 GiB memory and 4.543456 seconds\n";
        let path = log_file("graph-suggestion", &format!("{head}{tail}{weights}"));
        let text = run(Args {
            flags: Box::new(flags(&format!("--from-log {}", path.display()))),
        })
        .unwrap()
        .text;
        assert!(
            text.contains("--gpu-memory-utilization 0.8939   same KV budget in an engine that does not reserve graph memory; graph capture takes about 2.44 GiB beyond it (the warning's figure): 0.9558 of the device in all\n"),
            "{text}"
        );
        assert!(
            notes.contains("the log's 2.44 GiB, what graph capture took (line 7)"),
            "{notes}"
        );
        // A log cut off before capture: the engine's estimate, said so.
        let path = log_file("graph-estimate", head);
        let j = run_json(&format!("--from-log {}", path.display())).unwrap();
        let (w, notes) = graph_warning(&j);
        assert_eq!(w, Some(2_523_293_286), "{notes}");
        assert!(
            notes.contains("the log's 2.35 GiB, the engine's own estimate (line 3)"),
            "{notes}"
        );
        // Fewer sequences than the logged start-up captured for: other graphs, memplan's
        // estimate.
        let path = log_file("graph-other", &format!("{head}{tail}"));
        let j = run_json(&format!("--from-log {} --max-num-seqs 8", path.display())).unwrap();
        let (w, notes) = graph_warning(&j);
        assert!(w.is_some_and(|w| w != 2_619_930_051), "{notes}");
        assert!(
            !notes.contains("graph memory outside the budget"),
            "{notes}"
        );
        // A log that names no tensor-parallel size ran on one rank: a plan over two ranks
        // captures other graphs, and memplan's estimate stays.
        let one_rank = format!("{head}{tail}").replace("tensor_parallel_size=1, ", "");
        let path = log_file("graph-ranks", &one_rank);
        let j = run_json(&format!(
            "--from-log {} --tensor-parallel-size 2",
            path.display()
        ))
        .unwrap();
        let (w, notes) = graph_warning(&j);
        assert!(w.is_some_and(|w| w != 2_619_930_051), "{notes}");
        // Nor does the log's figure replace the graph memory the caller gave.
        let path = log_file("graph-given", &format!("{head}{tail}"));
        let j = run_json(&format!("--from-log {} --graph-bytes 1GiB", path.display())).unwrap();
        let (_, notes) = graph_warning(&j);
        assert!(
            !notes.contains("graph memory outside the budget"),
            "{notes}"
        );
    }

    #[test]
    fn an_sglang_log_without_a_total_is_no_smaller_than_its_free_memory() {
        // sgl-project/sglang#18263 (ROCm, Qwen3-30B-A3B): 230.20 GiB free after 56.98 GiB of
        // weights, so at least 287.18 GiB; weights + KV over mem_fraction_static 0.911 gave
        // 230.36 (that start-up took more than its fraction).
        let path = log_file(
            "sglang-free",
            "[2026-07-15 13:14:53] Load weight end. elapsed=19.09 s, type=Qwen3MoeForCausalLM, avail mem=230.20 GB, mem usage=56.98 GB.\n\
             self.server_args.mem_fraction_static 0.911\n\
             [2026-07-15 13:14:54] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1669816, K size: 76.44 GB, V size: 76.44 GB\n\
             [2026-07-15 13:14:54] Memory pool end. avail mem=74.01 GB\n",
        );
        let j = run_json(&format!(
            "--model qwen3-30b-a3b --from-log {}",
            path.display()
        ))
        .unwrap();
        let t = j["total_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        assert!((287.1..287.3).contains(&t), "{t}");
        assert_eq!(j["kv"]["tokens"], 1_669_816);
    }

    #[test]
    fn a_log_whose_banner_alone_names_the_model_is_planned_for_it() {
        // A public vLLM log (ROCm, Qwen3-14B) names its model only in the start-up banner;
        // V0 logs only in "Starting to load model X...".
        let path = log_file(
            "banner",
            "INFO [utils.py:287]  \u{2584}\u{2584} \u{2584}\u{2588} \u{2588}     \u{2588}     \u{2588} \u{2580}\u{2584}\u{2580} \u{2588}  version 0.16.1.dev0+g89a77b108.d20260318\n\
             INFO [utils.py:287]   \u{2588}\u{2584}\u{2588}\u{2580} \u{2588}     \u{2588}     \u{2588}     \u{2588}  model   Qwen/Qwen3-14B\n\
             INFO [gpu_model_runner.py:4221] Model loading took 27.58 GiB memory and 285.457232 seconds\n\
             INFO [gpu_worker.py:373] Available KV cache memory: 13.49 GiB\n\
             INFO [kv_cache_utils.py:1307] GPU KV cache size: 88,384 tokens\n",
        );
        let j = run_json(&format!(
            "--total-memory 47.98GiB --from-log {}",
            path.display()
        ))
        .unwrap();
        // The logged 88,384 tokens count every block, the null block included: vLLM 0.16.0
        // `v1/core/kv_cache_utils.py` `_report_kv_cache_config` (line 1307, as logged) prints
        // `num_blocks // len(kv_cache_groups) * min_block_size`, and `BlockPool.__init__`
        // (`v1/core/block_pool.py`) takes the null block from those `num_blocks`; 0.19's rules
        // (the oldest memplan has) print alike. 88,384 / 16 = 5,524 blocks, of Qwen3-14B's
        // 40 layers x 8 KV heads x 128 x (K + V) x 2 bytes x 16 tokens = 2,621,440 bytes
        // (5,524 fit from 14,480,834,560 bytes = 13.486 GiB, inside 13.49 +- 0.005 GiB), 5,523
        // of them usable: 88,368 tokens.
        assert_eq!(j["kv"]["num_blocks"], 5_524, "{}", j["notes"]);
        assert_eq!(j["kv"]["tokens"], 88_368, "{}", j["notes"]);
        let v0 = log_file(
            "starting",
            "INFO 12-06 11:39:31 model_runner.py:1072] Starting to load model microsoft/phi-1_5...\n\
             INFO 12-06 11:39:36 gpu_executor.py:113] # GPU blocks: 1207, # CPU blocks: 1365\n",
        );
        let f = memplan_model::fromlog::read(&v0).unwrap();
        assert_eq!(f.model.as_deref(), Some("microsoft/phi-1_5"));
    }

    #[test]
    fn a_total_the_log_lacks_keeps_its_kv_cache() {
        // vllm-project/vllm#33263 (a 24 GB GPU): the log states its KV cache and no device
        // total; the total the error asks for completes the plan without replacing the KV.
        let path = log_file(
            "no-total",
            "INFO 01-28 16:08:46 [gpu_worker.py:358] Available KV cache memory: 18.78 GiB\n\
             INFO 01-28 16:08:46 [kv_cache_utils.py:1305] GPU KV cache size: 175,856 tokens\n",
        );
        let f = run_json(&format!(
            "--model Qwen/Qwen3-0.6B --from-log {}",
            path.display()
        ))
        .unwrap_err();
        assert!(f.message.contains("--total-memory"), "{}", f.message);
        let j = run_json(&format!(
            "--model Qwen/Qwen3-0.6B --total-memory 23.55GiB --from-log {}",
            path.display()
        ))
        .unwrap();
        let kv = j["kv_budget_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        assert!((kv - 18.78).abs() <= 0.0051, "{kv}");
        assert!(
            j["notes"]
                .to_string()
                .contains("taken as the logged device's"),
            "{}",
            j["notes"]
        );
        // A total the log prints and the flag changes is another device: the KV is re-planned.
        let path = log_file(
            "total",
            "Free memory on device (23.08/23.53 GiB) on startup. Desired GPU memory utilization is (0.8, 18.82 GiB).\n\
             Available KV cache memory: 8.60 GiB\n",
        );
        let j = run_json(&format!(
            "--model Qwen/Qwen3-0.6B --total-memory 47.06GiB --from-log {}",
            path.display()
        ))
        .unwrap();
        let kv = j["kv_budget_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        assert!(kv > 20.0, "{kv}");
    }

    #[test]
    fn a_v0_log_is_planned_to_the_blocks_it_logged() {
        // A public vLLM 0.8.5.post1 V0 log (RTX 4090 D, unsloth's bnb 4-bit
        // Qwen2.5-0.5B-Instruct; a repository file found through a code index, its URL not
        // known; the paste lost its line breaks, restored here at each record). V0 prints
        // the available KV memory to 0.01 GiB but its block count exactly: `num_gpu_blocks
        // = int(available_kv_cache_memory // cache_block_size)` (vLLM 0.6.6
        // `worker/worker.py` `Worker.determine_num_available_blocks`, the same through 0.8).
        // Qwen2.5-0.5B: 24 layers x K and V x 2 KV heads x 64 x 2 bytes x 16 tokens =
        // 196,608 bytes a block; 16.09 GiB +- 0.005 holds 87,845 to 87,900 blocks, and the
        // log says 87,853, all of them usable (V0 keeps no null block): 87,853 x 16 =
        // 1,405,648 tokens, 42.90x at 32,768 as the log prints.
        let path = log_file(
            "v0-blocks",
            "INFO 08-29 13:08:21 [llm_engine.py:240] Initializing a V0 LLM engine (v0.8.5.post1) with config: model='unsloth/qwen2.5-0.5b-instruct-unsloth-bnb-4bit', speculative_config=None, tokenizer='unsloth/qwen2.5-0.5b-instruct-unsloth-bnb-4bit', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, override_neuron_config=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=32768, download_dir=None, load_format=bitsandbytes, tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=bitsandbytes, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda:0\n\
             INFO 08-29 13:08:35 [worker.py:287] Memory profiling takes 2.72 seconds\n\
             INFO 08-29 13:08:35 [worker.py:287] the current vLLM instance can use total_gpu_memory (23.55GiB) x gpu_memory_utilization (0.78) = 18.28GiB\n\
             INFO 08-29 13:08:35 [worker.py:287] model weights take 0.52GiB; non_torch_memory takes 0.07GiB; PyTorch activation peak memory takes 1.61GiB; the rest of the memory reserved for KV Cache is 16.09GiB.\n\
             INFO 08-29 13:08:35 [executor_base.py:112] # cuda blocks: 87853, # CPU blocks: 32768\n\
             INFO 08-29 13:08:35 [executor_base.py:117] Maximum concurrency for 32768 tokens per request: 42.90x\n",
        );
        let j = run_json(&format!(
            "--model qwen2.5-0.5b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        let notes = j["notes"].to_string();
        assert_eq!(j["kv"]["block_bytes"], 196_608, "{notes}");
        assert_eq!(j["kv"]["num_blocks"], 87_853, "{notes}");
        assert!(notes.contains("gives the logged KV blocks"), "{notes}");
        assert!(
            notes.contains("the logged 87853 blocks (line 5) all serve requests, 1405648 tokens"),
            "{notes}"
        );
        assert!(!j["warnings"].to_string().contains("log_disagrees"));
    }

    #[test]
    fn a_vllm_ascend_log_is_planned_with_the_block_size_it_printed() {
        // The vllm-ascend installation docs' single-NPU check (vLLM 0.18.0), lines as printed;
        // its config line says Qwen3-0.6B, its 36 layers and 15.29 GB of weights are
        // Qwen3-8B's. vllm-ascend set 128-token blocks (`vllm_ascend/utils.py`
        // `refresh_block_size`). Qwen3-8B: 36 layers x K and V x 8 KV heads x 128 x 2 bytes
        // x 128 tokens = 18,874,368 bytes a block; 39.06 GiB holds 2,222 of them, which the
        // engine prints as 2,222 x 128 = 284,416 tokens.
        let path = log_file(
            "ascend",
            &format!(
                "{ASCEND_QWEN3_LOG}(EngineCore pid=970) INFO 05-12 11:35:44 [kv_cache_utils.py:1321] Maximum concurrency for 40,960 tokens per request: 6.94x\n"
            ),
        );
        let j = run_json(&format!("--model qwen3-8b --from-log {}", path.display())).unwrap();
        assert_eq!(j["kv"]["block_size"], 128, "{}", j["notes"]);
        assert_eq!(j["kv"]["block_bytes"], 18_874_368);
        assert_eq!(j["kv"]["num_blocks"], 2_222, "{}", j["notes"]);
        assert!(!j["warnings"].to_string().contains("log_disagrees"));
    }

    #[test]
    fn a_log_in_a_v0_format_is_planned_with_the_oldest_rules() {
        // vllm-project/vllm#13882 (no version line; V0's profile report): the engine subtracted
        // no graph memory, so the start-up is 1.05 GiB short, as it printed.
        let path = log_file(
            "v0",
            "INFO 02-26 09:54:02 model_runner.py:1115] Loading model weights took 5.2032 GB\n\
             INFO 02-26 09:54:05 worker.py:267] the current vLLM instance can use total_gpu_memory (8.00GiB) x gpu_memory_utilization (0.70) = 5.60GiB\n\
             INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.\n\
             INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 0, # CPU blocks: 4681\n",
        );
        let mut a = flags(&format!(
            "--model qwen2.5-7b-instruct --from-log {}",
            path.display()
        ));
        let log = extras::apply_log(&mut a).unwrap();
        assert_eq!(a.engine.as_deref(), Some("vllm@0.19"));
        assert!(
            log.notes.iter().any(|n| n.contains("before 0.19")),
            "{:?}",
            log.notes
        );
        let f = run_json(&format!(
            "--model qwen2.5-7b-instruct --from-log {}",
            path.display()
        ))
        .unwrap_err();
        assert!(f.message.contains("by 1.05 GiB"), "{}", f.message);
    }

    #[test]
    fn the_allocator_configuration_comes_from_the_flag_else_the_first_variable_set() {
        let vars = |set: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                set.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let base = "--model qwen2.5-1.5b-instruct --total-memory 24GiB";
        // The flag wins over the environment.
        let a = flags(&format!("{base} --alloc-conf expandable_segments:True"));
        let (c, from) = allocator(&a, vars(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")]))
            .unwrap()
            .unwrap();
        assert!(c.expandable_segments && c.max_split_size.is_none());
        assert_eq!(from, "--alloc-conf");
        // Else the first variable set, as PyTorch reads them.
        let a = flags(base);
        let (c, from) = allocator(
            &a,
            vars(&[
                ("PYTORCH_HIP_ALLOC_CONF", "expandable_segments:True"),
                ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert!(!c.expandable_segments && c.max_split_size == Some(64 << 20));
        assert!(from.contains("PYTORCH_CUDA_ALLOC_CONF"), "{from}");
        assert!(allocator(&a, vars(&[])).unwrap().is_none());
        let e = allocator(
            &a,
            vars(&[("PYTORCH_ALLOC_CONF", "expandable_segments:yes")]),
        )
        .unwrap_err();
        assert_eq!(e.class, crate::ExitClass::Usage);
        assert!(
            e.message.contains("PYTORCH_ALLOC_CONF") && e.message.contains("expandable_segments"),
            "{}",
            e.message
        );
        // A malformed flag is a usage error naming the flag and the key.
        let e = try_flags(&format!("{base} --alloc-conf max_split_size_mb:4")).unwrap_err();
        assert_eq!(e.class, crate::ExitClass::Usage);
        assert!(
            e.message.contains("--alloc-conf") && e.message.contains("max_split_size_mb"),
            "{}",
            e.message
        );
        // The plan notes it; a dry run's figures do not move.
        let with = plan(&format!("{base} --alloc-conf expandable_segments:True")).unwrap();
        let notes = with["notes"].as_array().unwrap();
        assert!(
            notes
                .iter()
                .any(|n| n.as_str().unwrap().contains("expandable_segments:True")
                    && n.as_str().unwrap().contains("--alloc-conf")),
            "{notes:?}"
        );
        assert_eq!(
            with["kv_cache_bytes"],
            plan(base).unwrap()["kv_cache_bytes"]
        );
    }

    #[test]
    fn a_vllm_ascend_log_in_bytes_is_planned_to_its_blocks() {
        // A public vllm-ascend v0.10.2rc1 start-up (Qwen2.5-0.5B-Instruct, fp16, 48 GB NPU; a
        // report copied into a public repository, code index id 55763524705), lines as printed.
        // `vllm_ascend/worker/worker_v1.py` `NPUWorker.determine_available_memory` prints the
        // available KV memory and the total in bytes: 40,178,937,036 // (24 layers x 2 KV
        // heads x 64 x (K + V) x 2 bytes x 128 tokens = 1,572,864) = 25,545 blocks, printed
        // as 3,269,760 tokens (the null block included, `kv_cache_utils.py:864` in 0.10.2).
        let path = log_file(
            "ascend-bytes",
            "(EngineCore_DP0 pid=6903) INFO 10-09 01:30:33 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='/home/h00643489/data/Qwen2.5-0.5B-Instruct', dtype=torch.float16, max_seq_len=32768, tensor_parallel_size=1, quantization=None, enforce_eager=True, kv_cache_dtype=auto, device_config=npu\n\
             (EngineCore_DP0 pid=6903) INFO 10-09 01:31:09 [model_runner_v1.py:2373] Loading model weights took 0.9299 GB\n\
             (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [worker_v1.py:198] Available memory: 40178937036, total memory: 49602220032\n\
             (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [kv_cache_utils.py:864] GPU KV cache size: 3,269,760 tokens\n\
             (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 99.79x\n",
        );
        let j = run_json(&format!(
            "--model qwen2.5-0.5b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        let notes = j["notes"].to_string();
        assert_eq!(j["kv"]["num_blocks"], 25_545, "{notes}");
        assert_eq!(j["kv"]["block_size"], 128, "{notes}");
        assert_eq!(j["total_bytes"], 49_602_220_032u64, "{notes}");
        assert_eq!(j["kv_budget_bytes"], 40_178_937_036u64, "{notes}");
        assert!(!notes.contains("within that rounding"), "{notes}");
        assert!(
            !j["warnings"].to_string().contains("log_disagrees"),
            "{}",
            j["warnings"]
        );
    }

    #[test]
    fn an_sglang_pool_is_planned_within_its_k_and_v_rounding() {
        // A public SGLang start-up of Qwen2.5-0.5B-Instruct (docs notebook build, 2026-02-04;
        // public repository file, code index id 53259568910), lines as printed. K and V are
        // printed to 0.01 GB each (`mem_cache/memory_pool.py`: "K size: {k_size / GB:.2f} GB"),
        // so their 0.24 GB sum is known to 0.01 GB: 20,480 tokens of 24 layers x 2 KV heads x
        // 64 x (K + V) x 2 bytes = 12,288 bytes are 0.234 GiB, outside half a hundredth of
        // 0.24 but within a hundredth.
        let path = log_file(
            "sglang-kv-sum",
            "[2026-02-04 11:30:29] Load weight begin. avail mem=78.43 GB\n\
             [2026-02-04 11:30:29] Load weight end. elapsed=0.38 s, type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=77.45 GB, mem usage=0.98 GB.\n\
             [2026-02-04 11:30:29] KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB\n\
             [2026-02-04 11:30:29] Memory pool end. avail mem=77.12 GB\n",
        );
        let j = run_json(&format!(
            "--model qwen2.5-0.5b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        let notes = j["notes"].to_string();
        assert_eq!(j["kv"]["tokens"], 20_480, "{notes}");
        assert!(
            notes.contains("its K and V sizes to 0.01 GB each: within that rounding"),
            "{notes}"
        );
        assert!(
            !j["warnings"].to_string().contains("log_disagrees"),
            "{}",
            j["warnings"]
        );
    }

    #[test]
    fn a_v0_budget_of_printed_parts_is_searched_within_their_rounding() {
        // Study notes of a vLLM 0.6.6 V0 start-up of Qwen2.5-7B-Instruct on an RTX 3090 (public
        // repository file, code index id 62352993850), lines as the author published them
        // (condensed: the KV memory's own wording is not vLLM's, so it is not read). V0 sizes
        // the KV memory as total x utilisation - weights - activation peak - non-torch memory
        // (`worker/worker.py` `determine_num_available_blocks`), each printed to 0.01 GiB:
        // 23.57 x 0.9 - 14.25 - 1.09 - 0.10 = 5.773 GiB would be 6,756 blocks of 917,504 bytes
        // (28 layers x 4 KV heads x 128 x (K + V) x 2 bytes x 16), but within the parts'
        // roundings (+-0.02 GiB) the engine's 6,749 blocks (5.767 GiB) are one of the budgets.
        let path = log_file(
            "v0-parts",
            "the current vLLM instance can use total_gpu_memory (23.57GiB) x 0.90 = 21.21GiB\n\
             model weights take 14.25GiB; non_torch_memory 0.10GiB;\n\
             PyTorch activation peak memory takes 1.09GiB; the rest reserved for KV Cache is 5.77GiB.\n\
             \n\
             # GPU blocks: 6749(block_size 默认 16 tokens)\n",
        );
        let j = run_json(&format!(
            "--model qwen2.5-7b-instruct --from-log {}",
            path.display()
        ))
        .unwrap();
        let notes = j["notes"].to_string();
        assert_eq!(j["kv"]["num_blocks"], 6_749, "{notes}");
        assert!(
            notes.contains("the parts of its KV budget (total, weights, activation, non-torch memory) to 0.01 GiB each: within that rounding"),
            "{notes}"
        );
        // A part the command line gives is no longer the log's: no search, the plan's own.
        let j = run_json(&format!(
            "--model qwen2.5-7b-instruct --weights-bytes 14.25GiB --from-log {}",
            path.display()
        ))
        .unwrap();
        assert_eq!(j["kv"]["num_blocks"], 6_756, "{}", j["notes"]);
    }

    #[test]
    fn a_model_directory_of_another_machine_named_as_a_preset_is_that_preset() {
        // vllm-ascend's start-up of /home/h00643489/data/Qwen2.5-0.5B-Instruct (a report copied
        // into a public repository, code index id 55763524705), lines as printed: that
        // directory is not on this machine, and its name is the shipped preset's.
        let log = "(EngineCore_DP0 pid=6903) INFO 10-09 01:30:33 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='/home/h00643489/data/Qwen2.5-0.5B-Instruct', dtype=torch.float16, max_seq_len=32768, tensor_parallel_size=1, quantization=None, enforce_eager=True, kv_cache_dtype=auto, device_config=npu\n\
             (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [worker_v1.py:198] Available memory: 40178937036, total memory: 49602220032\n\
             (EngineCore_DP0 pid=6903) INFO 10-09 01:31:14 [kv_cache_utils.py:864] GPU KV cache size: 3,269,760 tokens\n";
        let path = log_file("preset-dir", log);
        let j = run_json(&format!("--from-log {}", path.display())).unwrap();
        let notes = j["notes"].to_string();
        assert_eq!(j["kv"]["num_blocks"], 25_545, "{notes}");
        assert!(
            notes.contains("its directory name is the shipped preset Qwen2.5-0.5B-Instruct"),
            "{notes}"
        );
        // A directory whose name no preset has is left as it is (and refused as no model).
        let path = log_file(
            "no-preset-dir",
            &log.replace("Qwen2.5-0.5B-Instruct", "my-finetune"),
        );
        let f = run_json(&format!("--from-log {}", path.display())).unwrap_err();
        assert!(f.message.contains("my-finetune"), "{}", f.message);
    }

    /// A pasted `vllm serve ... -tp 2` above a V0 profile table (public copy: the outside14
    /// battery's log 30) plans two ranks, as the start-up ran; `--tensor-parallel-size` given
    /// to memplan wins over the command.
    #[test]
    fn from_log_takes_the_pasted_commands_flags_and_memplans_own_win() {
        let path = log_file(
            "command",
            "$ vllm serve meta-llama/Meta-Llama-3-8B -tp 2 --max-num-seqs 64\n\
             INFO 12-13 19:55:25 worker.py:243] Memory profiling results:\n\
             INFO 12-13 19:55:25 worker.py:243] duration     3.49 seconds\n\
             INFO 12-13 19:55:25 worker.py:243] total_gpu_memory     79.22GiB\n\
             INFO 12-13 19:55:25 worker.py:243] gpu_memory_utilization       0.90\n\
             INFO 12-13 19:55:25 worker.py:243] the current vLLM instance can use    71.29GiB\n\
             INFO 12-13 19:55:25 worker.py:243] model weights take   7.48GiB\n\
             INFO 12-13 19:55:25 worker.py:243] non_torch_memory     3.58GiB\n\
             INFO 12-13 19:55:25 worker.py:243] PyTorch activation peak memory       1.26GiB\n",
        );
        let mut a = flags(&format!(
            "--model meta-llama-3-8b-instruct --from-log {}",
            path.display()
        ));
        let log = extras::apply_log(&mut a).unwrap();
        assert_eq!(a.tensor_parallel_size, 2);
        assert_eq!(a.max_num_seqs, Some(64));
        assert!(log.filled.contains(&"--tensor-parallel-size"));
        assert!(
            log.notes.iter().any(|n| n
                .contains("from the pasted `vllm serve` command: -tp 2, --max-num-seqs 64")
                && n.contains("flags given to memplan win over both")),
            "{:?}",
            log.notes
        );
        let mut a = flags(&format!(
            "--model meta-llama-3-8b-instruct --tensor-parallel-size 4 --max-num-seqs 8 --from-log {}",
            path.display()
        ));
        extras::apply_log(&mut a).unwrap();
        assert_eq!((a.tensor_parallel_size, a.max_num_seqs), (4, Some(8)));
    }

    /// A vLLM 0.11.0 start-up (public copy: the outside16 battery's log 01, NGC 25.11 on a DGX
    /// Spark) is planned with the 0.19 row as a release whose KV sizing was read and found to
    /// be that row's, not as a release outside memplan's rules; 0.12 (not read) still is.
    #[test]
    fn from_log_plans_vllm_0_10_and_0_11_with_the_rules_read_for_them() {
        let text = "(APIServer pid=1) INFO 01-23 15:48:29 [api_server.py:1842] vLLM API server version 0.11.0+582e4e37.nv25.11\n\
             (EngineCore_DP0 pid=164) INFO 01-23 15:49:08 [gpu_model_runner.py:2653] Model loading took 3.8844 GiB and 20.442057 seconds\n\
             (EngineCore_DP0 pid=164) INFO 01-23 15:50:05 [gpu_worker.py:298] Available KV cache memory: 102.56 GiB\n\
             (EngineCore_DP0 pid=164) INFO 01-23 15:50:06 [kv_cache_utils.py:1087] GPU KV cache size: 840,160 tokens\n\
             (EngineCore_DP0 pid=164) INFO 01-23 15:50:06 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens per request: 25.64x\n\
             (APIServer pid=1) INFO 01-23 15:50:32 [loggers.py:147] Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 52510\n";
        let path = log_file("v011", text);
        let mut a = flags(&format!("--model mistral-7b --from-log {}", path.display()));
        let log = extras::apply_log(&mut a).unwrap();
        assert_eq!(a.engine.as_deref(), Some("vllm@0.19"));
        assert!(
            log.notes.iter().any(|n| n.starts_with(
                "the log's vLLM 0.11.0 (line 1) sizes its KV cache by vllm@0.19's rules (read in the 0.11.0 wheel"
            )),
            "{:?}",
            log.notes
        );
        assert!(!log
            .notes
            .iter()
            .any(|n| n.contains("outside memplan's rules")));
        let path = log_file("v012", &text.replace("version 0.11.0", "version 0.12.0"));
        let mut a = flags(&format!("--model mistral-7b --from-log {}", path.display()));
        let log = extras::apply_log(&mut a).unwrap();
        assert_eq!(a.engine.as_deref(), Some("vllm@0.19"));
        assert!(
            log.notes
                .iter()
                .any(|n| n.contains("vLLM 0.12.0 (line 1) is outside memplan's rules")),
            "{:?}",
            log.notes
        );
    }

    /// An SGLang start-up of google/gemma-3-4b-it from 2025-03-27 (main, about 0.4.4.post2;
    /// sgl-project/sglang PR 4826, a TestGemma3itServer run; trimmed: the server arguments cut,
    /// no version line). SGLang 0.4.4 and 0.4.4.post2 (`srt/model_executor/model_runner.py`):
    /// `ModelRunner.__init__` multiplies `mem_fraction_static` by 0.95 for a multimodal model
    /// (`Gemma3ForConditionalGeneration` is in `multimodal_model_archs`), after the arguments
    /// are printed; `profile_max_num_token` sizes a token as 4 KV heads x 256 x 34 layers (no
    /// sliding-window pool: every layer full) x 2 (K, V) x 2 bytes = 139,264 B. By hand: rest =
    /// 131.08 - (131.08 + 8.13) x (1 - 0.88 x 0.95) = 131.08 - 139.21 x 0.164 = 108.2496 GiB,
    /// 108.2496 x 2^30 // 139,264 = 834,616 (834,615 logged: the printed GBs are rounded; at
    /// 0.88 uncut it would be 881,843); 834,615 x 69,632 = 58,115,911,680 B = 54.12 GiB, the
    /// logged K size. The 0.5 rules size Gemma 3's 29 sliding-window layers to their window and
    /// planned 810,773 tokens from the same 108.25 GiB.
    #[test]
    fn an_sglang_0_4_log_plans_every_gemma_3_layer_full_and_cuts_the_multimodal_fraction() {
        let text = "command=python3 -m sglang.launch_server --model-path google/gemma-3-4b-it --trust-remote-code --chat-template gemma-it --host 127.0.0.1 --port 2157\n\
             [2025-03-27 21:33:10] server_args=ServerArgs(model_path='google/gemma-3-4b-it', tokenizer_path='google/gemma-3-4b-it', dtype='auto', kv_cache_dtype='auto', quantization=None, context_length=None, device='cuda', mem_fraction_static=0.88, max_total_tokens=None, chunked_prefill_size=8192, page_size=1, tp_size=1)\n\
             [2025-03-27 21:33:30 TP0] Load weight end. type=Gemma3ForConditionalGeneration, dtype=torch.bfloat16, avail mem=131.08 GB, mem usage=8.13 GB.\n\
             [2025-03-27 21:33:31 TP0] KV Cache is allocated. #tokens: 834615, K size: 54.12 GB, V size: 54.12 GB\n\
             [2025-03-27 21:33:31 TP0] Memory pool end. avail mem=14.61 GB\n\
             [2025-03-27 21:33:31 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=13.95 GB\n";
        // google/gemma-3-4b-it's config.json (architecture keys).
        let config = r#"{"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144, "mm_tokens_per_image": 256, "model_type": "gemma3", "text_config": {"head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2560, "intermediate_size": 10240, "max_position_embeddings": 131072, "model_type": "gemma3_text", "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 1000000.0, "sliding_window": 1024, "sliding_window_pattern": 6, "vocab_size": 262208}, "torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14}}"#;
        let dir = std::env::temp_dir().join(format!("memplan-gemma3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("config.json");
        std::fs::write(&cfg, config).unwrap();
        let path = log_file("sglang044", text);
        let j = run_json(&format!(
            "--from-log {} --model {}",
            path.display(),
            cfg.display()
        ))
        .unwrap();
        assert_eq!(j["engine"], "sglang@0.4.4");
        assert_eq!(j["kv_cache_tokens"], 834_615, "{:#}", j["notes"]);
        assert_eq!(
            (&j["kv"]["block_bytes"], &j["kv"]["num_groups"]),
            (&139_264.into(), &1.into())
        );
        let notes = j["notes"].to_string();
        assert!(
            notes.contains("dated 2025-03-27 (line 2), before SGLang 0.4.5 was published"),
            "{notes}"
        );
        assert!(notes.contains("no sliding-window KV pool"), "{notes}");
        assert!(!j["warnings"].to_string().contains("log_disagrees"));
        // Without the log: the multimodal cut, 0.88 x 0.95 = 0.836 of the device, against the
        // 0.5 rows' uncut 0.88.
        let base = format!(
            "--model {} --total-memory 100GiB --gpu-memory-utilization 0.88",
            cfg.display()
        );
        let requested = |e: &str| {
            let j = plan(&format!("{base} --engine {e}")).unwrap();
            (
                j["requested_bytes"].as_f64().unwrap(),
                j["notes"].to_string(),
            )
        };
        // The emitted fraction is the planned one over the cut: 0.836 / 0.95 = 0.88.
        let j = plan(&format!("{base} --engine sglang@0.4.4")).unwrap();
        assert!(
            j["engine_args"]["sglang"]
                .as_str()
                .unwrap()
                .contains("--mem-fraction-static 0.880 "),
            "{}",
            j["engine_args"]
        );
        let (old, notes) = requested("sglang@0.4.4");
        assert!(
            (old - 0.836 * 100.0 * (1u64 << 30) as f64).abs() < 2.0,
            "{old}"
        );
        assert!(
            notes.contains("reduces --mem-fraction-static 0.88 to 0.836"),
            "{notes}"
        );
        let (mid, _) = requested("sglang@0.4.8");
        assert!(
            (mid - 0.792 * 100.0 * (1u64 << 30) as f64).abs() < 2.0,
            "{mid}"
        );
        let (new, _) = requested("sglang@0.5.9");
        assert!(
            (new - 0.88 * 100.0 * (1u64 << 30) as f64).abs() < 2.0,
            "{new}"
        );
        // 0.4.9 to 0.4.x (a sliding-window pool, no cut in the runner) are not held.
        assert!(plan(&format!("{base} --engine sglang@0.4.10"))
            .unwrap_err()
            .message
            .contains("between memplan's SGLang 0.4 rows and its 0.5 rows"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
