//! One test per quirk, each showing the raw readings it produces next to the truth.

use memplan_core::{CaptureWork, Device, Reading, Reliability};

use super::{free_after_sync, gpu, total, G, M};
use crate::{GraphSpec, Quirks, SimGpu, EXEC_BYTES_PER_KERNEL_NODE};

#[test]
fn well_behaved_cuda_free_is_device_wide() {
    let mut g = gpu("rtx4090");
    g.set_other_processes(2 * G);
    g.set_graphics_bytes(G);
    let free = free_after_sync(&mut g).unwrap();
    assert_eq!(free, total("rtx4090") - 400 * M - 3 * G);
    assert_eq!(free, g.truth().free);
}

#[test]
fn free_process_local_ignores_other_processes_and_graphics() {
    let mut g = gpu("rx7900xtx-rocm5.4");
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
        free_after_sync(&mut g),
        raw.free,
        "process-local is sourced, not masked"
    );
}

#[test]
fn free_blind_to_graphics_sees_others_but_not_drm() {
    let mut g = gpu("rx7900xtx-rocm6.2");
    g.set_other_processes(2 * G);
    g.set_graphics_bytes(G);
    let free = free_after_sync(&mut g).unwrap();
    assert_eq!(
        free,
        g.truth().free + G,
        "graphics allocations are invisible"
    );
    assert_eq!(free, total("rx7900xtx-rocm6.2") - 300 * M - 2 * G);
}

#[test]
fn apu_reports_the_aperture_not_the_usable_pool() {
    let mut g = gpu("strix-halo");
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
        (None, None),
        "declared unavailable, so absent"
    );
    assert!(g.capabilities().facts.unified_memory);
    g.free(a).unwrap();
}

#[test]
fn deferred_graph_release_returns_memory_at_next_sync() {
    let mut g = gpu("rx7900xtx-rocm6.2,hidden-bytes-per-capture=0");
    let before = free_after_sync(&mut g).unwrap();
    let cap = g.graph_capture().unwrap();
    cap.begin_capture().unwrap();
    cap.record(&CaptureWork {
        kernel_nodes: 100,
        alloc_node_bytes: 0,
    })
    .unwrap();
    let id = cap.end_capture().unwrap();
    cap.destroy(id).unwrap();
    let exec = 100 * EXEC_BYTES_PER_KERNEL_NODE;
    assert_eq!(
        g.raw_driver_memory().free,
        Some(before - exec),
        "destroyed but not yet released"
    );
    assert_eq!(g.truth().pending_release, exec);
    assert_eq!(
        free_after_sync(&mut g),
        Some(before),
        "released at the synchronize"
    );
    assert_eq!(g.truth().pending_release, 0);
}

#[test]
fn immediate_release_without_the_quirk() {
    let mut g = gpu("h100-80gb");
    let before = free_after_sync(&mut g).unwrap();
    let cap = g.graph_capture().unwrap();
    cap.begin_capture().unwrap();
    cap.record(&CaptureWork {
        kernel_nodes: 100,
        alloc_node_bytes: 0,
    })
    .unwrap();
    let id = cap.end_capture().unwrap();
    cap.destroy(id).unwrap();
    assert_eq!(g.raw_driver_memory().free, Some(before));
}

#[test]
fn hidden_bytes_per_capture_are_kept_by_the_runtime() {
    let mut g = gpu("rx7900xtx-rocm6.2");
    let before = free_after_sync(&mut g).unwrap();
    for _ in 0..3 {
        let cap = g.graph_capture().unwrap();
        cap.begin_capture().unwrap();
        let id = cap.end_capture().unwrap();
        cap.destroy(id).unwrap();
        cap.release_pool().unwrap();
    }
    assert_eq!(
        free_after_sync(&mut g),
        Some(before - 12 * M),
        "4 MiB per capture never comes back"
    );
    assert_eq!(g.truth().hidden_capture, 12 * M);
}

