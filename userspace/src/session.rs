//! An observing session: the passive views asked for, attached; one read per
//! interval (each flow's samples since the previous read, totals, counters);
//! closed and idle flows given back to the kernel's tables. It prints
//! nothing: `cmd::observe` drives it and hands what it reads to the sinks
//! (table, JSON Lines, Prometheus).
use std::collections::{BTreeMap, HashMap};

use anyhow::Result;

use std::sync::Arc;

use crate::analysis::hist::{Hist, Snapshot};
use crate::analysis::workload::Workload;
use crate::bpf::tcp::types::rttscope_tcp_counter as C;
use crate::sys::cgroup::CgroupIndex;
use crate::sys::netns;
use crate::sys::sockdiag::FlowOwners;
use crate::views::flow::{Flow, Side};
use crate::views::sampler::sides::SideResolver;
use crate::views::sampler::{FlowKind, IfaceSpec, SamplerConfig, SamplerFlowStats, SamplerView};
use crate::views::tcp::{self, TcpFlowState, TcpView, TcpViewConfig};
use crate::views::{LoaderKind, ViewKind};
pub(crate) use crate::views::names::NsNames;

use crate::analysis::records::{self, EndFlow, EndView, Name};
pub use crate::analysis::records::{FlowRow, Interval, ViewStats};

mod raw;
pub use crate::views::{RawEvent, RawSample};

/// Where each flow's new samples go as they are read (daemon mode's
/// exporter), besides the interval's rows.
pub trait FlowSink {
    /// One TCP flow of this read: `prev` is its cumulative histogram at the
    /// previous read (None: a new flow).
    fn tcp_flow(
        &mut self,
        f: &TcpFlowState,
        prev: Option<&Snapshot>,
        netns_name: &mut dyn FnMut(u32) -> String,
    );
    /// One sampler flow's samples since the previous read.
    /// `owner`: the flow's workload (`--label-workload`), when known.
    fn sampler_delta(
        &mut self,
        flow: &Flow,
        side: Side,
        netns_name: &str,
        owner: Option<&Workload>,
        delta: &Hist,
    );
}

/// What to attach.
pub struct SessionConfig {
    pub loader: LoaderKind,
    /// The TCP view's settings, if it is asked for.
    pub tcp: Option<TcpViewConfig>,
    /// The sampler's interfaces and settings, if it is asked for.
    pub sampler: Option<(Vec<IfaceSpec>, SamplerConfig)>,
    /// Build per-flow rows (nothing prints them with --quiet).
    pub keep_rows: bool,
    /// `--label-workload`: name each TCP flow's owner from its socket's cgroup.
    pub workloads: bool,
    /// Keep closed flows for the whole-run summary (daemon mode exports per
    /// interval and keeps none: its memory must not grow with churn).
    pub keep_summary: bool,
    /// Read every view's raw samples ([`Session::drain_raw`]): each view is
    /// loaded with its raw-sample ring buffer on. Attach must then run
    /// inside a tokio runtime.
    pub raw_samples: bool,
}

/// One view's samples of an interval by side (the two ends of a connection
/// see different RTTs: a total over both would describe neither).
pub type SideTotals = BTreeMap<Side, Hist>;

/// Each side's statistics, keyed `client`, `server`, `unknown`.
fn side_stats(t: &SideTotals) -> BTreeMap<Name, ViewStats> {
    t.iter()
        .filter(|(_, h)| h.count() > 0)
        .map(|(s, h)| (Name::from(s.as_str()), ViewStats::from_hist(h)))
        .collect()
}

/// Every side's samples together (the cloud-bucket aggregate).
fn merged(t: &SideTotals) -> Hist {
    let mut all = Hist::default();
    for h in t.values() {
        all.merge(h);
    }
    all
}

/// One interval's read: the report and each view's total histogram.
pub struct IntervalRead {
    pub interval: Interval,
    pub totals_hist: BTreeMap<&'static str, Hist>,
}

/// The attached views and what is kept between reads.
pub struct Session {
    pub tcp: Option<Box<dyn TcpView>>,
    pub sampler: Option<Box<dyn SamplerView>>,
    names: NsNames,
    tracker: Tracker,
    sampler_ways: SamplerTracker,
    /// Sides of sampler flows the kernel could not label (socket table).
    sampler_sides: SideResolver,
    keep_rows: bool,
    watch: Watch,
    /// Socket cgroups to owners (`--label-workload`).
    workloads: Option<CgroupIndex>,
    /// The owners of the sampler's flows (`--label-workload` with the sampler).
    sampler_owners: SamplerOwners,
    /// Each view's `samples_not_binned` when last said (TCP, sampler).
    not_binned: [u64; 2],
    /// The views' raw-sample streams (`SessionConfig::raw_samples`).
    raw: raw::RawStreams,
}

/// The observed namespaces (`--netns`, `--iface NETNS:DEV`) and interfaces,
/// checked once per interval: one that disappears (`ip netns del`,
/// `ip link del`) is reported once and counted, and the rest goes on.
#[derive(Default)]
struct Watch {
    netns: Vec<WatchedNs>,
    ifaces: Vec<WatchedIface>,
    /// `--netns` namespaces gone (the TCP view's counter).
    netns_vanished: u64,
    /// Interfaces gone, with their namespace or alone (the sampler's counter).
    ifaces_vanished: u64,
    /// The TCP view's `--cgroup` directory and its inode at attach (None:
    /// the root, or not asked for): a removed one gets a notice
    /// (`cgroup_vanished`, only in the counters when `--cgroup` was given).
    cgroup: Option<(std::path::PathBuf, u64)>,
    cgroup_vanished: u64,
}

struct WatchedNs {
    name: String,
    path: std::path::PathBuf,
    inode: u32,
    /// Given with --netns (counted in the TCP view's netns_vanished).
    tcp: bool,
    gone: bool,
}

struct WatchedIface {
    /// As given: DEV (the observer's namespace) or NETNS:DEV.
    label: String,
    ifindex: u32,
    /// Index into `Watch::netns` of its namespace (None: the observer's own).
    ns: Option<usize>,
    /// A netlink socket in its namespace (None: could not open one; unchecked).
    probe: Option<netns::LinkProbe>,
    gone: bool,
}

