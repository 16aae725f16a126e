//! The conformance report: one row per check, a pass/fail table, JSON.

use memplan_planner::CalibrationReport;
use serde::Serialize;
use std::fmt;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The device does what the backend declares.
    Pass,
    /// It does not; the evidence says how.
    Fail,
    /// Nothing to check (e.g. the device has too little free memory for a step).
    Skip,
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Name (`readings.free_le_total`, `graph_capture.lifecycle`...).
    pub name: String,
    /// Outcome.
    pub outcome: Outcome,
    /// What was observed.
    pub evidence: String,
}

impl Check {
    /// A check that passes when `ok`.
    pub fn new(name: &str, ok: bool, evidence: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            outcome: if ok { Outcome::Pass } else { Outcome::Fail },
            evidence: evidence.into(),
        }
    }

    /// A skipped check.
    pub fn skip(name: &str, why: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            outcome: Outcome::Skip,
            evidence: why.into(),
        }
    }
}

/// The suite's result for one device.
#[derive(Debug, Clone, Serialize)]
pub struct ConformanceReport {
    /// The device id.
    pub device: String,
    /// Every check.
    pub checks: Vec<Check>,
    /// The calibration behind the `calibration` check.
    pub calibration: CalibrationReport,
}

impl ConformanceReport {
    /// True when no check failed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome != Outcome::Fail)
    }

    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| c.outcome == Outcome::Fail)
            .collect()
    }
}

impl fmt::Display for ConformanceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "conformance of {}", self.device)?;
        for c in &self.checks {
            let o = match c.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            writeln!(f, "  {o:<5} {:<34} {}", c.name, c.evidence)?;
        }
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        writeln!(
            f,
            "{verdict}: {} checks, {} failed",
            self.checks.len(),
            self.failures().len()
        )
    }
}
