//! Opaque handles: what a [`Device`](crate::Device) hands out and takes back.
//!
//! Every handle carries an id minted by the core from one process-wide counter, so ids are
//! never reused and a handle of one device is unknown to every other. Fields are private and
//! no handle has a public constructor, `Default` or `Deserialize`: safe code cannot forge one.
//! `RawAllocation`, `VaRange` and `Mapping` are neither `Clone` nor `Copy` (releasing one
//! consumes it); a [`GraphId`] is `Copy`, and using it after its graph was destroyed is an
//! error naming the graph, since its id is never given out again.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;

/// A handle's id, unique in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct HandleId(u64);

impl HandleId {
    /// A new id, never handed out before.
    pub(crate) fn mint() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        HandleId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for HandleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A raw device allocation made by [`Device::allocate`](crate::Device::allocate) (directly from
/// the driver, no caching allocator).
#[derive(Debug, PartialEq, Eq)]
pub struct RawAllocation {
    pub(crate) id: HandleId,
    pub(crate) address: u64,
    pub(crate) bytes: u64,
}

impl RawAllocation {
    /// Bytes asked for.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Its device address.
    pub fn address(&self) -> u64 {
        self.address
    }
}

/// A reserved virtual address range made by
/// [`VirtualMemory::reserve`](crate::VirtualMemory::reserve).
#[derive(Debug, PartialEq, Eq)]
pub struct VaRange {
    pub(crate) id: HandleId,
    pub(crate) base: u64,
    pub(crate) bytes: u64,
}

impl VaRange {
    /// Its base address (what an engine points its KV cache at).
    pub fn base(&self) -> u64 {
        self.base
    }
    /// Size in bytes (a multiple of the granularity).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Physical memory mapped into a reserved range by
/// [`VirtualMemory::map`](crate::VirtualMemory::map).
#[derive(Debug, PartialEq, Eq)]
pub struct Mapping {
    pub(crate) id: HandleId,
    pub(crate) range: HandleId,
    pub(crate) address: u64,
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
}

impl Mapping {
    /// Offset in its range.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Bytes mapped.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// The address it is mapped at (range base + offset).
    pub fn address(&self) -> u64 {
        self.address
    }
    /// Whether it lies in `range`.
    pub fn is_in(&self, range: &VaRange) -> bool {
        self.range == range.id
    }
}

/// A captured graph, made by [`GraphCapture::end_capture`](crate::GraphCapture::end_capture).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphId(pub(crate) HandleId);

impl fmt::Display for GraphId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "graph {}", self.0)
    }
}

/// A release that failed, with the handle given back: the resource is still live and tracked
/// by the device, so the call can be tried again with `handle` (or the device releases it when
/// it is dropped). `?` turns it into its [`Error`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Failed<H> {
    /// The handle, still valid.
    pub handle: H,
    /// Why the release failed.
    pub error: Error,
}

impl<H> Failed<H> {
    pub(crate) fn new(handle: H, error: Error) -> Self {
        Failed { handle, error }
    }
}

impl<H> From<Failed<H>> for Error {
    fn from(f: Failed<H>) -> Error {
        f.error
    }
}

impl<H> fmt::Display for Failed<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<H: fmt::Debug> std::error::Error for Failed<H> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_reused() {
        let a = HandleId::mint();
        let b = HandleId::mint();
        assert_ne!(a, b);
        assert!(b > a);
    }

    #[test]
    fn a_failed_release_converts_to_its_error() {
        let f = Failed::new(7u8, Error::invalid("x", "y"));
        assert_eq!(f.to_string(), "x: y");
        let e: Error = f.into();
        assert!(matches!(e, Error::InvalidInput { .. }));
    }
}
