//! # memplan-planner
//!
//! The measurement protocol, calibration, graph-memory strategies and the plan. Everything here
//! decides from [`ProfilingCapability`](memplan_core::ProfilingCapability) values and readings,
//! never from a vendor's name (a test greps this crate's sources to keep it so).
//!
//! ## How an engine uses it
//!
//! ```text
//! let cap = calibrate(&mut *device)?.calibrated;        // or device.capabilities().clone()
//! let mut s = Session::begin(&mut *device, &mut engine, cap)?;   // release cache, baseline
//! s.load_weights(&mut engine, |e| e.load())?;           // weights = allocated growth
//! s.profile_run(&mut engine, |e| e.dummy_run())?;       // activation peak
//! let sel = select(s.capability(), engine.graph_sizes().len(), engine.supports_post_capture(), Default::default());
//! s.graph_phase(&mut engine, &*sel.kind.strategy())?;   // teardown on every path
//! let plan = plan(&s.finish(), sel.why, &inputs)?;      // budget, KV blocks, warnings
//! ```
//!
//! ## Contract
//!
//! - [`Session`]: every reading is a synchronized snapshot of every layer; cached memory is
//!   released before any baseline whose window would release it; quiet windows between steps
//!   attribute foreign memory changes to other processes; negative windows are kept and
//!   warned about, never clamped.
//! - [`strategy`]: one type per strategy behind [`GraphStrategy`]; [`select`] picks from the
//!   capability; graphs captured for measuring are torn down on every path and the session
//!   checks that the allocator and the graph pool are restored.
//! - [`calibrate()`]: confirms or downgrades each declared reading and fact with evidence; the
//!   calibrated capability is never stronger than the declared one.
//! - [`plan()`]: the budget ([`budget`]), capped by what is physically free, sized into KV
//!   blocks; [`Plan`] is `Display` (a table and a memory bar) and `Serialize`.
//!
//! The planner depends on no backend. Its tests on simulated devices, and the `memplan
//! simulate` harness, live in the `memplan-testbed` crate.

pub mod budget;
pub mod calibrate;
pub mod engine;
pub mod plan;
pub mod profile;
pub mod session;
pub mod strategy;

pub use calibrate::{calibrate, CalibrationReport};
pub use engine::Engine;
pub use plan::{combine_ranks, plan, Plan, PlanInputs};
pub use session::{AsDynEngine, Profile, Session};
pub use strategy::{
    select, GraphEstimate, GraphStrategy, Selection, SelectionPolicy, StrategyKind,
};

#[cfg(test)]
mod testutil;

#[cfg(test)]
mod vendor_names {
    // Spelled in pieces so this file does not match itself.
    const BANNED: [&str; 10] = [
        concat!("cu", "da"),
        concat!("ro", "cm"),
        concat!("h", "ip"),
        concat!("nvi", "dia"),
        concat!("a", "md"),
        concat!("in", "tel"),
        concat!("x", "pu"),
        concat!("level", " zero"),
        concat!("level", "_zero"),
        concat!("level", "zero"),
    ];

    /// The planner decides from capabilities only: no vendor or vendor API name in its sources.
    #[test]
    fn no_vendor_name_in_planner_sources() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut hits = Vec::new();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("planner src is readable") {
                let p = entry.expect("dir entry").path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let text = std::fs::read_to_string(&p)
                    .expect("source is utf-8")
                    .to_ascii_lowercase();
                for (n, line) in text.lines().enumerate() {
                    for b in BANNED {
                        if has_word(line, b) {
                            hits.push(format!("{}:{}: {b}", p.display(), n + 1));
                        }
                    }
                }
            }
        }
        assert!(hits.is_empty(), "vendor names in the planner: {hits:#?}");
    }

    /// `word` appears in `line` not as part of a longer identifier (so `chip` does not match the three letters after its c).
    fn has_word(line: &str, word: &str) -> bool {
        let is_id = |c: char| c.is_ascii_alphanumeric();
        line.match_indices(word).any(|(i, _)| {
            let before = line[..i].chars().next_back().is_none_or(|c| !is_id(c));
            let after = line[i + word.len()..]
                .chars()
                .next()
                .is_none_or(|c| !is_id(c));
            before && after
        })
    }

    #[test]
    fn word_matching() {
        assert!(has_word(&format!("uses {} here", BANNED[0]), BANNED[0]));
        assert!(has_word(&format!("sim:{}-6", BANNED[1]), BANNED[1]));
        assert!(!has_word("a chip", BANNED[2]));
        assert!(!has_word("relationship", BANNED[2]));
    }
}