impl Watch {
    fn new(
        tcp_netns: &[netns::NetNs],
        cgroup: Option<&std::path::Path>,
        sampler: Option<&dyn SamplerView>,
    ) -> Watch {
        use std::os::unix::fs::MetadataExt;
        let mut w = Watch {
            cgroup: cgroup.and_then(|c| Some((c.to_path_buf(), std::fs::metadata(c).ok()?.ino()))),
            ..Watch::default()
        };
        let ns_index = |w: &mut Watch, ns: &netns::NetNs, tcp: bool| -> Option<usize> {
            // the observer's own namespace and the host's do not go away
            if ns.name == "self" || ns.name == netns::HOST || netns::is_current(ns) {
                return None;
            }
            if let Some(i) = w.netns.iter().position(|n| n.inode == ns.inode) {
                w.netns[i].tcp |= tcp;
                return Some(i);
            }
            w.netns.push(WatchedNs {
                name: ns.name.clone(),
                path: ns.path.clone(),
                inode: ns.inode,
                tcp,
                gone: false,
            });
            Some(w.netns.len() - 1)
        };
        for ns in tcp_netns {
            ns_index(&mut w, ns, true);
        }
        for a in sampler.map(|s| s.attach_info()).unwrap_or_default() {
            let Ok(ns) = netns::resolve(&a.netns) else {
                continue;
            };
            if ns.inode != a.netns_inode {
                continue; // already replaced: nothing sensible to watch
            }
            let idx = ns_index(&mut w, &ns, false);
            let probe = match idx {
                None => netns::LinkProbe::open().ok(),
                Some(_) => netns::run_in(&ns, netns::LinkProbe::open).ok(),
            };
            w.ifaces.push(WatchedIface {
                label: if a.netns == "self" {
                    a.iface.clone()
                } else {
                    format!("{}:{}", a.netns, a.iface)
                },
                ifindex: a.ifindex,
                ns: idx,
                probe,
                gone: false,
            });
        }
        w
    }

    /// What disappeared since the last check, one notice line each.
    fn check(&mut self) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let mut notices = Vec::new();
        if let Some((path, ino)) = &self.cgroup {
            // removed, or removed and made again (the programs stay on the old one)
            if self.cgroup_vanished == 0
                && std::fs::metadata(path).map_or(true, |m| m.ino() != *ino)
            {
                self.cgroup_vanished = 1;
                notices.push(format!(
                    "cgroup {} is gone (removed?); the TCP view attached to it sees no new connections, the rest goes on",
                    path.display()
                ));
            }
        }
        for n in self.netns.iter_mut().filter(|n| !n.gone) {
            if !netns::still_there(&n.path, n.inode) {
                n.gone = true;
                if n.tcp {
                    self.netns_vanished += 1;
                }
                notices.push(format!(
                    "network namespace {} is gone (deleted?); its flows and interfaces are no longer seen, the rest goes on",
                    n.name
                ));
            }
        }
        for i in self.ifaces.iter_mut().filter(|i| !i.gone) {
            let ns_gone = i.ns.is_some_and(|n| self.netns[n].gone);
            let dev_gone = !ns_gone
                && match i.probe.as_mut() {
                    // an error (timeout, ...) is not taken as gone
                    Some(p) => matches!(p.exists(i.ifindex), Ok(false)),
                    None => false,
                };
            if ns_gone || dev_gone {
                i.gone = true;
                i.probe = None;
                self.ifaces_vanished += 1;
                notices.push(format!(
                    "interface {} is gone (deleted?); the sampler stops seeing it, the other views and interfaces go on",
                    i.label
                ));
            }
        }
        notices
    }
}

/// The sampler's table between reads, per way (table entry): which flow
/// stay (`gen`) it held, what of its histogram was read, and the way's
/// running total of evicted samples. Bounded by the table's size.
#[derive(Default)]
pub(crate) struct SamplerTracker {
    prev: crate::views::SlotMap<u32, WayPrev>,
    /// Samples of evicted flows that no read saw (cumulative).
    samples_evicted: u64,
}

struct WayPrev {
    gen: u64,
    evicted: u64,
    snap: Snapshot,
    /// Samples of this flow stay read so far (the snapshot's count).
    read: u64,
}

impl SamplerTracker {
    /// One way of this read: its samples since the previous read (the
    /// whole histogram for a flow new in the way), and the way's evicted
    /// samples that were never read added to `samples_evicted`. Returns
    /// (delta, whether the flow stay is new to us).
    fn way(&mut self, f: &SamplerFlowStats) -> (Hist, bool) {
        let grown = |p: &WayPrev| f.evicted_samples.saturating_sub(p.evicted);
        if let Some(p) = self.prev.get(&f.way) {
            // an idle flow: nothing read since, nothing evicted from its way
            if p.gen == f.gen && p.read == f.hist.count() && p.evicted == f.evicted_samples {
                return (Hist::default(), false);
            }
        }
        let (delta, first) = match self.prev.get(&f.way) {
            Some(p) if p.gen == f.gen => {
                self.samples_evicted += grown(p);
                (p.snap.delta_hist(&f.hist), false)
            }
            Some(p) => {
                // re-keyed since: the flow we read part of was evicted
                // (with any flows that came and went in between)
                self.samples_evicted += grown(p).saturating_sub(p.read);
                (f.hist.clone(), true)
            }
            None => {
                self.samples_evicted += f.evicted_samples;
                (f.hist.clone(), true)
            }
        };
        self.prev.insert(
            f.way,
            WayPrev {
                gen: f.gen,
                evicted: f.evicted_samples,
                snap: Snapshot::of_hist(&f.hist),
                read: f.hist.count(),
            },
        );
        (delta, first)
    }
}

