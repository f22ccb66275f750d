//! Daemon mode's exporter: the passive views as Prometheus/OpenMetrics text on
//! `/metrics` (`rttscope observe --listen ADDR`); the HTTP endpoint is
//! [`http`], the daemon that feeds it from observe's reads [`daemon`]; the label
//! sets are in `labels.rs`, the RTT histogram metric in `rtt_hist.rs`.
//!
//! What is exported (names as scraped):
//! - `rttscope_rtt_seconds` (histogram) per view, side, netns, remote prefix
//!   and local port: every RTT sample the views took;
//! - `rttscope_samples_total{view}`, `rttscope_drops_total{view,reason}`,
//!   `rttscope_view_events_total{view,event}` (every kernel/userspace counter
//!   of the view), `rttscope_flows_tracked{view}`;
//! - `rttscope_bpf_prog_run_time_seconds_total{prog}`,
//!   `rttscope_bpf_prog_run_count_total{prog}`, `rttscope_bpf_stats_enabled`;
//! - `rttscope_series{}` (label sets in use), `rttscope_series_overflow_total{view}`;
//! - the standard `process_*` metrics and
//!   `rttscope_build_info{version,commit,loaders,features,linkage,kernel}`.
//!
//! Labels are bounded ([`LabelPolicy`]): the remote address is cut to a
//! prefix (/24, /48 by default, like ePPing's subnet aggregation), the local
//! port is kept only for listed ports ("other" otherwise), and at most
//! `max_series` RTT label sets exist; past that, samples go to one overflow
//! series per view (all other labels `"overflow"`) and
//! `rttscope_series_overflow_total` counts them. Label sets idle for
//! `series_idle` are removed, so churn does not fill the cap for good.
//!
//! Histogram conversion: the kernel's histogram is log-linear in integer
//! microseconds (`hist::bucket_bounds`). The Prometheus bucket bounds
//! ([`RTT_BOUNDS_US`]) are 10 us x 2^k and 14 us x 2^k, 10 us .. 10.5 s: every
//! one of them is a kernel bucket boundary, so each kernel bucket falls
//! entirely inside one Prometheus bucket and counts are moved over exactly
//! (no midpoint guessing). The only departure from Prometheus' `le`
//! (less-or-equal) is at the bound itself: a sample of exactly B us sits in
//! the kernel bucket starting at B and is counted in the next Prometheus
//! bucket; `le=B` therefore counts samples < B us (<= B - 1 us). `_sum` is the
//! kernel's exact sum of samples; `_count` is exact.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::Hist;
use crate::analysis::peers::PeerFile;
use crate::analysis::workload::Workload;
use crate::sys::bpf::ProgRun;
use crate::views::view::FlowDelta;
use crate::views::ViewKind;

pub mod daemon;
mod handshake;
pub mod http;
mod labels;
mod names;
pub mod native;
pub mod proto;
mod rtt_hist;
pub mod web;

use labels::{DropLabels, EventLabels, HookLabels, ProgLabels, ViewLabel};
pub use labels::{LabelPolicy, RttLabels, WorkloadLabels};
pub use rtt_hist::{RttHist, RTT_BOUNDS_US};

/// A std Mutex that shrugs off poisoning (a panicked scrape must not stop the exporter).
mod parking_lot_free {
    #[derive(Default)]
    pub struct Mutex<T>(std::sync::Mutex<T>);
    impl<T> Mutex<T> {
        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
    impl<T: std::fmt::Debug> std::fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.lock().fmt(f)
        }
    }
}

/// Default `/metrics` address: loopback only. Anything else must be asked for.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// The OpenMetrics text content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Counter names that are drops: samples or records lost (a ring buffer
/// overrun, a table full, a flow gone unread, samples of evicted flows never
/// read). Normal table churn (evictions of idle flows and segments) is not a
/// drop: see [`is_eviction`].
pub fn is_drop(name: &str) -> bool {
    name.contains("dropped")
        || name.ends_with("_full")
        || name.contains("vanished")
        || name == "samples_evicted"
        || name == "samples_not_binned"
        || name.contains("overrun")
        || name.ends_with("_bad")
}

/// Counter names that count normal LRU churn: flows and pending segments
/// evicted to make room (their samples, if any were unread, are counted by
/// `samples_evicted`, a drop).
pub fn is_eviction(name: &str) -> bool {
    !is_drop(name) && name.contains("evict")
}

/// Counter names that are levels, not event counts: exported as gauges
/// (`rttscope_view_level`), never as counters.
fn is_gauge(name: &str) -> bool {
    name == "flows_tracked" || name.ends_with("_live")
}

/// The level that is the view's tracked flows: the TCP view's own count,
/// the sampler's flow-table entries in use.
fn is_flows_tracked(view: ViewKind, name: &str) -> bool {
    view.flows_level() == Some(name)
}

