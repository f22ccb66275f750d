//! The sampler view's attach and read logic, written once against the loader
//! layer (`views::loader`): one copy of `bpf/sampler.bpf.c`'s object per
//! interface, with that interface's `.rodata`, the copies after the first
//! sharing the first one's maps ([`SHARED_MAPS`]); each copy's programs
//! attached at egress and ingress by `tc.rs` (tcx links, or clsact filters
//! where tcx is unavailable or asked against).
use std::collections::BTreeMap;
use std::mem::offset_of;

use anyhow::{bail, Context, Result};

use super::tc::{tcx_attach, Attached, Attachments};
use super::{
    attach_info, derived_counters, hash_seed, resolve_ifaces, table_flows, AttachInfo, AttachMode,
    IfaceSpec, ResolvedIface, SamplerConfig, SamplerFlowStats, COUNTERS, PROG_EGRESS, PROG_INGRESS,
    SHARED_MAPS, SHARED_MAPS_NOATOMIC,
};
use crate::bpf::SamplerRodata as rodata;
use crate::sys::netns;
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
    info: Vec<AttachInfo>,
    /// The raw-sample ring buffer was handed out (`raw_samples`).
    raw_taken: bool,
    /// The fine-histogram pool (`fine_pool`, shared by every copy) and
    /// the flows' histograms read from it.
    fine: FinePool,
    /// Set only where the build without BPF atomics runs, and why.
    without_atomics: Option<String>,
    /// tcx links and clsact filters: removed before the programs go.
    #[allow(dead_code)] // held for its Drop: detaches
    attached: Attachments,
    /// One copy per interface; the first one's maps are everybody's.
    objs: Vec<Box<dyn Object>>,
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
    (slot, r): (usize, &ResolvedIface),
    atomics: bool,
) -> Settings {
    // (the generated layout has private padding fields: start from zeroes)
    let mut ro: rodata = crate::bpf::zeroed();
    ro.cfg_netns = r.ns.inode;
    ro.cfg_ifindex = r.meta.ifindex;
    ro.cfg_link = r.link.0;
    ro.cfg_slot = slot as u32;
    ro.cfg_sample_threshold = cfg.threshold();
    ro.cfg_match = cfg.matching.raw();
    ro.cfg_raw = cfg.raw as u32;
    ro.cfg_timeout_ns = cfg.pending_timeout.as_nanos().min(u64::MAX as u128) as u64;
    ro.cfg_set_mask = cfg.set_mask();
    ro.cfg_hash_seed = seed;
    ro.cfg_protos = cfg.proto_mask();
    ro.cfg_pool_entries = pool_entries(cfg.table_entries());
    // x86-64 is TSO: the programs release a lock with a plain store (unlock())
    ro.cfg_tso = cfg!(target_arch = "x86_64") as u32;
    Settings {
        globals: globals!(
            rodata,
            ro,
            [
                cfg_netns,
                cfg_ifindex,
                cfg_link,
                cfg_slot,
                cfg_sample_threshold,
                cfg_match,
                cfg_raw,
                cfg_timeout_ns,
                cfg_set_mask,
                cfg_hash_seed,
                cfg_protos,
                cfg_pool_entries,
                cfg_tso
            ]
        ),
        max_entries: vec![
            ("sampler_table", cfg.table_entries()),
            (fine::POOL, 2 * pool_entries(cfg.table_entries())),
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
        label: format!("loading the sampler programs for {}", r.spec),
        ..Settings::default()
    }
}

impl Sampler {
    /// Load one copy of the programs per interface and attach them at
    /// ingress and egress.
    pub(crate) fn attach(
        kind: LoaderKind,
        ifaces: &[IfaceSpec],
        cfg: SamplerConfig,
    ) -> Result<Sampler> {
        let resolved = resolve_ifaces(ifaces, &cfg)?;
        if !cfg!(feature = "libbpf") && clsact_first(cfg.attach) {
            bail!("clsact filters under aya need a build with the libbpf feature too (its netlink code attaches them); this kernel has no tcx links (`rttscope features`)");
        }
        let seed = hash_seed();
        let atomics = crate::views::features::Features::get().atomics_choice();
        let (def, shared) = object(atomics.used);
        let copies = resolved
            .iter()
            .enumerate()
            .map(|r| settings(&cfg, seed, r, atomics.used))
            .collect();
        let mut objs = loader::load(kind, def, copies, shared)?;
        let entries = pool_entries(cfg.table_entries());
        let fine = FinePool::new(objs[0].as_mut(), entries)?;
        let mut attached = Attachments::default();
        let mut info = Vec::new();
        for (obj, r) in objs.iter().zip(&resolved) {
            let (how, priority) = attach_copy(obj.as_ref(), r, cfg.attach, &mut attached)?;
            let mut a = attach_info(&r.spec, &r.ns, r.meta.ifindex, how, r.link);
            a.priority = priority;
            info.push(a);
        }
        Ok(Sampler {
            cfg,
            info,
            without_atomics: (!atomics.used).then(|| {
                format!(
                    "{}: kernel programs built without them (each table way's lock a bpf_spin_lock, fine-histogram entries popped from stacks rttscope fills; the same samples)",
                    atomics.why
                )
            }),
            raw_taken: false,
            fine,
            attached,
            objs,
        })
    }

    /// The first copy: its maps are the shared ones.
    fn first(&self) -> &dyn Object {
        self.objs[0].as_ref()
    }
}

/// Attach one copy's programs at egress and ingress of its interface: tcx
/// links where the kernel has them (auto: falling back to clsact if the
/// attach fails), else clsact filters in our claimed slot. Returns how, and the clsact
/// priority taken.
fn attach_copy(
    obj: &dyn Object,
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
    for (egress, prog) in [(false, PROG_INGRESS), (true, PROG_EGRESS)] {
        let fd = obj.prog_fd(prog)?;
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
        for o in &self.objs {
            for p in [PROG_EGRESS, PROG_INGRESS] {
                if let Ok(id) = o
                    .prog_fd(p)
                    .and_then(|fd| Ok(crate::sys::bpf::prog_id(fd)?))
                {
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
        // the programs count each packet once, per interface and direction
        let hooks = self.hook_packets()?;
        out.insert("seen_ingress", hooks.iter().map(|h| h[0]).sum());
        out.insert("seen_egress", hooks.iter().map(|h| h[1]).sum());
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
    /// [`SamplerView::attach_info`] (`sampler_hooks`, summed over CPUs).
    pub(crate) fn hook_packets(&self) -> Result<Vec<[u64; 2]>> {
        let m = self.first().map("sampler_hooks")?;
        let mut out = Vec::with_capacity(self.info.len());
        for slot in 0..self.info.len() as u32 {
            let mut both = [0u64; 2];
            for (dir, n) in both.iter_mut().enumerate() {
                let key = slot * 2 + dir as u32;
                *n = m
                    .percpu_sum(&key.to_ne_bytes())
                    .context("reading the sampler's hook counters")?
                    .unwrap_or(0);
            }
            out.push(both);
        }
        Ok(out)
    }

    /// Each interface's programs' ids, `[ingress, egress]`, in the same order.
    pub(crate) fn hook_prog_ids(&self) -> Vec<[u32; 2]> {
        let id = |o: &dyn Object, p: &str| {
            o.prog_fd(p)
                .ok()
                .and_then(|fd| crate::sys::bpf::prog_id(fd).ok())
                .unwrap_or(0)
        };
        self.objs
            .iter()
            .map(|o| [id(o.as_ref(), PROG_INGRESS), id(o.as_ref(), PROG_EGRESS)])
            .collect()
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
