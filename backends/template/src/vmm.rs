//! Virtual memory ([`HalVirtualMemory`]): reserve address space, create physical memory, map,
//! unmap, release. The core passes only sizes and offsets that are multiples of the
//! granularity and addresses it got from here.

use memplan_core::{HalVirtualMemory, Result};

use crate::conv::{check, check_alloc};
use crate::device::TemplateDevice;
use crate::fake;

// guide:begin vmm
impl HalVirtualMemory for TemplateDevice {
    fn granularity(&mut self) -> Result<u64> {
        let mut g = 0;
        check("fake_mem_granularity", fake::fake_mem_granularity(&mut g))?;
        Ok(g)
    }

    fn reserve(&mut self, bytes: u64) -> Result<u64> {
        let mut base = 0;
        check(
            "fake_mem_address_reserve",
            fake::fake_mem_address_reserve(bytes, &mut base),
        )?;
        Ok(base)
    }

    unsafe fn free_range(&mut self, base: u64, _bytes: u64) -> Result<()> {
        check("fake_mem_address_free", fake::fake_mem_address_free(base))
    }

    fn create_physical(&mut self, bytes: u64) -> Result<u64> {
        let mut handle = 0;
        check_alloc(
            "fake_mem_create",
            fake::fake_mem_create(bytes, &mut handle),
            bytes,
        )?;
        Ok(handle)
    }

    unsafe fn destroy_physical(&mut self, physical: u64, _bytes: u64) -> Result<()> {
        check("fake_mem_release", fake::fake_mem_release(physical))
    }

    unsafe fn map(&mut self, address: u64, bytes: u64, physical: u64) -> Result<()> {
        check("fake_mem_map", fake::fake_mem_map(address, bytes, physical))
    }

    unsafe fn unmap(&mut self, address: u64, _bytes: u64) -> Result<()> {
        check("fake_mem_unmap", fake::fake_mem_unmap(address))
    }
}
// guide:end vmm
