//! The simulator's own physics: every hidden quantity of a simulated GPU, drawn per device from
//! a documented range with a seed (selector modifier `seed=N`; [`DEFAULT_SEED`] otherwise).
//!
//! The ranges and their public sources are in `docs/simulator-physics.md`. The planner never
//! imports these figures: it measures them (calibration, full capture) or takes a documented
//! upper bound of the same public range, so a plan can only agree with the simulator by being
//! right, never by construction. The generator is SplitMix64: tiny, deterministic on every
//! platform, and good enough to spread draws over a range.

use memplan_core::bytes::{KIB, MIB};
use serde::{Deserialize, Serialize};

use crate::quirks::Quirks;

/// The seed a device gets when its selector names none (documented; keeps output
/// reproducible).
pub const DEFAULT_SEED: u64 = 1;

/// Driver memory of a graph's executable object per kernel node: one public data point of
/// about 64 KiB; the simulator draws from half to double of it.
pub const EXEC_PER_KERNEL_NODE_RANGE: (u64, u64) = (32 * KIB, 128 * KIB);
/// Per-capture memory a runtime keeps (where the platform has it): the public ~4 MiB, ±1 MiB.
pub const HIDDEN_PER_CAPTURE_SPREAD: u64 = MIB;
/// Fraction (per mille) of an eager warm-up's memory that stays cached in the allocator.
pub const WARMUP_LEFT_CACHED_RANGE: (u64, u64) = (600, 1000);
/// Context and runtime libraries: the profile's typical figure scaled by this (per mille).
pub const CONTEXT_SCALE_RANGE: (u64, u64) = (800, 1200);
/// Noise of a driver free reading declared approximate, as a fraction (per mille) of the
/// declared tolerance; at most [`READ_NOISE_MAX`].
pub const READ_NOISE_OF_TOLERANCE: u64 = 125;
/// Cap of the reading noise.
pub const READ_NOISE_MAX: u64 = 256 * KIB;

/// The drawn quantities of one simulated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Physics {
    /// The seed they were drawn from.
    pub seed: u64,
    /// Executable-object bytes per kernel node.
    pub exec_bytes_per_kernel_node: u64,
    /// Per-capture bytes the runtime keeps (0 on platforms without the quirk).
    pub hidden_bytes_per_capture: u64,
    /// Per mille of a warm-up's memory left cached before a capture.
    pub warmup_left_cached_permille: u64,
    /// Context and runtime libraries, bytes.
    pub context_bytes: u64,
    /// Amplitude of the noise on an approximate free reading, bytes (0 for exact readings).
    pub read_noise_bytes: u64,
    /// Amplitude of the noise on the device-wide reading (DRM sysfs, host available memory),
    /// bytes, within its declared tolerance (0 when exact or not offered).
    #[serde(default)]
    pub device_noise_bytes: u64,
}

/// SplitMix64.
#[derive(Debug, Clone, Copy)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x6d65_6d70_6c61_6e21)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]` (inclusive).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Which end of each range to take instead of drawing (for the flip-to-the-ends study).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pin {
    /// Draw from the seed.
    #[default]
    Draw,
    /// Every quantity at the low end of its range.
    Low,
    /// Every quantity at the high end.
    High,
    /// Every quantity at its typical figure (the public data point; no reading noise): for
    /// the simulator's own unit tests of its quirks, never for evidence about the planner.
    Nominal,
}

impl Physics {
    /// Draw the physics of a device with typical context `context_bytes`, quirks `q` and a
    /// free reading declared approximate within `free_tolerance` (0 when exact).
    pub fn draw(seed: u64, context_bytes: u64, q: &Quirks, free_tolerance: u64) -> Self {
        Self::draw_pinned(seed, context_bytes, q, free_tolerance, Pin::Draw)
    }

    /// As [`Physics::draw_pinned`], with the noise of a device-wide reading declared
    /// approximate within `device_tolerance` (0 when exact or not offered). Drawn after every
    /// other quantity, so adding it moves none of them.
    pub fn draw_with_device(
        seed: u64,
        context_bytes: u64,
        q: &Quirks,
        (free_tolerance, device_tolerance): (u64, u64),
        pin: Pin,
    ) -> Self {
        let mut p = Self::draw_pinned(seed, context_bytes, q, free_tolerance, pin);
        let mut rng = Rng::new(seed ^ 0x6465_7669_6365);
        let cap = (device_tolerance / 1000 * READ_NOISE_OF_TOLERANCE).min(READ_NOISE_MAX);
        p.device_noise_bytes = match pin {
            Pin::Draw => rng.range(0, cap),
            Pin::Low | Pin::Nominal => 0,
            Pin::High => cap,
        };
        p
    }

