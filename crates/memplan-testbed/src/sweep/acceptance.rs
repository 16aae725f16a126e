//! The strict acceptance rules on the automatic choice, one [`Check`] each:
//!
//! - **out of memory** anywhere, profiling included;
//! - **over the request**: the process's high-water mark from the plan on (the simulator's
//!   ground truth through the KV allocation, the engine's graph capture and serving, every
//!   driver call counted) passed the memory the engine asked for, unless the plan warned by
//!   name that it could not bound what went over ([`UNBOUNDED_WARNINGS`]), or by no more than
//!   what its share of the device asks past the same share of the device's real memory where
//!   it named that it took the share of a total nothing checks (`utilization_of_unchecked_total`:
//!   the driver's total read once, nothing read or measured at start-up bounding it from
//!   above, and the runtime reporting more than the device has: the request is then held as
//!   the larger of the two shares, `Outcome::unchecked_total_allowance`, and the oracle
//!   fits its cache in the same request, `crate::oracle::AtPlan::unchecked_total_allowance`, and in
//!   the device's real free memory; out of memory and every other rule take the device's real
//!   memory); and the weaker
//!   earlier rule beside it, **over the request at sampled points** (what the process held
//!   after the KV cache, each warm-up and capture and the serving burst);
//! - **over the request before the plan**: the process's high-water mark from the engine's
//!   start to the plan (the session's start and calibration, its check of the request, the
//!   engine's weights and profile run, the graph phase, the plan step, or the step that ended a
//!   start-up that refused), in each phase, passed both the request and what the engine alone
//!   took at its most in the same step ([`crate::oracle::AloneMarks`], computed by the
//!   oracle's engine alone, no planner code; its captures with [`ATTAINABLE_Z`] standard
//!   deviations of the device's capture-to-capture variation on top, which the same graphs
//!   captured again show): memory the engine's own weights, profile run or graph captures take
//!   past the request is the engine's (the session learns it only by
//!   running them, and an engine alone takes it too), and what the session added on top (its
//!   calibration's leftovers, its probes, its own captures) is memplan's. The session's
//!   allocation probes that measure free memory by the largest allocation that succeeds (where
//!   no reading measures this process) take everything free for an instant: the session says
//!   so by name (`probes_take_free_memory`, with the largest allocation a probe held); a
//!   start for a request below the memory the device held in use before it (part of which may
//!   be the process's own runtime context) says that its checks, up to a named size at once,
//!   may go past the request (`request_below_memory_in_use`); and
//!   memory its own checks left held for good (a runtime that keeps memory of every capture
//!   keeps that of calibration's test capture and of captures torn down after measuring) is
//!   named too (`checks_left_held`), and a share of a total nothing checks is held as above:
//!   a run whose excess those named figures cover is not
//!   failed ([`over_request_before_plan`]); nothing else forgives it (a start-up that refused has no plan,
//!   and the plan's warnings of what it cannot bound are of the engine's memory after it). The
//!   check that allocates what the engine still needs at the last quiet point (the KV cache,
//!   activation and graphs still to capture) is held to the room the request leaves less what
//!   the plan's held figures may read low, in whole pages of the driver's (`memplan_planner`'s
//!   `probe::verify`), and does not pass it. The raw figure (past the request, whoever took
//!   it) is kept beside it (`Outcome::over_request_before_plan`);
//! - **failed after the plan**: the run planned, then the engine's KV allocation, graph
//!   capture or serving failed with an error other than out-of-memory. The errors that path
//!   can raise are the plan's (a block count the engine's layout cannot hold, a capture the
//!   device refuses where the plan counted on graphs, an allocator state the session left
//!   wrong), none the world's: another process that takes memory makes an out-of-memory,
//!   judged as such. The run is judged on what it served too (over the oracle, below the
//!   floor, served below the plan), not as a refusal;
//! - **over the oracle**: more KV tokens than fit, by over 0.5%;
//! - **below the floor**: under 99% of the oracle where the graph memory was measured
//!   (post-capture, full), under 97% where it was bounded or modelled (conservative, sampled),
//!   wherever a reading's tolerance or an allocation probe capped the plan, and where nothing
//!   measured the KV cache's allocation (its rounding bounded, [`floor`]);
//! - **below the floor in memory**: below the floor, and fewer tokens than the largest cache
//!   that fits in 99% (97%) of the oracle's room, by the engine's own arithmetic
//!   ([`crate::oracle::Oracle::floor_tokens`]). An allocator that rounds each KV tensor to
//!   a coarse granule gives the cache in steps of many blocks (20 MiB pages under PyTorch's
//!   expandable segments: a step of 20 MiB per layer), and where the oracle's room ends just
//!   past a step, a plan short of it by a fraction of a percent holds one step less: 1/7 of
//!   the tokens for a cache of seven steps. The floor in tokens counts that run; the floor in
//!   memory counts only a plan that lost more than the floor's share of the memory, which no
//!   granule explains;
//! - **below an attainable floor**: below the floor, where a plan that knew the mean cost of
//!   every graph exactly would have reached it while keeping enough for the engine's own later
//!   captures to stay within the request in 99.9% of them ([`ATTAINABLE_Z`] standard
//!   deviations of their capture-to-capture variation, from the ground truth,
//!   [`crate::oracle::Oracle::jitter_tokens`]). The engine captures its graphs again after the
//!   plan, and a capture that varies from one to the next by more than the floor's share of
//!   the room leaves no plan made before it both within the request and at the floor: such a
//!   run is below the floor by the physics drawn, not by what the plan failed to measure. The
//!   column counts the rest;
//! - **needless refusal**: start-up refused while the oracle holds at least one request of
//!   `max_model_len` tokens after keeping 97% of its blocks, or, for an engine that starts with
//!   a shorter pool and admits shorter requests (SGLang), a pool it starts with
//!   ([`crate::scenario::StartRule`]) (and the engine's own start-up check would not refuse
//!   the request: vLLM's refuses a request above the free memory at the start, SGLang's
//!   none, [`crate::scenario::StartRule::refuses_at_start`]);
//! - **needless refusal within reach**: a needless refusal where the cache of a plan that knew
//!   the mean cost of every graph exactly and kept [`ATTAINABLE_Z`] standard deviations of the
//!   engine's later captures holds such a request too (the room of the attainable floor,
//!   [`crate::oracle::Oracle::jitter_blocks`]). Where the engine's captures vary by more than
//!   the room past one request, a plan that holds the request in 99.9% of them refuses: the
//!   column counts the refusals no such variation explains;
//! - **harness error**: the scenario could not be run, or an oracle could not be computed;
//! - **reserve below the real graph memory** where it was not measured, by more than the margin
//!   of a capture-to-capture variation the plan warned of (`graph_capture_varies`: the reserve
//!   is then earlier captures measured and a margin for their variation, which the engine's
//!   later capture can exceed, and the plan names it, as it names an over-request it cannot
//!   bound);
//! - **served below the plan**: the engine's KV cache holds fewer tokens than the plan
//!   promised, by more than one block beyond what the caching allocator's rounding of the
//!   engine's tensors costs (the blocks the plan's own bytes do not hold once each tensor is
//!   rounded, from the simulator's allocator: a granule coarser than the planner's bound, which
//!   the session measures and shrinks the cache for, warned), or where an engine that sizes its
//!   pool from its own free readings (SGLang) kept what its own rule gives and the plan named
//!   that it could not model those readings (`engine_pool_unmodelled`). Beyond that, the engine's own
//!   page arithmetic took more than the planner's layout said, the plan kept no room for the
//!   rounding of its tensors, or the session shrank the cache by more than its excess. A
//!   layout error in the planner shows here, or as an out-of-memory where the engine sizes
//!   itself.
//!
//! Every failure is counted per group in `docs/strategy-comparison.md`. [`GATING`] lists the
//! checks that fail `cargo xtask ci`, in every group and on every physics.

