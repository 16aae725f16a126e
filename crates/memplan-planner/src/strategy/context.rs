//! [`GraphContext`]: the protocol primitives a strategy may use, and the teardown guard.
//!
//! The context is armed while graphs may be alive. [`GraphContext::teardown`] destroys every
//! graph, releases the private pool, synchronizes (deferred releases complete there) and checks
//! that the allocator and the graph pool are back where they were before the phase. If the
//! context is dropped while still armed (an early return, a panic in a strategy), `Drop` runs
//! the same teardown best-effort, so teardown happens on every path.
//!
//! A warm-up or capture that runs out of device memory is not an out-of-memory of the
//! start-up: profiling happens before the KV cache exists, so graphs that do not fit now fit
//! nowhere later. It becomes the refusal
//! [`Refusal::GraphsDoNotFit`](memplan_core::Refusal::GraphsDoNotFit), naming the size, and the
//! teardown runs as on any error.

use memplan_core::bytes::fmt_bytes;
use memplan_core::{
    Device, Error, MemoryInfo, MemoryWindow, ProfilingCapability, Reading, Refusal, Result,
};

use crate::engine::Engine;
use crate::kv_range::KvRange;
use crate::session::Recorder;
use crate::warning::Warning;

/// What one window says about graph memory, and from which layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphReading {
    /// Bytes (signed).
    pub bytes: i64,
    /// True when read from the driver (everything the process holds); false when only the
    /// allocator layer was readable (the private pool, without executable objects).
    pub from_driver: bool,
}

/// What [`GraphContext::prime`]'s release gave back and what it did not, read from the driver
/// (both 0 where the free reading does not measure this process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Primed {
    /// Bytes the release gave back by the end of its settle.
    pub returned: i64,
    /// Bytes the priming capture still holds after its release and settle: memory a library
    /// took on the first capture, per-capture memory a runtime keeps, and memory of the
    /// destroyed graph that the runtime has not given back yet.
    pub outstanding: i64,
}

impl Primed {
    /// How much of the outstanding memory may be the destroyed graph's own, still to come back
    /// at some later synchronize, given `recapture`, what a capture of the same size was
    /// measured to take: what such a capture takes, less what the release gave back, at most
    /// what is outstanding (the rest is memory held for good). Memory that comes back inside
    /// a later window makes the window measure that much less than its captures took.
    pub fn may_come_back(&self, recapture: i64) -> u64 {
        let not_back = recapture.saturating_sub(self.returned);
        u64::try_from(not_back.min(self.outstanding)).unwrap_or(0)
    }
}

/// What the warm-ups since the context last released the allocator's cache took in segments of
/// their own, summed over them: where the engine's capture keeps the cache, the segments its own
/// warm-up sequence leaves cached into serving, had the device held them all.
///
/// A warm-up's take is what it grew the allocator's reserved memory by. Nothing in a warm-up
/// gives memory back to the driver but the allocator's own out-of-memory path: where a request
/// does not fit, the caching allocator frees its cached segments and retries (PyTorch
/// `DeviceCachingAllocator::malloc`: `release_available_cached_blocks`, then
/// `release_cached_blocks`). A warm-up after which the allocator reserves less than before it
/// was served by giving the cache back: the segments the sequence had cached did not fit beside
/// it, and the cache read after the sequence holds only what came after the last such release.
/// Its own take is then what the allocator reserves above `floor` (where it stood with its
/// cache released, before the warm-ups; more than its own segments where the allocator gave back
/// only part of its cache, the safe side), at least its allocated peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WarmUpsTook {
    /// Reserved bytes with the cache released, before the warm-ups (`None`: not read yet; the
    /// first warm-up's starting point then).
    floor: Option<u64>,
    /// The warm-ups' takes, summed.
    bytes: u64,
    /// Whether the allocator gave cached memory back during one of them.
    gave_back: bool,
}

impl WarmUpsTook {
    /// Counting from an allocator whose cache was just released, reserving `reserved` bytes.
    pub(crate) fn from(reserved: u64) -> Self {
        WarmUpsTook {
            floor: Some(reserved),
            ..WarmUpsTook::default()
        }
    }

    /// One warm-up: the allocator reserved `before` bytes before it and `after` after it, and
    /// its allocated peak was `peak` bytes above where it started.
    pub(crate) fn add(&mut self, before: u64, after: u64, peak: u64) {
        let floor = *self.floor.get_or_insert(before);
        let take = if after >= before {
            after - before
        } else {
            self.gave_back = true;
            after.saturating_sub(floor).max(peak)
        };
        self.bytes = self.bytes.saturating_add(take);
    }

    /// What the warm-up sequence leaves cached, given `read`, what a release of the cache after
    /// it gave back: that, or where the allocator gave its cache back during the sequence (so
    /// that the release saw only what came after), the sum of the warm-ups' takes.
    pub(crate) fn left_cached(&self, read: u64) -> u64 {
        if self.gave_back {
            read.max(self.bytes)
        } else {
            read
        }
    }

    /// Whether the allocator gave its cache back to serve one of the warm-ups.
    pub(crate) fn gave_back(&self) -> bool {
        self.gave_back
    }
}

/// Protocol primitives for a strategy, bound to one session and one engine.
pub struct GraphContext<'s> {
    session: &'s mut Recorder,
    engine: &'s mut dyn Engine,
    before: MemoryInfo,
    armed: bool,
    /// Graphs captured in this phase (for the refusal when one does not fit).
    captured: usize,
    /// What the warm-ups since the cache was last released took ([`WarmUpsTook`]).
    warm_ups: WarmUpsTook,
}

