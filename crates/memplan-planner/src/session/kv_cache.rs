//! The end of a session: [`KvCache`], what a rank's KV cache gets from a plan
//! ([`Session::into_kv_cache`](crate::Session::into_kv_cache)).
//!
//! The plan handed over is this session's own plan, or a plan combined from every rank's
//! ([`crate::plan::combine_ranks`]). Either way the rank maps the plan's number of blocks in its own
//! block layout (pipeline stages hold different layers, so their blocks differ in size), and
//! never more blocks than it planned itself: a plan with more is refused, whatever its bytes
//! say.
//!
//! An engine that allocates its KV cache itself (no post-capture range) and offers
//! [`Engine::allocate_kv_cache`] has the session allocate it, between two snapshots: the plan
//! knows the blocks' bytes but not how the engine lays them out (vLLM allocates one tensor per
//! layer) nor how its allocator rounds each allocation (2 MiB, the 20 MiB pages of expandable
//! segments, or whatever another allocator does). Where what the blocks took exceeds what the
//! plan kept for the KV cache (its budget, or its physical cap), the engine releases them and
//! allocates the blocks that fit beside the largest overhead measured so far (what it took
//! beyond the blocks' own bytes, which a few blocks less do not shrink), at most
//! [`KV_ATTEMPTS`] times ([`Warning::KvCacheShrunk`]). An attempt that runs out of memory is
//! released and retried with a sixteenth fewer. The measurement replaces the plan's
//! assumption about rounding.
//!
//! Before the planned count is allocated, where the engine's allocator offers tensors
//! ([`AllocatorView::allocate_tensor`]), one tensor of the planned size is allocated on its own
//! and what it took read: a cache of equal tensors each rounded alone takes at most that many
//! times it, so the count is cut to what fits by that measure first, one tensor a step
//! ([`count_by_one_tensor`]). Else (or where its tensors are not rounded alone), the
//! allocator's granule is measured on caches of at most half the planned blocks and one more
//! just past a multiple of what they read, and the planned count is cut to what fits with that
//! granule, or grown to it where the plan is this rank's own ([`kv_granule`](super::kv_granule)
//! holds that measurement and its contract). A cut or grown count whose cache takes other than
//! the granule predicted is released, and the planned count allocated. Where neither gave a
//! count but one tensor of the planned size alone says the planned cache does not fit, the
//! count is measured tensor by tensor through the allocator, never past the room
//! ([`kv_tensors`](super::kv_tensors)). An allocator that packs the tensors into pages
//! (expandable segments, declared) has the planned count allocated whole, and grown to the
//! count of a finer page where the plan kept a coarser one than the cache showed (the plan
//! keeps the coarsest page the configuration allows; `finer_count`).
//!
//! An engine that allocates its KV cache only after the session (no hook) gets the same measurement
//! where its allocator offers tensors ([`AllocatorView::allocate_tensor`]): the session allocates
//! the plan's layout (one tensor of `blocks x page` bytes per layer, vLLM's up to 0.28; one tensor
//! of `blocks x block bytes` where the rules say the engine allocates one backing allocation,
//! vLLM's from 0.29.0; a K and a V tensor of half a page each per layer where they say it allocates
//! them apart, SGLang's up to 0.5.22) through that allocator, reads what it reserved, and frees it
//! at once; the count it hands over ([`KvCache::num_blocks`]) is what fitted. This measures the
//! plan's layout, not the engine's: an engine whose layout differs offers the hook. Where neither
//! is offered, the count is the plan's, and the allocator's rounding is bounded, not measured: the
//! plan kept room for rounding each tensor up to the coarsest granule the engine's own allocations
//! during the start-up allow ([`granule_bound`](crate::plan::granule_bound),
//! [`Warning::KvAllocationUnmeasured`]).
//!
//! [`AllocatorView::allocate_tensor`]: memplan_core::AllocatorView::allocate_tensor

use memplan_core::bytes::fmt_bytes;
use memplan_core::kv::{KvLimits, KvSpec, SizingRules};
use memplan_core::{Error, MemoryInfo, Reading, Result, TensorId};

use crate::engine::Engine;
use crate::kv_range::KvRange;
use crate::plan::Plan;
use crate::rank::Rank;
use crate::session::Recorder;

use super::kv_granule::by_granule;
use super::kv_tensors::{by_tensors, largest_fitting};
use crate::warning::Warning;

/// Most allocations of the KV cache the session asks of an engine (see the module docs):
/// enough to double the cut from one block past an allocator granule of up to 2^20 blocks and
/// bisect back to the last block that fits, so a cache is shrunk by what its excess costs and
/// no more (each attempt is one allocation and its release; a coarse granule, where a smaller
/// attempt takes no less, is what needs them).
pub const KV_ATTEMPTS: usize = 42;

/// The KV cache's layout as the planner knows it: `tensors` tensors of `n x page` bytes for a
/// cache of `n` blocks (vLLM v1 up to 0.28: one tensor per layer of a KV-cache group,
/// `GPUModelRunner._allocate_kv_cache_tensors`; from 0.29.0 `page` is the whole block, one
/// tensor; SGLang up to 0.5.22: a K and a V tensor per layer, `page` half a layer's page; see
/// [`crate::plan::kv_layout`]). `None` where the block is not whole pages.
pub(crate) fn layout(block_bytes: u64, page_bytes: u64) -> Option<(u64, u64)> {
    let tensors = block_bytes.checked_div(page_bytes)?;
    (tensors > 0 && tensors.checked_mul(page_bytes) == Some(block_bytes))
        .then_some((tensors, page_bytes))
}

/// Whether the session can measure the plan's layout of `kv` through tensors from the engine's
/// allocator ([`Allocating::Tensors`]): only where the plan builder knows the engine's tensors
/// ([`crate::plan::kv_layout`], the one rule both follow): a block of whole pages of one size,
/// one tensor per layer, or one backing allocation (`KvAllocation::OneBacking`, vLLM 0.29.0
/// on, `vllm/v1/worker/utils.py` `allocate_kv_cache`), measured with one tensor of `blocks x
/// block bytes` whatever its pages, or a K and a V tensor of one size per layer
/// (`KvAllocation::SplitKv`, SGLang 0.5.1 to 0.5.22, `MHATokenToKVPool`), measured with two
/// tensors of half a page per layer. vLLM 0.19.0 lays full-attention (or MLA) layers of several
/// shapes out as one group of `UniformTypeKVCacheSpecs` whose tensors differ in size
/// (`vllm/v1/core/kv_cache_utils.py`, `get_kv_cache_config_from_groups`: one `KVCacheTensor`
/// per layer of `per_layer_specs[layer_name].page_size_bytes * num_blocks`); equal tensors of
/// the largest page would not take what those take (even where the block happens to be a whole
/// number of them), so such a cache goes unmeasured, and the plan fits its tensors each rounded
/// by the allocator's rules on its own (`plan::footprint::per_layer_pages`).
pub(crate) fn measurable_layout(kv: &KvSpec, limits: &KvLimits, rules: &SizingRules) -> bool {
    kv.size_with(0, limits, rules)
        .is_ok_and(|s| crate::plan::kv_layout(kv, &s, rules).is_some())
}

