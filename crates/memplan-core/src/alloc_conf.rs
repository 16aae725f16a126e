//! The engine's caching-allocator configuration: the options of PyTorch's allocator that change
//! how the KV cache's tensors round and share segments, parsed from the option string an engine
//! runs with (`PYTORCH_ALLOC_CONF`, or the older `PYTORCH_CUDA_ALLOC_CONF` and
//! `PYTORCH_HIP_ALLOC_CONF`).
//!
//! Read from PyTorch's own source:
//! - the option string: `c10/core/AllocatorConfig.h` (`ConfigTokenizer`: tokens split at `,`
//!   `:` `[` `]`, whitespace dropped; `key:value` pairs separated by `,`, a list value in
//!   `[...]`) and `c10/core/AllocatorConfig.cpp` (`AcceleratorAllocatorConfig::parseArgs` and
//!   its `parse*` helpers), at commit 0ac716637f3258efcaf7fdfb851bdd520c9c1441;
//! - which variable wins: `AcceleratorAllocatorConfig::instance()` there reads
//!   `PYTORCH_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_HIP_ALLOC_CONF` (the two
//!   older names deprecated), the first one set (even to an empty string) and only that one;
//! - what each option does to an allocation: `c10/cuda/CUDACachingAllocator.cpp` at commit
//!   001074d25084fdb87a799823e395a50f5ec044d3 (`round_size`, `roundup_power2_next_division`,
//!   `get_allocation_size`, `should_split`, `get_free_block`, `alloc_block`,
//!   `find_expandable_block`, `try_allocate_expandable_block`, `ExpandableSegment::map`).
//!
//! Options by release: `expandable_segments`, `max_split_size_mb`, `roundup_power2_divisions`
//! (one number; the `[interval:divisions,...,>:divisions]` list form in later releases),
//! `garbage_collection_threshold`, `backend` are in every release memplan knows;
//! `max_non_split_rounding_mb` came later (it is in `AllocatorConfig.cpp` at 0ac71663);
//! `large_segment_size_mb` (the 20 MiB segment of mid-sized requests, `kLargeBuffer` before it)
//! is newer still: it is not in `AllocatorConfig.cpp` at 0ac71663 and is parsed by
//! `AcceleratorAllocatorConfig::parseLargeSegmentSize` on PyTorch's main branch afterwards
//! (which then takes it for `get_allocation_size`'s mid-sized segment). An engine on an older
//! release that sets it gets an error from PyTorch ("Unrecognized key"); memplan takes it as
//! given.
//!
//! This parser is stricter than PyTorch's in one way (a malformed value is an error naming its
//! key, never a silently different setting) and looser in another: keys it does not know are
//! kept and noted, not refused, since they do not change the KV cache's footprint (PyTorch's
//! own keys for pinned host memory, the lock around device allocation, a vendor fork's own).

use std::ffi::OsString;
use std::fmt;
use std::num::IntErrorKind;

use crate::bytes::MIB;
use crate::error::{Error, Result};

/// The environment variables PyTorch reads its allocator configuration from, the one that wins
/// first (`AcceleratorAllocatorConfig::instance()`, `c10/core/AllocatorConfig.cpp`).
pub const ALLOC_CONF_VARS: [&str; 3] = [
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
];

/// Size intervals `roundup_power2_divisions` sets divisions for: index 0 is every request
/// below 2 MiB, index `k` the requests in `[2^k MiB, 2^(k+1) MiB)`, the last one everything
/// from 32 GiB (`kRoundUpPowerOfTwoIntervals`, `AcceleratorAllocatorConfig::
/// roundup_power2_divisions(size)`).
pub const POWER2_INTERVALS: usize = 16;

/// The largest `max_split_size_mb`, `max_non_split_rounding_mb` or `large_segment_size_mb`
/// taken (1 PiB in MiB): past it a value is a typo, not a setting.
const MAX_MB: u64 = 1 << 30;
/// The most divisions of one power-of-two interval taken: past it every request is rounded to
/// 512 bytes anyway (`round_size` rounds by divisions only above `512 * divisions`).
const MAX_DIVISIONS: u32 = 1 << 20;
/// The largest interval boundary of `roundup_power2_divisions` (64 GiB in MiB, where PyTorch's
/// intervals end, `kRoundUpPowerOfTwoEnd`).
const MAX_BOUNDARY_MB: u64 = 1 << 16;

