//! Virtual-memory primitives of a simulated GPU: reserving address space costs nothing;
//! creating physical memory takes it (and can run out); granularity 2 MiB. The simulated
//! driver is strict: a call on something it did not hand out is an error, so a bookkeeping
//! slip of the core shows up in tests instead of passing silently.

use memplan_core::{Error, HalVirtualMemory, Result};

use crate::gpu::SimGpu;

/// Granularity of every reservation, mapping size and offset.
pub const GRANULARITY: u64 = 2 << 20;

/// Where simulated reservations start (an address, so an engine can point at it).
const VA_BASE: u64 = 0x7f00_0000_0000;

fn no(what: &str, at: u64) -> Error {
    Error::invalid("address", format!("sim driver: no {what} at {at:#x}"))
}

impl HalVirtualMemory for SimGpu {
    fn granularity(&mut self) -> Result<u64> {
        Ok(GRANULARITY)
    }

    fn reserve(&mut self, bytes: u64) -> Result<u64> {
        let mut s = self.lock();
        // Below the next free address, one granule apart, like a real VA allocator.
        let base = s.vmm_ranges.last_key_value().map_or(VA_BASE, |(b, n)| {
            b.saturating_add(*n).saturating_add(GRANULARITY)
        });
        if base.checked_add(bytes).is_none() {
            // Not a shortage of memory: no such range exists in a 64-bit address space.
            return Err(Error::invalid(
                "bytes",
                format!("sim driver: {bytes} bytes do not fit in the address space"),
            ));
        }
        s.vmm_ranges.insert(base, bytes);
        Ok(base)
    }

    unsafe fn free_range(&mut self, base: u64, bytes: u64) -> Result<()> {
        let mut s = self.lock();
        if s.vmm_maps
            .range(base..base.saturating_add(bytes))
            .next()
            .is_some()
        {
            return Err(Error::invalid(
                "range",
                "sim driver: freed with a live mapping",
            ));
        }
        s.vmm_ranges
            .remove(&base)
            .map(drop)
            .ok_or_else(|| no("reservation", base))
    }

    fn create_physical(&mut self, bytes: u64) -> Result<u64> {
        let mut s = self.lock();
        s.take(&self.shared.profile, bytes, "sim create physical")?;
        s.next_handle += 1;
        let handle = s.next_handle;
        s.vmm_physical.insert(handle, bytes);
        Ok(handle)
    }

    unsafe fn destroy_physical(&mut self, physical: u64, _bytes: u64) -> Result<()> {
        let mut s = self.lock();
        if s.vmm_maps.values().any(|(_, p)| *p == physical) {
            return Err(Error::invalid(
                "physical",
                "sim driver: destroyed while mapped",
            ));
        }
        let bytes = s
            .vmm_physical
            .remove(&physical)
            .ok_or_else(|| no("physical memory", physical))?;
        // Broken on purpose (`leak-per-vm-release`): part of it stays held.
        s.leaked = s
            .leaked
            .saturating_add(self.shared.quirks.leak_per_vm_release.min(bytes));
        Ok(())
    }

    unsafe fn map(&mut self, address: u64, bytes: u64, physical: u64) -> Result<()> {
        let mut s = self.lock();
        let inside = s
            .vmm_ranges
            .range(..=address)
            .next_back()
            .is_some_and(|(b, n)| address.saturating_add(bytes) <= b.saturating_add(*n));
        if !inside || !s.vmm_physical.contains_key(&physical) {
            return Err(no(
                "reservation or physical memory for this mapping",
                address,
            ));
        }
        s.vmm_maps.insert(address, (bytes, physical));
        Ok(())
    }

    unsafe fn unmap(&mut self, address: u64, _bytes: u64) -> Result<()> {
        self.lock()
            .vmm_maps
            .remove(&address)
            .map(drop)
            .ok_or_else(|| no("mapping", address))
    }
}

impl SimGpu {
    /// Live mappings as `(range, offset, bytes)`, `range` being the handle (address) of the
    /// reserved range they are mapped into; sorted. Ground truth for tests that check where
    /// memory was mapped.
    pub fn vmm_mappings(&self) -> Vec<(u64, u64, u64)> {
        let s = self.lock();
        s.vmm_maps
            .iter()
            .map(|(&address, &(bytes, _))| {
                let base = s
                    .vmm_ranges
                    .range(..=address)
                    .next_back()
                    .map_or(address, |(b, _)| *b);
                (base, address - base, bytes)
            })
            .collect()
    }
}
