//! The floor judged in memory: a run is below it only where it is below the floor in tokens
//! and holds less than the largest cache that fits in the floor's share of the oracle's room.
//! An allocator that rounds each KV tensor to a coarse granule gives the cache in steps of
//! many blocks, so a plan a fraction of a percent short of a room that ends just past a step
//! holds a whole step less: the floor in tokens counts that run, the floor in memory does not.

use std::sync::Arc;

use memplan_testbed::oracle::engine_alone;
use memplan_testbed::run::{open, run_judged, Choice};
use memplan_testbed::sweep::acceptance::{failures, gating, Check, MEASURED_FLOOR};
use memplan_testbed::sweep::{seeded, Case};
use memplan_testbed::{Scenario, Setup};

fn case(setup: &Setup) -> Case {
    let alone = engine_alone(setup).ok();
    assert!(alone.is_some(), "the oracle runs");
    let out = run_judged(setup, Choice::Auto, None, alone).unwrap();
    Case {
        group: "floor".into(),
        what: format!("seed {}", setup.seed),
        out,
        harness_error: false,
        setup: Some(Arc::new(setup.clone())),
        adversarial: open(setup).is_ok_and(|g| g.physics().adversarial),
    }
}

fn checks_when_served(c: &Case, tokens: u64) -> Vec<Check> {
    let mut c = c.clone();
    c.out.kv_tokens = Some(tokens);
    c.out.planned_tokens = Some(tokens);
    let oracle = c.out.oracle.expect("an oracle").tokens;
    c.out.kv_vs_oracle = Some(tokens as f64 / oracle as f64);
    let cases = [c];
    failures(&cases).iter().map(|f| f.check).collect()
}

/// A scenario whose run is judged; `physics`: the simulator's pinned extremes, if any.
fn judged(physics: Option<&str>, seed: u64) -> Case {
    judged_in("process-local-24g", physics, seed)
}

/// [`judged`] on a shipped scenario named `name`.
fn judged_in(name: &str, physics: Option<&str>, seed: u64) -> Case {
    let mut s = seeded(Scenario::load(name).unwrap().resolve().unwrap(), seed);
    s.physics = physics.map(str::to_string);
    case(&s)
}

#[test]
fn calibration_leaves_nothing_a_later_trim_gives_back() {
    // A runtime that frees a destroyed graph's memory some synchronizes later (adversarial
    // seed 310 draws two): calibration's test graph left 32 MiB reserved in the graph pool
    // where the pool was trimmed before those synchronizes. It was counted as the engine's,
    // then came back in the graph phase as another process's release: the plan kept 32 MiB
    // too much and lost a whole step of the coarsely rounded KV cache (85.7% of the oracle).
    let c = judged(None, 310);
    assert!(c.out.kv_vs_oracle.is_some_and(|x| x >= 0.99), "{:?}", c.out);
    let cases = [c];
    assert!(failures(&cases).is_empty(), "{:?}", failures(&cases));
}

#[test]
fn the_reading_before_calibration_is_as_narrow_as_the_sessions() {
    // A free reading whose single reads are off by up to 11 MB (adversarial seeds of a
    // declared-exact ROCm 6.2 card): the calibration step's window, from a single read before
    // calibration to the session's combined baseline, carried that whole error into the
    // engine's memory, where the strategies' margins (sized for combined reads) do not cover
    // it; the post-capture plan then went 0.2-2.5 MiB past the request in serving.
    for seed in [24, 44, 333] {
        let cases = [judged_in("deferred-release-24g", None, seed)];
        let all = failures(&cases);
        assert!(gating(&all).is_empty(), "seed {seed}: {all:?}");
    }
}

#[test]
fn the_floor_in_memory_is_within_the_oracle_and_ordered() {
    for (physics, seed) in [(None, 1), (Some("high"), 2), (Some("high"), 3)] {
        let c = judged(physics, seed);
        let o = c.out.oracle.expect("an oracle");
        assert!(o.room > 0, "{o:?}");
        assert!(o.floor_tokens.bounded <= o.floor_tokens.measured, "{o:?}");
        assert!(o.floor_tokens.measured <= o.tokens, "{o:?}");
    }
}

#[test]
fn on_the_documented_allocator_the_floor_in_memory_is_the_floor_in_tokens() {
    // PyTorch's 2 MiB rounding: a step of 2 MiB per layer, far under 1% of the room, so 99%
    // of the room holds 99% of the tokens, to within a step.
    let c = judged(None, 1);
    let o = c.out.oracle.expect("an oracle");
    let in_tokens = o.tokens as f64 * MEASURED_FLOOR;
    let step = 2.0 * (1u64 << 20) as f64 / o.room as f64 * o.tokens as f64 * 28.0;
    let diff = (o.floor_tokens.measured as f64 - in_tokens).abs();
    assert!(
        diff <= step + 16.0,
        "{} tokens in 99% of the room, {in_tokens:.0} at 99% of the tokens (step {step:.0})",
        o.floor_tokens.measured
    );
}

#[test]
fn a_run_below_both_floors_fails_and_a_run_at_the_floor_in_memory_does_not() {
    for (physics, seed) in [(None, 1), (Some("high"), 2), (Some("high"), 3)] {
        let c = judged(physics, seed);
        let o = c.out.oracle.expect("an oracle");
        let least = o.floor_tokens.measured;
        let at = checks_when_served(&c, least);
        assert!(!at.contains(&Check::BelowFloorInMemory), "{at:?}");
        // One block fewer than what 99% of the room holds, and below 99% of the tokens too.
        let fewer = least
            .saturating_sub(16)
            .min((o.tokens as f64 * 0.98) as u64);
        let below = checks_when_served(&c, fewer);
        assert!(below.contains(&Check::BelowFloor), "{below:?}");
        assert!(below.contains(&Check::BelowFloorInMemory), "{below:?}");
        // Above 99% of the tokens: neither floor, whatever the memory says.
        let near = checks_when_served(&c, (o.tokens as f64 * 0.995).ceil() as u64);
        assert!(!near.contains(&Check::BelowFloor), "{near:?}");
        assert!(!near.contains(&Check::BelowFloorInMemory), "{near:?}");
    }
}

