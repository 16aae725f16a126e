//! Loading the HIP runtime at run time, and its symbol table.
//!
//! The binary never links `libamdhip64`: [`Api::load`] opens it with libloading (trying the
//! soname variants of ROCm 5, 6 and 7, or the path in `MEMPLAN_HIP_LIBRARY`), resolves every
//! function once and keeps the library open for as long as any [`Api`] lives. Functions that
//! older runtimes lack (graph memory attributes before HIP 5.3, virtual memory, ...) are
//! `Option`s; the capability table says what their absence means.
//!
//! Every function returns its hipError_t as a plain `c_int`, and enum parameters are passed
//! as `c_int`: hip-runtime-sys's enums describe HIP 5.4 and must never receive a value from a
//! newer runtime.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::Arc;

use memplan_core::{Error, Result};

use crate::conv::{check, HipVersion};

/// Library names tried in order when `MEMPLAN_HIP_LIBRARY` is not set.
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "/opt/rocm/lib/libamdhip64.so",
];

/// Environment variable naming the HIP runtime library to load instead of the candidates.
pub const LIBRARY_ENV: &str = "MEMPLAN_HIP_LIBRARY";

/// An opaque HIP handle (stream, graph, graph exec, allocation handle).
pub type Handle = *mut c_void;
/// `hipError_t`, read as an integer.
pub type HipResult = c_int;

macro_rules! symbols {
    (required { $($r:ident : $rt:ty),* $(,)? } optional { $($o:ident : $ot:ty),* $(,)? }) => {
        /// Every HIP function memplan calls. Required ones are resolved at load (a missing one
        /// makes the library unusable); optional ones are `None` on runtimes that lack them.
        #[allow(non_snake_case, missing_docs)]
        pub struct Symbols {
            $(pub $r: $rt,)*
            $(pub $o: Option<$ot>,)*
        }

        impl Symbols {
            fn resolve(lib: &libloading::Library, name: &str) -> Result<Self> {
                Ok(Symbols {
                    $($r: required::<$rt>(lib, name, stringify!($r))?,)*
                    $($o: optional::<$ot>(lib, stringify!($o)),)*
                })
            }

            /// Names of the optional symbols this runtime lacks.
            pub fn missing_optional(&self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $(if self.$o.is_none() { v.push(stringify!($o)); })*
                v
            }
        }
    };
}

symbols! {
    required {
        hipInit: unsafe extern "C" fn(c_uint) -> HipResult,
        hipGetDeviceCount: unsafe extern "C" fn(*mut c_int) -> HipResult,
        hipRuntimeGetVersion: unsafe extern "C" fn(*mut c_int) -> HipResult,
        hipDriverGetVersion: unsafe extern "C" fn(*mut c_int) -> HipResult,
        hipSetDevice: unsafe extern "C" fn(c_int) -> HipResult,
        hipDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipResult,
        hipDeviceTotalMem: unsafe extern "C" fn(*mut usize, c_int) -> HipResult,
        hipDeviceGetAttribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipResult,
        hipDeviceGetPCIBusId: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipResult,
        hipMemGetInfo: unsafe extern "C" fn(*mut usize, *mut usize) -> HipResult,
        hipDeviceSynchronize: unsafe extern "C" fn() -> HipResult,
        hipMalloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipResult,
        hipFree: unsafe extern "C" fn(*mut c_void) -> HipResult,
    }
    optional {
        hipGetDeviceProperties: unsafe extern "C" fn(*mut c_void, c_int) -> HipResult,
        hipGetDevicePropertiesR0600: unsafe extern "C" fn(*mut c_void, c_int) -> HipResult,
        hipStreamCreateWithFlags: unsafe extern "C" fn(*mut Handle, c_uint) -> HipResult,
        hipStreamDestroy: unsafe extern "C" fn(Handle) -> HipResult,
        hipStreamSynchronize: unsafe extern "C" fn(Handle) -> HipResult,
        hipStreamBeginCapture: unsafe extern "C" fn(Handle, c_int) -> HipResult,
        hipStreamEndCapture: unsafe extern "C" fn(Handle, *mut Handle) -> HipResult,
        hipGraphInstantiate: unsafe extern "C" fn(*mut Handle, Handle, *mut Handle, *mut c_char, usize) -> HipResult,
        hipGraphLaunch: unsafe extern "C" fn(Handle, Handle) -> HipResult,
        hipGraphExecDestroy: unsafe extern "C" fn(Handle) -> HipResult,
        hipGraphDestroy: unsafe extern "C" fn(Handle) -> HipResult,
        hipMemsetAsync: unsafe extern "C" fn(*mut c_void, c_int, usize, Handle) -> HipResult,
        hipMallocAsync: unsafe extern "C" fn(*mut *mut c_void, usize, Handle) -> HipResult,
        hipFreeAsync: unsafe extern "C" fn(*mut c_void, Handle) -> HipResult,
        hipDeviceGraphMemTrim: unsafe extern "C" fn(c_int) -> HipResult,
        hipDeviceGetGraphMemAttribute: unsafe extern "C" fn(c_int, c_int, *mut c_void) -> HipResult,
        hipMemGetAllocationGranularity: unsafe extern "C" fn(*mut usize, *const c_void, c_int) -> HipResult,
        hipMemAddressReserve: unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, c_ulonglong) -> HipResult,
        hipMemAddressFree: unsafe extern "C" fn(*mut c_void, usize) -> HipResult,
        hipMemCreate: unsafe extern "C" fn(*mut Handle, usize, *const c_void, c_ulonglong) -> HipResult,
        hipMemRelease: unsafe extern "C" fn(Handle) -> HipResult,
        hipMemMap: unsafe extern "C" fn(*mut c_void, usize, usize, Handle, c_ulonglong) -> HipResult,
        hipMemUnmap: unsafe extern "C" fn(*mut c_void, usize) -> HipResult,
        hipMemSetAccess: unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize) -> HipResult,
    }
}