impl<'s> GraphContext<'s> {
    pub(crate) fn new(
        session: &'s mut Recorder,
        engine: &'s mut dyn Engine,
        before: MemoryInfo,
    ) -> Self {
        GraphContext {
            session,
            engine,
            before,
            armed: true,
            captured: 0,
            warm_ups: WarmUpsTook::default(),
        }
    }

    /// An out-of-memory while warming up or capturing `size` becomes the refusal that the
    /// graphs do not fit; other errors pass as they are (one that says the device cannot
    /// record the graph is noted for the automatic choice, see `Session::capture_graphs`).
    fn graphs_do_not_fit(&mut self, size: u32, e: Error) -> Error {
        let requested = match e.root() {
            Error::OutOfMemory { requested, .. } => *requested,
            Error::Unsupported { .. } => {
                self.session.capture_unsupported = Some(e.to_string());
                return e;
            }
            _ => return e,
        };
        tracing::warn!(size, error = %e, "the graphs do not fit in device memory");
        Error::does_not_fit(Refusal::GraphsDoNotFit {
            size,
            captured: self.captured,
            graphs: self.engine.graph_sizes().len(),
            requested,
            free: self.before.driver.free,
        })
    }

    /// The capability the session trusts.
    pub fn capability(&self) -> &ProfilingCapability {
        &self.session.p.capability
    }

    /// The sizes the engine captures, in its capture order.
    pub fn sizes(&self) -> Vec<u32> {
        self.engine.graph_sizes()
    }

    /// The engine (for hints such as kernel-node counts).
    pub fn engine(&self) -> &dyn Engine {
        self.engine
    }

    /// The device (for virtual-memory operations).
    pub fn device(&self) -> &Device {
        &self.session.device
    }

    /// The snapshot the phase started from.
    pub fn phase_baseline(&self) -> MemoryInfo {
        self.before
    }

    /// Post-capture: reserve the KV cache's address range (at least `bytes`, rounded up to
    /// the granularity) and hand it to the engine before any capture
    /// ([`Engine::bind_kv_range`]). The session keeps the range: it is released after the
    /// teardown if the phase fails, and mapped for the engine when the session ends. Returns
    /// the bytes reserved.
    pub fn reserve_kv_range(&mut self, bytes: u64) -> Result<u64> {
        let range = KvRange::reserve(&self.session.device, bytes)?;
        // An error drops the range here: nothing was captured against it.
        self.engine.bind_kv_range(&range)?;
        let reserved = range.bytes();
        self.session.kv_range = Some(range);
        Ok(reserved)
    }

    /// Record a warning in the session.
    pub fn warn(&mut self, w: Warning) {
        self.session.warn(w);
    }

    /// Release the engine's cached memory, then snapshot: the baseline of a window whose work
    /// (graph capture) would release the cache itself.
    pub fn flushed_snapshot(&mut self) -> Result<MemoryInfo> {
        self.release_cache()?;
        self.session.snap(self.engine)
    }

    /// Snapshot without releasing cached memory (only the legacy strategy does this).
    pub fn snapshot(&mut self) -> Result<MemoryInfo> {
        self.session.snap(self.engine)
    }

    /// Warm up one size (eager run before its capture). Out of memory: the graphs do not fit
    /// (see the module docs). What the engine's allocator reserved for a warm-up whose peak
    /// was one large request or more is kept beside the weights' and the profile run's
    /// ([`Profile::segment_readings`](crate::Profile::segment_readings)): more readings narrow
    /// the granule they bound.
    pub fn warm_up(&mut self, size: u32) -> Result<()> {
        self.armed = true;
        let a = self.engine.allocator();
        a.reset_peak();
        let before = a.stats();
        self.engine
            .warm_up(size)
            .map_err(|e| self.graphs_do_not_fit(size, e))?;
        let after = self.engine.allocator().stats();
        let peak = after.peak_allocated.saturating_sub(before.allocated);
        self.warm_ups.add(before.reserved, after.reserved, peak);
        let grown = after.reserved.saturating_sub(before.reserved);
        if grown > 0 && crate::plan::is_large_request(peak) {
            self.session.p.segment_readings.push((peak, grown));
        }
        // What the warm-up made the allocator hold at its peak: its segments (the reserved
        // peak) where the allocator reports them, else what it left reserved, at least its
        // allocated peak.
        let held = after
            .peak_reserved
            .map_or(grown, |p| p.saturating_sub(before.reserved))
            .max(peak);
        let p = &mut self.session.p;
        let small = crate::plan::is_small_request(peak);
        match p.warmup_peak_bytes {
            Some(w) if w > held => {}
            Some(w) if w == held => p.warmup_peak_small &= small,
            _ => {
                p.warmup_peak_bytes = Some(held);
                p.warmup_peak_small = small;
            }
        }
        self.session.warmed_up(u64::from(size), held);
        Ok(())
    }

    /// What the engine's allocator holds from the driver now (cached or in use), read without
    /// releasing anything: a pass that must not change the allocator's history reads it
    /// between its captures.
    pub fn allocator_reserved(&mut self) -> u64 {
        self.engine.allocator().stats().reserved
    }

    /// Reset the allocator's peak (before a sample whose transient memory is read).
    pub fn reset_peak(&mut self) {
        self.engine.allocator().reset_peak();
    }

    /// Capture the graph of one size (kept until teardown). Out of memory: the graphs do not
    /// fit (see the module docs).
    pub fn capture(&mut self, size: u32) -> Result<()> {
        let span = tracing::debug_span!("capture", size);
        let _e = span.enter();
        self.armed = true;
        match self.engine.capture_graph(size) {
            Ok(()) => {
                self.captured += 1;
                Ok(())
            }
            Err(e) => Err(self.graphs_do_not_fit(size, e)),
        }
    }

