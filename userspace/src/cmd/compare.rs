//! `rttscope compare`: the three views side by side, same flows, same time
//! window. Attaches the TCP view (and the sampler on `--iface`), runs the
//! TCP request/response probe (plus UDP_RR, ICMP, irtt when asked) against
//! `rttscope serve` on HOST, and prints one
//! table: one row per view. `--explain` adds short factual notes when the
//! data shows a known cause; `--json FILE` saves every sample set and setting
//! as a `results::RunResult` that `rttscope chart` can draw.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::json;

use crate::active::rr::{run_probe, Kind, ProbeConfig, ProbeResult, Stop};
use crate::analysis::dist::{BucketOptions, Distribution, ValueUnit};
use crate::analysis::results::{RunResult, Sample, ViewKind, ViewSeries};
use crate::analysis::stats::Summary;
use crate::analysis::units::{duration_arg, fmt_duration_short, fmt_ms};
use crate::views::flow::{Flow, Side};
use crate::views::sampler::{IfaceSpec, Matching, SamplerConfig};
use crate::views::tcp::TcpViewConfig;
use crate::views::{self, LoaderKind};

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Host running `rttscope serve` (and `irtt server` for --irtt).
    pub host: String,
    /// The responder's port (`rttscope serve` default: 7878).
    #[arg(short = 'p', long, default_value_t = crate::active::serve::DEFAULT_PORT)]
    pub port: u16,
    /// Length of the run (all probes and views over the same window).
    #[arg(short = 'l', long = "length", default_value = "10s", value_parser = duration_arg)]
    pub length: Duration,
    /// Interval between transactions (0 = back to back, as netperf).
    #[arg(short = 'w', long, default_value = "0", value_parser = duration_arg)]
    pub interval: Duration,
    /// Transactions per interval.
    #[arg(short = 'b', long, default_value_t = 1)]
    pub burst: u32,
    /// Request and response sizes in bytes, REQ,RESP.
    #[arg(short = 'r', long = "sizes", default_value = "1,1", value_parser = sizes_arg)]
    pub sizes: (u32, u32),
    /// TCP_NODELAY on the TCP probe.
    #[arg(long)]
    pub nodelay: bool,
    /// Run the UDP request/response probe.
    #[arg(long)]
    pub udp_rr: bool,
    /// Run an ICMP echo probe (ping) at the same interval.
    #[arg(long)]
    pub icmp: bool,
    /// Run an irtt probe against `irtt server` on HOST (port 2112) at the same interval (10 ms if -w 0).
    #[arg(long)]
    pub irtt: bool,
    /// Sampler view on this interface (NAME or NETNS:NAME); repeatable. Without it no sampler rows.
    #[arg(long = "iface", value_name = "[NETNS:]NAME")]
    pub ifaces: Vec<IfaceSpec>,
    /// Sampler: sample each packet with probability 1/N.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sample_every: u32,
    /// Sampler matching rule.
    #[arg(long = "match", value_enum, default_value = "seq")]
    pub matching: Matching,
    /// Cloud bucket layout for the "sampler via cloud buckets" row (see `rttscope bucket --help`).
    #[arg(long, default_value = "vm_flow", value_parser = crate::analysis::dist::layout_arg)]
    pub layout: BucketOptions,
    /// Add short notes explaining the differences, each with the numbers that triggered it.
    #[arg(long)]
    pub explain: bool,
    /// Save every sample set and setting (a result `rttscope chart` draws).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// BPF loader for the TCP view: libbpf (default) or aya; see docs/loaders.md.
    #[arg(long, value_enum, env = "RTTSCOPE_LOADER", default_value_t = LoaderKind::DEFAULT)]
    pub loader: LoaderKind,
}

fn sizes_arg(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s.split_once(',').unwrap_or((s, s));
    let p = |x: &str| x.trim().parse::<u32>().ok().filter(|v| *v > 0);
    match (p(a), p(b)) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(format!("'{s}' is not REQ,RESP sizes in bytes (e.g. 1,2)")),
    }
}

/// One row of the comparison table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub view: String,
    pub what: String,
    pub summary: Summary,
    /// Set for rows whose percentiles come from a bucketed distribution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucketed: Option<String>,
}