/// The field errors of this module name.
const FIELD: &str = "allocator configuration";

/// The options of an engine's caching allocator (PyTorch's) that change the KV cache's
/// footprint, and the rest of the option string as given. [`Default`] is PyTorch's default
/// configuration (no option set). Parse one with [`AllocatorConfig::parse`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AllocatorConfig {
    /// `expandable_segments:True`: one segment per stream and pool that grows by mapping pages
    /// (2 MiB for requests up to 1 MiB, 20 MiB for larger ones), every request split off it.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in bytes: a cached block this large or larger is never split, and
    /// never serves a smaller request. `None`: unlimited (the default).
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions`, per size interval ([`POWER2_INTERVALS`]): a request is
    /// rounded up to the next of this many equal steps between two powers of two (0 or 1:
    /// not rounded so).
    pub roundup_power2_divisions: [u32; POWER2_INTERVALS],
    /// `large_segment_size_mb`, in bytes: the segment requests over 1 MiB and under 10 MiB
    /// share. `None`: 20 MiB (`kLargeBuffer`).
    pub large_segment_size: Option<u64>,
    /// `garbage_collection_threshold`, in (0, 1): when cached blocks are given back. Does not
    /// change what the KV cache's tensors take.
    pub garbage_collection_threshold: Option<f64>,
    /// `max_non_split_rounding_mb`, in bytes: how much larger a cached unsplittable block may
    /// be and still serve a request. Does not change what new segments take.
    pub max_non_split_rounding: Option<u64>,
    /// `backend`: `native` (the caching allocator, `None`) or the driver's asynchronous pool
    /// (`cudaMallocAsync`, `hipMallocAsync`), whose rounding is the driver's own.
    pub backend: Option<String>,
    /// Every other `key:value` as given, in order: options that do not change the KV cache's
    /// footprint (or that memplan does not know).
    pub other: Vec<(String, String)>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            expandable_segments: false,
            max_split_size: None,
            roundup_power2_divisions: [0; POWER2_INTERVALS],
            large_segment_size: None,
            garbage_collection_threshold: None,
            max_non_split_rounding: None,
            backend: None,
            other: Vec::new(),
        }
    }
}

/// One value of the option string: a token, or a bracketed list of tokens.
enum Value {
    One(String),
    List(Vec<String>),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::One(s) => s.clone(),
            Value::List(v) => format!("[{}]", v.join("")),
        }
    }
}

fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for c in s.chars() {
        if matches!(c, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(c.to_string());
        } else if !c.is_whitespace() {
            buf.push(c);
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

fn bad(key: &str, why: impl fmt::Display) -> Error {
    Error::invalid(FIELD, format!("`{key}`: {why}"))
}

/// `v` as a whole number. One made only of digits but too long for 64 bits is a whole number,
/// too large: it is refused saying so and giving `limit`, the most `key` takes there (the
/// limit of a number that fits is each caller's own check, worded by [`too_large`] alike).
fn number(key: &str, v: &str, limit: &str) -> Result<u64> {
    v.parse::<u64>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => too_large(key, v, limit),
        _ => bad(key, format!("`{v}` is not a whole number")),
    })
}

/// `key`'s value `v` is past `limit` (worded with its unit: `1073741824 MB (1 PiB)`).
fn too_large(key: &str, v: impl fmt::Display, limit: &str) -> Error {
    bad(key, format!("{v} is too large: at most {limit}"))
}

/// [`MAX_MB`] in words, for messages.
fn max_mb() -> String {
    format!("{MAX_MB} MB (1 PiB)")
}

fn one<'v>(key: &str, v: &'v Value) -> Result<&'v str> {
    match v {
        Value::One(s) => Ok(s),
        Value::List(_) => Err(bad(key, "takes one value, not a list")),
    }
}

fn megabytes(key: &str, v: &Value, above: u64) -> Result<u64> {
    let n = number(key, one(key, v)?, &max_mb())?;
    if n < above {
        return Err(bad(
            key,
            format!("{n} MB is below {above} MB, the least PyTorch takes"),
        ));
    }
    if n > MAX_MB {
        return Err(too_large(key, format_args!("{n} MB"), &max_mb()));
    }
    Ok(n * MIB)
}

fn divisions(key: &str, v: &str, zero_ok: bool) -> Result<u32> {
    let limit = format!("{MAX_DIVISIONS} divisions");
    let n = number(key, v, &limit)?;
    if n == 0 && zero_ok {
        return Ok(0);
    }
    if !n.is_power_of_two() {
        return Err(bad(
            key,
            format!(
                "{n} divisions: divisions are a power of two{}",
                if zero_ok { " (or 0)" } else { "" }
            ),
        ));
    }
    u32::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_DIVISIONS)
        .ok_or_else(|| too_large(key, format_args!("{n} divisions"), &limit))
}

/// Of two division counts for one interval, the one that rounds a request more: 0 or 1 round
/// only to 512 bytes, and of two counts above 1 the smaller has the larger steps.
fn coarser(a: u32, b: u32) -> u32 {
    match (a > 1, b > 1) {
        (true, true) => a.min(b),
        (true, false) => a,
        _ => b,
    }
}

/// `roundup_power2_divisions`: one number for every interval, or `[MB:n,...,>:n]`, as
/// `AcceleratorAllocatorConfig::parseRoundUpPower2Divisions` reads them: the first boundary's
/// value also fills the intervals below it, `>` fills those after the last boundary (and the
/// last boundary's own interval where that rounds more: older releases fill it too).
fn power2(key: &str, v: &Value) -> Result<[u32; POWER2_INTERVALS]> {
    let items = match v {
        Value::One(s) => return Ok([divisions(key, s, false)?; POWER2_INTERVALS]),
        Value::List(items) => items,
    };
    let mut out = [0u32; POWER2_INTERVALS];
    let (mut first, mut last) = (true, 0usize);
    let mut i = 0;
    if items.is_empty() {
        return Err(bad(key, "an empty list"));
    }
    while i < items.len() {
        let (Some(at), Some(colon), Some(n)) = (items.get(i), items.get(i + 1), items.get(i + 2))
        else {
            return Err(bad(key, "a list item is `MB:divisions` or `>:divisions`"));
        };
        if colon != ":" {
            return Err(bad(key, format!("expected `:` after `{at}`")));
        }
        let n = divisions(key, n, true)?;
        if at == ">" {
            // Releases differ on the interval of the last boundary before `>` (the first
            // interval where none comes before it): `AcceleratorAllocatorConfig` fills from
            // the one after it (`last_index + 1`), the older `CUDAAllocatorConfig` from that
            // interval itself (`last_index`). Which release the engine runs is not known, so
            // that interval takes whichever of the two rounds a request more.
            out[last] = coarser(out[last], n);
            out.iter_mut().skip(last + 1).for_each(|d| *d = n);
        } else {
            let mb = number(key, at, &format!("{MAX_BOUNDARY_MB} MB"))?;
            if !mb.is_power_of_two() || mb > MAX_BOUNDARY_MB {
                return Err(bad(
                    key,
                    format!(
                        "interval {mb} MB: intervals are powers of two up to {MAX_BOUNDARY_MB} MB"
                    ),
                ));
            }
            let index = (mb.trailing_zeros() as usize).min(POWER2_INTERVALS - 1);
            if first {
                out.iter_mut().take(index).for_each(|d| *d = n);
                first = false;
            }
            out[index] = n;
            last = index;
        }
        i += 3;
        match items.get(i).map(String::as_str) {
            None => {}
            Some(",") => i += 1,
            Some(t) => return Err(bad(key, format!("expected `,` or `]`, found `{t}`"))),
        }
    }
    Ok(out)
}

impl AllocatorConfig {
    /// Parse a PyTorch allocator option string (`expandable_segments:True,max_split_size_mb:512`;
    /// the empty string is the default configuration). A malformed string, a malformed or
    /// out-of-range value of an option that changes the KV footprint, is an
    /// [`Error::InvalidInput`] naming the key; keys memplan does not know are kept in
    /// [`other`](Self::other). A key given twice takes its last value, as in PyTorch.
    pub fn parse(s: &str) -> Result<Self> {
        let t = tokens(s);
        let mut conf = AllocatorConfig::default();
        let mut i = 0;
        while i < t.len() {
            let key = t[i].as_str();
            if matches!(key, "," | ":" | "[" | "]") {
                return Err(Error::invalid(
                    FIELD,
                    format!("expected an option name, found `{key}` in `{s}`"),
                ));
            }
            if t.get(i + 1).map(String::as_str) != Some(":") {
                return Err(bad(key, "expected `key:value`"));
            }
            i += 2;
            let value = match t.get(i).map(String::as_str) {
                None | Some(",") | Some(":") | Some("]") => return Err(bad(key, "no value")),
                Some("[") => {
                    let end = t[i..]
                        .iter()
                        .position(|x| x == "]")
                        .ok_or_else(|| bad(key, "a list without its closing `]`"))?;
                    let list = t[i + 1..i + end].to_vec();
                    if list.iter().any(|x| x == "[") {
                        return Err(bad(key, "a list inside a list"));
                    }
                    i += end;
                    Value::List(list)
                }
                Some(v) => Value::One(v.to_string()),
            };
            conf.set(key, &value)?;
            i += 1;
            match t.get(i).map(String::as_str) {
                None => {}
                // A trailing `,` ends the string, as in PyTorch's parser.
                Some(",") => i += 1,
                Some(x) => {
                    return Err(bad(
                        key,
                        format!("expected `,` after its value, found `{x}`"),
                    ))
                }
            }
        }
        Ok(conf)
    }

    fn set(&mut self, key: &str, v: &Value) -> Result<()> {
        match key {
            "expandable_segments" => {
                self.expandable_segments = match one(key, v)? {
                    "True" => true,
                    "False" => false,
                    x => return Err(bad(key, format!("`{x}`: PyTorch takes `True` or `False`"))),
                }
            }
            // `parseMaxSplitSize`: at least `kLargeBuffer` (20 MB).
            "max_split_size_mb" => self.max_split_size = Some(megabytes(key, v, 20)?),
            // `parseMaxNonSplitRoundingSize`: at least 20 MB too.
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding = Some(megabytes(key, v, 20)?)
            }
            // `parseLargeSegmentSize`: more than `kMinLargeAlloc` (10 MB).
            "large_segment_size_mb" => self.large_segment_size = Some(megabytes(key, v, 11)?),
            "roundup_power2_divisions" => self.roundup_power2_divisions = power2(key, v)?,
            "garbage_collection_threshold" => {
                let x = one(key, v)?;
                let f: f64 = x
                    .parse()
                    .map_err(|_| bad(key, format!("`{x}` is not a number")))?;
                if !(f > 0.0 && f < 1.0) {
                    return Err(bad(key, format!("{x} is outside (0, 1)")));
                }
                self.garbage_collection_threshold = Some(f);
            }
            "backend" => {
                let x = one(key, v)?;
                if x == "native" {
                    self.backend = None;
                } else if x.ends_with("MallocAsync") && x.len() > "MallocAsync".len() {
                    self.backend = Some(x.to_string());
                } else {
                    return Err(bad(
                        key,
                        format!("`{x}`: native or the driver's `...MallocAsync`"),
                    ));
                }
            }
            _ => {
                let text = v.text();
                match self.other.iter_mut().find(|(k, _)| k == key) {
                    Some(kv) => kv.1 = text,
                    None => self.other.push((key.to_string(), text)),
                }
            }
        }
        Ok(())
    }

    /// Read the configuration the way PyTorch does: the first of [`ALLOC_CONF_VARS`] that
    /// `get` finds set (even to an empty string) wins and is parsed; `Ok(None)` where none is
    /// set. Returns the configuration and the variable it came from. `get` is
    /// `std::env::var_os` for this process's environment ([`Self::from_env`]): a value that
    /// is not UTF-8 is set (PyTorch takes it, and it hides the variables after it), so it is an
    /// error naming the variable, never read as unset.
    pub fn from_vars(
        get: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Option<(Self, &'static str)>> {
        for var in ALLOC_CONF_VARS {
            if let Some(v) = get(var) {
                let v = v.into_string().map_err(|v| {
                    Error::invalid(
                        var,
                        format!(
                            "{v:?} is not UTF-8 text (PyTorch's option string is `key:value,...`)"
                        ),
                    )
                })?;
                let conf = Self::parse(&v).map_err(|e| match e {
                    Error::InvalidInput { message, .. } => Error::invalid(var, message),
                    e => e,
                })?;
                return Ok(Some((conf, var)));
            }
        }
        Ok(None)
    }

    /// [`Self::from_vars`] over this process's environment.
    pub fn from_env() -> Result<Option<(Self, &'static str)>> {
        Self::from_vars(|v| std::env::var_os(v))
    }

    /// The segment requests over 1 MiB and under 10 MiB share (`large_segment_size_mb`, else
    /// 20 MiB: `get_allocation_size`).
    pub fn mid_segment(&self) -> u64 {
        self.large_segment_size.unwrap_or(20 * MIB)
    }

    /// Divisions `roundup_power2_divisions` sets for a request of `bytes`
    /// (`AcceleratorAllocatorConfig::roundup_power2_divisions(size)`).
    pub fn divisions_for(&self, bytes: u64) -> u32 {
        let log = 63 - bytes.max(1).leading_zeros() as usize;
        let index = log.saturating_sub(20).min(POWER2_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }

    /// Whether the configuration is PyTorch's default as far as the KV cache's footprint goes
    /// (options that do not change it aside).
    pub fn footprint_is_default(&self) -> bool {
        let d = AllocatorConfig::default();
        self.expandable_segments == d.expandable_segments
            && self.max_split_size == d.max_split_size
            && self.large_segment_size == d.large_segment_size
            && self.backend == d.backend
            && self.roundup_power2_divisions.iter().all(|n| *n <= 1)
    }
}

impl fmt::Display for AllocatorConfig {
    /// The configuration as an option string PyTorch reads (every option set, in a fixed
    /// order; the empty string for the default).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(b) = &self.backend {
            parts.push(format!("backend:{b}"));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if let Some(m) = self.large_segment_size {
            parts.push(format!("large_segment_size_mb:{}", m / MIB));
        }
        if let Some(m) = self.max_non_split_rounding {
            parts.push(format!("max_non_split_rounding_mb:{}", m / MIB));
        }
        let d = &self.roundup_power2_divisions;
        if d.iter().all(|n| *n == d[0]) {
            if d[0] != 0 {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            }
        } else {
            let list: Vec<String> = d
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{}:{n}", 1u64 << i))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
        }
        if let Some(g) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{g}"));
        }
        parts.extend(self.other.iter().map(|(k, v)| format!("{k}:{v}")));
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        AllocatorConfig::parse(s).expect_err(s).to_string()
    }

    #[test]
    fn the_empty_string_is_the_default() {
        assert_eq!(
            AllocatorConfig::parse("").unwrap(),
            AllocatorConfig::default()
        );
        assert_eq!(
            AllocatorConfig::parse("  ").unwrap(),
            AllocatorConfig::default()
        );
        assert!(AllocatorConfig::default().footprint_is_default());
        assert_eq!(AllocatorConfig::default().to_string(), "");
        assert_eq!(AllocatorConfig::default().mid_segment(), 20 * MIB);
    }

    #[test]
    fn options_that_change_the_footprint() {
        let c = AllocatorConfig::parse(
            "expandable_segments:True, max_split_size_mb:512,large_segment_size_mb:64,roundup_power2_divisions:4",
        )
        .unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, Some(512 * MIB));
        assert_eq!(c.mid_segment(), 64 * MIB);
        assert_eq!(c.divisions_for(3 * MIB), 4);
        assert!(!c.footprint_is_default());
        // The canonical string reads back to the same configuration.
        assert_eq!(AllocatorConfig::parse(&c.to_string()).unwrap(), c);
        let off = AllocatorConfig::parse("expandable_segments:False,garbage_collection_threshold:0.6,max_non_split_rounding_mb:40").unwrap();
        assert!(off.footprint_is_default());
        assert_eq!(off.garbage_collection_threshold, Some(0.6));
        assert_eq!(AllocatorConfig::parse(&off.to_string()).unwrap(), off);
    }

    #[test]
    fn divisions_by_interval_as_pytorch_reads_them() {
        // `[64:8,128:2,256:4,512:2,1024:4,>:1]`, PyTorch's own test of the parser
        // (`c10/test/core/AllocatorConfig_test.cpp`): 8 below 128 MB, then each interval's.
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
                .unwrap();
        assert_eq!(c.divisions_for(32 * MIB), 8);
        assert_eq!(c.divisions_for(64 * MIB), 8);
        assert_eq!(c.divisions_for(128 * MIB), 2);
        assert_eq!(c.divisions_for(256 * MIB), 4);
        assert_eq!(c.divisions_for(512 * MIB), 2);
        assert_eq!(c.divisions_for(1024 * MIB), 4);
        assert_eq!(c.divisions_for(2048 * MIB), 1);
        assert_eq!(c.divisions_for(100), 8);
        assert_eq!(AllocatorConfig::parse(&c.to_string()).unwrap(), c);
        // Requests under 2 MiB share the first interval.
        assert_eq!(c.divisions_for(MIB + 1), c.divisions_for(MIB / 2));
    }

    #[test]
    fn the_interval_releases_disagree_on_takes_the_coarser_rounding() {
        // `[64:8,>:2]`: PyTorch's `AcceleratorAllocatorConfig` gives 64-128 MB 8 divisions and
        // everything above 2; the older `CUDAAllocatorConfig` (`last_index`, not
        // `last_index + 1`) gives 64-128 MB 2 as well. A 100 MiB request is 104 MiB with 8
        // divisions but 128 MiB with 2: the plan takes 2 there.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[64:8,>:2]").unwrap();
        assert_eq!(c.divisions_for(32 * MIB), 8);
        assert_eq!(c.divisions_for(100 * MIB), 2);
        assert_eq!(c.divisions_for(300 * MIB), 2);
        // A `>` that rounds less leaves the boundary's own value, as the newer release reads it.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[64:8,128:2,>:1]").unwrap();
        assert_eq!(c.divisions_for(130 * MIB), 2);
        assert_eq!(c.divisions_for(300 * MIB), 1);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[256:0,>:4]").unwrap();
        assert_eq!(c.divisions_for(300 * MIB), 4);
        // `>` alone: every interval (the older release fills the first too).
        let c = AllocatorConfig::parse("roundup_power2_divisions:[>:4]").unwrap();
        assert_eq!(c.divisions_for(100), 4);
        assert_eq!(c.divisions_for(100 * MIB), 4);
        assert_eq!(AllocatorConfig::parse(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn a_trailing_comma_ends_the_string_as_in_pytorch() {
        // PyTorch's parser reads a `,` after the last value and stops there.
        let c = AllocatorConfig::parse("expandable_segments:True,").unwrap();
        assert!(c.expandable_segments);
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb:64 , ")
                .unwrap()
                .max_split_size,
            Some(64 * MIB)
        );
        assert!(err(",").contains("option name"));
    }

    #[test]
    fn unknown_keys_are_kept() {
        let c = AllocatorConfig::parse(
            "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,vendor_knob:[1,2]",
        )
        .unwrap();
        assert!(c.footprint_is_default());
        assert_eq!(
            c.other,
            vec![
                (
                    "pinned_use_cuda_host_register".to_string(),
                    "True".to_string()
                ),
                ("pinned_num_register_threads".to_string(), "8".to_string()),
                ("vendor_knob".to_string(), "[1,2]".to_string()),
            ]
        );
        assert_eq!(
            c.to_string(),
            "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,vendor_knob:[1,2]"
        );
    }

    #[test]
    fn malformed_input_names_the_key() {
        for (s, key) in [
            ("expandable_segments:true", "expandable_segments"),
            ("expandable_segments:1", "expandable_segments"),
            ("expandable_segments", "expandable_segments"),
            ("expandable_segments:", "expandable_segments"),
            ("max_split_size_mb:19", "max_split_size_mb"),
            ("max_split_size_mb:-5", "max_split_size_mb"),
            ("max_split_size_mb:1.5", "max_split_size_mb"),
            ("max_split_size_mb:99999999999", "max_split_size_mb"),
            ("max_split_size_mb:[20]", "max_split_size_mb"),
            ("large_segment_size_mb:10", "large_segment_size_mb"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            ("roundup_power2_divisions:0", "roundup_power2_divisions"),
            (
                "roundup_power2_divisions:[64:3]",
                "roundup_power2_divisions",
            ),
            (
                "roundup_power2_divisions:[65:4]",
                "roundup_power2_divisions",
            ),
            ("roundup_power2_divisions:[64:4", "roundup_power2_divisions"),
            (
                "roundup_power2_divisions:[64;4]",
                "roundup_power2_divisions",
            ),
            ("roundup_power2_divisions:[]", "roundup_power2_divisions"),
            (
                "roundup_power2_divisions:[131072:4]",
                "roundup_power2_divisions",
            ),
            (
                "roundup_power2_divisions:4294967296",
                "roundup_power2_divisions",
            ),
            (
                "garbage_collection_threshold:1.0",
                "garbage_collection_threshold",
            ),
            (
                "garbage_collection_threshold:nan",
                "garbage_collection_threshold",
            ),
            (
                "garbage_collection_threshold:x",
                "garbage_collection_threshold",
            ),
            ("backend:fast", "backend"),
            (
                "expandable_segments:True max_split_size_mb:40",
                "expandable_segments",
            ),
        ] {
            let e = err(s);
            assert!(e.contains(&format!("`{key}`")), "{s}: {e}");
        }
        assert!(err("expandable_segments:True,,").contains("option name"));
        assert!(err(",expandable_segments:True").contains("option name"));
        assert!(err(":True").contains("option name"));
    }

    /// A number too long for 64 bits is still a whole number: every numeric key says it is
    /// too large and gives the most it takes, as it does for a number that fits but is past it.
    #[test]
    fn a_number_too_large_is_called_too_large_with_the_limit() {
        let huge = "99999999999999999999999";
        for (s, limit) in [
            (
                format!("max_split_size_mb:{huge}"),
                "at most 1073741824 MB (1 PiB)",
            ),
            (
                "max_split_size_mb:2000000000".into(),
                "at most 1073741824 MB (1 PiB)",
            ),
            (
                format!("max_non_split_rounding_mb:{huge}"),
                "at most 1073741824 MB",
            ),
            (
                format!("large_segment_size_mb:{huge}"),
                "at most 1073741824 MB",
            ),
            (
                format!("roundup_power2_divisions:{huge}"),
                "at most 1048576 divisions",
            ),
            (
                "roundup_power2_divisions:4294967296".into(),
                "at most 1048576 divisions",
            ),
            (
                format!("roundup_power2_divisions:[64:{huge}]"),
                "at most 1048576 divisions",
            ),
            (
                format!("roundup_power2_divisions:[{huge}:4]"),
                "at most 65536 MB",
            ),
        ] {
            let e = err(&s);
            assert!(
                e.contains("is too large") && e.contains(limit) && !e.contains("whole number"),
                "{s}: {e}"
            );
        }
        assert!(err(&format!("garbage_collection_threshold:{huge}")).contains("outside (0, 1)"));
        // Not digits: still not a whole number.
        for s in [
            "max_split_size_mb:-5",
            "max_split_size_mb:1.5",
            "roundup_power2_divisions:x",
        ] {
            assert!(err(s).contains("is not a whole number"), "{s}");
        }
    }

    #[test]
    fn the_first_variable_set_wins() {
        let vars = |set: &[(&str, &str)]| {
            let set: Vec<(String, String)> = set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |k: &str| {
                set.iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(AllocatorConfig::from_vars(vars(&[])).unwrap(), None);
        let (c, var) = AllocatorConfig::from_vars(vars(&[
            (ALLOC_CONF_VARS[1], "expandable_segments:True"),
            (ALLOC_CONF_VARS[2], "max_split_size_mb:40"),
        ]))
        .unwrap()
        .unwrap();
        assert!(c.expandable_segments && c.max_split_size.is_none());
        assert_eq!(var, ALLOC_CONF_VARS[1]);
        // Set but empty still wins, as in PyTorch: the default configuration.
        let (c, var) = AllocatorConfig::from_vars(vars(&[
            (ALLOC_CONF_VARS[0], ""),
            (ALLOC_CONF_VARS[1], "expandable_segments:True"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((c, var), (AllocatorConfig::default(), ALLOC_CONF_VARS[0]));
        // A malformed value names the variable.
        let e = AllocatorConfig::from_vars(vars(&[(ALLOC_CONF_VARS[2], "max_split_size_mb:1")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(ALLOC_CONF_VARS[2]) && e.contains("max_split_size_mb"),
            "{e}"
        );
    }

    /// A variable set to bytes that are not UTF-8 is set, as PyTorch sees it: an error naming
    /// it, not skipped for the next variable (which PyTorch would not read).
    #[cfg(unix)]
    #[test]
    fn a_variable_that_is_not_utf8_is_an_error_naming_it() {
        use std::os::unix::ffi::OsStringExt;
        let get = |k: &str| {
            (k == ALLOC_CONF_VARS[0] || k == ALLOC_CONF_VARS[1]).then(|| {
                if k == ALLOC_CONF_VARS[0] {
                    OsString::from_vec(b"expandable_segments:\xff".to_vec())
                } else {
                    OsString::from("expandable_segments:True")
                }
            })
        };
        let e = AllocatorConfig::from_vars(get).unwrap_err().to_string();
        assert!(e.contains(ALLOC_CONF_VARS[0]) && e.contains("UTF-8"), "{e}");
    }
}
