//! # memplan-conformance
//!
//! The suite every backend runs to prove it is honest: it declares no more than its device
//! delivers, and its device gives back what it is given. [`run_with`] takes any opened
//! [`Device`] and checks (each check is named; a failure names the check and its evidence):
//!
//! 1. **readings** (`readings.*`): internally consistent (free <= total), a reading declared
//!    unavailable is absent (never 0), a reading declared available is present, graph-pool
//!    readings are absent when the device has no graph-pool query;
//! 2. **the total's sources** (`total.sources_agree`): the backend's enumeration, the opened
//!    device's descriptor and the driver's reading agree within the declared tolerance;
//! 3. **locality** (`locality.driver_free`, `locality.device_available`): a second, separate
//!    OS process ([`SecondProcess`]) opens the same device and holds an allocation while the
//!    suite reads; a reading declared to see the whole device must drop by it (a process-local
//!    reading declared exact fails here). Its drop also measures a context for the total;
//! 4. **calibration** (`calibration.declared_holds`): every reading and fact the backend
//!    declares behaves so under allocations of sizes that are no multiple of common reading
//!    steps ([`memplan_planner::calibrate_with`], `ODD_SIZES`); a downgrade fails with
//!    calibration's evidence;
//! 5. **allocator layer** (`allocator.raw_allocations_accounted`), **graph capture**
//!    (`graph_capture.lifecycle`: capture, replay, destroy, pool release; or the typed
//!    `Unsupported`), **virtual memory** (`virtual_memory.lifecycle`), **errors**
//!    (`errors.name_the_call`: an impossible allocation is a typed error naming the call);
//! 6. **capacity** (an allocation probe fills the device, then frees it, trusting no
//!    reading): `free.matches_capacity` (free says what fits, within its tolerance),
//!    `total.holds_what_fits`, and `total.accounted` (total less what is available at start is
//!    a context, as large as the second process's; without one, at most
//!    [`total::MAX_UNACCOUNTED`]: a total too high or too low fails);
//! 7. **leaks**, without trusting memplan's bookkeeping: `leaks.free_returns_memory` and
//!    `leaks.vm_release_returns_memory` (the free reading back at its baseline, within half a
//!    granule plus its tolerance, after each of many cycles, so small leaks add up), and
//!    `leaks.capacity_after_free`, `leaks.capacity_after_vm_release` (the probe finds as much
//!    after the cycles as before: a leak fails where the free reading is unavailable too).
//!
//! The suite needs the device to itself (another process's memory reads as unaccounted).
//! Run it from the command line with `cargo xtask conformance --device ID` (pass/fail table
//! and a JSON report; the binary starts itself again as the second process), or in a test
//! with [`conformance_test!`]. [`run`] alone cannot start a second process: the locality
//! checks are skipped and say so.

mod checks;
mod leaks;
mod locality;
pub mod matrix;
mod probe;
mod report;
mod second;
pub mod total;

pub use report::{Check, ConformanceReport, Outcome};
pub use second::{serve_if_asked, SecondProcess, HOLD_ENV};

use memplan::{Device, Reading, Result};

/// How the suite runs.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Options {
    /// How to start the second process of the locality checks (skipped without one).
    pub second_process: Option<SecondProcess>,
}

impl Options {
    /// With a second process started as `how`.
    pub fn with_second_process(how: SecondProcess) -> Self {
        Options {
            second_process: Some(how),
        }
    }
}

/// Run the suite on one device without a second process (the locality checks are skipped,
/// saying why). Errors only when the device cannot be read at all; every failed expectation
/// is a failed [`Check`] with its evidence.
pub fn run(device: &Device) -> Result<ConformanceReport> {
    run_with(device, &Options::default())
}

