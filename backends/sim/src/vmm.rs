//! Virtual-memory management on a simulated GPU: reserving address space costs nothing;
//! mapping takes physical memory (and can run out); granularity 2 MiB.

use memplan_core::{Error, Mapping, Result, VaRange, VirtualMemory};

use crate::gpu::SimGpu;

/// Granularity of every reservation, mapping size and offset.
pub const GRANULARITY: u64 = 2 << 20;

fn aligned(field: &str, v: u64) -> Result<()> {
    if !v.is_multiple_of(GRANULARITY) {
        return Err(Error::invalid(
            field,
            format!("{v} is not a multiple of the 2 MiB granularity"),
        ));
    }
    Ok(())
}

impl VirtualMemory for SimGpu {
    fn granularity(&mut self) -> Result<u64> {
        Ok(GRANULARITY)
    }

    fn reserve(&mut self, bytes: u64) -> Result<VaRange> {
        aligned("reserve.bytes", bytes)?;
        if bytes == 0 {
            return Err(Error::invalid("reserve.bytes", "must be greater than 0"));
        }
        let mut s = self.lock();
        s.next_handle += 1;
        let handle = s.next_handle;
        s.vmm_ranges.insert(handle, bytes);
        Ok(VaRange { handle, bytes })
    }

    fn map(&mut self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping> {
        aligned("map.offset", offset)?;
        aligned("map.bytes", bytes)?;
        let mut s = self.lock();
        let size = *s.vmm_ranges.get(&range.handle).ok_or_else(|| {
            Error::invalid("map.range", format!("no reserved range {}", range.handle))
        })?;
        if bytes == 0 || offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(Error::invalid(
                "map",
                format!("[{offset}, +{bytes}) does not fit in a range of {size} bytes"),
            ));
        }
        let overlaps = s
            .vmm_maps
            .values()
            .any(|(r, o, b)| *r == range.handle && offset < o + b && *o < offset + bytes);
        if overlaps {
            return Err(Error::invalid(
                "map.offset",
                format!("{offset} overlaps an existing mapping"),
            ));
        }
        s.take(&self.shared.profile, bytes, "sim map")?;
        s.next_handle += 1;
        let handle = s.next_handle;
        s.vmm_maps.insert(handle, (range.handle, offset, bytes));
        Ok(Mapping {
            handle,
            range: range.handle,
            offset,
            bytes,
        })
    }

    fn unmap(&mut self, mapping: Mapping) -> Result<()> {
        self.lock()
            .vmm_maps
            .remove(&mapping.handle)
            .map(|_| ())
            .ok_or_else(|| Error::invalid("mapping", format!("no live mapping {}", mapping.handle)))
    }

    fn release(&mut self, range: VaRange) -> Result<()> {
        let mut s = self.lock();
        let live = s.vmm_maps.values().filter(|m| m.0 == range.handle).count();
        if live > 0 {
            return Err(Error::invalid(
                "release",
                format!("range {} still has {live} mapping(s)", range.handle),
            ));
        }
        s.vmm_ranges
            .remove(&range.handle)
            .map(|_| ())
            .ok_or_else(|| Error::invalid("range", format!("no reserved range {}", range.handle)))
    }
}

impl SimGpu {
    /// Live mappings as `(range, offset, bytes)`, `range` being the handle (address) of the
    /// reserved range they are mapped into; sorted. Ground truth for tests that check where
    /// memory was mapped.
    pub fn vmm_mappings(&self) -> Vec<(u64, u64, u64)> {
        let mut v: Vec<_> = self.lock().vmm_maps.values().copied().collect();
        v.sort_unstable();
        v
    }
}
