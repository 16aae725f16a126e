//! Tests of the granule measurement: simulated allocators that round to a granule.

use super::*;
use crate::session::kv_cache::layout;
use memplan_core::bytes::MIB;

/// Rounded up to a multiple of `g`.
fn up(x: u64, g: u64) -> u64 {
    x.div_ceil(g) * g
}

#[test]
fn the_granule_is_the_common_divisor_of_rounded_sizes_and_bounds_every_granule() {
    // PyTorch's 2 MiB and a coarse 34.5 MiB granule, pages of 32 KiB: sizes as `granule`
    // draws them (half the cache, then one, two, four, ... steps less, down to a quarter).
    for g in [2 * MIB, 36_175_872, 3 * MIB / 2, 40 * MIB] {
        let page = 32 * 1024;
        let mut sizes = Vec::new();
        for n in granule_counts(15_554, page) {
            let own = n * page;
            sizes.push((own, up(own, g)));
        }
        let found = granule_of(&sizes).expect("a granule");
        assert_eq!(found % g, 0, "{found} is not a multiple of {g}");
        assert!(found <= 2 * g, "{found} for {g}");
    }
    // A granule finer than the rounding bound is resolved, not read as the bound's half:
    // 88 tensors of 4 KiB pages rounded to 512 KiB (steps of exactly 2 MiB gave sizes 2 MiB
    // apart and a 1 MiB divisor, and the cache was cut by it).
    let (g, page) = (MIB / 2, 4096);
    let sizes: Vec<(u64, u64)> = granule_counts(35_200, page)
        .into_iter()
        .map(|n| (n * page, up(n * page, g)))
        .collect();
    assert_eq!(granule_of(&sizes[..3]), Some(g));
    // One rounded size says nothing; a waste of a granule or more contradicts it.
    assert_eq!(
        granule_of(&[(10 * MIB, 12 * MIB), (11 * MIB, 12 * MIB)]),
        None
    );
    assert_eq!(
        granule_of(&[(10 * MIB, 14 * MIB), (12 * MIB, 16 * MIB)]),
        None
    );
    assert_eq!(
        granule_of(&[(10 * MIB, 9 * MIB), (12 * MIB, 16 * MIB)]),
        None
    );
}

/// An allocator that rounds each of `tensors` tensors of `n x page` bytes up to `g`, as
/// [`measure_granule`] sees it: what each cache of `n` blocks took, every request kept in
/// `asked`.
fn rounding(
    tensors: u64,
    page: u64,
    g: u64,
    asked: &mut Vec<u64>,
) -> impl FnMut(u64) -> Result<Attempt> + '_ {
    move |n| {
        asked.push(n);
        Ok(Attempt::Took(tensors * up(n * page, g)))
    }
}

#[test]
fn a_granule_finer_than_the_plans_bound_is_told_apart_and_the_cache_grows_to_it() {
    // A K and a V tensor per layer of 96 layers, 8 KiB a block each, on an allocator that
    // rounds to 7.5 MiB; the plan kept a 15 MiB bound per tensor (all nothing measured
    // before it allowed): 30 MiB tensors, 3,840 blocks, in a room of 40 MiB a tensor.
    let (tensors, page, g, bound) = (192u64, 8192u64, 15 * MIB / 2, 15 * MIB);
    let room = tensors * 40 * MIB;
    let planned = blocks_within((tensors, page), bound, room);
    assert_eq!(planned, 3840);
    // Caches of a quarter to half the planned one have tensors of 7.5 to 15 MiB: those
    // that are rounded alone (10 MiB and up) all read 15 MiB, a granule of 7.5 as of 15.
    for n in granule_counts(planned, page) {
        if crate::plan::is_large_request(n * page) {
            assert_eq!(up(n * page, g), bound, "{n} blocks");
        }
    }
    let mut asked = Vec::new();
    let found = measure_granule(
        planned,
        (tensors, page),
        (room, bound),
        rounding(tensors, page, g, &mut asked),
    )
    .unwrap();
    assert_eq!(found, Granule::Measured(g));
    assert!(asked.len() <= GRANULE_ATTEMPTS);
    // Every cache measured took at most the room, even the one past half the planned cache
    // (its tensors just past 15 MiB: 22.5 MiB on this allocator, at most 30 MiB on any
    // fixed granule that divides 15 MiB), and none was larger than the planned one.
    for n in &asked {
        assert!(*n <= planned);
        assert!(tensors * up(n * page, bound) <= room, "{n} blocks");
    }
    assert!(asked.iter().any(|n| *n > planned / 2));
    // The count grows to what fits in the room by the measured granule: 37.5 MiB tensors.
    let (count, planned_takes, takes) =
        count_by_granule(planned, (tensors, page), g, room, Some(room)).unwrap();
    assert_eq!(count, 4800);
    assert_eq!(takes, tensors * up(count * page, g));
    assert!(takes <= room);
    assert!(tensors * up((count + 1) * page, g) > room);
    assert_eq!(planned_takes, tensors * 30 * MIB);
    // Not for a plan whose count must not grow (combined from every rank's).
    assert_eq!(
        count_by_granule(planned, (tensors, page), g, room, None),
        None
    );
    // On an allocator that does round to the bound, the cache stays as planned.
    let mut asked = Vec::new();
    let found = measure_granule(
        planned,
        (tensors, page),
        (room, bound),
        rounding(tensors, page, bound, &mut asked),
    )
    .unwrap();
    assert_eq!(found, Granule::Measured(bound));
    assert_eq!(
        count_by_granule(planned, (tensors, page), bound, room, Some(room)),
        None
    );
}

