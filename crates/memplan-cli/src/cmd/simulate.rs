//! `memplan simulate`: run a whole engine start-up on a simulated device, then what a real
//! engine does next (allocate the KV cache the plan allowed, capture every graph, serve a
//! burst), and compare each graph strategy with the ground truth.

use memplan_testbed::{simulate_seeded, Outcome, Scenario, StrategyArg, DEFAULT_SEED, SHIPPED};
use serde_json::json;

use crate::contract::{schema, Failure};

/// `--seed`: any 64-bit unsigned number; a whole number outside that range is refused with
/// the range (clap's own parser said "invalid digit found in string" for -1 and "number too
/// large to fit in target type" without the limit).
fn seed(s: &str) -> Result<u64, String> {
    s.trim().parse::<u64>().map_err(|_| {
        let t = s.trim();
        let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
        if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) {
            format!("{t} is outside 0..={}", u64::MAX)
        } else {
            format!("{s:?} is not a whole number")
        }
    })
}
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
    #[arg(long, allow_negative_numbers = true, default_value_t = DEFAULT_SEED, value_parser = seed)]
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

/// Whether a run never started: it ended before a plan was made, and not by running out of
/// memory in a step its strategy took (which is the strategy's result), but because the
/// scenario's engine could not start at all (its model does not fit the device, the start-up
/// check refused the device, the device misreported its memory).
fn did_not_start(o: &Outcome) -> bool {
    o.plan.is_none() && o.oom.is_none() && o.failed.is_some()
}

/// The command's failure when no run of the scenario started ([`did_not_start`]): nothing
/// was simulated, so there is no result to report (exit 1, kind `did_not_start`). A run that
/// started is a result whatever its outcome (a strategy that runs out of memory, goes over
/// the request or misjudges the graphs under `--strategy all`), and so is the report with at
/// least one of them.
fn nothing_started(scenario: &str, runs: &[Outcome]) -> Option<Failure> {
    if runs.is_empty() || !runs.iter().all(did_not_start) {
        return None;
    }
    let mut why: Vec<&str> = Vec::new();
    for w in runs.iter().filter_map(|o| o.failed.as_deref()) {
        if !why.contains(&w) {
            why.push(w);
        }
    }
    let why = match why.as_slice() {
        [one] => (*one).to_string(),
        many => format!("{} (and {} other reasons)", many[0], many.len() - 1),
    };
    Some(Failure::of(
        "did_not_start",
        format!(
            "scenario {scenario}: the engine did not start, so nothing was simulated: {why}; change the scenario's device, model or request so that the engine can start"
        ),
    ))
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
    let json = serde_json::to_value(&report).map_err(|e| Failure::of("internal", e.to_string()))?;
    if let Some(f) = nothing_started(&scenario, &report.runs) {
        return Err(f.with_help("simulation", json));
    }
    let mut text = report.to_string();
    if let Some(auto) = report.runs.iter().find(|r| r.auto) {
        if let Some(p) = &auto.plan {
            text.push_str(&format!(
                "\nplan of the automatic choice:\n{}\n",
                memplan_planner::plan::render::text(p, &crate::flags::flag_name)
            ));
        }
    }
    Ok(Report::new(schema::SIMULATE, json, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_outside_64_bits_is_refused_with_the_range() {
        assert_eq!(seed("7").unwrap(), 7);
        assert_eq!(seed("18446744073709551615").unwrap(), u64::MAX);
        for n in ["-1", "18446744073709551616", "99999999999999999999999"] {
            let e = seed(n).unwrap_err();
            assert!(
                e.contains(&format!("{n} is outside 0..=18446744073709551615")),
                "{n}: {e}"
            );
        }
        assert!(seed("x").unwrap_err().contains("not a whole number"));
    }
}
