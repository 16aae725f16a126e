//! # memplan
//!
//! How much memory can an inference engine's KV cache take, after the weights, the activation
//! peak, the graph-capture memory and everything else the device holds, and how sure is that?
//! An engine runs its start-up through memplan and gets a plan:
//!
//! ```
//! # #[cfg(feature = "sim")]
//! # include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/engine/src/toy.rs"));
//! # #[cfg(feature = "sim")]
//! # fn main() -> memplan::Result<()> {
//! use memplan::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
//! use memplan::{Request, Session};
//! # let group = LayerGroup::new(AttentionKind::Full, 28, 2, 128);
//! # let kv_spec = KvSpec::new(vec![group], KvDtype::Bf16, 16);
//! # let limits = KvLimits::new(32768, 8192);
//! let request = Request::Utilization(0.9);
//! let dev = memplan::open_shared("sim:rtx4090")?;      // or "cuda:0" with feature `cuda`
//! let mut engine = ToyEngine::new(dev.clone());        // your engine: it implements `Engine`
//! let mut s = Session::start_for(&dev, &mut engine, request)?  // calibrate within it, baseline
//!     .with_kv(&kv_spec, limits);                      // the cache to come (optional)
//! s.check_request(request)?;                          // free < requested: refused early
//! s.load_weights(ToyEngine::load)?;                   // weights: allocator growth
//! s.profile_run(|e| e.forward(8192))?;                // activation peak
//! s.capture_graphs()?;                                // strategy chosen from the capability
//! let plan = s.plan(request, &kv_spec, limits)?;      // budget, KV blocks, warnings
//! let kv = s.into_kv_cache(&plan)?;                   // this rank's blocks (mapped: post-capture)
//! assert_eq!(kv.range.map(|r| r.address()), engine.kv_address);
//! println!("{plan}");
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sim"))]
//! # fn main() {}
//! ```
//!
//! The whole engine, `ToyEngine` included, is the downstream crate `examples/engine` of the
//! repository (`cargo run --manifest-path examples/engine/Cargo.toml`). With post-capture (a
//! device with virtual memory) the engine receives its KV cache's address range before any
//! graph is captured ([`Engine::bind_kv_range`]), and owns it at the end through a guard
//! ([`KvRange`]) that unmaps and releases it on drop; a session dropped half-way tears down
//! what it holds. The plan is [`Plan`]: text (`Display`), SVG ([`plan::render`]) and the
//! `memplan.plan/1` JSON (`docs/plan-schema.md`), read back by [`Plan::from_json`]. Errors are
//! typed ([`Error::class`], [`Refusal`], [`Param`]; a step's error is [`Error::During`] naming
//! it); warnings are [`Warning`].
//!
//! The session's steps run once, in order ([`Step`]; refused by name otherwise), and it ends
//! with [`Session::into_kv_cache`], which takes a plan, never a byte count. Where the engine
//! allocates the KV cache itself, it allocates [`KvCache::num_blocks`]: the plan's count, or
//! fewer where the session measured that the engine's allocator rounds the cache's tensors past
//! what the plan kept (or more, given the session's own plan, where it measured a granule finer
//! than the rounding the plan kept room for). That measurement needs the engine's hook
//! ([`Engine::allocate_kv_cache`]) or tensors from its allocator
//! ([`AllocatorView::allocate_tensor`]); without either, the plan keeps room for the coarsest
//! rounding the engine's own allocations during the start-up allow, and [`KvCache::warnings`]
//! says the allocation was not measured (`kv_allocation_unmeasured`). An engine whose caching
//! allocator runs with options (`PYTORCH_ALLOC_CONF`: expandable segments, power-of-two
//! divisions, `max_split_size_mb`) states them with [`Session::with_allocator_config`]
//! ([`AllocatorConfig::parse`], or [`AllocatorConfig::from_env`] as PyTorch reads them): the
//! plan then takes the cache's tensors to round and share segments as they say.
//!
//! ## Several GPUs
//!
//! One process per GPU: each opens its device and runs its session with its [`Rank`]
//! ([`Session::with_rank`]) up to `plan`; the ranks exchange their plans' JSON
//! ([`Plan::to_json`]) through the engine's own all-gather and combine them
//! ([`combine_json`]: every rank gets the fewest blocks of any, [`Ranks`] says who limits);
//! each rank then maps the combined plan ([`Session::into_kv_cache`]`(&combined)`), in its own
//! block layout. `examples/engine --ranks 2` runs two ranks in two processes this way.
//!
//! ## Backends
//!
//! Backends are chosen with cargo features, one per backend, named in the one list of
//! backends ([`BackendKind`] shows it as a table; `sim` is the default). This crate links every
//! compiled-in backend from that list, so a backend needs no line here. Other features:
//! `model` (model configs, checkpoint headers and the dry run: the `memplan::model` module,
//! which is the `memplan_model` crate) and `declarations` (every backend's pure declaration,
//! for [`declared_platforms`]).
//!
//! Every backend name parses in every build; asking for one that is not compiled in returns
//! [`Error::BackendNotCompiled`] naming the feature. A binary with every runtime-loaded backend
//! starts on a machine with no vendor library and reports each one unavailable with the reason.
//! Opening the same simulated device id twice in one process gives the same simulated GPU.

