//! The core's bookkeeping against a fake backend that records every primitive: ownership,
//! zero sizes, unmap before release, undo on failure, retry after a failed release, teardown.

use crate::testing::{Calls, FakeHal};
use crate::{Device, Error, Live};

fn device() -> (Device, Calls) {
    let (hal, calls) = FakeHal::new();
    (Device::new(hal), calls)
}

fn driver_holds(calls: &Calls) -> [usize; 4] {
    calls.with(|d| {
        [
            d.allocations.len(),
            d.ranges.len(),
            d.physical.len(),
            d.mapped.len(),
        ]
    })
}

#[test]
fn raw_allocations_are_checked_by_the_core() {
    let (d, calls) = device();
    assert!(matches!(d.allocate(0), Err(Error::InvalidInput { .. })));
    assert!(
        calls.take().is_empty(),
        "a zero size never reaches the backend"
    );
    let a = d.allocate(10).unwrap();
    assert_eq!((a.bytes(), d.live().allocations), (10, 1));
    let (other, _) = device();
    let f = other.free(a).unwrap_err();
    assert!(f.to_string().contains("not a live raw allocation"), "{f}");
    calls.fail("free");
    let f = d.free(f.handle).unwrap_err();
    assert!(matches!(f.error, Error::DriverCall { .. }));
    assert_eq!(d.live().allocations, 1, "a failed free keeps it tracked");
    calls.heal("free");
    d.free(f.handle)
        .expect("retried with the handle given back");
    assert_eq!(d.live(), Live::default());
    assert_eq!(driver_holds(&calls), [0; 4]);
}

#[test]
fn sizes_and_offsets_are_granularity_multiples() {
    let (d, calls) = device();
    let vm = d.virtual_memory().unwrap();
    assert_eq!(vm.granularity().unwrap(), 2);
    assert!(matches!(vm.reserve(3), Err(Error::InvalidInput { .. })));
    assert!(matches!(vm.reserve(0), Err(Error::InvalidInput { .. })));
    let r = vm.reserve(8).unwrap();
    for (offset, bytes) in [(1, 2), (0, 3), (0, 0), (6, 4), (u64::MAX - 1, 2)] {
        let e = vm.map(&r, offset, bytes).unwrap_err();
        assert!(
            matches!(e, Error::InvalidInput { .. }),
            "{offset}+{bytes}: {e}"
        );
    }
    assert_eq!(
        calls.take(),
        ["granularity", "reserve"],
        "asked once, cached; bad input never reaches the backend"
    );
    vm.release(r).unwrap();
}

#[test]
fn unmap_comes_before_release_and_overlaps_are_refused() {
    let (d, calls) = device();
    let vm = d.virtual_memory().unwrap();
    let r = vm.reserve(8).unwrap();
    let m = vm.map(&r, 2, 4).unwrap();
    assert_eq!((m.address(), m.offset(), m.bytes()), (r.base() + 2, 2, 4));
    assert!(m.is_in(&r));
    for (offset, bytes) in [(0, 4), (4, 2), (2, 2)] {
        assert!(
            vm.map(&r, offset, bytes).is_err(),
            "{offset}+{bytes} overlaps"
        );
    }
    let next = vm.map(&r, 6, 2).expect("touching ends do not overlap");
    let f = vm.release(r).unwrap_err();
    assert!(f.to_string().contains("2 mapping(s) still live"), "{f}");
    vm.unmap(m).unwrap();
    vm.unmap(next).unwrap();
    vm.release(f.handle).unwrap();
    let c = calls.take();
    let (unmap, free) = (
        c.iter().rposition(|x| *x == "unmap").unwrap(),
        c.iter().position(|x| *x == "free_range").unwrap(),
    );
    assert!(unmap < free, "{c:?}");
    assert_eq!(driver_holds(&calls), [0; 4]);
}

