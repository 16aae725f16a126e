//! Logging set-up and writing to stdout/stderr without panicking.
//!
//! `println!` panics when stdout is closed or full (`memplan devices > /dev/full`,
//! `memplan simulate ... | true`). Everything here returns or ignores the error instead: a
//! closed pipe (the reader has what it wanted) ends quietly with the run's own exit code, any
//! other write error (a full disk) is a failure with exit 1.

use std::io::{IsTerminal, Write};

use tracing_subscriber::EnvFilter;

use crate::contract::Failure;

/// Log to stderr. The filter is `--log`, else `MEMPLAN_LOG`, else `RUST_LOG`, else `warn`; an
/// unparsable filter falls back to `warn` with a note. Colour only when stderr is a terminal
/// and `NO_COLOR` is unset.
pub fn init_logging(level: Option<&str>) {
    let spec = level
        .map(str::to_string)
        .or_else(|| std::env::var("MEMPLAN_LOG").ok())
        .or_else(|| std::env::var("RUST_LOG").ok())
        .filter(|s| !s.trim().is_empty());
    let filter = match spec.as_deref().map(EnvFilter::try_new) {
        None => EnvFilter::new("warn"),
        Some(Ok(f)) => f,
        Some(Err(e)) => {
            eprint_line(&format!(
                "memplan: warning: log filter {:?} is not valid ({e}); using warn",
                spec.unwrap_or_default()
            ));
            EnvFilter::new("warn")
        }
    };
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// How a write to stdout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Everything was written and flushed.
    All,
    /// The reader closed the pipe: stop quietly.
    Closed,
}

/// Write `text` to stdout and flush. A closed pipe is [`Written::Closed`]; any other error
/// (a full disk) is a failure naming stdout.
pub fn write_stdout(text: &str) -> Result<Written, Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(Written::All),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Written::Closed),
        Err(e) => Err(Failure::of(
            "write",
            format!("could not write to standard output: {e}"),
        )),
    }
}

/// Write one line to stderr, ignoring errors (there is nowhere left to report them). The
/// line is made [`for_terminal`]: it may quote a file's content or name.
pub fn eprint_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{}", for_terminal(line));
}

/// Whether `c` would act on a terminal rather than show: a C0 control other than newline
/// and tab (ESC starts colour, cursor and title sequences; a carriage return overwrites the
/// line), DEL, a C1 control (U+009B is a one-byte CSI), or a bidirectional formatting
/// character (U+202E turns the rest of the line around; Unicode's UAX #9 lists them).
fn acts_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Human text with every character that would act on a terminal (a control other than
/// newline and tab, a bidirectional formatting character) written as its escape
/// (`\u{1b}`): a config's architecture name, a log's model name, a scenario's description
/// or a file name is shown, never run as a terminal sequence. JSON needs none of this
/// (serde_json escapes controls, and a JSON reader is not a terminal).
pub fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(acts_on_terminal) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if acts_on_terminal(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// Pretty JSON with a trailing newline.
pub fn json_text(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|_| "null".into());
    s.push('\n');
    s
}
