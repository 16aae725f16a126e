//! The device-wide source of each platform: it sees every process (graphics included) where
//! the real backend's source does, with its own noise within the declared tolerance, and is
//! absent (never 0) where the platform offers none.

use memplan_core::Reading;

use super::{gpu, Gpu, G, M};

fn drawn(selector: &str) -> Gpu {
    Gpu::of(crate::SimGpu::open(selector).unwrap())
}

#[test]
fn drm_counters_see_what_a_process_local_free_reading_misses() {
    // ROCm 6.2 with DRM sysfs: others and graphics are counted, within the declared ±16 MiB.
    let g = drawn("rx7900xtx-rocm6.2,seed=3");
    g.set_other_processes(4 * G);
    g.set_graphics_bytes(G);
    let tol = g
        .capabilities()
        .reading(Reading::DeviceAvailable)
        .tolerance_bytes();
    assert!(tol > 0);
    for _ in 0..5 {
        g.synchronize().unwrap();
        let d = g.device_wide_memory().unwrap().available.unwrap();
        assert!(
            d.abs_diff(g.truth().free) <= tol,
            "{d} vs {}",
            g.truth().free
        );
    }
    assert!(g.physics().device_noise_bytes <= tol);
}

#[test]
fn a_platform_without_a_source_reads_nothing_and_the_apu_reads_the_host() {
    // ROCm 5.4 without DRM sysfs: nothing device-wide, absent rather than 0.
    let g = gpu("rx7900xtx-rocm5.4");
    g.set_other_processes(4 * G);
    assert_eq!(g.device_wide_memory().unwrap().available, None);
    assert_eq!(
        g.capabilities().reading(Reading::DeviceAvailable).label(),
        "unavailable"
    );
    // Strix Halo: the host's available memory drops with a neighbour.
    let apu = drawn("strix-halo,seed=5");
    let before = apu.device_wide_memory().unwrap().available.unwrap();
    apu.set_other_processes(8 * G);
    apu.synchronize().unwrap();
    let after = apu.device_wide_memory().unwrap().available.unwrap();
    let tol = apu
        .capabilities()
        .reading(Reading::DeviceAvailable)
        .tolerance_bytes();
    assert!(
        (before - after).abs_diff(8 * G) <= 2 * tol,
        "{before} -> {after}"
    );
    // Sysman missing: the same call as free, absent; CUDA: the free reading itself.
    let b = gpu("arc-b580-nosysman");
    assert_eq!(b.device_wide_memory().unwrap().available, None);
    let c = gpu("rtx4090");
    c.set_other_processes(2 * G);
    assert_eq!(
        c.device_wide_memory().unwrap().available,
        c.driver_memory().unwrap().free
    );
}

#[test]
fn nvml_reads_the_cards_memory_where_the_runtime_misreports_it() {
    // CUDA with NVML: the second total is the card's memory, whatever the runtime's total says.
    let h200 = super::total("h200");
    let over = gpu("h200,total-over=512MiB");
    assert_eq!(over.driver_memory().unwrap().total, Some(h200 + 512 * M));
    assert_eq!(over.device_wide_memory().unwrap().total, Some(h200));
    let under = gpu("h200,total-under=128MiB");
    assert_eq!(under.driver_memory().unwrap().total, Some(h200 - 128 * M));
    assert_eq!(under.device_wide_memory().unwrap().total, Some(h200));
    // A sound runtime: both readings agree, so nothing contradicts the driver's total.
    let sound = gpu("rtx4090");
    assert_eq!(
        sound.device_wide_memory().unwrap().total,
        sound.driver_memory().unwrap().total
    );
    // NVML absent: no second total, only the runtime's.
    let bare = gpu("h200,total-over=512MiB,no-nvml");
    assert_eq!(bare.device_wide_memory().unwrap().total, None);
    assert_eq!(
        bare.device_wide_memory().unwrap().available,
        bare.driver_memory().unwrap().free
    );
    // DRM's counters read it on ROCm 6.2; Level Zero and ROCm without DRM counters have none.
    let drm = gpu("rx7900xtx-rocm6.2,total-over=512MiB");
    assert_eq!(
        drm.device_wide_memory().unwrap().total,
        Some(super::total("rx7900xtx-rocm6.2"))
    );
    for name in [
        "rx7900xtx-rocm5.4",
        "max1550",
        "arc-a770",
        "arc-b580-nosysman",
    ] {
        let g = gpu(&format!("{name},total-over=512MiB"));
        assert_eq!(g.device_wide_memory().unwrap().total, None, "{name}");
    }
}
