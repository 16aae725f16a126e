//! The whole pipeline — calibrate, engine start-up through the protocol, automatic strategy,
//! plan, then the real KV allocation, every graph captured and a full-concurrency burst — on
//! every shipped simulated profile, honest and with `declare-exact` over its quirks, engine
//! hints off. The automatic choice must never run out of memory and never grant more than the
//! oracle (computed from ground truth by the test-bed's own code); where it measured the graph
//! memory (post-capture, full capture) it must reach 99% of the oracle, 97% where it modelled
//! it from samples, 94% running eagerly (a non-allocator bound where free cannot measure it).
//! The conservative bound, used where nothing can measure this process, is only
//! held to 70%: with no engine hints it bounds each graph's executable object from above (see
//! docs/strategy-comparison.md for what that costs; a device-wide reading would measure it). A
//! device that lies about its total may instead be refused with a clear start-up error. The
//! seeded sweep (`cargo xtask sweep`) runs the same checks over many seeds.

use memplan_testbed::{simulate, StrategyArg};
use std::path::PathBuf;

/// Shipped scenarios and the smallest device (bytes) their model fits on: the ~1.5B models
/// fit everywhere, the shared-pool 8B model needs a data-centre card.
const BASE_SCENARIOS: [(&str, u64); 3] =
    [("fp8-24g", 0), ("bf16-24g", 0), ("shared-pool", 40 << 30)];

fn scenario_text(name: &str) -> String {
    let path = memplan_workspace_tests::repo_root()
        .join("crates/memplan-testbed/scenarios")
        .join(format!("{name}.toml"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The scenario moved onto `device`; profiles without a readable total (APUs) get a byte
/// budget of 75% of the memory the GPU can really use.
fn retarget(text: &str, device: &str, total: Option<u64>, usable: u64) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("device =") {
            out.push_str(&format!("device = \"{device}\"\n"));
        } else if t.starts_with("other_processes") || t.starts_with("graphics") {
            // The base scenario's neighbours were sized for its own card.
        } else if t.starts_with("gpu_memory_utilization") && total.is_none() {
            out.push_str(&format!("memory_budget = {}\n", usable / 4 * 3));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The share of the oracle each strategy must reach (see the module docs).
fn floor(s: memplan_planner::StrategyKind) -> f64 {
    use memplan_planner::StrategyKind as K;
    match s {
        K::PostCapture | K::Full => 0.99,
        K::Sampled => 0.97,
        // Eager where free cannot measure: the 512 MiB non-allocator bound costs ~3.5% of a
        // 16 GiB card and ~5.5% of a 12 GiB one (below the 97% target: reported in
        // docs/strategy-comparison.md, not hidden).
        K::None => 0.94,
        _ => 0.70,
    }
}

fn write_temp(name: &str, text: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-every-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).expect("write scenario");
    p
}

#[test]
fn automatic_choice_is_safe_and_tight_on_every_profile() {
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for profile in memplan_backend_sim::profiles() {
        if profile.name.starts_with("broken") {
            continue;
        }
        let total = profile
            .capability()
            .reading(memplan::Reading::DriverTotal)
            .is_exact()
            .then_some(profile.total_bytes);
        for selector in [
            profile.name.to_string(),
            format!("{},declare-exact", profile.name),
        ] {
            let lying = selector.ends_with("declare-exact");
            for (base, min_total) in BASE_SCENARIOS {
                if profile.total_bytes / 4 * 3 < min_total {
                    continue;
                }
                let text = retarget(&scenario_text(base), &selector, total, profile.total_bytes);
                let file = write_temp(&format!("{base}-{}", selector.replace(',', "_")), &text);
                let report = match simulate(file.to_str().expect("utf-8 path"), StrategyArg::Auto) {
                    Ok(r) => r,
                    Err(e) => {
                        failures.push(format!("{selector} {base}: {e}"));
                        continue;
                    }
                };
                let run = &report.runs[0];
                let ratio = run.kv_vs_oracle.unwrap_or(0.0);
                rows.push(format!(
                    "{selector:<34} {base:<12} {:<13} {:.3}",
                    run.strategy.to_string(),
                    ratio
                ));
                if let Some(oom) = &run.oom {
                    failures.push(format!(
                        "{selector} {base}: ran out of memory with {}: {oom}",
                        run.strategy
                    ));
                } else if let Some(f) = &run.failed {
                    // A device that lies about its total may be refused with a clear error
                    // (safe); an honest one must be planned.
                    if !(lying && f.starts_with("start-up refused")) {
                        failures.push(format!("{selector} {base}: failed: {f}"));
                    }
                } else if !(floor(run.strategy)..=1.0 + 1e-3).contains(&ratio) {
                    failures.push(format!(
                        "{selector} {base}: {} granted {ratio:.4} of the oracle",
                        run.strategy
                    ));
                }
            }
        }
    }
    println!("{}", rows.join("\n"));
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
