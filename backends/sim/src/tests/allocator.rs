//! The caching allocator: rounding, cache kept until `empty_cache`, peak, OOM.

use memplan_core::{AllocatorView, Error};

use super::{free_after_sync, gpu, G, M};
use crate::RAW_ROUND;

#[test]
fn rounds_requests_and_segments() {
    let g = gpu("rtx4090");
    let a = g.allocator();
    let b = a.malloc(1).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved),
        (512, 2 * M),
        "512 B block in a 2 MiB small segment"
    );
    let c = a.malloc(11 * M + 1).unwrap();
    let s = a.stats();
    // The 12 MiB segment's remainder (< 1 MiB) is not split off: the block counts whole, as in PyTorch.
    assert_eq!(s.allocated, 512 + 12 * M);
    assert_eq!(
        s.reserved,
        2 * M + 12 * M,
        "large request: its own segment rounded up to 2 MiB"
    );
    let m = a.malloc(3 * M + 1).unwrap();
    let s = a.stats();
    // A mid-sized request (1 - 10 MiB) in a 20 MiB segment (`kLargeBuffer`), the rest split
    // off for the next request.
    assert_eq!(s.allocated, 512 + 12 * M + 3 * M + 512);
    assert_eq!(
        s.reserved,
        2 * M + 12 * M + 20 * M,
        "mid-sized request: a 20 MiB segment"
    );
    let n = a.malloc(3 * M + 1).unwrap();
    assert_eq!(
        a.stats().reserved,
        2 * M + 12 * M + 20 * M,
        "it shares the segment"
    );
    a.free(n).unwrap();
    a.free(b).unwrap();
    a.free(m).unwrap();
    a.free(c).unwrap();
    assert!(
        matches!(a.free(c), Err(Error::InvalidInput { .. })),
        "double free is an error"
    );
}

#[test]
fn cache_is_kept_until_empty_cache() {
    let g = gpu("h100-80gb");
    let a = g.allocator();
    let start = free_after_sync(&g).unwrap();
    let b = a.malloc(G).unwrap();
    a.free(b).unwrap();
    assert_eq!(a.stats().allocated, 0);
    assert_eq!(a.stats().reserved, G, "cached");
    assert_eq!(
        free_after_sync(&g),
        Some(start - G),
        "the driver still sees it taken"
    );
    let again = a.malloc(G - M).unwrap();
    assert_eq!(a.stats().reserved, G, "served from the cache");
    a.free(again).unwrap();
    let mut view = a.clone();
    view.release_cached().unwrap();
    assert_eq!(a.stats().reserved, 0);
    assert_eq!(free_after_sync(&g), Some(start));
}

#[test]
fn peak_tracks_allocated_until_reset() {
    let g = gpu("a100-80gb");
    let mut a = g.allocator();
    let x = a.malloc(10 * M).unwrap();
    let y = a.malloc(20 * M).unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    assert_eq!(a.stats().peak_allocated, 30 * M);
    let _z = a.malloc(4 * M).unwrap();
    a.reset_peak();
    assert_eq!(a.stats().peak_allocated, 4 * M);
}

#[test]
fn out_of_memory_when_the_device_is_full() {
    let g = gpu("l4");
    let a = g.allocator();
    let e = a.malloc(30 * G).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { requested, .. } if requested == 30 * G),
        "{e}"
    );
    g.set_other_processes(23 * G);
    assert!(a.malloc(G).is_err(), "others hold the memory");
    g.set_other_processes(0);
    assert!(a.malloc(G).is_ok());
}

#[test]
fn oom_gives_the_cache_back_and_retries() {
    let g = gpu("l4");
    let a = g.allocator();
    let b = a.malloc(12 * G).unwrap();
    a.free(b).unwrap(); // 12 GiB cached
                        // 14 GiB do not fit next to the 12 GiB cache, but fit once it is given back.
    let c = a.malloc(14 * G).unwrap();
    assert_eq!(a.stats().reserved, 14 * G);
    a.free(c).unwrap();
}

#[test]
fn raw_allocations_round_to_two_mib_and_fail_cleanly() {
    let g = gpu("rtx3090");
    let r = g.allocate(M).unwrap();
    assert_eq!(r.bytes(), M, "reports what was asked");
    assert_eq!(
        g.truth().raw_allocations,
        2 * M,
        "the driver takes a 2 MiB page"
    );
    g.free(r).unwrap();
    assert!(matches!(
        g.allocate(100 * G),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(g.allocate(0).is_err());
}

#[test]
fn absurd_requests_are_out_of_memory_not_an_overflow() {
    let g = gpu("rtx4090");
    let a = g.allocator();
    for bytes in [u64::MAX, u64::MAX - 1, u64::MAX / 2 + 1] {
        let e = a.malloc(bytes).expect_err("no device holds that");
        assert!(
            matches!(e, Error::OutOfMemory { requested, .. } if requested == bytes),
            "{e}"
        );
    }
    // Raw driver allocations too (the conformance suite asks for impossible sizes).
    let g = gpu("rtx4090");
    for bytes in [u64::MAX, u64::MAX - RAW_ROUND + 2] {
        let e = g.allocate(bytes).expect_err("no device holds that");
        assert!(
            matches!(e, Error::OutOfMemory { requested, .. } if requested == bytes),
            "{e}"
        );
    }
    assert_eq!(g.truth().raw_allocations, 0);
}
