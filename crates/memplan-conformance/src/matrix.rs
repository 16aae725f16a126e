//! The capability matrix of the shipped backends, generated from the code: each backend's
//! representative platforms (its `capability::platforms()`, built with the same
//! `capability::declare` function the backend calls at run time; a simulated profile's
//! declaration is that function too, run on the profile's facts), gathered through the facade
//! (`memplan::declared_platforms`) from the one list of backends, so a new backend's rows need
//! no line here.
//!
//! [`IMITATES`] names the real row each simulated profile imitates, and [`drifts`] lists where
//! the two rows disagree: `tests/declarations.rs` fails on any.
//!
//! `cargo xtask capability-matrix` writes it to `docs/capability-matrix.md`; `cargo xtask ci`
//! fails when the committed file differs from what the code declares.

use memplan::{ProfilingCapability, Reading};

/// One row: backend, platform, capability.
pub struct Row {
    /// Backend name.
    pub backend: &'static str,
    /// Platform (profile name, or runtime version and device kind).
    pub platform: String,
    /// The declared capability.
    pub capability: ProfilingCapability,
}

/// The real platform each simulated profile imitates: (profile, backend, the real row's
/// platform). Every simulated profile is listed: the ones broken on purpose (`broken-*`)
/// declare what a real platform declares while their device does something else (lags,
/// leaks, misreports its total), so they imitate that platform's row.
pub const IMITATES: &[(&str, &str, &str)] = &[
    ("rtx4090", "cuda", CUDA_DISCRETE),
    ("rtx3090", "cuda", CUDA_DISCRETE),
    ("a100-40gb", "cuda", CUDA_DISCRETE),
    ("a100-80gb", "cuda", CUDA_DISCRETE),
    ("h100-80gb", "cuda", CUDA_DISCRETE),
    ("h200", "cuda", CUDA_DISCRETE),
    ("l4", "cuda", CUDA_DISCRETE),
    ("mi300x", "rocm", ROCM62_DRM),
    ("rx7900xtx-rocm5.4", "rocm", "HIP 5.4, discrete"),
    ("rx7900xtx-rocm5.5", "rocm", "HIP 5.5, discrete"),
    ("rx7900xtx-rocm6.2", "rocm", ROCM62_DRM),
    ("strix-halo", "rocm", "HIP 6.2, APU with DRM sysfs"),
    ("arc-a770", "xpu", XPU_FREE_EQ_TOTAL_PER_PROCESS),
    ("max1550", "xpu", "discrete, Sysman readable"),
    ("arc-b580-nosysman", "xpu", "discrete, Sysman unavailable"),
    ("arc-140v", "xpu", "integrated, per-process query permitted"),
    ("broken-stale", "cuda", CUDA_DISCRETE),
    ("broken-process-local", "cuda", CUDA_DISCRETE),
    ("broken-total-high", "cuda", CUDA_DISCRETE),
    ("broken-total-low", "cuda", CUDA_DISCRETE),
    ("broken-leaky-free", "cuda", CUDA_DISCRETE),
    ("broken-leaky-vm", "cuda", CUDA_DISCRETE),
    (
        "broken-leaky-free-unreadable",
        "xpu",
        "discrete, Sysman unavailable",
    ),
];

const CUDA_DISCRETE: &str = "driver 12.8, discrete";
const ROCM62_DRM: &str = "HIP 6.2, discrete with DRM sysfs";
const XPU_FREE_EQ_TOTAL_PER_PROCESS: &str =
    "discrete, Sysman free == total (non-root i915), per-process query permitted";

/// What a row says, cell by cell, beyond its backend and platform: the matrix's columns, the
/// tolerance of each reading, and the reason of each unsupported operation's absence kept out
/// (reasons are prose; the columns are the contract).
pub fn cells(r: &Row) -> Vec<String> {
    let c = &r.capability;
    let f = &c.facts;
    let mut v: Vec<String> = Reading::ALL
        .iter()
        .map(|rd| {
            let rel = c.reading(*rd);
            format!("{}: {} ±{}", rd.name(), rel.label(), rel.tolerance_bytes())
        })
        .collect();
    for (name, s) in [
        ("graph capture", &f.graph_capture),
        ("graph-pool attrs", &f.graph_pool_attributes),
        ("virtual memory", &f.virtual_memory),
        ("synchronize", &f.synchronize),
    ] {
        v.push(format!("{name}: {}", s.is_supported()));
    }
    v.push(format!("unified: {}", f.unified_memory));
    v.push(format!("graph release: {:?}", f.graph_release));
    v.push(format!(
        "hidden per capture: {:?}",
        f.hidden_bytes_per_capture
    ));
    v
}

