//! `memplan.engine.SimDevice` and `SimAllocator`: a simulated GPU and the caching allocator a
//! Python engine allocates from on it, standing in for `torch.cuda` where there is no GPU.
//!
//! Both are thin handles on the simulator's own objects (`memplan_backend_sim::SimGpu`,
//! `SimAllocator`); the start-up reads the same simulated GPU through memplan's device
//! interface, so what the Python engine allocates is what memplan measures. Handles given to
//! Python are small integers from this module's own tables, never the simulator's ids.

use std::collections::HashMap;

use memplan::sim::{BlockId, GraphSpec, SimGpu};
use memplan::AllocatorView;
use memplan::RawAllocation;
use memplan_backend_sim::EngineGraph;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{guard, int_arg, opt_int_arg, to_py, u32_arg};

/// A table of handles handed to Python.
struct Table<T> {
    next: u64,
    live: HashMap<u64, T>,
}

impl<T> Table<T> {
    fn new() -> Self {
        Table {
            next: 1,
            live: HashMap::new(),
        }
    }
    fn put(&mut self, v: T) -> u64 {
        let h = self.next;
        self.next += 1;
        self.live.insert(h, v);
        h
    }
    /// Remove a live handle; a stale or foreign one is a usage error (`memplan.UsageError`).
    fn take(&mut self, py: Python<'_>, what: &'static str, h: u64) -> PyResult<T> {
        self.live.remove(&h).ok_or_else(|| {
            let msg = format!("{h} is not live (freed twice, or not from this object)");
            to_py(py, &memplan::Error::invalid(what, msg))
        })
    }
}

/// One simulated GPU (`sim:rtx4090`, `sim:mi300x,other=4GiB`, ...).
#[pyclass(module = "memplan._native")]
pub struct SimDevice {
    pub(crate) gpu: SimGpu,
    /// The same GPU as memplan's device interface sees it (what a start-up measures).
    pub(crate) shared: memplan::SharedDevice,
    id: String,
    raw: Table<RawAllocation>,
}

impl SimDevice {
    fn open(py: Python<'_>, id: &str, private: bool) -> PyResult<Self> {
        let selector = id.strip_prefix("sim:").ok_or_else(|| {
            to_py(
                py,
                &memplan::Error::invalid(
                    "device",
                    format!("{id:?} is not a simulated device id (sim:PROFILE)"),
                ),
            )
        })?;
        let gpu = if private {
            SimGpu::open(selector)
        } else {
            SimGpu::shared(selector)
        }
        .map_err(|e| to_py(py, &e))?;
        Ok(SimDevice {
            shared: gpu.device(),
            gpu,
            id: id.to_string(),
            raw: Table::new(),
        })
    }
}

#[pymethods]
impl SimDevice {
    /// Open a simulated GPU by id (``memplan.devices()`` lists them). By default the
    /// process-wide GPU of that id, as opening ``cuda:0`` twice gives one device (what the
    /// engine holds is what ``memplan.probe(id)`` and a start-up on ``id`` see);
    /// ``private=True`` opens one nobody else can (tests).
    #[new]
    #[pyo3(signature = (id, private=false))]
    fn new(py: Python<'_>, id: &str, private: bool) -> PyResult<Self> {
        guard(py, || Self::open(py, id, private))
    }

    /// The device id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Total memory in bytes.
    #[getter]
    fn total_bytes(&self) -> Option<u64> {
        self.shared.descriptor().total_bytes
    }

    /// The caching allocator an engine allocates from on this GPU (one per GPU: every call
    /// returns a view of the same allocator).
    fn allocator(&self) -> SimAllocator {
        SimAllocator {
            inner: self.gpu.allocator(),
            blocks: Table::new(),
            graphs: Table::new(),
        }
    }

    /// Allocate outside the allocator (a library workspace, as cuBLAS or NCCL take):
    /// returns a handle for :meth:`free`.
    fn allocate(&mut self, py: Python<'_>, bytes: &Bound<'_, PyAny>) -> PyResult<u64> {
        let bytes = int_arg(py, bytes, "bytes", u64::MAX)?;
        guard(py, || {
            let a = self.shared.allocate(bytes).map_err(|e| to_py(py, &e))?;
            Ok(self.raw.put(a))
        })
    }

    /// Free what :meth:`allocate` returned.
    fn free(&mut self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
        let handle = int_arg(py, handle, "handle", u64::MAX)?;
        guard(py, || {
            let a = self.raw.take(py, "allocation", handle)?;
            self.shared.free(a).map_err(|f| {
                let e = to_py(py, &f.error);
                // still valid: keep it, so a retry can free it
                self.raw.live.insert(handle, f.handle);
                e
            })
        })
    }

    /// Set the memory other processes hold on this GPU (bytes).
    fn set_other_processes(&self, py: Python<'_>, bytes: &Bound<'_, PyAny>) -> PyResult<()> {
        let bytes = int_arg(py, bytes, "bytes", u64::MAX)?;
        guard(py, || {
            self.gpu.set_other_processes(bytes);
            Ok(())
        })
    }

    fn __repr__(&self) -> String {
        format!("SimDevice({:?})", self.id)
    }
}

