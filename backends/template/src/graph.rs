//! Graph capture ([`HalGraphs`]): stream capture of kernel and allocation nodes, instantiate,
//! launch, destroy, trim the pool. Ending a capture is two runtime calls (end, instantiate):
//! when the second fails, the first's graph is destroyed here, so a failed primitive leaves
//! nothing behind.

use memplan_core::{CaptureWork, HalGraph, HalGraphs, Result};

use crate::conv::check;
use crate::device::TemplateDevice;
use crate::fake;

// guide:begin graphs
impl HalGraphs for TemplateDevice {
    fn begin_capture(&mut self) -> Result<()> {
        check(
            "fake_stream_begin_capture",
            fake::fake_stream_begin_capture(self.ordinal),
        )
    }

    fn record(&mut self, work: &CaptureWork) -> Result<()> {
        check(
            "fake_stream_record",
            fake::fake_stream_record(work.kernel_nodes, work.alloc_node_bytes),
        )
    }

    fn end_capture(&mut self) -> Result<HalGraph> {
        let mut graph = 0;
        check(
            "fake_stream_end_capture",
            fake::fake_stream_end_capture(&mut graph),
        )?;
        let mut exec = 0;
        let made = fake::fake_graph_instantiate(graph, &mut exec);
        if let Err(e) = check("fake_graph_instantiate", made) {
            // Undo the first call: no part of the graph is left.
            let _ = check("fake_graph_destroy", fake::fake_graph_destroy(graph));
            return Err(e);
        }
        Ok(HalGraph::new(graph, exec))
    }

    fn abort_capture(&mut self) -> Result<()> {
        check(
            "fake_stream_abort_capture",
            fake::fake_stream_abort_capture(),
        )
    }

    unsafe fn replay(&mut self, graph: HalGraph) -> Result<()> {
        check("fake_graph_launch", fake::fake_graph_launch(graph.exec))
    }

    unsafe fn destroy_exec(&mut self, exec: u64) -> Result<()> {
        check(
            "fake_graph_exec_destroy",
            fake::fake_graph_exec_destroy(exec),
        )
    }

    unsafe fn destroy_graph(&mut self, graph: u64) -> Result<()> {
        check("fake_graph_destroy", fake::fake_graph_destroy(graph))
    }

    fn release_pool(&mut self) -> Result<()> {
        check(
            "fake_graph_mem_trim",
            fake::fake_graph_mem_trim(self.ordinal),
        )
    }
}
// guide:end graphs
