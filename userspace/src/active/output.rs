//! Printing a probe result: a ping- or netperf-like summary, netperf output
//! selectors (`-o`), and the result document (`--json FILE`, docs/results.md).
use std::fmt::Write;

use super::config::{IoMode, Kind};
use super::result::ProbeResult;
use crate::analysis::results::{RunResult, Sample, ViewKind, ViewSeries, ViewSummary};
use crate::analysis::units::fmt_duration_short;

/// netperf's output selectors that rttscope understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    MinLatency,
    MaxLatency,
    MeanLatency,
    P50Latency,
    P90Latency,
    P99Latency,
    StddevLatency,
    Throughput,
    ThroughputUnits,
}

/// A parsed `-o` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selectors(pub Vec<Selector>);

impl Selector {
    const ALL: [(&'static str, Selector, &'static str); 9] = [
        (
            "MIN_LATENCY",
            Selector::MinLatency,
            "Minimum Latency Microseconds",
        ),
        (
            "MAX_LATENCY",
            Selector::MaxLatency,
            "Maximum Latency Microseconds",
        ),
        (
            "MEAN_LATENCY",
            Selector::MeanLatency,
            "Mean Latency Microseconds",
        ),
        (
            "P50_LATENCY",
            Selector::P50Latency,
            "50th Percentile Latency Microseconds",
        ),
        (
            "P90_LATENCY",
            Selector::P90Latency,
            "90th Percentile Latency Microseconds",
        ),
        (
            "P99_LATENCY",
            Selector::P99Latency,
            "99th Percentile Latency Microseconds",
        ),
        (
            "STDDEV_LATENCY",
            Selector::StddevLatency,
            "Stddev Latency Microseconds",
        ),
        ("THROUGHPUT", Selector::Throughput, "Throughput"),
        (
            "THROUGHPUT_UNITS",
            Selector::ThroughputUnits,
            "Throughput Units",
        ),
    ];

    /// netperf's column header for this selector.
    pub fn header(self) -> &'static str {
        Self::ALL.iter().find(|x| x.1 == self).map(|x| x.2).unwrap()
    }
}

/// Parse `MIN_LATENCY,P99_LATENCY,...` (case-insensitive, spaces allowed).
pub fn parse_selectors(s: &str) -> Result<Selectors, String> {
    let mut v = Vec::new();
    for name in s.split(',').map(|x| x.trim()).filter(|x| !x.is_empty()) {
        let up = name.to_ascii_uppercase();
        match Selector::ALL.iter().find(|x| x.0 == up) {
            Some(x) => v.push(x.1),
            None => {
                let known: Vec<&str> = Selector::ALL.iter().map(|x| x.0).collect();
                return Err(format!(
                    "unknown output selector '{name}': use {}",
                    known.join(", ")
                ));
            }
        }
    }
    if v.is_empty() {
        return Err("no output selector given".into());
    }
    Ok(Selectors(v))
}

fn us(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.2}")
    }
}

/// netperf style: a header line and a value line, comma-separated.
pub fn selectors(r: &ProbeResult, sel: &[Selector], netperf_pct: bool) -> String {
    let s = &r.summary;
    let np = &r.netperf;
    let pct = |exact: f64, hist: u64| {
        if netperf_pct {
            hist.to_string()
        } else {
            us(exact)
        }
    };
    let vals: Vec<String> = sel
        .iter()
        .map(|x| match x {
            Selector::MinLatency => us(s.min),
            Selector::MaxLatency => us(s.max),
            Selector::MeanLatency => us(s.mean),
            Selector::P50Latency => pct(s.p50, np.p50),
            Selector::P90Latency => pct(s.p90, np.p90),
            Selector::P99Latency => pct(s.p99, np.p99),
            Selector::StddevLatency => us(s.stddev),
            Selector::Throughput => format!("{:.2}", r.throughput),
            Selector::ThroughputUnits => r.throughput_units.clone(),
        })
        .collect();
    let headers: Vec<&str> = sel.iter().map(|x| x.header()).collect();
    format!("{}\n{}\n", headers.join(","), vals.join(","))
}

