//! One test per driver-reading quirk, each showing the raw readings it produces next to the truth.

use memplan_core::{Reading, Reliability};

use super::{free_after_sync, gpu, total, G, M};

#[test]
fn well_behaved_cuda_free_is_device_wide() {
    let g = gpu("rtx4090");
    g.set_other_processes(2 * G);
    g.set_graphics_bytes(G);
    let free = free_after_sync(&g).unwrap();
    assert_eq!(free, total("rtx4090") - 400 * M - 3 * G);
    assert_eq!(free, g.truth().free);
}

#[test]
fn free_process_local_ignores_other_processes_and_graphics() {
    let g = gpu("rx7900xtx-rocm5.4");
    g.set_other_processes(4 * G);
    g.set_graphics_bytes(G);
    let raw = g.raw_driver_memory();
    assert_eq!(
        raw.free,
        Some(total("rx7900xtx-rocm5.4") - 300 * M),
        "only this process counts"
    );
    assert_eq!(g.truth().free, raw.free.unwrap() - 5 * G);
    // Process-local readings still measure this process's own use.
    let a = g.allocate(G).unwrap();
    assert_eq!(g.raw_driver_memory().free, raw.free.map(|f| f - G));
    g.free(a).unwrap();
    assert!(matches!(
        g.capabilities().reading(Reading::DriverFree),
        Reliability::ProcessLocal { .. }
    ));
    assert_eq!(
        free_after_sync(&g),
        raw.free,
        "process-local is sourced, not masked"
    );
}

#[test]
fn free_blind_to_graphics_sees_others_but_not_drm() {
    let g = gpu("rx7900xtx-rocm5.5");
    g.set_other_processes(2 * G);
    g.set_graphics_bytes(G);
    let free = free_after_sync(&g).unwrap();
    assert_eq!(
        free,
        g.truth().free + G,
        "graphics allocations are invisible"
    );
    assert_eq!(free, total("rx7900xtx-rocm5.5") - 300 * M - 2 * G);
}

#[test]
fn apu_reports_the_aperture_not_the_usable_pool() {
    // What hipMemGetInfo gives on an APU; the real backend bounds it by the host instead (the
    // profile's own readings), so the quirk is switched on to see it.
    let g = gpu("strix-halo,apu-wrong-pool=on");
    let raw = g.raw_driver_memory();
    assert_eq!(
        raw.total,
        Some(512 * M),
        "aperture, not the 64 GiB the GPU can use"
    );
    assert_eq!(raw.free, Some(256 * M), "aperture less the context");
    let a = g.allocate(G).unwrap();
    g.synchronize().unwrap();
    assert_eq!(
        g.raw_driver_memory().free,
        Some(256 * M),
        "the reading does not move: the GiB went to GTT ..."
    );
    assert_eq!(
        g.truth().free,
        64 * G - 256 * M - G,
        "... while 62.75 GiB are really free"
    );
    let masked = g.driver_memory().unwrap();
    assert_eq!(
        (masked.total, masked.free),
        (Some(512 * M), Some(256 * M)),
        "declared approximate by the real backend: sourced, calibration must catch it"
    );
    assert!(g.capabilities().facts.unified_memory);
    let honest = gpu("strix-halo");
    honest.synchronize().unwrap();
    assert_eq!(
        honest.driver_memory().unwrap().free,
        Some(honest.truth().free),
        "bounded by the host: the usable pool"
    );
    g.free(a).unwrap();
}

#[test]
fn sysman_missing_gives_absent_free_never_zero() {
    let g = gpu("arc-b580-nosysman");
    let raw = g.raw_driver_memory();
    assert_eq!(raw.free, None);
    assert_eq!(raw.total, Some(12 * G), "total comes from the core API");
    let d = g.driver_memory().unwrap();
    assert_eq!((d.total, d.free), (Some(12 * G), None));
    let why = g.capabilities().reading(Reading::DriverFree).detail();
    assert!(why.contains("Sysman"), "{why}");
}

