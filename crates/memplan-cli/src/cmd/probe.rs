//! `memplan probe` (being built).

use std::process::ExitCode;

/// Flags of `memplan probe`.
#[derive(clap::Args)]
pub struct Args {}

/// Run `memplan probe`.
pub fn run(_args: Args) -> Result<ExitCode, memplan::Error> {
    Err(memplan::Error::unsupported("memplan probe", "not built yet"))
}
