//! `rttscope observe`: the passive views (TCP; sampler) in one table.
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use crate::bpf::tcp::types::rttscope_tcp_counter as C;
use crate::flow::Flow;
use crate::hist::{Hist, Snapshot};
use crate::loader::{self, LoaderKind};
use crate::netns::{self, NetNs};
use crate::report::{self, FlowRow, Interval, ViewStats};
use crate::tcp_view::{self, TcpFlowState, TcpViewConfig};
use crate::units::{duration_arg, fmt_duration_short};

#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// Only these network namespaces (names under /var/run/netns, or `host`); repeatable.
    #[arg(long = "netns", value_name = "NAME")]
    pub netns: Vec<String>,
    /// Also enable existing connections in every network namespace (default: the current one and --netns ones).
    #[arg(long)]
    pub all_netns: bool,
    /// cgroup v2 directory to attach the sock_ops program to (default: the cgroup v2 root).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Only connections with this local or remote port; repeatable.
    #[arg(long = "port", value_name = "N")]
    pub ports: Vec<u16>,
    /// Only connections with a local or remote address in this CIDR; repeatable.
    #[arg(long = "addr", value_name = "CIDR")]
    pub addrs: Vec<ipnet::IpNet>,
    /// Report interval.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    pub interval: Duration,
    /// Stop after this long (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Also stream every raw sample (ring buffer) to the output.
    #[arg(long)]
    pub raw: bool,
    /// Capacity of the per-flow tables (TCP view: when nearly full, the least recently active flows are evicted; sampler view: see --max-pending).
    #[arg(long, default_value_t = 16384)]
    pub max_flows: u32,
    /// TCP view: take samples from the optional per-ACK hook (fexit/tcp_ack_update_rtt) instead of the sock_ops RTT callback.
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    pub ack_hook: crate::tcp_view::AckHook,
    /// Views to show, comma separated: tcp, sampler (default: tcp, plus sampler when --iface is given).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub view: Option<Vec<View>>,
    /// Sampler view: interface to sample at ingress and egress, NAME (current namespace) or NETNS:NAME; repeatable.
    #[arg(long = "iface", value_name = "[NETNS:]NAME")]
    pub ifaces: Vec<crate::sampler::IfaceSpec>,
    /// Sampler view: sample each packet, in each direction, with probability 1/N (the cloud sampler samples).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sample_every: u32,
    /// Sampler view: pair segments and ACKs by sequence number (cloud sampler) or TCP timestamps (pping).
    #[arg(long = "match", value_enum, default_value = "seq")]
    pub matching: crate::sampler::Matching,
    /// Sampler view: tcx links (kernel >= 6.6), clsact filters, or tcx falling back to clsact.
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: crate::sampler::AttachMode,
    /// Sampler view: drop a recorded segment not acknowledged within this time (counted as expired).
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub pending_timeout: Duration,
    /// Sampler view: flow-table size (entries = max(--max-flows, --max-pending), rounded up to a power of two; each holds a flow's pending segments).
    #[arg(long, default_value_t = 16384)]
    pub max_pending: u32,
    /// Also aggregate each view like the cloud metric: a distribution per alignment period with
    /// percentile-aligner interpolation (layout --cloud-layout, period --cloud-period).
    #[arg(long)]
    pub cloud_buckets: bool,
    /// Bucket layout for --cloud-buckets (see `rttscope bucket --help`).
    #[arg(long, default_value = "vm_flow", value_parser = crate::dist::layout_arg)]
    pub cloud_layout: crate::dist::BucketOptions,
    /// Alignment period for --cloud-buckets (the metric API's default: 60s).
    #[arg(long, default_value = "60s", value_parser = crate::units::period_arg)]
    pub cloud_period: Duration,
    /// BPF loader: libbpf (libbpf-rs, the default) or aya (pure Rust); see docs/loaders.md.
    #[arg(long, value_enum, env = "RTTSCOPE_LOADER", default_value_t = LoaderKind::DEFAULT)]
    pub loader: LoaderKind,
    // --- daemon mode (metrics.rs, config.rs, caps.rs) ---
    /// Read options from this TOML file (flags given on the command line win).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Validate --config FILE, print the result and exit.
    #[arg(long, requires = "config")]
    pub check_config: bool,
    /// Serve Prometheus/OpenMetrics /metrics on this address (bare --listen: 127.0.0.1:9464; other addresses must be given explicitly).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = crate::metrics::DEFAULT_LISTEN, value_parser = crate::metrics::parse_listen)]
    pub listen: Option<std::net::SocketAddr>,
    /// Metrics labels: remote IPv4 addresses aggregated to this prefix length (default 24).
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=32))]
    pub v4_prefix: Option<u8>,
    /// Metrics labels: remote IPv6 addresses aggregated to this prefix length (default 48).
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pub v6_prefix: Option<u8>,
    /// Metrics labels: keep this local port as a label value (others: "other"); repeatable.
    #[arg(long = "label-port", value_name = "N")]
    pub label_ports: Vec<u16>,
    /// Metrics labels: at most this many RTT label sets (default 1000); more go to an overflow series.
    #[arg(long, value_name = "N")]
    pub max_series: Option<usize>,
    /// Metrics labels: remove a label set idle for this long (default 10m).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub series_idle: Option<Duration>,
    /// No per-interval output (daemon mode: metrics only).
    #[arg(long)]
    pub quiet: bool,
    /// Turn on kernel BPF run-time statistics while running (needs CAP_SYS_ADMIN; else set sysctl kernel.bpf_stats_enabled=1).
    #[arg(long)]
    pub bpf_stats: bool,
}

