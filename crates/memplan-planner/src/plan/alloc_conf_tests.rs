//! The KV footprint under a declared caching-allocator configuration, held to a model of the
//! allocator written here from PyTorch's source (`c10/<device>/<Device>CachingAllocator.cpp`
//! at commit 001074d25084fdb87a799823e395a50f5ec044d3: `round_size`,
//! `roundup_power2_next_division`, `get_allocation_size`, `get_free_block`, `should_split`,
//! `alloc_block`, `try_allocate_expandable_block`; `c10/core/AllocatorConfig.cpp` for the
//! size intervals), not from the planner's helpers.

use super::*;
use crate::budget::Request;
use crate::plan::tests::{limits, spec};
use crate::plan::{Plan, PlanBuilder};
use memplan_core::bytes::{GIB, MIB};
use memplan_core::kv::KvAllocation;
use memplan_core::MemoryInfo;
use proptest::prelude::*;

/// The settings the model runs with.
#[derive(Debug, Clone)]
struct Settings {
    expandable: bool,
    /// `max_split_size` (`usize::MAX` in PyTorch where unset).
    max_split: u64,
    /// Divisions per interval: index 0 below 2 MiB, `k` for `[2^k, 2^(k+1))` MiB, 15 beyond.
    divisions: [u64; 16],
    /// The segment of requests over 1 MiB and under 10 MiB.
    large_segment: u64,
    /// The page an expandable segment of the large pool maps.
    large_page: u64,
    /// How a new segment for a large request is rounded (`kRoundLarge`, or a granule of the
    /// simulator's, which also floors the segment of mid-sized requests).
    granule: u64,
}

impl Settings {
    fn default_with_granule(granule: u64) -> Self {
        Settings {
            expandable: false,
            max_split: u64::MAX,
            divisions: [0; 16],
            large_segment: 20 * MIB,
            large_page: 20 * MIB,
            granule,
        }
    }
}

/// `roundup_power2_next_division`, bit for bit.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let division = floor >> (63 - divisions.leading_zeros());
    if division == 0 {
        return floor << 1;
    }
    let down = size & !(division - 1);
    if down == size {
        size
    } else {
        down + division
    }
}

/// `round_size`, with `roundup_power2_divisions(size)` indexing the intervals.
fn round_size(size: u64, s: &Settings) -> u64 {
    if size < 512 {
        return 512;
    }
    let log = 63 - size.leading_zeros() as i64;
    let d = s.divisions[(log - 20).clamp(0, 15) as usize];
    if d > 1 && size > 512 * d {
        next_division(size, d)
    } else {
        512 * size.div_ceil(512)
    }
}

/// What a fresh allocator reserves for `count` requests of `bytes`, one after another.
fn reserves(bytes: u64, count: u64, s: &Settings) -> u64 {
    let r = round_size(bytes, s);
    let small = r <= MIB;
    if s.expandable {
        // One segment for the pool, its requests one after another, mapped in whole pages.
        let page = if small { 2 * MIB } else { s.large_page };
        let used = r * count;
        return used.div_ceil(page) * page;
    }
    let mut free: Vec<u64> = Vec::new();
    let mut reserved = 0;
    for _ in 0..count {
        // `get_free_block`: the smallest cached block that fits, unless it is oversize.
        let best = (0..free.len())
            .filter(|i| free[*i] >= r)
            .min_by_key(|i| free[*i])
            .filter(|i| {
                let size = free[*i];
                let oversize_for_smaller = r < s.max_split && size >= s.max_split;
                let too_large_for_oversize = r >= s.max_split && size >= r + 20 * MIB;
                !oversize_for_smaller && !too_large_for_oversize
            });
        let block = match best {
            Some(i) => free.swap_remove(i),
            None => {
                // `get_allocation_size`.
                let rounded = r.div_ceil(s.granule) * s.granule;
                let size = if small {
                    2 * MIB
                } else if r < 10 * MIB {
                    s.large_segment.max(rounded)
                } else {
                    rounded
                };
                reserved += size;
                size
            }
        };
        // `should_split`.
        let rest = block - r;
        let split = if small {
            rest >= 512
        } else {
            r < s.max_split && rest > MIB
        };
        if split {
            free.push(rest);
        }
    }
    reserved
}

