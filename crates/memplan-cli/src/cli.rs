//! The command line as clap parses it: [`Cli`] and one [`Command`] per subcommand.

use clap::{Parser, Subcommand};

use crate::cmd;

/// Plan the KV cache of an LLM inference engine on any vendor's GPU.
#[derive(Parser, Debug)]
#[command(
    name = "memplan",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Exit codes: 0 success, 1 failure (does not fit, bad file, device), 2 usage error.\n\
                  Logging: --log LEVEL, else MEMPLAN_LOG, else RUST_LOG (default warn), on stderr."
)]
pub struct Cli {
    /// Log verbosity (error, warn, info, debug, trace, or a filter such as memplan=debug);
    /// else MEMPLAN_LOG, else RUST_LOG.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log: Option<String>,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List every compiled-in backend and its devices.
    #[command(after_help = "Examples:\n  memplan devices\n  memplan devices --json")]
    Devices(cmd::devices::Args),
    /// Read every memory layer of a device and show its declared (or calibrated) capabilities.
    #[command(after_help = "Examples:\n  memplan probe sim:rtx4090\n  \
                            memplan probe sim:arc-a770,declare-exact --calibrate\n  \
                            memplan probe cuda:0 --json")]
    Probe(cmd::probe::Args),
    /// Plan the KV cache of a model on a device (a dry run before launching the engine).
    #[command(after_help = cmd::plan::EXAMPLES)]
    Plan(cmd::plan::Args),
    /// Run a whole engine start-up on a simulated device and check each graph strategy.
    #[command(
        after_help = "Exit codes: 0 when at least one run started (each run's outcome, \
                            an out-of-memory or a plan over the request included, is in the \
                            report); 1 when the scenario's engine did not start in any run (the \
                            model does not fit the device, the start-up check refused it, the \
                            device misreported its memory: nothing was simulated; with --json a \
                            memplan.error/1 of kind did_not_start holding the report in \
                            help.simulation) or the scenario file is invalid; 2 for a usage \
                            error.\n\n\
                            Examples:\n  memplan simulate --list\n  \
                            memplan simulate --scenario fp8-24g\n  \
                            memplan simulate --scenario shared-pool --strategy all --json\n  \
                            memplan simulate --scenario my-scenario.toml   # docs/scenarios.md"
    )]
    Simulate(cmd::simulate::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  memplan completions bash > /etc/bash_completion.d/memplan\n  \
                            memplan completions zsh > ~/.zfunc/_memplan\n  \
                            memplan completions fish > ~/.config/fish/completions/memplan.fish"
    )]
    Completions(cmd::completions::Args),
}

impl Command {
    /// Whether the output is JSON (`--json`).
    pub fn json(&self) -> bool {
        match self {
            Command::Devices(a) => a.json,
            Command::Probe(a) => a.json,
            Command::Plan(a) => a.json(),
            Command::Simulate(a) => a.json,
            Command::Completions(_) => false,
        }
    }
}

/// Whether raw arguments ask for JSON (before clap has parsed them, so that a parse error is
/// printed as JSON too): `--json` anywhere before a `--`.
pub fn wants_json<I, T>(args: I) -> bool
where
    I: IntoIterator<Item = T>,
    T: AsRef<std::ffi::OsStr>,
{
    args.into_iter()
        .map(|a| a.as_ref().to_owned())
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}
