//! Several ranks: [`combine_ranks`] makes one plan of every rank's, [`Ranks`] records how.
//!
//! An engine runs one process per GPU; each measures its own device and plans its own KV cache.
//! The engine then sizes every rank's KV cache alike, in blocks: the block tables are shared
//! (tensor parallelism: every rank holds the same blocks of its own heads; pipeline
//! parallelism: every stage holds the same blocks of its own layers), so the deployment gets
//! the **fewest blocks** of any rank (vLLM `get_kv_cache_configs`: the minimum `num_blocks`
//! over workers). Each rank then maps that many blocks in its own block layout: stages hold
//! different layers, so their blocks differ in bytes ([`RankPlan::mapped_bytes`]).
//!
//! The combined plan is the plan of the rank with the fewest blocks (its figures at the top
//! level, its rank in [`Plan::rank`]), with the deployment's sizes and [`Plan::ranks`]: the
//! blocks every rank maps, each rank's own figures, and the limiting rank, named (also in a
//! [`Warning::LimitingRank`]) only when the ranks differ.

use std::collections::BTreeMap;

use memplan_core::bytes::fmt_bytes;
use memplan_core::{Error, Param, Result};
use serde::{Deserialize, Serialize};

use super::{ConsumerKind, GraphMethod, PhysicalCheck, Plan};
use crate::budget::Request;
use crate::rank::Rank;
use crate::warning::Warning;

/// One rank's own figures in a combined plan. The field names are the JSON keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RankPlan {
    /// The rank.
    pub rank: Rank,
    /// Its device, when known.
    pub device: Option<String>,
    /// Its device's total.
    pub total_bytes: u64,
    /// Memory it may use.
    pub requested_bytes: u64,
    /// What its budget left for the KV cache.
    pub kv_budget_bytes: u64,
    /// The KV cache its own plan granted.
    pub kv_cache_bytes: u64,
    /// Blocks its own plan fits (the null block included).
    pub num_blocks: u64,
    /// Bytes of one of its blocks.
    pub block_bytes: u64,
    /// Its own KV cache in tokens.
    pub kv_cache_tokens: u64,
    /// What its budget subtracted, per consumer.
    pub consumer_bytes: BTreeMap<ConsumerKind, u64>,
    /// How graph memory entered its plan.
    pub graph_strategy: GraphMethod,
    /// What bounded its KV cache by physically available memory.
    pub physical_check: Option<PhysicalCheck>,
    /// What it maps under the combined plan: the combined blocks times its own block bytes
    /// (after post-capture, the session maps them rounded up to the device's mapping
    /// granularity, less than a granule more, inside the granules its own plan kept).
    pub mapped_bytes: u64,
    /// The codes of its own plan's warnings.
    pub warnings: Vec<String>,
}

impl RankPlan {
    fn of(p: &Plan, rank: Rank, blocks: u64) -> Result<Self> {
        Ok(RankPlan {
            rank,
            device: p.device.clone(),
            total_bytes: p.total_bytes,
            requested_bytes: p.requested_bytes,
            kv_budget_bytes: p.kv_budget_bytes,
            kv_cache_bytes: p.kv_cache_bytes,
            num_blocks: p.kv.num_blocks,
            block_bytes: p.kv.block_bytes,
            kv_cache_tokens: p.kv_cache_tokens,
            consumer_bytes: p.consumers.iter().map(|c| (c.kind, c.bytes)).collect(),
            graph_strategy: p.graph.strategy,
            physical_check: p.physical_check,
            mapped_bytes: mapped(blocks, p.kv.block_bytes)?,
            warnings: p.warnings.iter().map(|w| w.code().to_string()).collect(),
        })
    }

    fn label(&self) -> String {
        match &self.device {
            Some(d) => format!("{} on {d}", self.rank),
            None => self.rank.to_string(),
        }
    }
}