/// Live cloud-metric aggregation of one view (`--cloud-buckets`): the kernel
/// histograms' interval deltas go into a Cloud Monitoring distribution, each
/// kernel bucket at its midpoint (kernel buckets are <= 12.5% wide, far
/// narrower than the cloud's 0-1, 1-2, 2-4 ms buckets).
struct CloudAgg {
    layout: crate::dist::BucketOptions,
    period: Duration,
    dist: crate::dist::Distribution,
    period_start: f64,
}

impl CloudAgg {
    fn new(layout: crate::dist::BucketOptions, period: Duration) -> Self {
        let dist = crate::dist::Distribution::new(layout.clone(), crate::dist::ValueUnit::Ms);
        CloudAgg {
            layout,
            period,
            dist,
            period_start: 0.0,
        }
    }

    fn add(&mut self, h: &Hist) {
        for (i, &c) in h.counts.iter().enumerate() {
            if c > 0 {
                let (lo, hi) = crate::hist::bucket_bounds(i);
                let mid = if hi.is_finite() { (lo + hi) / 2.0 } else { lo };
                let v = match (h.min_us, h.max_us) {
                    (Some(mn), Some(mx)) => mid.clamp(mn as f64, mx as f64),
                    _ => mid,
                };
                self.dist.add_n(v / 1000.0, c);
            }
        }
    }

    /// The period so far (or the completed one) as JSON.
    fn point(&self, t: f64, complete: bool) -> serde_json::Value {
        let p = |q: f64| {
            self.dist
                .percentile(q)
                .ok()
                .flatten()
                .map(|x| x.value * 1000.0)
        };
        json!({
            "period_start_s": self.period_start,
            "period_s": self.period.as_secs_f64(),
            "complete": complete,
            "t": t,
            "count": self.dist.count,
            "layout": self.layout.spec(),
            "p50_us": p(50.0), "p95_us": p(95.0), "p99_us": p(99.0),
        })
    }

