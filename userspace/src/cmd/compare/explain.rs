//! `--explain`: short notes on the differences between the rows, each only when the numbers show
//! its cause, with those numbers.
use std::time::Duration;

use super::rows::{CloudEvidence, Row};
use crate::analysis::flow::Side;
use crate::analysis::stats::Summary;
use crate::analysis::units::fmt_ms;
use crate::analysis::view_kind::ViewKind;

/// Notes with evidence: each only when the numbers show the cause.
pub fn explain(
    rows: &[Row],
    interval: Duration,
    retrans: u64,
    cloud: Option<CloudEvidence>,
) -> Vec<String> {
    let get = |name: &str| {
        rows.iter()
            .find(|r| r.view == name && r.summary.n > 0)
            .map(|r| r.summary)
    };
    // the socket's own RTT (TCP's view), which the notes explain the others against
    let socket = |side| ViewKind::socket().and_then(|k| get(&k.label(side)));
    let iv_us = interval.as_secs_f64() * 1e6;
    let mut notes = Vec::new();
    notes.extend(delayed_ack(
        socket(Side::Client),
        socket(Side::Server),
        iv_us,
    ));
    // the rows of the views read as the cloud's metric (the packet sampler's)
    let packet_rows =
        ViewKind::cloud_metric_views().flat_map(|k| [k.label(Side::Client), k.label(Side::Server)]);
    for name in packet_rows {
        notes.extend(think_time(&name, get(&name), socket(Side::Client), iv_us));
    }
    notes.extend(cloud.and_then(bucket_artifact));
    notes.extend(loss_recovery(get("TCP_RR"), socket(Side::Client), retrans));
    notes.extend(kernel_echo(get("ICMP"), get("TCP_RR")));
    notes.extend(handshake_baseline(
        get("TCP_CONNECT"),
        socket(Side::Client),
        get("TCP_RR"),
    ));
    notes
}

/// Well above: more than 20 % and 50 us over (below that, the clocks' and wake-ups' noise).
fn above(x: f64, base: f64) -> bool {
    x > 1.2 * base && x - base > 50.0
}

/// The handshake as the path's baseline (`--tcp-connect`: the kernel's SYN to SYN-ACK, answered
/// by the peer's kernel at once, no data before it, no delayed ACK): what TCP's per-ACK RTT and
/// the application add above it, each only when it is well above.
fn handshake_baseline(
    hs: Option<Summary>,
    tcp: Option<Summary>,
    app: Option<Summary>,
) -> Vec<String> {
    let Some(h) = hs else {
        return Vec::new();
    };
    let mut notes = Vec::new();
    if let Some(t) = tcp.filter(|t| above(t.p50, h.p50)) {
        notes.push(format!(
            "TCP's client-side RTT p50 {} ms is {} ms above the handshake's p50 {} ms (TCP_CONNECT: SYN to SYN-ACK, the path alone): the data's ACKs came that much later than the path allows (queued behind other data, or held by the peer's delayed ACK).",
            fmt_ms(t.p50), fmt_ms(t.p50 - h.p50), fmt_ms(h.p50)
        ));
    }
    let floor = tcp.map_or(h.p50, |t| t.p50.max(h.p50));
    if let Some(a) = app.filter(|a| above(a.p50, floor)) {
        notes.push(format!(
            "TCP_RR p50 {} ms is {} ms above the handshake's p50 {} ms{}: the applications' time (the responder's read, work and write, both ends' wake-ups), which no packet's RTT holds.",
            fmt_ms(a.p50),
            fmt_ms(a.p50 - floor),
            fmt_ms(h.p50),
            match tcp {
                Some(t) if t.p50 > h.p50 => format!(" and TCP's client-side RTT p50 {} ms", fmt_ms(t.p50)),
                _ => String::new(),
            }
        ));
    }
    notes
}

