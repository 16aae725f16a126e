//! Against a fake CUDA 11.2 driver that does not export the 11.4 symbols
//! (`cuDeviceGetGraphMemAttribute`, `cuGraphInstantiateWithFlags`, `cuMemAllocAsync`...):
//! the backend must gate by version and never reach them (cudarc would panic on a missing
//! symbol), declare what it cannot do with the reason, and still give the basic readings.

mod fake;

use memplan_backend_cuda::CudaBackend;
use memplan_core::{protocol::snapshot, Backend, Error, Reading};

#[test]
fn old_driver_is_gated_not_crashed() {
    let Some(_) = fake::load(&["-DFAKE_OLD_DRIVER"]) else {
        return;
    };
    let devs = CudaBackend.devices().expect("devices");
    assert_eq!(
        devs[0]
            .properties
            .iter()
            .find(|(k, _)| k == "driver_version")
            .map(|(_, v)| v.as_str()),
        Some("11.2")
    );
    assert!(
        !devs[0].properties.iter().any(|(k, _)| k == "uuid"),
        "cuDeviceGetUuid_v2 needs 11.4"
    );
    let d = CudaBackend.open("0").expect("open");
    let c = d.capabilities().clone();
    let gp = c.reading(Reading::GraphPool);
    assert_eq!(gp.label(), "unavailable");
    assert!(
        gp.detail().contains("11.2") && gp.detail().contains("11.4"),
        "{gp}"
    );
    assert!(!c.facts.graph_capture.is_supported(), "{c}");
    assert!(
        c.facts.virtual_memory.is_supported(),
        "VMM exists since 10.2: {c}"
    );
    assert!(c.reading(Reading::DriverFree).is_exact());

    let m = snapshot(&d, None).expect("snapshot without graph attributes");
    assert!(m.driver.free.is_some());
    assert_eq!(
        (m.graph_pool.used, m.graph_pool.reserved),
        (None, None),
        "absent, never 0"
    );
    let e = d.graph_capture().err().expect("capture is unsupported");
    assert!(
        matches!(&e, Error::Unsupported { reason, .. } if reason.contains("11.4")),
        "{e}"
    );
    let a = d.allocate(1 << 20).expect("raw allocations work");
    d.free(a).expect("free");
    d.virtual_memory()
        .expect("vmm")
        .granularity()
        .expect("granularity");
}
