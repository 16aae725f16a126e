//! Graph capture: the primitive operations a backend supplies.
//!
//! Ordering (synchronize, release the allocator cache before the baseline, snapshot, teardown on
//! every path) is the core protocol's job, not the backend's. Memory that graph allocation nodes
//! take during capture goes to the device's graph pool, which [`GraphCapture::release_pool`]
//! returns to the driver once every graph using it is destroyed.

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// A captured graph, opaque to the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GraphId(pub u64);

/// Work recorded into a capture: `kernel_nodes` small kernels plus, optionally, one graph
/// memory-allocation node of `alloc_node_bytes` (freed inside the graph). Real backends compile
/// a trivial kernel; the simulator models the costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureWork {
    /// Number of kernel nodes.
    pub kernel_nodes: u32,
    /// Bytes of one graph allocation node (0 = none).
    pub alloc_node_bytes: u64,
}

/// Graph capture on one device's stream.
///
/// Contract: `begin_capture` → any number of `record` → `end_capture` (or `abort_capture`);
/// graphs may be replayed and must be destroyed; `release_pool` trims the graph pool once no
/// graph uses it. A capture in progress must be ended or aborted before any other call on the
/// device: global capture mode fails on stray synchronizes.
pub trait GraphCapture {
    /// Start capturing on the device's stream.
    fn begin_capture(&mut self) -> Result<()>;
    /// Record work into the capture in progress.
    fn record(&mut self, work: &CaptureWork) -> Result<()>;
    /// End the capture and instantiate the graph.
    fn end_capture(&mut self) -> Result<GraphId>;
    /// Abandon the capture in progress (teardown on error paths). A no-op when none is.
    fn abort_capture(&mut self) -> Result<()>;
    /// Launch a graph once and wait for it.
    fn replay(&mut self, graph: GraphId) -> Result<()>;
    /// Destroy a graph (its exec object and its allocation nodes).
    fn destroy(&mut self, graph: GraphId) -> Result<()>;
    /// Return the graph pool's unused memory to the driver.
    fn release_pool(&mut self) -> Result<()>;

    /// Capture one graph of `work`: begin, record, end. On any error the capture in progress
    /// is aborted (so no other call on the device fails on it) and the error returned.
    fn capture_once(&mut self, work: &CaptureWork) -> Result<GraphId> {
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
    use crate::error::Error;

    /// Records calls; `record` fails when asked to.
    #[derive(Default)]
    struct Log {
        calls: Vec<&'static str>,
        fail_record: bool,
    }

    impl GraphCapture for Log {
        fn begin_capture(&mut self) -> Result<()> {
            self.calls.push("begin");
            Ok(())
        }
        fn record(&mut self, _: &CaptureWork) -> Result<()> {
            self.calls.push("record");
            if self.fail_record {
                return Err(Error::unsupported("graph allocation nodes", "test"));
            }
            Ok(())
        }
        fn end_capture(&mut self) -> Result<GraphId> {
            self.calls.push("end");
            Ok(GraphId(7))
        }
        fn abort_capture(&mut self) -> Result<()> {
            self.calls.push("abort");
            Ok(())
        }
        fn replay(&mut self, _: GraphId) -> Result<()> {
            Ok(())
        }
        fn destroy(&mut self, _: GraphId) -> Result<()> {
            Ok(())
        }
        fn release_pool(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn capture_once_aborts_on_error() {
        let work = CaptureWork {
            kernel_nodes: 1,
            alloc_node_bytes: 1,
        };
        let mut ok = Log::default();
        assert_eq!(ok.capture_once(&work).unwrap(), GraphId(7));
        assert_eq!(ok.calls, ["begin", "record", "end"]);
        let mut bad = Log {
            fail_record: true,
            ..Log::default()
        };
        assert!(matches!(
            bad.capture_once(&work),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(bad.calls, ["begin", "record", "abort"]);
    }
}
