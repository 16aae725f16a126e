//! The seeded sweep behind `docs/strategy-comparison.md` (written by `cargo xtask
//! strategy-table`, checked current and run by `cargo xtask ci` from a release build).
//!
//! `cargo run --release -p memplan-testbed --example sweep -- [--seeds N] [--strategy-seeds N]
//! [--profile-seeds N] [--random N] [--hookless N] [--unmeasured N] [--one-backing N]
//! [--split-kv N] [--hybrid N] [--threads N] [--physics low|high] [--shown N]`: Markdown on stdout;
//! every failed gating check on stderr, exit code 1 when there is one (see
//! `memplan_testbed::sweep::acceptance`). `SWEEP_WARNING=CODE[,CODE...]` counts on stderr the
//! automatic runs whose plan carries each warning code.

use std::collections::BTreeMap;
use std::process::ExitCode;

use memplan_planner::strategy::StrategyKind;
use memplan_testbed::sweep::acceptance::{self, Check, ATTAINABLE_Z, GATING};
use memplan_testbed::sweep::{
    Case, Stats, Sweep, HOOKLESS_GROUP, HYBRID_GROUP, ONE_BACKING_GROUP, OTHERS_SEEDS,
    SPLIT_KV_GROUP, UNMEASURED_GROUP,
};

/// Generated scenarios run again with each engine allocating one backing buffer (`--one-backing`):
/// four runs each.
const ONE_BACKING_DEFAULT: u64 = 500;

/// Generated scenarios run again with each engine allocating a K and a V tensor per layer
/// (`--split-kv`): four runs each.
const SPLIT_KV_DEFAULT: u64 = 500;

/// Generated scenarios made hybrid (`--hybrid`): four runs each.
const HYBRID_DEFAULT: u64 = 250;

fn kind(k: StrategyKind) -> &'static str {
    match k {
        StrategyKind::PostCapture | StrategyKind::Full => "measured",
        StrategyKind::Sampled => "modelled from samples",
        StrategyKind::Conservative => "bound",
        StrategyKind::None => "eager",
        StrategyKind::VllmLegacy => "legacy estimate",
    }
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn table(out: &mut String, rows: &BTreeMap<String, Stats>, first: &str) {
    out.push_str(&format!(
        "| {first} | KV tokens of the run's oracle (min / median / max) | of the clean oracle | runs (adversarial) | out of memory | over the request | refused |\n|---|---|---|---|---|---|---|\n"
    ));
    for (k, s) in rows {
        out.push_str(&format!(
            "| {k} | {} | {} | {} ({}) | {} | {} | {} |\n",
            s.spread(),
            s.clean_spread(),
            s.runs,
            s.adversarial,
            s.oom,
            s.over_request,
            s.refused
        ));
    }
    out.push('\n');
}

