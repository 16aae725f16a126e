//! `SimGpu`: a cheap clonable handle on one simulated GPU, the world outside the process, and
//! its `Device` implementation.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use memplan_core::bytes::fmt_bytes;
use memplan_core::{
    BackendKind, Device, DeviceDescriptor, DeviceId, DeviceWideMemory, DriverMemory, Error,
    GraphPoolMemory, HalDevice, HalGraphs, HalVirtualMemory, ProfilingCapability, Result, Support,
};

use crate::allocator::SimAllocator;
use crate::declared;
use crate::physics::{Physics, Pin, Platform, Regime, DEFAULT_SEED};
use crate::profile::{profile, profile_names, SimProfile};
use crate::quirks::{parse_selector, Quirks};
use crate::readings;
use crate::state::State;
use crate::world::World;

/// Rounding of raw driver allocations (`Device::allocate`), like cuMemAlloc's 2 MiB pages.
pub const RAW_ROUND: u64 = 2 << 20;

pub(crate) struct Shared {
    /// The profile, its context overhead replaced by the drawn one.
    pub profile: SimProfile,
    /// The drawn physics.
    pub physics: Physics,
    pub quirks: Quirks,
    /// What the real platform declares (decides which operations work).
    pub platform: ProfilingCapability,
    /// What this device declares (the platform's, or everything exact with `declare-exact`).
    pub capability: ProfilingCapability,
    pub descriptor: DeviceDescriptor,
    /// This GPU among every simulated GPU this process made (see [`SimGpu::gpu_id`]).
    pub instance: u64,
    /// Other processes sharing this device (`world=DIR`, or made by `shared_id`).
    pub world: OnceLock<World>,
}

/// The state, locked; with a world, what other processes hold is read when locking and what
/// this process holds is published when unlocking.
pub(crate) struct StateGuard<'a> {
    guard: MutexGuard<'a, State>,
    gpu: &'a SimGpu,
}

impl Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let watched = self.guard.peak.is_some();
        let world = self.gpu.shared.world.get();
        if !watched && world.is_none() {
            return;
        }
        let now = self.guard.this_process(&self.gpu.shared.profile);
        if let Some(p) = self.guard.peak.as_mut() {
            *p = (*p).max(now);
        }
        if let Some(w) = world {
            w.publish(now);
        }
    }
}

/// Simulated GPUs made so far in this process: each gets the next number.
static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A simulated GPU. Clones share the same device: the "engine" and memplan can both hold one.
#[derive(Clone)]
pub struct SimGpu {
    pub(crate) shared: Arc<Shared>,
    pub(crate) state: Arc<Mutex<State>>,
}

impl SimGpu {
    /// A GPU with the profile's own quirks and nominal physics (each hidden quantity at its
    /// typical figure; [`SimGpu::open`] draws them).
    pub fn new(profile: &SimProfile) -> Self {
        Self::with_quirks(profile, profile.quirks)
    }

    /// A GPU with other quirks (the declaration stays the profile's), nominal physics.
    pub fn with_quirks(profile: &SimProfile, quirks: Quirks) -> Self {
        Self::build(
            profile,
            (quirks, None),
            false,
            (DEFAULT_SEED, Pin::Nominal, Regime::World),
            profile.name.to_string(),
        )
    }

