//! The sampler view's attach and read logic, written once against the loader
//! layer (`views::loader`): one copy of `bpf/sampler.bpf.c`'s object per
//! network namespace and link type of the interfaces, with that namespace's
//! `.rodata`, the copies after the first sharing the first one's maps
//! ([`SHARED_MAPS`]); each copy's two programs attached at egress and ingress
//! of every interface of its namespace and type by `tc.rs` (tcx links, or
//! clsact filters where tcx is unavailable or asked against): one
//! verification per namespace, not per interface (issue 41.5). Interfaces
//! come and go through `follow.rs`.
use std::collections::BTreeMap;
use std::mem::offset_of;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};

use super::follow::{self, Ctx, Follower, Group, Ifaces};
use super::hook_tags;
use super::tc::{tcx_attach, Attached, Attachments};
use super::{
    derived_counters, hash_seed, resolve_ifaces, table_flows, AttachInfo, AttachMode, IfaceSpec,
    ResolvedIface, SamplerConfig, SamplerFlowStats, COUNTERS, PROG_EGRESS, PROG_INGRESS,
    SHARED_MAPS, SHARED_MAPS_NOATOMIC,
};
use crate::bpf::sampler::types as t;
use crate::bpf::SamplerRodata as rodata;
use crate::sys::netns::{self, NetNs};
use crate::views::fine::{self, pool_entries, FinePool};
use crate::views::loader::{
    self, globals, include_object, Object, ObjectDef, Prog, ProgKind, Settings,
};
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

const PROGS: &[Prog] = &[
    Prog {
        name: PROG_EGRESS,
        kind: ProgKind::Classifier,
    },
    Prog {
        name: PROG_INGRESS,
        kind: ProgKind::Classifier,
    },
];

/// The compiled sampler.
pub(crate) static OBJECT: ObjectDef = ObjectDef {
    what: "the sampler",
    name: "sampler_bpf",
    bytes: include_object!("sampler"),
    progs: PROGS,
};

/// The same sources built without BPF atomics that return a value
/// (RTTSCOPE_NO_ATOMICS, bpf/sampler_noatomic.bpf.h), for kernels that
/// refuse them (< 5.12): each table way's lock is a `bpf_spin_lock` in
/// `sampler_locks`, fine-histogram entries are popped from stacks this side
/// fills. Same samples, same `.rodata` and `.bss` layout.
pub(crate) static OBJECT_NOATOMIC: ObjectDef = ObjectDef {
    what: "the sampler (built without BPF atomics)",
    name: "sampler_bpf",
    bytes: include_object!("sampler_noatomic"),
    progs: PROGS,
};

/// The object and the maps its copies share (the `atomics` probe, or the
/// test setting RTTSCOPE_BPF_ATOMICS=off).
fn object(atomics: bool) -> (&'static ObjectDef, &'static [&'static str]) {
    if atomics {
        (&OBJECT, &SHARED_MAPS)
    } else {
        (&OBJECT_NOATOMIC, &SHARED_MAPS_NOATOMIC)
    }
}

/// The sampler view, loaded and attached.
pub(crate) struct Sampler {
    cfg: SamplerConfig,
    /// The attached interfaces at the last [`Sampler::sync`], and their programs' ids.
    info: Vec<AttachInfo>,
    ids: Vec<[u32; 2]>,
    version: u64,
    /// The raw-sample ring buffer was handed out (`raw_samples`).
    raw_taken: bool,
    /// The fine-histogram pool (`fine_pool`, shared by every copy) and
    /// the flows' histograms read from it.
    fine: FinePool,
    /// Set only where the build without BPF atomics runs, and why.
    without_atomics: Option<String>,
    /// The programs of each copy, the hooks map, the bound.
    ctx: Arc<Ctx>,
    /// Every attached interface (tcx links, clsact filters: removed before the programs go).
    ifaces: Arc<Mutex<Ifaces>>,
    /// A thread per namespace with `--iface` patterns.
    followers: Vec<Follower>,
    /// One copy per namespace and link type; the first one's maps are everybody's.
    objs: Vec<Box<dyn Object>>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // no attach after this, then everything detached before the programs go
        self.followers.clear();
        follow::lock(&self.ifaces).clear();
    }
}