fn mapped(blocks: u64, block_bytes: u64) -> Result<u64> {
    blocks.checked_mul(block_bytes).ok_or_else(|| {
        Error::param(
            Param::Ranks,
            format!("{blocks} blocks of {block_bytes} bytes overflow 64 bits"),
        )
    })
}

/// How several rank plans were combined ([`Plan::ranks`]). The field names are the JSON keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Ranks {
    /// Plans combined.
    pub count: usize,
    /// Tensor-parallel ranks per stage of the deployment.
    pub tensor_parallel_size: u64,
    /// Pipeline stages of the deployment.
    pub pipeline_parallel_size: u64,
    /// The blocks every rank maps: the fewest of any rank (the null block included).
    pub num_blocks: u64,
    /// Index in [`per_rank`](Self::per_rank) of the rank with the fewest blocks, when the
    /// ranks differ; `None` when every rank fits the same blocks.
    pub limiting: Option<usize>,
    /// Each rank's own figures, by global rank.
    pub per_rank: Vec<RankPlan>,
}

impl Ranks {
    /// The figures of `rank`, when its plan is one of those combined.
    pub fn get(&self, rank: &Rank) -> Option<&RankPlan> {
        self.per_rank.iter().find(|r| r.rank == *rank)
    }

    /// Check a combined plan read from elsewhere: its ranks are those of its deployment, each
    /// once; the blocks are the fewest; each rank maps them in its own layout; the limiting
    /// rank is named exactly when the ranks differ.
    pub(super) fn validate(&self, p: &Plan) -> Result<()> {
        let bad = |m: String| Error::invalid("plan", format!("ranks: {m}"));
        if self.count != self.per_rank.len() || self.count == 0 {
            return Err(bad(format!(
                "count {} but {} ranks listed",
                self.count,
                self.per_rank.len()
            )));
        }
        if (self.tensor_parallel_size, self.pipeline_parallel_size)
            != (p.tensor_parallel_size, p.pipeline_parallel_size)
        {
            return Err(bad("the deployment differs from the plan's".into()));
        }
        let deployment =
            Rank::new(0, self.tensor_parallel_size)?.with_stage(0, self.pipeline_parallel_size)?;
        let mut seen = BTreeMap::new();
        for r in &self.per_rank {
            r.rank.validate()?;
            if !r.rank.same_deployment(&deployment) || seen.insert(r.rank.global(), ()).is_some() {
                return Err(bad(format!(
                    "{} is not a rank of this deployment, or is listed twice",
                    r.rank
                )));
            }
            if r.mapped_bytes != mapped(self.num_blocks, r.block_bytes)? {
                return Err(bad(format!(
                    "{} maps {} bytes, not the combined blocks times its block bytes",
                    r.rank, r.mapped_bytes
                )));
            }
        }
        if let Some(missing) = missing_ranks(&deployment, &seen)? {
            return Err(bad(format!(
                "no figures of {missing}: a combined plan holds every rank of its deployment ({})",
                deployment.world_size()
            )));
        }
        let fewest = self.per_rank.iter().map(|r| r.num_blocks).min();
        let differ = self.per_rank.iter().any(|r| Some(r.num_blocks) != fewest);
        if fewest != Some(self.num_blocks) || p.kv.num_blocks != self.num_blocks {
            return Err(bad(format!(
                "num_blocks {} is not the fewest of the ranks' (and the plan's)",
                self.num_blocks
            )));
        }
        match self.limiting {
            Some(i) if !differ || self.per_rank.get(i).map(|r| r.num_blocks) != fewest => Err(bad(
                format!("limiting {i} is not a rank with the fewest blocks of differing ranks"),
            )),
            None if differ => Err(bad("the ranks differ but none is named limiting".into())),
            _ => Ok(()),
        }
    }
}

