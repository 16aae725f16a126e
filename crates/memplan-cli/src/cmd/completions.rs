//! `memplan completions SHELL`: a completion script for the shell, generated from the clap
//! definitions (so it never falls behind the flags).

use clap::CommandFactory;
use clap_complete::Shell;

use crate::contract::Failure;
use crate::Report;

/// Flags of `memplan completions`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

/// Run `memplan completions`.
pub fn run(args: Args) -> Result<Report, Failure> {
    let mut cmd = crate::Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "memplan", &mut buf);
    let text = String::from_utf8(buf).map_err(|e| Failure::of("internal", e.to_string()))?;
    Ok(Report {
        json: serde_json::Value::Null,
        text,
    })
}
