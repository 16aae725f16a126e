//! `memplan.engine.start_up`: the measured start-up of a Python engine, through the facade's
//! own chain ([`memplan::Session`]), exactly as `examples/engine` runs it in Rust:
//!
//! open (shared) → `Session::start_for` (calibrate within the request, release cache, baseline) → `check_request`
//! → `load_weights` → `profile_run` → `capture_graphs` (strategy from the capability, or the
//! one asked for) → `plan` → (with an exchange: every rank's plan, combined) →
//! `into_kv_cache`.
//!
//! Every setting left unset takes the dry run's default, through the same functions
//! (`memplan::model::defaults`): the engine release (the newest vLLM release memplan knows),
//! the request (with vLLM 0.34's extensible KV cache: free / total at the baseline), block
//! size, requests and tokens per step, the rank's KV layout (its pipeline stage's layers, its
//! share of the heads) and the sizing rules. So a start-up and `memplan.plan` of the same
//! model on the same GPU differ only by what one measured and the other estimated.
//!
//! The engine's hooks are [`PyEngine`]'s; a Python exception in a hook (or in the exchange)
//! is re-raised as it was once the session has torn down what it held.

use memplan::kv::KvDtype;
use memplan::model::consumers::Extras;
use memplan::model::defaults;
use memplan::model::dryrun::DryRun;
use memplan::model::Model;
use memplan::{
    AllocatorConfig, Error, KvRange, Param, Rank, Result, Session, SharedDevice, StrategyKind,
};
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::hooks::PyEngine;

/// What the start-up asks for (`None`: the dry run's default).
pub struct Options {
    pub model: String,
    pub gpu_memory_utilization: Option<f64>,
    pub kv_cache_memory_bytes: Option<u64>,
    pub kv_cache_dtype: Option<String>,
    pub engine_release: Option<String>,
    pub block_size: Option<u32>,
    pub tensor_parallel_size: u64,
    pub tensor_parallel_rank: u64,
    pub pipeline_parallel_size: u64,
    pub pipeline_parallel_rank: u64,
    pub max_model_len: Option<u64>,
    pub max_num_seqs: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    pub strategy: Option<String>,
    /// The caching allocator's options as the engine runs them, and where they came from
    /// (`alloc_conf=`, else this process's environment); `None`: PyTorch's default.
    pub alloc_conf: Option<(AllocatorConfig, String)>,
}

/// What a start-up gives back: the plan, the profile, the combined plan (with an exchange),
/// as JSON text, the KV range (post-capture), the KV blocks the engine allocates, and the KV
/// cache's warnings (JSON text).
type Outcome = (String, String, Option<String>, Option<KvRange>, u64, String);

/// [`Outcome`] as Python gets it (the KV range as its Python class).
type Returned = (
    String,
    String,
    Option<String>,
    Option<PyKvRange>,
    u64,
    String,
);

/// Every rank's plan through the caller's exchange (`exchange(own plan JSON)` returns every
/// rank's plan JSON); a Python exception is kept in `raised`.
fn exchange(f: &Py<PyAny>, own: &str, raised: &mut Option<PyErr>) -> Result<Vec<String>> {
    Python::attach(|py| {
        f.bind(py)
            .call1((own,))
            .and_then(|v| v.extract::<Vec<String>>())
            .map_err(|e| {
                let msg = format!("the exchange of the ranks' plans raised {}", e.value(py));
                raised.get_or_insert(e);
                Error::Measurement(msg)
            })
    })
}

