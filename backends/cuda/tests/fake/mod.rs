//! Shared by the fake-driver tests: build `fake_cuda.c` as a library whose soname is
//! `libcuda.so.1` and load it by path before the backend looks for the driver. The dynamic
//! loader then answers the backend's (and cudarc's) `dlopen("libcuda.so.1")` with it, so the
//! real loading code runs against the fake. One flavour per test binary: the backend loads the
//! driver once per process.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Build and load the fake driver with these `-D` flags. `None` (with a note) when there is no
/// C compiler or the platform is not Linux; every test then checks nothing and says so.
pub fn load(flags: &[&str]) -> Option<&'static libloading::Library> {
    static LIB: OnceLock<Option<libloading::Library>> = OnceLock::new();
    LIB.get_or_init(|| build("fake_cuda.c", "libcuda.so.1", flags))
        .as_ref()
}

/// Build and load the fake nvrtc (soname `libnvrtc.so`, the first name cudarc tries).
#[allow(dead_code)] // only the nvrtc test binary uses it
pub fn load_nvrtc() -> Option<&'static libloading::Library> {
    static LIB: OnceLock<Option<libloading::Library>> = OnceLock::new();
    LIB.get_or_init(|| build("fake_nvrtc.c", "libnvrtc.so", &[]))
        .as_ref()
}

/// Build and load the fake NVML (soname `libnvidia-ml.so.1`).
#[allow(dead_code)] // only the NVML test binary uses it
pub fn load_nvml() -> Option<&'static libloading::Library> {
    static LIB: OnceLock<Option<libloading::Library>> = OnceLock::new();
    LIB.get_or_init(|| build("fake_nvml.c", "libnvidia-ml.so.1", &[]))
        .as_ref()
}

fn build(source: &str, soname: &str, flags: &[&str]) -> Option<libloading::Library> {
    if !cfg!(target_os = "linux") {
        eprintln!("SKIPPED: the fake libraries rely on Linux sonames");
        return None;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fake")
        .join(source);
    let tag: String = flags
        .concat()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{source}-{tag}-{}.so", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = match Command::new(&cc)
        .args(["-shared", "-fPIC", "-O0", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-Wl,-soname,{soname}"))
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: no C compiler ({cc}) to build {source}: {e}");
            return None;
        }
    };
    assert!(
        built.status.success(),
        "{source}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    // SAFETY: the fakes have no initialisers; they stay loaded for the whole test process.
    let lib = unsafe { libloading::Library::new(&out) }.expect("load the fake by path");
    let _ = std::fs::remove_file(&out);
    Some(lib)
}

/// A counter of the fake driver (`free`, `allocs`, `ctx_refs`, `graphs`, `execs`, `streams`,
/// `modules`, `handles`, `ranges`, `mappings`, `bad_unmaps`, `pool_reserved`).
#[allow(dead_code)] // not every test binary reads counters
pub fn state(lib: &libloading::Library, key: &str) -> i64 {
    counter(lib, b"fake_cuda_state", key)
}

/// Make the fake driver's next `call` (`cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemAlloc_v2` with the
/// unknown code 4242) fail, or every
/// `cuCtxSetCurrent` until `fail_next(lib, "none")`.
#[allow(dead_code)] // not every test binary injects failures
pub fn fail_next(lib: &libloading::Library, call: &str) {
    assert_eq!(counter(lib, b"fake_cuda_fail_next", call), 0, "{call}");
}

/// A counter of the fake NVML (`inits`).
#[allow(dead_code)] // only the NVML test binary uses it
pub fn nvml_state(lib: &libloading::Library, key: &str) -> i64 {
    counter(lib, b"fake_nvml_state", key)
}

/// A counter of the fake nvrtc (`programs`, `compiles`, `arch`).
#[allow(dead_code)] // only the nvrtc test binary uses it
pub fn nvrtc_state(lib: &libloading::Library, key: &str) -> i64 {
    counter(lib, b"fake_nvrtc_state", key)
}

#[allow(dead_code)]
fn counter(lib: &libloading::Library, symbol: &[u8], key: &str) -> i64 {
    type Counter = unsafe extern "C" fn(*const std::ffi::c_char) -> std::ffi::c_longlong;
    let key = std::ffi::CString::new(key).expect("key");
    // SAFETY: `fake_*_state(const char*) -> long long` in the fakes' C sources.
    unsafe {
        let f = lib.get::<Counter>(symbol).expect("counter symbol");
        f(key.as_ptr())
    }
}
