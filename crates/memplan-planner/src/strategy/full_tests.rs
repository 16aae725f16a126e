//! `full`'s and `post-capture`'s decisions on repeats, windows and noise, one rule a test.

use super::*;

/// The range the margin reads the repeats `v` (none left out) at, for `n` repeats: the larger
/// of their range and the range d2(n) times their sample standard deviation stands for.
fn read_range(v: &[i64], n: usize) -> f64 {
    let range = (v.iter().max().unwrap() - v.iter().min().unwrap()) as f64;
    range.max(t_and_d2(n).1 * sample_sd(v))
}

/// A reading whose idle windows were off by as much as its window error allows.
fn at_bound(tolerance: u64) -> Noise {
    Noise {
        bound: 2 * tolerance,
        seen: 2 * tolerance,
        hidden: 0,
    }
}

#[test]
fn the_variation_and_the_windows_errors_add_in_quadrature() {
    let mib = 1u64 << 20;
    // Captures that varied by 180 MiB on a reading good to 20 MiB a window: 184 MiB bound
    // both, where adding them kept 220 MiB.
    let m = independent_margin(180 * mib, 20 * mib);
    let want = ((180.0f64 * 180.0 + 40.0 * 40.0).sqrt() * mib as f64).ceil() as u64;
    assert_eq!(m, want);
    assert!(m < 180 * mib + 2 * 20 * mib);
    // A quiet pass keeps both windows whole: they are all the margin there is for a
    // variation the repeats' noise hid.
    assert_eq!(independent_margin(0, 20 * mib), 40 * mib);
    // An exact reading leaves the variation as it is.
    assert_eq!(independent_margin(180 * mib, 0), 180 * mib);
    assert_eq!(independent_margin(0, 0), 0);
    assert!(keeps_a_window_for_other_memory(StrategyKind::Full));
    assert!(keeps_a_window_for_other_memory(StrategyKind::PostCapture));
    assert!(!keeps_a_window_for_other_memory(StrategyKind::Sampled));
}

#[test]
fn a_window_error_that_could_hide_a_variation_asks_for_more_repeats() {
    let mib = 1i64 << 20;
    let repeats = [190 * mib, 200 * mib, 210 * mib, 200 * mib];
    // Twice 27 MiB against a 200 MiB capture: a 7.5% variation could hide in it.
    assert!(hides_variation(&repeats, at_bound(27 << 20), 0));
    // Twice 5 MiB: it could not.
    assert!(!hides_variation(&repeats, at_bound(5 << 20), 0));
    assert!(!hides_variation(&[], at_bound(27 << 20), 0));
    assert!(!hides_variation(&[0, 0, 0, 0], at_bound(27 << 20), 0));
}

#[test]
fn a_variation_the_noise_hides_summed_over_many_graphs_asks_for_more_repeats() {
    let mib = 1i64 << 20;
    // Four repeats of a 394 MB capture within the idle windows' noise (twice 11 MiB, under
    // 7.5% of the capture: `hides_variation` does not ask for more).
    let repeats = [397_196_165, 393_518_210, 395_923_355, 388_732_933];
    let noise = at_bound(11 << 20);
    assert!(!hides_variation(&repeats, noise, 0));
    // 67 graphs from 6 MB to 394 MB: a variation of up to the noise in each sums past
    // the two windows.
    let each: Vec<i64> = (1..=67).map(|i| i * 394_000_000 / 67).collect();
    assert!(hidden_variation_sums_past_the_windows(
        &repeats, &each, noise
    ));
    // One graph, or graphs that together weigh less than a repeat: it cannot.
    assert!(!hidden_variation_sums_past_the_windows(
        &repeats,
        &each[66..],
        noise
    ));
    assert!(!hidden_variation_sums_past_the_windows(
        &repeats,
        &[200 * mib, 100 * mib],
        noise
    ));
    // An exact reading hides nothing; nothing measured, nothing to ask.
    assert!(!hidden_variation_sums_past_the_windows(
        &repeats,
        &each,
        at_bound(0)
    ));
    assert!(!hidden_variation_sums_past_the_windows(&[], &each, noise));
}

