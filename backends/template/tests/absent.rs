//! A runtime that is not installed: the backend says which library, and nothing panics. Alone
//! in its test binary, because it sets the environment.

#![cfg(feature = "runtime")]

use memplan_backend_template::backend::TemplateBackend;
use memplan_backend_template::loader::ABSENT_ENV;
use memplan_core::{Backend, Error};

#[test]
fn an_absent_runtime_is_library_not_found() {
    // SAFETY: the only test of this binary; nothing else reads the environment concurrently.
    unsafe { std::env::set_var(ABSENT_ENV, "absent") };
    let e = TemplateBackend.devices().unwrap_err();
    assert!(matches!(e, Error::LibraryNotFound { .. }), "{e}");
    assert!(e.to_string().contains("libfake-runtime"), "{e}");
    let e = TemplateBackend.open("0").unwrap_err();
    assert!(matches!(e, Error::LibraryNotFound { .. }), "{e}");
}
