//! The runtime's status codes into memplan's errors: every failure names the call, the code
//! and the code's name; a code the runtime did not document is "unknown code N", never a
//! guess; running out of memory is [`Error::OutOfMemory`].

use memplan_core::{Error, Result};

use crate::fake::{self, Status};

/// The name of a status code, as the runtime's header spells it.
pub fn status_name(code: Status) -> String {
    match code {
        fake::SUCCESS => "FAKE_SUCCESS".into(),
        fake::ERROR_NOT_INITIALIZED => "FAKE_ERROR_NOT_INITIALIZED".into(),
        fake::ERROR_INVALID_VALUE => "FAKE_ERROR_INVALID_VALUE".into(),
        fake::ERROR_OUT_OF_MEMORY => "FAKE_ERROR_OUT_OF_MEMORY".into(),
        fake::ERROR_INVALID_DEVICE => "FAKE_ERROR_INVALID_DEVICE".into(),
        fake::ERROR_CAPTURE_STATE => "FAKE_ERROR_CAPTURE_STATE".into(),
        other => format!("unknown code {other}"),
    }
}

// guide:begin check
/// `Ok` on success, else the typed error naming `call`.
pub fn check(call: &str, code: Status) -> Result<()> {
    match code {
        fake::SUCCESS => Ok(()),
        code => Err(Error::DriverCall {
            call: call.into(),
            code: code.into(),
            name: status_name(code),
        }),
    }
}

/// As [`check`], for a call that takes `requested` bytes: running out is `OutOfMemory`.
pub fn check_alloc(call: &str, code: Status, requested: u64) -> Result<()> {
    match code {
        fake::ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory {
            call: call.into(),
            requested,
        }),
        code => check(call, code),
    }
}
// guide:end check

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_and_unknown_ones_say_so() {
        let e = check("fake_free", fake::ERROR_INVALID_VALUE).unwrap_err();
        assert_eq!(
            e.to_string(),
            "fake_free failed: FAKE_ERROR_INVALID_VALUE (2)"
        );
        let e = check("fake_free", 77).unwrap_err().to_string();
        assert!(e.contains("unknown code 77"), "{e}");
        let e = check_alloc("fake_malloc", fake::ERROR_OUT_OF_MEMORY, 5).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(check("fake_init", fake::SUCCESS).is_ok());
    }
}
