//! Vendor quirks as switchable behaviours, and the selector modifiers that switch them.
//!
//! Each field of [`Quirks`] reproduces one row of the vendor table in `DESIGN.md`. A profile
//! turns on the quirks its real platform has; a selector such as
//! `sim:rtx4090,stale-free=on,other=2GiB` changes them per device (see [`Modifiers`]).

use memplan_core::bytes::{parse_bytes, MIB};
use memplan_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The switchable behaviours of a simulated GPU. `Default` is a well-behaved discrete GPU
/// (every quirk off) with the framework behaviour `capture_empties_cache` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Quirks {
    /// Driver free counts only this process (ROCm <= 5.4 `hipMemGetInfo`): other processes and
    /// graphics allocations are invisible.
    pub free_process_local: bool,
    /// Driver free is device-wide but blind to graphics (DRM) allocations (ROCm >= 5.5).
    pub free_blind_to_graphics: bool,
    /// APU: total/free come from the VRAM aperture (`SimProfile::apu_aperture_bytes`), not from
    /// the GTT memory the GPU really uses: free is the aperture less the context and does not
    /// move when the process allocates (its memory lands in GTT).
    pub apu_wrong_pool: bool,
    /// Destroying a graph returns its memory only at the next synchronize (ROCm >= 6.2).
    pub deferred_graph_release: bool,
    /// Driver memory kept per capture by the runtime's fragment allocator and never returned
    /// (ROCm >= 6.2: about 4 MiB). 0 = none.
    pub hidden_bytes_per_capture: u64,
    /// Graph-pool attribute query is a stub returning 0 (ROCm 5.3 - 5.5.1).
    pub graph_pool_attrs_zero: bool,
    /// The platform has no graph-pool attribute query at all (Level Zero): readings are absent.
    pub no_graph_pool_query: bool,
    /// The runtime cannot record graph memory-allocation nodes (no stream-ordered allocation:
    /// HIP < 5.3 has no `hipMallocAsync`): recording one is `Error::Unsupported`, while
    /// capture itself works.
    pub no_graph_alloc_nodes: bool,
    /// Level Zero Sysman is not initialised: driver free cannot be read (absent, never 0).
    pub sysman_missing: bool,
    /// Level Zero Sysman's per-process query (`zesDeviceProcessesGetState`) lists this
    /// process's device memory (permitted for the caller's own processes): where Sysman's free
    /// reading cannot be used (integrated, free == total), the real backend composes a
    /// process-local free reading from it.
    pub sysman_processes: bool,
    /// Driver free always equals total (i915 Sysman for non-root users).
    pub free_equals_total: bool,
    /// NVIDIA's management library (`libnvidia-ml.so.1`) is absent or fails to initialise (a
    /// container without the driver's user-space libraries mounted): the CUDA backend then
    /// reads no second total of the device's memory. Without it, a CUDA profile's device-wide
    /// reading carries NVML's total, whatever the runtime's total reports.
    pub no_nvml: bool,
    /// Broken on purpose: driver free lags one synchronize behind (for the conformance suite).
    pub stale_free: bool,
    /// Driver free counted in steps of this many bytes (rounded down), 0 = to the byte: a
    /// reading declared exact that only moves in steps must fail calibration with sizes
    /// that are not multiples of common steps.
    pub free_step: u64,
    /// Broken on purpose: the driver's total (the reading and the descriptor) reports this
    /// many bytes more than the device has.
    pub total_over: u64,
    /// Broken on purpose: the driver's total reports this many bytes less than the device has.
    pub total_under: u64,
    /// Broken on purpose: every raw `free` keeps this many bytes of the allocation held for
    /// good (a leak the driver's books hide).
    pub leak_per_free: u64,
    /// Broken on purpose: every virtual-memory `destroy_physical` keeps this many bytes held
    /// for good.
    pub leak_per_vm_release: u64,
    /// Framework behaviour: entering an engine graph capture empties the allocator cache first
    /// (`torch.cuda.graph` does). On by default.
    pub capture_empties_cache: bool,
}

impl Quirks {
    /// A well-behaved platform: no quirk on, and the framework behaviour that entering
    /// capture empties the allocator cache.
    pub const NONE: Quirks = Quirks {
        free_process_local: false,
        free_blind_to_graphics: false,
        apu_wrong_pool: false,
        deferred_graph_release: false,
        hidden_bytes_per_capture: 0,
        graph_pool_attrs_zero: false,
        no_graph_pool_query: false,
        no_graph_alloc_nodes: false,
        sysman_missing: false,
        sysman_processes: false,
        free_equals_total: false,
        no_nvml: false,
        stale_free: false,
        free_step: 0,
        total_over: 0,
        total_under: 0,
        leak_per_free: 0,
        leak_per_vm_release: 0,
        capture_empties_cache: true,
    };
}

