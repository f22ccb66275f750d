//! The TCP view: RTT as the TCP stack computes it, observed with a cgroup
//! sock_ops program (BPF_SOCK_OPS_RTT_CB) and an iter/tcp program for
//! connections that existed before attach. Loads `bpf/tcp.bpf.c`.
//!
//! Everything attached is a BPF link (cgroup link, iterator link): when the
//! process exits, even by SIGKILL, the kernel detaches it.
//!
//! The libbpf-rs loader (`TcpView`) is built with the `libbpf` feature; the
//! configuration, the decoded flow state and the decoding itself
//! (`decode_flow`) are shared with the aya loader (`crate::loader`).
use std::collections::HashSet;
#[cfg(feature = "libbpf")]
use std::fs::File;
#[cfg(feature = "libbpf")]
use std::io::Read;
#[cfg(feature = "libbpf")]
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
#[cfg(feature = "libbpf")]
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use anyhow::{Context, Result};
#[cfg(feature = "libbpf")]
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
#[cfg(feature = "libbpf")]
use libbpf_rs::{MapCore, MapFlags};
use serde::Serialize;

#[cfg(feature = "libbpf")]
use crate::bpf::tcp::types::rttscope_listener_key;
use crate::bpf::tcp::types::{
    rttscope_cidr_key, rttscope_flow_flags as F, rttscope_tcp_counter as C,
};
#[cfg(feature = "libbpf")]
use crate::bpf::tcp::{TcpSkel, TcpSkelBuilder};
use crate::bpf::{self, TcpFlow};
use crate::flow::{Flow, Side};
use crate::hist::Hist;
use crate::netns::{self, NetNs};

/// What to observe.
#[derive(Debug, Clone, Default)]
pub struct TcpViewConfig {
    /// cgroup v2 directory for the sock_ops program (default: the root).
    pub cgroup: Option<PathBuf>,
    /// Restrict to these namespaces (empty: all).
    pub netns_filter: Vec<NetNs>,
    /// Namespaces whose existing connections the iterator enables.
    pub iter_netns: Vec<NetNs>,
    pub ports: Vec<u16>,
    pub cidrs: Vec<ipnet::IpNet>,
    pub raw: bool,
    pub max_flows: u32,
    /// The optional per-ACK hook (fexit/tcp_ack_update_rtt).
    pub ack_hook: AckHook,
}

/// The optional per-ACK hook's attach point.
pub const ACK_HOOK: &str = "fexit/tcp_ack_update_rtt";

/// Whether to use the optional per-ACK hook (`rttscope_ack_rtt`, fexit on
/// tcp_ack_update_rtt): the sample the kernel feeds tcp_rtt_estimator(), on
/// any kernel that allows fentry/fexit (many production kernels do; this
/// project's test kernel refuses them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AckHook {
    /// Try it only where the RTT callback carries no sample (kernel < 6.10); else off.
    #[default]
    Auto,
    /// Never: samples come from the RTT callback.
    Off,
    /// Try it; if the kernel refuses it, one notice and the RTT callback.
    Try,
    /// Use it, or fail.
    Require,
}

impl AckHook {
    /// Should the hook be tried on this kernel?
    pub fn wanted(self) -> bool {
        match self {
            AckHook::Auto => crate::preflight::kernel_version() < (6, 10),
            AckHook::Off => false,
            AckHook::Try | AckHook::Require => true,
        }
    }

    /// The hook was tried and refused (`why`: the kernel's or loader's
    /// reason). `require`: one-sentence error; otherwise a one-line notice on
    /// stderr, and the status for the record.
    pub(crate) fn refused(self, why: &anyhow::Error) -> Result<String> {
        let why = why.root_cause().to_string();
        if self == AckHook::Require {
            anyhow::bail!(
                "the per-ACK hook {ACK_HOOK} was refused by this kernel ({why}); run without --ack-hook require to use the sock_ops RTT callback"
            );
        }
        eprintln!(
            "rttscope: notice: per-ACK hook {ACK_HOOK} not used (refused: {why}); RTT samples come from the sock_ops RTT callback"
        );
        Ok(format!("refused: {why}"))
    }
}

