//! memplan errors raised in Python: the CLI's classification and JSON error envelope, turned
//! into the matching `memplan.MemplanError` subclass by `memplan._errors.from_envelope`, so
//! an error from the engine API looks exactly like the same error from `memplan.plan`.

use pyo3::prelude::*;

/// The exit code and envelope the CLI gives `e`.
pub fn envelope(e: &memplan::Error) -> (u8, serde_json::Value) {
    let f = memplan_cli::contract::classify(e);
    (f.class.code(), f.json())
}

/// `e` as a Python exception (a `memplan.MemplanError` subclass). An operation in a state
/// that forbids it (`InvalidState`: a step out of order, an allocation during a capture, a
/// graph destroyed twice) is the Python caller's misuse here, not a bug in memplan as it is
/// for the command line: a `memplan.UsageError` of kind `invalid_state`, never an
/// `InternalError`.
pub fn to_py(py: Python<'_>, e: &memplan::Error) -> PyErr {
    if let memplan::Error::InvalidState { .. } = e.root() {
        return raise(py, "invalid_state", 2, e.to_string());
    }
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

/// A `memplan.MemplanError` of `kind` (`usage`, `type`, `measurement`, `internal`) with
/// `message`, raised from the same envelope the CLI prints.
fn raise(py: Python<'_>, kind: &str, code: u8, message: String) -> PyErr {
    let env = serde_json::json!({
        "schema": "memplan.error/1",
        "error": {"kind": kind, "message": message, "exit_code": code, "help": {}},
    });
    let made = (|| -> PyResult<PyErr> {
        let env = py
            .import("json")?
            .call_method1("loads", (env.to_string(),))?;
        let exc = py
            .import("memplan._errors")?
            .call_method1("from_envelope", (code, env))?;
        Ok(PyErr::from_value(exc))
    })();
    made.unwrap_or_else(|err| err)
}

/// A value out of range: `memplan.UsageError` (a `ValueError`).
pub fn usage(py: Python<'_>, message: String) -> PyErr {
    raise(py, "usage", 2, message)
}

/// An argument of the wrong Python type: `memplan.ArgumentTypeError` (a `UsageError` and a
/// `TypeError`).
pub fn type_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, "type", 2, message)
}

/// A reading that cannot be right: `memplan.MeasurementError`.
pub fn measurement(py: Python<'_>, message: String) -> PyErr {
    raise(py, "measurement", 1, message)
}

/// A bug (a caught panic): `memplan.InternalError`.
pub fn internal(py: Python<'_>, message: String) -> PyErr {
    raise(
        py,
        "internal",
        1,
        format!("memplan panicked (a bug; please report it): {message}"),
    )
}

/// A short `repr()` of `v` for messages.
pub fn repr(v: &Bound<'_, PyAny>) -> String {
    let r = v
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into());
    if r.chars().count() > 80 {
        format!("{}...", r.chars().take(77).collect::<String>())
    } else {
        r
    }
}

/// An integer argument `name`: a Python `int` (or an object with `__index__`, such as a
/// numpy integer; not a `bool`) in `0..=max`. A wrong type is an `ArgumentTypeError`, a value
/// out of range (negative, above `max`, beyond 64 bits) a `UsageError` naming the argument
/// and the value; never an `OverflowError`.
pub fn int_arg(py: Python<'_>, v: &Bound<'_, PyAny>, name: &str, max: u64) -> PyResult<u64> {
    use pyo3::types::PyBool;
    let kind = v
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    if v.is_instance_of::<PyBool>() {
        return Err(type_error(
            py,
            format!("{name}={} is a bool; {name} takes an int", repr(v)),
        ));
    }
    match v.extract::<u64>() {
        Ok(n) if n <= max => Ok(n),
        Ok(_) => Err(usage(
            py,
            format!("{name}={} is outside 0..={max}", repr(v)),
        )),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => Err(usage(
            py,
            format!("{name}={} is outside 0..={max}", repr(v)),
        )),
        Err(_) => Err(type_error(
            py,
            format!(
                "{name}={} is {}; {name} takes an int",
                repr(v),
                a_type(&kind)
            ),
        )),
    }
}

/// A Python type's name with its article, as messages say it (`a str`, `an object`): `an`
/// before a vowel sound, a name that starts with a, e, i or o, or with a u not said "you"
/// (`uni`, `use`, `usu`, `uti`, `uu` are). The same rule as `memplan._errors.a_type`.
pub fn a_type(name: &str) -> String {
    let low = name.to_ascii_lowercase();
    let you = ["uni", "use", "usu", "uti", "uu"]
        .iter()
        .any(|p| low.starts_with(p));
    let vowel = low.starts_with(['a', 'e', 'i', 'o']) || (low.starts_with('u') && !you);
    format!("{} {name}", if vowel { "an" } else { "a" })
}

/// [`int_arg`] for a count: `1..=max`.
pub fn count_arg(py: Python<'_>, v: &Bound<'_, PyAny>, name: &str, max: u64) -> PyResult<u64> {
    match int_arg(py, v, name, max)? {
        0 => Err(usage(py, format!("{name}=0 is outside 1..={max}"))),
        n => Ok(n),
    }
}

/// [`int_arg`] for a `u32` argument.
pub fn u32_arg(py: Python<'_>, v: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    int_arg(py, v, name, u64::from(u32::MAX)).map(|n| n as u32)
}

/// [`int_arg`] for an optional argument (`None`: absent).
pub fn opt_int_arg(
    py: Python<'_>,
    v: Option<&Bound<'_, PyAny>>,
    name: &str,
    max: u64,
) -> PyResult<Option<u64>> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => int_arg(py, v, name, max).map(Some),
    }
}

/// Run `f`; a panic inside it becomes `memplan.InternalError` instead of crossing into
/// Python (every native entry point that does real work runs under this).
pub fn guard<T>(py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(internal(py, crate::panic_message(&*p))))
}
