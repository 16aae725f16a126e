//! One set of defaults for the dry run and the measured start-up.
//!
//! `memplan plan` (a dry run) and a measured start-up (`memplan.engine.start_up`, or a Rust
//! engine's `Session` with these settings) answer the same question for the same deployment,
//! so every setting left unset comes from the same function here:
//! - [`engine`]: the engine release whose rules apply: the newest vLLM release memplan knows,
//!   unless one is named (`vllm@0.19`, `sglang`);
//! - [`request`]: what the engine asks for: the release's default utilisation, or, with vLLM
//!   0.34's extensible KV cache, what is free when the engine starts (free / total, read at
//!   the start: the dry run's device reading, the measured start-up's baseline); the note says
//!   how a derived figure was derived and goes into the plan's notes;
//! - [`settings`]: block size, requests and tokens per step, the max model length, the rank's
//!   KV layout (its pipeline stage's layers, its share of the KV heads) and the sizing rules:
//!   the dry run's own resolution ([`DryRun::resolve`], or [`resolve_stage`] for a stage).
//!
//! What differs between the two paths is then only what one measures and the other estimates
//! (the plan's consumers, each with its provenance) and the free memory each reads at its
//! start (the requested bytes): the measured KV budget minus the dry one is the requested
//! difference minus the consumers' differences, to the byte.

use memplan_core::bytes::fmt_bytes;
use memplan_core::kv::{KvLimits, KvSpec, SizingRules};
use memplan_core::{Error, Param, Refusal, Result};
use memplan_planner::budget::Request;

use crate::consumers::resolve_stage;
use crate::dryrun::DryRun;
use crate::engine::EngineRules;

/// The engine release `name` names (`vllm`, `vllm@0.19`, `sglang@0.5.23`), or the newest vLLM
/// release memplan knows when none is named: the dry run's and the measured start-up's default.
pub fn engine(name: Option<&str>) -> Result<EngineRules> {
    name.unwrap_or("vllm").parse()
}

/// Round a fraction down to 6 decimals: the requested bytes, rounded up from it, then never
/// exceed what it was derived from.
fn floor6(f: f64) -> f64 {
    (f * 1e6).floor() / 1e6
}

/// What the engine asks for on a device of `total` bytes with `free` bytes free when it
/// starts, for `tp` x `pp` ranks: a fixed KV size or a utilisation when given (not both),
/// else the release's default (see the module docs). Returns the request and, for a default,
/// the note that says where it comes from. A device whose memory other processes hold
/// entirely does not fit the extensible cache's default ([`Refusal::FreeBelowRequested`]).
pub fn request(
    engine: &EngineRules,
    total: u64,
    free: Option<u64>,
    (tp, pp): (u64, u64),
    (utilization, kv_cache_bytes): (Option<f64>, Option<u64>),
) -> Result<(Request, Option<String>)> {
    match (utilization, kv_cache_bytes) {
        (Some(_), Some(_)) => {
            return Err(Error::param(
                Param::KvCacheBytes,
                "give a KV cache size or a GPU memory utilisation, not both",
            ))
        }
        (None, Some(b)) => return Ok((Request::KvCacheBytes(b), None)),
        (Some(u), None) => {
            if !(u > 0.0 && u <= 1.0) {
                return Err(Error::param(
                    Param::Utilization,
                    format!("{u} is outside (0, 1]"),
                ));
            }
            return Ok((Request::Utilization(u), None));
        }
        (None, None) => {}
    }
    if !engine.extensible_kv_cache {
        let u = engine.default_utilization(total, tp, pp);
        return Ok((
            Request::Utilization(u),
            Some(format!("GPU memory utilisation {u}: {engine}'s default")),
        ));
    }
    let refused = || {
        Error::does_not_fit(Refusal::FreeBelowRequested {
            free: 0,
            total,
            requested: total,
            request: format!(
                "{engine}'s default: GPU memory utilisation 1.0, the KV cache taking what is free once the engine has started"
            ),
            held_by_allocator: None,
        })
    };
    match free {
        Some(f) if total > 0 && f < total => {
            let u = floor6(f as f64 / total as f64);
            if u <= 0.0 {
                return Err(refused());
            }
            Ok((
                Request::Utilization(u),
                Some(format!(
                    "GPU memory utilisation {u}: free memory / total when the engine starts ({} / {}), {engine}'s default with its extensible KV cache (it takes what is free once started)",
                    fmt_bytes(f),
                    fmt_bytes(total)
                )),
            ))
        }
        Some(0) => Err(refused()),
        _ => Ok((
            Request::Utilization(1.0),
            Some(format!(
                "GPU memory utilisation 1.0: {engine}'s default with its extensible KV cache (no free reading to start from)"
            )),
        )),
    }
}