#[test]
fn probed_repeats_size_the_margin_as_full_does_with_the_resolution_left_in() {
    let mib = 1i64 << 20;
    // Twelve probe-measured repeats within 40 MiB of each other, probes good to 10 MiB: the
    // range stays whole (no idle window shows a probe's error), scaled to 35 graphs by
    // the factor of 12 repeats.
    let repeats: Vec<i64> = (0..12).map(|i| 500 * mib + (i % 5) * 10 * mib).collect();
    // They vary by 7% beyond the probes' resolution: the plan warns, and keeps one
    // capture's bound.
    assert!(probed_spread_per_mille(&repeats, 10 << 20) > VARIATION_REPORTED_PER_MILLE);
    let m = probed_variation_margin(&repeats, 35, 10 << 20, 0);
    // Five values evenly apart, whose standard deviation stands for a wider range than the
    // 40 MiB seen: probes' repeats keep their range.
    assert!(read_range(&repeats, 12) > (40 * mib) as f64);
    let want = margin_factor(12) * (40 * mib) as f64 * 35f64.sqrt();
    assert!((m as f64 - want).abs() < 1.0, "{m} against {want}");
    // Equal repeats: the probes saw no variation, but captures that differ by less than a
    // resolution read alike, so one resolution per graph is kept; nothing is warned, so
    // it bounds the difference of two captures (sqrt(2) times one capture's bound).
    assert_eq!(
        probed_variation_margin(&[500 * mib; 12], 35, 10 << 20, 0),
        unwarned_margin(
            (margin_factor(12) * (10 * mib) as f64 * 35f64.sqrt()).ceil() as u64,
            true
        )
    );
    // A repeat far below the others (memory that came back inside its window) is left out.
    let mut came_back = repeats.clone();
    came_back[0] = 100 * mib;
    assert_eq!(probed_variation_margin(&came_back, 35, 10 << 20, 0), {
        let rest: Vec<i64> = repeats[1..].to_vec();
        let range = rest.iter().max().unwrap() - rest.iter().min().unwrap();
        (margin_factor(12) * range as f64 * 35f64.sqrt()).ceil() as u64
    });
}

#[test]
fn probed_repeats_that_read_alike_keep_a_page_of_variation_per_graph() {
    // Twelve probed repeats of a 206 MB capture that all read 205,874,622 B, probes searching
    // up to 24 GiB: the driver commits raw allocations in whole pages, so captures up to a
    // page apart read alike (their executable objects varied by up to 2 MB). The range kept
    // for them is what the probes cannot tell apart (a page), not the search's resolution
    // alone, and the bound on the difference of two passes of 36 graphs covers captures
    // 1.9 MiB apart.
    let limit = 24u64 << 30;
    let read = [205_874_622; 12];
    let search = crate::session::probe::resolution(limit);
    let alike = crate::session::probe::alike_within(limit);
    let m = probed_variation_margin(&read, 36, search, alike);
    let unseen = unwarned_margin(
        (margin_factor(12) * 1_992_294.0 * 36f64.sqrt()).ceil() as u64,
        true,
    );
    assert!(m >= unseen, "{m} against {unseen}");
    // At the search's resolution alone it kept 4.5 MB, and the engine's later captures took
    // 5.3 MB past the reserve.
    assert!(probed_variation_margin(&read, 36, search, 0) < unseen);
    // Repeats a page apart are within what the probes cannot tell apart: the margin keeps it,
    // and what the plan warns of is only what the repeats show beyond the search's error.
    let two = [205_874_622, 205_874_622 - (2 << 20)];
    let spread = probed_spread_per_mille(&two, search);
    assert_eq!(
        probed_variation_margin(&two, 36, search, alike),
        unwarned_margin(
            (margin_factor(2) * alike as f64 * 36f64.sqrt()).ceil() as u64,
            spread <= VARIATION_REPORTED_PER_MILLE
        )
    );
}

#[test]
fn a_plan_that_does_not_warn_bounds_the_difference_between_two_captures() {
    // 32 repeats of a 342 MB capture within 1.59 MB (0.46%, no warning): one capture's
    // bound over 35 graphs is 0.877 x 1.59 MB x sqrt(35) = 8.27 MB; the engine's later
    // captures and the pass are two draws, so the bound on their difference is sqrt(2)
    // times it, 11.69 MB (the engine's captures took 9.8 MB more than the pass).
    let one = (3.634 / 4.139 * 1_591_280.0 * 35f64.sqrt()).ceil() as u64;
    assert_eq!(one, 8_265_519);
    assert_eq!(unwarned_margin(one, true), 11_689_210);
    // A plan that warns keeps one capture's bound: the warning names the rest.
    assert_eq!(unwarned_margin(one, false), one);
    assert_eq!(unwarned_margin(0, true), 0);
}