/// The chain. `dry` keeps the dry run of the same settings (to match a refusal against).
fn chain(
    dev: &SharedDevice,
    engine: &mut PyEngine,
    o: &Options,
    exchanger: Option<&Py<PyAny>>,
    raised: &mut Option<PyErr>,
    dry_run: &mut Option<DryRun>,
) -> Result<Outcome> {
    let model = Model::load(&o.model)?;
    let rules = defaults::engine(o.engine_release.as_deref())?;
    let (tp, pp) = (o.tensor_parallel_size, o.pipeline_parallel_size);
    let rank = Rank::new(o.tensor_parallel_rank, tp)?.with_stage(o.pipeline_parallel_rank, pp)?;
    let strategy = o
        .strategy
        .as_deref()
        .filter(|s| *s != "auto")
        .map(str::parse::<StrategyKind>)
        .transpose()?;
    let kv_dtype = match o.kv_cache_dtype.as_deref() {
        None => None,
        Some(d) => KvDtype::parse_setting(d)?,
    };
    let device_name = dev.descriptor().name.clone();
    // The request as the device reads before the start sizes the start's own checks
    // (`Session::start_for`: none holds more than half of it at once); the plan's request is
    // resolved again below, from the baseline.
    let pre = dev.driver_memory()?;
    let s = match pre.total {
        Some(total) => {
            let (before, _) = defaults::request(
                &rules,
                total,
                pre.free,
                (tp, pp),
                (o.gpu_memory_utilization, o.kv_cache_memory_bytes),
            )?;
            Session::start_for(dev, engine, before)?
        }
        None => Session::start(dev, engine)?,
    }
    .with_rank(rank);
    // The request and every setting, as the dry run resolves them, from the baseline.
    let base = *s.baseline();
    let total = base.driver.total.ok_or_else(|| {
        Error::param(
            Param::DeviceTotal,
            "the device reports no total to plan a start-up against",
        )
    })?;
    let (request, note) = defaults::request(
        &rules,
        total,
        base.driver.free,
        (tp, pp),
        (o.gpu_memory_utilization, o.kv_cache_memory_bytes),
    )?;
    let mut extras = Extras::default()
        .with_pipeline_parallel(pp)
        .with_tensor_parallel_rank(Some(o.tensor_parallel_rank));
    if pp > 1 {
        extras = extras.with_pipeline_stage(Some(o.pipeline_parallel_rank));
    }
    let dry = DryRun::new(model.clone(), total)
        .engine(rules)
        .request(request)
        .device_name(device_name)
        .kv_cache_dtype(kv_dtype)
        .block_size(o.block_size)
        .max_model_len(o.max_model_len)
        .max_num_seqs(o.max_num_seqs)
        .max_num_batched_tokens(o.max_num_batched_tokens)
        .tensor_parallel(tp)
        .notes(note.into_iter().collect())
        .extras(extras);
    let set = defaults::settings(&dry)?;
    *dry_run = Some(dry);
    // The KV cache is known before the profile run: where the run runs out of memory after
    // the session's own frees kept some on a device that keeps memory of every free, the
    // session judges with it whether the engine alone would have had room for one request.
    let mut s = s
        .with_sizing_rules(set.rules, set.engine.clone())
        .with_kv(&set.kv_spec, set.limits);
    if let Some((c, source)) = &o.alloc_conf {
        s = s.with_allocator_config(c.clone(), source.clone());
    }
    s.check_request(request)?;
    s.load_weights(|e| e.step("load_weights"))?;
    s.profile_run(|e| e.step("profile_run"))?;
    match strategy {
        Some(k) => s.capture_graphs_with(k)?,
        None => s.capture_graphs()?,
    };
    let mut b = s
        .plan_builder(request, &set.kv_spec, set.limits)?
        .model(model.name.clone())
        .notes(set.notes.clone());
    if let Some(n) = set.max_num_seqs {
        b = b.max_num_seqs(n);
    }
    let plan = s.plan_with(b)?;
    let profile = s.profile();
    let plan_json = plan.to_json();
    let profile_json = serde_json::to_string(&profile)
        .map_err(|e| Error::Measurement(format!("JSON encoding failed: {e}")))?;
    let combined = match exchanger {
        Some(f) => Some(memplan::combine_json(&exchange(f, &plan_json, raised)?)?),
        None => None,
    };
    let kv = s.into_kv_cache(combined.as_ref().unwrap_or(&plan))?;
    let kv_warnings = serde_json::Value::Array(kv.warnings.iter().map(|w| w.to_json()).collect());
    Ok((
        plan_json,
        profile_json,
        combined.map(|c| c.to_json()),
        kv.range,
        kv.num_blocks,
        kv_warnings.to_string(),
    ))
}

/// Run the start-up; a hook's (or the exchange's) own exception wins over the memplan error
/// it caused.
pub fn run(
    py: Python<'_>,
    dev: &SharedDevice,
    engine: &Bound<'_, PyAny>,
    o: &Options,
    exchanger: Option<&Py<PyAny>>,
) -> PyResult<Outcome> {
    let mut eng = PyEngine::new(engine);
    let mut raised = None;
    let mut dry = None;
    let out = chain(dev, &mut eng, o, exchanger, &mut raised, &mut dry);
    let kept = eng.failed.take().or(raised);
    match (out, kept) {
        // Out of memory in a step (memplan's own, or memplan's OutOfMemoryError raised in a
        // hook, which becomes this error's cause): the step and the sizes, or the dry run's
        // own refusal when the same settings do not fit on paper either.
        (Err(e), kept) if e.is_out_of_memory() => {
            let err = to_py(py, &like_the_dry_run(e, dry.as_ref()));
            if let Some(k) = kept {
                err.set_cause(py, Some(k));
            }
            Err(err)
        }
        (_, Some(k)) => Err(k),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(to_py(py, &e)),
    }
}

