//! Budget arithmetic: from the device total down to the KV-cache budget, and the suggestions
//! that pin it in an engine.
//!
//! - `requested = ceil(total * gpu_memory_utilization)` ([`Request::Utilization`], which must
//!   lie in (0, 1]) or an absolute byte budget ([`Request::Bytes`], at most the total); or the
//!   KV cache size itself is fixed ([`Request::KvCacheBytes`], vLLM `--kv-cache-memory-bytes`).
//! - Start-up check ([`check_free`]): free memory below `requested` fails early, saying how
//!   much is in use and who holds it (this process's allocator vs. everything outside it).
//! - `kv_budget = requested - weights - activation - non_allocator - graph_reserve`
//!   ([`compute`]); a negative result is [`Error::DoesNotFit`] with the utilisation that would
//!   fit, or the size the device lacks.
//! - Suggestions ([`Suggestions`]): the `--gpu-memory-utilization` an engine that does *not*
//!   reserve graph memory needs for the same KV budget, and the KV byte budgets that fill the
//!   requested memory and the whole device.
//! - Several ranks (tensor parallelism): one budget per rank, the engine takes the minimum
//!   ([`combine_ranks`]).
//!
//! All sums are checked: overflow is an error naming the field.

use serde::{Deserialize, Serialize};

use memplan_core::bytes::fmt_bytes;
use memplan_core::{Error, MemoryInfo, Result};

/// How much of the device the engine may use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Request {
    /// A fraction of the total, in (0, 1] (`--gpu-memory-utilization`).
    Utilization(f64),
    /// An absolute byte budget for everything (weights, activations, graphs, KV cache).
    Bytes(u64),
    /// The KV cache's own size is fixed (vLLM `--kv-cache-memory-bytes`): requested memory is
    /// the consumers plus this, and must fit in the total.
    KvCacheBytes(u64),
}

/// What the non-KV parts of the engine take, per rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumers {
    /// Model weights.
    pub weights: u64,
    /// Peak of the allocator during the profile run, above the weights.
    pub activation: u64,
    /// Growth of memory outside the allocator during start-up (library workspaces, NCCL).
    pub non_allocator: u64,
    /// Memory reserved for graph capture (0 when the engine runs eagerly or does not reserve).
    pub graph_reserve: u64,
}

impl Consumers {
    /// The sum, or an overflow error.
    pub fn total(&self) -> Result<u64> {
        [self.activation, self.non_allocator, self.graph_reserve]
            .iter()
            .try_fold(self.weights, |acc, v| acc.checked_add(*v))
            .ok_or_else(|| {
                Error::invalid(
                    "budget",
                    "weights + activation + non-allocator + graph reserve overflow 64 bits",
                )
            })
    }
}

/// Ways to pin the planned KV cache in an engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Suggestions {
    /// `--gpu-memory-utilization` giving the same KV budget in an engine that does not
    /// subtract a graph reserve: `(requested - graph_reserve) / total`, rounded down to 4
    /// decimals so the engine never gets more than planned. `None` when it would not be > 0.
    pub utilization_without_graph_reserve: Option<f64>,
    /// KV byte budget that fills the requested memory (`--kv-cache-memory-bytes`).
    pub kv_bytes_fill_requested: u64,
    /// KV byte budget that fills the whole device (utilisation 1.0; no headroom at all).
    pub kv_bytes_fill_device: u64,
}

/// The budget arithmetic of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Device total.
    pub total: u64,
    /// Memory the engine may use.
    pub requested: u64,
    /// What the non-KV parts take.
    pub consumers: Consumers,
    /// What is left for the KV cache.
    pub kv_budget: u64,
    /// Ways to pin it.
    pub suggestions: Suggestions,
}

