//! The whole backend (loading, enumeration, readings, raw allocations, graph capture, virtual
//! memory, teardown) against a fake HIP runtime compiled from `tests/fake_hip/fake_hip.c`: as
//! HIP 6.2 and as HIP 5.2, with fake sysfs/meminfo trees. It checks the FFI plumbing and the
//! version rules end to end without an AMD GPU; it cannot check what a real GPU does.
//!
//! Needs a C compiler (`cc`); without one the tests print why they checked nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use memplan_backend_rocm::{conv, sysfs::SysRoot, RocmBackend};
use memplan_core::bytes::{GIB, MIB};
use memplan_core::{Backend, CaptureWork, Device, Error, GraphRelease, Reading};

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("memplan-fakehip-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Build the fake runtime (HIP 5 or 6 flavour) into its own file, or `None` without `cc`.
fn fake(dir: &Path, hip5: bool) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_hip/fake_hip.c");
    let out = dir.join(if hip5 {
        "libfakehip5.so"
    } else {
        "libfakehip6.so"
    });
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-shared", "-fPIC", "-O0"])
        .arg(format!(
            "-DPROPS_R0000_GCN={}",
            conv::PROPS_R0000_GCN_ARCH_NAME
        ))
        .arg(format!(
            "-DPROPS_R0600_GCN={}",
            conv::PROPS_R0600_GCN_ARCH_NAME
        ));
    if hip5 {
        cmd.arg("-DFAKE_HIP5");
    }
    let built = match cmd.arg(&src).arg("-o").arg(&out).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: no C compiler to build the fake HIP runtime: {e}");
            return None;
        }
    };
    assert!(
        built.status.success(),
        "fake_hip.c: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    Some(out)
}

/// Set the fake's knobs (the library is the same handle the backend opens).
fn configure(
    lib: &Path,
    version: i32,
    apu: bool,
    vmm: bool,
    init_err: i32,
    others: u64,
    four_bytes: bool,
) {
    type F = unsafe extern "C" fn(i32, i32, i32, i32, u64, i32);
    // SAFETY: loading the fake runs no initialiser; the symbol has exactly this signature.
    unsafe {
        let l = libloading::Library::new(lib).expect("load fake");
        let f = l.get::<F>(b"fake_configure").expect("fake_configure");
        f(
            version,
            apu as i32,
            vmm as i32,
            init_err,
            others,
            four_bytes as i32,
        );
        std::mem::forget(l); // keep the globals alive for the backend's handle
    }
}

fn fake_u64(lib: &Path, name: &[u8]) -> u64 {
    // SAFETY: as in `configure`; the getters take nothing and return a u64.
    unsafe {
        let l = libloading::Library::new(lib).expect("load fake");
        let v = l
            .get::<unsafe extern "C" fn() -> u64>(name)
            .expect("getter")();
        std::mem::forget(l);
        v
    }
}

fn free(d: &Device) -> u64 {
    d.synchronize().expect("sync");
    d.driver_memory()
        .expect("driver memory")
        .free
        .expect("free is readable")
}

