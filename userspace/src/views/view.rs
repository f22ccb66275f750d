//! The one interface the session reads every view through ([`View`]):
//! attached by the registry (`views/mod.rs`), read once per interval into
//! the interval's rows, totals and counters, read whole at the end, and
//! stopped by being dropped (its links and programs go with it). A view
//! knows its own flows; what one view learns that a later one can use (the
//! side TCP found for a 4-tuple, the owner of its socket) it answers through
//! [`View::knows`], asked through [`ReadCtx`]. What it attached it says once ([`Attached`]),
//! and the sinks render that.
//!
//! Nothing here names a view: the session holds a list of `Box<dyn View>`
//! in registry order, and rows, sinks and records take any view by its kind.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;

use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::Hist;
use crate::analysis::records::{EndFlow, FlowRow};
use crate::analysis::workload::Workload;
use crate::sys::cgroup::CgroupIndex;
use crate::views::{PassiveView, ViewKind};

pub use crate::views::names::NsNames;

/// One view's samples of an interval (or of the whole run) by side: the two
/// ends of a connection see different RTTs, a total over both would
/// describe neither.
pub type SideTotals = BTreeMap<Side, Hist>;

/// A view's counters by name (kernel counters summed over CPUs, plus what
/// userspace derives).
pub type Counters = BTreeMap<&'static str, u64>;

/// Where each flow's new samples go as they are read (daemon mode's
/// exporter), besides the interval's rows.
pub trait FlowSink {
    /// One flow's samples since the previous read (never empty).
    /// `owner`: the flow's workload (`--label-workload`), when known.
    fn flow_delta(&mut self, view: ViewKind, d: &FlowDelta<'_>);
}

/// One flow's samples since the previous read, as a view hands them to a [`FlowSink`].
pub struct FlowDelta<'a> {
    pub flow: &'a Flow,
    pub side: Side,
    pub netns_name: &'a str,
    pub owner: Option<&'a Workload>,
    pub delta: &'a Hist,
    /// A NATed connection: its tuple as translated on the wire (the sampler's; issue 45).
    pub translated: Option<&'a Flow>,
}

/// What a view reads into, besides its own state: shared by every view of
/// the session, and the views read before this one (registry order) to ask.
pub struct ReadCtx<'a, 's> {
    /// Network namespace names (decided once per namespace for the run).
    pub names: &'a mut NsNames,
    /// Socket cgroups to owners (`--label-workload`), None when off.
    pub workloads: &'a mut Option<CgroupIndex>,
    /// Build per-flow rows (nothing prints them with --quiet, the daemon).
    pub keep_rows: bool,
    /// The interval's rows by flow: a view fills its own column of a row
    /// ([`ReadCtx::row`]), the first view to see a flow makes the row.
    pub rows: &'a mut BTreeMap<Flow, FlowRow>,
    /// Daemon mode's exporter.
    pub sink: Option<&'a mut (dyn FlowSink + 's)>,
    /// The views read before this one, to ask what they know of a flow.
    pub earlier: &'a [Box<dyn View>],
    /// What the session's watch counted for this view (`netns_vanished`, ...).
    pub watched: Counters,
    /// Records of this view's raw-sample stream it could not decode (only
    /// when raw samples were asked for).
    pub raw_bad: Option<u64>,
    /// This read is the start of every view's first window (issue 45), once, when the last view
    /// is attached: the session leaves what it returns out of the intervals (counted in
    /// `samples_before_window`), and a view that keeps a whole run of its own leaves it out of
    /// that too (a view that does nothing about it: its samples are left out of the intervals
    /// only).
    pub window_start: bool,
}

impl ReadCtx<'_, '_> {
    /// What the views read before this one found for a flow's side (Unknown: none did).
    pub fn side_of(&self, flow: &Flow) -> Side {
        self.earlier
            .iter()
            .find_map(|v| v.knows(Ask::Flow(flow)).side)
            .unwrap_or(Side::Unknown)
    }

    /// The owner the views read before this one found for a flow (this read).
    pub fn owner_of(&self, flow: &Flow) -> Option<Arc<Workload>> {
        self.earlier
            .iter()
            .find_map(|v| v.knows(Ask::Flow(flow)).owner)
    }

