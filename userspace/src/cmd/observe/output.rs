//! What `observe` prints: the start record or header, each interval (table
//! or JSON Lines, cloud-bucket lines), raw samples, and the end record.
use std::collections::BTreeMap;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use serde::Serialize;

use super::args::{Format, ObserveArgs};
use crate::analysis::records::{self, CloudPoint};
use crate::analysis::units::fmt_duration_short;
use crate::session::{Interval, RawSample, Session};
use crate::views::ViewKind;

/// `--format cloud-monitoring`: one create request per line (at most 200 series each), every
/// label set's samples since the start.
pub(super) fn cloud_requests(
    export: &crate::analysis::cloud_monitoring::LiveExport,
    end_unix_s: f64,
    out: &mut impl Write,
) -> Result<()> {
    let host = crate::analysis::results::HostInfo::current().hostname;
    for r in export.requests(end_unix_s, &host) {
        writeln!(out, "{r}")?;
    }
    out.flush()?;
    Ok(())
}

pub(super) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The settings recorded in the start record (and in the `--json` document), with each view's
/// options ([`crate::views::ViewArgs::record`]); keys in alphabetical order, as they always were
/// (a JSON object's, serde_json's map).
#[derive(Serialize)]
struct Settings<'a> {
    addrs: Vec<String>,
    all_netns: bool,
    duration_s: Option<f64>,
    histogram: &'static str,
    interval_s: f64,
    loader: &'a crate::views::LoaderKind,
    max_flows: u32,
    netns: &'a [String],
    ports: &'a [u16],
    raw: bool,
}

/// The settings recorded in the start record (and in the `--json` document).
pub(super) fn settings(args: &ObserveArgs) -> serde_json::Value {
    let mut settings = serde_json::to_value(Settings {
        addrs: args.addrs.iter().map(|a| a.to_string()).collect(),
        all_netns: args.all_netns,
        duration_s: args.duration.map(|d| d.as_secs_f64()),
        histogram: "log-linear: 1 us buckets below 128 us, then 64 linear sub-buckets per power of two (<= 1.6% wide, open above 33 s); percentiles within 0.8% of the exact ones",
        interval_s: args.interval.as_secs_f64(),
        loader: &args.loader,
        max_flows: args.max_flows,
        netns: &args.netns,
        ports: &args.ports,
        raw: args.raw,
    })
    .expect("settings serialise");
    if let Some(map) = settings.as_object_mut() {
        args.view_opts.record(map);
        // checked before anything was attached (otlp_config): an error here cannot happen
        let otlp = super::otlp_settings(args).ok().flatten();
        map.insert("exports".into(), exports(args, otlp.as_ref()));
    }
    settings
}

/// Where the metrics go, without a secret: `/metrics` (address, web config file) and OTLP as
/// resolved from flags, TOML and the OTEL_EXPORTER_OTLP_* environment (the URL without any
/// credentials, header names without their values, file paths, timeout, compression).
fn exports(
    args: &ObserveArgs,
    otlp: Option<&crate::sinks::prometheus::daemon::OtlpConfig>,
) -> serde_json::Value {
    let metrics = args.listen.map(|a| {
        serde_json::json!({
            "listen": a.to_string(),
            "web_config_file": args.web_config_file.as_ref().map(|p| p.display().to_string()),
        })
    });
    let otlp = otlp.map(|o| {
        let s = &o.settings;
        let e = &s.endpoint;
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
        serde_json::json!({
            "endpoint": format!("{}://{}{}", if e.tls { "https" } else { "http" }, e.host_header, e.path),
            "protocol": "http/protobuf",
            "interval_s": o.interval.as_secs_f64(),
            "timeout_s": s.timeout.as_secs_f64(),
            "compression": match s.compression {
                crate::sinks::otlp::settings::Compression::None => "none",
                crate::sinks::otlp::settings::Compression::Gzip => "gzip",
            },
            "header_names": s.headers.iter().map(|h| h.name.clone()).collect::<Vec<_>>(),
            "ca_file": path(&s.tls.ca_file),
            "client_cert": path(&s.tls.client_cert),
            "client_key": path(&s.tls.client_key),
        })
    });
    serde_json::json!({ "metrics": metrics, "otlp": otlp })
}