#[test]
fn captures_in_whole_coarse_segments_ask_for_more_repeats() {
    let mib = 1i64 << 20;
    let repeats = [224 * mib; 4];
    let pass = [288 * mib, 256 * mib, 224 * mib, 192 * mib, 160 * mib];
    let step = quantum(&[pass.as_slice(), repeats.as_slice()].concat());
    assert_eq!(step, 32 << 20);
    // No window error, yet four equal repeats of 7 steps of 32 MiB could hide a variation
    // of up to a step.
    assert!(hides_variation(&repeats, at_bound(0), step));
    // Windows that count bytes share no coarse step.
    let bytes = [224 * mib + 4097, 224 * mib - 811, 224 * mib + 13, 224 * mib];
    assert!(quantum(&bytes) < 1 << 20);
    assert!(!hides_variation(&bytes, at_bound(0), quantum(&bytes)));
}

#[test]
fn a_variation_below_the_windows_step_is_counted() {
    let mib = 1i64 << 20;
    let step = 256u64 << 20;
    // Twelve repeats of a capture of about 400 MiB read in 256 MiB steps: 256 or 512 MiB
    // by where the readings fell, and the idle windows read 0 or a step.
    let repeats: Vec<i64> = [2, 2, 2, 1, 1, 2, 2, 2, 2, 2, 1, 1]
        .iter()
        .map(|k| k * 256 * mib)
        .collect();
    let each = vec![256 * mib; 35];
    let noise = Noise {
        bound: 2 * step,
        seen: step,
        hidden: 0,
    };
    // The range less the idle windows' step: no variation at all; what is left is what
    // the repeats' standard deviation stands for beyond the step.
    let beyond = varied_beyond_noise(read_range(&repeats, 12), noise.seen);
    assert!(beyond > 0.0 && read_range(&repeats, 12) > step as f64);
    // The step is the repeats' range at least, the same bytes for every graph.
    let stepped = noise.stepped(&repeats, step);
    assert_eq!(stepped.hidden, step);
    assert_eq!(
        variation_margin(&repeats, &each, stepped),
        (margin_factor(12) * beyond.max(step as f64) * 35f64.sqrt()).ceil() as u64
    );
    // Twelve repeats that all read one step: no range, no deviation, the step alone.
    let flat = vec![256 * mib; 12];
    assert_eq!(
        variation_margin(&flat, &each, noise.stepped(&flat, step)),
        (margin_factor(12) * step as f64 * 35f64.sqrt()).ceil() as u64
    );
    // A step far below the captures hides no variation that matters.
    assert_eq!(hidden_by_step(&repeats, 4 << 20), 0);
    // Captures below a step read 0: the step hides them whole, and four repeats of them
    // are not enough.
    assert_eq!(hidden_by_step(&[0; 4], step), step);
    assert!(hides_variation(&[0; 4], Noise::default(), step));
    assert!(variation_margin(&[0; 12], &each, Noise::default().stepped(&[0; 12], step)) > 0);
    // No step, nothing hidden.
    assert_eq!(hidden_by_step(&[0; 4], 0), 0);
}

#[test]
fn identical_windows_are_no_step_where_the_reading_has_its_own() {
    let mib = 1i64 << 20;
    // Twelve repeats and the pass of one capture size, all read as 7.38 GiB: their common
    // divisor is the capture itself, and taken as a step it hides the capture whole.
    let windows = vec![7040 * mib; 13];
    let q = quantum(&windows);
    assert_eq!(q, 7040 << 20);
    assert_eq!(hidden_by_step(&windows[1..], q), q);
    // On a reading in 64 MiB steps the windows hide no more than its step, which hides no
    // variation that matters beside a capture of 7 GiB.
    let step = within_reading_step(q, 64 << 20);
    assert_eq!(step, 64 << 20);
    assert_eq!(hidden_by_step(&windows[1..], step), 0);
    // Windows in a coarser step than the reading's read the reading's; an unknown reading step
    // leaves the windows' own.
    assert_eq!(within_reading_step(512 << 20, 256 << 20), 256 << 20);
    assert_eq!(within_reading_step(q, 0), q);
    // No positive window: the reading's step, which hides captures read as 0 whole.
    assert_eq!(within_reading_step(0, 64 << 20), 64 << 20);
}

