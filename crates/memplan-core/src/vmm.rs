//! Virtual-memory management: reserve address space now, map physical memory later.
//!
//! This is what makes the `post-capture` strategy possible: the KV cache's address range is
//! reserved before graphs are captured against it, and physical memory is mapped only after the
//! real free memory is read.
//!
//! [`VirtualMemory`] is the checked view a [`Device`] gives out. The rules live here, once for
//! every backend: sizes and offsets are non-zero multiples of the granularity, a mapping lies
//! inside a live range of this device and overlaps no live mapping, a range is released only
//! once nothing is mapped in it, a mapping is made as create → map → set access and undone
//! in reverse when a step fails, and an unmap is unmap → release the physical memory, where a
//! failure at either step keeps the mapping tracked in the state it reached.

use crate::device::{not_live, Device, Inner};
use crate::error::{Error, Result};
use crate::handle::{Failed, HandleId, Mapping, VaRange};
use crate::tables::MappingEntry;

/// Virtual-memory operations of one device (from [`Device::virtual_memory`]).
pub struct VirtualMemory<'d> {
    device: &'d Device,
}

/// Check that `value` (named `field`) is a multiple of `granularity`, and non-zero unless
/// `allow_zero`.
fn check_multiple(field: &str, value: u64, granularity: u64, allow_zero: bool) -> Result<()> {
    if value == 0 && !allow_zero {
        return Err(Error::invalid(field, "must be greater than 0"));
    }
    if !value.is_multiple_of(granularity) {
        return Err(Error::invalid(
            field,
            format!("{value} is not a multiple of the granularity {granularity}"),
        ));
    }
    Ok(())
}

/// The granularity, asked once and cached; 0 is an error, not a divisor.
fn granularity(inner: &mut Inner) -> Result<u64> {
    if let Some(g) = inner.t.granularity {
        return Ok(g);
    }
    let g = inner.hal.virtual_memory()?.granularity()?;
    if g == 0 {
        return Err(Error::Measurement(
            "the virtual-memory granularity reads 0".into(),
        ));
    }
    inner.t.granularity = Some(g);
    Ok(g)
}

impl<'d> VirtualMemory<'d> {
    pub(crate) fn new(device: &'d Device) -> Self {
        VirtualMemory { device }
    }

    /// Allocation granularity: every size and offset is a multiple of it.
    pub fn granularity(&self) -> Result<u64> {
        granularity(&mut self.device.lock())
    }

    /// Reserve `bytes` of address space (no physical memory); a non-zero multiple of the
    /// granularity.
    pub fn reserve(&self, bytes: u64) -> Result<VaRange> {
        let mut g = self.device.lock();
        g.t.no_capture("reserving address space")?;
        check_multiple("bytes", bytes, granularity(&mut g)?, false)?;
        let base = g.hal.virtual_memory()?.reserve(bytes)?;
        let id = HandleId::mint();
        g.t.ranges.insert(id, (base, bytes));
        if base == 0 {
            return Err(Error::Measurement(
                "the reservation succeeded but returned a null address".into(),
            ));
        }
        Ok(VaRange { id, base, bytes })
    }

    /// Create `bytes` of physical memory and map it at `offset` in `range`. On failure
    /// nothing of this call stays mapped or allocated (or, where undoing failed too, it stays
    /// tracked and is released with the device).
    pub fn map(&self, range: &VaRange, offset: u64, bytes: u64) -> Result<Mapping> {
        let (id, address) = map(&mut self.device.lock(), range.id, offset, bytes)?;
        Ok(Mapping {
            id,
            range: range.id,
            address,
            offset,
            bytes,
        })
    }

    /// Unmap a mapping and release its physical memory. On failure the mapping stays tracked
    /// in the state it reached (still mapped, or unmapped with its memory not yet released)
    /// and is given back: calling again resumes where it stopped.
    pub fn unmap(&self, mapping: Mapping) -> Result<(), Failed<Mapping>> {
        match unmap(&mut self.device.lock(), mapping.id) {
            Ok(()) => Ok(()),
            Err(e) => Err(Failed::new(mapping, e)),
        }
    }

    /// Release a range. Refused while anything is mapped in it; on failure it stays live and
    /// is given back.
    pub fn release(&self, range: VaRange) -> Result<(), Failed<VaRange>> {
        match release(&mut self.device.lock(), range.id) {
            Ok(()) => Ok(()),
            Err(e) => Err(Failed::new(range, e)),
        }
    }
}

