//! Byte quantities: parsing of user input (`512MiB`, `14.99GiB`, `80GB`, `1073741824`) and
//! formatting for people.
//!
//! Parsing is strict: unknown units, negative values, NaN and values that overflow `u64` are
//! errors, never silently 0.

use crate::error::Error;

/// One kibibyte.
pub const KIB: u64 = 1 << 10;
/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// One gibibyte.
pub const GIB: u64 = 1 << 30;

/// Parse a byte quantity: a plain integer number of bytes, or a number with a unit
/// (`B`, `KB`/`MB`/`GB`/`TB`/`PB` = powers of 1000, `KiB`/`MiB`/`GiB`/`TiB`/`PiB` = powers of
/// 1024, `K`/`M`/`G`/`T`/`P` alone = powers of 1024 as engines print them). Case-insensitive for the
/// SI part; fractional values are rounded to the nearest byte. A quantity past what 64 bits
/// hold is refused as too large (it is a byte quantity, just no count of bytes memplan keeps).
pub fn parse_bytes(field: &str, input: &str) -> Result<u64, Error> {
    parse_bytes_or_too_large(field, input)?.ok_or_else(|| {
        Error::invalid(
            field,
            format!(
                "{input:?} is too large: more than 64 bits hold ({} bytes, 16 EiB)",
                u64::MAX
            ),
        )
    })
}

/// [`parse_bytes`], except that a well-formed quantity past what 64 bits hold is `Ok(None)`
/// rather than an error: for a caller with a lower limit of its own, whose message should
/// give that limit (`--total-memory`: at most 1 PiB). Malformed input is an error as there.
pub fn parse_bytes_or_too_large(field: &str, input: &str) -> Result<Option<u64>, Error> {
    let bad = |why: &str| {
        Error::invalid(
            field,
            format!("{input:?} is not a byte quantity ({why}); use e.g. 1073741824, 512MiB, 14.99GiB or 80GB"),
        )
    };
    let s = input.trim().replace('_', "");
    if s.is_empty() {
        return Err(bad("empty"));
    }
    if s.starts_with('-') {
        return Err(bad("negative"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim();
    if num.is_empty() {
        return Err(bad("no number"));
    }
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => GIB * KIB,
        "p" | "pib" => GIB * MIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => return Err(bad(&format!("unknown unit {unit:?}"))),
    };
    if !num.contains('.') {
        // Only ASCII digits here: a parse that fails is a number past 64 bits.
        return Ok(num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)));
    }
    let x: f64 = num.parse().map_err(|_| bad("not a number"))?;
    let v = x * mult as f64;
    if v >= u64::MAX as f64 {
        return Ok(None);
    }
    Ok(Some(v.round() as u64))
}

/// A byte count as a signed number, saturating at `i64::MAX`: differences of readings are
/// signed, and a reading above `i64::MAX` (garbage from a driver) must not wrap negative.
pub fn signed(b: u64) -> i64 {
    i64::try_from(b).unwrap_or(i64::MAX)
}

/// Format bytes for people: `23.99 GiB`, `512.00 MiB`, `12 KiB`, `17 B`.
pub fn fmt_bytes(b: u64) -> String {
    if b >= GIB {
        format!("{:.2} GiB", b as f64 / GIB as f64)
    } else if b >= MIB {
        format!("{:.2} MiB", b as f64 / MIB as f64)
    } else if b >= KIB {
        format!("{:.0} KiB", b as f64 / KIB as f64)
    } else {
        format!("{b} B")
    }
}

/// Format a signed byte difference for people, with an explicit sign.
pub fn fmt_signed(d: i64) -> String {
    let sign = if d < 0 { "-" } else { "+" };
    format!("{sign}{}", fmt_bytes(d.unsigned_abs()))
}

/// Format a fraction (a utilisation, a share) for people: at most 4 decimals, trailing zeros
/// dropped (`0.9`, `0.9837`, `1`). A value that 4 decimals would show as 0 or 1 without being
/// it gets the decimals that tell it apart (`0.99999`, `0.00004`), so text never claims a
/// boundary the value is not on. Not for echoing a value back in an error: there the value as
/// given is what the user needs to see.
pub fn fmt_fraction(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    for decimals in 4..=12 {
        let s = format!("{x:.decimals$}");
        let shown: f64 = s.parse().unwrap_or(x);
        let on_boundary = |b: f64| shown == b && x != b;
        if !on_boundary(0.0) && !on_boundary(1.0) {
            return trim(s);
        }
    }
    x.to_string()
}

