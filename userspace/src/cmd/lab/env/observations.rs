//! The report's observations: 2–4 sentences per scenario on what the run showed, with its
//! numbers. The sentences call the socket's own RTT "TCP" and the view read as the cloud's flow
//! metric "the sampler"; which views those are is the registry's ([`PassiveKind::socket`],
//! [`PassiveKind::cloud_metric_views`]).
use super::phase::{rtts, PhaseData, Series};
use super::table::fmt_ms;
use crate::analysis::flow::Side;
use crate::analysis::results::ViewSummary;
use crate::lab::scenarios::{Plan, Scenario};
use crate::views::ViewKind as PassiveKind;

fn p50(points: &[Vec<ViewSummary>], i: usize, view: &str) -> Option<f64> {
    points.get(i)?.iter().find(|v| v.view == view)?.p50_us
}

fn pct(points: &[Vec<ViewSummary>], i: usize, view: &str, q: u32) -> Option<f64> {
    let v = points.get(i)?.iter().find(|v| v.view == view)?;
    match q {
        5 => v.p5_us,
        50 => v.p50_us,
        95 => v.p95_us,
        99 => v.p99_us,
        _ => None,
    }
}

fn f(us: Option<f64>) -> String {
    format!("{} ms", fmt_ms(us))
}

fn range(points: &[Vec<ViewSummary>], view: &str) -> String {
    let v: Vec<f64> = (0..points.len())
        .filter_map(|i| p50(points, i, view))
        .collect();
    if v.is_empty() {
        return "- ms".into();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{}–{} ms", fmt_ms(Some(lo)), fmt_ms(Some(hi)))
}

/// The label of the socket's RTT on one side (TCP's view: `tcp server`); empty in a build
/// without such a view.
fn socket(side: Side) -> String {
    PassiveKind::socket()
        .map(|k| k.label(side))
        .unwrap_or_default()
}

/// The view read as the cloud's flow metric (the packet sampler), if this build has one.
fn packet_view() -> Option<PassiveKind> {
    PassiveKind::cloud_metric_views().next()
}

/// The label of [`packet_view`] on one side (`sampler client`).
fn packet(side: Side) -> String {
    packet_view().map(|k| k.label(side)).unwrap_or_default()
}

/// A passive view's samples on one side in a phase (none without the view).
fn samples_of(d: &PhaseData, kind: Option<PassiveKind>, side: Side) -> &[(f64, f64)] {
    kind.map_or(&[], |k| d.passive(k, side))
}

fn idx(plan: &Plan, label: &str) -> Option<usize> {
    plan.phases.iter().position(|p| p.label == label)
}

/// 2–4 sentences on what the run showed, with its numbers.
pub(super) fn observations(
    plan: &Plan,
    points: &[Vec<ViewSummary>],
    data: &[PhaseData],
) -> Vec<String> {
    match plan.scenario {
        Scenario::DelayedAck => delayed_ack_observations(plan, points),
        Scenario::BeyondAckTimer => beyond_ack_timer_observations(plan, points, data),
        Scenario::RttStep => rtt_step_observations(plan, data),
        Scenario::Loss => loss_observations(plan, points),
        Scenario::Bufferbloat => bufferbloat_observations(plan, points, data),
        Scenario::ProbeInterval => probe_interval_observations(plan, points),
    }
}

/// The label of phase `i` (empty when there is none).
fn phase_label(plan: &Plan, i: usize) -> String {
    plan.phases
        .get(i)
        .map(|p| p.label.clone())
        .unwrap_or_default()
}

/// The sampler's cloud-bucket median of `view` at phase `i`.
fn cloud_p50(points: &[Vec<ViewSummary>], i: usize, view: &str) -> Option<f64> {
    points[i]
        .iter()
        .find(|v| v.view == view)
        .and_then(|v| v.extra.get("cloud_p50_us").copied())
}

fn delayed_ack_observations(plan: &Plan, points: &[Vec<ViewSummary>]) -> Vec<String> {
    let last = points.len().saturating_sub(1);
    let mut s = Vec::new();
    let i16 = idx(plan, "16").unwrap_or(0);
    let (client, server) = (socket(Side::Client), socket(Side::Server));
    s.push(format!(
        "The server's TCP RTT (p50) followed the interval: {} at 0 ms, {} at 16 ms, {} at 32 ms — the client holds its ACK until the next request carries it.",
        f(p50(points, 0, &server)),
        f(p50(points, i16, &server)),
        f(idx(plan, "32").and_then(|i| p50(points, i, &server))),
    ));
    let s32 = idx(plan, "32").and_then(|i| p50(points, i, &server));
    let s41 = p50(points, last, &server);
    s.push(format!(
        "At {} ms it was {}: {}.",
        phase_label(plan, last),
        f(s41),
        match (s41, s32) {
            (Some(a), Some(b)) if a < 0.5 * b => "the client's delayed-ACK timer (~40 ms) had fired and taken the socket out of ping-pong mode, so the client ACKed each response at once",
            _ => "capped near the client's delayed-ACK timer (~40 ms), whose ACK now comes before the next request",
        }
    ));
    s.push(format!(
        "The client's TCP RTT p50 stayed at {} and the request/response p50 at {} over all intervals: the server answers at once, so its ACK rides on the response.",
        range(points, &client),
        range(points, "rr"),
    ));
    let (pc, ps) = (packet(Side::Client), packet(Side::Server));
    s.push(format!(
        "The sampler agreed with TCP on each side: server {} at 16 ms (cloud-bucket median {}), client {} (cloud-bucket median {}).",
        f(p50(points, i16, &ps)),
        f(cloud_p50(points, i16, &ps)),
        f(p50(points, i16, &pc)),
        f(cloud_p50(points, i16, &pc)),
    ));
    s
}

fn beyond_ack_timer_observations(
    plan: &Plan,
    points: &[Vec<ViewSummary>],
    data: &[PhaseData],
) -> Vec<String> {
    let mut s = vec![format!(
        "TCP's RTT on the server stayed at {} (p50 per interval) and on the client at {}.",
        range(points, &socket(Side::Server)),
        range(points, &socket(Side::Client))
    )];
    let ps = packet(Side::Server);
    for (i, d) in data.iter().enumerate().take(points.len()) {
        let x = plan.phases[i].label.parse::<f64>().unwrap_or(0.0) * 1e3;
        let smp: Vec<f64> = rtts(samples_of(d, packet_view(), Side::Server));
        let near = smp.iter().filter(|&&r| r > 0.5 * x).count();
        s.push(format!(
            "At {} ms the server-side sampler (1 in {} packets) took {} samples, {} of them above half the interval; its p50 {}, p95 {}.",
            phase_label(plan, i),
            4,
            smp.len(),
            near,
            f(p50(points, i, &ps)),
            f(pct(points, i, &ps, 95)),
        ));
    }
    s
}

fn rtt_step_observations(plan: &Plan, data: &[PhaseData]) -> Vec<String> {
    let d = &data[0];
    let half = plan.phases[0]
        .steps
        .first()
        .map(|s| s.at.as_secs_f64())
        .unwrap_or(0.0);
    let (lo, hi) = split_step(d, half);
    let mut s = Vec::new();
    let sock = PassiveKind::socket();
    for (name, v) in [
        ("RR".to_string(), &d.rr[..]),
        ("ping".to_string(), &d.ping[..]),
        ("tcp-connect".to_string(), &d.connect[..]),
        (
            // TCP's short name, as the table's columns say it
            format!("{} client", sock.map_or("", |k| k.short_name())),
            samples_of(d, sock, Side::Client),
        ),
        (
            packet(Side::Client),
            samples_of(d, packet_view(), Side::Client),
        ),
    ] {
        if v.is_empty() {
            continue;
        }
        let (a, b) = (med_in(v, d.start_unix, &lo), med_in(v, d.start_unix, &hi));
        s.push(format!(
            "{name}: p50 {} in the low halves, {} in the high halves (+{}).",
            f(a),
            f(b),
            f(b.zip(a).map(|(b, a)| b - a))
        ));
    }
    s
}

fn loss_observations(plan: &Plan, points: &[Vec<ViewSummary>]) -> Vec<String> {
    let (client, server) = (socket(Side::Client), socket(Side::Server));
    (0..points.len())
        .map(|i| {
            format!(
                "At {} % loss: request/response p50 {} / p95 {}, TCP client p50 {} / p95 {}, TCP server p50 {} / p95 {}.",
                phase_label(plan, i),
                fmt_ms(pct(points, i, "rr", 50)),
                f(pct(points, i, "rr", 95)),
                fmt_ms(pct(points, i, &client, 50)),
                f(pct(points, i, &client, 95)),
                fmt_ms(pct(points, i, &server, 50)),
                f(pct(points, i, &server, 95)),
            )
        })
        .collect()
}

fn bufferbloat_observations(
    plan: &Plan,
    points: &[Vec<ViewSummary>],
    data: &[PhaseData],
) -> Vec<String> {
    let mut s = Vec::new();
    let (client, pc) = (socket(Side::Client), packet(Side::Client));
    for (i, d) in data.iter().enumerate().take(points.len()) {
        let bw = d.bulk.as_ref().and_then(|b| b["received_bps"].as_f64());
        s.push(format!(
            "{}: RR p50 {}, ping p50 {}, TCP client p50 {}, sampler client p50 {}{}.",
            phase_label(plan, i),
            f(p50(points, i, "rr")),
            f(p50(points, i, "ping")),
            f(p50(points, i, &client)),
            f(p50(points, i, &pc)),
            bw.map(|b| format!(", bulk {:.1} Mbit/s", b / 1e6))
                .unwrap_or_default()
        ));
    }
    s
}

fn probe_interval_observations(plan: &Plan, points: &[Vec<ViewSummary>]) -> Vec<String> {
    let last = points.len().saturating_sub(1);
    let mut s = Vec::new();
    if let (Some(b), Some(x)) = (p50(points, 0, "rr"), p50(points, last, "rr")) {
        s.push(format!(
            "Request/response p50 was {:.1} times higher with one probe every {} ms than back to back ({} vs {}).",
            x / b,
            phase_label(plan, last),
            f(Some(x)),
            f(Some(b))
        ));
    }
    for i in 0..points.len() {
        s.push(format!(
            "Interval {}: RR p50 {} (p99 {}), ping p50 {} (p99 {}), server TCP p50 {}.",
            phase_label(plan, i),
            f(p50(points, i, "rr")),
            f(pct(points, i, "rr", 99)),
            f(p50(points, i, "ping")),
            f(pct(points, i, "ping", 99)),
            f(p50(points, i, &socket(Side::Server))),
        ));
    }
    s
}

/// rtt-step: the low and high windows (s since phase start), skipping 1 s after each step.
fn split_step(d: &PhaseData, half: f64) -> (Series, Series) {
    let len = d.end_unix - d.start_unix;
    let mut lo = Vec::new();
    let mut hi = Vec::new();
    if half <= 0.0 {
        return (lo, hi);
    }
    let mut t = 0.0;
    let mut high = false;
    while t < len {
        let w = (t + 1.0, (t + half).min(len));
        if high {
            hi.push(w)
        } else {
            lo.push(w)
        }
        high = !high;
        t += half;
    }
    (lo, hi)
}

fn med_in(v: &[(f64, f64)], t0: f64, wins: &[(f64, f64)]) -> Option<f64> {
    let x: Vec<f64> = v
        .iter()
        .filter(|(t, _)| wins.iter().any(|w| t - t0 >= w.0 && t - t0 < w.1))
        .map(|s| s.1)
        .collect();
    ViewSummary::of_samples("", None, &x).p50_us
}
