//! Memory held by others: which reading can bound the KV cache by what is physically available.
//!
//! The budget arithmetic plans within the requested memory; the physical cap makes sure the KV
//! cache also fits in what is really free at the last quiet point, other processes included.
//! [`judge`] picks the reading that sees those processes, from the capability and the readings
//! alone (no vendor name):
//! - the driver's free reading, where it is declared to see the whole device and its reading
//!   is plausible ([`Physical::FreeSeesAll`]);
//! - otherwise the device-wide reading ([`Reading::DeviceAvailable`]), with its tolerance
//!   ([`Physical::DeviceWide`]);
//! - otherwise nothing sees other processes ([`Physical::Blind`]): the plan says so by name and
//!   the session checks it with an allocation probe (`session::probe`).
//!
//! A reading is *suspect* when its declared tolerance is half the device or more (it says
//! nothing), or when it shows more available than the device less what this process's own
//! allocator holds (it cannot be counting this process, let alone others).

use memplan_core::bytes::{fmt_bytes, MIB};
use memplan_core::{MemoryInfo, Reading, Reliability};
use serde::{Deserialize, Serialize};
use std::fmt;

use crate::session::Profile;

/// Bookkeeping slack of the plausibility check: a context and library handles hold driver
/// memory no allocator counts, so `available <= total - reserved` holds with room to spare;
/// this only absorbs rounding.
const PLAUSIBLE_SLACK: u64 = 64 * MIB;

/// Which reading bounded the KV cache by physically available memory (`physical_check` in a
/// plan's JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PhysicalCheck {
    /// The driver's free reading (device-wide, or at least this process's use).
    DriverFree,
    /// The device-wide reading ([`Reading::DeviceAvailable`]).
    DeviceAvailable,
    /// An allocation probe at the last quiet point: neither reading sees other processes.
    Probe,
}

impl PhysicalCheck {
    /// A short name for table rows (`free memory`, `device-wide`, `probe`).
    pub fn short(self) -> &'static str {
        match self {
            PhysicalCheck::DriverFree => "free memory",
            PhysicalCheck::DeviceAvailable => "device-wide",
            PhysicalCheck::Probe => "probe",
        }
    }
}

impl fmt::Display for PhysicalCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PhysicalCheck::DriverFree => "driver free memory",
            PhysicalCheck::DeviceAvailable => "the device-wide available memory",
            PhysicalCheck::Probe => "an allocation probe",
        })
    }
}

/// What can see memory other processes hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Physical {
    /// The driver's free reading does.
    FreeSeesAll,
    /// The device-wide reading does: at the baseline (when read), at the last quiet point,
    /// and how far it may be off.
    DeviceWide {
        /// At the baseline (absent when not read then).
        baseline: Option<u64>,
        /// At the last snapshot.
        last: u64,
        /// Declared tolerance.
        tolerance: u64,
    },
    /// Nothing does; why not, per reading.
    Blind {
        /// Why the free reading cannot.
        free_reading: String,
        /// Why the device-wide reading cannot.
        device_wide: String,
    },
}

/// Slack for the allocator's rounding of the allocations still to come (0.5%, at least
/// 32 MiB): a cap that is met exactly leaves a large allocation nowhere to go.
pub(crate) fn rounding_slack(bytes: u64) -> u64 {
    (bytes / 200).max(32 * MIB)
}

/// Pick the reading that sees other processes' memory (see the module docs).
pub(crate) fn judge(p: &Profile) -> Physical {
    let total = p.baseline.driver.total;
    let free = p.capability.reading(Reading::DriverFree);
    let Some(free_why) = unseen(&free, p.last.driver.free, &p.last, total) else {
        return Physical::FreeSeesAll;
    };
    let dev = p.capability.reading(Reading::DeviceAvailable);
    match unseen(&dev, p.last.device.available, &p.last, total) {
        None => Physical::DeviceWide {
            baseline: p.baseline.device.available.filter(|_| {
                unseen(&dev, p.baseline.device.available, &p.baseline, total).is_none()
            }),
            last: p.last.device.available.unwrap_or(0),
            tolerance: dev.tolerance_bytes(),
        },
        Some(device_wide) => Physical::Blind {
            free_reading: free_why,
            device_wide,
        },
    }
}

/// Why `rel` (read as `value` in `snap`) cannot see memory other processes hold; `None` when
/// it can.
fn unseen(
    rel: &Reliability,
    value: Option<u64>,
    snap: &MemoryInfo,
    total: Option<u64>,
) -> Option<String> {
    if !rel.sees_whole_device() {
        return Some(format!("{}: {}", rel.label(), rel.detail()));
    }
    let tol = rel.tolerance_bytes();
    if let Some(t) = total.filter(|t| tol >= t / 2) {
        return Some(format!(
            "suspect: declared within {} of a {} device ({})",
            fmt_bytes(tol),
            fmt_bytes(t),
            rel.detail()
        ));
    }
    let Some(v) = value else {
        return Some(format!(
            "declared {} but not read in the last snapshot",
            rel.label()
        ));
    };
    let held = snap.allocator.reserved.unwrap_or(0);
    if let Some(t) = total {
        if v > t
            .saturating_sub(held)
            .saturating_add(tol)
            .saturating_add(PLAUSIBLE_SLACK)
        {
            return Some(format!(
                "suspect: reads {} available while this process's allocator alone holds {} of {}",
                fmt_bytes(v),
                fmt_bytes(held),
                fmt_bytes(t)
            ));
        }
    }
    None
}

#[cfg(test)]
#[path = "physical_tests.rs"]
mod tests;