/// A raw TCP-view sample: flow, side, seconds since start, rtt us.
type TcpSample = (Flow, Side, f64, f64);

/// Samples collected for one view: (seconds since start, rtt us).
type Series = Vec<(f64, f64)>;

fn summary_of(s: &Series) -> Summary {
    let v: Vec<f64> = s.iter().map(|x| x.1).collect();
    Summary::from_us(&v)
}

pub fn run(args: CompareArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(compare(args))
}

async fn compare(args: CompareArgs) -> Result<()> {
    crate::sys::preflight::require_bpf_caps()?;
    let kinds: Vec<Kind> = {
        // TCP_RR always runs: it is the flow the TCP view and the sampler observe.
        let mut k = vec![Kind::TcpRr];
        if args.udp_rr {
            k.push(Kind::UdpRr);
        }
        if args.icmp {
            k.push(Kind::Icmp);
        }
        k
    };
    // Passive views: the TCP view restricted to the responder's port (both
    // ends when the server is on this host too), raw samples for the time series.
    let tcp_cfg = TcpViewConfig {
        iter_netns: vec![crate::sys::netns::resolve("self")?],
        ports: vec![args.port],
        raw: true,
        max_flows: 4096,
        ..Default::default()
    };
    let mut tcp = views::attach_tcp(args.loader, &tcp_cfg)?;
    let mut sampler = if args.ifaces.is_empty() {
        None
    } else {
        let cfg = SamplerConfig {
            sample_every: args.sample_every,
            matching: args.matching,
            raw: true,
            ..Default::default()
        };
        cfg.validate()?;
        Some(crate::views::attach_sampler(
            args.loader,
            &args.ifaces,
            cfg,
        )?)
    };
    let start_mono = crate::sys::clock::mono_ns();
    let start_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);

    // TCP raw samples through the loader's ring buffer.
    let mut tcp_raw = tcp.raw_samples()?;
    let mut tcp_events: Vec<crate::bpf::Event> = Vec::new();
    let mut tcp_samples: Vec<TcpSample> = Vec::new();
    // The sampler's, the same way.
    let mut sampler_raw = match sampler.as_mut() {
        Some(s) => Some(s.raw_samples()?),
        None => None,
    };
    let mut sampler_events: Vec<crate::bpf::Event> = Vec::new();
    let take_tcp = |evs: &mut Vec<crate::bpf::Event>, out: &mut Vec<TcpSample>| {
        for ev in evs.drain(..) {
            if ev.r#type == 1 {
                if let Some(f) = Flow::from_key(&ev.key) {
                    let t = (ev.ts_ns as i64 - start_mono as i64) as f64 / 1e9;
                    out.push((f, Side::from_raw(ev.side), t, ev.rtt_us as f64));
                }
            }
        }
    };
    let mut sampler_samples: Vec<(Flow, f64, f64)> = Vec::new();
    let take_sampler = |evs: &mut Vec<crate::bpf::Event>, out: &mut Vec<(Flow, f64, f64)>| {
        for x in evs
            .drain(..)
            .filter_map(|e| crate::views::sampler::SamplerSample::from_event(&e))
        {
            out.push((
                x.flow,
                (x.ts_ns as i64 - start_mono as i64) as f64 / 1e9,
                x.rtt_us as f64,
            ));
        }
    };

    // The probes, concurrently, over the same window.
    let (cancel_tx, cancel_rx) = crate::active::cancel::cancel_pair();
    let mut configs = Vec::new();
    for k in &kinds {
        let mut c = ProbeConfig::new(*k, &args.host);
        c.port = args.port;
        c.interval = args.interval;
        c.burst = args.burst;
        if *k != Kind::Icmp {
            c.req_size = args.sizes.0;
            c.resp_size = args.sizes.1;
        }
        c.nodelay = args.nodelay;
        c.stop = Stop::Duration(args.length);
        configs.push(c);
    }
    let irtt_stop = Arc::new(AtomicBool::new(false));
    let irtt_cfg = args.irtt.then(|| crate::active::irtt::IrttConfig {
        server: args.host.clone(),
        duration: args.length,
        interval: if args.interval.is_zero() {
            Duration::from_millis(10)
        } else {
            args.interval
        },
        ..Default::default()
    });
    let probes = async {
        let rr = futures_join_all(
            configs
                .iter()
                .map(|c| run_probe(c, cancel_rx.clone()))
                .collect(),
        )
        .await;
        let ir = match irtt_cfg.clone() {
            Some(c) => Some(crate::active::irtt::run_irtt(c, irtt_stop.clone()).await),
            None => None,
        };
        (rr, ir)
    };
    tokio::pin!(probes);
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (rr_results, irtt_result) = loop {
        tokio::select! {
            r = &mut probes => break r,
            _ = poll.tick() => {
                tcp_raw.drain_now(&mut tcp_events)?;
                take_tcp(&mut tcp_events, &mut tcp_samples);
                if let Some(r) = sampler_raw.as_mut() {
                    r.drain_now(&mut sampler_events)?;
                    take_sampler(&mut sampler_events, &mut sampler_samples);
                }
            }
            _ = tokio::signal::ctrl_c() => { let _ = cancel_tx.send(true); irtt_stop.store(true, std::sync::atomic::Ordering::Relaxed); }
            _ = sigterm.recv() => { let _ = cancel_tx.send(true); irtt_stop.store(true, std::sync::atomic::Ordering::Relaxed); }
        }
    };
    // Late samples of the last transactions.
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp_raw.drain_now(&mut tcp_events)?;
    take_tcp(&mut tcp_events, &mut tcp_samples);
    if let Some(r) = sampler_raw.as_mut() {
        r.drain_now(&mut sampler_events)?;
        take_sampler(&mut sampler_events, &mut sampler_samples);
    }

    let tcp_counters = tcp.counters()?;
    let sampler_counters = match &sampler {
        Some(s) => Some(s.counters()?),
        None => None,
    };

    // Sort samples into views. Only this run's connections count: on the
    // client side, flows in this namespace to the target's address and port;
    // on the server side (when visible), the reverse of those tuples.
    let my_netns = crate::sys::netns::current_inode()?;
    let target_ip = rr_results
        .iter()
        .find_map(|r| r.as_ref().ok().map(|r| r.settings.address));
    let is_client = |f: &Flow| {
        f.netns == my_netns && f.remote.port() == args.port && Some(f.remote.ip()) == target_ip
    };
    let client_tuples: std::collections::HashSet<(std::net::SocketAddr, std::net::SocketAddr)> =
        tcp_samples
            .iter()
            .map(|s| s.0)
            .chain(sampler_samples.iter().map(|s| s.0))
            .filter(|f| is_client(f))
            .map(|f| (f.local, f.remote))
            .collect();
    let is_server = |f: &Flow| client_tuples.contains(&(f.remote, f.local));
    // Retransmissions of this run's connections (TCP view).
    let mut retrans = 0u64;
    tcp.for_each_flow(&mut |f| {
        if is_client(&f.flow) || is_server(&f.flow) {
            retrans += f.retrans as u64;
        }
    })?;
    let mut tcp_client: Series = Vec::new();
    let mut tcp_server: Series = Vec::new();
    for (f, _, t, rtt) in tcp_samples.iter() {
        if is_client(f) {
            tcp_client.push((*t, *rtt));
        } else if is_server(f) {
            tcp_server.push((*t, *rtt));
        }
    }
    let mut smp_client: Series = Vec::new();
    let mut smp_server: Series = Vec::new();
    for (f, t, rtt) in &sampler_samples {
        if is_client(f) {
            smp_client.push((*t, *rtt));
        } else if is_server(f) {
            smp_server.push((*t, *rtt));
        }
    }

    let mut result = RunResult::new(
        std::env::args().collect::<Vec<_>>().join(" "),
        json!({
            "host": args.host,
            "port": args.port,
            "length_s": args.length.as_secs_f64(),
            "interval_s": args.interval.as_secs_f64(),
            "burst": args.burst,
            "sizes": [args.sizes.0, args.sizes.1],
            "nodelay": args.nodelay,
            "probes": kinds.iter().map(|k| k.label()).collect::<Vec<_>>(),
            "tcp_view": tcp.info(),
            "loader": args.loader,
            "sampler": sampler.as_ref().map(|s| json!({"settings": s.config(), "attached": s.attach_info()})),
            "cloud_layout": args.layout.spec(),
            "tcp_counters": tcp_counters,
            "sampler_counters": sampler_counters,
            "tcp_retransmits": retrans,
        }),
    );
    result.start_unix_s = Some(start_unix);
    result.title = Some(format!(
        "compare {} port {}: -l {} -w {} -b {} -r {},{}{}",
        args.host,
        args.port,
        fmt_duration_short(args.length),
        fmt_duration_short(args.interval),
        args.burst,
        args.sizes.0,
        args.sizes.1,
        if sampler.is_some() {
            format!(
                ", sampler 1/{} {}",
                args.sample_every,
                args.matching.as_str()
            )
        } else {
            String::new()
        }
    ));

    let mut rows: Vec<Row> = Vec::new();
    let add_series = |result: &mut RunResult,
                      rows: &mut Vec<Row>,
                      name: &str,
                      kind: ViewKind,
                      side: Option<&str>,
                      what: String,
                      s: &Series,
                      settings: serde_json::Value| {
        let mut v = ViewSeries::new(name, kind);
        v.side = side.map(str::to_string);
        v.settings = settings;
        v.samples = s
            .iter()
            .map(|&(t, r)| Sample { t_s: t, rtt_us: r })
            .collect();
        result.views.push(v);
        rows.push(Row {
            view: name.to_string(),
            what,
            summary: summary_of(s),
            bucketed: None,
        });
    };
    add_series(
        &mut result,
        &mut rows,
        "tcp client",
        ViewKind::Tcp,
        Some("client"),
        "TCP's RTT samples (sock_ops RTT_CB), connecting side".into(),
        &tcp_client,
        json!({"hook": "sock_ops RTT_CB"}),
    );
    if !tcp_server.is_empty() {
        add_series(
            &mut result,
            &mut rows,
            "tcp server",
            ViewKind::Tcp,
            Some("server"),
            "TCP's RTT samples, responding side (visible on this host)".into(),
            &tcp_server,
            json!({"hook": "sock_ops RTT_CB"}),
        );
    }
    let mut cloud_note: Option<CloudEvidence> = None;
    if let Some(s) = &sampler {
        let set =
            json!({"sample_every": s.config().sample_every, "match": s.config().matching.as_str()});
        let label = format!(
            "1/{} sampled, {} match, no Karn",
            s.config().sample_every,
            s.config().matching.as_str()
        );
        add_series(
            &mut result,
            &mut rows,
            "sampler client",
            ViewKind::Sampler,
            Some("client"),
            format!("packet sampler at the interface ({label})"),
            &smp_client,
            set.clone(),
        );
        if !smp_server.is_empty() {
            add_series(
                &mut result,
                &mut rows,
                "sampler server",
                ViewKind::Sampler,
                Some("server"),
                format!("packet sampler, responding side ({label})"),
                &smp_server,
                set.clone(),
            );
        }
        // The same samples through the cloud metric's buckets.
        let all: Series = smp_client
            .iter()
            .chain(smp_server.iter())
            .copied()
            .collect();
        let mut d = Distribution::new(args.layout.clone(), ValueUnit::Ms);
        for (_, r) in &all {
            d.add_us(*r);
        }
        let pct = |p: f64| d.percentile(p).ok().flatten();
        let to_us = |p: Option<crate::analysis::dist::Percentile>| {
            p.map(|x| ValueUnit::Ms.to_us(x.value)).unwrap_or(f64::NAN)
        };
        let mut sm = Summary::empty();
        sm.n = d.count;
        sm.p50 = to_us(pct(50.0));
        sm.p90 = to_us(pct(90.0));
        sm.p99 = to_us(pct(99.0));
        sm.mean = if d.count > 0 {
            ValueUnit::Ms.to_us(d.mean)
        } else {
            f64::NAN
        };
        if let Some(p) = pct(50.0) {
            cloud_note = Some(CloudEvidence {
                p50_us: ValueUnit::Ms.to_us(p.value),
                bucket_lo_ms: args.layout.lower(p.bucket),
                bucket_hi_ms: args.layout.upper(p.bucket),
                bucket_share_pct: p.p_up - p.p_low,
                exact_p50_us: summary_of(&all).p50,
            });
        }
        rows.push(Row {
            view: "sampler cloud".into(),
            what: format!(
                "sampler samples through cloud buckets ({}), percentile aligner interpolation",
                args.layout.spec()
            ),
            summary: sm,
            bucketed: Some(args.layout.spec()),
        });
    }
    let mut rr_by_kind: BTreeMap<&'static str, ProbeResult> = BTreeMap::new();
    for r in rr_results {
        let r = r?;
        let name = match r.settings.kind {
            Kind::TcpRr => "TCP_RR",
            Kind::UdpRr => "UDP_RR",
            Kind::Icmp => "ICMP",
        };
        let s: Series = r
            .samples
            .iter()
            .map(|&(off, rtt)| ((off as f64) / 1e9, rtt as f64 / 1e3))
            .collect();
        let kind = if r.settings.kind == Kind::Icmp {
            ViewKind::Ping
        } else {
            ViewKind::Probe
        };
        let what = format!(
            "{} send()->recv() of the response; {} lost{}",
            r.settings.kind.label(),
            r.counts.lost,
            if r.counts.errors > 0 {
                format!(", {} errors", r.counts.errors)
            } else {
                String::new()
            }
        );
        add_series(
            &mut result,
            &mut rows,
            name,
            kind,
            None,
            what,
            &s,
            serde_json::to_value(&r.settings)?,
        );
        rr_by_kind.insert(name, r);
    }
    if let Some(ir) = irtt_result {
        let ir = ir?;
        let s: Series = ir
            .rtt_samples()
            .map(|(off, rtt)| (off as f64 / 1e9, rtt as f64 / 1e3))
            .collect();
        add_series(
            &mut result,
            &mut rows,
            "irtt",
            ViewKind::Irtt,
            None,
            "irtt isochronous UDP (irtt protocol)".into(),
            &s,
            json!({"interval_s": irtt_cfg.as_ref().map(|c| c.interval.as_secs_f64())}),
        );
    }

    // The table.
    let mut out = std::io::stdout().lock();
    writeln!(out, "rttscope {}", result.title.clone().unwrap_or_default())?;
    writeln!(
        out,
        "{:<15} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}   (ms)",
        "VIEW", "N", "MIN", "MEAN", "P50", "P90", "P99", "MAX"
    )?;
    for r in &rows {
        let s = &r.summary;
        writeln!(
            out,
            "{:<15} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}   {}",
            r.view,
            s.n,
            fmt_ms(s.min),
            fmt_ms(s.mean),
            fmt_ms(s.p50),
            fmt_ms(s.p90),
            fmt_ms(s.p99),
            fmt_ms(s.max),
            r.what
        )?;
    }
    writeln!(
        out,
        "TCP view: {} retransmissions on the probe's connections; hook: {} ({} loader)",
        retrans,
        tcp.info().hook,
        args.loader
    )?;

    if args.explain {
        let notes = explain(&rows, args.interval, retrans, cloud_note);
        writeln!(out)?;
        if notes.is_empty() {
            writeln!(
                out,
                "explain: no known cause of a difference is evident in this data."
            )?;
        }
        for n in &notes {
            writeln!(out, "note: {n}")?;
        }
        result.settings["notes"] = json!(notes);
    }
    result.settings["rows"] = serde_json::to_value(&rows)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
        writeln!(
            out,
            "saved: {} (draw it: rttscope chart {} -o chart.png)",
            path.display(),
            path.display()
        )?;
    }
    Ok(())
}