#[test]
fn a_failed_mapping_undoes_its_own_steps_in_reverse() {
    let (d, calls) = device();
    let vm = d.virtual_memory().unwrap();
    let r = vm.reserve(8).unwrap();
    calls.take();
    calls.fail("map");
    assert!(vm.map(&r, 0, 2).is_err());
    calls.heal("map");
    assert_eq!(calls.take(), ["create_physical", "map", "destroy_physical"]);
    calls.fail("set_access");
    assert!(vm.map(&r, 0, 2).is_err());
    calls.heal("set_access");
    assert_eq!(
        calls.take(),
        [
            "create_physical",
            "map",
            "set_access",
            "unmap",
            "destroy_physical"
        ]
    );
    assert_eq!(d.live().mappings + d.live().unreleased_physical, 0);
    // When the undo fails too, what is left stays tracked and blocks the range's release.
    calls.fail("set_access");
    calls.fail("unmap");
    assert!(vm.map(&r, 0, 2).is_err());
    calls.heal("set_access");
    calls.heal("unmap");
    assert_eq!(
        d.live().mappings,
        1,
        "still mapped: tracked without a handle"
    );
    let f = vm.release(r).unwrap_err();
    assert!(f.to_string().contains("still live"), "{f}");
    drop(d);
    assert_eq!(driver_holds(&calls), [0; 4], "teardown released it");
}

#[test]
fn a_failed_unmap_or_physical_release_keeps_the_mapping_and_resumes() {
    let (d, calls) = device();
    let vm = d.virtual_memory().unwrap();
    let r = vm.reserve(4).unwrap();
    let m = vm.map(&r, 0, 4).unwrap();
    calls.take();
    calls.fail("unmap");
    let f = vm.unmap(m).unwrap_err();
    calls.heal("unmap");
    assert_eq!(d.live().mappings, 1, "still mapped");
    let r = vm.release(r).unwrap_err().handle;
    // The unmap works, destroying the physical memory fails: the handle is not lost.
    calls.fail("destroy_physical");
    let f = vm.unmap(f.handle).unwrap_err();
    calls.heal("destroy_physical");
    let live = d.live();
    assert_eq!((live.mappings, live.unreleased_physical), (0, 1));
    vm.release(r)
        .expect("nothing is mapped in the range any more");
    vm.unmap(f.handle)
        .expect("resumes: only the physical release is retried");
    assert_eq!(
        calls.take(),
        [
            "unmap",
            "unmap",
            "destroy_physical",
            "free_range",
            "destroy_physical"
        ]
    );
    assert_eq!(d.live(), Live::default());
    assert_eq!(driver_holds(&calls), [0; 4]);
}

#[test]
fn clones_share_tables_and_the_last_one_tears_down_in_order() {
    let (d, calls) = device();
    let engine = d.clone();
    let r = d.virtual_memory().unwrap().reserve(8).unwrap();
    let _m = engine
        .virtual_memory()
        .unwrap()
        .map(&r, 0, 8)
        .expect("a clone knows the range");
    let _a = d.allocate(3).unwrap();
    {
        let gc = d.graph_capture().unwrap();
        let work = crate::CaptureWork {
            kernel_nodes: 1,
            alloc_node_bytes: 0,
        };
        let _g = gc.capture_once(&work).unwrap();
        gc.begin_capture().unwrap();
    }
    calls.take();
    drop(d);
    assert!(calls.take().is_empty(), "a clone is still alive");
    drop(engine);
    assert_eq!(
        calls.take(),
        [
            "abort",
            "destroy_exec",
            "destroy_graph",
            "release_pool",
            "unmap",
            "destroy_physical",
            "free_range",
            "free"
        ]
    );
    assert_eq!(driver_holds(&calls), [0; 4]);
}

#[test]
fn teardown_never_frees_a_range_under_a_mapping_it_could_not_unmap() {
    let (d, calls) = device();
    let vm = d.virtual_memory().unwrap();
    let r = vm.reserve(4).unwrap();
    let _m = vm.map(&r, 0, 4).unwrap();
    calls.fail("unmap");
    drop(d);
    calls.with(|x| {
        assert_eq!(
            (x.mapped.len(), x.physical.len(), x.ranges.len()),
            (1, 1, 1)
        )
    });
}

#[test]
fn unsupported_features_are_refused_with_the_declared_reason() {
    let (mut hal, _) = FakeHal::new();
    hal.granularity = 0;
    let d = Device::new(hal);
    let e = d.virtual_memory().unwrap().reserve(2).unwrap_err();
    assert!(e.to_string().contains("granularity reads 0"), "{e}");
    let (mut hal, _) = FakeHal::new();
    hal.caps.facts.virtual_memory = crate::Support::no("no VMM here");
    let d = Device::new(hal);
    let e = d.virtual_memory().err().unwrap();
    assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("no VMM here"));
}
