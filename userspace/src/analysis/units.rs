//! Durations and RTT values as users type and read them.
//!
//! One grammar for every duration option (docs/usage.md): a number with a
//! unit `ns`, `us` (or `µs`), `ms`, `s`, `min`, `h`; fractions are allowed
//! (`1.5ms`). A lone `m` is refused (milliseconds or minutes? netperf and Go
//! disagree), except in netperf's `-w`, whose own grammar defines it. What a
//! bare number means is the habit of the tool an option stands in for:
//! [`seconds_arg`] (netperf `-l`, ping `-i -W -w`), [`netperf_interval_arg`]
//! (netperf `-w`: milliseconds) or [`duration_arg`] (a unit is required; `0`
//! alone is zero).
use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("'{0}' is not a duration: use a number with a unit, e.g. 500ms, 20us, 1.5s, 2min")]
    BadDuration(String),
    #[error("'{0}' has no unit: write {0}s for seconds, {0}ms for milliseconds (units: ns, us, ms, s, min, h)")]
    NoUnit(String),
    #[error("'{0}{1}' is ambiguous: write {0}ms for milliseconds or {0}min for minutes")]
    LoneM(String, &'static str),
}

/// Parse a duration such as `20ms`, `1.5s`, `100us`, `2min`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    let bad = || UnitError::BadDuration(s.to_string());
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let ns_per = match unit.trim() {
        "" => return Err(UnitError::NoUnit(num.to_string())),
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => return Err(UnitError::LoneM(num.to_string(), "m")),
        "min" => 60e9,
        "h" => 3600e9,
        _ => return Err(bad()),
    };
    let ns = v * ns_per;
    if !ns.is_finite() || ns < 0.0 || ns > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(ns.round() as u64))
}

/// clap value parser for durations.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// A bare number is seconds, as netperf's `-l` and ping's `-i`, `-W`, `-w`;
/// or any duration with a unit.
pub fn seconds_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>() {
        if (0.0..1e12).contains(&v) {
            return Ok(Duration::from_secs_f64(v));
        }
        return Err(format!(
            "'{s}' is not a duration: a number of seconds (e.g. 10, 0.2) or a number with a unit (e.g. 500ms, 1.5s)"
        ));
    }
    duration_arg(t)
}

/// netperf's `-w`: a bare number is milliseconds, `m` is milliseconds and `u`
/// microseconds (netperf's suffixes), `-1` means none (back to back); any
/// duration with one of our units works too (`10ms`, `250us`, `1s`).
pub fn netperf_interval_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "-1" {
        return Ok(Duration::ZERO);
    }
    if let Ok(ms) = t.parse::<f64>() {
        if (0.0..1e12).contains(&ms) {
            return Ok(Duration::from_nanos((ms * 1e6).round() as u64));
        }
        return Err(format!(
            "'{s}' is not an interval: milliseconds (e.g. 10), -1 for none, or a number with a unit (e.g. 250us, 10ms)"
        ));
    }
    if let Some(n) = t.strip_suffix('u') {
        return parse_duration(&format!("{n}us")).map_err(|e| e.to_string());
    }
    if let Some(n) = t.strip_suffix('m') {
        if !n.ends_with('m') {
            return parse_duration(&format!("{n}ms")).map_err(|e| e.to_string());
        }
    }
    duration_arg(t)
}

/// The refusal of a zero alignment period (`bucket --period`, `observe --cloud-period`).
pub const ZERO_PERIOD: &str = "the alignment period must be longer than 0";

/// clap value parser for an alignment period: a duration longer than 0.
pub fn period_arg(s: &str) -> Result<Duration, String> {
    let d = duration_arg(s)?;
    if d.is_zero() {
        return Err(ZERO_PERIOD.to_string());
    }
    Ok(d)
}

/// Microseconds as milliseconds with three decimals (the table's unit).
pub fn fmt_ms(us: f64) -> String {
    if us.is_nan() {
        "-".to_string()
    } else {
        format!("{:.3}", us / 1000.0)
    }
}

