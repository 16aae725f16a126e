//! `memplan simulate`: run a whole engine start-up on a simulated device, then what a real
//! engine does next (allocate the KV cache the plan allowed, capture every graph, serve a
//! burst), and compare each graph strategy with the ground truth.

use memplan_testbed::{simulate_seeded, Scenario, StrategyArg, DEFAULT_SEED, SHIPPED};
use serde_json::json;

use crate::contract::{schema, Failure};
use crate::Report;

fn strategy(s: &str) -> Result<StrategyArg, String> {
    s.to_ascii_lowercase()
        .parse()
        .map_err(|e: memplan::Error| format!("{e} (or auto, all)"))
}

/// Flags of `memplan simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A shipped scenario name (`--list`) or a scenario file (TOML, see docs/scenarios.md).
    #[arg(long, value_name = "NAME|FILE", required_unless_present = "list")]
    pub scenario: Option<String>,
    /// auto, all, post-capture, full, sampled, conservative, none or vllm-legacy.
    #[arg(long, default_value = "auto", value_parser = strategy)]
    pub strategy: StrategyArg,
    /// Seed of the simulated device's physics (hidden quantities drawn from documented
    /// ranges, docs/simulator-physics.md); the default keeps output reproducible.
    #[arg(long, allow_negative_numbers = true, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Print JSON (`memplan.simulate/1`; with --list `memplan.scenarios/1`) instead of the
    /// table.
    #[arg(long)]
    pub json: bool,
    /// List the shipped scenarios with what each reproduces.
    #[arg(long, conflicts_with = "scenario")]
    pub list: bool,
}

/// The shipped scenarios, `(name, description)`.
pub fn shipped() -> Vec<(&'static str, String)> {
    SHIPPED
        .iter()
        .map(|(n, toml)| {
            let d = Scenario::from_toml(n, toml)
                .map(|s| s.description)
                .unwrap_or_default();
            (*n, d.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

fn list() -> Report {
    let all = shipped();
    let w = all.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let text: String = all.iter().map(|(n, d)| format!("{n:<w$}  {d}\n")).collect();
    let json = json!({"scenarios": all.iter().map(|(n, d)| json!({"name": n, "description": d})).collect::<Vec<_>>()});
    Report::new(schema::SCENARIOS, json, text)
}

/// Run `memplan simulate`.
pub fn run(args: Args) -> Result<Report, Failure> {
    if args.list {
        return Ok(list());
    }
    let Some(scenario) = args.scenario else {
        let names: Vec<_> = SHIPPED.iter().map(|(n, _)| *n).collect();
        return Err(Failure::usage(format!(
            "--scenario is required: a file or one of {}",
            names.join(", ")
        )));
    };
    // A name that is neither shipped nor a file is `Param::Scenario` (a usage error, worded
    // with the flag); everything read from the file is the file's.
    let report = simulate_seeded(&scenario, args.strategy, args.seed).map_err(Failure::from)?;
    let mut text = report.to_string();
    if let Some(auto) = report.runs.iter().find(|r| r.auto) {
        if let Some(p) = &auto.plan {
            text.push_str(&format!(
                "\nplan of the automatic choice:\n{}\n",
                memplan_planner::plan::render::text(p, &crate::flags::flag_name)
            ));
        }
    }
    let json = serde_json::to_value(&report).map_err(|e| Failure::of("internal", e.to_string()))?;
    Ok(Report::new(schema::SIMULATE, json, text))
}
