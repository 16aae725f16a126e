//! The parts of `memplan plan` beyond the dry run itself: `--from-log` (fill the flags from an
//! engine's start-up log), the other memory users (`--speculative-model`, `--max-loras`,
//! `--cpu-offload-gb`, `--pp`) and the llama.cpp answer for `.gguf` models.

use memplan::{Error, Param};
use memplan_model::consumers::Extras;
use memplan_model::engine::{EngineKind, EngineRules, SGLANG, VLLM};
use memplan_model::fromlog::LogFigures;
use memplan_model::Model;
use memplan_planner::{ConsumerKind, Plan};

use super::flags::{Flags, KvChoice, MambaChoice, QuantChoice, Strategy};
use crate::contract::Failure;

/// What `--from-log` read, kept for the checks after planning.
#[derive(Debug, Default)]
pub struct LogContext {
    /// The log's path.
    pub path: Option<std::path::PathBuf>,
    /// The flags whose values came from the log (not from the command line).
    pub filled: Vec<&'static str>,
    /// The figures read.
    pub figures: Option<LogFigures>,
    /// Notes for the plan: where each figure came from, what a flag overrode.
    pub notes: Vec<String>,
    /// The KV cache is the log's "Available KV cache memory" (no budget term overridden).
    pub anchored: bool,
    /// Where the log prints no KV memory but every part of the budget vLLM V0 sized it from
    /// (`worker/worker.py` `determine_num_available_blocks`: total x utilisation - weights -
    /// activation peak - non-torch memory, each printed to 0.01 GiB in its "Memory profiling
    /// results" / "model weights take" line) and none is overridden: how far that budget may
    /// be from the engine's, the sum of the parts' roundings.
    pub parts_rounding: Option<u64>,
    /// The model(s) the log names where `--model` names another (a warning of the plan).
    pub model_differs: Option<String>,
    /// Nothing that sizes the CUDA graphs differs from the logged start-up (the model, the
    /// ranks, the capture sizes and what bounds them, the KV and weight formats, a draft model
    /// or adapters): the graph memory the log prints is this plan's.
    pub graphs_as_logged: bool,
}

