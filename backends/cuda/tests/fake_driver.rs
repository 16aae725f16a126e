//! The whole backend against the fake CUDA 12.4 driver of `tests/fake/fake_cuda.c`: loading,
//! enumeration, declared capability, readings, raw allocations, graph capture with allocation
//! nodes and pool trim, abort paths, virtual memory, and teardown on drop. It checks the FFI
//! plumbing, argument layouts and ordering without a GPU; what a real GPU does is the GPU
//! check's job (`docs/gpu-check.md`).

mod fake;

use std::sync::Mutex;

use memplan_backend_cuda::CudaBackend;
use memplan_core::{protocol::snapshot, Backend, CaptureWork, Device, Error, Reading};

const MIB: u64 = 1 << 20;
static SERIAL: Mutex<()> = Mutex::new(());

fn lib() -> Option<&'static libloading::Library> {
    fake::load(&[])
}

fn free(d: &Device) -> u64 {
    snapshot(d, None)
        .expect("snapshot")
        .driver
        .free
        .expect("free")
}

#[test]
fn enumerates_and_declares_from_facts() {
    let _s = SERIAL.lock();
    let Some(_) = lib() else { return };
    let devs = CudaBackend.devices().expect("devices");
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert_eq!(d.id.to_string(), "cuda:0");
    assert_eq!(d.name, "NVIDIA Fake GPU MIG 1g.24gb");
    assert_eq!(d.total_bytes, Some(24 << 30));
    let prop = |k: &str| {
        d.properties
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(prop("compute_capability").as_deref(), Some("8.9"));
    assert_eq!(prop("driver_version").as_deref(), Some("12.4"));
    assert_eq!(prop("driver_library").as_deref(), Some("libcuda.so.1"));
    assert_eq!(prop("pci_bus_id").as_deref(), Some("00000000:41:00.0"));
    assert_eq!(
        prop("uuid").as_deref(),
        Some("MIG-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf")
    );
    assert_eq!(prop("mig_profile").as_deref(), Some("1g.24gb"));

    let dev = CudaBackend.open("0").expect("open");
    let c = dev.capabilities();
    for r in Reading::ALL {
        assert!(c.reading(r).is_exact(), "{r:?}: {c}");
    }
    assert!(
        c.facts.graph_capture.is_supported() && c.facts.virtual_memory.is_supported(),
        "{c}"
    );
    assert!(
        c.notes.iter().any(|n| n.contains("MIG instance 1g.24gb")),
        "{c}"
    );
    let e = CudaBackend.open("1").expect_err("one device only");
    assert!(
        matches!(e, Error::UnknownDevice { .. }) && e.to_string().contains("cuda:0"),
        "{e}"
    );
    assert!(matches!(
        CudaBackend.open("x"),
        Err(Error::UnknownDevice { .. })
    ));
}

#[test]
fn readings_and_raw_allocations() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    assert_eq!(
        fake::state(lib, "ctx_refs"),
        1,
        "open retains the primary context once"
    );
    let m = snapshot(&d, None).expect("snapshot");
    assert_eq!(m.driver.total, Some(24 << 30));
    assert_eq!(m.driver.free, Some(fake::state(lib, "free") as u64));
    assert_eq!(
        m.device.total, None,
        "no NVML for this device: no second reading of the total"
    );
    assert_eq!(
        (m.graph_pool.used, m.graph_pool.reserved),
        (Some(0), Some(0))
    );
    assert_eq!(
        m.allocator.reserved, None,
        "the allocator layer is not the backend's"
    );

    let before = free(&d);
    let a = d.allocate(256 * MIB).expect("allocate");
    assert_eq!(before - free(&d), 256 * MIB);
    let e = d.allocate(1 << 50).expect_err("too big");
    assert!(
        matches!(&e, Error::OutOfMemory { call, requested } if call == "cuMemAlloc_v2" && *requested == 1 << 50),
        "{e}"
    );
    assert!(matches!(d.allocate(0), Err(Error::InvalidInput { .. })));
    d.free(a).expect("free");
    assert_eq!(free(&d), before);

    let _kept = d.allocate(64 * MIB).expect("allocate");
    drop(d);
    assert_eq!(
        fake::state(lib, "allocs"),
        0,
        "drop frees what memplan allocated"
    );
    assert_eq!(
        fake::state(lib, "ctx_refs"),
        0,
        "drop releases the primary context"
    );
}

