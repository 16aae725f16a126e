//! `memplan simulate` (being built).

use std::process::ExitCode;

/// Flags of `memplan simulate`.
#[derive(clap::Args)]
pub struct Args {}

/// Run `memplan simulate`.
pub fn run(_args: Args) -> Result<ExitCode, memplan::Error> {
    Err(memplan::Error::unsupported("memplan simulate", "not built yet"))
}
