//! The core's bookkeeping of one device: everything memplan handed out and still holds, and
//! the teardown that releases it in order when the device is dropped.
//!
//! An entry leaves a table only once the backend confirmed its release. A release that fails
//! keeps the entry (in the state the failure left it: a mapping whose unmap failed is still
//! mapped, one whose physical release failed is unmapped but still holds its memory), so it is
//! never forgotten and teardown tries again.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::hal::{HalDevice, HalGraph};
use crate::handle::HandleId;

/// A mapping, or the physical memory left of one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MappingEntry {
    pub range: HandleId,
    pub address: u64,
    pub bytes: u64,
    pub physical: u64,
    /// Still mapped at `address` (false once unmapped, while the physical memory awaits release).
    pub mapped: bool,
}

/// A graph; each object is `None` once destroyed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GraphEntry {
    pub graph: Option<u64>,
    pub exec: Option<u64>,
}

impl GraphEntry {
    pub(crate) fn new(g: HalGraph) -> Self {
        GraphEntry {
            graph: Some(g.graph),
            exec: Some(g.exec),
        }
    }

    /// Both objects, while neither is destroyed (what replay needs).
    pub(crate) fn whole(&self) -> Option<HalGraph> {
        Some(HalGraph {
            graph: self.graph?,
            exec: self.exec?,
        })
    }
}

/// How many of each kind of object a device holds for its callers (see
/// [`Device::live`](crate::Device::live)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Live {
    /// Raw allocations.
    pub allocations: usize,
    /// Reserved ranges.
    pub ranges: usize,
    /// Mappings still mapped.
    pub mappings: usize,
    /// Physical memory unmapped but not yet released (a release that failed).
    pub unreleased_physical: usize,
    /// Graphs (or what is left of them).
    pub graphs: usize,
    /// Whether a capture is in progress.
    pub capturing: bool,
}

/// Everything one device holds.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub allocations: BTreeMap<HandleId, (u64, u64)>,
    pub ranges: BTreeMap<HandleId, (u64, u64)>,
    pub mappings: BTreeMap<HandleId, MappingEntry>,
    pub graphs: BTreeMap<HandleId, GraphEntry>,
    pub capturing: bool,
    /// Graph capture was used, so teardown trims the pool.
    pub graphs_used: bool,
    pub granularity: Option<u64>,
    /// Raw allocations freed so far ([`Device::raw_frees`](crate::Device::raw_frees)).
    pub raw_frees: u64,
    /// The bytes of those allocations ([`Device::raw_freed_bytes`](crate::Device::raw_freed_bytes)).
    pub raw_freed_bytes: u64,
}

/// The error of an operation the protocol forbids while a capture is in progress.
fn during_capture(what: &str) -> Error {
    Error::state(
        what,
        "a graph capture is in progress: end or abort it first",
    )
}

impl Tables {
    /// Refuse `what` while a capture is in progress (global capture mode would fail on it).
    pub(crate) fn no_capture(&self, what: &str) -> Result<()> {
        if self.capturing {
            return Err(during_capture(what));
        }
        Ok(())
    }

    pub(crate) fn live(&self) -> Live {
        let mapped = self.mappings.values().filter(|m| m.mapped).count();
        Live {
            allocations: self.allocations.len(),
            ranges: self.ranges.len(),
            mappings: mapped,
            unreleased_physical: self.mappings.len() - mapped,
            graphs: self.graphs.len(),
            capturing: self.capturing,
        }
    }

    /// Release everything still held, in order: the capture, graphs (executable, then graph),
    /// the graph pool, mappings (unmap, then physical memory), ranges, raw allocations. What
    /// fails is logged and left to the backend's own teardown (its context); nothing is tried
    /// twice here.
    pub(crate) fn teardown(&mut self, hal: &mut dyn HalDevice) {
        let mut errors: Vec<Error> = Vec::new();
        if self.capturing || !self.graphs.is_empty() || self.graphs_used {
            match hal.graphs() {
                Ok(g) => {
                    if std::mem::take(&mut self.capturing) {
                        errors.extend(g.abort_capture().err());
                    }
                    for (_, e) in std::mem::take(&mut self.graphs) {
                        if let Some(x) = e.exec {
                            // SAFETY: from end_capture, not destroyed (still in the table).
                            errors.extend(unsafe { g.destroy_exec(x) }.err());
                        }
                        if let Some(x) = e.graph {
                            // SAFETY: as above; its executable was destroyed first.
                            errors.extend(unsafe { g.destroy_graph(x) }.err());
                        }
                    }
                    errors.extend(g.release_pool().err());
                }
                Err(e) => errors.push(e),
            }
        }
        if !self.mappings.is_empty() || !self.ranges.is_empty() {
            match hal.virtual_memory() {
                Ok(vm) => {
                    let mut stuck = std::collections::BTreeSet::new();
                    for (_, m) in std::mem::take(&mut self.mappings) {
                        if m.mapped {
                            // SAFETY: a live mapping made by the backend's map, unmapped once.
                            if let Err(e) = unsafe { vm.unmap(m.address, m.bytes) } {
                                // Still mapped: neither its memory nor its range may be
                                // released under it. Left to the context's destruction.
                                errors.push(e);
                                stuck.insert(m.range);
                                continue;
                            }
                        }
                        // SAFETY: live physical memory, unmapped above or before, released once.
                        errors.extend(unsafe { vm.destroy_physical(m.physical, m.bytes) }.err());
                    }
                    for (id, (base, bytes)) in std::mem::take(&mut self.ranges) {
                        if stuck.contains(&id) {
                            continue;
                        }
                        // SAFETY: a live reservation with nothing mapped in it any more.
                        errors.extend(unsafe { vm.free_range(base, bytes) }.err());
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        for (_, (address, bytes)) in std::mem::take(&mut self.allocations) {
            // SAFETY: a live raw allocation of this backend, freed once (taken out of the table).
            errors.extend(unsafe { hal.free(address, bytes) }.err());
        }
        for e in errors {
            tracing::warn!(error = %e, "device teardown");
        }
    }
}