    fn build(
        profile: &SimProfile,
        (mut quirks, hidden_override): (Quirks, Option<u64>),
        declare_exact: bool,
        (seed, pin, regime): (u64, Pin, Regime),
        selector: String,
    ) -> Self {
        let platform = profile.capability();
        let tolerance = |r| platform.reading(r).tolerance_bytes();
        let world = Platform {
            hidden_override,
            device_tolerance: tolerance(memplan_core::Reading::DeviceAvailable),
            declaration_wrong: declare_exact,
            ..Platform::new(
                profile.context_overhead_bytes,
                &quirks,
                tolerance(memplan_core::Reading::DriverFree),
            )
        };
        let physics = Physics::draw_for(seed, &world, pin, regime);
        quirks.hidden_bytes_per_capture = physics.hidden_bytes_per_capture;
        let mut profile = profile.clone();
        profile.context_overhead_bytes = physics.context_bytes;
        let profile = &profile;
        let capability = if declare_exact {
            declared::declare_exact(&platform)
        } else {
            platform.clone()
        };
        let total = readings::mask_driver(
            &capability,
            DriverMemory::new(Some(readings::reported_total(profile, &quirks)), None),
        )
        .total;
        let mut properties = vec![
            ("platform".to_string(), profile.vendor_label.to_string()),
            ("total_source".to_string(), profile.total_source.to_string()),
            (
                "context_overhead".to_string(),
                fmt_bytes(profile.context_overhead_bytes),
            ),
            ("quirks".to_string(), quirks.active().join(" ")),
        ];
        properties.push(("seed".to_string(), seed.to_string()));
        if physics.adversarial {
            properties.push(("physics".to_string(), "adversarial".to_string()));
        }
        if profile.apu_aperture_bytes.is_some() {
            properties.push(("usable_memory".to_string(), fmt_bytes(profile.total_bytes)));
        }
        let descriptor = DeviceDescriptor::new(
            DeviceId::new(BackendKind::Sim, selector),
            profile.device_name.to_string(),
            total,
        )
        .with_properties(properties);
        let shared = Shared {
            profile: profile.clone(),
            physics,
            quirks,
            platform,
            capability,
            descriptor,
            instance: INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
            world: OnceLock::new(),
        };
        let mut state = State {
            heap: crate::heap::Heap::with_rules(physics.allocator),
            ..State::default()
        };
        if quirks.stale_free {
            let f = readings::fresh_free(profile, &quirks, &physics, &state);
            state.stale = Some((f, f));
        }
        SimGpu {
            shared: Arc::new(shared),
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// Open by selector: a profile name and optional modifiers, e.g. `arc-a770,declare-exact`
    /// or `rtx4090,other=2GiB,capture-empties-cache=off` (see [`crate::Modifiers`]), with or
    /// without the device id's `sim:` prefix. Always a new GPU of its own (a private one:
    /// [`SimGpu::shared`] is the one `memplan::open` gives). Without
    /// `seed=N` (or `physics=...`) the physics are nominal (each hidden quantity at its typical
    /// figure); with it they are drawn. The test-bed always gives a seed.
    pub fn open(selector: &str) -> Result<Self> {
        let selector = crate::registry::selector_of(selector);
        let (name, quirks, mods) = parse_with_profile(selector)?;
        let p = profile(&name).ok_or_else(|| Error::UnknownDevice {
            id: name.clone(),
            available: profile_names(),
        })?;
        let gpu = Self::build(
            p,
            (quirks, mods.hidden_bytes_per_capture),
            mods.declare_exact,
            // No seed: the profile as catalogued (nominal physics); a seed draws them.
            match (mods.seed, mods.pin, mods.regime) {
                (None, Pin::Draw, Regime::BySeed) => (DEFAULT_SEED, Pin::Nominal, Regime::World),
                (seed, pin, regime) => (seed.unwrap_or(DEFAULT_SEED), pin, regime),
            },
            selector.trim().to_ascii_lowercase(),
        );
        if let Some(b) = mods.other_processes {
            gpu.set_other_processes(b);
        }
        if let Some(b) = mods.graphics {
            gpu.set_graphics_bytes(b);
        }
        if let Some(dir) = &mods.world {
            let _ = gpu.shared.world.set(World::join(dir)?);
            // Publish this process's context at once.
            drop(gpu.lock());
        }
        Ok(gpu)
    }

    /// Check that `selector` names a profile and that every modifier parses, as
    /// [`SimGpu::open`] would, without building a device (nor joining a `world=DIR`): the
    /// error a scenario file should get when it is loaded, not when it runs.
    pub fn check_selector(selector: &str) -> Result<()> {
        parse_with_profile(crate::registry::selector_of(selector)).map(|_| ())
    }

    /// The profile `selector` opens, its quirks and its modifiers, checked as [`SimGpu::check_selector`]
    /// checks them (a scenario file compares what it asks of the device with the device's
    /// memory when it is loaded).
    pub fn selector_profile(
        selector: &str,
    ) -> Result<(&'static SimProfile, Quirks, crate::Modifiers)> {
        let (name, quirks, mods) = parse_with_profile(crate::registry::selector_of(selector))?;
        let p = profile(&name).ok_or_else(|| Error::UnknownDevice {
            id: format!("sim:{name}"),
            available: format!("sim:{{{}}} with optional ,modifiers", profile_names()),
        })?;
        Ok((p, quirks, mods))
    }

    pub(crate) fn lock(&self) -> StateGuard<'_> {
        // A panic in another holder cannot leave the plain-data state half-updated in a way
        // that matters more than losing the device; keep going with what is there.
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = self.shared.world.get() {
            guard.world_others = w.others();
        }
        StateGuard { guard, gpu: self }
    }

    /// The selector another process opens to share this GPU: this one's with `world=DIR`,
    /// the directory created on first use (see the `world` module: each process publishes
    /// what it holds there).
    pub fn shared_selector(&self) -> Result<String> {
        let world = match self.shared.world.get() {
            Some(w) => w,
            None => {
                let created = World::create()?;
                // Another thread may have won the race; either world is this GPU's.
                let _ = self.shared.world.set(created);
                let w = self
                    .shared
                    .world
                    .get()
                    .ok_or_else(|| Error::Measurement("sim world: not set".into()))?;
                drop(self.lock());
                w
            }
        };
        let own = self.shared.descriptor.id.selector.clone();
        if own.contains("world=") {
            return Ok(own);
        }
        Ok(format!("{own},world={}", world.dir().display()))
    }

    /// A checked [`Device`] on this GPU (the core's tables over this simulated driver). Clones
    /// of the returned device share its tables; another call gives a device with its own.
    pub fn device(&self) -> Device {
        Device::new(self.clone())
    }

    /// Which simulated GPU this is: its id and its number among the simulated GPUs this
    /// process made (`sim:rtx4090#2`). Clones, and every open of a shared selector while one
    /// is alive, share it; a private [`SimGpu::open`] gets its own. The device
    /// ([`Device::gpu_id`](memplan_core::Device::gpu_id)) and the allocator
    /// ([`AllocatorView::gpu_id`](memplan_core::AllocatorView::gpu_id)) report it, so a
    /// measurement session refuses an allocator on another GPU than its device.
    pub fn gpu_id(&self) -> String {
        format!("{}#{}", self.shared.descriptor.id, self.shared.instance)
    }

    /// The simulated driver's live mappings, `(address, bytes)`, in address order.
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        self.lock()
            .vmm_maps
            .iter()
            .map(|(a, (b, _))| (*a, *b))
            .collect()
    }