/// The option string for `s` (every interval's divisions spelled out).
fn option_string(s: &Settings) -> String {
    let mut parts = vec![format!(
        "expandable_segments:{}",
        if s.expandable { "True" } else { "False" }
    )];
    if s.max_split != u64::MAX {
        parts.push(format!("max_split_size_mb:{}", s.max_split / MIB));
    }
    if s.large_segment != 20 * MIB {
        parts.push(format!("large_segment_size_mb:{}", s.large_segment / MIB));
    }
    let list: Vec<String> = (0..16)
        .map(|i| format!("{}:{}", 1u64 << i, s.divisions[i]))
        .collect();
    parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
    parts.join(",")
}

fn sizes() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..2 * MIB, 2 * MIB..12 * MIB, 12 * MIB..300 * MIB]
}

fn settings() -> impl Strategy<Value = Settings> {
    let divisions = prop_oneof![
        proptest::sample::select(vec![0u64, 1, 2, 4, 8, 16]).prop_map(|d| [d; 16]),
        proptest::array::uniform16(proptest::sample::select(vec![0u64, 1, 2, 4, 8, 64])),
    ];
    (
        any::<bool>(),
        proptest::option::of(proptest::sample::select(vec![20u64, 21, 30, 64, 100, 1024])),
        divisions,
        proptest::option::of(proptest::sample::select(vec![11u64, 12, 16, 30, 64, 512])),
        any::<bool>(),
    )
        .prop_map(|(expandable, split, divisions, segment, page_is_segment)| {
            let large_segment = segment.map_or(20 * MIB, |m| m * MIB);
            Settings {
                expandable,
                max_split: split.map_or(u64::MAX, |m| m * MIB),
                divisions,
                large_segment,
                large_page: if page_is_segment {
                    large_segment
                } else {
                    20 * MIB
                },
                granule: 2 * MIB,
            }
        })
}

proptest::proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Under any configuration, the planned footprint of `count` KV tensors is never under
    /// what the allocator reserves for them: with its own granule (`kRoundLarge`), with a
    /// granule `d` that divides one read off its sizes (`Granule::Multiple`), and with one
    /// below a bound (`Granule::AtMost`).
    #[test]
    fn the_footprint_bounds_what_the_allocator_reserves(
        bytes in sizes(),
        count in 1u64..160,
        mut s in settings(),
        (d, k) in (proptest::sample::select(vec![512u64, 64 * 1024, MIB, 2 * MIB, 3 * MIB, 6 * MIB, 15 * MIB]), 1u64..6),
        below in 1u64..(32 * MIB),
    ) {
        let conf = AllocatorConfig::parse(&option_string(&s)).expect("the test's own string");
        let real = reserves(bytes, count, &s);
        let planned = footprint(bytes, count, Granule::Multiple(2 * MIB), &conf);
        prop_assert!(real <= planned, "{} x {} B under `{}`: {} > {}", count, bytes, conf, real, planned);
        // A granule read off the allocator's sizes, `d * k`, of which the real one is `d`.
        s.granule = d;
        let real = reserves(bytes, count, &s);
        let planned = footprint(bytes, count, Granule::Multiple(d * k), &conf);
        prop_assert!(real <= planned, "granule {} of {}: {} x {} B under `{}`: {} > {}", d, d * k, count, bytes, conf, real, planned);
        // A granule below a bound that need not divide it.
        let bound = d + below;
        let planned = footprint(bytes, count, Granule::AtMost(bound), &conf);
        prop_assert!(real <= planned, "granule {} below {}: {} x {} B under `{}`: {} > {}", d, bound, count, bytes, conf, real, planned);
    }

    /// The default configuration, declared, is the model's default allocator.
    #[test]
    fn the_default_configuration_is_the_default_model(bytes in sizes(), count in 1u64..160) {
        let s = Settings::default_with_granule(2 * MIB);
        let d = AllocatorConfig::default();
        prop_assert!(reserves(bytes, count, &s) <= footprint(bytes, count, Granule::Multiple(2 * MIB), &d));
        prop_assert_eq!(
            footprint(bytes, count, Granule::Multiple(2 * MIB), &d),
            footprint(bytes, count, Granule::Multiple(2 * MIB), &AllocatorConfig::parse("expandable_segments:False").unwrap())
        );
    }
}

