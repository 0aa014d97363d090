//! Units as users write them: sizes ("4KiB", "8GiB", "512"), durations ("10us", "1.5ms", "2s"),
//! ratios ("50%", "0.5"). Parsing never does I/O; errors say what is allowed.

use serde::{Deserialize, Deserializer, de};
use std::fmt;
use std::time::Duration;

pub const SIZE_HELP: &str =
    "a byte count with an optional unit: B, KiB, MiB, GiB, TiB (powers of 1024) or kB, MB, GB, TB (powers of 1000), e.g. 4KiB, 8GiB, 512";
pub const DURATION_HELP: &str = "a duration with a unit: ns, us (or µs), ms, s, m, h, e.g. 10us, 1.5ms, 30s";
pub const RATIO_HELP: &str = "a ratio between 0 and 1, or a percentage, e.g. 0.25 or 25%";

/// A size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Size(pub u64);

/// A non-negative duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Dur(pub Duration);

/// A probability/ratio in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Default)]
pub struct Ratio(pub f64);

fn split_number(s: &str) -> (&str, &str) {
    let end = s.char_indices().find(|(_, c)| !(c.is_ascii_digit() || *c == '.' || *c == '_')).map(|(i, _)| i).unwrap_or(s.len());
    (&s[..end], s[end..].trim())
}

pub fn parse_size(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(format!("`{text}` is not a size; expected {SIZE_HELP}"));
    }
    let mult: u64 = match unit {
        "" | "B" | "b" => 1,
        "KiB" | "K" | "k" | "KB" => 1 << 10,
        "MiB" | "M" | "m" => 1 << 20,
        "GiB" | "G" | "g" => 1 << 30,
        "TiB" | "T" | "t" => 1 << 40,
        "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(format!("`{text}`: unknown size unit `{unit}`; expected {SIZE_HELP}")),
    };
    let num = num.replace('_', "");
    let value = if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| format!("`{text}` is not a size; expected {SIZE_HELP}"))?;
        let v = f * mult as f64;
        if !v.is_finite() || v > u64::MAX as f64 || v.fract() != 0.0 {
            return Err(format!("`{text}` is not a whole number of bytes"));
        }
        v as u64
    } else {
        let n: u64 = num.parse().map_err(|_| format!("`{text}` is not a size; expected {SIZE_HELP}"))?;
        n.checked_mul(mult).ok_or_else(|| format!("`{text}` is too large"))?
    };
    Ok(value)
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(format!("`{text}` is not a duration; expected {DURATION_HELP}"));
    }
    let f: f64 = num.replace('_', "").parse().map_err(|_| format!("`{text}` is not a duration; expected {DURATION_HELP}"))?;
    let ns_per: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        "" => return Err(format!("`{text}` has no unit; expected {DURATION_HELP}")),
        _ => return Err(format!("`{text}`: unknown duration unit `{unit}`; expected {DURATION_HELP}")),
    };
    let ns = f * ns_per;
    if !ns.is_finite() || ns > u64::MAX as f64 {
        return Err(format!("`{text}` is too long"));
    }
    Ok(Duration::from_nanos(ns.round() as u64))
}

/// `serve --busy-poll` / an experiment's `disk: {busy_poll}`: `0` or `off`, or a duration up
/// to 1ms (a longer poll only burns a CPU while the disk idles).
pub fn parse_busy_poll(text: &str) -> Result<Duration, String> {
    if matches!(text.trim(), "0" | "off") {
        return Ok(Duration::ZERO);
    }
    let d = parse_duration(text)?;
    if d > Duration::from_millis(1) {
        return Err(format!("`{text}` is too long for a busy poll; allowed: 0 (off) up to 1ms"));
    }
    Ok(d)
}

/// A busy-poll budget in YAML: `0`, `off`, or a duration up to 1ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BusyPoll(pub Duration);

