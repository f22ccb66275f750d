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
use crate::analysis::flow::{Flow, Side};
use crate::analysis::results::{RunResult, Sample, ViewKind, ViewSeries};
use crate::analysis::stats::Summary;
use crate::analysis::units::{fmt_duration_short, fmt_ms};
use crate::session::{RawEvent, RawSample, Session, SessionConfig};
use crate::views::sampler::{IfaceSpec, Matching, SamplerConfig};
use crate::views::tcp::TcpViewConfig;
use crate::views::{LoaderKind, ViewConfig};

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Host running `rttscope serve` (and `irtt server` for --irtt).
    pub host: String,
    /// The responder's port (the port `rttscope serve` listens on by default).
    #[arg(short = 'p', long, default_value_t = crate::active::serve::DEFAULT_PORT)]
    pub port: u16,
    // The netperf options, as `probe tcp-rr` takes them; all probes and views share the window.
    #[arg(short = 'l', long = "length", value_name = "DURATION", default_value = "10", help = crate::cmd::probe::LENGTH_HELP, value_parser = crate::analysis::units::seconds_arg)]
    pub length: Duration,
    #[arg(short = 'w', long = "interval", value_name = "DURATION", default_value = "0", help = crate::cmd::probe::INTERVAL_HELP, value_parser = crate::analysis::units::netperf_interval_arg, allow_hyphen_values = true)]
    pub interval: Duration,
    #[arg(short = 'b', long = "burst", value_name = "N", default_value_t = 1, help = crate::cmd::probe::BURST_HELP)]
    pub burst: u32,
    #[arg(short = 'r', long = "sizes", value_name = "REQ,RESP", default_value = "1,1", help = crate::cmd::probe::SIZES_HELP, value_parser = crate::cmd::probe::sizes_arg)]
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
    /// Run an irtt probe against `irtt server` on HOST (port 2112) at the same interval (10ms if -w 0).
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
    /// Add the cloud's own numbers as one more row: a Cloud Monitoring file (projects.timeSeries.list
    /// response for vm_flow/rtt, fetched for this window; docs/cloud.md).
    #[arg(long, value_name = "FILE")]
    pub cloud: Option<PathBuf>,
    /// Add short notes explaining the differences, each with the numbers that triggered it.
    #[arg(long)]
    pub explain: bool,
    /// No progress line on the terminal: only the results.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Save every sample set and setting (a result `rttscope chart` draws); `-`: print it on
    /// stdout (the table then goes to stderr).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// What to print: the table (text), or csv: one row per view summary
    /// (`view,count,min_us,mean_us,p50_us,p90_us,p99_us,max_us,stddev_us,bucketed,what`).
    #[arg(long, value_enum, default_value = "text")]
    pub format: crate::cmd::probe::PrintFormat,
    /// BPF loader: libbpf (libbpf-rs over C libbpf) or aya (pure Rust); see docs/loaders.md.
    // Offered only in builds with aya; otherwise the one loader built in.
    #[cfg_attr(feature = "aya", arg(long, value_enum, env = "RTTSCOPE_LOADER", default_value_t = LoaderKind::DEFAULT))]
    #[cfg_attr(not(feature = "aya"), arg(skip = LoaderKind::DEFAULT))]
    pub loader: LoaderKind,
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

/// The driver: attach, run the window, assemble the rows, report.
async fn compare(args: CompareArgs) -> Result<()> {
    crate::cmd::probe::check_netperf(args.length, args.burst)?;
    crate::sys::preflight::require_bpf_caps()?;
    // --cloud: read before attaching, so a bad file fails first.
    let cloud_file = args.cloud.as_deref().map(read_cloud_file).transpose()?;
    let mut plan = ProbePlan::new(&args);
    let mut session = Session::attach(session_config(&args)?)?;
    // The live line counts the TCP_RR transactions (the first probe).
    let live = crate::cmd::probe::rr_progress("compare", &mut plan.rr[0], args.quiet);
    let mut raw = Collected::new();
    let (rr_results, irtt_result) = run_window(&plan, &mut session, &mut raw).await?;
    drop(live);
    let tcp_counters = crate::views::tcp::track::of(session.views())
        .map(|v| v.counters())
        .transpose()?;
    let sampler_counters = crate::views::sampler::track::of(session.views())
        .map(|s| s.counters())
        .transpose()?;
    let sel = Selection::new(
        crate::sys::netns::current_inode()?,
        &rr_results,
        raw.start_mono,
    );
    let sides = split_sides(&session, &raw, &sel)?;
    let mut report = Report {
        result: RunResult::new(
            std::env::args().collect::<Vec<_>>().join(" "),
            settings_json(
                &args,
                &plan,
                &session,
                tcp_counters,
                sampler_counters,
                sides.retrans,
            ),
        ),
        rows: Vec::new(),
    };
    report.result.start_unix_s =
        Some(raw.start_unix + (sel.origin_mono as f64 - raw.start_mono as f64) / 1e9);
    report.result.title = Some(title(
        &args,
        crate::views::sampler::track::of(session.views()).is_some(),
    ));
    let cloud = report.add_passive(&args, &session, &sides);
    if let Some((name, f)) = &cloud_file {
        report.add_cloud_file(name, f);
    }
    report.add_probes(rr_results, irtt_result, plan.irtt.as_ref(), sel.origin_mono)?;
    let footer = Footer {
        others: sides.others,
        retrans: sides.retrans,
        hook: crate::views::tcp::track::of(session.views())
            .map_or_else(String::new, |v| v.info().hook.clone()),
        loader: args.loader,
    };
    output(&args, report, &footer, cloud)
}