pub use memplan_core::*;

pub use memplan_planner::budget::{self, Request};
pub use memplan_planner::plan::{
    self, combine_json, combine_ranks, Plan, PlanBuilder, RankPlan, Ranks,
};
pub use memplan_planner::{
    calibrate, strategy, warning, CalibrationReport, Consumer, ConsumerKind, Engine, GraphMethod,
    GraphPlan, KvCache, KvRange, Profile, Provenance, Rank, Session, Step, StrategyKind, Warning,
};

/// Model specs and the dry run (feature `model`): `memplan_model`.
#[cfg(feature = "model")]
pub use memplan_model as model;

#[cfg(feature = "sim")]
pub mod sim {
    //! The simulated backend's own types (feature `sim`): a simulated GPU, the PyTorch-like
    //! caching allocator an engine can run on it, what an engine keeps of it (blocks, graphs),
    //! and the ground truth behind the readings.
    //!
    //! One id opens both halves: `memplan::open("sim:rtx4090")` is the device memplan measures,
    //! [`allocator`] (or [`gpu`]) of that device is the allocator the engine allocates from on
    //! the same simulated GPU. A session refuses to start (an [`Error::InvalidInput`] on
    //! `device`) when its device and the engine's allocator are different GPUs (a private
    //! [`SimGpu::open`] beside `memplan::open`): the engine's memory would not show where memplan
    //! reads, and every figure would be 0.
    use memplan_core::{Device, Error, Result};

    pub use memplan_backend_sim::{
        profile_names, BlockId, EngineGraph, GraphSpec, GroundTruth, SimAllocator, SimGpu,
    };

    /// The simulated GPU behind `device` (opened with `memplan::open("sim:...")`); a device
    /// of another backend is an [`Error::InvalidInput`] on `device`.
    pub fn gpu(device: &Device) -> Result<SimGpu> {
        device.inspect(|g: &SimGpu| g.clone()).ok_or_else(|| {
            Error::invalid(
                "device",
                format!(
                    "{} is not a simulated device (sim:PROFILE)",
                    device.descriptor().id
                ),
            )
        })
    }

    /// The caching allocator of the simulated GPU behind `device`: what the engine allocates
    /// from it is what `device` reads (one allocator per GPU: every call shares it).
    pub fn allocator(device: &Device) -> Result<SimAllocator> {
        gpu(device).map(|g| g.allocator())
    }
}

/// What is generated from the one list of backends (`memplan_core::backend_list!`): each
/// backend's crate is referenced under its feature, so adding a backend to the list (and its
/// feature to this crate's manifest) is all this crate needs.
macro_rules! from_the_backend_list {
    ($(
        $variant:ident {
            name: $name:literal,
            aliases: [$($alias:literal),*],
            feature: $feature:literal,
            krate: $krate:ident,
            $($rest:tt)*
        }
    )*) => {
        /// Reference every compiled-in backend crate so the linker keeps its `inventory`
        /// registration.
        fn link_backends() {
            $(
                #[cfg(feature = $feature)]
                $krate::link();
            )*
        }

        /// Every platform the compiled-in backends declare a capability for (each backend's
        /// `capability::platforms()`: its pure declaration, no vendor library): the rows of
        /// the capability matrix. With the feature `declarations`, every backend's, with no
        /// vendor library or header needed to build.
        pub fn declared_platforms() -> Vec<(BackendKind, &'static str, ProfilingCapability)> {
            #[allow(unused_mut)]
            let mut rows = Vec::new();
            $(
                #[cfg(any(feature = "declarations", feature = $feature))]
                rows.extend(
                    $krate::capability::platforms()
                        .into_iter()
                        .map(|(platform, capability)| (BackendKind::$variant, platform, capability)),
                );
            )*
            rows
        }
    };
}