/// Drive every future concurrently on this task; outputs in input order.
async fn futures_join_all<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<std::pin::Pin<Box<F>>>> =
        fs.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (slot, out) in pending.iter_mut().zip(results.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results
        .into_iter()
        .map(|r| r.expect("every future completed"))
        .collect()
}

/// Where the cloud-bucket median came from.
#[derive(Debug, Clone, Copy)]
pub struct CloudEvidence {
    pub p50_us: f64,
    pub bucket_lo_ms: f64,
    pub bucket_hi_ms: f64,
    /// Share of the samples in that bucket, percent.
    pub bucket_share_pct: f64,
    pub exact_p50_us: f64,
}

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
    let mut notes = Vec::new();
    let iv_us = interval.as_secs_f64() * 1e6;
    // Delayed ACK on the responding side.
    if let (Some(c), Some(s)) = (get("tcp client"), get("tcp server")) {
        if s.p50 > 3.0 * c.p50
            && iv_us > 0.0
            && iv_us < 40_000.0
            && (s.p50 - iv_us).abs() <= 0.3 * iv_us + 2_000.0
        {
            notes.push(format!(
                "server-side TCP RTT p50 {} ms is close to the probe interval {} ms (below the 40 ms delayed-ACK timer) while the client side's is {} ms: the client's TCP holds its ACK of each response until the next request carries it (delayed ACK), so the server times the think time.",
                fmt_ms(s.p50), fmt_ms(iv_us), fmt_ms(c.p50)
            ));
        } else if s.p50 > 3.0 * c.p50 && (35_000.0..=45_000.0).contains(&s.p50) {
            notes.push(format!(
                "server-side TCP RTT p50 {} ms sits at the 40 ms delayed-ACK timer (client side {} ms): the client's ACKs of the responses waited for the timer.",
                fmt_ms(s.p50), fmt_ms(c.p50)
            ));
        }
    }
    // Sampler samples at the application's think time.
    for name in ["sampler client", "sampler server"] {
        if let (Some(smp), Some(tc)) = (get(name), get("tcp client")) {
            if iv_us > 5.0 * tc.p50.max(1.0) && smp.max >= 0.8 * iv_us && smp.p99 >= 0.8 * iv_us {
                notes.push(format!(
                    "{name}: p99 {} ms / max {} ms reach the think time {} ms while TCP's client-side p50 is {} ms: some sampled acknowledging packets were the next request, not a bare ACK, so the sampler timed the application's pause.",
                    fmt_ms(smp.p99), fmt_ms(smp.max), fmt_ms(iv_us), fmt_ms(tc.p50)
                ));
            }
        }
    }
    // Cloud-bucket median interpolated inside one wide bucket.
    if let Some(c) = cloud {
        let width_us = (c.bucket_hi_ms - c.bucket_lo_ms) * 1000.0;
        if c.bucket_share_pct >= 50.0
            && (c.p50_us - c.exact_p50_us).abs() > 0.5 * c.exact_p50_us
            && width_us > 2.0 * c.exact_p50_us
        {
            notes.push(format!(
                "the cloud-bucket median {} ms is interpolated inside the [{}, {}) ms bucket, which holds {:.0}% of the samples (at its midpoint when it holds them all); the exact median of the same samples is {} ms: a bucketing artifact, not a network difference.",
                fmt_ms(c.p50_us), c.bucket_lo_ms, c.bucket_hi_ms, c.bucket_share_pct, fmt_ms(c.exact_p50_us)
            ));
        }
    }
    // Application tail far above TCP's with retransmissions.
    if let (Some(app), Some(tc)) = (get("TCP_RR"), get("tcp client")) {
        if retrans > 0 && app.p99 > 3.0 * tc.p99 {
            notes.push(format!(
                "TCP_RR p99 {} ms is far above TCP's RTT p99 {} ms with {} retransmissions: the application waits for loss recovery, which TCP's RTT excludes (no samples from retransmitted data).",
                fmt_ms(app.p99), fmt_ms(tc.p99), retrans
            ));
        }
    }
    // Ping below request/response: no receiving application.
    if let (Some(p), Some(app)) = (get("ICMP"), get("TCP_RR")) {
        if app.p50 > 1.2 * p.p50 {
            notes.push(format!(
                "ICMP p50 {} ms is below TCP_RR p50 {} ms: an echo is answered inside the kernel, a request/response crosses TCP and both applications.",
                fmt_ms(p.p50), fmt_ms(app.p50)
            ));
        }
    }
    notes
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

    #[test]
    fn sizes_parse() {
        assert_eq!(sizes_arg("1,2").unwrap(), (1, 2));
        assert_eq!(sizes_arg("1409").unwrap(), (1409, 1409));
        assert!(sizes_arg("0,1").is_err());
        assert!(sizes_arg("a,b").is_err());
    }
}