/// The probes to run: TCP_RR always (it is the flow the TCP view and the
/// sampler observe), UDP_RR, ICMP and irtt when asked.
struct ProbePlan {
    kinds: Vec<Kind>,
    rr: Vec<ProbeConfig>,
    irtt: Option<crate::active::irtt::IrttConfig>,
}

impl ProbePlan {
    fn new(args: &CompareArgs) -> Self {
        let mut kinds = vec![Kind::TcpRr];
        if args.udp_rr {
            kinds.push(Kind::UdpRr);
        }
        if args.icmp {
            kinds.push(Kind::Icmp);
        }
        let rr = kinds
            .iter()
            .map(|k| {
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
                c
            })
            .collect();
        let irtt = args.irtt.then(|| crate::active::irtt::IrttConfig {
            server: args.host.clone(),
            duration: args.length,
            interval: if args.interval.is_zero() {
                Duration::from_millis(10)
            } else {
                args.interval
            },
            ..Default::default()
        });
        ProbePlan { kinds, rr, irtt }
    }
}

/// What the session attaches: the TCP view restricted to the responder's port (both ends
/// when the server is on this host too), and the sampler on each `--iface`; both with raw
/// samples for the time series.
fn session_config(args: &CompareArgs) -> Result<SessionConfig> {
    let tcp = TcpViewConfig {
        iter_netns: vec![crate::sys::netns::resolve("self")?],
        ports: vec![args.port],
        raw: true,
        max_flows: 4096,
        ..Default::default()
    };
    let sampler = (!args.ifaces.is_empty()).then(|| {
        let cfg = SamplerConfig {
            sample_every: args.sample_every,
            matching: args.matching,
            raw: true,
            ..Default::default()
        };
        (args.ifaces.clone(), cfg)
    });
    let views = std::iter::once(ViewConfig::Tcp(tcp))
        .chain(sampler.map(|(i, c)| ViewConfig::Sampler(i, c)))
        .collect();
    Ok(SessionConfig {
        loader: args.loader,
        views,
        keep_rows: false,
        workloads: false,
        keep_summary: false,
        raw_samples: true,
    })
}

/// The passive views' raw samples as they arrive (read through the session), with the
/// kernel's monotonic time (the probes' windows select them afterwards): RTT samples of
/// TCP flows, and the sampler's ICMP echo samples where this host is the pinger (issue 17).
struct Collected {
    /// When the reading started (CLOCK_MONOTONIC ns and Unix seconds).
    start_mono: u64,
    start_unix: f64,
    samples: Vec<RawSample>,
    read: Vec<RawSample>,
}

impl Collected {
    fn new() -> Self {
        let start_mono = crate::sys::clock::mono_ns();
        let start_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Collected {
            start_mono,
            start_unix,
            samples: Vec::new(),
            read: Vec::new(),
        }
    }

    /// Take every sample available now, without waiting.
    fn drain(&mut self, session: &mut Session) -> Result<()> {
        session.drain_raw(&mut self.read)?;
        self.samples.extend(
            self.read.drain(..).filter(|s| {
                s.event == RawEvent::Rtt && (s.proto.is_none() || s.side == Side::Pinger)
            }),
        );
        Ok(())
    }
}

type RrResults = Vec<Result<ProbeResult>>;
type IrttOutcome = Option<Result<crate::active::irtt::IrttResult>>;

