//! `memplan`: how much memory can the KV cache take on this GPU, and how sure is that?
//!
//! The whole binary is [`memplan_cli::main_with`] on this process's arguments (the Python
//! package's `memplan` script runs the same function).

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(memplan_cli::main_with(std::env::args_os()))
}
