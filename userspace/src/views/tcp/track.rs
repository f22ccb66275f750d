//! The TCP view as the session reads it ([`TcpView`], a
//! [`crate::views::view::View`]): each flow stay's histogram between reads
//! ([`Tracker`]), closed flows reported once and their slots given back,
//! the least recently active evicted when the table fills up, closed flows
//! kept for the end summary, and what later views ask of a 4-tuple (its
//! side, its owner).
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::Result;

use super::attach::Tcp;
use super::{TcpFlowState, TcpViewConfig};
use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::{Hist, Snapshot};
use crate::analysis::records::{EndFlow, EndView, FlowRow, ViewStats};
use crate::analysis::workload::Workload;
use crate::bpf::tcp::types::rttscope_tcp_counter as C;
use crate::sys::cgroup::CgroupIndex;
use crate::views::view::{
    Ask, Attached, Counters, Known, NsNames, ReadCtx, RunFlows, SeriesOf, SideTotals, View,
    ViewRead, Watched,
};
use crate::views::{HoldsAttached, PassiveView, ViewKind};

/// The attached TCP view and what the session keeps of it between reads.
pub struct TcpView {
    view: Box<Tcp>,
    tracker: Tracker,
    /// This read's flows with an owner (`--label-workload`), for later views.
    owners: HashMap<Flow, Arc<Workload>>,
    /// `--netns` namespaces and `--cgroup` (watched by the session).
    netns: Vec<crate::sys::netns::NetNs>,
    cgroup: Option<std::path::PathBuf>,
    /// `--all-netns` (the start line's hint).
    all_netns: bool,
    /// Listen-queue drops of the observed namespaces (their netstat).
    listen: super::listen::ListenDrops,
}

impl TcpView {
    /// The attached view, read by the session. `keep_rows`: build rows (not
    /// with --quiet); `keep_summary`: keep closed flows for the end summary
    /// (not in daemon mode: its memory must not grow with churn).
    pub(crate) fn new(
        view: Box<Tcp>,
        cfg: &TcpViewConfig,
        keep_rows: bool,
        keep_summary: bool,
    ) -> TcpView {
        TcpView {
            view,
            tracker: Tracker {
                keep_finished: keep_summary,
                keep_rows,
                ..Tracker::default()
            },
            owners: HashMap::new(),
            netns: cfg.netns_filter.clone(),
            cgroup: cfg.cgroup.clone(),
            all_netns: cfg.all_netns,
            listen: super::listen::ListenDrops::open(&cfg.iter_netns),
        }
    }

