//! An observing session: the views asked for, attached, in registry order
//! (`views::VIEWS`), each behind one interface (`views::view::View`);
//! one read per interval (each flow's samples since the previous read,
//! totals, counters); what disappears watched. It prints nothing:
//! `cmd::observe` drives it and hands what it reads to the sinks (table,
//! JSON Lines, Prometheus). Nothing here names a view.
use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;

use crate::analysis::flow::Flow;
use crate::analysis::hist::Hist;
use crate::analysis::peers::{PeerFile, PeerNames};
use crate::analysis::records::{self, EndFlow, Name};
use crate::sys::cgroup::CgroupIndex;
use crate::views::view::{Attached, ReadCtx, RunFlows, View, ViewRead};
use crate::views::{AttachOpts, LoaderKind, PassiveView, ViewConfig, ViewKind};

pub use crate::analysis::records::{FlowRow, Interval, ViewStats};
pub(crate) use crate::views::names::NsNames;
pub use crate::views::view::{FlowDelta, FlowSink, SideTotals};

mod raw;
#[cfg(test)]
mod tests;
mod watch;
pub use crate::views::{RawEvent, RawSample};

/// What to attach.
pub struct SessionConfig {
    pub loader: LoaderKind,
    /// The views asked for, with their settings (attached in this order).
    pub views: Vec<Box<dyn ViewConfig>>,
    /// Build per-flow rows (nothing prints them with --quiet).
    pub keep_rows: bool,
    /// `--label-workload`: name each flow's owner from its socket's cgroup.
    pub workloads: bool,
    /// Keep closed flows for the whole-run summary (daemon mode exports per
    /// interval and keeps none: its memory must not grow with churn).
    pub keep_summary: bool,
    /// Read every view's raw samples ([`Session::drain_raw`]): each view is
    /// loaded with its raw-sample ring buffer on. Attach must then run
    /// inside a tokio runtime.
    pub raw_samples: bool,
}

impl SessionConfig {
    /// With raw samples asked for, every view asked for is loaded with its
    /// raw-sample ring buffer on.
    fn with_raw_views(mut self) -> SessionConfig {
        if self.raw_samples {
            for v in self.views.iter_mut() {
                v.set_raw();
            }
        }
        self
    }
}

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

/// One interval's read: the report, each view's total histogram and its handshakes by side.
pub struct IntervalRead {
    pub interval: Interval,
    pub totals_hist: BTreeMap<&'static str, Hist>,
    pub handshakes: BTreeMap<ViewKind, SideTotals>,
}

/// The attached views and what they share between reads.
pub struct Session {
    views: Vec<Box<dyn View>>,
    /// What each view attached, as it said once after attach (in the same order).
    attached: Vec<Attached>,
    names: NsNames,
    keep_rows: bool,
    watch: watch::Watch,
    /// Socket cgroups to owners (`--label-workload`).
    workloads: Option<CgroupIndex>,
    /// Each view's `samples_not_binned` when last said (session order).
    not_binned: Vec<u64>,
    /// The views' raw-sample streams (`SessionConfig::raw_samples`).
    raw: raw::RawStreams,
    /// Each view's samples taken before the window started (session order), and when it
    /// started (CLOCK_MONOTONIC ns): [`Session::start_window`].
    before_window: Vec<u64>,
    window_mono_ns: u64,
    /// How long the window start's reads took (ns).
    window_read_ns: u64,
    /// Each view's handshakes of the whole run, by side (a few histograms: bounded).
    handshakes: BTreeMap<ViewKind, SideTotals>,
    /// `--names`: the remote addresses' names in rows and end flows (issue 45).
    peers: Option<Arc<PeerFile>>,
}

impl Session {
    /// Load and attach the views asked for, in registry order.
    pub fn attach(cfg: SessionConfig) -> Result<Session> {
        let mut cfg = cfg.with_raw_views();
        cfg.views.sort_by_key(|v| v.def().kind);
        let how = AttachOpts {
            loader: cfg.loader,
            keep_rows: cfg.keep_rows,
            keep_summary: cfg.keep_summary,
            workloads: cfg.workloads,
        };
        let mut views = Vec::new();
        for v in &cfg.views {
            views.push(v.attach(&how)?);
        }
        Session::of_views(views, &cfg)
    }