    /// Warm up and capture `size` once, then destroy it and release its pool, before any
    /// capture a strategy measures. Memory a library allocates on the process's first capture
    /// and keeps (a cuBLAS workspace taken outside the caching allocator during capture,
    /// pytorch/pytorch#124250; communicator buffers registered on the first capture) is taken
    /// here, so the measured captures cost what a capture of an engine that has captured before
    /// costs: the engine's own capture after the plan does not take that memory again. What the
    /// priming capture leaves held is in the phase's teardown window, counted as held once
    /// ([`Warning::HeldAfterGraphTeardown`]).
    ///
    /// Returns what the release gave back and what it did not ([`Primed`]): a runtime may give
    /// a destroyed graph's memory back after more synchronizes than the settle waits for, and
    /// memory that comes back inside a later window makes that window measure less than its
    /// captures took.
    pub fn prime(&mut self, size: u32) -> Result<Primed> {
        self.check_capture_keeps_cache(size)?;
        self.warm_up(size)?;
        let before = self.flushed_snapshot()?;
        self.capture(size)?;
        let captured = self.session.snap(self.engine)?;
        self.release_graphs()?;
        let released = self.session.snap(self.engine)?;
        let gave_back = self.graph_bytes(&released.window_to(&captured));
        let held = self.graph_bytes(&before.window_to(&released));
        Ok(if gave_back.from_driver && held.from_driver {
            Primed {
                returned: gave_back.bytes,
                outstanding: held.bytes,
            }
        } else {
            Primed::default()
        })
    }

    /// Whether the device records the engine's graphs at all, found with its smallest size
    /// (warmed up and captured; the caller tears the context down), before a strategy
    /// warms up the engine's first size, the largest. Run where calibration found that the
    /// device refuses graph allocation nodes
    /// ([`CalibrationReport::graph_alloc_nodes_refused`](crate::calibrate::CalibrationReport::graph_alloc_nodes_refused)):
    /// an engine whose graphs allocate in such nodes cannot capture them, and learning that
    /// from its first size cost that size's warm-up first. An RTX 4090 whose engine warmed 512
    /// tokens up at 8 MiB each went 332 MiB past a 17 GiB budget before the capture was refused
    /// and the engine ran eagerly. [`Error::Unsupported`] where the device refuses
    /// (the session then plans the engine eagerly).
    pub fn trial_capture(&mut self) -> Result<()> {
        let Some(size) = self.sizes().into_iter().min() else {
            return Ok(());
        };
        self.warm_up(size)?;
        self.capture(size)
    }

    /// Whether the engine's capture keeps what its allocator cached before it
    /// ([`Profile::capture_keeps_cache`](crate::Profile)): a warm-up, then a capture with
    /// nothing released in between, then the allocator's cache released: what that release
    /// gave back is what the capture left cached. A capture that empties the cache on entering
    /// leaves none (its own allocations are its graph's, in use); one that does not leaves the
    /// warm-up's segments. The graph is then destroyed. `full` measures each capture after
    /// releasing the cache, so its windows cannot tell; this capture is the process's first (a
    /// library's memory taken on it is held from here on, as the priming capture's would be).
    ///
    /// Only `size` (the first in the engine's order) is warmed up before it, as the engine
    /// warms it up before its own first capture: where the capture empties the cache, the
    /// engine never holds two warm-ups at once, and the check must not either. Warming the
    /// smallest size up first held its segments beside the first size's where the engine's
    /// sequence, largest first, serves the smaller warm-up from the larger's cached block:
    /// sizes of 512, 384 and 256 tokens at 8 MiB each held 2 GiB more than the engine ever
    /// does, up to 424 MiB past the request before the plan. And where the engine declared
    /// `max_split_size_mb`, every size was warmed up with no capture in between: an RTX 4090
    /// whose warm-ups reach 2 GiB held 19 GiB of them at once (224-412 MiB past the request).
    ///
    /// Where the capture keeps the cache, what the engine's whole warm-up sequence leaves
    /// cached through its captures into serving ([`Profile::capture_cache_left_bytes`]) is
    /// then measured (`measure_warm_ups_left_cached`): the engine's own warm-ups stay cached
    /// there, so the process holds no more than the engine's own sequence does.
    ///
    /// [`Profile::capture_cache_left_bytes`]: crate::Profile::capture_cache_left_bytes
    pub fn check_capture_keeps_cache(&mut self, size: u32) -> Result<()> {
        self.warm_up(size)?;
        self.capture(size)?;
        self.release_cache_left_by_captures()?;
        self.release_graphs()?;
        if self.session.p.capture_keeps_cache == Some(true) {
            self.measure_warm_ups_left_cached(size)?;
        }
        Ok(())
    }