/// What one tensor of `bytes` takes from the engine's allocator (its reserved growth), on
/// fresh segments: a tensor it served from segments it had cached (it grew by less than the
/// tensor's bytes: free space beside the weights, say) is held, so that the next one is not,
/// at most `most` times. Every tensor is freed and the cache released after. The engine is
/// synchronized first (a snapshot): where the driver lets go of released segments only then,
/// the last tensor's would otherwise still be held beside this one. `None` where the
/// allocator offers no tensors, runs out of memory, or served every one from its cache.
pub(super) fn one_tensor(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    bytes: u64,
    most: u64,
) -> Result<Option<u64>> {
    rec.snap(engine)?;
    let mut held = Vec::new();
    let mut took = None;
    let mut failed = None;
    for _ in 0..most.max(1) {
        let a = engine.allocator();
        let before = a.stats().reserved;
        match a.allocate_tensor(bytes) {
            Ok(Some(id)) => held.push(id),
            Ok(None) => break,
            Err(e) if e.is_out_of_memory() => break,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        let grew = a.stats().reserved.saturating_sub(before);
        if grew >= bytes {
            took = Some(grew);
            break;
        }
    }
    free_all(engine, &mut held)?;
    failed.map_or(Ok(took), Err)
}

/// Where the engine's allocator offers tensors, the most blocks, at most `planned`, whose
/// `tensors` tensors of `n x page` bytes fit in `limit` by what one of them takes, with what
/// the planned count takes by that measure; `None` where the measure does not hold (the
/// granule is then measured on whole caches, [`kv_granule`](super::kv_granule)). See
/// [`count_by_one_tensor`].
fn by_one_tensor(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    planned: u64,
    (tensors, page): (u64, u64),
    limit: u64,
) -> Result<Option<((u64, u64), u64)>> {
    let got = count_by_one_tensor(planned, (tensors, page), limit, |bytes| {
        one_tensor(rec, engine, bytes, tensors)
    })?;
    if let Some(((fit, _), planned_takes)) = got {
        tracing::debug!(
            planned,
            planned_takes,
            fit,
            tensors,
            "the KV cache's count by what one tensor takes"
        );
    }
    Ok(got)
}

/// The most blocks, at most `planned`, whose `tensors` tensors of `n x page` bytes fit in
/// `limit` by what one of them takes (`one(bytes)`: what a tensor of `bytes` took on fresh
/// segments, `None` where that could not be read), with what the planned count takes by that
/// measure: `((count, what it takes), what the planned count takes)`; `None` where the
/// measure does not hold.
///
/// A caching allocator gives a request it cannot serve from its cache a segment whose size
/// depends on the request's alone (a multiple of its granule, PyTorch's `get_allocation_size`
/// in `c10/<device>/<Device>CachingAllocator.cpp`), and a tensor shares its segment with the next only
/// where the segment's remainder holds it (`should_split`, then best-fit from the cached
/// blocks, `get_free_block`): a tensor large enough to be rounded on its own
/// ([`is_large_request`](crate::plan::is_large_request)) whose segment is under twice its
/// bytes shares none, so a cache of `tensors` such tensors takes at most `tensors` times what
/// one took (less where some are served from the cache). One tensor is a small share of the
/// cache whatever the allocator rounds it to, so reading it never goes past what the plan
/// kept, where a whole cache on a granule coarser than the plan assumed can; and it reads the
/// rounding of the very size it is about, where caches of other sizes can mislead (one served
/// from free space the allocator had cached reads as nothing, tensors under half the granule
/// packed two to a segment read as half of it). The count is bisected, one tensor a step;
/// tensors too small to be rounded alone, or whose segment could hold a second, leave it to
/// the whole caches.
pub(crate) fn count_by_one_tensor(
    planned: u64,
    (tensors, page): (u64, u64),
    limit: u64,
    mut one: impl FnMut(u64) -> Result<Option<u64>>,
) -> Result<Option<((u64, u64), u64)>> {
    // What a cache of `blocks` takes by one of its tensors, where the measure holds.
    let mut takes = |blocks: u64| -> Result<Option<u64>> {
        Ok(alone_takes(blocks.saturating_mul(page), &mut one)?.map(|t| t.saturating_mul(tensors)))
    };
    let Some(planned_takes) = takes(planned)? else {
        return Ok(None);
    };
    if planned_takes <= limit {
        return Ok(Some(((planned, planned_takes), planned_takes)));
    }
    // The largest count that fits, between none and one less than planned.
    let fit = largest_fitting((0, 0), planned.saturating_sub(1), |n| {
        Ok(takes(n)?.map(|t| (t <= limit).then_some(t)))
    })?;
    Ok(fit.map(|fit| (fit, planned_takes)))
}

/// What one tensor of `own` bytes takes (`one(own)`, see [`count_by_one_tensor`]) where that
/// stands for the tensor alone: a tensor large enough to be rounded on its own
/// ([`is_large_request`](crate::plan::is_large_request), else nothing is read) whose segment
/// is under twice its bytes, so that it shares none with the next; `None` otherwise.
fn alone_takes(own: u64, one: impl FnOnce(u64) -> Result<Option<u64>>) -> Result<Option<u64>> {
    if !crate::plan::is_large_request(own) {
        return Ok(None);
    }
    Ok(one(own)?.filter(|t| *t < own.saturating_mul(2)))
}

/// Where [`by_granule`] cut or grew the planned count (`cut`: the count, what the planned
/// count takes by the granule, what the count takes), the attempts start from it: `blocks` is
/// the count, the take the warning reports is the planned count's, and what the count takes
/// is the prediction its attempt is checked against.
fn start_from_cut(
    cut: Option<(u64, u64, u64)>,
    blocks: &mut u64,
    first_taken: &mut Option<u64>,
    predicted: &mut Option<(u64, u64)>,
) {
    if let Some((fit, planned_takes, p)) = cut {
        *blocks = fit;
        *first_taken = Some(planned_takes);
        *predicted = Some((fit, p));
    }
}

/// Whether the engine's allocator offers tensors ([`AllocatorView::allocate_tensor`]), asked
/// with one tensor of one byte, freed at once (the session asks before its baseline, which
/// releases the allocator's cache). An error says no: the plan then keeps the room an
/// unmeasured allocation needs, on the safe side.
///
/// [`AllocatorView::allocate_tensor`]: memplan_core::AllocatorView::allocate_tensor
pub(crate) fn offers_tensors(allocator: &mut dyn memplan_core::AllocatorView) -> bool {
    match allocator.allocate_tensor(1) {
        Ok(Some(id)) => allocator.free_tensor(id).is_ok(),
        Ok(None) | Err(_) => false,
    }
}

/// What a session's own last plan gave this rank, kept to check the plan `into_kv_cache` gets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planned {
    pub rank: Rank,
    pub num_blocks: u64,
    pub block_bytes: u64,
    /// Bytes of one block in one tensor of the cache, as the plan builder lays the engine's
    /// tensors out ([`crate::plan::kv_layout`]): the plan's `kv.page_bytes` where the engine
    /// allocates a tensor per layer, its `kv.block_bytes` where it allocates one backing
    /// allocation; 0 where the builder knows no layout of equal tensors (tensors of several
    /// sizes), which [`layout`] then reads as none: the session measures no layout the plan
    /// did not keep room for.
    pub page_bytes: u64,
    pub kv_cache_bytes: u64,
    /// What the plan kept for the KV cache: its cap where one bounded it, else its budget (the
    /// plan's blocks fit in either once the allocator rounded their tensors).
    pub room: u64,
    /// Where a physical cap (free memory, an allocation probe) bounded the plan: the budget the
    /// request allows, and what the engine still needs after the KV cache (activation, graphs
    /// still to capture, rounding slack). A cache that takes more than the cap, within the
    /// budget, is kept where that need is still allocatable beside it.
    pub capped: Option<(u64, u64)>,
    /// What the engine still needs once its KV cache is allocated (activation, graphs still to
    /// capture, rounding slack): a count grown past the planned one stands only where it is
    /// still allocatable beside the cache ([`Kept::after_kv`]).
    pub after_kv: u64,
    /// Where the plan kept a page for the cache's rounding coarser than the finest its
    /// allocator's declared configuration allows (expandable segments with a
    /// `large_segment_size_mb` past 20 MiB, [`PlanBuilder::with_finer_page`]): the blocks the
    /// same plan holds with the finer page, and the coarse page. See [`finer_count`].
    ///
    /// [`PlanBuilder::with_finer_page`]: crate::plan::PlanBuilder
    pub finer: Option<(u64, u64)>,
}