/// Run the probes concurrently over the same window while collecting the
/// passive views' raw samples; Ctrl-C or SIGTERM ends the probes early.
async fn run_window(
    plan: &ProbePlan,
    session: &mut Session,
    raw: &mut Collected,
) -> Result<(RrResults, IrttOutcome)> {
    let (cancel_tx, cancel_rx) = crate::active::cancel::cancel_pair();
    let irtt_stop = Arc::new(AtomicBool::new(false));
    // Every probe over the same window: irtt beside the others, not after them.
    let probes = async {
        let rr = futures_join_all(
            plan.rr
                .iter()
                .map(|c| run_probe(c, cancel_rx.clone()))
                .collect(),
        );
        let ir = async {
            match plan.irtt.clone() {
                Some(c) => Some(crate::active::irtt::run_irtt(c, irtt_stop.clone()).await),
                None => None,
            }
        };
        tokio::join!(rr, ir)
    };
    tokio::pin!(probes);
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = || {
        let _ = cancel_tx.send(true);
        irtt_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    let out = loop {
        tokio::select! {
            r = &mut probes => break r,
            _ = poll.tick() => raw.drain(session)?,
            _ = tokio::signal::ctrl_c() => stop(),
            _ = sigterm.recv() => stop(),
        }
    };
    // Late samples of the last transactions.
    tokio::time::sleep(Duration::from_millis(100)).await;
    raw.drain(session)?;
    Ok(out)
}

/// This run's samples by view and side, the retransmissions on its connections, and how many
/// samples of other traffic were left out.
struct Sides {
    tcp_client: Series,
    tcp_server: Series,
    smp_client: Series,
    smp_server: Series,
    /// The sampler's passive reading of the ICMP probe's pings (to the target, from here).
    smp_icmp: Series,
    retrans: u64,
    /// Samples of other connections and pings (or of the probes' connections outside their
    /// windows: handshake, hello, close) that no row holds.
    others: u64,
}

/// What identifies this run's probes to the passive views: the TCP probe's 4-tuple in this
/// namespace, the ICMP probe's identifier, and each probe's window (first transaction to last)
/// on the monotonic clock. Everything else on the host (other connections to the same port,
/// connections opened before, other namespaces' traffic, other pings) is left out.
#[derive(Debug, Clone, Copy)]
struct Selection {
    netns: u32,
    /// The TCP probe's (local, remote) and window; no local address: no TCP probe ran.
    tcp_local: Option<std::net::SocketAddr>,
    tcp_remote: std::net::SocketAddr,
    tcp: crate::active::rr::ProbeIdent,
    /// The ICMP probe's target, identifier and window.
    icmp: Option<(std::net::IpAddr, u16, crate::active::rr::ProbeIdent)>,
    /// Time 0 of the rows: the TCP probe's first transaction (CLOCK_MONOTONIC ns).
    origin_mono: u64,
}

impl Selection {
    fn new(netns: u32, rr: &RrResults, fallback_origin: u64) -> Selection {
        let ok = |k: Kind| {
            rr.iter()
                .filter_map(|r| r.as_ref().ok())
                .find(|r| r.settings.kind == k)
        };
        let tcp = ok(Kind::TcpRr);
        let tcp_ident = tcp.map(|r| r.ident).unwrap_or_default();
        let icmp =
            ok(Kind::Icmp).and_then(|r| Some((r.settings.address, r.ident.icmp_id?, r.ident)));
        Selection {
            netns,
            tcp_local: tcp_ident.local,
            tcp_remote: tcp.map_or(std::net::SocketAddr::from(([0, 0, 0, 0], 0)), |r| {
                std::net::SocketAddr::new(r.settings.address, r.settings.port)
            }),
            tcp: tcp_ident,
            icmp,
            origin_mono: if tcp_ident.start_mono_ns > 0 {
                tcp_ident.start_mono_ns
            } else {
                fallback_origin
            },
        }
    }

    /// Seconds from time 0 of the rows.
    fn secs(&self, ts_ns: u64) -> f64 {
        (ts_ns as i64 - self.origin_mono as i64) as f64 / 1e9
    }

    /// The TCP probe's connection seen from its own end (this namespace).
    fn is_client(&self, f: &Flow) -> bool {
        f.netns == self.netns && Some(f.local) == self.tcp_local && f.remote == self.tcp_remote
    }

    /// The same connection seen from the responder's end (when it is in view).
    fn is_server(&self, f: &Flow) -> bool {
        Some(f.remote) == self.tcp_local && f.local == self.tcp_remote
    }

    /// The ICMP probe's echoes, seen by the sampler as the pinger.
    fn is_icmp(&self, f: &Flow, ts_ns: u64) -> bool {
        self.icmp.is_some_and(|(ip, id, w)| {
            f.netns == self.netns
                && f.remote.ip() == ip
                && f.local.port() == id
                && w.in_window(ts_ns)
        })
    }
}

/// Sort samples into views: only the probes' own connections and pings, inside their windows.
fn split_sides(session: &Session, raw: &Collected, sel: &Selection) -> Result<Sides> {
    // Retransmissions of this run's connection (TCP view).
    let mut retrans = 0u64;
    if let Some(v) = crate::views::tcp::track::of(session.views()) {
        v.for_each_flow(&mut |f| {
            if sel.is_client(&f.flow) || sel.is_server(&f.flow) {
                retrans += f.retrans as u64;
            }
        })?;
    }
    let mut others = 0u64;
    let mut by_side = |view: crate::views::ViewKind| {
        let (mut client, mut server): (Series, Series) = (Vec::new(), Vec::new());
        for s in raw
            .samples
            .iter()
            .filter(|s| s.view == view && s.proto.is_none())
        {
            let (f, ts, rtt) = (&s.flow, s.ts_ns, s.rtt_us as f64);
            let t = sel.secs(ts);
            if !sel.tcp.in_window(ts) {
                others += 1;
            } else if sel.is_client(f) {
                client.push((t, rtt));
            } else if sel.is_server(f) {
                server.push((t, rtt));
            } else {
                others += 1;
            }
        }
        (client, server)
    };
    let (tcp_client, tcp_server) = by_side(crate::views::ViewKind::Tcp);
    let (smp_client, smp_server) = by_side(crate::views::ViewKind::Sampler);
    // The sampler's pings from here (the only non-TCP samples collected).
    let icmp: Vec<&RawSample> = raw.samples.iter().filter(|s| s.proto.is_some()).collect();
    let smp_icmp: Series = icmp
        .iter()
        .filter(|s| sel.is_icmp(&s.flow, s.ts_ns))
        .map(|s| (sel.secs(s.ts_ns), s.rtt_us as f64))
        .collect();
    others += (icmp.len() - smp_icmp.len()) as u64;
    Ok(Sides {
        tcp_client,
        tcp_server,
        smp_client,
        smp_server,
        smp_icmp,
        retrans,
        others,
    })
}

/// The result's `settings` (the rows and notes are added at the end).
fn settings_json(
    args: &CompareArgs,
    plan: &ProbePlan,
    session: &Session,
    tcp_counters: Option<BTreeMap<&'static str, u64>>,
    sampler_counters: Option<BTreeMap<&'static str, u64>>,
    retrans: u64,
) -> serde_json::Value {
    json!({
        "host": args.host,
        "port": args.port,
        "length_s": args.length.as_secs_f64(),
        "interval_s": args.interval.as_secs_f64(),
        "burst": args.burst,
        "sizes": [args.sizes.0, args.sizes.1],
        "nodelay": args.nodelay,
        "probes": plan.kinds.iter().map(|k| k.label()).collect::<Vec<_>>(),
        "tcp_view": crate::views::tcp::track::of(session.views()).map(|v| v.info()),
        "loader": args.loader,
        "sampler": crate::views::sampler::track::of(session.views()).map(|s| json!({"settings": s.config(), "attached": s.attach_info()})),
        "cloud_layout": args.layout.spec(),
        "tcp_counters": tcp_counters,
        "sampler_counters": sampler_counters,
        "tcp_retransmits": retrans,
    })
}

/// The table's first line (after "rttscope ") and the result's title.
fn title(args: &CompareArgs, with_sampler: bool) -> String {
    format!(
        "compare {} port {}: -l {} -w {} -b {} -r {},{}{}",
        args.host,
        args.port,
        fmt_duration_short(args.length),
        fmt_duration_short(args.interval),
        args.burst,
        args.sizes.0,
        args.sizes.1,
        if with_sampler {
            format!(
                ", sampler 1/{} {}",
                args.sample_every,
                args.matching.as_str()
            )
        } else {
            String::new()
        }
    )
}

/// The result being assembled and the table's rows, one per view, in order.
struct Report {
    result: RunResult,
    rows: Vec<Row>,
}

impl Report {
    /// One view's samples into the result and its row into the table.
    fn add_series(
        &mut self,
        name: &str,
        kind: ViewKind,
        side: Option<&str>,
        what: String,
        s: &Series,
        settings: serde_json::Value,
    ) {
        let mut v = ViewSeries::new(name, kind);
        v.side = side.map(str::to_string);
        v.settings = settings;
        v.samples = s.iter().map(|&(t, r)| Sample::at_s(t, r)).collect();
        v.summary = Some(crate::analysis::results::ViewSummary::of_samples(
            name,
            Some(kind),
            &v.rtts_us(),
        ));
        self.result.views.push(v);
        self.rows.push(Row {
            view: name.to_string(),
            what,
            summary: summary_of(s),
            bucketed: None,
        });
    }

    /// The passive views' rows: TCP client/server, sampler client/server and
    /// the sampler's samples through the cloud buckets (whose median is
    /// returned as evidence for `--explain`).
    fn add_passive(
        &mut self,
        args: &CompareArgs,
        session: &Session,
        sides: &Sides,
    ) -> Option<CloudEvidence> {
        let tcp_set = || json!({"hook": "sock_ops RTT_CB"});
        self.add_series(
            "tcp client",
            ViewKind::Tcp,
            Some("client"),
            "TCP's RTT samples (sock_ops RTT_CB), connecting side".into(),
            &sides.tcp_client,
            tcp_set(),
        );
        if !sides.tcp_server.is_empty() {
            self.add_series(
                "tcp server",
                ViewKind::Tcp,
                Some("server"),
                "TCP's RTT samples, responding side (visible on this host)".into(),
                &sides.tcp_server,
                tcp_set(),
            );
        }
        let s = crate::views::sampler::track::of(session.views())?;
        let set =
            json!({"sample_every": s.config().sample_every, "match": s.config().matching.as_str()});
        let label = format!(
            "1/{} sampled, {} match, no Karn",
            s.config().sample_every,
            s.config().matching.as_str()
        );
        self.add_series(
            "sampler client",
            ViewKind::Sampler,
            Some("client"),
            format!("packet sampler at the interface ({label})"),
            &sides.smp_client,
            set.clone(),
        );
        if !sides.smp_server.is_empty() {
            self.add_series(
                "sampler server",
                ViewKind::Sampler,
                Some("server"),
                format!("packet sampler, responding side ({label})"),
                &sides.smp_server,
                set,
            );
        }
        if !sides.smp_icmp.is_empty() {
            self.add_series(
                "sampler icmp",
                ViewKind::Sampler,
                Some("pinger"),
                "packet sampler at the interface, the ICMP probe's echoes (passive)".into(),
                &sides.smp_icmp,
                json!({"sample_every": s.config().sample_every, "match": "echo"}),
            );
        }
        let all: Series = sides
            .smp_client
            .iter()
            .chain(sides.smp_server.iter())
            .copied()
            .collect();
        let (row, evidence) = cloud_row(&args.layout, &all);
        self.rows.push(row);
        evidence
    }

    /// The probes' rows, in the order they ran; the first failed probe's
    /// error ends the command.
    fn add_probes(
        &mut self,
        rr_results: RrResults,
        irtt_result: IrttOutcome,
        irtt_cfg: Option<&crate::active::irtt::IrttConfig>,
        origin_mono: u64,
    ) -> Result<()> {
        for r in rr_results {
            let r = r?;
            let name = match r.settings.kind {
                Kind::TcpRr => "TCP_RR",
                Kind::UdpRr => "UDP_RR",
                Kind::Icmp => "ICMP",
            };
            // On the rows' clock: from the TCP probe's first transaction.
            let shift = r.ident.start_mono_ns as f64 - origin_mono as f64;
            let s: Series = r
                .samples
                .iter()
                .map(|&(off, rtt)| ((off as f64 + shift) / 1e9, rtt as f64 / 1e3))
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
                    format!(", {}", crate::sinks::table::count(r.counts.errors, "error"))
                } else {
                    String::new()
                }
            );
            let settings = serde_json::to_value(&r.settings)?;
            self.add_series(name, kind, None, what, &s, settings);
        }
        if let Some(ir) = irtt_result {
            let ir = ir?;
            let s: Series = ir
                .rtt_samples()
                .map(|(off, rtt)| (off as f64 / 1e9, rtt as f64 / 1e3))
                .collect();
            self.add_series(
                "irtt",
                ViewKind::Irtt,
                None,
                "irtt isochronous UDP (irtt protocol)".into(),
                &s,
                json!({"interval_s": irtt_cfg.map(|c| c.interval.as_secs_f64())}),
            );
        }
        Ok(())
    }
}

