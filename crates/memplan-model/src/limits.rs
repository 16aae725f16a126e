//! The ranges every planning figure must lie in, wherever it comes from: a command-line flag
//! or a figure read from an engine's start-up log ([`crate::fromlog`]). One table, so a value
//! a flag would refuse is refused from a log too (and the other way round).
//!
//! The caps are far above anything real (a device of 1 PiB, 2^20 sequences per step) and far
//! below what would overflow 64-bit sums of such figures.

/// Largest device total, measured figure or KV size (1 PiB): no device comes near, and sums
/// of such figures stay far inside 64 bits.
pub const MAX_BYTES: u64 = 1 << 50;
/// Longest `max_model_len` (2^30 tokens; the longest-context models take 10 M).
pub const MAX_MODEL_LEN: u64 = 1 << 30;
/// Largest `max_num_seqs` (2^20).
pub const MAX_NUM_SEQS: u64 = 1 << 20;
/// Largest `max_num_batched_tokens` (2^30).
pub const MAX_BATCHED_TOKENS: u64 = 1 << 30;
/// Largest tensor-parallel size.
pub const MAX_TP: u64 = 1024;
/// Largest block size in tokens.
pub const MAX_BLOCK: u32 = 4096;
/// Largest KV-cache token or block count an engine can report: one token per byte of
/// [`MAX_BYTES`].
pub const MAX_KV_TOKENS: u64 = MAX_BYTES;

/// A fraction of the device in (0, 1] (`gpu_memory_utilization`, `mem_fraction_static`).
pub fn check_fraction(u: f64) -> Result<f64, String> {
    if u.is_finite() && u > 0.0 && u <= 1.0 {
        Ok(u)
    } else {
        Err(format!("{u} is outside (0, 1]: a fraction of the device"))
    }
}

/// A whole number in `1..=max`.
pub fn check_count(n: u64, max: u64) -> Result<u64, String> {
    if n == 0 || n > max {
        Err(format!("{n} is outside 1..={max}"))
    } else {
        Ok(n)
    }
}

/// A byte figure of at most [`MAX_BYTES`].
pub fn check_bytes(b: u64) -> Result<u64, String> {
    if b > MAX_BYTES {
        Err(format!(
            "{} is more than any device holds (at most {})",
            memplan_core::bytes::fmt_bytes(b),
            memplan_core::bytes::fmt_bytes(MAX_BYTES)
        ))
    } else {
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert!(check_fraction(0.0).is_err() && check_fraction(f64::NAN).is_err());
        assert!(check_fraction(1.0).is_ok() && check_fraction(1.0001).is_err());
        assert!(check_count(0, 4).is_err() && check_count(5, 4).is_err());
        assert_eq!(check_count(4, 4), Ok(4));
        assert!(check_bytes(MAX_BYTES + 1).is_err() && check_bytes(MAX_BYTES).is_ok());
    }
}
