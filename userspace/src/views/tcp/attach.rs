//! The TCP view's attach and read logic, written once against the loader
//! layer (`views::loader`): `bpf/tcp.bpf.c`'s sock_ops, iter/tcp and optional
//! per-ACK programs, under whichever loader was chosen.
//!
//! Order: load (the per-ACK hook optional: the kernel may refuse it), attach
//! the hook if loaded (before the sock_ops program, so that no connection
//! gets the RTT callback while the hook has its samples), fill the filters,
//! attach sock_ops to the cgroup, run the iterator in each namespace asked
//! for, read the listeners it found.
use std::collections::{BTreeMap, HashSet};
use std::mem::{offset_of, size_of};
use std::os::fd::AsFd;

use anyhow::{Context, Result};

use super::{
    cidr_key, free_slot, hint_entries, read_slots, TcpFlowState, TcpHookInfo, TcpViewConfig,
    COUNTER_NAMES,
};
use crate::analysis::flow::{Flow, Side};
use crate::bpf::tcp::types::{bss, rodata, rttscope_cidr_key, rttscope_tcp_counter as C};
use crate::sys::netns;
use crate::views::fine::{self, pool_entries, FinePool};
use crate::views::loader::{
    self, globals, include_object, Object, ObjectDef, Prog, ProgKind, Settings,
};
use crate::views::{LoaderKind, PassiveView, RawEvent, RawSample, RawSamples, ViewKind};

const SOCKOPS: &str = "rtt_tcp_sockops";
const ITER: &str = "rtt_tcp_iter";
/// The iterator without bpf_setsockopt (bpf/tcp.bpf.c).
const ITER_NS: &str = "rtt_tcp_iter_ns";
const ACK: &str = "rtt_tcp_ack";

const PROGS: &[Prog] = &[
    Prog {
        name: SOCKOPS,
        kind: ProgKind::SockOps,
    },
    Prog {
        name: ITER,
        kind: ProgKind::Iter("tcp"),
    },
    Prog {
        name: ITER_NS,
        kind: ProgKind::Iter("tcp"),
    },
    Prog {
        name: ACK,
        kind: ProgKind::FExit("tcp_ack_update_rtt"),
    },
];

/// The compiled TCP view.
pub(crate) static OBJECT: ObjectDef = ObjectDef {
    what: "the TCP view",
    name: "tcp_bpf",
    bytes: include_object!("tcp"),
    progs: PROGS,
};

/// The same sources built without BPF atomics that return a value
/// (RTTSCOPE_NO_ATOMICS), for kernels that refuse them (< 5.12): fresh flow
/// slots and fine-histogram entries are popped from stacks this side fills
/// (`tcp_fresh_slots`, `fine_pool_free0`/`1`). Same samples, same maps
/// otherwise, same `.rodata` and `.bss` layout.
pub(crate) static OBJECT_NOATOMIC: ObjectDef = ObjectDef {
    what: "the TCP view (built without BPF atomics)",
    name: "tcp_bpf",
    bytes: include_object!("tcp_noatomic"),
    progs: PROGS,
};

/// The iterator to load here: the one calling bpf_setsockopt where the `iter_setsockopt` probe
/// found the call works (or could not run: it then tries, and its refusals are counted), else
/// the one without the call. Before 5.15 the verifier refuses bpf_setsockopt in iter/tcp, so a
/// program calling it would fail the whole object there (kernels 5.12 to 5.14: atomics, no such
/// call); on 6.1 the helper refuses the option at run time, so both behave the same. The build
/// without atomics never calls it.
fn iter_prog(atomics: bool) -> &'static str {
    let p = &crate::views::features::Features::get().iter_setsockopt;
    if atomics && (p.ok || !p.probed) {
        ITER
    } else {
        ITER_NS
    }
}

/// The iterator left out (not loaded).
fn other_iter(atomics: bool) -> &'static str {
    if iter_prog(atomics) == ITER {
        ITER_NS
    } else {
        ITER
    }
}

/// The object to load here (the `atomics` probe, or the test setting).
fn object(atomics: bool) -> &'static ObjectDef {
    if atomics {
        &OBJECT
    } else {
        &OBJECT_NOATOMIC
    }
}