#[test]
fn graph_pool_attrs_stuck_at_zero() {
    let mut g = gpu("rx7900xtx-rocm5.4");
    let cap = g.graph_capture().unwrap();
    cap.begin_capture().unwrap();
    cap.record(&CaptureWork {
        kernel_nodes: 1,
        alloc_node_bytes: 64 * M,
    })
    .unwrap();
    let _id = cap.end_capture().unwrap();
    let raw = g.raw_graph_pool_memory();
    assert_eq!(
        (raw.used, raw.reserved, raw.used_high),
        (Some(0), Some(0), Some(0)),
        "the stub"
    );
    assert_eq!(
        g.truth().graph_pool_reserved,
        64 * M,
        "while 64 MiB are really in the pool"
    );
    assert_eq!(
        g.graph_pool_memory().unwrap().used,
        None,
        "declared unavailable, so absent"
    );
    // The same work on CUDA shows up.
    let mut c = gpu("rtx4090");
    let cap = c.graph_capture().unwrap();
    cap.begin_capture().unwrap();
    cap.record(&CaptureWork {
        kernel_nodes: 1,
        alloc_node_bytes: 64 * M,
    })
    .unwrap();
    let id = cap.end_capture().unwrap();
    assert_eq!(c.graph_pool_memory().unwrap().used, Some(64 * M));
    let cap = c.graph_capture().unwrap();
    cap.destroy(id).unwrap();
    assert_eq!(
        c.graph_pool_memory().unwrap().reserved,
        Some(64 * M),
        "kept until trimmed"
    );
    c.graph_capture().unwrap().release_pool().unwrap();
    let gp = c.graph_pool_memory().unwrap();
    assert_eq!(
        (gp.used, gp.reserved, gp.reserved_high),
        (Some(0), Some(0), Some(64 * M))
    );
}

#[test]
fn level_zero_has_no_graph_pool_query() {
    let g = gpu("max1550");
    let raw = g.raw_graph_pool_memory();
    assert_eq!((raw.used, raw.reserved), (None, None));
}

#[test]
fn sysman_missing_gives_absent_free_never_zero() {
    let mut g = gpu("arc-b580-nosysman");
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
    let mut g = gpu("arc-a770");
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
        None,
        "declared unavailable, so absent"
    );
    g.free(a).unwrap();
}

#[test]
fn stale_free_lags_one_synchronize() {
    let mut g = gpu("broken-stale");
    assert!(
        g.capabilities().reading(Reading::DriverFree).is_exact(),
        "declares exact: broken on purpose"
    );
    let f0 = free_after_sync(&mut g).unwrap();
    let a = g.allocate(G).unwrap();
    assert_eq!(
        free_after_sync(&mut g),
        Some(f0),
        "the allocation is not visible yet"
    );
    assert_eq!(
        free_after_sync(&mut g),
        Some(f0 - G),
        "one synchronize later"
    );
    g.free(a).unwrap();
    assert_eq!(free_after_sync(&mut g), Some(f0 - G));
    assert_eq!(free_after_sync(&mut g), Some(f0));
}

#[test]
fn capture_empties_cache_reproduces_the_negative_window() {
    for flush in [true, false] {
        let q = Quirks {
            capture_empties_cache: flush,
            ..crate::profile("rtx4090").unwrap().quirks
        };
        let mut g = SimGpu::with_quirks(crate::profile("rtx4090").unwrap(), q);
        let alloc = g.allocator();
        let b = alloc.malloc(30 * M).unwrap();
        alloc.free(b).unwrap(); // 30 MiB stay cached
        let baseline = free_after_sync(&mut g).unwrap();
        alloc.begin_graph_capture().unwrap();
        let id = alloc
            .end_graph_capture(&GraphSpec {
                kernel_nodes: 64,
                ..GraphSpec::default()
            })
            .unwrap();
        let after = free_after_sync(&mut g).unwrap();
        let taken = baseline as i64 - after as i64;
        if flush {
            assert_eq!(
                taken,
                (4 * M) as i64 - (30 * M) as i64,
                "the flush hides the graph: -26 MiB"
            );
        } else {
            assert_eq!(taken, (4 * M) as i64, "64 nodes * 64 KiB");
        }
        alloc.destroy_graph(id).unwrap();
    }
}

#[test]
fn declare_exact_keeps_the_quirks() {
    let mut g = gpu("arc-a770,declare-exact");
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
    let mut r = gpu("rx7900xtx-rocm5.4,declare-exact");
    assert_eq!(
        r.graph_pool_memory().unwrap().used,
        Some(0),
        "the stub's 0 leaks through"
    );
}

#[test]
fn stale_lag_keeps_absent_readings_absent() {
    let mut g = gpu("arc-b580-nosysman,stale-free,declare-exact");
    g.synchronize().unwrap();
    g.synchronize().unwrap();
    assert_eq!(g.raw_driver_memory().free, None, "never a substituted 0");
    assert_eq!(g.driver_memory().unwrap().free, None);
}
