//! memplan errors raised in Python: the CLI's classification and JSON error envelope, turned
//! into the matching `memplan.MemplanError` subclass by `memplan._errors.from_envelope`, so
//! an error from the engine API looks exactly like the same error from `memplan.plan`.

use pyo3::prelude::*;

/// The exit code and envelope the CLI gives `e`.
pub fn envelope(e: &memplan::Error) -> (u8, serde_json::Value) {
    let f = memplan_cli::contract::classify(e);
    (f.class.code(), f.json())
}

/// `e` as a Python exception (a `memplan.MemplanError` subclass).
pub fn to_py(py: Python<'_>, e: &memplan::Error) -> PyErr {
    let (code, json) = envelope(e);
    let made = (|| -> PyResult<PyErr> {
        let env = py
            .import("json")?
            .call_method1("loads", (json.to_string(),))?;
        let exc = py
            .import("memplan._errors")?
            .call_method1("from_envelope", (code, env))?;
        Ok(PyErr::from_value(exc))
    })();
    made.unwrap_or_else(|err| err)
}
