//! The plan: one type for a measured start-up and a dry run alike.
//!
//! A [`Plan`] is built by one function, [`PlanBuilder::build`], from a set of [`Consumer`]s,
//! each a figure with its [`Provenance`] (measured by a protocol step, read from a checkpoint,
//! given by the user, estimated with a named basis, or measured by a graph strategy with its
//! uncertainty). A measured session fills the builder from its [`Profile`](crate::Profile)
//! ([`PlanBuilder::from_profile`]); `memplan-model`'s dry run fills it from a model's config;
//! a caller overrides single figures ([`PlanBuilder::consumer`]), so measured and estimated
//! figures mix.
//!
//! What `build` does, in order:
//! - the start-up check: free memory at the start below the requested memory is refused
//!   ([`Refusal::FreeBelowRequested`](memplan_core::Refusal::FreeBelowRequested));
//! - the budget ([`crate::budget::compute`]): `kv_budget = requested - Σ consumers`, refused
//!   when negative;
//! - the physical cap, when free memory was read after the steps: the KV cache gets no more
//!   than is free now, less the activation peak, the graph reserve still to be captured, the
//!   reading's tolerance and some slack for allocator rounding (memory another process took
//!   while profiling is not the engine's, but it is not free either);
//!   where the free reading cannot see other processes (process-local, absent or suspect), the
//!   device-wide reading bounds it instead, and where neither can, the plan warns by name
//!   ([`Warning::OtherProcessesUnseen`]) and a session checks it with an allocation probe
//!   ([`PhysicalCheck`]);
//! - KV sizing into blocks, tokens and concurrency, each KV tensor as the engine's caching
//!   allocator rounds it (the allocator's arithmetic is in `footprint.rs`, apart from the
//!   budget's order); a max model length one request cannot get
//!   is refused with the longest that fits
//!   ([`Refusal::RequestDoesNotFit`](memplan_core::Refusal::RequestDoesNotFit)).
//!
//! Every refusal is [`Error::DoesNotFit`](memplan_core::Error::DoesNotFit) carrying a typed
//! [`Refusal`](memplan_core::Refusal). Several ranks: [`combine_ranks`]. Rendering: `Display`
//! (the text table), [`render`] (text with a front end's parameter names, SVG), and serde
//! (the `memplan.plan/1` JSON document, `docs/plan-schema.md`).

mod build;
mod consumer;
mod footprint;
mod json;
pub(crate) mod physical;
mod ranks;
#[cfg(test)]
pub(crate) use ranks::tests::rank_plan;
pub mod render;

pub use build::{PlanBuilder, UNMEASURED_NON_ALLOCATOR_BYTES};
pub use consumer::{Consumer, ConsumerKind, Consumers, Provenance};
pub(crate) use footprint::{fewest_divisions, gcd, kv_layout, MID_SEGMENT};
pub use footprint::{
    granule_bound, granule_bound_beside, granule_bound_of_segments, granule_bound_segments,
    is_large_request, is_small_request, weights_left_out, GranuleBound, ALLOCATOR_ROUNDING_BOUND,
};
pub use json::{combine_json, MAX_PLAN_JSON_BYTES};
pub use physical::PhysicalCheck;
pub use ranks::{combine_ranks, RankPlan, Ranks};

use memplan_core::kv::{KvLimits, KvSizing, KvSpec, SizingRules};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;

use crate::budget::{Request, Suggestions};
use crate::rank::Rank;
use crate::strategy::{GraphEstimate, StrategyKind};
use crate::warning::{self, Warning};

/// The name and version of the plan's JSON document (its `schema` key).
pub const SCHEMA: &str = "memplan.plan/1";

/// How graph memory entered the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GraphMethod {
    /// A graph strategy ran in a measured start-up (`none`: the engine captures no graphs).
    Strategy(StrategyKind),
    /// A dry run's analytic estimate from the model (no capture).
    Estimate,
    /// A figure the user gave.
    Given,
    /// The engine captures graphs but the budget does not subtract their memory.
    NotReserved,
}

impl GraphMethod {
    /// The name in JSON and text: a strategy's name, `estimate`, `given` or `not-reserved`.
    pub fn name(self) -> &'static str {
        match self {
            GraphMethod::Strategy(k) => k.name(),
            GraphMethod::Estimate => "estimate",
            GraphMethod::Given => "given",
            GraphMethod::NotReserved => "not-reserved",
        }
    }
}

impl fmt::Display for GraphMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for GraphMethod {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for GraphMethod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        let known = [
            GraphMethod::Estimate,
            GraphMethod::Given,
            GraphMethod::NotReserved,
        ]
        .into_iter()
        .chain(StrategyKind::ALL.map(GraphMethod::Strategy));
        for m in known {
            if m.name() == name {
                return Ok(m);
            }
        }
        Err(serde::de::Error::custom(format!(
            "unknown graph method {name:?}"
        )))
    }
}

/// The graph part of a plan: how graph memory entered it and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GraphPlan {
    /// How graph memory entered the plan.
    pub strategy: GraphMethod,
    /// Why this way (the selection's reason, an override, a dry run's basis).
    pub why: String,
    /// How far the KV budget may be off because of the graph figure (bytes, either way).
    pub uncertainty_bytes: u64,
    /// The graphs are captured for good (post-capture): nothing is left to capture.
    pub kept: bool,
    /// What a measured start-up's strategy found (samples, margin, explanation).
    pub estimate: Option<GraphEstimate>,
}