impl Planned {
    /// `after_kv`: what the engine still needs once its KV cache is allocated.
    pub fn of(plan: &Plan, rank: Rank, after_kv: u64) -> Self {
        Planned {
            capped: plan
                .capped_by_free_bytes
                .map(|_| (plan.kv_budget_bytes.max(plan.kv_cache_bytes), after_kv)),
            after_kv,
            finer: None,
            rank,
            num_blocks: plan.kv.num_blocks,
            block_bytes: plan.kv.block_bytes,
            page_bytes: crate::plan::kv_layout(&plan.kv_spec, &plan.kv, &plan.sizing_rules)
                .map_or(0, |(_, page)| page),
            kv_cache_bytes: plan.kv_cache_bytes,
            room: match plan.capped_by_free_bytes {
                Some(cap) => cap.max(plan.kv_cache_bytes),
                None => plan.kv_budget_bytes.max(plan.kv_cache_bytes),
            },
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

    /// Whether the count handed over for `plan` (`blocks`, [`blocks_of`](Self::blocks_of)) may
    /// grow past it where the measured granule leaves room for more blocks in what this plan
    /// kept: only for this session's own plan with the blocks it planned. A plan combined from
    /// every rank's gives each the fewest blocks any rank planned; a rank that grew past them
    /// would hold more than the others, whose plans never kept room for them (and an engine
    /// that shards its cache across ranks needs one count on all of them), so it maps that
    /// count or fewer. Any other plan with fewer blocks is someone's choice, not a bound the
    /// measurement replaces.
    pub fn grows(&self, plan: &Plan, blocks: u64) -> bool {
        plan.ranks.is_none() && blocks == self.num_blocks
    }
}

/// A rank's KV cache at the end of a session. See the module docs.
#[derive(Debug)]
#[non_exhaustive]
pub struct KvCache {
    /// Blocks the engine allocates, the null block included: the plan's `kv.num_blocks`, fewer
    /// where the measured allocation took more than the plan kept, or more where the allocator's
    /// granule, measured, is finer than the rounding the plan kept room for and the plan is this
    /// rank's own (see the module docs; never more than a combined plan gives every rank).
    pub num_blocks: u64,
    /// Bytes those blocks take on this rank: `num_blocks` times this rank's own block bytes.
    pub bytes: u64,
    /// After post-capture: the range the engine's graphs point into, with `bytes` (rounded
    /// up to the mapping granularity; the session's plan grants whole granules, so this stays
    /// inside its `kv_cache_bytes`) mapped at its start; it releases the memory on drop.
    /// `None`: the engine allocates `bytes` itself, unless `allocated`.
    pub range: Option<KvRange>,
    /// The engine allocated the cache inside the session ([`Engine::allocate_kv_cache`]) and
    /// holds it: `num_blocks` and `bytes` are what it holds.
    pub allocated: bool,
    /// What the session had to change (a cache shrunk to fit the plan).
    pub warnings: Vec<Warning>,
}

/// What `blocks` of `block_bytes` took between two snapshots: the allocator's reserved growth
/// (exact for this process's own allocator); where that is less than the blocks' own bytes
/// (the engine allocated them outside its allocator), the driver's used growth where the free
/// reading measures this process. A free reading's growth past the blocks' own bytes by no
/// more than its tolerance, or the step it moves in, is that reading's error as much as
/// anything the cache took: it counts as the blocks' own bytes (a free reading in 256 MiB steps reads a cache of
/// 58.96 GiB as 59.00 GiB, and a cache that fits the plan's room would be shrunk for it).
fn taken(rec: &Recorder, before: &MemoryInfo, after: &MemoryInfo, own: u64) -> u64 {
    let w = before.window_to(after);
    let allocator = w.allocator_reserved.unwrap_or(0).max(0) as u64;
    if allocator >= own {
        return allocator;
    }
    let free = rec.p.capability.reading(Reading::DriverFree);
    let driver = w
        .driver_used
        .filter(|_| free.measures_own_usage())
        .unwrap_or(0)
        .max(0) as u64;
    let driver = if driver > own && driver - own <= free.tolerance_bytes().max(rec.p.free_step) {
        own
    } else {
        driver
    };
    allocator.max(driver)
}

/// Who allocates the caches the session measures.
pub(crate) enum Allocating {
    /// The engine, in its own layout ([`Engine::allocate_kv_cache`]); it keeps the last.
    Engine,
    /// The session, in the plan's layout (`tensors` tensors of `blocks x page` bytes), through
    /// the engine's allocator ([`AllocatorView::allocate_tensor`]); each cache is freed once
    /// measured, and the engine allocates its own after the session.
    ///
    /// [`AllocatorView::allocate_tensor`]: memplan_core::AllocatorView::allocate_tensor
    Tensors {
        tensors: u64,
        page: u64,
        held: Vec<TensorId>,
    },
}

impl Allocating {
    /// Allocate a cache of `blocks` blocks: `Ok(false)` where it is not offered.
    fn allocate(&mut self, engine: &mut dyn Engine, blocks: u64) -> Result<bool> {
        match self {
            Allocating::Engine => engine.allocate_kv_cache(blocks),
            Allocating::Tensors {
                tensors,
                page,
                held,
            } => {
                let bytes = blocks.checked_mul(*page).ok_or_else(|| {
                    Error::invalid("plan", "a KV tensor's bytes overflow 64 bits")
                })?;
                for _ in 0..*tensors {
                    match engine.allocator().allocate_tensor(bytes) {
                        Ok(Some(id)) => held.push(id),
                        Ok(None) => {
                            free_all(engine, held)?;
                            return Ok(false);
                        }
                        Err(e) => {
                            free_all(engine, held)?;
                            return Err(e);
                        }
                    }
                }
                Ok(true)
            }
        }
    }

    /// Free the cache allocated last, its allocator's cached segments included.
    pub(super) fn release(&mut self, engine: &mut dyn Engine) -> Result<()> {
        match self {
            Allocating::Engine => engine.release_kv_cache(),
            Allocating::Tensors { held, .. } => free_all(engine, held),
        }
    }
}

/// Free every tensor in `held` and give the allocator's cached segments back, so the next
/// cache is measured on fresh segments as the engine's own will be (nothing held: nothing to
/// do).
pub(super) fn free_all(engine: &mut dyn Engine, held: &mut Vec<TensorId>) -> Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    let a = engine.allocator();
    let mut first_err = None;
    for id in held.drain(..) {
        if let Err(e) = a.free_tensor(id) {
            first_err.get_or_insert(e);
        }
    }
    a.release_cached()?;
    first_err.map_or(Ok(()), Err)
}

/// One allocation of `blocks`, measured (see [`Attempt`]).
pub(super) fn attempt(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    way: &mut Allocating,
    blocks: u64,
    block_bytes: u64,
) -> Result<Attempt> {
    let before = rec.snap(engine)?;
    match way.allocate(engine, blocks) {
        Ok(false) => Ok(Attempt::NotOffered),
        Ok(true) => {
            let after = rec.snap(engine)?;
            let own = blocks.saturating_mul(block_bytes);
            Ok(Attempt::Took(taken(rec, &before, &after, own)))
        }
        Err(e) if e.is_out_of_memory() => {
            way.release(engine)?;
            Ok(Attempt::OutOfMemory)
        }
        Err(e) => Err(e),
    }
}

/// What one allocation gave.
pub(crate) enum Attempt {
    /// The engine does not offer the hook.
    NotOffered,
    /// Allocated, taking this many bytes.
    Took(u64),
    /// Ran out of memory (what it allocated is released).
    OutOfMemory,
}

/// What [`allocate_measured`] gave: the blocks that fit, the warnings, and whether the engine
/// holds them (allocated by its hook) or allocates them itself after the session.
pub(crate) struct Measured {
    pub blocks: u64,
    pub warnings: Vec<Warning>,
    pub held: bool,
}

/// What the plan kept for the KV cache, which the measured allocation is held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kept {
    /// The plan's room ([`Planned::room`]).
    pub room: u64,
    /// Where a physical cap bounded it ([`Planned::capped`]).
    pub capped: Option<(u64, u64)>,
    /// Whether the count may grow past the planned one where the measured granule is finer
    /// than the rounding the plan kept ([`Planned::grows`]).
    pub grow: bool,
    /// The coarsest granule the plan kept room for per KV tensor, where nothing measured the
    /// allocation before it (0 where none): tensors at most half of it may share segments,
    /// and measure no granule ([`measure_granule`](super::kv_granule::measure_granule)).
    pub granule: u64,
    /// The engine declared a caching allocator that packs the cache's tensors one after
    /// another into a segment it grows by pages (expandable segments,
    /// `Session::with_allocator_config`): what one tensor alone, or a granule, takes says
    /// nothing of what the whole cache takes (one tensor maps its own pages, many share
    /// them), so the planned count is allocated and measured as a whole, and where it shows
    /// a finer page than the plan kept and the count may grow, grown to the count of that page
    /// ([`finer_count`]).
    pub packed: bool,
    /// Where the plan kept a coarse page for the cache's rounding ([`Planned::finer`]): the
    /// count its arithmetic gives with the finer page, and the coarse page.
    pub finer: Option<(u64, u64)>,
    /// What the engine still needs beside its KV cache ([`Planned::after_kv`]). A count grown
    /// past the planned one spends room the plan kept for the allocator's rounding, on the
    /// strength of readings that said the rest was there; a reading that missed memory others
    /// hold (a process-local free reading declared exact, say) makes the grown cache take what
    /// the engine's activation needs, and the engine runs out of memory in its first burst.
    /// So a grown count stands only where this much is still allocatable beside it (one raw
    /// allocation, freed at once; where the device cannot allocate raw memory, as before).
    pub after_kv: u64,
}