impl Session {
    /// Load and attach the views asked for (TCP first, then the sampler).
    pub fn attach(cfg: SessionConfig) -> Result<Session> {
        let cfg = cfg.with_raw_views();
        let tcp = match &cfg.tcp {
            Some(c) => Some(crate::views::attach_tcp(cfg.loader, c)?),
            None => None,
        };
        let tcp_netns = cfg
            .tcp
            .as_ref()
            .map(|c| c.netns_filter.clone())
            .unwrap_or_default();
        let tcp_cgroup = cfg.tcp.as_ref().and_then(|c| c.cgroup.clone());
        let sampler = match cfg.sampler {
            Some((ifaces, sc)) => {
                crate::sys::preflight::require_bpf_caps()?;
                sc.validate()?;
                Some(crate::views::attach_sampler(cfg.loader, &ifaces, sc)?)
            }
            None => None,
        };
        let watch = Watch::new(&tcp_netns, tcp_cgroup.as_deref(), sampler.as_deref());
        let sampler_sides = SideResolver::new(sampler_namespaces(sampler.as_deref()));
        let sampler_owners = SamplerOwners {
            tcp: HashMap::new(),
            diag: (cfg.workloads && sampler.is_some())
                .then(|| FlowOwners::open(&sampler_namespaces(sampler.as_deref()))),
        };
        let (mut tcp, mut sampler) = (tcp, sampler);
        let raw = raw::RawStreams::open(
            cfg.raw_samples,
            vec![
                tcp.as_deref_mut()
                    .map(|v| v as &mut dyn crate::views::PassiveView),
                sampler
                    .as_deref_mut()
                    .map(|v| v as &mut dyn crate::views::PassiveView),
            ],
        )?;
        Ok(Session {
            tcp,
            sampler,
            watch,
            names: NsNames::new(),
            tracker: Tracker {
                keep_finished: cfg.keep_summary,
                keep_rows: cfg.keep_rows,
                ..Tracker::default()
            },
            sampler_ways: SamplerTracker::default(),
            sampler_sides,
            keep_rows: cfg.keep_rows,
            workloads: cfg.workloads.then(workload_index),
            sampler_owners,
            not_binned: [0; 2],
            raw,
        })
    }

    /// Once per interval: the observed namespaces and interfaces that
    /// disappeared since the last call, one notice each (counted in the
    /// TCP view's `netns_vanished`, the sampler's `ifaces_vanished`).
    pub fn check_vanished(&mut self) -> Vec<String> {
        let mut notices = self.watch.check();
        notices.extend(self.not_binned_notices());
        notices
    }

    /// Samples a view left out of its histograms since the last call (more
    /// flows with samples in one read than its fine-histogram pool and
    /// overflow ring hold: `samples_not_binned`), one notice per view.
    fn not_binned_notices(&mut self) -> Vec<String> {
        let now = [
            self.tcp
                .as_ref()
                .map_or(0, |v| v.counter(C::RTTSCOPE_TCP_NOT_BINNED)),
            self.sampler
                .as_ref()
                .and_then(|s| s.counters().ok())
                .and_then(|c| c.get("samples_not_binned").copied())
                .unwrap_or(0),
        ];
        let mut out = Vec::new();
        for (i, view) in ["tcp", "sampler"].into_iter().enumerate() {
            let new = now[i].saturating_sub(self.not_binned[i]);
            if new > 0 {
                out.push(format!(
                    "{new} samples of the {view} view were left out of its histograms (counted in samples_not_binned): more flows had samples between two reads than its fine-histogram pool and overflow ring hold (docs/metrics.md, \"Kernel memory\"); a shorter --interval or a larger --max-flows holds more"
                ));
            }
        }
        self.not_binned = now;
        out
    }

    /// Between reports: fold each view's fine-histogram pool in when its
    /// current half is half taken (busy hosts, long intervals), so that the
    /// pool and its overflow ring hold the samples until the report.
    pub fn drain_pools_if_due(&mut self) -> Result<()> {
        if let Some(v) = self.tcp.as_ref() {
            v.drain_pool_if_busy()?;
        }
        if let Some(s) = self.sampler.as_mut() {
            s.drain_pool_if_busy()?;
        }
        Ok(())
    }

