//! Shared by the fake-driver tests: build `fake_cuda.c` as a library whose soname is
//! `libcuda.so.1` and load it by path before the backend looks for the driver. The dynamic
//! loader then answers the backend's (and cudarc's) `dlopen("libcuda.so.1")` with it, so the
//! real loading code runs against the fake. One flavour per test binary: the backend loads the
//! driver once per process.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Build and load the fake with these `-D` flags. `None` (with a note) when there is no C
/// compiler or the platform is not Linux; every test then checks nothing and says so.
pub fn load(flags: &[&str]) -> Option<&'static libloading::Library> {
    static LIB: OnceLock<Option<libloading::Library>> = OnceLock::new();
    LIB.get_or_init(|| {
        if !cfg!(target_os = "linux") {
            eprintln!("SKIPPED: the fake driver relies on Linux sonames");
            return None;
        }
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake/fake_cuda.c");
        let tag = if flags.is_empty() {
            "default".to_string()
        } else {
            flags.join("").replace('-', "")
        };
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("libfakecuda-{tag}-{}.so", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = match Command::new(&cc)
            .args([
                "-shared",
                "-fPIC",
                "-O0",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Wl,-soname,libcuda.so.1",
            ])
            .args(flags)
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                eprintln!("SKIPPED: no C compiler ({cc}) to build the fake driver: {e}");
                return None;
            }
        };
        assert!(
            built.status.success(),
            "fake_cuda.c: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        // SAFETY: the fake has no initialisers; it stays loaded for the whole test process.
        let lib = unsafe { libloading::Library::new(&out) }.expect("load the fake driver by path");
        let _ = std::fs::remove_file(&out);
        Some(lib)
    })
    .as_ref()
}

/// A counter of the fake (`free`, `allocs`, `ctx_refs`, `graphs`, `execs`, `streams`,
/// `modules`, `handles`, `ranges`, `mappings`, `pool_reserved`).
#[allow(dead_code)] // not every test binary reads counters
pub fn state(lib: &libloading::Library, key: &str) -> i64 {
    let key = std::ffi::CString::new(key).expect("key");
    // SAFETY: `fake_cuda_state(const char*) -> long long` in fake_cuda.c.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(*const std::ffi::c_char) -> std::ffi::c_longlong>(
                b"fake_cuda_state",
            )
            .expect("fake_cuda_state");
        f(key.as_ptr())
    }
}