fn required<T: Copy>(lib: &libloading::Library, library: &str, symbol: &str) -> Result<T> {
    // SAFETY: `T` is the function-pointer type declared for `symbol` in the table above,
    // copied from HIP's header; the pointer is only used while `lib` is alive (Api owns both).
    let sym = unsafe { lib.get::<T>(symbol.as_bytes()) };
    sym.map(|s| *s).map_err(|e| Error::MissingSymbol {
        library: library.to_string(),
        symbol: symbol.to_string(),
        detail: e.to_string(),
    })
}

fn optional<T: Copy>(lib: &libloading::Library, symbol: &str) -> Option<T> {
    // SAFETY: as in `required`.
    let sym = unsafe { lib.get::<T>(symbol.as_bytes()) };
    sym.ok().map(|s| *s)
}

/// The loaded HIP runtime: its symbols, where it came from, and its versions.
#[non_exhaustive]
pub struct Api {
    /// Resolved functions. Valid while `_lib` lives, which is as long as `self`.
    pub sym: Symbols,
    /// The file name or path that loaded.
    pub library: String,
    /// `hipRuntimeGetVersion`.
    pub runtime: HipVersion,
    /// `hipDriverGetVersion`, when it returned a version.
    pub driver: Option<HipVersion>,
    _lib: libloading::Library,
}

impl Api {
    /// Load the HIP runtime and initialise it (`hipInit(0)`). Errors name the library, the
    /// missing symbol, or the call and its hipError_t.
    pub fn load() -> Result<Arc<Api>> {
        let candidates: Vec<String> = match std::env::var(LIBRARY_ENV) {
            Ok(p) if !p.is_empty() => vec![p],
            _ => LIBRARY_CANDIDATES.iter().map(|s| s.to_string()).collect(),
        };
        Self::load_from(&candidates)
    }

    /// Load the first of `candidates` that opens, then resolve and initialise as [`Api::load`].
    pub fn load_from(candidates: &[String]) -> Result<Arc<Api>> {
        let mut tried = Vec::new();
        for name in candidates {
            // SAFETY: loading the HIP runtime runs its initialisers, which only set up the
            // runtime's own state; we load it once per Api and never unload it early.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Self::from_library(lib, name).map(Arc::new),
                Err(e) => {
                    let msg = e.to_string();
                    tried.push(if msg.contains(name.as_str()) {
                        msg
                    } else {
                        format!("{name}: {msg}")
                    });
                }
            }
        }
        Err(Error::LibraryNotFound {
            library: "libamdhip64.so (HIP runtime)".into(),
            detail: tried.join("; "),
        })
    }

    fn from_library(lib: libloading::Library, name: &str) -> Result<Api> {
        let sym = Symbols::resolve(&lib, name)?;
        let mut v: c_int = 0;
        // SAFETY: hipRuntimeGetVersion writes one int through a valid pointer; it does not need
        // hipInit and is the one call that works without a device.
        check("hipRuntimeGetVersion", unsafe {
            (sym.hipRuntimeGetVersion)(&mut v)
        })?;
        let runtime = HipVersion::from_int(v).ok_or_else(|| Error::DriverCall {
            call: "hipRuntimeGetVersion".into(),
            code: i64::from(v),
            name: "not a version".into(),
        })?;
        // SAFETY: hipInit takes flags (must be 0) and returns a code.
        let rc = unsafe { (sym.hipInit)(0) };
        // Name the runtime in the error: "hipInit (libamdhip64.so, HIP 5.2.21153) failed: ...".
        check(&format!("hipInit ({name}, HIP {runtime})"), rc)?;
        let mut d: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        let driver = match unsafe { (sym.hipDriverGetVersion)(&mut d) } {
            0 => HipVersion::from_int(d),
            _ => None,
        };
        Ok(Api {
            sym,
            library: name.to_string(),
            runtime,
            driver,
            _lib: lib,
        })
    }

    /// Make `ordinal` the calling thread's current device (HIP's current device is per thread,
    /// so every device operation calls this first).
    pub fn set_device(&self, ordinal: c_int) -> Result<()> {
        // SAFETY: plain call with an integer argument.
        check("hipSetDevice", unsafe { (self.sym.hipSetDevice)(ordinal) })
    }

    /// An optional symbol, or [`Error::Unsupported`] naming it and the runtime version.
    pub fn need<T: Copy>(&self, f: Option<T>, symbol: &str, operation: &'static str) -> Result<T> {
        f.ok_or_else(|| {
            Error::unsupported(
                operation,
                format!("{} (HIP {}) has no `{symbol}`", self.library, self.runtime),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_an_error_naming_every_attempt() {
        let names = vec![
            "/nonexistent/libamdhip64.so".to_string(),
            "libmemplan-absent.so.9".to_string(),
        ];
        let e = Api::load_from(&names).err().expect("nothing to load");
        let msg = e.to_string();
        assert!(matches!(e, Error::LibraryNotFound { .. }), "{msg}");
        assert!(
            msg.contains("/nonexistent/libamdhip64.so") && msg.contains("libmemplan-absent.so.9"),
            "{msg}"
        );
    }

    #[test]
    fn a_library_without_hip_symbols_is_a_missing_symbol() {
        // libc is loaded in every process and has no HIP function.
        let e = Api::load_from(&["libc.so.6".to_string()])
            .err()
            .expect("libc is not HIP");
        assert!(
            matches!(&e, Error::MissingSymbol { symbol, .. } if symbol == "hipInit"),
            "{e}"
        );
    }
}
