//! The virtual-memory check of calibration.

use memplan_core::bytes::fmt_bytes;
use memplan_core::{Device, Error, ProfilingCapability, Reading, Result, Support};

use super::checks::tolerance;
use super::graph_checks::{fact, free};
use super::report::{Evidence, Status, Verdict};

/// Reserve, map, unmap and release one granule.
pub(super) fn virtual_memory(device: &Device, cal: &mut ProfilingCapability) -> Result<Verdict> {
    let declared = cal.facts.virtual_memory.clone();
    if !declared.is_supported() {
        return Ok(fact(
            "virtual_memory",
            declared.to_string(),
            declared.to_string(),
            Status::NotChecked,
            vec![],
            "declared unsupported",
        ));
    }
    let free_ok = cal.reading(Reading::DriverFree).measures_own_usage();
    let attempt = (|| -> Result<Option<Evidence>> {
        let gran = device.virtual_memory()?.granularity()?.max(1);
        let span = gran.checked_mul(2).ok_or_else(|| {
            Error::Measurement(format!(
                "virtual-memory granularity of {gran} bytes is not a usable size"
            ))
        })?;
        let range = device.virtual_memory()?.reserve(span)?;
        // Teardown on every path, a failed reading included: unmap, then release the range.
        let before = free(device, true);
        let mapped = match &before {
            Ok(_) => device
                .virtual_memory()
                .and_then(|vm| vm.map(&range, 0, gran)),
            Err(_) => Err(Error::Measurement("free memory could not be read".into())),
        };
        let after = free(device, true);
        let unmapped = match mapped {
            Ok(m) => device.virtual_memory().and_then(|vm| Ok(vm.unmap(m)?)),
            Err(e) => Err(e),
        };
        let released = device
            .virtual_memory()
            .and_then(|vm| Ok(vm.release(range)?));
        let (before, after) = (before?, after?);
        unmapped?;
        released?;
        Ok(free_ok.then(|| {
            Evidence::bytes(
                format!("free drop after mapping one {} granule", fmt_bytes(gran)),
                gran as i64,
                super::checks::diff(before, after),
                tolerance(gran),
            )
        }))
    })();
    Ok(match attempt {
        Ok(ev) => {
            let ok = ev.as_ref().is_none_or(|e| e.ok);
            let status = if ok {
                Status::Confirmed
            } else {
                cal.facts.virtual_memory = Support::no("mapping did not take the memory it should");
                Status::Downgraded
            };
            fact(
                "virtual_memory",
                "yes".into(),
                cal.facts.virtual_memory.to_string(),
                status,
                ev.into_iter().collect(),
                "",
            )
        }
        // A full device says nothing about virtual memory: out of memory, not a missing
        // capability.
        Err(e) if e.is_out_of_memory() => {
            return Err(e.during("calibration (virtual memory; the device is out of memory)"))
        }
        Err(e) => {
            cal.facts.virtual_memory = Support::no(format!("calibration failed: {e}"));
            fact(
                "virtual_memory",
                "yes".into(),
                cal.facts.virtual_memory.to_string(),
                Status::Downgraded,
                vec![],
                "",
            )
        }
    })
}
