//! # memplan-backend-sim
//!
//! Simulated GPUs that reproduce each vendor's memory behaviour, deterministically, so that
//! memplan's protocol, planner and CLI run and are tested on machines without a GPU.
//!
//! ## Contract (engineer B and the conformance suite build on these shapes)
//!
//! - [`profiles`] / [`profile`]: named GPUs ([`SimProfile`]) with totals as real drivers
//!   report them (each with its source), a context overhead, the platform's [`Quirks`] and the
//!   facts the real backend reads there ([`PlatformFacts`]); the profile's capability
//!   ([`SimProfile::capability`]) is the real backend's own `capability::declare` run on those
//!   facts (the backend crates built without their `runtime` feature: no vendor library).
//! - [`SimGpu`]: a cheap clonable handle (`Arc<Mutex<..>>`); clones share one device, so an
//!   "engine" and memplan can both hold it. [`SimGpu::shared`] (what `memplan::open` uses)
//!   gives the GPU already open under the same selector in this process, if any, so two opens
//!   of `sim:rtx4090` see one device; [`SimGpu::open`] always makes a private one. Selectors:
//!   `name[,modifier...]`, modifiers being `declare-exact` (declare every reading exact while
//!   the quirks stay on: calibration must catch it), `QUIRK=on|off`, `QUIRK=BYTES` for the
//!   byte quirks ([`BYTE_QUIRK_NAMES`]), `other=BYTES`, `graphics=BYTES`, `world=DIR`
//!   ([`Modifiers`]).
//! - **Other OS processes** (`world=DIR`): a GPU opened with the same `DIR` in several
//!   processes is one device; each process publishes what it holds to its own file there and
//!   counts the others' as memory other processes hold (device-wide readings and out of
//!   memory see it, a process-local reading does not). `HalDevice::shared_id` creates the
//!   directory and names the selector another process opens: the conformance suite's second
//!   process is a real process on the same simulated GPU.
//! - **Liars** (`broken-*` profiles, for the conformance suite): each declares what a real
//!   platform declares while its device lies once: `broken-stale` (free lags a synchronize),
//!   `broken-process-local` (a process-local free declared exact), `broken-total-high` /
//!   `broken-total-low` (the total 8 GiB too high, 128 MiB too low), `broken-leaky-free`,
//!   `broken-leaky-vm` (2 MiB kept by every free / `destroy_physical`),
//!   `broken-leaky-free-unreadable` (the leaky free where free is declared unavailable).
//! - The world outside the process: [`SimGpu::set_other_processes`],
//!   [`SimGpu::set_graphics_bytes`], [`SimGpu::schedule_other_processes`]. **Clock**: one tick
//!   per `Device::synchronize`; a change scheduled at tick `t` applies at the synchronize that
//!   reaches `t` (a tick already passed applies at the next synchronize). Deferred graph
//!   releases and the stale-free lag also advance at synchronize. [`SimGpu::truth`] gives the
//!   real numbers ([`GroundTruth`]) for tests and oracles.
//! - `impl HalDevice for SimGpu` (the raw primitives every backend implements; the core's
//!   `Device` keeps the books: [`SimGpu::device`] wraps a GPU in one): `driver_memory` /
//!   `graph_pool_memory` obey the quirks, and a reading the declaration calls unavailable is
//!   returned as `None` (a backend does not source what it cannot trust);
//!   [`SimGpu::raw_driver_memory`] / [`SimGpu::raw_graph_pool_memory`] show the unmasked vendor
//!   values. `allocate` rounds physical use up to 2 MiB (like cuMemAlloc). `HalGraphs` and
//!   `HalVirtualMemory` are available where the platform supports them, `Error::Unsupported`
//!   otherwise; reservations get addresses (from `0x7f00_0000_0000`), physical memory is taken
//!   when created, and [`SimGpu::mappings`] lists what is mapped where. Like a driver, the
//!   simulator refuses a call on something it did not hand out. `synchronize`, raw allocations
//!   and replays during a capture fail (global capture mode).
//! - [`SimAllocator`] (`Clone + AllocatorView`, one per GPU): PyTorch-like caching allocator.
//!   Requests round up to 512 B; requests <= 1 MiB come from 2 MiB small segments, larger ones
//!   from segments rounded up to 2 MiB; free blocks are reused best-fit and split (when the
//!   remainder is at least 512 B for small, over 1 MiB for large blocks); the cache is kept until `empty_cache`; on a driver OOM the
//!   request is retried as PyTorch's `malloc` retries it (just enough oversize blocks of its own
//!   pool under `max_split_size_mb`; then, where no capture is under way, the default pool's free
//!   segments and the private pool's where no engine graph uses it), then
//!   `Error::OutOfMemory`. `reserved` includes the graph private pool, as PyTorch's does.
//! - Engine graphs ([`SimAllocator::begin_graph_capture`] / `end_graph_capture(&GraphSpec)` /
//!   `destroy_graph` / `release_private_pools`): entering capture empties the cache when
//!   `capture_empties_cache` (on by default); allocations during capture go to one private
//!   pool shared by every graph. Per graph, the driver sees `kernel_nodes` times a drawn
//!   per-node figure of exec object (no allocator sees it) plus the drawn per-capture bytes
//!   (never returned);
//!   intermediates are allocated and freed in the private pool (which keeps them cached, so it
//!   grows to the largest graph's need); each graph keeps an output of `intermediate_bytes / 16`
//!   live in the pool until destroyed (the per-graph allocator part); `alloc_node_bytes` go to
//!   the driver's graph pool. This is what makes a linear extrapolation from two samples wrong
//!   in both directions.
//! - **Synchronize.** Where the platform declares no device-wide synchronize (Level Zero),
//!   segments the engine gives back (`empty_cache`, `release_private_pools`) stay held on the
//!   driver until the engine synchronizes its own queue ([`SimAllocator::synchronize`]) or its
//!   allocator retries after an out-of-memory; `Device::synchronize` does not release them
//!   ([`GroundTruth::queued_release`]). Elsewhere they return at once.
//!
//! - **Physics** ([`physics`]): every hidden quantity (exec bytes per kernel node, per-capture
//!   bytes, how much a warm-up leaves cached, the context overhead, noise of an approximate free
//!   reading) is drawn per device from a documented range with a seed (`seed=N`;
//!   `physics=low|high` pins every range to one end). A selector without either gets nominal
//!   physics (each quantity at its typical figure); the test-bed always gives a seed
//!   ([`DEFAULT_SEED`] unless asked otherwise). Ranges and sources:
//!   `docs/simulator-physics.md`. [`SimGpu::physics`] shows the draw to the test-bed.
//!
//! ## Additions beyond the original contract
//!
//! `SimProfile` also has `device_name`, `total_source` and `apu_aperture_bytes` (for unified
//! memory APUs `total_bytes` is the memory the GPU can really use; the driver reports the
//! aperture). `Quirks` also has `no_graph_pool_query` (Level Zero has no such query) and
//! `no_graph_alloc_nodes` (a runtime without stream-ordered allocation, HIP < 5.3: recording a
//! graph allocation node is `Error::Unsupported`, capture without one works).
//! `SimGpu::quirks`, `tick`, `raw_*`; `SimAllocator::abort_graph_capture`, `gpu`;
//! `GraphSpec::output_bytes`.

mod allocator;
mod backend;
pub mod capability;
mod capture;
mod catalog;
mod declared;
mod gpu;
mod heap;
pub mod physics;
mod profile;
mod quirks;
mod readings;
mod registry;
mod state;
mod truth;
mod vmm;
mod world;

#[cfg(test)]
mod tests;

pub use allocator::{AllocatorSnapshot, EngineGraph, GraphSpec, SimAllocator};
pub use backend::SimBackend;
pub use declared::PlatformFacts;
pub use gpu::{SimGpu, RAW_ROUND};
pub use heap::BlockId;
pub use physics::{AllocatorRules, EngineOptions, Physics, Pin, Regime, Rng, DEFAULT_SEED};
pub use profile::{profile, profile_names, profiles, DeviceWideSource, SimProfile};
pub use quirks::{Modifiers, Quirks, BYTE_QUIRK_NAMES, QUIRK_NAMES};
pub use truth::GroundTruth;
pub use vmm::GRANULARITY;

/// Referenced by the facade so the linker keeps this crate's registration.
pub fn link() {}
