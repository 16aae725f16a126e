//! NVML through a fake `libnvidia-ml.so.1` beside the fake driver: the device is found by the
//! driver's UUID, `nvmlMemory_v2_t` carries the right version word, the process list is
//! re-read with a larger buffer after NVML_ERROR_INSUFFICIENT_SIZE, this process and
//! not-available sizes are left out, every nvmlInit is balanced by nvmlShutdown, and the
//! framebuffer less its reserve is the device-wide reading's second total.

mod fake;

use memplan_backend_cuda::CudaBackend;
use memplan_core::HalDevice;

#[test]
fn nvml_itemises_other_processes_and_reserved_memory() {
    let (Some(_), Some(nvml)) = (fake::load(&[]), fake::load_nvml()) else {
        return;
    };
    let mut d = CudaBackend.open_cuda("0").expect("open");
    let m = d.nvml_memory().expect("NVML read at open");
    assert_eq!(m.total, (24 << 30) + (300 << 20));
    assert_eq!(m.reserved, Some(300 << 20));
    assert_eq!(m.used, 1 << 30);
    assert_eq!(m.other_processes, Some(71), "72 processes minus this one");
    assert_eq!(
        m.other_processes_bytes, None,
        "one size is not available: no total rather than a partial one"
    );
    let prop = |k: &str| {
        d.descriptor()
            .properties
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(prop("nvml_reserved"), Some((300u64 << 20).to_string()));
    assert_eq!(prop("nvml_other_processes").as_deref(), Some("71"));
    assert_eq!(prop("nvml_other_processes_bytes"), None);
    assert!(d
        .capabilities()
        .notes
        .iter()
        .any(|n| n.starts_with("NVML:")));
    // The second reading of the total: NVML's framebuffer less its reserve, which a sound
    // driver's total (the fake's 24 GiB) matches.
    assert_eq!(d.device_wide_memory().expect("read").total, Some(24 << 30));
    assert_eq!(d.driver_memory().expect("read").total, Some(24 << 30));
    assert_eq!(
        fake::nvml_state(nvml, "inits"),
        0,
        "nvmlShutdown balanced nvmlInit_v2"
    );
    drop(d);

    std::env::set_var("FAKE_NVML_ALL_KNOWN", "1");
    let d = CudaBackend.open_cuda("0").expect("open");
    let m = d.nvml_memory().expect("NVML read at open");
    assert_eq!(
        m.other_processes_bytes,
        Some(72 << 20),
        "70 x 1 MiB + 2 MiB; this process's 5 MiB left out"
    );
}
