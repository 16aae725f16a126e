//! The plan: from a measured [`Profile`] and the engine's request to a KV budget, with the
//! strategy that measured the graphs, why, how sure it is, and every warning.
//!
//! `kv_budget = requested - weights - activation peak - non-allocator growth - graph reserve`
//! ([`crate::budget::compute`]). When the free reading can measure this process, the budget is
//! also capped by what is physically left (free memory now, minus the activation peak, the
//! graph reserve still to be captured and the reading's tolerance; memory the allocator keeps
//! cached is not counted, since after the flushed snapshots only fragments of live segments
//! remain there): memory another process took during profiling is not counted as the
//! engine's, but it is not free either.

use memplan_core::bytes::{fmt_bytes, fmt_signed, MIB};
use memplan_core::kv::{KvLimits, KvSizing, KvSpec};
use memplan_core::{Error, MemoryInfo, ProfilingCapability, Reading, Result};
use serde::Serialize;
use std::fmt;

use crate::budget::{self, Budget, Consumers, Request};
use crate::session::Profile;
use crate::strategy::{GraphEstimate, StrategyKind};

/// What the engine asks for.
#[derive(Debug, Clone, Serialize)]
pub struct PlanInputs {
    /// Utilisation, byte budget or fixed KV size.
    pub request: Request,
    /// The KV cache to size.
    pub kv: KvSpec,
    /// Request-shape limits.
    pub limits: KvLimits,
}

/// The plan for one rank.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The graph strategy that ran.
    pub strategy: StrategyKind,
    /// Why it was chosen.
    pub why: String,
    /// What it found (absent when no graph phase ran).
    pub graph: Option<GraphEstimate>,
    /// How far the KV budget may be off because of the graph estimate (bytes, either way).
    pub uncertainty_bytes: u64,
    /// The budget arithmetic.
    pub budget: Budget,
    /// The KV budget actually granted (the budget's, or less when capped by free memory).
    pub kv_bytes: u64,
    /// Set when free memory capped the KV budget: the cap.
    pub capped_by_free: Option<u64>,
    /// Blocks, tokens, concurrency.
    pub kv: KvSizing,
    /// Bytes other processes took (+) or released (-) while profiling.
    pub foreign_bytes: i64,
    /// Every warning, calibration downgrades included.
    pub warnings: Vec<String>,
}

fn request_label(r: &Request) -> String {
    match r {
        Request::Utilization(u) => format!("gpu_memory_utilization {u}"),
        Request::Bytes(b) => format!("byte budget {}", fmt_bytes(*b)),
        Request::KvCacheBytes(b) => format!("KV cache of {}", fmt_bytes(*b)),
    }
}

/// The early start-up check on the baseline: free memory below the request fails, naming who
/// holds the memory. Skipped (with `Ok`) when the free reading cannot measure it. Engines call
/// it right after [`Session::begin`](crate::Session::begin); [`plan`] repeats it.
pub fn check_request(
    baseline: &MemoryInfo,
    cap: &ProfilingCapability,
    request: &Request,
) -> Result<()> {
    let total = device_total(baseline, cap, request)?;
    if matches!(request, Request::KvCacheBytes(_))
        || !cap.reading(Reading::DriverFree).measures_own_usage()
    {
        return Ok(());
    }
    let requested = budget::requested_bytes(total, *request)?;
    budget::check_free(baseline, requested, &request_label(request))
}

/// The device total the budget starts from: the driver's, or, where the driver cannot give
/// one (unified-memory devices), an absolute byte budget stands for the device.
fn device_total(
    baseline: &MemoryInfo,
    cap: &ProfilingCapability,
    request: &Request,
) -> Result<u64> {
    match (baseline.driver.total, request) {
        (Some(t), _) => Ok(t),
        (None, Request::Bytes(b)) => Ok(*b),
        (None, r) => Err(Error::invalid(
            if matches!(r, Request::KvCacheBytes(_)) {
                "kv-cache-memory-bytes"
            } else {
                "gpu-memory-utilization"
            },
            format!(
                "the device reports no usable total ({}): give an absolute byte budget instead",
                cap.reading(Reading::DriverTotal)
            ),
        )),
    }
}

/// Reserved for memory held outside the allocator (library workspaces, context growth) when it
/// cannot be measured because the driver's free reading is unavailable: never taken as 0. In
/// the single-GPU vLLM start-up logs of `shared/data` this memory is 0.24-0.35 GiB; 512 MiB
/// covers it with margin (multi-GPU communication buffers can take more: measure them).
pub const UNMEASURED_NON_ALLOCATOR_BYTES: u64 = 512 * MIB;

