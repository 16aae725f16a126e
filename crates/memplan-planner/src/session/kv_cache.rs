//! The end of a session: [`KvCache`], what a rank's KV cache gets from a plan
//! ([`Session::into_kv_cache`](crate::Session::into_kv_cache)).
//!
//! The plan handed over is this session's own plan, or a plan combined from every rank's
//! ([`crate::plan::combine_ranks`]). Either way the rank maps the plan's number of blocks in its own
//! block layout (pipeline stages hold different layers, so their blocks differ in size), and
//! never more blocks than it planned itself: a plan with more is refused, whatever its bytes
//! say.

use memplan_core::bytes::fmt_bytes;
use memplan_core::{Error, Result};

use crate::kv_range::KvRange;
use crate::plan::Plan;
use crate::rank::Rank;

/// What a session's own last plan gave this rank, kept to check the plan `into_kv_cache` gets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planned {
    pub rank: Rank,
    pub num_blocks: u64,
    pub block_bytes: u64,
    pub kv_cache_bytes: u64,
}

impl Planned {
    pub fn of(plan: &Plan, rank: Rank) -> Self {
        Planned {
            rank,
            num_blocks: plan.kv.num_blocks,
            block_bytes: plan.kv.block_bytes,
            kv_cache_bytes: plan.kv_cache_bytes,
        }
    }

    /// The blocks `plan` gives this rank: its block count, checked against this rank's own.
    /// A combined plan must hold this rank's own plan, with the figures this session planned;
    /// a single plan must be of this rank.
    pub fn blocks_of(&self, plan: &Plan) -> Result<u64> {
        let blocks = match &plan.ranks {
            Some(ranks) => {
                let mine = ranks.get(&self.rank).ok_or_else(|| {
                    Error::invalid(
                        "plan",
                        format!(
                            "the combined plan holds no plan of this rank ({}): combine every rank's own plan",
                            self.rank
                        ),
                    )
                })?;
                if (mine.num_blocks, mine.block_bytes) != (self.num_blocks, self.block_bytes) {
                    return Err(Error::invalid(
                        "plan",
                        format!(
                            "the combined plan holds {} blocks of {} bytes for this rank ({}), but this session planned {} of {}: combine this session's last plan",
                            mine.num_blocks, mine.block_bytes, self.rank, self.num_blocks, self.block_bytes
                        ),
                    ));
                }
                ranks.num_blocks
            }
            None => {
                if let Some(r) = plan.rank.filter(|r| *r != self.rank) {
                    return Err(Error::invalid(
                        "plan",
                        format!(
                            "the plan is of {r}, this session is {}: pass this session's plan or the combined one",
                            self.rank
                        ),
                    ));
                }
                plan.kv.num_blocks
            }
        };
        if blocks > self.num_blocks {
            return Err(Error::invalid(
                "plan",
                format!(
                    "the plan holds {blocks} KV blocks but this rank ({}) planned {} ({}): \
                     mapping more than a rank planned can run it out of memory; pass this \
                     session's plan or the plan combined from every rank's",
                    self.rank,
                    self.num_blocks,
                    fmt_bytes(self.kv_cache_bytes)
                ),
            ));
        }
        Ok(blocks)
    }
}

/// A rank's KV cache at the end of a session. See the module docs.
#[derive(Debug)]
#[non_exhaustive]
pub struct KvCache {
    /// Blocks the engine allocates (the plan's `kv.num_blocks`, the null block included).
    pub num_blocks: u64,
    /// Bytes those blocks take on this rank: `num_blocks` times this rank's own block bytes.
    pub bytes: u64,
    /// After post-capture: the range the engine's graphs point into, with `bytes` (rounded
    /// up to the mapping granularity; the session's plan grants whole granules, so this stays
    /// inside its `kv_cache_bytes`) mapped at its start; it releases the memory on drop.
    /// `None`: the engine allocates `bytes` itself.
    pub range: Option<KvRange>,
}

/// Map `bytes` (rounded up to the granularity) at the start of `range`.
pub(crate) fn map(range: &mut KvRange, bytes: u64) -> Result<u64> {
    let g = range.granularity();
    let rounded = bytes
        .div_ceil(g)
        .checked_mul(g)
        .ok_or_else(|| Error::invalid("plan", "the KV cache's bytes overflow 64 bits"))?;
    range.map(rounded)
}