/// Fill the stack of never-used slots of the object without atomics:
/// `max_flows - 1 .. 0`, so that pops hand out 0, 1, 2, ... (bpf/tcp.bpf.c
/// take_slot(), which raises `slots_hwm` before each pop).
fn fill_fresh_slots(obj: &dyn Object, max_flows: u32) -> Result<()> {
    crate::sys::bpf::refill_stack(obj.map_fd("tcp_fresh_slots")?, max_flows, 0)
        .context("filling the TCP view's stack of fresh flow slots")
}

// SAFETY: a generated `#[repr(C)]` struct of integers (u32 + [u8; 16]): any
// bit pattern is a valid value, no padding.
unsafe impl plain::Plain for rttscope_cidr_key {}

/// The TCP view, loaded and attached.
pub struct Tcp {
    obj: Box<dyn Object>,
    /// The iterator loaded (`iter_prog`).
    iter: &'static str,
    listeners: HashSet<(u32, u16)>,
    info: TcpHookInfo,
    epoch: u32,
    raw: bool,
    raw_taken: bool,
    /// The fine-histogram pool (`fine_pool`) and the flows' histograms read from it.
    fine: std::sync::Mutex<FinePool>,
}

/// What the object is loaded with: sizes, `.rodata`, the per-ACK hook left
/// out, or optional. `tcp_existing` (build without atomics) holds up to
/// `max_flows` connections open before attach where the hook is loaded, else 1.
fn settings(cfg: &TcpViewConfig, max_flows: u32, with_hook: bool, atomics: bool) -> Settings {
    let hints = hint_entries(max_flows);
    let ro = rodata {
        cfg_netns_filter: !cfg.netns_filter.is_empty() as u32,
        cfg_port_filter: !cfg.ports.is_empty() as u32,
        cfg_addr_filter: !cfg.cidrs.is_empty() as u32,
        cfg_raw: cfg.raw as u32,
        cfg_max_slots: max_flows,
        cfg_hint_mask: hints - 1,
        cfg_pool_entries: pool_entries(max_flows),
    };
    Settings {
        globals: globals!(
            rodata,
            ro,
            [
                cfg_netns_filter,
                cfg_port_filter,
                cfg_addr_filter,
                cfg_raw,
                cfg_max_slots,
                cfg_hint_mask,
                cfg_pool_entries
            ]
        ),
        max_entries: vec![
            ("tcp_flows", max_flows),
            ("tcp_free_slots", max_flows),
            ("tcp_hints", hints),
            (fine::POOL, 2 * pool_entries(max_flows)),
        ]
        .into_iter()
        .chain((!atomics).then_some([
            ("tcp_fresh_slots", max_flows),
            ("fine_pool_free0", pool_entries(max_flows)),
            ("fine_pool_free1", pool_entries(max_flows)),
            ("tcp_existing", if with_hook { max_flows } else { 1 }),
        ]).into_iter().flatten())
        .collect(),
        skip: [(!with_hook).then_some(ACK), Some(other_iter(atomics))]
            .into_iter()
            .flatten()
            .collect(),
        optional: if with_hook { vec![ACK] } else { vec![] },
        memory: format!(
            "its maps of {max_flows} flows (lower --max-flows, or check the memory cgroup and RLIMIT_MEMLOCK)"
        ),
        label: String::new(),
    }
}

impl Tcp {
    /// Load, configure and attach. Fails with one clear sentence.
    pub(crate) fn attach(kind: LoaderKind, cfg: &TcpViewConfig) -> Result<Tcp> {
        cfg.validate()?;
        crate::sys::preflight::require_bpf_caps()?;
        crate::sys::preflight::require_btf()?;
        let (cg, cgroup) = crate::sys::preflight::open_cgroup(cfg.cgroup.as_deref())?;
        let max_flows = cfg.max_flows.max(16);
        let with_hook = cfg.ack_hook.wanted();
        let atomics = crate::views::features::Features::get().atomics_choice();
        let mut obj = load_object(kind, cfg, max_flows, with_hook, atomics.used)?;
        // the build without atomics' hook is attached after the iterator (below)
        let hook_status = if atomics.used {
            attach_ack_hook(obj.as_mut(), cfg, with_hook)?
        } else {
            prepare_existing_hook(obj.as_mut(), cfg, with_hook)?
        };
        let fine = fill_maps(obj.as_mut(), cfg, max_flows, atomics.used)?;
        obj.attach_cgroup(SOCKOPS, cg.as_fd())
            .with_context(|| format!("attaching sock_ops to cgroup {}", cgroup.display()))?;
        let mut view = Tcp {
            fine: std::sync::Mutex::new(fine),
            obj,
            iter: iter_prog(atomics.used),
            listeners: HashSet::new(),
            info: TcpHookInfo::new(cfg, &cgroup, max_flows).with_atomics(&atomics),
            epoch: 0,
            raw: cfg.raw,
            raw_taken: false,
        };
        if atomics.used {
            view.info.set_ack_hook(hook_status.clone());
        }
        view.walk_existing(cfg, atomics.used, hook_status)?;
        view.info.prog_ids = view.prog_ids().into_iter().map(|(_, id)| id).collect();
        view.load_listeners()?;
        Ok(view)
    }