/// What is running: the build as `--version` names it (version, commit, loaders, cargo
/// features, linkage) and the kernel.
fn register_build_info(r: &mut Registry) {
    let build = Family::<Vec<(String, String)>, Gauge>::default();
    r.register(
        "rttscope_build_info",
        "rttscope's version, commit, BPF loaders and cargo features built in, linkage (static or dynamic) and the kernel it runs on (always 1)",
        build.clone(),
    );
    let tool = crate::analysis::results::Tool::current();
    build
        .get_or_create(&vec![
            ("version".into(), tool.version),
            ("commit".into(), tool.commit),
            ("loaders".into(), tool.loaders.join(",")),
            ("features".into(), tool.features.join(",")),
            ("linkage".into(), tool.linkage),
            ("kernel".into(), kernel_release()),
        ])
        .set(1);
}

/// The exporter: metric families, the label policy, the series cap.
pub struct Exporter {
    registry: Registry,
    policy: LabelPolicy,
    rtt: Family<RttLabels, RttHist>,
    /// Label sets in use: when last updated, and their histogram.
    series: HashMap<RttLabels, (Instant, RttHist)>,
    /// The overflow series of each view that has one.
    overflow_series: HashMap<ViewKind, RttHist>,
    series_gauge: Gauge,
    overflow: Family<ViewLabel, Counter>,
    samples: Family<ViewLabel, Counter>,
    drops: Family<DropLabels, Counter>,
    evictions: Family<EventLabels, Counter>,
    events: Family<EventLabels, Counter>,
    levels: Family<LevelLabels, Gauge>,
    flows_tracked: Family<ViewLabel, Gauge>,
    hook_blind: Family<HookLabels, Gauge>,
    hook_packets: Family<HookLabels, Counter>,
    hook_iface_packets: Family<HookLabels, Counter>,
    /// The TCP view's handshakes.
    handshakes: Option<handshake::Handshakes>,
    prog_time: Family<ProgLabels, Counter<f64, AtomicU64>>,
    prog_cnt: Family<ProgLabels, Counter>,
    stats_enabled: Gauge,
    scrapes: Counter,
    cpu: Counter<f64, AtomicU64>,
    rss: Gauge,
    vsz: Gauge,
    fds: Gauge,
    max_fds: Gauge,
    last_cpu: u64,
    last_counters: HashMap<(ViewKind, String), u64>,
    last_prog: HashMap<u32, ProgRun>,
    last_expiry: Instant,
    /// `--names`: the file and its reload metrics.
    names: Option<names::NamesState>,
    /// What `/metrics` serves: the last render, shared with the server.
    rendered: Arc<std::sync::RwLock<Arc<Rendered>>>,
}

/// One render of every metric, in each format a scraper may ask for
/// (prepared once per read interval; a scrape only clones the `Arc`).
#[derive(Debug, Default)]
pub struct Rendered {
    /// OpenMetrics text 1.0.
    pub openmetrics: hyper::body::Bytes,
    /// The Prometheus text format 0.0.4.
    pub text: hyper::body::Bytes,
    /// The protobuf exposition format with native buckets.
    pub protobuf: hyper::body::Bytes,
    /// The RTT series' native buckets by label set (OTLP reads them).
    pub natives: Vec<(RttLabels, native::Native)>,
    /// The handshake histogram's native buckets by side (OTLP reads them).
    pub handshake_natives: Vec<(String, native::Native)>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    view: String,
    level: String,
}

impl Exporter {
    pub fn new(policy: LabelPolicy) -> Result<Exporter> {
        policy.validate()?;
        let mut e = Exporter {
            registry: Registry::default(),
            policy,
            rtt: Family::default(),
            series: HashMap::new(),
            overflow_series: HashMap::new(),
            series_gauge: Gauge::default(),
            overflow: Family::default(),
            samples: Family::default(),
            drops: Family::default(),
            evictions: Family::default(),
            events: Family::default(),
            levels: Family::default(),
            flows_tracked: Family::default(),
            hook_blind: Family::default(),
            hook_packets: Family::default(),
            hook_iface_packets: Family::default(),
            handshakes: None,
            prog_time: Family::default(),
            prog_cnt: Family::default(),
            stats_enabled: Gauge::default(),
            scrapes: Counter::default(),
            cpu: Counter::default(),
            rss: Gauge::default(),
            vsz: Gauge::default(),
            fds: Gauge::default(),
            max_fds: Gauge::default(),
            last_cpu: 0,
            last_counters: HashMap::new(),
            last_prog: HashMap::new(),
            last_expiry: Instant::now(),
            names: None,
            rendered: Arc::default(),
        };
        // The registration order is the order of the families in /metrics.
        e.register_view_metrics();
        e.handshakes = Some(handshake::Handshakes::register(&mut e.registry));
        e.register_kernel_and_series_metrics();
        e.register_process_metrics();
        register_build_info(&mut e.registry);
        Ok(e)
    }