    /// The flows the views read before this one know, by their ends ([`Ask::Ends`]).
    pub fn flows_by_ends(&self) -> impl Iterator<Item = ((SocketAddr, SocketAddr), Flow)> + '_ {
        self.earlier.iter().flat_map(|v| v.knows(Ask::Ends).by_ends)
    }

    /// A flow's row for this read, made with its 4-tuple, namespace name and side when this view
    /// is the first to see it.
    pub fn row(&mut self, flow: &Flow, side: Side) -> &mut FlowRow {
        let names = &mut *self.names;
        self.rows
            .entry(*flow)
            .or_insert_with(|| FlowRow::new(flow, names.get(flow.netns), side))
    }

    /// Hand a flow's samples since the previous read to the sink, if any (empty ones are not).
    pub fn export(
        &mut self,
        view: ViewKind,
        flow: &Flow,
        side: Side,
        owner: Option<&Workload>,
        delta: &Hist,
    ) {
        self.export_translated(view, flow, side, owner, delta, None)
    }

    /// [`ReadCtx::export`] of a NATed connection's samples: `translated`, its tuple on the wire.
    pub fn export_translated(
        &mut self,
        view: ViewKind,
        flow: &Flow,
        side: Side,
        owner: Option<&Workload>,
        delta: &Hist,
        translated: Option<&Flow>,
    ) {
        if delta.count() == 0 {
            return;
        }
        if let Some(s) = self.sink.as_deref_mut() {
            let netns_name = self.names.get(flow.netns);
            s.flow_delta(
                view,
                &FlowDelta {
                    flow,
                    side,
                    netns_name: &netns_name,
                    owner,
                    delta,
                    translated,
                },
            );
        }
    }

    /// This view's counters as every record carries them: its own, then what the session
    /// counted for it, then undecodable raw records.
    pub fn finish_counters(&self, mut c: Counters) -> Counters {
        c.extend(self.watched.iter().map(|(k, v)| (*k, *v)));
        if let Some(bad) = self.raw_bad {
            c.insert("raw_records_bad", bad);
        }
        c
    }
}

/// A view's part of one read: its totals by side, its counters, its hooks on interfaces as
/// last checked (packets seen against the interface's own, what runs ahead, blind or not), and
/// the handshake RTTs of the connections it saw established since the previous read, by side
/// (the TCP view's; the summary's: those no read took yet).
#[derive(Default)]
pub struct ViewRead {
    pub totals: SideTotals,
    pub counters: Counters,
    pub hooks: Vec<crate::analysis::records::HookStatus>,
    pub handshakes: SideTotals,
}

impl ViewRead {
    /// Its samples on every side.
    pub fn samples(&self) -> u64 {
        self.totals.values().map(|h| h.count()).sum()
    }
}

/// The whole run's flows, as the `end` record's entries and the closing table's rows.
pub type RunFlows = BTreeMap<Flow, (EndFlow, FlowRow)>;

/// What the session watches for a view: namespaces, its cgroup and
/// interfaces that may disappear during the run (checked once per interval,
/// one notice each), and the counters that count them in its records.
#[derive(Default)]
pub struct Watched {
    /// Network namespaces (`--netns`); Some: the view counts `netns_vanished`.
    pub netns: Option<Vec<crate::sys::netns::NetNs>>,
    /// The cgroup the view attached to (`--cgroup`): a removed one counts
    /// `cgroup_vanished` and its notice says `cgroup_loss`.
    pub cgroup: Option<std::path::PathBuf>,
    pub cgroup_loss: &'static str,
    /// Interfaces; Some: the view counts `ifaces_vanished`, and a notice
    /// says `iface_loss`.
    pub ifaces: Option<Vec<WatchedIface>>,
    pub iface_loss: &'static str,
}

/// An interface a view attached to.
pub struct WatchedIface {
    /// As the user named its namespace (`self`: the observer's own).
    pub netns: String,
    /// That namespace's inode at attach.
    pub netns_inode: u32,
    pub iface: String,
    pub ifindex: u32,
}

/// One series of a view's raw samples in a report: its samples are the view's own on the side
/// `side` (`Side::Pinger`: its ICMP echo samples), its row is named `<view> <label>`.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesOf {
    pub side: Side,
    /// The row's name after the view's (`client`, `server`, `icmp`).
    pub label: &'static str,
    /// What the series is, in a few words (the row's description).
    pub what: String,
    /// The settings its samples were taken with.
    pub settings: serde_json::Value,
}