/// The models a log names, at most 8 of them and how many more: a log may name one on each
/// of millions of lines.
fn listed(models: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut s = models[..models.len().min(SHOWN)].join(", ");
    if models.len() > SHOWN {
        s.push_str(&format!(" and {} more", models.len() - SHOWN));
    }
    s
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

impl LogContext {
    /// A usage error about a flag the user did not pass but the log filled is the log's
    /// content: exit 1, naming the file (the figure itself passed its range check when the
    /// log was read; what fails is the combination).
    pub fn blame(&self, f: Failure) -> Failure {
        let Some(path) = &self.path else {
            return f;
        };
        let from_log = self
            .filled
            .iter()
            .any(|flag| f.message.starts_with(flag) || f.message.contains(&format!("{flag} ")));
        if f.class == crate::ExitClass::Usage && from_log {
            return Failure::of(
                "invalid_file",
                format!(
                    "{}: the figures read from this log do not make a plan: {}",
                    path.display(),
                    f.message
                ),
            );
        }
        f
    }
}

/// `--from-log`: fill every flag the user did not pass from the log's figures; a flag the user
/// passed wins, and the notes say so (and where every figure came from). Every figure was
/// checked as its flag would be when the log was read ([`memplan_model::fromlog`]); bad
/// content is an error naming the file, the line and the value.
pub fn apply_log(a: &mut Flags) -> Result<LogContext, Failure> {
    let Some(path) = a.from_log.clone() else {
        return Ok(LogContext::default());
    };
    let f = memplan_model::fromlog::read(&path)?;
    let before = a.clone();
    let mut notes = vec![format!("figures from the log {}", path.display())];
    let at = |name: &str| {
        f.line(name)
            .map(|n| format!(" (line {n})"))
            .unwrap_or_default()
    };
    // A flag the user passed overrides the log's figure; say so when they differ.
    let mut overridden = false;
    let mut take_bytes =
        |flag: &str, slot: &mut Option<u64>, logged: Option<u64>, name: &str| match (*slot, logged)
        {
            (Some(given), Some(l)) => {
                overridden = true;
                if given != l {
                    notes.push(format!(
                        "{flag} {} (given) overrides the log's {}{}",
                        gib(given),
                        gib(l),
                        at(name)
                    ));
                }
            }
            (Some(_), None) => overridden = true,
            (None, l) => *slot = l,
        };
    take_bytes(
        "--weights-bytes",
        &mut a.weights_bytes,
        f.weights,
        "weights",
    );
    // vLLM 0.2x+: "Total non KV cache memory" = consumed + the transient activation peak.
    let activation = match (f.non_kv, f.consumed) {
        (Some(nk), Some(c)) if nk >= c => Some(nk - c),
        _ => f.activation,
    };
    take_bytes(
        "--activation-bytes",
        &mut a.activation_bytes,
        activation,
        "activation",
    );
    let non_torch = f.non_torch.or_else(|| match (f.consumed, f.weights) {
        (Some(c), Some(w)) if c >= w => Some(c - w),
        _ => None,
    });
    take_bytes(
        "--non-torch-bytes",
        &mut a.non_torch_bytes,
        non_torch,
        "non_torch",
    );
    if f.graph_subtracted {
        take_bytes(
            "--graph-bytes",
            &mut a.graph_bytes,
            f.graph_estimate,
            "graph_estimate",
        );
    } else if a.graph_bytes.is_some() {
        overridden = true;
    }
    if a.kv_cache_memory_bytes.is_some() {
        overridden = true;
    }
    // A total the log does not print completes it (the error for a log without one asks for
    // it): the log's KV cache stays the engine's. One that differs from the log's is another
    // device.
    if a.total_memory.is_some() && f.total.is_none() {
        notes.push(format!(
            "the log prints no device total: --total-memory {} (given) is taken as the logged device's",
            gib(a.total_memory.unwrap_or(0))
        ));
    } else if a.total_memory.is_some() {
        overridden = true;
        if let (Some(given), Some(l)) = (a.total_memory, f.total) {
            if given != l {
                notes.push(format!(
                    "--total-memory {} (given) overrides the log's device total {}{}",
                    gib(given),
                    gib(l),
                    at("total")
                ));
            }
        }
    } else if a.device.is_none() {
        a.total_memory = f.total;
    }
    match (a.gpu_memory_utilization, f.utilization) {
        (Some(given), Some(l)) => {
            overridden = true;
            if given != l {
                notes.push(format!(
                    "--gpu-memory-utilization {given} (given) overrides the log's {l}{}",
                    at("utilization")
                ));
            }
        }
        (Some(_), None) => overridden = true,
        (None, l) => a.gpu_memory_utilization = l,
    }
    a.max_model_len = a.max_model_len.or(f.max_model_len);
    a.max_num_batched_tokens = a.max_num_batched_tokens.or(f.max_num_batched_tokens);
    a.max_num_seqs = a.max_num_seqs.or(f.max_num_seqs);
    if a.block_size.is_none() {
        a.log_block_size = f
            .block_size
            .map(|b| (b, f.engine.unwrap_or(EngineKind::Vllm)));
    }
    a.block_size = a.block_size.or(f.block_size);
    if let Some(tp) = f.tensor_parallel.filter(|_| a.tensor_parallel_size == 1) {
        a.tensor_parallel_size = tp;
    }
    if let Some(pp) = f
        .pipeline_parallel
        .filter(|_| a.pipeline_parallel_size == 1)
    {
        a.pipeline_parallel_size = pp;
    }
    if f.enforce_eager == Some(true) && a.cudagraph_capture_sizes.is_none() {
        a.enforce_eager = true;
    }
    // Prefix caching as the start-up ran it: a hybrid's state pages follow it.
    if a.prefix_caching().is_none() {
        match f.enable_prefix_caching {
            Some(true) => a.enable_prefix_caching = true,
            Some(false) => a.no_enable_prefix_caching = true,
            None => {}
        }
    }
    // A start-up whose graph mode is NONE captures nothing (`v1/worker/gpu_model_runner.py`
    // `capture_model`: "Skipping CUDA graph capture"): no graph memory, as eager.
    if let (Some(n), false, None) = (f.no_graphs, a.enforce_eager, &a.cudagraph_capture_sizes) {
        if a.graph_bytes.is_none() {
            a.enforce_eager = true;
            notes.push(format!(
                "line {n}: the start-up captures no CUDA graphs (cudagraph_mode NONE): planned without graph memory, as an eager start-up"
            ));
        }
    }
    if a.kv_cache_dtype.0.is_none() {
        if let Some(k) = f.kv_cache_dtype.as_deref().filter(|k| *k != "auto") {
            let k = k.parse().map_err(|e: Error| {
                Error::file_key(
                    path.display().to_string(),
                    format!("line {}", f.line("kv_cache_dtype").unwrap_or(0)),
                    e.to_string(),
                )
            })?;
            a.kv_cache_dtype = KvChoice(Some(k));
        }
    }
    // vLLM's Mamba state dtypes, where the start-up was given them (its non-default args).
    for (key, choice) in [
        ("mamba_cache_dtype", &mut a.mamba_cache_dtype),
        ("mamba_ssm_cache_dtype", &mut a.mamba_ssm_cache_dtype),
    ] {
        let logged = match key {
            "mamba_cache_dtype" => f.mamba_cache_dtype.as_deref(),
            _ => f.mamba_ssm_cache_dtype.as_deref(),
        };
        if choice.0.is_some() {
            continue;
        }
        if let Some(d) = logged.filter(|d| *d != "auto") {
            let d = d.parse().map_err(|e: String| {
                Error::file_key(
                    path.display().to_string(),
                    format!("line {}", f.line(key).unwrap_or(0)),
                    e,
                )
            })?;
            *choice = MambaChoice(Some(d));
        }
    }
    if a.quantization.0.is_none() && f.quantization.as_deref() == Some("fp8") {
        a.quantization = QuantChoice(Some("fp8".into()));
    }
    // The release that wrote it selects the rules.
    if a.engine.is_none() {
        a.engine = Some(match (&f.engine, f.release()) {
            (Some(EngineKind::Sglang), Some(r)) => sglang_release(&r, &at("version"), &mut notes),
            (Some(EngineKind::Sglang), None) => {
                sglang_by_date(f.date.as_deref(), &at("date"), &mut notes)
            }
            (_, Some(r)) => {
                let want = format!("vllm@{r}");
                match (want.parse::<EngineRules>(), older_as_first_row(&r)) {
                    (Ok(_), _) => want,
                    // A release older than the table whose KV sizing was read and found to
                    // be the first row's (`VLLM_OLDER_AS_FIRST_ROW`).
                    (Err(_), Some((checked, why))) => {
                        let first = VLLM[0].version;
                        notes.push(format!(
                            "the log's vLLM {r}{} sizes its KV cache by vllm@{first}'s rules (read in the {checked} wheel: {why}): planned with vllm@{first}'s",
                            at("version")
                        ));
                        format!("vllm@{first}")
                    }
                    (Err(e), None) => {
                        let (oldest, newest) =
                            (VLLM[0].version, EngineRules::newest_vllm().version);
                        let pick = if e.to_string().contains("newer") {
                            newest
                        } else {
                            oldest
                        };
                        notes.push(format!("the log's vLLM {r}{} is outside memplan's rules ({oldest} to {newest}): planned with vllm@{pick}'s", at("version")));
                        format!("vllm@{pick}")
                    }
                }
            }
            // The estimate printed but not subtracted: vLLM 0.19.
            _ if f.graph_estimate.is_some() && !f.graph_subtracted => "vllm@0.19".into(),
            // Lines only releases before 0.19 print (V0's): none of them subtracted graph
            // memory or used another block size than 16, as vLLM 0.19's row says.
            _ if f.legacy_line.is_some() => {
                notes.push(format!(
                    "the log has no version line; its line {} is in a format of vLLM releases before 0.19 (V0): planned with vllm@0.19's rules, the oldest memplan knows (no graph memory subtracted, 16-token blocks)",
                    f.legacy_line.unwrap_or(0)
                ));
                "vllm@0.19".into()
            }
            // A V1 log without a version line: the lines it prints bound its release
            // (`LogFigures::release_bounds`, each bound a line vLLM printed only from or up
            // to a release).
            _ => {
                let (rules, note) = unversioned_v1(&f);
                notes.push(note);
                rules
            }
        });
    }
    if !f.graph_subtracted && f.graph_estimate.is_some() && a.graph_bytes.is_none() {
        // The engine printed its estimate but did not subtract it (vLLM 0.19).
        a.graph_strategy = Strategy::None;
    }
    // No total printed: the utilisation pair and the graph estimate give it (0.19's advice to
    // raise the utilisation, 0.21+'s equivalent utilisation without the reserve).
    if let (None, None, Some(t)) = (a.total_memory, &a.device, f.derived_total()) {
        a.total_memory = Some(t);
        let line = match f.line("utilization_without_graphs") {
            Some(_) => at("utilization_without_graphs"),
            None => at("utilization_with_graphs"),
        };
        notes.push(format!(
            "the log prints no device total: {} from its graph estimate over the utilisation it says the estimate is worth{line}",
            gib(t),
        ));
    }
    // No total in the log, no device, no flag: the start-up's own figures give it
    // (what the engine requested, over the utilisation it requested it with).
    if let (None, None, Some(w), Some(kv)) = (a.total_memory, &a.device, f.weights, f.kv_available)
    {
        let rules: EngineRules = a.engine.as_deref().unwrap_or("vllm").parse()?;
        // The utilisation the logged start-up requested its memory with: the log's own, else
        // the release's default. A --gpu-memory-utilization given now is the plan's request,
        // not the log's: over the log's used memory it would make another device (0.1 made
        // 106 GiB used at 0.9 a 1 TiB device).
        let u = f.utilization.unwrap_or(rules.gpu_memory_utilization);
        let used = [
            Some(w),
            a.activation_bytes,
            a.non_torch_bytes,
            a.graph_bytes,
            Some(kv),
        ]
        .iter()
        .flatten()
        .fold(0u64, |s, b| s.saturating_add(*b));
        let total = (used as f64 / u).ceil() as u64;
        // The device held at least what was free after the weights and the weights (SGLang's
        // "Load weight end ... avail mem=X GB, mem usage=W GB"): a start-up that took more
        // than its fraction (or left memory unused) is no smaller device than that.
        let floor = f.free_after_weights.map(|fr| fr.saturating_add(w));
        if let Some(fl) = floor.filter(|fl| *fl > total && *fl <= memplan_model::limits::MAX_BYTES)
        {
            a.total_memory = Some(fl);
            notes.push(format!(
                "the log prints no device total: at least {}, what was free after the weights and the weights{} (its figures at utilisation {u} would give {}, less than that)",
                gib(fl),
                at("free_after_weights"),
                gib(total)
            ));
        } else if total > 0 && total <= memplan_model::limits::MAX_BYTES {
            a.total_memory = Some(total);
            notes.push(format!("the log prints no device total: {} derived from its figures ({} used at utilisation {u})", gib(total), gib(used)));
        }
    }
    // The logged start-up never ran: vLLM refuses to start where less memory is free than its
    // utilisation of the total asks for (`v1/worker/gpu_worker.py` `init_device`: "Free memory
    // on device ... on startup is less than desired GPU memory utilization"). The plan for that
    // request is that refusal, unless the command line changed the request or the device.
    if let (Some(n), Some(free), Some(total), Some(u)) =
        (f.refused_free, f.free, f.total, f.utilization)
    {
        if before.gpu_memory_utilization.is_none()
            && before.total_memory.is_none()
            && before.device.is_none()
            && before.kv_cache_memory_bytes.is_none()
        {
            let wanted = (total as f64 * u).ceil() as u64;
            let mut fail = Failure::of(
                "does_not_fit",
                format!(
                    "the logged start-up failed (line {n} of {}): only {} of the device's {} was free at start-up, less than the {} that gpu_memory_utilization {u} of it asks for, and vLLM refuses to start there; free that memory, or lower --gpu-memory-utilization to at most {:.4}",
                    path.display(),
                    gib(free),
                    gib(total),
                    gib(wanted),
                    (free as f64 / total as f64 * 10_000.0).floor() / 10_000.0
                ),
            );
            fail.help
                .insert("free_at_start_bytes".into(), serde_json::Value::from(free));
            fail.help
                .insert("requested_bytes".into(), serde_json::Value::from(wanted));
            return Err(fail);
        }
    }
    // The start-up's KV cache is the log's available KV memory, unless a flag changed a term.
    // The extensible cache (0.34) re-sizes after warmup: its final size wins.
    let anchor = f.kv_final.or(f.kv_available);
    let anchored = !overridden && anchor.is_some();
    // No KV memory printed: the printed parts of a V0 budget, each within its rounding.
    // (The total's rounding scales by the utilisation, at most 1.)
    let parts_rounding = match (f.total, f.weights, activation, non_torch) {
        (Some(t), Some(_), Some(_), Some(_))
            if !overridden
                && f.legacy_line.is_some()
                && anchor.is_none()
                && a.total_memory == Some(t)
                && a.gpu_memory_utilization == f.utilization =>
        {
            let u = f.utilization.unwrap_or(1.0);
            Some(((u + 3.0) * ((1u64 << 30) / 200) as f64).ceil() as u64)
        }
        _ => None,
    };
    if anchored {
        a.kv_cache_memory_bytes = anchor;
        let (what, line) = if f.kv_final.is_some() {
            ("KV cache the engine committed after warmup", at("kv_final"))
        } else {
            ("Available KV cache memory", at("kv_available"))
        };
        notes.push(format!(
            "the KV cache is the log's {what} {}{line}",
            gib(anchor.unwrap_or(0))
        ));
    }
    // The model: --model wins (a warning where the log names another); without it, the one
    // model the log names.
    let mut model_differs = None;
    match (&a.model, f.models.as_slice()) {
        (Some(given), named)
            if !named.is_empty() && !named.iter().any(|m| same_model(given, m)) =>
        {
            model_differs = Some(listed(named));
        }
        (Some(_), _) => {}
        (None, [one]) => {
            // A Hugging Face cache snapshot of another machine (`.../models--Org--Name/
            // snapshots/HASH`, as vLLM prints a resolved path) is that model's id here.
            match hub_id(one).filter(|_| !std::path::Path::new(one).exists()) {
                Some(id) => {
                    notes.push(format!(
                        "model from the log: {one}{} (not on this machine: its Hugging Face id {id})",
                        at("model")
                    ));
                    a.model = Some(id);
                }
                // A directory of another machine (`/models/Qwen2.5-7B-Instruct`) whose name is
                // a shipped preset's: that preset, as `--model` matches a name without its
                // organisation or directory (`same_model`).
                None => match preset_dir(one) {
                    Some(name) => {
                        notes.push(format!(
                            "model from the log: {one}{} (not on this machine: its directory name is the shipped preset {name})",
                            at("model")
                        ));
                        a.model = Some(name.to_string());
                    }
                    None => {
                        notes.push(format!("model from the log: {one}{}", at("model")));
                        a.model = Some(one.clone());
                    }
                },
            }
        }
        (None, []) => {
            return Err(Failure::usage(format!(
                "--from-log {}: memplan reads the model from vLLM's \"non-default args\" or \"with config: model=\" line, SGLang's model_path, vLLM's start-up banner or \"Starting to load model\" line, SGLang's \"Found local HF snapshot for\" line, or a pasted `vllm serve X` / `--model X` / `--model-path X` command, and the log has none of them; pass --model NAME|PATH",
                path.display()
            )))
        }
        (None, several) => {
            return Err(Failure::usage(format!(
                "--from-log {}: the log names {} models ({}); pass --model NAME|PATH for the one to plan",
                path.display(),
                several.len(),
                listed(several)
            )))
        }
    }
    if let Some(t) = f.kv_tokens {
        notes.push(format!(
            "the logged engine reported {t} KV tokens{}",
            at("kv_tokens")
        ));
    }
    notes.extend(f.notes.iter().cloned());
    let mut filled = Vec::new();
    for (flag, changed) in [
        ("--total-memory", a.total_memory != before.total_memory),
        (
            "--gpu-memory-utilization",
            a.gpu_memory_utilization != before.gpu_memory_utilization,
        ),
        ("--weights-bytes", a.weights_bytes != before.weights_bytes),
        (
            "--activation-bytes",
            a.activation_bytes != before.activation_bytes,
        ),
        (
            "--non-torch-bytes",
            a.non_torch_bytes != before.non_torch_bytes,
        ),
        ("--graph-bytes", a.graph_bytes != before.graph_bytes),
        (
            "--kv-cache-memory-bytes",
            a.kv_cache_memory_bytes != before.kv_cache_memory_bytes,
        ),
        ("--max-model-len", a.max_model_len != before.max_model_len),
        (
            "--max-num-batched-tokens",
            a.max_num_batched_tokens != before.max_num_batched_tokens,
        ),
        ("--max-num-seqs", a.max_num_seqs != before.max_num_seqs),
        ("--block-size", a.block_size != before.block_size),
        (
            "--tensor-parallel-size",
            a.tensor_parallel_size != before.tensor_parallel_size,
        ),
        (
            "--pipeline-parallel-size",
            a.pipeline_parallel_size != before.pipeline_parallel_size,
        ),
        ("--enforce-eager", a.enforce_eager != before.enforce_eager),
        (
            "--kv-cache-dtype",
            a.kv_cache_dtype != before.kv_cache_dtype,
        ),
        (
            "--mamba-cache-dtype",
            a.mamba_cache_dtype != before.mamba_cache_dtype,
        ),
        (
            "--mamba-ssm-cache-dtype",
            a.mamba_ssm_cache_dtype != before.mamba_ssm_cache_dtype,
        ),
        (
            "--enable-prefix-caching",
            a.prefix_caching() != before.prefix_caching(),
        ),
        ("--engine", a.engine != before.engine),
        ("--model", a.model != before.model),
    ] {
        if changed {
            filled.push(flag);
        }
    }
    let graphs_as_logged = model_differs.is_none()
        && before.cudagraph_capture_sizes.is_none()
        && before.max_num_seqs.is_none()
        && before.max_num_batched_tokens.is_none()
        && before.kv_cache_dtype.0.is_none()
        && before.quantization.0.is_none()
        && before.speculative_model.is_none()
        && before.max_loras.is_none()
        && before.pipeline_parallel_size <= 1
        && before.graph_bytes.is_none()
        // A log that names no tensor-parallel size ran on one rank (vLLM's default): its
        // graphs are one rank's of that start-up, not of a plan over more ranks.
        && f.tensor_parallel.unwrap_or(1) == a.tensor_parallel_size;
    Ok(LogContext {
        path: Some(path),
        filled,
        figures: Some(f),
        notes,
        anchored,
        parts_rounding,
        model_differs,
        graphs_as_logged,
    })
}

/// Where the plan warns that graph memory is not reserved (vLLM up to 0.19 subtracts none,
/// nor does SGLang's static fraction), the graph memory the logged start-up printed replaces
/// memplan's own estimate in that warning: what capture took, where the log prints it (vLLM
/// 0.19.0 `v1/worker/gpu_model_runner.py` `GPUModelRunner.capture_model`: "Graph capturing
/// finished in N secs, took X GiB"; `v1/worker/gpu_worker.py`
/// `Worker.compile_or_warm_up_model`: "CUDA graph pool memory: X GiB (actual), Y GiB
/// (estimated)"; SGLang's "Capture cuda graph end ... mem usage=X GB"), else the engine's own
/// estimate (`GPUModelRunner.profile_cudagraph_memory`: "Estimated CUDA graph memory: X GiB
/// total"). A note says which figure, and from which line. Not where a flag changed what
/// sizes the graphs, the ranks among them (a log that names no tensor-parallel size ran on
/// one), nor where `--graph-bytes` gave the figure (`as_logged`): the log's figure is another
/// start-up's.
pub fn logged_graph_memory(plan: &mut Plan, f: &LogFigures, as_logged: bool) {
    let (bytes, name, what) = match (f.graph_actual, f.graph_estimate) {
        _ if !as_logged => return,
        (Some(b), _) => (b, "graph_actual", "what graph capture took"),
        (None, Some(b)) => (b, "graph_estimate", "the engine's own estimate"),
        (None, None) => return,
    };
    let mut replaced = None;
    for w in &mut plan.warnings {
        if let memplan_planner::Warning::GraphMemoryNotReserved { estimate } = w {
            replaced = Some(*estimate);
            *estimate = bytes;
        }
    }
    if let Some(ours) = replaced {
        let at = f
            .line(name)
            .map(|n| format!(" (line {n})"))
            .unwrap_or_default();
        plan.notes.push(format!(
            "graph memory outside the budget: the log's {}, {what}{at}, not memplan's estimate of {}",
            memplan::bytes::fmt_bytes(bytes),
            memplan::bytes::fmt_bytes(ours)
        ));
    }
}

/// The Hugging Face id of a path into a Hugging Face cache (`.../models--Org--Name/...` is
/// `Org/Name`), or `None`.
fn hub_id(path: &str) -> Option<String> {
    let i = path.find("models--")?;
    let dir = path[i + "models--".len()..].split('/').next()?;
    let (org, name) = dir.split_once("--")?;
    (!org.is_empty() && !name.is_empty()).then(|| format!("{org}/{name}"))
}

/// The last component of a path the log names, where the path is not on this machine and
/// that component names a shipped preset (any case); `None` otherwise.
fn preset_dir(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    if !trimmed.contains('/') || std::path::Path::new(trimmed).exists() {
        return None;
    }
    let name = trimmed.rsplit('/').next().filter(|n| !n.is_empty())?;
    memplan_model::presets::find(name).ok().map(|_| name)
}

/// Whether `--model` names the model a log names: the same name, or the same model name
/// without its organisation or directory (`llama-3.1-8b-instruct` and
/// `meta-llama/Llama-3.1-8B-Instruct`), any case; a Hugging Face cache snapshot path
/// (`.../models--Org--Name/snapshots/HASH`) is `Org/Name`.
fn same_model(given: &str, logged: &str) -> bool {
    fn key(m: &str) -> String {
        let m = m.trim_end_matches('/');
        let m = m.strip_suffix("/config.json").unwrap_or(m);
        let m = hub_id(m).unwrap_or_else(|| m.to_string());
        m.rsplit('/').next().unwrap_or(&m).to_ascii_lowercase()
    }
    given == logged || key(given) == key(logged)
}

/// The rules for a V1 log without a version line, and the note that says why: the newest
/// release its own lines allow (the newest memplan knows where no line bounds it from above),
/// and how to name another.
/// The release read and what was compared, where `release` (`0.11.0`) is of a minor release
/// older than [`VLLM`]'s first row whose KV sizing is that row's
/// ([`memplan_model::engine::VLLM_OLDER_AS_FIRST_ROW`]).
fn older_as_first_row(release: &str) -> Option<(&'static str, &'static str)> {
    let minor: String = release.split('.').take(2).collect::<Vec<_>>().join(".");
    memplan_model::engine::VLLM_OLDER_AS_FIRST_ROW
        .iter()
        .find(|(m, _, _)| *m == minor)
        .map(|(_, checked, why)| (*checked, *why))
}

/// The SGLang rules for a log whose version line names `release`: its row, else the nearest
/// (oldest, or the first 0.5 row for the unread 0.4.9 to 0.4.x), with a note.
fn sglang_release(release: &str, at: &str, notes: &mut Vec<String>) -> String {
    let want = format!("sglang@{release}");
    match want.parse::<EngineRules>() {
        Ok(_) => want,
        Err(e) => {
            let e = e.to_string();
            let pick = if e.contains("newer") {
                SGLANG.last().map_or("0.5.23", |r| r.version)
            } else if e.contains("between") {
                "0.5"
            } else {
                SGLANG[0].version
            };
            notes.push(format!(
                "the log's SGLang {release}{at} is outside memplan's rules ({e}): planned with sglang@{pick}'s"
            ));
            format!("sglang@{pick}")
        }
    }
}

/// The SGLang rules for a log without a version line: where its first stamped line is dated
/// before a release that changed the rules was published
/// ([`memplan_model::engine::SGLANG_PUBLISHED`]), the row before that release, with a note;
/// else the newest.
fn sglang_by_date(date: Option<&str>, at: &str, notes: &mut Vec<String>) -> String {
    let Some(d) = date else {
        return "sglang".into();
    };
    let Some((next, published)) = memplan_model::engine::SGLANG_PUBLISHED
        .iter()
        .find(|(_, p)| d < *p)
    else {
        return "sglang".into();
    };
    let want = format!("sglang@{next}");
    let row = SGLANG
        .iter()
        .rev()
        .find(|r| version_lt(r.version, next))
        .map_or(SGLANG[0].version, |r| r.version);
    notes.push(format!(
        "the log has no version line; it is dated {d}{at}, before SGLang {next} was published ({published}), so an older release wrote it: planned with sglang@{row}'s rules, the newest memplan holds before {want} (name --engine sglang@VERSION for another)"
    ));
    format!("sglang@{row}")
}

/// `a < b` for dotted release numbers (`0.4.4` < `0.4.5`).
fn version_lt(a: &str, b: &str) -> bool {
    let p = |s: &str| -> Vec<u32> { s.split('.').filter_map(|x| x.parse().ok()).collect() };
    p(a) < p(b)
}

fn unversioned_v1(f: &LogFigures) -> (String, String) {
    let (rules, note) = unversioned_v1_by_lines(f);
    match tokens_date(f, &rules) {
        Some((older, why)) => (older, format!("{note}; {why}")),
        None => (rules, note),
    }
}

/// Where the release [`unversioned_v1_by_lines`] picked (`rules`) cannot have allocated the
/// log's KV cache: its logged tokens ("GPU KV cache size: N tokens", whole blocks of one
/// attention group) are no multiple of that release's block size and the log prints none of its
/// own. The newest release the log's lines allow whose block size divides them is picked
/// instead, with why (vLLM 0.34 raised the default block from 16 to 64 tokens,
/// `CacheConfig.DEFAULT_BLOCK_SIZE`: a log of 75,824 tokens was not written by it).
fn tokens_date(f: &LogFigures, rules: &str) -> Option<(String, String)> {
    let tokens = f.kv_tokens.filter(|_| f.block_size.is_none())?;
    let picked: EngineRules = rules.parse().ok()?;
    if picked.block_size == 0 || tokens.is_multiple_of(u64::from(picked.block_size)) {
        return None;
    }
    let at = VLLM.iter().position(|r| r.version == picked.version)?;
    let b = f.release_bounds();
    let from = b
        .oldest
        .filter(|_| !b.contradict())
        .and_then(|lo| VLLM.iter().position(|r| r.version == lo.release))
        .unwrap_or(0);
    let older = VLLM[from..at]
        .iter()
        .rev()
        .find(|r| r.block_size > 0 && tokens.is_multiple_of(u64::from(r.block_size)))?;
    Some((
        format!("vllm@{}", older.version),
        format!(
            "but its {tokens} KV tokens{} are no multiple of {}'s {}-token blocks: planned with vllm@{}'s rules instead, the newest release whose {}-token blocks give them",
            f.line("kv_tokens").map(|n| format!(" (line {n})")).unwrap_or_default(),
            rules,
            picked.block_size,
            older.version,
            older.block_size
        ),
    ))
}

/// [`unversioned_v1`] by the lines the log prints alone.
fn unversioned_v1_by_lines(f: &LogFigures) -> (String, String) {
    let newest = EngineRules::newest_vllm();
    let b = f.release_bounds();
    let block = |rules: &str| match (f.block_size, rules.parse::<EngineRules>()) {
        (Some(own), _) => format!("the log's {own}-token blocks"),
        (None, Ok(r)) => format!("{}-token blocks", r.block_size),
        (None, Err(_)) => String::new(),
    };
    if let (true, Some(lo), Some(hi)) = (b.contradict(), b.oldest, b.newest) {
        return (
            newest.to_string(),
            format!(
                "the log has no version line and its lines disagree on the release (line {}: {}; line {}: {}), as a fork or two start-ups of different releases print them: planned with the newest vLLM rules, {newest} ({}); pass --engine vllm@X for the release that wrote it",
                lo.line, lo.why, hi.line, hi.why, block(&newest.to_string())
            ),
        );
    }
    match (b.oldest, b.newest) {
        (lo, Some(hi)) => {
            let rules = format!("vllm@{}", hi.release);
            let from = lo.map_or_else(String::new, |lo| {
                format!(" and after {} (line {}: {})", lo.release, lo.line, lo.why)
            });
            (
                rules.clone(),
                format!(
                    "the log has no version line; its line {} is {}{from}: planned with {rules}'s rules, the newest release that prints it ({}); pass --engine vllm@X for another release",
                    hi.line, hi.why, block(&rules)
                ),
            )
        }
        (Some(lo), None) => (
            newest.to_string(),
            format!(
                "the log has no version line; its line {} is {}, and no line dates it further: planned with the newest vLLM rules, {newest} ({}); pass --engine vllm@X if an earlier release wrote it",
                lo.line, lo.why, block(&newest.to_string())
            ),
        ),
        (None, None) => (
            newest.to_string(),
            format!(
                "the log has no version line and none of its lines dates the release: planned with the newest vLLM rules, {newest} ({}); pass --engine vllm@X for the release that wrote it",
                block(&newest.to_string())
            ),
        ),
    }
}

/// The other memory users from the flags.
pub fn extras(a: &Flags) -> Result<Extras, Failure> {
    // `--cpu-offload-gb` is checked where it is parsed (finite, 0 to 1 PiB): the product
    // stays far inside 64 bits.
    if let Some(stage) = a
        .pipeline_stage
        .filter(|s| *s >= a.pipeline_parallel_size.max(1))
    {
        return Err(Failure::usage(format!(
            "--pipeline-stage {stage}: stages count from 0 to --pipeline-parallel-size - 1 ({})",
            a.pipeline_parallel_size.max(1) - 1
        )));
    }
    if let Some(rank) = a
        .tensor_parallel_rank
        .filter(|r| *r >= a.tensor_parallel_size.max(1))
    {
        return Err(Failure::usage(format!(
            "--tensor-parallel-rank {rank}: ranks count from 0 to --tensor-parallel-size - 1 ({})",
            a.tensor_parallel_size.max(1) - 1
        )));
    }
    if a.tensor_parallel_rank.is_some()
        && a.pipeline_stage.is_none()
        && a.pipeline_parallel_size > 1
    {
        return Err(Failure::usage(
            "--tensor-parallel-rank with --pipeline-parallel-size > 1 needs --pipeline-stage (which stage the rank is in)",
        ));
    }
    let mut e = Extras::default()
        .with_cpu_offload((a.cpu_offload_gb * (1u64 << 30) as f64) as u64)
        .with_pipeline_parallel(a.pipeline_parallel_size)
        .with_pipeline_stage(a.pipeline_stage)
        .with_tensor_parallel_rank(a.tensor_parallel_rank);
    if let Some(m) = &a.speculative_model {
        let draft = Model::load(m).map_err(|e| match e {
            // The draft is named by its own flag, not by `--model`.
            Error::InvalidParam {
                param: Param::Model,
                message,
            } => Failure::usage(format!("--speculative-model: {message}")),
            other => Failure::from(other),
        })?;
        e = e.with_draft(draft.config, a.num_speculative_tokens);
    }
    if let Some(n) = a.max_loras {
        e = e.with_lora(n, a.max_lora_rank);
    }
    Ok(e)
}

/// For a `.gguf` model, the llama.cpp answer: which `-c` and `-ngl` fit the same device
/// budget (what the engine may use minus activations, library memory and graphs), per KV
/// type.
pub fn llama_cpp_answer(a: &Flags, model: &Model, plan: &Plan) -> Result<Vec<String>, Failure> {
    let memplan_model::Source::Gguf(path) = &model.source else {
        return Ok(Vec::new());
    };
    let info = memplan_model::gguf::read(path)?;
    let config = &model.config;
    let c = &plan.consumers;
    let budget = plan.requested_bytes.saturating_sub(
        c.bytes(ConsumerKind::Activation)
            .saturating_add(c.bytes(ConsumerKind::NonAllocator))
            .saturating_add(c.bytes(ConsumerKind::Graphs)),
    );
    let ctx = a.max_model_len.or(config.derived_max_len).unwrap_or(4096);
    let mut out = Vec::new();
    for kv in ["f16", "q8_0", "q4_0"] {
        let f = memplan_model::gguf::fit(&info, config, budget, 0, kv, ctx)?;
        out.push(format!(
            "llama.cpp: -c {} -ngl {} --cache-type-k {kv} --cache-type-v {kv} fits ({} of weights and {} of KV cache on the GPU)",
            f.ctx,
            f.ngl,
            memplan::bytes::fmt_bytes(f.weight_bytes),
            memplan::bytes::fmt_bytes(f.kv_bytes)
        ));
    }
    Ok(out)
}
