//! `memplan.engine.start_up`: the measured start-up of a Python engine, through the facade's
//! own chain ([`memplan::Session`]), exactly as `examples/engine` runs it in Rust:
//!
//! open (shared) → `Session::start` (calibrate, release cache, baseline) → `check_request`
//! → `load_weights` → `profile_run` → `capture_graphs` (strategy from the capability, or the
//! one asked for) → `plan(request, KV spec of the model, limits)` → `into_kv_cache`.
//!
//! The KV spec comes from the model as `memplan plan` reads it (`memplan::model::Model`).
//! The engine's hooks are [`PyEngine`]'s; a Python exception in a hook is re-raised as it was
//! once the session has torn down what it held.

use memplan::kv::{KvDtype, KvLimits, KvSpec};
use memplan::model::Model;
use memplan::{Error, KvRange, Rank, Request, Result, Session, SharedDevice, StrategyKind};
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::hooks::PyEngine;

/// What the start-up asks for.
pub struct Options {
    pub model: String,
    pub request: Request,
    pub kv_cache_dtype: Option<String>,
    pub block_size: u32,
    pub tensor_parallel_size: u64,
    pub tensor_parallel_rank: u64,
    pub max_model_len: Option<u64>,
    pub max_num_batched_tokens: u64,
    pub strategy: Option<String>,
}

/// The KV cache the model needs per rank, and the request limits.
fn kv_of(o: &Options) -> Result<(KvSpec, KvLimits, String)> {
    let model = Model::load(&o.model)?;
    let c = &model.config;
    let dtype = match o.kv_cache_dtype.as_deref() {
        None | Some("auto") => c
            .torch_dtype
            .as_deref()
            .unwrap_or("bfloat16")
            .parse::<KvDtype>()?,
        Some(d) => d.parse()?,
    };
    let spec = c.kv_spec(dtype, o.block_size, o.tensor_parallel_size)?;
    let longest = c.max_position_embeddings;
    let max_model_len = o.max_model_len.or(longest).ok_or_else(|| {
        Error::invalid(
            "max_model_len",
            "the model config has no max_position_embeddings: give max_model_len",
        )
    })?;
    let limits = KvLimits::new(max_model_len, o.max_num_batched_tokens)
        .with_max_len_limit(max_model_len.max(longest.unwrap_or(0)));
    Ok((spec, limits, model.name.clone()))
}

/// The chain. Returns the plan and profile as JSON text, and the KV range (post-capture).
fn chain(
    dev: &SharedDevice,
    engine: &mut PyEngine,
    o: &Options,
) -> Result<(String, String, Option<KvRange>)> {
    let (spec, limits, _name) = kv_of(o)?;
    let strategy = o
        .strategy
        .as_deref()
        .filter(|s| *s != "auto")
        .map(str::parse::<StrategyKind>)
        .transpose()?;
    let rank = Rank::new(o.tensor_parallel_rank, o.tensor_parallel_size)?;
    let mut s = Session::start(dev, engine)?.with_rank(rank);
    s.check_request(o.request)?;
    s.load_weights(|e| e.step("load_weights"))?;
    s.profile_run(|e| e.step("profile_run"))?;
    match strategy {
        Some(k) => s.capture_graphs_with(k)?,
        None => s.capture_graphs()?,
    };
    let plan = s.plan(o.request, &spec, limits)?;
    let profile = s.profile();
    let json = |v: serde_json::Result<String>| {
        v.map_err(|e| Error::Measurement(format!("JSON encoding failed: {e}")))
    };
    let plan_json = json(serde_json::to_string(&plan))?;
    let profile_json = json(serde_json::to_string(&profile))?;
    let kv = s.into_kv_cache(&plan)?.range;
    Ok((plan_json, profile_json, kv))
}

