//! The output contract: exit codes, the JSON error envelope and the schema names.
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | success (also when stdout was closed early by the reader: `memplan ... \| head -1`) |
//! | 1 | a failure: the plan does not fit, a file is unreadable or invalid (kind, size, content), a device or backend failed or is unavailable, stdout could not be written (full disk) |
//! | 2 | a usage error, wherever it is found: an unknown flag, a flag value out of range or of the wrong form, flags that contradict each other, a name that is neither a file nor a known preset, scenario or device |
//!
//! Under `--json` a failure prints one object on stdout, `{"schema": "memplan.error/1",
//! "error": {"kind", "message", "exit_code", "help"}}`, where `help` holds what still helps
//! (the longest max model length that fits, the utilisation that would fit, the presets).

use serde_json::{json, Map, Value};

/// The JSON schemas of every output, `memplan.<kind>/<version>`; a version changes when a
/// key is removed or changes meaning (new keys do not change it). Documented in
/// `docs/json-output.md`, with one JSON Schema file per kind in `docs/schemas/`.
pub mod schema {
    /// `memplan plan --json`.
    pub const PLAN: &str = "memplan.plan/1";
    /// `memplan devices --json`.
    pub const DEVICES: &str = "memplan.devices/1";
    /// `memplan probe --json`.
    pub const PROBE: &str = "memplan.probe/1";
    /// `memplan simulate --json`.
    pub const SIMULATE: &str = "memplan.simulate/1";
    /// `memplan simulate --list --json`.
    pub const SCENARIOS: &str = "memplan.scenarios/1";
    /// Any failure under `--json`.
    pub const ERROR: &str = "memplan.error/1";
    /// `--help` or `--version` under `--json`: the text people read, as one JSON string.
    pub const HELP: &str = "memplan.help/1";
}

/// How a run ended, as an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitClass {
    /// 0.
    Success,
    /// 1: the work could not be done.
    Failure,
    /// 2: the command line is wrong.
    Usage,
}

impl ExitClass {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            ExitClass::Success => 0,
            ExitClass::Failure => 1,
            ExitClass::Usage => 2,
        }
    }
}

/// A failed run: what to print and how to exit.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Exit class.
    pub class: ExitClass,
    /// A stable name for the kind of failure (`usage`, `invalid_file`, `does_not_fit`, ...).
    pub kind: &'static str,
    /// One line for people.
    pub message: String,
    /// What still helps, as JSON (`max_model_len_fit`, `presets`, ...); empty when nothing.
    pub help: Map<String, Value>,
}

impl Failure {
    /// A usage error (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            class: ExitClass::Usage,
            kind: "usage",
            message: message.into(),
            help: Map::new(),
        }
    }

    /// A failure (exit 1) of the given kind.
    pub fn of(kind: &'static str, message: impl Into<String>) -> Self {
        Failure {
            class: ExitClass::Failure,
            kind,
            message: message.into(),
            help: Map::new(),
        }
    }

    /// Add a help value.
    pub fn with_help(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.help.insert(key.to_string(), value.into());
        self
    }

    /// The same failure worded with the flags as the command line `args` typed them (an
    /// alias such as `--pp` where clap or the library named `--pipeline-parallel-size`).
    /// Every word longer than `memplan::error::MAX_QUOTED_WORD` is shortened to its ends (a
    /// value quoted from a file can be as long as the file).
    pub fn as_passed<T: AsRef<std::ffi::OsStr>>(mut self, args: &[T]) -> Self {
        self.message = memplan::error::bounded(crate::flags::as_passed(&self.message, args));
        if let Some(Value::String(u)) = self.help.get_mut("usage") {
            *u = crate::flags::as_passed(u, args);
        }
        self
    }

    /// The `--json` envelope.
    pub fn json(&self) -> Value {
        json!({
            "schema": schema::ERROR,
            "error": {
                "kind": self.kind,
                "message": self.message,
                "exit_code": self.class.code(),
                "help": self.help,
            }
        })
    }
}

impl From<memplan::Error> for Failure {
    fn from(e: memplan::Error) -> Self {
        classify(&e)
    }
}

/// Sort a library error into the contract, worded with this command line's flags
/// ([`crate::flags::describe`]). Errors about a setting, an unknown device or backend are
/// usage errors; a bad file, a device failure, a plan that does not fit are failures.
pub fn classify(e: &memplan::Error) -> Failure {
    use memplan::{Error as E, ErrorClass as C};
    let message = crate::flags::describe(e);
    match e.root() {
        // The library calls a bad file's content bad input; for the command line it is the
        // file's fault, not the command line's.
        E::InvalidFile { .. } => return Failure::of("invalid_file", message),
        E::UnknownBackend { .. } | E::UnknownDevice { .. } => {
            return Failure {
                kind: "unknown_device",
                ..Failure::usage(message)
            }
        }
        _ => {}
    }
    match e.class() {
        C::Usage => Failure::usage(message),
        C::DoesNotFit => does_not_fit(e, message),
        C::Io => Failure::of("io", message),
        C::Unavailable => Failure::of("unavailable", message),
        C::Device => Failure::of("device", message),
        C::OutOfMemory => {
            // The step it happened in and the bytes asked for, for scripts.
            let mut f = Failure::of("out_of_memory", message);
            if let Some(step) = e.step() {
                f = f.with_help("step", step);
            }
            if let Some(b) = e.requested_bytes() {
                f = f.with_help("requested_bytes", b);
            }
            f
        }
        C::Measurement => Failure::of("measurement", message),
        C::Bug => Failure::of("internal", message),
        #[allow(unreachable_patterns)]
        _ => Failure::of("error", message),
    }
}

/// A plan that does not fit, with what still helps from the library's [`memplan::Refusal`].
fn does_not_fit(e: &memplan::Error, message: String) -> Failure {
    use memplan::Refusal as R;
    let f = Failure::of("does_not_fit", message);
    match e.refusal() {
        Some(R::RequestDoesNotFit {
            max_model_len_fit: Some(n),
            ..
        }) => f.with_help("max_model_len_fit", *n),
        // The rest of the device is held outside the engine: no utilisation helps.
        Some(R::NoRoomForKv {
            used,
            free_at_start: Some(free),
            ..
        }) if used >= free => f.with_help("free_at_start_bytes", *free),
        Some(R::NoRoomForKv {
            utilization_that_fits: Some(u),
            ..
        }) => f.with_help("gpu_memory_utilization_that_fits", *u),
        Some(r) => f.with_help("refusal", serde_json::to_value(r).unwrap_or_default()),
        None => f,
    }
}
