//! The seeded sweep: many draws of the simulator's physics, every simulated profile, every
//! shipped scenario, and randomly generated scenarios; the acceptance checks over all of them.
//!
//! - [`Sweep::run`]: the runs (in parallel on the machine's cores), each a pure function of its
//!   seed, so the result does not depend on the scheduling. Besides the shipped scenarios, every
//!   profile and the generated scenarios, every profile runs with memory other processes hold
//!   ([`with_others`]), where the free reading may not see it.
//! - [`generate`]: the generated scenarios, wider on the seeds whose physics are adversarial.
//! - [`acceptance`]: the strict checks on the automatic choice (out of memory, over the request
//!   unless warned by name, over the oracle, below the share floor, needless refusal, harness
//!   errors), counted per group; [`acceptance::GATING`] fail the sweep.
//! - [`Stats`]: min / median / max of the share of each oracle, per group.

pub mod acceptance;
pub mod generate;

pub use generate::{hybrid_scenario, random_scenario, ADDED_AFTER_THE_DRAW, HYBRID_SHAPES};

use std::sync::Arc;

use memplan_backend_sim::profiles;
use memplan_core::kv::KvAllocation;
use memplan_planner::strategy::StrategyKind;

use crate::oracle::engine_alone;
use crate::report::Outcome;
use crate::run::{run_judged, Choice};
use crate::scenario::{ByteValue, NeighbourChange, RequestSpec, Scenario, StartRule, SHIPPED};
use crate::setup::Setup;

/// One run of the sweep.
#[derive(Debug, Clone)]
pub struct Case {
    /// Group it is reported in (scenario name, `profile/scenario`, or `random`).
    pub group: String,
    /// The device selector and seed, to reproduce it.
    pub what: String,
    /// The outcome.
    pub out: Outcome,
    /// Whether the harness itself failed (the scenario could not be run or judged): then
    /// `out.failed` says why, and the case is a hard failure whatever the strategy did.
    pub harness_error: bool,
    /// The setup it ran (shared by the strategies of one job); `None` where it could not be
    /// loaded or resolved (a harness error).
    pub setup: Option<Arc<Setup>>,
    /// Whether the device's physics were drawn from the adversarial ranges.
    pub adversarial: bool,
}

/// Min / median / max of the share of the oracle, and counts.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Shares of the oracle, sorted.
    pub shares: Vec<f64>,
    /// Shares of the clean device's oracle, sorted.
    pub clean_shares: Vec<f64>,
    /// Runs on adversarial physics.
    pub adversarial: usize,
    /// Runs.
    pub runs: usize,
    /// Out of memory.
    pub oom: usize,
    /// Past the requested memory.
    pub over_request: usize,
    /// Refused at start-up or failed otherwise.
    pub refused: usize,
}

impl Stats {
    /// Add one outcome.
    pub fn add(&mut self, o: &Outcome) {
        self.runs += 1;
        self.oom += usize::from(o.oom.is_some());
        self.over_request += usize::from(o.over_request_bytes.is_some());
        self.refused += usize::from(o.failed.is_some());
        let insert = |v: &mut Vec<f64>, x: f64| {
            let i = v.partition_point(|y| *y < x);
            v.insert(i, x);
        };
        if let (None, None) = (&o.oom, &o.failed) {
            if let Some(x) = o.kv_vs_oracle {
                insert(&mut self.shares, x);
            }
            if let Some(x) = o.kv_vs_clean_oracle {
                insert(&mut self.clean_shares, x);
            }
        }
    }

    /// Add one case (its outcome, and whether its physics were adversarial).
    pub fn add_case(&mut self, c: &Case) {
        self.add(&c.out);
        self.adversarial += usize::from(c.adversarial);
    }

    /// `min / median / max` of the shares of the run's oracle in percent, or `-`.
    pub fn spread(&self) -> String {
        spread(&self.shares)
    }