    /// The profile.
    pub fn profile(&self) -> &SimProfile {
        &self.shared.profile
    }

    /// The quirks in force.
    pub fn quirks(&self) -> &Quirks {
        &self.shared.quirks
    }

    /// The drawn physics (ground truth: for the test-bed and its oracle, never the planner).
    pub fn physics(&self) -> &Physics {
        &self.shared.physics
    }

    /// This GPU with the engine's caching-allocator options pinned to `options` in place of the
    /// ones its seed drew (a scenario that fixes the engine's `PYTORCH_ALLOC_CONF`): the
    /// device's own rules stay ([`AllocatorRules::with_options`](crate::AllocatorRules::with_options)).
    /// Only on a GPU of its own that nothing has allocated from: the allocator's rules are
    /// the device's from its first allocation on.
    pub fn pin_allocator_options(mut self, options: &crate::EngineOptions) -> Result<Self> {
        let shared = Arc::get_mut(&mut self.shared).ok_or_else(|| {
            Error::Measurement("sim: allocator options pinned on a GPU already shared".into())
        })?;
        let rules = shared.physics.allocator.with_options(options);
        shared.physics.allocator = rules;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.heap.reserved(None) > 0 {
            return Err(Error::Measurement(
                "sim: allocator options pinned after the allocator reserved memory".into(),
            ));
        }
        state.heap = crate::heap::Heap::with_rules(rules);
        drop(state);
        Ok(self)
    }