fn interval_text(r: &ProbeResult) -> String {
    let st = &r.settings;
    if st.interval_ns == 0 {
        "0 (back to back)".into()
    } else {
        format!(
            "{} ({})",
            fmt_duration_short(std::time::Duration::from_nanos(st.interval_ns)),
            st.pacing
        )
    }
}

/// The human summary: ping-like for ICMP, netperf-like for TCP/UDP.
/// A loss percentage as ping prints it (`0%`, `20%`, `33.3333%`).
fn fmt_loss(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{p:.0}")
    } else {
        format!("{p:.4}").trim_end_matches('0').to_string()
    }
}

/// An RTT as ping prints it: milliseconds, 3 significant decimals below 10 ms.
pub fn ping_ms(rtt_ns: u64) -> String {
    let ms = rtt_ns as f64 / 1e6;
    if ms < 1.0 {
        format!("{ms:.3}")
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 100.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

/// The view name of a probe kind in result documents and compare's rows (netperf's test
/// names, `ICMP`, `TCP_CONNECT`).
pub fn view_name(kind: Kind) -> &'static str {
    match kind {
        Kind::TcpRr => "TCP_RR",
        Kind::UdpRr => "UDP_RR",
        Kind::Icmp => "ICMP",
        Kind::TcpConnect => "TCP_CONNECT",
    }
}

/// A probe's result as an rttscope result document (`docs/results.md`, what `probe --json FILE`
/// writes): the settings at the top, one view whose samples are the transactions (send offset
/// and RTT, microseconds), the summary, and every count in `details`. Lossless:
/// [`probe_from_document`] gives the `ProbeResult` back.
pub fn probe_document(r: &ProbeResult) -> RunResult {
    let name = view_name(r.settings.kind);
    let kind = if r.settings.kind == Kind::Icmp {
        ViewKind::Ping
    } else {
        ViewKind::Probe
    };
    let settings = serde_json::to_value(&r.settings).unwrap_or_default();
    let mut res = RunResult::new(
        format!(
            "probe {}",
            match r.settings.kind {
                Kind::TcpRr => "tcp-rr",
                Kind::UdpRr => "udp-rr",
                Kind::Icmp => "icmp",
                Kind::TcpConnect => "tcp-connect",
            }
        ),
        settings,
    );
    res.start_unix_s = Some(r.start_unix_s);
    let mut v = ViewSeries::new(name, kind);
    v.flow = Some(format!("-> {}", target_addr(r)));
    for (what, n) in [
        ("lost", r.counts.lost),
        ("errors", r.counts.errors),
        ("samples_dropped", r.counts.samples_dropped),
    ] {
        if n > 0 {
            v.dropped.insert(what.to_string(), n);
        }
    }
    v.samples = r
        .samples
        .iter()
        .map(|&(t, rtt)| Sample {
            t_us: t as f64 / 1e3,
            rtt_us: rtt as f64 / 1e3,
        })
        .collect();
    v.summary = Some(probe_summary(r, name, kind, &v.samples));
    let mut details = serde_json::to_value(r).unwrap_or_default();
    if let Some(o) = details.as_object_mut() {
        for k in ["settings", "samples", "start_unix_s", "summary"] {
            o.remove(k);
        }
    }
    v.details = details;
    res.views.push(v);
    res
}

fn target_addr(r: &ProbeResult) -> String {
    match r.settings.kind {
        Kind::Icmp => r.settings.address.to_string(),
        _ => std::net::SocketAddr::new(r.settings.address, r.settings.port).to_string(),
    }
}

/// The view's summary: the probe's own (exact, or HDR when samples were dropped), p5/p95 from
/// the kept samples when they are all there, netperf's histogram percentiles in `extra`.
fn probe_summary(r: &ProbeResult, name: &str, kind: ViewKind, samples: &[Sample]) -> ViewSummary {
    let mut s = ViewSummary::from_stats(name, Some(kind), &r.summary);
    if r.summary_source == "exact" && !samples.is_empty() {
        let rtts: Vec<f64> = samples.iter().map(|x| x.rtt_us).collect();
        let exact = ViewSummary::of_samples(name, Some(kind), &rtts);
        (s.p5_us, s.p95_us) = (exact.p5_us, exact.p95_us);
    } else if r.summary_source != "exact" {
        s.method = Some(format!(
            "{} (samples beyond --max-samples dropped)",
            r.summary_source
        ));
    }
    for (k, v) in [
        ("netperf_p50_us", r.netperf.p50),
        ("netperf_p90_us", r.netperf.p90),
        ("netperf_p99_us", r.netperf.p99),
    ] {
        if s.count > 0 {
            s.extra.insert(k.into(), v as f64);
        }
    }
    s
}

/// The `ProbeResult` a [`probe_document`] was made from (`None` when the document is not one
/// probe's: another command's, or a field missing).
pub fn probe_from_document(doc: &RunResult) -> Option<ProbeResult> {
    let [v] = doc.views.as_slice() else {
        return None;
    };
    let sum = v.summary.as_ref()?;
    let nan = |x: Option<f64>| x.unwrap_or(f64::NAN);
    let summary = crate::analysis::stats::Summary {
        n: sum.count,
        min: nan(sum.min_us),
        mean: nan(sum.mean_us),
        p50: nan(sum.p50_us),
        p90: nan(sum.p90_us),
        p99: nan(sum.p99_us),
        max: nan(sum.max_us),
        stddev: nan(sum.stddev_us),
    };
    let mut o = v.details.as_object()?.clone();
    o.insert("settings".into(), doc.settings.clone());
    o.insert("start_unix_s".into(), doc.start_unix_s?.into());
    o.insert("summary".into(), serde_json::to_value(summary).ok()?);
    let ns = |us: f64| (us * 1e3).round() as u64;
    let samples: Vec<(u64, u64)> = v
        .samples
        .iter()
        .map(|s| (ns(s.t_us), ns(s.rtt_us)))
        .collect();
    o.insert("samples".into(), serde_json::to_value(samples).ok()?);
    serde_json::from_value(serde_json::Value::Object(o)).ok()
}

/// The text summary: ping's lines for ICMP, their like for handshakes, netperf-like lines
/// otherwise.
pub fn human(r: &ProbeResult) -> String {
    match r.settings.kind {
        Kind::Icmp => human_ping(r),
        Kind::TcpConnect => human_connect(r),
        Kind::TcpRr | Kind::UdpRr => human_rr(r),
    }
}

/// `probe tcp-connect`'s summary, in ping's shape: the counts (refused and timed-out
/// handshakes said apart), the rtt lines, then the settings and the SYNs sent again.
fn human_connect(r: &ProbeResult) -> String {
    let mut o = String::new();
    let c = &r.counts;
    let failed = if c.sent > 0 {
        100.0 * c.lost as f64 / c.sent as f64
    } else {
        0.0
    };
    let target = std::net::SocketAddr::new(r.settings.address, r.settings.port);
    let _ = writeln!(o, "--- {target} tcp-connect statistics ---");
    let _ = writeln!(
        o,
        "{} handshakes, {} connected, {} refused, {} timed out, {}% failed, time {:.0}ms",
        c.sent,
        c.received,
        c.refused,
        c.lost - c.errors.min(c.lost),
        fmt_loss(failed),
        r.elapsed_s * 1000.0
    );
    if c.received > 0 {
        ping_rtt(&mut o, r);
    }
    let st = &r.settings;
    let _ = writeln!(
        o,
        "settings: interval {}, timeout {}, {} SYN retransmissions, clock {}",
        interval_text(r),
        fmt_duration_short(std::time::Duration::from_nanos(st.timeout_ns)),
        c.syn_retransmits,
        st.clock
    );
    o
}

/// Milliseconds with three decimals, as ping prints them ("-": no value).
fn ms(v: f64) -> String {
    if v.is_nan() {
        "-".to_string()
    } else {
        format!("{:.3}", v / 1000.0)
    }
}

/// ping's summary: its statistics, its rtt lines, then the probe's settings.
fn human_ping(r: &ProbeResult) -> String {
    let mut o = String::new();
    ping_statistics(&mut o, r);
    ping_rtt(&mut o, r);
    ping_settings(&mut o, r);
    o
}

/// ping's two statistics lines, to the letter (ping prints only the counts that are not zero:
/// "+N duplicates"), then rttscope's own late and reordered counts when either is not zero.
fn ping_statistics(o: &mut String, r: &ProbeResult) {
    let c = &r.counts;
    let loss = if c.sent > 0 {
        100.0 * c.lost as f64 / c.sent as f64
    } else {
        0.0
    };
    let _ = writeln!(o, "--- {} ping statistics ---", r.settings.target);
    let mut line = format!("{} packets transmitted, {} received", c.sent, c.received);
    if c.duplicates > 0 {
        line += &format!(", +{} duplicates", c.duplicates);
    }
    if c.errors > 0 {
        line += &format!(", +{} errors", c.errors);
    }
    let _ = writeln!(
        o,
        "{line}, {}% packet loss, time {:.0}ms",
        fmt_loss(loss),
        r.elapsed_s * 1000.0
    );
    if c.late > 0 || c.reordered > 0 {
        let _ = writeln!(o, "{} late, {} reordered", c.late, c.reordered);
    }
}

/// ping's rtt line (min/avg/max/mdev) and, from 2 samples on (when percentiles say something;
/// netperf's histogram the same), the percentiles with netperf's.
fn ping_rtt(o: &mut String, r: &ProbeResult) {
    let s = &r.summary;
    let _ = writeln!(
        o,
        "rtt min/avg/max/mdev = {}/{}/{}/{} ms",
        ms(s.min),
        ms(s.mean),
        ms(s.max),
        ms(s.stddev)
    );
    if s.n >= 2 {
        let _ = writeln!(
            o,
            "rtt p50/p90/p99 = {}/{}/{} ms (netperf histogram: {}/{}/{} us)",
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            r.netperf.p50,
            r.netperf.p90,
            r.netperf.p99
        );
    }
}

/// The ICMP probe's settings line: payload, interval, burst, timeout, socket kind and clock.
fn ping_settings(o: &mut String, r: &ProbeResult) {
    let st = &r.settings;
    let _ = writeln!(
        o,
        "settings: payload {} B, interval {}, burst {}, timeout {}, {} socket, clock {}",
        st.req_size,
        interval_text(r),
        st.burst,
        fmt_duration_short(std::time::Duration::from_nanos(st.timeout_ns)),
        st.icmp_socket.as_deref().unwrap_or("?"),
        st.clock
    );
}

/// netperf-like summary of a TCP or UDP request/response run: the headline, the latency lines,
/// the counts (always for UDP, for TCP only with errors), then the probe's settings.
fn human_rr(r: &ProbeResult) -> String {
    let mut o = String::new();
    rr_headline(&mut o, r);
    rr_latency(&mut o, r);
    if r.settings.kind == Kind::UdpRr || r.counts.errors > 0 {
        let c = &r.counts;
        let _ = writeln!(
            o,
            "sent {} received {} lost {} late {} duplicates {} reordered {} errors {}",
            c.sent, c.received, c.lost, c.late, c.duplicates, c.reordered, c.errors
        );
    }
    rr_settings(&mut o, r);
    o
}

/// The first line: kind, target, address and port, transactions, run time and throughput.
fn rr_headline(o: &mut String, r: &ProbeResult) {
    let st = &r.settings;
    let _ = writeln!(
        o,
        "{} to {} ({}) port {}: {} in {:.2} s, {:.2} {}",
        st.kind.label(),
        st.target,
        st.address,
        st.port,
        crate::sinks::table::count(r.counts.received, "transaction"),
        r.run_s,
        r.throughput,
        r.throughput_units
    );
}

/// The latency line in microseconds (with where the summary comes from and the sample count)
/// and, from 2 samples on, netperf's histogram percentiles.
fn rr_latency(o: &mut String, r: &ProbeResult) {
    let s = &r.summary;
    let _ = writeln!(
        o,
        "latency us: min {} mean {} p50 {} p90 {} p99 {} max {} stddev {} ({}, {})",
        us(s.min),
        us(s.mean),
        us(s.p50),
        us(s.p90),
        us(s.p99),
        us(s.max),
        us(s.stddev),
        r.summary_source,
        crate::sinks::table::count(s.n, "sample")
    );
    if s.n >= 2 {
        let _ = writeln!(
            o,
            "netperf histogram us: p50 {} p90 {} p99 {}",
            r.netperf.p50, r.netperf.p90, r.netperf.p99
        );
    }
}

/// The request/response probe's settings line: sizes, interval, burst, nodelay, timeout, I/O
/// mode and clock.
fn rr_settings(o: &mut String, r: &ProbeResult) {
    let st = &r.settings;
    let _ = writeln!(
        o,
        "settings: request {} B, response {} B, interval {}, burst {}, nodelay {}, timeout {}, io {}, clock {}",
        st.req_size,
        st.resp_size,
        interval_text(r),
        st.burst,
        if st.nodelay { "on" } else { "off" },
        fmt_duration_short(std::time::Duration::from_nanos(st.timeout_ns)),
        io_label(st.io, st.busy_poll),
        st.clock
    );
}

/// How the probe did its I/O, in the settings line's words.
fn io_label(io: IoMode, busy_poll: bool) -> &'static str {
    match (io, busy_poll) {
        (IoMode::BlockingThread, false) => "blocking thread",
        (IoMode::BlockingThread, true) => "blocking thread, busy-poll",
        (IoMode::TokioReactor, false) => "tokio reactor",
        (IoMode::TokioReactor, true) => "tokio reactor, busy-poll",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::active::result::{Counts, Settings};
    use crate::analysis::stats::{NetperfPercentiles, Summary};

    fn result(kind: Kind) -> ProbeResult {
        ProbeResult {
            settings: Settings {
                kind,
                target: "h".into(),
                address: "10.0.0.1".parse().unwrap(),
                port: 7878,
                interval_ns: 10_000_000,
                burst: 1,
                req_size: 1,
                resp_size: 1,
                duration_s: Some(2.0),
                count: None,
                spin: false,
                busy_poll: false,
                nodelay: false,
                timeout_ns: 1_000_000_000,
                pacing: "sleep (timerfd)".into(),
                clock: "CLOCK_MONOTONIC".into(),
                icmp_socket: None,
                io: IoMode::TokioReactor,
                ttl: None,
            },
            start_unix_s: 0.0,
            elapsed_s: 2.0,
            run_s: 2.0,
            counts: Counts {
                sent: 4,
                received: 4,
                ..Default::default()
            },
            summary: Summary::from_us(&[10.0, 20.0, 30.0, 40.0]),
            summary_source: "exact".into(),
            netperf: NetperfPercentiles {
                p50: 20,
                p90: 40,
                p99: 40,
            },
            throughput: 2.0,
            throughput_units: "Trans/s".into(),
            samples: vec![(0, 10_000), (1, 20_000), (2, 30_000), (3, 40_000)],
            last_error: None,
            ident: Default::default(),
        }
    }

    #[test]
    fn selector_output() {
        let r = result(Kind::TcpRr);
        let sel = parse_selectors("min_latency,P50_LATENCY, throughput,THROUGHPUT_UNITS").unwrap();
        assert_eq!(
            selectors(&r, &sel.0, false),
            "Minimum Latency Microseconds,50th Percentile Latency Microseconds,Throughput,Throughput Units\n10.00,20.00,2.00,Trans/s\n"
        );
        let sel = parse_selectors("P99_LATENCY").unwrap();
        assert_eq!(
            selectors(&r, &sel.0, true),
            "99th Percentile Latency Microseconds\n40\n"
        );
        assert!(parse_selectors("FOO").is_err());
        assert!(parse_selectors(" , ").is_err());
    }

    #[test]
    fn human_output() {
        let t = human(&result(Kind::TcpRr));
        assert!(
            t.contains("TCP_RR to h (10.0.0.1) port 7878: 4 transactions"),
            "{t}"
        );
        assert!(t.contains("interval 10ms (sleep (timerfd))"), "{t}");
        let t = human(&result(Kind::Icmp));
        assert!(t.contains("4 packets transmitted, 4 received"), "{t}");
        assert!(
            t.contains("rtt min/avg/max/mdev = 0.010/0.025/0.040/"),
            "{t}"
        );
    }

    /// With fewer than 2 samples there is no percentile worth a line (it read `netperf
    /// histogram: 0/0/0 us`); from 2 on, the line is there.
    #[test]
    fn no_histogram_line_below_two_samples() {
        for kind in [Kind::TcpRr, Kind::Icmp] {
            for (samples, want) in [
                (vec![], false),
                (vec![25.0], false),
                (vec![25.0, 30.0], true),
            ] {
                let mut r = result(kind);
                r.summary = Summary::from_us(&samples);
                r.counts.received = samples.len() as u64;
                let t = human(&r);
                assert_eq!(
                    t.contains("netperf histogram"),
                    want,
                    "{kind:?} {samples:?}: {t}"
                );
            }
        }
    }

    #[test]
    fn json_roundtrip() {
        let r = result(Kind::UdpRr);
        let j = serde_json::to_string(&r).unwrap();
        let back: ProbeResult = serde_json::from_str(&j).unwrap();
        // serde_json's default float parsing may differ in the last bit.
        assert_eq!(back.samples, r.samples);
        assert_eq!(back.settings, r.settings);
        assert!((back.summary.stddev - r.summary.stddev).abs() < 1e-9);
        assert!(j.contains("\"clock\":\"CLOCK_MONOTONIC\""));
        assert!(j.contains("\"kind\":\"udp-rr\""));
    }

    /// What `probe --json FILE` writes is a result document that gives the probe's result back
    /// bit for bit, and that `bucket` reads (one set, microsecond samples).
    #[test]
    fn probe_document_round_trips_and_feeds_bucket() {
        for kind in [Kind::TcpRr, Kind::UdpRr, Kind::Icmp] {
            let mut r = result(kind);
            r.samples = vec![
                (0, 10_123),
                (1_000_001, 20_000),
                (2_500_000_003, 30_999),
                (3, 40_000),
            ];
            r.counts.lost = 2;
            let doc = probe_document(&r);
            let text = doc.to_json().unwrap();
            let back = RunResult::from_json(&text, "probe.json").unwrap();
            assert_eq!(back.version, crate::analysis::results::VERSION);
            let v = &back.views[0];
            assert_eq!(v.samples[1].t_us, 1000.001, "{kind:?}");
            assert_eq!(v.samples[0].rtt_us, 10.123);
            assert_eq!(v.dropped["lost"], 2);
            let s = v.summary.as_ref().unwrap();
            // p5 from the samples kept; the rest is the probe's own summary
            assert_eq!((s.count, s.p50_us, s.p5_us), (4, Some(20.0), Some(10.123)));
            assert_eq!(s.extra["netperf_p99_us"], 40.0);
            let p = probe_from_document(&back).expect("a probe document");
            assert_eq!(p, r, "{kind:?}");
            let sets = crate::analysis::input::load_sample_sets(&text, "probe.json").unwrap();
            assert_eq!(sets.len(), 1);
            assert_eq!(sets[0].samples.len(), r.samples.len());
            assert_eq!(sets[0].samples[2].t_s(), 2.500000003);
        }
    }

    /// What rttscope 0.1's `probe --json` wrote (the probe's own struct, before the result
    /// document) is refused in one sentence that says so, by `bucket` and by `chart`.
    #[test]
    fn probe_json_of_0_1_is_refused_in_one_sentence() {
        let old = serde_json::to_string(&result(Kind::UdpRr)).unwrap();
        let e = crate::analysis::input::load_sample_sets(&old, "old.json").unwrap_err();
        let want = "old.json was written by rttscope 0.1's probe --json, which this version no longer reads; re-run the probe with this version";
        assert_eq!(e.to_string(), want);
        let path = std::env::temp_dir().join(format!("rttscope-0.1-{}.json", std::process::id()));
        std::fs::write(&path, &old).unwrap();
        let e = crate::analysis::input::load_result(&path)
            .unwrap_err()
            .to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(e.ends_with("re-run the probe with this version"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        // a document of another format is not taken for one
        let e = crate::analysis::input::load_sample_sets(r#"{"format":"x"}"#, "x.json");
        assert!(!e.unwrap_err().to_string().contains("0.1"));
    }
}
