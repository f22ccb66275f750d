//! The charts' text: titles and labels cut to a length (control characters as spaces), the
//! settings line in the user's words, what a view measures.
use crate::analysis::results::ViewSeries;

/// How many characters of the 15 px subtitle fit across `width` pixels (~8 px a character).
pub(super) fn subtitle_chars(width: u32) -> usize {
    (width.saturating_sub(40) / 8).max(20) as usize
}

/// The settings in the user's words, cut between two settings (never inside a word) to
/// `max` characters: `interval_ns=10000000` reads `interval 10ms`, `length_s=3` reads
/// `length 3s`; what does not fit is counted (`+N more`).
pub(super) fn subtitle(settings_line: &str, max: usize) -> String {
    let words: Vec<String> = settings_line
        .split(", ")
        .filter(|p| !p.is_empty())
        .map(user_words)
        .collect();
    let mut out = String::new();
    for (i, w) in words.iter().enumerate() {
        let more = words.len() - i;
        let tail = if more > 1 { 12 } else { 0 };
        let sep = if out.is_empty() { 0 } else { 2 };
        if out.chars().count() + sep + w.chars().count() + tail > max {
            out.push_str(&format!(
                "{}+{more} more",
                if out.is_empty() { "" } else { ", " }
            ));
            return out;
        }
        if sep > 0 {
            out.push_str(", ");
        }
        out.push_str(w);
    }
    out
}

/// One `key=value` setting in the user's words: durations kept in a unit suffix of the key
/// (`_ns`, `_us`, `_ms`, `_s`) as a duration, the rest as `key value`.
fn user_words(kv: &str) -> String {
    let Some((k, v)) = kv.split_once('=') else {
        return short(kv, 60);
    };
    let (k, v) = (short(k, 40), short(v, 60));
    let scale = [("_ns", 1.0), ("_us", 1e3), ("_ms", 1e6), ("_s", 1e9)]
        .into_iter()
        .find(|(suffix, _)| k.ends_with(suffix));
    if let (Some((suffix, ns_per)), Ok(x)) = (scale, v.parse::<f64>()) {
        let ns = x * ns_per;
        if ns.is_finite() && (0.0..1e18).contains(&ns) {
            let d = std::time::Duration::from_nanos(ns.round() as u64);
            return format!(
                "{} {}",
                k.trim_end_matches(suffix).replace('_', " "),
                crate::analysis::units::fmt_duration_short(d)
            );
        }
    }
    format!("{} {v}", k.replace('_', " "))
}

pub(super) fn label(v: &ViewSeries) -> String {
    format!(
        "{} ({}, n={})",
        short(&v.name, 60),
        v.kind.as_str(),
        v.samples.len()
    )
}

/// Text from the result as drawn: at most `max` characters (then "..."), control characters as
/// spaces, so a hostile name cannot make text layout the slow part.
pub(super) fn short(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().nth(max).is_some() {
        out.truncate(
            out.char_indices()
                .nth(max - 3)
                .map_or(out.len(), |(i, _)| i),
        );
        out.push_str("...");
    }
    out
}

/// A view's name as a legend says it: the name and what kind of measurement it is.
pub(super) fn full_name(name: &str, kind: Option<crate::analysis::results::ViewKind>) -> String {
    use crate::analysis::results::ViewKind as K;
    let what = match kind {
        Some(K::Probe) => "request/response probe, send() to recv()",
        Some(K::Ping) => "ICMP echo probe",
        Some(K::Irtt) => "irtt probe",
        // a passive view says what it is (the registry)
        Some(K::Passive(v)) => v.legend(),
        Some(K::Other) | None => return short(name, 60),
    };
    format!("{} ({what})", short(name, 40))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::results::ViewKind;

    #[test]
    fn subtitles_fit_and_use_the_users_words() {
        let line = "interval_ns=10000000, length_s=3, burst=1, sizes=1/1, sampler.sample_every=1";
        assert_eq!(
            subtitle(line, 200),
            "interval 10ms, length 3s, burst 1, sizes 1/1, sampler.sample every 1"
        );
        let cut = subtitle(line, 40);
        assert!(cut.chars().count() <= 40, "{cut}");
        assert!(
            cut.starts_with("interval 10ms, length 3s") && cut.ends_with("more"),
            "{cut}"
        );
        assert_eq!(subtitle("", 40), "");
        // The legend names what a view measures.
        assert_eq!(
            full_name("rr", Some(ViewKind::Probe)),
            "rr (request/response probe, send() to recv())"
        );
    }
}
