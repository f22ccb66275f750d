//! The sampler as the session reads it ([`SamplerView`], a
//! [`crate::views::view::View`]): per table way, what of its histogram was
//! read ([`SamplerTracker`]), each flow's samples since the previous read
//! into its row, with the side the views read before it found (the TCP
//! view), else the programs' own, else the socket table's; the owners of
//! its flows (`--label-workload`).
use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;

use super::attach::Sampler;
use super::join::{flip, pick, How, Join, Joiner, Rank};
use super::sides::SideResolver;
use super::{FlowKind, SamplerFlowStats};
use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::{Hist, Snapshot};
use crate::analysis::records::{EndFlow, EndView, FlowRow, Name, Nat, ViewStats};
use crate::analysis::workload::Workload;
use crate::sys::netns;

// its key `sampler` in observe's start record (docs/observe-record.schema.json)
/// The sampler view in the start record.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SamplerStart {
    pub attached: serde_json::Value,
    pub prog_ids: serde_json::Value,
    pub settings: serde_json::Value,
    /// Only where the sampler runs its build without BPF atomics that return a value
    /// (kernels < 5.12): why, and what differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub without_atomics: Option<String>,
}

/// The type of the sampler's value in the start record (null when it is not attached).
pub fn start_schema(gen: &mut schemars::SchemaGenerator) -> schemars::Schema {
    gen.subschema_for::<Option<SamplerStart>>()
}
use crate::sys::conntrack::NatJoin;
use crate::sys::sockdiag::FlowOwners;
use crate::views::view::{
    Attached, Counters, ReadCtx, RunFlows, SeriesOf, SideTotals, View, ViewRead, Watched,
    WatchedIface,
};
use crate::views::{HoldsAttached, PassiveView, ViewKind};

/// The attached sampler and what the session keeps of it between reads.
pub struct SamplerView {
    view: Box<Sampler>,
    /// Each hook against its interface's own counters, and what runs ahead of it.
    hooks: super::hooks::HookWatch,
    ways: SamplerTracker,
    /// Sides of flows the kernel could not label (socket table).
    sides: SideResolver,
    /// The owners of its flows (`--label-workload`).
    owners: SamplerOwners,
    /// Its NATed flows joined to their sockets' (conntrack, issue 45).
    nat: NatJoin,
    /// Joined across namespaces, not joined (ambiguous, none), samples of other interfaces.
    joins: JoinCounts,
}

impl SamplerView {
    /// The attached view, read by the session; `workloads`: `--label-workload`.
    pub(crate) fn new(view: Box<Sampler>, workloads: bool) -> SamplerView {
        let namespaces = sampler_namespaces(view.as_ref());
        SamplerView {
            sides: SideResolver::new(namespaces.clone()),
            owners: SamplerOwners {
                diag: workloads.then(|| FlowOwners::open(&namespaces)),
            },
            nat: NatJoin::open(&namespaces),
            joins: JoinCounts::default(),
            ways: SamplerTracker::default(),
            hooks: super::hooks::HookWatch::new(view.as_ref()),
            view,
        }
    }

    /// The view's counters as every record carries them.
    fn counters(&self, ctx: &ReadCtx<'_, '_>) -> Result<Counters> {
        let mut sc = self.view.counters()?;
        sc.insert("samples_evicted", self.ways.samples_evicted);
        sc.insert("nat_lookups", self.nat.lookups);
        sc.insert("nat_translated", self.nat.translated);
        sc.insert("nat_lookup_errors", self.nat.errors + self.nat.skipped);
        sc.insert("nat_unjoined", self.joins.unjoined);
        sc.insert("join_across_netns", self.joins.across);
        sc.insert("join_ambiguous", self.joins.ambiguous);
        sc.insert("samples_other_iface", self.joins.samples_other_iface);
        self.owners.counters(&mut sc);
        Ok(ctx.finish_counters(sc))
    }