impl Budget {
    /// The one-line memory bar over the device total, `cells` wide between brackets:
    /// `W` weights, `A` activation, `N` non-allocator, `G` graph reserve, `K` the KV cache of
    /// `kv_bytes`, `.` requested but unused, ` ` outside the request. Cells are rounded to the
    /// nearest and never overflow the bar.
    pub fn bar(&self, kv_bytes: u64, cells: u64) -> String {
        let t = u128::from(self.total.max(1));
        let to_cells = |b: u64| ((u128::from(b) * u128::from(cells) + t / 2) / t) as u64;
        let c = &self.consumers;
        let parts = [
            ('W', c.weights),
            ('A', c.activation),
            ('N', c.non_allocator),
            ('G', c.graph_reserve),
            ('K', kv_bytes),
        ];
        let mut s = String::from("[");
        let mut used = 0u64;
        for (ch, b) in parts {
            let n = to_cells(b).min(cells - used);
            s.extend(std::iter::repeat_n(ch, n as usize));
            used += n;
        }
        let requested = to_cells(self.requested).clamp(used, cells);
        s.extend(std::iter::repeat_n('.', (requested - used) as usize));
        s.extend(std::iter::repeat_n(' ', (cells - requested) as usize));
        s.push(']');
        s
    }
}

/// `requested` for a device of `total` bytes. Errors: utilisation outside (0, 1] or not a
/// number, a byte budget of 0 or above the total, a zero total. For
/// [`Request::KvCacheBytes`] this is the KV size alone; [`compute`] adds the consumers.
pub fn requested_bytes(total: u64, request: Request) -> Result<u64> {
    if total == 0 {
        return Err(Error::invalid("total-memory", "device total is 0 bytes"));
    }
    match request {
        Request::Utilization(u) => {
            if !(u.is_finite() && u > 0.0 && u <= 1.0) {
                return Err(Error::invalid(
                    "gpu-memory-utilization",
                    format!("{u} is outside (0, 1]"),
                ));
            }
            // ceil(total * u) with exact integer arithmetic when u has <= 9 decimals, so
            // 0.95 * 79.19 GiB is not off by one from float error.
            let scaled = (u * 1e9).round();
            if (scaled / 1e9 - u).abs() < 1e-15 {
                let num = u128::from(total) * scaled as u128;
                return u64::try_from(num.div_ceil(1_000_000_000))
                    .map_err(|_| Error::invalid("gpu-memory-utilization", "overflow"));
            }
            Ok(((total as f64) * u).ceil().min(total as f64) as u64)
        }
        Request::Bytes(b) | Request::KvCacheBytes(b) => {
            let field = if matches!(request, Request::Bytes(_)) {
                "memory-budget"
            } else {
                "kv-cache-memory-bytes"
            };
            if b == 0 {
                return Err(Error::invalid(field, "a byte budget of 0"));
            }
            if b > total {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{} is more than the device total {}",
                        fmt_bytes(b),
                        fmt_bytes(total)
                    ),
                ));
            }
            Ok(b)
        }
    }
}

/// The start-up check: fail when free memory is below `requested`, saying who holds the rest.
/// Readings that are absent are skipped (the check cannot be made), never taken as 0.
pub fn check_free(snapshot: &MemoryInfo, requested: u64, what: &str) -> Result<()> {
    let (Some(total), Some(free)) = (snapshot.driver.total, snapshot.driver.free) else {
        return Ok(());
    };
    if free >= requested {
        return Ok(());
    }
    let used = total.saturating_sub(free);
    let holders = match snapshot.allocator.reserved {
        Some(r) => format!(
            "{} is in use: {} held by this process's allocator, {} outside it (other processes, driver contexts, graphics)",
            fmt_bytes(used),
            fmt_bytes(r.min(used)),
            fmt_bytes(used.saturating_sub(r))
        ),
        None => format!("{} is in use by other processes, driver contexts or graphics (this process holds no allocator memory yet)", fmt_bytes(used)),
    };
    Err(Error::DoesNotFit(format!(
        "free memory on the device ({} of {}) is less than requested ({what}, {}); {holders}; lower the request or free the memory",
        fmt_bytes(free),
        fmt_bytes(total),
        fmt_bytes(requested)
    )))
}