/// Allocate `planned` blocks of `block_bytes`, fewer where they take more than the room kept
/// (more where the measured granule leaves room for more and `kept.grow`; see the module
/// docs): by the engine's hook where it offers one (the engine keeps the cache), else in the
/// plan's layout through the engine's allocator where it offers tensors (freed at once: the
/// engine allocates its own). `Ok(None)`: neither is offered.
pub(crate) fn allocate_measured(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    planned: u64,
    (block_bytes, page_bytes): (u64, u64),
    kept: Kept,
) -> Result<Option<Measured>> {
    let sizes = (block_bytes, page_bytes);
    let engine_way = &mut Allocating::Engine;
    if let Some((blocks, warnings)) = measured_with(rec, engine, engine_way, planned, sizes, kept)?
    {
        return Ok(Some(Measured {
            blocks,
            warnings,
            held: true,
        }));
    }
    let Some((tensors, page)) = layout(block_bytes.max(1), page_bytes) else {
        tracing::info!("the engine allocates its KV cache after the session and its layout is not whole pages: the allocator's rounding is not measured");
        return Ok(None);
    };
    let mut way = Allocating::Tensors {
        tensors,
        page,
        held: Vec::new(),
    };
    let got = measured_with(rec, engine, &mut way, planned, sizes, kept);
    // Freed whatever happened, and the device synchronized (a snapshot), as the engine's own
    // release is followed by the next reading's: a driver that lets go of freed memory only at
    // a synchronize would otherwise still hold the last cache when the engine allocates its own.
    let measured = matches!(got, Ok(Some(_)));
    let freed = way.release(engine).and_then(|()| {
        if measured {
            rec.snap(engine).map(drop)
        } else {
            Ok(())
        }
    });
    let got = got?;
    freed?;
    if got.is_none() {
        tracing::info!("the engine allocates its KV cache after the session and its allocator offers no tensor allocation: the allocator's rounding is not measured");
    }
    Ok(got.map(|(blocks, warnings)| Measured {
        blocks,
        warnings,
        held: false,
    }))
}

