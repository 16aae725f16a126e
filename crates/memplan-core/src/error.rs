//! The error type shared by every memplan crate.
//!
//! Errors only cover what a user cannot anticipate or must act on: a backend that is not
//! compiled in or cannot load, a driver call that failed (with the call and its code), an
//! operation a device does not support, bad input (naming the field or the [`Param`]), a
//! broken measurement, and a plan that does not fit ([`Refusal`]).
//!
//! Callers branch on variants, never on message text: [`Error::class`] sorts every error into
//! an [`ErrorClass`] (a usage error, something unavailable here, a device call, out of memory,
//! a measurement failure, a plan that does not fit, I/O); [`Error::is_out_of_memory`] and
//! [`Error::refusal`] see through [`Error::During`]. Library errors name concepts ("GPU memory
//! utilisation"), never a command-line flag: a front end maps [`Param`]s to its own flags.

use crate::backend::BackendKind;
pub use crate::refusal::{Param, Refusal};

/// memplan's error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend exists but this binary was built without its cargo feature.
    #[error("backend `{backend}` is not compiled in: rebuild with `--features {feature}`, a feature of the `memplan` crate (`--features memplan/{feature}` from a crate that depends on it) (compiled in: {compiled})")]
    BackendNotCompiled {
        /// The backend asked for.
        backend: BackendKind,
        /// The cargo feature that enables it.
        feature: &'static str,
        /// The backends this binary has.
        compiled: String,
    },
    /// No backend has that name.
    #[error("unknown backend `{name}`: known backends are {known}")]
    UnknownBackend {
        /// What was asked for.
        name: String,
        /// The known names.
        known: String,
    },
    /// A device id that does not parse or names no device.
    #[error("unknown device `{id}`: available devices are {available}")]
    UnknownDevice {
        /// What was asked for.
        id: String,
        /// The devices that exist.
        available: String,
    },
    /// The backend is compiled in but cannot run on this machine.
    #[error("backend `{backend}` is unavailable: {reason}")]
    BackendUnavailable {
        /// The backend.
        backend: BackendKind,
        /// Which library, which call, what it returned.
        reason: String,
    },
    /// A vendor library could not be loaded.
    #[error("could not load {library}: {detail}")]
    LibraryNotFound {
        /// The library file name.
        library: String,
        /// What the loader said.
        detail: String,
    },
    /// A vendor library lacks a symbol memplan needs.
    #[error("{library} has no symbol `{symbol}`: {detail}")]
    MissingSymbol {
        /// Library.
        library: String,
        /// The symbol.
        symbol: String,
        /// What the loader said.
        detail: String,
    },
    /// A driver call failed. Codes above 0xffff (Level Zero's `0x78000001`) are shown in hex,
    /// as the vendor headers spell them.
    #[error("{call} failed: {name} ({})", fmt_code(*code))]
    DriverCall {
        /// The call, e.g. `cuMemGetInfo_v2`.
        call: String,
        /// The numeric return code.
        code: i64,
        /// The code's name, or `unknown code`.
        name: String,
    },
    /// The driver is too old for an operation.
    #[error("driver version {have} is too old for {what} (needs {need})")]
    DriverTooOld {
        /// Version found.
        have: String,
        /// Version needed.
        need: String,
        /// What needs it.
        what: String,
    },
    /// The device ran out of memory.
    #[error("out of memory: {call} could not allocate {requested} bytes")]
    OutOfMemory {
        /// The call.
        call: String,
        /// Bytes asked for.
        requested: u64,
    },
    /// The device or backend does not support an optional operation.
    #[error("{operation} is not supported: {reason}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// Why not.
        reason: String,
    },
    /// Bad input in a file or a structure: a config key, a scenario field, a handle.
    #[error("{field}: {message}")]
    InvalidInput {
        /// The field (a config key, a scenario field, an argument).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A file's kind, size or content is not acceptable: a model config, a checkpoint, an
    /// index, a scenario. `key` names the field inside the file, when one is at fault.
    #[error("{path}: {}{message}", key.as_deref().map(|k| format!("{k}: ")).unwrap_or_default())]
    InvalidFile {
        /// The file, as the user named it (or as found inside a directory they named).
        path: String,
        /// The key inside the file (`quantization_config.bits`), if one is at fault.
        key: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A planning parameter out of range (a front end maps [`Param`] to its flag).
    #[error("{param}: {message}")]
    InvalidParam {
        /// The parameter.
        param: Param,
        /// What is wrong.
        message: String,
    },
    /// An operation called in a state that forbids it (a synchronize during a graph capture, a
    /// record outside one): a bug in the caller, not a device failure.
    #[error("{operation}: {reason}")]
    InvalidState {
        /// The operation.
        operation: String,
        /// Why it cannot run now.
        reason: String,
    },
    /// The measurement protocol was broken or the device misbehaved.
    #[error("measurement error: {0}")]
    Measurement(String),
    /// The plan cannot be satisfied; the [`Refusal`] says why and what still helps.
    #[error("{0}")]
    DoesNotFit(Box<Refusal>),
    /// An error inside a named step (`KV cache allocation`, `graph capture`): the step gives
    /// context, the source keeps its variant ([`Error::is_out_of_memory`] sees through it).
    #[error("{step}: {source}")]
    During {
        /// The step.
        step: String,
        /// What went wrong in it.
        #[source]
        source: Box<Error>,
    },
    /// I/O on a file the user named.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// An `InvalidInput` error.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidInput {
            field: field.into(),
            message: bounded(message.into()),
        }
    }

    /// An `InvalidFile` error about the file as a whole.
    pub fn file(path: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidFile {
            path: path.into(),
            key: None,
            message: bounded(message.into()),
        }
    }

    /// An `InvalidFile` error about one key of the file.
    pub fn file_key(
        path: impl Into<String>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::InvalidFile {
            path: path.into(),
            key: Some(key.into()),
            message: bounded(message.into()),
        }
    }

    /// An `Unsupported` error.
    pub fn unsupported(operation: &'static str, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            operation,
            reason: reason.into(),
        }
    }

    /// An `InvalidParam` error.
    pub fn param(param: Param, message: impl Into<String>) -> Self {
        Error::InvalidParam {
            param,
            message: bounded(message.into()),
        }
    }

    /// An `InvalidState` error.
    pub fn state(operation: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidState {
            operation: operation.into(),
            reason: reason.into(),
        }
    }

    /// A `DoesNotFit` error.
    pub fn does_not_fit(refusal: Refusal) -> Self {
        Error::DoesNotFit(Box::new(refusal))
    }

    /// This error as the cause of a failed step.
    pub fn during(self, step: impl Into<String>) -> Self {
        Error::During {
            step: step.into(),
            source: Box::new(self),
        }
    }

    /// The step an error happened in: the outermost [`Error::During`]'s (`load_weights`).
    pub fn step(&self) -> Option<&str> {
        match self {
            Error::During { step, .. } => Some(step),
            _ => None,
        }
    }

    /// The bytes asked for when the device ran out of memory (through any [`Error::During`]).
    pub fn requested_bytes(&self) -> Option<u64> {
        match self.root() {
            Error::OutOfMemory { requested, .. } => Some(*requested),
            _ => None,
        }
    }

    /// The innermost error, below every [`Error::During`].
    pub fn root(&self) -> &Error {
        match self {
            Error::During { source, .. } => source.root(),
            e => e,
        }
    }

    /// Whether the device ran out of memory (through any [`Error::During`]).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self.root(), Error::OutOfMemory { .. })
    }

    /// The refusal, when the plan does not fit (through any [`Error::During`]).
    pub fn refusal(&self) -> Option<&Refusal> {
        match self.root() {
            Error::DoesNotFit(r) => Some(r),
            _ => None,
        }
    }

    /// What kind of failure this is, for callers that act on it (exit codes, retries).
    pub fn class(&self) -> ErrorClass {
        match self.root() {
            Error::InvalidInput { .. }
            | Error::InvalidFile { .. }
            | Error::InvalidParam { .. }
            | Error::UnknownBackend { .. }
            | Error::UnknownDevice { .. } => ErrorClass::Usage,
            Error::BackendNotCompiled { .. }
            | Error::BackendUnavailable { .. }
            | Error::LibraryNotFound { .. }
            | Error::MissingSymbol { .. }
            | Error::DriverTooOld { .. }
            | Error::Unsupported { .. } => ErrorClass::Unavailable,
            Error::DriverCall { .. } => ErrorClass::Device,
            Error::InvalidState { .. } => ErrorClass::Bug,
            Error::OutOfMemory { .. } => ErrorClass::OutOfMemory,
            Error::Measurement(_) => ErrorClass::Measurement,
            Error::DoesNotFit(_) => ErrorClass::DoesNotFit,
            Error::Io { .. } => ErrorClass::Io,
            Error::During { .. } => unreachable!("root() is never During"),
        }
    }
}