/// Whether the programs go in as clsact filters from the start (else tcx
/// links first): where asked, or where the feature probe finds no tcx.
fn clsact_first(mode: AttachMode) -> bool {
    match mode {
        AttachMode::Clsact => true,
        AttachMode::Tcx => false,
        AttachMode::Auto => !crate::views::features::Features::get().tcx.ok,
    }
}

/// One copy's settings: its interface's `.rodata`, the table's size (and,
/// without atomics, its locks' and the pool's free stacks').
fn settings(
    cfg: &SamplerConfig,
    seed: u64,
    (ns, link): &(NetNs, t::rttscope_sampler_link),
    atomics: bool,
) -> Settings {
    // (the generated layout has private padding fields: start from zeroes)
    let mut ro: rodata = crate::bpf::zeroed();
    ro.cfg_netns = ns.inode;
    ro.cfg_link = link.0;
    ro.cfg_sample_threshold = cfg.threshold();
    ro.cfg_match = cfg.matching.raw();
    ro.cfg_raw = cfg.raw as u32;
    ro.cfg_timeout_ns = cfg.pending_timeout.as_nanos().min(u64::MAX as u128) as u64;
    ro.cfg_set_mask = cfg.set_mask();
    ro.cfg_hash_seed = seed;
    ro.cfg_hook_mask = hook_tags::entries_for(2 * cfg.max_ifaces) - 1;
    ro.cfg_protos = cfg.proto_mask();
    ro.cfg_vxlan_ports = super::config::pack_ports(&cfg.vxlan_ports);
    ro.cfg_geneve_ports = super::config::pack_ports(&cfg.geneve_ports);
    ro.cfg_pool_entries = pool_entries(cfg.table_entries());
    // x86-64 is TSO: the programs release a lock with a plain store (unlock())
    ro.cfg_tso = cfg!(target_arch = "x86_64") as u32;
    Settings {
        globals: globals!(
            rodata,
            ro,
            [
                cfg_netns,
                cfg_link,
                cfg_sample_threshold,
                cfg_match,
                cfg_raw,
                cfg_timeout_ns,
                cfg_set_mask,
                cfg_hash_seed,
                cfg_hook_mask,
                cfg_protos,
                cfg_vxlan_ports,
                cfg_geneve_ports,
                cfg_pool_entries,
                cfg_tso
            ]
        ),
        max_entries: vec![
            ("sampler_table", cfg.table_entries()),
            (fine::POOL, 2 * pool_entries(cfg.table_entries())),
            ("sampler_hooks", hook_tags::entries_for(2 * cfg.max_ifaces)),
        ]
        .into_iter()
        .chain(
            (!atomics)
                .then_some([
                    ("sampler_locks", cfg.table_entries()),
                    ("fine_pool_free0", pool_entries(cfg.table_entries())),
                    ("fine_pool_free1", pool_entries(cfg.table_entries())),
                ])
                .into_iter()
                .flatten(),
        )
        .collect(),
        label: format!(
            "loading the sampler programs for namespace {} ({} link)",
            ns.name,
            if *link == t::rttscope_sampler_link::RTTSCOPE_LINK_NONE {
                "raw-IP"
            } else {
                "Ethernet"
            }
        ),
        ..Settings::default()
    }
}

