//! HIP graph capture: hipStreamBeginCapture / EndCapture / GraphInstantiate / Launch /
//! Destroy, and hipDeviceGraphMemTrim for the pool.
//!
//! Recorded work has no compiled kernel to launch (memplan ships no code objects), so each
//! "kernel node" is a `hipMemsetAsync` on a small scratch buffer, which HIP runs as a fill
//! kernel and captures as a memset node; an allocation node is `hipMallocAsync` + a memset
//! touching it + `hipFreeAsync`, all inside the graph. The stream and the scratch buffer are
//! created before capture begins (allocating during capture would invalidate it). Capture
//! runs in thread-local mode, so another thread's synchronize does not abort it.
//!
//! Handles are stored as integers. The core (`memplan_core::GraphCapture`) keeps the capture
//! state and the table of graphs and destroys them; the scratch buffer and the stream, this
//! backend's own, go on drop.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

use memplan_core::{CaptureWork, Error, HalGraph, HalGraphs, Result};

use crate::conv::{check, check_alloc, CAPTURE_MODE_THREAD_LOCAL, STREAM_NON_BLOCKING};
use crate::loader::{Api, Handle};

/// Bytes of the scratch buffer each memset node writes.
const SCRATCH_BYTES: usize = 4096;

/// Graph state of one device.
pub struct RocmGraphs {
    api: Arc<Api>,
    ordinal: c_int,
    stream: usize,
    scratch: usize,
}

fn h(v: usize) -> Handle {
    v as Handle
}

impl RocmGraphs {
    /// No stream, no graphs yet: both are created on first use.
    pub fn new(api: Arc<Api>, ordinal: c_int) -> Self {
        RocmGraphs {
            api,
            ordinal,
            stream: 0,
            scratch: 0,
        }
    }

    fn prepare(&mut self) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        if self.stream == 0 {
            let f = self.api.need(
                self.api.sym.hipStreamCreateWithFlags,
                "hipStreamCreateWithFlags",
                "graph capture",
            )?;
            let mut s: Handle = null_mut();
            // SAFETY: writes one stream handle through a valid pointer.
            check("hipStreamCreateWithFlags", unsafe {
                f(&mut s, STREAM_NON_BLOCKING)
            })?;
            self.stream = s as usize;
        }
        if self.scratch == 0 {
            let mut p: *mut c_void = null_mut();
            // SAFETY: writes one device pointer through a valid pointer.
            let rc = unsafe { (self.api.sym.hipMalloc)(&mut p, SCRATCH_BYTES) };
            check_alloc("hipMalloc", rc, SCRATCH_BYTES as u64)?;
            self.scratch = p as usize;
        }
        Ok(())
    }

    fn memset(&self, ptr: usize, bytes: usize) -> Result<()> {
        let f = self.api.need(
            self.api.sym.hipMemsetAsync,
            "hipMemsetAsync",
            "graph capture",
        )?;
        // SAFETY: `ptr` is a live device allocation of at least `bytes` bytes (the scratch
        // buffer, or a graph allocation made just before), and the stream is ours.
        check("hipMemsetAsync", unsafe {
            f(ptr as *mut c_void, 0, bytes, h(self.stream))
        })
    }

    /// Destroy a graph that never got an id (failed or aborted capture). Null is a no-op.
    fn discard(&self, graph: Handle) {
        if let (false, Some(d)) = (graph.is_null(), self.api.sym.hipGraphDestroy) {
            // SAFETY: a graph returned by the capture that just ended, referenced nowhere else.
            let rc = unsafe { d(graph) };
            if rc != 0 {
                tracing::warn!(rc, "hipGraphDestroy of a discarded capture failed");
            }
        }
    }
}

impl HalGraphs for RocmGraphs {
    fn begin_capture(&mut self) -> Result<()> {
        self.prepare()?;
        let f = self.api.need(
            self.api.sym.hipStreamBeginCapture,
            "hipStreamBeginCapture",
            "graph capture",
        )?;
        // SAFETY: our stream, a valid capture-mode value.
        check("hipStreamBeginCapture", unsafe {
            f(h(self.stream), CAPTURE_MODE_THREAD_LOCAL)
        })
    }

    fn record(&mut self, work: &CaptureWork) -> Result<()> {
        for _ in 0..work.kernel_nodes {
            self.memset(self.scratch, SCRATCH_BYTES)?;
        }
        if work.alloc_node_bytes > 0 {
            let bytes = usize::try_from(work.alloc_node_bytes)
                .map_err(|_| Error::invalid("alloc_node_bytes", "exceeds the address space"))?;
            let alloc = self.api.need(
                self.api.sym.hipMallocAsync,
                "hipMallocAsync",
                "graph allocation nodes",
            )?;
            let free = self.api.need(
                self.api.sym.hipFreeAsync,
                "hipFreeAsync",
                "graph allocation nodes",
            )?;
            let mut p: *mut c_void = null_mut();
            // SAFETY: captured into a graph allocation node; writes one pointer.
            let rc = unsafe { alloc(&mut p, bytes, h(self.stream)) };
            check_alloc("hipMallocAsync", rc, work.alloc_node_bytes)?;
            self.memset(p as usize, bytes.min(SCRATCH_BYTES))?;
            // SAFETY: `p` is the graph allocation just made on this stream.
            check("hipFreeAsync", unsafe { free(p, h(self.stream)) })?;
        }
        Ok(())
    }