impl Default for Quirks {
    fn default() -> Self {
        Quirks::NONE
    }
}

/// The quirks that take a byte count (`QUIRK=BYTES`), in kebab-case.
pub const BYTE_QUIRK_NAMES: [&str; 6] = [
    "hidden-bytes-per-capture",
    "free-step",
    "total-over",
    "total-under",
    "leak-per-free",
    "leak-per-vm-release",
];

/// The boolean quirk names accepted in selectors, in kebab-case.
pub const QUIRK_NAMES: [&str; 13] = [
    "free-process-local",
    "free-blind-to-graphics",
    "apu-wrong-pool",
    "deferred-graph-release",
    "graph-pool-attrs-zero",
    "no-graph-pool-query",
    "no-graph-alloc-nodes",
    "sysman-missing",
    "sysman-processes",
    "free-equals-total",
    "no-nvml",
    "stale-free",
    "capture-empties-cache",
];

impl Quirks {
    fn flag_mut(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "free-process-local" => &mut self.free_process_local,
            "free-blind-to-graphics" => &mut self.free_blind_to_graphics,
            "apu-wrong-pool" => &mut self.apu_wrong_pool,
            "deferred-graph-release" => &mut self.deferred_graph_release,
            "graph-pool-attrs-zero" => &mut self.graph_pool_attrs_zero,
            "no-graph-pool-query" => &mut self.no_graph_pool_query,
            "no-graph-alloc-nodes" => &mut self.no_graph_alloc_nodes,
            "sysman-missing" => &mut self.sysman_missing,
            "sysman-processes" => &mut self.sysman_processes,
            "free-equals-total" => &mut self.free_equals_total,
            "no-nvml" => &mut self.no_nvml,
            "stale-free" => &mut self.stale_free,
            "capture-empties-cache" => &mut self.capture_empties_cache,
            _ => return None,
        })
    }

    /// The names of the quirks that are on (for descriptors and reports).
    pub fn active(&self) -> Vec<String> {
        let mut copy = *self;
        let mut v: Vec<String> = QUIRK_NAMES
            .iter()
            .filter(|n| copy.flag_mut(n).is_some_and(|b| *b))
            .map(|n| n.to_string())
            .collect();
        for (name, h) in self.byte_quirks() {
            if h > 0 {
                let shown = if h.is_multiple_of(MIB) {
                    format!("{}MiB", h / MIB)
                } else {
                    h.to_string()
                };
                v.push(format!("{name}={shown}"));
            }
        }
        v
    }

    /// The quirks that take a byte count, by selector name.
    fn byte_quirks(&self) -> [(&'static str, u64); 6] {
        let mut copy = *self;
        BYTE_QUIRK_NAMES.map(|n| (n, copy.bytes_mut(n).map_or(0, |b| *b)))
    }

    fn bytes_mut(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "hidden-bytes-per-capture" => &mut self.hidden_bytes_per_capture,
            "free-step" => &mut self.free_step,
            "total-over" => &mut self.total_over,
            "total-under" => &mut self.total_under,
            "leak-per-free" => &mut self.leak_per_free,
            "leak-per-vm-release" => &mut self.leak_per_vm_release,
            _ => return None,
        })
    }
}

/// What a selector's modifiers ask for, beyond the profile: `name,mod,mod...`.
///
/// Modifiers: `declare-exact` (declare every reading exact, keep the quirks: calibration must
/// catch it), `QUIRK=on|off` for each name in [`QUIRK_NAMES`], `QUIRK=BYTES` for each of
/// `hidden-bytes-per-capture`, `free-step`, `total-over`, `total-under`, `leak-per-free`,
/// `leak-per-vm-release`, `other=BYTES` (memory held by other processes), `graphics=BYTES`
/// (DRM allocations), `seed=N` (the draw of the device's physics),
/// `physics=low|high|nominal|draw` (every physical quantity at one end of its range, or at its
/// typical figure), `regime=world|adversarial|seed` (draw from the ranges of public evidence,
/// from the wider adversarial ones, or as the seed decides) and `world=DIR` (the device is
/// shared with the other processes that open it with the same `DIR`: [`crate::SimGpu`]'s
/// `shared_id`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Modifiers {
    /// Declare every reading exact while keeping the quirks.
    pub declare_exact: bool,
    /// Memory held by other processes at start.
    pub other_processes: Option<u64>,
    /// Graphics (DRM) allocations at start.
    pub graphics: Option<u64>,
    /// Seed of the device's physics (`seed=N`; [`crate::DEFAULT_SEED`] when absent).
    pub seed: Option<u64>,
    /// Pin every physical quantity to one end of its range (`physics=low|high|draw`).
    pub pin: crate::physics::Pin,
    /// The directory through which other processes share this device (`world=DIR`).
    pub world: Option<std::path::PathBuf>,
    /// The ranges drawn from (`regime=world|adversarial`; by the seed when absent).
    pub regime: crate::physics::Regime,
    /// The per-capture memory set explicitly (`hidden-bytes-per-capture=BYTES`): the device
    /// keeps exactly that, whatever the draw.
    pub hidden_bytes_per_capture: Option<u64>,
}

