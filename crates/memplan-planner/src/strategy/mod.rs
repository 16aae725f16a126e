//! Graph-memory strategies: each a type with the same interface ([`GraphStrategy`]), chosen
//! automatically from the (calibrated) capabilities by [`select`], and overridable.
//!
//! | strategy | needs | what it does |
//! |---|---|---|
//! | `post-capture` | virtual memory, a driver free reading that sees this process, an engine that binds its KV range before capture | reserve the KV address range, capture every graph for good, read real usage; no estimate |
//! | `full` | capture, a driver free reading that sees this process | capture every size into a throwaway pool, measure, release |
//! | `sampled` | the same as `full` | capture a few sizes, shared pool (max over sizes) modelled apart from per-graph overhead (linear in the count), margin from the spread |
//! | `conservative` | capture only | allocator-visible pool measured, driver-only part bounded analytically, plus a margin |
//! | `none` | nothing | no graphs (eager, or capture unsupported) |
//! | `vllm-legacy` | nothing | vLLM's old sampling, kept only to compare; never chosen automatically |
//!
//! Selection reads the capability only, never a vendor name.

mod context;
mod full;
mod legacy;
mod sampled;
mod simple;

pub(crate) use context::{
    kept_window_error, release_all, trim_and_settle, wait_for_release, window_error, Trim,
    LATE_RELEASE_SYNCHRONIZES, SETTLE_SYNCHRONIZES, WINDOW_ERROR_FACTOR_INVERSE_EXCESS,
};
pub use context::{GraphContext, Primed};
pub(crate) use full::keeps_a_window_for_other_memory;
pub use full::{Full, PostCapture};
pub use legacy::{legacy_extrapolate, VllmLegacy};
pub use sampled::{sample_sizes, sampled_model, Layers, Sampled};
pub use simple::{
    Conservative, NoGraphs, DEFAULT_EXEC_BYTES_PER_GRAPH, EXEC_BYTES_PER_KERNEL_NODE_BOUND,
};

use memplan_core::{Error, Param, ProfilingCapability, Reading, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Size the KV cache after capturing (virtual memory).
    PostCapture,
    /// Capture every size into a throwaway pool.
    Full,
    /// Capture a few sizes and model the rest.
    Sampled,
    /// Analytic bound plus margin.
    Conservative,
    /// No graphs.
    None,
    /// vLLM's legacy extrapolation (comparison only).
    VllmLegacy,
}

impl StrategyKind {
    /// Every strategy, in the order `--strategy all` runs them.
    pub const ALL: [StrategyKind; 6] = [
        StrategyKind::PostCapture,
        StrategyKind::Full,
        StrategyKind::Sampled,
        StrategyKind::Conservative,
        StrategyKind::None,
        StrategyKind::VllmLegacy,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::PostCapture => "post-capture",
            StrategyKind::Full => "full",
            StrategyKind::Sampled => "sampled",
            StrategyKind::Conservative => "conservative",
            StrategyKind::None => "none",
            StrategyKind::VllmLegacy => "vllm-legacy",
        }
    }

    /// The strategy object.
    pub fn strategy(self) -> Box<dyn GraphStrategy> {
        match self {
            StrategyKind::PostCapture => Box::new(PostCapture),
            StrategyKind::Full => Box::new(Full),
            StrategyKind::Sampled => Box::new(Sampled::default()),
            StrategyKind::Conservative => Box::new(Conservative),
            StrategyKind::None => Box::new(NoGraphs),
            StrategyKind::VllmLegacy => Box::new(VllmLegacy),
        }
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StrategyKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        StrategyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let known: Vec<_> = StrategyKind::ALL.iter().map(|k| k.name()).collect();
                Error::param(
                    Param::GraphStrategy,
                    format!(
                        "unknown strategy {s:?}; expected auto, all or one of {}",
                        known.join(", ")
                    ),
                )
            })
    }
}

/// One graph-memory sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GraphSample {
    /// Graph size (batch size).
    pub size: u32,
    /// Memory the capture took (signed: a negative sample is evidence of a broken protocol).
    pub delta: i64,
    /// Whether cached memory was released before the sample's baseline.
    pub flushed: bool,
}

