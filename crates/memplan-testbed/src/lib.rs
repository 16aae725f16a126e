//! # memplan-testbed
//!
//! The `memplan simulate` harness: a whole engine start-up on a simulated device, then what a
//! real engine does next, compared with the simulator's ground truth for each strategy.
//!
//! This crate is the test-bed, kept apart from what engines ship: `memplan-planner` and
//! `memplan-model` never depend on the simulated backend (a `cargo xtask ci` dependency rule
//! enforces it). The planner is exercised here only through its public API.
//!
//! - [`scenario`]: the TOML scenario format and the shipped scenarios (embedded by name);
//! - [`setup`]: a scenario resolved into quantities;
//! - [`engine`]: [`SimEngine`], a small engine over the simulated caching allocator;
//! - [`kv`]: the engine's own KV-cache arithmetic (pages, one tensor per layer), from its
//!   rules and shared with nothing in the planner;
//! - [`run`](mod@run): one run per strategy;
//! - [`oracle`]: the largest KV cache that would have fit, from ground truth only, by code the
//!   planner does not share;
//! - [`sweep`]: the seeded sweep over profiles, scenarios and random scenarios, and its checks;
//! - [`report`]: the per-strategy comparison ([`SimReport`], `Display` + `Serialize`).

pub mod engine;
pub mod kv;
pub mod oracle;
pub mod report;
pub mod run;
pub mod scenario;
pub mod setup;
pub mod sweep;

pub use engine::SimEngine;
pub use memplan_backend_sim::DEFAULT_SEED;
pub use report::{Outcome, SimReport};
pub use run::{run_all, Choice};
pub use scenario::{Scenario, SHIPPED};
pub use setup::Setup;

use memplan_core::{Error, Result};

use memplan_planner::strategy::StrategyKind;

/// What `--strategy` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyArg {
    /// The automatic choice.
    Auto,
    /// Every strategy, the automatic choice first.
    All,
    /// One strategy.
    One(StrategyKind),
}

impl std::str::FromStr for StrategyArg {
    type Err = memplan_core::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(StrategyArg::Auto),
            "all" => Ok(StrategyArg::All),
            other => other.parse().map(StrategyArg::One),
        }
    }
}

/// Simulate a scenario (shipped name or file path) with the strategies asked for, on a device
/// with the default seed.
pub fn simulate(scenario: &str, strategy: StrategyArg) -> Result<SimReport> {
    simulate_seeded(scenario, strategy, memplan_backend_sim::DEFAULT_SEED)
}

/// As [`simulate`], with the device's physics drawn from `seed`.
pub fn simulate_seeded(scenario: &str, strategy: StrategyArg, seed: u64) -> Result<SimReport> {
    let mut setup = Scenario::load(scenario)?
        .resolve()
        .map_err(|e| in_file(scenario, e))?;
    setup.seed = seed;
    simulate_setup(&setup, strategy)
}

/// As [`simulate`], for a resolved setup.
pub fn simulate_setup(setup: &Setup, strategy: StrategyArg) -> Result<SimReport> {
    let setup = setup.clone();
    let calibration = if setup.scenario.calibrate {
        Some(run::calibration(&setup)?)
    } else {
        None
    };
    let runs = match strategy {
        StrategyArg::Auto => vec![run::run(&setup, Choice::Auto)?],
        StrategyArg::All => run_all(&setup)?,
        StrategyArg::One(k) => vec![run::run(&setup, Choice::Forced(k))?],
    };
    Ok(SimReport {
        scenario: setup.scenario.name.clone(),
        description: setup.scenario.description.clone(),
        device: setup.scenario.device.clone(),
        seed: setup.seed,
        calibration,
        runs,
    })
}

/// A scenario's invalid values are the file's fault, not the caller's: report them as
/// [`Error::InvalidFile`] naming the scenario and the key.
fn in_file(scenario: &str, e: Error) -> Error {
    match e {
        Error::InvalidInput { field, message } => {
            let key = field
                .split_once(": ")
                .map_or(field.as_str(), |(_, k)| k)
                .to_string();
            Error::file_key(scenario, key, message)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