use memplan_planner::strategy::StrategyKind;

use crate::oracle::Oracle;

use super::Case;

/// Warning codes by which a plan says it could not bound memory it may go over: an over-request
/// under one of them is reported, not failed.
///
/// `device_keeps_memory_on_free`: the device keeps part of every raw allocation freed (seen by
/// calibration's allocate/free pairs, or the session's own windows where nothing calibrated);
/// the plan keeps room for the frees the start-up itself makes after its last reading, but each
/// free the engine makes while serving (an allocator releasing its cache, a library freeing a
/// workspace) takes that much more for good, and how many it makes is the engine's, decided
/// after the plan: no plan made before serving can bound it.
pub const UNBOUNDED_WARNINGS: [&str; 4] = [
    "other_processes_unseen",
    "graph_memory_not_reserved",
    "graph_capture_varies",
    "device_keeps_memory_on_free",
];

/// Share of the oracle a plan whose graph memory was measured must reach.
pub const MEASURED_FLOOR: f64 = 0.99;
/// Share of the oracle a plan whose graph memory (or physical room) was bounded must reach.
pub const BOUNDED_FLOOR: f64 = 0.97;
/// Standard deviations of the engine's later graph capture an ideal plan keeps (the one-sided
/// 99.9% quantile of a normal distribution: the sum of many graphs' independent variations is
/// near normal) when the test-bed asks whether a floor was attainable at all
/// ([`Check::BelowAttainableFloor`]). Generous to the plan: one that holds the request in 99.9%
/// of captures would still fail about one run in a thousand of those that vary, where the
/// sweep gates on none.
pub const ATTAINABLE_Z: f64 = 3.09;
/// Most a plan may exceed the oracle by.
pub const OVER_ORACLE: f64 = 1.005;

