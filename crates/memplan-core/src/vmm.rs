//! Virtual-memory management: reserve address space now, map physical memory later.
//!
//! This is what makes the `post-capture` strategy possible: the KV cache's address range is
//! reserved before graphs are captured against it, and physical memory is mapped only after the
//! real free memory is read.

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// A reserved virtual address range.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VaRange {
    /// Opaque handle (base address for real backends).
    pub handle: u64,
    /// Size in bytes (a multiple of the granularity).
    pub bytes: u64,
}

/// Physical memory mapped into a reserved range.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    /// Opaque handle of the physical allocation.
    pub handle: u64,
    /// Base handle of the range it is mapped into.
    pub range: u64,
    /// Offset in the range.
    pub offset: u64,
    /// Bytes mapped.
    pub bytes: u64,
}

/// Virtual-memory operations of one device.
pub trait VirtualMemory {
    /// Allocation granularity: every size and offset is a multiple of it.
    fn granularity(&mut self) -> Result<u64>;
    /// Reserve address space (no physical memory).
    fn reserve(&mut self, bytes: u64) -> Result<VaRange>;
    /// Create physical memory and map it at `offset` in `range`.
    fn map(&mut self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping>;
    /// Unmap and release the physical memory.
    fn unmap(&mut self, mapping: Mapping) -> Result<()>;
    /// Release the address range (every mapping in it must be unmapped first).
    fn release(&mut self, range: VaRange) -> Result<()>;
}