    /// As [`Physics::draw`], optionally pinned to one end of every range.
    pub fn draw_pinned(
        seed: u64,
        context_bytes: u64,
        q: &Quirks,
        free_tolerance: u64,
        pin: Pin,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let mut pick = |(lo, hi): (u64, u64), nominal: u64| {
            let v = rng.range(lo, hi);
            match pin {
                Pin::Draw => v,
                Pin::Low => lo,
                Pin::High => hi,
                Pin::Nominal => nominal,
            }
        };
        let exec = pick(EXEC_PER_KERNEL_NODE_RANGE, 64 * KIB);
        let hidden = if q.hidden_bytes_per_capture > 0 {
            let h = q.hidden_bytes_per_capture;
            let lo = h.saturating_sub(HIDDEN_PER_CAPTURE_SPREAD).max(h / 2);
            pick((lo, h.saturating_add(HIDDEN_PER_CAPTURE_SPREAD)), h) / KIB * KIB
        } else {
            0
        };
        let warm = pick(WARMUP_LEFT_CACHED_RANGE, 1000);
        let ctx_scale = pick(CONTEXT_SCALE_RANGE, 1000);
        let noise_cap = (free_tolerance / 1000 * READ_NOISE_OF_TOLERANCE).min(READ_NOISE_MAX);
        let noise = pick((0, noise_cap), 0);
        Physics {
            seed,
            exec_bytes_per_kernel_node: exec / 1024 * 1024,
            hidden_bytes_per_capture: hidden,
            warmup_left_cached_permille: warm,
            context_bytes: if ctx_scale == 1000 {
                context_bytes
            } else {
                (context_bytes / 1000 * ctx_scale) / MIB * MIB
            },
            read_noise_bytes: noise,
            device_noise_bytes: 0,
        }
    }

    /// The noise of the `n`-th free reading: deterministic in `(seed, n)`, within
    /// `±read_noise_bytes`.
    pub fn noise(&self, n: u64) -> i64 {
        if self.read_noise_bytes == 0 {
            return 0;
        }
        let mut r = Rng::new(self.seed.wrapping_mul(31).wrapping_add(n));
        let span = 2 * self.read_noise_bytes;
        r.range(0, span) as i64 - self.read_noise_bytes as i64
    }

    /// The noise of the `n`-th device-wide reading: deterministic in `(seed, n)`, within
    /// `±device_noise_bytes`, independent of [`Physics::noise`].
    pub fn device_noise(&self, n: u64) -> i64 {
        if self.device_noise_bytes == 0 {
            return 0;
        }
        let mut r = Rng::new(self.seed.wrapping_mul(37).wrapping_add(n) ^ 0x7379_7366);
        let span = 2 * self.device_noise_bytes;
        r.range(0, span) as i64 - self.device_noise_bytes as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_their_ranges_and_differ_between_seeds() {
        let q = Quirks {
            hidden_bytes_per_capture: 4 * MIB,
            ..Quirks::NONE
        };
        let mut execs = std::collections::BTreeSet::new();
        for seed in 0..500 {
            let p = Physics::draw(seed, 400 * MIB, &q, 512 * MIB);
            let (lo, hi) = EXEC_PER_KERNEL_NODE_RANGE;
            assert!((lo..=hi).contains(&p.exec_bytes_per_kernel_node), "{p:?}");
            assert!(
                (3 * MIB..=5 * MIB).contains(&p.hidden_bytes_per_capture),
                "{p:?}"
            );
            assert!((319 * MIB..=480 * MIB).contains(&p.context_bytes), "{p:?}");
            assert!(p.read_noise_bytes <= READ_NOISE_MAX);
            for n in 0..4 {
                assert!(p.noise(n).unsigned_abs() <= p.read_noise_bytes);
            }
            execs.insert(p.exec_bytes_per_kernel_node);
        }
        assert!(execs.len() > 50, "seeds spread the draw: {}", execs.len());
        assert_eq!(
            Physics::draw(7, 400 * MIB, &q, 0),
            Physics::draw(7, 400 * MIB, &q, 0),
            "deterministic"
        );
        let hi = Physics::draw_pinned(7, 400 * MIB, &q, 0, Pin::High);
        assert_eq!(hi.exec_bytes_per_kernel_node, EXEC_PER_KERNEL_NODE_RANGE.1);
        assert_eq!(
            Physics::draw(7, 400 * MIB, &Quirks::NONE, 0).read_noise_bytes,
            0
        );
    }
}
