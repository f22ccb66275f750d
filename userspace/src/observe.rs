//! `rttscope observe`: the passive views (TCP; sampler) in one table.
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use crate::flow::Flow;
use crate::hist::Hist;
use crate::netns::{self, NetNs};
use crate::report::{self, FlowRow, Interval, ViewStats};
use crate::tcp_view::{self, TcpFlowState, TcpView, TcpViewConfig};
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
    /// Capacity of the per-flow map (LRU: the least recently used flow is evicted when full).
    #[arg(long, default_value_t = 16384)]
    pub max_flows: u32,
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

/// Per-flow bookkeeping between intervals.
#[derive(Default)]
struct Tracker {
    prev: HashMap<Flow, Hist>,
    vanished: u64,
    closed_reported: u64,
}

impl Tracker {
    /// Turn a read of the flow map into the interval's rows.
    fn interval_rows(
        &mut self,
        flows: &[TcpFlowState],
        epoch: u32,
        names: &mut NsNames,
    ) -> (Vec<FlowRow>, Hist) {
        let mut rows = Vec::new();
        let mut total = Hist::default();
        let mut seen = std::collections::HashSet::new();
        for f in flows {
            seen.insert(f.flow);
            let first = !self.prev.contains_key(&f.flow);
            let mut delta = match self.prev.get(&f.flow) {
                Some(p) => f.hist.delta(p),
                None => f.hist.clone(),
            };
            if delta.count() > 0 && f.win_epoch == epoch && f.win_min_us <= f.win_max_us {
                delta.min_us = Some(f.win_min_us);
                delta.max_us = Some(f.win_max_us);
            } else if first && delta.count() > 0 {
                delta.min_us = f.hist.min_us;
                delta.max_us = f.hist.max_us;
            }
            self.prev.insert(f.flow, f.hist.clone());
            if delta.count() == 0 && !first && !f.closed {
                continue;
            }
            total.merge(&delta);
            let mut vs = ViewStats::from_hist(&delta);
            vs.srtt_us = Some(f.srtt_us);
            vs.retrans = Some(f.retrans);
            rows.push(FlowRow {
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
            });
        }
        let before = self.prev.len();
        self.prev.retain(|k, _| seen.contains(k));
        self.vanished += (before - self.prev.len()) as u64;
        rows.sort_by(|a, b| (a.netns, &a.local, &a.remote).cmp(&(b.netns, &b.local, &b.remote)));
        (rows, total)
    }
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
    let netns_filter: Vec<NetNs> = args
        .netns
        .iter()
        .map(|n| netns::resolve(n))
        .collect::<Result<_>>()?;
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
    };
    // daemon mode: bind /metrics before attaching, so a bad address fails early.
    let listener = match args.listen {
        Some(a) => Some(crate::metrics::bind(a).await?),
        None => None,
    };
    let mut view = TcpView::attach(&cfg)?;
    // daemon mode: serve /metrics, report hooks, drop capabilities (metrics.rs).
    let mut daemon = match listener {
        Some(l) => Some(crate::metrics::Daemon::start(l, &args, &view)?),
        None => None,
    };
    let mut names = NsNames::new();
    let start_mono = monotonic_ns();
    let start = Instant::now();
    let stdout = std::io::stdout();
    let views = ["tcp"];

    let settings = json!({
        "interval_s": args.interval.as_secs_f64(),
        "duration_s": args.duration.map(|d| d.as_secs_f64()),
        "netns": args.netns,
        "all_netns": args.all_netns,
        "ports": args.ports,
        "addrs": args.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "raw": args.raw,
        "max_flows": view.info.max_flows,
        "histogram": "log-linear: 1 us buckets below 8 us, then 8 linear sub-buckets per power of two (<= 12.5% wide)",
    });
    let header = format!(
        "rttscope observe | view tcp: {} @ cgroup {} | rtt source: {} | interval {} | netns {}",
        "sock_ops RTT_CB",
        view.info.cgroup,
        if view.info.rtt_source.starts_with("srtt") {
            "srtt fallback (kernel < 6.10)"
        } else {
            "RTT_CB args"
        },
        fmt_duration_short(args.interval),
        if args.netns.is_empty() {
            "all".to_string()
        } else {
            args.netns.join(",")
        }
    );
    {
        let mut out = stdout.lock();
        match args.format {
            Format::Json => {
                let line = json!({
                    "type": "start",
                    "version": 1,
                    "ts": unix_now(),
                    "views": views,
                    "settings": settings,
                    "tcp": view.info,
                    "clock": "CLOCK_MONOTONIC (raw sample ts_ns); t = seconds since start",
                });
                writeln!(out, "{line}")?;
            }
            Format::Table => {
                writeln!(out, "{header}")?;
                writeln!(
                    out,
                    "existing connections enabled: {} (in {}); waiting for samples...\n",
                    view.info.existing_enabled,
                    view.info.iter_netns.join(",")
                )?;
            }
        }
        out.flush()?;
    }

    // Raw samples: the ring buffer's epoll fd drives an AsyncFd.
    let raw_lines: std::rc::Rc<std::cell::RefCell<Vec<String>>> = Default::default();
    let ringbuf = if args.raw {
        let mut b = libbpf_rs::RingBufferBuilder::new();
        let sink = raw_lines.clone();
        let fmt = args.format;
        b.add(view.events_map(), move |data: &[u8]| {
            if let Ok(ev) = crate::bpf::decode::<crate::bpf::Event>(data) {
                sink.borrow_mut().push(raw_line(&ev, start_mono, fmt));
            }
            0
        })?;
        Some(b.build().context("setting up the raw-sample ring buffer")?)
    } else {
        None
    };
    let rb_fd = match &ringbuf {
        // SAFETY: the epoll fd belongs to `ringbuf`, which is declared before
        // `rb_fd` and therefore dropped after it.
        Some(rb) => Some(
            unsafe { tokio::io::unix::AsyncFd::register(RawFdWrap(rb.epoll_fd())) }
                .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?,
        ),
        None => None,
    };

    let mut tracker = Tracker::default();
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
            match &rb_fd {
                Some(fd) => fd.readable().await.map(|mut g| g.clear_ready()),
                None => std::future::pending().await,
            }
        };
        let stop = tokio::select! {
            _ = ticker.tick() => false,
            _ = rb_ready => {
                if let Some(rb) = &ringbuf { let _ = rb.consume(); }
                flush_raw(&raw_lines, &stdout)?;
                continue;
            }
            _ = until_deadline => true,
            _ = tokio::signal::ctrl_c() => true,
            _ = sigterm.recv() => true,
        };
        if let Some(rb) = &ringbuf {
            let _ = rb.consume();
            flush_raw(&raw_lines, &stdout)?;
        }
        if stop && last_tick.elapsed() < args.interval / 10 {
            break; // the last interval was just reported
        }
        // One interval: read, then start the next epoch.
        let flows = view.read_flows()?;
        let epoch = view.epoch();
        view.next_epoch();
        // daemon mode: histogram deltas, before the tracker moves on.
        if let Some(d) = daemon.as_mut() {
            d.tcp_flows(&flows, &tracker.prev, |ns| names.get(ns));
        }
        let (rows, total) = tracker.interval_rows(&flows, epoch, &mut names);
        for r in rows.iter().filter(|r| r.closed) {
            if let Some(f) = &r.flow {
                view.forget(f);
                tracker.prev.remove(f);
                tracker.closed_reported += 1;
            }
        }
        let mut counters = BTreeMap::new();
        let mut tc = view.counters();
        tc.insert("flows_vanished", tracker.vanished);
        tc.insert("flows_closed_reported", tracker.closed_reported);
        tc.insert("flows_tracked", flows.len() as u64);
        counters.insert("tcp", tc);
        // daemon mode: counters, program statistics.
        if let Some(d) = daemon.as_mut() {
            d.counters(&counters);
        }
        let iv = Interval {
            kind: "interval",
            t: start.elapsed().as_secs_f64(),
            ts: unix_now(),
            interval_s: last_tick.elapsed().as_secs_f64(),
            flows: rows,
            totals: [("tcp", ViewStats::from_hist(&total))]
                .into_iter()
                .collect(),
            counters,
        };
        last_tick = Instant::now();
        if !args.quiet {
            let mut out = stdout.lock();
            match args.format {
                Format::Json => writeln!(out, "{}", serde_json::to_string(&iv)?)?,
                Format::Table => report::print_table(&mut out, &header, &iv, &views)?,
            }
            out.flush()?;
        }
        if stop {
            break;
        }
    }
    // Cumulative summary since start, per flow still known.
    let flows = view.read_flows()?;
    let summary: Vec<serde_json::Value> = flows
        .iter()
        .map(|f| {
            json!({
                "netns": f.flow.netns,
                "netns_name": names.get(f.flow.netns),
                "local": f.flow.local.to_string(),
                "remote": f.flow.remote.to_string(),
                "side": f.side,
                "origin": f.origin,
                "tcp": { "summary": f.hist.summary(), "srtt_us": f.srtt_us, "retrans": f.retrans, "histogram": sparse(&f.hist) },
            })
        })
        .collect();
    let mut out = stdout.lock();
    if args.format == Format::Json {
        let line = json!({ "type": "end", "t": start.elapsed().as_secs_f64(), "ts": unix_now(), "flows": summary, "counters": { "tcp": view.counters() } });
        writeln!(out, "{line}")?;
    } else {
        let c = view.counters();
        writeln!(
            out,
            "done after {:.1}s: {} samples, {} flows created, {} flow-map-full, {} raw events dropped",
            start.elapsed().as_secs_f64(),
            c["samples"],
            c["flows_created"],
            c["flow_map_full"],
            c["raw_events_dropped"]
        )?;
    }
    out.flush()?;
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

struct RawFdWrap(i32);
impl std::os::fd::AsRawFd for RawFdWrap {
    fn as_raw_fd(&self) -> i32 {
        self.0
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
        ])
        .unwrap();
        let crate::cli::Command::Observe(a) = c.command else {
            panic!()
        };
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
}