/// One acceptance rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// Ran out of memory (profiling included).
    OutOfMemory,
    /// The process's high-water mark from the plan on passed the request without a warning
    /// that names why.
    OverRequest,
    /// Past the request at a sampled point (after the KV cache, each warm-up and capture, the
    /// serving burst) without a warning that names why.
    OverRequestSampled,
    /// The process's high-water mark before the plan (the session's start and calibration,
    /// the engine's weights and profile run, the graph phase, the plan) passed both the
    /// request and what the engine alone took in the same step, without a warning that names
    /// why ([`over_request_before_plan`]).
    OverRequestBeforePlan,
    /// Planned, then failed in the engine's KV allocation, graph capture or serving with an
    /// error other than out-of-memory (see the module docs).
    FailedAfterPlan,
    /// More than the oracle by over 0.5%.
    OverOracle,
    /// Below the share floor.
    BelowFloor,
    /// Below the share floor, and below it judged in memory (see the module docs).
    BelowFloorInMemory,
    /// Below the share floor where a plan keeping only the margin the engine's own capture
    /// variation needs would have reached it (see the module docs).
    BelowAttainableFloor,
    /// Refused where the oracle shows room.
    NeedlessRefusal,
    /// Refused where the oracle shows room even after keeping the margin the engine's own
    /// capture variation needs (see the module docs).
    NeedlessRefusalWithinReach,
    /// The harness could not run or judge the scenario.
    HarnessError,
    /// An unmeasured graph reserve below the real graph memory.
    ReserveBelowReal,
    /// The engine's KV cache holds fewer tokens than the plan promised (by over one block).
    ServedBelowPlan,
    /// Ran out of memory after the plan only because other processes took memory after it
    /// (`Outcome::oom_others_after_plan`): the same run with the others as they were at the
    /// plan did not. The deployment's overcommit, which no plan made at start-up can see:
    /// reported as its own outcome, not gating, never a success. Not in [`Check::ALL`] (the
    /// sweep's table): no generated scenario has a change after the plan.
    OutOfMemoryOthersAfterPlan,
}

