//! The lies of the `broken-*` profiles and their quirks, and the world shared with other
//! processes: what the conformance suite must catch, shown on the raw readings.

use super::*;
use crate::world::World;

#[test]
fn byte_quirks_parse_and_show() {
    let g = SimGpu::open("rtx4090,leak-per-free=2MiB,total-over=8GiB,free-step=64MiB").unwrap();
    let q = g.quirks();
    assert_eq!(
        (q.leak_per_free, q.total_over, q.free_step),
        (2 * M, 8 * G, 64 * M)
    );
    let active = q.active().join(" ");
    assert!(
        active.contains("leak-per-free=2MiB") && active.contains("total-over=8192MiB"),
        "{active}"
    );
    let e = SimGpu::open("rtx4090,leak-per-free=lots")
        .unwrap_err()
        .to_string();
    assert!(e.contains("leak-per-free"), "{e}");
}

#[test]
fn a_leaky_free_keeps_memory_the_books_do_not_show() {
    let g = gpu("broken-leaky-free");
    let before = g.truth().this_process();
    let a = g.allocate(67 * M).unwrap();
    g.free(a).unwrap();
    let t = g.truth();
    assert_eq!((t.raw_allocations, t.leaked), (0, 2 * M));
    assert_eq!(t.this_process(), before + 2 * M);
    // Virtual memory: destroy_physical leaks on its own profile.
    let g = gpu("broken-leaky-vm");
    let vm = g.virtual_memory().unwrap();
    let r = vm.reserve(4 * M).unwrap();
    let m = vm.map(&r, 0, 4 * M).unwrap();
    vm.unmap(m).unwrap();
    vm.release(r).unwrap();
    assert_eq!(g.truth().leaked, 2 * M);
}

#[test]
fn a_wrong_total_is_in_every_source() {
    let g = gpu("broken-total-high");
    let t = total("broken-total-high");
    assert_eq!(g.driver_memory().unwrap().total, Some(t + 8 * G));
    assert_eq!(g.dev.descriptor().total_bytes, Some(t + 8 * G));
    // Free is the device's own: the lie is in the total alone.
    assert_eq!(g.truth().free, free_after_sync(&g).unwrap());
    let g = gpu("broken-total-low");
    assert_eq!(g.driver_memory().unwrap().total, Some(t - 128 * M));
}

#[test]
fn a_stepped_free_reading_moves_in_steps() {
    let g = gpu("rtx4090,free-step=64MiB");
    let f = free_after_sync(&g).unwrap();
    assert_eq!(f % (64 * M), 0);
    let a = g.allocate(37 * M).unwrap();
    let drop = f - free_after_sync(&g).unwrap();
    assert!(drop == 0 || drop == 64 * M, "{drop}");
    g.free(a).unwrap();
}

#[test]
fn the_world_counts_other_live_processes_only() {
    let w = World::create().unwrap();
    let dir = w.dir().to_path_buf();
    // pid 1 runs on every Linux system; a pid above the kernel's maximum never does.
    std::fs::write(dir.join("1"), "1048576").unwrap();
    std::fs::write(dir.join("4294967"), "999999999").unwrap();
    std::fs::write(dir.join(std::process::id().to_string()), "5").unwrap();
    std::fs::write(dir.join("not-a-pid"), "7").unwrap();
    let expect = if std::path::Path::new("/proc/self").exists() {
        M
    } else {
        M + 999_999_999
    };
    assert_eq!(w.others(), expect);
    w.publish(42);
    assert_eq!(
        std::fs::read_to_string(dir.join(std::process::id().to_string())).unwrap(),
        "42"
    );
    drop(w);
    assert!(!dir.exists(), "the owner removes its world");
}

#[test]
fn a_shared_selector_names_the_world_and_others_join_it() {
    let g = SimGpu::open("rtx4090,seed=4").unwrap();
    let sel = g.shared_selector().unwrap();
    let (own, dir) = sel.split_once(",world=").expect("world named");
    assert_eq!(own, "rtx4090,seed=4");
    // This process published what it holds (its context).
    let mine =
        std::fs::read_to_string(std::path::Path::new(dir).join(std::process::id().to_string()))
            .unwrap();
    assert_eq!(mine.parse::<u64>().unwrap(), g.truth().this_process());
    // The same selector again is the same world; a missing directory is refused.
    assert_eq!(g.shared_selector().unwrap(), sel);
    let e = SimGpu::open("rtx4090,world=/nonexistent/memplan-world")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a directory"), "{e}");
}