/// [`allocate_measured`] with one way of allocating. `Ok(None)`: it is not offered.
fn measured_with(
    rec: &mut Recorder,
    engine: &mut dyn Engine,
    way: &mut Allocating,
    planned: u64,
    (block_bytes, page_bytes): (u64, u64),
    Kept {
        room,
        capped,
        grow,
        granule,
        packed,
        finer,
        after_kv,
    }: Kept,
) -> Result<Option<(u64, Vec<Warning>)>> {
    let block_bytes = block_bytes.max(1);
    let mut blocks = planned;
    let mut first_taken = None;
    // The count cut to the measured granule and what it predicts that count takes.
    let mut predicted: Option<(u64, u64)> = None;
    // The attempt whose take the warning reports (the first of the planned count, or the cut).
    let mut first_attempt = 0;
    // The most the tensors may take: within the budget the request allows (a physical cap
    // below it is checked by the attempts themselves).
    let limit = capped.map_or(room, |(budget, _)| budget.max(room));
    let l = layout(block_bytes, page_bytes).filter(|_| planned >= 2 && !packed);
    // Where the engine's allocator offers tensors, the count is chosen by what one tensor of
    // it takes (see [`by_one_tensor`]); else the allocator's granule is measured first, on
    // caches of half the size, and the planned count is cut to what fits with it before it is
    // allocated.
    let mut alone = match l {
        Some(l) => by_one_tensor(rec, engine, planned, l, limit)?,
        None => None,
    };
    // Whether a cache the engine allocated showed its layout is not the plan's: then nothing
    // measured in the plan's layout stands for it.
    let mut other_layout = false;
    // A count an engine's cache was measured to fit at, within the room: the least the search
    // below ends on. An allocator's rounding need not grow with the count (tensors of one size
    // share segments where those of a smaller size take one each), so a smaller count that took
    // more says nothing of this one: an engine's cache of 1,024 blocks took 572 MiB of a 1 GiB
    // room and its search, from the planned 2,048 (1.62 GiB) down, found 768 to 129 blocks
    // taking 1.62 GiB each and ended on 128 (1,016 tokens where the engine alone held 13,300).
    let mut measured_fit: Option<u64> = None;
    // One tensor measures the plan's layout. The session's own tensors are laid out so; an
    // engine's hook may lay its cache out otherwise (one backing allocation where the plan has
    // a tensor per layer, say), so the measure stands for it only where a cache the engine
    // allocated, of half the planned blocks, took what one tensor of its size says some of
    // its tensors take: a whole number of such tensors, at most all of them (the allocator
    // may serve the others from free space it had cached); else the engine's own
    // allocations are measured, as where no tensors are offered.
    if let (Some(_), Some((tensors, page)), Allocating::Engine) = (alone, l, &*way) {
        let half = (planned / 2).max(1);
        let own = half.saturating_mul(page);
        let one = alone_takes(own, |b| one_tensor(rec, engine, b, tensors))?;
        let took = match attempt(rec, engine, way, half, block_bytes)? {
            Attempt::NotOffered => return Ok(None),
            Attempt::OutOfMemory => None,
            Attempt::Took(t) => {
                way.release(engine)?;
                Some(t)
            }
        };
        let whole = one.zip(took).is_some_and(|(one, t)| {
            t > 0 && t.is_multiple_of(one.max(1)) && t / one.max(1) <= tensors
        });
        if !whole {
            tracing::info!(half, ?took, ?one, tensors, "the engine's KV cache of half the planned blocks took other than whole tensors of the plan's layout: its own allocations are measured");
            alone = None;
            other_layout = true;
            measured_fit = took.filter(|t| *t <= room).map(|_| half);
        }
    }
    // The count cut by one tensor's measure and what that measure says it takes.
    let mut alone_predicted: Option<(u64, u64)> = None;
    if let Some(((fit, fit_takes), planned_takes)) = alone {
        if fit < planned {
            tracing::info!(
                planned,
                fit,
                planned_takes,
                "the planned KV cache would not fit by what one of its tensors takes"
            );
            blocks = fit.max(1);
            first_taken = Some(planned_takes);
            alone_predicted = Some((blocks, fit_takes));
        }
    } else if let Some(l) = l {
        let Some(cut) = by_granule(rec, engine, way, planned, l, (limit, room, granule), grow)?
        else {
            return Ok(None);
        };
        // Where nothing cut the count, but one planned tensor alone says the planned cache
        // does not fit, it is measured tensor by tensor ([`by_tensors`]) rather than allocated
        // whole past the room: in the plan's layout, so not where the engine's own cache
        // showed another (one backing allocation where the plan has a tensor per layer).
        // Where a granule read on smaller caches cut it, the cut may stand on tensors packed
        // into shared segments: a cache of half the blocks whose 11 MiB tensors shared 40 MiB
        // segments three to one read 13.1 MiB each, as a granule, and the planned 22 MiB
        // tensors were cut to 13.1 MiB ones, where 20 MiB tensors two to a segment fitted
        // (the engine served 66% of what it could). Measured tensor by tensor, the count
        // holds however the allocator packs them: the larger count stands.
        let cut = match cut {
            None if !other_layout => by_tensors(rec, engine, planned, l, limit)?,
            Some(c) if c.0 < planned && !other_layout => {
                match by_tensors(rec, engine, planned, l, limit)? {
                    Some(t) if t.0 > c.0 => Some(t),
                    _ => Some(c),
                }
            }
            cut => cut,
        };
        start_from_cut(cut, &mut blocks, &mut first_taken, &mut predicted);
    }
    // The most the engine's layout and allocator took beyond the blocks' own bytes: it does
    // not shrink with a few blocks less (each tensor is rounded to a granule), so the next
    // attempt leaves room for it; where a smaller attempt took no less, the granule is coarser
    // than the cut, and the cut doubles. Once one attempt fits, the rest bisect between the
    // largest count that fit and the smallest that did not.
    let mut waste = 0u64;
    let mut step = 1u64;
    let mut last_taken: Option<u64> = None;
    // Below the count the search starts from only (it bisects up from there).
    let (mut fit, mut over): (Option<u64>, Option<u64>) =
        (measured_fit.filter(|f| *f < blocks), None);
    // What the planned count took where it fit the room: a count grown past it that takes no
    // more stands as it did ([`grown_fits`]).
    let mut planned_took: Option<u64> = None;
    for n in 0..KV_ATTEMPTS {
        let taken = match attempt(rec, engine, way, blocks, block_bytes)? {
            Attempt::NotOffered => return Ok(None),
            Attempt::Took(t) => Some(t),
            Attempt::OutOfMemory => None,
        };
        if blocks == planned {
            planned_took = taken.filter(|t| *t <= room).or(planned_took);
        }
        if n == first_attempt && first_taken.is_none() {
            first_taken = taken;
        }
        // One tensor measures the plan's layout: an engine's own cache that took less than
        // that measure said is laid out or rounded otherwise (one backing allocation where the
        // plan has a tensor per layer, say), and the cut stands on nothing. It is released and
        // the engine's own allocation measured instead, on caches of half the size as where
        // the allocator offers no tensors, from the planned count.
        if let (Some((cut, p)), Some(t), Some(l)) = (alone_predicted.take(), taken, l) {
            if cut == blocks && t < p {
                tracing::info!(blocks, taken = t, predicted = p, "the engine's KV cache took less than one tensor of the plan's layout said: measuring its own allocation instead");
                way.release(engine)?;
                blocks = planned;
                first_taken = None;
                first_attempt = n + 1;
                let Some(cut) =
                    by_granule(rec, engine, way, planned, l, (limit, room, granule), grow)?
                else {
                    return Ok(None);
                };
                start_from_cut(cut, &mut blocks, &mut first_taken, &mut predicted);
                continue;
            }
        }
        // The cut (or grown) count is near the full size: where it takes other than the
        // granule predicted, the allocator does not round these tensors to that granule (the
        // smaller caches were rounded another way, e.g. packed into shared segments), and the
        // count stands on nothing: released, and the planned count allocated as planned.
        if let (Some((cut, p)), Some(t)) = (predicted.take(), taken) {
            if cut == blocks && t != p {
                tracing::info!(blocks, taken = t, predicted = p, "the measured granule did not predict the KV cache of the count it gave: allocating the planned count");
                way.release(engine)?;
                blocks = planned;
                first_taken = None;
                first_attempt = n + 1;
                continue;
            }
        }
        match taken {
            Some(t)
                if (t <= room
                    && (blocks <= planned
                        || grown_fits(rec, blocks, (t, room, planned_took), after_kv)?))
                    || still_fits(rec, t, capped)? =>
            {
                fit = Some(blocks);
                let last = n + 1 == KV_ATTEMPTS;
                // Tensors packed into pages, measured whole: a planned cache that took no
                // whole number of the coarse pages the plan kept grows to the count of the
                // finer page ([`finer_count`]), bisected back from there where it takes more.
                let grown = (packed && grow && over.is_none() && blocks == planned && !last)
                    .then(|| finer_count(finer, blocks, t))
                    .flatten();
                if let Some(more) = grown {
                    tracing::info!(
                        blocks,
                        taken = t,
                        room,
                        more,
                        "the KV cache, its tensors packed into pages, took no whole number of the pages the plan kept: the count grows to what the finer page holds, measured"
                    );
                    way.release(engine)?;
                    blocks = more;
                    continue;
                }
                // A grown count stands on a check that allocates and frees raw memory
                // ([`grown_fits`]); on a device that keeps memory of every raw free, each
                // further count bisected up spends a keep, and the room with it: an Arc B580
                // keeping 32 MiB a free, its count grown past the plan's, fitted 918 blocks of
                // 960, then bisected 939, 928, 923, 920 and on, each check failing as the keeps
                // took the room, until no count fitted and the start was refused. The first
                // grown count that stands there is kept.
                let keeps = blocks > planned && own_keep(rec) > 0;
                if over.is_none_or(|o| o <= blocks + 1) || last || keeps {
                    return Ok(Some((blocks, shrunk(planned, blocks, first_taken, room))));
                }
            }
            _ => over = Some(blocks),
        }
        // Released, and the next count chosen.
        if fit != Some(blocks) || taken.is_none() {
            if let Some(t) = taken {
                way.release(engine)?;
                tracing::info!(
                    blocks,
                    taken = t,
                    room,
                    "the KV cache took more than the plan kept"
                );
                waste = waste.max(t.saturating_sub(blocks.saturating_mul(block_bytes)));
                if last_taken.is_some_and(|l| t >= l) {
                    step = step.saturating_mul(2);
                }
                last_taken = Some(t);
            }
        } else {
            way.release(engine)?;
        }
        blocks = match (fit, over) {
            (Some(lo), Some(hi)) => lo + (hi - lo) / 2,
            // A count grown past the planned one that did not stand: the planned count, which
            // the plan kept room for, and the bisection between them.
            (None, Some(hi)) if hi > planned && grown_back(&taken, room) => planned,
            _ => {
                let fits = room.saturating_sub(waste) / block_bytes;
                let cut = match taken {
                    Some(_) => (blocks - fits.min(blocks)).max(1).saturating_mul(step),
                    None => blocks.div_ceil(16),
                };
                blocks.saturating_sub(cut)
            }
        };
    }
    // The last attempts bisected without settling: allocate the largest count that fit.
    if let Some(lo) = fit {
        if let Attempt::Took(t) = attempt(rec, engine, way, lo, block_bytes)? {
            if (t <= room
                && (lo <= planned || grown_fits(rec, lo, (t, room, planned_took), after_kv)?))
                || still_fits(rec, t, capped)?
            {
                return Ok(Some((lo, shrunk(planned, lo, first_taken, room))));
            }
            way.release(engine)?;
        }
    }
    Err(Error::Measurement(format!(
        "the engine's KV cache still took more than the {} the plan kept for it after {KV_ATTEMPTS} allocations (the first for {planned} blocks took {})",
        fmt_bytes(room),
        first_taken.map_or("all the memory there was".into(), fmt_bytes),
    )))
}

