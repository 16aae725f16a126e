//! The whole backend against a fake Level Zero loader (`tests/fake/fake_ze.c`, compiled here
//! against the real headers with `cc`): initialisation, enumeration, Sysman via `zesInit` and
//! UUID matching (or `ZES_ENABLE_SYSMAN` when the environment has it), the snapshot cache, raw
//! allocations, virtual memory and teardown, plus each trap as its own scenario. Skipped, with
//! a message, only when the Level Zero headers or a C compiler are absent (CI has both).

use std::path::{Path, PathBuf};
use std::process::Command;

use memplan_backend_xpu::{sysman, XpuBackend};
use memplan_core::bytes::{GIB, MIB};
use memplan_core::{protocol, Backend, Device, Error, OwnAccounting, Reading, Reliability};

/// Build the fake loader with `defines`; `None` (test skipped) without headers or `cc`.
fn fake(scenario: &str, defines: &[&str]) -> Option<PathBuf> {
    if !Path::new("/usr/include/level_zero/zes_api.h").is_file() {
        eprintln!("SKIPPED: /usr/include/level_zero/zes_api.h absent (install libze-dev)");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake/fake_ze.c");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-xpu-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let out = dir.join(format!("libfake_ze_{scenario}.so"));
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src);
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    match cmd.output() {
        Ok(o) if o.status.success() => Some(out),
        Ok(o) => panic!(
            "fake loader did not build:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            eprintln!("SKIPPED: no C compiler ({e})");
            None
        }
    }
}

/// Call one of the fake's `int fake_*(void)` counters.
fn counter(lib: &Path, name: &str) -> i32 {
    // SAFETY: the fake loader is our own C file; loading it runs no initialisers.
    let l = unsafe { libloading::Library::new(lib) }.expect("fake loader loads");
    // SAFETY: the fake defines `int name(void)`.
    let f =
        unsafe { l.get::<unsafe extern "C" fn() -> i32>(name.as_bytes()) }.expect("counter symbol");
    // SAFETY: a plain C function without arguments.
    unsafe { f() }
}

fn open(lib: &Path) -> Device {
    XpuBackend::with_library(lib.to_string_lossy())
        .open("0")
        .expect("fake device opens")
}

