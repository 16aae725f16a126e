//! `memplan`: how much memory can the KV cache take on this GPU, and how sure is that?
//!
//! One file per subcommand under `cmd/`; this file only wires them together.

mod cmd;
mod flags;
mod output;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Plan the KV cache of an LLM inference engine on any vendor's GPU.
#[derive(Parser)]
#[command(name = "memplan", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Log verbosity (error, warn, info, debug, trace); also read from MEMPLAN_LOG.
    #[arg(long, global = true, value_name = "LEVEL")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every compiled-in backend and its devices.
    Devices(cmd::devices::Args),
    /// Read every memory layer of a device and show its declared (or calibrated) capabilities.
    Probe(cmd::probe::Args),
    /// Plan the KV cache of a model on a device (a dry run before launching the engine).
    Plan(cmd::plan::Args),
    /// Run a whole engine start-up on a simulated device and check each graph strategy.
    Simulate(cmd::simulate::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    output::init_logging(cli.log.as_deref());
    let result = match cli.command {
        Command::Devices(a) => cmd::devices::run(a),
        Command::Probe(a) => cmd::probe::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Simulate(a) => cmd::simulate::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("memplan: error: {}", flags::describe(&e));
            ExitCode::FAILURE
        }
    }
}