/// Format an optional reading: absent values are shown as `absent`, never as 0.
pub fn fmt_opt(b: Option<u64>) -> String {
    b.map(fmt_bytes).unwrap_or_else(|| "absent".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_read_like_people_write_them() {
        assert_eq!(fmt_fraction(0.9), "0.9");
        assert_eq!(fmt_fraction(0.95), "0.95");
        assert_eq!(fmt_fraction(1.0), "1");
        assert_eq!(fmt_fraction(0.5000), "0.5");
        // vLLM 0.34's extensible cache on a device with 1.6% in use: free / total.
        assert_eq!(fmt_fraction(0.9837160071649569), "0.9837");
        // Not rounded onto a boundary it is not on.
        assert_eq!(fmt_fraction(0.99999), "0.99999");
        assert_eq!(fmt_fraction(0.999_999_999_9), "0.9999999999");
        assert_eq!(fmt_fraction(0.00004), "0.00004");
        assert_eq!(fmt_fraction(0.0), "0");
        assert_eq!(fmt_fraction(f64::NAN), "NaN");
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("x", "1024").unwrap(), 1024);
        assert_eq!(parse_bytes("x", "512MiB").unwrap(), 512 * MIB);
        assert_eq!(parse_bytes("x", "80GB").unwrap(), 80_000_000_000);
        assert_eq!(
            parse_bytes("x", "14.99GiB").unwrap(),
            (14.99 * GIB as f64).round() as u64
        );
        assert_eq!(parse_bytes("x", " 2 g ").unwrap(), 2 * GIB);
        assert_eq!(parse_bytes("x", "1_000").unwrap(), 1000);
        // The unit the documented limits are written in (1 PiB) is one a user can write.
        assert_eq!(parse_bytes("x", "1PiB").unwrap(), 1 << 50);
        assert_eq!(parse_bytes("x", "0.5P").unwrap(), 1 << 49);
        assert_eq!(parse_bytes("x", "2PB").unwrap(), 2_000_000_000_000_000);
        assert!(parse_bytes("x", "20000PiB").is_err());
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "GiB",
            "-1",
            "1.2.3GiB",
            "12 parsecs",
            "99999999999999999999",
            "20000000000TiB",
            "nan",
        ] {
            let e = parse_bytes("--weights-bytes", bad).unwrap_err().to_string();
            assert!(e.contains("--weights-bytes"), "{bad}: {e}");
        }
    }

    /// A number past 64 bits is a byte quantity, too large: never "not a number"; a negative
    /// one is called negative, not "no number".
    #[test]
    fn too_large_and_negative_are_called_so() {
        for big in [
            "99999999999999999999",
            "99999999999999999999999GiB",
            "20000000000TiB",
            "20000000000.5TiB",
            "18446744073709551616",
        ] {
            let e = parse_bytes("x", big).unwrap_err().to_string();
            assert!(
                e.contains("is too large") && e.contains("18446744073709551615 bytes"),
                "{big}: {e}"
            );
            assert_eq!(parse_bytes_or_too_large("x", big).unwrap(), None, "{big}");
        }
        assert_eq!(parse_bytes("x", "18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_bytes_or_too_large("x", "1GiB").unwrap(), Some(GIB));
        for neg in ["-1", "-5GiB", " -0.5 MiB"] {
            let e = parse_bytes("x", neg).unwrap_err().to_string();
            assert!(e.contains("(negative)"), "{neg}: {e}");
        }
        assert!(parse_bytes_or_too_large("x", "12 parsecs").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(24 * GIB), "24.00 GiB");
        assert_eq!(fmt_bytes(4 * MIB), "4.00 MiB");
        assert_eq!(fmt_bytes(17), "17 B");
        assert_eq!(fmt_signed(-22 * MIB as i64), "-22.00 MiB");
        assert_eq!(fmt_opt(None), "absent");
    }

    #[test]
    fn signed_saturates() {
        assert_eq!(signed(5), 5);
        assert_eq!(signed(u64::MAX), i64::MAX);
        assert_eq!(signed(1 << 63), i64::MAX);
    }
}