#[test]
fn a_spread_under_half_a_per_mille_still_keeps_a_margin() {
    // An exact reading: 18 KB of spread over a 93 MB capture, 0.19 per mille, is
    // reported as 0 per mille but is a variation all the same.
    let repeats = [93_016_212, 93_013_228, 93_028_894, 93_010_990];
    let quiet = Noise::default();
    assert_eq!(spread_per_mille(&repeats, quiet), 0);
    assert!(spread_share(&repeats, quiet) > 0.0);
    let each = vec![7_000_000i64; 35];
    let margin = variation_margin(&repeats, &each, quiet);
    // At least the range for each of the 35 graphs, in quadrature.
    assert!(margin as f64 >= 17_904.0 * 35f64.sqrt(), "{margin}");
}

#[test]
fn the_repeats_spread_is_the_margin() {
    let mib = 1i64 << 20;
    // Identical repeats: no margin.
    assert_eq!(
        variation_margin(&[100 * mib; 3], &[132 * mib, 90 * mib], at_bound(0)),
        0
    );
    // Repeats that vary by 10%: a margin that grows with every graph, not their sum.
    let each = vec![100 * mib; 16];
    let three = [95 * mib, 100 * mib, 105 * mib];
    let margin = variation_margin(&three, &each, at_bound(0));
    let sqrt_sum = (16.0f64).sqrt() * 100.0 * (1u64 << 20) as f64;
    let share = read_range(&three, 3) / (100 * mib) as f64;
    assert!(share >= 0.1);
    assert_eq!(margin, (margin_factor(3) * share * sqrt_sum).ceil() as u64);
    // Four times the graphs: twice the margin (independent variations), not four times.
    let margin4 = variation_margin(
        &[95 * mib, 100 * mib, 105 * mib],
        &vec![100 * mib; 64],
        at_bound(0),
    );
    assert!(
        margin4 <= 2 * margin + 1 && margin4 >= 2 * margin - 1,
        "{margin} {margin4}"
    );
    // Within what the reading's tolerance explains: none.
    assert_eq!(
        variation_margin(&[90 * mib, 100 * mib, 110 * mib], &each, at_bound(16 << 20)),
        0
    );
    // Nothing to compare.
    assert_eq!(variation_margin(&[], &[5], at_bound(0)), 0);
}

#[test]
fn a_repeat_that_memory_came_back_inside_is_not_variation() {
    let mib = 1i64 << 20;
    // The pass's graphs came back inside the first repeat's window.
    let late = [-2337 * mib, 90 * mib, 100 * mib, 95 * mib];
    assert_eq!(spread(&late, 0).map(|s| s.0), Some(10 * mib));
    // 10 MiB over the median of 92.5 MiB: the mean (-513 MiB) would have read none.
    assert_eq!(spread_per_mille(&late, at_bound(0)), 108);
    let each = vec![100 * mib; 19];
    let sqrt_sum = (19.0f64).sqrt() * 100.0 * mib as f64;
    assert_eq!(
        variation_margin(&late, &each, at_bound(0)),
        (margin_factor(4) * (read_range(&late[1..], 4) / (92.5 * mib as f64)) * sqrt_sum).ceil()
            as u64
    );
    // A low repeat within what a variation either way explains stays in the range, and
    // so does one above half the median (the others happening to agree says little).
    let wide = [80 * mib, 100 * mib, 100 * mib, 105 * mib];
    assert_eq!(spread(&wide, 0).map(|s| s.0), Some(25 * mib));
    let one_low = [80 * mib, 100 * mib, 100 * mib, 100 * mib];
    assert_eq!(spread(&one_low, 0).map(|s| s.0), Some(20 * mib));
}

#[test]
fn a_range_within_the_window_error_is_variation_where_the_idle_windows_were_quiet() {
    // Twelve repeats 38 MB apart, read with a 24 MiB window error (48 MiB between two
    // windows): at the bound, the whole range is noise and no margin is left.
    let repeats: Vec<i64> = [297, 318, 320, 317, 304, 282, 301, 305, 317, 319, 282, 317]
        .iter()
        .map(|mb| mb * 1_000_000)
        .collect();
    let each = vec![150i64 << 20; 35];
    let tol = 24u64 << 20;
    assert_eq!(variation_margin(&repeats, &each, at_bound(tol)), 0);
    // The idle windows moved 12 MB: the range is mostly the capture's, and the margin
    // covers it over every graph (sqrt(38^2 - noise^2) MB each, same bytes for 35 graphs,
    // the noise what five idle windows that ranged 12 MB surely show of it).
    let r = Repeats {
        bytes: repeats.clone(),
        baselines: Vec::new(),
        idle: vec![3_000_000, -5_000_000, 7_000_000, 0, 1_000_000],
    };
    let noise = r.noise(tol);
    assert_eq!(
        (noise.bound, noise.seen),
        (48 << 20, surely_noise(12_000_000, 5))
    );
    let seen = noise.seen as f64;
    let read = read_range(&repeats, 12);
    assert!(read >= 38e6);
    let varied = (read * read - seen * seen).sqrt();
    let m = variation_margin(&repeats, &each, noise);
    assert_eq!(m, (margin_factor(12) * varied * 35f64.sqrt()).ceil() as u64);
    // Idle windows that moved more than the bound are taken at the bound; none read: the
    // bound.
    let loud = Repeats {
        idle: vec![-200 << 20, 200 << 20],
        ..Repeats::default()
    };
    assert_eq!(loud.noise(tol).seen, 48 << 20);
    assert_eq!(Repeats::default().noise(tol).seen, 48 << 20);
}

