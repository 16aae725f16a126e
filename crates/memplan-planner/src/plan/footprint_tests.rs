use super::*;
use proptest::strategy::Strategy as _;

/// PyTorch's default configuration.
static D: std::sync::LazyLock<AllocatorConfig> = std::sync::LazyLock::new(AllocatorConfig::default);

#[test]
fn mid_sized_tensors_share_twenty_mib_segments() {
    // 64 tensors of 8 MiB: two per 20 MiB segment.
    assert_eq!(
        tensors_footprint(8 * MIB, 64, Granule::Multiple(2 * MIB)),
        32 * 20 * MIB
    );
    // An odd count leaves the last segment part empty.
    assert_eq!(
        tensors_footprint(8 * MIB, 3, Granule::Multiple(2 * MIB)),
        2 * 20 * MIB
    );
    // Large tensors are rounded on their own.
    assert_eq!(
        tensors_footprint(11 * MIB, 4, Granule::Multiple(2 * MIB)),
        4 * 12 * MIB
    );
    // Small ones share 2 MiB segments.
    assert_eq!(
        tensors_footprint(MIB / 2, 8, Granule::Multiple(2 * MIB)),
        2 * 2 * MIB
    );
    assert_eq!(tensors_footprint(0, 8, Granule::Multiple(2 * MIB)), 0);
    // Non-decreasing in the tensor's bytes.
    let mut last = 0;
    for kib in (1..=40 * 1024).step_by(97) {
        let f = tensors_footprint(kib * 1024, 64, Granule::Multiple(2 * MIB));
        assert!(f >= last, "{kib} KiB");
        last = f;
    }
}

#[test]
fn the_fit_holds_what_the_allocator_takes() {
    // 64 layers of 8 KiB pages in 512 MiB: 8 MiB tensors would take 640 MiB; tensors of
    // 6.67 MiB go three to a segment (22 segments, 440 MiB).
    let page = 8 * 1024;
    let kv = fit_rounded(
        512 * MIB,
        Granule::Multiple(2 * MIB),
        Some(&KvTensors::equal(64, page)),
        0,
        &D,
    );
    let pages = kv / 64 / page;
    assert!(tensors_footprint(pages * page, 64, Granule::Multiple(2 * MIB)) <= 512 * MIB);
    assert!(tensors_footprint((pages + 1) * page, 64, Granule::Multiple(2 * MIB)) > 512 * MIB);
    assert_eq!(pages, 853);
    // Large tensors: whole granules per tensor, as before.
    let kv = fit_rounded(
        64 * 101 * MIB,
        Granule::Multiple(2 * MIB),
        Some(&KvTensors::equal(64, page)),
        0,
        &D,
    );
    assert_eq!(kv, 64 * 100 * MIB);
}

/// What a caching allocator with PyTorch's size classes reserves for `count` requests of
/// `b` bytes (over 1 MiB), one after another: a new segment for a request below 10 MiB is
/// 20 MiB or the request rounded up to `granule` where that is more, for a larger one the
/// request rounded up to `granule`; a request is served from the best fitting free block
/// first, and a block whose remainder is over 1 MiB is split.
fn allocator_reserves(b: u64, count: u64, granule: u64) -> u64 {
    allocator_reserves_each((0..count).map(|_| b), granule)
}

/// [`allocator_reserves`] for requests of the sizes `each`, in order.
fn allocator_reserves_each(each: impl Iterator<Item = u64>, granule: u64) -> u64 {
    let mut free: Vec<u64> = Vec::new();
    let mut reserved = 0;
    for b in each {
        let best = (0..free.len())
            .filter(|i| free[*i] >= b)
            .min_by_key(|i| free[*i]);
        let block = match best {
            Some(i) => free.swap_remove(i),
            None => {
                let rounded = b.div_ceil(granule) * granule;
                let segment = if b < 10 * MIB {
                    rounded.max(20 * MIB)
                } else {
                    rounded
                };
                reserved += segment;
                segment
            }
        };
        if block - b > MIB {
            free.push(block - b);
        }
    }
    reserved
}