    /// Between reports: when the TCP view's table is filling up, read the
    /// closed flows now and free their slots (their rows wait for the report).
    pub fn reclaim_if_due<'s>(&mut self, sink: Option<&mut (dyn FlowSink + 's)>) -> Result<()> {
        let Some(view) = self.tcp.as_mut() else {
            return Ok(());
        };
        let cap = view.info().max_flows;
        let closed = view.counter(C::RTTSCOPE_TCP_CLOSED);
        // a scan of the whole table only when a connection closed since the last one: on a host
        // with 100,000 long-lived connections the table stays more than half taken, and reading
        // it 8 times per interval for nothing took most of the observer's idle CPU
        if closed != self.tracker.closed_scanned
            && self
                .tracker
                .reclaim_due(view.counter(C::RTTSCOPE_TCP_FLOWS_CREATED), cap)
        {
            self.tracker.closed_scanned = closed;
            reclaim_closed(
                view.as_mut(),
                &mut self.tracker,
                &mut self.names,
                sink,
                self.keep_rows,
            )?;
        }
        Ok(())
    }

    /// One interval: read each view, then start the next epoch. `raw_bad`:
    /// the TCP raw stream's bad-record count, reported with its counters.
    pub fn read_interval<'s>(
        &mut self,
        mut sink: Option<&mut (dyn FlowSink + 's)>,
        raw_bad: Option<u64>,
    ) -> Result<IntervalRead> {
        let mut rows: BTreeMap<Flow, FlowRow> = BTreeMap::new();
        let mut totals = BTreeMap::new();
        let mut totals_hist: BTreeMap<&'static str, Hist> = BTreeMap::new();
        let mut counters = BTreeMap::new();
        if self.tcp.is_some() {
            let (by_side, tc) = self.read_tcp(&mut rows, sink.as_deref_mut(), raw_bad)?;
            counters.insert("tcp".into(), records::names(tc));
            totals.insert("tcp".into(), side_stats(&by_side));
            totals_hist.insert("tcp", merged(&by_side));
        }
        if self.sampler.is_some() {
            let (by_side, sc) = self.read_sampler(&mut rows, sink)?;
            counters.insert("sampler".into(), records::names(sc));
            totals.insert("sampler".into(), side_stats(&by_side));
            totals_hist.insert("sampler", merged(&by_side));
        }
        Ok(IntervalRead {
            interval: Interval {
                kind: "interval".into(),
                t: 0.0,
                ts: 0.0,
                interval_s: 0.0,
                flows: rows.into_values().collect(),
                totals,
                counters,
            },
            totals_hist,
        })
    }

    /// The TCP view's part of an interval: rows, total, counters; closed
    /// flows' slots given back, the least recently active evicted when few
    /// slots are left.
    fn read_tcp<'s>(
        &mut self,
        rows: &mut BTreeMap<Flow, FlowRow>,
        mut sink: Option<&mut (dyn FlowSink + 's)>,
        raw_bad: Option<u64>,
    ) -> Result<(SideTotals, BTreeMap<&'static str, u64>)> {
        let (tracker, names, keep_rows) = (&mut self.tracker, &mut self.names, self.keep_rows);
        let workloads = &mut self.workloads;
        let tcp_owners = &mut self.sampler_owners.tcp;
        tcp_owners.clear();
        let view = self.tcp.as_mut().expect("TCP view attached");
        let epoch = view.epoch();
        let mut totals = SideTotals::new();
        let mut closed = Vec::new();
        let mut live = Vec::new();
        let collect_live = tracker.near_full(view.info().max_flows);
        tracker.closed_scanned = view.counter(C::RTTSCOPE_TCP_CLOSED);
        tracker.begin();
        // Closed flows freed early (the table was filling up) are reported
        // with this interval too; a row of this read for the same 4-tuple (a
        // new connection on it) replaces theirs and holds their samples too.
        for (flow, r) in tracker.early_rows.drain(..) {
            rows.insert(flow, r);
        }
        view.for_each_flow(&mut |mut f| {
            if let Some(idx) = workloads.as_mut() {
                own(idx, names, &mut f);
                if let Some(w) = &f.workload {
                    tcp_owners.insert(f.flow, w.clone());
                }
            }
            // daemon mode: this flow's samples since the last read.
            if let Some(d) = sink.as_deref_mut() {
                d.tcp_flow(
                    &f,
                    tracker.prev.get(&(f.slot, f.gen)).map(|p| &p.snap),
                    &mut |ns| names.get(ns),
                );
            }
            if f.closed {
                closed.push((f.slot, f.gen, f.flow));
            } else if collect_live {
                live.push((f.slot, f.gen));
            }
            if let Some(r) = tracker.flow_row(&f, epoch, names, &mut totals) {
                if keep_rows {
                    rows.insert(f.flow, r); // (--quiet: nothing prints rows)
                }
            }
        })?;
        tracker.end();
        view.next_epoch();
        for (side, h) in std::mem::take(&mut tracker.early_totals) {
            totals.entry(side).or_default().merge(&h);
        }
        // Closed flows are reported once (this interval), then their
        // slots are given back.
        for (slot, gen, _) in closed {
            view.forget(slot, gen)?;
            tracker.forget(slot, gen);
            tracker.closed_reported += 1;
        }
        // Few slots left: evict the least recently active live flows
        // (their sockets take a new slot at their next sample).
        for (slot, gen) in tracker.to_evict(live, view.info().max_flows) {
            view.forget(slot, gen)?;
            tracker.forget(slot, gen);
            tracker.evicted += 1;
        }
        let mut tc = view.counters()?;
        tracker.counters(&mut tc);
        tc.insert("netns_vanished", self.watch.netns_vanished);
        if self.watch.cgroup.is_some() {
            tc.insert("cgroup_vanished", self.watch.cgroup_vanished);
        }
        if let Some(bad) = raw_bad {
            tc.insert("raw_records_bad", bad);
        }
        Ok((totals, tc))
    }

    /// The sampler's part of an interval: each flow's samples since the
    /// previous read, into its row (with the side the TCP view found).
    fn read_sampler<'s>(
        &mut self,
        rows: &mut BTreeMap<Flow, FlowRow>,
        mut sink: Option<&mut (dyn FlowSink + 's)>,
    ) -> Result<(SideTotals, BTreeMap<&'static str, u64>)> {
        let s = self.sampler.as_mut().expect("sampler attached");
        let mut totals = SideTotals::new();
        // One entry per way: a flow in two ways (rare) has its deltas merged.
        let mut deltas: BTreeMap<Flow, (Hist, FlowKind, Side)> = BTreeMap::new();
        self.sampler_sides.begin();
        self.sampler_owners.begin();
        let (ways, owners) = (&mut self.sampler_ways, &mut self.sampler_owners);
        let (tracker, sides) = (&self.tracker, &mut self.sampler_sides);
        s.for_each_flow(&mut |f| {
            let (mut delta, first) = ways.way(&f);
            if delta.count() == 0 {
                owners.keep(&f.flow);
                return;
            }
            delta.set_range(
                f.interval_min_us
                    .or(if first { f.hist.min_us } else { None }),
                f.interval_max_us
                    .or(if first { f.hist.max_us } else { None }),
            );
            match deltas.entry(f.flow) {
                std::collections::btree_map::Entry::Occupied(mut d) => d.get_mut().0.merge(&delta),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let side = sampler_side(tracker, sides, &f);
                    v.insert((delta, f.kind, side));
                }
            }
        })?;
        self.sampler_sides.end();
        for (flow, (delta, kind, side)) in deltas {
            let owner = self
                .sampler_owners
                .get(&mut self.workloads, &mut self.names, &flow, kind);
            // daemon mode: the sampler's samples since the last read.
            if let Some(d) = sink.as_deref_mut() {
                let ns = self.names.get(flow.netns);
                d.sampler_delta(&flow, side, &ns, owner.as_deref(), &delta);
            }
            totals.entry(side).or_default().merge(&delta);
            if !self.keep_rows {
                continue; // nothing prints rows
            }
            let stats = ViewStats::from_hist(&delta);
            let names = &mut self.names;
            let row = rows.entry(flow).or_insert_with(|| FlowRow {
                netns: flow.netns,
                netns_name: names.get(flow.netns),
                local: flow.local.to_string(),
                remote: flow.remote.to_string(),
                side,
                proto: icmp_proto(kind).map(Name::from),
                origin: None,
                state: None,
                closed: false,
                tcp: None,
                sampler: None,
                workload: None,
                flow: Some(flow),
            });
            row.sampler = Some(stats);
            if row.workload.is_none() {
                row.workload = owner;
            }
        }
        self.sampler_owners.end();
        let mut sc = s.counters()?;
        sc.insert("samples_evicted", self.sampler_ways.samples_evicted);
        sc.insert("ifaces_vanished", self.watch.ifaces_vanished);
        self.sampler_owners.counters(&mut sc);
        if let Some(bad) = self.raw_records_bad(ViewKind::Sampler) {
            sc.insert("raw_records_bad", bad); // raw records it could not decode
        }
        Ok((totals, sc))
    }

    /// The whole run, per flow: every flow still in the views' tables and
    /// every TCP flow that closed during the run (`closed: true`), as the
    /// `end` record's flows and as rows for the closing table; each view's
    /// counters.
    pub fn summary(&mut self) -> Result<Summary> {
        let mut flows: BTreeMap<Flow, (EndFlow, FlowRow)> = BTreeMap::new();
        let mut totals: BTreeMap<&'static str, SideTotals> = BTreeMap::new();
        let names = &mut self.names;
        let workloads = &mut self.workloads;
        if let Some(view) = &self.tcp {
            view.for_each_flow(&mut |mut f| {
                if let Some(idx) = workloads.as_mut() {
                    own(idx, names, &mut f);
                }
                let h = f.hist();
                add_total(&mut totals, "tcp", f.side, &h);
                let name = names.get(f.flow.netns);
                let (mut e, mut r) = whole_run(&f.flow, name, f.side);
                tcp_whole_run(&mut e, &mut r, &h, (f.srtt_us, f.retrans));
                e.origin = Some(f.origin.into());
                r.origin = e.origin.clone();
                (e.closed, r.closed) = (Some(f.closed), f.closed);
                e.workload = f.workload.clone();
                r.workload = f.workload.clone();
                flows.insert(f.flow, (e, r));
            })?;
        }
        for (flow, fin) in &self.tracker.finished {
            if flows.contains_key(flow) {
                continue; // the same 4-tuple, open again at the end
            }
            add_total(&mut totals, "tcp", fin.side, &fin.hist);
            let (mut e, mut r) = whole_run(flow, fin.netns_name.clone(), fin.side);
            tcp_whole_run(&mut e, &mut r, &fin.hist, (fin.srtt_us, fin.retrans));
            e.origin = Some(fin.origin.into());
            r.origin = e.origin.clone();
            (e.closed, r.closed) = (Some(true), true);
            e.workload = fin.workload.clone();
            r.workload = fin.workload.clone();
            flows.insert(*flow, (e, r));
        }
        if let Some(s) = self.sampler.as_mut() {
            self.sampler_sides.begin();
            self.sampler_owners.begin();
            for f in crate::views::sampler::merge_ways(s.read_flows()?) {
                let side = sampler_side(&self.tracker, &mut self.sampler_sides, &f);
                add_total(&mut totals, "sampler", side, &f.hist);
                let owner = self.sampler_owners.get(workloads, names, &f.flow, f.kind);
                let entry = flows.entry(f.flow).or_insert_with(|| {
                    let (mut e, mut r) = whole_run(&f.flow, names.get(f.flow.netns), side);
                    e.proto = icmp_proto(f.kind).map(Name::from);
                    r.proto = e.proto.clone();
                    (e.workload, r.workload) = (owner.clone(), owner);
                    (e, r)
                });
                let mut v = EndView::of(&f.hist);
                v.iface = Some(f.iface.clone());
                entry.0.sampler = Some(v);
                entry.1.sampler = Some(ViewStats::from_hist(&f.hist));
            }
        }
        let mut counters = BTreeMap::new();
        if let Some(v) = &self.tcp {
            let mut tc = v.counters()?;
            tc.insert("netns_vanished", self.watch.netns_vanished);
            if self.watch.cgroup.is_some() {
                tc.insert("cgroup_vanished", self.watch.cgroup_vanished);
            }
            self.tracker.counters(&mut tc);
            tc.insert("summary_flows_dropped", self.tracker.finished_dropped);
            counters.insert("tcp", tc);
        }
        if let Some(s) = &self.sampler {
            let mut sc = s.counters()?;
            sc.insert("samples_evicted", self.sampler_ways.samples_evicted);
            sc.insert("ifaces_vanished", self.watch.ifaces_vanished);
            self.sampler_owners.counters(&mut sc);
            if let Some(bad) = self.raw_records_bad(ViewKind::Sampler) {
                sc.insert("raw_records_bad", bad);
            }
            counters.insert("sampler", sc);
        }
        let (end_flows, rows): (Vec<_>, Vec<_>) = flows.into_values().unzip();
        Ok(Summary {
            flows: end_flows,
            rows,
            totals,
            counters,
        })
    }
}

