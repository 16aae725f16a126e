//! One simulated device id opens both halves of an engine on a simulated GPU: the device
//! memplan measures (`memplan::open`) and the allocator the engine allocates from
//! (`memplan::sim::allocator`). A session refuses an allocator on another GPU than its
//! device: the engine's memory would not show in the readings, and the weights would read 0.

#![cfg(feature = "sim")]

use memplan::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan::sim::{BlockId, EngineGraph, GraphSpec, SimAllocator, SimGpu};
use memplan::{AllocatorView, Engine, Error, Request, Result, Session};

const MIB: u64 = 1 << 20;

/// An eager engine whose weights come from the simulated caching allocator.
struct OnSim {
    alloc: SimAllocator,
    weights: Vec<BlockId>,
}

impl Engine for OnSim {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        &mut self.alloc
    }
    fn graph_sizes(&self) -> Vec<u32> {
        Vec::new()
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        Ok(())
    }
    fn release_graphs(&mut self) -> Result<()> {
        Ok(())
    }
}

impl OnSim {
    fn load(&mut self) -> Result<()> {
        for _ in 0..4 {
            self.weights.push(self.alloc.malloc(256 * MIB)?);
        }
        Ok(())
    }
}

#[test]
fn one_id_opens_the_device_and_its_allocator() {
    let dev = memplan::open("sim:l4").unwrap();
    let alloc = memplan::sim::allocator(&dev).unwrap();
    assert_eq!(alloc.gpu_id().as_deref(), dev.gpu_id());
    // The selector and the device id name the same shared GPU.
    let by_selector = SimGpu::shared("l4").unwrap();
    let by_id = SimGpu::shared("sim:l4").unwrap();
    assert_eq!(by_selector.gpu_id(), by_id.gpu_id());
    assert_eq!(Some(by_id.gpu_id().as_str()), dev.gpu_id());
    // A private GPU is another GPU.
    assert_ne!(
        Some(SimGpu::open("sim:l4").unwrap().gpu_id().as_str()),
        dev.gpu_id()
    );

    let mut e = OnSim {
        alloc,
        weights: Vec::new(),
    };
    let mut s = Session::start(&dev, &mut e).unwrap();
    let w = s.load_weights(OnSim::load).unwrap();
    assert_eq!(w, 1024 * MIB, "the device sees what the engine allocates");
    s.profile_run(|_| Ok(())).unwrap();
    let g = LayerGroup::new(AttentionKind::Full, 24, 8, 128);
    let plan = s
        .plan(
            Request::Utilization(0.9),
            &KvSpec::new(vec![g], KvDtype::Bf16, 16),
            KvLimits::new(4096, 2048),
        )
        .unwrap();
    assert!(plan.consumers.bytes(memplan::ConsumerKind::Weights) >= 1024 * MIB);
}

#[test]
fn an_allocator_on_another_gpu_is_refused() {
    let dev = memplan::open("sim:a100-80gb").unwrap();
    // A private GPU of the same profile: the engine's memory would not show on `dev`.
    let private = SimGpu::open("a100-80gb").unwrap();
    let mut e = OnSim {
        alloc: private.allocator(),
        weights: Vec::new(),
    };
    for r in [
        Session::start(&dev, &mut e).map(drop),
        Session::begin(&dev, &mut e, dev.capabilities().clone()).map(drop),
    ] {
        match r {
            Err(Error::InvalidInput { field, message }) => {
                assert_eq!(field, "device");
                assert!(
                    message.contains("allocates on GPU sim:a100-80gb#"),
                    "{message}"
                );
                assert!(message.contains("memplan::sim::allocator"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A device of another backend (a stand-in driver that only describes itself).
struct Elsewhere(memplan::DeviceDescriptor, memplan::ProfilingCapability);

impl memplan::HalDevice for Elsewhere {
    fn descriptor(&self) -> &memplan::DeviceDescriptor {
        &self.0
    }
    fn capabilities(&self) -> &memplan::ProfilingCapability {
        &self.1
    }
    fn driver_memory(&mut self) -> Result<memplan::DriverMemory> {
        Ok(memplan::DriverMemory::new(Some(1 << 30), Some(1 << 30)))
    }
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
    fn allocate(&mut self, _bytes: u64) -> Result<u64> {
        Err(Error::unsupported("allocate", "a stand-in"))
    }
    unsafe fn free(&mut self, _address: u64, _bytes: u64) -> Result<()> {
        Ok(())
    }
}

#[test]
fn a_device_of_another_backend_has_no_simulated_allocator() {
    let id = memplan::DeviceId::new(memplan::BackendKind::Cuda, "0");
    let dev = memplan::Device::new(Elsewhere(
        memplan::DeviceDescriptor::new(id, "stand-in", Some(1 << 30)),
        memplan::ProfilingCapability::exact_discrete(),
    ));
    let e = memplan::sim::allocator(&dev).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidInput { field, message } if field == "device" && message.contains("cuda:0")),
        "{e}"
    );
}

/// What an engine keeps of the simulated allocator (its blocks, its graphs) is nameable from
/// the facade alone.
#[test]
fn an_engine_stores_facade_types() {
    let dev = memplan::open("sim:h200").unwrap();
    let alloc = memplan::sim::allocator(&dev).unwrap();
    alloc.begin_graph_capture().unwrap();
    let g: EngineGraph = alloc
        .end_graph_capture(&GraphSpec::new(8, 1 << 20))
        .unwrap();
    alloc.destroy_graph(g).unwrap();
    let b: BlockId = alloc.malloc(1 << 20).unwrap();
    alloc.free(b).unwrap();
    alloc.release_private_pools().unwrap();
}