/// Where the engine's allocator packs the cache's tensors into pages (expandable segments,
/// [`Kept::packed`]) and the count may grow ([`Kept::grow`]): the count the plan would have
/// held with the finer page ([`Kept::finer`]: that count and the coarse page the plan kept),
/// where the planned cache of `blocks` took `taken`, no whole number of coarse pages, so the
/// allocator did not map them; `None` otherwise (no finer count, or none larger).
///
/// The plan keeps room for the tensors' sum rounded up to the coarsest page the declared
/// configuration allows (a `large_segment_size_mb` that a release may take for the page,
/// `plan/footprint.rs`, `expandable_footprint`), since nothing before the cache's allocation
/// tells which page the allocator maps; a segment grows by whole pages, so a cache measured
/// whole shows it. A 1 GiB page kept for a cache whose allocator mapped 20 MiB pages held it
/// to 14 GiB in a room of 14.25 GiB: 16,384 blocks where 16,671 fitted (98.3%). The finer count
/// is the plan's own arithmetic with the finer page, not the room filled to what the cache
/// took: filled so, the room the plan's page kept for the rounding of what comes after the
/// cache in the same segment (the activation's pages) was gone, and serving went a few MiB past
/// the request; and a count grown by its bytes alone took half as much again where
/// `roundup_power2_divisions` rounds each tensor. The count is allocated and measured as any
/// other: it stands only within the room and where what the engine still needs beside it is
/// allocatable ([`grown_fits`]), and one that took more is bisected back to the planned count.
fn finer_count(finer: Option<(u64, u64)>, blocks: u64, taken: u64) -> Option<u64> {
    let (fine, coarse) = finer?;
    (fine > blocks && taken > 0 && !taken.is_multiple_of(coarse.max(1))).then_some(fine)
}