    /// The same for the clean device's oracle.
    pub fn clean_spread(&self) -> String {
        spread(&self.clean_shares)
    }
}

fn spread(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let p = |x: f64| format!("{:.1}%", x * 100.0);
    format!(
        "{} / {} / {}",
        p(v[0]),
        p(v[v.len() / 2]),
        p(v[v.len() - 1])
    )
}

/// A setup for a scenario and a seed.
pub fn seeded(mut setup: Setup, seed: u64) -> Setup {
    setup.seed = seed;
    setup
}

/// A shipped scenario moved onto another profile (its neighbours dropped, a byte budget of 75%
/// of the usable memory where the device reports no usable total).
pub fn retarget(base: &Scenario, profile: &str, exact_total: bool, usable: u64) -> Scenario {
    let mut s = base.clone();
    s.device = profile.to_string();
    s.other_processes = ByteValue::Int(0);
    s.neighbour.clear();
    if !exact_total {
        s.request = RequestSpec {
            gpu_memory_utilization: None,
            memory_budget: Some(ByteValue::Int(usable / 4 * 3)),
        };
    }
    s
}

/// The group of generated scenarios whose engine offers no KV allocation hook
/// (`Engine::allocate_kv_cache`) and allocates the plan's blocks itself, with its own page
/// arithmetic, after the session: the session measures the plan's layout through the engine's
/// allocator (`AllocatorView::allocate_tensor`), so the plan's layout is what stands between
/// the engine and an out-of-memory.
pub const HOOKLESS_GROUP: &str = "no KV hook";

/// The group of generated scenarios whose engine offers neither the KV allocation hook nor
/// tensors from its allocator: nothing measures what the engine's allocator makes of the
/// plan's blocks, so the plan's layout and the rounding it keeps room for (bounded from the
/// engine's own allocations during the start-up) are all that stands between the plan and an
/// out-of-memory. It gates like every other group.
pub const UNMEASURED_GROUP: &str = "no KV measurement";

/// The group of generated scenarios whose engine allocates its KV cache as one backing buffer
/// that every layer views, as vLLM 0.29.0 on does (`vllm/v1/worker/utils.py`,
/// `allocate_kv_cache`: one `torch.zeros(bytes_per_block * num_blocks)`; 0.34.0
/// `vllm/v1/core/kv_cache_planning.py`, `get_kv_cache_config_from_groups`: every
/// `KVCacheTensor` of that one size), the session told so (`SizingRules::kv_allocation`), with
/// each engine of [`KV_ALLOCATION_ENGINES`]. It gates like every other group.
pub const ONE_BACKING_GROUP: &str = "one backing (vLLM 0.29+)";

/// The group of generated scenarios whose engine allocates its KV cache as SGLang 0.5.1 to
/// 0.5.22 do, a K and a V tensor per layer (`python/sglang/srt/mem_cache/memory_pool.py`,
/// `MHATokenToKVPool._create_buffers`: a `k_buffer` and a `v_buffer` of one `torch.zeros` per
/// layer each), the session told so (`SizingRules::kv_allocation`), with each engine of
/// [`KV_ALLOCATION_ENGINES`]: twice the tensors of vLLM's layout, each half the size, so each
/// is rounded by the allocator at half the size. It gates like every other group.
pub const SPLIT_KV_GROUP: &str = "K and V apart (SGLang to 0.5.22)";

/// The group of generated scenarios whose model mixes sliding-window and full-attention
/// layers ([`hybrid_scenario`]: gemma-3's and gpt-oss's patterns), each allocated by the four
/// engines of [`HYBRID_ENGINES`] with one of [`KV_ALLOCATION_ENGINES`]'s ways of measuring it
/// (turn by turn, so every pairing occurs), the session told the allocation. It gates like
/// every other group.
pub const HYBRID_GROUP: &str = "hybrid sliding window + full";