/// A failed load of the TCP view's object, in one sentence: ENOMEM (creating maps of `max_flows`
/// entries the kernel cannot allocate) is a memory problem, not a verifier or BTF one.
#[cfg(feature = "libbpf")]
fn load_error(e: libbpf_rs::Error, max_flows: u32) -> anyhow::Error {
    if e.kind() == libbpf_rs::ErrorKind::OutOfMemory {
        anyhow::anyhow!(
            "loading the TCP view into the kernel: not enough memory for its maps of {max_flows} flows (lower --max-flows, or check the memory cgroup and RLIMIT_MEMLOCK): {e}"
        )
    } else {
        anyhow::Error::new(e).context(
            "loading the TCP view into the kernel (verifier or BTF problem; run with -vv for libbpf's log)",
        )
    }
}

/// How the view is hooked in, for report headers and JSON.
#[derive(Debug, Clone, Serialize)]
pub struct TcpHookInfo {
    pub hook: String,
    pub cgroup: String,
    pub iter_netns: Vec<String>,
    pub existing_enabled: u64,
    pub rtt_source: String,
    /// The optional per-ACK hook: "attached", "off" or "refused: <reason>".
    pub ack_hook: String,
    pub kernel: String,
    pub max_flows: u32,
    /// Kernel IDs of our programs (bpftool prog show id N).
    pub prog_ids: Vec<u32>,
}

impl TcpViewConfig {
    /// Limits the kernel maps impose, checked before anything is loaded (both loaders).
    pub fn validate(&self) -> anyhow::Result<()> {
        crate::sampler::check_max_flows(self.max_flows)?;
        if self.netns_filter.len() > bpf::consts::MAX_NETNS as usize
            || self.ports.len() > bpf::consts::MAX_PORTS as usize
            || self.cidrs.len() > bpf::consts::MAX_CIDRS as usize
        {
            anyhow::bail!(
                "too many filters: at most {} --netns, {} --port and {} --addr",
                bpf::consts::MAX_NETNS,
                bpf::consts::MAX_PORTS,
                bpf::consts::MAX_CIDRS
            );
        }
        Ok(())
    }
}

impl TcpHookInfo {
    /// The hook information of a view just attached (both loaders); the
    /// program ids and the count of enabled existing connections are filled
    /// in after attach.
    pub(crate) fn new(cfg: &TcpViewConfig, cgroup: &std::path::Path, max_flows: u32) -> Self {
        TcpHookInfo {
            hook: "cgroup sock_ops: BPF_SOCK_OPS_RTT_CB (+ iter/tcp for existing connections)"
                .into(),
            cgroup: cgroup.display().to_string(),
            iter_netns: cfg.iter_netns.iter().map(|n| n.name.clone()).collect(),
            existing_enabled: 0,
            rtt_source: rtt_source(),
            ack_hook: "off".into(),
            kernel: crate::preflight::kernel_release(),
            max_flows,
            prog_ids: Vec::new(),
        }
    }

    /// Record the outcome of the optional hook: `Ok(())` attached, `Err(status)` not.
    pub(crate) fn set_ack_hook(&mut self, attached: Result<(), String>) {
        match attached {
            Ok(()) => {
                self.hook = format!(
                    "cgroup sock_ops: state and retransmit callbacks (+ iter/tcp for existing connections); RTT samples: {ACK_HOOK}"
                );
                self.rtt_source = "fexit tcp_ack_update_rtt: the sample tcp_rtt_estimator() gets, per ACK, and srtt after it".into();
                self.ack_hook = "attached".into();
            }
            Err(status) => self.ack_hook = status,
        }
    }

    /// Whether the per-ACK hook has the samples.
    pub fn ack_hook_attached(&self) -> bool {
        self.ack_hook == "attached"
    }

    /// The RTT source in a few words (report headers).
    pub fn rtt_source_short(&self) -> &'static str {
        if self.ack_hook_attached() {
            "fexit tcp_ack_update_rtt"
        } else if self.rtt_source.starts_with("srtt") {
            "srtt fallback (kernel < 6.10)"
        } else {
            "RTT_CB args"
        }
    }
}