/// Delayed ACK on the responding side: TCP's server-side RTT at the think time (below the
/// 40 ms timer) or at the timer, far above the client side's.
fn delayed_ack(client: Option<Summary>, server: Option<Summary>, iv_us: f64) -> Option<String> {
    let (c, s) = (client?, server?);
    // well above the client side (on a 20 ms path at 30 ms think time: 30 vs 20 ms)
    if !above(s.p50, c.p50) {
        return None;
    }
    if iv_us > 0.0 && iv_us < 40_000.0 && (s.p50 - iv_us).abs() <= 0.3 * iv_us + 2_000.0 {
        Some(format!(
            "server-side TCP RTT p50 {} ms is close to the probe interval {} ms (below the 40 ms delayed-ACK timer) while the client side's is {} ms: the client's TCP holds its ACK of each response until the next request carries it (delayed ACK), so the server times the think time.",
            fmt_ms(s.p50), fmt_ms(iv_us), fmt_ms(c.p50)
        ))
    } else if (35_000.0..=45_000.0).contains(&s.p50) {
        Some(format!(
            "server-side TCP RTT p50 {} ms sits at the 40 ms delayed-ACK timer (client side {} ms): the client's ACKs of the responses waited for the timer.",
            fmt_ms(s.p50), fmt_ms(c.p50)
        ))
    } else {
        None
    }
}

/// A packet sampler's row (`name`) whose tail reaches the application's think time, far above
/// TCP's client-side RTT.
fn think_time(
    name: &str,
    row: Option<Summary>,
    tcp: Option<Summary>,
    iv_us: f64,
) -> Option<String> {
    let (smp, tc) = (row?, tcp?);
    (iv_us > 5.0 * tc.p50.max(1.0) && smp.max >= 0.8 * iv_us && smp.p99 >= 0.8 * iv_us).then(|| {
        format!(
            "{name}: p99 {} ms / max {} ms reach the think time {} ms while TCP's client-side p50 is {} ms: some sampled acknowledging packets were the next request, not a bare ACK, so the sampler timed the application's pause.",
            fmt_ms(smp.p99), fmt_ms(smp.max), fmt_ms(iv_us), fmt_ms(tc.p50)
        )
    })
}

/// The cloud-bucket median interpolated inside one wide bucket.
fn bucket_artifact(c: CloudEvidence) -> Option<String> {
    let width_us = (c.bucket_hi_ms - c.bucket_lo_ms) * 1000.0;
    (c.bucket_share_pct >= 50.0
        && (c.p50_us - c.exact_p50_us).abs() > 0.5 * c.exact_p50_us
        && width_us > 2.0 * c.exact_p50_us)
        .then(|| {
            format!(
                "the cloud-bucket median {} ms is interpolated inside the [{}, {}) ms bucket, which holds {:.0}% of the samples (at its midpoint when it holds them all); the exact median of the same samples is {} ms: a bucketing artifact, not a network difference.",
                fmt_ms(c.p50_us), c.bucket_lo_ms, c.bucket_hi_ms, c.bucket_share_pct, fmt_ms(c.exact_p50_us)
            )
        })
}

/// The application's tail far above TCP's RTT, with retransmissions.
fn loss_recovery(app: Option<Summary>, tcp: Option<Summary>, retrans: u64) -> Option<String> {
    let (app, tc) = (app?, tcp?);
    (retrans > 0 && app.p99 > 3.0 * tc.p99).then(|| {
        format!(
            "TCP_RR p99 {} ms is far above TCP's RTT p99 {} ms with {} retransmissions: the application waits for loss recovery, which TCP's RTT excludes (no samples from retransmitted data).",
            fmt_ms(app.p99), fmt_ms(tc.p99), retrans
        )
    })
}

