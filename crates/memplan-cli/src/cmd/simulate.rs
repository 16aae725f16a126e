//! `memplan simulate`: run a whole engine start-up on a simulated device, then what a real
//! engine does next (allocate the KV cache the plan allowed, capture every graph, serve a
//! burst), and compare each graph strategy with the ground truth.

use std::process::ExitCode;

use memplan_testbed::{simulate_seeded, StrategyArg, DEFAULT_SEED, SHIPPED};

use crate::output::print_json;

/// Flags of `memplan simulate`.
#[derive(clap::Args)]
pub struct Args {
    /// A shipped scenario name or a scenario file (TOML, see docs/scenarios.md).
    #[arg(long, value_name = "NAME|FILE")]
    scenario: Option<String>,
    /// auto, all, post-capture, full, sampled, conservative, none or vllm-legacy.
    #[arg(long, default_value = "auto")]
    strategy: String,
    /// Seed of the simulated device's physics (hidden quantities drawn from documented
    /// ranges, docs/simulator-physics.md); the default keeps output reproducible.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// List the shipped scenarios.
    #[arg(long)]
    list: bool,
}

/// Run `memplan simulate`.
pub fn run(args: Args) -> Result<ExitCode, memplan::Error> {
    if args.list {
        for (name, _) in SHIPPED {
            println!("{name}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(scenario) = args.scenario else {
        let names: Vec<_> = SHIPPED.iter().map(|(n, _)| *n).collect();
        return Err(memplan::Error::invalid(
            "--scenario",
            format!("required: a file or one of {}", names.join(", ")),
        ));
    };
    let strategy: StrategyArg = args.strategy.parse()?;
    let report = simulate_seeded(&scenario, strategy, args.seed)?;
    if args.json {
        print_json(&report)?;
    } else {
        print!("{report}");
        if let Some(auto) = report.runs.iter().find(|r| r.auto) {
            if let Some(p) = &auto.plan {
                println!(
                    "\nplan of the automatic choice:\n{}",
                    memplan_planner::plan::render::text(p, &crate::flags::flag_name)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