/// One flow's kernel state, decoded.
#[derive(Debug, Clone)]
pub struct TcpFlowState {
    /// The flow's slot in the `tcp_flows` array and the slot's generation
    /// (what `forget` needs to give the slot back).
    pub slot: u32,
    pub gen: u32,
    /// The socket cookie (`ss -e` prints it as sk:<hex>).
    pub cookie: u64,
    pub flow: Flow,
    pub side: Side,
    pub origin: &'static str,
    pub state: u8,
    pub closed: bool,
    pub srtt_fallback: bool,
    pub samples: u64,
    /// Cumulative histogram counts over the flow's life, as the kernel keeps them.
    pub counts: Box<[u32]>,
    pub sum_us: u64,
    pub life_min_us: Option<u32>,
    pub life_max_us: Option<u32>,
    pub srtt_us: u32,
    pub last_rtt_us: u32,
    pub retrans: u32,
    /// Report epoch the win_* values belong to, and the interval's min/max.
    pub win_epoch: u32,
    pub win_min_us: u32,
    pub win_max_us: u32,
}

/// Counter names, in the order of `enum rttscope_tcp_counter`.
pub const COUNTER_NAMES: &[(C, &str)] = &[
    (C::RTTSCOPE_TC_RTT_CB_SKIPPED, "rtt_callbacks_skipped"),
    (C::RTTSCOPE_TC_SAMPLES, "samples"),
    (C::RTTSCOPE_TC_SRTT_FALLBACK, "srtt_fallback_samples"),
    (C::RTTSCOPE_TC_FLOWS_CREATED, "flows_created"),
    (C::RTTSCOPE_TC_FLOW_MAP_FULL, "flow_map_full"),
    (C::RTTSCOPE_TC_FILTERED, "connections_filtered"),
    (C::RTTSCOPE_TC_ENABLED, "connections_enabled"),
    (C::RTTSCOPE_TC_ITER_SOCKETS, "iter_sockets"),
    (
        C::RTTSCOPE_TC_ITER_SETSOCKOPT_FAIL,
        "iter_setsockopt_failed",
    ),
    (C::RTTSCOPE_TC_RETRANS, "retransmits"),
    (C::RTTSCOPE_TC_CLOSED, "flows_closed"),
    (C::RTTSCOPE_TC_RAW_EVENTS, "raw_events"),
    (C::RTTSCOPE_TC_RAW_DROPS, "raw_events_dropped"),
    (C::RTTSCOPE_TC_NO_SOCK, "no_socket"),
    (C::RTTSCOPE_TC_HINT_MISSES, "rtt_hint_misses"),
];

/// Size of the kernel's `tcp_hints` array for `max_flows` slots: a power of
/// two, at least twice the slots, so that few live sockets share a hint.
/// The programs index it with `cfg_hint_mask` = this - 1.
pub fn hint_entries(max_flows: u32) -> u32 {
    max_flows.max(16).saturating_mul(2).next_power_of_two()
}

#[cfg(feature = "libbpf")]
pub struct TcpView {
    skel: TcpSkel<'static>,
    _sockops_link: libbpf_rs::Link,
    ack_link: Option<libbpf_rs::Link>,
    listeners: HashSet<(u32, u16)>,
    pub info: TcpHookInfo,
    epoch: u32,
}

impl TcpFlowState {
    /// The cumulative histogram (exact life min/max).
    pub fn hist(&self) -> Hist {
        Hist::from_counts(
            &self.counts,
            self.sum_us,
            self.life_min_us,
            self.life_max_us,
        )
    }
}

pub(crate) fn origin_name(o: u8) -> &'static str {
    match o {
        1 => "established",
        2 => "existing",
        3 => "late",
        _ => "?",
    }
}