#[test]
fn large_tensors_share_a_segment_coarser_than_them() {
    // 182 KV tensors of 14.76 MiB (K and V apart, 91 layers) where the allocator's sizes
    // read a 30 MiB granule: two share each 30 MiB segment, but a real granule of 10 MiB
    // (which the readings cannot tell from 30) gives each 20 MiB on its own.
    let b = 1889 * 8 * 1024;
    assert_eq!(allocator_reserves(b, 182, 30 * MIB), 91 * 30 * MIB);
    assert_eq!(allocator_reserves(b, 182, 10 * MIB), 182 * 20 * MIB);
    let f = tensors_footprint(b, 182, Granule::Multiple(30 * MIB));
    assert_eq!(f, 182 * 20 * MIB);
    assert!(f < 182 * 30 * MIB, "no longer a whole granule per tensor");
    // A granule finer than the request: one per segment, as before.
    assert_eq!(
        tensors_footprint(b, 182, Granule::Multiple(2 * MIB)),
        182 * 16 * MIB
    );
    // Nothing read the granule, which is at most 30 MiB: every segment but the last has less
    // than one tensor free, and the last less than 30 MiB.
    assert_eq!(
        tensors_footprint(b, 182, Granule::AtMost(30 * MIB)),
        363 * b + 30 * MIB
    );
}

#[test]
fn a_granule_bound_far_coarser_than_the_tensors_is_not_kept_whole_per_tensor() {
    // Two of the engine's own sizes (weights of whole 20 MiB segments beside an activation
    // peak, sharing 120 MiB) bound the granule at 120 MiB, and 52 KV tensors of 17 MiB were
    // each kept rounded up by a whole bound: 6.9 GiB, and the start-up was refused where
    // 3.81 GiB was left. Any granule up to it shares its segments between them.
    let b = 17 * MIB;
    let g = 120 * MIB;
    let f = tensors_footprint(b, 52, Granule::AtMost(g));
    assert_eq!(f, 103 * b + g);
    assert!(f < 52 * (b + g));
    for real in (1..=240).map(|k| k * 512 * 1024) {
        assert!(allocator_reserves(b, 52, real) <= f, "{real}");
    }
    // Tensors of unequal sizes within the bound take no more.
    let sizes = [b, 11 * MIB, b - MIB, 14 * MIB, 2 * MIB, 10 * MIB];
    for real in (1..=240).map(|k| k * 512 * 1024) {
        let each = sizes.iter().copied().cycle().take(52);
        assert!(allocator_reserves_each(each, real) <= f, "{real}");
    }
    // A declared `max_split_size_mb` the free blocks may reach stops the sharing: a whole
    // bound per tensor again. One past every free block keeps it.
    let mut split = AllocatorConfig::default();
    split.max_split_size = Some(64 * MIB);
    assert_eq!(footprint(b, 52, Granule::AtMost(g), &split), 52 * (b + g));
    split.max_split_size = Some(128 * MIB);
    assert_eq!(footprint(b, 52, Granule::AtMost(g), &split), f);
}

#[test]
fn mid_sized_tensors_keep_pytorchs_segments_beside_a_coarse_granule() {
    // 64 tensors of 7 MiB, a 30 MiB granule read off the allocator's sizes: PyTorch's 20
    // MiB segments (two each) take 640 MiB, more than four per 30 MiB segment (480 MiB).
    let f = tensors_footprint(7 * MIB, 64, Granule::Multiple(30 * MIB));
    assert!(f >= 32 * 20 * MIB, "{f}");
    for granule in divisors(30 * MIB).expect("small") {
        assert!(allocator_reserves(7 * MIB, 64, granule) <= f, "{granule}");
    }
}

#[test]
fn mid_sized_tensors_are_not_rounded_to_the_large_granule() {
    // 178 KV tensors (K and V apart, 89 layers) of 8 KiB per block in 528.3 MiB, PyTorch's
    // 2 MiB granule: tensors of 2.85 MiB (365 blocks) go seven to a 20 MiB segment, 26 of
    // them (520 MiB); one block more and six go to one, 30 segments. Rounding each to the
    // granule (4 MiB apiece past 2 MiB) held the cache at 256 blocks, 70% of it.
    let (page, room) = (8 * 1024, 554_001_767);
    let kv = fit_rounded(
        room,
        Granule::Multiple(2 * MIB),
        Some(&KvTensors::equal(178, page)),
        0,
        &D,
    );
    assert_eq!(kv / 178 / page, 365);
    assert_eq!(allocator_reserves(365 * page, 178, 2 * MIB), 26 * 20 * MIB);
    assert!(allocator_reserves(366 * page, 178, 2 * MIB) > room);
}