#[test]
fn the_cache_past_half_is_measured_only_where_the_granule_read_says_it_fits() {
    let (tensors, page) = (192u64, 8192u64);
    // Half the planned tensors read 15 MiB: the next is just past it.
    let n = probe_count(3840, (tensors, page), 15 * MIB, tensors * 30 * MIB).unwrap();
    assert_eq!(n * page, 15 * MIB + page);
    // Where two 20 MiB granules would not fit in the room, none is allocated.
    assert_eq!(
        probe_count(3840, (tensors, page), 20 * MIB, tensors * 30 * MIB),
        None
    );
    // A finer common divisor: the first multiple of it at or past half, then a page.
    let n = probe_count(3840, (tensors, page), 2 * MIB, tensors * 30 * MIB).unwrap();
    assert_eq!(n * page, 16 * MIB + page);
    // Never past the planned tensors, nor below a quarter of them or the size the
    // allocator rounds alone.
    assert_eq!(
        probe_count(3840, (tensors, page), 30 * MIB, tensors * 90 * MIB),
        None
    );
    assert_eq!(
        probe_count(1200, (tensors, page), 2 * MIB, tensors * 90 * MIB),
        None,
        "tensors of 6 MiB share segments"
    );
    // An allocator that gives a cache the granule says fits no memory: nothing stands.
    let mut calls = 0;
    let found = measure_granule(3840, (tensors, page), (tensors * 30 * MIB, 15 * MIB), |n| {
        calls += 1;
        Ok(if n > 1920 {
            Attempt::OutOfMemory
        } else {
            Attempt::Took(tensors * up(n * page, 15 * MIB))
        })
    })
    .unwrap();
    assert_eq!(found, Granule::Unknown);
    assert!(calls <= GRANULE_ATTEMPTS);
}

#[test]
fn the_certified_count_fits_once_rounded_and_is_the_largest_that_does() {
    let (tensors, page, g) = (82u64, 48 * 1024u64, 36_175_872u64);
    let room = 82 * 700 * MIB;
    let (fit, planned_takes) = certified_blocks(20_000, (tensors, page), g, room);
    assert!(tensors * up(fit * page, g) <= room);
    assert!(tensors * up((fit + 1) * page, g) > room || fit == 20_000);
    assert_eq!(planned_takes, tensors * up(20_000 * page, g));
    // Never more than planned.
    assert_eq!(certified_blocks(10, (tensors, page), g, room).0, 10);
    assert_eq!(layout(28 * 32 * 1024, 32 * 1024), Some((28, 32 * 1024)));
    assert_eq!(layout(1000, 300), None);
    assert_eq!(layout(1000, 0), None);
}

/// What a caching allocator that rounds each new segment up to `g` and serves the next
/// request of the same size from a segment's rest where it fits (PyTorch: `should_split`
/// splits a large block whose rest is over 1 MiB, `get_free_block` takes the best fitting
/// cached block first) takes for `tensors` tensors of `own` bytes.
fn shared_takes(tensors: u64, own: u64, g: u64) -> u64 {
    let segment = up(own, g);
    let per_segment = if segment - own > MIB {
        segment / own
    } else {
        1
    };
    tensors.div_ceil(per_segment) * segment
}

