//! Run scenario files over a range of seeds with the automatic choice, judged by the sweep's
//! own acceptance rules, and count the failures per check.
//!
//! ```text
//! cargo run --release -p memplan-testbed --example battery -- FROM TO FILE...
//! ```
//!
//! Each file runs on seeds `FROM..TO` (end exclusive) exactly as the outside scenarios of
//! `tests/outside.rs` do. Every gating failure is printed with its run; the summary counts
//! each check, and the floor and oracle shares. `BATTERY_DETAIL=1` prints one line per run;
//! `BATTERY_ALL=1` prints every failure of the other checks too (below the floor, needless
//! refusals beyond reach), one line each, so a battery's classes can be counted per file;
//! `BATTERY_WARNING=CODE[,CODE...]` counts the runs whose plan carries each warning code (and
//! the files they are in); `BATTERY_THREADS` sets the worker count (default: the machine's
//! cores); `RUST_LOG` the planner's tracing (for example `memplan_planner=debug`).

use std::collections::BTreeMap;

use memplan_testbed::run::Choice;
use memplan_testbed::scenario::Scenario;
use memplan_testbed::sweep::acceptance::{self, Check};
use memplan_testbed::sweep::{run_jobs, seeded, Job};

fn usage() -> ! {
    eprintln!("usage: battery FROM TO FILE...   (seeds FROM..TO, end exclusive)");
    std::process::exit(2)
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        usage();
    }
    let (Ok(from), Ok(to)) = (args[0].parse::<u64>(), args[1].parse::<u64>()) else {
        usage()
    };
    let mut jobs: Vec<Job> = Vec::new();
    for file in &args[2..] {
        let setup = match Scenario::load(file).and_then(Scenario::resolve) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{file}: {e}");
                std::process::exit(1);
            }
        };
        for seed in from..to {
            let what = format!("seed={seed}");
            jobs.push((
                file.clone(),
                what,
                seeded(setup.clone(), seed),
                vec![Choice::Auto],
            ));
        }
    }
    let threads = std::env::var("BATTERY_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cases = run_jobs(&jobs, threads);
    let detail = std::env::var("BATTERY_DETAIL").is_ok_and(|v| v == "1");
    if detail {
        for c in &cases {
            let o = &c.out;
            println!(
                "{} {} auto={} share={} reserve={:?} real={:?} over={:?} before={:?} why: {}{}",
                c.group,
                c.what,
                o.strategy,
                o.kv_vs_oracle
                    .map_or("-".into(), |x| format!("{:.2}%", x * 100.0)),
                o.estimate,
                o.real_graph,
                o.over_request_bytes,
                o.own_over_request_before_plan,
                o.why,
                o.failed
                    .as_deref()
                    .or(o.oom.as_deref())
                    .map_or(String::new(), |f| format!(" | {f}")),
            );
        }
    }
    let failures = acceptance::failures(&cases);
    let mut counts: BTreeMap<Check, usize> = BTreeMap::new();
    for f in &failures {
        *counts.entry(f.check).or_default() += 1;
        if acceptance::GATING.contains(&f.check) {
            println!("GATING {:?}: {}", f.check, f.line);
        }
    }
    let all = std::env::var("BATTERY_ALL").is_ok_and(|v| v == "1");
    for f in failures.iter().filter(|f| {
        f.check == Check::NeedlessRefusalWithinReach
            || f.check == Check::OutOfMemoryOthersAfterPlan
            || (all && !acceptance::GATING.contains(&f.check))
    }) {
        println!("{:?}: {}", f.check, f.line);
    }
    let gating: usize = counts
        .iter()
        .filter(|(c, _)| acceptance::GATING.contains(c))
        .map(|(_, n)| n)
        .sum::<usize>();
    let shares: Vec<f64> = cases.iter().filter_map(|c| c.out.kv_vs_oracle).collect();
    let mean = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
    let min = shares.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "runs {} gating {} mean share {:.2}% min share {:.2}%",
        cases.len(),
        gating,
        mean * 100.0,
        if shares.is_empty() { 0.0 } else { min * 100.0 }
    );
    for (check, n) in &counts {
        println!("  {}: {n}", check.name());
    }
    let codes = std::env::var("BATTERY_WARNING").unwrap_or_default();
    for code in codes.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let warned: Vec<_> = cases
            .iter()
            .filter(|c| {
                c.out
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.warnings.iter().any(|w| w.code() == code))
            })
            .collect();
        let files: std::collections::BTreeSet<&str> =
            warned.iter().map(|c| c.group.as_str()).collect();
        println!(
            "plans warning {code}: {} of {} runs, in {} files",
            warned.len(),
            cases.len(),
            files.len()
        );
    }
}