#[test]
fn divisors_are_every_divisor() {
    assert_eq!(divisors(0), None);
    let mut d = divisors(30 * MIB).expect("factors");
    d.sort_unstable();
    let by_trial: Vec<u64> = (1..=30 * MIB)
        .filter(|k| (30 * MIB).is_multiple_of(*k))
        .collect();
    assert_eq!(d, by_trial);
    assert_eq!(divisors(1), Some(vec![1]));
    // A large prime factors within the limit; a product of two primes past it does not.
    let p = 1_000_003u64;
    assert_eq!(divisors(p).map(|d| d.len()), Some(2));
    let q = 4_294_967_291u64; // the largest prime below 2^32
    assert_eq!(divisors(q * 4_294_967_279), None);
    // Where it does not factor, every tensor is rounded on its own.
    let g = q * 4_294_967_279;
    assert_eq!(
        packed_footprint(16 * MIB, 10, g, &D),
        Granule::Multiple(g).large(16 * MIB).saturating_mul(10)
    );
}

proptest::proptest! {
    #[test]
    fn packed_footprint_bounds_every_granule_the_readings_allow(
        blocks in 1_000u64..20_000,
        page_kib in 1u64..16,
        count in 1u64..300,
        (k, base) in (1u64..40, proptest::sample::select(vec![512u64, 64 * 1024, 512 * 1024, MIB, 2 * MIB])),
    ) {
        let b = blocks * page_kib * 1024;
        proptest::prop_assume!(b > SMALL_REQUEST);
        let g = k * base;
        let f = tensors_footprint(b, count, Granule::Multiple(g));
        for granule in divisors(g).expect("small") {
            proptest::prop_assert!(
                allocator_reserves(b, count, granule) <= f,
                "granule {} of {}: {} > {}", granule, g, allocator_reserves(b, count, granule), f
            );
        }
        if b >= MID_REQUEST_BELOW {
            proptest::prop_assert!(f <= Granule::Multiple(g).large(b) * count);
        }
    }

    #[test]
    fn a_bound_on_the_granule_bounds_every_granule_below_it(
        blocks in 1_000u64..20_000,
        page_kib in 1u64..16,
        count in 1u64..300,
        (bound_kib, real_kib) in (2u64..(64 * 1024)).prop_flat_map(|b| (proptest::strategy::Just(b), 1..b)),
    ) {
        let b = (blocks * page_kib * 1024).max(SMALL_REQUEST + 1);
        let f = tensors_footprint(b, count, Granule::AtMost(bound_kib * 1024));
        let real = allocator_reserves(b, count, real_kib * 1024);
        proptest::prop_assert!(real <= f, "granule {} KiB of at most {} KiB: {} > {}", real_kib, bound_kib, real, f);
    }

    /// Mid-sized tensors (over 1 MiB, under 10 MiB), where the segments are shared, with
    /// both kinds of granule.
    #[test]
    fn mid_sized_tensors_take_at_most_their_footprint(
        half_kib in 2049u64..20480,
        count in 1u64..400,
        (bound_kib, real_kib) in (2u64..(64 * 1024)).prop_flat_map(|b| (proptest::strategy::Just(b), 1..b)),
        (k, base) in (1u64..40, proptest::sample::select(vec![512u64, 64 * 1024, 512 * 1024, MIB, 2 * MIB])),
    ) {
        let b = half_kib * 512;
        let bounded = tensors_footprint(b, count, Granule::AtMost(bound_kib * 1024));
        let real = allocator_reserves(b, count, real_kib * 1024);
        proptest::prop_assert!(real <= bounded, "granule {} KiB of at most {} KiB: {} > {}", real_kib, bound_kib, real, bounded);
        let g = k * base;
        let read = tensors_footprint(b, count, Granule::Multiple(g));
        for granule in divisors(g).expect("small") {
            proptest::prop_assert!(allocator_reserves(b, count, granule) <= read, "granule {} of {}", granule, g);
        }
    }
}

