//! The fuzz targets of `fuzz/` (config, safetensors header, log reader, GGUF reader, Hugging
//! Face cache resolution) on the stable toolchain: each target's committed seeds (`fuzz/seeds/<target>/`) are mutated by a
//! seeded mutator (byte flips, boundary integers written over the bytes, insertions, cuts,
//! duplicated chunks, splices of two seeds) and fed to the same body the libFuzzer target runs
//! (`tests/fuzz_bodies/`). Checked on every input: no panic, at most [`PER_INPUT`] of time;
//! at the end, the process's peak memory.
//!
//! Runs: by default a short deterministic pass (a few hundred inputs per target, part of
//! `cargo test`); `MEMPLAN_FUZZ_SECONDS=N` runs each target for N seconds instead (the CI
//! fuzz step, `cargo xtask fuzz`); `MEMPLAN_FUZZ_SEED` picks another sequence. A failing input
//! is written to `target/fuzz-failures/<target>-<n>` for `cargo fuzz run <target> FILE`.

mod fuzz_bodies;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The longest one input may take (debug build, loaded CI machine): a reader that walks its
/// caps takes well under a second.
const PER_INPUT: Duration = Duration::from_secs(3);
/// Inputs per target in the default pass.
const DEFAULT_INPUTS: u64 = 300;

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Integers at the edges of what readers check, little-endian.
const EDGES: &[u64] = &[
    0,
    1,
    2,
    3,
    7,
    31,
    32,
    63,
    64,
    0xff,
    0x100,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 40,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];
/// Text that log lines and JSON put numbers in.
const TOKENS: &[&str] = &[
    "18446744073709551615",
    "99999999999999999999",
    "-1",
    "1e308",
    "NaN",
    "inf",
    "0.90.",
    " GiB",
    " MiB",
    " TiB",
    ",",
    "\n",
    "=",
    ": ",
    "[0]",
];

fn mutate(r: &mut Rng, seeds: &[Vec<u8>], input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + r.below(4) {
        let i = r.below(v.len() + 1);
        match r.below(8) {
            0 if !v.is_empty() => {
                let j = i.min(v.len() - 1);
                v[j] ^= 1 << r.below(8);
            }
            1 => {
                let e = EDGES[r.below(EDGES.len())].to_le_bytes();
                let w = [1, 2, 4, 8][r.below(4)];
                for (k, b) in e.iter().take(w).enumerate() {
                    if let Some(x) = v.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            2 => {
                let t = TOKENS[r.below(TOKENS.len())].as_bytes();
                v.splice(i..i, t.iter().copied());
            }
            3 => v.truncate(i),
            4 if !v.is_empty() => {
                let j = r.below(v.len());
                let (a, b) = (i.min(j), i.max(j).min(v.len()));
                let chunk = v[a..b].to_vec();
                v.splice(a..a, chunk);
            }
            5 if !v.is_empty() => {
                let j = r.below(v.len());
                let end = (j + 1 + r.below(16)).min(v.len());
                v.drain(j..end);
            }
            6 => {
                // Splice a piece of another seed.
                let other = &seeds[r.below(seeds.len())];
                if !other.is_empty() {
                    let a = r.below(other.len());
                    let b = (a + r.below(256)).min(other.len());
                    v.splice(i..i, other[a..b].iter().copied());
                }
            }
            _ => v.push(r.next() as u8),
        }
        if v.len() > 1 << 20 {
            v.truncate(1 << 20);
        }
    }
    v
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out.into_iter().map(|(_, b)| b).collect()
}

fn save(target: &str, n: u64, input: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{target}-{n}"));
    std::fs::write(&p, input).unwrap();
    p
}

/// Run one target: the seeds as they are, then mutated inputs. Returns how many ran.
fn drive(target: &str, body: fn(&[u8])) -> u64 {
    let seeds = seeds(target);
    let secs: Option<u64> = std::env::var("MEMPLAN_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let seed: u64 = std::env::var("MEMPLAN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6675_7a7a);
    let mut r = Rng(seed ^ target.len() as u64);
    let start = Instant::now();
    let mut n = 0u64;
    let mut failures = Vec::new();
    loop {
        let done = match secs {
            Some(s) => start.elapsed() >= Duration::from_secs(s),
            None => n >= DEFAULT_INPUTS + seeds.len() as u64,
        };
        if done {
            break;
        }
        let input = match seeds.get(n as usize) {
            Some(s) => s.clone(),
            None => {
                let base = seeds[r.below(seeds.len())].clone();
                mutate(&mut r, &seeds, &base)
            }
        };
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| body(&input)));
        let took = t.elapsed();
        if let Err(p) = outcome {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {msg}", save(target, n, &input).display()));
        } else if took > PER_INPUT {
            failures.push(format!(
                "{}: took {took:?}",
                save(target, n, &input).display()
            ));
        }
        n += 1;
    }
    assert!(
        failures.is_empty(),
        "{target}: {} failing input(s) of {n}:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "{target}: {n} inputs in {:.1} s, no failure",
        start.elapsed().as_secs_f64()
    );
    n
}

/// Peak resident memory of this process (Linux `VmHWM`), bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn fuzz_targets_on_the_stable_toolchain() {
    // One test: the targets run one after the other, so the time budget adds up and the peak
    // memory is the largest any input took.
    let mut total = 0;
    total += drive("config_json", fuzz_bodies::config_json::run);
    total += drive("safetensors_header", fuzz_bodies::safetensors_header::run);
    total += drive("from_log", fuzz_bodies::from_log::run);
    total += drive("gguf", fuzz_bodies::gguf::run);
    struct Cleanup;
    impl Drop for Cleanup {
        fn drop(&mut self) {
            fuzz_bodies::hf_cache::cleanup();
        }
    }
    let _cleanup = Cleanup;
    let n = drive("hf_cache", fuzz_bodies::hf_cache::run);
    total += n;
    // Not vacuous: some programs build an entry that loads, most break it.
    let planned = fuzz_bodies::hf_cache::planned();
    assert!(
        planned > 0 && planned < n,
        "{planned} of {n} cache entries loaded"
    );
    assert!(total > 0);
    if let Some(peak) = peak_rss() {
        assert!(
            peak < 2 << 30,
            "peak memory {} MiB: an input grew memory past 2 GiB",
            peak >> 20
        );
    }
}