#[cfg(feature = "libbpf")]
impl TcpView {
    /// Load, configure and attach. Fails with one clear sentence.
    pub fn attach(cfg: &TcpViewConfig) -> Result<TcpView> {
        cfg.validate()?;
        crate::preflight::require_bpf_caps()?;
        crate::preflight::require_btf()?;
        let (cg, cgroup) = crate::preflight::open_cgroup(cfg.cgroup.as_deref())?;

        let max_flows = cfg.max_flows.max(16);
        let hints = hint_entries(max_flows);
        // The per-ACK hook is a program of the same object: where the kernel
        // refuses it, the object is loaded again without it (one refused
        // program fails a whole libbpf object).
        let mut hook_status = Err("off".to_string());
        let mut skel = if cfg.ack_hook.wanted() {
            match Self::open_and_load(cfg, max_flows, hints, true) {
                Ok(skel) => {
                    hook_status = Ok(());
                    skel
                }
                Err(e) => {
                    let skel = Self::open_and_load(cfg, max_flows, hints, false)?;
                    hook_status = Err(cfg.ack_hook.refused(&e)?);
                    skel
                }
            }
        } else {
            Self::open_and_load(cfg, max_flows, hints, false)?
        };
        // Attached before the sock_ops program, so that no connection ever
        // gets the RTT callback while the hook has its samples.
        let ack_link = match hook_status {
            Ok(()) => match skel.progs.rttscope_ack_rtt.attach() {
                Ok(link) => {
                    if let Some(bss) = skel.maps.bss_data.as_deref_mut() {
                        bss.ack_hook_on = 1;
                    }
                    Some(link)
                }
                Err(e) => {
                    let e = anyhow::Error::from(e).context("attaching the per-ACK hook");
                    hook_status = Err(cfg.ack_hook.refused(&e)?);
                    None
                }
            },
            Err(_) => None,
        };

        for ns in &cfg.netns_filter {
            skel.maps
                .netns_filter
                .update(&ns.inode.to_ne_bytes(), &[1], MapFlags::ANY)?;
        }
        for p in &cfg.ports {
            skel.maps
                .port_filter
                .update(&p.to_ne_bytes(), &[1], MapFlags::ANY)?;
        }
        for c in &cfg.cidrs {
            let k = cidr_key(c);
            // SAFETY of layout: rttscope_cidr_key is a generated C struct (u32 + [u8;16]).
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&k as *const rttscope_cidr_key).cast::<u8>(),
                    std::mem::size_of::<rttscope_cidr_key>(),
                )
            };
            skel.maps.addr_filter.update(bytes, &[1], MapFlags::ANY)?;
        }

        let link = skel
            .progs
            .rttscope_sockops
            .attach_cgroup(cg.as_raw_fd())
            .with_context(|| format!("attaching sock_ops to cgroup {}", cgroup.display()))?;

        let mut view = TcpView {
            skel,
            _sockops_link: link,
            ack_link,
            listeners: HashSet::new(),
            info: TcpHookInfo::new(cfg, &cgroup, max_flows),
            epoch: 0,
        };
        view.info.set_ack_hook(hook_status);
        view.info.prog_ids = view.prog_ids().into_iter().map(|(_, id)| id).collect();
        for ns in &cfg.iter_netns {
            view.enable_existing(ns)?;
        }
        view.info.existing_enabled = view.counter(C::RTTSCOPE_TC_ENABLED);
        view.load_listeners();
        Ok(view)
    }

    /// Open the object, size and configure it, load it (with or without the
    /// per-ACK hook program).
    fn open_and_load(
        cfg: &TcpViewConfig,
        max_flows: u32,
        hints: u32,
        with_hook: bool,
    ) -> Result<TcpSkel<'static>> {
        // The skeleton borrows its open object for its whole life; a view lives
        // as long as the command, so the (small) storage is leaked on purpose.
        let open_object = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = TcpSkelBuilder::default()
            .open(open_object)
            .context("opening the TCP view's BPF object")?;
        open.maps
            .tcp_flows
            .set_max_entries(max_flows)
            .context("sizing the flow map")?;
        open.maps
            .tcp_free_slots
            .set_max_entries(max_flows)
            .context("sizing the free-slot stack")?;
        open.maps
            .tcp_hints
            .set_max_entries(hints)
            .context("sizing the slot hints")?;
        open.progs.rttscope_ack_rtt.set_autoload(with_hook);
        {
            let ro = open
                .maps
                .rodata_data
                .as_deref_mut()
                .context("TCP view object has no .rodata")?;
            ro.cfg_netns_filter = !cfg.netns_filter.is_empty() as u32;
            ro.cfg_port_filter = !cfg.ports.is_empty() as u32;
            ro.cfg_addr_filter = !cfg.cidrs.is_empty() as u32;
            ro.cfg_raw = cfg.raw as u32;
            ro.cfg_max_slots = max_flows;
            ro.cfg_hint_mask = hints - 1;
        }
        open.load().map_err(|e| load_error(e, max_flows))
    }

    /// Run the iterator inside `ns`: an iterator only walks the namespace
    /// of the thread that creates it.
    fn enable_existing(&mut self, ns: &NetNs) -> Result<()> {
        let link = self
            .skel
            .progs
            .rttscope_iter_tcp
            .attach()
            .context("attaching the iter/tcp program")?;
        let name = ns.name.clone();
        // libbpf_rs::Link is not Send: create the iterator fd inside the
        // namespace from the link's raw fd.
        let link_fd = link.as_fd().as_raw_fd();
        netns::scoped(ns, move || -> Result<()> {
            // SAFETY: plain syscall wrapper on a valid link fd.
            let fd = unsafe { libbpf_sys::bpf_iter_create(link_fd) };
            if fd < 0 {
                anyhow::bail!(
                    "creating the TCP iterator in '{name}': {}",
                    std::io::Error::from_raw_os_error(-fd)
                );
            }
            // SAFETY: fd was just returned to us and is owned here.
            let mut it = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let mut sink = Vec::new();
            it.read_to_end(&mut sink)
                .with_context(|| format!("walking TCP sockets in '{name}'"))?;
            Ok(())
        })?;
        drop(link);
        Ok(())
    }

    fn load_listeners(&mut self) {
        let m = &self.skel.maps.tcp_listeners;
        for k in m.keys() {
            if k.len() >= std::mem::size_of::<rttscope_listener_key>() {
                let netns = u32::from_ne_bytes(k[0..4].try_into().unwrap());
                let port = u16::from_ne_bytes(k[4..6].try_into().unwrap());
                self.listeners.insert((netns, port));
            }
        }
    }

    /// Sum of one per-CPU counter.
    pub fn counter(&self, c: C) -> u64 {
        let key = c.0.to_ne_bytes();
        match self
            .skel
            .maps
            .tcp_counters
            .lookup_percpu(&key, MapFlags::ANY)
        {
            Ok(Some(per_cpu)) => per_cpu
                .iter()
                .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8])))
                .sum(),
            _ => 0,
        }
    }

    /// The current report epoch (win_* values of flows belong to it when equal).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Start a new report interval: flows' win_min/win_max restart.
    pub fn next_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.epoch = self.epoch;
        }
    }

    /// Read every flow entry (batched: a few syscalls for thousands of
    /// flows), handing each to `f` without keeping them all in memory.
    pub fn for_each_flow(&self, f: impl FnMut(TcpFlowState)) -> Result<()> {
        let hwm = self
            .skel
            .maps
            .bss_data
            .as_deref()
            .map_or(u64::MAX, |b| b.slots_hwm);
        read_slots(
            self.skel.maps.tcp_flows.as_fd(),
            hwm,
            self.info.max_flows,
            &self.listeners,
            f,
        )
    }

    /// Read every flow entry.
    pub fn read_flows(&self) -> Result<Vec<TcpFlowState>> {
        let mut out = Vec::new();
        self.for_each_flow(|s| out.push(s))?;
        Ok(out)
    }

    /// Give a flow's slot back (after it was reported closed, or to evict it).
    pub fn forget(&self, slot: u32, gen: u32) -> Result<()> {
        free_slot(
            self.skel.maps.tcp_flows.as_fd(),
            self.skel.maps.tcp_free_slots.as_fd(),
            slot,
            gen,
        )
    }

    /// The raw-sample ring buffer map (for `--raw`).
    pub fn events_map(&self) -> &libbpf_rs::Map<'static> {
        &self.skel.maps.tcp_events
    }

    /// IDs of the loaded programs (for run-time statistics).
    pub fn prog_ids(&self) -> Vec<(&'static str, u32)> {
        use libbpf_rs::AsRawLibbpf;
        let id = |p: &libbpf_rs::Program| {
            // SAFETY: valid program handle from the loaded skeleton.
            let fd = unsafe { libbpf_sys::bpf_program__fd(p.as_libbpf_object().as_ptr()) };
            let mut info = libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
            // SAFETY: info is a valid out-buffer of `len` bytes.
            unsafe {
                libbpf_sys::bpf_obj_get_info_by_fd(
                    fd,
                    (&mut info as *mut libbpf_sys::bpf_prog_info).cast(),
                    &mut len,
                )
            };
            info.id
        };
        let mut ids = vec![
            ("tcp_sockops", id(&self.skel.progs.rttscope_sockops)),
            ("tcp_iter", id(&self.skel.progs.rttscope_iter_tcp)),
        ];
        if self.ack_link.is_some() {
            ids.push(("tcp_ack_hook", id(&self.skel.progs.rttscope_ack_rtt)));
        }
        ids
    }
}