#[test]
fn the_idle_windows_range_is_taken_off_at_what_it_surely_shows_of_the_noise() {
    // What a range of idle windows surely shows of the noise: the range their count is
    // expected to have (d2) at the noise's lower bound at 99.95% (the range over its upper
    // 99.95% point): about 37% of the range seen for four windows, 52% for twelve, 60% for 32.
    assert_eq!(surely_noise(1_000_000, 4), 370_990);
    assert_eq!(surely_noise(1_000_000, 12), 516_323);
    assert_eq!(surely_noise(1_000_000, 32), 596_397);
    assert_eq!(surely_noise(0, 12), 0);
    // Twelve repeats of an 87 MB capture on a reading good to 499 KiB a window (an APU's),
    // ranging 711 KB beside idle windows that ranged 867 KB: taken off whole, the idle range
    // left no variation at all, though the executable objects beneath varied by 2.1% of their
    // 10 MB each and the engine's 35 captures took 2.8 MB more than the pass.
    let r = Repeats {
        bytes: vec![
            87_083_581, 86_842_680, 87_031_141, 87_248_585, 87_506_959, 87_553_633, 87_216_762,
            87_346_562, 87_515_203, 87_032_301, 86_877_385, 86_990_533,
        ],
        baselines: Vec::new(),
        idle: vec![
            -190_530, -253_610, -164_441, 492_616, -42_417, 450_239, 52_721, -125_957, 21_601,
            -160_338, -374_720, 43_923,
        ],
    };
    let tol = 511_203;
    assert_eq!(varied_beyond_noise(710_953.0, 867_336), 0.0);
    let each: Vec<i64> = (1..=35).map(|i| i * 2_500_000).collect();
    let m = variation_margin(&r.bytes, &each, r.noise(tol));
    // At least the variation beyond what the noise surely explains, for every graph.
    let seen = surely_noise(867_336, 12) as f64;
    let varied = (710_953f64 * 710_953.0 - seen * seen).sqrt();
    assert!(m as f64 >= margin_factor(12) * varied * 35f64.sqrt());
    // Kept unwarned with the windows', it covers what the engine's captures took beyond the
    // pass.
    let kept = independent_margin(unwarned_margin(m, true), tol);
    assert!(kept > 2_830_000, "{kept}");
}

#[test]
fn noise_and_variation_add_in_quadrature() {
    let mib = 1i64 << 20;
    // A 20 MiB range read with a 16 MiB window error: 12 MiB of it is variation
    // (sqrt(20^2 - 16^2)), not the 4 MiB a linear subtraction would leave.
    let repeats = [90 * mib, 100 * mib, 110 * mib];
    assert_eq!(spread_per_mille(&repeats, at_bound(8 << 20)), 120);
    let linear = 0.04 * 100.0 * (mib as f64);
    let m = variation_margin(&repeats, &[100 * mib], at_bound(8 << 20));
    let read = read_range(&repeats, 3);
    let varied = (read * read - (16.0 * mib as f64).powi(2)).sqrt();
    assert!(varied >= 12.0 * mib as f64);
    assert_eq!(m, (margin_factor(3) * varied).ceil() as u64);
    assert!(m as f64 > 2.0 * margin_factor(3) * linear);
}

#[test]
fn memory_a_release_did_not_give_back_may_come_back() {
    let mib = 1i64 << 20;
    // The release gave the graph back; the library's workspace stays: nothing to come.
    let back = Primed {
        returned: 40 * mib,
        outstanding: 300 * mib,
    };
    assert_eq!(back.may_come_back(40 * mib), 0);
    // The runtime still holds the destroyed graph: what a capture of its size takes.
    let late = Primed {
        returned: 0,
        outstanding: 340 * mib,
    };
    assert_eq!(late.may_come_back(40 * mib), 40 << 20);
    // At most what stayed out, never negative.
    let small = Primed {
        returned: 0,
        outstanding: 10 * mib,
    };
    assert_eq!(small.may_come_back(40 * mib), 10 << 20);
    assert_eq!(small.may_come_back(-mib), 0);
}