#[test]
fn graph_capture_measures_the_pool_and_tears_down() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    let base = snapshot(&d, None).expect("snapshot");
    let g = d.graph_capture().expect("capture");
    g.begin_capture().expect("begin");
    assert!(g.begin_capture().is_err(), "nested begin is refused");
    g.record(&CaptureWork::new(16).with_alloc_node(64 * MIB))
        .expect("record");
    let id = g.end_capture().expect("end");
    g.replay(id).expect("replay");
    let after = snapshot(&d, None).expect("snapshot");
    let w = after - base;
    assert_eq!(w.graph_pool_reserved, Some(64 * MIB as i64), "{w}");
    assert_eq!(after.graph_pool.used_high, Some(64 * MIB));
    // The fake charges 64 KiB per kernel node (+1) for the exec object, seen only as free drop.
    assert_eq!(
        w.driver_taken(),
        Some((64 * MIB + 17 * 64 * 1024) as i64),
        "{w}"
    );
    assert_eq!(
        fake::state(lib, "modules"),
        1,
        "the embedded PTX was loaded (no nvrtc here)"
    );

    let g = d.graph_capture().expect("capture");
    g.destroy(id).expect("destroy");
    assert!(matches!(g.destroy(id), Err(Error::InvalidInput { .. })));
    assert!(matches!(g.replay(id), Err(Error::InvalidInput { .. })));
    g.release_pool().expect("trim");
    let end = snapshot(&d, None).expect("snapshot");
    assert_eq!(end.graph_pool.reserved, Some(0));
    assert_eq!(end.driver.free, base.driver.free);

    // A graph left alive (its pool memory too) is destroyed, with the stream and module, and
    // the pool trimmed, when the device drops.
    let g = d.graph_capture().expect("capture");
    g.begin_capture().expect("begin");
    g.record(&CaptureWork::new(1).with_alloc_node(8 * MIB))
        .expect("record");
    let id = g.end_capture().expect("end");
    g.replay(id).expect("replay");
    assert_eq!(fake::state(lib, "pool_reserved"), 8 * MIB as i64);
    drop(d);
    for k in [
        "graphs",
        "execs",
        "streams",
        "modules",
        "ctx_refs",
        "pool_reserved",
    ] {
        assert_eq!(fake::state(lib, k), 0, "{k} left behind");
    }
}

#[test]
fn aborted_and_invalid_captures() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    let g = d.graph_capture().expect("capture");
    g.abort_capture().expect("no capture: no-op");
    assert!(matches!(
        g.record(&CaptureWork::new(1)),
        Err(Error::InvalidState { .. })
    ));
    assert!(matches!(g.end_capture(), Err(Error::InvalidState { .. })));
    g.begin_capture().expect("begin");
    g.record(&CaptureWork::new(3).with_alloc_node(3))
        .expect("record (n = 0 threads write)");
    g.abort_capture().expect("abort");
    assert_eq!(
        fake::state(lib, "graphs"),
        0,
        "the partial graph was destroyed"
    );
    g.begin_capture().expect("usable again");
    let id = g.end_capture().expect("empty graph");
    g.destroy(id).expect("destroy");
}

#[test]
fn virtual_memory_reserve_map_release() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    let before = free(&d);
    let vm = d.virtual_memory().expect("vmm");
    let g = vm.granularity().expect("granularity");
    assert_eq!(g, 2 * MIB);
    assert!(matches!(vm.reserve(g + 1), Err(Error::InvalidInput { .. })));
    let range = vm.reserve(16 * g).expect("reserve");
    assert!(matches!(
        vm.map(&range, 1, g),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        vm.map(&range, 16 * g, g),
        Err(Error::InvalidInput { .. })
    ));
    let m = vm.map(&range, 4 * g, 8 * g).expect("map");
    assert_eq!((m.offset(), m.bytes()), (4 * g, 8 * g));
    assert_eq!(before - free(&d), 8 * g);
    let vm = d.virtual_memory().expect("vmm");
    let range = vm
        .release(range)
        .expect_err("a range with a live mapping is not released")
        .handle;
    vm.unmap(m).expect("unmap");
    vm.release(range).expect("release");
    assert_eq!(free(&d), before);
    let vm = d.virtual_memory().expect("vmm");
    let r = vm.reserve(4 * g).expect("reserve");
    vm.map(&r, 0, 2 * g).expect("map");
    drop(d);
    for k in ["handles", "ranges", "mappings", "ctx_refs"] {
        assert_eq!(fake::state(lib, k), 0, "{k} left behind");
    }
}

#[test]
fn out_of_memory_in_a_mapping_is_typed() {
    let _s = SERIAL.lock();
    let Some(_) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    let vm = d.virtual_memory().expect("vmm");
    let g = vm.granularity().expect("granularity");
    let big = 16 * 1024 * g; // 32 GiB on a 24 GiB device
    let r = vm.reserve(big).expect("address space is cheap");
    let e = vm.map(&r, 0, big).expect_err("no physical memory for it");
    assert!(
        matches!(&e, Error::OutOfMemory { call, .. } if call == "cuMemCreate"),
        "{e}"
    );
    vm.release(r).expect("release");
}