/// The namespaces and link types to load a copy for: those of the interfaces given by name
/// and of the matches at start, and Ethernet in each namespace with patterns.
fn groups_of(r: &super::Resolved) -> Vec<(NetNs, t::rttscope_sampler_link)> {
    let mut out: Vec<(NetNs, t::rttscope_sampler_link)> = Vec::new();
    let ether = t::rttscope_sampler_link::RTTSCOPE_LINK_ETHER;
    let starts = r.watches.iter().flat_map(|(_, s)| s.iter());
    let each = r.fixed.iter().chain(starts).map(|i| (&i.ns, i.link));
    let pattern_ns = r.watches.iter().map(|(w, _)| (&w.ns, ether));
    for (ns, link) in each.chain(pattern_ns) {
        if !out.iter().any(|(n, l)| n.inode == ns.inode && *l == link) {
            out.push((ns.clone(), link));
        }
    }
    out
}

/// A loaded copy's programs, for attaching them anywhere (descriptors of their own).
fn group(obj: &dyn Object, (ns, link): &(NetNs, t::rttscope_sampler_link)) -> Result<Group> {
    let dup = |p| -> Result<OwnedFd> { Ok(obj.prog_fd(p)?.try_clone_to_owned()?) };
    let progs = [dup(PROG_INGRESS)?, dup(PROG_EGRESS)?];
    let id = |fd: &OwnedFd| crate::sys::bpf::prog_id(fd.as_fd()).unwrap_or(0);
    Ok(Group {
        ns_inode: ns.inode,
        link: *link,
        ids: [id(&progs[0]), id(&progs[1])],
        progs,
    })
}

impl Sampler {
    /// Load one copy of the programs per namespace and link type, attach them at ingress and
    /// egress of every interface, and follow the patterns' namespaces.
    pub(crate) fn attach(
        kind: LoaderKind,
        ifaces: &[IfaceSpec],
        cfg: SamplerConfig,
    ) -> Result<Sampler> {
        let resolved = resolve_ifaces(ifaces, &cfg)?;
        if resolved.fixed.len() > cfg.max_ifaces as usize {
            bail!(
                "{} interfaces are given by name, more than --max-ifaces {}",
                resolved.fixed.len(),
                cfg.max_ifaces
            );
        }
        if !cfg!(feature = "libbpf") && clsact_first(cfg.attach) {
            bail!("clsact filters under aya need a build with the libbpf feature too (its netlink code attaches them); this kernel has no tcx links (`rttscope features`)");
        }
        let seed = hash_seed();
        let atomics = crate::views::features::Features::get().atomics_choice();
        let (def, shared) = object(atomics.used);
        let wanted = groups_of(&resolved);
        let copies = wanted
            .iter()
            .map(|g| settings(&cfg, seed, g, atomics.used))
            .collect();
        let mut objs = loader::load(kind, def, copies, shared)?;
        let entries = pool_entries(cfg.table_entries());
        let fine = FinePool::new(objs[0].as_mut(), entries)?;
        let groups = objs
            .iter()
            .zip(&wanted)
            .map(|(o, g)| group(o.as_ref(), g))
            .collect::<Result<Vec<_>>>()?;
        let ctx = Arc::new(Ctx {
            groups,
            hooks: objs[0].map_fd("sampler_hooks")?.try_clone_to_owned()?,
            mode: cfg.attach,
            max: cfg.max_ifaces as usize,
        });
        let ifaces = Arc::new(Mutex::new(Ifaces::new(cfg.max_ifaces)));
        attach_at_start(&ctx, &ifaces, &resolved)?;
        let followers = resolved
            .watches
            .into_iter()
            .map(|(w, _)| Follower::spawn(ctx.clone(), ifaces.clone(), w))
            .collect();
        let mut s = Sampler {
            cfg,
            info: Vec::new(),
            ids: Vec::new(),
            version: u64::MAX,
            without_atomics: (!atomics.used).then(|| {
                format!(
                    "{}: kernel programs built without them (each table way's lock a bpf_spin_lock, fine-histogram entries popped from stacks rttscope fills; the same samples)",
                    atomics.why
                )
            }),
            raw_taken: false,
            fine,
            ctx,
            ifaces,
            followers,
            objs,
        };
        s.sync();
        Ok(s)
    }

