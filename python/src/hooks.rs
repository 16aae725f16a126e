//! A Python engine as a memplan [`Engine`]: every hook is a method call on the Python object.
//!
//! Hook methods (see `memplan/engine.py` for the Python side and its docs):
//! `memory_stats() -> {"reserved", "allocated", "peak_allocated"[, "peak_reserved"]}`, `release_cached()`,
//! `reset_peak()`, optionally `gpu_id()` and `allocate_tensor(nbytes)` with `free_tensor(handle)`
//! (the allocator view); `graph_sizes()`, `warm_up(size)`,
//! `capture_graph(size)`, `release_graphs()`, `supports_post_capture()`,
//! `bind_kv_range(address, size)`, `kernel_nodes_hint(size)`, `alloc_node_bytes_hint(size)`
//! (the graph hooks).
//!
//! A Python exception inside a hook becomes a memplan error (so the protocol's teardown runs
//! on every path) and is kept: the start-up raises the engine's own exception at the end.
//! [`AllocatorView::stats`] and `reset_peak` cannot fail in Rust; a failure there is kept the
//! same way and the start-up fails at its end, so no figure built on a missing reading is
//! ever returned (the zeros handed back meanwhile never leave the failed run).

use std::cell::RefCell;
use std::rc::Rc;

use memplan::{AllocatorStats, AllocatorView, Engine, Error, KvRange, Result, TensorId};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The first Python exception a hook raised, shared by the engine and its allocator view.
#[derive(Clone, Default)]
pub struct Failed(Rc<RefCell<Option<PyErr>>>);

impl Failed {
    /// Keep `e` (the first one wins) and turn it into a memplan error naming the hook: the
    /// device's [`Error::OutOfMemory`] when `e` is memplan's `OutOfMemoryError` (what a
    /// `SimAllocator` raises, with the bytes asked for), a measurement error otherwise.
    fn keep(&self, py: Python<'_>, hook: &str, e: PyErr) -> Error {
        let msg = format!("the engine's {hook} raised {}", e.value(py));
        let oom = requested_if_out_of_memory(py, &e);
        self.0.borrow_mut().get_or_insert(e);
        match oom {
            Some(requested) => Error::OutOfMemory {
                call: format!("the engine's {hook}"),
                requested,
            },
            None => Error::Measurement(msg),
        }
    }

    /// The kept exception, if a hook raised one.
    pub fn take(&self) -> Option<PyErr> {
        self.0.borrow_mut().take()
    }
}

/// The bytes asked for, when `e` is memplan's `OutOfMemoryError` (its `help` names them).
pub fn requested_if_out_of_memory(py: Python<'_>, e: &PyErr) -> Option<u64> {
    let v = e.value(py);
    let oom = py
        .import("memplan._errors")
        .and_then(|m| m.getattr("OutOfMemoryError"))
        .is_ok_and(|cls| v.is_instance(&cls).unwrap_or(false));
    if !oom {
        return None;
    }
    v.getattr("help")
        .and_then(|h| h.get_item("requested_bytes"))
        .and_then(|b| b.extract::<u64>())
        .ok()
}

/// The engine's allocator view.
pub struct PyAllocator {
    obj: Py<PyAny>,
    failed: Failed,
}

/// A hook's answer converted to `T`; an answer of the wrong type or out of range is a
/// `memplan.MeasurementError` naming the hook, the answer and what was expected (never a bare
/// `OverflowError` or `TypeError` from the conversion).
fn returned<'py, T>(
    py: Python<'py>,
    hook: &str,
    v: &Bound<'py, PyAny>,
    expected: &str,
) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    v.extract::<T>().map_err(|_| {
        crate::errors::measurement(
            py,
            format!(
                "the engine's {hook} returned {}: expected {expected}",
                crate::errors::repr(v)
            ),
        )
    })
}

const BYTES: &str = "a byte count, an int from 0 to 2^64 - 1";

fn stats_from(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<AllocatorStats> {
    let hook = "memory_stats()";
    let item = |k: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        if let Ok(dict) = d.cast::<PyDict>() {
            dict.get_item(k)
        } else if d.hasattr("__getitem__")? {
            Ok(d.get_item(k).ok())
        } else {
            Err(crate::errors::measurement(
                py,
                format!(
                    "the engine's {hook} returned {}: expected a dict of byte counts",
                    crate::errors::repr(d)
                ),
            ))
        }
    };
    let get = |k: &str| -> PyResult<u64> {
        match item(k)? {
            Some(v) => returned(py, &format!("{hook}[{k:?}]"), &v, BYTES),
            None => Err(crate::errors::measurement(
                py,
                format!(
                    "the engine's {hook} has no {k:?} (needs reserved, allocated, peak_allocated, in bytes; peak_reserved optional)"
                ),
            )),
        }
    };
    // Optional: an allocator that cannot tell its reserved peak leaves it out (or None).
    let peak_reserved = match item("peak_reserved")? {
        Some(v) if !v.is_none() => Some(returned(
            py,
            "memory_stats()[\"peak_reserved\"]",
            &v,
            BYTES,
        )?),
        _ => None,
    };
    let (reserved, allocated, peak) = (get("reserved")?, get("allocated")?, get("peak_allocated")?);
    // What a caching allocator's own counters always satisfy: in use is part of what is held,
    // a peak is at least the current value. An answer that breaks one is not a reading.
    let mut broken = Vec::new();
    if allocated > reserved {
        broken.push(format!("allocated {allocated} > reserved {reserved}"));
    }
    if peak < allocated {
        broken.push(format!("peak_allocated {peak} < allocated {allocated}"));
    }
    if let Some(pr) = peak_reserved {
        if pr < reserved {
            broken.push(format!("peak_reserved {pr} < reserved {reserved}"));
        }
        if pr < peak {
            broken.push(format!("peak_reserved {pr} < peak_allocated {peak}"));
        }
    }
    if !broken.is_empty() {
        return Err(crate::errors::measurement(
            py,
            format!(
                "the engine's {hook} contradicts itself: {} (an allocator never holds less than it has in use, and a peak is never below the current value)",
                broken.join(", ")
            ),
        ));
    }
    Ok(AllocatorStats::new(reserved, allocated, peak).with_peak_reserved(peak_reserved))
}