    /// The side of one of its flows: what the views read before it found
    /// for the row it joins (a tunnelled flow: for the socket it joins, the
    /// other side when that is the other end's; a NATed one: its socket's tuple), else what
    /// its programs saw (the handshake; ICMP: pinger or pinged), else the socket table of the
    /// interface's namespace (issue 15).
    fn side(
        sides: &mut SideResolver,
        ctx: &ReadCtx<'_, '_>,
        f: &SamplerFlowStats,
        j: &Join,
    ) -> Side {
        if f.kind != FlowKind::Tcp {
            return f.side;
        }
        let found = ctx.side_of(&j.row);
        match if j.swapped { flip(found) } else { found } {
            Side::Unknown if f.side != Side::Unknown => f.side,
            Side::Unknown => sides.side(if j.swapped { &f.flow } else { &j.row }),
            s => s,
        }
    }

    /// The row a flow of the sampler joins ([`Joiner`]: its own, or a socket's with its ends in
    /// another namespace), else, for a plain TCP flow no socket has the ends of (or only the
    /// swapped ends: behind NAT, the peer's socket has the translated tuple's), its socket's tuple
    /// when its namespace's conntrack translated it (issue 45); with the wire's tuple then.
    fn join(
        nat: &mut NatJoin,
        joiner: &mut Joiner,
        ctx: &ReadCtx<'_, '_>,
        f: &SamplerFlowStats,
    ) -> (Join, Option<Flow>) {
        let tcp = f.kind == FlowKind::Tcp;
        let j = joiner.join(ctx, &f.flow, tcp);
        // a tunnelled flow is joined by its inner ends, not NAT
        let unsure = j.how == How::Alone || (j.how == How::Across && j.swapped);
        if !unsure || !tcp || !f.flow.tunnel.is_none() {
            return (j, None);
        }
        match nat.socket_of(&f.flow) {
            Some(s) => (Join::alone(s, How::Own), Some(f.flow)),
            None => (j, None),
        }
    }

    /// Whether a TCP view read before this one (a flow it does not know is then unjoined).
    fn tcp_earlier(ctx: &ReadCtx<'_, '_>) -> bool {
        ctx.earlier.iter().any(|v| v.kind() == ViewKind::Tcp)
    }

    /// Each flow's samples since the previous read (one entry per flow: a
    /// flow in two ways, rare, has its deltas merged), with its kind, side,
    /// the row it joins (`join`) and, when NAT translated it, the wire's tuple.
    fn deltas(&mut self, ctx: &ReadCtx<'_, '_>) -> Result<BTreeMap<Flow, FlowDelta>> {
        let mut deltas: BTreeMap<Flow, FlowDelta> = BTreeMap::new();
        let (ways, owners, sides) = (&mut self.ways, &mut self.owners, &mut self.sides);
        let (nat, joins, tcp) = (&mut self.nat, &mut self.joins, Self::tcp_earlier(ctx));
        let mut joiner = Joiner::default();
        self.view.for_each_flow(&mut |f| {
            let (mut delta, first) = ways.way(&f);
            if delta.count() == 0 {
                owners.keep(&f.flow);
                nat.keep(&f.flow);
                return;
            }
            delta.set_range(
                f.interval_min_us
                    .or(if first { f.hist.min_us } else { None }),
                f.interval_max_us
                    .or(if first { f.hist.max_us } else { None }),
            );
            match deltas.entry(f.flow) {
                std::collections::btree_map::Entry::Occupied(mut d) => {
                    let d = d.get_mut();
                    d.delta.merge(&delta);
                    if f.hist.count() > d.rank.samples {
                        d.rank = Rank::of(&f.hist, d.join.swapped);
                    }
                }
                std::collections::btree_map::Entry::Vacant(v) => {
                    let (j, wire) = Self::join(nat, &mut joiner, ctx, &f);
                    if first && f.kind == FlowKind::Tcp {
                        joins.count(&j, tcp && ctx.side_of(&j.row) == Side::Unknown);
                    }
                    let side = Self::side(sides, ctx, &f, &j);
                    v.insert(FlowDelta {
                        rank: Rank::of(&f.hist, j.swapped),
                        delta,
                        kind: f.kind,
                        side,
                        join: j,
                        wire,
                    });
                }
            }
        })?;
        Ok(deltas)
    }
}

