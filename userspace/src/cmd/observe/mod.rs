//! `rttscope observe`: the passive views (TCP; sampler) in one table, as
//! JSON Lines, or as Prometheus metrics (daemon mode). This driver attaches
//! a [`Session`], reads it once per interval and hands what it reads to the
//! sinks; raw samples stream as they arrive.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

pub mod args;
mod cloud;
pub mod config;
mod output;
mod result;

pub use args::{Format, ObserveArgs};

use crate::session::{FlowSink, RawSample, Session, SessionConfig};
use crate::sinks::prometheus::daemon::Daemon;
use crate::sys::netns::{self, NetNs};
use crate::views::ViewKind;
use cloud::{Both, CloudAgg, CloudSink};
use output::{flush_raw, raw_lines};

/// Run `observe` for a library caller that built `args` without a command
/// line. With `--config`, an option counts as given (wins over the file) when
/// its value differs from the flag's default; a value equal to the default
/// cannot be told from "not given", so the file wins over it
/// ([`config::Explicit::non_default`]). The process's argv is never
/// read. `main` calls [`run_with`] with what clap saw instead.
pub fn run(args: ObserveArgs) -> Result<()> {
    let explicit = config::Explicit::non_default(&args);
    run_with(args, &explicit)
}

/// Run `observe`; `explicit` holds the options given explicitly (command
/// line or environment variable, [`config::Explicit::from_matches`]),
/// which win over `--config`'s file.
pub fn run_with(args: ObserveArgs, explicit: &config::Explicit) -> Result<()> {
    // daemon mode: --config / --check-config (config.rs)
    let Some(args) = config::resolve(args, explicit)? else {
        return Ok(());
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(observe(args))
}

/// The options that make no sense together, refused before anything is loaded.
fn check(args: &ObserveArgs, views: &[ViewKind]) -> Result<()> {
    if args.interval < Duration::from_millis(10) {
        anyhow::bail!("--interval must be at least 10ms");
    }
    if args.cloud_period.is_zero() {
        anyhow::bail!(crate::analysis::units::ZERO_PERIOD);
    }
    if args.quiet && args.format != args::Format::Table {
        anyhow::bail!(
            "--quiet prints nothing on standard output, so --format {} would have nothing to print: drop one of them (--json FILE saves the whole run either way)",
            clap::ValueEnum::to_possible_value(&args.format)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default()
        );
    }
    if args.raw && args.format == args::Format::CloudMonitoring {
        anyhow::bail!(
            "--raw cannot be used with --format cloud-monitoring: standard output carries only the create requests (use --format json --raw for the samples)"
        );
    }
    args.view_opts.check(views)?;
    Ok(())
}

/// `--otlp [URL]` and the other OTLP options over the OpenTelemetry
/// environment (checked before anything is attached; the TLS files are read
/// when the pusher starts).
fn otlp_config(args: &ObserveArgs) -> Result<Option<crate::sinks::prometheus::daemon::OtlpConfig>> {
    let Some(cfg) = otlp_settings(args)? else {
        return Ok(None);
    };
    if cfg.settings.endpoint.tls {
        // the files now, before anything is attached (read again by the pusher)
        crate::sinks::otlp::client::client_config(&cfg.settings.tls)?;
    }
    Ok(Some(cfg))
}

/// The OTLP settings as the flags, the TOML file and the OpenTelemetry environment give them
/// (no file read): None without `--otlp`.
pub(super) fn otlp_settings(
    args: &ObserveArgs,
) -> Result<Option<crate::sinks::prometheus::daemon::OtlpConfig>> {
    let Some(url) = &args.otlp else {
        return Ok(None);
    };
    let interval = args.otlp_interval.unwrap_or(args.interval);
    if interval < Duration::from_millis(100) {
        anyhow::bail!("--otlp-interval must be at least 100ms");
    }
    let given = crate::sinks::otlp::settings::Given {
        endpoint: url,
        headers: &args.otlp_headers,
        ca_file: args.otlp_ca_file.as_deref(),
        client_cert: args.otlp_client_cert.as_deref(),
        client_key: args.otlp_client_key.as_deref(),
        timeout: args.otlp_timeout,
        compression: args.otlp_compression,
    };
    let settings =
        crate::sinks::otlp::Settings::resolve(&given, &crate::sinks::otlp::settings::process_env)?;
    Ok(Some(crate::sinks::prometheus::daemon::OtlpConfig {
        settings,
        interval,
    }))
}

/// `--listen` bound, with `--web-config-file` loaded (None: not serving /metrics).
async fn listener(args: &ObserveArgs) -> Result<Option<crate::sinks::prometheus::http::Listener>> {
    use crate::sinks::prometheus::{http, web};
    let Some(a) = args.listen else {
        if args.web_config_file.is_some() {
            anyhow::bail!("--web-config-file (web_config_file) says how /metrics is served: give --listen too");
        }
        return Ok(None);
    };
    let web = match &args.web_config_file {
        Some(p) => Some(std::sync::Arc::new(web::Web::load(p)?)),
        None => None,
    };
    Ok(Some(http::Listener {
        tcp: http::bind(a).await?,
        web,
    }))
}

/// What the session attaches, from the options (the lab attaches its observer's session with
/// it too).
pub(crate) fn session_config(args: &ObserveArgs, views: &[ViewKind]) -> Result<SessionConfig> {
    let netns_filter: Vec<NetNs> = args
        .netns
        .iter()
        .map(|n| netns::resolve(n))
        .collect::<Result<_>>()?;
    let configs = args.view_opts.configs(views, &args.scope(&netns_filter))?;
    Ok(SessionConfig {
        loader: args.loader,
        views: configs,
        keep_rows: !args.quiet,
        workloads: args.label_workload,
        keep_summary: !args.daemon_without_summary(),
        raw_samples: args.raw,
    })
}

/// The start record of a session attached with `args` (the lab's observer records it as
/// observe prints it); `start_mono`: t = 0 of the raw samples, whose Unix time is its `ts`.
#[cfg(feature = "lab")]
pub(crate) fn start_record(
    args: &ObserveArgs,
    session: &Session,
    start_mono: u64,
) -> Result<crate::analysis::records::Start> {
    output::start_record(args, session, &args.views(), start_mono)
}

/// With --raw: the session's raw samples as read, and their output lines
/// waiting to be written.
#[derive(Default)]
struct Raw {
    samples: Vec<RawSample>,
    lines: Vec<String>,
}

impl Raw {
    /// Print whatever has arrived, without waiting.
    fn drain(&mut self, session: &mut Session, start_mono: u64, fmt: Option<Format>) -> Result<()> {
        session.drain_raw(&mut self.samples)?;
        self.print(start_mono, fmt)
    }

    /// The samples read into the result document and the output.
    fn print(&mut self, start_mono: u64, fmt: Option<Format>) -> Result<()> {
        raw_lines(&mut self.samples, start_mono, fmt, &mut self.lines);
        flush_raw(&mut self.lines, &std::io::stdout())
    }
}

async fn observe(args: ObserveArgs) -> Result<()> {
    let views = args.views();
    check(&args, &views)?;
    otlp_config(&args)?;
    let cfg = session_config(&args, &views)?;
    // daemon mode: bind /metrics and load its web config before attaching, so a bad
    // address or file fails early.
    let listener = listener(&args).await?;
    let peers = args
        .names
        .as_deref()
        .map(crate::analysis::peers::PeerFile::load)
        .transpose()?
        .map(std::sync::Arc::new);
    let mut session = Session::attach(cfg)?;
    if let Some(p) = &peers {
        session.set_peer_names(p.clone());
    }
    // what already runs ahead of a view's hooks (a CNI's tc programs), said at once
    for n in session.view_notices() {
        eprintln!("rttscope: notice: {n}");
    }
    // daemon mode: serve /metrics, report hooks, drop capabilities.
    let otlp = otlp_config(&args)?;
    let mut daemon = if listener.is_some() || otlp.is_some() {
        Some(Daemon::start(
            listener,
            otlp,
            config::label_policy(&args)?,
            args.bpf_stats,
            &session,
            peers,
        )?)
    } else {
        None
    };
    let header = output::header(&args, &session);
    result::start(&args, &session, output::settings(&args));
    // t = 0 of the records and raw samples, and the start record's `ts` (its Unix time): when
    // every view's first window started (Session::attach).
    let start_mono = session.window_start_ns();
    output::print_start(&args, &session, &views, &header, start_mono)?;
    let start = Instant::now();
    let mut raw = Raw::default();
    run_loop(
        &args,
        &views,
        &header,
        &mut session,
        daemon.as_mut(),
        &mut raw,
        start_mono,
    )
    .await?;
    if args.daemon_without_summary() {
        // daemon mode keeps no whole-run summary (only what is exported).
        eprintln!("rttscope: done after {:.1}s", start.elapsed().as_secs_f64());
        return Ok(());
    }
    let summary = session.summary()?;
    result::finish(&args, &summary, start.elapsed().as_secs_f64())?;
    output::print_end(
        &args,
        &session,
        &header,
        &views,
        start.elapsed().as_secs_f64(),
        summary,
    )
}

/// Report every interval until --duration, Ctrl-C or SIGTERM; stream raw
/// samples as they arrive; free closed flows early when the TCP view's table
/// fills up.
async fn run_loop(
    args: &ObserveArgs,
    views: &[ViewKind],
    header: &str,
    session: &mut Session,
    mut daemon: Option<&mut Daemon>,
    raw: &mut Raw,
    start_mono: u64,
) -> Result<()> {
    let view_names: Vec<&'static str> = views.iter().map(|v| v.as_str()).collect();
    let mut report = Report::new(args, header, &view_names);
    // the first interval spans from the moment every view's window started (t = 0)
    let since_window = crate::sys::clock::mono_ns().saturating_sub(start_mono);
    report.last_tick = Instant::now()
        .checked_sub(Duration::from_nanos(since_window))
        .unwrap_or(report.last_tick);
    report.start = report.last_tick;
    // Between reports, a check that frees closed flows early when the TCP
    // view's table fills up (Tracker::reclaim_due).
    let reclaim_every = (args.interval / 8).max(Duration::from_millis(50));
    let mut reclaim_tick = tokio::time::interval(reclaim_every);
    reclaim_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + args.interval, args.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let has_views = session.has_views();
    // --quiet: raw samples go only into the result document (--json), never to stdout.
    let raw_fmt = (!args.quiet).then_some(args.format);
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let stop = tokio::select! {
            _ = ticker.tick() => false,
            r = session.next_raw(&mut raw.samples) => {
                r?;
                raw.print(start_mono, raw_fmt)?;
                continue;
            }
            _ = reclaim_tick.tick(), if has_views => {
                let mut sinks = report.sinks(daemon.as_deref_mut());
                session.between_reads(sinks.as_mut().map(|s| s as &mut dyn FlowSink))?;
                continue;
            }
            _ = until_deadline => true,
            _ = tokio::signal::ctrl_c() => true,
            _ = sigterm.recv() => true,
        };
        raw.drain(session, start_mono, raw_fmt)?;
        if stop && report.last_tick.elapsed() < args.interval / 10 {
            break; // the last interval was just reported
        }
        report.interval(session, daemon.as_deref_mut())?;
        crate::sys::trim_heap();
        if stop {
            break;
        }
    }
    Ok(())
}