#[test]
fn expandable_segments_pack_tensors_into_pages() {
    let ex = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let d = AllocatorConfig::default();
    let g = Granule::Multiple(2 * MIB);
    // 64 tensors of 7 MiB: two per 20 MiB segment by default (640 MiB), one after another in
    // 20 MiB pages when expandable (448 MiB in 23 pages, 460 MiB).
    assert_eq!(footprint(7 * MIB, 64, g, &d), 640 * MIB);
    assert_eq!(footprint(7 * MIB, 64, g, &ex), 460 * MIB);
    assert_eq!(
        reserves(
            7 * MIB,
            64,
            &Settings {
                expandable: true,
                ..Settings::default_with_granule(2 * MIB)
            }
        ),
        460 * MIB
    );
    // 28 tensors of 101 MiB: 102 MiB each by default, 2,840 MiB in pages of 20 MiB.
    assert_eq!(footprint(101 * MIB, 28, g, &d), 28 * 102 * MIB);
    assert_eq!(footprint(101 * MIB, 28, g, &ex), 142 * 20 * MIB);
    // Small tensors: 2 MiB pages.
    assert_eq!(footprint(300 * 1024, 10, g, &ex), 4 * MIB);
}

#[test]
fn power_of_two_divisions_round_before_packing() {
    let g = Granule::Multiple(2 * MIB);
    // 178 KV tensors of 2.85 MiB (365 blocks of 8 KiB): seven to a 20 MiB segment by
    // default; with 2 divisions each is 3 MiB, six to a segment; with 4 divisions still 3 MiB
    // (steps of 512 KiB between 2 and 4 MiB).
    let b = 365 * 8 * 1024;
    assert_eq!(
        footprint(b, 178, g, &AllocatorConfig::default()),
        26 * 20 * MIB
    );
    for n in [2, 4] {
        let c = AllocatorConfig::parse(&format!("roundup_power2_divisions:{n}")).unwrap();
        assert_eq!(rounded_request(b, &c), 3 * MIB);
        assert_eq!(footprint(b, 178, g, &c), 30 * 20 * MIB);
    }
    // 1200 bytes in 4 divisions is 1280 (PyTorch's own example), but only past 512 x 4.
    let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
    assert_eq!(rounded_request(1200, &c), 1536);
    assert_eq!(next_division(1200, 4), 1280);
    assert_eq!(rounded_request(2100, &c), 2560);
    assert_eq!(rounded_request(4096, &c), 4096);
}

#[test]
fn max_split_size_stops_sharing_segments() {
    // Mid-sized tensors in 64 MiB segments with blocks of 30 MiB and more unsplit: the
    // remainder of a segment serves no smaller request, each tensor takes a segment.
    let c = AllocatorConfig::parse("large_segment_size_mb:64,max_split_size_mb:30").unwrap();
    let g = Granule::Multiple(2 * MIB);
    assert_eq!(footprint(5 * MIB, 10, g, &c), 10 * 64 * MIB);
    let s = Settings {
        max_split: 30 * MIB,
        large_segment: 64 * MIB,
        ..Settings::default_with_granule(2 * MIB)
    };
    assert_eq!(reserves(5 * MIB, 10, &s), 10 * 64 * MIB);
    // Without the limit they share: 12 to a segment.
    let shared = AllocatorConfig::parse("large_segment_size_mb:64").unwrap();
    assert_eq!(footprint(5 * MIB, 10, g, &shared), 64 * MIB);
}

/// A measured start-up's profile: a device of `total`, weights and activation measured.
fn profile(total: u64, weights: u64) -> crate::session::Profile {
    use memplan_core::{AllocatorMemory, DriverMemory, ProfilingCapability};
    let snap = |free: u64| {
        MemoryInfo::default()
            .with_driver(DriverMemory::new(Some(total), Some(free)))
            .with_allocator(
                AllocatorMemory::new(Some(0), Some(0), Some(0)).with_peak_reserved(Some(0)),
            )
    };
    let mut p = crate::session::Profile::new(ProfilingCapability::exact_discrete(), snap(total));
    p.last = snap(total - weights - GIB);
    p.weights_bytes = Some(weights);
    p.weights_held_bytes = Some(weights);
    p.activation_peak_bytes = Some(GIB);
    p.non_allocator_growth = Some(0);
    p
}