    /// One read of every flow (`View::read`): rows, totals, counters, handshakes; closed flows'
    /// slots given back, the least recently active evicted when few slots are left.
    fn read_flows(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<ViewRead> {
        let (tracker, owners) = (&mut self.tracker, &mut self.owners);
        owners.clear();
        let view = &mut self.view;
        let epoch = view.epoch();
        let mut totals = SideTotals::new();
        let (mut closed, mut live) = (Vec::new(), Vec::new());
        let collect_live = tracker.near_full(view.info().max_flows);
        tracker.closed_scanned = view.counter(C::RTTSCOPE_TCP_CLOSED);
        tracker.begin();
        // Closed flows freed early (the table was filling up) are reported
        // with this interval too; a row of this read for the same 4-tuple (a
        // new connection on it) replaces theirs and holds their samples too.
        for (flow, r) in tracker.early_rows.drain(..) {
            ctx.rows.insert(flow, r);
        }
        view.for_each_flow(&mut |mut f| {
            if let Some(idx) = ctx.workloads.as_mut() {
                own(idx, ctx.names, &mut f);
                if let Some(w) = &f.workload {
                    owners.insert(f.flow, w.clone());
                }
            }
            export(ctx, tracker, &f); // daemon mode
            if f.closed {
                closed.push((f.slot, f.gen));
            } else if collect_live {
                live.push((f.slot, f.gen));
            }
            if let Some(r) = tracker.flow_row(&f, epoch, ctx.names, &mut totals) {
                ctx.rows.insert(f.flow, r);
            }
        })?;
        tracker.end();
        view.next_epoch();
        for (side, h) in std::mem::take(&mut tracker.early_totals) {
            totals.entry(side).or_default().merge(&h);
        }
        self.give_back(closed, live)?;
        Ok(ViewRead {
            totals,
            counters: self.counters(ctx)?,
            hooks: Vec::new(),
            handshakes: std::mem::take(&mut self.tracker.handshakes),
        })
    }

    /// The view's counters as every record carries them.
    fn counters(&mut self, ctx: &ReadCtx<'_, '_>) -> Result<Counters> {
        let mut tc = self.view.counters()?;
        self.tracker.counters(&mut tc);
        let (overflows, drops) = self.listen.since_attach();
        tc.insert("handshake_listen_overflows", overflows);
        tc.insert("handshake_listen_drops", drops);
        Ok(ctx.finish_counters(tc))
    }

    /// Closed flows reported once (this interval), then their slots given
    /// back; with few slots left, the least recently active live flows
    /// evicted (their sockets take a new slot at their next sample).
    fn give_back(&mut self, closed: Vec<(u32, u32)>, live: Vec<(u32, u32)>) -> Result<()> {
        let (view, tracker) = (&mut self.view, &mut self.tracker);
        for (slot, gen) in closed {
            view.forget(slot, gen)?;
            tracker.forget(slot, gen);
            tracker.closed_reported += 1;
        }
        for (slot, gen) in tracker.to_evict(live, view.info().max_flows) {
            view.forget(slot, gen)?;
            tracker.forget(slot, gen);
            tracker.evicted += 1;
        }
        Ok(())
    }

    /// Between reports: when the table is filling up and a connection closed since the last
    /// scan, read the closed flows now and free their slots (their rows wait for the report).
    fn reclaim_if_due(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<()> {
        let cap = self.view.info().max_flows;
        let closed = self.view.counter(C::RTTSCOPE_TCP_CLOSED);
        // a scan of the whole table only when a connection closed since the last one: on a host
        // with 100,000 long-lived connections the table stays more than half taken, and reading
        // it 8 times per interval for nothing took most of the observer's idle CPU
        if closed != self.tracker.closed_scanned
            && self
                .tracker
                .reclaim_due(self.view.counter(C::RTTSCOPE_TCP_FLOWS_CREATED), cap)
        {
            self.tracker.closed_scanned = closed;
            reclaim_closed(self.view.as_mut(), &mut self.tracker, ctx)?;
        }
        Ok(())
    }

    /// Every flow still in the table and every flow that closed during the
    /// run, into `flows`, with their totals.
    fn whole_run(
        &self,
        ctx: &mut ReadCtx<'_, '_>,
        flows: &mut RunFlows,
        totals: &mut SideTotals,
    ) -> Result<()> {
        let (names, workloads) = (&mut *ctx.names, &mut *ctx.workloads);
        self.view.for_each_flow(&mut |mut f| {
            if let Some(idx) = workloads.as_mut() {
                own(idx, names, &mut f);
            }
            let h = self.tracker.whole(&f);
            totals.entry(f.side).or_default().merge(&h);
            let mut e = EndFlow::new(&f.flow, names.get(f.flow.netns), f.side);
            let mut r = FlowRow::new(&f.flow, e.netns_name.clone(), f.side);
            tcp_whole_run(&mut e, &mut r, &h, (f.srtt_us, f.retrans, f.handshake_us));
            e.origin = Some(f.origin.into());
            r.origin = e.origin.clone();
            (e.closed, r.closed) = (Some(f.closed), f.closed);
            e.workload = f.workload.clone();
            r.workload = f.workload.clone();
            flows.insert(f.flow, (e, r));
        })?;
        for (flow, fin) in &self.tracker.finished {
            if flows.contains_key(flow) {
                continue; // the same 4-tuple, open again at the end
            }
            totals.entry(fin.side).or_default().merge(&fin.hist);
            let mut e = EndFlow::new(flow, fin.netns_name.clone(), fin.side);
            let mut r = FlowRow::new(flow, fin.netns_name.clone(), fin.side);
            let at_end = (fin.srtt_us, fin.retrans, fin.handshake_us);
            tcp_whole_run(&mut e, &mut r, &fin.hist, at_end);
            e.origin = Some(fin.origin.into());
            r.origin = e.origin.clone();
            (e.closed, r.closed) = (Some(true), true);
            e.workload = fin.workload.clone();
            r.workload = fin.workload.clone();
            flows.insert(*flow, (e, r));
        }
        Ok(())
    }
}

/// Its programs, counters and raw samples: the attached view's.
impl HoldsAttached for TcpView {
    fn attached_object(&self) -> &dyn PassiveView {
        self.view.as_ref()
    }

    fn attached_object_mut(&mut self) -> &mut dyn PassiveView {
        self.view.as_mut()
    }
}

impl View for TcpView {
    /// Its hook, settings and notes; the namespaces and cgroup the session watches.
    fn attached(&self) -> Result<Attached> {
        let info = self.view.info();
        let netns: Vec<&str> = self.netns.iter().map(|n| n.name.as_str()).collect();
        let settings = serde_json::to_value(info)?;
        Ok(Attached {
            start: Some(settings.clone()),
            notes: super::lines::start_lines(&netns, self.all_netns, info),
            log: super::lines::attach_lines(info),
            hook: Some(info.hook.clone()),
            series: series(),
            watched: Watched {
                netns: Some(self.netns.clone()),
                cgroup: self.cgroup.clone(),
                cgroup_loss: "the TCP view attached to it sees no new connections",
                ..Watched::default()
            },
            ..Attached::new(ViewKind::Tcp, self.header(), settings, closing)
        })
    }

    /// Free closed flows' slots early; fold the fine-histogram pool in when busy.
    fn between_reads(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<()> {
        self.reclaim_if_due(ctx)?;
        self.view.drain_pool_if_busy()
    }

    fn switch_generation(&mut self) -> Result<bool> {
        self.view.switch_pool()?;
        Ok(true)
    }

    /// Rows, totals, counters, the handshakes since the last read; closed flows' slots given
    /// back, the least recently active evicted when few slots are left. The window's start: one
    /// read whose samples are left out, closed flows not kept for the whole run, each open stay's
    /// histogram kept to be taken off its whole run.
    fn read(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<ViewRead> {
        if !ctx.window_start {
            return self.read_flows(ctx);
        }
        let keep = std::mem::replace(&mut self.tracker.keep_finished, false);
        let r = self.read_flows(ctx);
        self.tracker.keep_finished = keep;
        let t = &mut self.tracker;
        t.base = t.prev.iter().map(|(k, p)| (*k, p.snap.clone())).collect();
        r
    }

    fn summary(&mut self, ctx: &mut ReadCtx<'_, '_>, flows: &mut RunFlows) -> Result<ViewRead> {
        let mut totals = SideTotals::new();
        self.whole_run(ctx, flows, &mut totals)?;
        let mut counters = self.counters(ctx)?;
        counters.insert("summary_flows_dropped", self.tracker.finished_dropped);
        Ok(ViewRead {
            totals,
            counters,
            hooks: Vec::new(),
            handshakes: std::mem::take(&mut self.tracker.handshakes),
        })
    }

    fn knows(&self, ask: Ask<'_>) -> Known {
        match ask {
            Ask::Flow(flow) => Known {
                side: Some(self.tracker.side_of(flow)).filter(|s| *s != Side::Unknown),
                owner: self.owners.get(flow).cloned(),
                ..Known::default()
            },
            Ask::Ends => Known {
                by_ends: self
                    .tracker
                    .sides
                    .keys()
                    .map(|f| ((f.local, f.remote), *f))
                    .collect(),
                ..Known::default()
            },
        }
    }

    fn retransmissions(&self, keep: &dyn Fn(&Flow) -> bool) -> Result<u64> {
        let mut retrans = 0u64;
        self.view.for_each_flow(&mut |f| {
            if keep(&f.flow) {
                retrans += f.retrans as u64;
            }
        })?;
        Ok(retrans)
    }
}

/// Its series in a report: client and server.
fn series() -> Vec<SeriesOf> {
    let settings = serde_json::json!({"hook": "sock_ops RTT_CB"});
    vec![
        SeriesOf {
            side: Side::Client,
            label: "client",
            what: "TCP's RTT samples (sock_ops RTT_CB), connecting side".into(),
            settings: settings.clone(),
        },
        SeriesOf {
            side: Side::Server,
            label: "server",
            what: "TCP's RTT samples, responding side (visible on this host)".into(),
            settings,
        },
    ]
}

impl TcpView {
    /// Its part of the table's header.
    fn header(&self) -> String {
        let netns: Vec<&str> = self.netns.iter().map(|n| n.name.as_str()).collect();
        format!(
            "sock_ops @ cgroup {}, rtt source: {}, netns {}",
            self.view.info().cgroup,
            self.view.info().rtt_source_short(),
            if netns.is_empty() {
                "all".to_string()
            } else {
                netns.join(",")
            }
        )
    }
}

/// Its part of the table's closing line.
fn closing(c: &Counters) -> String {
    let get = |k: &str| c.get(k).copied().unwrap_or(0);
    format!(
        "{}, {} created, {} flow-map-full, {} raw dropped",
        crate::analysis::units::count(get("samples"), "sample"),
        crate::analysis::units::count(get("flows_created"), "flow"),
        get("flow_map_full"),
        get("raw_events_dropped")
    )
}

/// The most closed flows the end summary keeps (a connection churn of hours
/// must not grow the observer without bound).
pub const MAX_FINISHED: usize = 65_536;

/// A flow that closed during the run, as the end summary reports it.
struct Finished {
    hist: Hist,
    handshake_us: Option<u32>,
    srtt_us: u32,
    retrans: u32,
    side: Side,
    origin: &'static str,
    netns_name: String,
    workload: Option<Arc<Workload>>,
}

/// Fill a TCP flow's owner; a network namespace with no other name is named
/// by the pod or container that holds it.
fn own(idx: &mut CgroupIndex, names: &mut NsNames, f: &mut TcpFlowState) {
    f.workload = idx.get(f.cgroup);
    if let Some(n) = f.workload.as_ref().and_then(|w| w.netns_name()) {
        names.set_owner(f.flow.netns, n);
    }
}

/// The TCP view's whole run of a flow, into its end-record entry and its row.
fn tcp_whole_run(e: &mut EndFlow, r: &mut FlowRow, h: &Hist, at_end: (u32, u32, Option<u32>)) {
    let (srtt_us, retrans, handshake_us) = at_end;
    let mut v = EndView::of(h);
    (v.srtt_us, v.retrans, v.handshake_us) = (Some(srtt_us), Some(retrans), handshake_us);
    e.views.set(ViewKind::Tcp, v);
    let mut vs = ViewStats::from_hist(h);
    (vs.srtt_us, vs.retrans, vs.handshake_us) = (Some(srtt_us), Some(retrans), handshake_us);
    r.views.set(ViewKind::Tcp, vs);
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
pub(super) struct Tracker {
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
    prev: crate::views::fine::SlotMap<(u32, u32), Stay>,
    /// The stays open when the window started, their histogram then (left out of the whole run).
    base: crate::views::fine::SlotMap<(u32, u32), Snapshot>,
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
    /// Handshake RTTs of the stays new since the last report (each connection's once), by side.
    handshakes: SideTotals,
    /// Connections open before attach: no handshake seen.
    hs_before_attach: u64,
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
        let hist = self.whole(f);
        if let Some(e) = self.finished.get_mut(&f.flow) {
            e.hist.merge(&hist);
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
                hist,
                handshake_us: f.handshake_us,
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
        tc.insert("handshakes_before_attach", self.hs_before_attach);
    }

    /// A new stay's handshake RTT into this read's handshakes (one per connection); a
    /// connection open before attach has none (`handshakes_before_attach`).
    fn handshake(&mut self, f: &TcpFlowState) {
        match f.handshake_us {
            Some(us) => self.handshakes.entry(f.side).or_default().record(us),
            None if f.origin == "existing" => self.hs_before_attach += 1,
            None => {}
        }
    }

    /// A stay's samples since the window started.
    fn whole(&self, f: &TcpFlowState) -> Hist {
        f.since(self.base.get(&(f.slot, f.gen)))
    }

    fn forget(&mut self, slot: u32, gen: u32) {
        self.prev.remove(&(slot, gen));
        self.base.remove(&(slot, gen));
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
        let first = self.mark_seen(f)?;
        if first {
            self.handshake(f);
        }
        self.sides.insert(f.flow, (f.side, (f.slot, f.gen)));
        let delta = self.added(f, epoch, first);
        self.remember(f, first, delta.count());
        if delta.count() == 0 && !first && !f.closed {
            return None;
        }
        totals.entry(f.side).or_default().merge(&delta);
        if !self.keep_rows {
            return None; // nothing prints rows (--quiet, the daemon): none built
        }
        Some(self.row(f, names, &delta))
    }

    /// Count the flow as tracked and mark its stay seen by this read. `None`: a stay already
    /// known that is idle (most of them on a busy host), with nothing to add or keep again;
    /// else whether the stay is new.
    fn mark_seen(&mut self, f: &TcpFlowState) -> Option<bool> {
        let stay = (f.slot, f.gen);
        let read = self.interval;
        self.tracked += 1;
        let first = !self.prev.contains_key(&stay);
        if let Some(p) = self.prev.get_mut(&stay) {
            p.seen = read;
            if !f.closed && p.side == f.side && p.snap.unchanged(&f.counts, f.sum_us) {
                return None;
            }
        }
        Some(first)
    }

    /// The samples the stay added since the last read kept it, with their range: the kernel's
    /// window when it is of this `epoch`, else for a new stay its lifetime's.
    fn added(&self, f: &TcpFlowState, epoch: u32, first: bool) -> Hist {
        let mut delta = f.since(self.prev.get(&(f.slot, f.gen)).map(|p| &p.snap));
        if delta.count() > 0 && f.win_epoch == epoch && f.win_min_us <= f.win_max_us {
            delta.set_range(Some(f.win_min_us), Some(f.win_max_us));
        } else if first && delta.count() > 0 {
            delta.set_range(f.life_min_us, f.life_max_us);
        }
        delta
    }

    /// Keep the stay's histogram for the next read, with the read of its last sample (this one
    /// unless the stay was known and `added` no sample).
    fn remember(&mut self, f: &TcpFlowState, first: bool, added: u64) {
        let stay = (f.slot, f.gen);
        let active = match self.prev.get(&stay) {
            Some(p) if !first && added == 0 => p.active,
            _ => self.interval,
        };
        let snap = Snapshot::of_sparse(&f.counts, f.sum_us);
        let (seen, side) = (self.interval, f.side);
        self.prev.insert(
            stay,
            Stay {
                snap,
                active,
                seen,
                side,
            },
        );
    }

    /// The flow's row: its samples this interval so far (`delta` merged into what its 4-tuple's
    /// earlier stays and reads added) with its srtt and retransmissions, origin, state and workload.
    fn row(&mut self, f: &TcpFlowState, names: &mut NsNames, delta: &Hist) -> FlowRow {
        let merged = self.row_deltas.entry(f.flow).or_default();
        merged.merge(delta);
        let mut vs = ViewStats::from_hist(merged);
        vs.srtt_us = Some(f.srtt_us);
        vs.retrans = Some(f.retrans);
        vs.handshake_us = f.handshake_us;
        let mut row = FlowRow::new(&f.flow, names.get(f.flow.netns), f.side);
        row.origin = Some(f.origin.into());
        row.state = Some(super::state_name(f.state).into());
        row.closed = f.closed;
        row.views.set(ViewKind::Tcp, vs);
        row.workload = f.workload.clone();
        row
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

/// A flow's samples since the last read, to the sink (daemon mode), if any.
fn export(ctx: &mut ReadCtx<'_, '_>, tracker: &Tracker, f: &TcpFlowState) {
    if ctx.sink.is_some() {
        let delta = f.since(tracker.prev.get(&(f.slot, f.gen)).map(|p| &p.snap));
        ctx.export(
            ViewKind::Tcp,
            &f.flow,
            f.side,
            f.workload.as_deref(),
            &delta,
        );
    }
}

/// Read the TCP view's table between reports and free the slots of closed
/// flows now, keeping their rows (and exporting their samples in daemon
/// mode) for the interval's report.
fn reclaim_closed(view: &mut Tcp, tracker: &mut Tracker, ctx: &mut ReadCtx<'_, '_>) -> Result<()> {
    let epoch = view.epoch();
    let tracked = tracker.tracked;
    let mut closed = Vec::new();
    let mut totals = std::mem::take(&mut tracker.early_totals);
    view.for_each_flow(&mut |f| {
        if !f.closed {
            return;
        }
        export(ctx, tracker, &f);
        if let Some(r) = tracker.flow_row(&f, epoch, ctx.names, &mut totals) {
            tracker.early_rows.push((f.flow, r));
        }
        closed.push((f.slot, f.gen));
    })?;
    tracker.early_totals = totals;
    tracker.tracked = tracked; // a partial read: the interval's count stays
    for (slot, gen) in closed {
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
            tunnel: Default::default(),
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
            handshake_us: None,
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
            row.views.get(ViewKind::Tcp).unwrap().summary.n,
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
