//! [`KvRange`]: the KV cache's reserved address range (post-capture), owned through a guard.
//!
//! The `post-capture` strategy reserves the range before any graph is captured and hands it to
//! the engine ([`Engine::bind_kv_range`](crate::Engine::bind_kv_range)), so the engine's graphs
//! can point into its KV cache; physical memory is mapped once the plan says how much fits
//! ([`Session::into_kv_cache`](crate::Session::into_kv_cache)). Whoever holds the guard owns
//! the range: dropping it unmaps what is mapped, then releases the address space, on every
//! path (a session dropped half-way, an engine shutting down). Errors on drop are logged;
//! [`KvRange::release`] returns them instead.

use memplan_core::bytes::fmt_bytes;
use memplan_core::{Error, Mapping, Result, SharedDevice, VaRange};

/// A reserved address range for the KV cache and the memory mapped into it. See the module
/// docs.
pub struct KvRange {
    device: SharedDevice,
    range: Option<VaRange>,
    address: u64,
    bytes: u64,
    granularity: u64,
    mapping: Option<Mapping>,
}

impl KvRange {
    /// Reserve at least `bytes` of address space (rounded up to the granularity).
    pub fn reserve(device: &SharedDevice, bytes: u64) -> Result<Self> {
        let vm = device.virtual_memory()?;
        let gran = vm.granularity()?.max(1);
        let rounded = bytes.div_ceil(gran).checked_mul(gran).ok_or_else(|| {
            // A measurement error: in the session the size comes from the device's readings
            // (a garbage total), not from a setting the caller chose.
            Error::Measurement(format!(
                "a KV range of {bytes} bytes rounded up to the {gran}-byte granularity overflows 64 bits"
            ))
        })?;
        let range = vm.reserve(rounded)?;
        tracing::info!(bytes = range.bytes(), "KV address range reserved");
        Ok(KvRange {
            device: device.clone(),
            address: range.base(),
            bytes: range.bytes(),
            granularity: gran,
            range: Some(range),
            mapping: None,
        })
    }

    /// The range's address (its base; the handle the device gave).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The mapping granularity: mappings are whole multiples of it.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Bytes mapped (0 before [`map`](KvRange::map)).
    pub fn mapped_bytes(&self) -> u64 {
        self.mapping.as_ref().map_or(0, |m| m.bytes())
    }

    /// Map physical memory for the KV cache at the start of the range: `bytes` rounded down to
    /// the granularity (never more than planned). Returns the bytes mapped. Errors: already
    /// mapped, less than one granule, more than the range, the device's own errors (out of
    /// memory).
    pub fn map(&mut self, bytes: u64) -> Result<u64> {
        if self.mapping.is_some() {
            return Err(Error::state(
                "KV cache mapping",
                "the range is already mapped",
            ));
        }
        let b = (bytes / self.granularity) * self.granularity;
        if b == 0 || b > self.bytes {
            return Err(Error::invalid(
                "KV cache mapping",
                format!(
                    "{} does not fit between one granule ({}) and the reserved range ({})",
                    fmt_bytes(bytes),
                    fmt_bytes(self.granularity),
                    fmt_bytes(self.bytes)
                ),
            ));
        }
        let range = self
            .range
            .as_ref()
            .ok_or_else(|| Error::state("KV cache mapping", "the range was released"))?;
        let m = self.device.virtual_memory()?.map(range, 0, b)?;
        tracing::info!(bytes = b, address = self.address, "KV cache mapped");
        self.mapping = Some(m);
        Ok(b)
    }

    /// Unmap and release now, returning the first error (dropping does the same and logs).
    pub fn release(mut self) -> Result<()> {
        self.teardown()
    }

    /// Unmap, then release. What fails is kept (the device gives the handle back), so a
    /// second call retries it, and the device releases it when its last clone is dropped.
    fn teardown(&mut self) -> Result<()> {
        let unmapped = match self.mapping.take() {
            Some(m) => self.device.virtual_memory().and_then(|vm| {
                vm.unmap(m).map_err(|f| {
                    self.mapping = Some(f.handle);
                    f.error
                })
            }),
            None => Ok(()),
        };
        // A range whose mapping could not be unmapped cannot be released either: keep it.
        let released = match (self.range.take(), &unmapped) {
            (Some(r), Ok(())) => self.device.virtual_memory().and_then(|vm| {
                vm.release(r).map_err(|f| {
                    self.range = Some(f.handle);
                    f.error
                })
            }),
            (r, _) => {
                self.range = r;
                Ok(())
            }
        };
        unmapped.and(released)
    }
}

impl Drop for KvRange {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::error!(error = %e, "releasing the KV address range failed");
        }
    }
}

impl std::fmt::Debug for KvRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvRange")
            .field("address", &self.address)
            .field("bytes", &self.bytes)
            .field("mapped", &self.mapped_bytes())
            .finish()
    }
}