#[test]
fn a_default_granule_bounds_what_any_smaller_granule_takes() {
    // One backing buffer of 3.46 GiB (vLLM 0.29+), nothing measuring its allocation and
    // nothing reading the granule off the allocator's sizes: 20 MiB kept. An allocator
    // that rounds large requests to 19.5 MiB takes 182 of them (9.19 MiB past the bytes),
    // more than 177 granules of 20 MiB: rounding up to the default bounds nothing. At most
    // 20 MiB more does, for every granule up to it.
    let b = 3_711_762_432u64;
    let real = |g: u64| b.div_ceil(g) * g;
    assert!(real(19 * MIB + MIB / 2) > tensors_footprint(b, 1, Granule::Multiple(20 * MIB)));
    for g in (1..=40).map(|k| k * 512 * 1024) {
        assert!(
            real(g) <= tensors_footprint(b, 1, Granule::AtMost(20 * MIB)),
            "{g}"
        );
    }
    // A granule read off the allocator's sizes is a multiple of the real one: rounding up
    // to it bounds it, and costs no more than the bytes rounded to it.
    assert_eq!(
        tensors_footprint(b, 1, Granule::Multiple(2 * MIB)),
        real(2 * MIB)
    );
    assert!(real(MIB) <= tensors_footprint(b, 1, Granule::Multiple(2 * MIB)));
    // Fitted with the bound, the cache leaves room for any granule up to it.
    let room = 3_715_516_288u64;
    let kv = fit_rounded(
        room,
        Granule::AtMost(20 * MIB),
        Some(&KvTensors::equal(1, 458_752)),
        0,
        &D,
    );
    assert!(kv.div_ceil(19 * MIB + MIB / 2) * (19 * MIB + MIB / 2) <= room);
}

/// Gemma 3 1B's cache as SGLang lays it out (`SWAKVPool`: a pool for its 22 sliding-window
/// layers and one for its 4 full-attention layers, one KV head of 256 a layer), in fp16
/// blocks of 16 tokens.
fn gemma3_1b() -> KvSpec {
    use memplan_core::kv::{KvDtype, LayerGroup};
    KvSpec::new(
        vec![
            LayerGroup::new(AttentionKind::SlidingWindow { window: 512 }, 22, 1, 256),
            LayerGroup::new(AttentionKind::Full, 4, 1, 256),
        ],
        KvDtype::F16,
        16,
    )
}

#[test]
fn sliding_window_pools_are_tensors_of_one_size_per_layer() {
    use memplan_core::kv::KvLimits;
    let spec = gemma3_1b();
    let limits = KvLimits::new(2048, 2048);
    let split = SizingRules::default().with_kv_allocation(KvAllocation::SplitKv);
    let paired = SizingRules::default().with_kv_allocation(KvAllocation::PairedKv);
    let s = spec.size_with(0, &limits, &split).unwrap();
    // vLLM's grouping: groups of 4 layers, 6 of the sliding layers (the last padded), one of
    // the full ones; a layer's page is 16 tokens x 256 x (K and V) x 2 B = 16 KiB.
    assert_eq!((s.page_bytes, s.group_size, s.num_groups), (16_384, 4, 7));
    // No layout of whole pages (several groups): the bound per allocation, before.
    assert_eq!(kv_layout(&spec, &s, &split), None);
    // A K and a V of every layer (SGLang to 0.5.22), one tensor of both (0.5.23), each
    // holding at most one page more than its share of the blocks.
    let apart = kv_fit_layout(&spec, &s, &split).unwrap();
    assert_eq!(
        apart,
        KvTensors {
            count: 52,
            block_bytes: 4 * 16_384,
            beyond: 8_192,
            pools: None,
            pages: None,
        }
    );
    let one = kv_fit_layout(&spec, &s, &paired).unwrap();
    assert_eq!((one.count, one.beyond), (26, 16_384));
    // Both pools of the plan's tokens (`size`), each tensor `size + page_size` rows
    // (`MHATokenToKVPool._create_buffers`), are within what the layout takes them to hold.
    for blocks in [1u64, 2, 7, 8, 100, 12_345, 188_025] {
        let sized = spec
            .size_with(blocks * s.block_bytes, &limits, &split)
            .unwrap();
        let rows = sized.tokens + 16;
        let k_bytes = rows * 256 * 2;
        assert!(k_bytes <= apart.bytes_each(blocks), "{blocks} blocks");
        assert!(2 * k_bytes <= one.bytes_each(blocks), "{blocks} blocks");
        // Together no more than the blocks' bytes and a page per tensor.
        assert!(apart.bytes_each(blocks) * 52 <= blocks * s.block_bytes + 52 * (8_192 + 1));
    }
}

