//! The words people write in flags, environment variables and registry metadata, read the same
//! way by every binary (the adapters and mcpctl): durations, byte sizes and booleans.

use std::time::Duration;

/// Parses a duration as Go and Istio write them: a number with a unit, `us`, `ms`, `s`, `m` or
/// `h` (`250ms`, `1.5s`, `2m`), or `0`. A bare number other than 0 is refused: it would be
/// milliseconds to one reader and seconds to another. Every
/// duration flag of every binary reads through this.
pub fn duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 20ms, 1.5s, 2m or 0"))?;
    let seconds = match unit.trim() {
        "" => {
            return Err(format!(
                "invalid duration {s:?}: a bare number has no unit: did you mean {t}s? (units: us, ms, s, m, h)"
            ))
        }
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "invalid duration {s:?}: unknown unit {other:?} (us, ms, s, m, h)"
            ))
        }
    };
    Duration::try_from_secs_f64(n * seconds).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Parses a byte count: `1048576`, `512KiB`, `16MiB`, `1GiB` (case-insensitive; `K`, `KB`, `M`,
/// `MB`, `G`, `GB` are the same binary units: nobody sizes messages or files in powers of ten).
pub fn size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 16MiB, 512KiB, 1048576"))?;
    let unit = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        other => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {other:?} (B, KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(unit)
        .ok_or_else(|| format!("invalid size {s:?}: too large"))
}

/// Formats a byte count the way [`size`] reads it, for messages (`16 MiB`).
pub fn format_size(n: u64) -> String {
    match n {
        n if n >= GIB && n % GIB == 0 => format!("{} GiB", n / GIB),
        n if n >= MIB && n % MIB == 0 => format!("{} MiB", n / MIB),
        n if n >= KIB && n % KIB == 0 => format!("{} KiB", n / KIB),
        n => format!("{n} bytes"),
    }
}

/// A yes/no word: `Some(true)` for `true`, `t`, `1`, `yes`, `y`, `on`; `Some(false)` for
/// `false`, `f`, `0`, `no`, `n`, `off` (any case, surrounding blanks ignored); `None` for anything
/// else, so that each caller decides what an unknown word means where it reads it.
pub fn truthy(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "t" | "1" | "yes" | "y" | "on" => Some(true),
        "false" | "f" | "0" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

/// A boolean flag value as Go's `strconv.ParseBool` reads it (what the consul CLI's
/// `CONSUL_HTTP_SSL=true` and friends accept): `1`, `t`, `T`, `TRUE`, `true`, `True`, `0`, `f`,
/// `F`, `FALSE`, `false`, `False`.
pub fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "invalid boolean {s:?} (true/false, 1/0, t/f, as Go reads them)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(duration("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(duration(" 10s "), Ok(Duration::from_secs(10)));
        assert_eq!(
            duration("60"),
            Err("invalid duration \"60\": a bare number has no unit: did you mean 60s? (units: us, ms, s, m, h)".into())
        );
        let bare = duration(" 1.5 ").expect_err("a bare number");
        assert!(bare.contains("did you mean 1.5s?"), "{bare}");
        assert!(duration("fast").is_err());
        assert!(duration("3d").is_err());
        assert!(duration("-1s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(size("1048576"), Ok(MIB));
        assert_eq!(size("16MiB"), Ok(16 * MIB));
        assert_eq!(size("4MiB"), Ok(4 << 20));
        assert_eq!(size("512 KiB"), Ok(512 * KIB));
        assert_eq!(size("1g"), Ok(GIB));
        assert_eq!(size("4MB"), Ok(4 * MIB));
        assert!(size("MiB").is_err());
        assert!(size("12 parsecs").is_err());
        assert!(size("99999999999999GiB").is_err());
        assert_eq!(format_size(16 * MIB), "16 MiB");
        assert_eq!(format_size(1500), "1500 bytes");
    }

    #[test]
    fn booleans() {
        assert_eq!(truthy("True"), Some(true));
        assert_eq!(truthy(" yes "), Some(true));
        assert_eq!(truthy("off"), Some(false));
        assert_eq!(truthy("0"), Some(false));
        assert_eq!(truthy("maybe"), None);
        assert_eq!(truthy(""), None);
        assert_eq!(go_bool("TRUE"), Ok(true));
        assert_eq!(go_bool("f"), Ok(false));
        assert!(go_bool("yes").is_err());
    }
}