#[test]
fn a_failed_mapping_undoes_only_its_own_work() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    let vm = d.virtual_memory().expect("vmm");
    let g = vm.granularity().expect("granularity");
    let r = vm.reserve(8 * g).expect("reserve");
    let m = vm.map(&r, 0, 2 * g).expect("map");
    // Mapping over a live mapping is refused before any driver call, and the live mapping stays.
    for (offset, bytes) in [(0, 2 * g), (g, 2 * g), (0, 8 * g)] {
        let e = vm
            .map(&r, offset, bytes)
            .expect_err("overlaps the live mapping");
        assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    }
    assert_eq!(
        fake::state(lib, "mappings"),
        1,
        "the live mapping was unmapped"
    );
    assert_eq!(fake::state(lib, "handles"), 1);
    // cuMemMap fails: the new handle is released and nothing is unmapped.
    fake::fail_next(lib, "cuMemMap");
    let e = vm.map(&r, 4 * g, 2 * g).expect_err("map fails");
    assert!(
        matches!(&e, Error::DriverCall { call, .. } if call == "cuMemMap"),
        "{e}"
    );
    assert_eq!(
        fake::state(lib, "bad_unmaps"),
        0,
        "unmapped what the failed map never mapped"
    );
    assert_eq!(
        fake::state(lib, "handles"),
        1,
        "the failed map's handle leaked"
    );
    // cuMemSetAccess fails: the map and the handle of that call are undone.
    fake::fail_next(lib, "cuMemSetAccess");
    let e = vm.map(&r, 4 * g, 2 * g).expect_err("set access fails");
    assert!(
        matches!(&e, Error::DriverCall { call, .. } if call == "cuMemSetAccess"),
        "{e}"
    );
    assert_eq!(
        (fake::state(lib, "mappings"), fake::state(lib, "handles")),
        (1, 1)
    );
    vm.map(&r, 4 * g, 2 * g).expect("the range is still usable");
    vm.unmap(m).expect("the first mapping is intact");
    drop(d);
    for k in ["handles", "ranges", "mappings", "ctx_refs", "bad_unmaps"] {
        assert_eq!(fake::state(lib, k), 0, "{k} left behind");
    }
}

#[test]
fn the_context_reference_is_released_even_when_the_context_cannot_be_bound() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    fake::fail_next(lib, "cuCtxSetCurrent");
    let e = CudaBackend.open("0").expect_err("binding fails");
    fake::fail_next(lib, "none");
    assert!(
        matches!(&e, Error::DriverCall { call, .. } if call == "cuCtxSetCurrent"),
        "{e}"
    );
    assert_eq!(
        fake::state(lib, "ctx_refs"),
        0,
        "a failed open kept its context reference"
    );
    let d = CudaBackend.open("0").expect("open");
    fake::fail_next(lib, "cuCtxSetCurrent");
    drop(d);
    fake::fail_next(lib, "none");
    assert_eq!(
        fake::state(lib, "ctx_refs"),
        0,
        "drop kept the context reference"
    );
}

#[test]
fn a_result_code_no_binding_knows_is_an_error_not_undefined_behaviour() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    fake::fail_next(lib, "cuMemAlloc_v2");
    let e = d.allocate(MIB).expect_err("the driver returns code 4242");
    assert!(
        matches!(&e, Error::DriverCall { call, code: 4242, name } if call == "cuMemAlloc_v2" && name == "unknown code 4242"),
        "{e:?}"
    );
    let a = d.allocate(MIB).expect("the next allocation works");
    d.free(a).expect("free");
}

#[test]
fn a_failed_unmap_keeps_the_mapping_and_gives_it_back() {
    let _s = SERIAL.lock();
    let Some(lib) = lib() else { return };
    let d = CudaBackend.open("0").expect("open");
    let vm = d.virtual_memory().expect("vmm");
    let g = vm.granularity().expect("granularity");
    let r = vm.reserve(4 * g).expect("reserve");
    let m = vm.map(&r, 0, 2 * g).expect("map");
    fake::fail_next(lib, "cuMemUnmap");
    let e = vm.unmap(m).expect_err("unmap fails");
    assert!(
        matches!(&e.error, Error::DriverCall { call, .. } if call == "cuMemUnmap"),
        "{e}"
    );
    assert_eq!(
        fake::state(lib, "handles"),
        1,
        "the handle is released only once unmapped"
    );
    let r = vm
        .release(r)
        .expect_err("the mapping is still tracked")
        .handle;
    vm.unmap(e.handle).expect("unmap again");
    vm.release(r).expect("release");
    drop(d);
    for k in ["handles", "ranges", "mappings", "ctx_refs", "bad_unmaps"] {
        assert_eq!(fake::state(lib, k), 0, "{k} left behind");
    }
}