/// Unix time (seconds) of `mono_ns` (CLOCK_MONOTONIC): the start record's `ts` is the Unix time
/// of t = 0 itself, so `ts + t` of a raw sample is its Unix time (the lab selects samples by it).
pub(super) fn unix_at(mono_ns: u64) -> f64 {
    (mono_ns as i64 + crate::sys::clock::realtime_minus_mono_ns()) as f64 / 1e9
}

/// The start record; `start_mono`: t = 0 of the raw samples.
pub(super) fn start_record(
    args: &ObserveArgs,
    session: &Session,
    views: &[ViewKind],
    start_mono: u64,
) -> Result<records::Start> {
    let mut start = records::Start {
        clock: "CLOCK_MONOTONIC (raw sample ts_ns); t = seconds since start".into(),
        settings: settings(args),
        ts: Some(unix_at(start_mono)),
        read_s: Some(session.window_read_s()),
        // 2: `hooks` in the interval and end records (issue 41); 3: `handshakes`, `handshake_us`,
        // `samples_before_window` (issue 45 items 3, 5), `nat` and `remote_name` in flow rows and
        // end flows (issue 45 items 1-2); 4: `type` first in every record, keys in their
        // structs' order, an unattached view's key left out of this record (issue 42 item 4);
        // a sampler row's samples come from one interface, `iface_samples` in end flows
        // (views/sampler/join.rs, issue 41); 5: `settings.exports`, where the metrics go
        // (issue 46); 6: `read_s` in the start and interval records, how long the views' reads
        // took from `ts` (each view's window edge lies in that span)
        version: 6,
        views: views.iter().map(|v| v.as_str().to_string()).collect(),
        ..Default::default()
    };
    for a in session.attached() {
        if let Some(value) = &a.start {
            debug_assert!(a.kind.info().start_about.is_some(), "{:?}", a.kind);
            start.view_values.set(a.kind, value.clone());
        }
    }
    Ok(start)
}

/// The table's header line: interval and each view's hook and settings.
pub(super) fn header(args: &ObserveArgs, session: &Session) -> String {
    let mut header = format!(
        "rttscope observe | interval {}",
        fmt_duration_short(args.interval)
    );
    for a in session.attached() {
        header += &format!(" | view {}: {}", a.kind.as_str(), a.hooks);
    }
    header
}