#[test]
fn discrete_device_end_to_end() {
    let Some(lib) = fake("discrete", &[]) else {
        return;
    };
    let b = XpuBackend::with_library(lib.to_string_lossy());
    let devs = b.devices().expect("fake enumerates");
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert_eq!(
        (d.id.to_string().as_str(), d.name.as_str(), d.total_bytes),
        ("xpu:0", "Fake Intel Data Center GPU", Some(16 * GIB))
    );
    let prop = |k: &str| {
        d.properties
            .iter()
            .find(|(p, _)| p == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(prop("uuid"), "a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
    assert_eq!(
        (
            prop("kind").as_str(),
            prop("vendor_id").as_str(),
            prop("api_version").as_str()
        ),
        ("discrete", "0x8086", "1.4")
    );
    assert!(prop("sysman").contains(if sysman::env_enabled() {
        "ZES_ENABLE_SYSMAN"
    } else {
        "matched by UUID"
    }));
    assert!(matches!(
        b.open("1").err(),
        Some(Error::UnknownDevice { .. })
    ));

    let dev = b.open("0").expect("opens");
    let caps = dev.capabilities().clone();
    assert!(caps.reading(Reading::DriverFree).is_exact(), "{caps}");
    assert!(caps.facts.virtual_memory.is_supported() && !caps.facts.graph_capture.is_supported());
    assert!(matches!(
        dev.graph_capture().err(),
        Some(Error::Unsupported { .. })
    ));

    // One Sysman read per snapshot: repeated reads hit the cache until a synchronize.
    let calls = counter(&lib, "fake_state_calls");
    let m = dev.driver_memory().expect("reads");
    assert_eq!((m.total, m.free), (Some(16 * GIB), Some(15 * GIB)));
    dev.driver_memory().expect("reads");
    let after_two = counter(&lib, "fake_state_calls");
    assert_eq!(
        after_two, calls,
        "the reading taken at open is reused until a synchronize"
    );
    dev.synchronize().expect("sync");
    dev.driver_memory().expect("reads");
    assert_eq!(counter(&lib, "fake_state_calls"), after_two + 1);

    // Raw allocations move free memory, seen through a snapshot.
    let mut own = OwnAccounting::default();
    let before = protocol::snapshot(&dev, Some(&own)).expect("snapshot");
    let a = dev.allocate(GIB).expect("allocates");
    own.add(GIB);
    let after = protocol::snapshot(&dev, Some(&own)).expect("snapshot");
    let w = after - before;
    assert_eq!(
        (w.driver_taken(), w.non_allocator),
        (Some(GIB as i64), Some(0))
    );
    assert_eq!(a.bytes(), GIB);
    dev.free(a).expect("frees");
    assert!(matches!(
        dev.allocate(64 * GIB).unwrap_err(),
        Error::OutOfMemory { .. }
    ));
    assert!(matches!(
        dev.allocate(0).unwrap_err(),
        Error::InvalidInput { .. }
    ));

    // Virtual memory: reserve, map (free drops), unmap, release.
    let vm = dev.virtual_memory().expect("vmm");
    let g = vm.granularity().expect("granularity");
    assert_eq!(g, 2 * MIB);
    let r = vm.reserve(8 * MIB).expect("reserve");
    assert!(matches!(
        vm.map(&r, MIB, 2 * MIB).unwrap_err(),
        Error::InvalidInput { .. }
    ));
    let map = vm.map(&r, 2 * MIB, 4 * MIB).expect("map");
    let f = vm.release(r).unwrap_err();
    assert!(matches!(f.error, Error::InvalidInput { .. }), "{f}");
    let r = f.handle;
    vm.unmap(map).expect("unmap");
    vm.release(r).expect("release");

    // A mapping and an allocation left behind are released with the context on drop.
    let vm = dev.virtual_memory().expect("vmm");
    let r = vm.reserve(4 * MIB).expect("reserve");
    let _m = vm.map(&r, 0, 2 * MIB).expect("map");
    let _a = dev.allocate(MIB).expect("allocates");
    drop(dev);
    assert_eq!(counter(&lib, "fake_live_contexts"), 0);
    let again = open(&lib);
    assert_eq!(
        again.driver_memory().expect("reads").free,
        Some(15 * GIB),
        "teardown returned everything"
    );
}

#[test]
fn free_equal_to_total_is_declared_suspect() {
    let Some(lib) = fake("free_eq_total", &["FREE_EQUALS_TOTAL"]) else {
        return;
    };
    let dev = open(&lib);
    match dev.capabilities().reading(Reading::DriverFree) {
        Reliability::Approximate {
            tolerance_bytes, ..
        } => assert_eq!(tolerance_bytes, 16 * GIB),
        other => panic!("expected approximate, got {other}"),
    }
    assert!(dev
        .capabilities()
        .notes
        .iter()
        .any(|n| n.starts_with("suspect")));
    let _a = dev.allocate(GIB).expect("allocates");
    assert_eq!(
        dev.driver_memory().expect("reads").free,
        Some(16 * GIB),
        "the reading hides usage"
    );
}

#[test]
fn integrated_gpu_has_no_free_reading() {
    let Some(lib) = fake("integrated", &["INTEGRATED"]) else {
        return;
    };
    let dev = open(&lib);
    let c = dev.capabilities().clone();
    assert!(c.facts.unified_memory);
    assert!(
        c.reading(Reading::DriverFree)
            .detail()
            .contains("integrated GPU"),
        "{c}"
    );
    let m = dev.driver_memory().expect("reads");
    assert_eq!((m.total, m.free), (Some(16 * GIB), None));
}

#[test]
fn loader_without_zes_init_needs_the_environment_variable() {
    let Some(lib) = fake("no_zes_init", &["NO_ZES_INIT"]) else {
        return;
    };
    let dev = open(&lib);
    let free = dev.capabilities().reading(Reading::DriverFree);
    if sysman::env_enabled() {
        assert!(free.is_exact(), "{free}");
        return;
    }
    assert!(
        free.detail().contains("ZES_ENABLE_SYSMAN=1") && free.detail().contains("no zesInit"),
        "{free}"
    );
    let m = dev.driver_memory().expect("reads");
    assert_eq!((m.total, m.free), (Some(16 * GIB), None));
}

#[test]
fn virtual_memory_unsupported_names_the_code() {
    let Some(lib) = fake("no_vmm", &["NO_VMM"]) else {
        return;
    };
    let dev = open(&lib);
    let e = dev.virtual_memory().err().expect("unsupported");
    assert!(
        e.to_string()
            .contains("ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"),
        "{e}"
    );
}

#[test]
fn missing_required_symbol_is_named() {
    let Some(lib) = fake("no_mem_free", &["NO_MEM_FREE"]) else {
        return;
    };
    let e = XpuBackend::with_library(lib.to_string_lossy())
        .devices()
        .unwrap_err();
    assert!(
        matches!(&e, Error::MissingSymbol { symbol, .. } if symbol == "zeMemFree"),
        "{e}"
    );
}