/// The ranks of `plans`: their own, or, for plans without one (dry runs of several devices),
/// tensor-parallel ranks in order, of the plans' own tensor-parallel size (or, for plans of
/// one GPU each, of as many ranks as plans). Mixing both is an error.
fn ranks_of(plans: &[Plan]) -> Result<Vec<Rank>> {
    let n = (plans.len() as u64).max(plans[0].tensor_parallel_size);
    match plans.iter().filter(|p| p.rank.is_some()).count() {
        0 if plans[0].tensor_parallel_size > 1 && n > plans[0].tensor_parallel_size => {
            Err(Error::param(
                Param::Ranks,
                format!(
                    "{} plans without ranks, each of a deployment of {} tensor-parallel ranks: each rank's plan once",
                    plans.len(),
                    plans[0].tensor_parallel_size
                ),
            ))
        }
        0 => plans
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if p.tensor_parallel_size != plans[0].tensor_parallel_size {
                    return Err(Error::param(
                        Param::Ranks,
                        format!("plan {i} is of {} tensor-parallel ranks, plan 0 of {}: the plans are of different deployments", p.tensor_parallel_size, plans[0].tensor_parallel_size),
                    ));
                }
                if p.pipeline_parallel_size > 1 {
                    return Err(Error::param(
                        Param::Ranks,
                        format!("plan {i} is one pipeline stage's but says not which rank it is: plans without ranks combine as the tensor-parallel ranks of one stage"),
                    ));
                }
                Rank::new(i as u64, n)
            })
            .collect(),
        k if k == plans.len() => Ok(plans.iter().filter_map(|p| p.rank).collect()),
        _ => Err(Error::param(
            Param::Ranks,
            "some plans say which rank they are and some do not: combine plans of one deployment",
        )),
    }
}

/// The first ranks a listing names before it says how many more there are.
const NAMED: usize = 8;

/// `items` joined by `, `: the first [`NAMED`], then how many in all.
fn some_of(items: impl Iterator<Item = String>, total: u64) -> String {
    let named: Vec<String> = items.take(NAMED).collect();
    let mut s = named.join(", ");
    if total > named.len() as u64 {
        s.push_str(&format!(", ... ({total} in all)"));
    }
    s
}

/// The rank of global number `g` in `deployment`'s layout (tensor-parallel ranks fastest).
fn rank_at(deployment: &Rank, g: u64) -> Result<Rank> {
    let tp = deployment.tensor_parallel_size;
    Rank::new(g % tp, tp)?.with_stage(g / tp, deployment.pipeline_parallel_size)
}