#[test]
fn free_equals_total_for_non_root_i915() {
    // Sysman's own reading, without the per-process query the real backend composes from.
    let g = gpu("arc-a770,sysman-processes=off");
    let a = g.allocate(2 * G).unwrap();
    g.set_other_processes(G);
    g.synchronize().unwrap();
    assert_eq!(
        g.raw_driver_memory().free,
        Some(16 * G),
        "free == total whatever is used"
    );
    assert_eq!(g.truth().free, 16 * G - 256 * M - 3 * G);
    assert_eq!(
        g.driver_memory().unwrap().free,
        Some(16 * G),
        "declared approximate within the whole size (as the real backend does): sourced"
    );
    g.free(a).unwrap();
}

#[test]
fn the_per_process_query_gives_a_process_local_free() {
    // i915 for a non-root user: Sysman's free == total, its per-process query lists this
    // process: the backend's free is the total less this process, others unseen.
    let g = gpu("arc-a770");
    assert!(matches!(
        g.capabilities().reading(Reading::DriverFree),
        Reliability::ProcessLocal { .. }
    ));
    let before = free_after_sync(&g).unwrap();
    let a = g.allocate(2 * G).unwrap();
    g.set_other_processes(G);
    assert_eq!(
        free_after_sync(&g),
        Some(before - 2 * G),
        "sees this process only"
    );
    assert_eq!(
        g.raw_device_wide_memory().available,
        Some(16 * G),
        "the device-wide reading stays Sysman's own free == total"
    );
    g.free(a).unwrap();
    // An integrated GPU: no device-local free, the per-process query answers.
    let i = gpu("arc-140v");
    assert!(matches!(
        i.capabilities().reading(Reading::DriverFree),
        Reliability::ProcessLocal { .. }
    ));
    assert!(free_after_sync(&i).is_some());
}

#[test]
fn stale_free_lags_one_synchronize() {
    let g = gpu("broken-stale");
    assert!(
        g.capabilities().reading(Reading::DriverFree).is_exact(),
        "declares exact: broken on purpose"
    );
    let f0 = free_after_sync(&g).unwrap();
    let a = g.allocate(G).unwrap();
    assert_eq!(
        free_after_sync(&g),
        Some(f0),
        "the allocation is not visible yet"
    );
    assert_eq!(free_after_sync(&g), Some(f0 - G), "one synchronize later");
    g.free(a).unwrap();
    assert_eq!(free_after_sync(&g), Some(f0 - G));
    assert_eq!(free_after_sync(&g), Some(f0));
}

#[test]
fn declare_exact_keeps_the_quirks() {
    let g = gpu("arc-a770,sysman-processes=off,declare-exact");
    for r in Reading::ALL {
        assert!(g.capabilities().reading(r).is_exact(), "{r:?}");
    }
    let a = g.allocate(G).unwrap();
    assert_eq!(
        g.driver_memory().unwrap().free,
        Some(16 * G),
        "the bogus reading now leaks through"
    );
    assert!(
        g.graph_capture().is_err(),
        "what the device cannot do stays impossible"
    );
    g.free(a).unwrap();
    let r = gpu("rx7900xtx-rocm5.4,declare-exact");
    assert_eq!(
        r.graph_pool_memory().unwrap().used,
        Some(0),
        "the stub's 0 leaks through"
    );
}

#[test]
fn stale_lag_keeps_absent_readings_absent() {
    let g = gpu("arc-b580-nosysman,stale-free,declare-exact");
    g.synchronize().unwrap();
    g.synchronize().unwrap();
    assert_eq!(g.raw_driver_memory().free, None, "never a substituted 0");
    assert_eq!(g.driver_memory().unwrap().free, None);
}

#[test]
fn absurd_outside_memory_reads_as_a_full_device() {
    // `other=` and `graphics=` are user input: a figure beyond the device is a full device,
    // not an arithmetic overflow.
    let g = gpu("rtx4090,other=18446744073709551615,graphics=18446744073709551615");
    assert_eq!(free_after_sync(&g), Some(0));
    assert_eq!(g.truth().free, 0);
    assert!(matches!(
        g.allocate(M),
        Err(memplan_core::Error::OutOfMemory { .. })
    ));
}