    /// Where the engine's capture keeps the allocator's cache (as
    /// [`check_capture_keeps_cache`](Self::check_capture_keeps_cache) found, its first size
    /// `first`): warm up, in the engine's order and with nothing released in between, the
    /// sizes whose segments the engine's sequence leaves cached, then release the cache: what
    /// that release gave back is what the sequence leaves cached through the captures (which
    /// keep it) into serving ([`Profile::capture_cache_left_bytes`](crate::Profile), the larger
    /// of this and what the check's capture left). No capture is taken for it: the check showed
    /// the capture keeps what was cached before it, and a capture more would leave what a
    /// runtime keeps per capture.
    ///
    /// - The first size, then the smallest: a later warm-up is served from the first one's
    ///   cached block where it can (split), but a small warm-up's request may be served from
    ///   segments of its own pool (PyTorch serves requests of up to 1 MiB from small segments
    ///   only), which stay cached beside the largest warm-up's.
    /// - Where the engine declared `max_split_size_mb`, every size: PyTorch hands a cached
    ///   block of `max_split_size` or more to no smaller request, and to a request of that size
    ///   or more only where the block is less than 20 MiB larger (`get_free_block`), and splits
    ///   no block for such a request (`should_split`), so each warm-up of a size between may
    ///   take segments of its own, which stay cached beside the largest's (the sum of them, not
    ///   the largest, is what serving then has beside a burst).
    ///
    /// Where those segments do not fit on the device, the allocator gives its cache back to
    /// serve a later warm-up, and the release sees only what came after: what each warm-up took
    /// is summed instead ([`WarmUpsTook`], warned), more than the device holds beside the
    /// weights, and the plan refuses.
    fn measure_warm_ups_left_cached(&mut self, first: u32) -> Result<()> {
        let sizes = if self.session.max_split_declared {
            self.sizes()
        } else {
            let smallest = self.sizes().last().copied().filter(|s| *s != first);
            std::iter::once(first).chain(smallest).collect()
        };
        for s in sizes {
            self.warm_up(s)?;
        }
        let left = self.release_warm_ups_left()?;
        tracing::debug!(
            left_cached = left,
            "what the engine's warm-ups leave cached where its capture keeps the cache"
        );
        let p = &mut self.session.p;
        p.capture_cache_left_bytes = Some(p.capture_cache_left_bytes.unwrap_or(0).max(left));
        Ok(())
    }

    /// After warm-ups and captures with nothing released in between (the engine's own
    /// sequence, or [`prime`](Self::prime)'s check): release the allocator's cache, then
    /// snapshot. What the release gave back is what the captures left cached: none where the
    /// engine's capture empties the cache on entering (each capture gives back the warm-up
    /// before it, and its own allocations are its graph's, in use), the warm-ups' segments
    /// where it keeps the cache. That answers whether the engine's capture keeps the cache
    /// ([`Profile::capture_keeps_cache`](crate::Profile)) and how much stays cached through
    /// serving ([`Profile::capture_cache_left_bytes`](crate::Profile::capture_cache_left_bytes)).
    ///
    /// A strategy that warms up and captures every size in the engine's order (`conservative`)
    /// calls this after its last capture, in place of [`flushed_snapshot`](Self::flushed_snapshot):
    /// its release then gives back what the engine's whole warm-up sequence leaves cached
    /// (with segments a warm-up could not reuse, under a `max_split_size` or not), measured
    /// without a capture of its own. A strategy that never asks leaves the engine's capture
    /// unknown, and a plan counts no cache kept for it: the engine's own warm-ups would stay
    /// cached beside every burst in serving, unplanned.
    pub fn flushed_snapshot_after_captures(&mut self) -> Result<MemoryInfo> {
        self.release_cache_left_by_captures()?;
        self.session.snap(self.engine)
    }

    fn release_cache_left_by_captures(&mut self) -> Result<()> {
        let took = self.warm_ups;
        let read = self.release_cache()?;
        let keeps = capture_kept_cache(read);
        let left = if keeps {
            self.left_cached(read, took)
        } else {
            read
        };
        tracing::debug!(
            left_cached = left,
            keeps,
            "does the engine's capture keep the allocator's cache"
        );
        self.session.p.capture_keeps_cache = Some(keeps);
        self.session.p.capture_cache_left_bytes = keeps.then_some(left);
        Ok(())
    }

    /// Release the allocator's cache; the warm-ups are counted from here on ([`WarmUpsTook`]).
    /// Returns what the release gave back.
    fn release_cache(&mut self) -> Result<u64> {
        let a = self.engine.allocator();
        let cached = a.stats().reserved;
        a.release_cached()?;
        let after = a.stats().reserved;
        self.warm_ups = WarmUpsTook::from(after);
        Ok(cached.saturating_sub(after))
    }

    /// Where the engine's capture keeps the cache: release it after warm-ups in the engine's
    /// order, and return what that sequence leaves cached into serving (`left_cached`).
    fn release_warm_ups_left(&mut self) -> Result<u64> {
        let took = self.warm_ups;
        let read = self.release_cache()?;
        Ok(self.left_cached(read, took))
    }

    /// What a warm-up sequence that `took` leaves cached where the engine's capture keeps the
    /// cache, given `read`, what the release after it gave back ([`WarmUpsTook::left_cached`]).
    /// Where the allocator gave its cache back to serve one of the warm-ups, the engine's own
    /// sequence, which keeps every warm-up's segments through its captures, does not fit on the
    /// device beside what the process holds now, and holds less only by the same release: its
    /// capture then runs at the device's limit, where what a graph takes outside the allocator
    /// (its instantiation) finds nothing free, and what it holds passes any request. Warned,
    /// and counted whole: a plan beside it refuses rather than start a capture that fills the
    /// device.
    fn left_cached(&mut self, read: u64, took: WarmUpsTook) -> u64 {
        let left = took.left_cached(read);
        if took.gave_back() {
            self.session.warn(Warning::WarmUpsCachedPastDevice {
                took: left,
                cached: read,
            });
        }
        left
    }