    /// Memory held by other processes, from now on.
    pub fn set_other_processes(&self, bytes: u64) {
        self.lock().other = bytes;
    }

    /// Graphics (DRM) allocations, from now on (invisible with `free_blind_to_graphics`).
    pub fn set_graphics_bytes(&self, bytes: u64) {
        self.lock().graphics = bytes;
    }

    /// Other processes will hold `bytes` from the synchronize that reaches `at_tick` on (one
    /// tick per synchronize; a tick already passed applies at the next synchronize).
    pub fn schedule_other_processes(&self, at_tick: u64, bytes: u64) {
        let mut s = self.lock();
        s.schedule.push((at_tick, bytes));
        s.schedule.sort_by_key(|x| x.0);
    }

    /// The current tick (synchronizes so far).
    pub fn tick(&self) -> u64 {
        self.lock().tick
    }

    /// The engine's caching allocator on this GPU (one per GPU: clones share it).
    pub fn allocator(&self) -> SimAllocator {
        SimAllocator::new(self.clone())
    }

    /// The driver reading with the quirks applied and nothing masked (what the vendor call
    /// returns, even where the declaration says not to trust it).
    pub fn raw_driver_memory(&self) -> DriverMemory {
        readings::raw_driver(
            &self.shared.profile,
            &self.shared.quirks,
            &self.shared.physics,
            &self.lock(),
        )
    }

    /// The device-wide reading of the platform's source with the quirks applied and nothing
    /// masked.
    pub fn raw_device_wide_memory(&self) -> DeviceWideMemory {
        readings::raw_device_wide(
            &self.shared.profile,
            &self.shared.quirks,
            &self.shared.physics,
            &self.lock(),
        )
    }

    /// The graph-pool reading with the quirks applied and nothing masked.
    pub fn raw_graph_pool_memory(&self) -> GraphPoolMemory {
        readings::raw_graph_pool(&self.shared.quirks, &self.lock())
    }

    /// With `stale_free`, a synchronize reports the free memory of the previous synchronize
    /// and remembers the current one for the next.
    fn advance_stale(&self, s: &mut State) {
        if let Some((_, latest)) = s.stale {
            let fresh = readings::fresh_free(
                &self.shared.profile,
                &self.shared.quirks,
                &self.shared.physics,
                s,
            );
            s.stale = Some((latest, fresh));
        }
    }

    /// Segments the engine gave back: held until its queue is synchronized where the platform
    /// has no device-wide synchronize, returned at once elsewhere.
    pub(crate) fn engine_release(&self, s: &mut State, bytes: u64) {
        if !self.shared.platform.facts.synchronize.is_supported() {
            s.queued_release = s.queued_release.saturating_add(bytes);
        }
    }

    /// Synchronizes after which a destroyed graph's driver memory returns (0: at once).
    pub(crate) fn deferred_release(&self) -> u32 {
        self.shared.physics.release_after_syncs
    }

    pub(crate) fn capture_support(&self) -> Result<()> {
        match &self.shared.platform.facts.graph_capture {
            Support::Supported => Ok(()),
            Support::Unsupported { reason } => {
                Err(Error::unsupported("graph capture", reason.clone()))
            }
        }
    }
}

impl SimGpu {
    /// With `no_graph_alloc_nodes`, a graph allocation node cannot be recorded: the typed
    /// `Unsupported` error a runtime without stream-ordered allocation gives.
    pub(crate) fn alloc_node_support(&self, alloc_node_bytes: u64) -> Result<()> {
        if alloc_node_bytes > 0 && self.shared.quirks.no_graph_alloc_nodes {
            return Err(Error::unsupported(
                "graph allocation nodes",
                "the runtime has no stream-ordered allocation (sim: no-graph-alloc-nodes)",
            ));
        }
        Ok(())
    }
}

