//! `memplan`: how much memory can the KV cache take on this GPU, and how sure is that?
//!
//! Parse, set up logging, run ([`memplan_cli::execute`]), print, exit with the contract's
//! code (0 success, 1 failure, 2 usage). Nothing here panics on a closed or full stdout.

use std::process::ExitCode;

use clap::Parser;
use memplan_cli::output::{eprint_line, json_text, write_stdout, Written};
use memplan_cli::{cli, execute, parse_failure, Cli, Failure};

fn main() -> ExitCode {
    let json = cli::wants_json(std::env::args_os().skip(1));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return parse_error(&e, json),
    };
    memplan_cli::output::init_logging(cli.log.as_deref());
    let json = cli.command.json();
    match execute(cli.command) {
        Ok(report) => {
            let text = if json {
                json_text(&report.json)
            } else {
                report.text
            };
            match write_stdout(&text) {
                Ok(_) => ExitCode::SUCCESS,
                Err(f) => fail(&f, false),
            }
        }
        Err(f) => fail(&f, json),
    }
}

/// Report a failure (one line on stderr; the JSON envelope on stdout with `--json`) and
/// return its exit code.
fn fail(f: &Failure, json: bool) -> ExitCode {
    eprint_line(&format!("memplan: error: {}", f.message));
    if json && write_stdout(&json_text(&f.json())) == Ok(Written::Closed) {
        // The reader is gone; the exit code still tells.
    }
    ExitCode::from(f.class.code())
}

fn parse_error(e: &clap::Error, json: bool) -> ExitCode {
    match parse_failure(e) {
        // --help, --version: clap's text on stdout, exit 0.
        None => match write_stdout(&e.render().to_string()) {
            Ok(_) => ExitCode::SUCCESS,
            Err(f) => fail(&f, false),
        },
        Some(f) if json => fail(&f, true),
        Some(f) => {
            // clap's own rendering (usage and hints) for people.
            let text = e.render().to_string();
            for line in text.trim_end().lines() {
                eprint_line(line);
            }
            ExitCode::from(f.class.code())
        }
    }
}