#[test]
fn what_the_runtime_keeps_of_every_capture_is_read_from_the_later_openings() {
    let mib = 1i64 << 20;
    let at = |diffs: &[i64]| {
        let mut v = vec![10_000 * mib];
        for d in diffs {
            v.push(v.last().unwrap() + d * mib);
        }
        v
    };
    // The pass's graphs came back after the first repeat (a large drop), then each
    // capture left about 20 MiB held: the drop is in the first half, not counted.
    let b = at(&[-1400, 35, 19, 22, 12, 15, 31, 20, 27, 18, 21]);
    assert_eq!(kept_per_capture(&b, 0), 20 << 20);
    // Less the reading's window error.
    assert_eq!(kept_per_capture(&b, 4 << 20), 16 << 20);
    // The lower median of an even count: the smaller of the two middle differences.
    assert_eq!(kept_per_capture(&at(&[50, 10, 30]), 0), 10 << 20);
    // A runtime that keeps nothing: releases give back what captures took.
    assert_eq!(kept_per_capture(&at(&[0, 1, -1, 0, 0, -1, 1]), 0), 0);
    // Memory coming back late in the later half pulls the estimate down, never up.
    assert_eq!(kept_per_capture(&at(&[20, 20, 20, -300, -300, 20]), 0), 0);
    // Too few openings to compare.
    assert_eq!(kept_per_capture(&[], 0), 0);
    assert_eq!(kept_per_capture(&[5 * mib], 0), 0);
}

#[test]
fn further_repeats_are_taken_where_they_take_off_more_than_they_keep() {
    let mib = 1u64 << 20;
    // 18% of the twelve's margin against 20 captures' kept memory.
    let off = 1.0 - 3.634 / 4.437;
    assert!((0.17..0.19).contains(&off));
    // A runtime that keeps nothing: any margin pays for them.
    assert!(further_repeats_pay(10 * mib, 0));
    assert!(!further_repeats_pay(0, 0));
    // 4 MiB per capture: 80 MiB held for good, worth it only above a 440 MiB margin.
    assert!(!further_repeats_pay(400 * mib, 4 * mib));
    assert!(further_repeats_pay(500 * mib, 4 * mib));
    // 32 repeats of the same spread: a smaller margin than 12 at the same confidence.
    let (f12, f32) = (margin_factor(12), margin_factor(32));
    assert!((0.87..0.89).contains(&f32), "{f32}");
    assert!(f32 * 4.139 < f12 * 3.258 * 0.83);
}

#[test]
fn more_repeats_narrow_the_margin_at_the_same_confidence() {
    let (few, many) = (
        margin_factor(REPEATS),
        margin_factor(REPEATS + MORE_REPEATS),
    );
    assert!(
        (6.2..6.4).contains(&few) && (1.3..1.4).contains(&many),
        "{few} {many}"
    );
    // The same values over twelve repeats: under a third of the margin of four (their
    // standard deviation stands for a wider range of twelve than their range).
    let each = vec![100i64 << 20; 35];
    let four = [95i64 << 20, 100 << 20, 100 << 20, 105 << 20];
    let twelve: Vec<i64> = four.iter().cycle().take(12).copied().collect();
    let m4 = variation_margin(&four, &each, at_bound(0));
    let m12 = variation_margin(&twelve, &each, at_bound(0));
    assert!(m12 * 3 < m4 && m12 > 0, "{m4} {m12}");
}