/// The plan as JSON without its notes.
fn figures(p: &Plan) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(&p.to_json()).expect("plan JSON");
    v.as_object_mut().expect("an object").remove("notes");
    v
}

#[test]
fn declaring_the_default_configuration_keeps_every_figure() {
    let rules = [
        SizingRules::newest(1).with_kv_allocation(KvAllocation::PerTensor),
        SizingRules::newest(1),
        SizingRules::newest(1).with_kv_allocation(KvAllocation::SplitKv),
    ];
    for total in [8 * GIB, 24 * GIB, 80 * GIB] {
        let p = profile(total, total / 3);
        for r in rules {
            for granule in [None, Some(2 * MIB), Some(30 * MIB)] {
                for declared in [
                    "",
                    "expandable_segments:False,garbage_collection_threshold:0.6,other_key:1",
                ] {
                    let make = |conf: Option<AllocatorConfig>| {
                        let mut b = PlanBuilder::from_profile(
                            &p,
                            "test",
                            Request::Utilization(0.9),
                            spec(),
                            limits(),
                        )
                        .unwrap()
                        .sizing_rules(r);
                        if let Some(c) = conf {
                            b = b.allocator_config(c, "the test");
                        }
                        if granule.is_some() {
                            b.unmeasured_kv_allocation(granule);
                        }
                        b.build().unwrap()
                    };
                    let today = make(None);
                    let declared_plan = make(Some(AllocatorConfig::parse(declared).unwrap()));
                    assert_eq!(
                        figures(&today),
                        figures(&declared_plan),
                        "{total} {granule:?} `{declared}`"
                    );
                    assert!(declared_plan
                        .notes
                        .iter()
                        .any(|n| n.contains("from the test") && n.contains("default rules")));
                }
            }
        }
        // A dry run keeps no room for rounding, declared or not.
        let dry = |conf: Option<AllocatorConfig>| {
            let b = PlanBuilder::new(total, Request::Utilization(0.9), spec(), limits());
            let b = match conf {
                Some(c) => b.allocator_config(c, "the test"),
                None => b,
            };
            b.build().unwrap()
        };
        let ex = AllocatorConfig::parse("expandable_segments:True").unwrap();
        assert_eq!(figures(&dry(None)), figures(&dry(Some(ex))));
    }
}

#[test]
fn a_declared_configuration_moves_the_plan_where_it_changes_the_footprint() {
    // 28 layers of 16 KiB pages, one tensor per layer, 24 GiB: large tensors, 2 MiB each
    // wasted at most by default, a page (20 MiB) in all when expandable, and up to a quarter
    // with 4 divisions.
    let p = profile(24 * GIB, 8 * GIB);
    let r = SizingRules::newest(1).with_kv_allocation(KvAllocation::PerTensor);
    let plan = |conf: &str| {
        PlanBuilder::from_profile(&p, "test", Request::Utilization(0.9), spec(), limits())
            .unwrap()
            .sizing_rules(r)
            .allocator_config(AllocatorConfig::parse(conf).unwrap(), "the test")
            .build()
            .unwrap()
    };
    let (d, ex, p2) = (
        plan(""),
        plan("expandable_segments:True"),
        plan("roundup_power2_divisions:4"),
    );
    assert!(
        ex.kv.num_blocks >= d.kv.num_blocks,
        "{} < {}",
        ex.kv.num_blocks,
        d.kv.num_blocks
    );
    assert!(p2.kv.num_blocks < d.kv.num_blocks);
    // What each plan's tensors take under its own configuration stays within the budget.
    let page = 16 * 2 * 128 * 2 * 2;
    for (plan, conf) in [
        (&d, ""),
        (&ex, "expandable_segments:True"),
        (&p2, "roundup_power2_divisions:4"),
    ] {
        let c = AllocatorConfig::parse(conf).unwrap();
        let s = Settings {
            expandable: c.expandable_segments,
            divisions: std::array::from_fn(|i| u64::from(c.roundup_power2_divisions[i])),
            ..Settings::default_with_granule(2 * MIB)
        };
        assert!(
            reserves(plan.kv.num_blocks * page, 28, &s) <= plan.kv_budget_bytes,
            "`{conf}`"
        );
        assert!(
            plan.notes.iter().any(|n| n.contains("caching allocator")),
            "`{conf}`"
        );
    }
}