/// Ping below request/response: an echo has no receiving application.
fn kernel_echo(ping: Option<Summary>, app: Option<Summary>) -> Option<String> {
    let (p, app) = (ping?, app?);
    (app.p50 > 1.2 * p.p50).then(|| {
        format!(
            "ICMP p50 {} ms is below TCP_RR p50 {} ms: an echo is answered inside the kernel, a request/response crosses TCP and both applications.",
            fmt_ms(p.p50), fmt_ms(app.p50)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(view: &str, p50: f64, p99: f64, max: f64) -> Row {
        let mut s = Summary::from_us(&[p50]);
        s.p50 = p50;
        s.p99 = p99;
        s.max = max;
        Row {
            view: view.into(),
            what: String::new(),
            summary: s,
            bucketed: None,
        }
    }

    /// The handshake (TCP_CONNECT) as the baseline: a note for what is well above it, none for
    /// what is within 20 % or 50 us of it.
    #[test]
    fn handshake_baseline_notes_what_is_above_the_path() {
        let notes = |rows: &[Row]| explain(rows, Duration::from_millis(10), 0, None);
        // all on the path: 20 ms handshake, per-ACK RTT and TCP_RR within noise: nothing
        let path = [
            row("TCP_CONNECT", 20_300.0, 20_600.0, 21_000.0),
            row("tcp client", 20_350.0, 20_700.0, 21_000.0),
            row("TCP_RR", 20_500.0, 21_000.0, 22_000.0),
        ];
        assert!(notes(&path).is_empty(), "{:?}", notes(&path));
        // a per-ACK RTT 10 ms above (queues, delayed ACK) and TCP_RR 10 ms above that
        let slow = [
            row("TCP_CONNECT", 20_000.0, 20_600.0, 21_000.0),
            row("tcp client", 30_000.0, 31_000.0, 32_000.0),
            row("TCP_RR", 40_000.0, 41_000.0, 42_000.0),
        ];
        let n = notes(&slow);
        assert_eq!(n.len(), 2, "{n:?}");
        assert!(n[0].starts_with("TCP's client-side RTT p50 30.000 ms is 10.000 ms above the handshake's p50 20.000 ms"), "{}", n[0]);
        assert!(n[1].starts_with("TCP_RR p50 40.000 ms is 10.000 ms above the handshake's p50 20.000 ms and TCP's client-side RTT p50 30.000 ms"), "{}", n[1]);
        // sub-millisecond: 40 us above is noise, 200 us above is not
        let lan = |rr: f64| {
            notes(&[
                row("TCP_CONNECT", 60.0, 80.0, 90.0),
                row("TCP_RR", rr, rr, rr),
            ])
        };
        assert!(lan(100.0).is_empty());
        assert_eq!(lan(260.0).len(), 1, "{:?}", lan(260.0));
        // no handshakes run: no baseline notes
        assert!(notes(&slow[1..]).iter().all(|s| !s.contains("handshake")));
    }

    #[test]
    fn delayed_ack_note_needs_evidence() {
        let rows = vec![
            row("tcp client", 80.0, 150.0, 200.0),
            row("tcp server", 20_100.0, 20_300.0, 20_400.0),
        ];
        let n = explain(&rows, Duration::from_millis(20), 0, None);
        assert!(n.iter().any(|s| s.contains("delayed-ACK")), "{n:?}");
        // Same numbers without a think time: no note.
        assert!(explain(&rows, Duration::ZERO, 0, None).is_empty());
        // Server close to client: no note.
        let rows = vec![
            row("tcp client", 80.0, 150.0, 200.0),
            row("tcp server", 90.0, 150.0, 200.0),
        ];
        assert!(explain(&rows, Duration::from_millis(20), 0, None).is_empty());
    }

    #[test]
    fn think_time_note_names_the_sampler_row() {
        // The rows are found through the registry's roles (the socket's view, the views read as
        // the cloud's metric): the note must still name the row it is about.
        let rows = vec![
            row("tcp client", 100.0, 150.0, 200.0),
            row("sampler client", 110.0, 160.0, 210.0),
            row("sampler server", 120.0, 19_500.0, 20_100.0),
        ];
        let n = explain(&rows, Duration::from_millis(20), 0, None);
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].starts_with("sampler server: p99 19.500 ms"), "{n:?}");
        // Without TCP's client-side row there is nothing to explain it against.
        assert!(explain(&rows[1..], Duration::from_millis(20), 0, None).is_empty());
    }

    #[test]
    fn cloud_and_loss_notes() {
        let rows = vec![
            row("tcp client", 200.0, 300.0, 400.0),
            row("TCP_RR", 250.0, 250_000.0, 300_000.0),
        ];
        let ev = |p50_us, exact_p50_us| CloudEvidence {
            p50_us,
            bucket_lo_ms: 0.0,
            bucket_hi_ms: 1.0,
            bucket_share_pct: 100.0,
            exact_p50_us,
        };
        let n = explain(&rows, Duration::ZERO, 3, Some(ev(500.0, 200.0)));
        assert!(n.iter().any(|s| s.contains("bucketing artifact")), "{n:?}");
        assert!(n.iter().any(|s| s.contains("loss recovery")), "{n:?}");
        assert!(explain(&rows, Duration::ZERO, 0, Some(ev(500.0, 450.0))).is_empty());
    }
}