    /// The views' RTT histograms, samples, drops, evictions, levels, events
    /// and tracked flows.
    fn register_view_metrics(&mut self) {
        let r = &mut self.registry;
        r.register_with_unit(
            "rttscope_rtt",
            format!(
                "RTT samples per view ({}); le=B counts samples < B us (integer microseconds)",
                ViewKind::each_says(ViewKind::rtt_samples_are)
            ),
            Unit::Seconds,
            self.rtt.clone(),
        );
        r.register(
            "rttscope_samples",
            "RTT samples taken by a view (kernel counter)",
            self.samples.clone(),
        );
        r.register(
            "rttscope_drops",
            "Samples or records a view lost: ring-buffer overruns (raw_events_dropped), table full (flow_map_full, pending_map_full), flows that left a table unread (flows_vanished), samples of evicted flows never read (samples_evicted), samples left out of the histograms (samples_not_binned: the fine-histogram pool and its overflow ring were full); normal evictions are rttscope_evictions_total",
            self.drops.clone(),
        );
        r.register(
            "rttscope_evictions",
            "Normal table churn, not a loss: flows and pending segments evicted to make room (samples of evicted flows that were never read are a drop, reason samples_evicted)",
            self.evictions.clone(),
        );
        r.register(
            "rttscope_view_level",
            "Levels of a view at the last read (table entries in use: flows_live, pending_live, flows_tracked)",
            self.levels.clone(),
        );
        r.register(
            "rttscope_view_events",
            "Every counter of a view that counts events, by name (levels are rttscope_view_level)",
            self.events.clone(),
        );
        r.register(
            "rttscope_flows_tracked",
            format!(
                "Flows tracked by the view at the last read ({})",
                ViewKind::each_says(ViewKind::flows_tracked_are)
            ),
            self.flows_tracked.clone(),
        );
        r.register(
            "rttscope_hook_blind",
            "1 while a view's hook on an interface is blind: in the last interval the interface moved more than 10 packets in that direction while the hook's program saw none (a program ahead of it ends the chain, or a redirect moves packets past it); 0 otherwise",
            self.hook_blind.clone(),
        );
        r.register(
            "rttscope_hook_packets",
            "Packets a view's hook program saw on an interface, per direction (the sampler counts every packet before sampling)",
            self.hook_packets.clone(),
        );
        r.register(
            "rttscope_hook_iface_packets",
            "Packets the interface itself received (ingress) or sent (egress) since the hook was attached, from the kernel's interface counters, to compare with rttscope_hook_packets_total",
            self.hook_iface_packets.clone(),
        );
    }

    /// The kernel programs' run-time statistics, the series cap and the scrapes.
    fn register_kernel_and_series_metrics(&mut self) {
        let r = &mut self.registry;
        r.register_with_unit(
            "rttscope_bpf_prog_run_time",
            "Time spent in our kernel programs (kernel run-time statistics; 0 unless enabled)",
            Unit::Seconds,
            self.prog_time.clone(),
        );
        r.register(
            "rttscope_bpf_prog_run_count",
            "Invocations of our kernel programs (kernel run-time statistics; 0 unless enabled)",
            self.prog_cnt.clone(),
        );
        r.register(
            "rttscope_bpf_stats_enabled",
            "1 when kernel BPF run-time statistics are being collected",
            self.stats_enabled.clone(),
        );
        r.register("rttscope_series", "RTT histogram label sets in use (the cap is max_series, plus one overflow set per view)", self.series_gauge.clone());
        r.register(
            "rttscope_series_overflow",
            "Samples recorded into the overflow series because the series cap was reached",
            self.overflow.clone(),
        );
        r.register(
            "rttscope_scrapes",
            "Scrapes of /metrics served",
            self.scrapes.clone(),
        );
    }

    /// The standard process metrics (the names every Prometheus client
    /// library exports, so existing dashboards and alerts apply).
    fn register_process_metrics(&mut self) {
        let r = &mut self.registry;
        r.register_with_unit(
            "process_cpu",
            "Total user and system CPU time spent in seconds",
            Unit::Seconds,
            self.cpu.clone(),
        );
        r.register_with_unit(
            "process_resident_memory",
            "Resident memory size in bytes",
            Unit::Bytes,
            self.rss.clone(),
        );
        r.register_with_unit(
            "process_virtual_memory",
            "Virtual memory size in bytes",
            Unit::Bytes,
            self.vsz.clone(),
        );
        r.register(
            "process_open_fds",
            "Number of open file descriptors",
            self.fds.clone(),
        );
        r.register(
            "process_max_fds",
            "Maximum number of open file descriptors",
            self.max_fds.clone(),
        );
        let start = Gauge::<f64, AtomicU64>::default();
        r.register_with_unit(
            "process_start_time",
            "Start time of the process since unix epoch in seconds",
            Unit::Seconds,
            start.clone(),
        );
        start.set(process_start_unix_s());
    }