/// A flow's whole run: its end-record entry and its row, views to be filled in.
fn whole_run(f: &Flow, netns_name: String, side: Side) -> (EndFlow, FlowRow) {
    let e = EndFlow {
        closed: None,
        local: f.local.to_string(),
        netns: f.netns,
        netns_name: netns_name.clone(),
        origin: None,
        proto: None,
        remote: f.remote.to_string(),
        sampler: None,
        side,
        tcp: None,
        workload: None,
    };
    let r = FlowRow {
        netns: f.netns,
        netns_name,
        local: e.local.clone(),
        remote: e.remote.clone(),
        side,
        proto: None,
        origin: None,
        state: None,
        closed: false,
        tcp: None,
        sampler: None,
        workload: None,
        flow: Some(*f),
    };
    (e, r)
}

/// The TCP view's whole run of a flow, into its end-record entry and its row.
fn tcp_whole_run(e: &mut EndFlow, r: &mut FlowRow, h: &Hist, (srtt_us, retrans): (u32, u32)) {
    let mut v = EndView::of(h);
    (v.srtt_us, v.retrans) = (Some(srtt_us), Some(retrans));
    e.tcp = Some(v);
    let mut vs = ViewStats::from_hist(h);
    (vs.srtt_us, vs.retrans) = (Some(srtt_us), Some(retrans));
    r.tcp = Some(vs);
}

