//! The order of a session's steps, enforced: [`Step`] and the session's record of them.
//!
//! A start-up is measured in one order: `start` (or `begin`), `check_request` (optional),
//! `load_weights`, `profile_run`, `capture_graphs` (any graph phase), `plan`, `into_kv_cache`.
//! Each step runs once, after the steps before it, or is refused with
//! [`Error::InvalidState`] naming the step and what it needs. Exceptions, each on purpose:
//! - `load_weights` may run several times before `profile_run` (a model loaded in parts, a
//!   draft model beside it): the weights figure is the sum of every load, each recorded as its
//!   own step.
//! - `check_request` and the graph phase may be skipped: an engine without graphs plans
//!   without a graph phase (an engine that captures graphs cannot: `plan` refuses, because
//!   its graph memory would go unreserved).
//! - A graph phase that failed (and was torn down) may run again, with another strategy.
//! - `plan` may run several times (another request, another KV spec); `into_kv_cache` checks
//!   the plan it is given against the last one.
//!
//! A step that fails after it changed the device (`load_weights`, `profile_run`, a graph phase
//! whose teardown failed) leaves memory the session did not measure: every later step is
//! refused, naming the step that failed. Start a new session.

use memplan_core::{Error, Result};

/// One step of a measured start-up, in order (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Step {
    /// `Session::start` / `Session::begin`: the baseline.
    Start,
    /// `Session::check_request`: free memory against the request, before loading.
    CheckRequest,
    /// `Session::load_weights`.
    LoadWeights,
    /// `Session::profile_run`: the activation peak.
    ProfileRun,
    /// `Session::capture_graphs` (or `capture_graphs_with`, `graph_phase`).
    CaptureGraphs,
    /// `Session::plan`.
    Plan,
    /// `Session::into_kv_cache`.
    IntoKvCache,
}

impl Step {
    /// The method's name, as errors name the step.
    pub fn name(self) -> &'static str {
        match self {
            Step::Start => "start",
            Step::CheckRequest => "check_request",
            Step::LoadWeights => "load_weights",
            Step::ProfileRun => "profile_run",
            Step::CaptureGraphs => "capture_graphs",
            Step::Plan => "plan",
            Step::IntoKvCache => "into_kv_cache",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

const ORDER: &str = "start, check_request (optional), load_weights (may repeat), profile_run, \
                     capture_graphs, plan (may repeat), into_kv_cache";

/// The steps a session has taken (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    /// The last step that succeeded.
    done: Step,
    /// A step that failed after changing the device, and its error.
    failed: Option<(Step, String)>,
}

impl Steps {
    pub fn new() -> Self {
        Steps {
            done: Step::Start,
            failed: None,
        }
    }

    /// The last step that succeeded.
    pub fn done(&self) -> Step {
        self.done
    }

    /// Whether `step` may run now; the refusal names it and says why not.
    pub fn check(&self, step: Step) -> Result<()> {
        if let Some((f, why)) = &self.failed {
            return Err(Error::state(
                step.name(),
                format!(
                    "{f} failed earlier ({why}): the memory it left is unmeasured, so nothing \
                     after it can be planned; start a new session"
                ),
            ));
        }
        let after: &[Step] = match step {
            Step::Start => &[],
            Step::CheckRequest => &[Step::Start],
            Step::LoadWeights => &[Step::Start, Step::CheckRequest, Step::LoadWeights],
            Step::ProfileRun => &[Step::LoadWeights],
            Step::CaptureGraphs => &[Step::ProfileRun],
            Step::Plan => &[Step::ProfileRun, Step::CaptureGraphs, Step::Plan],
            Step::IntoKvCache => &[Step::Plan],
        };
        if after.contains(&self.done) {
            return Ok(());
        }
        let reason = if step == self.done {
            format!("{step} already ran; each step runs once (order: {ORDER})")
        } else if step < self.done {
            format!(
                "{step} cannot run after {}: the steps run in order ({ORDER})",
                self.done
            )
        } else {
            let need = after.last().copied().unwrap_or(Step::Start);
            format!(
                "{step} needs {need} first (the last step that ran is {}; order: {ORDER})",
                self.done
            )
        };
        Err(Error::state(step.name(), reason))
    }

    /// `step` succeeded.
    pub fn succeeded(&mut self, step: Step) {
        self.done = step;
    }

    /// `step` failed after changing the device: every later step is refused.
    pub fn poisoned(&mut self, step: Step, e: &Error) {
        self.failed = Some((step, e.to_string()));
    }

    /// Whether a step failed after changing the device (every later step is refused).
    pub fn is_poisoned(&self) -> bool {
        self.failed.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &Steps, step: Step) -> String {
        match s.check(step) {
            Err(Error::InvalidState { operation, reason }) => {
                assert_eq!(operation, step.name());
                reason
            }
            other => panic!("{step}: {other:?}"),
        }
    }

    #[test]
    fn steps_run_once_in_order() {
        let mut s = Steps::new();
        assert!(refused(&s, Step::ProfileRun).contains("needs load_weights first"));
        assert!(refused(&s, Step::Plan).contains("needs"));
        s.check(Step::CheckRequest).unwrap();
        s.succeeded(Step::CheckRequest);
        assert!(refused(&s, Step::CheckRequest).contains("already ran"));
        s.check(Step::LoadWeights).unwrap();
        s.succeeded(Step::LoadWeights);
        // Loading in parts accumulates.
        s.check(Step::LoadWeights).unwrap();
        s.succeeded(Step::ProfileRun);
        assert!(refused(&s, Step::LoadWeights).contains("cannot run after profile_run"));
        assert!(refused(&s, Step::ProfileRun).contains("already ran"));
        assert!(refused(&s, Step::IntoKvCache).contains("needs plan first"));
        // No graph phase is allowed here; plan itself refuses an engine with graphs.
        s.check(Step::Plan).unwrap();
        s.succeeded(Step::CaptureGraphs);
        assert!(refused(&s, Step::CaptureGraphs).contains("already ran"));
        s.succeeded(Step::Plan);
        s.check(Step::Plan).unwrap();
        s.check(Step::IntoKvCache).unwrap();
        assert!(refused(&s, Step::CaptureGraphs).contains("cannot run after plan"));
    }

    #[test]
    fn a_failed_step_stops_the_session() {
        let mut s = Steps::new();
        s.poisoned(
            Step::LoadWeights,
            &Error::OutOfMemory {
                call: "x".into(),
                requested: 1,
            },
        );
        let r = refused(&s, Step::ProfileRun);
        assert!(r.contains("load_weights failed earlier"), "{r}");
        assert!(r.contains("start a new session"), "{r}");
    }
}