/// The global ranks of `deployment` that `seen` lacks, named (at most [`NAMED`]), or `None`
/// when every rank is there. `seen` holds distinct ranks of the deployment.
fn missing_ranks<T>(deployment: &Rank, seen: &BTreeMap<u64, T>) -> Result<Option<String>> {
    let world = deployment.world_size();
    let lacking = world - seen.len() as u64;
    if lacking == 0 {
        return Ok(None);
    }
    // Among the first `seen.len() + NAMED` numbers at least `NAMED` are missing (or all are).
    let named = (0..world)
        .filter(|g| !seen.contains_key(g))
        .take(NAMED)
        .map(|g| rank_at(deployment, g).map(|r| r.to_string()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(some_of(named.into_iter(), lacking)))
}

/// Check that `ranks` form one whole deployment: the same sizes, every rank of it
/// (`tensor_parallel_size x pipeline_parallel_size`) exactly once. A plan combined from some of
/// the ranks would size the deployment by the ranks it saw: a rank left out may have fewer
/// blocks, and cannot map the plan ([`crate::Session::into_kv_cache`] looks for its own rank).
fn check_deployment(ranks: &[Rank]) -> Result<Rank> {
    let first = ranks[0];
    let mut seen = BTreeMap::new();
    for (i, r) in ranks.iter().enumerate() {
        if !r.same_deployment(&first) {
            return Err(Error::param(
                Param::Ranks,
                format!(
                    "plan {i} is {r}, plan 0 is {first}: the plans are of different deployments"
                ),
            ));
        }
        if let Some(j) = seen.insert(r.global(), i) {
            return Err(Error::param(
                Param::Ranks,
                format!("plans {j} and {i} are both {r}: each rank's plan once"),
            ));
        }
    }
    if let Some(missing) = missing_ranks(&first, &seen)? {
        return Err(Error::param(
            Param::Ranks,
            format!(
                "no plan of {missing}: plans of {} of the deployment's {} ranks (tensor_parallel_size {} x pipeline_parallel_size {}); combine every rank's plan, each once",
                ranks.len(),
                first.world_size(),
                first.tensor_parallel_size,
                first.pipeline_parallel_size
            ),
        ));
    }
    Ok(first)
}

/// What every plan of one deployment has alike, by JSON key: one model (where both plans
/// name it), served by one engine release (where both name it: a measured start-up may not)
/// with the same sizing rules, KV dtype, `max_model_len` and kind of request. Devices, totals,
/// budgets and the blocks differ by rank, and so may a utilisation (vllm@0.34's default is
/// each device's own free share) and the batch limits (`max_num_seqs`,
/// `max_num_batched_tokens`: a dry run takes the engine's defaults for its own device, where
/// the engine takes the driver's for every rank). The KV layers differ by pipeline stage and
/// are compared within a stage.
fn deployment_fields(p: &Plan) -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::{json, to_value, Value};
    let request_kind = to_value(p.request)
        .ok()
        .and_then(|v| v.get("kind").cloned())
        .unwrap_or(Value::Null);
    let mut f = vec![
        ("model", json!(p.model)),
        ("engine", json!(p.engine)),
        (
            "sizing_rules",
            to_value(p.sizing_rules).unwrap_or(Value::Null),
        ),
        (
            "kv_spec.dtype",
            to_value(p.kv_spec.dtype).unwrap_or(Value::Null),
        ),
        ("limits.max_model_len", json!(p.limits.max_model_len)),
        ("request.kind", request_kind),
    ];
    // vLLM's `--kv-cache-memory-bytes` is one value for every worker.
    if let Request::KvCacheBytes(b) = p.request {
        f.push(("request.value", json!(b)));
    }
    f
}

/// Keys of [`deployment_fields`] a plan may leave `null` beside another's value.
const UNNAMED_MATCHES: [&str; 2] = ["model", "engine"];

/// Check that `plans` (of `ranks`) can be one deployment: one block size, the fields of
/// [`deployment_fields`] alike, one KV layout per pipeline stage.
fn check_alike(plans: &[Plan], ranks: &[Rank]) -> Result<()> {
    let block_size = plans[0].kv_spec.block_size;
    let first = deployment_fields(&plans[0]);
    for (i, p) in plans.iter().enumerate() {
        if p.kv_spec.block_size != block_size {
            return Err(Error::param(
                Param::BlockSize,
                format!(
                    "{} plans blocks of {} tokens, {} of {block_size}: every rank must use one block size",
                    ranks[i], p.kv_spec.block_size, ranks[0]
                ),
            ));
        }
        for ((key, mine), (_, theirs)) in deployment_fields(p).iter().zip(&first) {
            let unnamed = UNNAMED_MATCHES.contains(key) && (mine.is_null() || theirs.is_null());
            if mine != theirs && !unnamed {
                return Err(Error::param(
                    Param::Ranks,
                    format!(
                        "`{key}` differs: {} (plan {i}) has {mine}, {} (plan 0) has {theirs}; the ranks of one deployment run one model on one engine release with the same flags",
                        ranks[i], ranks[0]
                    ),
                ));
            }
        }
        let same_stage = (0..i).find(|&j| {
            ranks[j].pipeline_parallel_rank == ranks[i].pipeline_parallel_rank
                && plans[j].kv_spec != p.kv_spec
        });
        if let Some(j) = same_stage {
            return Err(Error::param(
                Param::Ranks,
                format!(
                    "{} plans another KV layout than {} of its stage (different layers, heads or dtype): they cannot share block tables",
                    ranks[i], ranks[j]
                ),
            ));
        }
    }
    Ok(())
}

