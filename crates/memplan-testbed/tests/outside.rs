//! Scenario files written outside the test-bed's generator (`tests/outside/*.toml`): other
//! devices, models and quirks than the shipped scenarios and the sweep's generated ones. Each
//! runs with the automatic choice the way the sweep runs a case, on the seeds listed (among
//! them those whose physics once broke a rule), and is judged by the sweep's own acceptance
//! rules: no gating failure ([`acceptance::GATING`]), and no needless refusal.

use std::sync::Arc;

use memplan_planner::strategy::StrategyKind;
use memplan_testbed::oracle::engine_alone;
use memplan_testbed::run::{open, run_judged, Choice};
use memplan_testbed::scenario::Scenario;
use memplan_testbed::sweep::acceptance::{self, Check};
use memplan_testbed::sweep::{judge, seeded, Case};
use memplan_testbed::Setup;

/// The automatic choice on `setup`, judged against the engine alone as the sweep judges it.
fn judged(group: &str, what: String, setup: Setup) -> Case {
    let c = judge(group, &what, &setup, &[Choice::Auto])
        .pop()
        .expect("one case per choice");
    assert!(!c.harness_error, "{group} {what}: {:?}", c.out.failed);
    c
}

/// The cases of `file` on `seeds`, with `edit` applied to the resolved setup (what the format
/// does not write).
fn cases_with(file: &str, seeds: &[u64], edit: impl Fn(&mut Setup)) -> Vec<Case> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/outside")
        .join(file);
    let mut setup = Scenario::load(path.to_str().unwrap())
        .and_then(Scenario::resolve)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    edit(&mut setup);
    seeds
        .iter()
        .map(|seed| judged(file, format!("seed={seed}"), seeded(setup.clone(), *seed)))
        .collect()
}

fn passes(file: &str, seeds: &[u64]) -> Vec<Case> {
    passes_with(file, seeds, |_| {})
}

/// As [`passes`], with `edit` applied to the resolved setup.
fn passes_with(file: &str, seeds: &[u64], edit: impl Fn(&mut Setup)) -> Vec<Case> {
    let cases = cases_with(file, seeds, edit);
    let all = acceptance::failures(&cases);
    let failed: Vec<&str> = all
        .iter()
        .filter(|f| acceptance::GATING.contains(&f.check) || f.check == Check::NeedlessRefusal)
        .map(|f| f.line.as_str())
        .collect();
    assert!(failed.is_empty(), "{file}:\n{}", failed.join("\n"));
    cases
}

/// As [`passes`], each run planned eagerly (the graph phase's strategy `none`).
fn passes_eagerly(file: &str, seeds: &[u64]) {
    let cases = passes(file, seeds);
    assert!(cases
        .iter()
        .all(|c| c.out.strategy == memplan_planner::strategy::StrategyKind::None));
}

/// Assert that the KV cache `c` was handed came with `kv_allocation_unmeasured`: nothing
/// measured the engine's allocation of it.
fn assert_kv_unmeasured(c: &Case) {
    assert!(
        c.out
            .kv_warnings
            .iter()
            .any(|w| w == "kv_allocation_unmeasured"),
        "{}: {:?}",
        c.what,
        c.out.kv_warnings
    );
}

/// Assert that `c` has a plan with a warning `warned` picks out (its code, its figures),
/// naming the run and the plan's warnings where it has none.
fn assert_warns(c: &Case, warned: impl Fn(&memplan_planner::Warning) -> bool) {
    let plan = c.out.plan.as_ref().expect("a plan");
    assert!(
        plan.warnings.iter().any(warned),
        "{}: {:?}",
        c.what,
        plan.warnings
    );
}

/// A free reading calibration finds unusable on a device that captures graphs: the graph memory
/// is bounded, not measured. On adversarial physics an executable object may take far more per
/// kernel node than any analytic bound assumes (these seeds once ran out of memory or went
/// over the request by up to 6 GiB): allocation probes around the captures measure what they
/// hold, and around the phase what its teardown did not give back.
#[test]
fn stale_free_reading_bounds_graphs_by_probes() {
    let cases = passes(
        "stale-free-h100.toml",
        &[10, 12, 118, 122, 148, 176, 255, 296],
    );
    assert!(cases
        .iter()
        .all(|c| c.out.strategy == memplan_planner::strategy::StrategyKind::Conservative));
    // The probes measured the graphs: the margin is their capture-to-capture variation, not a
    // quarter of them (a quarter left 78-80% of the oracle on seeds 10, 12 and 176). Seed 10's
    // executable objects vary by 22% either way from one capture to the next (232 MB over its
    // 35 graphs, one standard deviation): its margin keeps it at 96.6%.
    for c in &cases {
        let x = c.out.kv_vs_oracle.unwrap_or(0.0);
        assert!(x >= 0.96, "{}: {:.2}% of the oracle", c.what, x * 100.0);
    }
}

/// A free reading calibration finds unusable (it lags a synchronize): what calibration's own
/// test capture leaves held (the runtime's per-capture memory) is this engine's through serving,
/// and the session's allocation probes start after it. Measured by a probe right before
/// calibration's captures against the session's first: uncounted, an eager plan went 2.9 MiB
/// past the request in serving (seeds 6 and 13) and a conservative one 101.03% and 100.54% of
/// the oracle (seeds 22 and 31).
#[test]
fn what_calibration_leaves_held_is_counted_where_probes_measure() {
    for (file, seeds, kind) in [
        (
            "eager-h100-stale-free-calibration-capture.toml",
            [6, 13],
            memplan_planner::strategy::StrategyKind::None,
        ),
        (
            "stale-free-conservative-calibration-capture-l4.toml",
            [22, 31],
            memplan_planner::strategy::StrategyKind::Conservative,
        ),
    ] {
        for c in passes(file, &seeds) {
            assert_eq!(c.out.strategy, kind, "{file} {}", c.what);
        }
    }
}

/// A device that declares capture supported but cannot record the engine's graphs (allocation
/// nodes on a runtime without stream-ordered allocation): start-up used to be refused where the
/// engine runs eagerly and fits; the plan is eager and says why.
#[test]
fn capture_unsupported_at_run_time_plans_eagerly() {
    for c in passes("no-alloc-nodes-l4.toml", &[0, 1, 2]) {
        assert_eq!(
            c.out.strategy,
            memplan_planner::strategy::StrategyKind::None
        );
        assert_warns(&c, |w| w.code() == "graph_capture_unsupported");
    }
}

/// The engine alone cannot capture this scenario's graphs on a fresh device (its captures meet
/// the device's limit in a graph's instantiation, which the allocator's cache cannot give way
/// to), and neither can the run, a few MiB of calibration apart, which meets it in a
/// private-pool allocation: the graphs already captured are live and keep their pool's cached
/// intermediates through the allocation's retry, as PyTorch's `release_cached_blocks` gives
/// back only the pools of destroyed graphs (`graph_pools_freeable`). The refusal is right: the
/// run's oracle finds no room either. (Where the simulator gave a live pool's cache back, the
/// run kept all thirteen graphs in 8.7 GiB, and the oracle had to count the graphs it kept:
/// `kept_graphs_fit_where_the_engine_alone_cannot_capture_them` is that case now.)
#[test]
fn graphs_a_live_pool_cannot_make_room_for_are_refused_alone_and_in_the_run() {
    let file = "kept-graphs-engine-alone-cannot-capture-rtx3090.toml";
    for c in passes(file, &[1]) {
        let setup = c.setup.as_deref().expect("the setup");
        let alone = engine_alone(setup).expect("the engine alone");
        assert!(alone.graphs_do_not_fit, "{}: the replay fits", c.what);
        assert_eq!(
            c.out.strategy,
            memplan_planner::strategy::StrategyKind::PostCapture
        );
        assert!(
            c.out.oracle_tokens == Some(0) && c.out.kv_tokens.is_none(),
            "{}: oracle {:?}, cache {:?}",
            c.what,
            c.out.oracle_tokens,
            c.out.kv_tokens
        );
    }
}

/// The analytic bound of the conservative strategy is the upper end of the public range per
/// kernel node: with an engine that gives a large node count it alone left no room for a KV
/// cache (start-up refused on 154 of 200 seeds). Where probes measure what the captures hold,
/// the measurement replaces the bound, and the plan fits.
#[test]
fn probes_replace_an_analytic_bound_that_leaves_no_room() {
    for c in passes("stale-free-hints-4090.toml", &[0, 1, 2, 3]) {
        assert!(c.out.failed.is_none(), "{:?}", c.out.failed);
    }
}

/// The oracle of a run that kept its graphs (post-capture) counts the graph memory the process
/// holds at the plan, not another capture of the same sizes: a graph's executable object varies
/// from one capture to the next, and with three graphs of about 1 GiB each the engine alone's
/// capture took up to 0.7 GiB more than the run's, which judged plans that fit as over the
/// oracle (these seeds, up to 102.3%).
#[test]
fn kept_graphs_are_judged_by_their_own_memory() {
    passes("single-tensor-h200.toml", &[9, 27, 88, 150, 170]);
}

/// Every other file, on two seeds each: other devices (H200, MI300X, Max 1550, A100 40GB, Arc
/// 140V, RTX 4090, ROCm 5.4/5.5), MLA-like single latent heads, int8/fp8/fp16 KV, block sizes
/// 1 to 256, 1 to 512 layers, eager engines, unsorted and duplicated size lists, engine hints,
/// up to 515 sizes, forced adversarial physics with neighbours, and requests that cannot be
/// met (utilisation exactly 1, a million-token context): no gating failure, no needless
/// refusal, and a refusal names why.
#[test]
fn outside_scenarios_pass_the_gating_rules() {
    for file in [
        "h200-mla-fp8.toml",
        "eager-int8-block256.toml",
        "max1550-sizes-hints.toml",
        "rocm55-graphics.toml",
        "many-tiny-layers-fp8-block1.toml",
        "mi300x-pool-stub.toml",
        "max1550-adversarial-eager.toml",
        "rocm54-nopost-budget.toml",
        "arc140v-long.toml",
        "mi300x-util-one.toml",
    ] {
        for c in passes(file, &[0, 1]) {
            if let Some(why) = &c.out.failed {
                assert!(
                    why.contains("start-up refused") && why.len() > 40,
                    "{file}: {why}"
                );
            }
        }
    }
}

/// A share of a total reading calibration finds approximate is a share of the reported figure
/// (as the engine takes it): the plan says so by name, and a byte budget does not.
#[test]
fn a_share_of_an_approximate_total_is_named() {
    let named = |c: &Case| {
        c.out.plan.as_ref().is_some_and(|p| {
            p.warnings
                .iter()
                .any(|w| w.code() == "utilization_of_inexact_total")
        })
    };
    for c in passes("total-under-utilization.toml", &[3]) {
        assert!(named(&c), "{}", c.what);
    }
    // The same device asked for a byte budget.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/outside/total-under-utilization.toml");
    let mut sc = Scenario::load(path.to_str().unwrap()).unwrap();
    sc.request.gpu_memory_utilization = None;
    sc.request.memory_budget = Some(memplan_testbed::scenario::ByteValue::Int(30 << 30));
    let setup = seeded(sc.resolve().unwrap(), 3);
    let out = run_judged(&setup, Choice::Auto, None, engine_alone(&setup).ok()).unwrap();
    let plan = out.plan.as_ref().expect("a plan");
    assert!(plan
        .warnings
        .iter()
        .all(|w| w.code() != "utilization_of_inexact_total"));
}

/// A sampled estimate whose margin leaves no room for one request is replaced by a full
/// capture unless that would leave more held than it saves. Here the samples left 2.67 GiB
/// held, most of it taken once, while calibration measured 82 MiB kept per capture: at the
/// samples' rate the full capture of 67 sizes looked too costly and the start-up was refused
/// although the engine fits; at calibration's rate it is measured.
#[test]
fn a_full_capture_is_costed_at_what_one_capture_keeps() {
    for c in passes("h200-mla-fp8.toml", &[189]) {
        assert!(c.out.failed.is_none(), "{:?}", c.out.failed);
    }
}

/// `c` planned with its memory outside the allocator measured, not the bound kept where it
/// could not be (`non_allocator_unmeasured`).
fn assert_non_allocator_measured(c: &Case) {
    let plan = c.out.plan.as_ref().expect("a plan");
    assert!(
        plan.warnings
            .iter()
            .all(|w| w.code() != "non_allocator_unmeasured"),
        "{}: {:?}",
        c.what,
        plan.warnings
    );
}

/// A driver whose total reading is below the device's reads idle free memory above that total,
/// so `total - free` is no figure; a window's change of it still is (the change of free, the
/// constant cancels). Read through snapshots, every window came out unmeasured, the libraries'
/// 1.5 GiB outside the allocator fell back to the 512 MiB bound, and the process went over the
/// request (these seeds, by 50-74 MiB).
#[test]
fn a_total_below_free_still_measures_non_allocator_memory() {
    for c in passes("total-under-workspace.toml", &[1, 4]) {
        assert_non_allocator_measured(&c);
    }
}

/// A free reading declared exact on a device that gives none (Level Zero without Sysman,
/// declared exact, not calibrated): the declaration said it measures this process, so the
/// session took no allocation probes, nothing measured the 230 MiB of workspace outside the
/// allocator, and the plan kept the 512 MiB bound (96.9% of the oracle on such a generated
/// case). A reading that gives nothing at the baseline measures nothing: the probes measure.
#[test]
fn a_free_reading_declared_exact_that_gives_nothing_is_replaced_by_probes() {
    for c in passes("b580-nosysman-declared-exact.toml", &[0, 1, 2]) {
        assert_non_allocator_measured(&c);
        let share = c.out.kv_vs_oracle.expect("an oracle");
        assert!(share >= 0.99, "{}: {share}", c.what);
    }
}

/// No reading at all (an Arc B580 without Sysman): the engine's memory outside its allocator
/// is measured by allocation probes around its steps, each counted on the safe side by the
/// probe's resolution. The adversarial allocator here rounds each of the 28 KV tensors to a
/// 33.5 MiB granule, and the cache that fitted the room ended 2 MiB short of the next
/// granule: a few MiB of probe resolution cost a whole granule per tensor (seed 35: 83% of
/// the oracle's tokens, with probes bisected to 1/8192 of the device). The probes bisect
/// finer, so their slack stays under a MiB.
#[test]
fn probe_resolution_does_not_cost_a_granule_per_tensor() {
    for c in passes("b580-int8-neighbours-adversarial.toml", &[35]) {
        let share = c.out.kv_vs_oracle.expect("an oracle");
        assert!(share >= 0.97, "{}: {share}", c.what);
    }
}

/// A free reading that calibration found approximate (here within 30 MiB) and that reads the
/// free memory at start a few MiB below the request does not show that the request cannot be
/// met: start-up was refused (seed 5, 22.06 GiB free read against 22.07 GiB requested) where
/// the device had the room. A shortfall within the reading's tolerance is planned, the KV cache
/// capped by what is free.
#[test]
fn a_free_reading_short_of_the_request_within_its_tolerance_is_planned() {
    for c in passes("rocm62-adv-fp8-neighbours.toml", &[5]) {
        assert!(c.out.failed.is_none(), "{:?}", c.out.failed);
    }
}

/// The engine warms each size up again before its own capture, with its KV cache allocated:
/// where a warm-up takes more than the profile run (here up to 2 GiB at size 256, against a
/// 1.2 GiB activation peak), the plan kept room for the profile run's peak only and the
/// engine's capture went over the request (these seeds, by 199-278 MiB). The graph phase's
/// largest warm-up is the transient peak beside the cache where it is the larger.
#[test]
fn a_warm_up_larger_than_the_profile_run_is_kept_room_for() {
    for c in passes("4090-big-warmup.toml", &[10, 15]) {
        let plan = c.out.plan.as_ref().expect("a plan");
        let act = plan
            .consumers
            .get(memplan_planner::plan::ConsumerKind::Activation)
            .expect("an activation peak");
        assert!(
            matches!(&act.provenance, memplan_planner::plan::Provenance::Measured { step, .. } if step == "capture_graphs"),
            "{}: {:?}",
            c.what,
            act.provenance
        );
    }
}

/// The same engine on seeds that draw `max_split_size_mb` (a cached block of the limit or more
/// serves no smaller request): the session's check of whether the engine's capture keeps the
/// allocator's cache warmed every size up with no capture in between, and each of the 2 GiB
/// warm-ups took segments of its own, 19 GiB of them at once, where the engine's capture
/// empties the cache and the engine never holds two: these seeds went 224-412 MiB past the
/// request in the graph phase, before the plan. Every size is warmed up at once only where the
/// capture keeps the cache, as the engine's own warm-ups then stay cached too.
#[test]
fn the_cache_check_warms_every_size_up_only_where_the_capture_keeps_the_cache() {
    for c in passes("4090-big-warmup.toml", &[1, 9, 18]) {
        assert!(c.out.plan.is_some(), "{}: {:?}", c.what, c.out.failed);
    }
}

/// An RTX 4090 whose capture sizes are 512, 384 and 256 tokens, at 8 MiB of warm-up per token,
/// and a 17 GiB model: the session's check of whether the capture keeps the allocator's cache
/// warmed the smallest size up before the first, and its 2 GiB block, which cannot serve the
/// first's 4 GiB, stayed cached beside it. The engine warms the largest up first and serves the
/// smaller warm-ups from its cached block, and its capture empties the cache: it never holds
/// both. These seeds went 44-424 MiB past the request in the graph phase, before the plan (12
/// of seeds 0-99). The check warms up only the first size before its capture, as the engine
/// does, and more only where the capture keeps the cache.
#[test]
fn the_cache_check_holds_no_warm_up_beside_the_first_that_the_engine_does_not() {
    passes("4090-warm-ups-no-small-size.toml", &[1, 8, 21, 23, 29]);
}

/// An RTX 4090 with 67 capture sizes up to 512 tokens (sampled) and warm-ups of 24 MiB a token:
/// the sampled strategy then checks whether the engine's capture keeps the allocator's cache by
/// warming the first (largest) size up again, and did so with its eight samples' graphs still
/// captured beside the 9 GB warm-up. The engine warms its largest size up before it holds any
/// graph. These seeds went 166-331 MB past the request and the engine's own steps in the graph
/// phase, before the plan (9 of seeds 0-21); releasing the samples' graphs before the check
/// takes 153-314 MB of that off, and what is left is what a library keeps from the first
/// capture (named).
#[test]
fn the_cache_check_after_the_samples_holds_none_of_their_graphs() {
    passes(
        "4090-sampled-then-every-size-warm-ups.toml",
        &[2, 3, 5, 7, 8, 11, 15, 19, 20],
    );
}

/// A neighbour that takes memory just before the engine's profile run can leave the engine's
/// own activation peak no room. That is the world leaving nothing to plan, not memplan's
/// profiling running out of memory: it is judged a refusal (where the engine alone, beside
/// what the others then held, runs out of memory too), and an out-of-memory only where the
/// engine alone would have fitted (calibration or profiling leftovers).
#[test]
fn an_engine_step_a_neighbour_starved_is_not_memplans_out_of_memory() {
    // Seed 0: the engine alone beside the neighbour loads and runs its profile, but cannot
    // capture its graphs even with no KV cache (a library's first-capture memory, which the
    // run's calibration took earlier, is part of what it needs): the start-up cannot succeed
    // beside the neighbour, memplan's profiling ran out of memory only earlier. On seed 21 the
    // engine alone cannot capture its graphs even without the neighbour: the model does not fit
    // (with its allocator's options, power-of-two divisions, its graphs do not). Both seeds run
    // the engine's allocator with expandable segments (`PYTORCH_ALLOC_CONF`, drawn with the
    // physics), which waste less: on seed 0 the start-up then fits, and is judged as any other.
    for c in passes("neighbour-before-profile-3090.toml", &[21, 0]) {
        let why = c.out.failed.as_deref().unwrap_or("");
        if c.what.contains("seed=0") && c.out.failed.is_none() && c.out.oom.is_none() {
            continue;
        }
        assert!(
            c.out.oom.is_none() && (why.contains("does not fit") || why.contains("do not fit")),
            "{}: {why}",
            c.what
        );
    }
}

/// Where the engine alone, with nothing else on the device, cannot capture its graphs even with
/// no KV cache, the engine cannot start whatever memplan does. Seed 45 (adversarial): the
/// allocator's coarse rounding of the weights left the engine 350 MiB for its profile run,
/// which ran out of memory by 29 MiB after calibration's test captures left memory held; it was
/// counted as memplan's out-of-memory, where the engine alone fails too (capturing its graphs).
/// Now that calibration leaves nothing in the graph pool, the profile run fits and the
/// refusal comes where the engine alone fails: its graphs do not fit; the weights and the
/// activation peak already leave the request no room for a KV cache, so the plan's refusal
/// comes before the graph phase.
#[test]
fn an_engine_whose_graphs_fit_nowhere_does_not_fit() {
    for c in passes("l4-llama8b-adversarial.toml", &[45]) {
        let why = c.out.failed.as_deref().unwrap_or("");
        assert!(
            c.out.oom.is_none()
                && (why.contains("the model does not fit")
                    || why.contains("the engine's graphs do not fit")
                    || why.contains("before the graph phase")),
            "{}: {why}",
            c.what
        );
    }
}

/// Where other processes leave during the start-up, the plan is judged on the engine alone
/// beside what they hold at the plan. Seed 28: beside the 860 MiB another process held at the
/// start, the engine alone's activation peak does not fit after its coarsely rounded weights
/// (14.34 GB), and the oracle fitted no KV cache at all; the process left before the profile
/// run, the run's engine loaded, profiled and served a small cache (859 tokens) within the
/// request, judged "a KV cache where the oracle fits none".
#[test]
fn an_engine_that_fits_once_others_left_is_judged_beside_them() {
    let file = "arc-a770-others-leave-before-profile-sglang-gemma3-4b.toml";
    for c in passes(file, &[28]) {
        let setup = c.setup.as_deref().expect("the setup");
        let alone = engine_alone(setup).expect("the engine alone");
        assert!(
            alone.nothing_fits,
            "{}: the engine alone fits at the start",
            c.what
        );
        assert!(
            c.out.oom.is_none()
                && c.out.over_request_bytes.is_none()
                && c.out.oracle_tokens.is_some_and(|t| t > 0)
                && c.out.kv_tokens.is_some_and(|t| t > 0),
            "{}: oracle {:?}, cache {:?}, out of memory {:?}, over {:?}",
            c.what,
            c.out.oracle_tokens,
            c.out.kv_tokens,
            c.out.oom,
            c.out.over_request_bytes
        );
    }
}

/// The automatic choice on `setup`, its measured profile made to leave no room for any KV cache
/// (an activation peak of 1 TiB) so that the session refuses (at the plan, unless it refuses
/// earlier), judged as the sweep judges it: the oracle ignores the plan.
fn refused(what: &str, setup: Setup) -> Case {
    let inflate = |p: &mut memplan_planner::Profile| p.activation_peak_bytes = Some(1 << 40);
    let alone = engine_alone(&setup).ok();
    let out = run_judged(&setup, Choice::Auto, Some(&inflate), alone)
        .unwrap_or_else(|e| panic!("{what}: harness error: {e}"));
    assert!(
        out.failed.is_some() && out.plan.is_none(),
        "{what}: not refused: {:?}",
        out.failed
    );
    Case {
        group: "refused".into(),
        what: what.into(),
        out,
        harness_error: false,
        setup: Some(Arc::new(setup)),
        adversarial: true,
    }
}

/// The setup of `file` (`tests/outside`) on `seed`, with `edit` applied.
fn outside_setup(file: &str, seed: u64, edit: impl Fn(&mut Setup)) -> Setup {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/outside")
        .join(file);
    let mut setup = Scenario::load(path.to_str().unwrap())
        .and_then(Scenario::resolve)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    edit(&mut setup);
    seeded(setup, seed)
}

/// A refusal is judged beside the other processes as they are when it comes, as a plan is
/// judged beside them at the plan. Seed 28 of the Arc A770 whose other process (860 MiB at the
/// start) leaves before the profile run: the engine alone beside it at the start runs out of
/// memory, beside what the others hold at the plan (16 MiB) it fits with a small cache (the
/// plan the test above judges). A session made to refuse at the plan refused where that cache
/// fits: a needless refusal, once judged on the engine alone beside the others of the start (no
/// cache fits there, so none was reported).
#[test]
fn a_refusal_after_others_left_is_judged_beside_them() {
    let file = "arc-a770-others-leave-before-profile-sglang-gemma3-4b.toml";
    let setup = outside_setup(file, 28, |_| {});
    assert!(engine_alone(&setup).expect("the engine alone").nothing_fits);
    let c = refused(file, setup);
    assert!(
        c.out.oracle_tokens.is_some_and(|t| t > 0),
        "the oracle beside the others at the refusal: {:?}",
        c.out.oracle_tokens
    );
    let f = acceptance::failures(std::slice::from_ref(&c));
    assert!(
        f.iter().any(|f| f.check == Check::NeedlessRefusal),
        "{:?}",
        f.iter().map(|f| &f.line).collect::<Vec<_>>()
    );
}