/// `--cloud FILE`: the Cloud Monitoring file, parsed.
fn read_cloud_file(
    path: &std::path::Path,
) -> Result<(String, crate::analysis::cloud_monitoring::CloudFile)> {
    let name = path.display().to_string();
    let text = crate::sys::files::read_to_string(path)?;
    Ok((
        name.clone(),
        crate::analysis::cloud_monitoring::parse(&text, &name)?,
    ))
}

/// The "cloud" row of `--cloud FILE`: the file's distribution points merged, percentiles by the
/// aligner's interpolation in the file's own buckets; or the already-aligned values.
fn cloud_file_row(name: &str, f: &crate::analysis::cloud_monitoring::CloudFile) -> Row {
    let m = crate::analysis::cloud_monitoring::merge_file(f);
    let mut sm = Summary::empty();
    let (what, bucketed) = match &m.distribution {
        Some(d) => {
            let pct = |p: f64| {
                d.percentile(p)
                    .ok()
                    .flatten()
                    .map_or(f64::NAN, |x| d.unit.to_us(x.value))
            };
            sm.n = d.count;
            sm.p50 = pct(50.0);
            sm.p90 = pct(90.0);
            sm.p99 = pct(99.0);
            sm.mean = d.unit.to_us(d.mean);
            (
                format!(
                    "the cloud's distribution from {name}: {} point(s){}, layout from the file ({}), percentile aligner interpolation",
                    m.points,
                    if m.skipped > 0 {
                        format!(" ({} with another layout left out)", m.skipped)
                    } else {
                        String::new()
                    },
                    d.bucket_options.spec()
                ),
                Some(d.bucket_options.spec()),
            )
        }
        None => {
            sm.n = m.aligned.len() as u64;
            let ms: Vec<f64> = m.aligned.iter().map(|v| v * 1000.0).collect();
            let s = Summary::from_us(&ms);
            sm.min = s.min;
            sm.mean = s.mean;
            sm.max = s.max;
            (
                format!(
                    "{name}: {} already-aligned value(s) (the request's aligner, e.g. ALIGN_PERCENTILE_50; ms assumed): min/mean/max of them, N counts points",
                    m.aligned.len()
                ),
                None,
            )
        }
    };
    Row {
        view: "cloud".into(),
        what,
        summary: sm,
        bucketed,
    }
}

