//! `memplan plan` (being built).

use std::process::ExitCode;

/// Flags of `memplan plan`.
#[derive(clap::Args)]
pub struct Args {}

/// Run `memplan plan`.
pub fn run(_args: Args) -> Result<ExitCode, memplan::Error> {
    Err(memplan::Error::unsupported("memplan plan", "not built yet"))
}