/// The whole arithmetic of one rank. Errors: bad request (see [`requested_bytes`]), overflow,
/// and [`Error::DoesNotFit`] when the consumers exceed the requested memory (saying what
/// utilisation would fit, or by how much the device is too small).
pub fn compute(total: u64, request: Request, consumers: Consumers) -> Result<Budget> {
    let mut requested = requested_bytes(total, request)?;
    let used = consumers.total()?;
    if let Request::KvCacheBytes(kv) = request {
        requested = used.checked_add(kv).filter(|r| *r <= total).ok_or_else(|| {
            Error::DoesNotFit(format!(
                "a KV cache of {} plus {} for weights, activation, non-allocator memory and graphs exceeds the device total {}",
                fmt_bytes(kv),
                fmt_bytes(used),
                fmt_bytes(total)
            ))
        })?;
    }
    let Some(kv_budget) = requested.checked_sub(used) else {
        return Err(does_not_fit(total, requested, &consumers, used));
    };
    let without_graph = requested.saturating_sub(consumers.graph_reserve);
    let u = ((without_graph as f64 / total as f64) * 1e4).floor() / 1e4;
    Ok(Budget {
        total,
        requested,
        consumers,
        kv_budget,
        suggestions: Suggestions {
            utilization_without_graph_reserve: (u > 0.0).then_some(u),
            kv_bytes_fill_requested: kv_budget,
            kv_bytes_fill_device: total.saturating_sub(used),
        },
    })
}

fn does_not_fit(total: u64, requested: u64, c: &Consumers, used: u64) -> Error {
    let parts = format!(
        "weights {} + activation {} + non-allocator {} + graph reserve {} = {}",
        fmt_bytes(c.weights),
        fmt_bytes(c.activation),
        fmt_bytes(c.non_allocator),
        fmt_bytes(c.graph_reserve),
        fmt_bytes(used)
    );
    if used < total {
        // Smallest utilisation (4 decimals, rounded up) that leaves room for at least one byte.
        let u = (((used + 1) as f64 / total as f64) * 1e4).ceil() / 1e4;
        let hint = if u <= 1.0 {
            format!("--gpu-memory-utilization {u:.4} or more would leave room for a KV cache")
        } else {
            "even the whole device leaves no room for a KV cache".into()
        };
        Error::DoesNotFit(format!(
            "no memory left for the KV cache: {parts} exceeds the requested {} by {}; {hint}",
            fmt_bytes(requested),
            fmt_bytes(used - requested)
        ))
    } else {
        Error::DoesNotFit(format!(
            "the model does not fit on this device: {parts} exceeds the device total {} by {}; use more tensor-parallel ranks, a quantized model or a larger device",
            fmt_bytes(total),
            fmt_bytes(used - total)
        ))
    }
}

