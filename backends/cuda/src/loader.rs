//! Loading the CUDA driver library and gating calls by driver version.
//!
//! memplan never calls cudarc's driver functions (they panic on a missing library or symbol and
//! read `CUresult` into a Rust enum): [`driver`] (1) finds a loadable library among the names
//! cudarc would try, in cudarc's order, (2) hands it to [`crate::ffi`], whose wrappers resolve
//! each symbol from it and return the result as an integer, (3) checks that the library exports
//! the symbols memplan calls (per [`Feature`]), (4) reads `cuDriverGetVersion` and (5) runs
//! `cuInit`. Every later use of a symbol that older drivers lack goes through
//! [`Driver::require`], which checks the version table ([`min_version`]) and the symbol table
//! ([`symbols`]) first.
//!
//! The outcome is computed once per process and cached, success or failure.

use std::sync::OnceLock;

use memplan_core::{Error, Result};

use crate::conv::{self, CudaVersion};
pub use crate::facts::{check_version, min_version, symbols, Feature};
use crate::ffi;

/// The loaded driver library.
#[non_exhaustive]
pub struct Driver {
    /// The file name that loaded (`libcuda.so.1`).
    pub library: String,
    /// `cuDriverGetVersion`.
    pub version: CudaVersion,
    /// The library itself, shared with [`crate::ffi`]'s wrappers.
    lib: &'static libloading::Library,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("library", &self.library)
            .field("version", &self.version)
            .finish()
    }
}

impl Driver {
    /// Does the library export `symbol`?
    pub fn has_symbol(&self, symbol: &str) -> bool {
        // SAFETY: looking a symbol up runs no code of the library; the pointer is not used.
        unsafe { self.lib.get::<*const ()>(symbol.as_bytes()).is_ok() }
    }

    /// Check that the driver's version and exports allow the calls of `f`.
    pub fn require(&self, f: Feature) -> Result<()> {
        check_version(self.version, f)?;
        match symbols(f).find(|s| !self.has_symbol(s)) {
            None => Ok(()),
            Some(s) => Err(Error::MissingSymbol {
                library: self.library.clone(),
                symbol: s.to_string(),
                detail: format!("needed for {}", f.what()),
            }),
        }
    }

    /// Whether `f` is usable, as a yes/no with the reason.
    pub fn supports(&self, f: Feature) -> std::result::Result<(), String> {
        self.require(f).map_err(|e| e.to_string())
    }
}

/// Why loading failed, kept so that every later call reports the same error.
#[derive(Debug, Clone)]
enum LoadFailure {
    Library {
        library: String,
        detail: String,
    },
    Symbol {
        library: String,
        symbol: String,
        detail: String,
    },
    Call {
        call: String,
        code: i64,
        name: String,
    },
    TooOld {
        have: String,
        need: String,
        what: String,
    },
}

impl LoadFailure {
    fn from_error(e: Error) -> Self {
        match e {
            Error::MissingSymbol {
                library,
                symbol,
                detail,
            } => LoadFailure::Symbol {
                library,
                symbol,
                detail,
            },
            Error::DriverCall { call, code, name } => LoadFailure::Call { call, code, name },
            Error::DriverTooOld { have, need, what } => LoadFailure::TooOld { have, need, what },
            Error::LibraryNotFound { library, detail } => LoadFailure::Library { library, detail },
            other => LoadFailure::Library {
                library: canonical_name().into(),
                detail: other.to_string(),
            },
        }
    }

    fn to_error(&self) -> Error {
        match self.clone() {
            LoadFailure::Library { library, detail } => Error::LibraryNotFound { library, detail },
            LoadFailure::Symbol {
                library,
                symbol,
                detail,
            } => Error::MissingSymbol {
                library,
                symbol,
                detail,
            },
            LoadFailure::Call { call, code, name } => Error::DriverCall { call, code, name },
            LoadFailure::TooOld { have, need, what } => Error::DriverTooOld { have, need, what },
        }
    }
}

/// The name people know the driver library by on this platform.
pub fn canonical_name() -> &'static str {
    if cfg!(windows) {
        "nvcuda.dll"
    } else {
        "libcuda.so.1"
    }
}

/// The file names cudarc tries, in its order (so the first that loads here is the one it loads).
pub fn candidates() -> Vec<String> {
    ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
        .collect()
}

/// What the dynamic loader said (libloading puts `dlerror()`'s text in the error's source).
fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(src) => src.to_string(),
        None => e.to_string(),
    }
}

/// Load the first of `names` that loads. The error names the canonical library and what the
/// loader said about it (or about the last name tried).
pub fn probe(names: &[String]) -> Result<(String, libloading::Library)> {
    let mut detail = None;
    for name in names {
        // SAFETY: loading the driver library runs its initialisers, which is what every CUDA
        // program does; the library is kept loaded for the life of the process.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return Ok((name.clone(), lib)),
            Err(e) if name == canonical_name() || detail.is_none() => {
                detail = Some(loader_message(&e))
            }
            Err(_) => {}
        }
    }
    let detail = detail.unwrap_or_else(|| "no candidate names".into());
    Err(Error::LibraryNotFound {
        library: canonical_name().into(),
        detail: format!(
            "{detail} (tried {} names; is the NVIDIA driver installed?)",
            names.len()
        ),
    })
}

fn load() -> Result<Driver> {
    let (library, lib) = probe(&candidates())?;
    // From here on every driver call goes through `ffi`, resolved from this library.
    let lib = ffi::install(lib);
    let base = Driver {
        library,
        version: CudaVersion(0),
        lib,
    };
    for s in ["cuDriverGetVersion", "cuInit"] {
        if !base.has_symbol(s) {
            return Err(Error::MissingSymbol {
                library: base.library,
                symbol: s.into(),
                detail: "not a CUDA driver".into(),
            });
        }
    }
    let mut v: std::ffi::c_int = 0;
    // SAFETY: the library is loaded and exports the symbol (checked above); `v` is a valid
    // out-pointer. cuDriverGetVersion needs no prior cuInit.
    let res = unsafe { ffi::cuDriverGetVersion(&mut v) };
    conv::check("cuDriverGetVersion", res)?;
    let driver = Driver {
        version: CudaVersion(v),
        ..base
    };
    driver.require(Feature::Basic)?;
    // SAFETY: symbol present (Basic checked); flags must be 0.
    let res = unsafe { ffi::cuInit(0) };
    conv::check("cuInit", res)?;
    tracing::debug!(library = %driver.library, version = %driver.version, "CUDA driver loaded");
    Ok(driver)
}

/// The process's driver: loaded, version-checked and initialised once.
pub fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, LoadFailure>> = OnceLock::new();
    DRIVER
        .get_or_init(|| load().map_err(LoadFailure::from_error))
        .as_ref()
        .map_err(LoadFailure::to_error)
}

#[cfg(test)]
#[path = "loader_tests.rs"]
mod tests;