    /// A session over views already attached, in registry order (`cfg.views` is not read).
    pub(crate) fn of_views(mut views: Vec<Box<dyn View>>, cfg: &SessionConfig) -> Result<Session> {
        let raw = raw::RawStreams::open(
            cfg.raw_samples,
            views
                .iter_mut()
                .map(|v| v.as_mut() as &mut dyn PassiveView)
                .collect(),
        )?;
        let mut attached = views
            .iter()
            .map(|v| v.attached())
            .collect::<Result<Vec<_>>>()?;
        let mut session = Session {
            watch: watch::Watch::new(&mut attached),
            attached,
            not_binned: vec![0; views.len()],
            before_window: vec![0; views.len()],
            window_mono_ns: 0,
            window_read_ns: 0,
            handshakes: BTreeMap::new(),
            views,
            names: NsNames::new(),
            keep_rows: cfg.keep_rows,
            workloads: cfg.workloads.then(workload_index),
            raw,
            peers: None,
        };
        session.start_window()?;
        Ok(session)
    }

    /// Every view's first window starts now, when the last one is attached (issue 45): what
    /// each view took before (a view attached earlier counts from its own attach, half a second
    /// or more before the last one's programs are verified) is read once and left out of the
    /// intervals, the whole run and the raw samples, and counted in its `samples_before_window`.
    fn start_window(&mut self) -> Result<()> {
        self.window_mono_ns = crate::sys::clock::mono_ns();
        self.switch_generations()?;
        let mut rows = BTreeMap::new();
        let mut before = Vec::new();
        self.each_view(&mut rows, None, true, &mut |v, ctx| {
            // its handshakes before the window are left out too
            before.push(v.read(ctx)?.samples());
            Ok(())
        })?;
        self.before_window = before;
        self.window_read_ns = crate::sys::clock::mono_ns().saturating_sub(self.window_mono_ns);
        Ok(())
    }

    /// CLOCK_MONOTONIC ns when every view's window started.
    pub fn window_start_ns(&self) -> u64 {
        self.window_mono_ns
    }

    /// How long the reads of the window's start took (each view's window starts in this span
    /// after [`Session::window_start_ns`]), in seconds.
    pub fn window_read_s(&self) -> f64 {
        self.window_read_ns as f64 / 1e9
    }

    /// Name the remote addresses of rows and end flows from this file (`--names`), re-read
    /// when it changes (looked at once per interval).
    pub fn set_peer_names(&mut self, peers: Arc<PeerFile>) {
        self.peers = Some(peers);
    }

    /// The names in force (the file looked at again first), when `--names` was given.
    fn peer_names(&self) -> Option<Arc<PeerNames>> {
        let p = self.peers.as_ref()?;
        p.poll();
        Some(p.current())
    }

    /// The attached views, in registry order.
    pub fn views(&self) -> &[Box<dyn View>] {
        &self.views
    }

    /// What each attached view attached, in registry order.
    pub fn attached(&self) -> &[Attached] {
        &self.attached
    }

    /// An attached view by kind.
    pub fn view(&self, kind: ViewKind) -> Option<&dyn View> {
        self.views
            .iter()
            .find(|v| v.kind() == kind)
            .map(|v| v.as_ref())
    }

    /// Whether any view is attached.
    pub fn has_views(&self) -> bool {
        !self.views.is_empty()
    }

    /// Once per interval: the observed namespaces, cgroups and interfaces
    /// that disappeared since the last call, one notice each (counted in
    /// the views' `netns_vanished`, `cgroup_vanished`, `ifaces_vanished`),
    /// and the samples a view left out of its histograms.
    pub fn check_vanished(&mut self) -> Vec<String> {
        let mut notices = self.watch.check();
        notices.extend(self.not_binned_notices());
        notices.extend(self.view_notices());
        notices
    }

    /// What the views have to say since the last call (a hook that went blind, a program now
    /// ahead of one; right after attach: what already runs ahead), one line each.
    pub fn view_notices(&mut self) -> Vec<String> {
        self.views.iter_mut().flat_map(|v| v.notices()).collect()
    }

