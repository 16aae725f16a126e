//! Optional NVML (`libnvidia-ml.so.1`), loaded at run time, for what the driver API cannot say:
//! the framebuffer the driver reserves for itself and the memory other processes hold.
//!
//! Absent NVML is not an error: [`memory`] returns `None` and the device says so in its notes.
//! Values NVML reports as not available (`NVML_VALUE_NOT_AVAILABLE`) stay `None`. In a container
//! with its own PID namespace NVML reports host PIDs, so this process cannot recognise itself
//! and `other_processes_bytes` then includes its own usage: read it as "processes on the
//! device" there.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CString};

type Device = *mut c_void;

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Default)]
struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlProcessInfo_t` as the `_v3` process queries fill it.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

const SUCCESS: c_int = 0;
const INSUFFICIENT_SIZE: c_int = 7;
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// `sizeof(nvmlMemory_v2_t) | 2 << 24`, the header's `nvmlMemory_v2`.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

/// NVML's view of one device, read once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NvmlMemory {
    /// Total framebuffer.
    pub total: u64,
    /// Framebuffer the driver and firmware reserve (not usable by anyone), when reported.
    pub reserved: Option<u64>,
    /// Framebuffer in use, all processes.
    pub used: u64,
    /// Memory held by compute processes other than this one, when the list could be read and
    /// NVML could size every one of them.
    pub other_processes_bytes: Option<u64>,
    /// How many other compute processes hold memory, when the list could be read.
    pub other_processes: Option<usize>,
}

impl NvmlMemory {
    /// The device's memory as NVML reads it, a second reading of the driver's total
    /// (`cuMemGetInfo`): the framebuffer total less what NVML reports reserved for the driver
    /// and firmware, which `cuMemGetInfo`'s total does not count either (`nvmlMemory_v2_t`:
    /// total = reserved + used + free). Where NVML reports no reserved figure (drivers before
    /// the v2 query), the total itself, which is above a sound driver total by that reserve
    /// (several hundred MiB on data-centre parts) and so contradicts only a larger misreport.
    /// `None` for a total of 0 or one reserve at least as large (nothing to compare).
    pub fn device_total(&self) -> Option<u64> {
        let usable = self.total.checked_sub(self.reserved.unwrap_or(0))?;
        (self.total != VALUE_NOT_AVAILABLE && usable > 0).then_some(usable)
    }

    /// Descriptor properties (`nvml_*`).
    pub fn properties(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("nvml_total".to_string(), self.total.to_string()),
            ("nvml_used".to_string(), self.used.to_string()),
        ];
        if let Some(r) = self.reserved {
            v.push(("nvml_reserved".into(), r.to_string()));
        }
        if let Some(n) = self.other_processes {
            v.push(("nvml_other_processes".into(), n.to_string()));
        }
        if let Some(b) = self.other_processes_bytes {
            v.push(("nvml_other_processes_bytes".into(), b.to_string()));
        }
        v
    }
}

/// How many processes other than `own_pid` hold memory, and their total: `None` when NVML
/// could not size one of them (a partial sum would understate it).
pub fn other_processes(list: &[(u32, u64)], own_pid: u32) -> (usize, Option<u64>) {
    let others: Vec<u64> = list
        .iter()
        .filter(|(pid, _)| *pid != own_pid)
        .map(|(_, used)| *used)
        .collect();
    let bytes = others.iter().try_fold(0u64, |sum, used| {
        (*used != VALUE_NOT_AVAILABLE).then(|| sum.saturating_add(*used))
    });
    (others.len(), bytes)
}

fn library_name() -> &'static str {
    if cfg!(windows) {
        "nvml.dll"
    } else {
        "libnvidia-ml.so.1"
    }
}

/// Read NVML's view of the device with this UUID (`GPU-…` / `MIG-…`), or `None` when NVML is
/// absent, fails, or does not know the device. Never panics.
pub fn memory(uuid: &str) -> Option<NvmlMemory> {
    // SAFETY: loading NVML runs its initialisers only; it is unloaded when `lib` drops, after
    // nvmlShutdown balanced the nvmlInit_v2 below.
    let lib = match unsafe { libloading::Library::new(library_name()) } {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!("NVML not loaded: {e}");
            return None;
        }
    };
    // SAFETY: the signatures match nvml.h for these symbols; each is looked up before use.
    unsafe {
        let init = lib
            .get::<unsafe extern "C" fn() -> c_int>(b"nvmlInit_v2")
            .ok()?;
        let shutdown = lib
            .get::<unsafe extern "C" fn() -> c_int>(b"nvmlShutdown")
            .ok()?;
        if init() != SUCCESS {
            return None;
        }
        let out = query(&lib, uuid);
        shutdown();
        out
    }
}

/// # Safety
/// NVML must be initialised in `lib`.
unsafe fn query(lib: &libloading::Library, uuid: &str) -> Option<NvmlMemory> {
    type ByUuid = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
    type MemInfo = unsafe extern "C" fn(Device, *mut MemoryV2) -> c_int;
    type Procs = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> c_int;
    let c_uuid = CString::new(uuid).ok()?;
    let mut dev: Device = std::ptr::null_mut();
    // SAFETY: symbol signatures per nvml.h; pointers valid for the calls (caller initialised NVML).
    unsafe {
        let by_uuid = lib.get::<ByUuid>(b"nvmlDeviceGetHandleByUUID").ok()?;
        if by_uuid(c_uuid.as_ptr(), &mut dev) != SUCCESS {
            return None;
        }
        let mem_info = lib.get::<MemInfo>(b"nvmlDeviceGetMemoryInfo_v2").ok()?;
        let mut m = MemoryV2 {
            version: MEMORY_V2_VERSION,
            ..Default::default()
        };
        if mem_info(dev, &mut m) != SUCCESS {
            return None;
        }
        let mut list = None;
        if let Ok(procs) = lib.get::<Procs>(b"nvmlDeviceGetComputeRunningProcesses_v3") {
            let mut buf = vec![ProcessInfo::default(); 64];
            for _ in 0..3 {
                let mut n = buf.len() as c_uint;
                match procs(dev, &mut n, buf.as_mut_ptr()) {
                    SUCCESS => {
                        list = Some(
                            buf[..(n as usize).min(buf.len())]
                                .iter()
                                .map(|p| (p.pid, p.used_gpu_memory))
                                .collect::<Vec<_>>(),
                        );
                        break;
                    }
                    INSUFFICIENT_SIZE => {
                        buf.resize((n as usize).max(buf.len() * 2), ProcessInfo::default())
                    }
                    _ => break,
                }
            }
        }
        let others = list.map(|l: Vec<(u32, u64)>| other_processes(&l, std::process::id()));
        Some(NvmlMemory {
            total: m.total,
            reserved: (m.reserved != VALUE_NOT_AVAILABLE).then_some(m.reserved),
            used: m.used,
            other_processes_bytes: others.and_then(|o| o.1),
            other_processes: others.map(|o| o.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<MemoryV2>(), 40);
        assert_eq!(MEMORY_V2_VERSION, 0x0200_0028);
        assert_eq!(std::mem::size_of::<ProcessInfo>(), 24);
    }

    #[test]
    fn other_processes_exclude_this_one_and_unknown_sizes() {
        let l = [(10, 100), (11, 200), (12, VALUE_NOT_AVAILABLE)];
        assert_eq!(
            other_processes(&l, 10),
            (2, None),
            "one size unknown: no total"
        );
        assert_eq!(other_processes(&l[..2], 10), (1, Some(200)));
        assert_eq!(other_processes(&l[..2], 99), (2, Some(300)));
        assert_eq!(other_processes(&[], 10), (0, Some(0)));
    }

    #[test]
    fn absent_nvml_is_none_not_an_error() {
        // SAFETY: loading NVML only runs its initialisers.
        if unsafe { libloading::Library::new(library_name()) }.is_err() {
            assert_eq!(memory("GPU-00000000-0000-0000-0000-000000000000"), None);
        }
    }

    fn reading(total: u64, reserved: Option<u64>) -> NvmlMemory {
        NvmlMemory {
            total,
            reserved,
            used: 0,
            other_processes_bytes: None,
            other_processes: None,
        }
    }

    #[test]
    fn the_device_total_leaves_out_the_reserved_framebuffer() {
        const MIB: u64 = 1 << 20;
        // H100 80GB HBM3 as nvidia-smi -q shows it: Total 81,559 MiB, Reserved 454 MiB.
        assert_eq!(
            reading(81_559 * MIB, Some(454 * MIB)).device_total(),
            Some(81_105 * MIB)
        );
        // No reserved figure (the v1 query): the framebuffer total as it is.
        assert_eq!(
            reading(81_559 * MIB, None).device_total(),
            Some(81_559 * MIB)
        );
        // Nothing usable to compare with: no second total, never 0.
        assert_eq!(reading(0, None).device_total(), None);
        assert_eq!(reading(MIB, Some(MIB)).device_total(), None);
        assert_eq!(reading(MIB, Some(2 * MIB)).device_total(), None);
        assert_eq!(reading(VALUE_NOT_AVAILABLE, None).device_total(), None);
    }

    #[test]
    fn properties_skip_absent_values() {
        let m = NvmlMemory {
            total: 1,
            reserved: None,
            used: 0,
            other_processes_bytes: None,
            other_processes: None,
        };
        let p = m.properties();
        assert_eq!(p.len(), 2);
        assert!(!p.iter().any(|(k, _)| k == "nvml_reserved"));
    }
}
