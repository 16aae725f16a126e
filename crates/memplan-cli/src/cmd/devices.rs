//! `memplan devices` (being built).

use std::process::ExitCode;

/// Flags of `memplan devices`.
#[derive(clap::Args)]
pub struct Args {}

/// Run `memplan devices`.
pub fn run(_args: Args) -> Result<ExitCode, memplan::Error> {
    Err(memplan::Error::unsupported("memplan devices", "not built yet"))
}