    /// The first copy: its maps are the shared ones.
    fn first(&self) -> &dyn Object {
        self.objs[0].as_ref()
    }

    /// Take the attached interfaces as they are now (the followers change them).
    fn sync(&mut self) {
        let st = follow::lock(&self.ifaces);
        if st.version == self.version {
            return;
        }
        self.version = st.version;
        self.info = st.live.iter().map(|l| l.info.clone()).collect();
        self.ids = st.live.iter().map(|l| l.ids).collect();
    }
}

/// The interfaces given by name (a failure fails the start, leaving nothing attached) and
/// those the patterns match at start (a failure counted, as later).
fn attach_at_start(ctx: &Ctx, ifaces: &Mutex<Ifaces>, r: &super::Resolved) -> Result<()> {
    let mut st = follow::lock(ifaces);
    for i in &r.fixed {
        st.attach(ctx, i, None)?;
    }
    for (w, start) in &r.watches {
        for i in start {
            let pattern = w.patterns.iter().find(|p| p.matches(&i.spec.name));
            if let Err(e) = st.attach(ctx, i, pattern) {
                st.unattachable(i.ns.inode, i.meta.ifindex, &i.spec.name, &e);
            }
        }
    }
    Ok(())
}

/// Attach a copy's programs (`progs`: ingress, egress) at ingress and egress of one
/// interface: tcx links where the kernel has them (auto: falling back to clsact if the
/// attach fails), else clsact filters in our claimed slot. Returns how, and the clsact
/// priority taken.
pub(super) fn attach_iface(
    progs: [BorrowedFd<'_>; 2],
    r: &ResolvedIface,
    mode: AttachMode,
    attached: &mut Attachments,
) -> Result<(&'static str, Option<u16>)> {
    let mut how = None;
    // our clsact slot on this interface, claimed at its first filter
    let mut slot = None;
    // Ingress first (issue 27.2): a segment recorded at egress is then
    // always answered where the ingress program sees it. The other order left
    // a gap in which a request went out recorded and its response came in
    // unseen; the next response's ACK, covering both, timed the older one:
    // a first sample of one think time plus the RTT (30 ms on a 90 us path,
    // 40 of 40 mid-flow attaches).
    for (egress, fd) in [(false, progs[0]), (true, progs[1])] {
        let ifindex = r.meta.ifindex;
        let tcx = if clsact_first(mode) {
            None
        } else {
            match netns::scoped(&r.ns, move || tcx_attach(fd, ifindex, egress)) {
                Ok(link) => Some(link),
                Err(e) if mode == AttachMode::Auto && cfg!(feature = "libbpf") => {
                    tracing::info!("tcx attach on {} failed ({e:#}); using clsact", r.spec);
                    None
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "attaching a tcx link to {} (tcx links need kernel 6.6 or later: `rttscope features` says whether this kernel has them; --attach auto uses clsact where it has not)",
                        r.spec
                    )))
                }
            }
        };
        how = Some(match tcx {
            Some(link) => {
                attached.0.push(Attached::Tcx(link));
                "tcx"
            }
            None => {
                clsact(fd, r, egress, &mut slot, attached)?;
                // mixed only if tcx worked one way and not the other
                if how == Some("tcx") {
                    "tcx+clsact"
                } else {
                    "clsact"
                }
            }
        });
    }
    Ok((how.unwrap_or("?"), slot.map(|s| s.1)))
}