/// Combine the budgets of several ranks: the engine sizes every rank's cache like the smallest
/// one. Returns the index and budget of the limiting rank; an empty slice is an error.
pub fn combine_ranks(ranks: &[Budget]) -> Result<(usize, Budget)> {
    ranks
        .iter()
        .copied()
        .enumerate()
        .min_by_key(|(_, b)| b.kv_budget)
        .ok_or_else(|| Error::invalid("ranks", "no rank budgets to combine"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::bytes::{GIB, MIB};
    use memplan_core::{AllocatorMemory, DriverMemory};

    fn gib(x: f64) -> u64 {
        (x * GIB as f64).round() as u64
    }

    #[test]
    fn llama_8b_on_h100_matches_the_log() {
        // vLLM 0.19: 79.19 GiB x 0.95 - 17.12 GiB "total non KV cache memory" = 58.11 GiB (graph
        // not subtracted). The printed parts (14.99 + 1.89 + 0.25) sum to 17.13 because each is
        // rounded; values inside their rounding that sum to 17.12 reproduce the log.
        let c = Consumers {
            weights: gib(14.986),
            activation: gib(1.886),
            non_allocator: gib(0.248),
            graph_reserve: 0,
        };
        let b = compute(gib(79.19), Request::Utilization(0.95), c).unwrap();
        assert_eq!(format!("{:.2}", b.kv_budget as f64 / GIB as f64), "58.11");
        assert_eq!(b.suggestions.kv_bytes_fill_requested, b.kv_budget);
        assert_eq!(
            b.suggestions.kv_bytes_fill_device,
            gib(79.19) - c.total().unwrap()
        );
    }

    #[test]
    fn requested_is_the_ceiling() {
        assert_eq!(requested_bytes(10, Request::Utilization(0.95)).unwrap(), 10);
        assert_eq!(
            requested_bytes(100, Request::Utilization(0.95)).unwrap(),
            95
        );
        assert_eq!(requested_bytes(101, Request::Utilization(0.5)).unwrap(), 51);
        assert_eq!(
            requested_bytes(u64::MAX, Request::Utilization(1.0)).unwrap(),
            u64::MAX
        );
        assert_eq!(requested_bytes(1000, Request::Bytes(700)).unwrap(), 700);
    }

    #[test]
    fn bad_requests_name_the_flag() {
        for u in [0.0, -0.1, 1.01, f64::NAN, f64::INFINITY] {
            let e = requested_bytes(GIB, Request::Utilization(u))
                .unwrap_err()
                .to_string();
            assert!(e.contains("gpu-memory-utilization"), "{u}: {e}");
        }
        assert!(requested_bytes(GIB, Request::Bytes(2 * GIB))
            .unwrap_err()
            .to_string()
            .contains("memory-budget"));
        assert!(requested_bytes(GIB, Request::KvCacheBytes(0))
            .unwrap_err()
            .to_string()
            .contains("kv-cache-memory-bytes"));
        assert!(requested_bytes(0, Request::Utilization(0.9))
            .unwrap_err()
            .to_string()
            .contains("total-memory"));
        let c = Consumers {
            weights: u64::MAX,
            activation: 1,
            ..Default::default()
        };
        assert!(compute(GIB, Request::Utilization(0.9), c)
            .unwrap_err()
            .to_string()
            .contains("overflow"));
    }

    #[test]
    fn graph_reserve_and_its_equivalent_utilization() {
        let c = Consumers {
            weights: 10 * GIB,
            activation: GIB,
            non_allocator: 0,
            graph_reserve: GIB,
        };
        let b = compute(20 * GIB, Request::Utilization(0.9), c).unwrap();
        assert_eq!(b.kv_budget, gib(18.0) - 12 * GIB);
        // Without the reserve the engine needs 17 GiB of 20 requested: 0.85.
        assert_eq!(b.suggestions.utilization_without_graph_reserve, Some(0.85));
    }

    #[test]
    fn too_big_says_what_would_fit() {
        let c = Consumers {
            weights: 20 * GIB,
            activation: GIB,
            non_allocator: 0,
            graph_reserve: 0,
        };
        let e = compute(24 * GIB, Request::Utilization(0.8), c).unwrap_err();
        assert!(matches!(e, Error::DoesNotFit(_)));
        assert!(
            e.to_string().contains("--gpu-memory-utilization 0.8751"),
            "{e}"
        );
        let c = Consumers {
            weights: 30 * GIB,
            ..c
        };
        assert!(compute(24 * GIB, Request::Utilization(0.9), c)
            .unwrap_err()
            .to_string()
            .contains("does not fit on this device"));
    }

    #[test]
    fn early_check_names_who_holds_memory() {
        // DESIGN.md failure 2: 1.33 of 23.98 GiB free, 0.95 requested.
        let snap = |reserved| MemoryInfo {
            driver: DriverMemory {
                total: Some(gib(23.98)),
                free: Some(gib(1.33)),
            },
            allocator: AllocatorMemory {
                reserved,
                allocated: None,
                peak_allocated: None,
            },
            ..Default::default()
        };
        let req = requested_bytes(gib(23.98), Request::Utilization(0.95)).unwrap();
        let e = check_free(&snap(None), req, "0.95 of total")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("1.33 GiB of 23.98 GiB")
                && e.contains("22.78 GiB")
                && e.contains("22.65 GiB is in use"),
            "{e}"
        );
        let e = check_free(&snap(Some(20 * GIB)), req, "0.95")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("20.00 GiB held by this process") && e.contains("2.65 GiB outside"),
            "{e}"
        );
        let ok = MemoryInfo {
            driver: DriverMemory {
                total: Some(gib(23.98)),
                free: Some(23 * GIB),
            },
            ..Default::default()
        };
        assert!(check_free(&ok, req, "x").is_ok());
        // Absent free memory: the check cannot be made and does not invent a 0.
        assert!(check_free(&MemoryInfo::default(), req, "x").is_ok());
    }

    #[test]
    fn fixed_kv_size_adds_the_consumers() {
        let c = Consumers {
            weights: 10 * GIB,
            activation: GIB,
            non_allocator: 0,
            graph_reserve: 0,
        };
        let b = compute(24 * GIB, Request::KvCacheBytes(4 * GIB), c).unwrap();
        assert_eq!((b.requested, b.kv_budget), (15 * GIB, 4 * GIB));
        assert!(matches!(
            compute(24 * GIB, Request::KvCacheBytes(14 * GIB), c),
            Err(Error::DoesNotFit(_))
        ));
    }

    #[test]
    fn ranks_take_the_minimum() {
        let c = |w| Consumers {
            weights: w,
            activation: 0,
            non_allocator: 0,
            graph_reserve: 0,
        };
        let a = compute(GIB, Request::Bytes(GIB), c(100 * MIB)).unwrap();
        let b = compute(GIB, Request::Bytes(GIB), c(300 * MIB)).unwrap();
        let (i, m) = combine_ranks(&[a, b, a]).unwrap();
        assert_eq!((i, m.kv_budget), (1, GIB - 300 * MIB));
        assert!(combine_ranks(&[]).is_err());
    }

    #[test]
    fn budgets_never_exceed_the_request_or_go_negative() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..5000 {
            let total = 1 + next(200 * GIB);
            let request = match next(3) {
                0 => Request::Utilization(next(1_200_000) as f64 / 1e6),
                1 => Request::Bytes(next(total + GIB)),
                _ => Request::KvCacheBytes(next(total)),
            };
            let c = Consumers {
                weights: next(total),
                activation: next(4 * GIB),
                non_allocator: next(3 * GIB),
                graph_reserve: next(2 * GIB),
            };
            match compute(total, request, c) {
                Ok(b) => {
                    assert!(b.requested <= total, "{b:?}");
                    assert_eq!(b.kv_budget + c.total().unwrap(), b.requested);
                    assert!(b.suggestions.kv_bytes_fill_device >= b.kv_budget);
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }

    /// The same invariants at the edges the test above never reaches: totals and consumers of
    /// any magnitude up to `u64::MAX`, utilisations with more decimals than the exact integer
    /// path takes (the float path), and the exact ends 0, 1 and the total.
    #[test]
    fn budgets_hold_at_the_edges_of_u64() {
        let mut x = 0xD1B5_4A32_D192_ED03u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // A value of random magnitude: 0, the ends, or uniform below a random power of two.
        let mut any = move |r: u64, max: u64| match r % 8 {
            0 => 0,
            1 => max,
            2 => max.saturating_sub(r % 3),
            _ => {
                let bits = 1 + (r >> 8) % 64;
                (next() & (u64::MAX >> (64 - bits))).min(max)
            }
        };
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut r = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut planned = 0;
        for _ in 0..20_000 {
            let total = any(r(), u64::MAX).max(1);
            let util = match r() % 4 {
                0 => 1.0,
                1 => f64::from_bits(0x3FEF_FFFF_FFFF_FFFF), // the largest float below 1
                2 => (r() % 1_000_000_007) as f64 / 1_000_000_007.0,
                _ => (r() >> 11) as f64 / (1u64 << 53) as f64,
            };
            let request = match r() % 3 {
                0 => Request::Utilization(util),
                1 => Request::Bytes(any(r(), total)),
                _ => Request::KvCacheBytes(any(r(), total)),
            };
            // Mostly within a quarter of the total each (so many budgets fit), sometimes of
            // any size up to u64::MAX (so the sums overflow).
            let mut part = |r1: u64, r2: u64| {
                any(
                    r2,
                    if r1.is_multiple_of(8) {
                        u64::MAX
                    } else {
                        total / 4
                    },
                )
            };
            let c = Consumers {
                weights: part(r(), r()),
                activation: part(r(), r()),
                non_allocator: part(r(), r()),
                graph_reserve: part(r(), r()),
            };
            match compute(total, request, c) {
                Ok(b) => {
                    assert!(b.requested <= total, "{request:?} {b:?}");
                    assert_eq!(
                        b.kv_budget.checked_add(c.total().unwrap()),
                        Some(b.requested)
                    );
                    assert!(b.suggestions.kv_bytes_fill_device >= b.kv_budget);
                    if let Request::Utilization(u) = request {
                        // Never more than the request: ceil(total * u), within float rounding.
                        let exact = (total as f64 * u).ceil();
                        assert!(
                            b.requested as f64 <= exact * (1.0 + 1e-15) + 1.0,
                            "{u} {b:?}"
                        );
                    }
                    assert_eq!(b.bar(0, 60).chars().count(), 62);
                    planned += 1;
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
        // The invariants above were exercised, not only the errors.
        assert!(planned > 2_000, "{planned} budgets computed");
    }
}
