//! Graph capture on CUDA: stream capture into graphs whose allocation nodes use the device's
//! graph pool, which [`GraphCapture::release_pool`] trims (`cuDeviceGraphMemTrim`).
//!
//! Capture runs on a private non-blocking stream in thread-local mode, so another thread's
//! unrelated CUDA calls do not invalidate it. [`CaptureWork`] is recorded as one
//! `cuMemAllocAsync` (a graph allocation node) when `alloc_node_bytes > 0`, `kernel_nodes`
//! launches of [`crate::kernel`]'s trivial kernel (writing into that allocation), and the
//! matching `cuMemFreeAsync`. Graphs are instantiated without flags; every graph, the stream
//! and the module are destroyed by [`CudaGraphs::teardown`] (run on drop of the device).

use std::collections::BTreeMap;
use std::ffi::c_int;

use cudarc::driver::sys::{self, CUstreamCaptureMode as Mode, CUstreamCaptureStatus as Status};
use memplan_core::{CaptureWork, Error, GraphCapture, GraphId, Result};

use crate::conv::{check, check_alloc};
use crate::device::Ctx;
use crate::ffi;
use crate::kernel::Kernel;
use crate::loader::{Driver, Feature};

struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

/// Graph-capture state of one device.
pub(crate) struct CudaGraphs {
    ctx: Ctx,
    stream: sys::CUstream,
    kernel: Option<Kernel>,
    capturing: bool,
    graphs: BTreeMap<u64, Graph>,
    next: u64,
}

// SAFETY: stream, graph and exec handles belong to the context, which `bind` makes current on
// the calling thread before every use.
unsafe impl Send for CudaGraphs {}

impl CudaGraphs {
    /// Check the driver, create the capture stream and load the kernel.
    pub(crate) fn new(ctx: Ctx, driver: &Driver, cc: (i32, i32)) -> Result<Self> {
        driver.require(Feature::GraphCapture)?;
        driver.require(Feature::GraphMemory)?;
        ctx.bind()?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: context current; `stream` is a valid out-pointer.
        check("cuStreamCreate", unsafe {
            ffi::cuStreamCreate(&mut stream, flags)
        })?;
        let kernel = match Kernel::load(cc) {
            Ok(k) => k,
            Err(e) => {
                // SAFETY: the stream was created above and is used by nothing else.
                let _ = unsafe { ffi::cuStreamDestroy_v2(stream) };
                return Err(e);
            }
        };
        Ok(CudaGraphs {
            ctx,
            stream,
            kernel: Some(kernel),
            capturing: false,
            graphs: BTreeMap::new(),
            next: 1,
        })
    }

    /// Where the kernel came from.
    pub(crate) fn kernel_source(&self) -> Option<&str> {
        self.kernel.as_ref().map(|k| k.source())
    }

    fn kernel(&self) -> Result<&Kernel> {
        self.kernel
            .as_ref()
            .ok_or_else(|| Error::Measurement("capture kernel not loaded".into()))
    }

    fn graph(&self, id: GraphId) -> Result<&Graph> {
        self.graphs
            .get(&id.0)
            .ok_or_else(|| Error::invalid("graph", format!("no live graph {}", id.0)))
    }

    fn destroy_handles(g: Graph) -> Result<()> {
        // SAFETY: both handles were created by end_capture and are destroyed once (g is consumed).
        let a = check("cuGraphExecDestroy", unsafe {
            ffi::cuGraphExecDestroy(g.exec)
        });
        // SAFETY: as above.
        let b = check("cuGraphDestroy", unsafe { ffi::cuGraphDestroy(g.graph) });
        a.and(b)
    }

    /// Abort any capture, destroy every graph, trim the pool, unload the kernel, destroy the
    /// stream. Errors are logged: this runs on drop.
    pub(crate) fn teardown(&mut self) {
        let mut steps = vec![self.abort_capture()];
        for (_, g) in std::mem::take(&mut self.graphs) {
            steps.push(Self::destroy_handles(g));
        }
        steps.push(self.release_pool());
        if let Some(k) = self.kernel.take() {
            k.unload();
        }
        if !self.stream.is_null() {
            // SAFETY: the stream was created in `new` and is destroyed once.
            steps.push(check("cuStreamDestroy_v2", unsafe {
                ffi::cuStreamDestroy_v2(self.stream)
            }));
            self.stream = std::ptr::null_mut();
        }
        for e in steps.into_iter().filter_map(|s| s.err()) {
            tracing::warn!("graph teardown: {e}");
        }
    }
}