/// A duration in the unit that reads best (`850us`, `20.1ms`, `3.2s`).
pub fn fmt_duration_short(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns}ns")
    } else if ns < 1e6 {
        format!("{}us", trim(ns / 1e3))
    } else if ns < 1e9 {
        format!("{}ms", trim(ns / 1e6))
    } else {
        format!("{}s", trim(ns / 1e9))
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `1 flow`, `2 flows`: a count and its noun, plural with -s unless one.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("20ms").unwrap(), Duration::from_millis(20));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("100us").unwrap(), Duration::from_micros(100));
        assert_eq!(parse_duration("100µs").unwrap(), Duration::from_micros(100));
        assert_eq!(parse_duration("7ns").unwrap(), Duration::from_nanos(7));
        assert_eq!(parse_duration("2min").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "ms", "10", "10x", "-1s", "1..2s", "abc"] {
            assert!(parse_duration(s).is_err(), "{s} should be rejected");
        }
    }

    /// A lone `m` (milliseconds to netperf, minutes to Go and irtt) is
    /// refused with a sentence that names both spellings; a bare number
    /// where a unit is needed says how to write one.
    #[test]
    fn lone_m_and_bare_numbers_are_refused_with_a_sentence() {
        let e = parse_duration("10m").unwrap_err().to_string();
        assert_eq!(
            e,
            "'10m' is ambiguous: write 10ms for milliseconds or 10min for minutes"
        );
        assert!(seconds_arg("2m").unwrap_err().contains("2ms"));
        assert!(duration_arg("1.5m").unwrap_err().contains("1.5min"));
        let e = duration_arg("30").unwrap_err();
        assert!(e.contains("30s") && e.contains("30ms"), "{e}");
        assert!(!e.contains("2m,"), "never suggests a lone m: {e}");
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_duration_short(Duration::from_micros(850)), "850us");
        assert_eq!(fmt_duration_short(Duration::from_micros(20100)), "20.1ms");
        assert_eq!(fmt_ms(1234.0), "1.234");
    }

    #[test]
    fn seconds_and_netperf_intervals() {
        assert_eq!(seconds_arg("10").unwrap(), Duration::from_secs(10));
        assert_eq!(seconds_arg("0.2").unwrap(), Duration::from_millis(200));
        assert_eq!(seconds_arg("200ms").unwrap(), Duration::from_millis(200));
        assert_eq!(seconds_arg("2min").unwrap(), Duration::from_secs(120));
        assert!(seconds_arg("-1").is_err());
        assert!(seconds_arg("inf").is_err());
        assert!(seconds_arg("1e300").is_err());
        assert_eq!(
            netperf_interval_arg("10").unwrap(),
            Duration::from_millis(10)
        );
        assert_eq!(
            netperf_interval_arg("1m").unwrap(),
            Duration::from_millis(1)
        );
        assert_eq!(netperf_interval_arg("-1").unwrap(), Duration::ZERO);
        assert!(netperf_interval_arg("1e300").is_err());
    }

    proptest::proptest! {
        /// Any input: a value or one sentence, never a panic; a refusal
        /// names the input.
        #[test]
        fn parsers_never_panic(s in "\\PC{0,12}") {
            for p in [duration_arg, seconds_arg, netperf_interval_arg, period_arg] {
                if let Err(e) = p(&s) {
                    proptest::prop_assert!(!e.is_empty());
                }
            }
        }

        /// Every unit of the grammar: N<unit> is N times the unit.
        #[test]
        fn every_unit_scales(n in 0u32..100_000, u in 0usize..6) {
            let (unit, ns) = [("ns", 1u64), ("us", 1_000), ("ms", 1_000_000),
                ("s", 1_000_000_000), ("min", 60_000_000_000), ("h", 3_600_000_000_000)][u];
            let want = Duration::from_nanos(n as u64 * ns);
            let s = format!("{n}{unit}");
            proptest::prop_assert_eq!(parse_duration(&s).unwrap(), want);
            proptest::prop_assert_eq!(seconds_arg(&s).unwrap(), want);
            proptest::prop_assert_eq!(netperf_interval_arg(&s).unwrap(), want);
        }
    }
}