#[test]
fn a_small_sliding_window_cache_shares_segments_instead_of_a_granule_per_tensor() {
    use memplan_core::kv::KvLimits;
    let spec = gemma3_1b();
    let split = SizingRules::default().with_kv_allocation(KvAllocation::SplitKv);
    let s = spec
        .size_with(0, &KvLimits::new(2048, 2048), &split)
        .unwrap();
    let layout = kv_fit_layout(&spec, &s, &split);
    // 511.45 MiB left on an allocator whose granule reads 31 MiB: a whole granule for each
    // of 52 tensors (1.57 GiB) left the cache nothing.
    let room = 536_294_604u64;
    let g = 31 * MIB;
    assert_eq!(fit_rounded(room, Granule::AtMost(g), None, 52 * g, &D), 0);
    // Its tensors of under 10 MiB share mid-sized segments, whatever granule up to 31 MiB
    // makes them: the cache has most of the room.
    for granule in [Granule::AtMost(g), Granule::Multiple(g)] {
        let kv = fit_rounded(room, granule, layout.as_ref(), 52 * g, &D);
        let blocks = kv / s.block_bytes;
        let t = layout.clone().unwrap();
        assert!(t.footprint(blocks, granule, &D) <= room);
        assert!(t.footprint(blocks + 1, granule, &D) > room);
        assert!(kv > room / 2, "{granule:?}: {kv}");
        // Every segment from 20 to 31 MiB holds them.
        for segment in (20..=31).map(|m| m * MIB) {
            let each = t.bytes_each(blocks).div_ceil(MIN_BLOCK) * MIN_BLOCK;
            assert!(
                52u64.div_ceil(segment / each) * segment <= room,
                "{segment}"
            );
        }
    }
    // Large tensors keep a whole granule each where the granule bounds the rounding: the
    // sizes are bounds.
    let t = layout.unwrap();
    let blocks = 40 * 52 * MIB / s.block_bytes;
    assert_eq!(
        t.footprint(blocks, Granule::AtMost(2 * MIB), &D),
        52 * (t.bytes_each(blocks).div_ceil(MIN_BLOCK) * MIN_BLOCK + 2 * MIB)
    );
}