/// One interval's report: read the session, feed the daemon, aggregate the
/// cloud buckets, print.
struct Report<'a> {
    args: &'a ObserveArgs,
    header: String,
    view_names: &'a [&'static str],
    cloud: BTreeMap<&'static str, CloudAgg>,
    /// --format cloud-monitoring: every flow group's samples since the start.
    cloud_export: Option<CloudSink>,
    start: Instant,
    last_tick: Instant,
}

impl<'a> Report<'a> {
    fn new(args: &'a ObserveArgs, header: &str, view_names: &'a [&'static str]) -> Self {
        let mut cloud = BTreeMap::new();
        if args.cloud_buckets {
            for v in view_names {
                cloud.insert(
                    *v,
                    CloudAgg::new(args.cloud_layout.clone(), args.cloud_period),
                );
            }
        }
        let cloud_export = (args.format == args::Format::CloudMonitoring).then(|| {
            CloudSink::new(
                args.cloud_layout.clone(),
                output::unix_now(),
                args.v4_prefix.unwrap_or(24),
                args.v6_prefix.unwrap_or(48),
            )
        });
        Report {
            args,
            header: header.to_string(),
            view_names,
            cloud,
            cloud_export,
            start: Instant::now(),
            last_tick: Instant::now(),
        }
    }

    /// Where each read's per-flow samples go: the Prometheus exporter, the cloud export.
    /// None when there is neither (the session then skips the per-flow deltas).
    fn sinks<'s>(&'s mut self, daemon: Option<&'s mut Daemon>) -> Option<Both<'s>> {
        if daemon.is_none() && self.cloud_export.is_none() {
            return None;
        }
        Some(Both(
            daemon.map(|d| d as &mut dyn FlowSink),
            self.cloud_export.as_mut().map(|c| c as &mut dyn FlowSink),
        ))
    }

    /// One interval: read the session, feed the daemon and the cloud buckets, print; returns
    /// the interval's record.
    fn interval(
        &mut self,
        session: &mut Session,
        mut daemon: Option<&mut Daemon>,
    ) -> Result<crate::session::Interval> {
        // an observed namespace or interface that disappeared: said once
        // (stderr, every mode), counted, and the rest goes on.
        for n in session.check_vanished() {
            eprintln!("rttscope: notice: {n}");
        }
        // the interval ends when its read starts
        let (end, end_ts) = (Instant::now(), output::unix_now());
        let read = {
            let mut sinks = self.sinks(daemon.as_deref_mut());
            session.read_interval(sinks.as_mut().map(|s| s as &mut dyn FlowSink))?
        };
        let mut iv = read.interval;
        iv.read_s = Some(end.elapsed().as_secs_f64());
        // daemon mode: counters, program statistics.
        if let Some(d) = daemon {
            d.handshakes(&read.handshakes);
            d.hooks(&iv.hooks);
            d.counters(&iv.counters);
        }
        let now_t = end.duration_since(self.start).as_secs_f64();
        let mut cloud_lines = Vec::new();
        for (name, agg) in self.cloud.iter_mut() {
            if let Some(h) = read.totals_hist.get(name) {
                agg.add(h);
            }
            let completed = agg.roll(now_t);
            let current = completed.unwrap_or_else(|| agg.point(now_t, false));
            cloud_lines.push((*name, current));
        }
        iv.t = now_t;
        iv.ts = end_ts;
        iv.interval_s = end.duration_since(self.last_tick).as_secs_f64();
        self.last_tick = end;
        if let Some(c) = &self.cloud_export {
            output::cloud_requests(&c.export, iv.ts, &mut std::io::stdout().lock())?;
        } else if !self.args.quiet {
            output::print_interval(self.args, &self.header, self.view_names, &iv, &cloud_lines)?;
        }
        Ok(iv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    #[test]
    #[allow(irrefutable_let_patterns)]
    fn parses_observe_options() {
        let c = Cli::try_parse_from([
            "rttscope",
            "observe",
            "--netns",
            "a",
            "--netns",
            "b",
            "--port",
            "5001",
            "--addr",
            "10.0.0.0/8",
            "--interval",
            "500ms",
            "--duration",
            "3s",
            "--format",
            "json",
            "--raw",
            "--ack-hook",
            "require",
        ])
        .unwrap();
        let crate::cli::Command::Observe(a) = c.command else {
            panic!()
        };
        assert_eq!(
            a.view_opts.tcp.ack_hook,
            crate::views::tcp::AckHook::Require
        );
        assert_eq!(a.netns, vec!["a", "b"]);
        assert_eq!(a.ports, vec![5001]);
        assert_eq!(a.interval, Duration::from_millis(500));
        assert_eq!(a.duration, Some(Duration::from_secs(3)));
        assert_eq!(a.format, Format::Json);
        assert!(a.raw);
    }

    /// The report loop's interval against fake views (no root): each interval reads the
    /// session once, in registry order, and feeds each view's samples to its cloud buckets.
    #[test]
    fn an_interval_reads_the_session_into_the_report() {
        use crate::analysis::flow::Side;
        use crate::views::fake::FakeView;
        let Ok(crate::cli::Cli {
            command: crate::cli::Command::Observe(args),
            ..
        }) = Cli::try_parse_from(["rttscope", "observe", "--cloud-buckets", "--quiet"])
        else {
            panic!("observe's options refused")
        };
        let (a, b) = (FakeView::flow(1000), FakeView::flow(2000));
        let steps = vec![
            vec![(a, Side::Client, vec![1000, 3000])],
            vec![(a, Side::Client, vec![2000]), (b, Side::Server, vec![500])],
        ];
        let mut tcp = FakeView::new(ViewKind::Tcp, steps);
        tcp.before = vec![(a, Side::Client, vec![9000; 3])]; // before the window: left out
        let views: Vec<Box<dyn crate::views::view::View>> = vec![
            Box::new(tcp),
            Box::new(FakeView::new(ViewKind::Sampler, vec![])),
        ];
        let mut session = Session::of_views(views, &session_config(&args, &[]).unwrap()).unwrap();
        let names = ["tcp", "sampler"];
        let mut report = Report::new(&args, "header", &names);
        let first = report.interval(&mut session, None).unwrap();
        assert_eq!(first.flows.len(), 0, "--quiet keeps no rows");
        assert_eq!(first.totals["tcp"]["client"].summary.n, 2);
        // the window's start, then this interval
        assert_eq!(first.counters["sampler"]["reads"], 2);
        assert_eq!(first.counters["tcp"]["samples_before_window"], 3);
        let second = report.interval(&mut session, None).unwrap();
        assert_eq!(second.totals["tcp"]["server"].summary.n, 1);
        assert!(second.interval_s >= 0.0 && second.t >= first.t);
        let count = |v: &str| report.cloud[v].point(0.0, false).count;
        assert_eq!((count("tcp"), count("sampler")), (4, 0));
    }

    #[test]
    fn rejects_malformed_options() {
        for bad in [
            vec!["rttscope", "observe", "--addr", "10.0.0.0/33"],
            vec!["rttscope", "observe", "--addr", "nonsense"],
            vec!["rttscope", "observe", "--interval", "fast"],
            vec!["rttscope", "observe", "--duration", "10"],
            vec!["rttscope", "observe", "--port", "70000"],
            vec!["rttscope", "observe", "--ack-hook", "always"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?} should fail");
        }
    }
}