impl GraphCapture for CudaGraphs {
    fn begin_capture(&mut self) -> Result<()> {
        if self.capturing {
            return Err(Error::Measurement(
                "begin_capture while a capture is in progress".into(),
            ));
        }
        self.ctx.bind()?;
        // SAFETY: the stream is live and not capturing.
        let res = unsafe {
            ffi::cuStreamBeginCapture_v2(self.stream, Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        };
        check("cuStreamBeginCapture_v2", res)?;
        self.capturing = true;
        Ok(())
    }

    fn record(&mut self, work: &CaptureWork) -> Result<()> {
        if !self.capturing {
            return Err(Error::Measurement("record without begin_capture".into()));
        }
        self.ctx.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        if work.alloc_node_bytes > 0 {
            let size = usize::try_from(work.alloc_node_bytes)
                .map_err(|_| Error::invalid("alloc_node_bytes", "too large"))?;
            // SAFETY: the stream is capturing, so this records a graph allocation node.
            let res = unsafe { ffi::cuMemAllocAsync(&mut ptr, size, self.stream) };
            check_alloc("cuMemAllocAsync", res, work.alloc_node_bytes)?;
        }
        let n = u32::try_from((work.alloc_node_bytes / 4).min(32)).unwrap_or(32);
        for _ in 0..work.kernel_nodes {
            self.kernel()?.launch(self.stream, ptr, n)?;
        }
        if ptr != 0 {
            // SAFETY: `ptr` was allocated on this stream in this capture; records a free node.
            check("cuMemFreeAsync", unsafe {
                ffi::cuMemFreeAsync(ptr, self.stream)
            })?;
        }
        Ok(())
    }

    fn end_capture(&mut self) -> Result<GraphId> {
        if !self.capturing {
            return Err(Error::Measurement(
                "end_capture without begin_capture".into(),
            ));
        }
        self.ctx.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing; `graph` is a valid out-pointer.
        let res = unsafe { ffi::cuStreamEndCapture(self.stream, &mut graph) };
        self.capturing = false;
        check("cuStreamEndCapture", res)?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the graph just captured; no flags.
        let res = unsafe { ffi::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check("cuGraphInstantiateWithFlags", res) {
            // SAFETY: destroying the graph captured above, which nothing else references.
            let _ = unsafe { ffi::cuGraphDestroy(graph) };
            return Err(e);
        }
        let id = self.next;
        self.next += 1;
        self.graphs.insert(id, Graph { graph, exec });
        Ok(GraphId(id))
    }

    fn abort_capture(&mut self) -> Result<()> {
        self.ctx.bind()?;
        let mut status = Status::CU_STREAM_CAPTURE_STATUS_NONE as c_int;
        // SAFETY: live stream; valid out-pointer.
        check("cuStreamIsCapturing", unsafe {
            ffi::cuStreamIsCapturing(self.stream, &mut status)
        })?;
        self.capturing = false;
        if status == Status::CU_STREAM_CAPTURE_STATUS_NONE as c_int {
            return Ok(());
        }
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (active or invalidated); ending it is the only way out.
        // An invalidated capture returns an error and no graph, which is expected here.
        let res = unsafe { ffi::cuStreamEndCapture(self.stream, &mut graph) };
        if !graph.is_null() {
            // SAFETY: the partial graph is ours and referenced by nothing.
            check("cuGraphDestroy", unsafe { ffi::cuGraphDestroy(graph) })?;
        }
        if status == Status::CU_STREAM_CAPTURE_STATUS_ACTIVE as c_int {
            check("cuStreamEndCapture", res)?;
        }
        Ok(())
    }

    fn replay(&mut self, graph: GraphId) -> Result<()> {
        self.ctx.bind()?;
        let exec = self.graph(graph)?.exec;
        // SAFETY: `exec` is a live instantiated graph; the stream is live and not capturing.
        check("cuGraphLaunch", unsafe {
            ffi::cuGraphLaunch(exec, self.stream)
        })?;
        // SAFETY: live stream.
        check("cuStreamSynchronize", unsafe {
            ffi::cuStreamSynchronize(self.stream)
        })
    }

    fn destroy(&mut self, graph: GraphId) -> Result<()> {
        self.graph(graph)?;
        self.ctx.bind()?;
        match self.graphs.remove(&graph.0) {
            Some(g) => Self::destroy_handles(g),
            None => Err(Error::invalid(
                "graph",
                format!("no live graph {}", graph.0),
            )),
        }
    }

    fn release_pool(&mut self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: context current; trimming waits for nothing, so synchronize first.
        check("cuCtxSynchronize", unsafe { ffi::cuCtxSynchronize() })?;
        // SAFETY: GraphMemory feature checked in `new`; `dev` is this context's device.
        check("cuDeviceGraphMemTrim", unsafe {
            ffi::cuDeviceGraphMemTrim(self.ctx.dev)
        })
    }
}