impl Report {
    /// `--cloud FILE`: one more row, and the file's distribution in the result's settings.
    fn add_cloud_file(&mut self, name: &str, f: &crate::analysis::cloud_monitoring::CloudFile) {
        self.rows.push(cloud_file_row(name, f));
        self.result.settings["cloud_file"] = json!({
            "path": name,
            "merged": crate::analysis::cloud_monitoring::merge_file(f),
        });
    }
}

/// The "sampler cloud" row: the samples through the cloud metric's buckets
/// (percentiles interpolated inside buckets, min/max not defined), and
/// where its median came from.
fn cloud_row(layout: &BucketOptions, all: &Series) -> (Row, Option<CloudEvidence>) {
    let mut d = Distribution::new(layout.clone(), ValueUnit::Ms);
    for (_, r) in all {
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
    let evidence = pct(50.0).map(|p| CloudEvidence {
        p50_us: ValueUnit::Ms.to_us(p.value),
        bucket_lo_ms: layout.lower(p.bucket),
        bucket_hi_ms: layout.upper(p.bucket),
        bucket_share_pct: p.p_up - p.p_low,
        exact_p50_us: summary_of(all).p50,
    });
    let row = Row {
        view: "sampler cloud".into(),
        what: format!(
            "sampler samples through cloud buckets ({}), percentile aligner interpolation",
            layout.spec()
        ),
        summary: sm,
        bucketed: Some(layout.spec()),
    };
    (row, evidence)
}

/// What the table's last line says about the TCP view.
struct Footer {
    /// Samples of other traffic left out (said by `--explain`).
    others: u64,
    retrans: u64,
    hook: String,
    loader: LoaderKind,
}

/// Print the table (and the notes with `--explain`), then save the result
/// with `--json`.
fn output(
    args: &CompareArgs,
    mut report: Report,
    footer: &Footer,
    cloud: Option<CloudEvidence>,
) -> Result<()> {
    // `--json -`: the result alone on stdout (for a pipe), the table on stderr.
    let json_to_stdout = args.json.as_deref() == Some(std::path::Path::new("-"));
    let mut out: Box<dyn Write> = if json_to_stdout {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    let title = report.result.title.clone().unwrap_or_default();
    if args.format == crate::cmd::probe::PrintFormat::Csv {
        out.write_all(rows_csv(&report.rows).as_bytes())?;
    } else {
        render_table(&mut out, &title, &report.rows, footer)?;
    }
    if args.explain {
        let mut notes = explain(&report.rows, args.interval, footer.retrans, cloud);
        if footer.others > 0 {
            notes.push(format!(
                "{} passive sample(s) of other traffic (other connections or pings on this host, or the probes' own handshake and close outside their windows) are in no row: each row holds only this run's probes, from their first transaction to their last.",
                footer.others
            ));
        }
        render_notes(&mut out, &notes)?;
        report.result.settings["notes"] = json!(notes);
    }
    report.result.settings["rows"] = serde_json::to_value(&report.rows)?;
    if let Some(path) = &args.json {
        report.result.write_to(path)?;
    }
    if let (Some(path), false) = (&args.json, json_to_stdout) {
        writeln!(
            out,
            "saved: {} (draw it: rttscope chart {} -o chart.png)",
            path.display(),
            path.display()
        )?;
    }
    Ok(())
}

/// The table: title, header, one line per row, the TCP view's footer.
fn render_table(
    out: &mut dyn Write,
    title: &str,
    rows: &[Row],
    footer: &Footer,
) -> std::io::Result<()> {
    use crate::sinks::table::{Align, Table};
    writeln!(out, "rttscope {title}")?;
    let mut t = Table::new().col("VIEW", Align::Left).col("N", Align::Right);
    for h in ["MIN ms", "MEAN ms", "P50 ms", "P90 ms", "P99 ms", "MAX ms"] {
        t = t.col(h, Align::Right);
    }
    t = t.col("WHAT", Align::Left);
    for r in rows {
        let s = &r.summary;
        t.row([
            r.view.clone(),
            s.n.to_string(),
            fmt_ms(s.min),
            fmt_ms(s.mean),
            fmt_ms(s.p50),
            fmt_ms(s.p90),
            fmt_ms(s.p99),
            fmt_ms(s.max),
            r.what.clone(),
        ]);
    }
    write!(out, "{}", t.render())?;
    writeln!(
        out,
        "TCP view: {} retransmissions on the probe's connections; hook: {} ({} loader)",
        footer.retrans, footer.hook, footer.loader
    )
}

/// `--format csv`: one row per view summary, RTTs in microseconds (empty when not known).
fn rows_csv(rows: &[Row]) -> String {
    use crate::sinks::table::{Align, Table};
    let us = |v: f64| {
        if v.is_nan() {
            String::new()
        } else {
            v.to_string()
        }
    };
    let heads = [
        "view",
        "count",
        "min_us",
        "mean_us",
        "p50_us",
        "p90_us",
        "p99_us",
        "max_us",
        "stddev_us",
        "bucketed",
        "what",
    ];
    let mut t = heads
        .into_iter()
        .fold(Table::new(), |t, h| t.col(h, Align::Right));
    for r in rows {
        let s = &r.summary;
        t.row([
            r.view.clone(),
            s.n.to_string(),
            us(s.min),
            us(s.mean),
            us(s.p50),
            us(s.p90),
            us(s.p99),
            us(s.max),
            us(s.stddev),
            r.bucketed.clone().unwrap_or_default(),
            r.what.clone(),
        ]);
    }
    t.csv()
}

/// The `--explain` block: a blank line, then the notes (or the sentence
/// saying there are none).
fn render_notes(out: &mut dyn Write, notes: &[String]) -> std::io::Result<()> {
    writeln!(out)?;
    if notes.is_empty() {
        writeln!(
            out,
            "explain: no known cause of a difference is evident in this data."
        )?;
    }
    for n in notes {
        writeln!(out, "note: {n}")?;
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

    fn series(us: &[f64]) -> Series {
        us.iter()
            .enumerate()
            .map(|(i, r)| (i as f64 * 0.02, *r))
            .collect()
    }

    fn series_row(view: &str, what: &str, us: &[f64]) -> Row {
        Row {
            view: view.into(),
            what: what.into(),
            summary: summary_of(&series(us)),
            bucketed: None,
        }
    }

    /// `--format csv`: a header and one row per view summary, microseconds, quoted where a field
    /// holds a comma, empty where a value is unknown.
    #[test]
    fn rows_as_csv() {
        let rows = vec![
            series_row("TCP_RR", "send()->recv(), 0 lost", &[100.0, 200.0, 300.0]),
            series_row("sampler server", "none", &[]),
        ];
        let csv = rows_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "view,count,min_us,mean_us,p50_us,p90_us,p99_us,max_us,stddev_us,bucketed,what"
        );
        assert!(
            lines[1].starts_with("TCP_RR,3,100,200,200,300,300,300,81.6"),
            "{csv}"
        );
        assert!(lines[1].ends_with(",,\"send()->recv(), 0 lost\""), "{csv}");
        assert_eq!(lines[2], "sampler server,0,,,,,,,,,none");
    }

    /// The table and the `--explain` block from fixed rows, byte for byte.
    #[test]
    fn table_and_notes_golden() {
        let client = [50.0, 60.0, 70.0, 80.0, 400.0];
        let layout = crate::analysis::dist::layout_arg("vm_flow").unwrap();
        let (cloud, evidence) = cloud_row(&layout, &series(&client));
        let rows = vec![
            series_row("tcp client", "TCP's RTT samples", &client),
            series_row(
                "tcp server",
                "responding side",
                &[19_900.0, 20_000.0, 20_100.0],
            ),
            series_row("sampler client", "packet sampler", &client),
            cloud,
            series_row("TCP_RR", "TCP_RR; 0 lost", &[90.0, 100.0, 110.0]),
            series_row("ICMP", "ICMP_ECHO; 0 lost", &[20.0, 30.0, 40.0]),
        ];
        let footer = Footer {
            others: 0,
            retrans: 2,
            hook: "cgroup sock_ops".into(),
            loader: LoaderKind::Libbpf,
        };
        let mut out = Vec::new();
        render_table(&mut out, "compare H port 7878: -l 3s", &rows, &footer).unwrap();
        let notes = explain(&rows, Duration::from_millis(20), footer.retrans, evidence);
        render_notes(&mut out, &notes).unwrap();
        render_notes(&mut out, &[]).unwrap();
        let got = String::from_utf8(out).unwrap();
        let want = [
            "rttscope compare H port 7878: -l 3s",
            "VIEW            N  MIN ms  MEAN ms  P50 ms  P90 ms  P99 ms  MAX ms  WHAT",
            "tcp client      5   0.050    0.132   0.070   0.400   0.400   0.400  TCP's RTT samples",
            "tcp server      3  19.900   20.000  20.000  20.100  20.100  20.100  responding side",
            "sampler client  5   0.050    0.132   0.070   0.400   0.400   0.400  packet sampler",
            "sampler cloud   5       -    0.132   0.500   0.900   0.990       -  sampler samples through cloud buckets (explicit:0,1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768,65536), percentile aligner interpolation",
            "TCP_RR          3   0.090    0.100   0.100   0.110   0.110   0.110  TCP_RR; 0 lost",
            "ICMP            3   0.020    0.030   0.030   0.040   0.040   0.040  ICMP_ECHO; 0 lost",
            "TCP view: 2 retransmissions on the probe's connections; hook: cgroup sock_ops (libbpf loader)",
            "",
            "note: server-side TCP RTT p50 20.000 ms is close to the probe interval 20.000 ms (below the 40 ms delayed-ACK timer) while the client side's is 0.070 ms: the client's TCP holds its ACK of each response until the next request carries it (delayed ACK), so the server times the think time.",
            "note: the cloud-bucket median 0.500 ms is interpolated inside the [0, 1) ms bucket, which holds 100% of the samples (at its midpoint when it holds them all); the exact median of the same samples is 0.070 ms: a bucketing artifact, not a network difference.",
            "note: ICMP p50 0.030 ms is below TCP_RR p50 0.100 ms: an echo is answered inside the kernel, a request/response crosses TCP and both applications.",
            "",
            "explain: no known cause of a difference is evident in this data.",
        ]
        .map(|l| format!("{l}\n"))
        .concat();
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn cloud_file_row_from_a_fixture() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cloud");
        let (name, f) = read_cloud_file(&dir.join("explicit-vm_flow.json")).unwrap();
        let row = cloud_file_row(&name, &f);
        assert_eq!((row.view.as_str(), row.summary.n), ("cloud", 1002));
        let want = 1000.0 * 50.0 / (100.0 * 1001.0 / 1002.0);
        assert!((row.summary.p50 - want).abs() < 1e-6, "{:?}", row.summary);
        assert!(row.what.contains("layout from the file"), "{}", row.what);
        let (name, f) = read_cloud_file(&dir.join("aligned-p50.json")).unwrap();
        let row = cloud_file_row(&name, &f);
        assert_eq!(row.summary.n, 2);
        assert_eq!(row.summary.mean, 500.0);
        assert!(row.summary.p50.is_nan());
        let e = read_cloud_file(&dir.join("bad-count.json")).unwrap_err();
        assert!(format!("{e:#}").contains("bucketCounts add up to 4"));
    }

    /// compare's -l, -w, -r are netperf's, parsed as probe parses them:
    /// `-l 3` and `-l 3s` are 3 s, `-w 10` and `-w 10m` are 10 ms, `-w -1` none.
    #[test]
    fn netperf_options_parse_as_probe_does() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: CompareArgs,
        }
        let p = |extra: &[&str]| {
            let mut v = vec!["compare", "h"];
            v.extend_from_slice(extra);
            T::try_parse_from(v).map(|t| t.a)
        };
        for (l, w, want_l, want_w) in [
            ("3", "10", 3000, 10),
            ("3s", "10m", 3000, 10),
            ("1.5", "-1", 1500, 0),
            ("500ms", "10ms", 500, 10),
        ] {
            let a = p(&["-l", l, "-w", w]).unwrap();
            assert_eq!(a.length, Duration::from_millis(want_l), "-l {l}");
            assert_eq!(a.interval, Duration::from_millis(want_w), "-w {w}");
        }
        assert_eq!(p(&["-r", "1409"]).unwrap().sizes, (1409, 1409));
        assert!(p(&["-r", "0,1"]).is_err());
        assert!(p(&["-l", "soon"]).is_err());
    }
}