/// What a strategy found: the reserve the budget subtracts and how sure it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GraphEstimate {
    /// The strategy that ran.
    pub strategy: StrategyKind,
    /// Number of graph sizes the engine captures.
    pub graphs: usize,
    /// Bytes the KV budget reserves for graphs (point estimate plus margin, never negative).
    pub reserve: u64,
    /// The point estimate before margin and clamping (signed: legacy can go negative).
    pub point_estimate: i64,
    /// Margin added to the point estimate.
    pub margin: u64,
    /// The part of `margin` kept for the captures' capture-to-capture variation alone, before
    /// the reading's window errors are combined with it in quadrature (`full`'s margin for the
    /// variation of its repeats); 0 where the margin keeps none. The plan adds the error of the
    /// reading's other windows to it the same way (`plan::build`).
    #[serde(default)]
    pub variation: u64,
    /// The error the margin kept for each of its windows of the free reading, where the
    /// strategy's own windows showed the reading more finely than its measured window error
    /// (`full`'s quiet reading: every idle window read exactly 0); `None` where the margin
    /// kept the reading's window error. The plan keeps the reading's other windows at the same
    /// error (`plan::build`).
    #[serde(default)]
    pub window: Option<u64>,
    /// How far the point estimate may be off (bytes, either way).
    pub uncertainty: u64,
    /// The samples taken, if any.
    pub samples: Vec<GraphSample>,
    /// Which reading measured it.
    pub measured_by: String,
    /// Whether the graphs stay captured (post-capture): the engine must not capture again.
    pub kept: bool,
    /// How the figure was obtained, for people.
    pub explanation: String,
}

impl GraphEstimate {
    /// An estimate with a point value and a margin; the reserve is their clamped sum.
    pub fn new(
        strategy: StrategyKind,
        graphs: usize,
        point: i64,
        margin: u64,
        measured_by: impl Into<String>,
    ) -> Self {
        let reserve = u64::try_from(point).unwrap_or(0).saturating_add(margin);
        GraphEstimate {
            strategy,
            graphs,
            reserve,
            point_estimate: point,
            margin,
            variation: 0,
            window: None,
            uncertainty: margin,
            samples: Vec::new(),
            measured_by: measured_by.into(),
            kept: false,
            explanation: String::new(),
        }
    }
}

/// A graph-memory strategy. `run` uses only the protocol primitives of [`GraphContext`];
/// the session tears down every graph afterwards unless the estimate says `kept`.
pub trait GraphStrategy {
    /// Which strategy this is.
    fn kind(&self) -> StrategyKind;
    /// Measure or bound the graph memory.
    fn run(&self, ctx: &mut GraphContext<'_>) -> Result<GraphEstimate>;
}

/// Knobs of the automatic selection.
#[derive(Debug, Clone, Copy, Serialize)]
#[non_exhaustive]
pub struct SelectionPolicy {
    /// Capture every size (`full`) up to this many sizes; above it, `sampled` (a session whose
    /// engine declared `max_split_size_mb` keeps `full`, `Session::selection`).
    pub full_capture_limit: usize,
    /// Prefer `post-capture` when possible.
    pub prefer_post_capture: bool,
}

impl Default for SelectionPolicy {
    fn default() -> Self {
        SelectionPolicy {
            full_capture_limit: 64,
            prefer_post_capture: true,
        }
    }
}

/// The automatic choice and why.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Selection {
    /// The strategy chosen.
    pub kind: StrategyKind,
    /// Why, from the capabilities.
    pub why: String,
}

/// Choose a strategy from the capability alone. `graphs` is how many sizes the engine captures;
/// `post_capture_ok` whether the engine can size its KV cache after capture.
pub fn select(
    cap: &ProfilingCapability,
    graphs: usize,
    post_capture_ok: bool,
    policy: SelectionPolicy,
) -> Selection {
    let pick = |kind, why: String| {
        tracing::info!(strategy = %kind, %why, "strategy selected");
        Selection { kind, why }
    };
    if graphs == 0 {
        return pick(
            StrategyKind::None,
            "the engine captures no graphs (eager)".into(),
        );
    }
    if let memplan_core::Support::Unsupported { reason } = &cap.facts.graph_capture {
        return pick(
            StrategyKind::None,
            format!("graph capture is not supported: {reason}"),
        );
    }
    let free = cap.reading(Reading::DriverFree);
    if !free.measures_own_usage() {
        return pick(
            StrategyKind::Conservative,
            format!(
                "driver free memory is {free}: graph memory outside the allocator cannot be measured, so it is bounded analytically"
            ),
        );
    }
    let vmm = cap.facts.virtual_memory.is_supported();
    if vmm && post_capture_ok && policy.prefer_post_capture {
        return pick(
            StrategyKind::PostCapture,
            format!("virtual memory is supported and driver free is {}: capture first, then size the KV cache from real usage", free.label()),
        );
    }
    let no_pc = if !vmm {
        "virtual memory is not supported"
    } else {
        "the engine cannot size its KV cache after capture"
    };
    if graphs <= policy.full_capture_limit {
        pick(
            StrategyKind::Full,
            format!(
                "{no_pc}; driver free is {}: capture all {graphs} sizes into a throwaway pool",
                free.label()
            ),
        )
    } else {
        pick(
            StrategyKind::Sampled,
            format!(
                "{no_pc}; {graphs} sizes exceed the full-capture limit of {}: sample and model",
                policy.full_capture_limit
            ),
        )
    }
}

#[cfg(test)]
mod tests;
