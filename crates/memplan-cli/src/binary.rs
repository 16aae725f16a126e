//! The binary's behaviour as a function: parse, set up logging, run ([`crate::execute`]),
//! print, return the contract's exit code (0 success, 1 failure, 2 usage). Nothing here
//! panics on a closed or full stdout. `src/main.rs` and the Python package's `memplan`
//! script both call [`main_with`].

use std::ffi::OsString;

use clap::Parser;

use crate::output::{eprint_line, json_text, write_stdout, Written};
use crate::{cli, execute, parse_failure, Cli, Failure};

/// Run the command line `args` (the first is the program name) as the `memplan` binary
/// does, printing to stdout and stderr; return the exit code.
pub fn main_with<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let json = cli::wants_json(args.iter().skip(1));
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => return parse_error(&e, json, &args),
    };
    crate::output::init_logging(cli.log.as_deref());
    let json = cli.command.json();
    match execute(cli.command) {
        Ok(report) => {
            let text = if json {
                json_text(&report.json)
            } else {
                crate::output::for_terminal(&report.text).into_owned()
            };
            match write_stdout(&text) {
                Ok(_) => 0,
                Err(f) => fail(&f, false),
            }
        }
        Err(f) => fail(&f.as_passed(&args), json),
    }
}

/// The argument that is not UTF-8, named with its flag: clap says only "invalid UTF-8 was
/// detected in one or more arguments", which names none (a model directory whose name is
/// not UTF-8: `--model` takes text).
fn not_utf8(args: &[OsString]) -> Option<Failure> {
    let at = args.iter().skip(1).position(|a| a.to_str().is_none())? + 1;
    let arg = args[at].to_string_lossy();
    let flag = match arg.split_once('=') {
        Some((flag, _)) if flag.starts_with("--") && flag.is_ascii() => flag.to_string(),
        _ => args[at - 1]
            .to_str()
            .filter(|p| at > 1 && p.starts_with('-'))
            .map_or_else(|| "an argument".to_string(), str::to_string),
    };
    Some(Failure::usage(format!(
        "{flag}: {arg:?} is not UTF-8 text; memplan reads this value as text"
    )))
}

/// Report a failure (one line on stderr; the JSON envelope on stdout with `--json`) and
/// return its exit code.
fn fail(f: &Failure, json: bool) -> u8 {
    eprint_line(&format!("memplan: error: {}", f.message));
    if json && write_stdout(&json_text(&f.json())) == Ok(Written::Closed) {
        // The reader is gone; the exit code still tells.
    }
    f.class.code()
}

fn parse_error(e: &clap::Error, json: bool, args: &[OsString]) -> u8 {
    if e.kind() == clap::error::ErrorKind::InvalidUtf8 {
        if let Some(f) = not_utf8(args) {
            return fail(&f, json);
        }
    }
    match parse_failure(e).map(|f| f.as_passed(args)) {
        // --help, --version: clap's text on stdout, exit 0; under --json the same text in
        // one `memplan.help/1` object.
        None if json => match write_stdout(&json_text(&crate::help_json(e))) {
            Ok(_) => 0,
            Err(f) => fail(&f, false),
        },
        None => match write_stdout(&e.render().to_string()) {
            Ok(_) => 0,
            Err(f) => fail(&f, false),
        },
        Some(f) if json => fail(&f, true),
        Some(f) => {
            // clap's own rendering (usage and hints) for people.
            let text = crate::flags::as_passed(&e.render().to_string(), args);
            for line in text.trim_end().lines() {
                eprint_line(line);
            }
            f.class.code()
        }
    }
}