/// Its programs, counters and raw samples: the attached view's.
impl HoldsAttached for SamplerView {
    fn attached_object(&self) -> &dyn PassiveView {
        self.view.as_ref()
    }

    fn attached_object_mut(&mut self) -> &mut dyn PassiveView {
        self.view.as_mut()
    }
}

/// The sampler's settings and what it attached (observe's result, compare's settings).
#[derive(serde::Serialize)]
struct Settings<'a> {
    settings: &'a super::SamplerConfig,
    attached: &'a [super::AttachInfo],
    #[serde(skip_serializing_if = "Option::is_none")]
    without_atomics: Option<&'a str>,
}

impl View for SamplerView {
    /// Its interfaces and settings; the interfaces the session watches.
    fn attached(&self) -> Result<Attached> {
        let settings = serde_json::to_value(Settings {
            settings: self.view.config(),
            attached: self.view.attach_info(),
            without_atomics: self.view.without_atomics(),
        })?;
        Ok(Attached {
            start: self.start_value()?,
            notes: self.start_lines(),
            log: self.attach_lines(),
            brief: self.brief(),
            series: self.series(),
            watched: self.watched(),
            ..Attached::new(ViewKind::Sampler, self.header(), settings, closing)
        })
    }

    /// Fold the fine-histogram pool in when busy.
    fn between_reads(&mut self, _ctx: &mut ReadCtx<'_, '_>) -> Result<()> {
        self.view.drain_pool_if_busy()
    }

    fn switch_generation(&mut self) -> Result<bool> {
        self.view.switch_pool()?;
        Ok(true)
    }

