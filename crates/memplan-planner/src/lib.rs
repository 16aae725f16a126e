//! # memplan-planner
//!
//! The measurement protocol, calibration, graph-memory strategies and the plan. Everything here
//! decides from [`ProfilingCapability`](memplan_core::ProfilingCapability) values and readings,
//! never from a vendor's name (a test greps this crate's sources to keep it so).
//!
//! ## How an engine uses it (through the `memplan` facade)
//!
//! ```text
//! let mut s = Session::start(&device, &mut engine)?;    // calibrate, release cache, baseline
//! s.load_weights(|e| e.load())?;                        // weights = allocated growth
//! s.profile_run(|e| e.dummy_run())?;                    // activation peak
//! s.capture_graphs()?;                                  // strategy from the capability
//! let plan = s.plan(request, &kv_spec, limits)?;        // budget, KV blocks, warnings
//! let kv = s.into_kv_cache(&plan)?;                     // KvCache: this rank's blocks
//! ```
//!
//! ## Contract
//!
//! - [`Session`]: every reading is a synchronized snapshot of every layer; cached memory is
//!   released before any baseline whose window would release it; quiet windows between steps
//!   attribute foreign memory changes to other processes; negative windows are kept and
//!   warned about, never clamped; a session dropped half-way tears down what it holds. Its
//!   steps run once, in order, or are refused naming the step ([`Step`]: weights may load in
//!   parts, an engine with graphs cannot plan without a graph phase); it knows its [`Rank`]
//!   in a tensor- and pipeline-parallel deployment, and ends with
//!   [`Session::into_kv_cache`], which takes a plan (its own or the ranks' combined one) and
//!   never gives more blocks than this rank planned ([`KvCache`]).
//! - [`Engine`]: the hooks an engine implements; post-capture hands it the KV cache's address
//!   range ([`KvRange`], a guard that releases it on drop) before any capture.
//! - [`strategy`]: one type per strategy behind [`GraphStrategy`]; [`select`] picks from the
//!   capability; graphs captured for measuring are torn down on every path and the session
//!   checks that the allocator and the graph pool are restored.
//! - [`calibrate()`]: confirms or downgrades each declared reading and fact with evidence; the
//!   calibrated capability is never stronger than the declared one.
//! - [`Plan`]: one type for measured start-ups and dry runs, built by [`PlanBuilder`] from
//!   [`Consumer`]s with their [`Provenance`]; refusals are typed
//!   ([`Refusal`](memplan_core::Refusal)); text, SVG ([`plan::render`]) and the
//!   `memplan.plan/1` JSON, read back (version-checked) by [`Plan::from_json`]; the plans of
//!   several ranks combine ([`combine_ranks`], [`combine_json`]) to the fewest blocks of any.
//! - [`Warning`]: every warning is a variant with its figures and a stable code.
//!
//! The planner depends on no backend. Its tests on simulated devices, and the `memplan
//! simulate` harness, live in the `memplan-testbed` crate.

pub mod budget;
pub mod calibrate;
pub mod engine;
pub mod kv_range;
pub mod plan;
pub mod profile;
pub mod rank;
pub mod session;
pub mod strategy;
pub mod warning;

pub use budget::Request;
pub use calibrate::{calibrate, calibrate_with, CalibrationReport};
pub use engine::Engine;
pub use kv_range::KvRange;
pub use plan::{
    combine_json, combine_ranks, Consumer, ConsumerKind, Consumers, GraphMethod, GraphPlan,
    PhysicalCheck, Plan, PlanBuilder, Provenance, RankPlan, Ranks,
};
pub use rank::Rank;
pub use session::{AsDynEngine, KvCache, Profile, Session, Step};
pub use strategy::{
    select, GraphEstimate, GraphStrategy, Selection, SelectionPolicy, StrategyKind,
};
pub use warning::Warning;

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