    pub fn policy(&self) -> &LabelPolicy {
        &self.policy
    }

    /// Record one flow's samples since the previous read (`cur` and `prev`
    /// are the flow's cumulative kernel histograms; `prev` None for a new
    /// flow). Returns the samples added.
    pub fn observe_flow(
        &mut self,
        view: ViewKind,
        flow: &Flow,
        side: Side,
        netns: &str,
        cur: &Hist,
        prev: Option<&Hist>,
    ) -> u64 {
        self.observe_owned_flow(view, flow, side, netns, None, cur, prev)
    }

    /// [`Exporter::observe_flow`] for a flow whose owner is known: with
    /// `--label-workload`, its workload labels too.
    #[allow(clippy::too_many_arguments)]
    pub fn observe_owned_flow(
        &mut self,
        view: ViewKind,
        flow: &Flow,
        side: Side,
        netns: &str,
        owner: Option<&Workload>,
        cur: &Hist,
        prev: Option<&Hist>,
    ) -> u64 {
        // Cheap check first: most flows in a busy host have nothing new.
        if prev.is_some_and(|p| p.same_counts(cur)) {
            return 0;
        }
        let mut labels = self.policy.labels(view, flow, side, netns);
        if self.policy.workload {
            labels.workload = Some(owner.map(WorkloadLabels::of).unwrap_or_default());
        }
        self.name_labels(&mut labels, flow, None);
        self.observe_labels(view, labels, cur, prev)
    }

    /// The names file (`--names`): the `remote_name` label's source, its reloads and entries
    /// exported ([`names::NamesState`]).
    pub fn set_names(&mut self, file: Arc<PeerFile>) {
        self.names = Some(names::NamesState::register(file, &mut self.registry));
    }

    /// The names file's reload counts and entries, as of now (once per interval).
    pub fn update_names(&mut self) {
        if let Some(n) = self.names.as_mut() {
            n.update();
        }
    }

    /// `remote_name` and `backend_prefix` when the policy asks for them.
    fn name_labels(&self, labels: &mut RttLabels, flow: &Flow, translated: Option<&Flow>) {
        names::name_labels(&self.policy, self.names.as_ref(), labels, flow, translated);
    }

    /// One flow's samples of this read, as a view handed them over.
    pub fn observe_delta(&mut self, view: ViewKind, d: &FlowDelta<'_>, netns: &str) -> u64 {
        let mut labels = self.policy.labels(view, d.flow, d.side, netns);
        if self.policy.workload {
            labels.workload = Some(d.owner.map(WorkloadLabels::of).unwrap_or_default());
        }
        self.name_labels(&mut labels, d.flow, d.translated);
        self.observe_labels(view, labels, d.delta, None)
    }

    /// Record a histogram delta under `labels`, applying the series cap.
    pub fn observe_labels(
        &mut self,
        view: ViewKind,
        labels: RttLabels,
        cur: &Hist,
        prev: Option<&Hist>,
    ) -> u64 {
        let now = Instant::now();
        if let Some((t, h)) = self.series.get_mut(&labels) {
            *t = now;
            return h.add_delta(cur, prev);
        }
        if self.series.len() < self.policy.max_series {
            let h = self.rtt.get_or_create(&labels).clone();
            let n = h.add_delta(cur, prev);
            self.series.insert(labels, (now, h));
            self.series_gauge.set(self.series.len() as i64);
            return n;
        }
        let rtt = &self.rtt;
        let n = self
            .overflow_series
            .entry(view)
            .or_insert_with(|| rtt.get_or_create(&RttLabels::overflow(view)).clone())
            .add_delta(cur, prev);
        self.overflow
            .get_or_create(&ViewLabel {
                view: view.as_str().into(),
            })
            .inc_by(n);
        n
    }

    /// Handshake RTTs of one side since the last read (the TCP view's).
    pub fn observe_handshakes(&mut self, side: Side, h: &Hist) {
        if let Some(hs) = self.handshakes.as_mut() {
            hs.observe(side, h);
        }
    }

    /// Remove label sets idle for longer than the policy allows (call once per interval).
    pub fn expire_idle(&mut self) -> usize {
        let now = Instant::now();
        if now.duration_since(self.last_expiry) < Duration::from_secs(1) {
            return 0;
        }
        self.last_expiry = now;
        let idle = self.policy.series_idle;
        let old: Vec<RttLabels> = self
            .series
            .iter()
            .filter(|(_, (t, _))| now.duration_since(*t) > idle)
            .map(|(l, _)| l.clone())
            .collect();
        for l in &old {
            self.series.remove(l);
            self.rtt.remove(l);
        }
        self.series_gauge.set(self.series.len() as i64);
        old.len()
    }

