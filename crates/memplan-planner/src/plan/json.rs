//! The plan's `memplan.plan/1` JSON, read back: [`Plan::from_json`] and [`combine_json`].
//!
//! Ranks in separate processes send each other their plans as this JSON (through whatever
//! all-gather the engine has) and combine them. Reading one back checks, in order:
//! 1. size: at most [`MAX_PLAN_JSON_BYTES`] of text (a plan is a few KiB; a combined plan of a
//!    large deployment a few MiB);
//! 2. the `schema` key: a plan of another version (`memplan.plan/2`) is refused naming both
//!    versions, anything else is "not a memplan plan";
//! 3. the shape: every key of the version with its type (serde, the same types that wrote it);
//!    keys this version does not know are ignored (a newer memplan of the same version may add
//!    keys), a warning code it does not know is kept as
//!    [`Warning::Unrecognized`](crate::Warning::Unrecognized);
//! 4. the figures agree with each other ([`Plan::validate`]): the request (a utilisation in
//!    (0, 1], bytes above 0), the budget (requested within the total, the consumers plus the
//!    KV budget), tokens, blocks and bytes, every whole figure of `kv` against the
//!    sizing of `kv_spec` in the KV cache granted, the rank and the deployment, a combined
//!    plan's ranks (every rank of its deployment, once).
//!
//! `docs/schemas/plan.schema.json` describes the same document for other languages; a test
//! checks every plan this crate writes against it.

use std::collections::BTreeMap;

use memplan_core::bytes::{fmt_bytes, MIB};
use memplan_core::{Error, Result};
use serde::{Deserialize, Deserializer};

use super::{combine_ranks, Plan, SCHEMA};
use crate::budget::Request;

/// The largest plan text [`Plan::from_json`] reads: 64 MiB (a combined plan carries a few
/// hundred bytes per rank, so even a deployment of 100,000 ranks stays far below).
pub const MAX_PLAN_JSON_BYTES: usize = 64 * MIB as usize;

fn bad(message: impl Into<String>) -> Error {
    Error::invalid("plan", message)
}

/// `#[serde(deserialize_with)]` of `schema`: this version only.
pub(super) fn schema<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<&'static str, D::Error> {
    let s = String::deserialize(d)?;
    match version_problem(&s) {
        None => Ok(SCHEMA),
        Some(p) => Err(serde::de::Error::custom(p)),
    }
}

/// Why a `schema` value is not this version, or `None`.
fn version_problem(s: &str) -> Option<String> {
    if s == SCHEMA {
        return None;
    }
    let family = SCHEMA.split('/').next().unwrap_or(SCHEMA);
    Some(match s.strip_prefix(family).and_then(|v| v.strip_prefix('/')) {
        Some(v) => format!(
            "the plan is version {v} ({s}); this memplan reads {SCHEMA}: plan and combine with one memplan release on every rank"
        ),
        None => format!("schema {s:?} is not a memplan plan ({SCHEMA})"),
    })
}

/// `#[serde(deserialize_with)]` of `engine_args`: an engine that would refuse the plan is
/// `null` (or absent) in the JSON, and absent here.
pub(super) fn engine_args<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, String>, D::Error> {
    let m = BTreeMap::<String, Option<String>>::deserialize(d)?;
    Ok(m.into_iter().filter_map(|(k, v)| Some((k, v?))).collect())
}

impl Plan {
    /// The `memplan.plan/1` JSON (what `serde_json::to_string` gives).
    pub fn to_json(&self) -> String {
        // Every field serializes to JSON (no map with non-string keys, no float that is not
        // finite reaches here: figures are integers, utilisations are checked in (0, 1]).
        serde_json::to_string(self).unwrap_or_else(|e| {
            tracing::error!(error = %e, "a plan did not serialize");
            String::new()
        })
    }