impl Check {
    /// Every check, in report order.
    pub const ALL: [Check; 14] = [
        Check::OutOfMemory,
        Check::OverRequest,
        Check::OverRequestSampled,
        Check::OverRequestBeforePlan,
        Check::FailedAfterPlan,
        Check::OverOracle,
        Check::BelowFloor,
        Check::BelowFloorInMemory,
        Check::BelowAttainableFloor,
        Check::NeedlessRefusal,
        Check::NeedlessRefusalWithinReach,
        Check::HarnessError,
        Check::ReserveBelowReal,
        Check::ServedBelowPlan,
    ];

    /// Column name in the comparison.
    pub fn name(self) -> &'static str {
        match self {
            Check::OutOfMemory => "out of memory",
            Check::OverRequest => "unwarned over request (high-water mark)",
            Check::OverRequestSampled => "unwarned over request at sampled points",
            Check::OverRequestBeforePlan => "unwarned over request before the plan",
            Check::FailedAfterPlan => "failed after the plan",
            Check::OverOracle => "over the oracle",
            Check::BelowFloor => "below the floor",
            Check::BelowFloorInMemory => "below the floor in memory",
            Check::BelowAttainableFloor => "below an attainable floor",
            Check::NeedlessRefusal => "needless refusal",
            Check::NeedlessRefusalWithinReach => "needless refusal within reach",
            Check::HarnessError => "harness error",
            Check::ReserveBelowReal => "reserve below real",
            Check::ServedBelowPlan => "served below the plan",
            Check::OutOfMemoryOthersAfterPlan => {
                "out of memory others took after the plan (not the plan's)"
            }
        }
    }
}

/// The checks that fail `cargo xtask ci` when any case fails them: every check the automatic
/// choice passes on every case of the sweep, so that a change that brings one back fails CI.
/// Below the floor and needless refusals (within reach or not) are reported, not gating: their
/// counts are not zero (see `docs/strategy-comparison.md`). Over the request gates on the
/// high-water mark (every driver call from the plan on) and on the earlier, weaker sampled rule.
/// Before the plan, what memplan's session took past the request and the engine's own steps
/// ([`over_request_before_plan`]) gates too: the session's own steps are held to what the
/// request leaves (its warm-ups that narrow the allocator's granule, for an engine whose KV
/// allocation nothing measures, forward passes that can take more per token than the
/// engine's profile run did, among them). A plan the engine could not serve gates.
pub const GATING: [Check; 9] = [
    Check::OutOfMemory,
    Check::OverRequest,
    Check::OverRequestSampled,
    Check::OverRequestBeforePlan,
    Check::FailedAfterPlan,
    Check::OverOracle,
    Check::HarnessError,
    Check::ReserveBelowReal,
    Check::ServedBelowPlan,
];

/// One failed check of one case.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// The case.
    pub case: &'a Case,
    /// The rule.
    pub check: Check,
    /// What happened.
    pub line: String,
}

/// Whether an over-request is covered by a warning that names what could not be bounded.
pub fn over_request_warned(c: &Case) -> bool {
    c.out.plan.as_ref().is_some_and(|p| {
        p.warnings.iter().any(|w| {
            let code = w.to_json()["code"].as_str().unwrap_or_default().to_string();
            UNBOUNDED_WARNINGS.contains(&code.as_str())
        })
    })
}

/// What memplan's session took past the request before the plan, unwarned: the process's
/// high-water mark before the plan above the larger of the request and what the engine alone
/// held at its most in the same step (`Outcome::own_over_request_before_plan`: the engine's
/// weights, profile run and graph captures past the request are the engine's, the oracle's
/// engine alone takes them too), at its most, and the first phase it did so in; `None` where
/// the session took nothing past them, or where what it said by name it put on top of the
/// engine covers all it went past them by: its allocation probes, which take what is free
/// (`probes_take_free_memory`, with the largest allocation one held), and memory its own
/// checks left held for good (`checks_left_held`: calibration's test capture and captures
/// torn down after measuring, on a runtime that keeps memory of every capture; as measured,
/// with the free reading's window error it names for each window that measured it), and where
/// the plan took its share of a total nothing checks (`utilization_of_unchecked_total`), what
/// that share of the runtime's total asks past the same share of the real total
/// (`Outcome::unchecked_total_allowance`). No other warning forgives it: the plan's warnings of what it cannot bound
/// ([`UNBOUNDED_WARNINGS`]) are of the engine's memory after the plan, and a start-up that
/// refused has no plan.
pub fn over_request_before_plan(c: &Case) -> Option<(u64, &'static str)> {
    let (b, phase) = c.out.own_over_request_before_plan?;
    let named = c
        .out
        .probes_named
        .unwrap_or(0)
        .saturating_add(c.out.checks_left_held.unwrap_or(0))
        .saturating_add(c.out.unchecked_total_allowance.unwrap_or(0));
    (b > named).then_some((b, phase))
}