    /// Run the iterator over the connections open before attach (in each `--iter-netns`
    /// namespace) and record what it did: with atomics its counts; without, also whether the
    /// per-ACK hook, prepared before it (`hook_status` `Ok`), is now attached.
    fn walk_existing(
        &mut self,
        cfg: &TcpViewConfig,
        atomics: bool,
        hook_status: Result<(), String>,
    ) -> Result<()> {
        for ns in &cfg.iter_netns {
            let Err(e) = self.obj.run_iter(iter_prog(atomics), ns) else {
                continue;
            };
            match netns::not_entered(&e) {
                Some(why) if cfg.all_netns => self.info.skip_netns(&ns.name, why),
                _ => return Err(e),
            }
        }
        if !self.info.netns_skipped.is_empty() {
            eprintln!(
                "rttscope: warning: --all-netns: {} network namespace(s) skipped, connections open there before the start are not timed ({})",
                self.info.netns_skipped.len(),
                self.info.netns_skipped.join("; ")
            );
        }
        let (enabled, refused) = (
            self.counter(C::RTTSCOPE_TCP_ENABLED),
            self.counter(C::RTTSCOPE_TCP_ITER_SETSOCKOPT_FAIL),
        );
        if atomics {
            self.info.set_existing(enabled, refused);
        } else {
            let full = self.counter(C::RTTSCOPE_TCP_EXISTING_TABLE_FULL);
            let linked = match hook_status {
                Ok(()) => attach_existing_hook(self.obj.as_mut(), cfg, enabled),
                Err(status) => Ok(Err(status)),
            }?;
            self.info.set_existing_table(linked, enabled, refused, full);
        }
        Ok(())
    }

    /// The pool (a poisoned lock only means a panic elsewhere mid-read: the
    /// histograms are still whole).
    fn fine_pool(&self) -> std::sync::MutexGuard<'_, FinePool> {
        self.fine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The listening sockets the iterator found: (netns, port).
    fn load_listeners(&mut self) -> Result<()> {
        for k in self.obj.map("tcp_listeners")?.keys()? {
            if let (Some(ns), Some(port)) = (k.get(0..4), k.get(4..6)) {
                let ns = u32::from_ne_bytes(ns.try_into().unwrap_or_default());
                let port = u16::from_ne_bytes(port.try_into().unwrap_or_default());
                self.listeners.insert((ns, port));
            }
        }
        Ok(())
    }
}

/// The TCP view's object (the build with or without atomics) loaded by `kind` with its
/// settings, not yet attached.
fn load_object(
    kind: LoaderKind,
    cfg: &TcpViewConfig,
    max_flows: u32,
    with_hook: bool,
    atomics: bool,
) -> Result<Box<dyn Object>> {
    loader::load(
        kind,
        object(atomics),
        vec![settings(cfg, max_flows, with_hook, atomics)],
        &[],
    )?
    .pop()
    .context("the TCP view's object was not loaded")
}

/// The maps filled before sock_ops is attached: the filters, the free slots (the build without
/// atomics only), then the pool of fine histograms.
fn fill_maps(
    obj: &mut dyn Object,
    cfg: &TcpViewConfig,
    max_flows: u32,
    atomics: bool,
) -> Result<FinePool> {
    fill_filters(obj, cfg)?;
    if !atomics {
        fill_fresh_slots(obj, max_flows)?;
    }
    FinePool::new(obj, pool_entries(max_flows))
}

/// Attach the optional per-ACK hook where it was asked for and loaded, and
/// tell the other programs (`ack_hook_on`): `Ok(())` attached, `Err(status)`
/// not (a refusal is a notice, or with `--ack-hook require` an error).
fn attach_ack_hook(
    obj: &mut dyn Object,
    cfg: &TcpViewConfig,
    with_hook: bool,
) -> Result<Result<(), String>> {
    if !with_hook {
        return Ok(Err("off".to_string()));
    }
    if let Some(e) = obj.refused(ACK) {
        return Ok(Err(cfg.ack_hook.refused(&e)?));
    }
    if let Err(e) = obj.attach_trace(ACK) {
        let e = e.context("attaching the per-ACK hook");
        return Ok(Err(cfg.ack_hook.refused(&e)?));
    }
    obj.write_data(".bss", offset_of!(bss, ack_hook_on), &1u32.to_ne_bytes())
        .context("writing the TCP view's .bss")?;
    Ok(Ok(()))
}

