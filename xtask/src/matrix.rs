//! The platform matrix: feature combinations that must each pass clippy and the tests.
//!
//! Runtime-loaded backends (cuda, rocm, xpu) build on any machine; rocm and xpu need the
//! Debian packages `.ci/run` installs (HIP headers for hip-runtime-sys's build script; Level
//! Zero headers for the layout tests).

use crate::run::step;

/// One matrix entry.
pub struct Entry {
    /// Name (`XTASK_ONLY=name`).
    pub name: &'static str,
    /// What it proves.
    pub why: &'static str,
    /// Package/feature selection passed to clippy and test.
    pub select: &'static [&'static str],
    /// Added to the test command only: packages whose tests an earlier entry already ran with
    /// the same code (clippy still checks them here).
    pub test_args: &'static [&'static str],
}

/// The matrix, smallest first.
pub const ENTRIES: &[Entry] = &[
    Entry {
        name: "none",
        why: "the core and facade with no backend at all",
        select: &[
            "-p",
            "memplan-core",
            "-p",
            "memplan",
            "--no-default-features",
        ],
        test_args: &[],
    },
    Entry {
        name: "sim",
        why: "the facade and planner with only the simulated backend",
        select: &[
            "-p",
            "memplan",
            "-p",
            "memplan-planner",
            "-p",
            "memplan-model",
            "-p",
            "memplan-backend-sim",
            "-p",
            "memplan-testbed",
        ],
        test_args: &[],
    },
    Entry {
        name: "default",
        why: "every crate with default features (CLI: sim + cuda)",
        // The Python package's crate has its own step (`cargo xtask python`).
        select: &["--workspace", "--exclude", "memplan-python"],
        test_args: &[],
    },
    Entry {
        name: "all-backends",
        why: "every crate, CLI with sim + cuda + rocm + xpu",
        select: &[
            "--workspace",
            "--exclude",
            "memplan-python",
            "--all-features",
        ],
        // The test-bed has no features of its own and opens only simulated devices: its tests
        // (the slowest of the workspace: the outside scenario files) already ran in `sim` and
        // `default`.
        test_args: &["--exclude", "memplan-testbed"],
    },
];

impl Entry {
    /// clippy with warnings denied, then the tests.
    pub fn run(&self) -> Result<(), String> {
        let mut clippy = vec!["cargo", "clippy", "--all-targets"];
        clippy.extend_from_slice(self.select);
        clippy.extend_from_slice(&["--", "-D", "warnings"]);
        step(&format!("{} clippy", self.name), &clippy)?;
        let mut test = vec!["cargo", "test"];
        test.extend_from_slice(self.select);
        test.extend_from_slice(self.test_args);
        step(&format!("{} test", self.name), &test)
    }
}

/// Print the matrix.
pub fn print() {
    println!("feature matrix:");
    for e in ENTRIES {
        println!("  {:<14} {:<60} {}", e.name, e.select.join(" "), e.why);
    }
}