    fn end_capture(&mut self) -> Result<HalGraph> {
        let end = self.api.need(
            self.api.sym.hipStreamEndCapture,
            "hipStreamEndCapture",
            "graph capture",
        )?;
        let inst = self.api.need(
            self.api.sym.hipGraphInstantiate,
            "hipGraphInstantiate",
            "graph capture",
        )?;
        let mut graph: Handle = null_mut();
        // SAFETY: our capturing stream; writes one graph handle.
        let rc = unsafe { end(h(self.stream), &mut graph) };
        if let Err(e) = check("hipStreamEndCapture", rc) {
            // An invalidated capture may still hand back a graph.
            self.discard(graph);
            return Err(e);
        }
        let mut exec: Handle = null_mut();
        // SAFETY: `graph` was just captured; no error node or log buffer requested.
        let rc = unsafe { inst(&mut exec, graph, null_mut(), null_mut(), 0) };
        if let Err(e) = check("hipGraphInstantiate", rc) {
            self.discard(graph);
            return Err(e);
        }
        Ok(HalGraph::new(graph as u64, exec as u64))
    }

    fn abort_capture(&mut self) -> Result<()> {
        let Some(end) = self.api.sym.hipStreamEndCapture else {
            return Ok(());
        };
        let mut graph: Handle = null_mut();
        // SAFETY: ends the capture on our stream; an invalidated capture returns an error and
        // possibly no graph, both fine here.
        let rc = unsafe { end(h(self.stream), &mut graph) };
        self.discard(graph);
        tracing::debug!(rc, "capture aborted");
        Ok(())
    }

    unsafe fn replay(&mut self, graph: HalGraph) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        let launch = self.api.need(
            self.api.sym.hipGraphLaunch,
            "hipGraphLaunch",
            "graph capture",
        )?;
        let sync = self.api.need(
            self.api.sym.hipStreamSynchronize,
            "hipStreamSynchronize",
            "graph capture",
        )?;
        // SAFETY: the caller guarantees a live executable graph of this device; the stream
        // is ours.
        check("hipGraphLaunch", unsafe {
            launch(graph.exec as usize as Handle, h(self.stream))
        })?;
        // SAFETY: our stream.
        check("hipStreamSynchronize", unsafe { sync(h(self.stream)) })
    }

    unsafe fn destroy_exec(&mut self, exec: u64) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        match self.api.sym.hipGraphExecDestroy {
            // SAFETY: the caller guarantees a live executable from end_capture, destroyed once.
            Some(f) => check("hipGraphExecDestroy", unsafe { f(exec as usize as Handle) }),
            None => Ok(()),
        }
    }

    unsafe fn destroy_graph(&mut self, graph: u64) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        match self.api.sym.hipGraphDestroy {
            // SAFETY: the caller guarantees a live graph from end_capture, destroyed once.
            Some(f) => check("hipGraphDestroy", unsafe { f(graph as usize as Handle) }),
            None => Ok(()),
        }
    }

    fn release_pool(&mut self) -> Result<()> {
        self.api.set_device(self.ordinal)?;
        match (
            self.api.sym.hipDeviceGraphMemTrim,
            self.api.sym.hipMallocAsync,
        ) {
            // SAFETY: plain call with the device ordinal.
            (Some(trim), _) => check("hipDeviceGraphMemTrim", unsafe { trim(self.ordinal) }),
            // No graph allocation nodes on this runtime, so no pool holds memory.
            (None, None) => Ok(()),
            (None, Some(_)) => Err(Error::unsupported(
                "graph pool release",
                format!(
                    "{} (HIP {}) has graph allocation nodes but no `hipDeviceGraphMemTrim`",
                    self.api.library, self.api.runtime
                ),
            )),
        }
    }
}

impl Drop for RocmGraphs {
    fn drop(&mut self) {
        if self.scratch != 0 {
            // SAFETY: the scratch buffer was allocated by hipMalloc in `prepare`, freed once.
            let rc = unsafe { (self.api.sym.hipFree)(self.scratch as *mut c_void) };
            if rc != 0 {
                tracing::warn!(rc, "hipFree of the capture scratch buffer failed");
            }
        }
        if let (true, Some(f)) = (self.stream != 0, self.api.sym.hipStreamDestroy) {
            // SAFETY: our stream, destroyed once.
            unsafe { f(h(self.stream)) };
        }
    }
}