impl AllocatorView for PyAllocator {
    fn stats(&self) -> AllocatorStats {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            match obj
                .call_method0("memory_stats")
                .and_then(|d| stats_from(py, &d))
            {
                Ok(s) => s,
                Err(e) => {
                    self.failed.keep(py, "memory_stats()", e);
                    AllocatorStats::default()
                }
            }
        })
    }

    fn release_cached(&mut self) -> Result<()> {
        Python::attach(|py| {
            (self.obj.bind(py).call_method0("release_cached"))
                .map(drop)
                .map_err(|e| self.failed.keep(py, "release_cached()", e))
        })
    }

    fn reset_peak(&mut self) {
        Python::attach(|py| {
            if let Err(e) = self.obj.bind(py).call_method0("reset_peak") {
                self.failed.keep(py, "reset_peak()", e);
            }
        })
    }

    /// The engine's optional `allocate_tensor(nbytes)`: one tensor of `nbytes` from its
    /// allocator (`torch.empty(nbytes, dtype=torch.uint8, device=dev)`, kept by the engine), and
    /// a handle (an int) for `free_tensor`; absent, or `None`: not offered. An out-of-memory
    /// (memplan's `OutOfMemoryError`, or a framework's of that name) is the answer the session
    /// measures for, not a failure of the start-up: it is not kept.
    fn allocate_tensor(&mut self, bytes: u64) -> Result<Option<TensorId>> {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            if !obj.hasattr("allocate_tensor").unwrap_or(false) {
                return Ok(None);
            }
            let v = match obj.call_method1("allocate_tensor", (bytes,)) {
                Ok(v) => v,
                Err(e) if is_out_of_memory(py, &e) => {
                    return Err(Error::OutOfMemory {
                        call: "the engine's allocate_tensor()".into(),
                        requested: bytes,
                    })
                }
                Err(e) => return Err(self.failed.keep(py, "allocate_tensor()", e)),
            };
            if v.is_none() {
                return Ok(None);
            }
            returned(
                py,
                "allocate_tensor()",
                &v,
                "a tensor handle (an int from 0 to 2^64 - 1) or None",
            )
            .map(|id: u64| Some(TensorId(id)))
            .map_err(|e| self.failed.keep(py, "allocate_tensor()", e))
        })
    }

    /// The engine's `free_tensor(handle)`, for a handle `allocate_tensor` returned.
    fn free_tensor(&mut self, id: TensorId) -> Result<()> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("free_tensor", (id.0,))
                .map(drop)
                .map_err(|e| self.failed.keep(py, "free_tensor()", e))
        })
    }

    /// The engine's optional `gpu_id()`: which GPU its allocator allocates on (a
    /// `SimAllocator`'s `gpu_id()`); absent or `None`: not checked.
    fn gpu_id(&self) -> Option<String> {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            if !obj.hasattr("gpu_id").unwrap_or(false) {
                return None;
            }
            match obj
                .call_method0("gpu_id")
                .and_then(|v| returned(py, "gpu_id()", &v, "a GPU id (str) or None"))
            {
                Ok(id) => id,
                Err(e) => {
                    self.failed.keep(py, "gpu_id()", e);
                    None
                }
            }
        })
    }
}

/// Whether `e` says the device ran out of memory: memplan's `OutOfMemoryError` (what a
/// `SimAllocator` raises) or a framework's of that name (PyTorch's `torch.OutOfMemoryError`).
fn is_out_of_memory(py: Python<'_>, e: &PyErr) -> bool {
    requested_if_out_of_memory(py, e).is_some()
        || e.get_type(py).name().is_ok_and(|n| n == "OutOfMemoryError")
}

/// The hooks every engine object has (`memplan.engine.Engine` defines each; an object that is
/// not a subclass must have them all). `synchronize()` and `gpu_id()` are optional.
pub const HOOKS: &[&str] = &[
    "memory_stats",
    "release_cached",
    "reset_peak",
    "load_weights",
    "profile_run",
    "graph_sizes",
    "warm_up",
    "capture_graph",
    "release_graphs",
    "supports_post_capture",
    "bind_kv_range",
    "kernel_nodes_hint",
    "alloc_node_bytes_hint",
];