/// Run the whole suite on one device. See the crate docs for the checks and their order.
pub fn run_with(device: &Device, options: &Options) -> Result<ConformanceReport> {
    let span = tracing::info_span!("conformance", device = %device.descriptor().id);
    let _e = span.enter();
    let mut checks = Vec::new();
    checks.extend(checks::readings(device)?);
    checks.push(total::sources_agree(device));
    let locality = locality::check(device, options.second_process.as_ref());
    checks.extend(locality.checks);
    let calibration =
        memplan_planner::calibrate_with(device, &memplan_planner::calibrate::ODD_SIZES)?;
    checks.push(checks::calibration(&calibration));
    checks.push(checks::raw_allocations(device));
    checks.push(checks::graph_capture(device));
    checks.push(checks::virtual_memory(device));
    checks.push(checks::errors_name_the_call(device));

    // Capacity: the allocation probe, trusting no reading.
    device.synchronize()?;
    let read = device.driver_memory()?;
    let hint = read
        .free
        .or(device.device_wide_memory()?.available)
        .or(total::total(device));
    let before = probe::capacity(device, hint);
    match &before {
        Ok(cap) => {
            let free_rel = device.capabilities().reading(Reading::DriverFree);
            checks.push(total::free_matches_capacity(read.free, &free_rel, cap));
            checks.push(total::holds_what_fits(device, cap));
            checks.push(match &locality.context {
                Some(ctx) => total::accounted_by_context(device, ctx),
                None => total::accounted_by_capacity(device, cap),
            });
        }
        Err(e) => {
            for n in [
                "free.matches_capacity",
                "total.holds_what_fits",
                "total.accounted",
            ] {
                checks.push(Check::new(
                    n,
                    false,
                    format!("the allocation probe failed: {e}"),
                ));
            }
        }
    }

    // Leaks: cycles judged by the free reading, then by the probe.
    checks.push(leaks::free_cycles(device));
    let after_free = probe::capacity(device, hint);
    checks.push(leaks::capacity_kept(
        "leaks.capacity_after_free",
        &format!("{} allocate/free cycles", leaks::CYCLES),
        &before,
        &after_free,
    ));
    checks.push(leaks::vm_cycles(device));
    if device.capabilities().facts.virtual_memory.is_supported() {
        let after_vm = probe::capacity(device, hint);
        checks.push(leaks::capacity_kept(
            "leaks.capacity_after_vm_release",
            &format!("{} virtual-memory cycles", leaks::CYCLES),
            &after_free,
            &after_vm,
        ));
    } else {
        checks.push(Check::skip(
            "leaks.capacity_after_vm_release",
            "virtual memory not declared",
        ));
    }
    Ok(ConformanceReport {
        device: device.descriptor().id.to_string(),
        checks,
        calibration,
    })
}

/// Open a device by id and run the suite without a second process (see [`run`]).
pub fn run_id(id: &str) -> Result<ConformanceReport> {
    let device = memplan::open(id)?;
    run(&device)
}

/// Make a `#[test]` that runs the whole suite, second process included, on the device an
/// expression opens, and fails with the report when any check fails. The test starts its own
/// binary again, on itself alone, as the second process (the test's first act is
/// [`serve_if_asked`]).
///
/// Where to put it: in a crate that depends on `memplan-conformance` and on `memplan` with your
/// backend's feature (a test crate of the workspace, an engine's tests), never in your backend
/// crate's own tests: `memplan-conformance` depends on `memplan`, which depends on your
/// backend, so a dev-dependency there is a cycle that `cargo package` refuses.
///
/// ```ignore
/// memplan_conformance::conformance_test!(sim_rtx4090, memplan::open("sim:rtx4090"));
/// ```
#[macro_export]
macro_rules! conformance_test {
    ($name:ident, $open:expr) => {
        #[test]
        fn $name() {
            $crate::serve_if_asked();
            let device = $open.expect("open the device under test");
            let second =
                $crate::SecondProcess::this_test(concat!(module_path!(), "::", stringify!($name)))
                    .expect("this test binary's path");
            let report = $crate::run_with(&device, &$crate::Options::with_second_process(second))
                .expect("the suite could read the device");
            assert!(report.passed(), "conformance failed:\n{report}");
        }
    };
}