/// Decode one `tcp_flows` slot (key: the slot index; value bytes as read
/// from the map); `None` for a free slot. Flows whose side the kernel could
/// not tell (found by the iterator) are servers if their local port was
/// listening in their namespace. Shared by both loaders.
pub fn decode_flow(k: &[u8], v: &[u8], listeners: &HashSet<(u32, u16)>) -> Option<TcpFlowState> {
    let slot = u32::from_ne_bytes(k.get(..4)?.try_into().ok()?);
    let val: TcpFlow = bpf::decode(v).ok()?;
    if val.flags & FLOW_IN_USE == 0 {
        return None;
    }
    let key = val.key;
    let flow = Flow::from_key(&key)?;
    let mut side = Side::from_raw(val.side);
    if side == Side::Unknown {
        side = if listeners.contains(&(key.netns, key.lport)) {
            Side::Server
        } else {
            Side::Client
        };
    }
    let agg = &val.agg;
    let (min, max) = if agg.samples > 0 {
        (Some(agg.min_us), Some(agg.max_us))
    } else {
        (None, None)
    };
    Some(TcpFlowState {
        slot,
        gen: val.gen,
        cookie: val.cookie,
        flow,
        side,
        origin: origin_name(val.origin),
        state: val.state,
        closed: val.flags & FLOW_CLOSED != 0,
        srtt_fallback: val.flags & FLOW_SRTT_FALLBACK != 0,
        samples: agg.samples,
        counts: Box::new(agg.hist),
        sum_us: agg.sum_us,
        life_min_us: min,
        life_max_us: max,
        srtt_us: val.srtt_us,
        last_rtt_us: agg.last_rtt_us,
        retrans: val.retrans,
        win_epoch: agg.win_epoch,
        win_min_us: agg.win_min_us,
        win_max_us: agg.win_max_us,
    })
}