/// How the engines of [`HYBRID_GROUP`] allocate a hybrid model's cache: `(allocation, label)`.
/// vLLM to 0.28 a tensor per layer of a group, shared by the groups
/// (`vllm/v1/core/kv_cache_utils.py`, `_get_kv_cache_groups_uniform_page_size`), vLLM 0.29.0 on
/// one backing buffer (`vllm/v1/worker/utils.py`, `allocate_kv_cache`), SGLang 0.5.1 to 0.5.22
/// a K and a V tensor per layer of each pool (`python/sglang/srt/mem_cache/memory_pool.py`,
/// `SWAKVPool` over two `MHATokenToKVPool`s), SGLang 0.5.23 a tensor per layer
/// (`MHATokenToKVPool._create_buffers_normal`).
pub const HYBRID_ENGINES: [(KvAllocation, &str); 4] = [
    (KvAllocation::PerTensor, "vLLM to 0.28"),
    (KvAllocation::OneBacking, "vLLM 0.29+"),
    (KvAllocation::SplitKv, "SGLang to 0.5.22"),
    (KvAllocation::PairedKv, "SGLang 0.5.23"),
];

/// What the engine of a generated scenario's `i`-th run allocating its KV cache as `allocation`
/// does where its pool cannot hold one request of `max_model_len`: SGLang's engines start and
/// admit shorter requests, those allocating K and V apart ([`SPLIT_KV_GROUP`]) by the rule of
/// 0.5.1 to 0.5.13 on even runs and of 0.5.14 to 0.5.22 on odd ones, 0.5.23 (K and V paired)
/// by 0.5.14's; vLLM's refuse.
pub fn start_rule(allocation: KvAllocation, i: u64) -> StartRule {
    match allocation {
        KvAllocation::SplitKv if i.is_multiple_of(2) => StartRule::Sglang051,
        KvAllocation::SplitKv | KvAllocation::PairedKv => StartRule::Sglang0514,
        _ => StartRule::Vllm,
    }
}

/// The `i`-th generated `setup` with an engine that offers the KV hook (`hook`) and the
/// allocator's tensors (`tensors`) and allocates its cache as `allocation`, the session told
/// so, starting by that engine's rule ([`start_rule`]).
fn with_engine(
    setup: &Setup,
    i: u64,
    (hook, tensors): (bool, bool),
    allocation: KvAllocation,
) -> Setup {
    let mut setup = seeded(setup.clone(), i);
    setup.kv_hook = hook;
    setup.allocator_tensors = tensors;
    setup.kv_allocation = allocation;
    setup.planned_kv_allocation = allocation;
    setup.start_rule = start_rule(allocation, i);
    setup
}

/// The engines of [`ONE_BACKING_GROUP`] and [`SPLIT_KV_GROUP`]: `(KV hook, allocator tensors,
/// label)`: the KV hook with tensors from the engine's allocator, no hook but the tensors
/// ([`HOOKLESS_GROUP`]), neither ([`UNMEASURED_GROUP`]), and the hook alone. The hook alone is
/// the one engine whose allocation the session measures only on whole caches of its own layout
/// (no tensor of the plan's layout can be allocated to read what one tensor takes).
pub const KV_ALLOCATION_ENGINES: [(bool, bool, &str); 4] = [
    (true, true, "KV hook"),
    (false, true, "no hook, allocator tensors"),
    (false, false, "no hook, no tensors"),
    (true, false, "KV hook, no tensors"),
];

/// Seeds per profile of the runs with other processes ([`with_others`]).
pub const OTHERS_SEEDS: u64 = 40;

/// A shipped scenario moved onto a profile with memory other processes hold: a quarter of the
/// usable memory from the start, 40% from the graph phase on (a neighbour that grows while the
/// engine starts), under a byte budget of 60% of the usable memory. Physically less than the
/// budget is left: whatever the device's readings see, the automatic choice must fit in what
/// is there (bounded by a reading that sees the others, or by an allocation probe).
pub fn with_others(base: &Scenario, profile: &str, usable: u64) -> Scenario {
    let mut s = retarget(base, profile, false, usable);
    s.request = RequestSpec {
        gpu_memory_utilization: None,
        memory_budget: Some(ByteValue::Int(usable / 10 * 6)),
    };
    s.other_processes = ByteValue::Int(usable / 4);
    s.neighbour = vec![NeighbourChange::before(
        "graph_phase",
        ByteValue::Int(usable / 10 * 4),
    )];
    s
}