impl std::fmt::Debug for SimGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGpu")
            .field("id", &self.shared.descriptor.id.to_string())
            .field("truth", &self.truth())
            .finish()
    }
}

impl HalDevice for SimGpu {
    fn descriptor(&self) -> &DeviceDescriptor {
        &self.shared.descriptor
    }

    fn capabilities(&self) -> &ProfilingCapability {
        &self.shared.capability
    }

    fn driver_memory(&mut self) -> Result<DriverMemory> {
        let d = readings::mask_driver(&self.shared.capability, self.raw_driver_memory());
        tracing::trace!(device = %self.shared.descriptor.id, total = ?d.total, free = ?d.free, "sim driver reading");
        Ok(d)
    }

    fn graph_pool_memory(&mut self) -> Result<GraphPoolMemory> {
        Ok(readings::mask_graph_pool(
            &self.shared.capability,
            self.raw_graph_pool_memory(),
        ))
    }

    fn device_wide_memory(&mut self) -> Result<DeviceWideMemory> {
        Ok(readings::mask_device_wide(
            &self.shared.capability,
            self.raw_device_wide_memory(),
        ))
    }

    fn shared_id(&mut self) -> Result<DeviceId> {
        Ok(DeviceId::new(BackendKind::Sim, self.shared_selector()?))
    }

    fn synchronize(&mut self) -> Result<()> {
        let mut s = self.lock();
        s.no_capture("synchronize")?;
        s.synchronize();
        if self.shared.platform.facts.synchronize.is_supported() {
            // A device-wide synchronize waits for the engine's queues too.
            s.queued_release = 0;
        }
        self.advance_stale(&mut s);
        Ok(())
    }

    fn allocate(&mut self, bytes: u64) -> Result<u64> {
        let mut s = self.lock();
        s.no_capture("raw allocation")?;
        // Saturating: an absurd request is out of memory, not an overflow.
        let physical = bytes.div_ceil(RAW_ROUND).saturating_mul(RAW_ROUND);
        s.take(&self.shared.profile, physical, "sim allocate")
            .map_err(|_| Error::OutOfMemory {
                call: "sim allocate".into(),
                requested: bytes,
            })?;
        s.next_handle += 1;
        let handle = s.next_handle;
        s.raw.insert(handle, physical);
        Ok(handle)
    }

    unsafe fn free(&mut self, address: u64, _bytes: u64) -> Result<()> {
        let mut s = self.lock();
        // Strict like a driver: what it did not hand out is an error, not a no-op.
        let physical = s.raw.remove(&address).ok_or_else(|| {
            Error::invalid("address", format!("no live raw allocation {address:#x}"))
        })?;
        // Broken on purpose (`leak-per-free`): part of it stays held.
        s.leaked = s
            .leaked
            .saturating_add(self.shared.quirks.leak_per_free.min(physical));
        Ok(())
    }

    fn graphs(&mut self) -> Result<&mut dyn HalGraphs> {
        self.capture_support()?;
        Ok(self)
    }

    fn gpu_id(&self) -> Option<String> {
        Some(SimGpu::gpu_id(self))
    }

    fn virtual_memory(&mut self) -> Result<&mut dyn HalVirtualMemory> {
        match &self.shared.platform.facts.virtual_memory {
            Support::Supported => Ok(self),
            Support::Unsupported { reason } => {
                Err(Error::unsupported("virtual memory", reason.clone()))
            }
        }
    }
}

/// [`parse_selector`] with the catalogue's profiles as the base quirks.
fn parse_with_profile(selector: &str) -> Result<(String, Quirks, crate::Modifiers)> {
    parse_selector(selector, |name| {
        profile(name)
            .map(|p| p.quirks)
            .ok_or_else(|| Error::UnknownDevice {
                id: format!("sim:{name}"),
                available: format!("sim:{{{}}} with optional ,modifiers", profile_names()),
            })
    })
}
