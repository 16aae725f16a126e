//! Translation of Level Zero values into memplan's language: `ze_result_t` codes into
//! [`Error`]s that carry the call and the code by name, and Sysman memory-module readings into
//! one free-memory reading (or the reason there is none). Everything here is pure, so the
//! traps (integrated GPUs, missing modules, free == total) are tested without hardware.

use level_zero_sys as ze;
use memplan_core::{Error, Result};

/// The name of a result code, or `unknown code 0x...`.
pub fn result_name(code: ze::ze_result_t) -> String {
    ze::result_name(code)
        .map(str::to_string)
        .unwrap_or_else(|| format!("unknown code {code:#010x}"))
}

/// A failed call as a [`Error::DriverCall`].
pub fn call_error(call: &str, code: ze::ze_result_t) -> Error {
    Error::DriverCall {
        call: call.to_string(),
        code: i64::from(code),
        name: result_name(code),
    }
}

/// `Ok` for `ZE_RESULT_SUCCESS`, otherwise the call's error.
pub fn check(call: &str, code: ze::ze_result_t) -> Result<()> {
    if code == ze::ZE_RESULT_SUCCESS {
        Ok(())
    } else {
        Err(call_error(call, code))
    }
}

/// Like [`check`], but out-of-memory codes become [`Error::OutOfMemory`].
pub fn check_alloc(call: &str, code: ze::ze_result_t, requested: u64) -> Result<()> {
    match code {
        ze::ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY | ze::ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY => {
            Err(Error::OutOfMemory {
                call: call.to_string(),
                requested,
            })
        }
        _ => check(call, code),
    }
}

/// A UUID in the usual 8-4-4-4-12 form.
pub fn uuid_string(id: &[u8; 16]) -> String {
    let h: Vec<String> = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// One Sysman memory module as read by `zesMemoryGetProperties` + `zesMemoryGetState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModuleReading {
    /// `ZES_MEM_LOC_SYSTEM` or `ZES_MEM_LOC_DEVICE` (other values are kept as read).
    pub location: u32,
    /// Free bytes.
    pub free: u64,
    /// Allocatable bytes.
    pub size: u64,
}

pub use crate::facts::{SysmanFree, SysmanProcesses};

/// This process's entry of a per-process listing `(pid, memSize)`: its memory, and how many
/// other processes were listed. Not listed: unavailable (the query answered for others only).
pub fn own_process(pid: u32, listed: &[(u32, u64)]) -> SysmanProcesses {
    let own: Vec<u64> = listed
        .iter()
        .filter(|(p, _)| *p == pid)
        .map(|(_, m)| *m)
        .collect();
    match own.as_slice() {
        [] => SysmanProcesses::unavailable(format!(
            "zesDeviceProcessesGetState listed {} process(es), not this one (pid {pid})",
            listed.len()
        )),
        // One entry per process; should a driver list it per context, they add up.
        mem => SysmanProcesses::Readable {
            own: mem.iter().fold(0u64, |a, b| a.saturating_add(*b)),
            others: listed.iter().filter(|(p, _)| *p != pid).count(),
        },
    }
}