/// A caching allocator on a simulated GPU, PyTorch-like: `malloc`/`free` keep freed blocks
/// cached, `empty_cache` gives them back, graph capture goes into a private pool.
#[pyclass(module = "memplan._native")]
pub struct SimAllocator {
    inner: memplan::sim::SimAllocator,
    blocks: Table<BlockId>,
    graphs: Table<EngineGraph>,
}

#[pymethods]
impl SimAllocator {
    /// Allocate `bytes`; returns a handle for :meth:`free`.
    fn malloc(&mut self, py: Python<'_>, bytes: &Bound<'_, PyAny>) -> PyResult<u64> {
        let bytes = int_arg(py, bytes, "bytes", u64::MAX)?;
        guard(py, || {
            let b = self.inner.malloc(bytes).map_err(|e| to_py(py, &e))?;
            Ok(self.blocks.put(b))
        })
    }

    /// Free a block (it stays cached in the allocator, as in PyTorch).
    fn free(&mut self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
        let handle = int_arg(py, handle, "handle", u64::MAX)?;
        guard(py, || {
            let b = self.blocks.take(py, "block", handle)?;
            self.inner.free(b).map_err(|e| to_py(py, &e))
        })
    }

    /// Give every cached block back to the driver (`torch.cuda.empty_cache()`). On a simulated
    /// device without a device-wide synchronize (Intel), the driver lets go of them only at
    /// the engine's :meth:`synchronize`.
    fn empty_cache(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || {
            self.inner.empty_cache();
            Ok(())
        })
    }

    /// Wait for the engine's own queue (`torch.xpu.synchronize()`): what :meth:`empty_cache`
    /// gave back while work was in flight returns to the driver.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || self.inner.synchronize().map_err(|e| to_py(py, &e)))
    }

    /// `{"reserved", "allocated", "peak_allocated", "peak_reserved"}` in bytes
    /// (`torch.cuda.memory_stats()`'s `reserved_bytes.all.current`,
    /// `allocated_bytes.all.current`, `allocated_bytes.all.peak` and `reserved_bytes.all.peak`).
    fn memory_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("reserved", s.reserved)?;
        d.set_item("allocated", s.allocated)?;
        d.set_item("peak_allocated", s.peak_allocated)?;
        d.set_item("peak_reserved", s.peak_reserved)?;
        Ok(d)
    }

    /// Reset the peak to the current allocation (`torch.cuda.reset_peak_memory_stats()`).
    fn reset_peak(&mut self, py: Python<'_>) -> PyResult<()> {
        guard(py, || {
            self.inner.reset_peak();
            Ok(())
        })
    }

    /// Which simulated GPU this allocator allocates on (``sim:rtx4090#1``): an engine that
    /// returns it from its own ``gpu_id()`` hook gets a start-up on another GPU refused.
    fn gpu_id(&self) -> String {
        self.inner.gpu().gpu_id()
    }

    /// Begin a graph capture: allocations go to the graphs' private pool until it ends.
    fn begin_graph_capture(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || {
            self.inner.begin_graph_capture().map_err(|e| to_py(py, &e))
        })
    }

    /// End the capture of one graph and return its handle. What it costs: `kernel_nodes`
    /// executable kernel nodes, `intermediate_bytes` of activations in the private pool,
    /// `alloc_node_bytes` of graph memory-allocation nodes.
    #[pyo3(signature = (kernel_nodes, intermediate_bytes, alloc_node_bytes=None))]
    fn end_graph_capture(
        &mut self,
        py: Python<'_>,
        kernel_nodes: &Bound<'_, PyAny>,
        intermediate_bytes: &Bound<'_, PyAny>,
        alloc_node_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let kernel_nodes = u32_arg(py, kernel_nodes, "kernel_nodes")?;
        let intermediate_bytes = int_arg(py, intermediate_bytes, "intermediate_bytes", u64::MAX)?;
        let alloc_node_bytes =
            opt_int_arg(py, alloc_node_bytes, "alloc_node_bytes", u64::MAX)?.unwrap_or(0);
        guard(py, || {
            let spec =
                GraphSpec::new(kernel_nodes, intermediate_bytes).with_alloc_nodes(alloc_node_bytes);
            let g = self
                .inner
                .end_graph_capture(&spec)
                .map_err(|e| to_py(py, &e))?;
            Ok(self.graphs.put(g))
        })
    }

    /// Abort a capture in progress (nothing when none is).
    fn abort_graph_capture(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || {
            self.inner.abort_graph_capture();
            Ok(())
        })
    }

    /// Destroy one captured graph.
    fn destroy_graph(&mut self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
        let handle = int_arg(py, handle, "handle", u64::MAX)?;
        guard(py, || {
            let g = self.graphs.take(py, "graph", handle)?;
            self.inner.destroy_graph(g).map_err(|e| to_py(py, &e))
        })
    }

    /// Release the graphs' private pool (after destroying them).
    fn release_private_pools(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || {
            self.inner
                .release_private_pools()
                .map_err(|e| to_py(py, &e))
        })
    }

    /// Graphs captured and not destroyed.
    #[getter]
    fn live_graphs(&self) -> usize {
        self.graphs.live.len()
    }
}