/// The margin the plan kept for the variation of the same graph captured again, where it warned
/// that the engine's later capture can still exceed it (`graph_capture_varies`): its reserve is
/// then earlier captures measured and that margin, and the plan names the risk.
pub fn warned_capture_margin(c: &Case) -> Option<u64> {
    c.out.plan.as_ref().and_then(|p| {
        p.warnings.iter().find_map(|w| match w {
            memplan_planner::Warning::GraphCaptureVaries { margin, .. } => Some(*margin),
            _ => None,
        })
    })
}

/// The floor a plan is held to: measured graph memory 99%; bounded or modelled graph memory,
/// a plan capped by a reading's tolerance or an allocation probe, one whose memory outside
/// the allocator no reading measured (a bound, or allocation probes within their
/// resolution), or one whose KV cache's allocation nothing measured (the allocator's rounding
/// of its tensors bounded from the engine's own allocations, `kv_allocation_unmeasured`), 97%;
/// eager plans 99% (nothing to estimate).
pub fn floor(c: &Case) -> f64 {
    let unmeasured_kv = c
        .out
        .kv_warnings
        .iter()
        .any(|w| w == "kv_allocation_unmeasured");
    let bounded = c.out.plan.as_ref().is_some_and(|p| {
        let unread = p
            .consumers
            .get(memplan_planner::plan::ConsumerKind::NonAllocator)
            .is_some_and(|n| match &n.provenance {
                memplan_planner::plan::Provenance::Measured { step, .. } => {
                    step == "allocation probes"
                }
                _ => true,
            });
        (p.physical_check.is_some() && p.capped_by_free_bytes.is_some()) || unread
    }) || unmeasured_kv;
    match c.out.strategy {
        _ if bounded => BOUNDED_FLOOR,
        StrategyKind::PostCapture | StrategyKind::Full | StrategyKind::None => MEASURED_FLOOR,
        _ => BOUNDED_FLOOR,
    }
}

/// Tokens the engine's KV cache holds below what the plan promised, where that is more than
/// one block (the rounding either side may do) beyond what the caching allocator's rounding
/// of the engine's tensors costs (`Outcome::kv_rounding_tokens`: a measured allocation gives
/// that back, warned); `None` when it holds as much. An engine that sizes its pool from its own
/// free readings keeps no more than its rule gives (`Outcome::engine_pool_tokens`): where that
/// is what it served and the plan said by name that it could not model those readings
/// (`engine_pool_unmodelled`: calibration found them not following this process's
/// allocations), the engine's own rule, not the plan, kept the tokens, and the plan named it.
pub fn served_below_plan(c: &Case) -> Option<u64> {
    let o = &c.out;
    let (planned, served) = (o.planned_tokens?, o.kv_tokens?);
    let named = o.plan.as_ref().is_some_and(|p| {
        p.warnings
            .iter()
            .any(|w| matches!(w, memplan_planner::Warning::EnginePoolUnmodelled { .. }))
    });
    if named && o.engine_pool_tokens == Some(served) {
        return None;
    }
    let block = c
        .setup
        .as_deref()
        .map_or(1, |s| u64::from(s.scenario.kv.block_size.max(1)));
    let short = planned.saturating_sub(served);
    (short > block.saturating_add(o.kv_rounding_tokens.unwrap_or(0))).then_some(short)
}