    /// After a release of graphs and its settle ([`release_all`]), where free memory is not
    /// back where it stood at `from` (the phase's baseline): synchronize up to
    /// [`LATE_RELEASE_SYNCHRONIZES`] more times, trimming the pool after each and reading the
    /// free memory, until it is back (within the reading's window error). Where it came back (by
    /// more than that error) after `n` of them, every later release in this session waits `n`
    /// synchronizes more than this one did (a runtime that gives a destroyed graph's memory back
    /// after more synchronizes than the settle waits for would give it back inside a later
    /// window, which then reads less than its capture took, or after the phase's teardown, which
    /// then counts it as held, and in the quiet window after it, where it cannot be told from
    /// another process releasing memory). Memory still out after them is held (per-capture
    /// memory a runtime keeps, a library's workspace): read as held, the safe side. The reads
    /// come before any snapshot, whose synchronizes would complete a late release after the
    /// pool was trimmed: counted from the release's own synchronizes, the count is the one a
    /// release needs. Where no free reading measures this process, nothing says when the memory
    /// is back: the wait makes all [`LATE_RELEASE_SYNCHRONIZES`] (a release 17 synchronizes
    /// late on an APU whose reading was stale was read as 13.7 GiB the teardown did not give
    /// back, counted as held beside the graphs the engine captures again, and a start-up the
    /// device had room for was refused). Returns whether memory came back (as seen: `false`
    /// where nothing reads it).
    fn wait_for_late_release(&mut self, from: &MemoryInfo) -> Result<bool> {
        let free_ok = self
            .capability()
            .reading(Reading::DriverFree)
            .measures_own_usage();
        let Some(start) = from.driver.free.filter(|_| free_ok) else {
            // No reading says when the memory is back: wait the whole count. What a release
            // gives back after the settle would otherwise come back after the teardown's
            // reading, counted as held (and again as the graphs the engine captures later), or
            // inside a later window, which then reads less than its capture took.
            wait_for_release(
                &self.session.device,
                LATE_RELEASE_SYNCHRONIZES,
                Trim::EachSynchronize,
                |_| Ok(false),
            )?;
            return Ok(false);
        };
        // Single reads: where the session's snapshots combine reads, one read moves further
        // than a combined window does (`still`, how far single reads of the idle device moved).
        let noise = self.window_tolerance().max(self.session.still.unwrap_or(0));
        let device = &self.session.device;
        // Free memory before the first synchronize, then after each: where it rose by more
        // than the reading's window error, memory came back at that synchronize. The wait ends
        // once it is back where it stood at `from`, or where the reading gives nothing.
        let mut last: Option<u64> = None;
        let mut came_back_at = None;
        wait_for_release(
            device,
            LATE_RELEASE_SYNCHRONIZES,
            Trim::EachSynchronize,
            |n| {
                let Some(f) = device.driver_memory()?.free else {
                    return Ok(true);
                };
                if last.is_some_and(|l| f > l.saturating_add(noise)) {
                    came_back_at = Some(n);
                }
                last = Some(f);
                Ok(f.saturating_add(noise) >= start)
            },
        )?;
        let Some(n) = came_back_at else {
            return Ok(false);
        };
        // At most what the settle and one such wait make: a release that takes longer is
        // waited out by the wait itself, and a reading whose noise passed for memory coming
        // back does not lengthen every release after it.
        let syncs = self
            .session
            .settle_synchronizes
            .saturating_add(n)
            .min(SETTLE_SYNCHRONIZES + LATE_RELEASE_SYNCHRONIZES);
        tracing::info!(
            synchronizes = syncs,
            "a destroyed graph's memory came back after more synchronizes than the settle waits for: releases wait for them"
        );
        self.session.settle_synchronizes = self.session.settle_synchronizes.max(syncs);
        Ok(true)
    }

    /// Destroy every graph captured so far, release their pool and synchronize, in the middle
    /// of a phase (a sample that must not share its pool with the next one), then wait out a
    /// late release (`wait_for_late_release`): memory a destroyed graph gives back later
    /// would come back inside the next window.
    pub fn release_graphs(&mut self) -> Result<()> {
        release_all(
            self.engine,
            &self.session.device,
            self.session.settle_synchronizes,
        )?;
        let from = self.before;
        self.wait_for_late_release(&from).map(drop)
    }

    /// Graph memory in a window: from the driver when its free reading measures this process,
    /// else from the allocator layer only (a lower bound).
    pub fn graph_bytes(&self, w: &MemoryWindow) -> GraphReading {
        let free_ok = self
            .capability()
            .reading(Reading::DriverFree)
            .measures_own_usage();
        match (free_ok, w.driver_used) {
            (true, Some(b)) => GraphReading {
                bytes: b,
                from_driver: true,
            },
            _ => GraphReading {
                bytes: w.allocator_reserved.unwrap_or(0),
                from_driver: false,
            },
        }
    }