/// What a rank sizes its KV cache with: the dry run's resolution of every unset setting.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// The rank's KV layout (its stage's layers, its share of the KV heads).
    pub kv_spec: KvSpec,
    /// Max model length and tokens per step.
    pub limits: KvLimits,
    /// The engine release's sizing rules for this deployment.
    pub rules: SizingRules,
    /// The release (`vllm@0.34`).
    pub engine: String,
    /// Requests per step.
    pub max_num_seqs: Option<u64>,
    /// The dry run's notes (which rule read the config, block size alignment, ...).
    pub notes: Vec<String>,
}

/// The settings of `d` (its stage's, with pipeline parallelism and a stage given), resolved
/// exactly as its dry run resolves them.
pub fn settings(d: &DryRun) -> Result<Settings> {
    let pp = d.extras.pipeline_parallel.max(1);
    let b = match (pp, d.extras.pipeline_stage) {
        (1, _) => d.resolve()?.builder,
        (_, Some(stage)) => resolve_stage(d, pp, stage)?,
        (_, None) => {
            return Err(Error::param(
                Param::PipelineParallel,
                format!("a rank of {pp} pipeline stages sizes its own stage: give the stage"),
            ))
        }
    };
    Ok(Settings {
        kv_spec: b.kv_spec().clone(),
        limits: b.limits(),
        rules: b.rules(),
        engine: b
            .engine_release()
            .map(String::from)
            .unwrap_or_else(|| d.engine.to_string()),
        max_num_seqs: b.requests_per_step(),
        notes: b.notes_so_far().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::GIB;

    fn rules(name: &str) -> EngineRules {
        engine(Some(name)).unwrap()
    }

    #[test]
    fn the_newest_release_is_the_default() {
        assert_eq!(engine(None).unwrap(), *EngineRules::newest_vllm());
        assert_eq!(rules("vllm@0.19").to_string(), "vllm@0.19");
    }

    #[test]
    fn derived_defaults_say_how_they_were_derived() {
        let total = 24 * GIB;
        // The extensible cache: free / total at the start, rounded down so the requested
        // bytes never exceed what was free.
        let free = total - 389 * (1 << 20);
        let (r, note) =
            request(&rules("vllm@0.34"), total, Some(free), (1, 1), (None, None)).unwrap();
        let Request::Utilization(u) = r else {
            panic!("{r:?}")
        };
        let requested = memplan_planner::budget::requested_bytes(total, r).unwrap();
        assert!(requested <= free && free - requested < 64 << 10, "{u}");
        assert!(note.unwrap().contains("free memory / total"));
        // A fixed default says whose it is.
        let (r, note) = request(
            &rules("vllm@0.20.1"),
            total,
            Some(free),
            (1, 1),
            (None, None),
        )
        .unwrap();
        assert_eq!(r, Request::Utilization(0.92));
        assert!(note.unwrap().contains("vllm@0.20.1's default"));
        // Given: as given, no note; both, or out of range: refused naming the parameter.
        let given = request(&rules("vllm"), total, Some(free), (1, 1), (Some(0.8), None)).unwrap();
        assert_eq!(given, (Request::Utilization(0.8), None));
        assert!(request(&rules("vllm"), total, None, (1, 1), (Some(0.8), Some(1))).is_err());
        assert!(request(&rules("vllm"), total, None, (1, 1), (Some(1.5), None)).is_err());
        // Nothing free: the extensible default does not fit.
        let e = request(&rules("vllm"), total, Some(0), (1, 1), (None, None)).unwrap_err();
        assert!(e.refusal().is_some(), "{e}");
    }
}