/// A flow's whole-run histogram into its view's total for its side.
fn add_total(
    totals: &mut BTreeMap<&'static str, SideTotals>,
    view: &'static str,
    side: Side,
    h: &Hist,
) {
    totals
        .entry(view)
        .or_default()
        .entry(side)
        .or_default()
        .merge(h);
}

/// `proto` of a sampler flow's row: `icmp`/`icmpv6`, None for TCP.
fn icmp_proto(kind: FlowKind) -> Option<&'static str> {
    (kind != FlowKind::Tcp).then(|| kind.as_str())
}

/// The side of a sampler flow: what the TCP view found for the same flow,
/// else what the sampler's programs saw (the handshake; ICMP: pinger or
/// pinged), else the socket table of the interface's namespace (issue 15).
fn sampler_side(tcp: &Tracker, sockets: &mut SideResolver, f: &SamplerFlowStats) -> Side {
    if f.kind != FlowKind::Tcp {
        return f.side;
    }
    match tcp.side_of(&f.flow) {
        Side::Unknown if f.side != Side::Unknown => f.side,
        Side::Unknown => sockets.side(&f.flow),
        s => s,
    }
}

/// The namespaces of the sampler's interfaces (for the socket table).
fn sampler_namespaces(s: Option<&dyn SamplerView>) -> Vec<netns::NetNs> {
    let mut out: Vec<netns::NetNs> = Vec::new();
    for a in s.map(|s| s.attach_info()).unwrap_or_default() {
        match netns::resolve(&a.netns) {
            Ok(ns) if ns.inode == a.netns_inode && !out.iter().any(|n| n.inode == ns.inode) => {
                out.push(ns)
            }
            _ => {}
        }
    }
    out
}

/// The whole run (see [`Session::summary`]).
pub struct Summary {
    /// The `end` record's flows.
    pub flows: Vec<EndFlow>,
    /// The same flows as rows (whole-run statistics) for the closing table.
    pub rows: Vec<FlowRow>,
    /// Each view's whole run, per side.
    pub totals: BTreeMap<&'static str, SideTotals>,
    pub counters: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
}

impl Summary {
    /// The rows as an interval report (totals per side) for the table.
    pub fn as_interval(&self, t: f64) -> Interval {
        Interval {
            kind: "summary".into(),
            t,
            ts: 0.0,
            interval_s: t,
            flows: self.rows.clone(),
            totals: self
                .totals
                .iter()
                .map(|(v, t)| (Name::from(*v), side_stats(t)))
                .collect(),
            counters: records::counters(&self.counters),
        }
    }
}

/// The most closed flows the end summary keeps (a connection churn of hours
/// must not grow the observer without bound).
pub const MAX_FINISHED: usize = 65_536;

/// A flow that closed during the run, as the end summary reports it.
struct Finished {
    hist: Hist,
    srtt_us: u32,
    retrans: u32,
    side: Side,
    origin: &'static str,
    netns_name: String,
    workload: Option<Arc<Workload>>,
}

/// The index of socket cgroups, at the cgroup v2 root (`--label-workload`).
fn workload_index() -> CgroupIndex {
    let root = crate::sys::preflight::cgroup2_mount().unwrap_or_else(|| "/sys/fs/cgroup".into());
    CgroupIndex::new(root)
}

/// Fill a TCP flow's owner; a network namespace with no other name is named
/// by the pod or container that holds it.
fn own(idx: &mut CgroupIndex, names: &mut NsNames, f: &mut TcpFlowState) {
    f.workload = idx.get(f.cgroup);
    if let Some(n) = f.workload.as_ref().and_then(|w| w.netns_name()) {
        names.set_owner(f.flow.netns, n);
    }
}

/// The owners of the sampler's flows (`--label-workload`): what the TCP
/// view found for the same 4-tuple in this read, else the flow's local
/// socket through sock_diag ([`FlowOwners`], cached per flow).
struct SamplerOwners {
    /// This read's TCP flows with an owner.
    tcp: HashMap<Flow, Arc<Workload>>,
    /// None: `--label-workload` is off or no sampler.
    diag: Option<FlowOwners>,
}

impl SamplerOwners {
    fn begin(&mut self) {
        if let Some(d) = self.diag.as_mut() {
            d.begin();
        }
    }

    fn end(&mut self) {
        if let Some(d) = self.diag.as_mut() {
            d.end();
        }
    }

    fn keep(&mut self, f: &Flow) {
        if let Some(d) = self.diag.as_mut() {
            d.keep(f);
        }
    }

    /// A TCP flow's owner; its namespace is named by it as the TCP view's are.
    fn get(
        &mut self,
        idx: &mut Option<CgroupIndex>,
        names: &mut NsNames,
        f: &Flow,
        kind: FlowKind,
    ) -> Option<Arc<Workload>> {
        let (idx, diag) = (idx.as_mut()?, self.diag.as_mut()?);
        if kind != FlowKind::Tcp {
            return None;
        }
        let w = match self.tcp.get(f) {
            Some(w) => Some(w.clone()),
            None => idx.get(diag.cgroup(f)),
        };
        if let Some(n) = w.as_ref().and_then(|w| w.netns_name()) {
            names.set_owner(f.netns, n);
        }
        w
    }

    /// `owner_lookups` and `owners_unknown` (only with `--label-workload`).
    fn counters(&self, c: &mut BTreeMap<&'static str, u64>) {
        if let Some(d) = &self.diag {
            c.insert("owner_lookups", d.lookups);
            c.insert("owners_unknown", d.unknown);
        }
    }
}

/// One flow stay (slot, gen) as the last read left it.
struct Stay {
    /// Its cumulative histogram then.
    snap: Snapshot,
    /// The read of its last sample (eviction takes the least recently active).
    active: u64,
    /// The last read that found it in the table.
    seen: u64,
    /// Its side then.
    side: Side,
}

