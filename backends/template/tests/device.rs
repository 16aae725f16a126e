//! The template backend on its fake runtime: enumeration, readings, typed errors.

#![cfg(feature = "runtime")]

use memplan_backend_template::backend::TemplateBackend;
use memplan_backend_template::fake;
use memplan_core::{Backend, Error, Reading};

#[test]
fn enumerates_opens_reads_and_names_failing_calls() {
    let b = TemplateBackend;
    let ds = b.devices().unwrap();
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0].id.to_string(), "template:0");
    assert_eq!(ds[0].total_bytes, Some(fake::TOTAL));
    let d = b.open("0").unwrap();
    d.synchronize().unwrap();
    let m = d.driver_memory().unwrap();
    assert_eq!(m.total, Some(fake::TOTAL));
    assert!(m.free.unwrap() <= fake::TOTAL - fake::CONTEXT);
    assert!(!d
        .capabilities()
        .reading(Reading::DriverFree)
        .sees_whole_device());
    // An allocation the device cannot hold is OutOfMemory naming the call.
    let e = d.allocate(fake::TOTAL * 2).unwrap_err();
    assert!(
        matches!(&e, Error::OutOfMemory { call, .. } if call == "fake_malloc"),
        "{e}"
    );
    let a = d.allocate(3 << 20).unwrap();
    let after = d.driver_memory().unwrap().free.unwrap();
    assert_eq!(m.free.unwrap() - after, 4 << 20, "rounded up to a page");
    d.free(a).unwrap();
    // Unknown devices are typed errors.
    assert!(matches!(b.open("1"), Err(Error::UnknownDevice { .. })));
    assert!(b.open("x").is_err());
}