/// The sweep: what to run.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Seeds per shipped scenario (the automatic choice).
    pub seeds: u64,
    /// Seeds per simulated profile and base model (the automatic choice), and (at most
    /// [`OTHERS_SEEDS`]) per profile with other processes.
    pub profile_seeds: u64,
    /// Of the shipped scenarios' seeds, those on which every strategy runs too (for the
    /// comparison table).
    pub strategy_seeds: u64,
    /// Random scenarios.
    pub random: u64,
    /// Of the random scenarios, those run again with an engine that offers the session no KV
    /// allocation hook ([`HOOKLESS_GROUP`]): it allocates the plan's block count itself, with
    /// its own page arithmetic, after the start-up.
    pub hookless: u64,
    /// Of the random scenarios, those run again with an engine that offers neither the hook
    /// nor tensors from its allocator ([`UNMEASURED_GROUP`]).
    pub unmeasured: u64,
    /// Of the random scenarios, those run again with an engine that allocates its KV cache as
    /// one backing buffer, the session told so ([`ONE_BACKING_GROUP`]), once with each engine
    /// of [`KV_ALLOCATION_ENGINES`]: four runs each.
    pub one_backing: u64,
    /// Of the random scenarios, those run again with an engine that allocates a K and a V
    /// tensor per layer, the session told so ([`SPLIT_KV_GROUP`]), once with each engine of
    /// [`KV_ALLOCATION_ENGINES`]: four runs each.
    pub split_kv: u64,
    /// Generated scenarios made hybrid ([`HYBRID_GROUP`]): four runs each.
    pub hybrid: u64,
    /// Every strategy on the shipped scenarios (for the comparison table), not only auto.
    pub all_strategies: bool,
    /// Pin every physical quantity to one end of its range (`low`, `high`) instead of drawing.
    pub physics: Option<String>,
}

/// The jobs of a sweep: (group, what, setup, choices judged against one oracle).
/// A sweep's job: (group, what, the setup, the choices to run on it).
pub type Job = (String, String, Setup, Vec<Choice>);

/// A setup the sweep could not build: (group, what, why). Each is a harness error.
type Dropped = (String, String, String);

impl Sweep {
    fn jobs(&self) -> (Vec<Job>, Vec<Dropped>) {
        let (mut jobs, dropped) = self.unpinned_jobs();
        for j in &mut jobs {
            j.2.physics = self.physics.clone();
        }
        (jobs, dropped)
    }

