//! The calibration report: per reading and fact, what was declared, what was observed, and
//! the verdict with its evidence.

use memplan_core::bytes::{fmt_bytes, fmt_signed};
use memplan_core::ProfilingCapability;
use serde::Serialize;
use std::fmt;

/// One check: what was expected and what was observed.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Evidence {
    /// What was checked (e.g. `free drop after allocating 64.00 MiB, synchronized`).
    pub check: String,
    /// Expected value in bytes, when the check has one.
    pub expected: Option<i64>,
    /// Observed value in bytes; `None` when the reading was absent.
    pub observed: Option<i64>,
    /// Whether the observation matched within tolerance.
    pub ok: bool,
}

impl Evidence {
    /// A check with a byte expectation.
    pub fn bytes(
        check: impl Into<String>,
        expected: i64,
        observed: Option<i64>,
        tolerance: u64,
    ) -> Self {
        let ok = observed.is_some_and(|o| o.abs_diff(expected) <= tolerance);
        Evidence {
            check: check.into(),
            expected: Some(expected),
            observed,
            ok,
        }
    }
}

/// The verdict on one declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The evidence agrees with the declaration.
    Confirmed,
    /// The evidence contradicts it: the calibrated capability is weaker.
    Downgraded,
    /// Nothing could be checked (undeclared, or not checkable from one process).
    NotChecked,
}

/// Declared vs calibrated for one reading or fact.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Verdict {
    /// Reading or fact name (`driver_free`, `graph_release`...).
    pub item: String,
    /// As declared.
    pub declared: String,
    /// As calibrated.
    pub calibrated: String,
    /// The verdict.
    pub status: Status,
    /// The checks behind it.
    pub evidence: Vec<Evidence>,
    /// What calibration cannot see about this item, if anything.
    pub note: String,
}

/// Calibration of one device.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct CalibrationReport {
    /// The device id.
    pub device: String,
    /// Allocation sizes used.
    pub sizes: Vec<u64>,
    /// The capability as the backend declared it.
    pub declared: ProfilingCapability,
    /// The capability after calibration (never stronger than declared).
    pub calibrated: ProfilingCapability,
    /// One verdict per reading and checked fact.
    pub verdicts: Vec<Verdict>,
    /// The largest error the free reading showed on a synchronized window over a known
    /// allocation: how far a window of two readings was off on this device (bias cancels in a
    /// window; noise does not). Absent where nothing could be checked.
    #[serde(default)]
    pub free_window_error: Option<u64>,
    /// What the device kept of every raw allocation calibration freed: each allocate/free pair
    /// left the synchronized free reading lower by about this much, beyond the reading's idle
    /// noise (a driver that does not give all of a freed allocation back; the free check's
    /// evidence `free back where it stood before...` fails). Absent where the pairs showed
    /// nothing kept, or could not tell (fewer than two pairs, no free reading, a reading that
    /// did not follow the allocations, losses unlike one another).
    #[serde(default)]
    pub kept_per_free: Option<u64>,
    /// The step the free reading moved in on calibration's windows where it is a MiB or more
    /// (every read a multiple of it): a window of two such reads may be off by up to it even
    /// where the reading is exact to calibration (a step within the allocator's rounding).
    /// The reads' common divisor, confirmed by allocations of half of it where it is coarser
    /// than a window's rounding (a divisor can be a multiple of the step). Absent where the
    /// reads count bytes or nothing could be checked.
    #[serde(default)]
    pub free_step: Option<u64>,
    /// What calibration's test capture held at once (its allocation node, the runtime's
    /// executable object, anything a first capture allocates), as the free reading measured it
    /// after the replay: a start's checks hold this on top of the process for an instant.
    /// Absent where no graph was captured or the free reading was absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_capture_held: Option<u64>,
    /// The device refused to record the test capture's graph allocation node
    /// ([`Error::Unsupported`](memplan_core::Error::Unsupported): a runtime without
    /// stream-ordered allocation) and calibration captured without one. Capture itself stays
    /// supported (graphs without such nodes record), but an engine whose graphs allocate in
    /// them cannot capture them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub graph_alloc_nodes_refused: bool,
}

impl Verdict {
    /// The warning that names this verdict, where it downgraded a declaration.
    pub fn downgrade_warning(&self) -> Option<crate::Warning> {
        (self.status == Status::Downgraded).then(|| crate::Warning::CalibrationDowngrade {
            item: self.item.clone(),
            declared: self.declared.clone(),
            observed: self.calibrated.clone(),
        })
    }
}

impl CalibrationReport {
    /// What calibration read behind its verdict on `item` (its first evidence), where it read
    /// something: `None` where the item was not checked or its reading was absent (the
    /// verdict then stands on the declaration alone).
    pub fn observed(&self, item: &str) -> Option<i64> {
        self.verdicts
            .iter()
            .find(|v| v.item == item)?
            .evidence
            .first()?
            .observed
    }

    /// The verdicts that downgraded a declaration.
    pub fn downgrades(&self) -> Vec<&Verdict> {
        self.verdicts
            .iter()
            .filter(|v| v.status == Status::Downgraded)
            .collect()
    }

    /// True when every declaration held.
    pub fn honest(&self) -> bool {
        self.downgrades().is_empty()
    }

    /// One warning per downgrade, for sessions and plans.
    pub fn downgrade_warnings(&self) -> Vec<crate::Warning> {
        self.verdicts
            .iter()
            .filter_map(Verdict::downgrade_warning)
            .collect()
    }

    /// The downgrades as lines (the warnings' text).
    pub fn downgrade_lines(&self) -> Vec<String> {
        self.downgrade_warnings()
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

fn fmt_obs(o: Option<i64>) -> String {
    o.map(fmt_signed).unwrap_or_else(|| "absent".into())
}

impl fmt::Display for CalibrationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<_> = self.sizes.iter().map(|s| fmt_bytes(*s)).collect();
        writeln!(
            f,
            "calibration of {} (allocations of {})",
            self.device,
            sizes.join(", ")
        )?;
        writeln!(
            f,
            "  {:<22} {:<12} {:<40} calibrated",
            "item", "verdict", "declared"
        )?;
        for v in &self.verdicts {
            let st = match v.status {
                Status::Confirmed => "confirmed",
                Status::Downgraded => "DOWNGRADED",
                Status::NotChecked => "not checked",
            };
            let mut decl = v.declared.clone();
            decl.truncate(40);
            writeln!(
                f,
                "  {:<22} {:<12} {:<40} {}",
                v.item, st, decl, v.calibrated
            )?;
            // Evidence is printed for downgrades; JSON carries all of it.
            for e in v.evidence.iter().filter(|_| v.status == Status::Downgraded) {
                let exp = e.expected.map(fmt_signed).unwrap_or_else(|| "-".into());
                let mark = if e.ok { "ok  " } else { "FAIL" };
                writeln!(
                    f,
                    "      {mark} {}: expected {exp}, observed {}",
                    e.check,
                    fmt_obs(e.observed)
                )?;
            }
            if !v.note.is_empty() {
                writeln!(f, "      note: {}", v.note)?;
            }
        }
        if let Some(k) = self.kept_per_free {
            writeln!(
                f,
                "  every raw free kept {} held (the device does not give all of a freed allocation back)",
                fmt_bytes(k)
            )?;
        }
        writeln!(f, "calibrated capability:")?;
        write!(f, "{}", self.calibrated)?;
        if self.honest() {
            writeln!(f, "result: every declaration held")
        } else {
            writeln!(
                f,
                "result: {} declaration(s) downgraded",
                self.downgrades().len()
            )
        }
    }
}