#[test]
fn a_quiet_reading_keeps_its_windows_at_the_step_its_windows_show() {
    let mib = 1u64 << 20;
    let quiet = [0i64; 32];
    // A process-local reading whose calibration windows read the 1 MiB of page rounding:
    // 32 idle windows of 0 and capture windows in single bytes keep a byte, not the MiB.
    assert_eq!(quiet_reading_window(mib, &quiet, true, 1), 1);
    let repeats = [86_364_496i64, 86_359_232, 86_358_856, 86_359_984];
    let step = within_reading_step(quantum(&repeats), mib);
    assert_eq!(step, 8);
    assert_eq!(quiet_reading_window(mib, &quiet, true, step), 8);
    // A reading in 2 MiB steps keeps its step: every window is a multiple of it.
    let stepped = [86 * mib as i64, 88 * mib as i64, 84 * mib as i64];
    let step = within_reading_step(quantum(&stepped), 2 * mib);
    assert_eq!(quiet_reading_window(2 * mib, &quiet, true, step), 2 * mib);
    // An idle window that moved, combined reads, no window that moved, no idle window:
    // the window error as measured.
    let mut moved = quiet;
    moved[7] = 4096;
    assert_eq!(quiet_reading_window(mib, &moved, true, 8), mib);
    assert_eq!(quiet_reading_window(mib, &quiet, false, 8), mib);
    assert_eq!(quiet_reading_window(mib, &quiet, true, 0), mib);
    assert_eq!(quiet_reading_window(mib, &[], true, 8), mib);
    // Never above the window error kept.
    assert_eq!(quiet_reading_window(mib, &quiet, true, 4 * mib), mib);
}

#[test]
fn a_pass_that_gave_memory_back_inside_itself_counts_its_peak() {
    let mib = 1i64 << 20;
    let pass = |peak: i64, total: i64| Pass {
        total,
        each: Vec::new(),
        from_driver: true,
        peak,
    };
    // The trace of an A100 40GB pass under `max_split_size_mb:20`: the pool grew to 36.8 GiB,
    // the allocator gave its cache back where the device was full, and the end read 10.7 GiB.
    let (peak, end) = (36_816 * mib, 10_742 * mib);
    assert_eq!(
        given_back_inside(&pass(peak, end), 2 << 20, 0),
        (peak - end) as u64
    );
    // A peak within one window's error of the end is the reading, not memory given back.
    assert_eq!(given_back_inside(&pass(end + 2 * mib, end), 2 << 20, 0), 0);
    // Nor is one the priming graph may have returned inside the pass (counted apart).
    assert_eq!(
        given_back_inside(&pass(end + 300 * mib, end), 2 << 20, 300 * mib),
        0
    );
    assert_eq!(
        given_back_inside(&pass(end + 300 * mib, end), 2 << 20, 100 * mib),
        300 << 20
    );
    // A pass that held the most at its end.
    assert_eq!(given_back_inside(&pass(end, end), 0, 0), 0);
}

/// A free reading in 768 MiB steps, 35 graphs whose first size (80 MB) reads 0 in every window:
/// counted from the reading, the step is the repeats' range for every graph and the margin
/// keeps seven steps (5.5 GiB beside 1.3 GB of graphs: every start-up on a 24 GiB card was
/// refused). Such a step is worth allocation probes, and twelve probed repeats within 2 MiB of
/// one another keep their variation and one window of the reading: about one step.
#[test]
fn a_step_that_hides_the_captures_costs_one_window_measured_by_probes_not_seven() {
    let mib = 1u64 << 20;
    let step = 768 * mib;
    let by_reading = unwarned_margin(
        variation_margin(
            &[0; 32],
            &[0; 35],
            Noise {
                bound: 2 * step,
                seen: 0,
                hidden: hidden_by_step(&[0; 32], step),
            },
        ),
        true,
    );
    assert!(by_reading > 7 * step, "{by_reading}");
    // What the reading's own figure decides on: the priming capture read as 0 (or a step)
    // hides under the step, and the step is coarse enough for a probe.
    assert!(hidden_by_step(&[0], step) > 0 && hidden_by_step(&[step as i64], step) > 0);
    assert!(crate::session::probe::step_worth_probes(step));
    // A step a probe is not worth: a 32 MiB one, nor the 2 MiB pages calibration reads.
    assert!(!crate::session::probe::step_worth_probes(32 * mib));
    assert!(!crate::session::probe::step_worth_probes(2 * mib));
    let repeats = [
        79_749_120, 81_776_640, 81_776_640, 79_613_952, 81_776_640, 81_776_640, 79_749_120,
        79_749_120, 81_776_640, 79_613_952, 79_749_120, 81_776_640,
    ];
    let free = 9 << 30;
    let variation = probed_variation_margin(
        &repeats,
        35,
        crate::session::probe::resolution(free),
        crate::session::probe::alike_within(free),
    );
    assert!(variation < 32 * mib, "{variation}");
    let by_probes = probed_pass_margin(variation, step);
    assert!(
        by_probes >= step && by_probes < step + 2 * mib,
        "{by_probes}"
    );
    // One window in quadrature with the variation, never less than either.
    assert_eq!(probed_pass_margin(0, step), step);
    assert_eq!(probed_pass_margin(variation, 0), variation);
}