    /// Where no reading measures this process and the session measures by allocation probes
    /// ([`Profile::probe_baseline`](crate::Profile)): the largest allocation that succeeds
    /// now, within the probes' resolution. `None` elsewhere, or where the device cannot
    /// allocate.
    pub fn allocatable(&mut self) -> Result<Option<u64>> {
        let total = self.session.p.last.driver.total;
        match self.session.probe_now(None, total) {
            Ok(b) => Ok(b),
            Err(Error::Unsupported { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What became unallocatable between two [`allocatable`](Self::allocatable) probes, the
    /// probes' resolution counted on the safe side (more, never less).
    pub fn probed_growth(&self, before: u64, after: u64) -> u64 {
        let limit = self.session.p.probe_baseline.unwrap_or(before);
        u64::try_from(crate::session::probe::step_growth(before, after, limit, 0).max(0))
            .unwrap_or(0)
    }

    /// How far one [`allocatable`](Self::allocatable) probe may be off: its search stops
    /// within this of what is allocatable. `None` where the session does not probe.
    pub fn probe_resolution(&self) -> Option<u64> {
        self.session
            .p
            .probe_baseline
            .map(crate::session::probe::resolution)
    }

    /// How far apart two captures' takes can be and still read alike, each measured by a
    /// window of two [`allocatable`](Self::allocatable) probes: a probe moves in the whole
    /// pages a driver commits a raw allocation in, and its search reads within its resolution
    /// (`session::probe::alike_within`). `None` where the session does not probe.
    pub fn probes_alike_within(&self) -> Option<u64> {
        self.session
            .p
            .probe_baseline
            .map(crate::session::probe::alike_within)
    }

    /// Where the free reading moves in steps coarse enough to hide the graphs it measures
    /// ([`step_worth_probes`](crate::session::probe::step_worth_probes) of
    /// [`reading_step`](Self::reading_step)), and the session does not measure by probes
    /// already: the limit a probe around the graphs searches at the resolution of (the free
    /// memory at the phase's start, else the device's total). `None` elsewhere.
    pub(crate) fn step_probe_limit(&self) -> Option<u64> {
        if self.session.p.probe_baseline.is_some()
            || !crate::session::probe::step_worth_probes(self.reading_step())
        {
            return None;
        }
        self.before
            .driver
            .free
            .or(self.before.driver.total)
            .filter(|l| *l > 0)
    }

    /// The largest allocation that succeeds now, searched at the resolution of a search up to
    /// `limit` ([`step_probe_limit`](Self::step_probe_limit)) from `hint`: a measurement of
    /// free memory whose resolution does not depend on the reading's step. `None` where the
    /// device cannot allocate.
    pub(crate) fn probe_free(&mut self, limit: u64, hint: Option<u64>) -> Result<Option<u64>> {
        let total = self.session.p.last.driver.total;
        match self.session.probe_free(limit, total, hint) {
            Ok(b) => Ok(Some(b)),
            Err(Error::Unsupported { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What the device was seen to keep of each raw free of the session's, as the cost of
    /// further frees is weighed (the figure seen, [`Profile::kept_per_free`](crate::Profile),
    /// or what the keep test bounds a probe's large free by, where larger); 0 where no keep
    /// was seen (a bound on a keep nobody saw is no cost of the session's frees).
    pub(crate) fn own_keep_per_free(&self) -> u64 {
        self.session
            .p
            .kept_per_free
            .max(self.session.probe_free_keep)
            .unwrap_or(0)
    }

    /// The step the free reading moves in where calibration (or the session's start) saw one
    /// of a MiB or more ([`Profile::free_step`](crate::Profile)); 0 elsewhere.
    pub fn reading_step(&self) -> u64 {
        self.session.p.free_step
    }

    /// Tolerance of the driver free reading (0 unless declared approximate).
    pub fn free_tolerance(&self) -> u64 {
        self.capability()
            .reading(Reading::DriverFree)
            .tolerance_bytes()
    }

    /// How far a window of the free reading may be off: the largest error calibration (or the
    /// session's start) saw on one, over [`IDLE_READS`](crate::calibrate::IDLE_READS) reads of
    /// the idle device and windows over known allocations, times 1.25
    /// (`WINDOW_ERROR_FACTOR_INVERSE_EXCESS`, plus a granule's worth of slack), within the
    /// declared tolerance; the declared tolerance where nothing measured it. A declared
    /// tolerance often covers a constant offset (memory the reading cannot see), which a window
    /// cancels; the measured window error does not.
    pub fn window_tolerance(&self) -> u64 {
        self.session.p.free_window_margin()
    }

    /// Whether every snapshot is one read of the free reading
    /// ([`Profile::free_reads`](crate::Profile)): a window of two reads is then a multiple of
    /// the step the reading moves in, as a mean of several reads need not be.
    pub(crate) fn single_reads(&self) -> bool {
        self.session.p.free_reads == 1
    }

    /// Destroy every graph, release the pool, synchronize, wait out a late release and check
    /// restoration ([`release_graphs`](Self::release_graphs)). Returns the snapshot after teardown.
    pub(crate) fn teardown(&mut self) -> Result<MemoryInfo> {
        let span = tracing::info_span!("teardown");
        let _e = span.enter();
        self.armed = false;
        self.release_graphs()?;
        // What the phase's warm-ups left in the allocator's cache is the session's, not the
        // engine's: where the engine's capture keeps the cache, a phase that failed before it
        // released the cache (a capture the device refused, after which the engine runs
        // eagerly) would leave the warm-ups' segments cached into serving, where a burst larger
        // than a cached block takes segments of its own beside them, counted by no plan. The
        // engine's own warm-ups before its capture are counted where the plan is built
        // (`Profile::capture_cache_left_bytes`); an engine that runs eagerly warms none up.
        self.release_cache()?;
        let after = self.session.snap(self.engine)?;
        self.check_restored(&after);
        Ok(after)
    }

    /// The strategy keeps its graphs: no teardown, read where memory stands.
    pub(crate) fn disarm_and_read(&mut self) -> Result<MemoryInfo> {
        self.armed = false;
        self.session.snap(self.engine)
    }

    fn check_restored(&mut self, after: &MemoryInfo) {
        let b = &self.before;
        let mut leaks = Vec::new();
        if let (Some(x), Some(y)) = (b.allocator.reserved, after.allocator.reserved) {
            if y > x {
                leaks.push(format!(
                    "allocator reserved {} above the phase baseline",
                    fmt_bytes(y - x)
                ));
            }
        }
        if let (Some(x), Some(y)) = (b.graph_pool.used, after.graph_pool.used) {
            if y > x {
                leaks.push(format!(
                    "graph pool {} above the phase baseline",
                    fmt_bytes(y - x)
                ));
            }
        }
        // Used can be back while the pool still holds the memory (trimmed before the
        // synchronize that released it): reserved tells.
        if let (Some(x), Some(y)) = (b.graph_pool.reserved, after.graph_pool.reserved) {
            if y > x {
                leaks.push(format!(
                    "graph pool reserved {} above the phase baseline (not trimmed)",
                    fmt_bytes(y - x)
                ));
            }
        }
        if let (Some(x), Some(y)) = (b.driver_used(), after.driver_used()) {
            let tol = self.free_tolerance();
            if y > x.saturating_add(tol) {
                leaks.push(format!(
                    "driver used {} above the phase baseline (or another process took it)",
                    fmt_bytes(y - x)
                ));
            }
        }
        if leaks.is_empty() {
            tracing::info!("teardown restored the allocator and graph pool");
        } else {
            self.session
                .warn(Warning::GraphTeardownIncomplete { leaks });
        }
    }
}

/// The measured window error is the largest difference between reads seen; a later window
/// can differ by more. The range of 32 reads (`IDLE_READS`) of a reading whose noise is
/// uniform falls below 80% of the noise's full width with a probability under 1%
/// (`32 x 0.8^31 - 31 x 0.8^32`, the distribution of the range of uniform samples); for
/// normal noise, 1.25 times the expected range of 32 reads (4.1 standard deviations) is 3.6
/// standard deviations of a window of two reads. So the window error kept is 1.25 times the
/// largest seen: `e + e / 4`.
pub const WINDOW_ERROR_FACTOR_INVERSE_EXCESS: u64 = 4;

/// Whether the capture before a release of the allocator's cache kept what was cached before
/// it, given `read`, the bytes that release gave back. The allocator's statistics are exact
/// (no reading noise), and a capture that empties the cache on entering leaves nothing in the
/// default pool for the release to give back (its own allocations are its graph's, in use):
/// any byte given back is a warm-up's segment the capture kept. A floor of one rounding step
/// (2 MiB) read a small warm-up's one small segment (PyTorch serves requests of up to 1 MiB
/// from 2 MiB segments, `kSmallBuffer`, `c10/<device>/<Device>CachingAllocator.cpp`) as a capture
/// that empties the cache: that segment then stayed cached beside every serving burst,
/// unplanned, 523 KiB past the request on an RTX 4090 whose warm-ups leave 16 KiB a token.
pub(crate) fn capture_kept_cache(read: u64) -> bool {
    read > 0
}

/// The window error kept for a largest error `e` seen: 1.25 times it
/// ([`WINDOW_ERROR_FACTOR_INVERSE_EXCESS`]) plus a granule's worth of slack (1 MiB). Also how
/// far the reads of one combined snapshot may spread while memory holds still.
pub(crate) fn kept_window_error(e: u64) -> u64 {
    e.saturating_add(e / WINDOW_ERROR_FACTOR_INVERSE_EXCESS)
        .saturating_add(1 << 20)
}

/// How far a window of the free reading may be off, from the reading's `declared` tolerance
/// and the largest error `seen` on one (calibration's or the session start's measurement): the
/// error kept for what was seen ([`kept_window_error`]), within the declared tolerance; the
/// declared tolerance where nothing measured it ([`GraphContext::window_tolerance`]). Never
/// less than the `step` the reading moves in ([`Profile::free_step`](crate::Profile)): a
/// reading in 2 MiB steps, exact to calibration, read an engine's graph memory up to a step
/// low, and a plan with no margin for it went up to 1.4 MiB past the request in serving.
pub(crate) fn window_error(declared: u64, seen: Option<u64>, step: u64) -> u64 {
    let kept = match seen {
        Some(e) => declared.min(kept_window_error(e)),
        None => declared,
    };
    kept.max(step)
}

/// Some runtimes return a destroyed graph's memory only after one or more later synchronizes,
/// how many being theirs to decide (one runtime documents the next one). A synchronize of an idle
/// device costs next to nothing, so a release of graphs ([`release_all`]) synchronizes this many
/// times more: whatever a runtime still holds after that is counted as held, which errs on the
/// safe side where it is read as held; a window opened while it is still out may see it come
/// back, which is why `full` widens its measurement by what its priming capture did not give
/// back ([`Primed::may_come_back`]). On a device that cannot synchronize this waits for nothing
/// (the engine's hook does, before readings).
pub const SETTLE_SYNCHRONIZES: usize = 8;

/// Synchronizes [`GraphContext::prime`] waits, after the settle, for a destroyed graph's memory
/// to come back where it is still out: idle synchronizes cost next to nothing, and memory out
/// after them is read as held.
pub const LATE_RELEASE_SYNCHRONIZES: usize = 64;

/// Destroy the engine's graphs, synchronize once and then `syncs` times more
/// ([`SETTLE_SYNCHRONIZES`], or more where releases were seen to come back later,
/// [`GraphContext::prime`]; done even when the engine's release failed), then trim the
/// device's graph pool ([`trim_pool`]).
pub(crate) fn release_all(engine: &mut dyn Engine, device: &Device, syncs: usize) -> Result<()> {
    let released = engine.release_graphs();
    let settled = wait_for_release(device, syncs.saturating_add(1), Trim::AtEnd, |_| Ok(false));
    released?;
    settled.map(drop)
}

/// When a wait for released memory ([`wait_for_release`]) trims the device's graph pool
/// ([`trim_pool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trim {
    /// After every synchronize, so that a reading after it sees what the synchronize gave
    /// back (a release completed, its pool memory returned to the device).
    EachSynchronize,
    /// Once, after the last synchronize (also after a synchronize that failed).
    AtEnd,
}

/// The one wait for memory a runtime gives back some synchronizes after a release (of graphs,
/// of their pool): synchronize up to `most` times, trimming the graph pool as `trim` says (a
/// trim follows the synchronizes that complete a release, never precedes them, [`trim_pool`]),
/// and end the wait once `stop` says so. `stop` is asked before the first synchronize (with 0)
/// and after each (with how many have run, after the trim that follows it): it reads what it
/// needs and says whether waiting longer is pointless (the memory is back, the reading gives
/// nothing). Returns the synchronizes made. A synchronize that fails ends the wait with its
/// error, after the trim (best effort where it follows each synchronize).
///
/// Every wait of the crate goes through here: the release of graphs ([`release_all`]), a
/// graph phase's start ([`trim_and_settle`]), the priming capture's wait for a late release
/// ([`GraphContext::prime`]), calibration's graph check, and an abandoned session's release
/// of its kept graphs.
pub(crate) fn wait_for_release(
    device: &Device,
    most: usize,
    trim: Trim,
    mut stop: impl FnMut(usize) -> Result<bool>,
) -> Result<usize> {
    let mut done = 0;
    let mut waited = Ok(());
    if !stop(0)? {
        while done < most {
            if let Err(e) = device.synchronize() {
                waited = Err(e);
                break;
            }
            done += 1;
            if trim == Trim::EachSynchronize {
                trim_pool(device)?;
            }
            if stop(done)? {
                break;
            }
        }
    }
    let trimmed = match (trim, &waited) {
        (Trim::AtEnd, _) => trim_pool(device),
        (Trim::EachSynchronize, Err(_)) => trim_pool(device).or(Ok(())),
        (Trim::EachSynchronize, Ok(())) => Ok(()),
    };
    waited?;
    trimmed.map(|()| done)
}

/// Give the graph pool's unused memory back to the device, where the device has a pool
/// ([`memplan_core::GraphCapture::release_pool`], a graph-memory trim). A trim frees only blocks
/// no graph uses, and the vendors' graph-memory APIs document a destroyed graph's allocations
/// as in use until its release completes: a runtime that defers the release to a later
/// synchronize (the DESIGN's vendor table) keeps them from a trim made before it. So a trim
/// follows the synchronizes that complete the releases, never precedes them: memory a trim
/// missed stays reserved in the pool, is read as held (calibration's test graph would seem to
/// keep it per capture), and comes back at the next trim, inside some later window, where it
/// reads as another process releasing memory.
pub(crate) fn trim_pool(device: &Device) -> Result<()> {
    match device.graph_capture() {
        Ok(gc) => gc.release_pool(),
        Err(Error::Unsupported { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Before a graph phase: synchronize `syncs` times (the session's settle count, see
/// [`release_all`]) and trim the device's graph pool ([`trim_pool`]), so the phase starts as
/// its teardown ends. Pool memory an earlier capture left reserved (calibration's test graphs)
/// would otherwise be reused unseen by the phase's first captures and given back by its
/// teardown: the graphs would measure less than a capture from a trimmed pool takes.
pub(crate) fn trim_and_settle(device: &Device, syncs: usize) -> Result<()> {
    wait_for_release(device, syncs, Trim::AtEnd, |_| Ok(false)).map(drop)
}

impl Drop for GraphContext<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.teardown() {
                tracing::error!(error = %e, "graph teardown failed on an early exit");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{capture_kept_cache, WarmUpsTook};
    use memplan_core::bytes::MIB;

    /// Warm-ups that each take a segment of their own, where the third does not fit beside the
    /// first two: the allocator gives its cache back to serve it, and the release after the
    /// sequence gives back only the third's segment. What the sequence leaves cached, had the
    /// device held it, is all three (the trace of an A100 80GB under `max_split_size_mb:512`,
    /// seed 9: 6.9 GB read, tens of GB taken).
    #[test]
    fn warm_ups_the_allocator_gave_its_cache_back_for_are_counted_whole() {
        let gib = 1u64 << 30;
        let weights = 29 * gib;
        let mut t = WarmUpsTook::from(weights);
        t.add(weights, weights + 20 * gib, 20 * gib);
        t.add(weights + 20 * gib, weights + 39 * gib, 19 * gib);
        // 29 + 20 + 19 + 18 GiB do not fit: the first two segments are given back.
        t.add(weights + 39 * gib, weights + 18 * gib, 18 * gib);
        assert!(t.gave_back());
        assert_eq!(t.left_cached(18 * gib), 57 * gib);
        // What the release gave back stands where it is more (a segment that stayed cached
        // before the warm-ups were counted).
        assert_eq!(t.left_cached(60 * gib), 60 * gib);
    }

    /// A keeping capture's only cached segment may be one small 2 MiB segment (warm-ups of a
    /// few hundred KiB): read as a capture that empties the cache, it stayed beside serving
    /// unplanned.
    #[test]
    fn one_small_segment_the_capture_left_cached_is_a_kept_cache() {
        assert!(capture_kept_cache(2 * MIB));
        assert!(capture_kept_cache(512 * 1024));
        assert!(!capture_kept_cache(0));
    }

    /// Where the allocator gave nothing back, what the release after the sequence gave back is
    /// what it leaves: a warm-up served from a cached block took nothing, and the sum of the
    /// takes is not read in its place.
    #[test]
    fn warm_ups_that_fit_leave_what_the_release_gives_back() {
        let gib = 1u64 << 30;
        let mut t = WarmUpsTook::default();
        t.add(10 * gib, 14 * gib, 4 * gib);
        t.add(14 * gib, 14 * gib, 3 * gib);
        assert!(!t.gave_back());
        assert_eq!(t.left_cached(4 * gib), 4 * gib);
        // Counted from the first warm-up where the cache was not released before: a give-back
        // below that point takes at least the warm-up's allocated peak.
        t.add(14 * gib, 9 * gib, 2 * gib);
        assert!(t.gave_back());
        assert_eq!(t.left_cached(0), 6 * gib);
    }
}