/// The group a case is counted in for the acceptance table.
fn acceptance_group(c: &Case) -> String {
    if c.group.starts_with("profile") {
        "every profile".into()
    } else if c.group.starts_with("others") {
        "other processes".into()
    } else if c.group == "random" {
        "generated scenarios".into()
    } else if c.group == HOOKLESS_GROUP {
        "generated, engine without the KV hook".into()
    } else if c.group == UNMEASURED_GROUP {
        "generated, no KV hook and no allocator tensors".into()
    } else if c.group == ONE_BACKING_GROUP {
        "generated, one backing allocation (vLLM 0.29+)".into()
    } else if c.group == SPLIT_KV_GROUP {
        "generated, K and V apart (SGLang to 0.5.22)".into()
    } else if c.group == HYBRID_GROUP {
        "generated, hybrid sliding window + full".into()
    } else {
        format!("scenario {}", c.group)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let sweep = Sweep {
        seeds: arg(&args, "--seeds", 1000),
        strategy_seeds: arg(&args, "--strategy-seeds", 40),
        profile_seeds: arg(&args, "--profile-seeds", 40),
        random: arg(&args, "--random", 1000),
        hookless: arg(&args, "--hookless", 500),
        unmeasured: arg(&args, "--unmeasured", 500),
        one_backing: arg(&args, "--one-backing", ONE_BACKING_DEFAULT),
        split_kv: arg(&args, "--split-kv", SPLIT_KV_DEFAULT),
        hybrid: arg(&args, "--hybrid", HYBRID_DEFAULT),
        all_strategies: true,
        physics: args
            .iter()
            .position(|a| a == "--physics")
            .and_then(|i| args.get(i + 1))
            .cloned(),
    };
    let threads = arg(
        &args,
        "--threads",
        std::thread::available_parallelism().map_or(2, |n| n.get() as u64),
    ) as usize;
    // Failures listed per check (`--shown N`).
    let shown = arg(&args, "--shown", 40) as usize;
    let cases: Vec<Case> = sweep.run(threads);
    let autos = cases.iter().filter(|c| c.out.auto).count();
    let codes = std::env::var("SWEEP_WARNING").unwrap_or_default();
    for code in codes.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let warned = cases
            .iter()
            .filter(|c| {
                c.out.auto
                    && c.out
                        .plan
                        .as_ref()
                        .is_some_and(|p| p.warnings.iter().any(|w| w.code() == code))
            })
            .count();
        eprintln!("plans warning {code}: {warned} of {autos} automatic runs");
    }
    let adversarial = cases.iter().filter(|c| c.out.auto && c.adversarial).count();
    let mut out = String::new();
    out.push_str("# Graph-memory strategies over seeded simulator physics\n\n");
    out.push_str(&format!(
        "Generated by `cargo xtask strategy-table` (the `sweep` example of memplan-testbed, release build, \
         `--seeds {} --strategy-seeds {} --profile-seeds {} --random {} --hookless {} --unmeasured {} --one-backing {} --split-kv {} --hybrid {}`): {} seeds of the simulator's physics \
         ([simulator-physics.md](simulator-physics.md)) of the automatic choice on every scenario of \
         `crates/memplan-testbed/scenarios/` ([scenarios.md](scenarios.md)), every strategy on the first {} of them, \
         {} seeds of the automatic choice on every simulated profile (honest and `declare-exact`) with the base \
         models that fit it, {} seeds with other processes on every profile, {} generated scenarios (one seed \
         each), the first {} of them again with an engine that offers the session no KV allocation hook (it \
         allocates the plan's block count itself, with its own page arithmetic, after the start-up; the session \
         measures the plan's layout through the engine's allocator), and the first {} with an engine whose \
         allocator offers no tensors either (the plan's layout, and the rounding it keeps room for, bounded from \
         the engine's own allocations, are all that stands between it and an out-of-memory); the first {} again \
         with each of four engines (the hook with the allocator's tensors, the tensors alone, neither, the hook alone) allocating its KV cache as one \
         backing buffer that every layer views, as vLLM 0.29.0 on does (`vllm/v1/worker/utils.py`, `allocate_kv_cache`), \
         the session told so (one rounding of the allocator, not one per layer), and the first {} with each of them \
         allocating a K and a V tensor per layer, as SGLang 0.5.1 to 0.5.22 do \
         (`python/sglang/srt/mem_cache/memory_pool.py`, `MHATokenToKVPool._create_buffers`), the session told so \
         (twice the tensors, each rounded at half the size), each starting where its pool cannot hold one request \
         of `max_model_len` and admitting shorter ones as SGLang does (`python/sglang/srt/managers/tp_worker.py`, \
         `TpModelWorker`: from a pool of 7 tokens as 0.5.1 to 0.5.13 on even scenarios, of 2 as 0.5.14 on on odd \
         ones), the session told so; the first {} with their layers split into sliding-window and full attention as \
         gemma-3's (one global in six, a window of 1024) and gpt-oss's (alternating, 128) are, each allocated as vLLM to 0.28 \
         (a tensor per layer of a group, shared by the groups), vLLM 0.29+ (one backing buffer), SGLang to 0.5.22 (a K \
         and a V tensor per layer of each pool) and 0.5.23 (a tensor per layer) do, with the four ways of measuring it \
         in turn; {} runs, {} of them of the automatic choice, {} of those on adversarial physics (a quarter of the \
         seeds draw every hidden quantity from ranges wider than the public evidence). `cargo xtask ci` fails when \
         this file drifts or a gating check fails. Both oracles are computed from ground truth by the test-bed's own \
         code (the engine alone on a fresh device, the engine's own KV arithmetic); the clean oracle is the \
         scenario's engine as configured (its graphs captured wherever the device captures, whatever strategy the \
         run chose) with nothing the run's profiling did, so an eager run can hold more than it. Engine hints are off.\n\n",
        sweep.seeds,
        sweep.strategy_seeds,
        sweep.profile_seeds,
        sweep.random,
        sweep.hookless,
        sweep.unmeasured,
        sweep.one_backing,
        sweep.split_kv,
        sweep.hybrid,
        sweep.seeds,
        sweep.strategy_seeds,
        sweep.profile_seeds,
        sweep.profile_seeds.min(OTHERS_SEEDS),
        sweep.random,
        sweep.hookless.min(sweep.random),
        sweep.unmeasured.min(sweep.random),
        sweep.one_backing.min(sweep.random),
        sweep.split_kv.min(sweep.random),
        sweep.hybrid,
        cases.len(),
        autos,
        adversarial
    ));
    out.push_str("Graph reserve: **measured** (post-capture, full capture: read from the device), **modelled from samples** \
        (sampled), **bound** (conservative: the allocator-visible pool measured, the driver-only part bounded from above), \
        **eager** (none), **legacy estimate** (vLLM's old sampling, for comparison). \"Over the request\": the process's \
        high-water mark from the plan on (ground truth, every driver call) passed the requested memory, whether or \
        not it ran out of memory or a warning named why.\n\n");

    // The strict acceptance table first: what fails, per group.
    let fails = acceptance::failures(&cases);
    // Per group: auto runs, and per check (failures, of which on adversarial physics).
    type Counts = BTreeMap<Check, (usize, usize)>;
    let mut per_group: BTreeMap<String, (usize, Counts)> = BTreeMap::new();
    for c in cases.iter().filter(|c| c.out.auto) {
        per_group.entry(acceptance_group(c)).or_default().0 += 1;
    }
    for f in &fails {
        let e = per_group
            .entry(acceptance_group(f.case))
            .or_default()
            .1
            .entry(f.check)
            .or_default();
        e.0 += 1;
        e.1 += usize::from(f.case.adversarial);
    }
    let cell = |(n, adv): (usize, usize)| {
        if adv > 0 {
            format!("{n} ({adv} adv.)")
        } else {
            n.to_string()
        }
    };
    out.push_str("## Strict acceptance of the automatic choice\n\n");
    out.push_str(&"Failures per group under the strict rules (`memplan_testbed::sweep::acceptance`): out of memory \
         anywhere, profiling included; the process's high-water mark from the plan on (ground truth, every \
         driver call of the KV allocation, the engine's graph capture and serving) over the requested memory \
         unless the plan warned by name that it could not bound it, and beside it the earlier, weaker rule: over \
         the requested memory at a sampled point (after the KV cache, each warm-up and capture, the serving \
         burst); the process's high-water mark before the plan (from the engine's start: the session's start \
         and calibration, the engine's weights and profile run, the graph phase, the plan step, or the step \
         that ended a start-up) over both the requested memory and what the engine alone took at its most in \
         the same step (the engine's own weights, profile run and graph captures past the request are the \
         engine's), unless what the session named it put on top covers it (its allocation probes, which take \
         what is free for an instant, `probes_take_free_memory`; memory its own checks left held for good, \
         `checks_left_held`); planned, then failed in the engine's KV allocation, graph \
         capture or serving with an error other than out-of-memory (judged on what it served too, not as \
         a refusal); over 100.5% of the run's oracle; below 99% of it where the graph memory was measured \
         (post-capture, full, eager) and below 97% where it was bounded or modelled, the plan was capped by a \
         reading's tolerance or an allocation probe, or nothing measured the KV cache's allocation; the same floor in memory: below the floor and fewer tokens \
         than the largest cache that fits in 99% (97%) of the oracle's room, by the engine's own arithmetic (an allocator that \
         rounds each KV tensor to a coarse granule gives the cache in steps of many blocks, and a plan a fraction \
         of a percent short of a room that ends just past a step holds a whole step less: the floor in tokens \
         counts that run, the floor in memory only a plan that lost more than the floor's share of the memory); \
         below an attainable floor: below the floor where a plan that knew the mean cost of every graph and kept \
         only ATTAINABLE_Z standard deviations of the engine's own later captures (their capture-to-capture variation, \
         from the ground truth: within the request in 99.9% of them) would have reached it (the engine captures \
         its graphs again after the plan, and where that variation is more than the floor's share of the room, \
         no plan made before it is both at the floor and safe: those runs are below the floor by the physics \
         drawn, the column counts the rest); \
         a refusal where the oracle holds a request of \
         `max_model_len` after keeping 97% of its blocks (for an SGLang engine, a pool it starts with), and of \
         those, the refusals within reach: where the cache of the plan of the attainable floor (ATTAINABLE_Z standard \
         deviations of the engine's later captures kept) holds such a request too; a harness error (including an oracle that could not be \
         computed, a shipped scenario that does not load, a profile or generated setup that does not resolve); \
         an unmeasured graph reserve below the real graph memory (by more than the margin of a capture-to-capture \
         variation the plan warned of, `graph_capture_varies`); a KV cache the engine was served with fewer \
         tokens than the plan promised, by over one block beyond what the caching allocator's rounding of the \
         engine's tensors costs (the engine's own page arithmetic took more than the plan's layout, and the \
         session shrank the cache to fit, `kv_cache_shrunk`). A case can fail more than one rule; \
         \"(N adv.)\": N of the failures are on adversarial physics. Gating in CI: ".replace("ATTAINABLE_Z", &ATTAINABLE_Z.to_string()),
    );
    let gating: Vec<&str> = GATING.iter().map(|c| c.name()).collect();
    out.push_str(&gating.join(", "));
    let reported: Vec<&str> = Check::ALL
        .iter()
        .filter(|c| !GATING.contains(c))
        .map(|c| c.name())
        .collect();
    out.push_str(&format!(". Reported, not gating: {}", reported.join(", ")));
    out.push_str(
        ". Every group gates, on every physics: the engine with neither the KV hook nor tensors from its \
         allocator, whose KV allocation nothing the session can call measures, has a plan that keeps room for \
         rounding each KV tensor to the coarsest granule its own allocations during the start-up allow (the \
         session says so, `kv_allocation_unmeasured`), and is held to the 97% floor of a bound",
    );
    out.push_str(".\n\n| group | auto runs |");
    for c in Check::ALL {
        out.push_str(&format!(" {} |", c.name()));
    }
    out.push_str("\n|---|---|");
    for _ in Check::ALL {
        out.push_str("---|");
    }
    out.push('\n');
    let mut totals: BTreeMap<Check, (usize, usize)> = BTreeMap::new();
    for (g, (runs, counts)) in &per_group {
        out.push_str(&format!("| {g} | {runs} |"));
        for c in Check::ALL {
            let n = counts.get(&c).copied().unwrap_or((0, 0));
            let t = totals.entry(c).or_default();
            (t.0, t.1) = (t.0 + n.0, t.1 + n.1);
            out.push_str(&format!(" {} |", cell(n)));
        }
        out.push('\n');
    }
    out.push_str(&format!("| **all** | {autos} |"));
    for c in Check::ALL {
        out.push_str(&format!(
            " **{}** |",
            cell(totals.get(&c).copied().unwrap_or((0, 0)))
        ));
    }
    out.push_str("\n\n");

    out.push_str("## Every strategy, per shipped scenario\n\n");
    let mut by_scenario: BTreeMap<String, BTreeMap<String, Stats>> = BTreeMap::new();
    for c in cases.iter().filter(|c| {
        !c.group.starts_with("profile") && !c.group.starts_with("others") && c.group != "random"
    }) {
        let name = if c.out.auto {
            "auto".to_string()
        } else {
            format!("{} ({})", c.out.strategy, kind(c.out.strategy))
        };
        by_scenario
            .entry(c.group.clone())
            .or_default()
            .entry(name)
            .or_default()
            .add_case(c);
    }
    for (scenario, rows) in &by_scenario {
        out.push_str(&format!("### {scenario}\n\n"));
        table(&mut out, rows, "strategy");
    }
    out.push_str("## The automatic choice on every profile\n\n");
    let mut by_profile: BTreeMap<String, Stats> = BTreeMap::new();
    for c in cases.iter().filter(|c| c.group.starts_with("profile")) {
        by_profile
            .entry(c.group.trim_start_matches("profile ").to_string())
            .or_default()
            .add_case(c);
    }
    table(&mut out, &by_profile, "profile");
    out.push_str(
        "## Other processes on every profile\n\n\
         `bf16-24g` on every profile under a byte budget of 60% of the usable memory, with other processes \
         holding 25% of it from the start and 40% from the graph phase on: physically less than the budget is \
         left. Where the driver's free reading cannot see them (process-local, absent or suspect), the \
         device-wide reading bounds the KV cache; where nothing can, the plan names the blind spot and an \
         allocation probe checks it. \"physical check\" counts the runs by what bounded the plan.\n\n",
    );
    let mut by_others: BTreeMap<String, Stats> = BTreeMap::new();
    let mut checks: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for c in cases.iter().filter(|c| c.group.starts_with("others")) {
        let name = c.group.trim_start_matches("others ").to_string();
        by_others.entry(name.clone()).or_default().add_case(c);
        let check = c
            .out
            .plan
            .as_ref()
            .and_then(|p| p.physical_check)
            .map_or("none".to_string(), |k| k.short().to_string());
        *checks.entry(name).or_default().entry(check).or_default() += 1;
    }
    out.push_str(
        "| profile | KV tokens of the run's oracle (min / median / max) | of the clean oracle | runs (adversarial) | out of memory | over the request | refused | physical check |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (k, s) in &by_others {
        let ch: Vec<String> = checks
            .get(k)
            .map(|m| m.iter().map(|(c, n)| format!("{c} {n}")).collect())
            .unwrap_or_default();
        out.push_str(&format!(
            "| {k} | {} | {} | {} ({}) | {} | {} | {} | {} |\n",
            s.spread(),
            s.clean_spread(),
            s.runs,
            s.adversarial,
            s.oom,
            s.over_request,
            s.refused,
            ch.join(", ")
        ));
    }
    out.push('\n');
    out.push_str("## Generated scenarios, by the strategy chosen\n\n");
    let mut by_auto: BTreeMap<String, Stats> = BTreeMap::new();
    for c in cases.iter().filter(|c| c.group == "random") {
        let k = if c.out.failed.is_some() && c.out.plan.is_none() {
            "refused at start-up".to_string()
        } else {
            format!("{} ({})", c.out.strategy, kind(c.out.strategy))
        };
        by_auto.entry(k).or_default().add_case(c);
    }
    table(&mut out, &by_auto, "automatic choice");

    out.push_str("## Every failure of the automatic choice\n\n");
    if fails.is_empty() {
        out.push_str("None.\n");
    }
    let mut by_check: BTreeMap<Check, Vec<&str>> = BTreeMap::new();
    for f in &fails {
        by_check.entry(f.check).or_default().push(&f.line);
    }
    for (check, lines) in &by_check {
        out.push_str(&format!("### {} ({})\n\n", check.name(), lines.len()));
        for l in lines.iter().take(shown) {
            out.push_str(&format!("- {}\n", l.replace('|', "/")));
        }
        if lines.len() > shown {
            out.push_str(&format!("- ... and {} more\n", lines.len() - shown));
        }
        out.push('\n');
    }
    print!("{out}");
    let hard = acceptance::gating(&fails);
    for f in &hard {
        eprintln!("sweep: {}", f.line);
    }
    if hard.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
