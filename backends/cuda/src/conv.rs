//! Translation of CUDA driver codes and values into memplan's types.
//!
//! Everything here is a pure function of plain numbers, so it is tested without a GPU: result
//! codes (plain integers, see [`crate::ffi`]) become [`Error`]s naming the call and the code,
//! `cuDriverGetVersion`'s integer becomes `major.minor`, graph-pool attributes become
//! [`GraphPoolMemory`], `cuMemGetInfo` becomes [`DriverMemory`], and the device UUID becomes
//! the `GPU-…` / `MIG-…` string NVML and `nvidia-smi` print. The rest of the backend speaks
//! only the core's language.

use std::ffi::c_int;

use memplan_core::{DriverMemory, Error, GraphPoolMemory, Result};

use crate::ffi::MISSING;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: c_int = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: c_int = 2;

/// `CUresult` values and names, from the bindings of CUDA 13.4 (cudarc's `cuda-13040`), sorted
/// by value. A code a newer driver returns that is not here is named `unknown code N`.
pub const RESULT_NAMES: &[(c_int, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (5, "CUDA_ERROR_PROFILER_DISABLED"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (47, "CUDA_ERROR_MULTICAST_RESOURCE_FULL"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"),
    (205, "CUDA_ERROR_MAP_FAILED"),
    (206, "CUDA_ERROR_UNMAP_FAILED"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED"),
    (208, "CUDA_ERROR_ALREADY_MAPPED"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED"),
    (211, "CUDA_ERROR_NOT_MAPPED"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"),
    (226, "CUDA_ERROR_CONTAINED"),
    (227, "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (402, "CUDA_ERROR_LOSSY_QUERY"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (710, "CUDA_ERROR_ASSERT"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"),
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"),
    (811, "CUDA_ERROR_CDP_NOT_SUPPORTED"),
    (812, "CUDA_ERROR_CDP_VERSION_MISMATCH"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"),
    (907, "CUDA_ERROR_CAPTURED_EVENT"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"),
    (909, "CUDA_ERROR_TIMEOUT"),
    (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"),
    (913, "CUDA_ERROR_FUNCTION_NOT_LOADED"),
    (914, "CUDA_ERROR_INVALID_RESOURCE_TYPE"),
    (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"),
    (916, "CUDA_ERROR_KEY_ROTATION"),
    (917, "CUDA_ERROR_STREAM_DETACHED"),
    (918, "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE"),
    (919, "CUDA_ERROR_FABRIC_NOT_READY"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// The name of a driver result code (`CUDA_ERROR_OUT_OF_MEMORY`), or `unknown code N`.
pub fn result_name(code: c_int) -> String {
    if code == MISSING {
        return "symbol not exported by the loaded driver library".into();
    }
    match RESULT_NAMES.binary_search_by_key(&code, |(c, _)| *c) {
        Ok(i) => RESULT_NAMES[i].1.to_string(),
        Err(_) => format!("unknown code {code}"),
    }
}

/// `Ok(())` on `CUDA_SUCCESS`, otherwise a [`Error::DriverCall`] naming `call` and the code.
pub fn check(call: &str, code: c_int) -> Result<()> {
    if code == CUDA_SUCCESS {
        return Ok(());
    }
    Err(driver_error(call, code))
}

/// Like [`check`], but `CUDA_ERROR_OUT_OF_MEMORY` becomes [`Error::OutOfMemory`] with the
/// bytes asked for.
pub fn check_alloc(call: &str, code: c_int, requested: u64) -> Result<()> {
    if code == CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::OutOfMemory {
            call: call.to_string(),
            requested,
        });
    }
    check(call, code)
}

/// The typed error for a failed call.
pub fn driver_error(call: &str, code: c_int) -> Error {
    Error::DriverCall {
        call: call.to_string(),
        code: i64::from(code),
        name: result_name(code),
    }
}

pub use crate::facts::CudaVersion;

/// `cuMemGetInfo` output: device-wide on CUDA, or the MIG instance's memory under MIG.
pub fn driver_memory(free: usize, total: usize) -> DriverMemory {
    DriverMemory::new(Some(total as u64), Some(free as u64))
}

/// The four `cuDeviceGetGraphMemAttribute` values, in the order USED_CURRENT, USED_HIGH,
/// RESERVED_CURRENT, RESERVED_HIGH; `None` for an attribute that could not be read.
pub fn graph_pool(
    used: Option<u64>,
    used_high: Option<u64>,
    reserved: Option<u64>,
    reserved_high: Option<u64>,
) -> GraphPoolMemory {
    GraphPoolMemory::new(used, reserved).with_high_water(used_high, reserved_high)
}

/// The UUID as NVML and `nvidia-smi` print it, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
/// (`MIG-` for a MIG instance).
pub fn uuid_string(bytes: &[u8; 16], mig: bool) -> String {
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let prefix = if mig { "MIG" } else { "GPU" };
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The MIG profile in a device name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`), which is
/// how the driver API names a MIG instance.
pub fn mig_profile(name: &str) -> Option<String> {
    let mut words = name.split_whitespace();
    while let Some(w) = words.next() {
        if w == "MIG" {
            return words.next().map(str::to_string);
        }
    }
    None
}

/// A device name from `cuDeviceGetName`'s NUL-terminated buffer.
pub fn name_from_buffer(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim().to_string()
}

/// A non-negative attribute value as bytes; a negative one (a driver bug) is not a number.
pub fn non_negative(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use cudarc::driver::sys::CUresult;

    #[test]
    fn result_codes_become_typed_errors() {
        assert!(check("cuInit", CUDA_SUCCESS).is_ok());
        let e = check("cuInit", 100).unwrap_err();
        match &e {
            Error::DriverCall { call, code, name } => {
                assert_eq!(call, "cuInit");
                assert_eq!(*code, 100);
                assert_eq!(name, "CUDA_ERROR_NO_DEVICE");
            }
            other => panic!("wrong variant: {other:?}"),
        }
        assert_eq!(e.to_string(), "cuInit failed: CUDA_ERROR_NO_DEVICE (100)");
        let e = check("cuMemGetInfo_v2", 201).unwrap_err();
        assert!(matches!(e, Error::DriverCall { code: 201, .. }), "{e}");
        let e = check("cuInit", 803).unwrap_err();
        assert!(
            e.to_string()
                .contains("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)"),
            "{e}"
        );
        let e = check("cuStreamEndCapture", 901).unwrap_err();
        assert!(
            e.to_string()
                .contains("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)"),
            "{e}"
        );
    }

    #[test]
    fn codes_no_binding_knows_are_named_not_undefined() {
        // A code a newer driver may add: read as an integer, never into cudarc's enum.
        let e = check("cuInit", 4242).unwrap_err();
        assert_eq!(e.to_string(), "cuInit failed: unknown code 4242 (4242)");
        let e = check("cuMemMap", MISSING).unwrap_err();
        assert!(e.to_string().contains("not exported"), "{e}");
    }

    #[test]
    fn the_name_table_matches_the_bindings() {
        assert!(RESULT_NAMES.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
        for r in [
            CUresult::CUDA_SUCCESS,
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            CUresult::CUDA_ERROR_NOT_INITIALIZED,
            CUresult::CUDA_ERROR_STUB_LIBRARY,
            CUresult::CUDA_ERROR_NO_DEVICE,
            CUresult::CUDA_ERROR_INVALID_CONTEXT,
            CUresult::CUDA_ERROR_NOT_SUPPORTED,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            CUresult::CUDA_ERROR_UNKNOWN,
        ] {
            assert_eq!(result_name(r as c_int), format!("{r:?}"));
        }
        assert_eq!(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY as c_int,
            CUDA_ERROR_OUT_OF_MEMORY
        );
    }

    #[test]
    fn out_of_memory_is_its_own_error() {
        let e = check_alloc("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, 1 << 30).unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfMemory {
                    requested: 1073741824,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("cuMemAlloc_v2"), "{e}");
        // Other failures of an allocation stay driver-call errors.
        let e = check_alloc("cuMemCreate", 1, 1).unwrap_err();
        assert!(matches!(e, Error::DriverCall { code: 1, .. }), "{e}");
        assert!(check_alloc("cuMemCreate", CUDA_SUCCESS, 1).is_ok());
    }

    #[test]
    fn versions() {
        let v = CudaVersion(12040);
        assert_eq!((v.major(), v.minor()), (12, 4));
        assert_eq!(v.to_string(), "12.4");
        assert_eq!(CudaVersion(11040).to_string(), "11.4");
        assert_eq!(CudaVersion(13000).to_string(), "13.0");
        assert!(CudaVersion(11020) < CudaVersion(11040));
    }

    #[test]
    fn readings() {
        let d = driver_memory(20 << 30, 24 << 30);
        assert_eq!(d.total, Some(24 << 30));
        assert_eq!(d.free, Some(20 << 30));
        let g = graph_pool(Some(1), Some(2), Some(3), None);
        assert_eq!(
            (g.used, g.used_high, g.reserved, g.reserved_high),
            (Some(1), Some(2), Some(3), None)
        );
        assert_eq!(non_negative(-1), None);
        assert_eq!(non_negative(5), Some(5));
    }

    #[test]
    fn names_and_ids() {
        let mut buf = [0u8; 256];
        buf[..24].copy_from_slice(b"NVIDIA GeForce RTX 4090 ");
        assert_eq!(name_from_buffer(&buf), "NVIDIA GeForce RTX 4090");
        assert_eq!(name_from_buffer(b"no nul"), "no nul");
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb").as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3"), None);
        assert_eq!(mig_profile("NVIDIA H100 MIG"), None);
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        assert_eq!(
            uuid_string(&u, false),
            "GPU-12345678-9abc-def0-0102-030405060708"
        );
        assert!(uuid_string(&u, true).starts_with("MIG-12345678-"));
    }
}