/// Plan from a measured profile. `why` says why the strategy ran (selection or override).
pub fn plan(profile: &Profile, why: impl Into<String>, inputs: &PlanInputs) -> Result<Plan> {
    let span = tracing::info_span!("plan");
    let _e = span.enter();
    check_request(&profile.baseline, &profile.capability, &inputs.request)?;
    let total = device_total(&profile.baseline, &profile.capability, &inputs.request)?;
    let mut warnings = profile.warnings.clone();
    let growth = profile.non_allocator_growth.unwrap_or_else(|| {
        warnings.push(format!(
            "non-allocator growth could not be measured (driver free unreliable): reserved the conservative bound {}",
            fmt_bytes(UNMEASURED_NON_ALLOCATOR_BYTES)
        ));
        UNMEASURED_NON_ALLOCATOR_BYTES as i64
    });
    let graph = profile.graph.clone();
    let consumers = Consumers {
        weights: profile.weights_held_bytes.ok_or_else(|| {
            Error::Measurement("weights were not measured (load_weights did not run)".into())
        })?,
        activation: profile
            .activation_peak_bytes
            .ok_or_else(|| Error::Measurement("the profile run did not run".into()))?,
        non_allocator: growth.max(0) as u64,
        graph_reserve: graph.as_ref().map_or(0, |g| g.reserve),
    };
    let budget = budget::compute(total, inputs.request, consumers)?;
    let mut kv_bytes = budget.kv_budget;
    let mut capped_by_free = None;
    if let Some(cap) = physical_cap(profile, &consumers) {
        if cap < kv_bytes {
            warnings.push(format!(
                "free memory caps the KV cache at {} (the budget allowed {}): memory held outside this engine ({} taken by others while profiling)",
                fmt_bytes(cap),
                fmt_bytes(kv_bytes),
                fmt_signed(profile.foreign_bytes)
            ));
            kv_bytes = cap;
            capped_by_free = Some(cap);
        }
    }
    if profile.foreign_bytes != 0 {
        warnings.push(format!(
            "other processes changed their memory by {} while profiling: attributed to them, not to this engine",
            fmt_signed(profile.foreign_bytes)
        ));
    }
    let kv = inputs.kv.size(kv_bytes, &inputs.limits)?;
    let (strategy, uncertainty_bytes) = graph
        .as_ref()
        .map_or((StrategyKind::None, 0), |g| (g.strategy, g.uncertainty));
    let plan = Plan {
        strategy,
        why: why.into(),
        graph,
        uncertainty_bytes,
        budget,
        kv_bytes,
        capped_by_free,
        kv,
        foreign_bytes: profile.foreign_bytes,
        warnings,
    };
    tracing::info!(kv_bytes = plan.kv_bytes, tokens = plan.kv.tokens, strategy = %plan.strategy, "plan ready");
    Ok(plan)
}

/// Several ranks (tensor parallelism): one plan per rank, and every rank's KV cache is sized
/// like the smallest. Returns the index and the plan of the limiting rank.
pub fn combine_ranks(plans: &[Plan]) -> Result<(usize, &Plan)> {
    plans
        .iter()
        .enumerate()
        .min_by_key(|(_, p)| p.kv.num_blocks)
        .ok_or_else(|| Error::invalid("ranks", "no rank plans to combine"))
}

/// What is physically left for the KV cache now, when the free reading sees this process.
fn physical_cap(profile: &Profile, c: &Consumers) -> Option<u64> {
    if !profile
        .capability
        .reading(Reading::DriverFree)
        .measures_own_usage()
    {
        return None;
    }
    let last = &profile.last;
    let kept = profile.graph.as_ref().is_some_and(|g| g.kept);
    let graphs_to_come = if kept { 0 } else { c.graph_reserve };
    // An approximate reading may over-state free memory by its tolerance.
    let tol = profile
        .capability
        .reading(Reading::DriverFree)
        .tolerance_bytes();
    let cap = last
        .driver
        .free?
        .saturating_sub(c.activation)
        .saturating_sub(graphs_to_come)
        .saturating_sub(tol);
    // Slack for the allocator's rounding of the allocations still to come (0.5%, at least
    // 32 MiB): a cap that is met exactly leaves a large allocation nowhere to go.
    Some(cap.saturating_sub((cap / 200).max(32 * MIB)))
}

impl Plan {
    /// The one-line memory bar over the device total (60 cells), see [`Budget::bar`].
    pub fn bar(&self) -> String {
        self.budget.bar(self.kv_bytes, 60)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.budget;
        let c = &b.consumers;
        writeln!(f, "graph strategy: {} ({})", self.strategy, self.why)?;
        if let Some(g) = &self.graph {
            writeln!(f, "  {}", g.explanation)?;
        }
        let row = |f: &mut fmt::Formatter<'_>, k: &str, v: String| writeln!(f, "  {k:<34} {v:>14}");
        row(f, "device total", fmt_bytes(b.total))?;
        row(f, "requested", fmt_bytes(b.requested))?;
        row(f, "- weights (as held)", fmt_bytes(c.weights))?;
        row(f, "- activation peak", fmt_bytes(c.activation))?;
        row(f, "- non-allocator growth", fmt_bytes(c.non_allocator))?;
        row(
            f,
            &format!("- graph reserve (±{})", fmt_bytes(self.uncertainty_bytes)),
            fmt_bytes(c.graph_reserve),
        )?;
        row(f, "= KV budget", fmt_bytes(b.kv_budget))?;
        if let Some(cap) = self.capped_by_free {
            row(f, "  capped by free memory to", fmt_bytes(cap))?;
        }
        let k = &self.kv;
        row(f, "KV blocks (incl. 1 null)", k.num_blocks.to_string())?;
        row(f, "KV tokens", k.tokens.to_string())?;
        row(f, "max concurrency", format!("{:.2}x", k.max_concurrency))?;
        if let Some(l) = k.max_model_len_fit {
            row(f, "longest max_model_len that fits", l.to_string())?;
        }
        if let Some(u) = b.suggestions.utilization_without_graph_reserve {
            row(f, "utilisation without graph reserve", format!("{u:.4}"))?;
        }
        row(
            f,
            "KV bytes filling requested",
            b.suggestions.kv_bytes_fill_requested.to_string(),
        )?;
        writeln!(
            f,
            "  {}  W weights A activation N non-allocator G graphs K KV . requested, unused",
            self.bar()
        )?;
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
