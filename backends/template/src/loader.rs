//! Finding and initialising the runtime. A real backend opens its library here (libloading,
//! the names the vendor ships, an environment variable to override them), checks the version
//! before it resolves any symbol a version may lack, and returns a typed error naming the
//! library and the call: never a panic, so a binary with this backend starts on a machine
//! without the library. The fake runtime is in this process; `MEMPLAN_TEMPLATE_RUNTIME=absent`
//! makes it behave as a library that is not installed.

use memplan_core::{Error, Result};

use crate::conv::check;
use crate::facts::Version;
use crate::fake;

/// The library this backend stands for.
pub const LIBRARY: &str = "libfake-runtime.so (the in-process fake runtime, src/fake.rs)";
/// Set to `absent` to make the runtime unavailable (as a missing library is).
pub const ABSENT_ENV: &str = "MEMPLAN_TEMPLATE_RUNTIME";
/// The oldest runtime this backend calls.
pub const MIN_VERSION: Version = Version(1000);

/// An initialised runtime.
#[derive(Debug)]
pub struct Runtime {
    /// Its version.
    pub version: Version,
}

// guide:begin load
/// Load and initialise the runtime, checking its version first.
pub fn load() -> Result<Runtime> {
    if std::env::var(ABSENT_ENV).is_ok_and(|v| v == "absent") {
        return Err(Error::LibraryNotFound {
            library: LIBRARY.into(),
            detail: format!("{ABSENT_ENV}=absent: treated as not installed"),
        });
    }
    check("fake_init", fake::fake_init())?;
    let mut v = 0;
    check("fake_get_version", fake::fake_get_version(&mut v))?;
    let version = Version(v);
    if version < MIN_VERSION {
        return Err(Error::DriverTooOld {
            have: version.to_string(),
            need: MIN_VERSION.to_string(),
            what: "the template backend".into(),
        });
    }
    Ok(Runtime { version })
}
// guide:end load