/// Where a simulated row and the real row it imitates ([`IMITATES`]) disagree, one line per
/// cell; a simulated profile missing from [`IMITATES`], or whose real row is not in `rows`, is
/// a drift too.
pub fn drifts(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for sim in rows.iter().filter(|r| r.backend == "sim") {
        let Some((_, backend, platform)) = IMITATES.iter().find(|(p, ..)| *p == sim.platform)
        else {
            out.push(format!("sim {}: imitates no real platform", sim.platform));
            continue;
        };
        let Some(real) = rows
            .iter()
            .find(|r| r.backend == *backend && r.platform == *platform)
        else {
            out.push(format!(
                "sim {}: no {backend} row `{platform}` to compare with",
                sim.platform
            ));
            continue;
        };
        for (s, r) in cells(sim).iter().zip(cells(real)) {
            if *s != r {
                out.push(format!(
                    "sim {} vs {backend} `{platform}`: `{s}` vs `{r}`",
                    sim.platform
                ));
            }
        }
    }
    out
}

/// Every row this build can produce: each compiled-in backend's declared platforms
/// (`memplan::declared_platforms`; with the feature `matrix`, every backend's pure
/// declaration, no vendor library or header needed).
pub fn rows() -> Vec<Row> {
    memplan::declared_platforms()
        .into_iter()
        .map(|(kind, platform, capability)| Row {
            backend: kind.name(),
            platform: platform.to_string(),
            capability,
        })
        .collect()
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The table of backends, from the one list (`memplan_core::backend_list!`): the README
/// points here, so no hand-written list of backends exists.
fn backends_table() -> String {
    let mut t = String::from(
        "\n## Backends\n\n\
         Generated by `cargo xtask capability-matrix` from the one list of backends \
         (`crates/memplan-core/src/backends.rs`). A backend is compiled in with the `memplan` \
         crate's feature (`--features memplan/<feature>` from the command line).\n\n\
         | backend | device ids | `memplan` feature | folder (crate) | what |\n\
         |---|---|---|---|---|\n",
    );
    for k in memplan::BackendKind::ALL {
        let b = k.info();
        let mut ids = vec![format!("`{}`", b.example_id())];
        ids.extend(b.aliases.iter().map(|a| format!("`{a}:0`")));
        t.push_str(&format!(
            "| `{}` | {} | `{}` | {} (`{}`) | {} |\n",
            b.name,
            ids.join(", "),
            b.feature,
            b.folder(),
            b.package(),
            cell(b.description)
        ));
    }
    t
}

/// The matrix as Markdown.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "# Capability matrix\n\n\
         Generated by `cargo xtask capability-matrix` from the backends' own declarations; \
         `cargo xtask ci` fails when this file drifts from the code. Reliability of each \
         reading: exact / approximate / deferred / process-local / unavailable (see \
         docs/architecture.md). These are *declarations*; calibration on the device confirms \
         or downgrades them.\n\n\
         | backend | platform | driver total | driver free | graph pool | graph capture | graph-pool attrs | virtual memory | unified | graph release | synchronize |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let c = &r.capability;
        let f = &c.facts;
        let yes_no = |s: &memplan::Support| if s.is_supported() { "yes" } else { "no" };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.backend,
            cell(&r.platform),
            c.reading(Reading::DriverTotal).label(),
            c.reading(Reading::DriverFree).label(),
            c.reading(Reading::GraphPool).label(),
            yes_no(&f.graph_capture),
            yes_no(&f.graph_pool_attributes),
            yes_no(&f.virtual_memory),
            if f.unified_memory { "yes" } else { "no" },
            match f.graph_release {
                memplan::GraphRelease::Immediate => "immediate",
                memplan::GraphRelease::AtNextSync => "at next sync",
            },
            yes_no(&f.synchronize),
        ));
    }
    out.push_str(
        "\nA device without a device-wide `synchronize` gets the engine's own synchronize \
         (`Engine::synchronize`) before each reading, or a `readings_not_synchronized` warning \
         (docs/measurement-protocol.md).\n",
    );
    out.push_str("\n## Why each reading is not exact\n\n");
    for r in rows {
        let c = &r.capability;
        let reasons: Vec<String> = Reading::ALL
            .iter()
            .filter_map(|rd| {
                let rel = c.reading(*rd);
                (!rel.is_exact()).then(|| format!("{}: {}", rd.name(), cell(&rel.to_string())))
            })
            .collect();
        if !reasons.is_empty() {
            out.push_str(&format!(
                "- **{} {}**: {}\n",
                r.backend,
                cell(&r.platform),
                reasons.join("; ")
            ));
        }
    }
    out.push_str(
        "\n## The real platform each simulated profile imitates\n\n\
         A simulated profile's declaration is the real backend's own `capability::declare`, \
         run on the facts that platform reports (`memplan_backend_sim::PlatformFacts`); \
         `tests/declarations.rs` fails when a simulated row and its real row disagree.\n\n",
    );
    for (sim, backend, platform) in IMITATES {
        out.push_str(&format!("- **sim {sim}**: {backend} {}\n", cell(platform)));
    }
    out.push_str("\n## Why a device cannot synchronize\n\n");
    for r in rows {
        if let memplan::Support::Unsupported { reason } = &r.capability.facts.synchronize {
            out.push_str(&format!(
                "- **{} {}**: {}\n",
                r.backend,
                cell(&r.platform),
                cell(reason)
            ));
        }
    }
    out.push_str(&backends_table());
    out
}