/// The build without atomics (kernels < 5.12): its hook times only the connections open before
/// attach, which the iterator records in `tcp_existing` where `ack_hook_on` is 2 (set here,
/// before the iterator runs). `Ok(())`: loaded and announced, to attach after the iterator;
/// `Err(status)`: not used.
fn prepare_existing_hook(
    obj: &mut dyn Object,
    cfg: &TcpViewConfig,
    with_hook: bool,
) -> Result<Result<(), String>> {
    if !with_hook {
        return Ok(Err("off".to_string()));
    }
    if let Some(e) = obj.refused(ACK) {
        return Ok(Err(cfg.ack_hook.refused(&e)?));
    }
    obj.write_data(".bss", offset_of!(bss, ack_hook_on), &2u32.to_ne_bytes())
        .context("writing the TCP view's .bss")?;
    Ok(Ok(()))
}

/// After the iterator, in the build without atomics: attach the hook where it recorded
/// connections (`enabled`; with `--ack-hook require` always). A hook with nothing to time is
/// left unattached: it would cost one table lookup per RTT sample of every socket.
fn attach_existing_hook(
    obj: &mut dyn Object,
    cfg: &TcpViewConfig,
    enabled: u64,
) -> Result<Result<(), String>> {
    if enabled == 0 && cfg.ack_hook != super::AckHook::Require {
        return Ok(Err(
            "not attached: no connection open before attach to time".to_string(),
        ));
    }
    if let Err(e) = obj.attach_trace(ACK) {
        let e = e.context("attaching the per-ACK hook");
        return Ok(Err(cfg.ack_hook.refused(&e)?));
    }
    Ok(Ok(()))
}

/// The netns, port and address filters, filled before sock_ops is attached.
fn fill_filters(obj: &dyn Object, cfg: &TcpViewConfig) -> Result<()> {
    let m = obj.map("netns_filter")?;
    for ns in &cfg.netns_filter {
        m.update(&ns.inode.to_ne_bytes(), &[1])
            .context("filling the netns filter")?;
    }
    let m = obj.map("port_filter")?;
    for p in &cfg.ports {
        m.update(&p.to_ne_bytes(), &[1])
            .context("filling the port filter")?;
    }
    let m = obj.map("addr_filter")?;
    for c in &cfg.cidrs {
        m.update(crate::bpf::as_bytes(&cidr_key(c)), &[1])
            .context("filling the address filter")?;
    }
    Ok(())
}

impl PassiveView for Tcp {
    fn kind(&self) -> ViewKind {
        ViewKind::Tcp
    }

    fn loader(&self) -> LoaderKind {
        self.obj.loader()
    }

    fn prog_ids(&self) -> Vec<(String, u32)> {
        let mut ids = vec![
            ("tcp_sockops", self.obj.prog_id(SOCKOPS)),
            ("tcp_iter", self.obj.prog_id(self.iter)),
        ];
        if self.info.ack_hook_linked() {
            ids.push(("tcp_ack_hook", self.obj.prog_id(ACK)));
        }
        ids.into_iter().map(|(n, i)| (n.to_string(), i)).collect()
    }

    fn counters(&self) -> Result<BTreeMap<&'static str, u64>> {
        Ok(all_counters(self))
    }

    fn raw_samples(&mut self) -> Result<RawSamples> {
        if !self.raw {
            anyhow::bail!("raw samples were not enabled when the TCP view was loaded");
        }
        if self.raw_taken {
            anyhow::bail!("the raw-sample stream was already taken");
        }
        let ring = self.obj.ring("tcp_events")?;
        self.raw_taken = true;
        RawSamples::new(ring, ViewKind::Tcp, raw_sample)
    }
}

/// Read by the session through [`super::track::TcpView`].
impl Tcp {
    /// How the view is hooked in (for report headers and JSON).
    pub fn info(&self) -> &TcpHookInfo {
        &self.info
    }