    /// Each flow's samples since the previous read, into its row (with the
    /// side the TCP view found) and the sink.
    fn read(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<ViewRead> {
        let mut totals = SideTotals::new();
        self.sides.begin();
        self.owners.begin();
        self.nat.begin();
        let deltas = self.deltas(ctx)?;
        self.sides.end();
        self.nat.end();
        // the sampler flows by the row they join: a socket's flow seen on two interfaces gives
        // the row the samples of one (join.rs, `pick`), the others' counted
        let mut by_row: BTreeMap<Flow, Vec<(Flow, FlowDelta)>> = BTreeMap::new();
        for (flow, d) in deltas {
            by_row.entry(d.join.row).or_default().push((flow, d));
        }
        for (row, cands) in by_row {
            let k = pick(cands.iter().map(|(f, d)| (f, d.rank)));
            let other: u64 = cands.iter().map(|(_, d)| d.delta.count()).sum();
            let d = &cands[k].1;
            self.joins.samples_other_iface += other - d.delta.count();
            let (side, kind) = (d.side, d.kind);
            let owner = self.owners.get(ctx, &row, kind);
            // daemon mode: the sampler's samples since the last read (under the joined flow)
            let (o, w) = (owner.as_deref(), d.wire.as_ref());
            ctx.export_translated(ViewKind::Sampler, &row, side, o, &d.delta, w);
            totals.entry(side).or_default().merge(&d.delta);
            if !ctx.keep_rows {
                continue; // nothing prints rows
            }
            let r = ctx.row(&row, side);
            if r.views.is_empty() {
                // a row of its own (no view before it saw the flow)
                r.proto = icmp_proto(kind).map(Name::from);
            }
            r.views
                .set(ViewKind::Sampler, ViewStats::from_hist(&d.delta));
            let tunnel = cands.iter().map(|(f, _)| f.tunnel).find(|t| !t.is_none());
            if let (None, Some(t)) = (r.tunnel, tunnel) {
                r.tunnel = Some(t);
            }
            if r.workload.is_none() {
                r.workload = owner;
            }
            if let Some(w) = d.wire {
                r.nat = Some(Nat::of(&row, &w));
            }
        }
        self.owners.end();
        if ctx.window_start {
            // each way's histogram now, to be taken off its flow's whole run
            let w = &mut self.ways;
            w.base = w
                .prev
                .iter()
                .map(|(k, p)| (*k, (p.gen, p.snap.clone())))
                .collect();
        }
        Ok(ViewRead {
            totals,
            counters: self.counters(ctx)?,
            hooks: self.hooks.statuses(),
            handshakes: SideTotals::new(),
        })
    }

    fn summary(&mut self, ctx: &mut ReadCtx<'_, '_>, flows: &mut RunFlows) -> Result<ViewRead> {
        let mut totals = SideTotals::new();
        self.sides.begin();
        self.owners.begin();
        self.nat.begin();
        let mut joiner = Joiner::default();
        let mut rows: BTreeMap<Flow, Vec<Seen>> = BTreeMap::new();
        let mut ways = self.view.read_flows()?;
        self.ways.since_window(&mut ways);
        for f in super::merge_ways(ways) {
            let (j, wire) = Self::join(&mut self.nat, &mut joiner, ctx, &f);
            let side = Self::side(&mut self.sides, ctx, &f, &j);
            let rank = Rank::of(&f.hist, j.swapped);
            rows.entry(j.row).or_default().push((f, side, wire, rank));
        }
        for (flow, seen) in rows {
            let k = pick(seen.iter().map(|s| (&s.0.flow, s.3)));
            totals.entry(seen[k].1).or_default().merge(&seen[k].0.hist);
            self.end_entry(ctx, flows, &flow, &seen, k);
        }
        Ok(ViewRead {
            totals,
            counters: self.counters(ctx)?,
            hooks: self.hooks.statuses(),
            handshakes: SideTotals::new(),
        })
    }

    fn resolve_side(&mut self, flow: &Flow) -> Side {
        self.sides.side(flow)
    }

    /// Once per interval (before the read; first right after attach): the hooks against
    /// their interfaces, and what newly runs ahead of them.
    fn notices(&mut self) -> Vec<String> {
        let mut out = self.view.follow();
        out.extend(self.hooks.take_notices());
        self.hooks.sync(self.view.as_ref());
        self.hooks.check(self.view.as_ref());
        out.extend(self.hooks.take_notices());
        out
    }
}

/// What it says of what it attached ([`View::attached`]).
impl SamplerView {
    fn watched(&self) -> Watched {
        // those a pattern matched are followed by the view itself (released and counted)
        let named = self
            .view
            .attach_info()
            .iter()
            .filter(|a| a.pattern.is_none());
        let ifaces = named.map(|a| WatchedIface {
            netns: a.netns.clone(),
            netns_inode: a.netns_inode,
            iface: a.iface.clone(),
            ifindex: a.ifindex,
        });
        Watched {
            ifaces: Some(ifaces.collect()),
            iface_loss: "the sampler stops seeing it",
            ..Watched::default()
        }
    }

    fn series(&self) -> Vec<SeriesOf> {
        let c = self.view.config();
        let (every, matching) = (c.sample_every, c.matching.as_str());
        let label = format!("1/{every} sampled, {matching} match, no Karn");
        let set = serde_json::json!({"sample_every": every, "match": matching});
        vec![
            SeriesOf {
                side: Side::Client,
                label: "client",
                what: format!("packet sampler at the interface ({label})"),
                settings: set.clone(),
            },
            SeriesOf {
                side: Side::Server,
                label: "server",
                what: format!("packet sampler, responding side ({label})"),
                settings: set,
            },
            SeriesOf {
                side: Side::Pinger,
                label: "icmp",
                what: "packet sampler at the interface, the ICMP probe's echoes (passive)".into(),
                settings: serde_json::json!({"sample_every": every, "match": "echo"}),
            },
        ]
    }

    fn brief(&self) -> Option<String> {
        let c = self.view.config();
        Some(format!(
            "sampler 1/{} {}",
            c.sample_every,
            c.matching.as_str()
        ))
    }

    fn start_lines(&self) -> Vec<String> {
        let w = self.view.without_atomics();
        w.map(|w| format!("sampler view without BPF atomics: {w}"))
            .into_iter()
            .collect()
    }

    fn start_value(&self) -> Result<Option<serde_json::Value>> {
        Ok(Some(serde_json::to_value(SamplerStart {
            attached: serde_json::to_value(self.view.attach_info())?,
            prog_ids: serde_json::to_value(self.view.prog_ids())?,
            settings: serde_json::to_value(self.view.config())?,
            without_atomics: self.view.without_atomics().map(str::to_string),
        })?))
    }