impl<'de> Deserialize<'de> for BusyPoll {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // YAML reads a bare `off` as false
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            B(bool),
            N(NumOrStr),
        }
        let help = format!("expected 0, off, or {DURATION_HELP}, at most 1ms");
        // any other shape (a list, a map) gets this message, not serde's, which names the private
        // enum `Raw`
        match Raw::deserialize(d).map_err(|_| de::Error::custom(format!("not a busy-poll budget; {help}")))? {
            Raw::B(false) | Raw::N(NumOrStr::U(0)) => Ok(BusyPoll(Duration::ZERO)),
            Raw::B(true) => Err(de::Error::custom(format!("`true` is not a busy-poll budget; {help}"))),
            Raw::N(NumOrStr::U(n)) => Err(de::Error::custom(format!("`{n}` has no unit; {help}"))),
            Raw::N(NumOrStr::F(f)) => Err(de::Error::custom(format!("`{f}` has no unit; {help}"))),
            Raw::N(NumOrStr::S(s)) => parse_busy_poll(&s).map(BusyPoll).map_err(de::Error::custom),
        }
    }
}

pub fn parse_ratio(text: &str) -> Result<f64, String> {
    let s = text.trim();
    let v = if let Some(p) = s.strip_suffix('%') { p.trim().parse::<f64>().map(|v| v / 100.0) } else { s.parse::<f64>() }
        .map_err(|_| format!("`{text}` is not a ratio; expected {RATIO_HELP}"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("`{text}` is out of range; expected {RATIO_HELP}"));
    }
    Ok(v)
}

/// Accept either a YAML number or a string for unit-bearing values.
#[derive(Deserialize)]
#[serde(untagged, expecting = "not a number or a value with its unit; allowed: e.g. 4KiB, 10us, 25%")]
enum NumOrStr {
    U(u64),
    F(f64),
    S(String),
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::U(n) => Ok(Size(n)),
            NumOrStr::F(f) => Err(de::Error::custom(format!("`{f}` is not a whole number of bytes; expected {SIZE_HELP}"))),
            NumOrStr::S(s) => parse_size(&s).map(Size).map_err(de::Error::custom),
        }
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::U(n) => Err(de::Error::custom(format!("`{n}` has no unit; expected {DURATION_HELP}"))),
            NumOrStr::F(f) => Err(de::Error::custom(format!("`{f}` has no unit; expected {DURATION_HELP}"))),
            NumOrStr::S(s) => parse_duration(&s).map(Dur).map_err(de::Error::custom),
        }
    }
}

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = match NumOrStr::deserialize(d)? {
            NumOrStr::U(n) => n as f64,
            NumOrStr::F(f) => f,
            NumOrStr::S(s) => return parse_ratio(&s).map(Ratio).map_err(de::Error::custom),
        };
        if !(0.0..=1.0).contains(&v) {
            return Err(de::Error::custom(format!("`{v}` is out of range; expected {RATIO_HELP}")));
        }
        Ok(Ratio(v))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

/// Human form of a byte count, exact when it is a whole number of a binary unit.
pub fn format_size(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, m) in UNITS {
        if n >= m && n.is_multiple_of(m) {
            return format!("{}{u}", n / m);
        }
    }
    format!("{n}B")
}

pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0s".into()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert!(parse_size("4XB").unwrap_err().contains("unknown size unit `XB`"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0.3B").is_err());
        assert_eq!(format_size(8 << 30), "8GiB");
        assert_eq!(format_size(1000), "1000B");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("1.5ms").unwrap(), Duration::from_micros(1500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("10 fortnights").is_err());
        assert_eq!(format_duration(Duration::from_micros(10)), "10us");
    }

    #[test]
    fn ratios() {
        assert_eq!(parse_ratio("50%").unwrap(), 0.5);
        assert_eq!(parse_ratio("0.25").unwrap(), 0.25);
        assert!(parse_ratio("150%").is_err());
        assert!(parse_ratio("-1").is_err());
    }
}
