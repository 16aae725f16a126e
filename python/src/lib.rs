//! `memplan._native`: the Python package's native module (PyO3, abi3).
//!
//! It runs the `memplan` command line's own code in-process ([`memplan_cli::run_json`],
//! [`memplan_cli::main_with`]), so every Python answer equals the CLI's `--json` by
//! construction. The contract at this boundary: no Rust panic reaches Python. Each call runs
//! under [`std::panic::catch_unwind`]; a caught panic becomes an `internal` error envelope
//! (for `run_json`) or exit code 101 with the message on stderr (for `main`), which the
//! Python layer raises as `memplan.InternalError`. The GIL is released while memplan works.

mod distributed;
mod errors;
mod hooks;
#[cfg(feature = "sim")]
mod sim;
mod startup;

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;

/// The message of a caught panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

/// The `internal` error envelope of a caught panic (the same shape as the CLI's envelopes).
fn panic_envelope(message: &str) -> String {
    serde_json::json!({
        "schema": "memplan.error/1",
        "error": {
            "kind": "internal",
            "message": format!("memplan panicked (a bug; please report it): {message}"),
            "exit_code": 1,
            "help": {},
        },
    })
    .to_string()
}

/// Run `f` without the GIL; a panic becomes `(1, internal error envelope)`.
fn guarded(py: Python<'_>, f: impl FnOnce() -> (u8, String) + Send) -> (u8, String) {
    py.detach(|| {
        catch_unwind(AssertUnwindSafe(f))
            .unwrap_or_else(|p| (1, panic_envelope(&panic_message(&*p))))
    })
}

/// Run `memplan <argv>` (which must ask for `--json`) and return `(exit code, JSON text)`.
#[pyfunction]
fn run_json(py: Python<'_>, argv: Vec<String>) -> (u8, String) {
    guarded(py, || {
        let (code, json) = memplan_cli::run_json(argv);
        (code, json.to_string())
    })
}

/// Panic inside [`guarded`], the wrapper of every call: the test that no panic crosses.
#[pyfunction]
fn _panic_for_test(py: Python<'_>, message: String) -> (u8, String) {
    guarded(py, move || panic!("{message}"))
}

/// Run `memplan <argv>` as the binary does (printing) and return its exit code.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| {
        let args = std::iter::once("memplan".to_string()).chain(argv);
        match catch_unwind(AssertUnwindSafe(|| memplan_cli::main_with(args))) {
            Ok(code) => code,
            Err(p) => {
                eprintln!(
                    "memplan: error: memplan panicked (a bug; please report it): {}",
                    panic_message(&*p)
                );
                101
            }
        }
    })
}

/// The native half of the `memplan` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(run_json, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(startup::start_up, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::combine_plans, m)?)?;
    m.add_class::<startup::PyKvRange>()?;
    #[cfg(feature = "sim")]
    {
        m.add_class::<sim::SimDevice>()?;
        m.add_class::<sim::SimAllocator>()?;
    }
    Ok(())
}