/// What a view attached, as it says it once after attach: what the sinks render (the table's
/// header, notes and closing line, daemon mode's log, observe's start record and result, compare's
/// rows, title and footer) and what the session watches. Nothing in it is asked again.
pub struct Attached {
    /// Which view.
    pub kind: ViewKind,
    /// How it is hooked in and its settings, in a few words (the table's header, after
    /// `| view <name>: `).
    pub hooks: String,
    /// Its settings and what it attached, as its own typed structs serialize them (observe's
    /// result `settings.hooks.<view>`, compare's `settings`).
    pub settings: serde_json::Value,
    /// Its value in observe's start record, under its name, for a view whose registry entry says
    /// what that key holds ([`crate::analysis::view_kind::ViewInfo::start_about`]; None: no key).
    pub start: Option<serde_json::Value>,
    /// Notes for the table, under the header line (what it will and will not see).
    pub notes: Vec<String>,
    /// Daemon mode's log lines at the start: what it attached, or why a part is unavailable.
    pub log: Vec<String>,
    /// The kernel hook its samples come from, when it chose one at attach (compare's footer).
    pub hook: Option<String>,
    /// A few words on how it samples (compare's title).
    pub brief: Option<String>,
    /// The series a report shows of its raw samples (compare's rows), in order: one per side it
    /// reports; the first is shown even when it holds no sample, the others only when they do.
    pub series: Vec<SeriesOf>,
    /// What the session watches for it.
    pub watched: Watched,
    /// Its part of the table's closing line (after `| <name>: `), from its counters.
    pub closing: fn(&Counters) -> String,
}

impl Attached {
    /// A view's hooks, settings and closing line; nothing else to say or watch.
    pub fn new(
        kind: ViewKind,
        hooks: String,
        settings: serde_json::Value,
        closing: fn(&Counters) -> String,
    ) -> Attached {
        Attached {
            kind,
            hooks,
            settings,
            start: None,
            notes: Vec::new(),
            log: Vec::new(),
            hook: None,
            brief: None,
            series: Vec::new(),
            watched: Watched::default(),
            closing,
        }
    }
}

/// What a view read after another asks it ([`View::knows`]).
#[derive(Debug, Clone, Copy)]
pub enum Ask<'a> {
    /// One flow: its side and its owner in this read ([`Known::side`], [`Known::owner`]).
    Flow(&'a Flow),
    /// Every flow it knows by its ends (local, remote), in any namespace ([`Known::by_ends`]): a
    /// tunnelled sampler flow, seen in the underlay's namespace, joins its socket's row by them
    /// (`views::sampler::join`). Asked at most once per read, only when such a flow has samples.
    Ends,
}

/// What a view found, for the views read after it.
#[derive(Default)]
pub struct Known {
    /// [`Ask::Flow`]: the side of the connection the flow is on.
    pub side: Option<Side>,
    /// [`Ask::Flow`]: its owner in this read (`--label-workload`).
    pub owner: Option<Arc<Workload>>,
    /// [`Ask::Ends`]: its flows by their ends (local, remote).
    pub by_ends: Vec<((SocketAddr, SocketAddr), Flow)>,
}

/// What the session reads from every view, whichever it is: its programs, counters and raw
/// samples ([`PassiveView`]), and these.
pub trait View: PassiveView {
    /// What it attached, said once, right after attach.
    fn attached(&self) -> Result<Attached>;
    /// Between reports (several times per interval): keep up with a busy
    /// kernel side (drain pools, free closed flows' slots early).
    fn between_reads(&mut self, _ctx: &mut ReadCtx<'_, '_>) -> Result<()> {
        Ok(())
    }
    /// At an interval's edge (the window's start, every interval's end), before any view is
    /// read: start the next generation of what its programs accumulate, without waiting for
    /// the programs still on the old one. True: it switched, and the session waits once for
    /// every view ([`crate::views::fine::wait_for_programs`]) before the reads, which take the
    /// generation switched from: every view's edge is then the same instant, not one after
    /// each view's wait (`read_s` in the records).
    fn switch_generation(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// One interval: each flow's samples since the previous read into its
    /// row and the sink; the view's totals by side, counters, hooks and handshakes. Once before
    /// the first interval the read is the window's start ([`ReadCtx::window_start`]).
    fn read(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<ViewRead>;
    /// The whole run: each flow the view holds (and held) into `flows`.
    fn summary(&mut self, ctx: &mut ReadCtx<'_, '_>, flows: &mut RunFlows) -> Result<ViewRead>;
    /// Notices for the user since the last call (one line each); asked once per interval,
    /// before the read, and once right after attach.
    fn notices(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// What this view found of a flow (its side, its owner in this read), or of every flow by its
    /// ends ([`Ask`]; asked by later views).
    fn knows(&self, _ask: Ask<'_>) -> Known {
        Known::default()
    }
    /// A last resort for the side of one of this view's flows that no view
    /// found (the sampler: the socket table of the interface's namespace).
    fn resolve_side(&mut self, _flow: &Flow) -> Side {
        Side::Unknown
    }
    /// The retransmissions the view counted on the flows `keep` accepts, when it sees the
    /// socket's own count (default: 0, it does not).
    fn retransmissions(&self, _keep: &dyn Fn(&Flow) -> bool) -> Result<u64> {
        Ok(0)
    }
}
