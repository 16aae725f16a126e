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
    /// What it maps under the combined plan: the combined blocks times its own block bytes.
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

    /// Check a combined plan read from elsewhere: its ranks belong to its deployment, once
    /// each; the blocks are the fewest; each rank maps them in its own layout; the limiting
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
        let mut seen = std::collections::BTreeSet::new();
        for r in &self.per_rank {
            r.rank.validate()?;
            if !r.rank.same_deployment(&deployment) || !seen.insert(r.rank.global()) {
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
/// tensor-parallel ranks in order, of the plans' own tensor-parallel size (or of as many
/// ranks as plans, when there are more). Mixing both is an error.
fn ranks_of(plans: &[Plan]) -> Result<Vec<Rank>> {
    let n = (plans.len() as u64).max(plans[0].tensor_parallel_size);
    match plans.iter().filter(|p| p.rank.is_some()).count() {
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

/// Check that `ranks` form one deployment: the same sizes, each rank at most once, every
/// pipeline stage present (its layers need a KV cache). Tensor-parallel ranks left out of a
/// stage are allowed: they cannot map the combined plan ([`crate::Session::into_kv_cache`]
/// looks for the session's own rank in it).
fn check_deployment(ranks: &[Rank]) -> Result<Rank> {
    let first = ranks[0];
    let mut seen = std::collections::BTreeMap::new();
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
    for stage in 0..first.pipeline_parallel_size {
        if !ranks.iter().any(|r| r.pipeline_parallel_rank == stage) {
            return Err(Error::param(
                Param::Ranks,
                format!(
                    "no plan of pipeline stage {stage} (of {}): every stage's KV cache bounds the blocks",
                    first.pipeline_parallel_size
                ),
            ));
        }
    }
    Ok(first)
}

/// Combine the plans of a deployment's ranks (see the module docs): every rank gets the fewest
/// blocks of any. One plan that names no rank (a dry run standing for every rank of its
/// deployment) is returned as it is. Errors ([`Error::InvalidParam`] on [`Param::Ranks`] or
/// [`Param::BlockSize`]): no plans, a plan that is itself combined, ranks of different
/// deployments or listed twice, a pipeline stage without a plan, ranks with different block
/// sizes, ranks of one stage with different KV layouts.
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
    let block_size = plans[0].kv_spec.block_size;
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