    /// Read a plan written by [`Plan::to_json`] (or `memplan plan --json`, or any rank's
    /// session): see the module docs for what is checked. Errors are
    /// [`Error::InvalidInput`] on `plan`, saying what is wrong.
    pub fn from_json(text: &str) -> Result<Plan> {
        if text.len() > MAX_PLAN_JSON_BYTES {
            return Err(bad(format!(
                "{} of text is beyond the {} a plan may take",
                fmt_bytes(text.len() as u64),
                fmt_bytes(MAX_PLAN_JSON_BYTES as u64)
            )));
        }
        // A syntax error (a `NaN` literal, text cut short) names the key path it is at.
        let v: serde_json::Value =
            memplan_core::json::from_str(text).map_err(|e| bad(e.to_string()))?;
        Self::from_value(v)
    }

    /// [`Plan::from_json`] of an already parsed document.
    pub fn from_value(v: serde_json::Value) -> Result<Plan> {
        match v.get("schema") {
            Some(serde_json::Value::String(s)) => {
                if let Some(p) = version_problem(s) {
                    return Err(bad(p));
                }
            }
            Some(_) => return Err(bad("`schema` is not a string")),
            None => {
                return Err(bad(format!(
                    "no `schema` key: not a memplan plan ({SCHEMA})"
                )))
            }
        }
        // serde's message says what was wrong but not where: the path to the value names it
        // (`kv.num_blocks`, `consumers[0].bytes`).
        let plan: Plan = serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            bad(if path == "." || path.is_empty() {
                inner
            } else {
                format!("{path}: {inner}")
            })
        })?;
        plan.validate()?;
        Ok(plan)
    }

    /// Check that the plan's figures agree with each other (a plan read from elsewhere): the
    /// request is one the planner takes (a utilisation in (0, 1], bytes above 0), the
    /// requested bytes fit in the total and are the consumers plus the KV budget, the
    /// token count is the sizing's, blocks times block bytes are the bytes used, which fit in
    /// the KV cache granted, which fits in the budget; every whole figure of `kv` (page and
    /// block bytes, blocks, usable blocks, tokens, ...) is what `kv_spec` gives in the KV cache
    /// granted with `limits` and `sizing_rules`; the rank belongs to the plan's
    /// deployment; a combined plan's ranks (see [`super::Ranks`]).
    pub fn validate(&self) -> Result<()> {
        // The request as it was checked when the plan was made.
        match self.request {
            Request::Utilization(u) if !(u.is_finite() && u > 0.0 && u <= 1.0) => {
                return Err(bad(format!(
                    "request: a utilisation of {u} is outside (0, 1]"
                )))
            }
            Request::Bytes(0) | Request::KvCacheBytes(0) => {
                return Err(bad("request: 0 bytes requested"))
            }
            _ => {}
        }
        if self.kv_cache_tokens != self.kv.tokens {
            return Err(bad(format!(
                "kv_cache_tokens {} is not kv.tokens {}",
                self.kv_cache_tokens, self.kv.tokens
            )));
        }
        if self.kv.num_blocks.checked_mul(self.kv.block_bytes) != Some(self.kv.used_bytes) {
            return Err(bad(format!(
                "kv.num_blocks {} times kv.block_bytes {} is not kv.used_bytes {}",
                self.kv.num_blocks, self.kv.block_bytes, self.kv.used_bytes
            )));
        }
        if self.kv.used_bytes > self.kv_cache_bytes || self.kv_cache_bytes > self.kv_budget_bytes {
            return Err(bad(format!(
                "the KV cache's bytes do not nest: used {} <= granted {} <= budget {} does not hold",
                self.kv.used_bytes, self.kv_cache_bytes, self.kv_budget_bytes
            )));
        }
        self.validate_budget()?;
        self.validate_sizing()?;
        let deployment = crate::Rank::new(0, self.tensor_parallel_size)
            .and_then(|r| r.with_stage(0, self.pipeline_parallel_size))?;
        if let Some(r) = &self.rank {
            r.validate()?;
            if !r.same_deployment(&deployment) {
                return Err(bad(format!(
                    "its rank ({r}) is not of its deployment (tensor_parallel_size {}, pipeline_parallel_size {})",
                    self.tensor_parallel_size, self.pipeline_parallel_size
                )));
            }
        }
        if let Some(ranks) = &self.ranks {
            ranks.validate(self)?;
        }
        Ok(())
    }
}