    /// Samples a view left out of its histograms since the last call (more
    /// flows with samples in one read than its fine-histogram pool and
    /// overflow ring hold: `samples_not_binned`), one notice per view.
    fn not_binned_notices(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, v) in self.views.iter().enumerate() {
            let now = v
                .counters()
                .ok()
                .and_then(|c| c.get("samples_not_binned").copied())
                .unwrap_or(0);
            let new = now.saturating_sub(self.not_binned[i]);
            if new > 0 {
                out.push(format!(
                    "{new} samples of the {} view were left out of its histograms (counted in samples_not_binned): more flows had samples between two reads than its fine-histogram pool and overflow ring hold (docs/metrics.md, \"Kernel memory\"); a shorter --interval or a larger --max-flows holds more",
                    v.kind().as_str()
                ));
            }
            self.not_binned[i] = now;
        }
        out
    }

    /// Run `f` on each view in order with its read context (the views
    /// before it to ask, the rows so far, the sink; `window_start`: the window's start).
    fn each_view<'s>(
        &mut self,
        rows: &mut BTreeMap<Flow, FlowRow>,
        mut sink: Option<&mut (dyn FlowSink + 's)>,
        window_start: bool,
        f: &mut dyn FnMut(&mut dyn View, &mut ReadCtx<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        for i in 0..self.views.len() {
            let (earlier, rest) = self.views.split_at_mut(i);
            let kind = rest[0].kind();
            let mut ctx = ReadCtx {
                names: &mut self.names,
                workloads: &mut self.workloads,
                keep_rows: self.keep_rows,
                rows: &mut *rows,
                sink: sink.as_deref_mut(),
                earlier,
                watched: self.watch.counters(i),
                raw_bad: self.raw.bad_records(kind),
                window_start,
            };
            f(rest[0].as_mut(), &mut ctx)?;
        }
        Ok(())
    }

    /// Between reports (several times per interval): each view keeps up with
    /// a busy kernel side (closed flows' slots freed early, their rows kept
    /// for the report; fine-histogram pools folded in when half taken).
    pub fn between_reads<'s>(&mut self, sink: Option<&mut (dyn FlowSink + 's)>) -> Result<()> {
        let mut rows = BTreeMap::new();
        self.each_view(&mut rows, sink, false, &mut |v, ctx| v.between_reads(ctx))
    }

    /// Every view's edge at once: each starts its next generation, then one wait for the
    /// programs still on the old ones ([`View::switch_generation`]); the reads that follow take
    /// the generation switched from, one view after the other.
    fn switch_generations(&mut self) -> Result<()> {
        let mut switched = false;
        for v in &mut self.views {
            switched |= v.switch_generation()?;
        }
        if switched {
            crate::views::fine::wait_for_programs();
        }
        Ok(())
    }

    /// One interval: read each view in order (each starts its next epoch), all from the same
    /// edge ([`Session::switch_generations`]).
    pub fn read_interval<'s>(
        &mut self,
        sink: Option<&mut (dyn FlowSink + 's)>,
    ) -> Result<IntervalRead> {
        self.switch_generations()?;
        let mut rows: BTreeMap<Flow, FlowRow> = BTreeMap::new();
        let mut reads: Vec<(ViewKind, ViewRead)> = Vec::new();
        self.each_view(&mut rows, sink, false, &mut |v, ctx| {
            reads.push((v.kind(), v.read(ctx)?));
            Ok(())
        })?;
        if let Some(n) = self.peer_names() {
            for (f, row) in rows.iter_mut() {
                row.remote_name = n.name(f.remote).map(str::to_string);
            }
        }
        let (mut totals, mut counters, mut totals_hist) =
            (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let (mut handshakes, mut hs_stats, mut hooks) =
            (BTreeMap::new(), BTreeMap::new(), Vec::new());
        for (i, (kind, mut r)) in reads.into_iter().enumerate() {
            hooks.append(&mut r.hooks);
            if !r.handshakes.is_empty() {
                let run = self.handshakes.entry(kind).or_default();
                for (side, h) in &r.handshakes {
                    run.entry(*side).or_default().merge(h);
                }
                hs_stats.insert(kind.as_str().into(), side_stats(&r.handshakes));
                handshakes.insert(kind, r.handshakes);
            }
            r.counters
                .insert("samples_before_window", self.before_window[i]);
            counters.insert(kind.as_str().into(), records::names(r.counters));
            totals.insert(kind.as_str().into(), side_stats(&r.totals));
            totals_hist.insert(kind.as_str(), merged(&r.totals));
        }
        Ok(IntervalRead {
            interval: Interval {
                t: 0.0,
                ts: 0.0,
                interval_s: 0.0,
                read_s: None,
                flows: rows.into_values().collect(),
                totals,
                counters,
                hooks,
                handshakes: hs_stats,
            },
            totals_hist,
            handshakes,
        })
    }

    /// Every raw sample available now, of every view (in attach order),
    /// without waiting; returns how many records were read (bad ones
    /// included). Nothing when raw samples were not asked for.
    pub fn drain_raw(&mut self, out: &mut Vec<RawSample>) -> Result<usize> {
        let from = out.len();
        let n = self.raw.drain_now(out)?;
        // samples taken before the window started: counted in samples_before_window
        let start = self.window_mono_ns;
        let mut new = out.split_off(from);
        new.retain(|s| s.event != RawEvent::Rtt || s.ts_ns >= start);
        out.append(&mut new);
        raw::resolve_sides(&mut self.views, &mut out[from..]);
        Ok(n)
    }

    /// Wait until some view's raw samples arrive, then take every one
    /// available ([`Session::drain_raw`]). Never returns when raw samples were
    /// not asked for. Cancel-safe: nothing is read before the wait ends.
    pub async fn next_raw(&mut self, out: &mut Vec<RawSample>) -> Result<usize> {
        loop {
            self.raw.readable().await?;
            let n = self.drain_raw(out)?;
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// Every view's raw records that were too short or that it could not
    /// decode, together (0 when raw samples are not read).
    pub fn raw_records_bad_total(&self) -> u64 {
        self.raw.bad_total()
    }

    /// The whole run, per flow: every flow still in the views' tables and
    /// every flow that closed during the run (`closed: true`), as the `end`
    /// record's flows and as rows for the closing table; each view's counters.
    pub fn summary(&mut self) -> Result<WholeRun> {
        let mut flows = RunFlows::new();
        let (mut totals, mut counters) = (BTreeMap::new(), BTreeMap::new());
        let mut rows = BTreeMap::new();
        let before = self.before_window.clone();
        let (mut i, mut hooks, mut last) = (0, Vec::new(), Vec::new());
        self.each_view(&mut rows, None, false, &mut |v, ctx| {
            let mut r = v.summary(ctx, &mut flows)?;
            hooks.append(&mut r.hooks);
            // the last interval's handshakes not read yet
            last.push((v.kind(), std::mem::take(&mut r.handshakes)));
            if !r.totals.is_empty() {
                totals.insert(v.kind().as_str(), r.totals);
            }
            r.counters.insert("samples_before_window", before[i]);
            i += 1;
            counters.insert(v.kind().as_str(), r.counters);
            Ok(())
        })?;
        if let Some(n) = self.peer_names() {
            for (f, (e, row)) in flows.iter_mut() {
                let name = n.name(f.remote).map(str::to_string);
                (e.remote_name, row.remote_name) = (name.clone(), name);
            }
        }
        let (end_flows, rows): (Vec<EndFlow>, Vec<FlowRow>) = flows.into_values().unzip();
        for (kind, hs) in last {
            let run = self.handshakes.entry(kind).or_default();
            for (side, h) in hs {
                run.entry(side).or_default().merge(&h);
            }
        }
        self.handshakes.retain(|_, t| !t.is_empty());
        Ok(WholeRun {
            flows: end_flows,
            rows,
            totals,
            counters,
            hooks,
            handshakes: self.handshakes.clone(),
        })
    }
}

/// The whole run (see [`Session::summary`]): its flows and counters, not a statistics summary
/// (that is [`crate::analysis::stats::Summary`]).
pub struct WholeRun {
    /// The `end` record's flows.
    pub flows: Vec<EndFlow>,
    /// The same flows as rows (whole-run statistics) for the closing table.
    pub rows: Vec<FlowRow>,
    /// Each view's whole run, per side.
    pub totals: BTreeMap<&'static str, SideTotals>,
    pub counters: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    /// Each view's hooks at the last check.
    pub hooks: Vec<records::HookStatus>,
    /// Each view's handshakes of the whole run, by side.
    pub handshakes: BTreeMap<ViewKind, SideTotals>,
}

impl WholeRun {
    /// The rows as an interval report (totals per side) for the table.
    pub fn as_interval(&self, t: f64) -> Interval {
        Interval {
            t,
            ts: 0.0,
            interval_s: t,
            read_s: None,
            flows: self.rows.clone(),
            totals: self
                .totals
                .iter()
                .map(|(v, t)| (Name::from(*v), side_stats(t)))
                .collect(),
            counters: records::counters(&self.counters),
            hooks: self.hooks.clone(),
            handshakes: self
                .handshakes
                .iter()
                .map(|(v, t)| (Name::from(v.as_str()), side_stats(t)))
                .collect(),
        }
    }
}

/// The index of socket cgroups, at the cgroup v2 root (`--label-workload`).
fn workload_index() -> CgroupIndex {
    let root = crate::sys::preflight::cgroup2_mount().unwrap_or_else(|| "/sys/fs/cgroup".into());
    CgroupIndex::new(root)
}