    /// Sum over CPUs of one per-CPU counter (0 if it cannot be read).
    pub fn counter(&self, c: C) -> u64 {
        self.obj
            .map("tcp_counters")
            .and_then(|m| m.percpu_sum(&c.0.to_ne_bytes()))
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// The current report epoch (flows' win_* values belong to it when equal).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Start a new report interval: flows' win_min/win_max restart.
    pub fn next_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.fine_pool().next_interval();
    }

    /// Start the fine-histogram pool's next generation at an interval's edge
    /// ([`FinePool::switch`]); the caller waits for the programs.
    pub fn switch_pool(&self) -> Result<()> {
        self.fine_pool().switch(self.obj.as_ref())
    }

    /// Between reads: fold the fine-histogram pool in if its current half
    /// is half taken (`views::fine`).
    pub fn drain_pool_if_busy(&self) -> Result<()> {
        self.fine_pool().drain_if_busy(self.obj.as_ref()).map(drop)
    }

    /// Fold the pool's finished generation into the flows' histograms, then
    /// read every flow entry (batched: a few syscalls for thousands of
    /// flows), handing each to `f` without keeping them all in memory.
    pub fn for_each_flow(&self, f: &mut dyn FnMut(TcpFlowState)) -> Result<()> {
        let mut fine = self.fine_pool();
        fine.drain(self.obj.as_ref())?;
        let hwm = self
            .obj
            .read_u64(".bss", offset_of!(bss, slots_hwm), size_of::<u64>())
            .unwrap_or(u64::MAX);
        fine.begin_scan();
        read_slots(
            self.obj.map_fd("tcp_flows")?,
            hwm,
            self.info.max_flows,
            &self.listeners,
            &fine,
            self.epoch,
            f,
        )?;
        fine.end_scan();
        Ok(())
    }

    /// Samples of flows given back (`forget`) that arrived between their
    /// last read and the give-back: counted as `samples_evicted`.
    pub fn samples_orphaned(&self) -> u64 {
        self.fine_pool().orphaned()
    }

    /// Give a flow's slot back (after it was reported closed, or to evict
    /// it): `slot` and `gen` as read in its `TcpFlowState`.
    pub fn forget(&mut self, slot: u32, gen: u32) -> Result<()> {
        self.fine_pool().forget(slot, gen);
        free_slot(
            self.obj.map_fd("tcp_flows")?,
            self.obj.map_fd("tcp_free_slots")?,
            slot,
            gen,
        )
    }
}

/// Every counter by name, in the order of `enum rttscope_tcp_counter`,
/// plus `rtt_callbacks` (samples + callbacks skipped: the kernel counts
/// only the exceptions, to keep the per-sample path short; with the
/// per-ACK hook attached the samples are the hook's, and the callbacks
/// are only those someone else turned on, all skipped). Both loaders'
/// [`PassiveView::counters`].
fn all_counters(v: &Tcp) -> BTreeMap<&'static str, u64> {
    let mut m: BTreeMap<&'static str, u64> = COUNTER_NAMES
        .iter()
        .map(|(c, n)| (*n, v.counter(*c)))
        .collect();
    let from_cb = if v.info().ack_hook_attached() {
        0
    } else {
        // the build without atomics: the hook's samples of connections open before attach
        m["samples"].saturating_sub(m["existing_hook_samples"])
    };
    m.insert("rtt_callbacks", from_cb + m["rtt_callbacks_skipped"]);
    m.insert("existing_not_timed", v.info().existing_not_timed);
    m.insert("samples_evicted", v.samples_orphaned());
    m
}

/// One record of the TCP view's ring buffer (`tcp_events`): an RTT sample
/// or a flow's end, with TCP's srtt and the flow's side as the programs
/// label it.
pub(crate) fn raw_sample(ev: &crate::bpf::Event) -> Option<RawSample> {
    use crate::bpf::tcp::types::rttscope_event_type as T;
    let event = match ev.r#type as u32 {
        x if x == T::RTTSCOPE_EV_TCP_RTT.0 => RawEvent::Rtt,
        x if x == T::RTTSCOPE_EV_FLOW_END.0 => RawEvent::FlowEnd,
        _ => return None,
    };
    Some(RawSample {
        view: ViewKind::Tcp,
        event,
        flow: Flow::from_key(&ev.key)?,
        proto: None,
        side: Side::from_raw(ev.side),
        ts_ns: ev.ts_ns,
        rtt_us: ev.rtt_us,
        srtt_us: Some(ev.srtt_us),
        matching: None,
    })
}
