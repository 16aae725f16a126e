//! What `memplan simulate` reports: per strategy, the graph estimate, the real graph memory,
//! the error, KV tokens the engine got vs the run's oracle and the clean device's oracle, and
//! whether anything ran out of memory.

use memplan_core::bytes::{fmt_bytes, fmt_signed};
use serde::Serialize;
use std::fmt;

use crate::oracle::Oracle;
use crate::run::Choice;
use memplan_planner::calibrate::CalibrationReport;
use memplan_planner::plan::Plan;
use memplan_planner::strategy::StrategyKind;

/// One strategy's run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Whether the strategy was chosen automatically.
    pub auto: bool,
    /// The strategy that ran.
    pub strategy: StrategyKind,
    /// Why.
    pub why: String,
    /// Graph reserve the plan subtracted.
    pub estimate: Option<u64>,
    /// Real graph memory (ground truth of the real capture).
    pub real_graph: Option<u64>,
    /// `estimate - real` (negative = under-estimate).
    pub error_bytes: Option<i64>,
    /// Error relative to the real graph memory, percent.
    pub error_pct: Option<f64>,
    /// KV tokens the engine's own arithmetic makes of the plan's block count (for an engine
    /// that sizes its pool from its own free readings, at most `engine_pool_tokens`).
    pub kv_tokens: Option<u64>,
    /// KV tokens the engine's own pool rule keeps, where it sizes its pool from its own free
    /// readings (SGLang): it serves the smaller of these and the plan's.
    pub engine_pool_tokens: Option<u64>,
    /// KV tokens the plan says its blocks hold (differs from `kv_tokens` only when the
    /// planner's page layout disagrees with the engine's).
    pub planned_tokens: Option<u64>,
    /// The most KV tokens that would have fit (the run's oracle).
    pub oracle_tokens: Option<u64>,
    /// The run's oracle.
    pub oracle: Option<Oracle>,
    /// The oracle of a clean device (independent of the run's strategy and leftovers).
    pub clean_oracle: Option<Oracle>,
    /// Why no oracle could be computed (a harness error).
    pub oracle_error: Option<String>,
    /// `kv_tokens / oracle_tokens`.
    pub kv_vs_oracle: Option<f64>,
    /// `kv_tokens / clean_oracle.tokens`.
    pub kv_vs_clean_oracle: Option<f64>,
    /// Bytes the process grew past the requested memory (ground truth), when it did.
    pub over_request_bytes: Option<u64>,
    /// The phase after the plan in which the process's high-water mark first passed the
    /// request (the session's KV allocation, the engine's own KV allocation, graph capture,
    /// serving), when it did.
    pub over_request_phase: Option<String>,
    /// Bytes the process was past the request at the sampled points after the plan (the KV
    /// cache allocated, each warm-up and capture, the serving burst), when it was: the
    /// earlier, weaker rule, kept beside the high-water mark.
    pub over_request_sampled_bytes: Option<u64>,
    /// The process's high-water mark (ground truth, context included) in each phase before
    /// the plan, from the engine's start on: the session's start (calibration where it
    /// calibrates), the engine's weights, its profile run, the graph phase, the plan; and the
    /// step that ended a start-up that failed or refused. Each mark counts only its phase.
    pub phase_peaks: Vec<(&'static str, u64)>,
    /// What other processes held (ground truth) at the end of each phase of `phase_peaks`, in
    /// the same order: the others each step ran beside (a neighbour's change lands at the
    /// synchronize that opens its step).
    pub phase_others: Vec<u64>,
    /// Bytes the process's high-water mark before the plan passed the requested memory by,
    /// at its most, and the phase it did so in (the first where it passed), when it did.
    pub over_request_before_plan: Option<(u64, &'static str)>,
    /// The step a start-up was in when it ended, where it failed or refused before its plan
    /// (one of the phases of `phase_peaks`, or the session's check of the request).
    pub ended_in: Option<&'static str>,
    /// How far the process's high-water mark before the plan passed what the engine's own
    /// steps took, at its most, and the phase it did so in: in each phase, the mark above the
    /// larger of the request and the engine alone's mark in that step
    /// ([`crate::oracle::AloneMarks`]), what memplan's session added past the request (its
    /// calibration's leftovers, its probes, its own captures). What acceptance judges
    /// (`acceptance::Check::OverRequestBeforePlan`).
    pub own_over_request_before_plan: Option<(u64, &'static str)>,
    /// The largest allocation the session's allocation probes held, where it said by name
    /// that they take what is free (`probes_take_free_memory`), from the plan's warnings or,
    /// where the start-up ended before a plan, the session's.
    pub probes_named: Option<u64>,
    /// What the session's own checks left held for good, where it said so by name
    /// (`checks_left_held`), from the same warnings.
    pub checks_left_held: Option<u64>,
    /// Where the plan said by name that its share of the device was taken of a total nothing
    /// checks (`utilization_of_unchecked_total`: the driver's total is read once, and nothing
    /// read or measured at start-up bounds it from above), what that share of the total the
    /// runtime reports asks for past the same share of the device's real memory (0 where the
    /// runtime reports no more than the device has). The request a run is held to is the
    /// larger of the two: the over-request rules allow this much more, and nothing else.
    pub unchecked_total_allowance: Option<u64>,
    /// The out-of-memory error, when something ran out of memory.
    pub oom: Option<String>,
    /// An out-of-memory that memory other processes took after the plan caused alone
    /// (`neighbour.before` a step after the plan, or `during = "engine_capture"`): the run
    /// ran out of memory, and the same run with the others left as they were at the plan did
    /// not. The deployment's overcommit, not the plan's error: reported as its own outcome,
    /// never a success. The rest of the outcome is that run's (the same plan, judged by every
    /// other rule); [`Outcome::oom`] stays `None`.
    pub oom_others_after_plan: Option<String>,
    /// Any other failure (start-up refused, plan error).
    pub failed: Option<String>,
    /// Calibration downgrades.
    pub downgrades: Vec<String>,
    /// Codes of the warnings the session's KV cache came with (`kv_cache_shrunk`: the engine's
    /// allocation took more than the plan kept and the session gave it fewer blocks).
    pub kv_warnings: Vec<String>,
    /// Tokens the caching allocator's rounding of the engine's KV tensors costs at the plan's
    /// block count: the blocks the plan's own bytes do not hold once each tensor is rounded
    /// (`None` where the cache was mapped, or the engine has no layout).
    pub kv_rounding_tokens: Option<u64>,
    /// The plan.
    pub plan: Option<Plan>,
}

impl Outcome {
    pub(crate) fn new(choice: Choice) -> Self {
        let (auto, strategy) = match choice {
            Choice::Auto => (true, StrategyKind::None),
            Choice::Forced(k) => (false, k),
        };
        Outcome {
            auto,
            strategy,
            why: String::new(),
            estimate: None,
            real_graph: None,
            error_bytes: None,
            error_pct: None,
            kv_tokens: None,
            engine_pool_tokens: None,
            planned_tokens: None,
            oracle_tokens: None,
            oracle: None,
            clean_oracle: None,
            oracle_error: None,
            kv_vs_oracle: None,
            kv_vs_clean_oracle: None,
            over_request_bytes: None,
            over_request_phase: None,
            over_request_sampled_bytes: None,
            phase_peaks: Vec::new(),
            phase_others: Vec::new(),
            over_request_before_plan: None,
            ended_in: None,
            own_over_request_before_plan: None,
            probes_named: None,
            checks_left_held: None,
            unchecked_total_allowance: None,
            oom: None,
            oom_others_after_plan: None,
            failed: None,
            downgrades: Vec::new(),
            kv_warnings: Vec::new(),
            kv_rounding_tokens: None,
            plan: None,
        }
    }

    pub(crate) fn finish(&mut self) {
        if let (Some(e), Some(r)) = (self.error_bytes, self.real_graph) {
            if r > 0 {
                self.error_pct = Some(e as f64 * 100.0 / r as f64);
            }
        }
        let share = |o: u64| {
            self.kv_tokens
                .filter(|_| o > 0)
                .map(|k| k as f64 / o as f64)
        };
        self.kv_vs_oracle = self.oracle_tokens.and_then(share);
        self.kv_vs_clean_oracle = self.clean_oracle.and_then(|o| share(o.tokens));
    }

    /// Did it run out of memory?
    pub fn ran_out_of_memory(&self) -> bool {
        self.oom.is_some()
    }

    /// Whether the graph reserve was measured on the device (post-capture, full capture), as
    /// opposed to modelled from samples, bounded or estimated.
    pub fn graph_measured(&self) -> bool {
        matches!(
            self.strategy,
            StrategyKind::PostCapture | StrategyKind::Full
        )
    }
}

/// The whole comparison for one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Scenario name.
    pub scenario: String,
    /// What it reproduces.
    pub description: String,
    /// Device selector.
    pub device: String,
    /// Seed of the device's physics.
    pub seed: u64,
    /// Calibration of the device, when the scenario calibrates.
    pub calibration: Option<CalibrationReport>,
    /// One entry per run.
    pub runs: Vec<Outcome>,
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scenario {} on sim:{} (seed {})",
            self.scenario, self.device, self.seed
        )?;
        if !self.description.is_empty() {
            writeln!(f, "  {}", self.description)?;
        }
        if let Some(c) = &self.calibration {
            for l in c.downgrade_lines() {
                writeln!(f, "  {l}")?;
            }
        }
        writeln!(
            f,
            "  {:<20} {:>11} {:>11} {:>11} {:>8} {:>10} {:>10} {:>7} {:>7}  outcome",
            "strategy",
            "estimate",
            "real",
            "error",
            "error%",
            "KV tokens",
            "oracle",
            "of orc.",
            "clean",
        )?;
        for r in &self.runs {
            let name = if r.auto {
                format!("auto ({})", r.strategy)
            } else {
                r.strategy.to_string()
            };
            let outcome = match (&r.oom, &r.failed, r.over_request_bytes) {
                (Some(o), _, _) => format!("OOM: {o}"),
                (None, Some(e), _) => format!("FAILED: {e}"),
                (None, None, Some(b)) => format!("OVER REQUEST by {}", fmt_bytes(b)),
                _ if r.oracle_error.is_some() => {
                    format!(
                        "HARNESS: no oracle ({})",
                        r.oracle_error.as_deref().unwrap_or("")
                    )
                }
                // A cache that holds no token serves nothing: not a success.
                _ if r.kv_tokens == Some(0) => "FAILED: the KV cache holds 0 tokens".into(),
                _ => "ok".into(),
            };
            writeln!(
                f,
                "  {:<20} {:>11} {:>11} {:>11} {:>8} {:>10} {:>10} {:>7} {:>7}  {}",
                name,
                opt(r.estimate, fmt_bytes),
                opt(r.real_graph, fmt_bytes),
                opt(r.error_bytes, fmt_signed),
                opt(r.error_pct, |p| format!("{p:+.1}%")),
                opt(r.kv_tokens, |t| t.to_string()),
                opt(r.oracle_tokens, |t| t.to_string()),
                opt(r.kv_vs_oracle, |x| format!("{:.1}%", x * 100.0)),
                opt(r.kv_vs_clean_oracle, |x| format!("{:.1}%", x * 100.0)),
                outcome
            )?;
        }
        if let Some(a) = self.runs.iter().find(|r| r.auto) {
            if a.why.is_empty() {
                // The run ended before the graph phase chose anything.
                writeln!(
                    f,
                    "  automatic choice: none made (the run ended before the graph phase)"
                )?;
            } else {
                writeln!(f, "  automatic choice: {} because {}", a.strategy, a.why)?;
            }
            if let Some(p) = &a.plan {
                for w in &p.warnings {
                    writeln!(f, "  warning: {w}")?;
                }
            }
        }
        Ok(())
    }
}
