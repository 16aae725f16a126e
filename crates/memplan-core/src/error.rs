//! The error type shared by every memplan crate.
//!
//! Errors only cover what a user cannot anticipate or must act on: a backend that is not
//! compiled in or cannot load, a driver call that failed (with the call and its code), an
//! operation a device does not support, bad input (naming the field), and a broken measurement.

use crate::device::BackendKind;

/// memplan's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend exists but this binary was built without its cargo feature.
    #[error("backend `{backend}` is not compiled in: rebuild with `--features {feature}` (compiled in: {compiled})")]
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
    /// Bad input: a flag, a config field, a scenario file.
    #[error("{field}: {message}")]
    InvalidInput {
        /// The field or flag.
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
    /// The measurement protocol was broken or the device misbehaved.
    #[error("measurement error: {0}")]
    Measurement(String),
    /// The plan cannot be satisfied (e.g. free memory < requested).
    #[error("{0}")]
    DoesNotFit(String),
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
            message: message.into(),
        }
    }

    /// An `InvalidFile` error about the file as a whole.
    pub fn file(path: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidFile {
            path: path.into(),
            key: None,
            message: message.into(),
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
            message: message.into(),
        }
    }

    /// An `Unsupported` error.
    pub fn unsupported(operation: &'static str, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            operation,
            reason: reason.into(),
        }
    }
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
}