/// Turn the module readings of one device into one free-memory reading.
///
/// Integrated GPUs have no device-local memory: their modules (if any) are system memory,
/// whose free value is the host's, not the GPU's: unavailable, never 0. A discrete device
/// with no device-local module is unavailable too. A module reporting free > size is
/// inconsistent and makes the reading unavailable rather than wrong.
pub fn translate(integrated: bool, modules: &[ModuleReading]) -> SysmanFree {
    if integrated {
        return SysmanFree::unavailable(
            "integrated GPU: device memory is shared system memory and Sysman reports no device-local free memory",
        );
    }
    let local: Vec<_> = modules
        .iter()
        .filter(|m| m.location == ze::ZES_MEM_LOC_DEVICE)
        .collect();
    if local.is_empty() {
        return SysmanFree::unavailable(format!(
            "Sysman lists {} memory module(s), none of them device-local (ZES_MEM_LOC_DEVICE)",
            modules.len()
        ));
    }
    let (mut free, mut size) = (0u64, 0u64);
    for m in &local {
        if m.free > m.size {
            return SysmanFree::unavailable(format!(
                "zesMemoryGetState reported free {} > size {} for a device-local module",
                m.free, m.size
            ));
        }
        free = free.saturating_add(m.free);
        size = size.saturating_add(m.size);
    }
    SysmanFree::Readable {
        free,
        size,
        modules: local.len(),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes; `None` when the text is absent or has
/// no such line (never 0 for what could not be read).
pub fn host_available(meminfo: Option<&str>) -> Option<u64> {
    let line = meminfo?.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut parts = line["MemAvailable:".len()..].split_whitespace();
    let kib: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => kib.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_from_the_listing() {
        assert_eq!(
            own_process(7, &[(3, 100), (7, 5 << 20)]),
            SysmanProcesses::Readable {
                own: 5 << 20,
                others: 1
            }
        );
        // Not listed (the query answered for others only): unavailable, never 0.
        match own_process(9, &[(3, 100)]) {
            SysmanProcesses::Unavailable { reason } => {
                assert!(reason.contains("pid 9"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn host_available_reads_meminfo_or_nothing() {
        let t = "MemTotal:       131072000 kB\nMemAvailable:    8388608 kB\n";
        assert_eq!(super::host_available(Some(t)), Some(8 << 30));
        assert_eq!(super::host_available(Some("MemTotal: 1 kB\n")), None);
        assert_eq!(super::host_available(None), None);
        assert_eq!(super::host_available(Some("MemAvailable: lots kB\n")), None);
    }

    use memplan_core::bytes::GIB;

    fn dev(free: u64, size: u64) -> ModuleReading {
        ModuleReading {
            location: ze::ZES_MEM_LOC_DEVICE,
            free,
            size,
        }
    }

    #[test]
    fn errors_name_the_call_and_code() {
        let e = check(
            "zeInit(ZE_INIT_FLAG_GPU_ONLY)",
            ze::ZE_RESULT_ERROR_UNINITIALIZED,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("zeInit(ZE_INIT_FLAG_GPU_ONLY)")
                && e.contains("ZE_RESULT_ERROR_UNINITIALIZED"),
            "{e}"
        );
        let e = check("zeDeviceGet", 0x7abc_0001).unwrap_err().to_string();
        assert!(e.contains("unknown code 0x7abc0001"), "{e}");
        assert!(check("x", ze::ZE_RESULT_SUCCESS).is_ok());
        let oom = check_alloc(
            "zeMemAllocDevice",
            ze::ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY,
            5,
        )
        .unwrap_err();
        assert!(
            matches!(oom, Error::OutOfMemory { requested: 5, .. }),
            "{oom}"
        );
    }

    #[test]
    fn sums_device_local_modules_of_a_two_tile_card() {
        let sys = ModuleReading {
            location: ze::ZES_MEM_LOC_SYSTEM,
            free: 100 * GIB,
            size: 200 * GIB,
        };
        let r = translate(
            false,
            &[dev(30 * GIB, 64 * GIB), dev(40 * GIB, 64 * GIB), sys],
        );
        assert_eq!(
            r,
            SysmanFree::Readable {
                free: 70 * GIB,
                size: 128 * GIB,
                modules: 2
            }
        );
        assert!(!r.free_equals_total());
    }

    #[test]
    fn integrated_gpu_has_no_free_reading_not_zero() {
        let r = translate(
            true,
            &[ModuleReading {
                location: ze::ZES_MEM_LOC_SYSTEM,
                free: 0,
                size: 16 * GIB,
            }],
        );
        assert!(
            matches!(&r, SysmanFree::Unavailable { reason } if reason.contains("integrated")),
            "{r:?}"
        );
        let r = translate(false, &[]);
        assert!(
            matches!(&r, SysmanFree::Unavailable { reason } if reason.contains("0 memory module")),
            "{r:?}"
        );
    }

    #[test]
    fn free_equal_total_is_flagged() {
        let r = translate(false, &[dev(16 * GIB, 16 * GIB)]);
        assert!(r.free_equals_total());
        let bad = translate(false, &[dev(17 * GIB, 16 * GIB)]);
        assert!(matches!(bad, SysmanFree::Unavailable { .. }));
    }

    #[test]
    fn formats_uuids() {
        let mut id = [0u8; 16];
        id[0] = 0x86;
        id[15] = 0xff;
        assert_eq!(uuid_string(&id), "86000000-0000-0000-0000-0000000000ff");
    }
}
