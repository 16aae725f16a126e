//! Translation of HIP's integers into memplan's language: return codes into names and
//! [`Error`]s, version integers into [`HipVersion`].
//!
//! Return codes are read as plain integers, never into hip-runtime-sys's Rust enums: its
//! bindings are from HIP 5.4, and a newer runtime may return a code those enums do not have,
//! which would be undefined behaviour to read into one. A code this table does not know is
//! reported as `unknown code N`.

use std::ffi::c_int;

use memplan_core::Error;

/// `hipSuccess`.
pub const HIP_SUCCESS: c_int = 0;
/// `hipErrorOutOfMemory` (also `hipErrorMemoryAllocation`).
pub const HIP_ERROR_OUT_OF_MEMORY: c_int = 2;
/// `hipErrorNotSupported`.
pub const HIP_ERROR_NOT_SUPPORTED: c_int = 801;

/// `hipDeviceAttributeIntegrated` (the same value from HIP 5.0 to 7.x).
pub const ATTR_INTEGRATED: c_int = 16;
/// `hipDeviceAttributeVirtualMemoryManagementSupported` (HIP >= 5.3; older runtimes reject it).
pub const ATTR_VMM_SUPPORTED: c_int = 89;
/// `hipGraphMemAttr{UsedMemCurrent, UsedMemHigh, ReservedMemCurrent, ReservedMemHigh}`.
pub const GRAPH_MEM_ATTRS: [c_int; 4] = [0, 1, 2, 3];
/// `hipStreamNonBlocking`.
pub const STREAM_NON_BLOCKING: u32 = 1;
/// `hipStreamCaptureModeThreadLocal`.
pub const CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// `hipMemAllocationGranularityMinimum`.
pub const GRANULARITY_MINIMUM: c_int = 0;

/// hipError_t values and names, from `hip_runtime_api.h` (HIP 5.2 through 7.x; aliases of the
/// same value keep the current name).
pub const ERROR_NAMES: &[(c_int, &str)] = &[
    (0, "hipSuccess"),
    (1, "hipErrorInvalidValue"),
    (2, "hipErrorOutOfMemory"),
    (3, "hipErrorNotInitialized"),
    (4, "hipErrorDeinitialized"),
    (5, "hipErrorProfilerDisabled"),
    (6, "hipErrorProfilerNotInitialized"),
    (7, "hipErrorProfilerAlreadyStarted"),
    (8, "hipErrorProfilerAlreadyStopped"),
    (9, "hipErrorInvalidConfiguration"),
    (12, "hipErrorInvalidPitchValue"),
    (13, "hipErrorInvalidSymbol"),
    (17, "hipErrorInvalidDevicePointer"),
    (21, "hipErrorInvalidMemcpyDirection"),
    (35, "hipErrorInsufficientDriver"),
    (52, "hipErrorMissingConfiguration"),
    (53, "hipErrorPriorLaunchFailure"),
    (98, "hipErrorInvalidDeviceFunction"),
    (100, "hipErrorNoDevice"),
    (101, "hipErrorInvalidDevice"),
    (200, "hipErrorInvalidImage"),
    (201, "hipErrorInvalidContext"),
    (202, "hipErrorContextAlreadyCurrent"),
    (205, "hipErrorMapFailed"),
    (206, "hipErrorUnmapFailed"),
    (207, "hipErrorArrayIsMapped"),
    (208, "hipErrorAlreadyMapped"),
    (209, "hipErrorNoBinaryForGpu"),
    (210, "hipErrorAlreadyAcquired"),
    (211, "hipErrorNotMapped"),
    (212, "hipErrorNotMappedAsArray"),
    (213, "hipErrorNotMappedAsPointer"),
    (214, "hipErrorECCNotCorrectable"),
    (215, "hipErrorUnsupportedLimit"),
    (216, "hipErrorContextAlreadyInUse"),
    (217, "hipErrorPeerAccessUnsupported"),
    (218, "hipErrorInvalidKernelFile"),
    (219, "hipErrorInvalidGraphicsContext"),
    (300, "hipErrorInvalidSource"),
    (301, "hipErrorFileNotFound"),
    (302, "hipErrorSharedObjectSymbolNotFound"),
    (303, "hipErrorSharedObjectInitFailed"),
    (304, "hipErrorOperatingSystem"),
    (400, "hipErrorInvalidHandle"),
    (401, "hipErrorIllegalState"),
    (500, "hipErrorNotFound"),
    (600, "hipErrorNotReady"),
    (700, "hipErrorIllegalAddress"),
    (701, "hipErrorLaunchOutOfResources"),
    (702, "hipErrorLaunchTimeOut"),
    (704, "hipErrorPeerAccessAlreadyEnabled"),
    (705, "hipErrorPeerAccessNotEnabled"),
    (708, "hipErrorSetOnActiveProcess"),
    (709, "hipErrorContextIsDestroyed"),
    (710, "hipErrorAssert"),
    (712, "hipErrorHostMemoryAlreadyRegistered"),
    (713, "hipErrorHostMemoryNotRegistered"),
    (719, "hipErrorLaunchFailure"),
    (720, "hipErrorCooperativeLaunchTooLarge"),
    (801, "hipErrorNotSupported"),
    (900, "hipErrorStreamCaptureUnsupported"),
    (901, "hipErrorStreamCaptureInvalidated"),
    (902, "hipErrorStreamCaptureMerge"),
    (903, "hipErrorStreamCaptureUnmatched"),
    (904, "hipErrorStreamCaptureUnjoined"),
    (905, "hipErrorStreamCaptureIsolation"),
    (906, "hipErrorStreamCaptureImplicit"),
    (907, "hipErrorCapturedEvent"),
    (908, "hipErrorStreamCaptureWrongThread"),
    (910, "hipErrorGraphExecUpdateFailure"),
    (911, "hipErrorInvalidChannelDescriptor"),
    (912, "hipErrorInvalidTexture"),
    (999, "hipErrorUnknown"),
    (1052, "hipErrorRuntimeMemory"),
    (1053, "hipErrorRuntimeOther"),
];