#[test]
fn tensors_that_share_segments_measure_no_granule() {
    // A K and a V tensor per layer of 89 layers (SGLang), 8 KiB a block each, on an allocator
    // whose granule is 24 MiB, which the plan kept per tensor: 3,072 blocks of 24 MiB tensors.
    // Half that cache has 12 MiB tensors, two to a 24 MiB segment: 12 MiB each, as on a 12
    // MiB granule, and 12 MiB and a page reads 24 MiB, as on a 12 MiB granule too.
    let (tensors, page, g) = (178u64, 8192u64, 24 * MIB);
    let (planned, room) = (3072u64, 7_017_973_136u64);
    assert_eq!(shared_takes(tensors, 1536 * page, g), tensors * 12 * MIB);
    assert_eq!(shared_takes(tensors, 1537 * page, g), tensors * g);
    let takes = |n: u64| Ok(Attempt::Took(shared_takes(tensors, n * page, g)));
    // Without the bound, those read as a 12 MiB granule, and the cache grown by it (36 MiB
    // tensors, predicted at 36 MiB each) takes 48 MiB a tensor, past the room.
    let misread = measure_granule(planned, (tensors, page), (room, 0), takes).unwrap();
    assert_eq!(misread, Granule::Measured(12 * MIB));
    let (count, _, predicted) =
        count_by_granule(planned, (tensors, page), 12 * MIB, room, Some(room)).unwrap();
    assert!(predicted <= room);
    assert!(shared_takes(tensors, count * page, g) > room);
    // With it, caches whose tensors are at most half the bound are not read: nothing grows
    // the cache past what the plan kept.
    let found = measure_granule(planned, (tensors, page), (room, g), takes).unwrap();
    let grown = match found {
        Granule::Measured(m) => count_by_granule(planned, (tensors, page), m, room, Some(room)),
        _ => None,
    };
    if let Some((count, _, _)) = grown {
        assert!(shared_takes(tensors, count * page, g) <= room, "{found:?}");
    }
}

#[test]
fn one_rounded_size_cuts_a_cache_whose_tensors_it_would_round_past_the_room() {
    // 4,096 tensors of 28 MiB, an allocator that rounds each to a multiple of 15.5 MiB: the
    // caches of half and less read 15.5 MiB per tensor, and the cache past it (tensors over
    // 15.5 MiB, 31 MiB by that size) cannot fit in 28.15 MiB a tensor. The planned cache,
    // allocated whole, took 10.9 GiB past the room before its attempt could read it.
    let (tensors, page, g) = (4096u64, 64 * 1024u64, 16_252_928u64);
    let planned = 28 * MIB / page;
    let room = tensors * (28 * MIB + 150 * 1024);
    let bound = 2 * MIB;
    let mut largest = 0;
    let found = measure_granule(planned, (tensors, page), (room, bound), |n| {
        largest = largest.max(n);
        Ok(Attempt::Took(tensors * up(n * page, g)))
    })
    .unwrap();
    assert_eq!(found, Granule::Bounded(g));
    assert!(
        tensors * up(largest * page, g) <= room,
        "a measuring cache passed the room"
    );
    // Cut by it, the planned count fits the room once rounded; as planned it would not.
    assert!(tensors * up(planned * page, g) > room);
    let (count, _, takes) =
        count_by_granule(planned, (tensors, page), g, room, None).expect("a cut");
    assert!(count < planned && takes <= room, "{count} {takes} {room}");
    assert_eq!(takes, tensors * up(count * page, g));
}

#[test]
fn one_rounded_size_that_allows_the_plans_granule_leaves_the_count_as_planned() {
    // 64 tensors of 22 MiB on PyTorch's 2 MiB rounding: the cache of half the blocks reads
    // 11 MiB at 12 MiB a tensor (a 12 MiB granule would round the planned ones to 24 MiB), and
    // smaller ones do not round on their own. 2 MiB divides 12 MiB and exceeds the waste: the
    // plan's own rounding stands (cut by 12 MiB, the cache lost 45% of its blocks).
    let (tensors, page) = (64u64, 32 * 1024u64);
    let planned = 22 * MIB / page;
    // Room for one more MiB a tensor: no cache past 12 MiB fits by that size.
    let room = tensors * (23 * MIB);
    let mut calls = 0;
    let found = measure_granule(planned, (tensors, page), (room, 2 * MIB), |n| {
        calls += 1;
        Ok(if n * page == 11 * MIB {
            Attempt::Took(tensors * 12 * MIB)
        } else {
            Attempt::Took(tensors * up(n * page, 2 * MIB))
        })
    })
    .unwrap();
    assert_eq!(calls, 1);
    assert_eq!(found, Granule::Unknown);
}
