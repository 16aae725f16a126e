//! Graph capture on CUDA: stream capture into graphs whose allocation nodes use the device's
//! graph pool, which [`GraphCapture::release_pool`](memplan_core::GraphCapture::release_pool) trims (`cuDeviceGraphMemTrim`).
//!
//! Capture runs on a private non-blocking stream in thread-local mode, so another thread's
//! unrelated CUDA calls do not invalidate it. [`CaptureWork`] is recorded as one
//! `cuMemAllocAsync` (a graph allocation node) when `alloc_node_bytes > 0`, `kernel_nodes`
//! launches of [`crate::kernel`]'s trivial kernel (writing into that allocation), and the
//! matching `cuMemFreeAsync`. Graphs are instantiated without flags. The core
//! (`memplan_core::GraphCapture`) keeps the capture state and the table of graphs and destroys
//! them; the stream and the module, this backend's own, go in `CudaGraphs::teardown` (run
//! on drop of the device).

use std::ffi::c_int;

use cudarc::driver::sys::{self, CUstreamCaptureMode as Mode, CUstreamCaptureStatus as Status};
use memplan_core::{CaptureWork, Error, HalGraph, HalGraphs, Result};

use crate::conv::{check, check_alloc};
use crate::device::Ctx;
use crate::ffi;
use crate::kernel::Kernel;
use crate::loader::{Driver, Feature};

/// Graph-capture state of one device.
pub(crate) struct CudaGraphs {
    ctx: Ctx,
    stream: sys::CUstream,
    kernel: Option<Kernel>,
}

// SAFETY: the stream belongs to the context, which `bind` makes current on
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
        })
    }

    /// Where the kernel came from.
    pub(crate) fn kernel_source(&self) -> Option<&str> {
        self.kernel.as_ref().map(|k| k.source())
    }

    fn kernel(&self) -> Result<&Kernel> {
        self.kernel.as_ref().ok_or_else(|| {
            Error::state(
                "graph capture",
                "the capture kernel was unloaded (teardown)",
            )
        })
    }

    /// Unload the kernel and destroy the stream (the core has aborted any capture and
    /// destroyed every graph before). Errors are logged: this runs on drop.
    pub(crate) fn teardown(&mut self) {
        if let Some(k) = self.kernel.take() {
            k.unload();
        }
        if !self.stream.is_null() {
            // SAFETY: the stream was created in `new` and is destroyed once.
            let destroyed = check("cuStreamDestroy_v2", unsafe {
                ffi::cuStreamDestroy_v2(self.stream)
            });
            self.stream = std::ptr::null_mut();
            if let Err(e) = destroyed {
                tracing::warn!("graph teardown: {e}");
            }
        }
    }
}

impl HalGraphs for CudaGraphs {
    fn begin_capture(&mut self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the stream is live and not capturing (the core allows one capture at a time).
        let res = unsafe {
            ffi::cuStreamBeginCapture_v2(self.stream, Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        };
        check("cuStreamBeginCapture_v2", res)
    }

    fn record(&mut self, work: &CaptureWork) -> Result<()> {
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

    fn end_capture(&mut self) -> Result<HalGraph> {
        self.ctx.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing; `graph` is a valid out-pointer.
        let res = unsafe { ffi::cuStreamEndCapture(self.stream, &mut graph) };
        check("cuStreamEndCapture", res)?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the graph just captured; no flags.
        let res = unsafe { ffi::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check("cuGraphInstantiateWithFlags", res) {
            // SAFETY: destroying the graph captured above, which nothing else references.
            let _ = unsafe { ffi::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(HalGraph::new(graph as u64, exec as u64))
    }

    fn abort_capture(&mut self) -> Result<()> {
        self.ctx.bind()?;
        let mut status = Status::CU_STREAM_CAPTURE_STATUS_NONE as c_int;
        // SAFETY: live stream; valid out-pointer.
        check("cuStreamIsCapturing", unsafe {
            ffi::cuStreamIsCapturing(self.stream, &mut status)
        })?;
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

    unsafe fn replay(&mut self, graph: HalGraph) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees a live instantiated graph of this context; the stream
        // is live and not capturing.
        check("cuGraphLaunch", unsafe {
            ffi::cuGraphLaunch(graph.exec as sys::CUgraphExec, self.stream)
        })?;
        // SAFETY: live stream.
        check("cuStreamSynchronize", unsafe {
            ffi::cuStreamSynchronize(self.stream)
        })
    }

    unsafe fn destroy_exec(&mut self, exec: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees a live executable from end_capture, destroyed once.
        check("cuGraphExecDestroy", unsafe {
            ffi::cuGraphExecDestroy(exec as sys::CUgraphExec)
        })
    }

    unsafe fn destroy_graph(&mut self, graph: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees a live graph from end_capture, destroyed once.
        check("cuGraphDestroy", unsafe {
            ffi::cuGraphDestroy(graph as sys::CUgraph)
        })
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