/// Every failed check of the automatic choice.
pub fn failures(cases: &[Case]) -> Vec<Failure<'_>> {
    let mut f = Vec::new();
    for c in cases.iter().filter(|c| c.out.auto) {
        let o = &c.out;
        let physics = if c.adversarial { " adversarial" } else { "" };
        let id = format!("{} [{}{physics}] auto={}", c.group, c.what, o.strategy);
        let mut fail = |check: Check, line: String| {
            f.push(Failure {
                case: c,
                check,
                line: format!("{id}: {line}"),
            })
        };
        if c.harness_error {
            fail(Check::HarnessError, o.failed.clone().unwrap_or_default());
            continue;
        }
        if let Some(e) = &o.oracle_error {
            fail(Check::HarnessError, format!("no oracle: {e}"));
        }
        if let Some(e) = &o.oom {
            fail(Check::OutOfMemory, format!("ran out of memory: {e}"));
        }
        if let Some(e) = &o.oom_others_after_plan {
            fail(
                Check::OutOfMemoryOthersAfterPlan,
                format!("ran out of memory other processes took after the plan (the run beside them as they were at the plan did not): {e}"),
            );
        }
        let allowed = o.unchecked_total_allowance.unwrap_or(0);
        if let Some(b) = o.over_request_sampled_bytes.filter(|b| *b > allowed) {
            if !over_request_warned(c) {
                fail(
                    Check::OverRequestSampled,
                    format!(
                        "held {} ({b} B) past the request at a sampled point, no warning names why",
                        memplan_core::bytes::fmt_bytes(b)
                    ),
                );
            }
        }
        if let Some(b) = o.over_request_bytes.filter(|b| *b > allowed) {
            if !over_request_warned(c) {
                fail(
                    Check::OverRequest,
                    format!(
                        "high-water mark {} ({b} B) past the request, first in {}, no warning names why",
                        memplan_core::bytes::fmt_bytes(b),
                        o.over_request_phase.as_deref().unwrap_or("an unmarked phase")
                    ),
                );
            }
        }
        if let Some((b, phase)) = over_request_before_plan(c) {
            let peaks: Vec<String> = o
                .phase_peaks
                .iter()
                .map(|(p, b)| format!("{p} {b}"))
                .collect();
            let (all, _) = o.over_request_before_plan.unwrap_or((b, phase));
            let probes = match (o.probes_named, o.checks_left_held) {
                (None, None) => "no warning names why".to_string(),
                (p, h) => format!(
                    "more than the {} its probes held and the {} its checks left held, named",
                    memplan_core::bytes::fmt_bytes(p.unwrap_or(0)),
                    memplan_core::bytes::fmt_bytes(h.unwrap_or(0))
                ),
            };
            fail(
                Check::OverRequestBeforePlan,
                format!(
                    "high-water mark {} ({b} B) past the request and the engine's own steps before the plan, first in {phase} ({} past the request in all), {probes} (peaks: {})",
                    memplan_core::bytes::fmt_bytes(b),
                    memplan_core::bytes::fmt_bytes(all),
                    peaks.join("; ")
                ),
            );
        }
        if let (Some(e), Some(_)) = (&o.failed, &o.plan) {
            // The engine could not serve the plan: a failure of the plan, judged on what it
            // served as well (no refusal: the plan was made).
            fail(Check::FailedAfterPlan, format!("planned, then failed: {e}"));
        } else if let Some(e) = &o.failed {
            let room = o
                .oracle
                .zip(c.setup.as_deref())
                .is_some_and(|(r, s)| r.has_room(s, BOUNDED_FLOOR));
            if room {
                fail(
                    Check::NeedlessRefusal,
                    format!(
                        "refused while the oracle holds {} tokens: {e}",
                        o.oracle_tokens.unwrap_or(0)
                    ),
                );
                if let (Some(r), Some(s)) = (o.oracle, c.setup.as_deref()) {
                    let reach = Oracle {
                        blocks: r.jitter_blocks,
                        ..r
                    };
                    if reach.has_room(s, BOUNDED_FLOOR) {
                        fail(
                            Check::NeedlessRefusalWithinReach,
                            format!(
                                "refused while a plan keeping only the engine's capture variation holds {} tokens: {e}",
                                r.jitter_tokens
                            ),
                        );
                    }
                }
            }
            continue;
        }
        if o.oom.is_some() {
            continue;
        }
        if let Some(short) = served_below_plan(c) {
            let named = if o.kv_warnings.is_empty() {
                "no warning".to_string()
            } else {
                format!("warned {}", o.kv_warnings.join(", "))
            };
            fail(
                Check::ServedBelowPlan,
                format!(
                    "the engine's KV cache holds {short} tokens fewer than the plan's {} ({named})",
                    o.planned_tokens.unwrap_or(0)
                ),
            );
        }
        if let Some(x) = o.kv_vs_oracle {
            let fl = floor(c);
            if x < fl {
                fail(
                    Check::BelowFloor,
                    format!("{:.2}% of the oracle (< {:.0}%)", x * 100.0, fl * 100.0),
                );
            }
            let in_memory = o.oracle.map(|r| r.floor_tokens.at(fl));
            if let (Some(served), Some(least)) = (o.kv_tokens, in_memory) {
                if x < fl && served < least {
                    fail(
                        Check::BelowFloorInMemory,
                        format!(
                            "{served} tokens, fewer than the {least} of {:.0}% of the oracle's room ({:.2}% of its tokens)",
                            fl * 100.0,
                            x * 100.0
                        ),
                    );
                }
            }
            if let Some(r) = o.oracle {
                let attainable = r.jitter_tokens as f64 >= fl * r.tokens as f64;
                if x < fl && attainable {
                    fail(
                        Check::BelowAttainableFloor,
                        format!(
                            "{:.2}% of the oracle, where {:.2}% was within reach of the engine's capture variation",
                            x * 100.0,
                            r.jitter_tokens as f64 * 100.0 / r.tokens.max(1) as f64
                        ),
                    );
                }
            }
            if x > OVER_ORACLE {
                fail(
                    Check::OverOracle,
                    format!("{:.2}% of the oracle (more than fits)", x * 100.0),
                );
            }
        } else if o.kv_tokens.is_some_and(|k| k > 0) && o.oracle_tokens == Some(0) {
            fail(
                Check::OverOracle,
                "a KV cache where the oracle fits none".to_string(),
            );
        }
        if !o.graph_measured() && o.strategy != StrategyKind::None {
            if let (Some(est), Some(real)) = (o.estimate, o.real_graph) {
                // A shortfall within the margin of a variation the plan named (the later
                // capture varied by up to twice what the plan kept, about its measured mean)
                // is that variation, reported like an over-request under the same warning.
                let named = warned_capture_margin(c).unwrap_or(0);
                if est.saturating_add(named) < real {
                    fail(
                        Check::ReserveBelowReal,
                        format!("unmeasured reserve {est} below the real {real}"),
                    );
                }
            }
        }
    }
    f
}

