//! Device-level graph capture (what memplan's calibration uses): kernel nodes and allocation
//! nodes recorded into a capture, instantiated into exec objects and graph-pool memory.

use memplan_core::{CaptureWork, Error, GraphCapture, GraphId, Result};

use crate::gpu::SimGpu;
use crate::state::Capture;

impl GraphCapture for SimGpu {
    fn begin_capture(&mut self) -> Result<()> {
        self.capture_support()?;
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

    fn end_capture(&mut self) -> Result<GraphId> {
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
        let per_node = self.shared.physics.exec_bytes_per_kernel_node;
        s.instantiate(
            &self.shared.profile,
            (c.kernel_nodes, per_node),
            c.alloc_node,
            hidden,
        )
        .map(GraphId)
    }

    fn abort_capture(&mut self) -> Result<()> {
        let mut s = self.lock();
        if matches!(s.capture, Some(Capture { engine: false, .. })) {
            s.capture = None;
        }
        Ok(())
    }

    fn replay(&mut self, graph: GraphId) -> Result<()> {
        let s = self.lock();
        s.no_capture("replay")?;
        if s.graphs.contains_key(&graph.0) {
            Ok(())
        } else {
            Err(Error::invalid(
                "graph",
                format!("no live graph with id {}", graph.0),
            ))
        }
    }

    fn destroy(&mut self, graph: GraphId) -> Result<()> {
        let deferred = self.deferred_release();
        self.lock().destroy(graph.0, deferred)
    }

    fn release_pool(&mut self) -> Result<()> {
        self.lock().trim_graph_pool();
        Ok(())
    }
}
