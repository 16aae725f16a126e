//! Virtual memory, the clock, the backend and its registration, selectors.

use memplan_core::protocol::snapshot;
use memplan_core::{Backend, BackendKind, Error, OwnAccounting};

use super::{free_after_sync, gpu, G, M};
use crate::{profiles, SimBackend, SimGpu};

#[test]
fn vmm_reserve_is_free_and_map_takes_memory() {
    let g = gpu("h100-80gb");
    let before = free_after_sync(&g).unwrap();
    let vm = g.virtual_memory().unwrap();
    assert_eq!(vm.granularity().unwrap(), 2 * M);
    let range = vm.reserve(100 * G).unwrap();
    let m1 = vm.map(&range, 0, 10 * G).unwrap();
    assert!(vm.map(&range, 10 * G - 2 * M, 4 * M).is_err(), "overlap");
    assert!(vm.map(&range, 3 * M, 2 * M).is_err(), "unaligned offset");
    assert!(vm.map(&range, 98 * G, 4 * G).is_err(), "past the end");
    assert!(
        matches!(
            vm.map(&range, 10 * G, 70 * G),
            Err(Error::OutOfMemory { .. })
        ),
        "80 GB card"
    );
    assert_eq!(
        free_after_sync(&g),
        Some(before - 10 * G),
        "reservation costs nothing"
    );
    let vm = g.virtual_memory().unwrap();
    let range = vm.release(range).expect_err("still mapped").handle;
    vm.unmap(m1).unwrap();
    vm.release(range).unwrap();
    assert_eq!(free_after_sync(&g), Some(before));
    assert!(
        gpu("rx7900xtx-rocm5.4").virtual_memory().is_err(),
        "unsupported on that profile"
    );
}

#[test]
fn scheduled_changes_apply_at_their_tick() {
    let g = gpu("rtx4090");
    let f0 = free_after_sync(&g).unwrap(); // tick 1
    g.schedule_other_processes(3, 2 * G);
    g.schedule_other_processes(5, G);
    assert_eq!(free_after_sync(&g), Some(f0)); // tick 2
    assert_eq!(free_after_sync(&g), Some(f0 - 2 * G)); // tick 3
    assert_eq!(free_after_sync(&g), Some(f0 - 2 * G)); // tick 4
    assert_eq!(free_after_sync(&g), Some(f0 - G)); // tick 5
    assert_eq!(g.tick(), 5);
    assert_eq!(g.truth().other_processes, G);
}

#[test]
fn snapshot_reads_every_layer() {
    let g = gpu("rtx4090");
    let a = g.allocator();
    let _b = a.malloc(100 * M).unwrap();
    let info = snapshot(&g.dev, Some(&a)).unwrap();
    assert_eq!(info.allocator.reserved, Some(100 * M));
    assert_eq!(info.non_allocator(), Some((400 * M) as i64), "the context");
    assert_eq!(info.graph_pool.used, Some(0));
    let x = gpu("arc-b580-nosysman");
    let info = snapshot(&x.dev, Some(&OwnAccounting::default())).unwrap();
    assert_eq!(info.driver.free, None);
    assert_eq!(info.graph_pool.used, None);
}

#[test]
fn clones_share_one_device() {
    let g = gpu("rtx4090");
    let h = g.clone();
    let _b = g.allocator().malloc(G).unwrap();
    assert_eq!(h.allocator_reserved_for_test(), G);
    h.synchronize().unwrap();
    assert_eq!(g.tick(), 1);
}

impl SimGpu {
    fn allocator_reserved_for_test(&self) -> u64 {
        self.truth().allocator_reserved
    }
}

#[test]
fn backend_lists_every_profile_and_registers() {
    let b = SimBackend;
    let devices = b.devices().unwrap();
    assert_eq!(devices.len(), profiles().len());
    let d = devices
        .iter()
        .find(|d| d.id.to_string() == "sim:rtx4090")
        .unwrap();
    assert_eq!(d.total_bytes, Some(24_564 * M));
    let apu = devices
        .iter()
        .find(|d| d.id.selector == "strix-halo")
        .unwrap();
    assert_eq!(
        apu.total_bytes,
        Some(64 * G),
        "bounded by the host, not the aperture"
    );
    // Registered only with `register` (the facade's `sim` feature), like every backend.
    assert_eq!(
        memplan_core::registry::registered()
            .iter()
            .any(|r| r.kind == BackendKind::Sim),
        cfg!(feature = "register")
    );
    let dev = b.open("H100-80GB,other=1GiB").unwrap();
    assert_eq!(dev.descriptor().id.to_string(), "sim:h100-80gb,other=1gib");
}

#[test]
fn unknown_profile_names_the_available_ones() {
    let e = SimGpu::open("rtx9090").unwrap_err();
    assert!(matches!(e, Error::UnknownDevice { .. }));
    let s = e.to_string();
    assert!(
        s.contains("sim:rtx9090") && s.contains("rtx4090") && s.contains("arc-b580-nosysman"),
        "{s}"
    );
    assert!(SimGpu::open("rtx4090,frobnicate").is_err());
}

#[test]
fn deterministic() {
    let run = || {
        let g = gpu("mi300x");
        let a = g.allocator();
        let x = a.malloc(3 * G + 17).unwrap();
        a.begin_graph_capture().unwrap();
        let id = a
            .end_graph_capture(&crate::GraphSpec {
                kernel_nodes: 33,
                intermediate_bytes: 77 * M,
                alloc_node_bytes: 5 * M,
            })
            .unwrap();
        a.free(x).unwrap();
        a.destroy_graph(id).unwrap();
        g.synchronize().unwrap();
        (
            g.truth(),
            g.driver_memory().unwrap(),
            g.graph_pool_memory().unwrap(),
        )
    };
    assert_eq!(run(), run());
}

#[test]
fn the_same_selector_opened_twice_is_one_gpu_while_someone_holds_it() {
    use memplan_core::Backend;
    let sel = "rtx4090,other=3gib,registry-test";
    // An unknown modifier is refused like any selector.
    assert!(SimBackend.open(sel).is_err());
    let sel = "h100-80gb,other=3GiB";
    let a = SimBackend.open(sel).unwrap();
    let b = SimBackend.open(&sel.to_ascii_uppercase()).unwrap();
    let x = a.allocate(1 << 30).unwrap();
    assert_eq!(
        a.driver_memory().unwrap().free,
        b.driver_memory().unwrap().free,
        "one GPU: the second handle sees the first one's allocation"
    );
    // Another selector is another GPU; a private open is never shared.
    let c = SimBackend.open("h100-80gb").unwrap();
    let d = SimGpu::open(sel).unwrap().device();
    assert_ne!(
        c.driver_memory().unwrap().free,
        a.driver_memory().unwrap().free
    );
    assert_ne!(
        d.driver_memory().unwrap().free,
        a.driver_memory().unwrap().free
    );
    let with_x = a.driver_memory().unwrap().free.unwrap();
    // Nobody holds it any more (the allocation is left live): the next open is a fresh GPU.
    drop((a, b, x));
    let e = SimBackend.open(sel).unwrap();
    assert!(e.driver_memory().unwrap().free.unwrap() > with_x);
}
