//! The text summary, laid out like `irtt client`'s, and the result document (`--json FILE`).
use std::fmt::Write;

use crate::analysis::results::{RunResult, Sample, ViewKind, ViewSeries, ViewSummary};

use super::stats::DurationStats;
use super::IrttResult;

/// A duration in ns, irtt-style: ns, µs, ms or s with 3 significant digits.
pub fn fmt_dur(ns: f64) -> String {
    let a = ns.abs();
    if a < 1e3 {
        format!("{ns:.0}ns")
    } else if a < 1e6 {
        format!("{:.3}µs", ns / 1e3)
    } else if a < 1e9 {
        format!("{:.3}ms", ns / 1e6)
    } else {
        format!("{:.3}s", ns / 1e9)
    }
}

fn fmt_rate(bps: f64) -> String {
    if bps >= 1e6 {
        format!("{:.1} Mbps", bps / 1e6)
    } else if bps >= 1e3 {
        format!("{:.1} Kbps", bps / 1e3)
    } else {
        format!("{bps:.0} bps")
    }
}

fn row(out: &mut String, name: &str, s: &DurationStats, median: bool) {
    if s.n == 0 {
        return;
    }
    let med = match (median, s.median) {
        (true, Some(m)) => fmt_dur(m),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{name:>20}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}",
        fmt_dur(s.min as f64),
        fmt_dur(s.mean),
        med,
        fmt_dur(s.max as f64),
        fmt_dur(s.stddev)
    );
}

fn pct(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        100.0 * n as f64 / d as f64
    }
}

/// irtt's text summary: the parameters, the statistics table, the counts.
pub fn text(r: &IrttResult) -> String {
    let set = &r.settings;
    let p = &set.negotiated;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "irtt probe {} -> {}: interval {}, duration {}, length {} bytes, stats {}, timestamps {}{}, dscp {}, hmac {}",
        set.local_addr,
        set.remote_addr,
        fmt_dur(p.interval_ns as f64),
        fmt_dur(p.duration_ns as f64),
        set.packet_length,
        p.received_stats.name(),
        p.stamp_at.name(),
        p.clock.map(|c| format!(" ({} clock)", c.name())).unwrap_or_default(),
        p.dscp,
        if set.supplied.hmac { "on" } else { "off" },
    );
    if set.supplied.no_test {
        let _ = writeln!(o, "parameters accepted by the server (no test run, -n)");
        return o;
    }
    stats_table(&mut o, &r.stats);
    let _ = writeln!(o);
    counts(&mut o, r);
    rejected_and_errors(&mut o, r);
    o
}

/// Min/mean/median/max/stddev of each statistic.
fn stats_table(o: &mut String, s: &super::Stats) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:>20}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}",
        "", "Min", "Mean", "Median", "Max", "Stddev"
    );
    row(o, "RTT", &s.rtt, true);
    row(o, "send delay", &s.send_delay, true);
    row(o, "receive delay", &s.receive_delay, true);
    let _ = writeln!(o);
    row(o, "IPDV (jitter)", &s.ipdv_round_trip, true);
    row(o, "send IPDV", &s.ipdv_send, true);
    row(o, "receive IPDV", &s.ipdv_receive, true);
    let _ = writeln!(o);
    row(o, "send call time", &s.send_call, false);
    row(o, "timer error", &s.timer_error, false);
    row(o, "server proc. time", &s.server_processing_time, false);
}

fn kv(o: &mut String, k: &str, v: String) {
    let _ = writeln!(o, "{k:>26}: {v}");
}

/// Duration, packets, loss, late, duplicates, bytes, rates, timer.
fn counts(o: &mut String, r: &IrttResult) {
    let s = &r.stats;
    kv(
        o,
        "duration",
        format!(
            "{} (wait {})",
            fmt_dur(r.duration_ns as f64),
            fmt_dur(r.wait_ns as f64)
        ),
    );
    kv(
        o,
        "packets sent/received",
        format!(
            "{}/{} ({:.2}% loss)",
            s.packets_sent, s.replies_unique, s.packet_loss_percent
        ),
    );
    loss_split(o, r);
    kv(
        o,
        "late (out-of-order) pkts",
        format!("{} ({:.2}%)", s.late_packets, s.late_packets_percent),
    );
    kv(
        o,
        "duplicates",
        format!("{} ({:.2}%)", s.duplicates, s.duplicate_percent),
    );
    kv(
        o,
        "bytes sent/received",
        format!("{}/{}", s.bytes_sent, s.bytes_received),
    );
    rates_and_timer(o, s);
}