memplan_core::backend_list!(from_the_backend_list);

/// The backends compiled into this build.
pub fn compiled_backends() -> Vec<BackendKind> {
    link_backends();
    memplan_core::registry::registered()
        .iter()
        .map(|r| r.kind)
        .collect()
}

/// Create a compiled-in backend, or a typed error when it is not compiled in.
pub fn backend(kind: BackendKind) -> Result<Box<dyn Backend>> {
    link_backends();
    memplan_core::registry::registered()
        .into_iter()
        .find(|r| r.kind == kind)
        .map(|r| (r.create)())
        .ok_or_else(|| Error::BackendNotCompiled {
            backend: kind,
            feature: kind.feature(),
            compiled: compiled_list(),
        })
}

fn compiled_list() -> String {
    let v: Vec<_> = compiled_backends().iter().map(|k| k.name()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Parse a device id (`sim:rtx4090,seed=3`, `cuda:0`) as [`DeviceId`]'s `FromStr` does. Where
/// the simulator is compiled in, the error for a simulator id without a profile (`sim`,
/// `sim:`) lists its profiles, as opening an unknown one does.
pub fn parse_device_id(id: &str) -> Result<DeviceId> {
    id.parse::<DeviceId>().map_err(|e| match e {
        #[cfg(feature = "sim")]
        Error::UnknownDevice { id, .. }
            if matches!(
                id.split_once(':').map_or(id.as_str(), |(b, _)| b).parse(),
                Ok(BackendKind::Sim)
            ) =>
        {
            Error::UnknownDevice {
                id,
                available: format!(
                    "sim:{{{}}} with optional ,modifiers (e.g. `sim:h100-80gb,seed=3`)",
                    sim::profile_names()
                ),
            }
        }
        e => e,
    })
}

/// Open a device by id (`sim:rtx4090`, `cuda:0`).
pub fn open(id: &str) -> Result<Device> {
    let id: DeviceId = parse_device_id(id)?;
    let span = tracing::debug_span!("open", device = %id);
    let _e = span.enter();
    backend(id.backend)?.open(&id.selector)
}

/// Open a device by id: the same as [`open`] (every [`Device`] is a clonable handle; the
/// engine, the measurement session and the guards that give memory back on drop each hold a
/// clone of one device). Kept for callers written against the first engine-facing API.
pub fn open_shared(id: &str) -> Result<SharedDevice> {
    open(id)
}

/// One backend's report for `memplan devices`.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct BackendReport {
    /// Which backend.
    pub backend: BackendKind,
    /// Available, or why not.
    #[serde(flatten)]
    pub status: BackendStatus,
    /// Its devices (empty when unavailable).
    pub devices: Vec<DeviceDescriptor>,
}

/// Enumerate every compiled-in backend and its devices. Never fails: a backend that cannot
/// run is reported unavailable with its reason.
pub fn survey() -> Vec<BackendReport> {
    link_backends();
    memplan_core::registry::registered()
        .into_iter()
        .map(|r| {
            let b = (r.create)();
            match b.devices() {
                Ok(devices) => BackendReport {
                    backend: r.kind,
                    status: BackendStatus::Available,
                    devices,
                },
                Err(e) => BackendReport {
                    backend: r.kind,
                    status: BackendStatus::Unavailable {
                        reason: e.to_string(),
                    },
                    devices: Vec::new(),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_backend_is_a_typed_error() {
        // `xpu` is never in the default feature set of this crate's tests.
        if compiled_backends().contains(&BackendKind::Xpu) {
            return;
        }
        let e = open("xpu:0").expect_err("xpu is not compiled in");
        assert!(matches!(e, Error::BackendNotCompiled { .. }), "{e}");
        assert!(e.to_string().contains("--features xpu"), "{e}");
    }
}