impl GraphPlan {
    /// A graph part without a strategy's estimate.
    pub fn new(strategy: GraphMethod, why: impl Into<String>) -> Self {
        GraphPlan {
            strategy,
            why: why.into(),
            uncertainty_bytes: 0,
            kept: false,
            estimate: None,
        }
    }

    /// The graph part of a strategy that ran.
    pub fn from_estimate(e: GraphEstimate, why: impl Into<String>) -> Self {
        GraphPlan {
            strategy: GraphMethod::Strategy(e.strategy),
            why: why.into(),
            uncertainty_bytes: e.uncertainty,
            kept: e.kept,
            estimate: Some(e),
        }
    }
}

/// The plan for one rank (or, combined, of every rank: [`combine_ranks`]). `Display` is the
/// text table; the JSON is the `memplan.plan/1` document, read back by [`Plan::from_json`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Plan {
    /// Always [`SCHEMA`] (reading another version is an error: [`Plan::from_json`]).
    #[serde(deserialize_with = "json::schema")]
    pub schema: &'static str,
    /// The device, when known (`sim:rtx4090 (...)`: its id and name).
    pub device: Option<String>,
    /// The model, when known.
    pub model: Option<String>,
    /// What the engine asked for.
    pub request: Request,
    /// Device total.
    pub total_bytes: u64,
    /// Memory the engine may use.
    pub requested_bytes: u64,
    /// What the budget subtracts, each figure with its provenance.
    pub consumers: Consumers,
    /// How graph memory entered the plan.
    pub graph: GraphPlan,
    /// What the budget leaves for the KV cache.
    pub kv_budget_bytes: u64,
    /// The KV cache granted: the budget, or less when free memory capped it.
    pub kv_cache_bytes: u64,
    /// Set when free memory capped the KV cache: the cap.
    pub capped_by_free_bytes: Option<u64>,
    /// Which reading bounded the KV cache by physically available memory (the driver's free
    /// memory, the device-wide reading or an allocation probe); absent when none could (a dry
    /// run, or a device whose readings see nothing and no probe ran).
    pub physical_check: Option<PhysicalCheck>,
    /// The KV cache sized.
    pub kv_spec: KvSpec,
    /// Request-shape limits.
    pub limits: KvLimits,
    /// Requests per step, when the plan knows it.
    pub max_num_seqs: Option<u64>,
    /// Tensor-parallel ranks per pipeline stage (figures are per rank).
    pub tensor_parallel_size: u64,
    /// Pipeline stages (figures are one stage's).
    pub pipeline_parallel_size: u64,
    /// The rank a measured start-up planned for (absent in a dry run).
    pub rank: Option<Rank>,
    /// KV-cache size in tokens as the engine reports it (= `kv.tokens`; top-level because
    /// scripts read it first).
    pub kv_cache_tokens: u64,
    /// Blocks, tokens, concurrency.
    pub kv: KvSizing,
    /// The engine release's rules the KV cache was sized with (tokens in flight, how tokens
    /// are reported, page padding, the hybrid manager); [`Plan::engine`] names the release.
    pub sizing_rules: SizingRules,
    /// Ways to pin the plan in an engine.
    pub suggestions: Suggestions,
    /// Bytes other processes took (+) or released (-) while profiling (measured start-ups).
    pub foreign_bytes: Option<i64>,
    /// Set when several rank plans were combined: the deployment, the blocks every rank maps,
    /// the limiting rank (when the ranks differ) and each rank's own figures.
    pub ranks: Option<Ranks>,
    /// The engine release whose rules sized the plan (`vllm@0.34`), when a dry run chose one.
    pub engine: Option<String>,
    /// Ready-to-paste flags per engine, filled by a tool that knows the engines' flags (the
    /// command line); empty otherwise.
    #[serde(deserialize_with = "json::engine_args")]
    pub engine_args: BTreeMap<String, String>,
    /// Notes for people: which rule read the model's config, which engine rules applied.
    pub notes: Vec<String>,
    /// Everything a person should know.
    #[serde(
        serialize_with = "warning::serialize_all",
        deserialize_with = "warning::deserialize_all"
    )]
    pub warnings: Vec<Warning>,
}

impl Plan {
    /// The bytes the graph reserve takes in the budget.
    pub fn graph_reserve(&self) -> u64 {
        self.consumers.bytes(ConsumerKind::Graphs)
    }

    /// The strategy that ran, when a measured start-up ran one.
    pub fn strategy(&self) -> Option<StrategyKind> {
        match self.graph.strategy {
            GraphMethod::Strategy(k) => Some(k),
            _ => None,
        }
    }

    /// The one-line memory bar over the device total, `cells` wide between brackets: one
    /// glyph per consumer (`W` weights, `A` activation, `N` non-allocator, `G` graphs), `K` the
    /// KV cache's used bytes, `.` requested but unused, ` ` outside the request.
    pub fn bar(&self, cells: u64) -> String {
        render::bar(self, cells)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&render::text(self, &render::concept_names))
    }
}

#[cfg(test)]
mod tests;