/// The start record (JSON) or the header and the attach lines (table).
pub(super) fn print_start(
    args: &ObserveArgs,
    session: &Session,
    views: &[ViewKind],
    header: &str,
    start_mono: u64,
) -> Result<()> {
    if args.quiet {
        return Ok(()); // --quiet: no start record, header nor attach lines
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.format {
        Format::Json => {
            let line = serde_json::to_string(&start_record(args, session, views, start_mono)?)?;
            writeln!(out, "{line}")?;
        }
        Format::CloudMonitoring => {
            // Standard output carries only the create requests.
            eprintln!(
                "rttscope observe: one projects.timeSeries.create request per line per interval, metric {}, layout {}, from the kernel's per-flow histograms (docs/cloud.md)",
                crate::analysis::cloud_monitoring::METRIC_TYPE,
                args.cloud_layout.spec()
            );
        }
        Format::Table => {
            writeln!(out, "{header}")?;
            for line in session.attached().iter().flat_map(|a| &a.notes) {
                writeln!(out, "{line}")?;
            }
            writeln!(out, "waiting for samples...\n")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// One interval: its record or table, then the cloud-bucket points.
pub(super) fn print_interval(
    args: &ObserveArgs,
    header: &str,
    views: &[&str],
    iv: &Interval,
    cloud_lines: &[(&'static str, CloudPoint)],
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.format {
        // Written by the report from its cloud sink (cloud_requests).
        Format::CloudMonitoring => {}
        Format::Json => {
            writeln!(out, "{}", serde_json::to_string(iv)?)?;
            for (name, p) in cloud_lines {
                let c = records::Cloud {
                    point: p.clone(),
                    view: (*name).into(),
                };
                writeln!(out, "{}", serde_json::to_string(&c)?)?;
            }
        }
        Format::Table => {
            crate::sinks::table::print_table(&mut out, header, iv, views)?;
            for (name, p) in cloud_lines {
                let f = |v: Option<f64>| {
                    v.map(crate::analysis::units::fmt_ms)
                        .unwrap_or_else(|| "-".into())
                };
                writeln!(
                    out,
                    "cloud buckets {name}: {} period from t={:.1}s ({:.0}s): n {} p50 {} p95 {} p99 {} ms ({})",
                    if p.complete { "completed" } else { "so far," },
                    p.period_start_s,
                    p.period_s,
                    p.count,
                    f(p.p50_us),
                    f(p.p95_us),
                    f(p.p99_us),
                    args.cloud_layout.spec()
                )?;
            }
            if !cloud_lines.is_empty() {
                writeln!(out)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// The end record (JSON: every flow's summary since start, counters) or the
/// closing line (table).
pub(super) fn print_end(
    args: &ObserveArgs,
    session: &Session,
    header: &str,
    views: &[ViewKind],
    elapsed_s: f64,
    summary: crate::session::WholeRun,
) -> Result<()> {
    // --format cloud-monitoring: standard output carries only the create requests.
    let mut out: Box<dyn Write> = match args.format {
        Format::CloudMonitoring => Box::new(std::io::stderr().lock()),
        _ => Box::new(std::io::stdout().lock()),
    };
    let counters = &summary.counters;
    if args.quiet {
        // --quiet: no end record, whole-run table nor closing line.
        return Ok(());
    }
    if args.format == Format::Json {
        let end = records::End {
            counters: records::counters(counters),
            flows: summary.flows,
            hooks: summary.hooks,
            handshakes: summary
                .handshakes
                .iter()
                .map(|(v, t)| {
                    let sides = t
                        .iter()
                        .map(|(s, h)| (s.as_str().into(), records::EndView::of(h)));
                    (v.as_str().into(), sides.collect())
                })
                .collect(),
            t: elapsed_s,
            ts: unix_now(),
        };
        writeln!(out, "{}", serde_json::to_string(&end)?)?;
    } else {
        if args.format == Format::Table {
            // The whole run, every flow seen (closed ones marked `*`).
            let names: Vec<&str> = views.iter().map(|v| v.as_str()).collect();
            let iv = summary.as_interval(elapsed_s);
            crate::sinks::table::print_table(
                &mut out,
                &format!("{header} | whole run"),
                &iv,
                &names,
            )?;
        }
        writeln!(out, "{}", closing_line(session, elapsed_s, counters))?;
    }
    out.flush()?;
    Ok(())
}

/// The closing line of the table: the run's length and each view's main counters.
fn closing_line(
    session: &Session,
    elapsed_s: f64,
    counters: &BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
) -> String {
    let mut line = format!("done after {elapsed_s:.1}s");
    for a in session.attached() {
        if let Some(c) = counters.get(a.kind.as_str()) {
            line += &format!(" | {}: {}", a.kind.as_str(), (a.closing)(c));
        }
    }
    line
}

/// Raw samples of every view: into the result document (--json), and as output lines unless
/// `fmt` is None (--quiet). A sampler sample's side is the one its flow's row has (the
/// programs' label, else the TCP view's or the socket table's, for a flow opened before the
/// sampler started): the session resolved it.
pub(super) fn raw_lines(
    samples: &mut Vec<RawSample>,
    start_mono: u64,
    fmt: Option<Format>,
    lines: &mut Vec<String>,
) {
    super::result::record_raw(samples, start_mono);
    let Some(fmt) = fmt else {
        samples.clear();
        return;
    };
    for s in samples.drain(..) {
        match fmt {
            // --raw is refused with --format cloud-monitoring (check()).
            Format::CloudMonitoring => continue,
            f => lines.push(raw_line(&s, start_mono, f)),
        }
    }
}

/// One raw sample as a JSON Lines `sample` record or a table line (a view with TCP's srtt
/// says the side and the srtt too).
pub(super) fn raw_line(s: &RawSample, start_mono: u64, fmt: Format) -> String {
    let t = (s.ts_ns as i64 - start_mono as i64) as f64 / 1e9;
    let (kind, f) = (s.label(), &s.flow);
    match fmt {
        Format::Json => serde_json::to_string(&records::Sample {
            local: f.local.to_string(),
            matching: s.matching.map(Into::into),
            netns: f.netns,
            proto: s.proto.map(Into::into),
            remote: f.remote.to_string(),
            rtt_us: s.rtt_us.into(),
            side: Some(s.side),
            srtt_us: s.srtt_us,
            t,
            t_us: Some(t * 1e6),
            view: kind.into(),
        })
        .expect("a sample serialises"),
        _ => match s.srtt_us {
            Some(srtt) => format!(
                "raw {kind:<8} t={t:.6}s {f} side={} rtt={}us srtt={srtt}us",
                s.side.as_str(),
                s.rtt_us,
            ),
            None => format!("raw {kind:<8} t={t:.6}s {f} rtt={}us", s.rtt_us),
        },
    }
}

pub(super) fn flush_raw(lines: &mut Vec<String>, stdout: &std::io::Stdout) -> Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut out = stdout.lock();
    for l in lines.drain(..) {
        writeln!(out, "{l}")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::flow::Flow;

    /// The start record's `settings.exports` says where the metrics go, and never a secret:
    /// the header's value, given by a flag, appears nowhere in it.
    #[test]
    fn exports_name_the_destinations_without_secrets() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "rttscope",
            "observe",
            "--listen",
            "127.0.0.1:9464",
            "--web-config-file",
            "/etc/rttscope/web.yml",
            "--otlp",
            "https://127.0.0.1:4318/v1/metrics",
            "--otlp-header",
            "authorization=Bearer s3cr3t-t0ken",
            "--otlp-compression",
            "gzip",
            "--otlp-interval",
            "30s",
        ])
        .unwrap();
        let crate::cli::Command::Observe(args) = cli.command else {
            panic!()
        };
        let s = settings(&args);
        let e = &s["exports"];
        assert_eq!(e["metrics"]["listen"], "127.0.0.1:9464", "{e}");
        assert_eq!(
            e["metrics"]["web_config_file"], "/etc/rttscope/web.yml",
            "{e}"
        );
        assert_eq!(
            e["otlp"]["endpoint"], "https://127.0.0.1:4318/v1/metrics",
            "{e}"
        );
        assert_eq!(e["otlp"]["protocol"], "http/protobuf", "{e}");
        assert_eq!(e["otlp"]["interval_s"], 30.0, "{e}");
        assert_eq!(e["otlp"]["compression"], "gzip", "{e}");
        assert_eq!(
            e["otlp"]["header_names"],
            serde_json::json!(["authorization"]),
            "{e}"
        );
        assert!(!s.to_string().contains("s3cr3t"), "{s}");
        // neither sink: both null
        let cli = crate::cli::Cli::try_parse_from(["rttscope", "observe"]).unwrap();
        let crate::cli::Command::Observe(args) = cli.command else {
            panic!()
        };
        let e = &settings(&args)["exports"];
        assert!(e["metrics"].is_null() && e["otlp"].is_null(), "{e}");
    }

    /// `--format cloud-monitoring`: the histogram deltas the session hands its sinks become
    /// CUMULATIVE TimeSeries that our own reader parses back, every sample counted.
    #[test]
    fn cloud_monitoring_interval_reads_back() {
        use crate::views::view::{FlowDelta, FlowSink};
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "rttscope",
            "observe",
            "--format",
            "cloud-monitoring",
            "--cloud-layout",
            "explicit:0,1,2,4",
        ])
        .unwrap();
        let crate::cli::Command::Observe(args) = cli.command else {
            panic!()
        };
        assert!(!args.raw, "cloud-monitoring is built from the histograms");
        let mut sink =
            super::super::cloud::CloudSink::new(args.cloud_layout.clone(), 1_795_240_800.0, 24, 48);
        let flow = Flow {
            tunnel: Default::default(),
            netns: 7,
            local: "10.0.0.2:5001".parse().unwrap(),
            remote: "10.0.0.1:40000".parse().unwrap(),
        };
        let mut h = crate::analysis::hist::Hist::default();
        for rtt in [150u32, 250, 3000] {
            h.record(rtt);
        }
        let d = FlowDelta {
            flow: &flow,
            side: crate::analysis::flow::Side::Server,
            netns_name: "ns-b",
            owner: None,
            delta: &h,
            translated: None,
        };
        sink.flow_delta(ViewKind::Sampler, &d);
        // A second read of the same flow adds to the same series.
        let mut h2 = crate::analysis::hist::Hist::default();
        h2.record(1500);
        let d = FlowDelta {
            flow: &flow,
            side: crate::analysis::flow::Side::Server,
            netns_name: "ns-b",
            owner: None,
            delta: &h2,
            translated: None,
        };
        sink.flow_delta(ViewKind::Sampler, &d);
        let mut out = Vec::new();
        cloud_requests(&sink.export, 1_795_240_801.0, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let f = crate::analysis::cloud_monitoring::parse(&text, "observe").unwrap();
        assert_eq!(f.series.len(), 1, "{text}");
        let s = &f.series[0];
        assert_eq!(s.metric_kind, "CUMULATIVE");
        assert_eq!(s.metric_labels["view"], "sampler");
        assert_eq!(s.metric_labels["side"], "server");
        assert_eq!(s.metric_labels["netns"], "ns-b");
        assert_eq!(s.metric_labels["remote_prefix"], "10.0.0.0/24");
        let p = &s.points[0];
        assert_eq!(
            (p.start_unix_s, p.end_unix_s),
            (Some(1_795_240_800.0), 1_795_240_801.0)
        );
        let crate::analysis::cloud_monitoring::PointValue::Distribution(d) = &p.value else {
            panic!("{:?}", p.value)
        };
        assert_eq!(d.bucket_counts, vec![0, 2, 1, 1, 0]);
        assert_eq!(d.count, 4);
    }

    #[test]
    fn raw_line_decodes_event_fixture() {
        let ev = crate::bpf::Event {
            r#type: 1,
            side: 1,
            rtt_us: 150,
            srtt_us: 140,
            ts_ns: 2_000_000_000,
            key: Flow {
                tunnel: Default::default(),
                netns: 7,
                local: "10.0.0.1:1000".parse().unwrap(),
                remote: "10.0.0.2:80".parse().unwrap(),
            }
            .to_key(),
            ..Default::default()
        };
        let bytes = crate::bpf::as_bytes(&ev).to_vec();
        let back: crate::bpf::Event = crate::bpf::decode(&bytes).unwrap();
        let smp = crate::views::tcp::attach::raw_sample(&back).unwrap();
        let line = raw_line(&smp, 1_000_000_000, Format::Json);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["view"], "tcp");
        assert_eq!(v["rtt_us"], 150);
        assert_eq!(v["srtt_us"], 140);
        assert_eq!(v["side"], "client");
        assert_eq!(v["t"], 1.0);
        assert_eq!(v["t_us"], 1e6);
        assert_eq!(v["local"], "10.0.0.1:1000");
        assert_eq!(
            raw_line(&smp, 1_000_000_000, Format::Table),
            "raw tcp      t=1.000000s 10.0.0.1:1000 -> 10.0.0.2:80 side=client rtt=150us srtt=140us"
        );
        // A flow's end: labelled `flow_end`.
        let end = crate::bpf::Event {
            r#type: 3,
            rtt_us: 0,
            ..back
        };
        let end = crate::views::tcp::attach::raw_sample(&end).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&raw_line(&end, 1_000_000_000, Format::Json)).unwrap();
        assert_eq!(
            (v["view"].as_str(), v["rtt_us"].as_u64()),
            (Some("flow_end"), Some(0))
        );
        // The sampler's: its matching, no srtt; the table line without side and srtt.
        let mut s = smp;
        (s.view, s.srtt_us, s.matching) = (crate::views::ViewKind::Sampler, None, Some("seq"));
        let v: serde_json::Value =
            serde_json::from_str(&raw_line(&s, 1_000_000_000, Format::Json)).unwrap();
        assert_eq!(
            (v["view"].as_str(), v["match"].as_str()),
            (Some("sampler"), Some("seq"))
        );
        assert!(
            v.get("srtt_us").is_none() && v.get("proto").is_none(),
            "{v}"
        );
        assert_eq!(
            raw_line(&s, 1_000_000_000, Format::Table),
            "raw sampler  t=1.000000s 10.0.0.1:1000 -> 10.0.0.2:80 rtt=150us"
        );
    }
}
