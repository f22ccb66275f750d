//! RFC 3339 times, as the API writes and reads them (UTC, optional fraction and offset).

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Unix seconds as RFC 3339 UTC with nanoseconds when needed (`2026-11-21T06:00:00.250Z`), the
/// way the API writes `google.protobuf.Timestamp` (0, 3, 6 or 9 fractional digits).
pub fn rfc3339(unix_s: f64) -> String {
    // Microseconds: an f64 Unix time carries no more (about 0.2 us of resolution today).
    let total_ns = (unix_s * 1e6).round() as i128 * 1000;
    let secs = total_ns.div_euclid(1_000_000_000) as i64;
    let ns = total_ns.rem_euclid(1_000_000_000) as u32;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let base = format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    );
    if ns == 0 {
        format!("{base}Z")
    } else if ns.is_multiple_of(1_000_000) {
        format!("{base}.{:03}Z", ns / 1_000_000)
    } else if ns.is_multiple_of(1000) {
        format!("{base}.{:06}Z", ns / 1000)
    } else {
        format!("{base}.{ns:09}Z")
    }
}

/// Parse an RFC 3339 time (`2026-11-21T06:00:00Z`, fractions, `+hh:mm` offsets) to Unix seconds.
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let b = s.trim().as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = std::str::from_utf8(&b[r]).ok()?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac = 0.0;
    if b[i] == b'.' {
        let st = i + 1;
        i = st;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == st || i - st > 9 {
            return None;
        }
        frac = format!("0.{}", std::str::from_utf8(&b[st..i]).ok()?)
            .parse()
            .ok()?;
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0i64,
        c @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)? as i64;
            let om = num(i + 4..i + 6)? as i64;
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *c == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y as i64, mo, d);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + se) as i64 - offset;
    Some(secs as f64 + frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400.25), "2000-02-29T00:00:00.250Z");
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00.250Z"),
            Some(951_782_400.25)
        );
        assert_eq!(parse_rfc3339("2026-11-21T07:12:33Z"), Some(1_795_245_153.0));
        assert_eq!(
            parse_rfc3339("2026-11-21T08:12:33+01:00"),
            Some(1_795_245_153.0)
        );
        assert_eq!(
            parse_rfc3339("2026-11-21T07:12:33.000001Z")
                .map(|t| ((t - 1_795_245_153.0) * 1e6).round()),
            Some(1.0)
        );
        for t in [
            1_795_245_153.0,
            1_795_245_153.5,
            1_795_245_153.123_456,
            86_399.0,
        ] {
            let back = parse_rfc3339(&rfc3339(t)).unwrap();
            assert!((back - t).abs() < 1e-6, "{t} -> {} -> {back}", rfc3339(t));
        }
        for bad in [
            "",
            "2026-11-21",
            "2026-13-01T00:00:00Z",
            "2026-11-21T07:12:33",
            "2026-11-21T07:12:33.Z",
            "2026-11-21T25:00:00Z",
            "x026-11-21T07:12:33Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