/// What kind of failure an [`Error`] is ([`Error::class`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorClass {
    /// Bad input: a parameter, a file's content, an unknown backend or device.
    Usage,
    /// Something this build or machine cannot do: a backend not compiled in, a library
    /// missing, an optional operation unsupported, a driver too old.
    Unavailable,
    /// A driver call failed.
    Device,
    /// An operation in a state that forbids it (a caller bug).
    Bug,
    /// The device ran out of memory.
    OutOfMemory,
    /// The measurement protocol was broken or the device misbehaved.
    Measurement,
    /// The plan cannot be satisfied.
    DoesNotFit,
    /// I/O on a file the user named.
    Io,
}

fn fmt_code(code: i64) -> String {
    if (0..=0xffff).contains(&code) {
        code.to_string()
    } else {
        format!("{code:#x}")
    }
}

/// memplan's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The longest word (a run without whitespace) an error message quotes whole.
pub const MAX_QUOTED_WORD: usize = 256;

/// An error message with every word longer than [`MAX_QUOTED_WORD`] bytes shortened to its
/// start and end around the count of bytes left out. Messages quote the value at fault as
/// written, and a file holds values as long as its size cap (a 250 MiB number on one line of a
/// log): quoted whole, one error would be that long. Paths and names shorter than the bound
/// stay whole.
pub fn bounded(message: String) -> String {
    let long = |w: &str| w.len() > MAX_QUOTED_WORD;
    if !message.split_whitespace().any(long) {
        return message;
    }
    let mut out = String::with_capacity(4 * MAX_QUOTED_WORD);
    let mut rest = message.as_str();
    while !rest.is_empty() {
        let start = rest
            .find(|c: char| !c.is_whitespace())
            .unwrap_or(rest.len());
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let word = &rest[..end];
        if long(word) {
            let head = floor_char(word, MAX_QUOTED_WORD / 2);
            let tail = ceil_char(word, word.len() - MAX_QUOTED_WORD / 4);
            out.push_str(&word[..head]);
            out.push_str(&format!("[... {} bytes left out ...]", tail - head));
            out.push_str(&word[tail..]);
        } else {
            out.push_str(word);
        }
        rest = &rest[end..];
    }
    out
}