/// Run the start-up; a hook's own exception wins over the memplan error it caused.
pub fn run(
    py: Python<'_>,
    dev: &SharedDevice,
    engine: &Bound<'_, PyAny>,
    o: &Options,
) -> PyResult<(String, String, Option<KvRange>)> {
    let mut eng = PyEngine::new(engine);
    let out = chain(dev, &mut eng, o);
    if let Some(e) = eng.failed.take() {
        return Err(e);
    }
    out.map_err(|e| to_py(py, &e))
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

/// Run the measured start-up of `engine` on `device`; `(plan JSON, profile JSON, KV range)`.
#[pyfunction]
#[pyo3(signature = (
    device, engine, *, model, gpu_memory_utilization=None, kv_cache_memory_bytes=None,
    kv_cache_dtype=None, block_size=None, tensor_parallel_size=None, tensor_parallel_rank=None,
    max_model_len=None, max_num_batched_tokens=None, graph_strategy=None
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
    block_size: Option<&Bound<'_, PyAny>>,
    tensor_parallel_size: Option<&Bound<'_, PyAny>>,
    tensor_parallel_rank: Option<&Bound<'_, PyAny>>,
    max_model_len: Option<&Bound<'_, PyAny>>,
    max_num_batched_tokens: Option<&Bound<'_, PyAny>>,
    graph_strategy: Option<String>,
) -> PyResult<(String, String, Option<PyKvRange>)> {
    use crate::errors::{count_arg, int_arg, type_error, usage};
    use memplan::model::limits;
    // Every argument is checked before anything runs: a wrong type is an ArgumentTypeError,
    // a value out of range a UsageError naming it (the ranges of `memplan plan`'s flags).
    crate::hooks::check_engine(py, engine)?;
    // `None` (or absent) takes the default.
    let count = |v: Option<&Bound<'_, PyAny>>, name: &str, max: u64, default: u64| match v
        .filter(|v| !v.is_none())
    {
        Some(v) => count_arg(py, v, name, max),
        None => Ok(default),
    };
    let block_size = count(block_size, "block_size", u64::from(limits::MAX_BLOCK), 16)? as u32;
    let tensor_parallel_size = count(
        tensor_parallel_size,
        "tensor_parallel_size",
        limits::MAX_TP,
        1,
    )?;
    let tensor_parallel_rank = match tensor_parallel_rank.filter(|v| !v.is_none()) {
        Some(v) => int_arg(py, v, "tensor_parallel_rank", tensor_parallel_size - 1)?,
        None => 0,
    };
    let max_model_len = match max_model_len.filter(|v| !v.is_none()) {
        Some(v) => Some(count_arg(py, v, "max_model_len", limits::MAX_MODEL_LEN)?),
        None => None,
    };
    let max_num_batched_tokens = count(
        max_num_batched_tokens,
        "max_num_batched_tokens",
        limits::MAX_BATCHED_TOKENS,
        8192,
    )?;
    let kv_cache_memory_bytes = match kv_cache_memory_bytes.filter(|v| !v.is_none()) {
        Some(v) => Some(count_arg(
            py,
            v,
            "kv_cache_memory_bytes",
            limits::MAX_BYTES,
        )?),
        None => None,
    };
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
    let request = match (kv_cache_memory_bytes, gpu_memory_utilization) {
        (Some(_), Some(_)) => {
            return Err(usage(
                py,
                "give kv_cache_memory_bytes or gpu_memory_utilization, not both".into(),
            ))
        }
        (Some(b), None) => Request::KvCacheBytes(b),
        (None, u) => {
            let u = u.unwrap_or(0.9);
            if limits::check_fraction(u).is_err() {
                return Err(usage(
                    py,
                    format!("gpu_memory_utilization={u} is outside (0, 1]"),
                ));
            }
            Request::Utilization(u)
        }
    };
    let o = Options {
        model,
        request,
        kv_cache_dtype,
        block_size,
        tensor_parallel_size,
        tensor_parallel_rank,
        max_model_len,
        max_num_batched_tokens,
        strategy: graph_strategy,
    };
    crate::errors::guard(py, || {
        let dev = device_of(py, device)?;
        let (plan, profile, kv) = run(py, &dev, engine, &o)?;
        Ok((plan, profile, kv.map(|r| PyKvRange { inner: Some(r) })))
    })
}