/// Combine the plans of a deployment's ranks (see the module docs): every rank gets the fewest
/// blocks of any. One plan that names no rank (a dry run standing for every rank of its
/// deployment) is returned as it is. Errors ([`Error::InvalidParam`] on [`Param::Ranks`] or
/// [`Param::BlockSize`]), each naming the ranks or the field: no plans, a plan that is itself
/// combined, ranks of different deployments, a rank listed twice or without a plan (every
/// rank of `tensor_parallel_size x pipeline_parallel_size` exactly once), plans that cannot
/// be one deployment (another model or engine release where both name one, other sizing
/// rules, KV dtype, block size, `max_model_len` or kind of request, other bytes of a fixed KV
/// cache), ranks of one stage with different KV layouts.
pub fn combine_ranks(plans: Vec<Plan>) -> Result<Plan> {
    if plans.is_empty() {
        return Err(Error::param(Param::Ranks, "no rank plans to combine"));
    }
    if plans.len() == 1 && plans[0].rank.is_none() {
        // A dry run that stands for every rank of its deployment: nothing to combine.
        return Ok(plans.into_iter().next().expect("one plan"));
    }
    if let Some(i) = plans.iter().position(|p| p.ranks.is_some()) {
        return Err(Error::param(
            Param::Ranks,
            format!("plan {i} is already combined: combine the ranks' own plans"),
        ));
    }
    let ranks = ranks_of(&plans)?;
    let deployment = check_deployment(&ranks)?;
    check_alike(&plans, &ranks)?;
    let (limit, _) = plans
        .iter()
        .zip(&ranks)
        .enumerate()
        .min_by_key(|(_, (p, r))| (p.kv.num_blocks, r.global()))
        .map(|(i, (p, _))| (i, p.kv.num_blocks))
        .expect("not empty");
    let blocks = plans[limit].kv.num_blocks;
    let differ = plans.iter().any(|p| p.kv.num_blocks != blocks);
    let mut order: Vec<usize> = (0..plans.len()).collect();
    order.sort_by_key(|&i| ranks[i].global());
    let per_rank = order
        .iter()
        .map(|&i| RankPlan::of(&plans[i], ranks[i], blocks))
        .collect::<Result<Vec<_>>>()?;
    let limiting = differ.then(|| {
        order
            .iter()
            .position(|&i| i == limit)
            .expect("the limiting plan is listed")
    });
    let count = plans.len();
    let limiting_rank = ranks[limit];
    let mut p = plans.into_iter().nth(limit).expect("limit is an index");
    p.rank = Some(limiting_rank);
    p.tensor_parallel_size = deployment.tensor_parallel_size;
    p.pipeline_parallel_size = deployment.pipeline_parallel_size;
    let spread = per_rank
        .iter()
        .map(|r| format!("{}: {} blocks", r.rank.global(), r.num_blocks))
        .collect::<Vec<_>>()
        .join(", ");
    p.notes.push(match limiting {
        Some(i) => format!(
            "{count} rank plans combined: every rank maps {blocks} blocks, the fewest, those of {} ({}); per rank: {spread}",
            per_rank[i].label(),
            fmt_bytes(per_rank[i].mapped_bytes)
        ),
        None => format!(
            "{count} rank plans combined: every rank fits the same {blocks} blocks"
        ),
    });
    if let Some(i) = limiting {
        p.warnings.push(Warning::LimitingRank {
            rank: limiting_rank.global() as usize,
            ranks: count,
            device: per_rank[i]
                .device
                .clone()
                .unwrap_or_else(|| limiting_rank.to_string()),
        });
    }
    p.ranks = Some(Ranks {
        count,
        tensor_parallel_size: deployment.tensor_parallel_size,
        pipeline_parallel_size: deployment.pipeline_parallel_size,
        num_blocks: blocks,
        limiting,
        per_rank,
    });
    Ok(p)
}

#[cfg(test)]
#[path = "ranks_tests.rs"]
pub(crate) mod tests;
