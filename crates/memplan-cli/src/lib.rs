//! # memplan-cli
//!
//! The `memplan` command line, as a library and a binary. The binary (`src/main.rs`) is
//! [`main_with`]: it only parses, sets up logging, prints and exits; everything else is here,
//! so other front ends (the Python package) get exactly the CLI's `--json` output from
//! [`run_json`], and its `memplan` script runs [`main_with`] itself.
//!
//! ## The contract ([`contract`])
//!
//! - Exit codes: 0 success, 1 failure (the plan does not fit, a file is bad, a device failed,
//!   stdout could not be written), 2 usage error (a flag, a flag value, a combination of
//!   flags, a name that is neither a file nor a preset), wherever it is detected.
//! - Every JSON output is one object with a top-level `"schema": "memplan.<kind>/<version>"`
//!   ([`contract::schema`]); under `--json` a failure is one `memplan.error/1` object on
//!   stdout (kind, message, exit code, and what still helps).
//! - A command renders into a [`Report`] (JSON and text) and never prints; the caller writes
//!   it ([`output::write_stdout`]: a closed stdout ends quietly, a full disk is exit 1).
//!
//! One file per subcommand under [`cmd`]; [`cli`] holds the clap definitions.

mod binary;
pub mod cli;
pub mod cmd;
pub mod contract;
pub mod flags;
pub mod output;

use clap::Parser;
use serde_json::Value;

pub use binary::main_with;
pub use cli::{Cli, Command};
pub use contract::{ExitClass, Failure};

/// What a successful command produced: its JSON (with its `schema` key) and its text.
#[derive(Debug, Clone)]
pub struct Report {
    /// The `--json` object.
    pub json: Value,
    /// What is printed without `--json`.
    pub text: String,
}

impl Report {
    /// A report whose JSON object gets `"schema": schema`.
    pub fn new(schema: &str, json: Value, text: String) -> Self {
        let json = match json {
            Value::Object(mut m) => {
                m.insert("schema".into(), Value::from(schema));
                Value::Object(m)
            }
            other => serde_json::json!({"schema": schema, "value": other}),
        };
        Report { json, text }
    }
}

/// Run a parsed command. Side effects are limited to files the command names (`--svg`).
pub fn execute(command: Command) -> Result<Report, Failure> {
    match command {
        Command::Devices(a) => cmd::devices::run(a),
        Command::Probe(a) => cmd::probe::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Simulate(a) => cmd::simulate::run(a),
        Command::Completions(a) => cmd::completions::run(a),
    }
}

/// Run a command line (without the program name) and return the exit code and the JSON
/// the CLI prints with `--json`: the command's object, or the `memplan.error/1` envelope.
/// `--help` and `--version` give code 0 and a `memplan.help/1` object ([`help_json`]).
pub fn run_json<I, T>(args: I) -> (u8, Value)
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = std::iter::once(std::ffi::OsString::from("memplan"))
        .chain(args.into_iter().map(Into::into))
        .collect();
    match Cli::try_parse_from(&argv) {
        Ok(cli) => match execute(cli.command) {
            Ok(r) => (0, r.json),
            Err(f) => {
                let f = f.as_passed(&argv);
                (f.class.code(), f.json())
            }
        },
        Err(e) => match parse_failure(&e).map(|f| f.as_passed(&argv)) {
            Some(f) => (f.class.code(), f.json()),
            None => (0, help_json(&e)),
        },
    }
}

/// `--help` or `--version` under `--json`: one `memplan.help/1` object whose `text` is what
/// is printed without `--json` (so a script that always passes `--json` still reads JSON).
pub fn help_json(e: &clap::Error) -> Value {
    let kind = match e.kind() {
        clap::error::ErrorKind::DisplayVersion => "version",
        _ => "help",
    };
    serde_json::json!({
        "schema": contract::schema::HELP,
        "kind": kind,
        "text": e.render().to_string(),
    })
}

/// A clap error as a usage failure; `None` for `--help` and `--version`, which are not
/// errors.
pub fn parse_failure(e: &clap::Error) -> Option<Failure> {
    use clap::error::ErrorKind as K;
    match e.kind() {
        K::DisplayHelp | K::DisplayVersion => None,
        K::DisplayHelpOnMissingArgumentOrSubcommand => Some(
            Failure::usage(
                "a subcommand is required: devices, probe, plan, simulate or completions",
            )
            .with_help("usage", e.render().to_string().trim().to_string()),
        ),
        _ => {
            let text = e.render().to_string();
            // clap's text is the error (one or more lines), then usage and a hint.
            let (head, tail) = match text.find("\nUsage:") {
                Some(i) => text.split_at(i),
                None => (text.as_str(), ""),
            };
            let first = head
                .trim_start_matches("error: ")
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let rest: Vec<&str> = tail
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let f = Failure::usage(first);
            Some(if rest.is_empty() {
                f
            } else {
                f.with_help("usage", rest.join("\n"))
            })
        }
    }
}
