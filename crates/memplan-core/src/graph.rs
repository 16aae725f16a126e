//! Graph capture, checked: the capture state machine and the table of graphs, once for every
//! backend.
//!
//! Ordering of a measurement (synchronize, release the allocator cache before the baseline,
//! snapshot, teardown on every path) is the protocol's job, in the planner. What lives here is
//! the lifecycle every backend used to track on its own: `begin_capture` → any number of
//! `record` → `end_capture` (or `abort_capture`), one capture at a time and nothing else on
//! the device meanwhile (global capture mode fails on a stray synchronize or allocation);
//! graphs are minted as [`GraphId`]s, replayed and destroyed by id, and a graph whose
//! destruction failed stays tracked with what is left of it. Memory that graph allocation
//! nodes take goes to the device's graph pool, which [`GraphCapture::release_pool`] returns to
//! the driver once every graph using it is destroyed.

use serde::{Deserialize, Serialize};

use crate::device::{not_live, Device, Inner};
use crate::error::{Error, Result};
use crate::handle::{GraphId, HandleId};
use crate::tables::GraphEntry;

/// Work recorded into a capture: `kernel_nodes` small kernels plus, optionally, one graph
/// memory-allocation node of `alloc_node_bytes` (freed inside the graph). Real backends compile
/// a trivial kernel; the simulator models the costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CaptureWork {
    /// Number of kernel nodes.
    pub kernel_nodes: u32,
    /// Bytes of one graph allocation node (0 = none).
    pub alloc_node_bytes: u64,
}

impl CaptureWork {
    /// `kernel_nodes` small kernels and no allocation node.
    pub const fn new(kernel_nodes: u32) -> Self {
        Self {
            kernel_nodes,
            alloc_node_bytes: 0,
        }
    }

    /// The same work plus one graph memory-allocation node of `bytes` (0 = none).
    pub const fn with_alloc_node(mut self, bytes: u64) -> Self {
        self.alloc_node_bytes = bytes;
        self
    }
}

/// Graph capture on one device's stream (from [`Device::graph_capture`]).
pub struct GraphCapture<'d> {
    device: &'d Device,
}

fn outside_capture(what: &str) -> Error {
    Error::state(what, "no capture is in progress")
}

impl<'d> GraphCapture<'d> {
    pub(crate) fn new(device: &'d Device) -> Self {
        GraphCapture { device }
    }

    /// Start capturing on the device's stream. Refused while a capture is in progress.
    pub fn begin_capture(&self) -> Result<()> {
        let mut g = self.device.lock();
        g.t.no_capture("begin_capture")?;
        g.t.graphs_used = true;
        g.hal.graphs()?.begin_capture()?;
        g.t.capturing = true;
        Ok(())
    }

    /// Record work into the capture in progress.
    pub fn record(&self, work: &CaptureWork) -> Result<()> {
        let mut g = self.device.lock();
        if !g.t.capturing {
            return Err(outside_capture("record"));
        }
        g.hal.graphs()?.record(work)
    }

    /// End the capture and instantiate the graph. The capture is over either way.
    pub fn end_capture(&self) -> Result<GraphId> {
        let mut guard = self.device.lock();
        let Inner { hal, t } = &mut *guard;
        if !t.capturing {
            return Err(outside_capture("end_capture"));
        }
        let ended = hal.graphs().and_then(|g| g.end_capture());
        t.capturing = false;
        let id = HandleId::mint();
        t.graphs.insert(id, GraphEntry::new(ended?));
        Ok(GraphId(id))
    }

    /// Abandon the capture in progress (teardown on error paths). A no-op when none is.
    pub fn abort_capture(&self) -> Result<()> {
        let mut guard = self.device.lock();
        let Inner { hal, t } = &mut *guard;
        if !std::mem::take(&mut t.capturing) {
            return Ok(());
        }
        hal.graphs()?.abort_capture()
    }

    /// Launch a graph once and wait for it.
    pub fn replay(&self, graph: GraphId) -> Result<()> {
        let mut guard = self.device.lock();
        let Inner { hal, t } = &mut *guard;
        t.no_capture("replay")?;
        let whole = t
            .graphs
            .get(&graph.0)
            .and_then(GraphEntry::whole)
            .ok_or_else(|| not_live("graph", "graph"))?;
        // SAFETY: both objects came from end_capture of this device and are not destroyed
        // (the table says so).
        unsafe { hal.graphs()?.replay(whole) }
    }

    /// Destroy a graph: its executable, then the graph (tried even when the executable's
    /// destruction failed). What fails stays tracked: calling again retries only that.
    pub fn destroy(&self, graph: GraphId) -> Result<()> {
        let mut guard = self.device.lock();
        let Inner { hal, t } = &mut *guard;
        t.no_capture("destroying a graph")?;
        let entry = t
            .graphs
            .get_mut(&graph.0)
            .ok_or_else(|| not_live("graph", "graph"))?;
        let g = hal.graphs()?;
        let mut first = Ok(());
        if let Some(exec) = entry.exec {
            // SAFETY: from end_capture of this device, not destroyed yet (it is in the table).
            match unsafe { g.destroy_exec(exec) } {
                Ok(()) => entry.exec = None,
                Err(e) => first = Err(e),
            }
        }
        if let Some(x) = entry.graph {
            // SAFETY: as above (a graph may go before its executable: they are independent).
            match unsafe { g.destroy_graph(x) } {
                Ok(()) => entry.graph = None,
                Err(e) => first = first.and(Err(e)),
            }
        }
        if entry.exec.is_none() && entry.graph.is_none() {
            t.graphs.remove(&graph.0);
        }
        first
    }