#[test]
fn hip6_device_readings_and_raw_allocations() {
    let s = Scratch::new("hip6");
    let Some(lib) = fake(&s.0, false) else { return };
    configure(&lib, 60_240_000, false, true, 0, 0, false);
    let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
    let devs = b.devices().expect("one device");
    assert_eq!(devs.len(), 1);
    let prop = |k: &str| {
        devs[0]
            .properties
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(devs[0].name, "Fake Radeon");
    assert_eq!(devs[0].total_bytes, Some(24 * GIB));
    assert_eq!(
        prop("arch").as_deref(),
        Some("gfx942:sramecc+:xnack-"),
        "R0600 layout preferred"
    );
    assert_eq!(prop("runtime").as_deref(), Some("HIP 6.2.40000"));
    assert_eq!(prop("pci").as_deref(), Some("0000:03:00.0"));
    assert_eq!(prop("drm"), None);

    let d = b.open("0").expect("open");
    let caps = d.capabilities().clone();
    assert_eq!(caps.reading(Reading::DriverFree).label(), "approximate");
    assert_eq!(caps.facts.graph_release, GraphRelease::AtNextSync);
    assert!(caps.facts.virtual_memory.is_supported());
    let before = free(&d);
    let a = d.allocate(GIB).expect("1 GiB");
    assert_eq!(
        before - free(&d),
        GIB,
        "a raw allocation shows up exactly in free"
    );
    d.free(a).expect("free");
    assert_eq!(free(&d), before);
    let e = d.allocate(100 * GIB).expect_err("larger than the device");
    assert!(
        matches!(e, Error::OutOfMemory { requested, .. } if requested == 100 * GIB),
        "{e}"
    );
    assert!(b.open("1").is_err() && b.open("x").is_err());
}

#[test]
fn hip6_graph_capture_lifecycle_and_pool() {
    for four_bytes in [false, true] {
        let s = Scratch::new("graph");
        let Some(lib) = fake(&s.0, false) else { return };
        configure(&lib, 60_240_000, false, true, 0, 0, four_bytes);
        let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
        let d = b.open("0").expect("open");
        {
            // Abort leaves the device usable; the first begin also creates the stream and the
            // scratch buffer, which stay until the device is dropped.
            let c = d.graph_capture().expect("capture supported");
            assert!(matches!(
                c.record(&CaptureWork::new(1)),
                Err(Error::InvalidState { .. })
            ));
            c.begin_capture().expect("begin");
            c.abort_capture().expect("abort");
        }
        let base = free(&d);
        let g = {
            let c = d.graph_capture().expect("capture supported");
            c.begin_capture().expect("begin");
            c.record(&CaptureWork::new(10).with_alloc_node(256 * MIB))
                .expect("record");
            let g = c.end_capture().expect("end");
            c.replay(g).expect("replay");
            g
        };
        let pool = d.graph_pool_memory().expect("pool");
        assert_eq!(
            pool.reserved,
            Some(256 * MIB),
            "4-byte writer: {four_bytes}"
        );
        assert_eq!(pool.used_high, Some(256 * MIB));
        // 11 nodes (10 + the memset touching the allocation) at 64 KiB, plus the pool.
        assert_eq!(base - free(&d), 11 * 64 * 1024 + 256 * MIB);
        let c = d.graph_capture().expect("capture");
        c.destroy(g).expect("destroy");
        assert!(c.destroy(g).is_err(), "a graph is destroyed once");
        c.release_pool().expect("trim");
        assert_eq!(free(&d), base, "everything returned after destroy + trim");
        let c = d.graph_capture().expect("capture");
        c.begin_capture().expect("begin again");
        let g2 = c.end_capture().expect("end");
        assert_ne!(g2, g);
        // An invalidated capture is the runtime's error, and its graph does not leak.
        // SAFETY: the fake's knob takes and returns nothing.
        unsafe {
            let l = libloading::Library::new(&lib).expect("load fake");
            l.get::<unsafe extern "C" fn()>(b"fake_invalidate_next_capture")
                .expect("knob")();
            std::mem::forget(l);
        }
        let c = d.graph_capture().expect("capture");
        c.begin_capture().expect("begin");
        let e = c.end_capture().expect_err("invalidated");
        assert!(
            matches!(&e, Error::DriverCall { code: 901, name, .. } if name == "hipErrorStreamCaptureInvalidated"),
            "{e}"
        );
        assert_eq!(fake_u64(&lib, b"fake_live_graphs"), 1, "only g2 is alive");
        // A failing hipGraphExecDestroy is reported, and the graph is destroyed all the same.
        // SAFETY: the fake's knob takes and returns nothing.
        unsafe {
            let l = libloading::Library::new(&lib).expect("load fake");
            l.get::<unsafe extern "C" fn()>(b"fake_fail_next_exec_destroy")
                .expect("knob")();
            std::mem::forget(l);
        }
        let c = d.graph_capture().expect("capture");
        c.begin_capture().expect("begin");
        let g3 = c.end_capture().expect("end");
        let e = c.destroy(g3).expect_err("exec destroy fails");
        assert!(
            matches!(&e, Error::DriverCall { call, .. } if call == "hipGraphExecDestroy"),
            "{e}"
        );
        assert_eq!(
            fake_u64(&lib, b"fake_live_graphs"),
            1,
            "the graph of g3 leaked"
        );
        drop(d); // teardown on drop destroys g2
        assert_eq!(fake_u64(&lib, b"fake_graph_exec_bytes\0"), 0);
        assert_eq!(fake_u64(&lib, b"fake_live_graphs"), 0);
    }
}

#[test]
fn hip6_virtual_memory() {
    let s = Scratch::new("vmm");
    let Some(lib) = fake(&s.0, false) else { return };
    configure(&lib, 60_240_000, false, true, 0, 0, false);
    let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
    let d = b.open("0").expect("open");
    let base = free(&d);
    let vm = d.virtual_memory().expect("vmm supported");
    assert_eq!(vm.granularity().expect("granularity"), 2 * MIB);
    assert!(
        matches!(vm.reserve(5 * MIB), Err(Error::InvalidInput { .. })),
        "not a granularity multiple"
    );
    let r = vm.reserve(6 * MIB).expect("reserve");
    assert_eq!(r.bytes(), 6 * MIB);
    assert!(matches!(
        vm.map(&r, MIB, 2 * MIB),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        vm.map(&r, 4 * MIB, 4 * MIB),
        Err(Error::InvalidInput { .. })
    ));
    let m = vm.map(&r, 2 * MIB, 4 * MIB).expect("map");
    assert_eq!(base - free(&d), 4 * MIB, "mapping takes physical memory");
    let vm = d.virtual_memory().expect("vmm");
    vm.unmap(m).expect("unmap");
    vm.release(r).expect("release");
    assert_eq!(free(&d), base);
}

#[test]
fn another_devices_handles_are_refused_and_drop_releases_everything() {
    let s = Scratch::new("teardown");
    let Some(lib) = fake(&s.0, false) else { return };
    configure(&lib, 60_240_000, false, true, 0, 0, false);
    let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
    let d = b.open("0").expect("open");
    let base = free(&d);
    let _a = d.allocate(GIB).expect("1 GiB");
    let other = b.open("0").expect("a second device on the same GPU");
    let theirs = other.allocate(MIB).expect("1 MiB");
    let f = d.free(theirs).expect_err("not this device's");
    assert!(matches!(f.error, Error::InvalidInput { .. }), "{f}");
    other.free(f.handle).expect("freed by its own device");
    assert!(matches!(d.allocate(0), Err(Error::InvalidInput { .. })));
    let vm = d.virtual_memory().expect("vmm");
    let r = vm.reserve(8 * MIB).expect("reserve");
    let m = vm.map(&r, 0, 4 * MIB).expect("map");
    let e = vm
        .map(&r, 2 * MIB, 4 * MIB)
        .expect_err("overlaps the live mapping");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    let ovm = other.virtual_memory().expect("vmm");
    let theirs = ovm.reserve(2 * MIB).expect("reserve");
    assert!(matches!(
        vm.map(&theirs, 0, 2 * MIB),
        Err(Error::InvalidInput { .. })
    ));
    let f = vm.release(theirs).expect_err("not this device's");
    ovm.release(f.handle).expect("released by its own device");
    drop(other);
    let f = vm
        .release(r)
        .expect_err("a range with a live mapping is not released");
    assert!(matches!(f.error, Error::InvalidInput { .. }), "{f}");
    let _ = m;
    assert_eq!(base - free(&d), GIB + 4 * MIB);
    drop(d);
    let d = b.open("0").expect("reopen");
    assert_eq!(free(&d), base, "drop left memory allocated");
    assert_eq!(fake_u64(&lib, b"fake_live_maps"), 0, "drop left a mapping");
    assert_eq!(
        fake_u64(&lib, b"fake_live_ranges"),
        0,
        "drop left a reservation"
    );
}

#[test]
fn hip5_runtime_is_process_local_and_lacks_newer_functions() {
    let s = Scratch::new("hip5");
    let Some(lib) = fake(&s.0, true) else { return };
    configure(&lib, 50_221_153, false, true, 0, 0, false);
    let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
    let devs = b.devices().expect("device");
    assert!(
        devs[0]
            .properties
            .contains(&("arch".into(), "gfx1030".into())),
        "R0000 layout"
    );
    let d = b.open("0").expect("open");
    let caps = d.capabilities().clone();
    assert_eq!(caps.reading(Reading::DriverFree).label(), "process-local");
    assert_eq!(caps.reading(Reading::GraphPool).label(), "unavailable");
    assert!(!caps.facts.virtual_memory.is_supported());
    assert_eq!(
        d.graph_pool_memory().expect("pool"),
        Default::default(),
        "absent, not 0"
    );
    assert!(matches!(
        d.virtual_memory().err(),
        Some(Error::Unsupported { .. })
    ));
    let c = d.graph_capture().expect("capture exists on 5.2");
    c.begin_capture().expect("begin");
    let e = c
        .record(&CaptureWork::new(1).with_alloc_node(MIB))
        .expect_err("no hipMallocAsync");
    assert!(e.to_string().contains("hipMallocAsync"), "{e}");
    c.abort_capture().expect("abort");
    c.release_pool().expect("no pool to release on 5.2");
}

#[test]
fn init_failure_is_the_runtimes_own_error() {
    let s = Scratch::new("init");
    let Some(lib) = fake(&s.0, false) else { return };
    configure(&lib, 60_240_000, false, true, 100, 0, false);
    let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
    let e = b.devices().expect_err("hipInit fails").to_string();
    assert!(
        e.contains("hipInit (")
            && e.contains("HIP 6.2.40000")
            && e.ends_with("failed: hipErrorNoDevice (100)"),
        "{e}"
    );
    assert!(b.open("0").is_err());
}

#[test]
fn drm_counters_and_apu_host_bound() {
    let s = Scratch::new("drm");
    let Some(lib) = fake(&s.0, false) else { return };
    let card = "root/sys/class/drm/card0/device";
    s.write(&format!("{card}/uevent"), "PCI_SLOT_NAME=0000:03:00.0\n");
    s.write(
        &format!("{card}/mem_info_vram_total"),
        &format!("{}\n", 24 * GIB),
    );
    // A compositor holds 600 MiB that HIP does not count.
    s.write(
        &format!("{card}/mem_info_vram_used"),
        &format!("{}\n", 600 * MIB),
    );
    configure(&lib, 60_240_000, false, true, 0, 0, false);
    let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
    let d = b.open("0").expect("open");
    assert!(d
        .descriptor()
        .properties
        .contains(&("drm".into(), "card0".into())));
    assert_eq!(free(&d), 24 * GIB - 600 * MIB, "the smaller of HIP and DRM");
    drop(d);

    // The same device as an APU with GTT and a host that has 6 GiB available.
    s.write(
        &format!("{card}/mem_info_gtt_total"),
        &format!("{}\n", 32 * GIB),
    );
    s.write(&format!("{card}/mem_info_gtt_used"), &format!("{}\n", GIB));
    s.write(
        "root/proc/meminfo",
        "MemTotal: 67108864 kB\nMemAvailable: 6291456 kB\n",
    );
    configure(&lib, 60_240_000, true, true, 0, 0, false);
    let b = RocmBackend::with(lib.to_string_lossy(), SysRoot::at(s.0.join("root")));
    let d = b.open("0").expect("open");
    assert!(d.capabilities().facts.unified_memory);
    let m = d.driver_memory().expect("memory");
    assert_eq!(
        m.free,
        Some(24 * GIB - 600 * MIB + 6 * GIB),
        "VRAM free + GTT bounded by MemAvailable"
    );
    assert_eq!(m.total, Some(56 * GIB));
}