/// Per-flow bookkeeping between intervals: a sparse snapshot of each flow's
/// cumulative histogram (the interval's counts are the difference).
#[derive(Default)]
pub(crate) struct Tracker {
    /// Flows that closed during the run, with their whole-run histogram and
    /// last TCP state: the end summary keeps them (at most
    /// [`MAX_FINISHED`]; past that `summary_flows_dropped` counts them).
    finished: BTreeMap<Flow, Finished>,
    finished_dropped: u64,
    /// Whether `finished` is kept at all (not in daemon mode).
    keep_finished: bool,
    /// Whether rows are built at all (not with --quiet).
    keep_rows: bool,
    /// Each flow stay's histogram at the last read, and the interval of its
    /// last sample, by (slot, gen): not by 4-tuple, which a new connection
    /// can take again while the closed one is still in the table (under
    /// churn the new one's samples were subtracted from the old one's).
    prev: crate::views::SlotMap<(u32, u32), Stay>,
    /// Each flow's side, and the stay (slot, gen) that told it, by 4-tuple (the sampler's rows
    /// and raw samples ask). Written when a stay is new, changes side or has samples, so an idle
    /// flow costs no lookup here; entries whose stay is gone are dropped once they are as many
    /// as the live ones (a closed connection's 4-tuple keeps its side until then).
    sides: HashMap<Flow, (Side, (u32, u32))>,
    /// This interval's samples per 4-tuple so far (over the stays of that
    /// 4-tuple read since the last report, early ones included): a row
    /// stands for all of them.
    row_deltas: HashMap<Flow, Hist>,
    interval: u64,
    vanished: u64,
    evicted: u64,
    closed_reported: u64,
    tracked: u64,
    /// Slots given back by us (closed, evicted): with the kernel's
    /// flows_created, the table's occupancy between reads.
    freed: u64,
    /// The kernel's count of closed connections when the table was last read (a read between
    /// reports frees closed flows early only when it has grown since).
    closed_scanned: u64,
    /// Closed flows read and freed before the interval's report (the table
    /// was filling up): their rows wait here for the report.
    early_rows: Vec<(Flow, FlowRow)>,
    early_totals: SideTotals,
}

impl Tracker {
    fn begin(&mut self) {
        self.tracked = 0;
        self.interval += 1;
    }

    /// Keep a closed flow's whole run for the end summary (a 4-tuple used
    /// again later in the run adds to the same entry).
    fn finish(&mut self, f: &TcpFlowState, names: &mut NsNames) {
        if !self.keep_finished {
            return;
        }
        if let Some(e) = self.finished.get_mut(&f.flow) {
            e.hist.merge(&f.hist());
            e.srtt_us = f.srtt_us;
            e.retrans = e.retrans.saturating_add(f.retrans);
            return;
        }
        if self.finished.len() >= MAX_FINISHED {
            self.finished_dropped += 1;
            return;
        }
        self.finished.insert(
            f.flow,
            Finished {
                hist: f.hist(),
                srtt_us: f.srtt_us,
                retrans: f.retrans,
                side: f.side,
                origin: f.origin,
                netns_name: names.get(f.flow.netns),
                workload: f.workload.clone(),
            },
        );
    }

    /// The tracker's own counters, in every interval and end record.
    fn counters(&self, tc: &mut BTreeMap<&'static str, u64>) {
        tc.insert("flows_vanished", self.vanished);
        tc.insert("flows_evicted", self.evicted);
        tc.insert("flows_closed_reported", self.closed_reported);
        tc.insert("flows_tracked", self.tracked);
    }