    /// Return the graph pool's unused memory to the driver.
    pub fn release_pool(&self) -> Result<()> {
        let mut g = self.device.lock();
        g.t.no_capture("releasing the graph pool")?;
        g.hal.graphs()?.release_pool()
    }

    /// Capture one graph of `work`: begin, record, end. On any error the capture in progress
    /// is aborted (so no other call on the device fails on it) and the error returned.
    pub fn capture_once(&self, work: &CaptureWork) -> Result<GraphId> {
        self.begin_capture()?;
        let captured = self.record(work).and_then(|_| self.end_capture());
        if captured.is_err() {
            if let Err(e) = self.abort_capture() {
                tracing::error!(error = %e, "aborting a failed capture failed");
            }
        }
        captured
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHal;

    fn work(alloc: u64) -> CaptureWork {
        CaptureWork {
            kernel_nodes: 1,
            alloc_node_bytes: alloc,
        }
    }

    #[test]
    fn capture_once_aborts_on_error() {
        let (hal, calls) = FakeHal::new();
        let d = Device::new(hal);
        let gc = d.graph_capture().unwrap();
        let g = gc.capture_once(&work(1)).unwrap();
        assert_eq!(calls.take(), ["begin", "record", "end"]);
        calls.fail("record");
        assert!(matches!(
            gc.capture_once(&work(1)),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(calls.take(), ["begin", "record", "abort"]);
        gc.destroy(g).unwrap();
    }

    #[test]
    fn the_lifecycle_is_enforced_once_for_every_backend() {
        let (hal, calls) = FakeHal::new();
        let d = Device::new(hal);
        let gc = d.graph_capture().unwrap();
        assert!(gc.record(&work(0)).is_err(), "record outside a capture");
        assert!(gc.end_capture().is_err(), "end outside a capture");
        gc.abort_capture().expect("no capture: no-op");
        assert!(calls.take().is_empty(), "none of it reached the backend");
        gc.begin_capture().unwrap();
        let during = [
            gc.begin_capture().err(),
            d.synchronize().err(),
            d.allocate(1).err(),
            gc.release_pool().err(),
        ];
        assert!(during.iter().all(
            |e| matches!(e, Some(Error::InvalidState { reason, .. }) if reason.contains("capture"))
        ));
        assert_eq!(calls.take(), ["begin"]);
        let g = gc.end_capture().unwrap();
        gc.replay(g).unwrap();
        gc.destroy(g).unwrap();
        assert!(
            matches!(gc.replay(g), Err(Error::InvalidInput { .. })),
            "destroyed"
        );
        assert!(matches!(gc.destroy(g), Err(Error::InvalidInput { .. })));
        assert_eq!(
            calls.take(),
            ["end", "replay", "destroy_exec", "destroy_graph"]
        );
    }

    #[test]
    fn a_graph_whose_destruction_failed_stays_tracked_and_is_retried_in_part() {
        let (hal, calls) = FakeHal::new();
        let d = Device::new(hal);
        let gc = d.graph_capture().unwrap();
        let g = gc.capture_once(&work(0)).unwrap();
        calls.take();
        calls.fail("destroy_exec");
        assert!(gc.destroy(g).is_err());
        assert_eq!(d.live().graphs, 1);
        calls.heal("destroy_exec");
        gc.destroy(g).expect("retry");
        assert_eq!(
            calls.take(),
            ["destroy_exec", "destroy_graph", "destroy_exec"],
            "the graph is destroyed once, the executable retried"
        );
        assert_eq!(d.live().graphs, 0);
    }

    #[test]
    fn a_failed_end_leaves_no_capture_and_no_graph() {
        let (hal, calls) = FakeHal::new();
        let d = Device::new(hal);
        let gc = d.graph_capture().unwrap();
        gc.begin_capture().unwrap();
        calls.fail("end");
        assert!(gc.end_capture().is_err());
        assert_eq!(d.live(), crate::Live::default());
        d.synchronize().expect("no capture in progress any more");
    }

    #[test]
    fn graphs_of_another_device_are_unknown() {
        let (a, _) = FakeHal::new();
        let (b, _) = FakeHal::new();
        let (a, b) = (Device::new(a), Device::new(b));
        let g = a.graph_capture().unwrap().capture_once(&work(0)).unwrap();
        let e = b.graph_capture().unwrap().destroy(g).unwrap_err();
        assert!(
            e.to_string().contains("not a live graph of this device"),
            "{e}"
        );
    }
}