fn map(inner: &mut Inner, range: HandleId, offset: u64, bytes: u64) -> Result<(HandleId, u64)> {
    inner.t.no_capture("mapping")?;
    let &(base, size) = inner
        .t
        .ranges
        .get(&range)
        .ok_or_else(|| not_live("range", "reservation"))?;
    let gran = granularity(inner)?;
    check_multiple("offset", offset, gran, true)?;
    check_multiple("bytes", bytes, gran, false)?;
    let address = offset
        .checked_add(bytes)
        .filter(|end| *end <= size)
        .and_then(|_| base.checked_add(offset))
        .ok_or_else(|| {
            Error::invalid(
                "bytes",
                format!("[{offset}, +{bytes}) does not fit in the range of {size} bytes"),
            )
        })?;
    let Inner { hal, t } = inner;
    let end = address.saturating_add(bytes);
    let overlap = |m: &&MappingEntry| {
        m.mapped && m.range == range && m.address < end && address < m.address + m.bytes
    };
    if let Some(m) = t.mappings.values().find(overlap) {
        return Err(Error::invalid(
            "offset",
            format!(
                "[{address:#x}, +{bytes}) overlaps the live mapping [{:#x}, +{}); unmap it first",
                m.address, m.bytes
            ),
        ));
    }
    let vm = hal.virtual_memory()?;
    let physical = vm.create_physical(bytes)?;
    let mut entry = MappingEntry {
        range,
        address,
        bytes,
        physical,
        mapped: false,
    };
    // SAFETY: inside a live range of this device (checked above), overlapping no live mapping;
    // `physical` was just created with exactly `bytes`.
    let mut step = unsafe { vm.map(address, bytes, physical) };
    if step.is_ok() {
        entry.mapped = true;
        // SAFETY: mapped just above.
        step = unsafe { vm.set_access(address, bytes) };
    }
    let Err(e) = step else {
        let id = HandleId::mint();
        t.mappings.insert(id, entry);
        return Ok((id, address));
    };
    // Undo in reverse; whatever cannot be undone stays tracked (no handle is given out).
    // SAFETY: mapped by this call just above, unmapped once.
    if entry.mapped && unsafe { vm.unmap(address, bytes) }.is_ok() {
        entry.mapped = false;
    }
    // SAFETY: created by this call and mapped nowhere (the map failed or was undone).
    if entry.mapped || unsafe { vm.destroy_physical(physical, bytes) }.is_err() {
        tracing::warn!(
            address,
            bytes,
            mapped = entry.mapped,
            "undoing a failed mapping failed: kept until the device is dropped"
        );
        t.mappings.insert(HandleId::mint(), entry);
    }
    Err(e)
}

fn unmap(inner: &mut Inner, id: HandleId) -> Result<()> {
    let Inner { hal, t } = inner;
    t.no_capture("unmapping")?;
    let mut m = *t
        .mappings
        .get(&id)
        .ok_or_else(|| not_live("mapping", "mapping"))?;
    let vm = hal.virtual_memory()?;
    if m.mapped {
        // SAFETY: a live mapping of this device at exactly this address and size.
        unsafe { vm.unmap(m.address, m.bytes) }?;
        m.mapped = false;
        t.mappings.insert(id, m);
    }
    // SAFETY: the mapping's physical memory, unmapped (just now or by an earlier call), not
    // released yet (still in the table).
    unsafe { vm.destroy_physical(m.physical, m.bytes) }?;
    t.mappings.remove(&id);
    Ok(())
}

fn release(inner: &mut Inner, id: HandleId) -> Result<()> {
    let Inner { hal, t } = inner;
    t.no_capture("releasing address space")?;
    let &(base, bytes) = t
        .ranges
        .get(&id)
        .ok_or_else(|| not_live("range", "reservation"))?;
    let mapped = t
        .mappings
        .values()
        .filter(|m| m.mapped && m.range == id)
        .count();
    if mapped > 0 {
        return Err(Error::invalid(
            "range",
            format!("{mapped} mapping(s) still live in it: unmap them before releasing it"),
        ));
    }
    // SAFETY: a live reservation of this device with nothing mapped in it (checked above).
    unsafe { hal.virtual_memory()?.free_range(base, bytes) }?;
    t.ranges.remove(&id);
    Ok(())
}