/// Attach `prog` as a clsact filter in our slot of the interface (claimed
/// at its first filter: `slot`).
#[cfg(feature = "libbpf")]
fn clsact(
    prog: std::os::fd::BorrowedFd<'_>,
    r: &ResolvedIface,
    egress: bool,
    slot: &mut Option<(u32, u16)>,
    attached: &mut Attachments,
) -> Result<()> {
    use super::tc::{clsact_attach, clsact_claim};
    let (ns, ifindex, spec) = (&r.ns, r.meta.ifindex, &r.spec);
    let slot = match *slot {
        Some(s) => s,
        None => {
            let claim = netns::run_in(ns, move || clsact_claim(ifindex))
                .with_context(|| format!("claiming a clsact slot on {spec}"))?;
            let s = (claim.slot, claim.priority);
            attached.0.push(Attached::Claim {
                ns: ns.clone(),
                claim,
            });
            *slot.insert(s)
        }
    };
    netns::scoped(ns, move || clsact_attach(prog, ifindex, egress, slot))
        .with_context(|| format!("attaching a clsact filter to {spec}"))?;
    attached.0.push(Attached::Clsact {
        ns: ns.clone(),
        ifindex,
        egress,
        slot: slot.0,
        priority: slot.1,
    });
    Ok(())
}

/// Without libbpf's netlink code there are no clsact filters (refused
/// before loading, in `Sampler::attach`).
#[cfg(not(feature = "libbpf"))]
fn clsact(
    _prog: std::os::fd::BorrowedFd<'_>,
    r: &ResolvedIface,
    _egress: bool,
    _slot: &mut Option<(u32, u16)>,
    _attached: &mut Attachments,
) -> Result<()> {
    bail!(
        "clsact filters on {} need a build with the libbpf feature (its netlink code attaches them)",
        r.spec
    )
}

impl PassiveView for Sampler {
    fn kind(&self) -> ViewKind {
        ViewKind::Sampler
    }

    fn loader(&self) -> LoaderKind {
        self.first().loader()
    }

    fn prog_ids(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for g in &self.ctx.groups {
            for (p, id) in [(PROG_EGRESS, g.ids[1]), (PROG_INGRESS, g.ids[0])] {
                if id != 0 {
                    out.push((p.to_string(), id));
                }
            }
        }
        out
    }

    fn counters(&self) -> Result<BTreeMap<&'static str, u64>> {
        let m = self.first().map("sampler_counters")?;
        let mut out = BTreeMap::new();
        for (name, idx) in COUNTERS {
            let sum = m
                .percpu_sum(&idx.0.to_ne_bytes())
                .with_context(|| format!("reading sampler counter {name}"))?;
            out.insert(*name, sum.unwrap_or(0));
        }
        // the programs count each packet once, per interface and direction (those released
        // included)
        let st = follow::lock(&self.ifaces);
        let hooks = st.hook_sums(&self.ctx);
        let seen = |d: usize| st.released_hooks[d] + hooks.iter().map(|h| h[d]).sum::<u64>();
        out.insert("seen_ingress", seen(0));
        out.insert("seen_egress", seen(1));
        out.insert("ifaces_attached", st.attached);
        out.insert("ifaces_released", st.released);
        out.insert("ifaces_refused", st.refused);
        out.insert("ifaces_unattachable", st.unattachable);
        out.insert("ifaces_live", st.live.len() as u64);
        drop(st);
        derived_counters(&mut out, self.cfg.sample_every <= 1);
        Ok(out)
    }

    fn raw_samples(&mut self) -> Result<RawSamples> {
        if !self.cfg.raw || self.raw_taken {
            bail!(
                "raw samples were not enabled when the sampler was loaded, or were already taken"
            );
        }
        let ring = self.objs[0].ring("sampler_events")?;
        self.raw_taken = true;
        RawSamples::new(ring, ViewKind::Sampler, |e| {
            super::SamplerSample::from_event(e).map(|s| s.to_raw_sample())
        })
    }
}

/// Read by the session through [`super::track::SamplerView`].
impl Sampler {
    /// The settings it was loaded with.
    pub(crate) fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// How each interface is attached.
    pub(crate) fn attach_info(&self) -> &[AttachInfo] {
        &self.info
    }

    /// Set only where the kernel programs built without BPF atomics that
    /// return a value run (kernels < 5.12), and why.
    pub(crate) fn without_atomics(&self) -> Option<&str> {
        self.without_atomics.as_deref()
    }

