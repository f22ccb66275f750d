//! The TCP view: RTT as the TCP stack computes it, observed with a cgroup
//! sock_ops program (BPF_SOCK_OPS_RTT_CB) and an iter/tcp program for
//! connections that existed before attach. Loads `bpf/tcp.bpf.c`.
//!
//! Everything attached is a BPF link (cgroup link, iterator link): when the
//! process exits, even by SIGKILL, the kernel detaches it.
//!
//! Loaded, attached and read once for both loaders in `attach.rs` (through
//! `views::loader`); here: the configuration, the decoded flow state and the
//! decoding itself (`decode_flow`).
use std::collections::HashSet;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::Hist;
use crate::bpf::tcp::types::{
    rttscope_cidr_key, rttscope_flow_flags as F, rttscope_tcp_counter as C,
};
use crate::bpf::{self, TcpFlow};
use crate::sys::netns::NetNs;
use crate::views::fine::FinePool;

/// What to observe.
#[derive(Debug, Clone, Default)]
pub struct TcpViewConfig {
    /// cgroup v2 directory for the sock_ops program (default: the root).
    pub cgroup: Option<PathBuf>,
    /// Restrict to these namespaces (empty: all).
    pub netns_filter: Vec<NetNs>,
    /// Namespaces whose existing connections the iterator enables.
    pub iter_netns: Vec<NetNs>,
    /// `iter_netns` is every namespace (`--all-netns`).
    pub all_netns: bool,
    pub ports: Vec<u16>,
    pub cidrs: Vec<ipnet::IpNet>,
    pub raw: bool,
    pub max_flows: u32,
    /// The optional per-ACK hook (fexit/tcp_ack_update_rtt).
    pub ack_hook: AckHook,
}

/// The optional per-ACK hook's attach point.
pub const ACK_HOOK: &str = "fexit/tcp_ack_update_rtt";

/// `ack_hook` where the build without atomics' hook is attached: it times only the connections
/// open before attach (found by address in `tcp_existing`); the RTT callback has the others.
pub const HOOK_EXISTING_ONLY: &str = "attached: connections open before attach only";

/// Whether to use the optional per-ACK hook (`rtt_tcp_ack`, fexit on
/// tcp_ack_update_rtt): the sample the kernel feeds tcp_rtt_estimator(), on
/// any kernel that allows fentry/fexit (many production kernels do; this
/// project's test kernel refuses them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AckHook {
    /// Use it where the feature probes say it attaches and something needs it: the RTT callback
    /// carries no sample, or the iterator cannot turn on the callbacks of connections open before
    /// attach (`rttscope features`); else off.
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
            AckHook::Auto => {
                let f = crate::views::features::Features::get();
                f.ack_hook_usable() && (!f.rtt_cb_args.ok || !f.iter_setsockopt.ok)
            }
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

/// How the view is hooked in, for report headers and JSON.
#[derive(Debug, Clone, Serialize)]
pub struct TcpHookInfo {
    pub hook: String,
    pub cgroup: String,
    pub iter_netns: Vec<String>,
    /// `--all-netns`: the namespaces the iterator could not enter, each "name: why" (skipped,
    /// not the end of the run; connections open there before the start are not timed).
    pub netns_skipped: Vec<String>,
    pub existing_enabled: u64,
    /// How connections open before attach are timed here, and why (from the feature probes and
    /// the per-ACK hook's outcome).
    pub existing_path: String,
    /// Connections open before attach that the iterator found and no path can time (kernels
    /// that refuse both bpf_setsockopt from iter/tcp and the per-ACK hook).
    pub existing_not_timed: u64,
    pub rtt_source: String,
    /// The optional per-ACK hook: "attached", "off" or "refused: <reason>"; in the build without
    /// atomics, where it times only connections open before attach, [`HOOK_EXISTING_ONLY`] (or
    /// "not attached: ..." when there were none).
    pub ack_hook: String,
    pub kernel: String,
    /// Set only where the view runs its build without BPF atomics that
    /// return a value (bpf/tcp.bpf.c with RTTSCOPE_NO_ATOMICS), and why;
    /// absent (and not in the JSON) with the atomics build.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without_atomics: Option<String>,
    pub max_flows: u32,
    /// Kernel IDs of our programs (bpftool prog show id N).
    pub prog_ids: Vec<u32>,
}