/// The name of a hipError_t value, or `unknown code N`.
pub fn error_name(code: c_int) -> String {
    match ERROR_NAMES.binary_search_by_key(&code, |(c, _)| *c) {
        Ok(i) => ERROR_NAMES[i].1.to_string(),
        Err(_) => format!("unknown code {code}"),
    }
}

/// `Ok(())` for `hipSuccess`, otherwise a [`Error::DriverCall`] naming the call and the code.
pub fn check(call: &str, code: c_int) -> Result<(), Error> {
    if code == HIP_SUCCESS {
        Ok(())
    } else {
        Err(Error::DriverCall {
            call: call.to_string(),
            code: i64::from(code),
            name: error_name(code),
        })
    }
}

/// Like [`check`], but an out-of-memory code becomes [`Error::OutOfMemory`] for `requested`
/// bytes, so callers can tell "full" from "broken".
pub fn check_alloc(call: &str, code: c_int, requested: u64) -> Result<(), Error> {
    if code == HIP_ERROR_OUT_OF_MEMORY {
        return Err(Error::OutOfMemory {
            call: call.to_string(),
            requested,
        });
    }
    check(call, code)
}

pub use crate::facts::HipVersion;

/// Offset of `gcnArchName` in `hipDeviceProp_t` as HIP 5.x lays it out (what
/// `hipGetDeviceProperties` writes), from hip-runtime-sys; tests/layout.rs compares it with
/// the installed header.
pub const PROPS_R0000_GCN_ARCH_NAME: usize =
    std::mem::offset_of!(hip_runtime_sys::hipDeviceProp_t, gcnArchName);
/// Size of the HIP 5.x `hipDeviceProp_t`.
pub const PROPS_R0000_SIZE: usize = std::mem::size_of::<hip_runtime_sys::hipDeviceProp_t>();
/// Offset of `gcnArchName` in `hipDeviceProp_tR0600` (HIP >= 6, `hipGetDevicePropertiesR0600`).
/// hip-runtime-sys predates it; tests/layout.rs checks it when a HIP 6 header is installed.
pub const PROPS_R0600_GCN_ARCH_NAME: usize = 1160;
/// Size of `hipDeviceProp_tR0600`.
pub const PROPS_R0600_SIZE: usize = 1472;
/// The zeroed buffer memplan hands to either properties call: larger than both layouts, so a
/// runtime that writes a few more bytes than its header says still writes inside it.
pub const PROPS_BUFFER_BYTES: usize = 4096;

const _: () = assert!(
    PROPS_R0000_SIZE + 256 <= PROPS_BUFFER_BYTES && PROPS_R0600_SIZE + 256 <= PROPS_BUFFER_BYTES
);

/// A NUL-terminated C string in a fixed buffer, as UTF-8 (lossy). `None` when the buffer
/// holds no terminator (a layout mismatch or an uninitialised buffer) or is empty.
pub fn c_buf_to_string(buf: &[u8]) -> Option<String> {
    let end = buf.iter().position(|b| *b == 0)?;
    let s = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_for_binary_search() {
        assert!(ERROR_NAMES.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn known_and_unknown_codes() {
        assert_eq!(error_name(100), "hipErrorNoDevice");
        assert_eq!(error_name(1053), "hipErrorRuntimeOther");
        assert_eq!(error_name(4242), "unknown code 4242");
        assert_eq!(error_name(-1), "unknown code -1");
        let e = check("hipInit", 100).unwrap_err().to_string();
        assert_eq!(e, "hipInit failed: hipErrorNoDevice (100)");
        let e = check("hipFoo", 1234).unwrap_err().to_string();
        assert_eq!(e, "hipFoo failed: unknown code 1234 (1234)");
        assert!(check("hipInit", 0).is_ok());
    }

    #[test]
    fn out_of_memory_is_typed() {
        let e = check_alloc("hipMalloc", 2, 1 << 30).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested, .. } if requested == 1 << 30));
        assert!(matches!(
            check_alloc("hipMalloc", 1, 8).unwrap_err(),
            Error::DriverCall { code: 1, .. }
        ));
    }

    #[test]
    fn versions_decode() {
        assert_eq!(
            HipVersion::from_int(50_221_153),
            Some(HipVersion::new(5, 2, 21153))
        );
        assert_eq!(
            HipVersion::from_int(60_241_134).map(|v| v.release()),
            Some((6, 2))
        );
        assert_eq!(
            HipVersion::from_int(70_000_000).map(|v| v.to_string()),
            Some("7.0.0".into())
        );
        assert_eq!(HipVersion::from_int(-5), None);
        assert!(HipVersion::new(5, 10, 0) > HipVersion::new(5, 6, 0));
    }

    #[test]
    fn c_strings() {
        assert_eq!(
            c_buf_to_string(b"gfx90a:sramecc+:xnack-\0junk").as_deref(),
            Some("gfx90a:sramecc+:xnack-")
        );
        assert_eq!(c_buf_to_string(b"no terminator"), None);
        assert_eq!(c_buf_to_string(b"\0"), None);
    }
}