    /// Close the period if it is over: returns the completed point.
    fn roll(&mut self, t: f64) -> Option<serde_json::Value> {
        if t - self.period_start + 1e-6 < self.period.as_secs_f64() {
            return None;
        }
        let done = self.point(t, true);
        self.dist = crate::dist::Distribution::new(self.layout.clone(), crate::dist::ValueUnit::Ms);
        self.period_start = t;
        Some(done)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum View {
    /// RTT as TCP computes it (sock_ops RTT callback).
    Tcp,
    /// The cloud-style packet sampler at interface ingress/egress (tc).
    Sampler,
}

impl ObserveArgs {
    /// The views this run shows.
    pub fn views(&self) -> Vec<View> {
        match &self.view {
            Some(v) => {
                let mut v = v.clone();
                v.dedup();
                v
            }
            None if self.ifaces.is_empty() => vec![View::Tcp],
            None => vec![View::Tcp, View::Sampler],
        }
    }

    pub fn sampler_config(&self) -> crate::sampler::SamplerConfig {
        crate::sampler::SamplerConfig {
            sample_every: self.sample_every,
            matching: self.matching,
            raw: self.raw,
            max_flows: self.max_flows,
            max_pending: self.max_pending,
            pending_timeout: self.pending_timeout,
            attach: self.attach,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Monotonic clock in ns (the clock of the kernel programs' timestamps).
pub fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Display names of network namespaces, refreshed when an unknown one shows up.
struct NsNames {
    names: BTreeMap<u32, String>,
    refreshed: Instant,
}

impl NsNames {
    fn new() -> Self {
        NsNames {
            names: netns::names(),
            refreshed: Instant::now(),
        }
    }
    fn get(&mut self, inode: u32) -> String {
        if !self.names.contains_key(&inode) && self.refreshed.elapsed() > Duration::from_millis(500)
        {
            self.names = netns::names();
            self.refreshed = Instant::now();
        }
        self.names
            .get(&inode)
            .cloned()
            .unwrap_or_else(|| format!("net:{inode}"))
    }
}

/// Per-flow bookkeeping between intervals: a sparse snapshot of each flow's
/// cumulative histogram (the interval's counts are the difference).
#[derive(Default)]
struct Tracker {
    /// Each flow's histogram at the last read, and the interval of its last sample.
    prev: HashMap<Flow, (Snapshot, u64)>,
    sides: HashMap<Flow, crate::flow::Side>,
    seen: std::collections::HashSet<Flow>,
    interval: u64,
    vanished: u64,
    evicted: u64,
    closed_reported: u64,
    tracked: u64,
    /// Slots given back by us (closed, evicted): with the kernel's
    /// flows_created, the table's occupancy between reads.
    freed: u64,
    /// Closed flows read and freed before the interval's report (the table
    /// was filling up): their rows wait here for the report.
    early_rows: Vec<(Flow, FlowRow)>,
    early_total: Hist,
}

impl Tracker {
    fn begin(&mut self) {
        self.seen.clear();
        self.tracked = 0;
        self.interval += 1;
    }

    fn forget(&mut self, flow: &Flow) {
        self.prev.remove(flow);
        self.freed += 1;
    }

    /// Whether closed flows should be read and freed before the interval
    /// ends: more than half of the `capacity` slots taken (`created`: the
    /// kernel's flows_created). Under heavy churn a closed flow would
    /// otherwise hold its slot until the next report, and a table could
    /// fill with flows that are only waiting to be reported.
    fn reclaim_due(&self, created: u64, capacity: u32) -> bool {
        created.saturating_sub(self.freed) > capacity as u64 / 2
    }

    /// Whether this read should collect eviction candidates: the last one
    /// found at least 3/4 of the `capacity` slots taken (below that, the
    /// list would only cost memory).
    fn near_full(&self, capacity: u32) -> bool {
        self.tracked as usize >= (capacity as usize - capacity as usize / 4)
    }

    /// Live flows (slot, gen, flow) to evict: when more than 7/8 of the
    /// `capacity` slots are taken, the least recently active ones, down to 3/4.
    fn to_evict(&self, mut live: Vec<(u32, u32, Flow)>, capacity: u32) -> Vec<(u32, u32, Flow)> {
        let cap = capacity as usize;
        if live.len() <= cap - cap / 8 {
            return Vec::new();
        }
        let n = live.len() - (cap - cap / 4);
        live.sort_by_key(|l| self.prev.get(&l.2).map_or(0, |p| p.1));
        live.truncate(n);
        live
    }

    /// One flow of this interval's read: its row, if it had samples, is new, or closed.
    fn flow_row(
        &mut self,
        f: &TcpFlowState,
        epoch: u32,
        names: &mut NsNames,
        total: &mut Hist,
    ) -> Option<FlowRow> {
        self.seen.insert(f.flow);
        self.sides.insert(f.flow, f.side);
        self.tracked += 1;
        let first = !self.prev.contains_key(&f.flow);
        let mut delta = self
            .prev
            .get(&f.flow)
            .map_or_else(|| f.hist(), |p| p.0.delta(&f.counts, f.sum_us));
        if delta.count() > 0 && f.win_epoch == epoch && f.win_min_us <= f.win_max_us {
            delta.set_range(Some(f.win_min_us), Some(f.win_max_us));
        } else if first && delta.count() > 0 {
            delta.set_range(f.life_min_us, f.life_max_us);
        }
        let active = match self.prev.get(&f.flow) {
            Some(p) if !first && delta.count() == 0 => p.1,
            _ => self.interval,
        };
        self.prev
            .insert(f.flow, (Snapshot::of_counts(&f.counts, f.sum_us), active));
        if delta.count() == 0 && !first && !f.closed {
            return None;
        }
        total.merge(&delta);
        let mut vs = ViewStats::from_hist(&delta);
        vs.srtt_us = Some(f.srtt_us);
        vs.retrans = Some(f.retrans);
        Some(FlowRow {
            netns: f.flow.netns,
            netns_name: names.get(f.flow.netns),
            local: f.flow.local.to_string(),
            remote: f.flow.remote.to_string(),
            side: f.side,
            origin: Some(f.origin),
            state: Some(tcp_view::state_name(f.state)),
            closed: f.closed,
            tcp: Some(vs),
            sampler: None,
            flow: Some(f.flow),
        })
    }

    /// The side the TCP view found for a flow (for rows only the sampler saw).
    fn side_of(&self, flow: &Flow) -> crate::flow::Side {
        self.sides
            .get(flow)
            .copied()
            .unwrap_or(crate::flow::Side::Unknown)
    }

    /// After a full read: flows that disappeared without a close were evicted.
    fn end(&mut self) {
        let before = self.prev.len();
        let seen = &self.seen;
        self.prev.retain(|k, _| seen.contains(k));
        self.sides.retain(|k, _| seen.contains(k));
        self.vanished += (before - self.prev.len()) as u64;
    }
}

/// Read the TCP view's table between reports and free the slots of closed
/// flows now, keeping their rows (and exporting their samples in daemon
/// mode) for the interval's report.
fn reclaim_closed(
    view: &mut dyn crate::loader::TcpLoader,
    tracker: &mut Tracker,
    names: &mut NsNames,
    mut daemon: Option<&mut crate::metrics::Daemon>,
    keep_rows: bool,
) -> Result<()> {
    let epoch = view.epoch();
    let tracked = tracker.tracked;
    let mut closed = Vec::new();
    let mut total = std::mem::take(&mut tracker.early_total);
    view.for_each_flow(&mut |f| {
        if !f.closed {
            return;
        }
        if let Some(d) = daemon.as_deref_mut() {
            d.tcp_flow(&f, tracker.prev.get(&f.flow).map(|p| &p.0), |ns| {
                names.get(ns)
            });
        }
        if let Some(r) = tracker.flow_row(&f, epoch, names, &mut total) {
            if keep_rows {
                tracker.early_rows.push((f.flow, r));
            }
        }
        closed.push((f.slot, f.gen, f.flow));
    })?;
    tracker.early_total = total;
    tracker.tracked = tracked; // a partial read: the interval's count stays
    for (slot, gen, flow) in closed {
        view.forget(slot, gen)?;
        tracker.forget(&flow);
        tracker.closed_reported += 1;
    }
    Ok(())
}

pub fn run(args: ObserveArgs) -> Result<()> {
    // daemon mode: --config / --check-config (config.rs)
    let Some(args) = crate::config::resolve(args)? else {
        return Ok(());
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(observe(args))
}

async fn observe(args: ObserveArgs) -> Result<()> {
    if args.interval < Duration::from_millis(10) {
        anyhow::bail!("--interval must be at least 10ms");
    }
    if args.cloud_period.is_zero() {
        anyhow::bail!(crate::units::ZERO_PERIOD);
    }
    let views = args.views();
    let want_tcp = views.contains(&View::Tcp);
    let want_sampler = views.contains(&View::Sampler);
    if want_sampler && args.ifaces.is_empty() {
        anyhow::bail!(
            "the sampler view needs at least one --iface NAME (or NETNS:NAME) to attach to"
        );
    }
    if !want_sampler && !args.ifaces.is_empty() {
        anyhow::bail!(
            "--iface is for the sampler view: add sampler to --view (e.g. --view tcp,sampler)"
        );
    }
    let netns_filter: Vec<NetNs> = args
        .netns
        .iter()
        .map(|n| netns::resolve(n))
        .collect::<Result<_>>()?;
    // daemon mode: bind /metrics before attaching, so a bad address fails early.
    let listener = match args.listen {
        Some(a) => Some(crate::metrics::bind(a).await?),
        None => None,
    };
    let mut tcp = if want_tcp {
        let iter_netns: Vec<NetNs> = if args.all_netns {
            netns::all().into_values().collect()
        } else if !netns_filter.is_empty() {
            netns_filter.clone()
        } else {
            vec![netns::resolve("self")?]
        };
        let cfg = TcpViewConfig {
            cgroup: args.cgroup.clone(),
            netns_filter: netns_filter.clone(),
            iter_netns,
            ports: args.ports.clone(),
            cidrs: args.addrs.clone(),
            raw: args.raw,
            max_flows: args.max_flows,
            ack_hook: args.ack_hook,
        };
        Some(loader::attach_tcp(args.loader, &cfg)?)
    } else {
        None
    };
    let mut sampler = if want_sampler {
        crate::preflight::require_bpf_caps()?;
        let cfg = args.sampler_config();
        cfg.validate()?;
        Some(crate::sampler::SamplerView::attach_with(
            args.loader,
            &args.ifaces,
            cfg,
        )?)
    } else {
        None
    };
    // daemon mode: serve /metrics, report hooks, drop capabilities (metrics.rs).
    let mut daemon = match listener {
        Some(l) => Some(crate::metrics::Daemon::start(
            l,
            &args,
            tcp.as_deref(),
            sampler.as_ref(),
        )?),
        None => None,
    };
    let view_names: Vec<&str> = views
        .iter()
        .map(|v| match v {
            View::Tcp => "tcp",
            View::Sampler => "sampler",
        })
        .collect();
    let mut names = NsNames::new();
    let start_mono = monotonic_ns();
    let start = Instant::now();
    let stdout = std::io::stdout();

    let settings = json!({
        "interval_s": args.interval.as_secs_f64(),
        "duration_s": args.duration.map(|d| d.as_secs_f64()),
        "netns": args.netns,
        "all_netns": args.all_netns,
        "ports": args.ports,
        "addrs": args.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "raw": args.raw,
        "max_flows": args.max_flows,
        "ack_hook": args.ack_hook,
        "loader": args.loader,
        "histogram": "log-linear: 1 us buckets below 8 us, then 8 linear sub-buckets per power of two (<= 12.5% wide)",
    });
    let mut header = format!(
        "rttscope observe | interval {}",
        fmt_duration_short(args.interval)
    );
    if let Some(v) = &tcp {
        header += &format!(
            " | view tcp: sock_ops @ cgroup {}, rtt source: {}, netns {}",
            v.info().cgroup,
            v.info().rtt_source_short(),
            if args.netns.is_empty() {
                "all".to_string()
            } else {
                args.netns.join(",")
            }
        );
    }
    if let Some(s) = &sampler {
        let c = s.config();
        let ifs: Vec<String> = s
            .attach_info()
            .iter()
            .map(|a| format!("{}:{} ({})", a.netns, a.iface, a.how))
            .collect();
        header += &format!(
            " | view sampler: 1/{} sampling, match {}, no Karn, on {}",
            c.sample_every,
            c.matching.as_str(),
            ifs.join(" ")
        );
    }
    {
        let mut out = stdout.lock();
        match args.format {
            Format::Json => {
                let line = json!({
                    "type": "start",
                    "version": 1,
                    "ts": unix_now(),
                    "views": view_names,
                    "settings": settings,
                    "tcp": tcp.as_ref().map(|v| v.info()),
                    "sampler": sampler.as_ref().map(|s| json!({
                        "settings": s.config(),
                        "attached": s.attach_info(),
                        "prog_ids": s.prog_ids(),
                    })),
                    "clock": "CLOCK_MONOTONIC (raw sample ts_ns); t = seconds since start",
                });
                writeln!(out, "{line}")?;
            }
            Format::Table => {
                writeln!(out, "{header}")?;
                if let Some(v) = &tcp {
                    writeln!(
                        out,
                        "existing connections enabled: {} (in {})",
                        v.info().existing_enabled,
                        v.info().iter_netns.join(",")
                    )?;
                }
                writeln!(out, "waiting for samples...\n")?;
            }
        }
        out.flush()?;
    }

    // Raw samples of the TCP view: the loader's ring buffer, driven by tokio (AsyncFd).
    let raw_lines: std::rc::Rc<std::cell::RefCell<Vec<String>>> = Default::default();
    let mut tcp_raw = match (tcp.as_mut(), args.raw) {
        (Some(v), true) => Some(v.raw_samples()?),
        _ => None,
    };
    let mut raw_events: Vec<crate::bpf::Event> = Vec::new();
    // The sampler's raw samples are polled (its ring buffer lives inside the view).
    let mut raw_poll = tokio::time::interval(Duration::from_millis(100));

    let mut tracker = Tracker::default();
    let mut sampler_prev: HashMap<Flow, Snapshot> = HashMap::new();
    let mut cloud: BTreeMap<&'static str, CloudAgg> = BTreeMap::new();
    if args.cloud_buckets {
        for v in &view_names {
            let name: &'static str = if *v == "tcp" { "tcp" } else { "sampler" };
            cloud.insert(
                name,
                CloudAgg::new(args.cloud_layout.clone(), args.cloud_period),
            );
        }
    }
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
    let mut last_tick = Instant::now();
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let rb_ready = async {
            match tcp_raw.as_mut() {
                Some(r) => r.next_batch(&mut raw_events).await,
                None => std::future::pending().await,
            }
        };
        let sampler_raw = async {
            if args.raw && sampler.is_some() {
                raw_poll.tick().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let stop = tokio::select! {
            _ = ticker.tick() => false,
            r = rb_ready => {
                r?;
                tcp_raw_lines(&mut raw_events, start_mono, args.format, &raw_lines);
                flush_raw(&raw_lines, &stdout)?;
                continue;
            }
            _ = sampler_raw => {
                if let Some(s) = sampler.as_mut() {
                    sampler_raw_lines(s, start_mono, args.format, &raw_lines)?;
                }
                flush_raw(&raw_lines, &stdout)?;
                continue;
            }
            _ = reclaim_tick.tick(), if tcp.is_some() => {
                if let Some(view) = tcp.as_mut() {
                    let cap = view.info().max_flows;
                    if tracker.reclaim_due(view.counter(C::RTTSCOPE_TC_FLOWS_CREATED), cap) {
                        reclaim_closed(
                            view.as_mut(),
                            &mut tracker,
                            &mut names,
                            daemon.as_mut(),
                            !args.quiet,
                        )?;
                    }
                }
                continue;
            }
            _ = until_deadline => true,
            _ = tokio::signal::ctrl_c() => true,
            _ = sigterm.recv() => true,
        };
        if let Some(r) = tcp_raw.as_mut() {
            r.drain_now(&mut raw_events)?;
            tcp_raw_lines(&mut raw_events, start_mono, args.format, &raw_lines);
        }
        if args.raw {
            if let Some(s) = sampler.as_mut() {
                sampler_raw_lines(s, start_mono, args.format, &raw_lines)?;
            }
        }
        flush_raw(&raw_lines, &stdout)?;
        if stop && last_tick.elapsed() < args.interval / 10 {
            break; // the last interval was just reported
        }
        // One interval: read each view, then start the next epoch.
        let mut rows: BTreeMap<Flow, FlowRow> = BTreeMap::new();
        let mut totals = BTreeMap::new();
        let mut totals_hist: BTreeMap<&'static str, Hist> = BTreeMap::new();
        let mut counters = BTreeMap::new();
        if let Some(view) = tcp.as_mut() {
            let epoch = view.epoch();
            let mut total = Hist::default();
            let mut closed = Vec::new();
            let mut live = Vec::new();
            let collect_live = tracker.near_full(view.info().max_flows);
            tracker.begin();
            view.for_each_flow(&mut |f| {
                // daemon mode: this flow's samples since the last read.
                if let Some(d) = daemon.as_mut() {
                    d.tcp_flow(&f, tracker.prev.get(&f.flow).map(|p| &p.0), |ns| {
                        names.get(ns)
                    });
                }
                if f.closed {
                    closed.push((f.slot, f.gen, f.flow));
                } else if collect_live {
                    live.push((f.slot, f.gen, f.flow));
                }
                if let Some(r) = tracker.flow_row(&f, epoch, &mut names, &mut total) {
                    if !args.quiet {
                        rows.insert(f.flow, r); // (--quiet: nothing prints rows)
                    }
                }
            })?;
            tracker.end();
            view.next_epoch();
            // Closed flows freed early (the table was filling up) are
            // reported with this interval too.
            for (flow, r) in tracker.early_rows.drain(..) {
                rows.insert(flow, r);
            }
            total.merge(&std::mem::take(&mut tracker.early_total));
            // Closed flows are reported once (this interval), then their
            // slots are given back.
            for (slot, gen, flow) in closed {
                view.forget(slot, gen)?;
                tracker.forget(&flow);
                tracker.closed_reported += 1;
            }
            // Few slots left: evict the least recently active live flows
            // (their sockets take a new slot at their next sample).
            for (slot, gen, flow) in tracker.to_evict(live, view.info().max_flows) {
                view.forget(slot, gen)?;
                tracker.forget(&flow);
                tracker.evicted += 1;
            }
            let mut tc = view.counters();
            tc.insert("flows_vanished", tracker.vanished);
            tc.insert("flows_evicted", tracker.evicted);
            tc.insert("flows_closed_reported", tracker.closed_reported);
            tc.insert("flows_tracked", tracker.tracked);
            if let Some(r) = &tcp_raw {
                tc.insert("raw_records_bad", r.bad_records);
            }
            counters.insert("tcp", tc);
            totals.insert("tcp", ViewStats::from_hist(&total));
            totals_hist.insert("tcp", total);
        }
        if let Some(s) = sampler.as_mut() {
            let mut total = Hist::default();
            let flows = s.read_flows()?;
            let mut seen = std::collections::HashSet::new();
            for f in &flows {
                seen.insert(f.flow);
                let first = !sampler_prev.contains_key(&f.flow);
                let mut delta = sampler_prev
                    .get(&f.flow)
                    .map_or_else(|| f.hist.clone(), |p| p.delta_hist(&f.hist));
                sampler_prev.insert(f.flow, Snapshot::of_hist(&f.hist));
                if delta.count() == 0 {
                    continue;
                }
                // daemon mode: the sampler's samples since the last read.
                if let Some(d) = daemon.as_mut() {
                    let ns = names.get(f.flow.netns);
                    d.sampler_delta(&f.flow, tracker.side_of(&f.flow), &ns, &delta);
                }
                delta.set_range(
                    f.interval_min_us
                        .or(if first { f.hist.min_us } else { None }),
                    f.interval_max_us
                        .or(if first { f.hist.max_us } else { None }),
                );
                total.merge(&delta);
                if args.quiet {
                    continue; // nothing prints rows
                }
                let stats = ViewStats::from_hist(&delta);
                let row = rows.entry(f.flow).or_insert_with(|| FlowRow {
                    netns: f.flow.netns,
                    netns_name: names.get(f.flow.netns),
                    local: f.flow.local.to_string(),
                    remote: f.flow.remote.to_string(),
                    side: tracker.side_of(&f.flow),
                    origin: None,
                    state: None,
                    closed: false,
                    tcp: None,
                    sampler: None,
                    flow: Some(f.flow),
                });
                row.sampler = Some(stats);
            }
            sampler_prev.retain(|k, _| seen.contains(k));
            counters.insert("sampler", s.counters()?);
            totals.insert("sampler", ViewStats::from_hist(&total));
            totals_hist.insert("sampler", total);
        }
        // daemon mode: counters, program statistics.
        if let Some(d) = daemon.as_mut() {
            d.counters(&counters);
        }
        let now_t = start.elapsed().as_secs_f64();
        let mut cloud_lines = Vec::new();
        for (name, agg) in cloud.iter_mut() {
            if let Some(h) = totals_hist.get(name) {
                agg.add(h);
            }
            let completed = agg.roll(now_t);
            let current = completed.unwrap_or_else(|| agg.point(now_t, false));
            cloud_lines.push((*name, current));
        }
        let iv = Interval {
            kind: "interval",
            t: now_t,
            ts: unix_now(),
            interval_s: last_tick.elapsed().as_secs_f64(),
            flows: rows.into_values().collect(),
            totals,
            counters,
        };
        last_tick = Instant::now();
        if !args.quiet {
            let mut out = stdout.lock();
            match args.format {
                Format::Json => {
                    writeln!(out, "{}", serde_json::to_string(&iv)?)?;
                    for (name, p) in &cloud_lines {
                        writeln!(
                            out,
                            "{}",
                            json!({"type": "cloud", "view": name, "point": p})
                        )?;
                    }
                }
                Format::Table => {
                    report::print_table(&mut out, &header, &iv, &view_names)?;
                    for (name, p) in &cloud_lines {
                        let f = |k: &str| {
                            p[k].as_f64()
                                .map(crate::units::fmt_ms)
                                .unwrap_or_else(|| "-".into())
                        };
                        writeln!(
                            out,
                            "cloud buckets {name}: {} period from t={:.1}s ({:.0}s): n {} p50 {} p95 {} p99 {} ms ({})",
                            if p["complete"] == true { "completed" } else { "so far," },
                            p["period_start_s"].as_f64().unwrap_or(0.0),
                            p["period_s"].as_f64().unwrap_or(0.0),
                            p["count"],
                            f("p50_us"),
                            f("p95_us"),
                            f("p99_us"),
                            args.cloud_layout.spec()
                        )?;
                    }
                    if !cloud_lines.is_empty() {
                        writeln!(out)?;
                    }
                }
            }
            out.flush()?;
        }
        if stop {
            break;
        }
    }
    // Cumulative summary since start, per flow still known.
    let mut summary: BTreeMap<Flow, serde_json::Value> = BTreeMap::new();
    if let Some(view) = &tcp {
        view.for_each_flow(&mut |f| {
            let h = f.hist();
            summary.insert(
                f.flow,
                json!({
                    "netns": f.flow.netns,
                    "netns_name": names.get(f.flow.netns),
                    "local": f.flow.local.to_string(),
                    "remote": f.flow.remote.to_string(),
                    "side": f.side,
                    "origin": f.origin,
                    "tcp": { "summary": h.summary(), "srtt_us": f.srtt_us, "retrans": f.retrans, "histogram": sparse(&h) },
                }),
            );
        })?;
    }
    if let Some(s) = sampler.as_mut() {
        for f in s.read_flows()? {
            let entry = summary.entry(f.flow).or_insert_with(|| {
                json!({
                    "netns": f.flow.netns,
                    "netns_name": names.get(f.flow.netns),
                    "local": f.flow.local.to_string(),
                    "remote": f.flow.remote.to_string(),
                    "side": tracker.side_of(&f.flow),
                })
            });
            entry["sampler"] = json!({ "summary": f.hist.summary(), "iface": f.iface, "histogram": sparse(&f.hist) });
        }
    }
    let mut counters = BTreeMap::new();
    if let Some(v) = &tcp {
        counters.insert("tcp", v.counters());
    }
    if let Some(s) = &sampler {
        counters.insert("sampler", s.counters()?);
    }
    let mut out = stdout.lock();
    if args.format == Format::Json {
        let flows: Vec<_> = summary.into_values().collect();
        let line = json!({ "type": "end", "t": start.elapsed().as_secs_f64(), "ts": unix_now(), "flows": flows, "counters": counters });
        writeln!(out, "{line}")?;
    } else {
        write!(out, "done after {:.1}s", start.elapsed().as_secs_f64())?;
        if let Some(c) = counters.get("tcp") {
            write!(
                out,
                " | tcp: {} samples, {} flows created, {} flow-map-full, {} raw dropped",
                c["samples"], c["flows_created"], c["flow_map_full"], c["raw_events_dropped"]
            )?;
        }
        if let Some(c) = counters.get("sampler") {
            let get = |k: &str| c.get(k).copied().unwrap_or(0);
            write!(
                out,
                " | sampler: {} samples, {} packets skipped (see JSON counters), {} pending expired, {} flow-map-full",
                get("samples"),
                c.iter().filter(|(k, _)| k.starts_with("skip_")).map(|(_, v)| v).sum::<u64>(),
                get("expired"),
                get("flow_map_full") + get("pending_map_full")
            )?;
        }
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

fn sampler_raw_lines(
    s: &mut crate::sampler::SamplerView,
    start_mono: u64,
    fmt: Format,
    lines: &std::rc::Rc<std::cell::RefCell<Vec<String>>>,
) -> Result<()> {
    for smp in s.raw_samples(Duration::ZERO)? {
        let t = (smp.ts_ns as i64 - start_mono as i64) as f64 / 1e9;
        let line = match fmt {
            Format::Json => json!({
                "type": "sample", "view": "sampler", "t": t, "netns": smp.flow.netns,
                "local": smp.flow.local.to_string(), "remote": smp.flow.remote.to_string(),
                "rtt_us": smp.rtt_us, "match": smp.matching.as_str(),
            })
            .to_string(),
            Format::Table => format!("raw sampler  t={t:.6}s {} rtt={}us", smp.flow, smp.rtt_us),
        };
        lines.borrow_mut().push(line);
    }
    Ok(())
}

/// Non-empty histogram buckets as [lower_us, upper_us, count].
pub fn sparse(h: &Hist) -> Vec<(f64, f64, u64)> {
    h.counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(i, &c)| {
            let (lo, hi) = crate::hist::bucket_bounds(i);
            (lo, if hi.is_finite() { hi } else { -1.0 }, c)
        })
        .collect()
}

fn raw_line(ev: &crate::bpf::Event, start_mono: u64, fmt: Format) -> String {
    let flow = Flow::from_key(&ev.key);
    let t = (ev.ts_ns as i64 - start_mono as i64) as f64 / 1e9;
    let kind = match ev.r#type {
        1 => "tcp",
        2 => "sampler",
        3 => "flow_end",
        _ => "?",
    };
    let side = crate::flow::Side::from_raw(ev.side);
    match (fmt, flow) {
        (Format::Json, Some(f)) => json!({
            "type": "sample", "view": kind, "t": t, "netns": f.netns,
            "local": f.local.to_string(), "remote": f.remote.to_string(),
            "side": side, "rtt_us": ev.rtt_us, "srtt_us": ev.srtt_us,
        })
        .to_string(),
        (Format::Table, Some(f)) => format!(
            "raw {kind:<8} t={t:.6}s {f} side={} rtt={}us srtt={}us",
            side.as_str(),
            ev.rtt_us,
            ev.srtt_us
        ),
        _ => String::new(),
    }
}

fn flush_raw(
    lines: &std::rc::Rc<std::cell::RefCell<Vec<String>>>,
    stdout: &std::io::Stdout,
) -> Result<()> {
    let mut v = lines.borrow_mut();
    if v.is_empty() {
        return Ok(());
    }
    let mut out = stdout.lock();
    for l in v.drain(..).filter(|l| !l.is_empty()) {
        writeln!(out, "{l}")?;
    }
    out.flush()?;
    Ok(())
}

/// Raw TCP-view events to output lines.
fn tcp_raw_lines(
    events: &mut Vec<crate::bpf::Event>,
    start_mono: u64,
    fmt: Format,
    lines: &std::rc::Rc<std::cell::RefCell<Vec<String>>>,
) {
    let mut l = lines.borrow_mut();
    for ev in events.drain(..) {
        l.push(raw_line(&ev, start_mono, fmt));
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
        assert_eq!(a.ack_hook, crate::tcp_view::AckHook::Require);
        assert_eq!(a.netns, vec!["a", "b"]);
        assert_eq!(a.ports, vec![5001]);
        assert_eq!(a.interval, Duration::from_millis(500));
        assert_eq!(a.duration, Some(Duration::from_secs(3)));
        assert_eq!(a.format, Format::Json);
        assert!(a.raw);
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

    #[test]
    fn raw_line_decodes_event_fixture() {
        let ev = crate::bpf::Event {
            r#type: 1,
            side: 1,
            rtt_us: 150,
            srtt_us: 140,
            ts_ns: 2_000_000_000,
            key: Flow {
                netns: 7,
                local: "10.0.0.1:1000".parse().unwrap(),
                remote: "10.0.0.2:80".parse().unwrap(),
            }
            .to_key(),
            ..Default::default()
        };
        let bytes = crate::bpf::as_bytes(&ev).to_vec();
        let back: crate::bpf::Event = crate::bpf::decode(&bytes).unwrap();
        let line = raw_line(&back, 1_000_000_000, Format::Json);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["rtt_us"], 150);
        assert_eq!(v["side"], "client");
        assert_eq!(v["t"], 1.0);
        assert_eq!(v["local"], "10.0.0.1:1000");
    }

    #[test]
    fn eviction_takes_the_least_recently_active_down_to_three_quarters() {
        let flow = |port: u16| Flow {
            netns: 1,
            local: format!("10.0.0.1:{port}").parse().unwrap(),
            remote: "10.0.0.2:80".parse().unwrap(),
        };
        let mut t = Tracker::default();
        // 14 of 16 slots taken: at the 7/8 mark, nothing to do.
        let live: Vec<_> = (0..14).map(|i| (i, 1, flow(i as u16))).collect();
        assert!(t.to_evict(live, 16).is_empty());
        // 16 of 16: evict 4 (down to 12), the ones active longest ago.
        for i in 0..16u32 {
            let snap = Snapshot::of_counts(&[], 0);
            t.prev.insert(flow(i as u16), (snap, (16 - i) as u64));
        }
        let live: Vec<_> = (0..16).map(|i| (i, 7, flow(i as u16))).collect();
        let ev = t.to_evict(live, 16);
        let slots: Vec<u32> = ev.iter().map(|e| e.0).collect();
        assert_eq!(slots, vec![15, 14, 13, 12]);
        assert!(ev.iter().all(|e| e.1 == 7));
    }

    #[test]
    fn closed_flows_are_freed_early_once_half_the_table_is_taken() {
        let mut t = Tracker::default();
        assert!(!t.reclaim_due(8, 16), "8 of 16 taken: not yet");
        assert!(t.reclaim_due(9, 16), "9 of 16 taken");
        t.freed = 5; // five given back since
        assert!(!t.reclaim_due(9, 16));
        assert!(t.reclaim_due(14, 16));
    }
}