/// Each engine's own start-up check: vLLM's worker refuses a utilisation above the free memory
/// at the start (`vllm/v1/worker/utils.py` `request_memory`), SGLang's static fraction is of the
/// memory free when it starts and it checks no request against it. The Arc A770 of seed 28,
/// the other process at 16 MiB throughout: 0.95 of the device is above what its 1 GiB of
/// graphics allocations leave free, and the engine alone fits with a small cache. A session
/// made to refuse at the plan refused rightly for vLLM's engine and needlessly for SGLang's
/// (judged, as both once were, by vLLM's check, it was right for both); vLLM's engine asked
/// for the same bytes as a budget is checked on them.
#[test]
fn the_start_check_is_the_engines_own() {
    use memplan_testbed::scenario::StartRule;
    let file = "arc-a770-others-leave-before-profile-sglang-gemma3-4b.toml";
    let steady = |s: &mut Setup| {
        s.neighbour.clear();
        s.other_processes = 16 << 20;
    };
    let needless = |c: &Case| {
        acceptance::failures(std::slice::from_ref(c))
            .iter()
            .any(|f| f.check == Check::NeedlessRefusal)
    };
    for (rule, start_refused) in [
        (StartRule::Sglang0514, false),
        (StartRule::Sglang051, false),
        (StartRule::Vllm, true),
    ] {
        let setup = outside_setup(file, 28, |s| {
            steady(s);
            s.start_rule = rule;
        });
        let start = open(&setup).expect("the device").truth();
        assert!(start.free < (start.total as f64 * 0.95) as u64);
        let c = refused(file, setup);
        let o = c.out.oracle.expect("an oracle");
        assert!(o.tokens > 0, "{rule:?}: no cache fits");
        assert_eq!(o.start_refused, start_refused, "{rule:?}");
        assert_eq!(needless(&c), !start_refused, "{rule:?}");
    }
    // vLLM's engine asked for the same memory as a byte budget.
    let total = open(&outside_setup(file, 28, steady))
        .expect("the device")
        .truth()
        .total;
    let budget = (total as f64 * 0.95) as u64;
    let setup = outside_setup(file, 28, |s| {
        steady(s);
        s.start_rule = StartRule::Vllm;
        s.scenario.request.gpu_memory_utilization = None;
        s.scenario.request.memory_budget = Some(memplan_testbed::scenario::ByteValue::Int(budget));
        s.request = memplan_planner::budget::Request::Bytes(budget);
    });
    let c = refused(file, setup);
    assert!(c.out.oracle.expect("an oracle").start_refused);
}

/// An SGLang engine asked for more than is free at its start (another process holds 1 GiB):
/// vLLM's worker would refuse it, SGLang sizes its pool from the free memory it reads after its
/// weights less the free memory at its start times `1 - mem_fraction_static` (0.5.9
/// `model_executor/model_runner_kv_cache_mixin.py` `profile_max_num_token`, 0.5.22
/// `mem_cache/kv_cache_configurator.py` `_profile_available_bytes`) and starts. The device's
/// free reading does not follow allocations (stale), so the engine's own readings are as wrong
/// and its pool is not what bounds the plan: the session plans the request (said in the plan's
/// notes) rather than refusing, and the
/// plan passes the gating rules with no needless refusal (the planner once refused these seeds
/// with vLLM's check while the oracle held a cache, and then took the request's share of the
/// free memory for the whole process, leaving room the engine would have used).
#[test]
fn an_engine_whose_fraction_is_of_the_free_memory_is_planned_within_it() {
    let file = "rx7900xtx-sglang-fraction-of-free-memory-codellama-7b.toml";
    for c in passes(file, &[0, 1, 3]) {
        let plan = c
            .out
            .plan
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no plan: {:?}", c.what, c.out.failed));
        let total = plan.total_bytes as f64;
        assert_eq!(
            plan.requested_bytes,
            (total * 0.95).ceil() as u64,
            "{}",
            c.what
        );
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains("the engine's readings are as wrong")),
            "{}: {:?}",
            c.what,
            plan.notes
        );
    }
}

/// SGLang with other processes holding 8 GiB of a 24 GiB card: its pool is the free memory it
/// reads once its weights are loaded less the free memory it read before them times one less
/// its static fraction (0.5.14 `mem_cache/kv_cache_configurator.py` `_profile_available_bytes`),
/// and with the request's share (0.85) that slack, 2.4 GiB, is more than the activations the
/// plan measured: the test-bed's engine, which keeps the smaller of its own pool and the plan's
/// tokens, served 84% of the oracle where the plan was held to that pool. The plan keeps the
/// request's room and gives the fraction that lets the engine's own rule reach it
/// (`engine_static_fraction`, above the request's share), and the engine serves the plan.
#[test]
fn an_engine_sizing_its_pool_from_its_readings_is_given_the_fraction_that_reaches_the_plan() {
    let file = "rtx3090-sglang-others-8g-fraction-reaches-the-plan.toml";
    for c in passes(file, &[0, 1, 2, 3]) {
        let plan = c.out.plan.as_ref().expect("a plan");
        let share = plan.requested_bytes as f64 / plan.total_bytes as f64;
        let f = plan.suggestions.engine_static_fraction.expect("a fraction");
        assert!(f > share + 0.05, "{}: {f} for a share of {share}", c.what);
        assert!(
            c.out.engine_pool_tokens >= c.out.planned_tokens,
            "{}: {:?} {:?}",
            c.what,
            c.out.engine_pool_tokens,
            c.out.planned_tokens
        );
        assert!(
            c.out.kv_vs_oracle.is_some_and(|x| x >= 0.99),
            "{}: {:?}",
            c.what,
            c.out.kv_vs_oracle
        );
    }
}

/// A free reading that lags a synchronize, declared exact in a start-up that does not calibrate,
/// and that also moves by a few hundred KiB while idle (ROCm's, composed with what other users
/// of the VRAM hold): its windows over allocations read none of them, so it is stale, whatever
/// the idle spread. Kept approximate within the windows' error instead, its tolerance was most
/// of the device and the full strategy refused a cache the device held (seeds 0-3, 5, 7, 8, 18).
#[test]
fn a_stale_reading_that_moves_while_idle_is_still_stale() {
    let file = "rx7900xtx-rocm62-stale-declared-exact-uncalibrated-full.toml";
    for c in passes(file, &[0, 1, 5, 18]) {
        assert_warns(&c, |w| {
            matches!(w, memplan_planner::Warning::CalibrationDowngrade { observed, .. }
                if observed.contains("stale?"))
        });
    }
}

/// Captures that vary by about 20% from one to the next, every size measured, the memory free
/// capping the plan beside a 3 GiB neighbour: the reserve keeps one capture's bound on the
/// variation (the plan warns `graph_capture_varies`), and the physical cap keeps the bound on
/// the difference of two captures. On seed 85 the engine's capture took 87 MB more than the
/// measured pass and serving ran out of memory. That seed is refused now: the bound on two
/// captures leaves no block (the engine alone had room for one: a needless refusal, not gated).
#[test]
fn a_physical_cap_beside_captures_that_vary_keeps_the_bound_on_two() {
    let cases = cases_with(
        "rtx4090-full-67-sizes-varying-captures-neighbour-3g.toml",
        &[46, 85],
        |_| {},
    );
    let gating: Vec<String> = acceptance::failures(&cases)
        .iter()
        .filter(|f| acceptance::GATING.contains(&f.check))
        .map(|f| f.line.clone())
        .collect();
    assert!(gating.is_empty(), "{}", gating.join("\n"));
    assert!(cases.iter().all(|c| c.out.oom.is_none()));
}

/// Warm-ups of 8 MiB per token beside graphics the free reading cannot see, world physics:
/// the session's check of whether the capture keeps the cache held warm-ups the engine never
/// holds together, 147-341 MiB past the request in the graph phase.
#[test]
fn big_warm_ups_on_world_physics_stay_within_the_request_before_the_plan() {
    passes(
        "rx7900xtx-rocm55-graphics-big-warm-ups-world.toml",
        &[1, 4, 9, 16, 18],
    );
}

/// Generated scenarios (the sweep's generator, one seed each), judged like the sweep's; the
/// gating failures among them.
fn generated_gating_failures(indices: &[u64]) -> Vec<String> {
    use memplan_testbed::sweep::random_scenario;
    let cases: Vec<Case> = indices
        .iter()
        .map(|&i| {
            let setup = seeded(random_scenario(i).resolve().unwrap(), i);
            judged("generated", format!("random-{i}"), setup)
        })
        .collect();
    acceptance::failures(&cases)
        .into_iter()
        .filter(|f| acceptance::GATING.contains(&f.check))
        .map(|f| f.line)
        .collect()
}