/// `oom`, or, when the dry run of the same settings refuses too, that refusal (what
/// `memplan.plan` says for them), with what the start-up ran into.
fn like_the_dry_run(oom: Error, dry: Option<&DryRun>) -> Error {
    match dry.map(DryRun::plan) {
        Some(Err(refused)) if refused.refusal().is_some() => refused.during(format!(
            "{oom}; a dry run of the same settings does not fit either"
        )),
        _ => oom,
    }
}

/// The KV cache's address range after a post-capture start-up, mapped where the engine's
/// graphs point; releasing it (or dropping the last reference) unmaps and gives the address
/// space back.
#[pyclass(module = "memplan._native", name = "KvRange")]
pub struct PyKvRange {
    inner: Option<KvRange>,
}

impl PyKvRange {
    fn get(&self, py: Python<'_>) -> PyResult<&KvRange> {
        self.inner.as_ref().ok_or_else(|| {
            to_py(
                py,
                &Error::invalid("kv_range", "this KV range was already released"),
            )
        })
    }
}

#[pymethods]
impl PyKvRange {
    /// The range's base address (what the engine was given before capture).
    #[getter]
    fn address(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.get(py)?.address())
    }

    /// Bytes of address space reserved.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.get(py)?.bytes())
    }

    /// Bytes of memory mapped at the start of the range (the plan's KV cache, rounded down to
    /// the mapping granularity).
    #[getter]
    fn mapped_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.get(py)?.mapped_bytes())
    }

    /// Whether it was released.
    #[getter]
    fn released(&self) -> bool {
        self.inner.is_none()
    }

    /// Unmap and give the address space back now (dropping the object does the same).
    fn release(&mut self, py: Python<'_>) -> PyResult<()> {
        match self.inner.take() {
            Some(r) => r.release().map_err(|e| to_py(py, &e)),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(r) => format!(
                "KvRange(address={:#x}, size={}, mapped_bytes={})",
                r.address(),
                r.bytes(),
                r.mapped_bytes()
            ),
            None => "KvRange(released)".to_string(),
        }
    }
}