const FLOW_SRTT_FALLBACK: u8 = F::RTTSCOPE_FLOW_SRTT_FALLBACK.0 as u8;
const FLOW_CLOSED: u8 = F::RTTSCOPE_FLOW_CLOSED.0 as u8;
const FLOW_IN_USE: u8 = F::RTTSCOPE_FLOW_IN_USE.0 as u8;

/// Read the taken slots of the flow array (up to the high-water mark),
/// decoded, one at a time. Shared by both loaders.
pub(crate) fn read_slots(
    flows: BorrowedFd<'_>,
    hwm: u64,
    max_flows: u32,
    listeners: &HashSet<(u32, u16)>,
    mut f: impl FnMut(TcpFlowState),
) -> Result<()> {
    let limit = hwm.min(max_flows as u64) as usize;
    crate::bpf_syscall::lookup_batch(
        flows,
        std::mem::size_of::<u32>(),
        std::mem::size_of::<TcpFlow>(),
        limit,
        |k, v| {
            if let Some(s) = decode_flow(k, v, listeners) {
                f(s);
            }
        },
    )
    .context("reading the TCP view's flow slots")
}

/// Give slot `slot` (taken with generation `gen`) back: mark it free with
/// the next generation, so its socket, if still alive, no longer matches
/// (it takes a new slot at its next sample), then push it on the free stack.
pub(crate) fn free_slot(
    flows: BorrowedFd<'_>,
    stack: BorrowedFd<'_>,
    slot: u32,
    gen: u32,
) -> Result<()> {
    let v = TcpFlow {
        gen: gen.wrapping_add(1),
        ..Default::default()
    };
    crate::bpf_syscall::update(flows, Some(&slot.to_ne_bytes()), bpf::as_bytes(&v), 0)
        .with_context(|| format!("freeing TCP flow slot {slot}"))?;
    crate::bpf_syscall::update(stack, None, &slot.to_ne_bytes(), 0)
        .with_context(|| format!("returning TCP flow slot {slot} to the free stack"))
}