impl Plan {
    /// Check the budget's figures as `budget::compute` makes them: the memory requested is
    /// within the device total, and the KV budget is what it leaves after the consumers (a
    /// byte budget is the bytes requested, a fixed KV cache the KV budget). A utilisation's
    /// bytes are not recomputed: the fraction goes through floating point.
    fn validate_budget(&self) -> Result<()> {
        if self.requested_bytes > self.total_bytes {
            return Err(bad(format!(
                "requested_bytes {} is more than total_bytes {}",
                self.requested_bytes, self.total_bytes
            )));
        }
        let used = self
            .consumers
            .total()
            .ok_or_else(|| bad("consumers: their bytes overflow 64 bits together"))?;
        if used.checked_add(self.kv_budget_bytes) != Some(self.requested_bytes) {
            return Err(bad(format!(
                "kv_budget_bytes {} is not requested_bytes {} less the consumers' {used} bytes",
                self.kv_budget_bytes, self.requested_bytes
            )));
        }
        match self.request {
            Request::Bytes(b) if b != self.requested_bytes => Err(bad(format!(
                "requested_bytes {} is not the {b} bytes the request asks for",
                self.requested_bytes
            ))),
            Request::KvCacheBytes(b) if b != self.kv_budget_bytes => Err(bad(format!(
                "kv_budget_bytes {} is not the fixed KV cache's {b} bytes the request asks for",
                self.kv_budget_bytes
            ))),
            _ => Ok(()),
        }
    }

    /// Check `kv` against the sizing that made it: the planner sizes `kv_spec` into
    /// `kv_cache_bytes` with `limits` and `sizing_rules` (`KvSpec::size_with`), so every whole
    /// figure of `kv` is that sizing's: the page and block bytes and the grouping (from the
    /// spec and rules), the blocks (`kv_cache_bytes / block_bytes`), the usable blocks (all
    /// but the null block), the tokens, the blocks a request needs, the longest length that
    /// fits. (The concurrencies are floating point and left out.)
    fn validate_sizing(&self) -> Result<()> {
        let want = self
            .kv_spec
            .size_with(self.kv_cache_bytes, &self.limits, &self.sizing_rules)
            .map_err(|e| bad(format!("kv_spec, limits and sizing_rules do not size: {e}")))?;
        let figures = |k: &memplan_core::kv::KvSizing| {
            [
                ("page_bytes", Some(k.page_bytes)),
                ("group_size", Some(k.group_size)),
                ("num_groups", Some(k.num_groups)),
                ("block_bytes", Some(k.block_bytes)),
                ("block_size", Some(k.block_size)),
                ("num_blocks", Some(k.num_blocks)),
                ("usable_blocks", Some(k.usable_blocks)),
                ("used_bytes", Some(k.used_bytes)),
                ("tokens", Some(k.tokens)),
                ("blocks_per_request", Some(k.blocks_per_request)),
                ("max_model_len_fit", k.max_model_len_fit),
            ]
        };
        let show = |v: Option<u64>| v.map_or_else(|| "null".to_string(), |v| v.to_string());
        for ((key, got), (_, want)) in figures(&self.kv).into_iter().zip(figures(&want)) {
            if got != want {
                return Err(bad(format!(
                    "kv.{key} {} is not {}, what kv_spec gives in kv_cache_bytes {} with limits and sizing_rules",
                    show(got),
                    show(want),
                    self.kv_cache_bytes
                )));
            }
        }
        Ok(())
    }
}

/// Combine the plans of every rank, each a `memplan.plan/1` JSON text (what an all-gather of
/// [`Plan::to_json`] gives): each is read with [`Plan::from_json`] (errors name the position
/// of the plan that is wrong), then [`combine_ranks`].
pub fn combine_json<S: AsRef<str>>(plans: &[S]) -> Result<Plan> {
    let plans = plans
        .iter()
        .enumerate()
        .map(|(i, t)| Plan::from_json(t.as_ref()).map_err(|e| e.during(format!("plan {i}"))))
        .collect::<Result<Vec<_>>>()?;
    combine_ranks(plans)
}