    /// Label sets in use (not counting overflow series).
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// A view's counters as read this interval (cumulative values: the
    /// kernel's per-CPU sums and observe's own running totals).
    pub fn set_counters(&mut self, view: ViewKind, counters: &BTreeMap<&str, u64>) {
        let v = view.as_str().to_string();
        // Present from the first scrape, so that rate() and alerts see a 0.
        let _ = self.overflow.get_or_create(&ViewLabel { view: v.clone() });
        for (&name, &value) in counters {
            if is_gauge(name) {
                let g = value.min(i64::MAX as u64) as i64;
                if is_flows_tracked(view, name) {
                    self.flows_tracked
                        .get_or_create(&ViewLabel { view: v.clone() })
                        .set(g);
                }
                self.levels
                    .get_or_create(&LevelLabels {
                        view: v.clone(),
                        level: name.into(),
                    })
                    .set(g);
                continue;
            }
            let last = self
                .last_counters
                .insert((view, name.to_string()), value)
                .unwrap_or(0);
            // A counter that went down was reset (a view reloaded): count from 0.
            let d = if value >= last { value - last } else { value };
            let ev = EventLabels {
                view: v.clone(),
                event: name.into(),
            };
            // Create the series even at 0 so that rate() works from the first scrape.
            self.events.get_or_create(&ev).inc_by(d);
            if let Some(h) = &self.handshakes {
                h.count(name, d);
            }
            if name == "samples" {
                self.samples
                    .get_or_create(&ViewLabel { view: v.clone() })
                    .inc_by(d);
            }
            if is_drop(name) {
                self.drops
                    .get_or_create(&DropLabels {
                        view: v.clone(),
                        reason: name.into(),
                    })
                    .inc_by(d);
            } else if is_eviction(name) {
                self.evictions
                    .get_or_create(&EventLabels {
                        view: v.clone(),
                        event: name.into(),
                    })
                    .inc_by(d);
            }
        }
    }

    /// The views' hooks as checked this interval (cumulative packet counts: added as deltas).
    pub fn set_hooks(&mut self, hooks: &[crate::analysis::records::HookStatus]) {
        for h in hooks {
            let l = HookLabels {
                view: h.view.to_string(),
                netns: h.netns.clone(),
                interface: h.iface.clone(),
                direction: h.direction.to_string(),
            };
            self.hook_blind.get_or_create(&l).set(h.blind as i64);
            for (fam, now) in [
                (&self.hook_packets, h.hook_packets),
                (&self.hook_iface_packets, h.iface_packets),
            ] {
                let c = fam.get_or_create(&l);
                c.inc_by(now.saturating_sub(c.get()));
            }
        }
    }

    /// Export program run-time statistics.
    pub fn set_prog_stats(&mut self, stats: &crate::sys::bpf::ProgStats) {
        self.stats_enabled.set(stats.kernel_stats_enabled() as i64);
        for (name, id, run) in stats.read() {
            let last = self.last_prog.insert(id, run).unwrap_or_default();
            let l = ProgLabels { prog: name };
            let dt = run.run_time_ns.saturating_sub(last.run_time_ns);
            let dc = run.run_cnt.saturating_sub(last.run_cnt);
            self.prog_time.get_or_create(&l).inc_by(dt as f64 / 1e9);
            self.prog_cnt.get_or_create(&l).inc_by(dc);
        }
    }

    /// The standard process metrics of this process, from /proc/self.
    pub fn set_process_stats(&mut self) {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which may contain spaces) start at state.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11) // state .. cmajflt: utime is field 14, i.e. the 12th after ')'
            .take(2)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        if f.len() == 2 {
            // SAFETY: sysconf has no side effects.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
            let now = f[0] + f[1];
            self.cpu
                .inc_by(now.saturating_sub(self.last_cpu) as f64 / hz);
            self.last_cpu = now;
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<i64>().ok())
        };
        if let Some(v) = kb("VmRSS:") {
            self.rss.set(v * 1024);
        }
        if let Some(v) = kb("VmSize:") {
            self.vsz.set(v * 1024);
        }
        if let Ok(rd) = std::fs::read_dir("/proc/self/fd") {
            self.fds.set(rd.count() as i64);
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            self.max_fds.set(lim.rlim_cur.min(i64::MAX as u64) as i64);
        }
    }

    /// Render every format now and publish it to `/metrics` (once per
    /// read interval); returns the render.
    pub fn render(&self) -> Arc<Rendered> {
        let mut om = String::with_capacity(64 * 1024);
        // Encoding into a String cannot fail except on a formatting bug.
        let _ = prometheus_client::encoding::text::encode(&mut om, &self.registry);
        let natives: Vec<(RttLabels, native::Native)> = self
            .series
            .iter()
            .map(|(l, (_, h))| (l.clone(), h.native()))
            .chain(
                self.overflow_series
                    .iter()
                    .map(|(v, h)| (RttLabels::overflow(*v), h.native())),
            )
            .collect();
        let by_key: HashMap<proto::LabelKey, native::Native> = natives
            .iter()
            .map(|(l, n)| (l.pairs(), n.clone()))
            .collect();
        let fams = proto::families(&om, "rttscope_rtt_seconds", &by_key);
        let r = Arc::new(Rendered {
            text: http::to_text_format(&om).into(),
            protobuf: proto::encode(&fams).into(),
            openmetrics: om.into(),
            natives,
            handshake_natives: self
                .handshakes
                .as_ref()
                .map_or_else(Vec::new, |h| h.natives()),
        });
        *self.rendered.write().unwrap_or_else(|e| e.into_inner()) = r.clone();
        r
    }

    /// Render now; the OpenMetrics text (tests, and callers without a server).
    pub fn encode(&self) -> String {
        String::from_utf8_lossy(&self.render().openmetrics).into_owned()
    }

    /// The registry, for metrics of other parts of the daemon (OTLP delivery).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// What the HTTP server needs: the last render and the scrape counter.
    pub fn handle(&self) -> MetricsHandle {
        MetricsHandle {
            rendered: self.rendered.clone(),
            scrapes: self.scrapes.clone(),
        }
    }
}