    /// Packets each interface's hooks saw since attach, `[ingress, egress]`, in the order of
    /// [`Sampler::attach_info`] (`sampler_hooks`, summed over CPUs; 0 for one released since).
    pub(crate) fn hook_packets(&self) -> Result<Vec<[u64; 2]>> {
        let st = follow::lock(&self.ifaces);
        let by_iface: std::collections::HashMap<(u32, u32), [u64; 2]> = st
            .live
            .iter()
            .map(|l| (l.info.netns_inode, l.info.ifindex))
            .zip(st.hook_sums(&self.ctx))
            .collect();
        Ok(self
            .info
            .iter()
            .map(|a| {
                by_iface
                    .get(&(a.netns_inode, a.ifindex))
                    .copied()
                    .unwrap_or([0, 0])
            })
            .collect())
    }

    /// Each interface's programs' ids, `[ingress, egress]`, in the same order.
    pub(crate) fn hook_prog_ids(&self) -> Vec<[u32; 2]> {
        self.ids.clone()
    }

    /// Take the interfaces attached and released since the last call (`--iface` patterns:
    /// [`Sampler::attach_info`] changes only here and in `for_each_flow`), and what to say
    /// about them (one line each).
    pub(crate) fn follow(&mut self) -> Vec<String> {
        self.sync();
        std::mem::take(&mut follow::lock(&self.ifaces).notices)
    }

    /// Start the fine-histogram pool's next generation at an interval's edge
    /// ([`FinePool::switch`]); the caller waits for the programs.
    pub(crate) fn switch_pool(&mut self) -> Result<()> {
        self.fine.switch(self.objs[0].as_ref())
    }

    /// Between reads: fold the fine-histogram pool in if its current half
    /// is half taken (`views::fine`).
    pub(crate) fn drain_pool_if_busy(&mut self) -> Result<()> {
        self.fine.drain_if_busy(self.objs[0].as_ref()).map(drop)
    }

    /// Every flow's cumulative histogram, plus min/max since the previous
    /// call (the kernel's per-flow window restarts when the epoch moves on):
    /// one entry per table way (`table_flows`; `merge_ways` for one per flow),
    /// in the table's order, handed to `f` one at a time (no list of every
    /// flow is built: 50,000 flows made a 16 MB list at each read).
    pub(crate) fn for_each_flow(&mut self, f: &mut dyn FnMut(SamplerFlowStats)) -> Result<()> {
        self.sync();
        let first = self.objs[0].as_ref();
        self.fine.drain(first)?;
        let table = first.map_fd("sampler_table")?;
        table_flows(table, &self.cfg, &self.info, &mut self.fine, f)?;
        self.fine.next_interval();
        Ok(())
    }

    /// `for_each_flow` as a list, sorted by flow (then most samples first).
    pub(crate) fn read_flows(&mut self) -> Result<Vec<SamplerFlowStats>> {
        let mut out = Vec::new();
        self.for_each_flow(&mut |s| out.push(s))?;
        out.sort_by(|a, b| a.flow.cmp(&b.flow).then(b.samples.cmp(&a.samples)));
        Ok(out)
    }
}

const _: () = assert!(offset_of!(rodata, cfg_netns) == 0);

#[cfg(all(test, not(feature = "libbpf")))]
mod tests {
    use super::*;

    #[test]
    fn clsact_is_refused_in_one_sentence() {
        // Resolving the interface comes first; "lo" exists in every namespace.
        let cfg = SamplerConfig {
            attach: AttachMode::Clsact,
            ..Default::default()
        };
        let Err(e) = Sampler::attach(LoaderKind::Aya, &["lo".parse().unwrap()], cfg) else {
            panic!("clsact accepted under aya");
        };
        let s = format!("{e:#}");
        assert!(s.contains("libbpf") && !s.contains('\n'), "{s}");
    }
}