#[test]
fn a_variation_with_light_tails_is_taken_at_its_standard_deviation() {
    let mib = 1i64 << 20;
    assert_eq!(
        sample_sd(&[95 * mib, 100 * mib, 105 * mib]),
        5.0 * mib as f64
    );
    assert_eq!(sample_sd(&[7 * mib]), 0.0);
    // 32 repeats of a 0.89 GB capture on an exact reading, ranging 130.7 MB (14.7%): their
    // range over d2(32) reads a standard deviation of 31.6 MB, their sample standard
    // deviation is 38.2 MB. Read at the range, the margin kept 229.5 MB for the pass's four
    // graphs, and the engine alone's captures of them took 265.5 MB more than the pass.
    let repeats = [
        890_844_977,
        889_890_938,
        876_534_392,
        933_776_732,
        945_861_226,
        857_771_625,
        891_481_003,
        897_523_250,
        903_883_510,
        888_300_873,
        848_867_261,
        945_543_213,
        912_469_861,
        875_898_366,
        942_045_070,
        866_675_989,
        832_330_585,
        817_383_974,
        815_157_883,
        869_856_119,
        871_446_184,
        929_006_537,
        902_929_471,
        907_063_640,
        831_376_546,
        900_067_354,
        840_598_923,
        880_032_535,
        864_449_898,
        909_925_757,
        944_589_174,
        828_832_442,
    ];
    let (range, median) = spread(&repeats, 0).unwrap();
    assert_eq!(range, 130_703_343);
    let s = sample_sd(&repeats);
    assert!((38.1e6..38.2e6).contains(&s), "{s}");
    assert!(range as f64 / t_and_d2(32).1 < 0.83 * s);
    // The pass's four graphs (the first size and three smaller).
    let each = [890_000_000i64, 640_000_000, 430_000_000, 250_000_000];
    let quadrature = in_quadrature(&each);
    let m = variation_margin(&repeats, &each, Noise::default());
    // Student's t with 31 degrees of freedom times the sample standard deviation, scaled to
    // every graph (the larger of in proportion to each and the same bytes for each of the
    // four): 277 MB, not the 17% less the range stood for.
    let scaled = (quadrature / median).max(4f64.sqrt());
    let at_s = 3.634 * s * scaled;
    assert!((m as f64 - at_s).abs() < 2.0, "{m} against {at_s}");
    assert!((277e6..278e6).contains(&at_s), "{at_s}");
    let at_range = margin_factor(32) * range as f64 * scaled;
    assert!(m as f64 > 1.2 * at_range, "{m} against {at_range}");
    // Heavy tails: one repeat far out (but not below the others, as memory coming back reads)
    // shows in the range more than in the standard deviation, and the range stays.
    let mut one_out = vec![100 * mib; 31];
    one_out.push(110 * mib);
    assert!(t_and_d2(32).1 * sample_sd(&one_out) < (10 * mib) as f64);
    assert_eq!(
        variation_margin(&one_out, &[100 * mib], Noise::default()),
        (margin_factor(32) * (10.0 / 100.0) * (100 * mib) as f64).ceil() as u64
    );
}

/// Probed repeats past the first four are taken only where the margin they are expected to
/// take off is more than their probes' frees keep for good: an L4 keeping 32 MiB a free held
/// 1 GiB after the graph phase, most of it the twelve repeats' probes' frees.
#[test]
fn more_probed_repeats_are_taken_where_they_take_off_more_than_their_frees_keep() {
    let mib = 1i64 << 20;
    let first = [100 * mib, 105 * mib, 100 * mib, 105 * mib];
    let (res, alike) = (mib as u64 / 4, 2 * mib as u64);
    let four = probed_variation_margin(&first, 67, res, alike);
    let off = four as f64 * (1.0 - margin_factor(PROBED_REPEATS) / margin_factor(REPEATS));
    // A device that keeps nothing of a free takes them all.
    assert!(more_probed_repeats_pay(&first, 67, res, alike, 0));
    assert!(more_probed_repeats_pay(
        &first,
        67,
        res,
        alike,
        (off * 0.9) as u64
    ));
    assert!(!more_probed_repeats_pay(
        &first,
        67,
        res,
        alike,
        (off * 1.1) as u64
    ));
    // 8 repeats of two probes, each with one try that succeeded, at 32 MiB a free: 512 MiB,
    // more than they take off a margin of 5 MiB of range over 67 graphs.
    assert!(!more_probed_repeats_pay(&first, 67, res, alike, 512 << 20));
}