/// The device a start-up runs on: a `SimDevice` (shared with the engine's allocator) or an id.
fn device_of(py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<SharedDevice> {
    #[cfg(feature = "sim")]
    if let Ok(d) = device.cast::<crate::sim::SimDevice>() {
        return Ok(d.borrow().shared.clone());
    }
    let id: String = device.extract().map_err(|_| {
        crate::errors::type_error(
            py,
            format!(
                "device={} is neither a device id (\"cuda:0\") nor a memplan.engine.SimDevice",
                crate::errors::repr(device)
            ),
        )
    })?;
    memplan::open_shared(&id).map_err(|e| to_py(py, &e))
}

/// Run the measured start-up of `engine` on `device`; `(plan JSON, profile JSON, combined
/// plan JSON or None, KV range)`.
#[pyfunction]
#[pyo3(signature = (
    device, engine, *, model, gpu_memory_utilization=None, kv_cache_memory_bytes=None,
    kv_cache_dtype=None, engine_release=None, block_size=None, tensor_parallel_size=None,
    tensor_parallel_rank=None, pipeline_parallel_size=None, pipeline_parallel_rank=None,
    max_model_len=None, max_num_seqs=None, max_num_batched_tokens=None, graph_strategy=None,
    exchange=None, alloc_conf=None
))]
#[allow(clippy::too_many_arguments)]
pub fn start_up(
    py: Python<'_>,
    device: &Bound<'_, PyAny>,
    engine: &Bound<'_, PyAny>,
    model: String,
    gpu_memory_utilization: Option<&Bound<'_, PyAny>>,
    kv_cache_memory_bytes: Option<&Bound<'_, PyAny>>,
    kv_cache_dtype: Option<String>,
    engine_release: Option<String>,
    block_size: Option<&Bound<'_, PyAny>>,
    tensor_parallel_size: Option<&Bound<'_, PyAny>>,
    tensor_parallel_rank: Option<&Bound<'_, PyAny>>,
    pipeline_parallel_size: Option<&Bound<'_, PyAny>>,
    pipeline_parallel_rank: Option<&Bound<'_, PyAny>>,
    max_model_len: Option<&Bound<'_, PyAny>>,
    max_num_seqs: Option<&Bound<'_, PyAny>>,
    max_num_batched_tokens: Option<&Bound<'_, PyAny>>,
    graph_strategy: Option<String>,
    exchange: Option<&Bound<'_, PyAny>>,
    alloc_conf: Option<String>,
) -> PyResult<Returned> {
    use crate::errors::{count_arg, int_arg, type_error, usage};
    use memplan::model::limits;
    // Every argument is checked before anything runs: a wrong type is an ArgumentTypeError,
    // a value out of range a UsageError naming it (the ranges of `memplan plan`'s flags).
    crate::hooks::check_engine(py, engine)?;
    // `None` (or absent) takes the default: the dry run's, resolved in the chain.
    let count = |v: Option<&Bound<'_, PyAny>>, name: &str, max: u64| -> PyResult<Option<u64>> {
        match v.filter(|v| !v.is_none()) {
            Some(v) => count_arg(py, v, name, max).map(Some),
            None => Ok(None),
        }
    };
    let block_size =
        count(block_size, "block_size", u64::from(limits::MAX_BLOCK))?.map(|b| b as u32);
    let tensor_parallel_size =
        count(tensor_parallel_size, "tensor_parallel_size", limits::MAX_TP)?.unwrap_or(1);
    let pipeline_parallel_size = count(
        pipeline_parallel_size,
        "pipeline_parallel_size",
        limits::MAX_TP,
    )?
    .unwrap_or(1);
    let rank_of =
        |v: Option<&Bound<'_, PyAny>>, name: &str, size: u64| match v.filter(|v| !v.is_none()) {
            Some(v) => int_arg(py, v, name, size - 1),
            None => Ok(0),
        };
    let tensor_parallel_rank = rank_of(
        tensor_parallel_rank,
        "tensor_parallel_rank",
        tensor_parallel_size,
    )?;
    let pipeline_parallel_rank = rank_of(
        pipeline_parallel_rank,
        "pipeline_parallel_rank",
        pipeline_parallel_size,
    )?;
    let max_model_len = count(max_model_len, "max_model_len", limits::MAX_MODEL_LEN)?;
    let max_num_seqs = count(max_num_seqs, "max_num_seqs", limits::MAX_NUM_SEQS)?;
    let max_num_batched_tokens = count(
        max_num_batched_tokens,
        "max_num_batched_tokens",
        limits::MAX_BATCHED_TOKENS,
    )?;
    let kv_cache_memory_bytes = count(
        kv_cache_memory_bytes,
        "kv_cache_memory_bytes",
        limits::MAX_BYTES,
    )?;
    let gpu_memory_utilization = match gpu_memory_utilization.filter(|v| !v.is_none()) {
        Some(v) if v.is_instance_of::<pyo3::types::PyBool>() || v.extract::<f64>().is_err() => {
            return Err(type_error(
                py,
                format!(
                    "gpu_memory_utilization={} is not a number; it takes a fraction in (0, 1]",
                    crate::errors::repr(v)
                ),
            ))
        }
        Some(v) => Some(v.extract::<f64>()?),
        None => None,
    };
    match (kv_cache_memory_bytes, gpu_memory_utilization) {
        (Some(_), Some(_)) => {
            return Err(usage(
                py,
                "give kv_cache_memory_bytes or gpu_memory_utilization, not both".into(),
            ))
        }
        (None, Some(u)) if limits::check_fraction(u).is_err() => {
            return Err(usage(
                py,
                format!("gpu_memory_utilization={u} is outside (0, 1]"),
            ))
        }
        _ => {}
    }
    let exchange = match exchange.filter(|v| !v.is_none()) {
        Some(f) if !f.is_callable() => {
            return Err(type_error(
                py,
                format!(
                    "exchange={} is not callable; it takes this rank's plan (JSON text) and returns every rank's",
                    crate::errors::repr(f)
                ),
            ))
        }
        f => f.map(|f| f.clone().unbind()),
    };
    // The engine runs in this process, so its caching allocator reads this process's
    // environment: where the caller states no configuration, the variables PyTorch reads.
    // Read (and refused where malformed) before anything runs.
    let alloc_conf = match alloc_conf {
        Some(text) => AllocatorConfig::parse(&text)
            .map(|c| Some((c, "alloc_conf=".to_string())))
            .map_err(|e| usage(py, format!("alloc_conf={text:?}: {e}")))?,
        None => AllocatorConfig::from_env()
            .map(|c| {
                c.map(|(c, var)| (c, format!("the environment variable {var} of this process")))
            })
            .map_err(|e| usage(py, e.to_string()))?,
    };
    let o = Options {
        model,
        gpu_memory_utilization,
        kv_cache_memory_bytes,
        kv_cache_dtype,
        engine_release,
        block_size,
        tensor_parallel_size,
        tensor_parallel_rank,
        pipeline_parallel_size,
        pipeline_parallel_rank,
        max_model_len,
        max_num_seqs,
        max_num_batched_tokens,
        strategy: graph_strategy,
        alloc_conf,
    };
    crate::errors::guard(py, || {
        let dev = device_of(py, device)?;
        let (plan, profile, combined, kv, kv_blocks, kv_warnings) =
            run(py, &dev, engine, &o, exchange.as_ref())?;
        Ok((
            plan,
            profile,
            combined,
            kv.map(|r| PyKvRange { inner: Some(r) }),
            kv_blocks,
            kv_warnings,
        ))
    })
}
