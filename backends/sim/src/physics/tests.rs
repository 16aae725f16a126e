//! Draws, regimes and the per-size helpers of the physics.

use super::*;

fn rocm() -> Platform {
    Platform {
        hidden_quirk: 4 * MIB,
        deferred_release: true,
        ..Platform::new(400 * MIB, &Quirks::NONE, 512 * MIB)
    }
}

#[test]
fn draws_stay_in_their_ranges_and_differ_between_seeds() {
    let mut execs = std::collections::BTreeSet::new();
    let mut adversarial = 0;
    for seed in 0..2000 {
        let p = Physics::draw_for(seed, &rocm(), Pin::Draw, Regime::BySeed);
        adversarial += usize::from(p.adversarial);
        let r = |q: &Quantity| q.range(p.adversarial);
        let inside = |q: &Quantity, v: u64| (r(q).0..=r(q).1).contains(&v);
        assert!(
            inside(&EXEC_PER_KERNEL_NODE, p.exec_bytes_per_kernel_node),
            "{p:?}"
        );
        assert!(
            inside(&HIDDEN_PER_CAPTURE, p.hidden_bytes_per_capture),
            "{p:?}"
        );
        assert!(inside(&LAZY_FIRST_CAPTURE, p.lazy_first_capture_bytes));
        assert!(inside(
            &RELEASE_AFTER_SYNCS,
            u64::from(p.release_after_syncs)
        ));
        assert!(p.context_bytes <= 400 * MIB / 1000 * 2100, "{p:?}");
        for n in 0..4 {
            assert!(p.noise(n).unsigned_abs() <= p.read_noise_bytes);
        }
        if !p.adversarial {
            assert!(p.read_noise_bytes <= READ_NOISE_MAX);
            assert_eq!(p.allocator.round_large, 2 * MIB);
            assert_eq!(p.release_after_syncs, 1, "the platform defers");
        }
        execs.insert(p.exec_bytes_per_kernel_node);
    }
    assert!(execs.len() > 50, "seeds spread the draw: {}", execs.len());
    assert!(
        (400..600).contains(&adversarial),
        "a quarter of the seeds: {adversarial}"
    );
    let q = Quirks::NONE;
    assert_eq!(
        Physics::draw(7, 400 * MIB, &q, 0),
        Physics::draw(7, 400 * MIB, &q, 0),
        "deterministic"
    );
    let hi = Physics::draw_for(7, &rocm(), Pin::High, Regime::World);
    assert_eq!(hi.exec_bytes_per_kernel_node, EXEC_PER_KERNEL_NODE.world.1);
    let hi = Physics::draw_for(7, &rocm(), Pin::High, Regime::Adversarial);
    assert_eq!(
        hi.exec_bytes_per_kernel_node,
        EXEC_PER_KERNEL_NODE.adversarial.1
    );
    assert_eq!(hi.allocator.round_large, ROUND_LARGE.adversarial.1);
}

#[test]
fn world_keeps_platforms_apart_and_adversarial_does_not() {
    let cuda = Platform::new(400 * MIB, &Quirks::NONE, 0);
    for seed in 0..200 {
        let w = Physics::draw_for(seed, &cuda, Pin::Draw, Regime::World);
        assert_eq!(w.hidden_bytes_per_capture, 0);
        assert_eq!(w.release_after_syncs, 0);
        assert_eq!(w.read_noise_bytes, 0, "an exact reading has no noise");
    }
    let hidden: u64 = (0..200)
        .map(|s| {
            Physics::draw_for(s, &cuda, Pin::Draw, Regime::Adversarial).hidden_bytes_per_capture
        })
        .sum();
    assert!(
        hidden > 0,
        "adversarial devices keep memory whatever they declare"
    );
    // A declaration smaller than the platform's tolerance gets noise above it.
    let lying = Platform {
        declaration_wrong: true,
        ..Platform::new(400 * MIB, &Quirks::NONE, 16 * MIB)
    };
    let p = Physics::draw_for(3, &lying, Pin::Draw, Regime::Adversarial);
    assert!(p.read_noise_bytes >= 4 * MIB, "{p:?}");
}

#[test]
fn nodes_and_intermediates_vary_with_the_size() {
    let p = Physics::draw_for(5, &rocm(), Pin::High, Regime::World);
    assert_eq!(
        p.kernel_nodes(100, 1, 256),
        100,
        "the smallest size has the base"
    );
    assert_eq!(
        p.kernel_nodes(100, 256, 256),
        116,
        "the largest the whole spread"
    );
    assert!(p.kernel_nodes(100, 16, 256) <= p.kernel_nodes(100, 32, 256));
    let a = Physics::draw_for(5, &rocm(), Pin::High, Regime::Adversarial);
    let nodes: std::collections::BTreeSet<u32> =
        (1..=64).map(|s| a.kernel_nodes(2000, s, 64)).collect();
    assert!(nodes.len() > 10 && nodes.iter().all(|n| (2000..=4000).contains(n)));
    let lin = 1 << 20;
    let v: Vec<u64> = (1..=32)
        .map(|s| a.intermediate(lin, s) / u64::from(s))
        .collect();
    assert!(v.iter().any(|x| *x < lin * 9 / 10) && v.iter().any(|x| *x > lin * 11 / 10));
    let n = Physics::draw_for(5, &rocm(), Pin::Nominal, Regime::BySeed);
    assert_eq!(n.intermediate(lin, 7), 7 * lin);
    assert_eq!(n.exec_bytes(10, 3), 10 * 64 * KIB);
    assert_eq!(n.kernel_nodes(100, 256, 256), 100);
}

#[test]
fn allocator_rules_follow_pytorch() {
    let r = AllocatorRules::PYTORCH;
    assert_eq!(r.segment_size(r.round_request(1)), 2 * MIB);
    assert_eq!(r.segment_size(r.round_request(3 * MIB)), 20 * MIB);
    assert_eq!(r.segment_size(r.round_request(10 * MIB + 1)), 12 * MIB);
    let p = AllocatorRules::PLAIN;
    assert_eq!(p.segment_size(p.round_request(3 * MIB + 1)), 4 * MIB);
    assert_eq!(p.round_request(u64::MAX), u64::MAX, "saturates");
}

#[test]
fn exec_bytes_sd_is_the_spread_of_the_drawn_captures() {
    let p = (0..200)
        .map(|seed| Physics::draw_for(seed, &rocm(), Pin::Draw, Regime::BySeed))
        .find(|p| p.capture_jitter_permille >= 100)
        .expect("an adversarial draw with a wide capture jitter");
    let nodes = 500;
    let n = 4000;
    let xs: Vec<f64> = (0..n).map(|i| p.exec_bytes(nodes, i) as f64).collect();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let want = p.exec_bytes_sd(nodes);
    assert!(
        (sd / want - 1.0).abs() < 0.05,
        "sampled {sd}, stated {want}"
    );
    let none = Physics::draw_for(5, &rocm(), Pin::Nominal, Regime::BySeed);
    assert_eq!(none.exec_bytes_sd(nodes), 0.0);
}