/// A run that planned, then failed in the engine's KV allocation, graph capture or serving with
/// an error other than out-of-memory, is a failure of the plan (gating), and is judged on what
/// it served: more tokens than the oracle holds is over the oracle there too. Before, it was
/// judged as a refusal (the needless-refusal check only) and its other checks were skipped.
/// A run that failed with no plan stays a refusal.
#[test]
fn a_plan_the_engine_could_not_serve_is_judged_on_what_it_served() {
    let c = judged(None, 1);
    let mut failed = c.clone();
    failed.out.failed = Some("the engine's layout cannot hold the plan's blocks".into());
    let oracle = failed.out.oracle.expect("an oracle").tokens;
    let over = oracle + oracle / 50;
    failed.out.kv_tokens = Some(over);
    failed.out.planned_tokens = Some(over);
    failed.out.kv_vs_oracle = Some(over as f64 / oracle as f64);
    let cases = [failed];
    let all = failures(&cases);
    let checks: Vec<Check> = all.iter().map(|f| f.check).collect();
    assert!(checks.contains(&Check::FailedAfterPlan), "{checks:?}");
    assert!(checks.contains(&Check::OverOracle), "{checks:?}");
    assert!(!checks.contains(&Check::NeedlessRefusal), "{checks:?}");
    assert!(
        gating(&all)
            .iter()
            .any(|f| f.check == Check::FailedAfterPlan),
        "{all:?}"
    );
    // The same failure with no plan is a refusal: judged by the oracle's room only.
    let mut refused = c;
    refused.out.plan = None;
    refused.out.failed = Some("start-up refused".into());
    let cases = [refused];
    let checks: Vec<Check> = failures(&cases).iter().map(|f| f.check).collect();
    assert!(!checks.contains(&Check::FailedAfterPlan), "{checks:?}");
    assert!(checks.contains(&Check::NeedlessRefusal), "{checks:?}");
}

/// The attainable floor: where the engine's own later captures vary by more than the floor's
/// share of the room, no plan made before them reaches the floor and stays within the request,
/// and a run below the floor there is not counted as below an attainable floor; where nothing
/// varies, every run below the floor is.
#[test]
fn a_run_below_the_floor_is_attainable_only_where_the_capture_variation_leaves_room() {
    let steady = judged(Some("nominal"), 1);
    let o = steady.out.oracle.expect("an oracle");
    assert_eq!(o.jitter_tokens, o.tokens, "no capture variation: {o:?}");
    let below = checks_when_served(&steady, (o.tokens as f64 * 0.98) as u64);
    assert!(below.contains(&Check::BelowFloor), "{below:?}");
    assert!(below.contains(&Check::BelowAttainableFloor), "{below:?}");

    // Adversarial physics whose executable objects vary by 5% either way from capture to
    // capture, on an allocator that rounds each KV tensor to a coarse granule: the oracle's room
    // ends at a step, and keeping 3.09 standard deviations of the 35 graphs' variation (27 MB)
    // leaves the cache a whole step (6% of the tokens) below it.
    let varies = judged(None, 79);
    let o = varies.out.oracle.expect("an oracle");
    assert!(
        (o.jitter_tokens as f64) < o.tokens as f64 * MEASURED_FLOOR,
        "the variation leaves the floor out of reach: {o:?}"
    );
    let below = checks_when_served(&varies, (o.tokens as f64 * 0.98) as u64);
    assert!(below.contains(&Check::BelowFloor), "{below:?}");
    assert!(!below.contains(&Check::BelowAttainableFloor), "{below:?}");
    // Still within reach at the tokens the variation leaves: short of them, it counts.
    let short = checks_when_served(&varies, o.jitter_tokens.saturating_sub(1));
    assert!(short.contains(&Check::BelowFloor), "{short:?}");
}

/// A refusal where the oracle holds a request is needless; it is within reach only where the
/// cache of a plan that kept the engine's own capture variation (the attainable floor's) holds
/// the request too.
#[test]
fn a_needless_refusal_is_within_reach_only_where_the_capture_variation_leaves_a_request() {
    let steady = judged(Some("nominal"), 1);
    let refused = |c: &Case| {
        let mut c = c.clone();
        // A refusal comes with no plan (a plan the engine then failed to serve is no refusal).
        c.out.plan = None;
        c.out.failed = Some("start-up refused".into());
        c
    };
    let checks = |c: Case| {
        let cases = [c];
        failures(&cases).iter().map(|f| f.check).collect::<Vec<_>>()
    };
    let all = checks(refused(&steady));
    assert!(all.contains(&Check::NeedlessRefusal), "{all:?}");
    assert!(all.contains(&Check::NeedlessRefusalWithinReach), "{all:?}");
    // The same refusal where the capture variation leaves the attainable cache a single block:
    // needless by the oracle, yet no plan that holds the request in 99.9% of the engine's
    // captures would start.
    let mut varies = refused(&steady);
    let o = varies.out.oracle.as_mut().expect("an oracle");
    o.jitter_blocks = 1;
    o.jitter_tokens = 0;
    let some = checks(varies);
    assert!(some.contains(&Check::NeedlessRefusal), "{some:?}");
    assert!(
        !some.contains(&Check::NeedlessRefusalWithinReach),
        "{some:?}"
    );
}