/// Tensors whose sizes are bounds (SGLang's K and V per layer of a hybrid cache, each at most
/// an even share of the blocks and a page, `swa_pools`) where the allocator rounds to a
/// multiple of a granule (one measured, or read off its own sizes): a request and its
/// rounding only grow with the request, so each tensor takes at most its bound rounded to the
/// granule, not the bound and a whole granule on top. A real shape (34 layers of a hybrid,
/// K and V paired, on an allocator whose sizes read as power-of-two divisions of 2 and a
/// granule dividing 8 MiB): tensors of 56.6 MiB rounded to 64 MiB each, where 72 MiB each
/// were kept and the start-up refused one request of 131,072 tokens with 770 MiB kept for
/// rounding.
#[test]
fn bounded_tensors_are_rounded_to_a_granule_that_divides_not_a_granule_past_it() {
    use memplan_core::kv::KvLimits;
    let spec = gemma3_1b();
    let split = SizingRules::default().with_kv_allocation(KvAllocation::SplitKv);
    let s = spec
        .size_with(0, &KvLimits::new(2048, 2048), &split)
        .unwrap();
    let t = kv_fit_layout(&spec, &s, &split).unwrap();
    assert!(t.beyond > 0);
    let mut two = D.clone();
    two.roundup_power2_divisions = [2; 16];
    for (a, blocks) in [(&*D, 40 * 52 * MIB / s.block_bytes), (&two, 45_000)] {
        let each = t.bytes_each(blocks);
        let rounded = super::rounded_request(each, a);
        assert!(rounded >= MID_REQUEST_BELOW, "{rounded}");
        let g = 8 * MIB;
        let multiple = t.footprint(blocks, Granule::Multiple(g), a);
        // Each bound rounded up to 8 MiB, the most any granule dividing it gives.
        assert_eq!(multiple, 52 * rounded.div_ceil(g) * g);
        assert!(multiple < t.footprint(blocks, Granule::AtMost(g), a));
        // Every tensor within the bound takes no more, by the allocator's own rounding.
        for r in [each, each - each / 7, MID_REQUEST_BELOW] {
            for d in [512, MIB, 2 * MIB, 4 * MIB, g] {
                let own = super::rounded_request(r, a).div_ceil(d) * d;
                assert!(52 * own <= multiple, "{r} {d}");
            }
        }
    }
    // The 56.6 MiB tensors of the real shape: 64 MiB each with divisions of 2.
    let blocks = (56 * MIB + MIB * 6 / 10) * 52 / t.block_bytes;
    let each = t.bytes_each(blocks);
    assert!(each > 48 * MIB && each < 64 * MIB, "{each}");
    assert_eq!(
        t.footprint(blocks, Granule::Multiple(8 * MIB), &two),
        52 * 64 * MIB
    );
    // A bound just past `kMinLargeAlloc`: a tensor within it may be a mid-sized request in a
    // 20 MiB segment of its own, so the bound rounded alone does not hold it; the whole
    // granule kept on top of the bound does, and stands.
    let blocks = 11 * MIB * 52 / t.block_bytes;
    assert_eq!(
        t.footprint(blocks, Granule::Multiple(8 * MIB), &D),
        t.footprint(blocks, Granule::AtMost(8 * MIB), &D)
    );
}

#[test]
fn pools_sglang_builds_otherwise_keep_no_layout() {
    use memplan_core::kv::{KvDtype, KvLimits, LayerGroup};
    let limits = KvLimits::new(2048, 2048);
    let split = SizingRules::default().with_kv_allocation(KvAllocation::SplitKv);
    let paired = SizingRules::default().with_kv_allocation(KvAllocation::PairedKv);
    let none = |spec: &KvSpec, rules: &SizingRules| {
        let s = spec.size_with(0, &limits, rules).unwrap();
        kv_fit_layout(spec, &s, rules)
    };
    // Pages of two sizes (sliding layers of 8 heads beside full ones of 4): tensors differ.
    let two_pages = KvSpec::new(
        vec![
            LayerGroup::new(AttentionKind::SlidingWindow { window: 512 }, 24, 8, 128),
            LayerGroup::new(AttentionKind::Full, 4, 4, 128),
        ],
        KvDtype::Bf16,
        16,
    );
    assert_eq!(none(&two_pages, &split), None);
    assert_eq!(none(&two_pages, &paired), None);
    // K and V of two sizes apart.
    let uneven = KvSpec::new(
        vec![
            LayerGroup::new(AttentionKind::SlidingWindow { window: 512 }, 24, 8, 192)
                .with_head_dim_v(128),
            LayerGroup::new(AttentionKind::Full, 4, 8, 192).with_head_dim_v(128),
        ],
        KvDtype::Bf16,
        16,
    );
    assert_eq!(none(&uneven, &split), None);
    // vLLM's tensors shared by a layer of every group keep their layout of whole pages.
    let vllm = SizingRules::default();
    let s = gemma3_1b().size_with(0, &limits, &vllm).unwrap();
    assert_eq!(
        kv_fit_layout(&gemma3_1b(), &s, &vllm),
        Some(KvTensors::equal(4, 16_384))
    );
}

