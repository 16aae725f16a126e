//! The backend against whatever HIP runtime this machine has: none, a runtime without an AMD
//! GPU (CI: Debian's libamdhip64-5), or a real device. In every case it answers without
//! panicking; with a device it also reads every layer and round-trips a raw allocation.

use memplan_backend_rocm::RocmBackend;
use memplan_core::{Backend, Error, Reading};

#[test]
fn enumerates_or_says_why_not() {
    let b = RocmBackend::new();
    match b.devices() {
        Ok(devices) => {
            eprintln!("{} HIP device(s)", devices.len());
            for d in &devices {
                assert!(d.total_bytes.is_some_and(|t| t > 0), "{d:?}");
                assert!(
                    d.properties
                        .iter()
                        .any(|(k, v)| k == "runtime" && v.starts_with("HIP ")),
                    "{d:?}"
                );
            }
            if !devices.is_empty() {
                exercise_device(&b);
            }
        }
        Err(e) => {
            eprintln!("rocm unavailable here: {e}");
            match &e {
                Error::LibraryNotFound { detail, .. } => {
                    assert!(detail.contains("libamdhip64"), "{e}")
                }
                Error::MissingSymbol { .. } => {}
                Error::DriverCall { call, name, .. } => {
                    assert!(call.starts_with("hip"), "{e}");
                    assert!(
                        name.starts_with("hipError") || name.starts_with("unknown code"),
                        "{e}"
                    );
                }
                other => panic!("unexpected error kind: {other}"),
            }
            // Opening a device fails the same way, without panicking.
            assert!(b.open("0").is_err());
        }
    }
}

fn exercise_device(b: &RocmBackend) {
    let d = b.open("0").expect("device 0 opens");
    eprintln!("{}", d.capabilities());
    d.synchronize().expect("synchronize");
    let m = d.driver_memory().expect("driver memory");
    assert!(m.total.is_some());
    let pool = d.graph_pool_memory().expect("graph pool");
    if !d
        .capabilities()
        .reading(Reading::GraphPool)
        .measures_own_usage()
    {
        assert_eq!(
            pool.used, None,
            "a stubbed pool query must not be read as 0"
        );
    }
    let a = d.allocate(64 << 20).expect("64 MiB");
    d.free(a).expect("free");
    assert!(b.open("4096").is_err(), "ordinal out of range");
}