/// The failures that fail the sweep ([`GATING`]), in every group and on every physics (an
/// engine whose KV allocation nothing measures included: its plan keeps room for the coarsest
/// rounding the engine's own allocations allow, `kv_allocation_unmeasured`).
pub fn gating<'a>(all: &'a [Failure<'a>]) -> Vec<&'a Failure<'a>> {
    all.iter().filter(|f| GATING.contains(&f.check)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Outcome;
    use crate::run::Choice;
    use memplan_core::bytes::{GIB, MIB};

    /// A start-up refused in `phase`, its process `all` past the request there, `own` of it
    /// past what the engine alone took in that step too; its probes named with `probes`.
    fn refused(all: u64, own: Option<u64>, probes: Option<u64>, phase: &'static str) -> Case {
        let mut out = Outcome::new(Choice::Auto);
        out.failed = Some("start-up refused: no room for the KV cache".into());
        out.over_request_before_plan = Some((all, phase));
        out.own_over_request_before_plan = own.map(|b| (b, phase));
        out.probes_named = probes;
        out.ended_in = Some(phase);
        Case {
            group: "test".into(),
            what: "refused".into(),
            out,
            harness_error: false,
            setup: None,
            adversarial: false,
        }
    }

    fn over_before_plan(c: &Case) -> Vec<String> {
        failures(std::slice::from_ref(c))
            .into_iter()
            .filter(|f| f.check == Check::OverRequestBeforePlan)
            .map(|f| f.line)
            .collect()
    }

    #[test]
    fn the_engines_own_weights_past_the_request_are_not_memplans() {
        // The engine's weights took 5 GiB more than the request, as they do alone: the run
        // refused, and nothing memplan's session added went past the request.
        let c = refused(5 * GIB, None, None, "the engine's weights");
        assert!(over_before_plan(&c).is_empty());
    }

    #[test]
    fn what_the_session_added_past_the_request_and_the_engine_gates() {
        // The engine's captures went 2 GiB past the request, as alone; the session's own
        // leftovers 24 MiB beyond that, no warning names them.
        let c = refused(2 * GIB + 24 * MIB, Some(24 * MIB), None, "the graph phase");
        let lines = over_before_plan(&c);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("first in the graph phase"), "{lines:?}");
        // It fails the sweep: the session's own steps are held to the request.
        let all = failures(std::slice::from_ref(&c));
        assert!(
            gating(&all)
                .iter()
                .any(|f| f.check == Check::OverRequestBeforePlan),
            "{all:?}"
        );
    }

    #[test]
    fn a_named_probe_forgives_only_what_it_covers() {
        // The session's probes took what was free, said by name with the largest they held.
        let covered = refused(
            GIB,
            Some(GIB),
            Some(8 * GIB),
            "the session's start (calibration)",
        );
        assert!(over_before_plan(&covered).is_empty());
        // A probe of 1 MiB does not explain 1 GiB past the request.
        let beyond = refused(
            GIB,
            Some(GIB),
            Some(MIB),
            "the session's start (calibration)",
        );
        assert_eq!(over_before_plan(&beyond).len(), 1);
    }

    #[test]
    fn memory_the_sessions_checks_left_held_forgives_only_up_to_its_figure() {
        let mut c = refused(30 * MIB, Some(24 * MIB), None, "the engine's weights");
        c.out.checks_left_held = Some(24 * MIB);
        assert!(over_before_plan(&c).is_empty());
        c.out.checks_left_held = Some(20 * MIB);
        assert_eq!(over_before_plan(&c).len(), 1);
    }

    #[test]
    fn a_planned_runs_warning_of_what_it_cannot_bound_after_the_plan_does_not_forgive_it() {
        // A plan that warns of other processes it cannot see is judged the same: what the
        // session took before the plan is its own.
        let mut c = refused(3 * MIB, Some(3 * MIB), None, "the plan");
        c.out.failed = None;
        c.out.ended_in = None;
        let mut p = memplan_planner::plan::PlanBuilder::new(
            80 * GIB,
            memplan_planner::budget::Request::Utilization(0.9),
            memplan_core::kv::KvSpec::new(
                vec![memplan_core::kv::LayerGroup::new(
                    memplan_core::kv::AttentionKind::Full,
                    2,
                    2,
                    64,
                )],
                memplan_core::kv::KvDtype::Bf16,
                16,
            ),
            memplan_core::kv::KvLimits::new(16, 64),
        )
        .build()
        .expect("a plan");
        p.warnings
            .push(memplan_planner::Warning::OtherProcessesUnseen {
                free_reading: "stale".into(),
                device_wide: "none".into(),
            });
        c.out.plan = Some(p);
        assert!(over_request_warned(&c));
        assert_eq!(over_before_plan(&c).len(), 1);
    }
}