/// Loss split into upstream and downstream, from the server's received stats.
fn loss_split(o: &mut String, r: &IrttResult) {
    let s = &r.stats;
    let p = &r.settings.negotiated;
    if let (Some(srv), Some(up), Some(down)) = (
        s.server_packets_received,
        s.upstream_loss_percent,
        s.downstream_loss_percent,
    ) {
        kv(
            o,
            "server packets received",
            format!(
                "{srv}/{} ({up:.2}%/{down:.2}% loss up/down)",
                s.packets_sent
            ),
        );
    }
    if p.received_stats.window() {
        kv(
            o,
            "lost up/down/unknown",
            format!(
                "{}/{}/{} (per packet, from the server's received window)",
                s.lost_up, s.lost_down, s.lost_unknown
            ),
        );
    }
}

/// Send and receive rates, the timer's misses and error, local send failures.
fn rates_and_timer(o: &mut String, s: &super::Stats) {
    kv(
        o,
        "send/receive rate",
        format!(
            "{} / {}",
            fmt_rate(s.send_rate_bps),
            fmt_rate(s.receive_rate_bps)
        ),
    );
    kv(
        o,
        "timer misses",
        format!(
            "{}/{} ({:.2}% missed)",
            s.timer_misses,
            s.packets_sent + s.timer_misses,
            pct(s.timer_misses, s.packets_sent + s.timer_misses)
        ),
    );
    kv(
        o,
        "timer error",
        format!("{:.2}% of the interval (mean)", s.timer_err_percent),
    );
    if s.send_failures > 0 {
        kv(
            o,
            "local send failures",
            format!(
                "{} (refused by this host: firewall or full queue; counted as lost up)",
                s.send_failures
            ),
        );
    }
}

/// Rejected replies, interruption, errors and notes.
fn rejected_and_errors(o: &mut String, r: &IrttResult) {
    let rej = &r.rejected;
    if rej.total() + rej.icmp_errors > 0 {
        kv(
            o,
            "rejected replies",
            format!(
                "{} (bad magic {}, truncated {}, bad HMAC {}, missing HMAC {}, unexpected HMAC {}, bad flags {}, not reply {}, wrong token {}, unknown seqno {}), ICMP errors {}",
                rej.total(),
                rej.bad_magic,
                rej.truncated,
                rej.bad_hmac,
                rej.no_hmac,
                rej.unexpected_hmac,
                rej.invalid_flags + rej.unexpected_open,
                rej.not_reply,
                rej.wrong_token,
                rej.unknown_seqno,
                rej.icmp_errors
            ),
        );
    }
    if r.interrupted {
        let _ = writeln!(o, "interrupted: partial results");
    }
    for e in r.send_error.iter().chain(&r.receive_error) {
        let _ = writeln!(o, "error during the test: {e}");
    }
    for n in &r.notes {
        let _ = writeln!(o, "note: {n}");
    }
}

/// The run as an rttscope result document (`probe irtt --json FILE`, docs/results.md): the
/// supplied and negotiated settings at the top, one view `irtt` whose samples are the answered
/// round trips (send offset and RTT, microseconds), lost ones counted by direction in `dropped`,
/// and irtt's statistics (one-way delays, IPDV, loss up/down, ...) in `details`.
pub fn document(r: &IrttResult) -> RunResult {
    let settings = serde_json::to_value(&r.settings).unwrap_or_default();
    let mut doc = RunResult::new("probe irtt", settings);
    doc.start_unix_s = Some(r.start_unix_ns as f64 / 1e9);
    let mut v = ViewSeries::new("irtt", ViewKind::Irtt);
    v.flow = Some(format!(
        "{} -> {}",
        r.settings.local_addr, r.settings.remote_addr
    ));
    v.samples = r
        .rtt_samples()
        .map(|(off, rtt)| Sample {
            t_us: off as f64 / 1e3,
            rtt_us: rtt as f64 / 1e3,
        })
        .collect();
    let s = &r.stats;
    for (what, n) in [
        ("lost_up", s.lost_up),
        ("lost_down", s.lost_down),
        ("lost_unknown", s.lost_unknown),
        ("send_failures", s.send_failures),
        ("rejected_replies", r.rejected.total()),
    ] {
        if n > 0 {
            v.dropped.insert(what.to_string(), n);
        }
    }
    let rtts: Vec<f64> = v.samples.iter().map(|x| x.rtt_us).collect();
    v.summary = Some(ViewSummary::of_samples("irtt", Some(ViewKind::Irtt), &rtts));
    v.details = serde_json::json!({
        "duration_ns": r.duration_ns,
        "wait_ns": r.wait_ns,
        "interrupted": r.interrupted,
        "server_closed": r.server_closed,
        "send_error": r.send_error,
        "receive_error": r.receive_error,
        "stats": s,
        "rejected": r.rejected,
        "notes": r.notes,
    });
    doc.views.push(v);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(fmt_dur(512.0), "512ns");
        assert_eq!(fmt_dur(61_234.0), "61.234µs");
        assert_eq!(fmt_dur(1_500_000.0), "1.500ms");
        assert_eq!(fmt_dur(-2_000.0), "-2.000µs");
        assert_eq!(fmt_rate(28_800.0), "28.8 Kbps");
    }
}
