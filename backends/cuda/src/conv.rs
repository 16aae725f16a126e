//! Translation of CUDA driver codes and values into memplan's types.
//!
//! Everything here is a pure function of plain numbers, so it is tested without a GPU: result
//! codes become [`Error`]s naming the call and the code, `cuDriverGetVersion`'s integer becomes
//! `major.minor`, graph-pool attributes become [`GraphPoolMemory`], `cuMemGetInfo` becomes
//! [`DriverMemory`], and the device UUID becomes the `GPU-…` / `MIG-…` string NVML and
//! `nvidia-smi` print. The rest of the backend speaks only the core's language.

use cudarc::driver::sys::CUresult;
use memplan_core::{DriverMemory, Error, GraphPoolMemory, Result};

/// The numeric value of a driver result code.
pub fn code(res: CUresult) -> i64 {
    i64::from(res as u32)
}

/// The enum name of a result code (`CUDA_ERROR_OUT_OF_MEMORY`), from the bindings.
pub fn result_name(res: CUresult) -> String {
    format!("{res:?}")
}

/// `Ok(())` on `CUDA_SUCCESS`, otherwise a [`Error::DriverCall`] naming `call` and the code.
pub fn check(call: &str, res: CUresult) -> Result<()> {
    if res == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(driver_error(call, res))
}

/// Like [`check`], but `CUDA_ERROR_OUT_OF_MEMORY` becomes [`Error::OutOfMemory`] with the
/// bytes asked for.
pub fn check_alloc(call: &str, res: CUresult, requested: u64) -> Result<()> {
    if res == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::OutOfMemory {
            call: call.to_string(),
            requested,
        });
    }
    check(call, res)
}

/// The typed error for a failed call.
pub fn driver_error(call: &str, res: CUresult) -> Error {
    Error::DriverCall {
        call: call.to_string(),
        code: code(res),
        name: result_name(res),
    }
}

/// A CUDA version as packed by `cuDriverGetVersion` (`1000 * major + 10 * minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion(pub i32);

impl CudaVersion {
    /// Major version.
    pub fn major(self) -> i32 {
        self.0 / 1000
    }
    /// Minor version.
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// `cuMemGetInfo` output: device-wide on CUDA, or the MIG instance's memory under MIG.
pub fn driver_memory(free: usize, total: usize) -> DriverMemory {
    DriverMemory {
        total: Some(total as u64),
        free: Some(free as u64),
    }
}

/// The four `cuDeviceGetGraphMemAttribute` values, in the order USED_CURRENT, USED_HIGH,
/// RESERVED_CURRENT, RESERVED_HIGH; `None` for an attribute that could not be read.
pub fn graph_pool(
    used: Option<u64>,
    used_high: Option<u64>,
    reserved: Option<u64>,
    reserved_high: Option<u64>,
) -> GraphPoolMemory {
    GraphPoolMemory {
        used,
        reserved,
        used_high,
        reserved_high,
    }
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

    #[test]
    fn result_codes_become_typed_errors() {
        assert!(check("cuInit", CUresult::CUDA_SUCCESS).is_ok());
        let e = check("cuInit", CUresult::CUDA_ERROR_NO_DEVICE).unwrap_err();
        match &e {
            Error::DriverCall { call, code, name } => {
                assert_eq!(call, "cuInit");
                assert_eq!(*code, 100);
                assert_eq!(name, "CUDA_ERROR_NO_DEVICE");
            }
            other => panic!("wrong variant: {other:?}"),
        }
        assert_eq!(e.to_string(), "cuInit failed: CUDA_ERROR_NO_DEVICE (100)");
        let e = check("cuMemGetInfo_v2", CUresult::CUDA_ERROR_INVALID_CONTEXT).unwrap_err();
        assert!(matches!(e, Error::DriverCall { code: 201, .. }), "{e}");
        let e = check("cuInit", CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH).unwrap_err();
        assert!(
            e.to_string()
                .contains("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)"),
            "{e}"
        );
        let e = check(
            "cuStreamEndCapture",
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        )
        .unwrap_err();
        assert!(matches!(e, Error::DriverCall { code: 901, .. }), "{e}");
    }

    #[test]
    fn out_of_memory_is_its_own_error() {
        let e =
            check_alloc("cuMemAlloc_v2", CUresult::CUDA_ERROR_OUT_OF_MEMORY, 1 << 30).unwrap_err();
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
        let e = check_alloc("cuMemCreate", CUresult::CUDA_ERROR_INVALID_VALUE, 1).unwrap_err();
        assert!(matches!(e, Error::DriverCall { code: 1, .. }), "{e}");
        assert!(check_alloc("cuMemCreate", CUresult::CUDA_SUCCESS, 1).is_ok());
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
