//! The virtual-memory check of calibration.

use memplan_core::bytes::fmt_bytes;
use memplan_core::{Device, Error, ProfilingCapability, Reading, Result, Support};

use super::checks::tolerance;
use super::graph_checks::{fact, free};
use super::report::{Evidence, Status, Verdict};

/// How many times the free reading's window error a mapping must take for its free drop to
/// tell a mapping that takes its memory from one that takes none (or half of it): the drop is
/// then off by at least twice the window error where the mapping takes half, and is read
/// within one.
const RESOLVED_WINDOW_ERRORS: u64 = 4;

/// How much to map for the check: one granule where the free reading resolves it, else the
/// whole granules that take [`RESOLVED_WINDOW_ERRORS`] times the reading's window error
/// (`noise`), at most `cap` (and at least one granule).
fn mapped_bytes(gran: u64, noise: u64, cap: u64) -> u64 {
    let want = noise.saturating_mul(RESOLVED_WINDOW_ERRORS);
    let granules = want.div_ceil(gran).clamp(1, (cap / gran).max(1));
    granules.saturating_mul(gran)
}

/// Reserve, map, unmap and release whole granules: one where the free reading resolves a
/// granule, else enough that a mapping that took no memory shows beyond the reading's window
/// error `window_error` (measured by the free check; where it measured none, twice the
/// reading's tolerance), at most `cap` bytes (the largest calibration allocation).
pub(super) fn virtual_memory(
    device: &Device,
    cal: &mut ProfilingCapability,
    window_error: Option<u64>,
    cap: u64,
) -> Result<Verdict> {
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
    let free_reading = cal.reading(Reading::DriverFree);
    let free_ok = free_reading.measures_own_usage();
    let noise = window_error.unwrap_or_else(|| free_reading.tolerance_bytes().saturating_mul(2));
    let attempt = (|| -> Result<Option<Evidence>> {
        let gran = device.virtual_memory()?.granularity()?.max(1);
        // Without a free reading to show it, one granule: nothing is read, and a larger
        // mapping would only be memory a lagging reading still counts afterwards.
        let bytes = if free_ok {
            mapped_bytes(gran, noise, cap)
        } else {
            gran
        };
        let span = bytes.checked_mul(2).ok_or_else(|| {
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
                .and_then(|vm| vm.map(&range, 0, bytes)),
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
            let what = if bytes == gran {
                format!("one {} granule", fmt_bytes(gran))
            } else {
                format!(
                    "{} ({} granules of {}, beyond the reading's window error of {})",
                    fmt_bytes(bytes),
                    bytes / gran,
                    fmt_bytes(gran),
                    fmt_bytes(noise)
                )
            };
            Evidence::bytes(
                format!("free drop after mapping {what}"),
                bytes as i64,
                super::checks::diff(before, after),
                tolerance(bytes).max(noise),
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

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::{GIB, MIB};

    #[test]
    fn the_mapping_takes_what_the_reading_can_see() {
        // A reading good to a few hundred KiB sees one granule.
        assert_eq!(mapped_bytes(2 * MIB, 300 << 10, GIB), 2 * MIB);
        // Windows off by up to 36 MiB: whole granules taking four times that.
        assert_eq!(mapped_bytes(2 * MIB, 36 * MIB, GIB), 144 * MIB);
        // Never more than the cap, never less than a granule.
        assert_eq!(mapped_bytes(2 * MIB, 2 * GIB, GIB), GIB);
        assert_eq!(mapped_bytes(2 * MIB, 2 * GIB, MIB), 2 * MIB);
    }
}