/// The same layers kept in SGLang's two pools (`SWAKVPool`, [`SglangPools`]), sized as SGLang
/// splits the tokens it is given, worked by hand from its formulas: a token takes 2 x 256 x
/// 2 B = 1 KiB of a layer, 512 B of each of its K and V; a cache of 1,001 pages of 16 tokens
/// is given 16,000 tokens.
#[test]
fn sglang_pools_hold_the_rows_sglang_gives_them() {
    use memplan_core::kv::{KvLimits, SwaPools};
    let spec = gemma3_1b();
    let limits = KvLimits::new(2048, 2048);
    let rules = |pools| {
        SizingRules::default()
            .with_kv_allocation(KvAllocation::SplitKv)
            .with_swa_pools(pools)
    };
    // From 0.5.14 (`HybridSWAPoolConfigurator._solve_pool_sizes`): the full pool holds the
    // 16,000, the sliding one int(16,000 x 0.8) = 12,800; each a page more.
    let new = rules(SwaPools::SglangFullPool);
    let s = spec.size_with(0, &limits, &new).unwrap();
    // A block: a page of the 4 full layers (64 KiB) and ceil(0.8 x) a page of the 22 sliding
    // ones (ceil(0.8 x 360,448) = 288,359 B).
    assert_eq!((s.block_bytes, s.num_groups), (353_895, 1));
    assert_eq!(kv_layout(&spec, &s, &new), None);
    let t = kv_fit_layout(&spec, &s, &new).unwrap();
    let p = t.pools.unwrap();
    assert_eq!((t.count, p.rows(1_001)), (52, (16_000, 12_800)));
    let g = Granule::Multiple(2 * MIB);
    assert_eq!(
        t.footprint(1_001, g, &D),
        tensors_footprint(16_016 * 512, 8, g) + tensors_footprint(12_816 * 512, 44, g)
    );
    // Up to 0.5.13 (`set_num_tokens_hybrid_swa`): the 16,000 are every layer's; the full pool
    // holds int(16,000 x (4 + 22) KiB / ((4 + 0.8 x 22) KiB)) = 19,259, floored to 19,248,
    // the sliding one int(19,248 x 0.8) = 15,398, floored to 15,392.
    let old = rules(SwaPools::SglangEveryLayer);
    let s = spec.size_with(0, &limits, &old).unwrap();
    assert_eq!((s.block_bytes, s.num_groups), (26 * 16_384, 1));
    let t = kv_fit_layout(&spec, &s, &old).unwrap();
    assert_eq!(t.pools.unwrap().rows(1_001), (19_248, 15_392));
    assert_eq!(
        t.footprint(1_001, g, &D),
        tensors_footprint(19_264 * 512, 8, g) + tensors_footprint(15_408 * 512, 44, g)
    );
    // Whatever the count the plan sizes, the pools' bytes are within its blocks' bytes.
    for (rules, t) in [
        (
            new,
            kv_fit_layout(&spec, &spec.size_with(0, &limits, &new).unwrap(), &new),
        ),
        (old, Some(t)),
    ] {
        let t = t.unwrap();
        let p = t.pools.unwrap();
        for budget in [1u64, 2, 7, 100, 1_001, 12_345, 188_025].map(|n| n * t.block_bytes) {
            let n = spec.size_with(budget, &limits, &rules).unwrap().num_blocks;
            if n == 0 {
                // No cache (one block would give SGLang no token): nothing allocated.
                continue;
            }
            let (full, swa) = p.rows(n);
            let bytes = (full + 16) * 1_024 * 4 + (swa + 16) * 1_024 * 22;
            assert!(bytes <= n * t.block_bytes, "{n} blocks: {bytes}");
        }
    }
}