    fn attach_lines(&self) -> Vec<String> {
        let attached = self.view.attach_info().iter().map(|a| {
            format!(
                "attached: sampler view: {} ingress+egress on {} in {} ({} link)",
                a.how, a.iface, a.netns, a.link
            )
        });
        attached.collect()
    }

    fn header(&self) -> String {
        let c = self.view.config();
        let ifs: Vec<String> = self
            .view
            .attach_info()
            .iter()
            .map(|a| format!("{}:{} ({})", a.netns, a.iface, a.how))
            .collect();
        format!(
            "1/{} sampling, match {}, no Karn, proto {}, on {}",
            c.sample_every,
            c.matching.as_str(),
            c.protos
                .iter()
                .map(|p| format!("{p:?}").to_lowercase())
                .collect::<Vec<_>>()
                .join(","),
            ifs.join(" ")
        )
    }
}

/// Its part of the table's closing line.
fn closing(c: &Counters) -> String {
    let get = |k: &str| c.get(k).copied().unwrap_or(0);
    let skipped: u64 = c
        .iter()
        .filter(|(k, _)| k.starts_with("skip_"))
        .map(|(_, v)| v)
        .sum();
    format!(
        "{}, {} skipped (see JSON counters), {} pending expired, {} flow-map-full",
        crate::analysis::units::count(get("samples"), "sample"),
        crate::analysis::units::count(skipped, "packet"),
        get("expired"),
        get("flow_map_full") + get("pending_map_full")
    )
}

/// The sampler's table between reads, per way (table entry): which flow
/// stay (`gen`) it held, what of its histogram was read, and the way's
/// running total of evicted samples. Bounded by the table's size.
#[derive(Default)]
pub(super) struct SamplerTracker {
    prev: crate::views::fine::SlotMap<u32, WayPrev>,
    /// Each way's flow stay (gen) and histogram when the window started (left out of the whole run).
    base: crate::views::fine::SlotMap<u32, (u64, Snapshot)>,
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
    /// Each way's samples since the window started (a stay that was in the way then loses what
    /// it had; its range is then the bucket bounds').
    fn since_window(&self, ways: &mut [SamplerFlowStats]) {
        for f in ways.iter_mut() {
            if let Some((_, snap)) = self.base.get(&f.way).filter(|b| b.0 == f.gen) {
                f.hist = snap.delta_hist(&f.hist);
                f.samples = f.hist.count();
            }
        }
    }

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

/// A sampler flow's samples since the previous read, its kind, side, the row it joins, the wire's
/// tuple when NAT translated it, and its rank among the flows of that row (`pick`).
struct FlowDelta {
    delta: Hist,
    kind: FlowKind,
    side: Side,
    join: Join,
    wire: Option<Flow>,
    rank: Rank,
}

/// A sampler flow of the whole run, with its side, the wire's tuple (NAT) and its rank.
type Seen = (SamplerFlowStats, Side, Option<Flow>, Rank);

/// The join's counters (cumulative): see `counters`.
#[derive(Default)]
struct JoinCounts {
    /// TCP flows joined to a socket of another namespace by their ends.
    across: u64,
    /// TCP flows whose ends sockets in several other namespaces have: not joined.
    ambiguous: u64,
    /// With a TCP view read before: TCP flows that joined none of its rows.
    unjoined: u64,
    /// Samples of a row's sampler flows other than the one its samples come from.
    samples_other_iface: u64,
}

impl JoinCounts {
    /// One TCP flow's join, when first seen; `unjoined`: it joined no earlier view's row.
    fn count(&mut self, j: &Join, unjoined: bool) {
        self.across += (j.how == How::Across) as u64;
        self.ambiguous += (j.how == How::Ambiguous) as u64;
        self.unjoined += unjoined as u64;
    }
}

impl SamplerView {
    /// The end record's entry (and closing row) of `flow`: the samples of `seen[k]`, the sampler
    /// flow [`pick`] chose of those that join it (one, or a socket's flow seen on several
    /// interfaces: each interface's samples listed, `iface_samples`).
    fn end_entry(
        &mut self,
        ctx: &mut ReadCtx<'_, '_>,
        flows: &mut RunFlows,
        flow: &Flow,
        seen: &[Seen],
        k: usize,
    ) {
        let (chosen, side, wire) = (&seen[k].0, seen[k].1, seen[k].2);
        let per_iface = iface_samples(ctx.names, seen);
        let owner = self.owners.get(ctx, flow, chosen.kind);
        let names = &mut *ctx.names;
        let entry = flows.entry(*flow).or_insert_with(|| {
            let mut e = EndFlow::new(flow, names.get(flow.netns), side);
            let mut r = FlowRow::new(flow, e.netns_name.clone(), side);
            e.proto = icmp_proto(chosen.kind).map(Name::from);
            r.proto = e.proto.clone();
            (e.workload, r.workload) = (owner.clone(), owner);
            (e, r)
        });
        let tunnel = seen.iter().map(|s| s.0.flow.tunnel).find(|t| !t.is_none());
        if let (None, Some(t)) = (entry.0.tunnel, tunnel) {
            (entry.0.tunnel, entry.1.tunnel) = (Some(t), Some(t));
        }
        if let Some(w) = wire {
            let nat = Nat::of(flow, &w);
            (entry.0.nat, entry.1.nat) = (Some(nat.clone()), Some(nat));
        }
        let mut v = EndView::of(&chosen.hist);
        v.iface = Some(chosen.iface.clone());
        v.iface_samples = (per_iface.len() > 1).then_some(per_iface);
        entry.0.views.set(ViewKind::Sampler, v);
        entry
            .1
            .views
            .set(ViewKind::Sampler, ViewStats::from_hist(&chosen.hist));
    }
}

/// The samples of each interface that timed a row's sampler flows, by the interface's name
/// (`NETNS:NAME` for a name that is an interface of several namespaces among them).
fn iface_samples(names: &mut crate::views::view::NsNames, seen: &[Seen]) -> BTreeMap<String, u64> {
    let shared = |f: &SamplerFlowStats| {
        let other_ns = |s: &Seen| s.0.iface == f.iface && s.0.flow.netns != f.flow.netns;
        seen.iter().any(other_ns)
    };
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (f, _, _, _) in seen {
        let name = match shared(f) {
            true => format!("{}:{}", names.get(f.flow.netns), f.iface),
            false => f.iface.clone(),
        };
        *out.entry(name).or_default() += f.hist.count();
    }
    out
}

/// `proto` of a sampler flow's row: `icmp`/`icmpv6`, None for TCP.
fn icmp_proto(kind: FlowKind) -> Option<&'static str> {
    (kind != FlowKind::Tcp).then(|| kind.as_str())
}

/// The namespaces of the sampler's interfaces (for the socket table).
fn sampler_namespaces(s: &Sampler) -> Vec<netns::NetNs> {
    let mut out: Vec<netns::NetNs> = Vec::new();
    for a in s.attach_info() {
        match netns::resolve(&a.netns) {
            Ok(ns) if ns.inode == a.netns_inode && !out.iter().any(|n| n.inode == ns.inode) => {
                out.push(ns)
            }
            _ => {}
        }
    }
    out
}

/// The owners of the sampler's flows (`--label-workload`): what the TCP
/// view found for the same 4-tuple in this read, else the flow's local
/// socket through sock_diag ([`FlowOwners`], cached per flow).
struct SamplerOwners {
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
        ctx: &mut ReadCtx<'_, '_>,
        f: &Flow,
        kind: FlowKind,
    ) -> Option<Arc<Workload>> {
        let diag = self.diag.as_mut()?;
        if kind != FlowKind::Tcp || ctx.workloads.is_none() {
            return None;
        }
        let w = match ctx.owner_of(f) {
            Some(w) => Some(w),
            None => ctx.workloads.as_mut()?.get(diag.cgroup(f)),
        };
        if let Some(n) = w.as_ref().and_then(|w| w.netns_name()) {
            ctx.names.set_owner(f.netns, n);
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
