//! Tests that need an NVIDIA GPU. Ignored by default; `scripts/gpu-check.sh` runs them with
//! `--ignored --test-threads=1`. They also hold a lock, because memory readings of one test
//! would see another's allocations.

use std::sync::Mutex;

use memplan_core::{protocol::snapshot, Backend, CaptureWork, Device, Error, Reading};

use crate::CudaBackend;

static GPU: Mutex<()> = Mutex::new(());
const MIB: u64 = 1 << 20;
/// Slack for driver bookkeeping between two readings (page tables, allocation granularity).
const SLACK: i64 = 2 * MIB as i64;

/// The environment variable naming the device these tests use (`gpu-check.sh --device N` sets
/// it, so the tests check the same GPU as the rest of the report); `0` when unset.
const DEVICE_ENV: &str = "MEMPLAN_GPU_TEST_DEVICE";

fn ordinal() -> String {
    device_from(std::env::var(DEVICE_ENV).ok())
}

fn device_from(v: Option<String>) -> String {
    v.map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "0".into())
}

fn open() -> Device {
    let n = ordinal();
    CudaBackend
        .open(&n)
        .unwrap_or_else(|e| panic!("cuda:{n} should open on a GPU machine: {e}"))
}

#[test]
fn the_device_comes_from_the_environment() {
    assert_eq!(device_from(None), "0");
    assert_eq!(device_from(Some(" 3 ".into())), "3");
    assert_eq!(device_from(Some(String::new())), "0");
}

fn free(d: &Device) -> i64 {
    let m = snapshot(d, None).expect("snapshot");
    m.driver.free.expect("cuMemGetInfo gives free") as i64
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn enumerates_and_declares() {
    let _g = GPU.lock();
    let devs = CudaBackend.devices().expect("devices");
    assert!(!devs.is_empty());
    let d = open();
    let desc = d.descriptor();
    assert!(desc.total_bytes.unwrap_or(0) > 0, "{desc:?}");
    assert!(desc
        .properties
        .iter()
        .any(|(k, _)| k == "compute_capability"));
    let c = d.capabilities();
    assert!(c.reading(Reading::DriverFree).measures_own_usage(), "{c}");
    let e = CudaBackend.open("4096").expect_err("no such device");
    assert!(matches!(e, Error::UnknownDevice { .. }), "{e}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn readings_are_consistent() {
    let _g = GPU.lock();
    let d = open();
    let m = snapshot(&d, None).expect("snapshot");
    let (free, total) = (m.driver.free.expect("free"), m.driver.total.expect("total"));
    assert!(free <= total && total > 0, "{m}");
    assert_eq!(
        Some(total),
        d.descriptor().total_bytes,
        "cuMemGetInfo and cuDeviceTotalMem agree"
    );
    // NVML's framebuffer less its reserve is a second reading of the total: a sound driver's
    // total is not above it (else every plan here would warn driver_total_above_device).
    if let Some(device) = m.device.total {
        assert!(total <= device, "cuMemGetInfo total above NVML's: {m}");
    }
    if d.capabilities().facts.graph_pool_attributes.is_supported() {
        assert!(
            m.graph_pool.used.is_some() && m.graph_pool.reserved_high.is_some(),
            "{m}"
        );
    } else {
        assert_eq!(m.graph_pool.used, None);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn raw_allocation_moves_free_memory_exactly() {
    let _g = GPU.lock();
    let d = open();
    let before = free(&d);
    let a = d.allocate(256 * MIB).expect("allocate");
    let during = free(&d);
    let taken = before - during;
    assert!(
        (taken - 256 * MIB as i64).abs() <= SLACK,
        "allocated 256 MiB, free dropped {taken}"
    );
    d.free(a).expect("free");
    let after = free(&d);
    assert!(
        (after - before).abs() <= SLACK,
        "free did not come back: {before} -> {after}"
    );
    let e = d.allocate(1 << 52).expect_err("4 PiB cannot fit");
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert!(matches!(d.allocate(0), Err(Error::InvalidInput { .. })));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn graph_capture_uses_and_releases_the_pool() {
    let _g = GPU.lock();
    let d = open();
    if !d.capabilities().facts.graph_capture.is_supported() {
        return;
    }
    d.graph_capture()
        .expect("capture")
        .release_pool()
        .expect("trim");
    let base = snapshot(&d, None).expect("snapshot");
    let g = d.graph_capture().expect("capture");
    g.begin_capture().expect("begin");
    g.record(&CaptureWork::new(16).with_alloc_node(64 * MIB))
        .expect("record");
    let id = g.end_capture().expect("end");
    g.replay(id).expect("replay");
    let after = snapshot(&d, None).expect("snapshot");
    let w = after - base;
    let pool = w.graph_pool_reserved.expect("graph pool reserved");
    assert!(pool >= 64 * MIB as i64, "graph pool grew by {pool}: {w}");
    assert!(
        w.driver_taken().expect("free") >= pool - SLACK,
        "free dropped less than the pool grew: {w}"
    );
    let g = d.graph_capture().expect("capture");
    g.destroy(id).expect("destroy");
    g.release_pool().expect("trim");
    let end = snapshot(&d, None).expect("snapshot");
    assert_eq!(end.graph_pool.reserved, Some(0), "{end}");
    assert!(
        (end.driver.free.unwrap_or(0) as i64 - base.driver.free.unwrap_or(0) as i64).abs() <= SLACK,
        "{end}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn aborted_capture_leaves_the_stream_usable() {
    let _g = GPU.lock();
    let d = open();
    if !d.capabilities().facts.graph_capture.is_supported() {
        return;
    }
    let g = d.graph_capture().expect("capture");
    g.abort_capture().expect("abort without capture is a no-op");
    g.begin_capture().expect("begin");
    g.record(&CaptureWork::new(2).with_alloc_node(MIB))
        .expect("record");
    g.abort_capture().expect("abort");
    assert!(g.end_capture().is_err(), "nothing to end after abort");
    g.begin_capture().expect("begin again");
    g.record(&CaptureWork::new(1)).expect("record");
    let id = g.end_capture().expect("end");
    g.replay(id).expect("replay");
    g.destroy(id).expect("destroy");
    assert!(
        g.destroy(id).is_err(),
        "double destroy is an error, not a crash"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn virtual_memory_maps_real_memory() {
    let _g = GPU.lock();
    let d = open();
    if !d.capabilities().facts.virtual_memory.is_supported() {
        return;
    }
    let before = free(&d);
    let vm = d.virtual_memory().expect("vmm");
    let g = vm.granularity().expect("granularity");
    assert!(g > 0 && g.is_power_of_two(), "{g}");
    let range = vm.reserve(64 * g).expect("reserve");
    assert!(matches!(
        vm.map(&range, 1, g),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        vm.map(&range, 64 * g, g),
        Err(Error::InvalidInput { .. })
    ));
    let m = vm.map(&range, g, 32 * g).expect("map");
    let mapped = free(&d);
    let taken = before - mapped;
    assert!(
        (taken - (32 * g) as i64).abs() <= SLACK,
        "mapped {} bytes, free dropped {taken}",
        32 * g
    );
    let vm = d.virtual_memory().expect("vmm");
    let range = vm
        .release(range)
        .expect_err("release with a live mapping is refused")
        .handle;
    vm.unmap(m).expect("unmap");
    vm.release(range).expect("release");
    let after = free(&d);
    assert!((after - before).abs() <= SLACK, "{before} -> {after}");
}