    fn unpinned_jobs(&self) -> (Vec<Job>, Vec<Dropped>) {
        let mut jobs = Vec::new();
        let mut dropped: Vec<Dropped> = Vec::new();
        let choices: Vec<Choice> = if self.all_strategies {
            std::iter::once(Choice::Auto)
                .chain(StrategyKind::ALL.into_iter().map(Choice::Forced))
                .collect()
        } else {
            vec![Choice::Auto]
        };
        let mut shipped: Vec<(String, Setup)> = Vec::new();
        for (n, _) in SHIPPED {
            match Scenario::load(n).and_then(Scenario::resolve) {
                Ok(s) => shipped.push((n.to_string(), s)),
                Err(e) => dropped.push((
                    n.to_string(),
                    n.to_string(),
                    format!("the shipped scenario does not load: {e}"),
                )),
            }
        }
        for (name, setup) in &shipped {
            for seed in 0..self.seeds {
                let what = format!("{} seed={seed}", setup.scenario.device);
                let these = if seed < self.strategy_seeds {
                    choices.clone()
                } else {
                    vec![Choice::Auto]
                };
                jobs.push((name.clone(), what, seeded(setup.clone(), seed), these));
            }
        }
        // Every profile, honest and declared exact, with the base models that fit it.
        for p in profiles().iter().filter(|p| !p.name.starts_with("broken")) {
            let exact = p
                .capability()
                .reading(memplan_core::Reading::DriverTotal)
                .is_exact();
            for (base, min_total) in [
                ("fp8-24g", 0u64),
                ("bf16-24g", 0),
                ("shared-pool", 40 << 30),
            ] {
                if p.total_bytes / 4 * 3 < min_total {
                    continue;
                }
                // A base that did not load is a harness error already.
                let Some((_, b)) = shipped.iter().find(|(n, _)| n == base) else {
                    continue;
                };
                for sel in [p.name.to_string(), format!("{},declare-exact", p.name)] {
                    let sc = retarget(&b.scenario, &sel, exact, p.total_bytes);
                    let setup = match sc.resolve() {
                        Ok(s) => s,
                        Err(e) => {
                            dropped.push((
                                format!("profile {}", p.name),
                                format!("{sel} {base}"),
                                format!("the profile's setup does not resolve: {e}"),
                            ));
                            continue;
                        }
                    };
                    for seed in 0..self.profile_seeds {
                        jobs.push((
                            format!("profile {}", p.name),
                            format!("{sel} {base} seed={seed}"),
                            seeded(setup.clone(), seed),
                            vec![Choice::Auto],
                        ));
                    }
                }
            }
        }
        // Every profile with memory other processes hold (see [`with_others`]).
        if let Some((_, b)) = shipped.iter().find(|(n, _)| n == "bf16-24g") {
            for p in profiles().iter().filter(|p| !p.name.starts_with("broken")) {
                let setup = match with_others(&b.scenario, p.name, p.total_bytes).resolve() {
                    Ok(s) => s,
                    Err(e) => {
                        dropped.push((
                            format!("others {}", p.name),
                            format!("{} bf16-24g", p.name),
                            format!("the setup with other processes does not resolve: {e}"),
                        ));
                        continue;
                    }
                };
                for seed in 0..self.profile_seeds.min(OTHERS_SEEDS) {
                    jobs.push((
                        format!("others {}", p.name),
                        format!("{} bf16-24g seed={seed}", p.name),
                        seeded(setup.clone(), seed),
                        vec![Choice::Auto],
                    ));
                }
            }
        }
        let without = [
            (HOOKLESS_GROUP, self.hookless, true),
            (UNMEASURED_GROUP, self.unmeasured, false),
        ];
        for (group, count, tensors) in without {
            for i in 0..count.min(self.random) {
                let sc = random_scenario(i);
                let what = format!("{} ({})", sc.name, sc.device);
                match sc.resolve() {
                    Ok(mut setup) => {
                        setup.kv_hook = false;
                        setup.allocator_tensors = tensors;
                        jobs.push((group.into(), what, seeded(setup, i), vec![Choice::Auto]))
                    }
                    Err(e) => dropped.push((
                        group.into(),
                        what,
                        format!("the generated scenario does not resolve: {e}"),
                    )),
                }
            }
        }
        let allocations = [
            (
                ONE_BACKING_GROUP,
                self.one_backing,
                KvAllocation::OneBacking,
            ),
            (SPLIT_KV_GROUP, self.split_kv, KvAllocation::SplitKv),
        ];
        for (group, count, allocation) in allocations {
            for i in 0..count.min(self.random) {
                let sc = random_scenario(i);
                let what = format!("{} ({})", sc.name, sc.device);
                match sc.resolve() {
                    Ok(setup) => {
                        for (hook, tensors, label) in KV_ALLOCATION_ENGINES {
                            jobs.push((
                                group.into(),
                                format!("{what} {label}"),
                                with_engine(&setup, i, (hook, tensors), allocation),
                                vec![Choice::Auto],
                            ));
                        }
                    }
                    Err(e) => dropped.push((
                        group.into(),
                        what,
                        format!("the generated scenario does not resolve: {e}"),
                    )),
                }
            }
        }
        for i in 0..self.hybrid {
            let sc = hybrid_scenario(i);
            let what = format!("{} ({})", sc.name, sc.device);
            match sc.resolve() {
                Ok(setup) => {
                    for (k, (allocation, label)) in HYBRID_ENGINES.into_iter().enumerate() {
                        let (hook, tensors, measured) =
                            KV_ALLOCATION_ENGINES[(i as usize + k) % KV_ALLOCATION_ENGINES.len()];
                        jobs.push((
                            HYBRID_GROUP.into(),
                            format!("{what} {label}, {measured}"),
                            with_engine(&setup, i, (hook, tensors), allocation),
                            vec![Choice::Auto],
                        ));
                    }
                }
                Err(e) => dropped.push((
                    HYBRID_GROUP.into(),
                    what,
                    format!("the generated hybrid scenario does not resolve: {e}"),
                )),
            }
        }
        for i in 0..self.random {
            let sc = random_scenario(i);
            let what = format!("{} ({})", sc.name, sc.device);
            match sc.resolve() {
                Ok(setup) => {
                    jobs.push(("random".into(), what, seeded(setup, i), vec![Choice::Auto]))
                }
                Err(e) => dropped.push((
                    "random".into(),
                    what,
                    format!("the generated scenario does not resolve: {e}"),
                )),
            }
        }
        (jobs, dropped)
    }