/// Refuse an object that is no engine before anything runs: a `memplan.ArgumentTypeError`
/// (a `TypeError`) naming the hooks it lacks, instead of an `AttributeError` from the middle
/// of a start-up.
pub fn check_engine(py: Python<'_>, engine: &Bound<'_, PyAny>) -> PyResult<()> {
    let missing: Vec<String> = HOOKS
        .iter()
        .filter(|h| {
            engine
                .getattr(**h)
                .map(|m| !m.is_callable())
                .unwrap_or(true)
        })
        .map(|h| format!("{h}()"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(crate::errors::type_error(
        py,
        format!(
            "engine={} is not an engine: it has no {} (subclass memplan.engine.Engine and implement its hooks)",
            crate::errors::repr(engine),
            missing.join(", ")
        ),
    ))
}

/// A Python object implementing the engine hooks.
pub struct PyEngine {
    obj: Py<PyAny>,
    alloc: PyAllocator,
    /// Exceptions raised by hooks.
    pub failed: Failed,
}

impl PyEngine {
    /// Wrap `obj` (an instance of `memplan.engine.Engine` or anything with its methods).
    pub fn new(obj: &Bound<'_, PyAny>) -> Self {
        let failed = Failed::default();
        PyEngine {
            obj: obj.clone().unbind(),
            alloc: PyAllocator {
                obj: obj.clone().unbind(),
                failed: failed.clone(),
            },
            failed,
        }
    }

    /// Call the hook `name` through `f`; a Python exception is kept and becomes an error.
    fn hook<R>(&self, name: &str, f: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<R>) -> Result<R> {
        Python::attach(|py| f(self.obj.bind(py)).map_err(|e| self.failed.keep(py, name, e)))
    }

    /// Run one of the engine's own steps (`load_weights`, `profile_run`).
    pub fn step(&mut self, name: &str) -> Result<()> {
        self.hook(name, |o| o.call_method0(name).map(drop))
    }
}

impl Engine for PyEngine {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.alloc
    }

    // A failed query below is kept (the start-up raises it at its end) and answers the
    // safe default meanwhile: no graphs, no post-capture, no hint.
    fn graph_sizes(&self) -> Vec<u32> {
        self.hook("graph_sizes()", |o| {
            returned(
                o.py(),
                "graph_sizes()",
                &o.call_method0("graph_sizes")?,
                "a list of batch sizes (ints from 0 to 2^32 - 1)",
            )
        })
        .unwrap_or_default()
    }

    fn warm_up(&mut self, size: u32) -> Result<()> {
        self.hook("warm_up()", |o| {
            o.call_method1("warm_up", (size,)).map(drop)
        })
    }

    fn capture_graph(&mut self, size: u32) -> Result<()> {
        self.hook("capture_graph()", |o| {
            o.call_method1("capture_graph", (size,)).map(drop)
        })
    }

    fn release_graphs(&mut self) -> Result<()> {
        self.hook("release_graphs()", |o| {
            o.call_method0("release_graphs").map(drop)
        })
    }

    fn supports_post_capture(&self) -> bool {
        self.hook("supports_post_capture()", |o| {
            returned(
                o.py(),
                "supports_post_capture()",
                &o.call_method0("supports_post_capture")?,
                "True or False",
            )
        })
        .unwrap_or(false)
    }

    /// The engine's optional `synchronize()` (wait for its own queues); without one, memplan
    /// warns on a device that cannot synchronize itself.
    fn synchronize(&mut self) -> Result<()> {
        let has = Python::attach(|py| self.obj.bind(py).hasattr("synchronize").unwrap_or(false));
        if !has {
            return Err(Error::unsupported(
                "engine synchronize",
                "the Python engine has no synchronize() method",
            ));
        }
        self.hook("synchronize()", |o| o.call_method0("synchronize").map(drop))
    }

    fn bind_kv_range(&mut self, range: &KvRange) -> Result<()> {
        let (address, size) = (range.address(), range.bytes());
        self.hook("bind_kv_range()", |o| {
            o.call_method1("bind_kv_range", (address, size)).map(drop)
        })
    }

    fn kernel_nodes_hint(&self, size: u32) -> Option<u32> {
        self.hook("kernel_nodes_hint()", |o| {
            returned(
                o.py(),
                "kernel_nodes_hint()",
                &o.call_method1("kernel_nodes_hint", (size,))?,
                "None or a kernel count (an int from 0 to 2^32 - 1)",
            )
        })
        .ok()
        .flatten()
    }

    fn alloc_node_bytes_hint(&self, size: u32) -> Option<u64> {
        self.hook("alloc_node_bytes_hint()", |o| {
            returned(
                o.py(),
                "alloc_node_bytes_hint()",
                &o.call_method1("alloc_node_bytes_hint", (size,))?,
                "None or a byte count (an int from 0 to 2^64 - 1)",
            )
        })
        .ok()
        .flatten()
    }
}
