//! Device-level graph capture primitives (what memplan's calibration uses): kernel nodes and
//! allocation nodes recorded into a capture, instantiated into exec objects and graph-pool
//! memory. One simulated object per graph: `graph` and `exec` are the same id, and destroying
//! the executable releases its memory (at once, or at the next synchronize with the
//! deferred-release quirk).

use memplan_core::{CaptureWork, Error, HalGraph, HalGraphs, Result};

use crate::gpu::SimGpu;
use crate::state::Capture;

impl HalGraphs for SimGpu {
    fn begin_capture(&mut self) -> Result<()> {
        let mut s = self.lock();
        s.no_capture("begin_capture")?;
        s.capture = Some(Capture::default());
        Ok(())
    }

    fn record(&mut self, work: &CaptureWork) -> Result<()> {
        self.alloc_node_support(work.alloc_node_bytes)?;
        let mut s = self.lock();
        match s.capture.as_mut() {
            Some(c) if !c.engine => {
                c.kernel_nodes += u64::from(work.kernel_nodes);
                c.alloc_node = c.alloc_node.saturating_add(work.alloc_node_bytes);
                Ok(())
            }
            _ => Err(Error::invalid(
                "record",
                "no device graph capture in progress",
            )),
        }
    }

    fn end_capture(&mut self) -> Result<HalGraph> {
        let hidden = self.shared.quirks.hidden_bytes_per_capture;
        let mut s = self.lock();
        let c = match s.capture.take() {
            Some(c) if !c.engine => c,
            other => {
                s.capture = other;
                return Err(Error::invalid(
                    "end_capture",
                    "no device graph capture in progress",
                ));
            }
        };
        let exec = self.shared.physics.exec_bytes(c.kernel_nodes, s.captures);
        let id = s.instantiate(&self.shared.profile, exec, c.alloc_node, hidden)?;
        Ok(HalGraph::new(id, id))
    }

    fn abort_capture(&mut self) -> Result<()> {
        let mut s = self.lock();
        if matches!(s.capture, Some(Capture { engine: false, .. })) {
            s.capture = None;
        }
        Ok(())
    }

    unsafe fn replay(&mut self, graph: HalGraph) -> Result<()> {
        let s = self.lock();
        s.no_capture("replay")?;
        if s.graphs.contains_key(&graph.exec) {
            Ok(())
        } else {
            Err(Error::invalid(
                "graph",
                format!("sim driver: no live graph {}", graph.exec),
            ))
        }
    }

    unsafe fn destroy_exec(&mut self, exec: u64) -> Result<()> {
        let deferred = self.deferred_release();
        self.lock().destroy(exec, deferred)
    }

    unsafe fn destroy_graph(&mut self, _graph: u64) -> Result<()> {
        Ok(())
    }

    fn release_pool(&mut self) -> Result<()> {
        self.lock().trim_graph_pool();
        Ok(())
    }
}