pub(crate) fn cidr_key(c: &ipnet::IpNet) -> rttscope_cidr_key {
    let mut k = rttscope_cidr_key::default();
    match c {
        ipnet::IpNet::V4(n) => {
            k.prefixlen = 96 + n.prefix_len() as u32;
            k.addr = n.network().to_ipv6_mapped().octets();
        }
        ipnet::IpNet::V6(n) => {
            k.prefixlen = n.prefix_len() as u32;
            k.addr = n.network().octets();
        }
    }
    k
}

pub(crate) fn rtt_source() -> String {
    let (maj, min) = crate::preflight::kernel_version();
    if (maj, min) >= (6, 10) {
        "RTT_CB args: per-ACK-window RTT sample (args[0]) and new srtt (args[1]/8)".into()
    } else {
        "srtt fallback: kernel < 6.10 passes no RTT_CB arguments, samples are TCP's previous srtt"
            .into()
    }
}

/// TCP state names (include/net/tcp_states.h).
pub fn state_name(s: u8) -> &'static str {
    match s {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        _ => "?",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 18 item 9: `--max-flows 0` became 16 silently (the sampler refuses it) and
    /// `--max-flows 4294967295` reached the kernel and failed as ENOMEM.
    #[test]
    fn max_flows_is_bounded_like_the_sampler() {
        let cfg = |max_flows| TcpViewConfig {
            max_flows,
            ..Default::default()
        };
        for bad in [0, crate::sampler::MAX_TABLE + 1, u32::MAX] {
            let e = cfg(bad).validate().map(|_| "accepted".to_string());
            let e = e.unwrap_or_else(|e| e.to_string());
            assert_eq!(
                e,
                format!("--max-flows must be between 1 and 16777216, not {bad} (the flow tables take up to 1 KiB per flow)"),
                "--max-flows {bad}"
            );
            // The sampler says the same.
            let s = crate::sampler::SamplerConfig {
                max_flows: bad,
                ..Default::default()
            };
            assert_eq!(s.validate().unwrap_err().to_string(), e);
        }
        for good in [1, 16, 16384, crate::sampler::MAX_TABLE] {
            cfg(good).validate().unwrap();
        }
    }

    /// ENOMEM at load is reported as memory, with the size asked for; anything else keeps the
    /// verifier/BTF hint.
    #[cfg(feature = "libbpf")]
    #[test]
    fn enomem_at_load_is_a_memory_problem() {
        let e = load_error(libbpf_rs::Error::from_raw_os_error(libc::ENOMEM), 4096).to_string();
        assert!(
            e.contains("not enough memory for its maps of 4096 flows") && !e.contains("verifier"),
            "{e}"
        );
        let e = load_error(libbpf_rs::Error::from_raw_os_error(libc::EINVAL), 4096);
        assert!(
            format!("{e:#}").contains("verifier or BTF problem"),
            "{e:#}"
        );
    }

    #[test]
    fn ack_hook_modes() {
        assert!(!AckHook::Off.wanted());
        assert!(AckHook::Try.wanted() && AckHook::Require.wanted());
        // auto: only where the RTT callback carries no sample
        assert_eq!(
            AckHook::Auto.wanted(),
            crate::preflight::kernel_version() < (6, 10)
        );
        assert_eq!(AckHook::default(), AckHook::Auto);
        let e = anyhow::anyhow!("Operation not permitted (os error 1)").context("loading");
        assert_eq!(
            AckHook::Try.refused(&e).unwrap(),
            "refused: Operation not permitted (os error 1)"
        );
        let err = AckHook::Require.refused(&e).unwrap_err().to_string();
        assert!(
            err.contains("fexit/tcp_ack_update_rtt") && err.contains("Operation not permitted"),
            "{err}"
        );
    }

    #[test]
    fn cidr_keys() {
        let k = cidr_key(&"10.1.2.0/24".parse().unwrap());
        assert_eq!(k.prefixlen, 120);
        assert_eq!(&k.addr[10..], &[0xff, 0xff, 10, 1, 2, 0]);
        let k = cidr_key(&"fd00::/8".parse().unwrap());
        assert_eq!(k.prefixlen, 8);
        assert_eq!(k.addr[0], 0xfd);
    }

    #[test]
    fn counter_names_cover_all() {
        assert_eq!(COUNTER_NAMES.len(), C::RTTSCOPE_TC_COUNTERS.0 as usize);
        for (i, (c, _)) in COUNTER_NAMES.iter().enumerate() {
            assert_eq!(c.0 as usize, i);
        }
    }
}