/// The largest character boundary of `s` at or below `i`.
fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest character boundary of `s` at or above `i`.
fn ceil_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_codes_read_as_the_headers_spell_them() {
        let e = |code| {
            Error::DriverCall {
                call: "zeInit".into(),
                code,
                name: "X".into(),
            }
            .to_string()
        };
        assert_eq!(e(101), "zeInit failed: X (101)");
        assert_eq!(e(0x7800_0001), "zeInit failed: X (0x78000001)");
    }

    /// A value as long as a file may hold is quoted by its ends, not whole; short words,
    /// multi-byte characters at the cut and the words around it are kept.
    #[test]
    fn an_error_quotes_a_long_value_by_its_ends() {
        let e = Error::invalid(
            "line 44",
            format!(
                "available KV cache memory {} GiB is more than any device holds",
                "9".repeat(5_000_000)
            ),
        )
        .to_string();
        assert!(e.len() < 1024, "{} bytes", e.len());
        assert!(
            e.starts_with("line 44: available KV cache memory 999"),
            "{e}"
        );
        assert!(
            e.contains("bytes left out") && e.ends_with("999 GiB is more than any device holds"),
            "{e}"
        );
        let e = Error::file_key(
            "config.json",
            "torch_dtype",
            format!("\"{}\" is not a model dtype", "é".repeat(1000)),
        )
        .to_string();
        assert!(
            e.len() < 1024 && e.ends_with("\" is not a model dtype"),
            "{e}"
        );
        let short = format!("{} is fine", "x".repeat(MAX_QUOTED_WORD));
        assert_eq!(bounded(short.clone()), short);
    }
}