    /// Run every job on `threads` threads; results in job order.
    pub fn run(&self, threads: usize) -> Vec<Case> {
        let (jobs, dropped) = self.jobs();
        let mut cases = run_jobs(&jobs, threads);
        // A setup the sweep could not build is the harness's failure, counted, never skipped.
        cases.extend(dropped.into_iter().map(|(group, what, why)| {
            let mut out = Outcome::new(Choice::Auto);
            out.failed = Some(format!("harness error: {why}"));
            Case {
                group,
                what,
                out,
                harness_error: true,
                setup: None,
                adversarial: false,
            }
        }));
        cases
    }
}

/// Every choice of `setup`, judged as the sweep judges it: against the engine alone on the same
/// setup, each a [`Case`] of `group` and `what`; a choice the harness could not run is a case
/// that says so (`harness_error`), never skipped.
pub fn judge(group: &str, what: &str, setup: &Setup, choices: &[Choice]) -> Vec<Case> {
    let alone = engine_alone(setup).ok();
    let adversarial = crate::run::open(setup).is_ok_and(|g| g.physics().adversarial);
    let shared = Arc::new(setup.clone());
    choices
        .iter()
        .map(|choice| {
            let (out, harness_error) = match run_judged(setup, *choice, None, alone.clone()) {
                Ok(o) => (o, false),
                Err(e) => {
                    let mut o = Outcome::new(*choice);
                    o.failed = Some(format!("harness error: {e}"));
                    (o, true)
                }
            };
            Case {
                group: group.to_string(),
                what: what.to_string(),
                out,
                harness_error,
                setup: Some(shared.clone()),
                adversarial,
            }
        })
        .collect()
}

/// [`judge`] every job on `threads` threads; the cases in job order.
pub fn run_jobs(jobs: &[Job], threads: usize) -> Vec<Case> {
    let n = jobs.len();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Vec<Case>>> =
        (0..n).map(|_| std::sync::Mutex::new(Vec::new())).collect();
    std::thread::scope(|sc| {
        for _ in 0..threads.max(1) {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (group, what, setup, choices) = &jobs[i];
                *slots[i].lock().unwrap_or_else(|e| e.into_inner()) =
                    judge(group, what, setup, choices);
            });
        }
    });
    slots
        .into_iter()
        .flat_map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}