    fn forget(&mut self, slot: u32, gen: u32) {
        self.prev.remove(&(slot, gen));
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

    /// Live flows (slot, gen) to evict: when more than 7/8 of the
    /// `capacity` slots are taken, the least recently active ones, down to 3/4.
    fn to_evict(&self, mut live: Vec<(u32, u32)>, capacity: u32) -> Vec<(u32, u32)> {
        let cap = capacity as usize;
        if live.len() <= cap - cap / 8 {
            return Vec::new();
        }
        let n = live.len() - (cap - cap / 4);
        live.sort_by_key(|l| self.prev.get(l).map_or(0, |p| p.active));
        live.truncate(n);
        live
    }

    /// One flow of this interval's read: its row, if it had samples, is new, or closed.
    fn flow_row(
        &mut self,
        f: &TcpFlowState,
        epoch: u32,
        names: &mut NsNames,
        totals: &mut SideTotals,
    ) -> Option<FlowRow> {
        if f.closed {
            self.finish(f, names);
        }
        let stay = (f.slot, f.gen);
        let read = self.interval;
        self.tracked += 1;
        let first = !self.prev.contains_key(&stay);
        if let Some(p) = self.prev.get_mut(&stay) {
            p.seen = read;
            // an idle flow (most of them on a busy host): nothing to add or keep again
            if !f.closed && p.side == f.side && p.snap.unchanged(&f.counts, f.sum_us) {
                return None;
            }
        }
        self.sides.insert(f.flow, (f.side, stay));
        let mut delta = f.since(self.prev.get(&stay).map(|p| &p.snap));
        if delta.count() > 0 && f.win_epoch == epoch && f.win_min_us <= f.win_max_us {
            delta.set_range(Some(f.win_min_us), Some(f.win_max_us));
        } else if first && delta.count() > 0 {
            delta.set_range(f.life_min_us, f.life_max_us);
        }
        let active = match self.prev.get(&stay) {
            Some(p) if !first && delta.count() == 0 => p.active,
            _ => self.interval,
        };
        let snap = Snapshot::of_sparse(&f.counts, f.sum_us);
        let side = f.side;
        self.prev.insert(
            stay,
            Stay {
                snap,
                active,
                seen: read,
                side,
            },
        );
        if delta.count() == 0 && !first && !f.closed {
            return None;
        }
        totals.entry(f.side).or_default().merge(&delta);
        if !self.keep_rows {
            return None; // nothing prints rows (--quiet, the daemon): none built
        }
        let merged = self.row_deltas.entry(f.flow).or_default();
        merged.merge(&delta);
        let mut vs = ViewStats::from_hist(merged);
        vs.srtt_us = Some(f.srtt_us);
        vs.retrans = Some(f.retrans);
        Some(FlowRow {
            netns: f.flow.netns,
            netns_name: names.get(f.flow.netns),
            local: f.flow.local.to_string(),
            remote: f.flow.remote.to_string(),
            side: f.side,
            proto: None,
            origin: Some(f.origin.into()),
            state: Some(tcp::state_name(f.state).into()),
            closed: f.closed,
            tcp: Some(vs),
            sampler: None,
            workload: f.workload.clone(),
            flow: Some(f.flow),
        })
    }

    /// The side the TCP view found for a flow (for rows only the sampler saw).
    pub fn side_of(&self, flow: &Flow) -> Side {
        self.sides.get(flow).map_or(Side::Unknown, |s| s.0)
    }

    /// After a full read: flows that disappeared without a close were evicted.
    fn end(&mut self) {
        let before = self.prev.len();
        let read = self.interval;
        self.prev.retain(|_, p| p.seen == read);
        if self.sides.len() > 2 * self.prev.len() + 1024 {
            let prev = &self.prev;
            self.sides.retain(|_, s| prev.contains_key(&s.1));
        }
        self.vanished += (before - self.prev.len()) as u64;
        self.row_deltas.clear();
    }
}

/// Read the TCP view's table between reports and free the slots of closed
/// flows now, keeping their rows (and exporting their samples in daemon
/// mode) for the interval's report.
fn reclaim_closed<'s>(
    view: &mut dyn TcpView,
    tracker: &mut Tracker,
    names: &mut NsNames,
    mut sink: Option<&mut (dyn FlowSink + 's)>,
    keep_rows: bool,
) -> Result<()> {
    let epoch = view.epoch();
    let tracked = tracker.tracked;
    let mut closed = Vec::new();
    let mut totals = std::mem::take(&mut tracker.early_totals);
    view.for_each_flow(&mut |f| {
        if !f.closed {
            return;
        }
        if let Some(d) = sink.as_deref_mut() {
            d.tcp_flow(
                &f,
                tracker.prev.get(&(f.slot, f.gen)).map(|p| &p.snap),
                &mut |ns| names.get(ns),
            );
        }
        if let Some(r) = tracker.flow_row(&f, epoch, names, &mut totals) {
            if keep_rows {
                tracker.early_rows.push((f.flow, r));
            }
        }
        closed.push((f.slot, f.gen, f.flow));
    })?;
    tracker.early_totals = totals;
    tracker.tracked = tracked; // a partial read: the interval's count stays
    for (slot, gen, _) in closed {
        view.forget(slot, gen)?;
        tracker.forget(slot, gen);
        tracker.closed_reported += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_takes_the_least_recently_active_down_to_three_quarters() {
        let mut t = Tracker::default();
        // 14 of 16 slots taken: at the 7/8 mark, nothing to do.
        let live: Vec<_> = (0..14).map(|i| (i, 1)).collect();
        assert!(t.to_evict(live, 16).is_empty());
        // 16 of 16: evict 4 (down to 12), the ones active longest ago.
        for i in 0..16u32 {
            let snap = Snapshot::of_sparse(&[], 0);
            let active = (16 - i) as u64;
            t.prev.insert(
                (i, 7),
                Stay {
                    snap,
                    active,
                    seen: 0,
                    side: Side::Client,
                },
            );
        }
        let live: Vec<_> = (0..16).map(|i| (i, 7)).collect();
        let ev = t.to_evict(live, 16);
        let slots: Vec<u32> = ev.iter().map(|e| e.0).collect();
        assert_eq!(slots, vec![15, 14, 13, 12]);
        assert!(ev.iter().all(|e| e.1 == 7));
    }

    /// A connection that takes the 4-tuple of a closed one still in the table (issue 26.4):
    /// each keeps its own snapshot (by slot and generation), and the interval's row holds the
    /// samples of both. Before, the new one's samples were subtracted from the old one's.
    #[test]
    fn a_reused_four_tuple_keeps_both_connections_samples() {
        let flow = Flow {
            netns: 1,
            local: "10.0.0.1:40000".parse().unwrap(),
            remote: "10.0.0.2:80".parse().unwrap(),
        };
        let stay = |slot: u32, gen: u32, n: u32, closed: bool| TcpFlowState {
            slot,
            gen,
            cookie: 0,
            cgroup: 0,
            workload: None,
            flow,
            side: Side::Client,
            origin: "established",
            state: 1,
            closed,
            srtt_fallback: false,
            samples: n as u64,
            counts: [(50u16, n)].into_iter().collect(),
            sum_us: 0,
            life_min_us: None,
            life_max_us: None,
            srtt_us: 0,
            last_rtt_us: 0,
            retrans: 0,
            win_epoch: 0,
            win_min_us: u32::MAX,
            win_max_us: 0,
        };
        let mut t = Tracker {
            keep_rows: true,
            ..Tracker::default()
        };
        let mut names = NsNames::new();
        let mut totals = SideTotals::new();
        // read 1: the old connection (slot 5) with 2 samples
        t.begin();
        t.flow_row(&stay(5, 1, 2, false), 0, &mut names, &mut totals);
        t.end();
        // read 2: it closed after 3 samples; the new one (slot 9) has 4
        t.begin();
        let mut totals = SideTotals::new();
        t.flow_row(&stay(5, 1, 3, true), 1, &mut names, &mut totals);
        let row = t
            .flow_row(&stay(9, 1, 4, false), 1, &mut names, &mut totals)
            .expect("a row");
        t.end();
        assert_eq!(
            totals[&Side::Client].count(),
            1 + 4,
            "this interval's samples"
        );
        assert_eq!(
            row.tcp.as_ref().unwrap().summary.n,
            1 + 4,
            "one row for both"
        );
        // read 3: the new one again, 2 more
        t.forget(5, 1);
        t.begin();
        let mut totals = SideTotals::new();
        t.flow_row(&stay(9, 1, 6, false), 2, &mut names, &mut totals);
        t.end();
        assert_eq!(totals[&Side::Client].count(), 2);
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