impl TcpViewConfig {
    /// Limits the kernel maps impose, checked before anything is loaded (both loaders).
    pub fn validate(&self) -> anyhow::Result<()> {
        crate::views::scope::check_max_flows(self.max_flows)?;
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
            netns_skipped: Vec::new(),
            existing_enabled: 0,
            existing_path: String::new(),
            existing_not_timed: 0,
            rtt_source: rtt_source(),
            ack_hook: "off".into(),
            kernel: crate::sys::preflight::kernel_release(),
            without_atomics: None,
            max_flows,
            prog_ids: Vec::new(),
        }
    }

    /// Record which object build was loaded (`without_atomics`).
    pub(crate) fn with_atomics(mut self, c: &crate::views::features::AtomicsChoice) -> Self {
        self.without_atomics = (!c.used).then(|| {
            format!(
                "{}: kernel programs built without them (fresh flow slots and fine-histogram entries popped from stacks rttscope fills; the same samples)",
                c.why
            )
        });
        self
    }

    /// `--all-netns`: the iterator could not enter `name` (`why`); it is no longer among the
    /// namespaces it ran in.
    pub(crate) fn skip_netns(&mut self, name: &str, why: &crate::sys::netns::EnterError) {
        self.iter_netns.retain(|n| n != name);
        self.netns_skipped.push(format!("{name}: {why}"));
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

    /// After the iterator ran: how existing connections are timed, and how many are not.
    pub(crate) fn set_existing(&mut self, enabled: u64, setsockopt_failed: u64) {
        self.existing_enabled = enabled;
        // Not probed here (no loopback connection): what the iterator did decides.
        let probe = &crate::views::features::Features::get().iter_setsockopt;
        let iter_ok = probe.ok || !probe.probed;
        self.existing_path = if iter_ok && setsockopt_failed == 0 {
            "iterator: iter/tcp turns their RTT callback on (bpf_setsockopt)".into()
        } else if self.ack_hook_attached() {
            "per-ACK hook: iter/tcp records them (bpf_setsockopt refused there), fexit/tcp_ack_update_rtt times them; their close is not seen".into()
        } else {
            "none: bpf_setsockopt from iter/tcp refused and the per-ACK hook not attached; they are not timed".into()
        };
        self.existing_not_timed = if self.ack_hook_attached() {
            0
        } else {
            setsockopt_failed
        };
    }

    /// After the iterator, in the build without atomics (kernels < 5.12): the hook's outcome
    /// (`linked`: attached, or why not), how many connections open before attach the iterator
    /// recorded for it (`recorded`), counted as not timed (`uncounted`: no hook loaded) and
    /// could not record (`full`: `tcp_existing` full).
    pub(crate) fn set_existing_table(
        &mut self,
        linked: Result<(), String>,
        recorded: u64,
        uncounted: u64,
        full: u64,
    ) {
        self.existing_enabled = recorded;
        match linked {
            Ok(()) => {
                self.ack_hook = HOOK_EXISTING_ONLY.into();
                self.hook = format!("cgroup sock_ops: BPF_SOCK_OPS_RTT_CB (+ iter/tcp for existing connections, timed by {ACK_HOOK})");
                self.existing_path = format!("per-ACK hook, by socket address: iter/tcp records them in a bounded table (tcp_existing: no socket storage in iter/tcp nor fexit here, build without BPF atomics), {ACK_HOOK} times them from their first ACK after attach; their close is not seen");
                self.existing_not_timed = full;
            }
            Err(status) => {
                if status.starts_with("not attached") {
                    // loaded, with nothing to time
                    self.existing_path = format!("per-ACK hook, by socket address (no connection open before attach: {ACK_HOOK} not attached)");
                    self.existing_not_timed = uncounted + full;
                } else {
                    self.existing_path = "none: the build without BPF atomics (kernels < 5.12) cannot turn their callbacks on (bpf_setsockopt from iter/tcp) nor give them socket storage, and the per-ACK hook is not attached; they are not timed".into();
                    self.existing_not_timed = uncounted + recorded + full;
                }
                self.ack_hook = status;
            }
        }
    }

    /// Whether the per-ACK hook has the samples.
    pub fn ack_hook_attached(&self) -> bool {
        self.ack_hook == "attached"
    }

    /// Whether the per-ACK hook is attached at all (every sample, or those of connections open
    /// before attach in the build without atomics).
    pub fn ack_hook_linked(&self) -> bool {
        self.ack_hook_attached() || self.ack_hook == HOOK_EXISTING_ONLY
    }

    /// The RTT source in a few words (report headers).
    pub fn rtt_source_short(&self) -> &'static str {
        if self.ack_hook_attached() {
            "fexit tcp_ack_update_rtt"
        } else if self.rtt_source.starts_with("srtt") {
            "srtt fallback (kernel < 6.10)"
        } else if self.rtt_source.starts_with("RTT_CB args or srtt") {
            "RTT_CB args or srtt (not probed)"
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
    /// The socket's cgroup v2: low 32 bits of its id (the directory's inode; 0: none).
    pub cgroup: u32,
    /// Its owner, when `--label-workload` asked for it (filled by the session, not the view).
    pub workload: Option<std::sync::Arc<crate::analysis::workload::Workload>>,
    pub flow: Flow,
    pub side: Side,
    pub origin: &'static str,
    pub state: u8,
    pub closed: bool,
    pub srtt_fallback: bool,
    pub samples: u64,
    /// Cumulative histogram counts over the flow's life, its non-empty
    /// buckets (index in the kernel's layout, count), ascending; empty before
    /// the first binned sample. Read from the pool.
    pub counts: crate::analysis::hist::Buckets,
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
    /// Its handshake RTT, us (client: SYN -> SYN-ACK; server: SYN-ACK -> ACK); None for a
    /// connection open before attach or one whose handshake left no sample (Karn).
    pub handshake_us: Option<u32>,
}

/// Counter names, in the order of `enum rttscope_tcp_counter`.
pub const COUNTER_NAMES: &[(C, &str)] = &[
    (C::RTTSCOPE_TCP_RTT_CB_SKIPPED, "rtt_callbacks_skipped"),
    (C::RTTSCOPE_TCP_SAMPLES, "samples"),
    (C::RTTSCOPE_TCP_SRTT_FALLBACK, "srtt_fallback_samples"),
    (C::RTTSCOPE_TCP_FLOWS_CREATED, "flows_created"),
    (C::RTTSCOPE_TCP_FLOW_MAP_FULL, "flow_map_full"),
    (C::RTTSCOPE_TCP_FILTERED, "connections_filtered"),
    (C::RTTSCOPE_TCP_ENABLED, "connections_enabled"),
    (C::RTTSCOPE_TCP_ITER_SOCKETS, "iter_sockets"),
    (
        C::RTTSCOPE_TCP_ITER_SETSOCKOPT_FAIL,
        "iter_setsockopt_failed",
    ),
    (C::RTTSCOPE_TCP_RETRANS, "retransmits"),
    (C::RTTSCOPE_TCP_CLOSED, "flows_closed"),
    (C::RTTSCOPE_TCP_RAW_EVENTS, "raw_events"),
    (C::RTTSCOPE_TCP_RAW_DROPS, "raw_events_dropped"),
    (C::RTTSCOPE_TCP_NO_SOCK, "no_socket"),
    (C::RTTSCOPE_TCP_HINT_MISSES, "rtt_hint_misses"),
    (C::RTTSCOPE_TCP_NOT_BINNED, "samples_not_binned"),
    (C::RTTSCOPE_TCP_POOL_OVERFLOW, "samples_pool_overflow"),
    (C::RTTSCOPE_TCP_EXISTING_TABLE_FULL, "existing_table_full"),
    (C::RTTSCOPE_TCP_EXISTING_TABLE_STALE, "existing_table_stale"),
    (C::RTTSCOPE_TCP_EXISTING_SAMPLES, "existing_hook_samples"),
    (C::RTTSCOPE_TCP_HS_REFUSED, "handshake_failed_refused"),
    (C::RTTSCOPE_TCP_HS_TIMED_OUT, "handshake_failed_timed_out"),
    (
        C::RTTSCOPE_TCP_HS_UNREACHABLE,
        "handshake_failed_unreachable",
    ),
    (C::RTTSCOPE_TCP_HS_RESET, "handshake_failed_reset"),
    (C::RTTSCOPE_TCP_HS_ABANDONED, "handshake_failed_abandoned"),
    (C::RTTSCOPE_TCP_HS_SYN_RETRANS, "handshake_syn_retransmits"),
    (
        C::RTTSCOPE_TCP_HS_SYNACK_RETRANS,
        "handshake_synack_retransmits",
    ),
    (C::RTTSCOPE_TCP_HS_NOT_MEASURED, "handshake_not_measured"),
];

/// Size of the kernel's `tcp_hints` array for `max_flows` slots: a power of
/// two, at least twice the slots, so that few live sockets share a hint.
/// The programs index it with `cfg_hint_mask` = this - 1.
pub fn hint_entries(max_flows: u32) -> u32 {
    max_flows.max(16).saturating_mul(2).next_power_of_two()
}

impl TcpFlowState {
    /// The cumulative histogram (exact life min/max).
    pub fn hist(&self) -> Hist {
        Hist::from_sparse(
            &self.counts,
            self.sum_us,
            self.life_min_us,
            self.life_max_us,
        )
    }

    /// The samples since `prev`, a snapshot of this flow's histogram at an earlier read (all of
    /// them for a flow not read before).
    pub fn since(&self, prev: Option<&crate::analysis::hist::Snapshot>) -> Hist {
        match prev {
            Some(p) => p.delta_sparse(&self.counts, self.sum_us),
            None => self.hist(),
        }
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

/// Decode one `tcp_flows` slot (key: the slot index; value bytes as read
/// from the map); `None` for a free slot. Flows whose side the kernel could
/// not tell (found by the iterator) are servers if their local port was
/// listening in their namespace. The histogram, its sum and min/max are the
/// flow's as read from the fine-histogram pool (`fine`; the interval min/max
/// belong to report epoch `epoch`). Shared by both loaders.
pub fn decode_flow(
    slot: u32,
    val: &TcpFlow,
    listeners: &HashSet<(u32, u16)>,
    fine: &FinePool,
    epoch: u32,
) -> Option<TcpFlowState> {
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
    let acc = fine.get(slot, val.gen);
    let (min, max) = acc.map_or((None, None), |a| a.range());
    let win = acc.and_then(|a| a.interval_range(fine.interval()));
    Some(TcpFlowState {
        slot,
        gen: val.gen,
        cookie: val.cookie,
        cgroup: val.cgroup,
        workload: None,
        flow,
        side,
        origin: origin_name(val.origin),
        state: val.state,
        // closed in a generation already read: all its samples are in
        // (else it is reported closed at the next read)
        closed: val.flags & FLOW_CLOSED != 0
            && (agg.reserved as u64) <= fine.generation() % (1 << 32),
        srtt_fallback: val.flags & FLOW_SRTT_FALLBACK != 0,
        samples: agg.samples,
        counts: acc.map_or_else(Default::default, |a| a.buckets().iter().copied().collect()),
        sum_us: acc.map_or(0, |a| a.sum_us),
        life_min_us: min,
        life_max_us: max,
        srtt_us: val.srtt_us,
        last_rtt_us: agg.last_rtt_us,
        retrans: val.retrans,
        win_epoch: if win.is_some() {
            epoch
        } else {
            epoch.wrapping_sub(1)
        },
        win_min_us: win.map_or(u32::MAX, |w| w.0),
        win_max_us: win.map_or(0, |w| w.1),
        handshake_us: (val.handshake_us > 0).then_some(val.handshake_us),
    })
}

const FLOW_SRTT_FALLBACK: u8 = F::RTTSCOPE_FLOW_SRTT_FALLBACK.0 as u8;
const FLOW_CLOSED: u8 = F::RTTSCOPE_FLOW_CLOSED.0 as u8;
const FLOW_IN_USE: u8 = F::RTTSCOPE_FLOW_IN_USE.0 as u8;

/// Read the taken slots of the flow array (up to the high-water mark),
/// decoded, one at a time, in place through a mapping made for the read
/// (the array is `BPF_F_MMAPABLE`: a `BPF_MAP_LOOKUP_BATCH` copy of every
/// slot to userspace was a third of an idle read's cost at 100,000 flows).
/// A slot is read while the programs may update it, as the batch copy did:
/// its own fields say whether it is in use. Shared by both loaders.
pub(crate) fn read_slots(
    flows: BorrowedFd<'_>,
    hwm: u64,
    max_flows: u32,
    listeners: &HashSet<(u32, u16)>,
    fine: &FinePool,
    epoch: u32,
    mut f: impl FnMut(TcpFlowState),
) -> Result<()> {
    const SIZE: usize = std::mem::size_of::<TcpFlow>();
    // an array's element is its value rounded up to 8 bytes: no gap between slots here
    const _: () = assert!(SIZE.is_multiple_of(8));
    let limit = hwm.min(max_flows as u64) as usize;
    if limit == 0 {
        return Ok(());
    }
    crate::sys::mmap::for_each_element(flows, 0, limit, SIZE, |slot, bytes| {
        // SAFETY: one slot of the mapping into a value of a plain C type
        // (every bit pattern valid); volatile: the programs write it concurrently.
        let val: TcpFlow = unsafe { std::ptr::read_volatile(bytes.as_ptr().cast::<TcpFlow>()) };
        if let Some(s) = decode_flow(slot as u32, &val, listeners, fine, epoch) {
            f(s);
        }
    })
    .context("mapping the TCP view's flow slots")
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
    crate::sys::bpf::update(flows, Some(&slot.to_ne_bytes()), bpf::as_bytes(&v), 0)
        .with_context(|| format!("freeing TCP flow slot {slot}"))?;
    crate::sys::bpf::update(stack, None, &slot.to_ne_bytes(), 0)
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
    let probe = &crate::views::features::Features::get().rtt_cb_args;
    if probe.ok {
        "RTT_CB args: per-ACK-window RTT sample (args[0]) and new srtt (args[1]/8)".into()
    } else if !probe.probed {
        format!(
            "RTT_CB args or srtt: the arguments where this kernel passes them (6.10+), else TCP's previous srtt (counted as srtt_fallback_samples); {}",
            probe.detail
        )
    } else {
        "srtt fallback: this kernel's RTT_CB passes no arguments (probed; added in 6.10), samples are TCP's previous srtt"
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

pub(crate) mod attach;
pub mod lines;
mod listen;
pub mod options;
pub mod plan;
pub mod track;

pub use options::DEF;

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
        for bad in [0, crate::views::scope::MAX_FLOWS + 1, u32::MAX] {
            let e = cfg(bad).validate().map(|_| "accepted".to_string());
            let e = e.unwrap_or_else(|e| e.to_string());
            assert_eq!(
                e,
                format!("--max-flows must be between 1 and 16777216, not {bad} (the flow tables take up to 5.3 KiB per flow)"),
                "--max-flows {bad}"
            );
            // The sampler says the same.
            let s = crate::views::sampler::SamplerConfig {
                max_flows: bad,
                ..Default::default()
            };
            assert_eq!(s.validate().unwrap_err().to_string(), e);
        }
        for good in [1, 16, 16384, crate::views::scope::MAX_FLOWS] {
            cfg(good).validate().unwrap();
        }
    }

    #[test]
    fn existing_table_outcomes() {
        let cfg = TcpViewConfig::default();
        let p = std::path::Path::new("/sys/fs/cgroup");
        // attached: every recorded connection timed, a full table's refusals not
        let mut i = TcpHookInfo::new(&cfg, p, 64);
        i.set_existing_table(Ok(()), 5, 0, 2);
        assert_eq!(i.ack_hook, HOOK_EXISTING_ONLY);
        assert!(i.ack_hook_linked() && !i.ack_hook_attached());
        assert!(i
            .existing_path
            .starts_with("per-ACK hook, by socket address"));
        assert_eq!((i.existing_enabled, i.existing_not_timed), (5, 2));
        // loaded, none to time: not attached, nothing untimed
        let mut i = TcpHookInfo::new(&cfg, p, 64);
        i.set_existing_table(Err("not attached: none".into()), 0, 0, 0);
        assert!(!i.ack_hook_linked());
        assert!(i.existing_path.starts_with("per-ACK hook"));
        assert_eq!(i.existing_not_timed, 0);
        // off (the iterator only counted them) or refused after recording: all untimed
        let mut i = TcpHookInfo::new(&cfg, p, 64);
        i.set_existing_table(Err("off".into()), 0, 3, 0);
        assert!(i.existing_path.starts_with("none"));
        assert_eq!(i.existing_not_timed, 3);
        let mut i = TcpHookInfo::new(&cfg, p, 64);
        i.set_existing_table(Err("refused: EPERM".into()), 4, 0, 1);
        assert!(i.existing_path.starts_with("none"));
        assert_eq!(i.existing_not_timed, 5);
    }

    #[test]
    fn ack_hook_modes() {
        assert!(!AckHook::Off.wanted());
        assert!(AckHook::Try.wanted() && AckHook::Require.wanted());
        // auto: where the probes say it attaches and a path needs it
        let f = crate::views::features::Features::get();
        assert_eq!(
            AckHook::Auto.wanted(),
            f.ack_hook.ok
                && (!f.atomics_choice().used || f.sk_storage_fexit.ok)
                && (!f.rtt_cb_args.ok || !f.iter_setsockopt.ok)
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
        assert_eq!(COUNTER_NAMES.len(), C::RTTSCOPE_TCP_COUNTERS.0 as usize);
        for (i, (c, _)) in COUNTER_NAMES.iter().enumerate() {
            assert_eq!(c.0 as usize, i);
        }
    }
}
