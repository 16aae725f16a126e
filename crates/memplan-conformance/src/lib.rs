//! # memplan-conformance
//!
//! The suite every backend runs to prove it is honest: it declares no more than its device
//! delivers. [`run`] takes any opened [`Device`] and checks:
//!
//! 1. **readings** — internally consistent (free <= total), a reading declared unavailable is
//!    absent (never 0), a reading declared available is present, graph-pool readings are absent
//!    when the device has no graph-pool query;
//! 2. **calibration** — every reading and fact the backend declares behaves so under
//!    allocations of several sizes ([`memplan_planner::calibrate()`]); any downgrade fails the
//!    suite with calibration's evidence;
//! 3. **allocator layer** — raw allocations of several sizes are accounted exactly
//!    (allocated <= reserved, both back to the start after freeing);
//! 4. **graph capture** — when declared, capture (with an allocation node, or without one where
//!    the runtime refuses it with `Unsupported`), replay, destroy and pool release work and the
//!    graph pool returns to where it started; when not declared, the typed `Unsupported`
//!    error;
//! 5. **virtual memory** — when declared, reserve, map, unmap and release work and free memory
//!    returns; when not declared, the typed `Unsupported` error;
//! 6. **errors name the call** — an impossible allocation is `OutOfMemory` or a `DriverCall`
//!    error naming the call, never a panic or a success.
//!
//! Instantiate it per backend with [`conformance_test!`], or run it from the command line with
//! `cargo xtask conformance --device ID` (pass/fail table and a JSON report).

mod checks;
pub mod matrix;
mod report;

pub use report::{Check, ConformanceReport, Outcome};

use memplan::{Device, Result};

/// Run the whole suite on one device. Errors only when the device cannot be read at all; every
/// failed expectation is a failed [`Check`] with its evidence.
pub fn run(device: &Device) -> Result<ConformanceReport> {
    let span = tracing::info_span!("conformance", device = %device.descriptor().id);
    let _e = span.enter();
    let mut checks = Vec::new();
    checks.extend(checks::readings(device)?);
    let calibration = memplan_planner::calibrate(device)?;
    checks.push(checks::calibration(&calibration));
    checks.push(checks::raw_allocations(device));
    checks.push(checks::graph_capture(device));
    checks.push(checks::virtual_memory(device));
    checks.push(checks::errors_name_the_call(device));
    Ok(ConformanceReport {
        device: device.descriptor().id.to_string(),
        checks,
        calibration,
    })
}

/// Open a device by id and run the suite.
pub fn run_id(id: &str) -> Result<ConformanceReport> {
    let device = memplan::open(id)?;
    run(&device)
}

/// Make a `#[test]` that runs the suite on the device an expression opens and fails with the
/// report when any check fails.
///
/// ```ignore
/// memplan_conformance::conformance_test!(sim_rtx4090, memplan::open("sim:rtx4090"));
/// ```
#[macro_export]
macro_rules! conformance_test {
    ($name:ident, $open:expr) => {
        #[test]
        fn $name() {
            let device = $open.expect("open the device under test");
            let report = $crate::run(&device).expect("the suite could read the device");
            assert!(report.passed(), "conformance failed:\n{report}");
        }
    };
}