/// A cache that took `taken`, more than the physical cap kept for it: within the budget the
/// request allows, and with what the engine still needs after it allocatable now (one
/// allocation, freed at once), it fits: the cap was a bound (a probe's resolution, a reading's
/// tolerance), and the allocation measures it.
///
/// The check's own free is one more raw free: on a device that keeps memory of every free
/// ([`Profile::kept_per_free`](crate::profile::Profile::kept_per_free), or the bound the reading's noise
/// leaves on it), it leaves that much less than it found, so it asks for the engine's need
/// plus that keep. Asking for the need alone would pass on a room that the check itself then
/// makes too small for the engine's first allocation after it.
fn still_fits(rec: &Recorder, taken: u64, capped: Option<(u64, u64)>) -> Result<bool> {
    let Some((budget, after_kv)) = capped else {
        return Ok(false);
    };
    if taken > budget {
        return Ok(false);
    }
    let Some((ask, kept)) = with_own_keep(rec, after_kv) else {
        return Ok(false);
    };
    match crate::session::probe::fits(&rec.device, ask) {
        Ok(fits) => {
            tracing::info!(taken, after_kv, kept, fits, "the KV cache took more than its cap: what the engine still needs allocated beside it (and what the check's own free keeps)");
            Ok(fits)
        }
        Err(Error::Unsupported { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What one raw free of the session's keeps on this device: its measured keep per free, else
/// the bound the reading's noise leaves on it, else nothing.
fn own_keep(rec: &Recorder) -> u64 {
    rec.p
        .keep_per_free_bound()
        .or(rec.p.unseen_kept_per_free)
        .max(rec.probe_free_keep)
        .unwrap_or(0)
}

/// `need` and what one raw free of the session's keeps ([`own_keep`]), with that keep: `None`
/// where the sum overflows (no such allocation can be asked for).
fn with_own_keep(rec: &Recorder, need: u64) -> Option<(u64, u64)> {
    let kept = own_keep(rec);
    need.checked_add(kept).map(|ask| (ask, kept))
}

/// A cache of `blocks`, grown past the planned count, within the room: what the engine still
/// needs beside it (`after_kv`, and what the check's own free keeps) is allocatable now. See
/// [`Kept::after_kv`]. A device that cannot allocate raw memory cannot check it: the grown
/// count stands on the readings, as the plan did.
///
/// The check itself stays within the request: the cache took `taken` of the `room` the plan
/// kept, so the request has `room - taken + after_kv` left, and a raw allocation is rounded up
/// by as much as calibration allows one ([`tolerance`](crate::calibrate::tolerance)); where
/// the need is closer to that than the rounding, the check asks for what the request holds.
///
/// A grown count that took no more than the planned count did within the room
/// (`planned_took`: tensors packed into pages, the finer count filling pages the planned one
/// already took) holds nothing the planned count did not, and stands as the planned count
/// did, unchecked. Where the check's own free keeps memory for good, that keep is the grown
/// count's too: it stays this process's beside the cache, and the engine's need comes after
/// it. A grown count whose room left over (`room - taken`) cannot hold it does not stand
/// here, and no check is made: asking for only what the request holds, as above, passes where
/// the engine's need fits and the keep does not, and the keep then takes the engine's room (an
/// Arc B580 keeping 96 MiB a free: a count grown within the 146.8 MB pages the planned count
/// took, 5 MB short of its room, passed its check, whose free left the engine's first
/// activation allocation of 461 MiB out of memory in serving). The check of a cache past its
/// cap ([`still_fits`]), which asks for the need and the keep whole, may still hold it.
fn grown_fits(
    rec: &Recorder,
    blocks: u64,
    (taken, room, planned_took): (u64, u64, Option<u64>),
    after_kv: u64,
) -> Result<bool> {
    if planned_took.is_some_and(|p| taken <= p) {
        return Ok(true);
    }
    let Some((need, kept)) = with_own_keep(rec, after_kv) else {
        return Ok(false);
    };
    if kept > room.saturating_sub(taken) {
        tracing::info!(blocks, taken, room, kept, "a KV cache grown past the plan's count leaves less room than the check beside it keeps of its own free: the count goes back down");
        return Ok(false);
    }
    // The room is the request less figures the free reading's windows may have read low by
    // their error, which the plan keeps a margin for: the check takes it off, as the plan's own
    // probes do (a count grown on a reading in 30 MiB steps went 1.25 MiB past the request).
    let left = room
        .saturating_sub(taken)
        .saturating_add(after_kv)
        .saturating_sub(rec.held_error())
        .saturating_sub(crate::calibrate::tolerance(0));
    let ask = need.min(left);
    match crate::session::probe::fits(&rec.device, ask) {
        Ok(fits) => {
            if !fits {
                tracing::info!(blocks, after_kv, "a KV cache grown past the plan's count leaves no room for what the engine still needs beside it: the readings missed memory, and the count goes back down");
            }
            Ok(fits)
        }
        Err(Error::Unsupported { .. }) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Whether a grown count that did not stand goes back to the planned count: where it took no
/// more than the room (what the engine needs beside it was missing, [`grown_fits`]). One that
/// took more than the room is cut by what it wasted, as any other.
fn grown_back(taken: &Option<u64>, room: u64) -> bool {
    taken.is_some_and(|t| t <= room)
}

/// The warning of a shrunk cache (none when the planned blocks fit).
fn shrunk(planned: u64, blocks: u64, first_taken: Option<u64>, room: u64) -> Vec<Warning> {
    if blocks >= planned {
        return Vec::new();
    }
    vec![Warning::KvCacheShrunk {
        planned_blocks: planned,
        blocks,
        taken: first_taken.unwrap_or(u64::MAX),
        room,
    }]
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

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::MIB;
    use memplan_core::kv::{AttentionKind, KvDtype, LayerGroup};

    #[test]
    fn tensors_of_several_sizes_are_not_measured_as_equal_ones() {
        let rules = SizingRules::default();
        let limits = KvLimits::new(8192, 8192);
        let full = |layers, heads, dim| LayerGroup::new(AttentionKind::Full, layers, heads, dim);
        let spec = |groups| KvSpec::new(groups, KvDtype::Bf16, 16);
        // One shape: a tensor per layer, all of one page.
        assert!(measurable_layout(
            &spec(vec![full(32, 8, 128)]),
            &limits,
            &rules
        ));
        // gemma-3: 7 groups of 10 layers, 10 tensors of one page (vLLM 0.19.0,
        // `_get_kv_cache_groups_uniform_page_size`: `group_size` tensors shared by the groups).
        let sliding = LayerGroup::new(AttentionKind::SlidingWindow { window: 1024 }, 52, 16, 128);
        assert!(measurable_layout(
            &spec(vec![sliding, full(10, 16, 128)]),
            &limits,
            &rules
        ));
        // Two full shapes: one `UniformTypeKVCacheSpecs` group, a tensor per layer of its own
        // page (28 of 64 KiB, 4 of 8 KiB): no equal tensors reproduce them.
        assert!(!measurable_layout(
            &spec(vec![full(28, 8, 128), full(4, 2, 64)]),
            &limits,
            &rules
        ));
        // Two full shapes whose block happens to be a whole number of the larger page (28 of
        // 64 KiB and 4 of 16 KiB: 29 x 64 KiB): still 32 tensors of two sizes, not 29 equal.
        assert!(!measurable_layout(
            &spec(vec![full(28, 8, 128), full(4, 4, 64)]),
            &limits,
            &rules
        ));
    }

    #[test]
    fn k_and_v_apart_are_measured_as_two_tensors_of_half_a_page_per_layer() {
        use memplan_core::kv::KvAllocation;
        // SGLang 0.5.1 to 0.5.22 (`MHATokenToKVPool._create_buffers`): a K and a V tensor per
        // layer of `rows x heads x head_dim`; 32 layers of 8 heads of 128 in bf16, one-token
        // pages: 4 KiB a layer, 2 KiB each of K and V.
        let limits = KvLimits::new(8192, 8192);
        let llama = KvSpec::new(
            vec![LayerGroup::new(AttentionKind::Full, 32, 8, 128)],
            KvDtype::Bf16,
            1,
        );
        let split = SizingRules::default().with_kv_allocation(KvAllocation::SplitKv);
        let paired = SizingRules::default().with_kv_allocation(KvAllocation::PairedKv);
        let s = llama.size_with(0, &limits, &split).unwrap();
        assert_eq!((s.page_bytes, s.block_bytes), (4096, 32 * 4096));
        let l = crate::plan::kv_layout(&llama, &s, &split);
        assert_eq!(l, Some((64, 2048)));
        // What the session hands the measurement (`Planned::page_bytes`) gives the same.
        assert_eq!(layout(s.block_bytes, 2048), l);
        assert!(measurable_layout(&llama, &limits, &split));
        // SGLang 0.5.23: K and V halves of one tensor per layer, as one per layer.
        assert_eq!(
            crate::plan::kv_layout(&llama, &s, &paired),
            Some((32, 4096))
        );
        // MLA: one `kv_buffer` per layer in both.
        let mla = KvSpec::new(
            vec![LayerGroup::new(AttentionKind::Mla, 27, 1, 576).with_head_dim_v(0)],
            KvDtype::Bf16,
            1,
        );
        let m = mla.size_with(0, &limits, &split).unwrap();
        assert_eq!(
            crate::plan::kv_layout(&mla, &m, &split),
            Some((27, m.page_bytes))
        );
        // K and V of different dims: tensors of two sizes, not measured as equal ones.
        let uneven = KvSpec::new(
            vec![LayerGroup::new(AttentionKind::Full, 32, 8, 192).with_head_dim_v(128)],
            KvDtype::Bf16,
            1,
        );
        assert!(!measurable_layout(&uneven, &limits, &split));
        assert!(!measurable_layout(&uneven, &limits, &paired));
        assert!(measurable_layout(&uneven, &limits, &SizingRules::default()));
    }

    /// Rounded up to a multiple of `g`.
    fn up(x: u64, g: u64) -> u64 {
        x.div_ceil(g) * g
    }

    #[test]
    fn one_tensor_of_the_planned_size_says_what_the_cache_takes() {
        // 88 tensors of 4 KiB pages on an allocator that rounds to 25.5 MiB (a K and a V per
        // layer, as SGLang before 0.5.23 allocates them): 54 MiB tensors take 76.5 MiB each.
        let g = 51 * MIB / 2;
        let one = |b: u64| Ok(Some(up(b, g)));
        let (tensors, page, room) = (88u64, 4096u64, 5_095_361_127u64);
        let ((fit, fit_takes), takes) = count_by_one_tensor(13_824, (tensors, page), room, one)
            .unwrap()
            .unwrap();
        assert_eq!(takes, tensors * 3 * g);
        assert_eq!(fit_takes, tensors * 2 * g);
        assert_eq!(fit, 13_056, "51 MiB tensors, two granules each");
        assert!(tensors * up(fit * page, g) <= room);
        assert!(tensors * up((fit + 1) * page, g) > room);
        // Where one tensor's measure fits, the count stays as planned.
        let wide = tensors * 77 * MIB;
        assert_eq!(
            count_by_one_tensor(13_824, (tensors, page), wide, one).unwrap(),
            Some(((13_824, tensors * 3 * g), tensors * 3 * g))
        );
        // Left to whole caches: a segment that could hold a second tensor, tensors too small
        // to be rounded alone (4 MiB: shared segments), a tensor that could not be read.
        let double = |b: u64| Ok(Some(2 * b));
        assert_eq!(
            count_by_one_tensor(13_824, (tensors, page), room, double).unwrap(),
            None
        );
        assert_eq!(
            count_by_one_tensor(1_000, (tensors, page), room, one).unwrap(),
            None
        );
        let unread = |_: u64| Ok(None);
        assert_eq!(
            count_by_one_tensor(13_824, (tensors, page), room, unread).unwrap(),
            None
        );
    }

    #[test]
    fn only_this_ranks_own_plan_grows() {
        use memplan_core::bytes::GIB;
        let plan = |rank: Rank| crate::plan::rank_plan(rank, 4 * GIB, 32);
        let (r0, r1) = (Rank::new(0, 2).unwrap(), Rank::new(1, 2).unwrap());
        let own = plan(r0);
        let planned = Planned::of(&own, r0, 0);
        let blocks = planned.blocks_of(&own).unwrap();
        assert!(planned.grows(&own, blocks));
        // Combined from every rank's: every rank maps the same count, none grows past it.
        let combined = crate::plan::combine_ranks(vec![own.clone(), plan(r1)]).unwrap();
        let blocks = planned.blocks_of(&combined).unwrap();
        assert!(!planned.grows(&combined, blocks));
        // A plan of fewer blocks than this session planned is not a bound to replace.
        let mut fewer = own.clone();
        fewer.kv.num_blocks -= 1;
        let blocks = planned.blocks_of(&fewer).unwrap();
        assert!(!planned.grows(&fewer, blocks));
    }
}