/// Full-attention layers of many shapes (variable grouped-query attention: 36 layers of 1 to 8
/// KV heads of 64 or 128) form one KV-cache group whose tensors differ in size, one per layer
/// of its own page: each tensor's size is known at any block count, so the fit rounds each as
/// the allocator does instead of keeping `1/(d+1)` of the cache for sizes it does not know.
/// Found by an outside battery (36 one-layer groups of different shapes on an allocator with
/// `roundup_power2_divisions:2`: a third of the room kept, the cache held to two thirds of it,
/// 60.7% of the oracle).
#[test]
fn layers_of_different_pages_are_each_rounded_as_the_allocator_rounds_them() {
    use memplan_core::kv::{KvDtype, KvLimits, LayerGroup};
    let groups: Vec<LayerGroup> = (0..36u32)
        .map(|i| LayerGroup::new(AttentionKind::Full, 1, i % 8 + 1, 64 << (i % 2)))
        .collect();
    let spec = KvSpec::new(groups, KvDtype::Bf16, 16);
    let rules = SizingRules::default();
    let s = spec
        .size_with(0, &KvLimits::new(40_960, 8_192), &rules)
        .unwrap();
    // A page of a layer: 16 tokens x heads x dim x (K and V) x 2 B.
    let pages: Vec<u64> = (0..36u64)
        .map(|i| 16 * (i % 8 + 1) * (64 << (i % 2)) * 4)
        .collect();
    assert_eq!(s.block_bytes, pages.iter().sum::<u64>());
    let t = kv_fit_layout(&spec, &s, &rules).expect("each layer's tensor is known");
    assert_eq!((t.count, t.block_bytes), (36, s.block_bytes));
    let a = AllocatorConfig::parse("roundup_power2_divisions:2").unwrap();
    let g = Granule::Multiple(2 * MIB);
    let room = 18 * 1024 * MIB;
    let kv = fit_rounded(room, g, Some(&t), 36 * 2 * MIB, &a);
    // PyTorch's `round_size` with 2 divisions (a request in `[2^k, 2^(k+1))` up to a multiple of
    // `2^(k-1)`), then `kRoundLarge` (2 MiB) for a large request: worked here on its own.
    let rounded = |bytes: u64| {
        let floor = 1u64 << (63 - bytes.leading_zeros());
        let up = if bytes == floor {
            bytes
        } else {
            bytes.div_ceil(floor / 2) * (floor / 2)
        };
        up.div_ceil(2 * MIB) * 2 * MIB
    };
    let taken = |blocks: u64| pages.iter().map(|p| rounded(p * blocks)).sum::<u64>();
    let blocks = kv / s.block_bytes;
    assert_eq!(kv, blocks * s.block_bytes);
    assert!(taken(blocks) <= room, "{} past {room}", taken(blocks));
    assert!(
        taken(blocks + 1) > room,
        "{blocks} blocks leave one more room"
    );
    // Keeping a third of the room for sizes it does not know was the unknown layout's rule;
    // the tensors' own rounding keeps half that here (15 of the 18 GiB are the cache's).
    assert!(room - kv <= room / 6, "kept {} of {room}", room - kv);
    // The unknown layout still keeps its share (a cache whose tensors are not known).
    assert!(room - fit_rounded(room, g, None, 36 * 2 * MIB, &a) >= room / 3);
}

/// Tensors of different sizes that share the allocator's segments are bounded as each making
/// its own (best-fit packing of mixed sizes can take more segments than each size packed
/// alone), and large ones as each rounded alone; an expandable segment packs their sum.
#[test]
fn tensors_of_different_pages_take_at_most_their_own_segments() {
    let pages = [(4 * 1024, 2), (8 * 1024, 1)];
    let g = Granule::Multiple(2 * MIB);
    // 1,536 blocks: tensors of 6 and 12 MiB, a mid-sized one in its own 20 MiB segment each
    // and a large one rounded alone.
    assert_eq!(
        pages_footprint(&pages, 1_536, g, &D),
        2 * 20 * MIB + 12 * MIB
    );
    // 1,600 blocks: 6.25 and 12.5 MiB.
    assert_eq!(
        pages_footprint(&pages, 1_600, g, &D),
        2 * 20 * MIB + 14 * MIB
    );
    let ex = AllocatorConfig::parse("expandable_segments:True").unwrap();
    // 24.5 MiB in the large pool, mapped in 20 MiB pages.
    assert_eq!(pages_footprint(&pages, 1_568, g, &ex), 40 * MIB);
    assert_eq!(pages_footprint(&pages, 0, g, &D), 0);
}