/// Split `name,mod,...` into the profile name, the quirks changed from `base` and the rest.
/// Each modifier may be given once: a repeated one (`seed=1,seed=2`) is an error naming it.
pub fn parse_selector(
    selector: &str,
    base: impl FnOnce(&str) -> Result<Quirks>,
) -> Result<(String, Quirks, Modifiers)> {
    let mut parts = selector.split(',').map(str::trim);
    let name = parts.next().unwrap_or_default().to_ascii_lowercase();
    let mut quirks = base(&name)?;
    let mut mods = Modifiers::default();
    // Each modifier as first written, by name: a second one is refused rather than the last
    // silently winning (`seed=1,seed=2` would plan with seed 2 and say nothing).
    let mut given: Vec<(String, &str)> = Vec::new();
    for m in parts {
        // A comma at the end or two in a row: said as such, not as an unknown modifier ``.
        if m.is_empty() {
            return Err(Error::invalid(
                "sim selector",
                format!(
                    "{selector:?} has an empty modifier (a comma at the end, or two in a row): \
                     remove the extra comma"
                ),
            ));
        }
        let bad = |msg: String| Error::invalid(format!("sim selector modifier `{m}`"), msg);
        let (key, value) = match m.split_once('=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), Some(v.trim())),
            None => (m.to_ascii_lowercase(), None),
        };
        if let Some((_, first)) = given.iter().find(|(k, _)| *k == key) {
            return Err(bad(format!(
                "`{key}` is given twice (`{first}` and `{m}`): give each modifier once"
            )));
        }
        given.push((key.clone(), m));
        match (key.as_str(), value) {
            ("declare-exact", None) => mods.declare_exact = true,
            ("other", Some(v)) => mods.other_processes = Some(parse_bytes("other", v)?),
            ("graphics", Some(v)) => mods.graphics = Some(parse_bytes("graphics", v)?),
            ("seed", Some(v)) => {
                mods.seed = Some(v.parse().map_err(|e: std::num::ParseIntError| {
                    // Digits past 64 bits are an unsigned integer, too large for a seed.
                    if *e.kind() == std::num::IntErrorKind::PosOverflow {
                        bad(format!("seed {v} is too large: at most {}", u64::MAX))
                    } else {
                        bad(format!("seed {v:?} is not an unsigned integer"))
                    }
                })?)
            }
            ("physics", Some(v)) => {
                mods.pin = match v.to_ascii_lowercase().as_str() {
                    "draw" => crate::physics::Pin::Draw,
                    "low" => crate::physics::Pin::Low,
                    "high" => crate::physics::Pin::High,
                    "nominal" => crate::physics::Pin::Nominal,
                    x => {
                        return Err(bad(format!(
                            "physics {x:?}: expected draw, low, high or nominal"
                        )))
                    }
                }
            }
            ("world", Some(v)) if !v.is_empty() => mods.world = Some(v.into()),
            ("regime", Some(v)) => {
                mods.regime = match v.to_ascii_lowercase().as_str() {
                    "world" => crate::physics::Regime::World,
                    "adversarial" => crate::physics::Regime::Adversarial,
                    "seed" => crate::physics::Regime::BySeed,
                    x => {
                        return Err(bad(format!(
                            "regime {x:?}: expected world, adversarial or seed"
                        )))
                    }
                }
            }
            ("hidden-bytes-per-capture", Some(v)) => {
                let b = parse_bytes("hidden-bytes-per-capture", v)?;
                quirks.hidden_bytes_per_capture = b;
                mods.hidden_bytes_per_capture = Some(b);
            }
            (k, Some(v)) if BYTE_QUIRK_NAMES.contains(&k) => {
                let b = parse_bytes(k, v)?;
                if let Some(q) = quirks.bytes_mut(k) {
                    *q = b;
                }
            }
            (k, v) => {
                let Some(flag) = quirks.flag_mut(k) else {
                    let mut known = vec![
                        "declare-exact",
                        "other",
                        "graphics",
                        "seed",
                        "physics",
                        "world",
                        "regime",
                    ];
                    known.extend(BYTE_QUIRK_NAMES.iter().copied());
                    known.extend(QUIRK_NAMES.iter().copied());
                    let hint = memplan_core::input::closest(k, &known)
                        .map(|c| format!("did you mean `{c}`? "))
                        .unwrap_or_default();
                    return Err(bad(format!(
                        "unknown modifier `{k}`; {hint}use declare-exact, other=BYTES, graphics=BYTES, \
                         seed=N, physics=low|high|draw|nominal, regime=world|adversarial|seed, world=DIR, hidden-bytes-per-capture|free-step|total-over|total-under|leak-per-free|leak-per-vm-release=BYTES or QUIRK=on|off with QUIRK one of {}",
                        QUIRK_NAMES.join(", ")
                    )));
                };
                *flag = match v.map(str::to_ascii_lowercase).as_deref() {
                    None | Some("on") | Some("true") | Some("1") => true,
                    Some("off") | Some("false") | Some("0") => false,
                    Some(_) => {
                        return Err(bad(format!(
                            "`{k}` is a quirk: its value is on or off, not {:?}",
                            v.unwrap_or_default()
                        )))
                    }
                };
            }
        }
    }
    Ok((name, quirks, mods))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_well_behaved_with_capture_flush() {
        let q = Quirks::default();
        assert_eq!(q.active(), vec!["capture-empties-cache".to_string()]);
    }

    #[test]
    fn parses_modifiers() {
        let (n, q, m) = parse_selector(
            "RTX4090, stale-free, capture-empties-cache=off,other=2GiB,declare-exact",
            |_| Ok(Quirks::default()),
        )
        .unwrap();
        assert_eq!(n, "rtx4090");
        assert!(q.stale_free && !q.capture_empties_cache);
        assert!(m.declare_exact);
        assert_eq!(m.other_processes, Some(2 << 30));
    }

    #[test]
    fn bad_modifiers_name_the_field() {
        let e = parse_selector("x,warp-drive", |_| Ok(Quirks::default()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`warp-drive`") && e.contains("stale-free"),
            "{e}"
        );
        let e = parse_selector("x,stale-free=maybe", |_| Ok(Quirks::default()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("on or off") && e.contains("\"maybe\""), "{e}");
        // A typo of a byte modifier is named, with the likely one, and the value is shown as
        // written.
        let e = parse_selector("x,ohter=2GiB", |_| Ok(Quirks::default()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown modifier `ohter`") && e.contains("did you mean `other`"),
            "{e}"
        );
        let e = parse_selector("x,other=lots", |_| Ok(Quirks::default()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("other"), "{e}");
        // A seed past 64 bits is a number, too large: said so, with the limit.
        let e = parse_selector("x,seed=99999999999999999999999", |_| Ok(Quirks::default()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is too large: at most 18446744073709551615")
                && !e.contains("not an unsigned integer"),
            "{e}"
        );
        let e = parse_selector("x,seed=-1", |_| Ok(Quirks::default()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an unsigned integer"), "{e}");
    }

    #[test]
    fn an_empty_modifier_is_named_as_such() {
        for selector in ["x,", "x,seed=1,", "x,,seed=1", "x, ,seed=1"] {
            let e = parse_selector(selector, |_| Ok(Quirks::default()))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("empty modifier") && !e.contains("unknown modifier"),
                "{selector}: {e}"
            );
        }
    }

    #[test]
    fn a_modifier_given_twice_is_refused_naming_it() {
        for (selector, key) in [
            ("x,seed=1,seed=2", "seed"),
            ("x,seed=1,physics=low,SEED = 1", "seed"),
            ("x,stale-free,stale-free=off", "stale-free"),
            ("x,declare-exact,declare-exact", "declare-exact"),
            ("x,other=1GiB,other=2GiB", "other"),
            ("x,free-step=2MiB,free-step=4MiB", "free-step"),
            (
                "x,hidden-bytes-per-capture=1MiB,hidden-bytes-per-capture=2MiB",
                "hidden-bytes-per-capture",
            ),
            ("x,physics=low,physics=high", "physics"),
            ("x,regime=world,regime=adversarial", "regime"),
            ("x,world=/a,world=/b", "world"),
        ] {
            let e = parse_selector(selector, |_| Ok(Quirks::default()))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("`{key}` is given twice")) && e.contains("once"),
                "{selector}: {e}"
            );
        }
        // Different modifiers, each once, still parse.
        let (_, q, m) = parse_selector("x,seed=1,physics=low,stale-free,free-step=2MiB", |_| {
            Ok(Quirks::default())
        })
        .unwrap();
        assert!(q.stale_free && m.seed == Some(1));
    }
}
