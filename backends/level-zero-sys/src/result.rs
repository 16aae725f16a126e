//! `ze_result_t` values (ze_api.h, spec 1.x) and their names.
//!
//! Results are plain `u32` constants, never a Rust enum: a newer driver may return a code this
//! crate does not know, and transmuting it into an enum would be undefined behaviour.
//! [`result_name`] gives the header's name, or `None` for an unknown code.

/// `ze_result_t`: the return value of every Level Zero call.
pub type ze_result_t = u32;

macro_rules! results {
    ($($name:ident = $value:expr),* $(,)?) => {
        $(
            #[doc = concat!("`", stringify!($name), "`")]
            pub const $name: ze_result_t = $value;
        )*
        /// Every result code this crate knows, with its name.
        pub const RESULT_NAMES: &[(ze_result_t, &str)] = &[$(($value, stringify!($name))),*];
    };
}

results! {
    ZE_RESULT_SUCCESS = 0,
    ZE_RESULT_NOT_READY = 1,
    ZE_RESULT_ERROR_DEVICE_LOST = 0x7000_0001,
    ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY = 0x7000_0002,
    ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY = 0x7000_0003,
    ZE_RESULT_ERROR_MODULE_BUILD_FAILURE = 0x7000_0004,
    ZE_RESULT_ERROR_MODULE_LINK_FAILURE = 0x7000_0005,
    ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET = 0x7000_0006,
    ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE = 0x7000_0007,
    ZE_RESULT_EXP_ERROR_DEVICE_IS_NOT_VERTEX = 0x7ff0_0001,
    ZE_RESULT_EXP_ERROR_VERTEX_IS_NOT_DEVICE = 0x7ff0_0002,
    ZE_RESULT_EXP_ERROR_REMOTE_DEVICE = 0x7ff0_0003,
    ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS = 0x7001_0000,
    ZE_RESULT_ERROR_NOT_AVAILABLE = 0x7001_0001,
    ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE = 0x7002_0000,
    ZE_RESULT_WARNING_DROPPED_DATA = 0x7002_0001,
    ZE_RESULT_ERROR_UNINITIALIZED = 0x7800_0001,
    ZE_RESULT_ERROR_UNSUPPORTED_VERSION = 0x7800_0002,
    ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x7800_0003,
    ZE_RESULT_ERROR_INVALID_ARGUMENT = 0x7800_0004,
    ZE_RESULT_ERROR_INVALID_NULL_HANDLE = 0x7800_0005,
    ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE = 0x7800_0006,
    ZE_RESULT_ERROR_INVALID_NULL_POINTER = 0x7800_0007,
    ZE_RESULT_ERROR_INVALID_SIZE = 0x7800_0008,
    ZE_RESULT_ERROR_UNSUPPORTED_SIZE = 0x7800_0009,
    ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT = 0x7800_000a,
    ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT = 0x7800_000b,
    ZE_RESULT_ERROR_INVALID_ENUMERATION = 0x7800_000c,
    ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION = 0x7800_000d,
    ZE_RESULT_ERROR_UNSUPPORTED_IMAGE_FORMAT = 0x7800_000e,
    ZE_RESULT_ERROR_INVALID_NATIVE_BINARY = 0x7800_000f,
    ZE_RESULT_ERROR_INVALID_GLOBAL_NAME = 0x7800_0010,
    ZE_RESULT_ERROR_INVALID_KERNEL_NAME = 0x7800_0011,
    ZE_RESULT_ERROR_INVALID_FUNCTION_NAME = 0x7800_0012,
    ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION = 0x7800_0013,
    ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION = 0x7800_0014,
    ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX = 0x7800_0015,
    ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE = 0x7800_0016,
    ZE_RESULT_ERROR_INVALID_KERNEL_ATTRIBUTE_VALUE = 0x7800_0017,
    ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED = 0x7800_0018,
    ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE = 0x7800_0019,
    ZE_RESULT_ERROR_OVERLAPPING_REGIONS = 0x7800_001a,
    ZE_RESULT_WARNING_ACTION_REQUIRED = 0x7800_001b,
    ZE_RESULT_ERROR_UNKNOWN = 0x7fff_fffe,
}

/// The header's name of a result code, or `None` for a code this crate does not know.
pub fn result_name(code: ze_result_t) -> Option<&'static str> {
    RESULT_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_and_unknown_codes() {
        assert_eq!(
            result_name(ZE_RESULT_ERROR_UNINITIALIZED),
            Some("ZE_RESULT_ERROR_UNINITIALIZED")
        );
        assert_eq!(result_name(0), Some("ZE_RESULT_SUCCESS"));
        assert_eq!(result_name(0x1234_5678), None);
    }

    #[test]
    fn codes_are_unique() {
        let mut v: Vec<_> = RESULT_NAMES.iter().map(|(c, _)| *c).collect();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), RESULT_NAMES.len());
    }
}