/// This process's start, Unix seconds (/proc/self/stat's starttime after boot).
fn process_start_unix_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let ticks: f64 = rest
        .split_whitespace()
        .nth(19) // starttime is field 22, the 20th after ')'
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no side effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    boot + ticks / hz
}

/// The running kernel's release (`uname -r`).
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// A cheap, cloneable reference for the HTTP server: each scrape takes the
/// last render (an `Arc`), whatever the number of flows or of scrapers.
#[derive(Clone)]
pub struct MetricsHandle {
    rendered: Arc<std::sync::RwLock<Arc<Rendered>>>,
    scrapes: Counter,
}

impl MetricsHandle {
    /// The last render, counted as a scrape (the count shows from the next render on).
    pub fn scrape(&self) -> Arc<Rendered> {
        self.scrapes.inc();
        self.rendered
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::rtt_hist::N_BOUNDS;
    use super::*;
    use crate::analysis::hist;
    use std::net::SocketAddr;
    fn flow(remote: &str, lport: u16) -> Flow {
        Flow {
            tunnel: Default::default(),
            netns: 1,
            local: SocketAddr::new(
                if remote.contains(':') && remote.starts_with('[') {
                    "fd00::1".parse().unwrap()
                } else {
                    "10.0.0.1".parse().unwrap()
                },
                lport,
            ),
            remote: remote.parse().unwrap(),
        }
    }

    fn hist_of(vals: &[u32]) -> Hist {
        let mut h = Hist::default();
        for &v in vals {
            h.record(v);
        }
        h
    }

    /// The HELP texts that list the views say what each view's samples and flows are, from the
    /// registry (the default build's two views: the text rttscope always exported).
    #[test]
    #[cfg(not(feature = "example-view"))]
    fn help_texts_list_each_view() {
        let text = Exporter::new(LabelPolicy::default()).unwrap().encode();
        for want in [
            "# HELP rttscope_rtt_seconds RTT samples per view (tcp: TCP's own RTT samples; sampler: packet-sampler RTT); le=B counts samples < B us (integer microseconds).",
            "# HELP rttscope_flows_tracked Flows tracked by the view at the last read (tcp: flows in its table; sampler: flow-table entries in use).",
        ] {
            assert!(text.lines().any(|l| l == want), "no line {want:?} in:\n{text}");
        }
    }

    #[test]
    fn bounds_are_kernel_boundaries_10us_to_10s() {
        let bounds: Vec<u32> = RTT_BOUNDS_US[..N_BOUNDS].to_vec();
        assert_eq!(bounds[0], 10);
        assert!(bounds[N_BOUNDS - 1] >= 10_000_000 && bounds[N_BOUNDS - 1] < 11_000_000);
        assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        let lows: std::collections::HashSet<u64> = (0..hist::BUCKETS)
            .map(|i| hist::bucket_bounds(i).0 as u64)
            .collect();
        for b in bounds {
            assert!(
                lows.contains(&(b as u64)),
                "{b} us is not a kernel bucket boundary"
            );
        }
    }

    #[test]
    fn conversion_is_exact_below_each_bound() {
        // Samples spread over 1 us .. 20 s; for every bound B the exported
        // cumulative count must equal the number of samples < B.
        let mut vals = Vec::new();
        let mut v = 1u32;
        while v < 20_000_000 {
            vals.push(v);
            vals.push(v + 1);
            v = v * 11 / 10 + 1;
        }
        let h = hist_of(&vals);
        let ph = RttHist::default();
        assert_eq!(ph.add_delta(&h, None), vals.len() as u64);
        let (sum, count, cum) = ph.snapshot();
        assert_eq!(count, vals.len() as u64);
        let exact_sum: u64 = vals.iter().map(|&v| v as u64).sum();
        assert!((sum - exact_sum as f64 / 1e6).abs() < 1e-6);
        for &(b, c) in &cum[..N_BOUNDS] {
            let bound_us = (b * 1e6).round() as u32;
            let exact = vals.iter().filter(|&&v| v < bound_us).count() as u64;
            assert_eq!(c, exact, "le={b}");
        }
        assert_eq!(cum[N_BOUNDS].1, count, "+Inf holds everything");
    }

    #[test]
    fn delta_adds_only_new_samples() {
        let a = hist_of(&[100, 200]);
        let mut b = a.clone();
        b.record(5000);
        let ph = RttHist::default();
        ph.add_delta(&a, None);
        assert_eq!(ph.add_delta(&b, Some(&a)), 1);
        let (sum, count, _) = ph.snapshot();
        assert_eq!(count, 3);
        assert!((sum - 0.0053).abs() < 1e-9);
        assert_eq!(ph.add_delta(&b, Some(&b)), 0);
    }

    #[test]
    fn prefixes_v4_v6_and_ports() {
        let p = LabelPolicy {
            ports: vec![443],
            ..Default::default()
        };
        assert_eq!(
            p.remote_prefix("192.0.2.77".parse().unwrap()),
            "192.0.2.0/24"
        );
        assert_eq!(
            p.remote_prefix("2001:db8:1234:5678::9".parse().unwrap()),
            "2001:db8:1234::/48"
        );
        assert_eq!(
            p.remote_prefix("::ffff:198.51.100.9".parse().unwrap()),
            "198.51.100.0/24"
        );
        let q = LabelPolicy {
            v4_prefix: 16,
            v6_prefix: 64,
            ..Default::default()
        };
        assert_eq!(
            q.remote_prefix("192.0.2.77".parse().unwrap()),
            "192.0.0.0/16"
        );
        assert_eq!(
            q.remote_prefix("2001:db8:1:2:3::9".parse().unwrap()),
            "2001:db8:1:2::/64"
        );
        let l = p.labels(
            ViewKind::Tcp,
            &flow("192.0.2.5:5555", 443),
            Side::Server,
            "ns1",
        );
        assert_eq!(l.local_port, "443");
        assert_eq!(l.side, "server");
        assert_eq!(l.view, "tcp");
        let l = p.labels(
            ViewKind::Sampler,
            &flow("192.0.2.5:443", 40000),
            Side::Client,
            "ns1",
        );
        assert_eq!(l.local_port, "other");
        assert_eq!(l.view, "sampler");
        assert_eq!(
            p.labels(ViewKind::Tcp, &flow("192.0.2.200:1", 1), Side::Client, "x")
                .remote_prefix,
            p.labels(ViewKind::Tcp, &flow("192.0.2.3:2", 2), Side::Client, "x")
                .remote_prefix
        );
    }

    #[test]
    fn policy_validation_sentences() {
        for (p, want) in [
            (
                LabelPolicy {
                    v4_prefix: 33,
                    ..Default::default()
                },
                "IPv4 label prefix",
            ),
            (
                LabelPolicy {
                    v6_prefix: 129,
                    ..Default::default()
                },
                "IPv6 label prefix",
            ),
            (
                LabelPolicy {
                    max_series: 0,
                    ..Default::default()
                },
                "at least 1",
            ),
        ] {
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn series_cap_holds_for_5000_remotes() {
        let policy = LabelPolicy {
            v4_prefix: 32, // every remote address its own label value
            max_series: 100,
            ..Default::default()
        };
        let mut ex = Exporter::new(policy).unwrap();
        let h = hist_of(&[150, 250, 350]);
        let mut total = 0;
        for i in 0..5000u32 {
            let ip = std::net::Ipv4Addr::from(0x0a10_0000 + i);
            let f = flow(&format!("{ip}:80"), 40000);
            total += ex.observe_flow(ViewKind::Tcp, &f, Side::Client, "ns", &h, None);
        }
        assert_eq!(total, 15_000);
        assert_eq!(ex.series_count(), 100);
        let text = ex.encode();
        let count_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("rttscope_rtt_seconds_count{"))
            .collect();
        assert_eq!(count_lines.len(), 101, "100 series + 1 overflow");
        let of = count_lines
            .iter()
            .find(|l| l.contains("remote_prefix=\"overflow\""))
            .expect("overflow series present");
        assert!(of.ends_with(" 14700"), "{of}");
        assert!(
            text.contains("rttscope_series_overflow_total{view=\"tcp\"} 14700"),
            "{}",
            text.lines()
                .filter(|l| l.contains("overflow_total"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(text.contains("rttscope_series 100"));
        // A known label set still updates its own series when the cap is full.
        let f = flow("10.16.0.0:80", 40000);
        let mut h2 = h.clone();
        h2.record(1000);
        assert_eq!(
            ex.observe_flow(ViewKind::Tcp, &f, Side::Client, "ns", &h2, Some(&h)),
            1
        );
        let text = ex.encode();
        assert!(text.contains("rttscope_series_overflow_total{view=\"tcp\"} 14700"));
        // The /24 default aggregates the same 5,000 remotes into 20 series.
        let mut ex = Exporter::new(LabelPolicy::default()).unwrap();
        for i in 0..5000u32 {
            let ip = std::net::Ipv4Addr::from(0x0a10_0000 + i);
            ex.observe_flow(
                ViewKind::Tcp,
                &flow(&format!("{ip}:80"), 40000),
                Side::Client,
                "ns",
                &h,
                None,
            );
        }
        assert_eq!(ex.series_count(), 20);
    }

    #[test]
    fn idle_series_expire() {
        let mut ex = Exporter::new(LabelPolicy {
            series_idle: Duration::from_millis(0),
            ..Default::default()
        })
        .unwrap();
        let h = hist_of(&[100]);
        ex.observe_flow(
            ViewKind::Tcp,
            &flow("10.1.1.1:80", 1),
            Side::Client,
            "n",
            &h,
            None,
        );
        ex.last_expiry = Instant::now() - Duration::from_secs(2);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(ex.expire_idle(), 1);
        assert_eq!(ex.series_count(), 0);
        assert!(!ex.encode().contains("rttscope_rtt_seconds_count{"));
    }

    #[test]
    fn counters_are_deltas_of_cumulative_values() {
        let mut ex = Exporter::new(LabelPolicy::default()).unwrap();
        let mut c = BTreeMap::new();
        c.insert("samples", 100u64);
        c.insert("raw_events_dropped", 3);
        c.insert("flow_map_full", 0);
        c.insert("flows_tracked", 7);
        ex.set_counters(ViewKind::Tcp, &c);
        c.insert("samples", 250);
        c.insert("flows_tracked", 5);
        ex.set_counters(ViewKind::Tcp, &c);
        let t = ex.encode();
        assert!(
            t.contains("rttscope_samples_total{view=\"tcp\"} 250"),
            "{t}"
        );
        assert!(t.contains("rttscope_drops_total{view=\"tcp\",reason=\"raw_events_dropped\"} 3"));
        assert!(t.contains("rttscope_drops_total{view=\"tcp\",reason=\"flow_map_full\"} 0"));
        assert!(t.contains("rttscope_flows_tracked{view=\"tcp\"} 5"));
        assert!(t.contains("rttscope_view_events_total{view=\"tcp\",event=\"samples\"} 250"));
        assert!(t.trim_end().ends_with("# EOF"));
        assert!(t.contains("rttscope_series_overflow_total{view=\"tcp\"} 0"));
        // Levels are gauges, never counters (issue 26.6).
        assert!(t.contains("# TYPE rttscope_view_level gauge"), "{t}");
        assert!(
            t.contains("rttscope_view_level{view=\"tcp\",level=\"flows_tracked\"} 5"),
            "{t}"
        );
        assert!(!t.contains("event=\"flows_tracked\""), "{t}");
        // No label that changes at every restart.
        assert!(!t.contains(",id=\"") && !t.contains("{id=\""), "{t}");
        ex.set_process_stats();
        ex.observe_flow(
            ViewKind::Tcp,
            &flow("10.1.1.1:80", 1),
            Side::Client,
            "n",
            &hist_of(&[5, 100]),
            None,
        );
        let t = ex.encode();
        for le in ["0.00001", "0.000014", "0.01024", "10.48576", "+Inf"] {
            assert!(t.contains(&format!("le=\"{le}\"")), "bucket le={le} in {t}");
        }
        let value = |name: &str| -> f64 {
            let line = t
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in {t}"));
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        // The standard process metrics, under their standard names.
        let rss = value("process_resident_memory_bytes");
        assert!(rss > 1e5 && rss < 1e10, "rss {rss}");
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_virtual_memory_bytes") >= rss);
        let fds = value("process_open_fds");
        assert!(fds >= 3.0 && fds <= value("process_max_fds"), "fds {fds}");
        let start = value("process_start_time_seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            start > now - 86400.0 && start <= now + 1.0,
            "start {start}, now {now}"
        );
        let build = t
            .lines()
            .find(|l| l.starts_with("rttscope_build_info{"))
            .unwrap_or_else(|| panic!("no build info in {t}"));
        assert!(
            build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
                && build.contains(&format!("commit=\"{}\"", env!("RTTSCOPE_GIT_COMMIT")))
                && build.contains(&format!("features=\"{}\"", env!("RTTSCOPE_FEATURES")))
                && build.contains("linkage=\"")
                && build.contains("loaders=\"")
                && build.contains("kernel=\"")
                && build.ends_with(" 1"),
            "{build}"
        );
    }
}