/// Generated scenarios past the sweep's seeds: an Arc B580 with no free reading (the session
/// measures each engine step by allocation probes) whose neighbour releases 0.6-1 GiB just
/// before a step. The probes were capped at the baseline's allocatable memory, so the probe
/// before the step read the baseline where more was there, and the step's memory outside the
/// allocator came out short by what the neighbour released: 102-108% of the oracle and over
/// the request. Probes search past the baseline, up to the device's total.
#[test]
fn probes_measure_a_step_after_a_neighbour_released_memory() {
    let failed = generated_gating_failures(&[1206, 1958, 2179]);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A generated scenario past the sweep's seeds (random-2481, world physics): KV tensors of
/// 14 MiB, which PyTorch's allocator rounds to 2 MiB, measured on half-size caches of 7 MiB
/// and 5 MiB tensors, which it packs into shared 20 MiB segments: their sizes read as a
/// 5 MiB granule, and the cache was cut from 7136 tokens to 5088 though the planned one fit.
/// Counts whose tensors share segments are not measured for tensors the allocator rounds on
/// their own.
#[test]
fn a_granule_is_not_read_from_tensors_that_share_segments() {
    let failed = generated_gating_failures(&[2481]);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A generated scenario past the sweep's seeds (random-3240, adversarial): an RX 7900 XTX that
/// declares its free reading exact while it moves by several MiB, in a start-up that does not
/// calibrate. Trusted as exact, the windows of the engine's steps and graphs came out a few
/// MiB short and the process went 2.7 MiB over the request. A session that trusts a free
/// reading as exact reads it on the idle device first; one that moves is approximate, with its
/// window error measured.
#[test]
fn an_exact_free_reading_that_moves_is_approximate_without_calibration() {
    let failed = generated_gating_failures(&[3240]);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// An engine whose capture does not empty the allocator's cache (`torch.cuda.graph` does; a
/// framework that does not keeps every warm-up's segments through its captures): the warm-ups'
/// 512 MiB stayed reserved beside the serving burst's own 1.2 GiB, and 46 of 60 seeds went
/// 260-470 MiB over the request while serving (101-103% of the oracle), since `full` measures
/// each capture after releasing the cache. The session checks, on the process's first capture,
/// whether a capture keeps the cache, and the plan then keeps the largest warm-up beside the
/// activation peak. Seeds 0 and 1 run under `max_split_size_mb` (512 and 20), where each
/// warm-up of a size between takes segments of its own (a cached block of the limit or more
/// serves no smaller request): the check warms every size up, and the plan keeps what all of
/// them left (seed 1 under `max_split_size_mb:256` had planned 106.6% of the oracle).
#[test]
fn a_capture_that_keeps_the_cache_keeps_the_warm_ups_beside_the_burst() {
    let cases = passes("4090-no-cache-empty.toml", &[0, 1, 2, 3, 5, 17, 33]);
    assert!(cases
        .iter()
        .all(|c| c.out.strategy == memplan_planner::strategy::StrategyKind::Full));
}

/// The same engine with warm-ups of 1 MiB per token: the smallest sizes' warm-ups are requests
/// of up to 1 MiB, which a caching allocator serves from small segments only, so a 2 MiB
/// segment stays cached beside the largest warm-up's and the burst goes on top (these seeds,
/// 0.9-1.7 MiB over the request in serving). The check warms the smallest size up too, and the
/// plan keeps what that left cached.
#[test]
fn a_small_warm_ups_segment_stays_cached_beside_the_largest() {
    passes("4090-keeps-cache-small-warm-ups.toml", &[36, 45, 149]);
}

/// An approximate free reading declared good to 16 MiB that moves in 64 MiB steps, with
/// calibration off: the session's own windows over known allocations were off by a step, but
/// the strategies' margins took the declaration's 16 MiB, and post-capture plans went up to
/// 18 MiB over the request (these seeds). A measured window error beyond the declaration now
/// stands; seed 29's readings never moved over the windows, whose common divisor (the free
/// memory itself) is no step.
#[test]
fn a_measured_window_error_beyond_the_declaration_stands() {
    passes("rocm62-uncal-step64.toml", &[12, 16, 24, 29, 30]);
}

/// A free reading that moves in 256 MiB steps: calibration's windows over its 64 MiB, 256 MiB
/// and 1 GiB allocations read the steps exactly or 64 MiB off, and the reading's window error
/// was taken to be that 64 MiB. Every reading was a multiple of the step, so a window may be
/// off by up to the step: the full capture's margin and a post-capture plan sized from the
/// smaller figure went over the request (these seeds, by 10 to 230 MiB) and over the oracle.
#[test]
fn a_reading_that_moves_in_steps_is_off_by_up_to_a_step() {
    passes("strix-free-step.toml", &[5, 22, 34, 39, 52, 69]);
    passes("h100-free-step.toml", &[78]);
}

/// A free reading that moves in 64 MiB steps: calibration's 64 MiB, 256 MiB and 1 GiB are
/// multiples of the step, so every window read exact and the reading passed as exact; the
/// engine's windows then read up to a step off, and these seeds went 5-22 MiB over the request.
/// Calibration also allocates 37 MiB, no multiple of a common step: its window shows the step.
#[test]
fn a_step_that_divides_the_calibration_sizes_is_seen() {
    passes("a100-free-step-64.toml", &[5, 8, 11, 14, 15]);
}

/// Per-layer tensors under twice a coarse allocator segment: caches of half the blocks measure
/// nothing (their tensors share segments) and the planned cache went past the request in the
/// session's own allocation on these seeds. One planned tensor alone says the cache does not
/// fit, and the count is then measured tensor by tensor, never past the room.
#[test]
fn tensors_under_twice_a_coarse_segment_are_measured_one_at_a_time() {
    passes("rtx4090-128-layer-tensors-eager.toml", &[9, 16, 17]);
}

/// A free reading in 4 MiB steps: a 37 MiB window is off by 1 MiB or 3, so on most seeds every
/// calibration window came out within the rounding a window allows and the reading passed as
/// exact; these seeds went up to 2.6 MiB over the request in serving. Readings that all fall on
/// multiples of a step coarser than that rounding make the reading approximate within the step.
#[test]
fn a_step_finer_than_the_odd_window_is_seen_in_the_readings() {
    passes("a100-free-step-4-post-capture.toml", &[5, 7, 13]);
}

/// A free reading in 256 MiB steps under a KV cache the engine's hook allocates in the session:
/// the cache of the planned blocks read as the step above its bytes, past what the plan kept,
/// and the session shrank a cache that fitted (the engine was served fewer tokens than the
/// plan). A reading's growth past the blocks' own bytes by no more than its tolerance is its
/// error as much as anything the cache took.
#[test]
fn a_cache_read_a_step_high_is_not_shrunk() {
    passes("a100-free-step-256-full.toml", &[0, 6, 13, 14]);
}

/// A free reading in 768 MiB steps on a 24 GiB card: `full`'s repeats of a first size smaller
/// than a step read 0, and its margin counted the step as the variation of every graph (5.5
/// GiB for 35 graphs of 1.3 GB): every one of these start-ups was refused where the device had
/// room. A step that hides the captures has them measured by allocation probes instead, and
/// the graph reserve is the graphs and the reading's error on one window, not eight.
#[test]
fn a_step_that_hides_the_captures_has_them_measured_by_probes() {
    let step = 768u64 << 20;
    for c in passes(
        "rocm62-free-step-768-full-neighbours.toml",
        &[0, 1, 2, 3, 5, 7, 8],
    ) {
        let (Some(reserve), Some(real)) = (c.out.estimate, c.out.real_graph) else {
            panic!("{}: no plan with graphs: {:?}", c.what, c.out.failed);
        };
        assert!(reserve >= real, "{}: {reserve} below {real}", c.what);
        assert!(
            reserve < real + 2 * step,
            "{}: {reserve} for {real}",
            c.what
        );
    }
}

/// A free reading in 2 MiB steps stays exact to calibration (a step within a window's
/// rounding), yet a window of two such reads may be off by up to the step: the engine's graph
/// memory read up to a step low and serving went up to 1 MiB past the request on these seeds.
/// Every window's margin keeps at least the step the reading moves in.
#[test]
fn a_step_within_the_rounding_is_still_kept_in_every_window() {
    passes(
        "h100-free-step-2-post-capture.toml",
        &[15, 16, 20, 22, 23, 26],
    );
}

/// An eager engine with a tensor per layer on a reading in 32 MiB steps: the load of the
/// weights read as memory freed outside the allocator (a window off by its error), counted as no
/// window, and no margin was kept for the windows' error where the KV cache is a tensor per
/// layer; serving went past the request on these seeds. Every window read counts, and the
/// margin is kept whatever the cache's layout.
#[test]
fn what_the_windows_may_read_low_is_kept_for_a_tensor_per_layer_too() {
    passes("mi300x-free-step-32-eager.toml", &[1, 2, 3, 5, 7, 8, 27]);
}

/// One capture size on a reading in 64 MiB steps: the repeats and the pass all read the same
/// bytes, whose common divisor (the capture itself) was taken for a step hiding the capture's
/// variation whole, and start-up was refused where the oracle holds 450,000 tokens. Windows hide
/// no more than the reading's own step.
#[test]
fn identical_repeats_are_not_a_step() {
    passes(
        "rx7900xtx-rocm54-free-step-64-one-size.toml",
        &[0, 1, 2, 3, 5, 8],
    );
}

/// Quiet windows that moved by no more than a window may be off by were taken for another
/// process's memory though none ran (a reading in 16 MiB steps read a step; a noisy one a few
/// hundred KiB), and a post-capture plan kept no margin on the engine's memory outside the
/// allocator: serving went past the request. Such windows are attributed to nobody and count
/// among those whose error the plan keeps, whatever the strategy.
#[test]
fn a_quiet_window_within_the_reading_error_is_nobodys() {
    passes("rx7900xtx-rocm62-free-step-16-post-capture.toml", &[6]);
    passes("strix-halo-declare-exact-one-backing-full.toml", &[11]);
}

/// A free reading that lags a synchronize, declared exact, in a start-up that does not
/// calibrate: idle, it reads steadily, so the check of an exact reading on the idle device
/// passed it, and every seed went 150-270 MiB over the request (its windows over the engine's
/// steps read the previous step's memory). A session nothing calibrated reads windows over
/// known allocations too: this one reads none of them, and is unavailable.
#[test]
fn an_uncalibrated_exact_reading_that_lags_is_unavailable() {
    for c in passes("h100-stale-uncalibrated.toml", &[0, 1, 2, 3]) {
        assert_warns(&c, |w| w.code() == "calibration_downgrade");
    }
}

/// The same stepped reading in a start-up that does not calibrate: the session measures the
/// reading's window error itself, and took what its few windows happened to be off by (less
/// than the step) as the error; these seeds went over the request. The session's windows
/// apply calibration's step rule, and are over an odd number of 2 MiB pages (a window over a
/// whole number of steps, as a 64 MiB one is, reads a stepped reading exactly).
#[test]
fn an_uncalibrated_session_sees_a_step_too() {
    passes("h100-free-step-64-uncalibrated.toml", &[5, 9, 11, 18, 20]);
}

/// A runtime whose frees keep 1 MiB each, in a start-up that does not calibrate: the session's
/// check of the exact free reading (windows over known allocations) ran after the baseline and
/// left what the frees kept held, counted by no step: every seed went 3-4 MiB over the request.
/// The check runs before the baseline, and what it left held is an engine step, as
/// calibration's leftovers are.
#[test]
fn what_the_free_reading_check_leaves_held_is_counted() {
    passes("a100-uncalibrated-leak.toml", &[0, 1, 2, 3]);
}

/// An MLA model written as MLA: the engine's latent page (one-sided, DeepSeek's 656-byte
/// fp8_ds_mla layout) and the plan's agree, and the cache holds what a 656-byte page gives, not
/// the 1,152 bytes of a full-attention head of 576 that the format could once only express.
#[test]
fn mla_latents_are_sized_as_one_sided_pages() {
    for c in passes("mla-deepseek-v2-lite.toml", &[0, 1, 2, 3]) {
        let plan = c.out.plan.as_ref().expect("a plan");
        assert_eq!(
            plan.kv.block_bytes / plan.kv.block_size,
            656 * 27,
            "{}",
            c.what
        );
    }
}

/// A runtime that frees a destroyed graph only after more synchronizes than a release waits
/// for: the teardown waits it out (synchronizing until the memory is back, or
/// `LATE_RELEASE_SYNCHRONIZES` more), and every later release waits as long. Counted as held
/// after the teardown, the late release came back while the engine was idle and was taken for
/// another process's too, so it stayed out of the KV cache twice: a full capture after a
/// too-costly sampled one planned 84.8% of the oracle on seed 13 (1.46 GiB of the sampled
/// phase's 1.59 GiB came back before the full capture), and the MLA scenario above 48.3% on
/// seed 12. Seed 12 plans 77%: its late releases (14 synchronizes) also came back inside the
/// full capture's windows, which read the pass 370 MiB short and the memory each capture keeps
/// for good at 7.1 of its 10.5 MiB (so 32 repeats looked worth their cost, and their margin
/// came out a third below twelve's); measured once the releases are waited out, the pass is
/// 0.4 GiB larger and twelve repeats are taken.
#[test]
fn a_late_release_is_waited_out_by_the_teardown() {
    for (file, seed, least) in [
        ("a100-deferred-release-sampled-then-full.toml", 13, 0.96),
        ("mla-deepseek-v2-lite.toml", 12, 0.77),
    ] {
        for c in passes(file, &[seed]) {
            let x = c.out.kv_vs_oracle.unwrap_or(0.0);
            assert!(
                x >= least,
                "{file} {}: {:.2}% of the oracle",
                c.what,
                x * 100.0
            );
        }
    }
}

/// A neighbour that frees memory in the idle window after a graph teardown, on a device that
/// frees a destroyed graph's memory some synchronizes later: the session once credited memory
/// coming back while the engine was idle to the engine, up to what its teardowns left held (a
/// late release it had not waited for), so the neighbour's release was taken for the engine's
/// memory coming back, and the plan counted memory the engine holds for good (a library's
/// first-capture workspace, 4 MiB per capture) as free: these seeds went 22-356 MiB over the
/// request while serving. The teardown waits out a late release, and memory coming back after
/// it is another process's. The neighbour lands where the session warms the engine up for the
/// allocator's granule, which it does for an engine that offers neither the KV allocation hook
/// nor tensors from its allocator.
#[test]
fn a_neighbour_freeing_memory_after_a_teardown_is_not_the_engines() {
    passes_with(
        "a100-deferred-release-neighbour-frees-after-teardown.toml",
        &[6, 9, 10, 12, 16],
        |s| {
            s.kv_hook = false;
            s.allocator_tensors = false;
        },
    );
}

/// A free reading that moves in 256 MiB steps, on adversarial physics (executable objects that
/// vary by up to a few tens of percent from one capture to the next): `full`'s repeats of the
/// first size read 256 or 512 MiB (0 or 256 MiB where a capture is below a step) whatever the
/// captures did, and their idle windows a step too, so the range less the idle windows' noise
/// read as no variation and the margin was the window error alone; seeds 15, 113 and 187 (whose
/// captures of the first size read 0) went 80-235 MiB over the request. A step hides a
/// variation below it: the margin counts the step as the repeats' range at least. Seeds 36 and
/// 115 (repeats that read 0, the first one memory coming back) refused needlessly with that
/// margin from four repeats: a step that hides the captures takes the twelve. The same device
/// with frees that keep 1 MiB each went 64-248 MiB over on seeds 64, 113 and 156.
#[test]
fn a_variation_below_a_step_is_counted() {
    passes("strix-free-step-adversarial.toml", &[15, 36, 113, 115, 187]);
    passes("strix-free-step-leak-adversarial.toml", &[64, 113, 156]);
}

/// The 64 MiB steps of `rocm62-uncal-step64`, uncalibrated, on adversarial physics whose noise
/// carries reads across a step where free memory stood when the session measured its window
/// error: combined reads were off by a few MiB there and the session combined its reads, but
/// where free memory stood later every read rounded the same way, and windows were off by up to
/// the step; these seeds went 10 and 14 MiB over the request. A combined read of a stepped reading is off by up to
/// the step, as a single read is.
#[test]
fn combined_reads_of_a_stepped_reading_are_off_by_up_to_the_step() {
    passes("rocm62-uncal-step64-adversarial.toml", &[18, 145]);
}

/// A runtime whose frees keep 1 MiB each, with a free reading noisy enough (±1.18 MiB) to be
/// measured as approximate: the session measures its window error with a few allocations of a
/// known size, and did so after taking the baseline, so the 4 MiB their frees kept came into
/// the first idle window as another process taking memory, not the engine's; the plan then
/// went 0.1-1.0 MiB past the request in serving on these seeds. The baseline is now taken after
/// those measurements.
#[test]
fn what_the_window_error_measurement_leaves_held_is_before_the_baseline() {
    passes("mi300x-composed-free-leaky-keeps-cache.toml", &[20, 23, 35]);
}

/// A device whose raw frees keep 2 MiB each, calibrated: calibration's allocate/free pairs each
/// left 2 MiB held, within what its windows allow for rounding, and nothing said so; the plan's
/// check by one allocation of what the engine still needs, after the last reading, kept 2 MiB
/// more, and these seeds went 1 MiB past the request while serving. Calibration reports what
/// every free kept, the plan keeps room for the session's own frees after its last reading
/// (so these runs stay within the request, warning or not), and says by name that the
/// engine's frees while serving are beyond it.
#[test]
fn memory_each_free_keeps_is_seen_and_the_sessions_own_frees_are_kept_room_for() {
    let seeds = [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16, 18];
    for c in passes("h100-leaky-free-calibrated.toml", &seeds) {
        assert_warns(
            &c,
            |w| matches!(w, memplan_planner::Warning::DeviceKeepsMemoryOnFree { bytes_per_free, .. } if *bytes_per_free == 2 << 20),
        );
        assert_eq!(c.out.over_request_bytes, None, "{}", c.what);
    }
}

/// A device whose raw frees keep less than its free reading moves from read to read (256 KiB
/// on an MI300X reading off by 0.5 MiB; 4 MiB on adversarial physics off by 4-96 MiB): no
/// allocate/free pair alone lost more than the noise, nothing was seen kept or said, and these
/// seeds went past the request while serving (51 KiB, 28.9 MiB, 5.6-18 MiB). The session's
/// windows are made one after the other: from the first reading to the last, free memory lost
/// what every free kept, give or take the noise once, which shows it; the plan warns by name.
#[test]
fn memory_each_free_keeps_under_the_readings_noise_is_seen_over_all_frees() {
    let keeps = |c: &Case| {
        assert_warns(c, |w| {
            matches!(w, memplan_planner::Warning::DeviceKeepsMemoryOnFree { .. })
        })
    };
    for c in passes(
        "mi300x-leak-256k-uncalibrated-eager.toml",
        &[1, 18, 23, 45, 52, 55],
    ) {
        keeps(&c);
    }
    for c in passes("mi300x-leak-4m-post-capture.toml", &[42]) {
        keeps(&c);
    }
    for c in passes("strix-halo-leak-4m-uncalibrated-eager.toml", &[4, 6, 27]) {
        keeps(&c);
    }
}

/// A device whose raw frees keep memory for good, where allocation probes measure or check the
/// plan: the probes' own frees must leave the engine its memory. With no free reading, probes
/// that bisected made 40 frees before the profile run of a 12 GiB Arc B580 keeping 4 MiB each,
/// and the profile run ran out of memory (seed 19); a plan capped by its probe lost what the
/// probe's last free kept, and the engine ran out of memory in its first burst (seed 16).
#[test]
fn probes_on_a_device_whose_frees_keep_memory_leave_the_engine_its_memory() {
    passes("b580-nosysman-leak-4m-profile-run.toml", &[19]);
    passes("arc140v-leak-4m-neighbour-before-plan.toml", &[16]);
}

/// A plan capped by its probe, whose KV cache took a little more than the cap: the check that
/// what the engine still needs is allocatable beside the cache frees its own allocation, and on
/// a device that keeps memory of every free that keep comes out of the engine's room. The check
/// asks for the need and the keep together; asking for the need alone, the engine's first burst
/// ran out of memory by less than one free's keep (256 KiB, seeds 4, 5, 12).
#[test]
fn a_check_beside_the_kv_cache_leaves_room_for_what_its_own_free_keeps() {
    passes(
        "b580-nosysman-leak-256k-stale-other-3g-one-backing-eager.toml",
        &[4, 5, 12],
    );
}

/// A device whose raw frees keep memory, where no free reading measures this process (one that
/// lags a synchronize, or none at all): no window of a reading shows what a free keeps, so the
/// allocation probes measure it around raw frees of their own; the plan warns by name, with
/// about the figure the device keeps (1 MiB). Unseen, these runs went 4-8 MiB past the request
/// while serving with no warning naming why.
#[test]
fn memory_each_free_keeps_is_seen_by_probes_where_no_reading_measures() {
    let keeps_a_mib = |c: &Case| {
        assert_warns(c, |w| {
            matches!(w, memplan_planner::Warning::DeviceKeepsMemoryOnFree { bytes_per_free, .. }
                if (768 << 10..=1536 << 10).contains(bytes_per_free))
        })
    };
    for c in passes("h100-stale-free-leak-1m-eager.toml", &[0, 1, 9, 30, 58]) {
        keeps_a_mib(&c);
    }
    for c in passes(
        "arc140v-no-free-reading-leak-1m-eager.toml",
        &[0, 1, 30, 55, 59],
    ) {
        keeps_a_mib(&c);
    }
}

/// A device whose raw frees keep memory, where allocation probes measure: the device keeps its
/// share of every free the session makes, also of those outside the windows two of its probes
/// measure (calibration's before its first probe; the last try of the probe that closes each
/// step, in the window before the next probe, which the session attributes to other
/// processes). An RTX 4090 with a stale reading keeping 4 MiB per free made 12 such frees and
/// went 31.8 MiB past the request while serving, with no warning naming why (its probes saw a
/// bound on what a free keeps, no figure); the 1 MiB files above went 5-11 MiB past it on these
/// seeds (warned: the warning blamed the engine's frees while serving, and the engine made
/// none). The plan keeps room for them, so all stay within the request.
#[test]
fn the_sessions_frees_between_its_probed_windows_are_kept_room_for() {
    for c in passes(
        "rtx4090-stale-free-leak-4m-sglang-hybrid-conservative.toml",
        &[11],
    ) {
        assert_eq!(c.out.over_request_bytes, None, "{}", c.what);
    }
    for file in [
        "h100-stale-free-leak-1m-eager.toml",
        "arc140v-no-free-reading-leak-1m-eager.toml",
    ] {
        for c in passes(file, &[1, 5]) {
            assert_eq!(c.out.over_request_bytes, None, "{file} {}", c.what);
        }
    }
}

/// The models with sliding-window layers (`[[kv.groups]]`, and Mistral's one sliding group):
/// the planner's layout of their groups against the engine's own, vLLM 0.19.0's
/// (`memplan_testbed::kv`).
const HYBRID: &[&str] = &[
    "gemma3-27b-bf16-80g.toml",
    "gemma3-27b-qat-bf16-24g.toml",
    "gemma3-27b-qat-fp8-24g.toml",
    "gemma3-27b-strix-halo.toml",
    "gpt-oss-20b-h200.toml",
    "gpt-oss-20b-fp8-h100.toml",
    "mistral-7b-sliding-rocm62.toml",
    "l4-full-two-shapes-int8.toml",
];

/// Hybrid models plan the engine's own layout: no gating failure, no needless refusal, and
/// where the engine starts it serves what the plan promised, by vLLM's count of tokens
/// (`(num_blocks - 1) // groups * block_size`).
#[test]
fn hybrid_models_plan_the_engines_own_layout() {
    for file in HYBRID {
        for c in passes(file, &[0, 1, 2, 3]) {
            if c.out.failed.is_none() {
                let (planned, served) = (c.out.planned_tokens.unwrap(), c.out.kv_tokens.unwrap());
                assert!(served >= planned, "{file} {}: {served} < {planned}", c.what);
            }
        }
    }
}

/// The hybrid models over 200 seeds each, judged as the sweep judges (`cargo test --release
/// -p memplan-testbed --test outside -- --ignored --nocapture hybrid_models_over_200`), with
/// the engine's KV allocation hook, without it (the session measures the plan's layout
/// through the engine's allocator) and with neither (nothing measures it: the plan's layout
/// against the engine's own is all there is): prints each file's starts and failed checks and
/// fails on a gating one. The needless refusals it prints (gemma-3 on strix-halo, adversarial
/// seeds such as 184) are not the layout's: a full-attention model of the same tensors and
/// blocks is refused on the same seeds, the full strategy keeping room for its graphs'
/// capture-to-capture variation.
#[test]
#[ignore = "200 seeds per file and engine: run by hand"]
fn hybrid_models_over_200_seeds() {
    let mut failed = Vec::new();
    for file in HYBRID {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/outside")
            .join(file);
        let setup = Scenario::load(path.to_str().unwrap())
            .and_then(Scenario::resolve)
            .unwrap();
        for (engine, hook, tensors) in [
            ("hook", true, true),
            ("no hook", false, true),
            ("unmeasured", false, false),
        ] {
            let cases: Vec<Case> = (0..200)
                .map(|seed| {
                    let mut s = seeded(setup.clone(), seed);
                    s.kv_hook = hook;
                    s.allocator_tensors = tensors;
                    judged(file, format!("{engine} seed={seed}"), s)
                })
                .collect();
            let started = cases.iter().filter(|c| c.out.failed.is_none()).count();
            let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
            for f in acceptance::failures(&cases) {
                *by.entry(f.check.name()).or_default() += 1;
                if acceptance::GATING.contains(&f.check) {
                    failed.push(f.line.clone());
                } else if f.check == Check::NeedlessRefusal {
                    println!("  {}", f.line);
                }
            }
            let mean = cases.iter().filter_map(|c| c.out.kv_vs_oracle).sum::<f64>()
                / started.max(1) as f64;
            println!(
                "{file} ({engine}): {started}/200 started, mean KV/oracle {mean:.4}, checks {by:?}"
            );
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Full-attention layers of two shapes are one vLLM group with a tensor per layer of its own
/// page (vLLM 0.19.0 `get_kv_cache_config_from_groups`, `UniformTypeKVCacheSpecs`): tensors
/// of two sizes, which the session cannot measure as equal tensors through the engine's
/// allocator. An engine without the KV hook then allocates them after the session; the plan
/// kept room for their rounding (these seeds once went 0.6-13% over the oracle, seed 58 97 MiB
/// over the request, when the plan counted on a measurement that did not happen).
#[test]
fn tensors_of_two_sizes_without_the_hook_are_planned_as_unmeasured() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/outside/l4-full-two-shapes-int8.toml");
    let setup = Scenario::load(path.to_str().unwrap())
        .and_then(Scenario::resolve)
        .unwrap();
    let cases: Vec<Case> = [4u64, 9, 13, 58, 84, 97]
        .iter()
        .map(|seed| {
            let mut s = seeded(setup.clone(), *seed);
            s.kv_hook = false;
            judged(
                "l4-full-two-shapes-int8.toml",
                format!("no hook seed={seed}"),
                s,
            )
        })
        .collect();
    let failed: Vec<String> = acceptance::failures(&cases)
        .into_iter()
        .filter(|f| acceptance::GATING.contains(&f.check) || f.check == Check::NeedlessRefusal)
        .map(|f| f.line)
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    for c in &cases {
        assert_kv_unmeasured(c);
    }
}

/// A KV cache that is one backing allocation nothing measures keeps the whole granule bound
/// beside it: rounded up to the bound instead (20 MiB where nothing bounded it, 10 MiB read
/// off the allocator's sizes), the buffer took more from allocators whose granules (19.5 MiB,
/// 6 MiB) do not divide it, and the engine went past the request while serving (seeds 5, 6).
#[test]
fn one_backing_allocation_nothing_measures_keeps_the_whole_granule_bound() {
    passes("arc140v-one-backing-unmeasured.toml", &[4, 5, 6, 7]);
}

/// Tensors too small for the allocator to round on their own share its segments: a size they
/// were measured at bounds no granule, and a cache cut to it is served below its plan (a K and
/// a V tensor per layer of 0.83 MiB at half size, two to a 2 MiB segment, read as 1 MiB each,
/// cut a session that took one measured size for a bound on the granule 10% below its plan).
#[test]
fn small_kv_tensors_sharing_segments_bound_no_granule() {
    passes("h200-tiny-split-kv-tensors.toml", &[0, 1, 2]);
}

/// A neighbour that takes memory between the graph phase's teardown and the plan: the plan step
/// opens with no synchronize of its own, and the change used to land after the plan (at the KV
/// cache's allocation), out of the oracle's sight, and the engine ran out of memory serving its
/// burst. Landing before the plan, as the scenario format says, the plan's allocation probe
/// finds the memory gone.
#[test]
fn a_neighbour_taking_memory_before_the_plan_is_seen_by_it() {
    passes("3090-mla-neighbour-takes-before-plan.toml", &[0, 1, 2, 3]);
}

/// A model's weights are many tensors, and PyTorch serves those of 1 - 10 MiB from 20 MiB
/// segments: beside an allocator granule that does not divide 20 MiB (19.5 MiB on seed 5) their
/// reading pulled the common divisor of the allocator's readings to 512 KiB, the plan kept 2 MiB
/// per KV tensor nothing measures, and the engine ran out of memory capturing its graphs. The
/// weights' reading is left out of the granule's bound where that keeps a coarser divisor.
#[test]
fn weights_in_mid_sized_segments_do_not_narrow_the_granule_bound() {
    passes(
        "7900xtx-rocm55-small-model-weights-beside-coarse-granule.toml",
        &[4, 5, 6],
    );
}

/// A neighbour that frees memory between the graph phase's teardown and the plan: the plan was
/// capped by the free memory read at the teardown, with the neighbour's 4 GiB still held, and
/// refused where 65k tokens fitted. The plan opens with a synchronized reading, as every engine
/// step does.
#[test]
fn a_neighbour_freeing_memory_before_the_plan_leaves_it_free() {
    passes("4090-gpt-oss-neighbour-frees-before-plan.toml", &[1, 5]);
}

/// The weights beside one activation peak bound the allocator's granule at their common
/// divisor (1 MiB, where the granule is 19 MiB and the weights sit in 20 MiB segments), which
/// ended the session's warm-ups for the granule at once, and a one-backing KV cache nothing
/// measures went past the request. The warm-ups go on until the readings other than the
/// weights bound it.
#[test]
fn weights_beside_one_peak_do_not_end_the_warm_ups_for_the_granule() {
    passes(
        "arc140v-small-model-one-backing-weights-beside-one-peak.toml",
        &[31, 32, 33],
    );
}

/// The same engine's warm-ups take 237 KiB a token beside a profile run of 32 KiB a token (its
/// activation peak of 513 MiB for 16,384 batched tokens), and the session's warm-ups for the
/// allocator's granule, up to 14,889 tokens (3.4 GiB), went 71 and 233 MiB past the request at
/// the plan step (seeds 32 and 33), where the engine alone takes nothing: memplan's own. Held to
/// what the request leaves by what the smaller ones took per token, they stay within it, and
/// the granule they measure keeps the cache as large (99.4% and 99.5% of the oracle before).
#[test]
fn warm_ups_for_the_granule_stay_within_the_request() {
    let cases = cases_with(
        "arc140v-small-model-one-backing-weights-beside-one-peak.toml",
        &[31, 32, 33],
        |_| {},
    );
    let over: Vec<String> = acceptance::failures(&cases)
        .into_iter()
        .filter(|f| f.check == Check::OverRequestBeforePlan)
        .map(|f| f.line)
        .collect();
    assert!(over.is_empty(), "{}", over.join("\n"));
    for c in &cases {
        let x = c.out.kv_vs_oracle.unwrap_or(0.0);
        assert!(x >= 0.99, "{}: {:.2}% of the oracle", c.what, x * 100.0);
    }
}

/// A free reading that moves in coarse steps reads calibration's test capture as leaving
/// nothing where the runtime kept some of it: an RTX 3090 reading in 32 MiB steps kept 20 MiB
/// held from before the engine's weights, which then took the request, and the start-up went
/// 20 MiB past it, named by nothing (seed 2); an RTX 4090 reading in 256 MiB steps kept 1.96 MiB
/// (seed 9). What the session's checks left held is named within the reading's window error
/// (`checks_left_held`): what the reading cannot see is the most it can be off by.
#[test]
fn what_a_coarse_free_reading_cannot_see_calibration_leave_held_is_named() {
    for (file, seed) in [
        ("neighbour-before-profile-3090.toml", 2),
        (
            "releases-budgets-quirks/quirk-free-step-256mib-rtx4090.toml",
            9,
        ),
    ] {
        for c in passes(file, &[seed]) {
            assert!(c.out.checks_left_held.is_some(), "{file} {}", c.what);
        }
    }
}

/// An engine whose first graph cannot be instantiated even alone, with no KV cache: its graph
/// phase takes the process to the device's limit whatever memplan does. Post-capture's captures
/// (the engine's own graphs, kept), with a smaller draw of their capture-to-capture variation,
/// got two graphs further than the engine alone before the third ran out, and were judged
/// 1.02 GiB past the engine's own graph phase (seed 9): the engine alone's mark was how far it
/// got before the allocation that failed. The start-up is refused, rightly: its weights and
/// activation peak already leave the request no room for a KV cache, so the plan's refusal now
/// comes before the graph phase.
#[test]
fn graphs_the_engine_alone_cannot_capture_are_the_engines_to_the_devices_limit() {
    for c in passes("real-shapes/o9-139-neigh0-rtx4090-qwen25-7b.toml", &[9]) {
        let why = c.out.failed.as_deref().unwrap_or_default();
        assert!(
            why.contains("graphs do not fit") || why.contains("before the graph phase"),
            "{}: {why}",
            c.what
        );
    }
}

/// The files of `tests/outside/real-shapes/`, sorted by name.
fn real_shapes() -> Vec<String> {
    folder("real-shapes")
}

/// The files of `tests/outside/<name>/`, sorted by name.
fn folder(name: &str) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/outside")
        .join(name);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".toml"))
        .collect();
    files.sort();
    files
}

/// Every `shards`-th file of `tests/outside/<name>/` from `shard` on, each on one seed (its
/// place in the list, modulo `seeds`), judged as [`passes`] judges.
fn folder_passes(name: &str, shard: usize, shards: usize, seeds: u64) {
    for (i, file) in folder(name).iter().enumerate().skip(shard).step_by(shards) {
        passes(&format!("{name}/{file}"), &[i as u64 % seeds]);
    }
}

/// Every file of `tests/outside/<name>/` on `seeds`, judged by the gating rules alone (the
/// needless refusals a folder was written with stay open).
fn folder_passes_the_gating_rules(name: &str, seeds: &[u64]) {
    let mut failed = Vec::new();
    for file in folder(name) {
        let cases = cases_with(&format!("{name}/{file}"), seeds, |_| {});
        failed.extend(
            acceptance::failures(&cases)
                .into_iter()
                .filter(|f| acceptance::GATING.contains(&f.check))
                .map(|f| f.line),
        );
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Every `shards`-th file of `tests/outside/real-shapes/` from `shard` on, each on one seed (its
/// place in the list, modulo 40: the seeds differ from file to file).
fn real_shapes_pass(shard: usize, shards: usize) {
    folder_passes("real-shapes", shard, shards, 40);
}

// Scenario files written from docs/scenarios.md alone, outside the test-bed's generator: real
// model shapes from their config.json (Llama-3.1-8B/70B, Llama-3.2-1B, Qwen2.5 0.5B to 72B,
// Mistral-7B's sliding window, gemma-3 1B to 27B's sliding and global layers, gpt-oss-20b and
// 120b, DeepSeek-V2-Lite's MLA latent, Phi-3-mini), with bf16, fp8 or 4-bit weights as the
// request allows, on every simulated profile, with physics pinned high or low or forced
// adversarial, utilisations from 0.05 to 1 and byte budgets, every cache dtype, block sizes 1
// to 256, neighbours taking and freeing memory before each step, other processes, unsorted
// and duplicated size lists, workspaces up to 8 GiB, engines with and without the KV hook and
// allocator tensors in each allocation layout, the selector's quirks, uncalibrated sessions,
// no post-capture sizing, engine hints, contexts from 256 tokens to 262,144, and the liar
// profiles. Each passed on seeds 0 to 39 when written (`real_shapes_over_40_seeds`); in four
// shards so that they run side by side.
#[test]
fn real_shapes_pass_the_gating_rules_0() {
    real_shapes_pass(0, 4);
}

#[test]
fn real_shapes_pass_the_gating_rules_1() {
    real_shapes_pass(1, 4);
}

#[test]
fn real_shapes_pass_the_gating_rules_2() {
    real_shapes_pass(2, 4);
}

#[test]
fn real_shapes_pass_the_gating_rules_3() {
    real_shapes_pass(3, 4);
}

/// Every file of `tests/outside/real-shapes/` on seeds 0 to 39.
#[test]
#[ignore = "40 seeds per file: run by hand (a release build takes about two minutes)"]
fn real_shapes_over_40_seeds() {
    let seeds: Vec<u64> = (0..40).collect();
    for file in real_shapes() {
        passes(&format!("real-shapes/{file}"), &seeds);
    }
}

/// Where the files of the second battery written from the docs alone live.
const RELEASES_BUDGETS_QUIRKS: &str = "releases-budgets-quirks";

/// Every `shards`-th file of `tests/outside/releases-budgets-quirks/` from `shard` on, each on
/// one seed (its place in the list, modulo 20).
fn releases_budgets_quirks_pass(shard: usize, shards: usize) {
    folder_passes(RELEASES_BUDGETS_QUIRKS, shard, shards, 20);
}

// Scenario files written from docs/scenarios.md, docs/simulator-physics.md, the README and
// shared/data alone, on what `real-shapes/` does not cover: every engine release's KV
// allocation (vLLM 0.19's tensor per layer, 0.29's one backing buffer with ROCm's padding,
// SGLang's K and V apart and paired) with and without the KV hook and allocator tensors, byte
// budgets beside the same utilisation, models from a 48 MiB one on a 192 GiB device to ones
// near the edge of fitting and ones that cannot fit (weights over the device, over the request,
// one request over the room: a refusal that names why), contexts to a million tokens, many
// short sequences with capture sizes to 2,048, MoE (Qwen3-30B-A3B's 18,867 weight tensors,
// gpt-oss-120b) and MLA (DeepSeek-V3 pipeline ranks) shapes, hybrids of two windows, a window
// past the context and pages of two head counts, every selector quirk alone and combined
// (declared exact, uncalibrated, stepped, stale or leaky readings, free equal to total,
// Sysman off, APU pools) but the misreported totals, neighbours that hold, grow and shrink
// at each step, engine hints, eager engines, every cache dtype and block sizes 1 to 512, and
// shared/data's logs as scenarios. Each passed on seeds 0 to 19 when written
// (`releases_budgets_quirks_over_20_seeds`); in four shards so that they run side by side.
#[test]
fn releases_budgets_quirks_pass_the_gating_rules_0() {
    releases_budgets_quirks_pass(0, 4);
}

#[test]
fn releases_budgets_quirks_pass_the_gating_rules_1() {
    releases_budgets_quirks_pass(1, 4);
}

#[test]
fn releases_budgets_quirks_pass_the_gating_rules_2() {
    releases_budgets_quirks_pass(2, 4);
}

#[test]
fn releases_budgets_quirks_pass_the_gating_rules_3() {
    releases_budgets_quirks_pass(3, 4);
}

/// A neighbour that takes the rest of an H100 just before the plan: the start-up refuses, and
/// the engine alone beside the neighbour runs out of memory loading, capturing nothing. The
/// run's graph phase ran before the neighbour came, beside the others of the start, and its
/// captures varied as the engine alone's do there; judged beside the engine alone that captured
/// nothing (no variation at all), a post-capture pass within that variation read as memplan's
/// own, 31 MiB (seed 16) and 11 MiB (seed 98) past the request before the plan. A refusal's
/// steps are judged beside the fuller of the two engines alone, their variation included.
#[test]
fn a_refusal_after_a_neighbour_grew_is_judged_with_the_engines_capture_variation() {
    for c in passes(
        &format!("{RELEASES_BUDGETS_QUIRKS}/neigh-grow-past-room-h100-80gb.toml"),
        &[16, 98],
    ) {
        let why = c.out.failed.as_deref().unwrap_or_default();
        assert!(why.contains("start-up refused"), "{}: {why}", c.what);
    }
}

/// Every file of `tests/outside/releases-budgets-quirks/` on seeds 0 to 19.
#[test]
#[ignore = "20 seeds per file: run by hand in a release build"]
fn releases_budgets_quirks_over_20_seeds() {
    let seeds: Vec<u64> = (0..20).collect();
    for file in folder(RELEASES_BUDGETS_QUIRKS) {
        passes(&format!("{RELEASES_BUDGETS_QUIRKS}/{file}"), &seeds);
    }
}

/// A runtime that reports the card 512 MiB larger than it is (`total-over`, a backend bug) on a
/// ROCm card whose DRM sysfs counters read the card's memory a second time: the plan takes the
/// smaller total and says so (`driver_total_above_device`), so a share of the device stays
/// within the card. Taking 0.9 of the runtime's figure was about 450 MiB past the request on
/// every seed.
#[test]
fn a_total_reported_too_high_beside_drm_counters() {
    let cases = passes("mi300x-total-reported-too-high.toml", &[0, 1, 2]);
    for c in &cases {
        assert_warns(c, |w| w.code() == "driver_total_above_device");
    }
}

/// The same misreport on an H200 (CUDA), where NVML's framebuffer total less the framebuffer it
/// reports reserved reads the card a second time: the plan takes that and says so. With no
/// second reading, 0.9 of the runtime's figure was about 460 MiB past the request on every
/// seed.
#[test]
fn a_total_reported_too_high_beside_nvml() {
    let cases = passes("h200-total-reported-too-high.toml", &[0, 1, 2]);
    for c in &cases {
        assert_warns(c, |w| w.code() == "driver_total_above_device");
    }
}

/// An uncalibrated ROCm 6.2 card (free declared good to 16 MiB) whose free reading reports the
/// total whatever is allocated: the session's own windows over known allocations never move, so
/// the reading is unavailable (as calibration would make it) and the plan measures the memory
/// outside the allocator by the allocation probe. Taken as approximate, the windows read nothing
/// of the engine's graphs and a post-capture plan went 1.4-1.9 GiB past the request.
#[test]
fn an_uncalibrated_free_reading_that_never_moves() {
    let cases = passes("rocm62-free-equals-total-uncalibrated.toml", &[0, 1]);
    for c in &cases {
        assert_warns(c, |w| {
            w.code() == "calibration_downgrade"
                && w.to_string().contains("driver_free")
                && w.to_string().contains("unavailable")
        });
    }
}

/// An APU whose runtime reports the VRAM aperture (512 MiB) as its total while the GPU
/// allocates from system memory: calibration finds the total describes another pool and makes
/// it unavailable, so a byte budget is held to itself and the device-wide reading, not to the
/// aperture. Held to the aperture, a 40 GiB budget was refused as "more than the device total
/// 512.00 MiB" where the device holds ~250k tokens; and allocation probes capped at it measured
/// nothing the engine held outside its allocator (seed 10: 100.81% of the oracle).
#[test]
fn a_byte_budget_beside_a_total_that_describes_another_pool() {
    passes("strix-halo-aperture-total-byte-budget.toml", &[0, 1, 10]);
}

/// The same APU with a share of the device (`gpu_memory_utilization`): the runtime's total is
/// the aperture, which calibration makes unavailable, and the share is taken of the device's
/// memory as DRM's counters read it (the GTT limit plus the carve-out), said by name. With no
/// total to take a share of, every seed was refused ("give an absolute memory budget") where
/// the device holds ~400k tokens.
#[test]
fn a_share_of_the_device_beside_a_total_that_describes_another_pool() {
    let cases = passes("strix-halo-aperture-total-utilization.toml", &[0, 1, 4]);
    for c in &cases {
        assert_warns(c, |w| w.code() == "utilization_of_device_total");
    }
}

/// The same APU declared exact and never calibrated: the session runs calibration's check of the
/// pool itself (one allocation larger than the free reading says is left fits), so the
/// aperture's free and total become unavailable as calibration would make them. Trusted, the
/// aperture's total refused an 8 GiB model as "more than the device total 512.00 MiB".
#[test]
fn an_uncalibrated_total_that_describes_another_pool() {
    let cases = passes(
        "strix-halo-aperture-declared-exact-uncalibrated.toml",
        &[0, 1, 4],
    );
    for c in &cases {
        assert_warns(c, |w| {
            w.code() == "calibration_downgrade"
                && w.to_string().contains("driver_total")
                && w.to_string().contains("another pool")
        });
        assert_warns(c, |w| w.code() == "utilization_of_device_total");
    }
}

/// An eager engine whose hybrid cache (two full-attention shapes beside a sliding window, K and
/// V apart) is not one layout of equal tensors the session could allocate to measure, and whose
/// start-up reserves only its weights and one activation peak: those two readings bounded the
/// allocator's 2 MiB granule at 64 MiB, and every seed was refused while the oracle held a
/// request. Its allocator offers tensors, and single tensors of odd sizes now measure the
/// granule.
#[test]
fn a_granule_measured_by_single_tensors() {
    passes("a770-eager-hybrid-split-kv-tensors.toml", &[0, 4]);
}

// Files of an outside battery that still break a rule, kept so that the rule can be worked on
// and checked where the battery itself is gone. Each test asserts what passing means, and is
// ignored until it passes.

/// An engine with neither the KV hook nor allocator tensors, whose warm-ups reserve nothing:
/// the allocator's granule is bounded from two readings only, the weights (980 MiB of 20 MiB
/// segments) and the activation peak (70 MiB in 72). Their common divisor, 4 MiB, is finer
/// than the granule that adversarial physics drew, and the cache's 24 tensors once took about
/// 250 MB more than the plan kept: 100.72% of the oracle on seed 31. The peak wasted 2 MiB, as
/// much as PyTorch's rounding can leave: nothing shows the weights' segments to be multiples of
/// the granule, nothing bounds it, and the plan keeps a 20 MiB segment per KV tensor (about 96%
/// of the oracle). The class stays open where the peak wastes less than 2 MiB: a
/// granule other than PyTorch's 2 MiB that does not divide the divisor (Qwen2.5-0.5B on an Arc
/// B580, 101-103% of the oracle on 3 of 100 adversarial seeds) is not told apart from it.
#[test]
fn two_readings_that_bound_the_granule_too_fine() {
    passes("open/two-readings-granule-too-fine-rocm55.toml", &[31]);
}

/// The same two readings where the activation peak wasted less than 2 MiB (460.8 MiB in 462 on
/// seed 12): no more than PyTorch's 2 MiB rounding can leave, but one request rounded to any
/// granule wastes that little where its size falls close below a multiple of it, so nothing
/// shows the weights' 20 MiB segments to be multiples of the granule, and their common divisor
/// (14 MiB) bounds nothing: the plan keeps the mid-sized segment per KV tensor. Kept as the
/// bound, a granule that does not divide it (adversarial physics) took the cache past the
/// oracle: 101.11% on seeds 12 and 83, 103.41% on seed 91 (B580, 4 of 0-199 over the oracle ->
/// 0, mean share 86.01% -> 85.12%); on an Arc 140V in fp32 at a utilisation of 1.0 the serving
/// burst ran out of memory (seed 12; 1 of 0-199 -> 0, mean share 94.74% -> 92.79%).
#[test]
fn two_readings_beside_a_peak_that_wasted_under_2_mib() {
    passes(
        "two-readings-waste-under-2mib-b580-qwen25-0.5b.toml",
        &[12, 83, 91],
    );
    passes(
        "two-readings-waste-under-2mib-arc140v-sglang-fp32.toml",
        &[0, 12],
    );
}

/// An eager engine on an Arc A770 whose only free reading is process-local, a neighbour taking
/// 2 GiB before the weights (adversarial seed 38): the last physical probe proves the KV cache as
/// the plan rounds it, and the hook's measured allocation takes 235 MB more. Judged against the
/// request's budget alone it was kept and serving ran out of memory; past what the probe proved
/// it is kept only where what the engine needs beside it is still allocatable.
#[test]
fn a_measured_cache_beside_an_unseen_neighbour_is_held_to_the_proven_room() {
    passes(
        "a770-process-local-free-neighbour-2g-eager-serve-oom.toml",
        &[0, 1, 2, 38],
    );
}

/// An engine whose capture keeps its warm-ups' cached segments, warm-ups that leave more than
/// the profile run, the full strategy (adversarial seeds 9, 18, 157, each under
/// `max_split_size_mb`): the warm-ups take more than the device has beside the weights, the
/// engine alone fills the device in its capture and fits no KV cache. The session saw its
/// allocator give the cache back to serve a warm-up and counts what they all took: the start-up
/// is refused. It planned a 19.4 GB cache from what the last warm-ups left cached (6.9 GB), and
/// the engine's capture went 4.47-5.00 GB past the request (over the oracle); seeds 1 and 18 of
/// the same setting on an L4 ran out of memory instantiating a graph. Seeds 0-8 plan as before.
#[test]
fn warm_ups_a_keeping_capture_leaves_cached_are_in_the_reserve() {
    let cases = passes(
        "a100-capture-keeps-cache-warm-ups-above-profile-run-full.toml",
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 18, 157],
    );
    for c in cases
        .iter()
        .filter(|c| ["seed=9", "seed=18", "seed=157"].contains(&c.what.as_str()))
    {
        let why = c.out.failed.as_deref().unwrap_or_default();
        assert!(why.contains("start-up refused"), "{}: {why}", c.what);
        assert!(c.out.oom.is_none(), "{}: {:?}", c.what, c.out.oom);
    }
}

/// A 2 GiB budget on an H200 with nothing calibrated: the session's check of the exact free
/// reading allocates no more at once than calibration would (1 GiB), where windows of an
/// eighth of free memory went 15.5 GiB past the request in the session's start on every seed.
#[test]
fn a_small_budget_on_a_large_device_is_not_passed_by_the_starts_checks() {
    passes(
        "h200-small-budget-uncalibrated-start.toml",
        &[0, 1, 2, 3, 4, 5, 6, 7],
    );
}

/// Requests below calibration's largest allocation, known before the start
/// (`Session::start_for`, `begin_for`): a 3% share of an RTX 4090, calibrated (287 MiB past
/// the request in the session's start on every seed), and a 256 MiB budget on an L4 with
/// nothing calibrated (2.7 GiB past it).
#[test]
fn a_request_smaller_than_calibration_is_not_passed_by_the_starts_checks() {
    for file in [
        "rtx4090-three-percent-share-calibrated-start.toml",
        "l4-256mib-budget-uncalibrated-start.toml",
    ] {
        passes(file, &[0, 1, 2, 3, 4, 5, 6, 7]);
    }
}

/// A refused start-up whose weights pass a 16 GiB budget on Strix Halo (adversarial seeds 41,
/// 51, 87, 99): what the session's checks left held before the engine's weights took the request
/// is named within the window error the plan keeps for any window, not the largest calibration
/// saw. On seed 87 the process went 12,962,816 B past the request and the engine's own weights
/// mark, 2,512 B past 5.43 MiB measured within the 6.93 MiB seen.
#[test]
fn a_leftover_at_the_named_figure_is_covered() {
    passes(
        "strix-halo-weights-past-budget-leftover-at-the-named-figure.toml",
        &[41, 51, 87, 99],
    );
}

/// The same two readings the other way, on world physics: weights that reserved 2,280 MiB
/// beside an activation peak of 1,440 MiB bound the granule at their common divisor, 120 MiB,
/// where it is 2 MiB. An eager engine with neither the KV hook nor allocator tensors kept 120
/// MiB for each of its 52 K and V tensors, more than its budget, and was refused on 26 of 40
/// seeds while the oracle holds 142,768 tokens. The readings do not rule out a granule of 120
/// MiB, but any granule up to it shares its segments between tensors far smaller than it
/// (PyTorch's best-fit reuse and splitting): the plan keeps what that takes, under twice the
/// tensors' bytes and one bound, and starts (about half the oracle, the granule unknown).
#[test]
fn a_granule_bound_far_coarser_than_the_tensors_is_not_kept_whole_per_tensor() {
    passes(
        "open/two-readings-granule-too-coarse-b580.toml",
        &[
            0, 2, 3, 5, 7, 8, 11, 14, 15, 18, 19, 20, 21, 22, 23, 25, 26, 28, 29, 30, 32, 35, 36,
            37, 39,
        ],
    );
}

/// The same file on seed 1, where the weights and the peak both read as allocated whole
/// (2,040 and 1,440 MiB, sharing 120 MiB): still refused ("824 fit in 51.56 MiB", 3.99 GiB
/// of 4.04 kept for the rounding) while the oracle holds a request. The engine states
/// `max_split_size_mb:20` (and `large_segment_size_mb:12`): a KV tensor of 11-17 MiB split off
/// a segment of a granule of 40, 60 or 120 MiB leaves a free block of 20 MiB or more, which
/// serves no smaller request, so no two tensors share a segment and each may take 120 MiB.
/// Nothing the session read rules that granule out: 17 weight tensors of 20-120 MiB (not
/// split, each its own segment, read as allocated whole) and one unsplit activation of 1,440 MiB give these
/// very readings on a 120 MiB granule, where the engine's 52 tensors would take 6.09 GiB of
/// 4.04. The engine offers neither the hook nor allocator tensors and its warm-ups reserve
/// nothing, so the session has nothing to measure the granule with; where its warm-ups
/// reserve, they do (`a_granule_two_round_readings_left_coarse_is_narrowed_by_warm_ups`).
#[test]
#[ignore = "open: two readings do not bound the allocator's granule (needless refusals)"]
fn two_readings_that_bound_the_granule_too_coarse() {
    passes("open/two-readings-granule-too-coarse-b580.toml", &[1]);
}

/// A device that reports its total 512 MiB too high (`total-over`, a backend bug) on a machine
/// where NVML does not load (`no-nvml`): nothing reads the card's memory a second time, and
/// nothing the session measures bounds a total from above without filling the device. The plan
/// takes 0.9 of the reported total, as the engine does, and says by name that the total is
/// unchecked (`utilization_of_unchecked_total`); the test-bed then holds the run to 0.9 of the
/// reported total (460.8 MiB past 0.9 of the real one) and no further, the oracle's room
/// included: every seed is about 458 MiB past the real share, within it, and passes every rule
/// (docs/scenarios.md, "Devices that misreport their total"). The same device reporting its
/// total as it is gets the same warning (nothing tells the two apart) and no allowance at all.
#[test]
fn a_total_reported_too_high_without_nvml() {
    let file = "total-over-h200-no-nvml.toml";
    let mib = 1u64 << 20;
    for c in &passes(file, &[0, 1, 2]) {
        assert_warns(c, |w| {
            matches!(
                w,
                memplan_planner::Warning::UtilizationOfUncheckedTotal { .. }
            )
        });
        let allowed = c.out.unchecked_total_allowance.expect("named");
        assert!(
            (460 * mib..=461 * mib).contains(&allowed),
            "{}: {allowed}",
            c.what
        );
        let over = c.out.over_request_bytes.expect("past the real share");
        assert!(over > 400 * mib && over <= allowed, "{}: {over}", c.what);
    }
    let honest = passes_with(file, &[0, 1], |s| {
        s.scenario.device = s.scenario.device.replace("total-over=512MiB,", "");
    });
    for c in &honest {
        assert_warns(c, |w| {
            matches!(
                w,
                memplan_planner::Warning::UtilizationOfUncheckedTotal { .. }
            )
        });
        assert_eq!(c.out.unchecked_total_allowance, Some(0), "{}", c.what);
    }
}

/// An SGLang engine whose pool is shorter than one request of `max_model_len` starts and admits
/// shorter requests (`python/sglang/srt/managers/tp_worker.py`, `TpModelWorker`: `max_req_len =
/// min(context_len - 1, max_total_num_tokens - 1)`, asserted `> 0` from 0.5.14; up to 0.5.13
/// `max_req_len - 5 > 0` too), where vLLM refuses (`_check_enough_kv_cache_memory`). The
/// session told SGLang's rule plans within the oracle and names the cap
/// (`requests_capped_by_pool`); told vLLM's, it refuses, which the oracle finds needless for
/// SGLang's engine and right for vLLM's.
#[test]
fn an_sglang_pool_shorter_than_the_context_is_planned_and_capped() {
    use memplan_testbed::scenario::StartRule;
    let file = "h200-sglang-pool-shorter-than-context.toml";
    for rule in [StartRule::Sglang0514, StartRule::Sglang051] {
        for c in passes_with(file, &[0, 1, 2], |s| s.start_rule = rule) {
            assert!(c.out.failed.is_none(), "{rule:?} {}: refused", c.what);
            let x = c.out.kv_vs_oracle.expect("judged against the oracle");
            assert!(x >= acceptance::floor(&c), "{rule:?} {}: {x}", c.what);
            let plan = c.out.plan.as_ref().expect("a plan");
            assert!(
                plan.kv.tokens < 32768,
                "{rule:?}: the pool holds the context"
            );
            assert_warns(&c, |w| {
                matches!(w, memplan_planner::Warning::RequestsCappedByPool { longest, pool_tokens, max_model_len: 32768, .. }
                    if *longest + 1 == *pool_tokens && *pool_tokens == plan.kv.tokens)
            });
        }
    }
    // The session told vLLM's rule refuses, rightly for vLLM's engine; the same refusal of
    // SGLang's engine, whose own rule starts with this pool, is needless (what memplan did
    // before it knew the rule).
    let refused = cases_with(file, &[0], |s| s.start_rule = StartRule::Vllm);
    let c = &refused[0];
    let why = c.out.failed.as_deref().expect("refused under vLLM's rule");
    assert!(why.contains("one request of 32768 tokens"), "{why}");
    assert!(acceptance::failures(&refused).is_empty());
    let mut sglang = c.setup.as_deref().expect("a setup").clone();
    sglang.start_rule = StartRule::Sglang0514;
    let as_sglang = [Case {
        setup: Some(Arc::new(sglang)),
        ..c.clone()
    }];
    let f = acceptance::failures(&as_sglang);
    assert!(
        f.iter().any(|f| f.check == Check::NeedlessRefusal),
        "{:?}",
        f.iter().map(|f| &f.line).collect::<Vec<_>>()
    );
    // ...and SGLang's own rule still refuses a pool of no room: 1 token for 0.5.14 on, 6 up to
    // 0.5.13.
    assert!(!StartRule::Sglang0514.starts_short(1, 32768));
    assert!(StartRule::Sglang0514.starts_short(2, 32768));
    assert!(!StartRule::Sglang051.starts_short(6, 32768));
    assert!(StartRule::Sglang051.starts_short(7, 32768));
    assert!(!StartRule::Vllm.starts_short(30000, 32768));
}

/// Every case's graph reserve is at least what the engine's own captures took.
fn assert_reserves_hold(cases: &[Case]) {
    for c in cases {
        let (Some(reserve), Some(real)) = (c.out.estimate, c.out.real_graph) else {
            panic!("{}: no graph estimate or no real graph memory", c.what);
        };
        assert!(
            reserve >= real,
            "{}: reserve {reserve} below the engine's captures' {real}",
            c.what
        );
    }
}

/// An APU whose free reading's windows are off by up to 11 MiB, 67 graphs of 8-16 GB (mostly
/// executable objects, varying from capture to capture): four repeats of the first size ranged
/// within the idle windows' noise and read as no variation, the margin kept only the reading's
/// two windows, and the engine's own captures took more than the measured pass and its margin
/// (seed 4: 33 MB more, past the request in serving before the simulator drew
/// `max_split_size_mb`; seed 6: 2 MB more). A variation that the noise could hide in each
/// capture, summed over every graph, passes those windows: `full` takes twelve repeats there,
/// and its reserve holds what the engine's captures take.
#[test]
fn a_variation_the_noise_hides_is_measured_before_it_sums_over_many_graphs() {
    assert_reserves_hold(&passes("strix-halo-67-sizes-fp32.toml", &[4, 6]));
}

/// An eager engine on an H200 whose free reading moves in 64 MiB steps, its allocator running
/// expandable segments: the KV cache's tensors are packed into 20 MiB pages, rounded once, so
/// no rounding per tensor absorbs a reading that read the engine's memory outside the
/// allocator low (20 MiB a failed capture left, read as 4 MiB). The plan keeps the reading's
/// window error there, as it does for one backing allocation; it went 307 KiB past the request
/// in serving before (seeds 0 and 6).
#[test]
fn expandable_segments_keep_the_free_readings_error_on_memory_outside_the_allocator() {
    for c in passes("h200-eager-free-step.toml", &[0, 6]) {
        let plan = c.out.plan.as_ref().expect("planned");
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains("expandable_segments:True")),
            "{}: the seed no longer draws expandable segments: {:?}",
            c.what,
            plan.notes
        );
    }
}

/// The same APU at physics the world allows: where the automatic choice samples, the graphs'
/// intermediates differ from size to size (not monotone in the batch), and each graph's live
/// output, placed best-fit in the hole the freed intermediates left, shrinks that hole faster
/// than the next intermediates shrink. The shared pool grew to five blocks of the largest
/// intermediates where `sampled` allowed two, and the plan went up to 67 MiB past the request
/// in serving (seeds 505, 528, 737; at 706 only its reserve fell short). The allowance now
/// counts a block for every block's worth of live outputs.
#[test]
fn sampled_counts_the_blocks_live_outputs_take_from_the_pool() {
    assert_reserves_hold(&passes(
        "strix-halo-67-sizes-fp32.toml",
        &[505, 528, 706, 737],
    ));
}

/// An APU whose runtime reports the VRAM aperture: the session measures by allocation probes,
/// and the conservative strategy's analytic bound (2.03 GiB) gives way to what the probes showed
/// the graphs take (10.89 GiB) and a margin for the variation of twelve repeats (15% either way
/// on adversarial seed 22). The engine's own later capture took 2.75 MB more than that reserve,
/// within the margin the plan warned of by name (`graph_capture_varies`): a variation named,
/// not a bound that failed. A shortfall past that margin still fails.
#[test]
fn a_reserve_short_by_a_capture_variation_the_plan_named_is_reported_not_failed() {
    for c in passes("strix-halo-aperture-probed-capture-variation.toml", &[22]) {
        assert_warns(&c, |w| {
            matches!(w, memplan_planner::Warning::GraphCaptureVaries { .. })
        });
        let (Some(reserve), Some(real)) = (c.out.estimate, c.out.real_graph) else {
            panic!("{}: no graph estimate or no real graph memory", c.what);
        };
        let margin = acceptance::warned_capture_margin(&c).expect("a named margin");
        assert!(
            real <= reserve + margin,
            "{}: {reserve} + {margin} < {real}",
            c.what
        );
        // The same run, its later capture past the named margin: a reserve below the real.
        let mut past = c.clone();
        past.out.real_graph = Some(reserve + margin + 1);
        let cases = [past];
        let checks: Vec<Check> = acceptance::failures(&cases)
            .iter()
            .map(|f| f.check)
            .collect();
        assert!(checks.contains(&Check::ReserveBelowReal), "{checks:?}");
    }
}

/// An APU whose runtime reports the VRAM aperture, an eager engine: the session measures by
/// allocation probes, searched up to the device-wide reading of what is available. That
/// reading is approximate, and a probe whose whole search fits reads its ceiling: 11 MiB low
/// on adversarial seed 16 before calibration's captures, where the probes' steps start, so the
/// memory the engine held outside its allocator came out short by about that, and the plan
/// went 0.56% past the oracle and 1.06 MiB past the request. Declared exact, the reading is
/// just as low and declares no tolerance to search past it. The probes now search up to the
/// device-wide total.
///
/// The engine runs SGLang's rules, which size its pool from its own free readings, and the
/// aperture's free reading stays where it was whatever the process allocates: the engine's own
/// rule keeps a pool of a few MiB whatever it is told, and the plan says by name that it
/// cannot model that reading (`engine_pool_unmodelled`). The plan itself is held to the oracle.
#[test]
fn allocation_probes_search_past_an_approximate_device_wide_reading() {
    let cases = [
        passes("strix-halo-aperture-eager-probe-ceiling.toml", &[16]),
        passes(
            "strix-halo-aperture-declared-exact-eager-probe-ceiling.toml",
            &[16],
        ),
    ];
    for c in cases.iter().flatten() {
        let planned = c.out.planned_tokens.unwrap() as f64;
        let oracle = c.out.oracle_tokens.unwrap() as f64;
        assert!(
            (0.99..=1.005).contains(&(planned / oracle)),
            "{}: {planned} of {oracle}",
            c.what,
        );
        assert_warns(c, |w| {
            matches!(w, memplan_planner::Warning::EnginePoolUnmodelled { .. })
        });
        assert_eq!(c.out.kv_tokens, c.out.engine_pool_tokens, "{}", c.what);
    }
}

/// An APU declared exact whose free reading moves by a few hundred KiB: `full`'s twelve repeats
/// of the first size ranged less than the idle windows beside them, and with the idle windows'
/// range taken off whole no margin was kept for the capture-to-capture variation the noise hid
/// (the executable objects varied by 2.1% each); the engine's 35 captures took 2.8 MB more than
/// the measured pass and serving went 545 KiB past the request (seed 11). What is taken off is
/// what the idle windows surely show of the noise.
#[test]
fn a_variation_within_the_idle_windows_range_is_kept() {
    for c in passes("strix-halo-declare-exact-mla-one-backing-full.toml", &[11]) {
        assert_eq!(
            c.out.strategy,
            memplan_planner::strategy::StrategyKind::Full,
            "{}",
            c.what
        );
    }
}

/// A stale free reading (the automatic choice bounds the graphs: `conservative`) on an engine
/// whose capture keeps the allocator's cache, with warm-ups of 400 KiB per token over 51 sizes:
/// `conservative` never asked whether the capture keeps the cache, so no plan counted the
/// warm-ups' segments that stay cached into serving beside the burst, and these seeds went up to
/// 407 MiB past the request and over the oracle. Its own captures (every size, in the engine's
/// order, nothing released in between) now measure what stays cached.
#[test]
fn a_bounded_capture_that_keeps_the_cache_keeps_the_warm_ups_beside_the_burst() {
    let cases = passes("h100-stale-free-keeps-cache-conservative.toml", &[1, 2, 3]);
    assert!(cases
        .iter()
        .all(|c| c.out.strategy == memplan_planner::strategy::StrategyKind::Conservative));
}

/// A device that cannot record the engine's graphs (graph allocation nodes unsupported): the
/// engine runs eagerly, but the graph phase had warmed sizes up before the capture failed, and
/// where the capture keeps the allocator's cache, nothing had released them: they stayed cached
/// into serving beside the burst (these seeds, 25-87 MiB past the request). A graph phase's
/// teardown now releases the cache its warm-ups left.
#[test]
fn an_eager_fallback_leaves_no_warm_up_cached() {
    let cases = passes(
        "a100-no-graph-alloc-nodes-eager-fallback-keeps-cache.toml",
        &[1, 2, 3],
    );
    assert!(cases
        .iter()
        .all(|c| c.out.strategy == memplan_planner::strategy::StrategyKind::None));
}

/// No gating failure of `file` on `seeds` (a refusal, reported beside them, allowed): where
/// nothing the start-up allocated bounds the allocator's rounding below a size the cache cannot
/// hold, a clear refusal is the plan's answer.
fn holds(file: &str, seeds: &[u64]) -> Vec<Case> {
    let cases = cases_with(file, seeds, |_| {});
    let all = acceptance::failures(&cases);
    let gating: Vec<&str> = acceptance::gating(&all)
        .iter()
        .map(|f| f.line.as_str())
        .collect();
    assert!(gating.is_empty(), "{file}:\n{}", gating.join("\n"));
    cases
}

/// An engine whose KV allocation nothing measures, beside an allocator whose mid-sized segments
/// are 64 MiB (declared) and whose activation peak, past the split limit, reads as its whole
/// segment allocated: the weights' segments pulled the granule's bound to 512 KiB, and the
/// engine's tensors went 782 MiB past the request. The weights are left out where the common
/// divisor is no multiple of PyTorch's rounding; the activation's segment bounds the granule,
/// and the plan refuses, naming the rounding it keeps room for.
#[test]
fn weights_in_declared_mid_segments_beside_an_unsplit_peak_bound_nothing() {
    for c in holds(
        "rtx4090-unmeasured-kv-64mib-segments-unsplit-peak.toml",
        &[9],
    ) {
        if let Some(why) = &c.out.failed {
            assert!(why.contains("rounding"), "{}: {why}", c.what);
        }
    }
}

/// The same rule on an Arc 140V with Gemma-3-1B, where the engine ran out of memory in serving
/// on both seeds (30.5 MiB and 18.5 MiB granules under split limits the activation peak passes).
#[test]
fn an_unsplit_activation_peak_beside_mid_segments_keeps_the_engine_in_memory() {
    passes("arc140v-unmeasured-kv-gemma3-unsplit-peak.toml", &[9, 18]);
}

/// An engine whose KV allocation nothing measures, eager, beside weights in 20 MiB segments and
/// an activation peak whose remainder (under 1 MiB) was not split off, so it showed no waste:
/// the two share 4 MiB, and the plan kept that per KV tensor where the allocator's granule was
/// 6, 12, 3 or 1.5 MiB (seeds 12, 31, 37, 54), 100.5-102.1% of the oracle. Nothing shows the
/// weights' segments to be multiples of the granule: the plan keeps the mid-sized segment per
/// tensor, and warns that it could not measure the cache's allocation.
#[test]
fn weights_in_mid_segments_beside_a_peak_that_hides_its_waste_bound_nothing() {
    for c in passes(
        "b580-nosysman-unmeasured-kv-coarse-granule-beside-mid-segments.toml",
        &[12, 31, 37, 54],
    ) {
        assert_kv_unmeasured(&c);
    }
}

/// KV tensors two to a coarse segment, measured tensor by tensor: the last tensor of each such
/// cache was refused the room of a segment it did not take (it fits in the rest of the one
/// before), and the engine served 66.5% of the oracle. A tensor the last segment's free rest
/// holds needs no new segment's room.
#[test]
fn tensors_two_to_a_segment_are_measured_as_they_pack() {
    passes(
        "rtx4090-full-byte-budget-tensors-two-to-a-segment.toml",
        &[4],
    );
}

/// K and V tensors of the caches that measure the granule packed three to a coarse segment read
/// as a granule, and the planned cache was cut by it to 65.6% of the oracle: where a granule
/// cut the count, the count measured tensor by tensor stands where it is larger.
#[test]
fn a_granule_read_on_packed_tensors_does_not_cut_what_fits() {
    passes(
        "rocm62-stale-free-split-kv-tensors-packed-in-halves.toml",
        &[20],
    );
}

/// A KV cache grown past the plan's count, into room the plan kept for the allocator's rounding
/// (a 512 KiB granule measured where 240 MB could not be ruled out), on a free reading declared
/// exact that misses 1.94 GB another process holds: the grown cache took the activation's
/// memory and the first burst ran out of memory. A grown count stands only where what the
/// engine needs beside it is still allocatable; here it goes back to the planned count.
#[test]
fn a_kv_cache_grown_past_the_plan_leaves_the_engine_its_activation() {
    passes_with(
        "a770-declared-exact-others-hybrid-grown-kv-cache.toml",
        &[235],
        |s| s.physics = Some("low".into()),
    );
}

/// SGLang's sliding-window pools (Gemma-3-1B: 22 sliding and 4 full-attention layers) with K
/// and V apart, in a room of 646 to 838 MiB on allocators whose granule reads 18.5 to 30.5
/// MiB: the plan kept a whole granule for each of the 52 tensors, whose sizes it did not model
/// for a cache of several groups, and refused to start where the oracle holds a pool of 38,000
/// tokens. The pools give every layer's K and V the same rows, so the tensors are an even
/// share of the cache (a page more at most), and under 10 MiB they share mid-sized segments.
#[test]
fn sliding_window_pools_with_k_and_v_apart_share_segments_in_a_small_room() {
    for c in passes(
        "b580-nosysman-sglang-gemma3-1b-split-kv-small-room.toml",
        &[5, 9, 18],
    ) {
        assert!(c.out.failed.is_none(), "{}: {:?}", c.what, c.out.failed);
    }
}

/// The plan of `c`, which the strategy `kind` made (naming the run, and why it failed where it
/// has no plan).
fn plan_of_strategy(kind: StrategyKind, c: &Case) -> &memplan_planner::plan::Plan {
    assert_eq!(c.out.strategy, kind, "{}", c.what);
    let plan = c.out.plan.as_ref();
    plan.unwrap_or_else(|| panic!("{}: {:?}", c.what, c.out.failed))
}

/// A stale free reading on an APU, where allocation probes measure: a runtime that gives a
/// destroyed graph's memory back 17 synchronizes after the release, past the settle's 8, and
/// nothing that reads when it is back. The teardown's probe read 13.7 GiB still held, the plan
/// counted it beside the graphs the engine captures again, and refused a start-up the oracle
/// holds over 200,000 tokens for. Every release of graphs now waits the whole late-release
/// count where no reading can end the wait early.
#[test]
fn a_late_graph_release_no_reading_sees_is_waited_out() {
    for c in passes(
        "strix-halo-stale-free-late-graph-release-conservative.toml",
        &[4, 12, 17],
    ) {
        let plan = plan_of_strategy(StrategyKind::Conservative, &c);
        // The graphs' memory, back only after the teardown's probe had waited for it, is not
        // the engine's: what the plan counts outside the allocator is less than the graphs took.
        let outside = plan
            .consumers
            .bytes(memplan_planner::ConsumerKind::NonAllocator);
        let graphs = c.out.real_graph.expect("the graphs' memory");
        assert!(
            outside < graphs,
            "{}: {outside} outside the allocator, graphs {graphs}",
            c.what
        );
    }
}

/// A stale free reading on an RTX 3090, where allocation probes measure: a library takes 440
/// MiB on the process's first capture and keeps it. The probed pass was that capture, so it
/// counted the 440 MiB as graphs, and the teardown's probe counted it again as memory the
/// phase did not give back: refused where the oracle holds 6,825 to 11,682 tokens. The first size
/// is now captured and released once before the pass, as `full` does.
#[test]
fn a_first_capture_workspace_is_counted_once_where_probes_measure() {
    for c in passes(
        "rtx3090-stale-free-first-capture-workspace-conservative.toml",
        &[10, 12, 15],
    ) {
        let plan = plan_of_strategy(StrategyKind::Conservative, &c);
        // The library's memory is counted where it stays, as held outside the allocator after
        // the teardown (and the start-up planned, so not also as graphs).
        let setup = c.setup.as_deref().expect("the case's setup");
        let workspace = open(setup).unwrap().physics().lazy_first_capture_bytes;
        let outside = plan
            .consumers
            .bytes(memplan_planner::ConsumerKind::NonAllocator);
        assert!(
            workspace > 0 && outside >= workspace,
            "{}: {outside} outside the allocator, first-capture workspace {workspace}",
            c.what
        );
    }
}

/// Graphs whose large intermediates (2 GiB at the largest of 51 sizes) share no blocks of the
/// graph pool under `max_split_size_mb`, on an engine that cannot size its KV cache after
/// capture: `full`'s throwaway pass grew until the device was full, where the allocator gave
/// its cached blocks back, and measured only what its end held. The plan kept a KV cache, and
/// the engine's capture beside it went 3.5 GiB past the request (seeds 1 18) or ran out of
/// memory instantiating a graph (seeds 4 16). The pass's graphs are taken at its peak: the
/// graphs fit beside nothing, and the session refuses.
#[test]
fn a_pass_that_gave_memory_back_inside_itself_is_taken_at_its_peak() {
    for c in passes(
        "a100-40gb-max-split-large-intermediates-full.toml",
        &[1, 4, 16, 18],
    ) {
        assert!(c.out.plan.is_none(), "{}: planned", c.what);
    }
}

/// An eager engine whose weights hold more than its request, and a neighbour that takes memory
/// after they loaded: where it left the profile run within what the session's calibration keeps
/// held of fitting, the engine ran out of memory in its profile run on its way to a certain
/// refusal. The plan's budget has no room for a KV cache before the profile run (its activation
/// peak counted as nothing): the session refuses there, and the engine never runs it. Every
/// neighbour size across each seed's edge: refused, the profile run not run, no out-of-memory.
#[test]
fn a_refusal_certain_before_the_profile_run_comes_before_it() {
    const FILE: &str = "rocm62-weights-held-past-request-neighbour-before-profile-run.toml";
    for mib in (160..=512).step_by(8) {
        let cases = passes_with(FILE, &[0, 1, 2], |s| {
            s.neighbour = vec![("profile_run".into(), mib * memplan_core::bytes::MIB)];
        });
        for c in cases {
            let what = format!("{} neighbour={mib} MiB", c.what);
            assert!(c.out.oom.is_none(), "{what}: {:?}", c.out.oom);
            assert!(c.out.plan.is_none(), "{what}: planned");
            assert!(
                !c.out
                    .phase_peaks
                    .iter()
                    .any(|(phase, _)| *phase == "the engine's profile run"),
                "{what}: the profile run ran: {:?}",
                c.out.failed
            );
        }
    }
}

/// The same engine asking for 0.97 of the card: its budget has room before the profile run
/// (1.5 GiB, the activation not measured yet), so nothing is foreseen there. Calibration's test
/// capture left what this runtime keeps of each capture held beside the engine, and where the
/// neighbour left the profile run within that of fitting, it ran out of memory where the
/// engine alone, beside the same neighbour, got through (seeds 0, 1 and 2 at 472-480, 368-376
/// and 184-192 MiB). The engine runs eagerly: the session makes no test capture, and the
/// engine has the room it has alone.
#[test]
fn an_eager_engines_calibration_leaves_nothing_its_profile_run_needs() {
    const FILE: &str = "rocm62-weights-held-past-request-neighbour-before-profile-run.toml";
    for mib in (160..=512).step_by(8) {
        let cases = passes_with(FILE, &[0, 1, 2], |s| {
            s.request = memplan_planner::budget::Request::Utilization(0.97);
            s.neighbour = vec![("profile_run".into(), mib * memplan_core::bytes::MIB)];
        });
        for c in cases {
            assert!(
                c.out.oom.is_none(),
                "{} neighbour={mib} MiB: {:?}",
                c.what,
                c.out.oom
            );
        }
    }
}

/// A free reading that cannot measure graph memory (stale after a synchronize), 36 graphs: the
/// session measures the pass and twelve repeats of its first size by allocation probes. A probe
/// finds the largest raw allocation that succeeds, a whole number of the driver's 2 MiB pages,
/// so executable objects that vary from capture to capture by less than a page read alike in
/// every repeat. The margin was sized from the probes' search resolution (0.37 MiB), and the
/// engine's captures took 2.1 to 5.6 MB more than the reserve (seeds 11, 21, 22); it now counts
/// the page the probes cannot see into as variation. With 400 kernel nodes a graph, the probes
/// counted no page on the safe side of a window at all, and the pass itself read short (seeds
/// 15, 37).
#[test]
fn probed_repeats_that_read_alike_keep_the_page_they_cannot_see_into() {
    const FILE: &str = "rtx3090-stale-free-36-graphs-probed-repeats-within-a-page.toml";
    let conservative = |cases: &[Case]| {
        for c in cases {
            assert_eq!(
                c.out.strategy,
                memplan_planner::strategy::StrategyKind::Conservative,
                "{}",
                c.what
            );
        }
    };
    let cases = passes(FILE, &[11, 21, 22]);
    conservative(&cases);
    assert_reserves_hold(&cases);
    let cases = passes_with(FILE, &[15, 37], |s| s.kernel_nodes = 400);
    conservative(&cases);
    assert_reserves_hold(&cases);
}

/// A runtime that reports its total 1 GiB low, where nothing reads free memory: an allocation
/// of the whole reported total succeeds, so the probe at the baseline searches past it, and
/// the plan takes a share of what the device can allocate and this process held, said by name.
/// Stopped at the reported total, the probe read the weights' step as 809 MB given back and
/// the plan held 26-66% of the oracle on these seeds. What the runtime's context holds is not
/// in the figure (nothing reads it), so a share of it stays below the oracle's share of the
/// real total: about 90% here.
#[test]
fn a_total_reported_low_is_searched_past_where_probes_measure() {
    let cases = passes("b580-nosysman-total-reported-1g-low.toml", &[0, 1, 4, 9]);
    for c in &cases {
        assert_warns(c, |w| {
            matches!(w, memplan_planner::Warning::TotalBelowAllocatable { reported, total, .. }
                if total > reported)
        });
        let x = c.out.kv_vs_oracle.unwrap_or(0.0);
        assert!(x >= 0.73, "{}: {:.2}% of the oracle", c.what, x * 100.0);
    }
}

/// An eager engine whose KV cache nothing measures, with two readings of its allocator: weights
/// in whole 20 MiB segments, and a profile run. Their common divisor (40 MiB) is a mid-sized
/// segment or more, which a granule that coarse divides but a finer one need not: it bounds the
/// rounding, not its steps. Kept as a multiple, these seeds went up to 1.65 GiB past the request
/// and 100.7-123% of the oracle.
#[test]
fn weights_in_mid_segments_sharing_a_coarse_divisor_bound_the_rounding() {
    let cases = passes(
        "rx7900xtx-eager-unmeasured-70-layers-weights-in-mid-segments.toml",
        &[41, 43, 71, 82, 99],
    );
    for c in &cases {
        assert_kv_unmeasured(c);
    }
}

/// 67 capture sizes on an engine that cannot size after capture: sampled. Where the graphs'
/// kernel counts vary in no order with the size, the samples between the extremes are all the
/// margin sees of that: with two of them, seed 57's reserve was 1.29 GB below the engine's
/// graphs (1.1 GiB past the request) and seed 301's 55 MB below. With six, seed 57's margin
/// shows the spread (over 1% of the KV cache's room: every size is measured instead).
#[test]
fn a_sampled_margin_sees_enough_samples_between_the_extremes() {
    let cases = passes(
        "h100-sampled-67-sizes-kernel-counts-in-no-order.toml",
        &[57, 301],
    );
    for c in &cases {
        assert!(
            matches!(c.out.strategy, StrategyKind::Sampled | StrategyKind::Full),
            "{}: {}",
            c.what,
            c.out.strategy
        );
        assert!(c.out.why.contains("sample and model"), "{}", c.out.why);
    }
}

/// Seeds 0 to 6 of the 0 to 20 the outside batteries (o26, o27) ran each of their files on (4
/// and 6 draw adversarial physics): 18 files on 21 seeds doubled the outside tests' time in
/// CI's debug build; the battery reruns all of them (`battery 0 21 FILE`).
fn battery_seeds() -> Vec<u64> {
    (0..7).collect()
}

/// Documented knobs at their extremes together (the o26 battery): neighbours that come and go
/// around the graph phase beside a stale or coarse free reading, deferred release with captures
/// that keep the allocator's cache, VM releases that leak, a free reading stuck at the total, a
/// wrong pool declared exact, Level Zero without Sysman, a consumer card's byte budget with a
/// 128k context, SGLang at a utilisation of 1.0 beside others that leave. Each passes every
/// gating rule with no needless refusal on seeds 0 to 20 (the test runs 0 to 6).
#[test]
fn knobs_at_their_extremes_together() {
    for file in [
        "rtx4090-stale-free-step-64m-neighbour-grows-twice-leaves-before-plan.toml",
        "a100-80gb-stale-free-neighbour-takes-30pc-before-plan.toml",
        "mi300x-deferred-release-capture-keeps-cache-leak-hidden-8m-67-sizes.toml",
        "h100-leak-per-vm-release-2m-post-capture-neighbours.toml",
        "h100-free-equals-total-neighbours.toml",
        "strix-halo-wrong-pool-declared-exact-neighbour-profile-run.toml",
        "a770-sysman-missing-neighbour-4g-before-plan.toml",
        "rocm55-graphics-6g-blind-free-16g-budget-sglang.toml",
        "l4-8gib-budget-128k-context-67-sizes.toml",
        "b580-nosysman-sglang-0-5-14-split-kv-128k-context.toml",
        "h100-sglang-utilization-1-others-leave-before-profile-run.toml",
        "mi300x-unmeasured-kv-67-sizes-full-neighbour-before-graph-phase.toml",
        "mi300x-mla-fp8-ds-one-backing-no-hook.toml",
    ] {
        let cases = passes(file, &battery_seeds());
        assert!(
            cases.iter().any(|c| c.out.failed.is_none()),
            "{file}: no seed started"
        );
    }
}

/// vLLM at a utilisation of 1.0 beside 2 GiB other processes hold at its start: its worker
/// refuses (free memory below the request, `request_memory`), and so does the plan, on every
/// seed, a refusal the oracle forgives (the engine's own start-up check).
#[test]
fn a_utilisation_of_one_beside_others_is_refused_as_vllm_refuses_it() {
    let cases = passes(
        "h100-vllm-utilization-1-others-refused-at-start.toml",
        &battery_seeds(),
    );
    for c in &cases {
        assert!(c.out.plan.is_none(), "{}: planned", c.what);
        let o = c.out.oracle.as_ref().expect("an oracle");
        assert!(o.start_refused, "{}: {:?}", c.what, o);
    }
}

/// Format edges the docs allow, on several layouts: a sliding window of one token, a window
/// past `max_model_len` (SGLang 0.5.23's paired tensors), MLA layers beside sliding layers of
/// the same page (vLLM 0.29's one backing), 64 layer groups, and a page of two bytes a token
/// that holds more than 2^32 tokens on an H200.
#[test]
fn format_edges_plan_within_the_oracle() {
    for file in [
        "rtx4090-sliding-window-of-one-token.toml",
        "rocm62-window-past-max-model-len-paired-kv.toml",
        "strix-halo-mla-beside-sliding-one-backing.toml",
        "h100-64-layer-groups.toml",
    ] {
        passes(file, &battery_seeds());
    }
    for c in passes("h200-two-byte-page-billions-of-tokens.toml", &[0, 1, 2]) {
        let tokens = c.out.kv_tokens.expect("a KV cache");
        assert!(tokens > u64::from(u32::MAX), "{}: {tokens} tokens", c.what);
    }
}

/// A byte budget below what calibration itself allocates (o26 battery, class C1b): a 100 MiB
/// model under a 512 MiB budget on an RTX 4090. The engine alone fits; the session's start held
/// about 1 GiB, past the request with no warning, on every seed, until the start was sized by
/// the request (`Session::start_for`: no check holds more than half of it at once).
#[test]
fn calibration_stays_within_a_small_budget() {
    passes(
        "calibration-within-a-512mib-budget-rtx4090.toml",
        &[0, 1, 2, 3, 4, 5],
    );
}

/// An uncalibrated session's check of its free reading (o26 battery, class C1a): allocations of
/// about an eighth of the device went 5.48 GiB past a 12 GiB budget on an H200, unwarned, on
/// every seed; they are no larger than calibration's, and half the request (`begin_for`).
#[test]
fn an_uncalibrated_free_check_stays_within_the_budget() {
    passes(
        "uncalibrated-free-check-within-a-12gib-budget-h200.toml",
        &[0, 1, 2, 3, 4, 5],
    );
}

/// Full capture of four widely spaced sizes whose captures each keep 3 MiB, a byte budget the
/// plan fills to the byte, adversarial seed 9 (a wide capture variation and a coarse allocator
/// granule; o26 battery, class O1): was 108.20% of the run's oracle. The per-capture memory is
/// in the plan and in the oracle once each (the library's first-capture memory and the 39
/// captures' 3 MiB match the plan's non-allocator figure to the byte). What was short is the
/// graph reserve's variation margin: 32 repeats of the first size ranged 14.7% of it, and their
/// range over d2(32) (the normal's expected range) read a standard deviation of 31.6 MB where
/// their sample standard deviation is 38.2 MB, so the margin kept 229.5 MB and the engine
/// alone's captures took 265.5 MB more than the pass (2,098,735,749 B reserved against
/// 2,134,740,252 B): one granule step of KV blocks past the room. The margin takes the larger
/// of the range's and the sample's standard deviation (277 MB).
#[test]
fn a_capture_variation_is_kept_at_its_sample_standard_deviation() {
    passes(
        "full-capture-kept-per-capture-memory-fills-budget-rtx4090.toml",
        &[9],
    );
}

/// OB1's kind on many seeds (o26 battery): an uncalibrated session on ROCm 6.2 whose raw frees
/// each keep 256 KiB, weights past a 0.7 request (refused, right). The check of the free
/// reading frees its test allocations raw; what they left is named at least as those frees
/// times what a free may keep (seen, else the most the windows could not show), not only
/// within the check's window error, which reading noise passed (3 MiB held, 2.25-2.50 MiB
/// named). Seeds 0-199 on the branch head: gating 4 -> 0 (12 of 200 on main dd8ceeb).
#[test]
fn leaky_frees_of_an_uncalibrated_check_are_named() {
    passes(
        "uncalibrated-leaky-frees-weights-past-request-rocm62.toml",
        &[4, 34, 38, 60, 175, 190, 194],
    );
}

/// OB1's kind, residual (o26 battery): an uncalibrated check's raw frees are named by the most
/// a free may keep as its windows bound it (each pair lost the keep give or take what two reads
/// of the same memory differ by, the idle spread), not by the mean of the pairs' noisy losses
/// (1009 KiB for a device keeping 1 MiB: 16 MiB held, 15.76 MiB named). Seeds 0-199: gating
/// 2 -> 0.
#[test]
fn leaky_frees_are_named_by_the_most_a_free_may_keep() {
    passes(
        "uncalibrated-leaky-frees-seen-keep-rocm62.toml",
        &[0, 1, 79, 190],
    );
}

/// The same under a free reading in 2 MiB steps whose idle reads never move: four frees that
/// kept 4 KiB each read back on the same step, and nothing was named (16 KiB past the request
/// and the engine's own weights; 11 of 200 seeds). Two reads of the same memory may differ by a
/// step, but the reads' common divisor does not show one: an exact reading of round sizes on an
/// idle RTX 4090 shares 14 MiB, and naming the frees by it would warn on every such session.
/// Windows of an odd number of 2 MiB pages tell a step of 4 MiB or more apart (they read off
/// on it, and the pair rules then read the losses against the step), but not a 2 MiB step:
/// raw allocations are whole 2 MiB pages, so every window reads exactly on it, as on an exact
/// reading.
#[test]
#[ignore = "open: a stepped reading's hidden keep per free is not told from an exact reading of round sizes"]
fn leaky_frees_under_a_stepped_reading_are_named() {
    passes(
        "open/uncalibrated-leaky-frees-stepped-reading-rtx3090.toml",
        &[0, 17, 38, 59],
    );
}

/// OB2's kind (o26 battery): a post-capture graph phase beside a neighbour that left before the
/// profile run and came back before the plan. Each step is judged against the engine alone
/// beside the others as they were in that step (and the steps before it): the captures took
/// what the neighbour left, as the engine alone's do beside no others, and were no memory of
/// memplan's. Judged beside the others of the start and the plan only: 84 / 59 MiB past the
/// request and the engine's own steps on seeds 16 and 31 (0..200: gating 2 -> 0; the o26 file
/// with 24 MiB per capture and a process-local free reading: 2 -> 0, 207 MiB on seed 16).
#[test]
fn a_graph_phase_is_judged_beside_the_others_of_its_own_step() {
    passes(
        "post-capture-neighbour-leaves-and-returns-rtx3090.toml",
        &[0, 16, 31],
    );
}

/// G3's kind with small warm-ups (o26 battery): a capture that keeps the allocator's cache, the
/// full strategy, warm-ups leaving 16 KiB a token (far below the profile run), world physics.
/// The warm-ups' one 2 MiB small segment is a kept cache (any byte a release gives back after a
/// capture, with nothing released between, is a warm-up's segment the capture kept; a 2 MiB
/// floor read it as a capture that empties the cache), and under expandable segments it stays
/// beside the serving burst (a small request's pages are the small pool's, which a burst's
/// large request never takes). Was 523 KiB past the request in serving on seed 36 and 101.02%
/// of the oracle on seed 19; seeds 0-199: gating 2 -> 0.
#[test]
fn small_warm_ups_a_keeping_capture_leaves_cached_are_in_the_reserve() {
    passes(
        "capture-keeps-cache-small-warm-ups-full-rtx4090.toml",
        &[0, 1, 2, 3, 19, 36],
    );
}

/// A request below the memory the device holds in use before the start (a utilisation of
/// 0.001 of a 24 GiB card, 24.6 MiB, below the runtime's context alone) cannot start: the
/// start-up refuses, and before it the session's start went past the request by no more than
/// it named (`request_below_memory_in_use`, with the most its checks held at once: their
/// windows, calibration's test capture as measured). Its test capture once held a 32 MiB node
/// whatever the request; these seeds went 8 to 45 MiB past it unnamed.
#[test]
fn a_request_below_the_memory_in_use_is_named_before_the_start() {
    let file = "rtx4090-utilisation-below-the-runtimes-context.toml";
    for c in passes(file, &[0, 1, 9, 12, 13, 16, 17, 19]) {
        let why = c.out.failed.as_deref().unwrap_or_default();
        assert!(why.contains("start-up refused"), "{}: {why}", c.what);
        assert!(c.out.probes_named.is_some(), "{}: nothing named", c.what);
    }
}

/// A stale free reading and a neighbour that leaves right before the plan: the device-wide
/// reading lags with the free one, so calibration finds it unavailable and the plan is checked
/// by an allocation probe at its quiet point, after the neighbour left. Capped by the lagging
/// reading, these seeds kept 73% of the oracle on average (80% at best on seeds 0-2).
#[test]
fn a_neighbour_that_left_before_the_plan_is_not_kept_room_for_by_a_stale_reading() {
    let file = "rtx4090-stale-free-neighbour-leaves-before-plan.toml";
    let cases = passes(file, &[0, 1, 2, 3, 5, 7]);
    for c in &cases {
        let x = c.out.kv_vs_oracle.unwrap_or(0.0);
        assert!(x >= 0.96, "{}: {:.2}% of the oracle", c.what, x * 100.0);
    }
}

/// The conformance suite's liar profiles (a stale free reading, a free reading that counts only
/// this process, a total 128 MiB low, VM releases that keep 2 MiB, all declared exact: o27
/// battery) under engine scenarios the sweep does not pair them with: a neighbour that changes
/// what it holds before every step, SGLang 0.5.14's K and V tensors for a sliding and global
/// model, an uncalibrated eager engine whose KV allocation nothing measures, the full strategy
/// with warm-ups above the profile run on adversarial physics, and vLLM 0.29's one backing
/// allocation of an MLA latent under a byte budget. Calibration or the session's own checks
/// catch each lie: no gating failure and no needless refusal.
#[test]
fn liar_profiles_under_engine_scenarios() {
    for file in [
        "broken-stale-neighbour-changes-before-every-step.toml",
        "broken-process-local-gemma3-4b-sglang-0-5-14-split-kv.toml",
        "broken-total-low-uncalibrated-eager-unmeasured-kv.toml",
        "broken-leaky-vm-full-warm-ups-above-profile-run-adversarial.toml",
        "broken-leaky-vm-mla-tp2-slice-one-backing-budget.toml",
    ] {
        let cases = passes(file, &battery_seeds());
        assert!(
            cases.iter().any(|c| c.out.failed.is_none()),
            "{file}: no seed started"
        );
    }
}

/// Other processes that change what they hold before every step of the start-up (the weights,
/// the profile run, the graph phase and the plan: o27 battery): rising on an H100 with the full
/// strategy on adversarial physics, a saw on Strix Halo's shared memory, and the inverse saw on
/// an Arc A770 whose only free reading is Sysman's per-process one. The plan is sized by what
/// they hold when it is made.
#[test]
fn a_neighbour_that_changes_before_every_step() {
    for file in [
        "h100-neighbour-rises-before-every-step-full-adversarial.toml",
        "strix-halo-neighbour-saw-before-every-step-post-capture.toml",
        "a770-neighbour-inverse-saw-before-every-step-eager.toml",
    ] {
        let cases = passes(file, &battery_seeds());
        assert!(
            cases.iter().any(|c| c.out.plan.is_some()),
            "{file}: nothing planned"
        );
    }
}

/// One GPU's slice of a tensor-parallel model (o27 battery; per-GPU weights and KV heads, the
/// TP 2 H100 log's 2.07 GiB of non-torch memory as workspace outside the allocator): gpt-oss-120b
/// at TP 4 on an H100, DeepSeek-V2-Lite's replicated MLA latent at TP 2 on an L4 (fp8_ds_mla in
/// blocks of 64), Qwen3-32B at TP 8 on an RTX 3090 with the full strategy. Beside them, shapes the
/// sweep does not draw: a 0.02 share of an H200, a million-token context of gemma-3-27b on an
/// MI300X under SGLang 0.5.14's start rule, SGLang 0.5.23's paired tensors of gemma-3-1b on an
/// Arc B580 with no free reading, and sliding, full and MLA layers in one cache (vLLM 0.29's
/// one backing on ROCm 6.2, blocks of 64).
#[test]
fn tensor_parallel_slices_and_unusual_shapes_plan_within_the_oracle() {
    for file in [
        "h100-gpt-oss-120b-tp4-slice-640mib-workspace.toml",
        "l4-deepseek-v2-lite-tp2-slice-fp8-ds-mla.toml",
        "rtx3090-qwen3-32b-tp8-slice-2gib-nccl-workspace-full.toml",
        "h200-qwen25-0.5b-utilisation-0.02.toml",
        "mi300x-gemma3-27b-1m-context-sglang-0-5-14.toml",
        "b580-nosysman-gemma3-1b-sglang-0-5-14-paired-kv.toml",
        "rocm62-sliding-full-and-mla-layers-one-backing-block-64.toml",
    ] {
        let cases = passes(file, &battery_seeds());
        assert!(
            cases.iter().any(|c| c.out.plan.is_some()),
            "{file}: nothing planned"
        );
    }
}

/// A runtime that cannot record the engine's graph allocation nodes (`no-graph-alloc-nodes`)
/// refuses the capture only at run time. Calibration's test capture already found the device
/// refusing an allocation node, so the graph phase first captures the engine's smallest size
/// (its warm-up the smallest) and plans eagerly on the refusal, before the strategy warms up
/// the first size, the largest (8 MiB a token: 4 GiB at 512). Warmed up first, that size took
/// the graph phase 332 MiB past a 17 GiB budget (seed 0), unwarned, on 16 of seeds 0-20 (RTX
/// 4090, H100, ROCm 6.2; outside battery o27). The engine alone runs eagerly and never warms up.
#[test]
fn a_capture_refused_after_the_warm_ups_stays_within_the_request() {
    passes_eagerly(
        "capture-unsupported-after-warm-ups-rtx4090.toml",
        &[0, 3, 19, 20],
    );
}

/// The same refusal where graph-pool attributes are declared unsupported (a ROCm 5.x-like
/// capability): nothing reads the pool to check an allocation node with, but calibration's test
/// capture still asks for one, to learn whether the device records it. Without the node,
/// calibration could not see the refusal, and the graph phase warmed up the largest size (8 MiB
/// a token at 512) before the engine's capture was refused: 780 MiB-1.31 GiB past the request,
/// unwarned, on 20 of seeds 0-20 (outside battery o27, post-capture, no engine hints).
#[test]
fn a_capture_refused_where_the_graph_pool_is_unreadable_stays_within_the_request() {
    passes_eagerly(
        "capture-unsupported-no-pool-attributes-post-capture-rocm55.toml",
        &battery_seeds(),
    );
}

/// Where the engine states that its graphs allocate in graph allocation nodes
/// (`alloc_node_bytes_hint`) and calibration found the device refusing such a node, the graphs
/// cannot record: the session plans the engine eagerly without warming up even the smallest
/// size. Here the engine's own profile run already passes the byte budget (its 3000 MiB
/// workspace beside 13.95 GiB of weights; the start-up is refused), so the trial capture's
/// warm-up of one token took a 2 MiB segment past the request and the engine's own steps, which
/// the engine alone, eager, never takes: 9 of seeds 0-20 (outside battery o27, ROCm 5.5). A
/// profile run that leaves the request no room for a KV cache is now refused before the graph
/// phase, which warms nothing up either: each run is planned eagerly or refused there.
#[test]
fn a_capture_the_engine_states_the_device_refuses_is_not_warmed_up() {
    let file = "capture-unsupported-engine-states-alloc-nodes-budget-passed-rocm55.toml";
    for c in passes(file, &battery_seeds()) {
        let failed = c.out.failed.as_deref().unwrap_or_default();
        assert!(
            c.out.strategy == StrategyKind::None || failed.contains("before the graph phase"),
            "{file} {}: {failed}",
            c.what
        );
    }
}

/// The refusal a graph phase owes where the profile run left the request no KV room is asked
/// for once, before the first phase: a sampled phase whose margin is measured again in full
/// (every size captured) is not cut between the two phases, where what the session read then
/// holds the samples' warm-ups and the refusal named their peak as the activation (o29
/// battery, seeds 8, 11 and 13 of 0-21: 232-685 MiB past the request and the engine's own
/// steps, the samples' overshoot left as the start-up's last step).
#[test]
fn a_sampled_phase_measured_again_in_full_is_not_refused_between_the_two() {
    for c in passes(
        "sampled-phase-then-full-measure-a100-adversarial.toml",
        &[8, 11, 13],
    ) {
        let failed = c.out.failed.as_deref().unwrap_or_default();
        assert!(
            !failed.contains("before the graph phase"),
            "{}: {failed}",
            c.what
        );
    }
}

/// Where the engine's weights and measured activation peak already leave the byte budget no
/// room for a KV cache, the start-up is refused before the graph phase warms anything up: on a
/// runtime that cannot record graph allocation nodes (calibration saw it refuse one) and an
/// engine that states nothing of its graphs, the trial capture's warm-up of the smallest size
/// (16 tokens at 16 MiB a token on ROCm 5.4, 128 at 20 MiB on an MI300X) went 2 MiB-1.5 GiB
/// past the request and the engine's own steps before the plan refused, memory the engine
/// alone, running eagerly, never takes (outside battery o28, class CU-trial: 6 and 13 of seeds
/// 0-20; the seeds here are among them).
#[test]
fn a_start_up_the_profile_run_leaves_no_kv_room_is_refused_before_the_graphs() {
    for (file, seeds) in [
        (
            "trial-capture-request-passed-by-weights-activation-rocm54.toml",
            &[2, 5, 7, 8][..],
        ),
        (
            "trial-capture-request-passed-by-weights-activation-mi300x.toml",
            &[0, 1, 2, 3][..],
        ),
    ] {
        for c in passes(file, seeds) {
            let failed = c.out.failed.as_deref().unwrap_or_default();
            assert!(
                c.out.plan.is_none() && failed.contains("before the graph phase"),
                "{file} {}: {failed}",
                c.what
            );
        }
    }
}

/// Where nothing calibrated tested whether the device records graph allocation nodes, the
/// session finds out with a trial capture of the smallest size before the strategy warms up the
/// largest: an RTX 4090 whose runtime cannot record them, warm-ups of 12 MiB a token over sizes
/// 32 to 512, post-capture, and a 10 GiB budget above the weights and activation (about 7.1 GiB).
/// Learning of the refusal only from the engine's own capture, after the warm-ups, went up to
/// 980 MiB past the request and the engine's own steps (outside battery o28, class CU-uncal: 14
/// of seeds 0-20, five of seeds 0-6), where the engine, planned eagerly, takes none of it.
#[test]
fn an_uncalibrated_capture_the_device_refuses_is_found_before_the_warm_ups() {
    passes_eagerly(
        "uncalibrated-capture-refused-budget-above-weights-activation-rtx4090.toml",
        &battery_seeds(),
    );
}

/// Two generated runs of the CI sweep that did not calibrate, on devices whose runtime records
/// graph allocation nodes: the session asks the device (a capture that records one node and is
/// abandoned, nothing instantiated) instead of capturing the engine's smallest graph as a trial,
/// whose leftovers counted as held and shifted `full`'s pass. With the trial, the L4 run's KV
/// cache fell off a rounding cliff (98.81% -> 83.33% of the oracle, below the 97% floor) and the
/// ROCm 6.2 run, keeping about 12 MB a capture, planned 98.96%, below a measured plan's 99%.
#[test]
fn an_uncalibrated_device_that_records_allocation_nodes_costs_no_trial_capture() {
    for (file, seed, floor) in [
        ("uncalibrated-l4-generated-random-407.toml", 407, 0.97),
        (
            "uncalibrated-rocm62-generated-random-309-one-backing.toml",
            309,
            0.99,
        ),
    ] {
        for c in passes(file, &[seed]) {
            let share = c.out.kv_vs_oracle.expect("an oracle");
            assert!(share >= floor, "{file} {}: {share}", c.what);
        }
    }
}

/// A stale free reading (calibration finds it off by up to 2 GiB and makes it unavailable), so
/// the conservative strategy measures the graphs without the driver's reading; 67 sizes at 2 MiB
/// a token of intermediates on an L4, world physics. Where the engine declares
/// `max_split_size_mb`, each graph's large intermediates take segments of their own, the pool
/// grows by their sum, and on a device that cannot serve it the allocator gives its cache back
/// inside the pass: every figure read after the pass (the allocator's, the probes') misses it,
/// while the engine's own capture holds it before giving anything back. The conservative pass
/// is taken at its peak (the drops of what the allocator held from one capture to the next,
/// added), as `full`'s is: seeds 4, 9 and 16, where the engine alone fits no KV cache, are
/// refused as `full` refuses them without the stale reading (they once planned a cache and the
/// engine's capture went 424-798 MiB past the request, seed 16 with a reserve below the real
/// graphs), and seed 2, whose pass gave nothing back, still plans.
#[test]
fn a_stale_free_reading_leaves_the_conservative_plan_within_the_request() {
    let seeds = [2, 4, 9, 16];
    let cases = passes(
        "stale-free-conservative-capture-over-request-l4.toml",
        &seeds,
    );
    for (c, seed) in cases.iter().zip(seeds) {
        assert_eq!(
            c.out.plan.is_some(),
            seed == 2,
            "{}: {:?}",
            c.what,
            c.out.failed
        );
    }
}

/// Other processes holding 1,129 MiB at the start leave before the weights; on adversarial
/// seeds 8 and 11 the allocator reserves 23.47 GiB for 15.25 GiB of weights (707 tensors), and
/// the start is refused, right. The weights step is the engine's own, judged beside the engine
/// alone next to the others of that step (none): beside the others of the start only, it read
/// as 6.61 GiB past the request and the engine's own steps (outside battery o27, class W1).
/// Others that stay, or none: 0 of 21 failed either way.
#[test]
fn weights_after_others_left_are_the_engines_own_step() {
    passes("others-leave-before-weights-rtx4090.toml", &[8, 11]);
}

/// An engine of SGLang's rules (0.5.1 or 0.5.14) with K and V apart, eager, at a utilisation of
/// 1.0, and 4,733 MiB others take at the plan step (adversarial seed 1): the plan, capped by its
/// probe, keeps 1 GiB for 2,048 blocks, and the engine's cache of them takes 1.62 GiB (each
/// 16 MiB tensor in a 26 MiB segment of its own), where its cache of 1,024 blocks, measured
/// first, took 572 MiB (its tensors two to a segment). The search down from the planned count
/// met counts from 768 to 129 blocks taking 1.62 GiB each and ended on 128 blocks: 1,016 tokens,
/// 7.64% of the oracle, served below the plan (outside battery o27, class SB1). A count measured
/// to fit is the least the search ends on (it bisects up from there): 1,664 blocks, the
/// oracle's. vLLM's rule, the per-tensor layout or world physics: 0 of 21 either way.
#[test]
fn sglangs_own_pool_after_others_arrive_at_the_plan_holds_the_plan() {
    passes("sglang-split-kv-others-arrive-at-plan-rtx4090.toml", &[1]);
}

/// An Arc B580 with no free reading (no Sysman) whose every raw free keeps 512 KiB,
/// uncalibrated, eager, 283 MiB others and 2,359 MiB more before the profile run (world
/// physics): the engine alone fits its profile run beside them with 24-31 MiB to spare on seeds
/// 11, 22, 24, 27, 39 and 52 of 0-59, and the session's test of what a raw free keeps (some
/// fifty frees beside the probes' 2 MiB resolution, 26 MB kept for good), made at its start,
/// took that and left the profile run out of memory (644,245,504 B with 8.29 GiB in the
/// engine's allocator). Made after the profile run, what the test keeps comes out of the room
/// the plan measures: 0 of 60 (outside battery o27, class LK1). Without the leak, or without the
/// neighbour: 0 of 60 either way.
#[test]
fn leaky_frees_without_a_free_reading_leave_the_profile_run_room() {
    passes("leaky-frees-no-free-reading-neighbour-b580.toml", &[11, 22]);
}

/// An Arc B580 with no free reading, every raw free keeping 32 MiB, calibrated for an eager
/// engine, a neighbour arriving before the profile run: the engine alone fits its profile run
/// beside it by a few hundred MiB. Calibration's free check allocated four sizes the absent
/// reading could not show, its probe measured checks that hold nothing for an eager engine
/// on a device that maps no virtual memory, and the probes' gallops overshot so that their
/// refinements succeeded again: 15 frees, 480 MiB kept before the profile run, which ran out
/// of memory (outside battery o28, class LK-leak: seeds 2, 3, 4, 8, 11, 17, 18 and 20), or was
/// refused needlessly (seeds 6, 14 and 15).
#[test]
fn a_calibrated_start_without_a_free_reading_keeps_the_profile_run_room() {
    passes(
        "b580-nosysman-leak-32m-calibrated-neighbour-profile-run.toml",
        &[2, 3, 4, 6, 8, 11, 14, 15, 17, 18, 20],
    );
}

/// The same device keeping 128 MiB a free, uncalibrated, a 6 GiB budget: each of the four
/// probes before the profile run succeeded twice, its gallop down from the last figure
/// overshooting by up to sixteen times, and the profile run, which fitted the engine alone
/// beside the neighbour, ran out of memory (outside battery o28, class LK-leak: 11 of 21
/// seeds).
#[test]
fn probes_before_the_profile_run_succeed_once_where_frees_keep_memory() {
    passes(
        "b580-nosysman-leak-128m-uncalibrated-neighbour-profile-run.toml",
        &[1, 2, 3, 5, 7, 8, 10, 11, 18, 19, 20],
    );
}

/// A device whose every raw free keeps 2 MiB and which gives no free reading
/// (`broken-leaky-free-unreadable`), calibrated, 2,958 MiB others, a 5,516 MiB request whose
/// weights the adversarial allocator holds in 4.63 GiB: the profile run's activation takes
/// 1.20 GiB more and its 3 GB workspace does not fit (seed 16). The engine alone fits that
/// run, only just, and the session's calibration and probes had kept a few MiB for good, so
/// the run's engine ran out of memory: an out-of-memory where the engine alone fits (outside
/// battery o27, class LK1). What the run had measured when it failed already leaves the request
/// no room for a KV cache: the start is the plan's refusal, said with the out-of-memory, and
/// judged right (the engine alone has no cache within the request either).
#[test]
fn a_profile_run_out_of_memory_past_the_request_is_the_plans_refusal() {
    passes("leaky-free-unreadable-profile-run-past-request.toml", &[16]);
}

/// The same device beside a neighbour that arrives before the profile run, a 4.6 GiB budget,
/// 2.88 GiB of weights: the run's one large allocation, a 1.5 GiB workspace outside the
/// allocator or a 2.5 GiB activation through it, is refused at once, before the allocator's
/// peak has grown (outside battery o28, seeds 2 and 19 ran out of memory). The allocation that
/// failed is part of what the run needed above where it started, and with it the request has no
/// room for a KV cache: the plan's refusal, judged right.
#[test]
fn a_profile_runs_failed_allocation_counts_in_the_plans_refusal() {
    for file in [
        "leaky-free-unreadable-profile-run-workspace-fails-past-request.toml",
        "leaky-free-unreadable-profile-run-activation-fails-past-request.toml",
    ] {
        passes(file, &[0, 1, 2, 3, 19]);
    }
}

/// A capture that keeps the allocator's cache, warm-ups of 8 MiB a token, 32 MiB of graph
/// allocation nodes and 2 MiB a token of intermediates over 67 sizes on an A100 80GB,
/// post-capture: the kept graphs pass the 0.70 request and the start is refused, right. The plan
/// step holds what the graph phase left (68.1-75.5 GB on adversarial seeds 1, 4, 9), the engine's
/// graphs and their pool's cache, within what the graph phase may hold. The engine alone's
/// captures reached the device's limit and went on only by giving the allocator's cache back
/// (seed 4: its graph pool kept 3.48 GB, where captures that never reach the limit keep 26.59
/// GB), so what they held after (59.15 GB) is no bound on the plan step: judged beside it, the
/// plan step read as 4.13-6.44 GiB past the request and the engine's own steps (outside battery
/// o27, class PC1; an RTX 3090 with a 2.1 GiB workspace, seed 16: 1.06 GiB). With the cache
/// emptied on capture, without warm-ups, or with the full strategy: 0 of 21. Since the
/// allocator's retry gives no live graph pool back, and nothing but the pool's oversize blocks
/// inside a capture (PyTorch's `malloc`), the engine alone no longer goes on at the limit on
/// seeds 1, 4 and 9: a graph's instantiation fails there and its graphs do not fit alone; the
/// refusal stands on the request.
#[test]
fn kept_graphs_past_the_request_are_the_engines_in_the_plan_step() {
    passes(
        "post-capture-keeps-cache-big-warm-ups-a100.toml",
        &[1, 4, 9],
    );
}

/// The PC1 file's engine with a 0.95 request, where its graphs leave room for a KV cache. On
/// these seeds the engine alone cannot capture its graphs: its warm-ups' cache stays in the
/// default pool at the device's limit, and a graph's instantiation (driver memory) fails there,
/// which the allocator's retry does not serve (it gives no live graph pool back, and nothing
/// inside a capture). The run releases the cache before each capture to measure it, so its
/// captures fit, and it keeps them (post-capture): those are the graphs the engine serves with,
/// and the oracle counts what they hold and finds room (the run serves 99.1-99.5% of it on
/// seeds 0 to 20). Judged as graphs the engine still had to capture, the oracle finds none, and
/// each run reads as a KV cache where the oracle fits none.
#[test]
fn kept_graphs_fit_where_the_engine_alone_cannot_capture_them() {
    let file = "post-capture-kept-graphs-engine-alone-cannot-capture-a100.toml";
    for c in passes(file, &[1, 4, 9, 16, 18]) {
        let setup = c.setup.as_deref().expect("the setup");
        let alone = engine_alone(setup).expect("the engine alone");
        assert!(
            alone.graphs_do_not_fit,
            "{}: the engine alone captures",
            c.what
        );
        assert_eq!(c.out.strategy, StrategyKind::PostCapture);
        assert!(
            c.out.oracle_tokens.is_some_and(|t| t > 0) && c.out.kv_tokens.is_some_and(|t| t > 0),
            "{}: oracle {:?}, cache {:?}",
            c.what,
            c.out.oracle_tokens,
            c.out.kv_tokens
        );
    }
}

/// An Arc B580 with no free reading whose every raw free keeps 96 MiB (all of a smaller one),
/// uncalibrated, eager, a neighbour of 9,413 MiB before the profile run: the keep test's
/// 32 MiB frees each kept all they held while the probes' frees kept 96 MiB, and its probes,
/// galloping down and failing to refine on their own success's keep, read 53.5 MB over two
/// frees and 206.4 MB over three; the plan kept 27.9 MB for the probe's free after its last
/// reading where that free kept 100.66 MB, and the serve burst ran out of memory (outside
/// battery o29, class LK-serve: seeds 12 and 14). Seed 14's rounds lost alike, 55.6 MB a free
/// over mixed frees, which the KV cache's growth check and the plan both took for a probe's.
#[test]
fn the_plan_keeps_what_a_probes_own_free_keeps_where_test_frees_keep_all_they_held() {
    passes(
        "b580-nosysman-leak-96m-uncalibrated-serve-burst.toml",
        &[0, 6, 12, 13, 14, 15, 16],
    );
}

/// The same device keeping 256 MiB a free, calibrated, a 4 GiB budget beside 8,113 MiB: the
/// rounds disagreed (381.5 MB over two frees, 385.7 MB over three), the plan kept the first
/// round's 191.9 MB for the probe's free after its last reading where it kept 268.4 MB, and
/// the serve burst ran out of memory (outside battery o29, class LK-serve: seeds 13, 14, 15).
/// The engine alone has no room for one request there: the start is refused.
#[test]
fn where_keep_rounds_disagree_the_plan_keeps_the_larger() {
    passes(
        "b580-nosysman-leak-256m-calibrated-serve-burst.toml",
        &[13, 14, 15],
    );
}

/// Assert that every case of `cases` whose seed is in `seeds` was refused: after its profile run
/// ran out of memory, the refusal naming what the start-up's own raw frees kept, or, where the
/// run fitted, by the plan.
fn refused_beside_own_keeps(cases: &[Case], seeds: &[u64]) {
    let seeded = |c: &&Case| c.setup.as_ref().is_some_and(|s| seeds.contains(&s.seed));
    let refused: Vec<&Case> = cases.iter().filter(seeded).collect();
    assert_eq!(refused.len(), seeds.len());
    for c in refused {
        let failed = c.out.failed.as_deref().unwrap_or("");
        assert!(
            failed.contains("raw frees this start-up made kept at most")
                || failed.starts_with("start-up refused: one request"),
            "{}: {failed}",
            c.what
        );
    }
}

/// An Arc B580 with no free reading, every raw free keeping 8 MiB, a neighbour of 7,667 MiB
/// arriving before the weights: the engine alone has about 62 MiB to spare in its profile run,
/// and the session's calibration and probes made ten frees before it (the probe before the
/// weights searched down past the neighbour), so the run ran out of memory (outside battery
/// o29, class LK-leak: seeds 2, 3, 5, 8, 18 and 20). Beside the neighbour, the engine alone has
/// no room for one request of 4,096 tokens after its activation: with every free's keep given
/// back, what was allocatable before the run less what it needed leaves none, and the start is
/// the plan's refusal, said with the out-of-memory, and right.
#[test]
fn a_profile_run_short_by_the_starts_own_keeps_is_refused_where_no_request_fits() {
    let seeds = [2, 3, 5, 8, 18, 20];
    let cases = passes(
        "b580-nosysman-leak-8m-neighbour-before-weights-profile-run.toml",
        &[0, 2, 3, 5, 6, 8, 13, 18, 20],
    );
    refused_beside_own_keeps(&cases, &seeds);
}

/// The same rule where what failed is a raw allocation beside the activation: a device with no
/// free reading keeping 2 MiB of every free, a neighbour arriving before the profile run, whose
/// 600 MiB workspace failed with the activation already held (outside battery o29, file fr-08,
/// seed 8; seeds 8 and 20 of 40). The run needed both: what it held and what failed.
#[test]
fn a_workspace_short_by_the_starts_own_keeps_is_refused_where_no_request_fits() {
    let seeds = [8, 20];
    let cases = passes(
        "leaky-free-unreadable-2m-neighbour-profile-run-workspace.toml",
        &[8, 13, 20],
    );
    refused_beside_own_keeps(&cases, &seeds);
}

/// An Arc B580 with no free reading, every raw free keeping 32 MiB (adversarial physics), a
/// neighbour of 7,417 MiB arriving before the profile run: the engine alone has about 240 MiB
/// to spare in its run, room for a request after it. The baseline's probe, searching from the
/// total after calibration's probe had just found what was allocatable, succeeded twice: eight
/// frees (256 MiB) before the run, which ran out of memory (outside battery o29, file fr-14,
/// seeds 3 and 4). From calibration's figure, descending, it succeeds once.
#[test]
fn a_baseline_probe_from_calibrations_figure_leaves_the_profile_run_room() {
    passes(
        "b580-nosysman-leak-32m-adversarial-neighbour-profile-run.toml",
        &[3, 4],
    );
}

/// An Intel Max 1550 whose Sysman gives no free reading of its own, composed from the
/// per-process query instead (the total less this process's memory): exact for this process,
/// blind to a neighbour of 111 GiB that arrives before the profile run; every raw free keeps
/// 16 MiB. The session measures by that reading, not by probes; calibration's free check (four
/// allocations the reading follows) kept 64 MiB, and the profile run, which fitted the engine
/// alone, ran out of memory (outside battery o29, class LK-leak: seeds 1, 3, 5, 8 and 11; on
/// seed 11 the engine alone had under 16 MiB to spare). Nothing the session read could see
/// the room was gone: one probe after the failed run finds what the device had, and with
/// every free's keep given back the engine alone has no room for one request of 4,096 tokens
/// beside its activation: the start is the plan's refusal, and right.
#[test]
fn a_reading_blind_to_others_is_refused_where_no_request_fits_beside_own_keeps() {
    let seeds = [1, 3, 5, 8, 11];
    let cases = passes(
        "max1550-process-local-free-leak-16m-neighbour-profile-run.toml",
        &[0, 1, 3, 5, 6, 8, 11, 13],
    );
    refused_beside_own_keeps(&cases, &seeds);
}

/// An RX 7900 XTX on ROCm 5.4, whose free reading counts this process alone, moving in 64
/// MiB steps, uncalibrated: the step goes unseen by the session's own check, the weights'
/// window reads 34 MiB freed outside the allocator (no other process can free memory in such
/// a reading: it is the reading's error), and what a library takes on the first capture reads
/// as nothing. The allocation probe at the last quiet point took the whole room the request
/// left and went up to 27 MiB past it (outside battery o30, class NS-step-uncal). The probe is
/// now held below the room by the error such a window showed.
#[test]
fn a_process_local_reading_that_reads_memory_freed_keeps_the_probe_below_the_request() {
    passes(
        "rocm54-stepped-uncalibrated-plan-probe-beside-unseen-growth.toml",
        &[7, 18, 20, 29, 30],
    );
}

/// An H100 whose free reading moves in 512 MiB steps (calibration sees the step), an engine
/// that cannot size its KV cache after capture, 131 capture sizes: sampled, eight samples read
/// each graph's own memory below a step as nothing or one step, and the model extrapolated
/// that to the 123 unsampled graphs: 0.88 GB reserved for 2.07 GB of graphs, past the request
/// in serving (outside battery o30, class SS-coarse: reserve below real on 15 of 40 seeds).
/// Where a step per unsampled graph costs more than a sampled margin may, every size is
/// measured instead.
#[test]
fn a_reading_too_coarse_for_the_samples_measures_every_size() {
    let cases = passes(
        "h100-step512-sampled-131-sizes-reserve-below-real.toml",
        &[2, 3, 5, 7, 8, 11, 15, 22, 26, 28, 29, 30, 32, 37, 39],
    );
    assert!(cases
        .iter()
        .all(|c| c.out.strategy == memplan_planner::strategy::StrategyKind::Full));
}

/// The same on ROCm 6.2 in 512 MiB steps, 67 sizes, a 6.8 GiB neighbour before the plan: the
/// sampled reserve (~93 MB for 0.5-1.7 GB of graphs) ran out of memory in the serve burst
/// where the neighbour made the device's cap bind (o30, SS-coarse: seeds 7, 8, 19, 20, 23, 25).
#[test]
fn a_reading_too_coarse_for_the_samples_measures_every_size_beside_a_neighbour() {
    passes(
        "rocm62-step512-sampled-neighbour-at-plan-serve-oom.toml",
        &[7, 8, 19, 20, 23, 25],
    );
}

/// The same 96 MiB file, seed 36 (outside battery o29, fr-03, fr-16 and fr-17: the same device
/// and its twins): the plan kept room for the probe's free after its last reading, and the
/// engine's KV cache, packed into pages, took no whole number of the pages the plan kept, so
/// its count grew to what the finer page holds, 5 MB short of its room. The check beside the
/// grown count asked for the engine's need (its 461 MiB activation) but not for its own free's
/// 96 MiB keep, the request having no more room than that need; it passed, its free kept
/// 96 MiB, and the serve burst's activation ran out of memory. A grown count whose room left
/// over cannot hold the check's own keep does not stand.
#[test]
fn a_kv_count_grown_past_the_plan_leaves_room_for_its_checks_own_keep() {
    passes(
        "b580-nosysman-leak-96m-uncalibrated-serve-burst.toml",
        &[36],
    );
}

/// The same B580 file, where the neighbour arrives just before the profile run: the probe
/// before the run started from the last figure, 7.4 GiB above what was allocatable, galloped
/// down by doubling to a first success up to as far below, and its refinement succeeded again
/// (243 KB more for a free of 32 MiB); calibration's probe from the device's total did the
/// same. Seven frees before the run, more than the engine alone had room for (five on seed 17):
/// the profile run ran out of memory (outside battery o29, fr-13 and fr-14, seeds 17, 32 and
/// 39). The gallop down steps by a probe's slack, then by a 256th of the distance: its first
/// success lies within a step, and the refinement fails where a free keeps more than the step.
#[test]
fn a_probe_far_above_what_is_allocatable_leaves_the_profile_run_room() {
    passes(
        "b580-nosysman-leak-32m-adversarial-neighbour-profile-run.toml",
        &[17, 32, 39],
    );
}

/// An Arc 140V capped by its device-wide reading less its tolerance (256 MiB), every raw free
/// keeping 48 MiB, a neighbour of 12,414 MiB before the profile run (outside battery o29,
/// fr-05): the reading less its tolerance left no room for one request, and the allocation
/// probe that checks the plan taking the reading at its word ran only where the tolerance
/// capped a plan, not where it refused one: every seed refused. A refusal the tolerance made is
/// checked as a cap it set is: where the probe finds the room, the plan stands.
#[test]
fn a_refusal_a_readings_tolerance_made_is_checked_by_a_probe() {
    let cases = passes(
        "arc140v-leak-48m-neighbour-profile-run-tolerance-refusal.toml",
        &[0, 13, 14, 15, 26, 27, 35, 36],
    );
    assert!(cases.iter().all(|c| c.out.plan.is_some()));
}

/// A calibrated Arc B580 with no free reading, every raw free keeping 32 MiB, a neighbour
/// before the profile run: the KV cache's count grew past the plan's (877 to 960 blocks), did
/// not stand, and bisected back: 918 fitted, then 939, 928, 923, 920 and on each allocated a
/// check and freed it, each free keeping 32 MiB of the room, until no count fitted and the
/// start was refused after 42 allocations. On a device that keeps memory of every free, the
/// first grown count that stands is kept.
#[test]
fn a_grown_kv_count_that_stands_is_kept_where_each_check_keeps_memory() {
    let cases = passes(
        "b580-nosysman-leak-32m-calibrated-neighbour-profile-run.toml",
        &[14],
    );
    assert!(cases.iter().all(|c| c.out.plan.is_some()));
}
/// An RX 7900 XTX on ROCm 5.4 (a free reading of this process alone, in 64 MiB steps),
/// uncalibrated: the weights' window read 20 MiB freed outside the allocator, which showed the
/// reading's error, but what a library took on the first capture (read as nothing) was more,
/// and the plan's last probe, held below the request by 20 MiB, went up to 9 MiB past it
/// (outside battery o30, random rn6-194). The reading's windows are now measured at the plan's
/// quiet point once such a window contradicted it, and its 64 MiB step holds the probe.
#[test]
fn a_process_local_reading_that_erred_is_measured_before_the_plan() {
    passes(
        "rocm54-stepped-uncalibrated-weights-window-understates-first-capture.toml",
        &[18, 28, 29],
    );
}

/// The same card on a runtime whose raw frees each keep 32 MiB: the measurement of the
/// reading's windows at the plan's quiet point frees four allocations raw, and what they kept
/// (128 MiB, which the reading's 64 MiB step hides per free) is this process's. Made from the
/// reading before the measurement, the plan did not count it and went 65-89 MB past the
/// request in the plan step (named only by the start's loose figure for its own checks); the
/// plan is now made from a reading after it, the window between the two the session's own
/// step, and nothing goes past the request before the plan at all.
#[test]
fn what_the_reading_measurement_frees_keep_is_counted_by_the_plan() {
    let cases = passes(
        "rocm54-stepped-uncalibrated-leak-32m-erred-reading-measured-before-the-plan.toml",
        &[7, 8, 18, 28],
    );
    for c in &cases {
        assert_eq!(c.out.own_over_request_before_plan, None, "{}", c.what);
    }
}

/// An A100 whose free reading is stale (allocation probes measure, nothing calibrated) keeps
/// 64 MiB of every raw free: the keep test's two rounds of probe frees lost 31 and 45 MB a
/// free, more than the probes tell apart but not alike, so no keep was concluded and no
/// warning named one; serving's frees took the process 120-330 MiB past the request (outside
/// battery o31, class LK-unwarned, 24 of 40 seeds). Where every round lost, the plan warns by
/// name, at least the least a free lost (no more than the device keeps), and the plan's
/// figures take no keep from it.
#[test]
fn probe_rounds_that_lose_but_not_alike_warn_the_device_keeps_memory_on_free() {
    let cases = passes(
        "a100-stale-uncal-keep64-probe-rounds-not-alike-serve-over-request.toml",
        &[2, 3, 8, 11, 17, 39],
    );
    for c in &cases {
        assert_warns(c, |w| {
            matches!(w, memplan_planner::Warning::DeviceKeepsMemoryOnFree { bytes_per_free, at_least: true }
                if (16 << 20..=64 << 20).contains(bytes_per_free))
        });
    }
}

/// A device whose raw frees each keep less than its free reading's step (outside battery,
/// class "keeps on each raw free, less than the step"): an H100 reading free memory in 64 MiB
/// steps, its idle reads never moving, keeping 48 MiB of every free. The session's windows over
/// 62 MiB read 64 or 0 MiB, and their pairs lost 64, 64, 64 and 0 MiB: read against the idle
/// spread (0), no keep was seen or bounded, the plan kept no room for what its probe's own free
/// kept, and serving ran out of memory (4 of 200 seeds each, calibrated or not). Two reads of
/// the same memory may differ by the step the windows show the reading moves in (a window over
/// an odd number of 2 MiB pages read off, on reads that share the step: `probe::shown_step`),
/// so the pair rules read the losses against it: 192 MiB over four frees, 48 MiB each, warned
/// by name and kept room for. In 256 MiB steps, 200 MiB kept a free: 7 of the first 40 seeds.
#[test]
fn frees_keeping_less_than_the_readings_step_are_read_against_the_step() {
    const MIB: u64 = 1 << 20;
    for (file, seeds, keep) in [
        (
            "h100-step64-keep48-uncalibrated-neighbour-at-plan-serve-oom.toml",
            &[2, 9, 45, 190][..],
            48 * MIB,
        ),
        (
            "h100-step64-keep48-calibrated-neighbour-at-plan-serve-oom.toml",
            &[2, 33, 74, 154][..],
            48 * MIB,
        ),
        (
            "h100-step256-keep200-uncalibrated-neighbour-at-plan-serve-oom.toml",
            &[19, 32, 33, 34, 35, 36, 39][..],
            200 * MIB,
        ),
    ] {
        for c in &passes(file, seeds) {
            // The figure is the loss over all shared among the frees: within a step of all
            // they kept, shared.
            assert_warns(c, |w| {
                matches!(w, memplan_planner::Warning::DeviceKeepsMemoryOnFree { bytes_per_free, .. }
                    if (keep / 2..=keep * 3 / 2).contains(bytes_per_free))
            });
        }
    }
}

/// An uncalibrated MI300X and RX 7900 XTX on ROCm 6.2 whose free reading lags one synchronize,
/// other processes holding memory from the start (24 GiB, 4 GiB) and more later: the session's
/// own check of its free reading, raw allocations it freed again, read the others' memory
/// (which the lagging reading first showed inside it) as its own leftovers, counted it as this
/// engine's and refused on 35 and 11 of seeds 0..40 where the oracle held a request (outside
/// battery nrs, needless refusal). Those allocations cannot have left more held than they held,
/// nor than their frees times the most the check's windows bound a free's keep by: on a
/// reading that sees the whole device, the rest is another process's, and the plan stands.
#[test]
fn others_memory_read_inside_the_sessions_own_check_is_not_its_leftovers() {
    for (file, seeds) in [
        (
            "mi300x-stale-uncal-others-24g-held-at-start-not-own-checks.toml",
            &[0, 4, 16, 39][..],
        ),
        (
            "rx7900xtx-rocm62-stale-uncal-others-4g-held-at-start-not-own-checks.toml",
            &[0, 14, 36][..],
        ),
    ] {
        for c in passes(file, seeds) {
            assert!(
                c.out.plan.is_some(),
                "{file} {}: {:?}",
                c.what,
                c.out.failed
            );
            let named = c.out.checks_left_held.unwrap_or(0);
            assert!(named < 64 << 20, "{file} {}: {named}", c.what);
        }
    }
}

/// The engine of `two_readings_that_bound_the_granule_too_coarse` whose warm-ups reserve (96 KiB
/// a token): the weights (2,040 MiB) and the activation peak (1,440 MiB), both read as allocated
/// whole, share 120 MiB, and with `max_split_size_mb:20` stated on seed 1 a granule that coarse
/// would keep a segment per KV tensor and refuse. The session's warm-ups at odd token counts
/// reserve 1,326 and 1,606 MiB, which bound the granule at 2 MiB: every seed starts within 1%
/// of the oracle. Two readings of round sizes leave the granule open; a measurement of sizes no
/// round granule divides closes it.
#[test]
fn a_granule_two_round_readings_left_coarse_is_narrowed_by_warm_ups() {
    let cases = passes(
        "two-readings-granule-narrowed-by-warm-ups-b580.toml",
        &[0, 1, 2, 5, 9],
    );
    for c in &cases {
        assert!(c.out.plan.is_some(), "{}: refused", c.what);
    }
}

/// An eager engine on an Arc A770 whose allocator rounds requests to two power-of-two
/// divisions (adversarial seed 38, `roundup_power2_divisions` stated): the session's warm-ups
/// for the granule were held to what the request leaves by what the largest warm-up so far took
/// per token, 2 GiB for 19,315 tokens, so one of 22,387 tokens was taken for 2.32 GiB; the
/// allocator rounded it up to 3 GiB, 89.6 MiB past the request in the plan step. A scaled
/// request may gain up to `1/d` of itself to `d` divisions: the warm-ups are held to
/// `d / (d + 1)` of the room. The start-up is still refused on that seed (its 52 KV tensors of
/// at most 17 MiB keep sharing room on a 40 MiB granule), a needless refusal this test does
/// not judge; seeds 0-2 start.
#[test]
fn warm_ups_for_the_granule_keep_room_for_power_of_two_divisions() {
    let file = "a770-warm-ups-rounded-by-power2-divisions.toml";
    let cases = cases_with(file, &[0, 1, 2, 38], |_| {});
    let gating: Vec<String> = acceptance::failures(&cases)
        .into_iter()
        .filter(|f| acceptance::GATING.contains(&f.check))
        .map(|f| f.line)
        .collect();
    assert!(gating.is_empty(), "{file}:\n{}", gating.join("\n"));
    for c in cases.iter().filter(|c| c.what != "seed=38") {
        assert!(c.out.plan.is_some(), "{}: refused", c.what);
    }
}

/// A KV count grown to the finer page the cache showed (expandable segments of 20 MiB pages
/// where the plan kept a 64 MiB one) is checked by allocating what the engine still needs in
/// the room the request leaves beside it. That room is the request less figures the free
/// reading's windows measured, which may read low by the windows' error (30 and 4 MiB steps
/// here): the check takes the error off, as the plan's own probes do. Without it the check's
/// allocation took the margin kept for the error and the process went 1.25 MiB (seed 14, 30 MiB
/// steps) and 505 KiB (seed 36, 4 MiB steps) past the request (outside battery o32).
#[test]
fn a_grown_kv_counts_check_keeps_the_free_readings_window_error() {
    passes(
        "rtx3090-free-step-30m-expandable-grown-kv-count-within-request.toml",
        &[0, 14],
    );
    passes(
        "rtx3090-free-step-4m-expandable-grown-kv-count-within-request.toml",
        &[0, 36],
    );
}

/// Where the files of the third battery written from the docs alone live.
const VENDORS_QUIRKS_ENGINES: &str = "vendors-quirks-engines";

// Scenario files written from docs/scenarios.md, docs/simulator-physics.md,
// docs/measurement-protocol.md, docs/engine-rules.md, docs/capability-matrix.md, the README
// and shared/data's model configs alone, before the planner's or the test-bed's source was
// read: every simulated profile but a few (CUDA, ROCm 5.4 to 6.2, MI300X, Strix Halo, Arc
// A770, B580 and 140V, Max 1550, the `broken-*` backends), each selector quirk (stale, stepped
// from 4 MiB to 1 GiB, process-local, blind to graphics or equal to the total free readings,
// Sysman or NVML missing, a total reported low, frees and VM releases that keep memory, memory
// hidden per capture, deferred graph release, zeroed graph pool attributes, no allocation
// nodes, captures that keep the cache, APU pools), adversarial and pinned physics, neighbours
// before every step (growing, leaving, alternating), vLLM's tensor per layer and one backing
// buffer, SGLang's K and V apart and paired, engines with no hook and with or without the
// allocator's tensors, hybrid sliding-window, MLA and a window past the context, block sizes 1
// to 4,096, int8 to fp32 caches, post-capture, full, sampled and eager graph phases with up
// to 5,000 kernel nodes, calibration on and off, shares from 0.05 to 0.98 and byte budgets,
// 65,536 weight tensors. Misreported totals with no second reading are left out (judged against
// the real total, they are over the request by design: docs/scenarios.md, "Devices that
// misreport their total"). When written, 71 of the 80 passed every rule on seeds 0 to 39; the
// other nine refused needlessly on a seed or two (13 runs: refusals beside memory the
// session's own measurement captures left held, an SGLang pool from an APU's aperture, a
// calibration beside a device that keeps 64 MiB of every free), none failed a gating rule. In CI
// every fourth file on one seed each (a debug build runs the whole folder in about four
// minutes of one core: `vendors_quirks_engines_over_40_seeds` runs it all, by hand).
#[test]
fn vendors_quirks_engines_pass_the_gating_rules() {
    folder_passes(VENDORS_QUIRKS_ENGINES, 0, 4, 40);
}

/// Every file of `tests/outside/vendors-quirks-engines/` on seeds 0 to 39, judged by the gating
/// rules alone (the needless refusals the files were written with stay open).
#[test]
#[ignore = "40 seeds per file: run by hand in a release build"]
fn vendors_quirks_engines_over_40_seeds() {
    let seeds: Vec<u64> = (0..40).collect();
    folder_passes_the_gating_rules(VENDORS_QUIRKS_ENGINES, &seeds);
}

/// The Arc B580 with no free reading, keeping 128 MiB of every raw free, and the same keeping
/// 96 MiB, a neighbour of 7,794 MiB arriving before the profile run: the engine alone fits its
/// profile run, and the run runs out of memory (128 MiB: seeds 31 and 167 of 200; 96 MiB: 31,
/// 96 and 167). The session's start makes no probe of its own (nothing before the weights
/// needs one: `the_session_start_makes_no_probe_that_measures_nothing`), and each of the three
/// probes before the run (two around the weights, one after the settle that opens the run)
/// succeeds once, as it must to measure, and its free keeps a free's worth: 288 or 384 MiB kept
/// where the engine alone had 125-249 MiB past the run's 614 MiB activation, room for a
/// request of 128 MiB and its rounding (where it had less, the out-of-memory is the refusal the
/// plan owed: `a_profile_run_out_of_memory_gives_back_only_the_frees_its_probe_shows`). Each
/// probe is what tells memory that lands at a step's start (another process's) from the step's
/// own: nothing the session reads before the run says how much a free keeps (the keep test runs
/// after it, to cost nothing before it). Seed 31 of the 128 MiB file ran out of memory with the
/// start's probe too, and was refused: the refusal's keep test, after the run, read 0 B a free
/// (its frees had left nothing allocatable). Found by running the outside folder over seeds
/// 0..40 and 0..200.
#[test]
#[ignore = "open: each allocation probe before the profile run keeps a free's worth, and three of them can take more than the engine alone had to spare"]
fn probes_before_the_profile_run_keep_less_than_the_engine_alone_spares() {
    passes(
        "b580-nosysman-leak-128m-uncalibrated-neighbour-profile-run.toml",
        &[31, 167],
    );
    passes(
        "open/b580-nosysman-leak-96m-uncalibrated-neighbour-profile-run.toml",
        &[31, 96, 167],
    );
}

/// Where the files of the fourth battery written from the docs alone live.
const READINGS_SLICES_BUDGETS: &str = "readings-slices-budgets";

// Scenario files written from the docs and shared/data's model configs alone, on what the
// other folders cover least: free readings in steps of 4 MiB to 1 GiB beside frees that keep
// memory (keeps below and above the step), stale readings beside memory other processes held
// from the start and neighbours after it, tensor-parallel slices, hybrid and MLA models on ROCm
// and Intel devices, shares from 0.02 to 0.995, byte budgets a few GiB past the weights, and
// neighbours that take and give back memory before every step. When written, gating 0 on
// seeds 0 to 39 of all 44 (1,760 runs), four needless refusals (a 1 GiB step beside 64 MiB
// kept a free, memory the session's own captures left held, a cache one block short after the
// rounding kept on a stale MI300X), and a share near 79% where a coarse step and a keep per
// free meet (each of the session's own checks' frees keeps memory for good). In CI every
// fourth file on one seed each (`readings_slices_budgets_over_40_seeds` runs them all).
#[test]
fn readings_slices_budgets_pass_the_gating_rules() {
    folder_passes(READINGS_SLICES_BUDGETS, 0, 4, 40);
}

/// Every file of `tests/outside/readings-slices-budgets/` on seeds 0 to 39, judged by the
/// gating rules alone (the needless refusals the files were written with stay open).
#[test]
#[ignore = "40 seeds per file: run by hand in a release build"]
fn readings_slices_budgets_over_40_seeds() {
    let seeds: Vec<u64> = (0..40).collect();
    folder_passes_the_gating_rules(READINGS_SLICES_BUDGETS, &seeds);
}

/// An L4 whose free reading moves in 256 MiB steps and whose raw frees each keep 32 MiB: the
/// start's windows over known allocations measured a window error of exactly the step, and a
/// second pass of windows with combined reads was made anyway, though a combined read's error is
/// never taken below the step. Its pairs kept 32 MiB each, 512 MiB more held for good,
/// counted as the engine's memory (the oracle, the engine alone, never takes it): what the
/// session's own checks left held was 2.5 to 2.75 GiB on these seeds, and the share of the
/// oracle 81-85% (outside battery o33, class L1: 79% mean over seeds 0..40). No such pass is
/// made where the error is the step: 2 to 2.25 GiB held, 85-88% of the oracle. The rest is the
/// single pass's 16 windows (a 32 MiB keep under 256 MiB steps needs all of them to be bounded),
/// calibration's pairs and the graph phase's probes.
#[test]
fn no_combined_reads_pass_where_the_window_error_is_the_reading_step() {
    let file = "l4-free-step-256m-keep-32m-no-combined-pass-the-step-cannot-narrow.toml";
    for c in passes(file, &[0, 1, 2, 3]) {
        let held = c.out.checks_left_held.unwrap_or(0);
        assert!(held < 2560 << 20, "{}: {held} held", c.what);
        let share = c.out.kv_vs_oracle.expect("an oracle");
        assert!(share >= 0.84, "{}: {share}", c.what);
    }
}

/// Where the files of the fifth battery written from the docs alone live.
const TIME_AND_NEIGHBOURS: &str = "time-and-neighbours";

// Scenario files written from docs/scenarios.md, docs/simulator-physics.md,
// docs/measurement-protocol.md, docs/capability-matrix.md and shared/data's model configs and
// start-up logs alone, on time and other processes: others that leave or arrive a step at a
// time before every step the format names (the weights, the profile run, the graph phase, the
// plan), that land for one step only (the weights' load, the profile run, the graph phase),
// that release late (right before the plan) or leave and come back, that re-state what they
// hold or move by less than a reading's step, and neighbours that leave an engine step no more
// than it needs plus 96 MiB to 4 GiB (physics pinned at the world's high end, so the room left
// is known); beside desktop graphics, beside readings that lag, move in steps of 16 MiB to
// 1 GiB, count this process only, miss graphics, equal the total or are missing, frees, VM
// releases and captures that keep memory, deferred graph releases, APU apertures and totals
// reported low; on every simulated profile but the liar ones, calibrated or not, on world and
// adversarial physics, shares from 0.5 to 0.98 and byte budgets, vLLM's and SGLang's layouts and
// start rules, engines with no hook, eager engines. Every neighbour is physically possible: it
// never takes more than is free at its step. When written, 126 files on seeds 0 to 79 (10,080
// runs): no gating failure; five runs refused within reach of a plan keeping only the engine's
// capture variation, all on adversarial seeds whose captures vary by 30-40% (the margin from
// the repeats), in four of them whatever the neighbours did. In CI every fourth file on one
// seed each (`time_and_neighbours_over_40_seeds` runs them all, by hand).
#[test]
fn time_and_neighbours_pass_the_gating_rules() {
    folder_passes(TIME_AND_NEIGHBOURS, 0, 4, 40);
}

/// Every file of `tests/outside/time-and-neighbours/` on seeds 0 to 39, judged by the gating
/// rules alone (the needless refusals the files were written with stay open).
#[test]
#[ignore = "40 seeds per file: run by hand in a release build"]
fn time_and_neighbours_over_40_seeds() {
    let seeds: Vec<u64> = (0..40).collect();
    folder_passes_the_gating_rules(TIME_AND_NEIGHBOURS, &seeds);
}

/// An engine that names its SGLang release sizes its pool from its own free readings around its
/// weights, and at any fraction keeps no more than what it read free once they were loaded:
/// others held 20 GiB of this H100 through the weights, 30 GiB from the profile run and 5 GiB at
/// the plan, so the 15 GiB they released after the weights are in no pool the engine can make.
/// The plan keeps its cache within that (a larger one is served below the plan), and the
/// run's oracle is held to the same: counted against the memory released later, the plan was
/// 88% of the oracle on 69 of 80 seeds (outside battery o35, time and other processes).
#[test]
fn an_sglang_pool_is_judged_within_what_the_engine_read_free_after_its_weights() {
    let file = "time-and-neighbours/h100-sglang1-others-grow-then-leave-llama8b.toml";
    for c in passes(file, &[0, 1, 2]) {
        let share = c.out.kv_vs_oracle.expect("an oracle");
        assert!(share >= 0.99, "{}: {share}", c.what);
    }
}

/// An uncalibrated MI300X whose reading lags and whose every raw free keeps 16 MiB, with a budget
/// below the engine's own steps: the start's check of the free reading left twelve frees' keep
/// held (192 MiB), and the plan named 188.8 MiB of it on seed 16, so the engine's profile run
/// went past the request by more than was named. The bound on what a free keeps took the idle
/// reads' spread as seen (4.9 MiB) for what a pair's two reads may differ by, and one pair
/// differed by 5.2 MiB; it takes the error kept for a spread seen, as a window's error does.
/// Found by an outside battery of models and graphs.
#[test]
fn what_the_start_check_left_held_is_named_beyond_the_spread_seen() {
    passes(
        "mi300x-stale-uncalibrated-leak-16m-budget-below-the-engine.toml",
        &[3, 16, 29],
    );
}

const MODELS_GRAPHS: &str = "models-graphs";

// Scenario files written from docs/scenarios.md, docs/simulator-physics.md,
// docs/engine-rules.md and shared/data's model configs and start-up logs alone, on model shapes
// and graph phases beside device quirks: MoE models loaded as 18,867 weight tensors, MLA
// latents (bf16, fp8, fp8_ds_mla) up to a DeepSeek-V3 slice of 78 GiB, Llama-3.1-405B's 126
// one-head layers, hybrid sliding and full layers (gemma-3 1B to 27B, gpt-oss-20b and 120b,
// a 2-token window, 4,096-token blocks), three kinds of layers in one cache and 36 full layers
// of different shapes, models of 0.5B to 32B at 1 to 131,072 tokens per block and request,
// int8 to fp32 caches; graph phases of one size to vLLM's 67, up to 2,048 tokens, piecewise
// node counts, allocation nodes recordable or not, engine hints, per-capture memory kept,
// deferred release, captures that keep the cache, post-capture on and off, eager; vLLM's tensor
// per layer and one backing, SGLang 0.5.1, 0.5.14 and 0.5.23 pools; shares from 0.03 to 0.995
// and byte budgets down to weights plus a few hundred MiB; stale, stepped (8 MiB to 1 GiB),
// process-local, blind, lost and equal-to-total readings, totals misreported where a second
// reading exists, frees and VM releases that keep memory, neighbours before every step.
// When written: gating 0 on seeds 0 to 39 of all 119 (4,760 runs; a 120th, which failed a
// gating rule on one seed, is reduced in `open/`), 12 needless refusals in 7 files, 7 within
// reach (the session's own checks' allocate/free pairs on a device keeping memory of each
// free, a full-capture reserve beside memory a deferred release had not given back,
// power-of-two divisions beside an APU's reading tolerance, a budget whose room was one
// request), mean share 98.2%. In CI every fourth file on one seed each
// (`models_graphs_over_40_seeds` runs them all, by hand).
#[test]
fn models_graphs_pass_the_gating_rules() {
    folder_passes(MODELS_GRAPHS, 0, 4, 40);
}

/// Every file of `tests/outside/models-graphs/` on seeds 0 to 39, judged by the gating rules
/// alone (the needless refusals the files were written with stay open).
#[test]
#[ignore = "40 seeds per file: run by hand in a release build"]
fn models_graphs_over_40_seeds() {
    let seeds: Vec<u64> = (0..40).collect();
    folder_passes_the_gating_rules(MODELS_GRAPHS, &seeds);
}

/// An A100 40GB whose raw frees each keep 64 MiB, more than calibration's smallest size: that
/// pair (37 MiB) gave nothing back, the four pairs read as unlike, no keep was seen, the free
/// reading was made approximate within 64 MiB, and the session's start made four windows more
/// over it. Calibration's pairs and the start's windows left 542 MiB held for good, counted
/// as the engine's memory (the engine alone never takes it): 95.8-96.0% of the oracle on
/// these seeds (outside battery o32, class N2: 94.2% mean over seeds 0..40). A pair that gave
/// nothing back now bounds the keep from below, calibration makes no further sizes once its
/// pairs show the keep, and the start does not measure it again: 230 MiB held, 98.4%.
#[test]
fn a_keep_per_free_larger_than_a_calibration_size_is_measured_once() {
    let file = "a100-40-keep-64m-a-free-calibrated-post-capture.toml";
    for c in passes(file, &[0, 1, 2, 3, 5]) {
        let held = c.out.checks_left_held.unwrap_or(0);
        assert!(held < 300 << 20, "{}: {held} held", c.what);
        let share = c.out.kv_vs_oracle.expect("an oracle");
        assert!(share >= 0.98, "{}: {share}", c.what);
    }
}

/// The L4 above (free reading in 256 MiB steps, 32 MiB kept a free): its steps hide the
/// captures, so `full` measures the pass and twelve repeats of the first size by allocation
/// probes, and every probe's tries that succeed are raw frees that each keep 32 MiB: 1 GiB
/// held after the graph phase's teardown, where the last eight repeats took about 80 MiB off
/// the margin (outside battery o33, class L1). Past the first four, repeats are taken only
/// where they take off more margin than their frees keep: 86.3%, 88.0% and 87.3% of the
/// oracle on these seeds before, 89.0%, 91.0% and 89.8% after.
#[test]
fn probed_repeats_stop_where_their_frees_keep_more_than_they_take_off() {
    let file = "l4-free-step-256m-keep-32m-no-combined-pass-the-step-cannot-narrow.toml";
    for c in passes(file, &[0, 3, 5]) {
        let share = c.out.kv_vs_oracle.expect("an oracle");
        assert!(share >= 0.885, "{}: {share}", c.what);
    }
}

/// The Arc B580 with no free reading, keeping 128 MiB of every raw free, uncalibrated, a
/// neighbour of 7,794 MiB arriving before the profile run: the session's start made a probe
/// (the largest allocation that succeeds, freed at once) whose figure nothing used before the
/// engine's weights, whose own probe, after that step's settle, reads what changed since as
/// another process's either way. Its free kept 128 MiB for good: four probes before the run,
/// 512 MiB, and the run, which fitted the engine alone with 1,107 MiB for a 614 MiB activation,
/// ran out of memory (seeds 33 and 148 of 200); on seed 0 the run fitted, and the plan, short by
/// that free, was refused where the engine alone holds 4,608 tokens. Where nothing before the
/// first step needs it (no probe of calibration's whose checks it closes), that step's probe
/// is the baseline.
#[test]
fn the_session_start_makes_no_probe_that_measures_nothing() {
    passes(
        "b580-nosysman-leak-128m-uncalibrated-neighbour-profile-run.toml",
        &[0, 33, 148],
    );
}

/// The Arc B580 with no free reading and a neighbour arriving before the profile run: every
/// raw free keeping 32 MiB (calibrated, adversarial physics: five probe frees before the run,
/// 160 MiB, where the engine alone had 71-99 MiB past its 921 MiB activation: seeds 59, 68, 93,
/// 104 and 117 of 200), 128 MiB (seed 96: 125 MiB past a 614 MiB one) and 96 MiB (seeds 24, 44
/// and 184: 61-99 MiB). The run ran out of memory, and the engine alone, past its run, had no
/// room for one request either: the plan owed a refusal. Where the run ran out of memory, every
/// free the session made was given back, the last probe's own included, though it was freed
/// after its figure (the run saw what it kept gone, the figure did not), and at the keep
/// test's bound where its rounds lost, but not alike: a loose one, 160 MiB read past the run
/// where the engine alone had 61. Given back now: the frees the figure shows, each at most what
/// the weights' window grew by (it held the first probe's free, of the largest allocation the
/// session makes before the run; a free keeps no more than one of a larger allocation does).
#[test]
fn a_profile_run_out_of_memory_gives_back_only_the_frees_its_probe_shows() {
    let mut cases = passes(
        "b580-nosysman-leak-32m-adversarial-neighbour-profile-run.toml",
        &[59, 68, 93, 104, 117],
    );
    cases.extend(passes(
        "b580-nosysman-leak-128m-uncalibrated-neighbour-profile-run.toml",
        &[96],
    ));
    cases.extend(passes(
        "open/b580-nosysman-leak-96m-uncalibrated-neighbour-profile-run.toml",
        &[24, 44, 184],
    ));
    for c in &cases {
        let why = c.out.failed.as_deref().unwrap_or("");
        assert!(why.contains("ran out of memory"), "{}: {why}", c.what);
    }
}

/// Where the files of the battery on other processes between captures and after the plan, and
/// pinned allocator options, live.
const CAPTURE_AND_AFTER: &str = "capture-and-after";

/// Every file of `tests/outside/<name>/`, each on one seed (its place in the list, modulo
/// `seeds`), judged by the gating rules alone.
fn folder_passes_the_gating_rules_once(name: &str, seeds: u64) {
    let mut failed = Vec::new();
    for (i, file) in folder(name).iter().enumerate() {
        let cases = cases_with(&format!("{name}/{file}"), &[i as u64 % seeds], |_| {});
        failed.extend(
            acceptance::failures(&cases)
                .into_iter()
                .filter(|f| acceptance::GATING.contains(&f.check))
                .map(|f| f.line),
        );
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// Scenario files written from docs/scenarios.md ("Other processes between captures and after
// the plan", "Allocator options") on files of the time-and-neighbours battery, their own
// neighbours replaced: other processes that arrive, grow, shrink, churn or leave between the
// graph phase's captures (after the first to after the last), that take part or all of what is
// free after the plan (before the KV cache, before or between the engine's own captures, before
// serving), that leave after the plan; and the engine's allocator options pinned on every seed
// (expandable segments, max_split_size_mb 20 to 1024, roundup_power2_divisions 2, 4, 16 and
// PyTorch's own test's list, large_segment_size_mb 11 to 1024, a stated collection threshold,
// PyTorch's defaults), on every simulated profile family, vLLM's and SGLang's layouts and start
// rules, engines with no hook or no post-capture sizing, eager engines. When written, 44 files on
// seeds 0 to 39 (1,760 runs): no gating failure; 484 runs ran out of memory that other processes
// took after the plan, each the others' (the same run with them as they were at the plan did
// not); neighbours that arrive between captures are counted as graph memory (below the floor
// where the same neighbour arriving at the graph phase's start is not). One file more, where
// others leave between captures, is open (`open/a100-40-others-leave-mid-capture-post-capture-codellama.toml`).
// In CI every file on one seed.
#[test]
fn capture_and_after_pass_the_gating_rules() {
    folder_passes_the_gating_rules_once(CAPTURE_AND_AFTER, 40);
}

/// Every file of `tests/outside/capture-and-after/` on seeds 0 to 39, judged by the gating rules
/// alone.
#[test]
#[ignore = "40 seeds per file: run by hand in a release build"]
fn capture_and_after_over_40_seeds() {
    let seeds: Vec<u64> = (0..40).collect();
    folder_passes_the_gating_rules(CAPTURE_AND_AFTER, &seeds);
}

/// Other processes that take all that is free after the plan (before the KV cache, between the
/// engine's captures, before serving): the run runs out of memory, and the same run with them as
/// they were at the plan does not. The out-of-memory is theirs, reported as its own outcome and
/// never a success or dropped; the calm run, with the same plan, passes every gating rule.
#[test]
fn an_out_of_memory_others_took_after_the_plan_is_reported_as_theirs() {
    for file in [
        "h100-step256-overcommit-before-kv-cache-llama8b.toml",
        "a100-80-no-post-capture-overcommit-mid-engine-capture-phi4.toml",
        "a770-eager-overcommit-before-serve-qwen25-1.5b.toml",
    ] {
        let cases = cases_with(&format!("{CAPTURE_AND_AFTER}/{file}"), &[0, 1], |_| {});
        let all = acceptance::failures(&cases);
        for c in &cases {
            assert!(c.out.oom.is_none(), "{file} {}: {:?}", c.what, c.out.oom);
            assert!(c.out.oom_others_after_plan.is_some(), "{file} {}", c.what);
        }
        assert_eq!(
            all.iter()
                .filter(|f| f.check == Check::OutOfMemoryOthersAfterPlan)
                .count(),
            cases.len(),
            "{file}"
        );
        let gating: Vec<&str> = all
            .iter()
            .filter(|f| acceptance::GATING.contains(&f.check))
            .map(|f| f.line.as_str())
            .collect();
        assert!(gating.is_empty(), "{file}:\n{}", gating.join("\n"));
    }
}

/// Others that held 512 MiB of an A100 from the start leave between the graph phase's captures:
/// the pass's capture window (and the whole pass's, first to last) reads their release as the
/// graphs taking less, so the post-capture reserve is 512 MiB below the graphs' real memory and
/// the KV cache takes it: 495 MiB past the request while serving, 102.3% of the oracle, on every
/// seed (the same others leaving before the graph phase or before the plan: 99.9%). `full`
/// (no post-capture sizing) the same (`capture_all` in `strategy/full.rs`). Found by the
/// capture-and-after battery.
#[test]
#[ignore = "open: a release by another process inside a capture window is read as the graphs' own memory"]
fn others_leaving_between_captures_are_not_the_graphs() {
    passes(
        "open/a100-40-others-leave-mid-capture-post-capture-codellama.toml",
        &[0, 1, 2],
    );
}

/// An A100 40GB whose KV cache is 36 one-layer full-attention groups of different shapes (1 to
/// 8 KV heads of 64 or 128: variable grouped-query attention), which vLLM lays out as one
/// group of a tensor per layer of its own page (`UniformTypeKVCacheSpecs`), beside an allocator
/// with power-of-two divisions. With no layout of one page the plan kept what a request of
/// unknown size may gain, `1/(d+1)` of the room (a third at two divisions), though each
/// tensor's size is known: 83.0%, 60.7% and 76.9% of the oracle on these seeds (outside battery
/// o34, models and graphs, file mg26). Each tensor is now fitted rounded as the allocator
/// rounds it: 100% on seeds 21 and 38; 75.0% on seed 34, where the granule read off the
/// allocator's sizes (71 MiB, one warm-up's) is all the plan knows of a finer one and each
/// tensor keeps that granule.
#[test]
fn layers_of_different_pages_are_fitted_tensor_by_tensor() {
    let file = "models-graphs/mg26-a100-40-36-full-groups-of-shapes-per-tensor-eager.toml";
    for c in passes(file, &[21, 34, 38]) {
        let share = c.out.kv_vs_oracle.expect("an oracle");
        let least = if c.what.contains("seed=34") {
            0.74
        } else {
            0.99
        };
        assert!(share >= least, "{}: {share}", c.what);
    }
}

/// An L4 whose free reading moves in 512 MiB steps, every calibration read on an even multiple
/// of the step (seeds 9 and 33; found by an outside battery): the reads' common divisor, 1 GiB,
/// was taken as the step and every window kept it as its error (55.5% and 49.6% of the oracle,
/// where other seeds give 88-92%). The divisor is only an upper bound: an allocation of half of
/// it moves the reading by one 512 MiB step, and the windows keep that (79.6% and 74.3%; the
/// rest is what a reading in such steps costs on the engine's captures).
#[test]
fn a_reading_step_is_confirmed_not_read_off_the_reads_divisor() {
    let file = "l4-free-step-512m-every-calibration-read-on-an-even-multiple.toml";
    for c in passes(file, &[9, 33]) {
        let share = c.out.kv_vs_oracle.expect("an oracle");
        assert!(share >= 0.7, "{}: {share}", c.what);
    }
}
