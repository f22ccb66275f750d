//! The sampler view: loader and reader for `bpf/sampler.bpf.c`, a
//! cloud-style (`vm_flow/rtt`) packet sampler at tc ingress/egress.
//!
//! Attachment. One copy of the object is loaded per network namespace and
//! link type of the interfaces, with that namespace's inode and the link
//! type in its `.rodata`, and attached to every interface of that namespace
//! and type (the interface is `skb->ifindex`; `follow.rs` attaches and
//! releases interfaces as `--iface` patterns match them); every copy after
//! the first reuses the first copy's maps
//! (`bpf_map__reuse_fd`), so the flow table, counters and the ring buffer
//! are shared. This is how the namespace reaches the kernel side:
//! ifindexes collide across namespaces (both ends of a veth pair between two
//! fresh namespaces are often ifindex 2), `skb->sk` is absent at ingress and
//! for forwarded traffic, and kfuncs (`bpf_cast_to_kern_ctx`) are off limits
//! for a later aya loader.
//!
//! The programs are `SEC("classifier")` (type SCHED_CLS, no expected attach
//! type), the only tc section aya 0.14 accepts. They are attached as tcx links
//! with `BPF_LINK_CREATE(prog_fd, ifindex, BPF_TCX_INGRESS/EGRESS)` called
//! from a thread inside the interface's namespace: the kernel accepts tcx
//! attach types for any SCHED_CLS program, so no expected attach type is
//! needed. A link detaches when its fd closes (also when the process dies).
//! When tcx is unavailable (kernel < 6.6) or `AttachMode::Clsact` is asked
//! for, a clsact filter with our handle/priority is used instead; filters of
//! ours left by a crashed run are removed before attaching, and ours are
//! removed on drop.
//!
//! The attached view (`attach::Sampler`) is written once, in `attach.rs`, against the loader
//! layer (either loader, chosen by `LoaderKind`; tcx or clsact attached by
//! `tc.rs`; clsact needs the libbpf feature's netlink code). It decodes with
//! the shared functions below ([`flow_stats`],
//! [`derived_counters`], [`read_table`]); raw samples are the views'
//! common [`crate::views::RawSamples`] stream, its `bpf::Event`s decoded
//! with [`SamplerSample::from_event`] into [`crate::views::RawSample`]s.
//!
//! Flow table. `sampler_table` is a BPF array of [`SamplerConfig::table_entries`]
//! entries, set-associative (`RTTSCOPE_SAMPLER_WAYS` ways per set): the
//! programs hash the flow key themselves (a random seed per view) and keep the LRU order within a set; each entry holds the
//! flow key, its pending segments and its histogram. Userspace reads it whole
//! with `BPF_MAP_LOOKUP_BATCH` and skips empty ways.
// The aya-only build keeps everything but the clsact code (libbpf's netlink).
#![cfg_attr(not(feature = "libbpf"), allow(unused_imports, dead_code))]

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::bpf::{self, sampler::types as t, Event, FlowKey, SamplerFlow};

/// One way of the flow table (`struct rttscope_sampler_entry`).
pub(crate) type TableEntry = t::rttscope_sampler_entry;
// SAFETY: a generated `#[repr(C)]` struct of integers and arrays of integers
// (Copy, no pointers, no invariants): any bit pattern is a valid value.
unsafe impl plain::Plain for TableEntry {}
const _: () = assert!(std::mem::size_of::<TableEntry>() == 256);
const _: () = assert!(std::mem::size_of::<TableEntry>().is_multiple_of(64));
const _: () = assert!(std::mem::offset_of!(TableEntry, key) == 0);
const _: () = assert!(std::mem::offset_of!(TableEntry, pend) == 56);
const WAYS: u32 = t::rttscope_sampler_consts::RTTSCOPE_SAMPLER_WAYS.0;
const MIN_TABLE: u32 = t::rttscope_sampler_consts::RTTSCOPE_SAMPLER_MIN_TABLE.0;
/// Largest flow table (entries): 84 GiB of kernel memory at 5.25 KiB each (the kernel refuses
/// what it cannot allocate: ENOMEM at load, reported as such).
pub const MAX_TABLE: u32 = crate::views::scope::MAX_FLOWS;
use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::Hist;
use crate::sys::netns::{self, NetNs};
use crate::views::fine::{FineAcc, FinePool};

/// Base of our clsact filters' handles and priorities ("rs"): an observer in
/// clsact mode uses `base + k` for the slot k it claims (views/sampler/tc.rs).
pub const CLSACT_HANDLE: u32 = 0x7273;
pub const CLSACT_PRIORITY: u32 = 0x7273;
/// Names of our programs (the kernel keeps 15 characters).
pub const PROG_EGRESS: &str = "rtt_sampler_egr";
pub const PROG_INGRESS: &str = "rtt_sampler_ing";
/// The maps every copy of the object shares (the first copy creates them).
pub(crate) const SHARED_MAPS: [&str; 7] = [
    "sampler_table",
    "sampler_counters",
    "sampler_hooks",
    "fine_pool",
    "fine_pool_ctl",
    "fine_ring",
    "sampler_events",
];
/// The same for the build without BPF atomics (bpf/sampler_noatomic.bpf.h):
/// the ways' locks and the pool's free stacks too.
pub(crate) const SHARED_MAPS_NOATOMIC: [&str; 10] = [
    "sampler_table",
    "sampler_counters",
    "sampler_hooks",
    "fine_pool",
    "fine_pool_ctl",
    "fine_ring",
    "sampler_events",
    "sampler_locks",
    "fine_pool_free0",
    "fine_pool_free1",
];
/// Raw samples kept in userspace between two reads; beyond this they are counted and dropped.
const ARPHRD_ETHER: u16 = 1;
const ARPHRD_LOOPBACK: u16 = 772;
const ARPHRD_NONE: u16 = 0xfffe;

/// How one interface is attached (for the report header).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AttachInfo {
    pub iface: String,
    pub netns: String,
    pub netns_inode: u32,
    pub ifindex: u32,
    /// "tcx" or "clsact".
    pub how: String,
    /// clsact: the priority of our filters (the same on both hooks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u16>,
    /// Link layer: "ether" or "none".
    pub link: String,
    /// The `--iface` pattern that matched it (followed: released when it vanishes); None for
    /// an interface given by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
}

/// One flow's sampler statistics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SamplerFlowStats {
    pub flow: Flow,
    /// TCP, or ICMP/ICMPv6 echo.
    pub kind: FlowKind,
    /// What the kernel knows of the side: TCP from the handshake it saw
    /// (SYN out: client, SYN-ACK out: server), ICMP pinger/pinged; else
    /// unknown (the session then asks the socket table).
    pub side: Side,
    /// Interface of the last sample (name, as attached).
    pub iface: String,
    /// Cumulative histogram since the flow was first sampled.
    pub hist: Hist,
    /// Samples in `hist` (read from the pool so far; the kernel's count may be ahead).
    pub samples: u64,
    pub last_rtt_us: u32,
    /// Min/max of samples since the previous `read_flows()` (None: no sample in it).
    pub interval_min_us: Option<u32>,
    pub interval_max_us: Option<u32>,
    pub first_ns: u64,
    pub last_ns: u64,
    /// The table entry (way) read, and its generation: a way re-keyed for
    /// another flow has a new `gen`, so (way, gen) names one flow's stay
    /// in the table.
    #[serde(skip)]
    pub way: u32,
    #[serde(skip)]
    pub gen: u64,
    /// Samples of every flow evicted from this way so far (read or not):
    /// with (way, gen), the samples of an evicted flow never read are
    /// `evicted_samples` growth minus what was read of it.
    #[serde(skip)]
    pub evicted_samples: u64,
}

/// One raw sample (ring buffer).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SamplerSample {
    pub flow: Flow,
    pub kind: FlowKind,
    /// The programs' own label: TCP from the handshake (unknown if not
    /// seen), ICMP pinger/pinged.
    pub side: Side,
    pub rtt_us: u32,
    pub ts_ns: u64,
    pub ifindex: u32,
    pub matching: Matching,
}

impl SamplerSample {
    pub fn from_event(e: &Event) -> Option<SamplerSample> {
        if e.r#type as u32 != t::rttscope_event_type::RTTSCOPE_EV_SAMPLER_RTT.0 {
            return None;
        }
        let (kind, icmp_side) = FlowKind::from_key(&e.key);
        Some(SamplerSample {
            flow: Flow::from_key(&e.key)?,
            kind,
            side: match kind {
                FlowKind::Tcp => Side::from_raw(e.side),
                _ => icmp_side,
            },
            rtt_us: e.rtt_us,
            ts_ns: e.ts_ns,
            ifindex: e.reserved2,
            matching: if e.flags as u32 == Matching::Tsval.raw() {
                Matching::Tsval
            } else {
                Matching::Seq
            },
        })
    }

    /// As every view's raw samples are read (`views::RawSample`): ICMP's
    /// protocol named, its matching `echo`.
    pub fn to_raw_sample(&self) -> crate::views::RawSample {
        let icmp = self.kind != FlowKind::Tcp;
        crate::views::RawSample {
            view: crate::views::ViewKind::Sampler,
            event: crate::views::RawEvent::Rtt,
            flow: self.flow,
            proto: icmp.then(|| self.kind.as_str()),
            side: self.side,
            ts_ns: self.ts_ns,
            rtt_us: self.rtt_us,
            srtt_us: None,
            matching: Some(if icmp { "echo" } else { self.matching.as_str() }),
        }
    }
}

use t::rttscope_sampler_counter as C;
/// Counter names, in the kernel's index order.
pub const COUNTERS: &[(&str, C)] = &[
    ("seen_egress", C::RTTSCOPE_SAMPLER_SEEN_EGRESS),
    ("seen_ingress", C::RTTSCOPE_SAMPLER_SEEN_INGRESS),
    ("sampled_egress", C::RTTSCOPE_SAMPLER_SAMPLED_EGRESS),
    ("sampled_ingress", C::RTTSCOPE_SAMPLER_SAMPLED_INGRESS),
    ("tcp_egress", C::RTTSCOPE_SAMPLER_TCP_EGRESS),
    ("tcp_ingress", C::RTTSCOPE_SAMPLER_TCP_INGRESS),
    ("recorded", C::RTTSCOPE_SAMPLER_RECORDED),
    ("samples", C::RTTSCOPE_SAMPLER_SAMPLES),
    ("no_data", C::RTTSCOPE_SAMPLER_NO_DATA),
    ("duplicate", C::RTTSCOPE_SAMPLER_DUPLICATE),
    ("slots_full", C::RTTSCOPE_SAMPLER_SLOTS_FULL),
    ("expired", C::RTTSCOPE_SAMPLER_EXPIRED),
    ("superseded", C::RTTSCOPE_SAMPLER_SUPERSEDED),
    ("ack_no_pending", C::RTTSCOPE_SAMPLER_ACK_NO_PENDING),
    ("ack_no_match", C::RTTSCOPE_SAMPLER_ACK_NO_MATCH),
    ("not_ack", C::RTTSCOPE_SAMPLER_NOT_ACK),
    ("no_timestamp", C::RTTSCOPE_SAMPLER_NO_TIMESTAMP),
    ("race", C::RTTSCOPE_SAMPLER_RACE),
    ("pending_created", C::RTTSCOPE_SAMPLER_PENDING_CREATED),
    ("pending_deleted", C::RTTSCOPE_SAMPLER_PENDING_DELETED),
    ("pending_map_full", C::RTTSCOPE_SAMPLER_PENDING_MAP_FULL),
    ("flows_created", C::RTTSCOPE_SAMPLER_FLOWS_CREATED),
    ("flow_map_full", C::RTTSCOPE_SAMPLER_FLOW_MAP_FULL),
    ("skip_non_ip", C::RTTSCOPE_SAMPLER_SKIP_NON_IP),
    ("skip_vlan", C::RTTSCOPE_SAMPLER_SKIP_VLAN),
    ("skip_non_tcp", C::RTTSCOPE_SAMPLER_SKIP_NON_TCP),
    ("skip_ip_options", C::RTTSCOPE_SAMPLER_SKIP_IP_OPTIONS),
    ("skip_fragment", C::RTTSCOPE_SAMPLER_SKIP_FRAGMENT),
    ("skip_ipv6_ext", C::RTTSCOPE_SAMPLER_SKIP_IPV6_EXT),
    ("skip_truncated", C::RTTSCOPE_SAMPLER_SKIP_TRUNCATED),
    ("skip_nonlinear", C::RTTSCOPE_SAMPLER_SKIP_NONLINEAR),
    ("skip_malformed", C::RTTSCOPE_SAMPLER_SKIP_MALFORMED),
    ("raw_events", C::RTTSCOPE_SAMPLER_RAW_EVENTS),
    ("raw_events_dropped", C::RTTSCOPE_SAMPLER_RAW_DROPS),
    ("acked_together", C::RTTSCOPE_SAMPLER_ACKED_TOGETHER),
    ("pending_evicted", C::RTTSCOPE_SAMPLER_PENDING_EVICTED),
    ("flows_evicted", C::RTTSCOPE_SAMPLER_FLOWS_EVICTED),
    ("evicted_segments", C::RTTSCOPE_SAMPLER_EVICTED_SEGMENTS),
    ("send_time_clock", C::RTTSCOPE_SAMPLER_SEND_TIME_CLOCK),
    ("icmp_egress", C::RTTSCOPE_SAMPLER_ICMP_EGRESS),
    ("icmp_ingress", C::RTTSCOPE_SAMPLER_ICMP_INGRESS),
    ("icmp_errors", C::RTTSCOPE_SAMPLER_ICMP_ERRORS),
    ("icmp_other", C::RTTSCOPE_SAMPLER_ICMP_OTHER),
    ("icmp_unmatched", C::RTTSCOPE_SAMPLER_ICMP_UNMATCHED),
    ("icmp_dup_request", C::RTTSCOPE_SAMPLER_ICMP_DUP_REQUEST),
    ("icmp_dup_reply", C::RTTSCOPE_SAMPLER_ICMP_DUP_REPLY),
    ("icmp_truncated", C::RTTSCOPE_SAMPLER_ICMP_TRUNCATED),
    ("skip_proto_off", C::RTTSCOPE_SAMPLER_SKIP_PROTO_OFF),
    ("icmp_not_for_host", C::RTTSCOPE_SAMPLER_ICMP_NOT_HOST),
    ("icmp_bad_checksum", C::RTTSCOPE_SAMPLER_ICMP_BAD_CSUM),
    ("icmp_unverified", C::RTTSCOPE_SAMPLER_ICMP_UNVERIFIED),
    ("samples_not_binned", C::RTTSCOPE_SAMPLER_NOT_BINNED),
    ("samples_pool_overflow", C::RTTSCOPE_SAMPLER_POOL_OVERFLOW),
    ("tcp_not_for_host", C::RTTSCOPE_SAMPLER_TCP_NOT_HOST),
    ("tcp_bad_checksum", C::RTTSCOPE_SAMPLER_TCP_BAD_CSUM),
    ("tcp_checksum_unchecked", C::RTTSCOPE_SAMPLER_TCP_UNCHECKED),
    ("vlan", C::RTTSCOPE_SAMPLER_VLAN),
    ("tunnel_vxlan", C::RTTSCOPE_SAMPLER_TUNNEL_VXLAN),
    ("tunnel_geneve", C::RTTSCOPE_SAMPLER_TUNNEL_GENEVE),
    ("tunnel_ipip", C::RTTSCOPE_SAMPLER_TUNNEL_IPIP),
    ("tunnel_pulled", C::RTTSCOPE_SAMPLER_TUNNEL_PULLED),
    ("skip_wireguard", C::RTTSCOPE_SAMPLER_SKIP_WIREGUARD),
    ("skip_esp", C::RTTSCOPE_SAMPLER_SKIP_ESP),
    ("skip_gre", C::RTTSCOPE_SAMPLER_SKIP_GRE),
    ("skip_tunnel_nested", C::RTTSCOPE_SAMPLER_SKIP_TUNNEL_NESTED),
];
const _: () = assert!(COUNTERS.len() == C::RTTSCOPE_SAMPLER_COUNTERS.0 as usize);

pub(crate) struct IfaceMeta {
    pub ifindex: u32,
    pub arphrd: u16,
}

/// ifindex and ARPHRD type of `name` in the calling thread's namespace.
fn iface_meta(name: &str) -> Result<IfaceMeta> {
    let cname = std::ffi::CString::new(name).context("interface name")?;
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        bail!("no interface '{name}' in that network namespace");
    }
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)
        .context("socket for SIOCGIFHWADDR")?;
    // SAFETY: ifreq is plain old data; the kernel fills ifr_hwaddr.
    let arphrd = unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(cname.as_bytes()) {
            *d = *s as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut ifr) != 0 {
            return Err(std::io::Error::last_os_error()).context("SIOCGIFHWADDR");
        }
        ifr.ifr_ifru.ifru_hwaddr.sa_family
    };
    Ok(IfaceMeta { ifindex, arphrd })
}

/// One `--iface`, resolved: its namespace, ifindex and link type there.
pub(crate) struct ResolvedIface {
    pub spec: IfaceSpec,
    pub ns: NetNs,
    pub meta: IfaceMeta,
    pub link: t::rttscope_sampler_link,
}

/// The program's link type for an interface of ARPHRD type `arphrd`: one clear sentence for a
/// type the programs cannot parse.
pub(crate) fn link_of(spec: &IfaceSpec, arphrd: u16) -> Result<t::rttscope_sampler_link> {
    Ok(match arphrd {
        ARPHRD_ETHER | ARPHRD_LOOPBACK => t::rttscope_sampler_link::RTTSCOPE_LINK_ETHER,
        ARPHRD_NONE => t::rttscope_sampler_link::RTTSCOPE_LINK_NONE,
        other => bail!(
            "interface {spec} has link type {other}: only Ethernet, loopback and raw-IP interfaces are supported"
        ),
    })
}

/// The `--iface` list resolved: the interfaces given by name, and per namespace with patterns,
/// what a follower watches and the interfaces matching there at start.
struct Resolved {
    pub fixed: Vec<ResolvedIface>,
    pub watches: Vec<(follow::Watch, Vec<ResolvedIface>)>,
}

/// Check the settings and the interface list and resolve every interface
/// (both loaders): one clear sentence on bad input.
fn resolve_ifaces(ifaces: &[IfaceSpec], cfg: &SamplerConfig) -> Result<Resolved> {
    cfg.validate()?;
    if ifaces.is_empty() {
        bail!("the sampler view needs at least one --iface");
    }
    let max = t::rttscope_consts::RTTSCOPE_MAX_IFACES.0 as usize;
    let fixed_n = ifaces.iter().filter(|i| !i.is_pattern()).count();
    if fixed_n > max {
        bail!("at most {max} interfaces by name (a pattern takes up to --max-ifaces)");
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Resolved {
        fixed: Vec::new(),
        watches: Vec::new(),
    };
    let mut all_links = Vec::new();
    for spec in ifaces.iter().filter(|i| !i.is_pattern()) {
        let ns = netns::resolve(spec.netns.as_deref().unwrap_or("self"))
            .with_context(|| format!("interface {spec}"))?;
        let name = spec.name.clone();
        let meta = netns::run_in(&ns, move || iface_meta(&name))
            .with_context(|| format!("interface {spec}"))?;
        if !seen.insert((ns.inode, meta.ifindex)) {
            bail!("interface {spec} is given twice");
        }
        let link = link_of(spec, meta.arphrd)?;
        out.fixed.push(ResolvedIface {
            spec: spec.clone(),
            ns,
            meta,
            link,
        });
    }
    for spec in ifaces.iter().filter(|i| i.is_pattern()) {
        let ns = netns::resolve(spec.netns.as_deref().unwrap_or("self"))
            .with_context(|| format!("interface pattern {spec}"))?;
        if let Some((w, _)) = out.watches.iter_mut().find(|(w, _)| w.ns.inode == ns.inode) {
            w.patterns.push(spec.clone());
            continue;
        }
        // subscribed first, listed second: an interface created in between is announced
        let (events, links) = netns::run_in(&ns, || {
            let ev = crate::sys::rtnl::LinkEvents::open()?;
            let links = crate::sys::rtnl::Rtnl::open()?.links()?;
            Ok((ev, links))
        })
        .with_context(|| format!("listing the interfaces for {spec}"))?;
        let patterns = vec![spec.clone()];
        out.watches.push((
            follow::Watch {
                ns,
                patterns,
                events,
            },
            Vec::new(),
        ));
        all_links.push(links);
    }
    // the interfaces each namespace's patterns match now (one given by name is left to the
    // name), resolved as a follower resolves them; a link type the programs cannot parse is
    // left out
    for ((w, start), links) in out.watches.iter_mut().zip(&all_links) {
        let spec_ns = w.patterns[0].netns.clone();
        for l in follow::matching(links, &w.patterns) {
            if seen.contains(&(w.ns.inode, l.ifindex)) {
                continue;
            }
            if let Ok(r) = follow::resolved(&w.ns, spec_ns.as_deref(), &l) {
                start.push(r);
            }
        }
    }
    Ok(out)
}

/// The report header entry of one attached interface.
pub(crate) fn attach_info(
    spec: &IfaceSpec,
    ns: &NetNs,
    ifindex: u32,
    how: &str,
    link: t::rttscope_sampler_link,
) -> AttachInfo {
    AttachInfo {
        iface: spec.name.clone(),
        netns: ns.name.clone(),
        netns_inode: ns.inode,
        ifindex,
        how: how.to_string(),
        priority: None,
        link: if link == t::rttscope_sampler_link::RTTSCOPE_LINK_NONE {
            "none".into()
        } else {
            "ether".into()
        },
        pattern: None,
    }
}

/// Decode one `sampler_flows` entry (both loaders), with its histogram as
/// read from the fine-histogram pool (`acc`; its interval min/max count when
/// they belong to report interval `interval`). None: not an IPv4/IPv6 flow key.
pub(crate) fn flow_stats(
    info: &[AttachInfo],
    key: &FlowKey,
    f: &SamplerFlow,
    acc: Option<&FineAcc>,
    interval: u32,
) -> Option<SamplerFlowStats> {
    let flow = Flow::from_key(key)?;
    let (kind, icmp_side) = FlowKind::from_key(key);
    let side = match kind {
        FlowKind::Tcp => Side::from_raw(f.side),
        _ => icmp_side,
    };
    let a = &f.agg;
    let (min, max) = acc.map_or((None, None), |h| h.range());
    let window = acc.and_then(|h| h.interval_range(interval));
    // the samples read so far (those since the last read are counted with
    // the next one: the histogram and its count stay one)
    let read = acc.map_or(0, |h| h.count);
    let iface = info
        .iter()
        .find(|i| i.ifindex == f.ifindex && i.netns_inode == key.netns)
        .map(|i| i.iface.clone())
        .unwrap_or_else(|| format!("if{}", f.ifindex));
    Some(SamplerFlowStats {
        flow,
        kind,
        side,
        iface,
        hist: match acc {
            Some(h) => Hist::from_sparse(h.buckets(), h.sum_us, min, max),
            None => Hist::default(),
        },
        samples: read,
        last_rtt_us: a.last_rtt_us,
        interval_min_us: window.map(|w| w.0),
        interval_max_us: window.map(|w| w.1),
        first_ns: f.first_ns,
        last_ns: f.last_ns,
        way: 0,
        gen: 0,
        evicted_samples: 0,
    })
}

/// Add what userspace derives to the kernel counters (both loaders): live
/// table entries, raw samples dropped here. Entries are never deleted, only
/// re-keyed (each eviction counted by the kernel), so live entries are
/// created - evicted: `pending_live` (entries in use), `flows_live` (of
/// those, entries with a histogram).
pub(crate) fn derived_counters(out: &mut BTreeMap<&'static str, u64>, every_packet: bool) {
    if every_packet {
        // the programs count sampled_* only when sampling (one counter
        // less per packet): with every packet sampled, sampled = seen
        for (sampled, seen) in [
            ("sampled_egress", "seen_egress"),
            ("sampled_ingress", "seen_ingress"),
        ] {
            let n = out.get(seen).copied().unwrap_or(0);
            out.insert(sampled, n);
        }
    }
    let get = |k: &str| out.get(k).copied().unwrap_or(0);
    let flows_live = get("flows_created").saturating_sub(get("flows_evicted"));
    let pending_live = get("pending_created").saturating_sub(get("pending_evicted"));
    out.insert("flows_live", flows_live);
    out.insert("pending_live", pending_live);
}

/// Read the whole flow table (an array, `entries` long, `BPF_F_MMAPABLE`)
/// through a mapping made for this read (both loaders: the map's fd), and
/// pass every entry (with its index) that holds a flow with at least one
/// sample, or whose way has evicted flows with samples. Entries are read
/// while the programs may update them, as a seqlock reader: `gen` (even),
/// then the entry, then `gen_end` again; an entry being re-keyed (`gen_end`
/// goes odd before anything is rewritten, bpf/rttscope.h) or re-keyed in
/// between is left out (the next read sees the way again); a histogram can
/// still be a sample behind its count, as with a hash-map walk. Reading the
/// memory in place replaced `BPF_MAP_LOOKUP_BATCH`, whose per-entry copy to
/// userspace was a third of an idle read's cost at 131,072 ways.
pub(crate) fn read_table(
    fd: BorrowedFd<'_>,
    entries: u32,
    mut f: impl FnMut(u32, &TableEntry),
) -> Result<()> {
    use std::sync::atomic::{fence, Ordering};
    const SIZE: usize = std::mem::size_of::<TableEntry>();
    // an array's element is its value rounded up to 8 bytes: no gap between entries here
    const _: () = assert!(SIZE.is_multiple_of(8));
    const FAMILY: usize =
        std::mem::offset_of!(TableEntry, key) + std::mem::offset_of!(FlowKey, family);
    const GEN: usize = std::mem::offset_of!(TableEntry, gen);
    const GEN_END: usize = std::mem::offset_of!(TableEntry, gen_end);
    crate::sys::mmap::for_each_element(fd, 0, entries as usize, SIZE, |idx, bytes| {
        let p = bytes.as_ptr();
        // SAFETY: inside the entry (offsets of its own fields); volatile: the
        // programs write this memory concurrently.
        let word = |off: usize| unsafe { std::ptr::read_volatile(p.add(off).cast::<u64>()) };
        // SAFETY: the same, for the 2-byte family of the key.
        let family = unsafe { std::ptr::read_volatile(p.add(FAMILY).cast::<u16>()) };
        if family == 0 {
            return; // most ways of a sparse table are empty
        }
        let gen = word(GEN);
        fence(Ordering::Acquire);
        // SAFETY: SIZE bytes of the mapping into a value of a plain C type
        // (every bit pattern valid); torn copies are told by gen_end below.
        let e: TableEntry = unsafe { std::ptr::read_volatile(p.cast::<TableEntry>()) };
        fence(Ordering::Acquire);
        if gen & 1 != 0 || word(GEN_END) != gen || e.gen != gen || e.gen_end != gen {
            return;
        }
        if e.key.family != 0 && (e.flow.agg.samples > 0 || e.evicted_samples > 0) {
            f(idx as u32, &e);
        }
    })
    .context("mapping the sampler's flow table")
}

/// The flows of one table read (both loaders), one per way, sorted by flow:
/// a flow that two CPUs entered at once (two ways, rare) comes twice, and
/// a way whose flow has no sample yet comes (with `samples` 0) when flows
/// with samples were evicted from it, so that the reader can account for
/// them (`session`: samples_evicted). See `merge_ways` for one per flow.
pub(crate) fn table_flows(
    fd: BorrowedFd<'_>,
    cfg: &SamplerConfig,
    info: &[AttachInfo],
    fine: &mut FinePool,
    out: &mut dyn FnMut(SamplerFlowStats),
) -> Result<()> {
    fine.begin_scan();
    read_table(fd, cfg.table_entries(), |way, e| {
        // the key opens the entry (the sampler object's own copy of the type)
        if let Ok(key) = bpf::decode::<FlowKey>(bpf::as_bytes(e)) {
            let owner = (way, e.gen as u32);
            if let Some(mut s) = flow_stats(
                info,
                &key,
                &e.flow,
                fine.get(owner.0, owner.1),
                fine.interval(),
            ) {
                s.way = way;
                s.gen = e.gen;
                s.evicted_samples = e.evicted_samples;
                out(s);
            }
        }
    })?;
    // ways re-keyed since (their flows evicted: counted by the reader from
    // `evicted_samples`), or torn in this read and re-keyed: not asked for again
    fine.end_scan();
    Ok(())
}

/// One entry per flow with samples, from `table_flows`' per-way list: a
/// flow that two CPUs entered at once (two ways) reported once, by the way
/// with more samples; ways without samples left out.
pub fn merge_ways(mut ways: Vec<SamplerFlowStats>) -> Vec<SamplerFlowStats> {
    ways.retain(|f| f.samples > 0);
    ways.sort_by(|a, b| a.flow.cmp(&b.flow).then(b.samples.cmp(&a.samples)));
    ways.dedup_by(|later, kept| later.flow == kept.flow);
    ways
}

/// A random seed for the programs' flow hash (per view: a remote peer cannot
/// aim its flows at one set).
pub(crate) fn hash_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom(2) fills at most b.len() bytes of b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // no entropy source: still a per-process value
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return t ^ ((std::process::id() as u64) << 32);
    }
    u64::from_ne_bytes(b)
}

pub(crate) mod attach;
pub mod chain;
mod config;
mod follow;
pub mod hook_tags;
pub mod hooks;
pub mod join;
pub mod options;
pub mod plan;
pub mod sides;
mod tc;
pub mod track;

pub use options::{SamplerSetup, DEF};

pub use config::{AttachMode, FlowKind, IfaceSpec, Matching, Proto, SamplerConfig};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iface_specs() {
        assert_eq!(
            "veth0".parse::<IfaceSpec>().unwrap(),
            IfaceSpec {
                netns: None,
                name: "veth0".into()
            }
        );
        assert_eq!(
            "ns1:eth0".parse::<IfaceSpec>().unwrap(),
            IfaceSpec {
                netns: Some("ns1".into()),
                name: "eth0".into()
            }
        );
        assert!(":eth0".parse::<IfaceSpec>().is_err());
        assert!("ns:".parse::<IfaceSpec>().is_err());
        assert!("a-very-long-interface-name".parse::<IfaceSpec>().is_err());
        assert_eq!(
            "ns1:eth0".parse::<IfaceSpec>().unwrap().to_string(),
            "ns1:eth0"
        );
    }

    #[test]
    fn table_size_is_a_power_of_two_of_whole_sets() {
        let mut c = SamplerConfig::default();
        assert_eq!(c.table_entries(), 16384);
        assert_eq!(c.set_mask(), 4095);
        c.max_flows = 1000;
        assert_eq!(c.table_entries(), 1024);
        c.max_flows = 5000;
        assert_eq!(c.table_entries(), 8192);
        c.max_flows = 1;
        assert_eq!(c.table_entries(), MIN_TABLE);
        assert_eq!(c.set_mask(), MIN_TABLE / WAYS - 1);
        c.max_flows = MAX_TABLE + 1;
        assert!(c.validate().is_err());
        assert_ne!(hash_seed(), hash_seed());
    }

    #[test]
    fn sampling_threshold() {
        let mut c = SamplerConfig::default();
        assert_eq!(c.threshold(), 0);
        c.sample_every = 4;
        assert_eq!(c.threshold(), 1 << 30);
        c.sample_every = 3;
        let p = c.threshold() as f64 / 4294967296.0;
        assert!((p - 1.0 / 3.0).abs() < 1e-9);
        c.sample_every = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn counter_names_are_unique_and_ordered() {
        for (i, (_, c)) in COUNTERS.iter().enumerate() {
            assert_eq!(c.0 as usize, i);
        }
        let names: std::collections::BTreeSet<_> = COUNTERS.iter().map(|c| c.0).collect();
        assert_eq!(names.len(), COUNTERS.len());
    }

    #[test]
    fn flow_entry_and_counters_decode_once_for_both_loaders() {
        let key = Flow {
            tunnel: Default::default(),
            netns: 5,
            local: "10.0.0.1:80".parse().unwrap(),
            remote: "10.0.0.2:9".parse().unwrap(),
        }
        .to_key();
        let mut f = SamplerFlow {
            ifindex: 3,
            agg: t::rttscope_rtt_agg {
                samples: 2,
                min_us: 10,
                max_us: 30,
                sum_us: 40,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut h: crate::bpf::FineHist = crate::bpf::zeroed();
        (h.count, h.sum_us, h.min_us, h.max_us) = (2, 40, 10, 30);
        h.hist[10] = 1;
        h.hist[30] = 1;
        let mut acc = FineAcc::default();
        acc.add(&h, 7);
        let acc = Some(&acc);
        let info = [AttachInfo {
            iface: "veth0".into(),
            netns: "a".into(),
            netns_inode: 5,
            ifindex: 3,
            how: "tcx".into(),
            priority: None,
            link: "ether".into(),
            pattern: None,
        }];
        let s = flow_stats(&info, &key, &f, acc, 7).unwrap();
        assert_eq!(s.iface, "veth0");
        assert_eq!(s.samples, 2);
        assert_eq!(flow_stats(&info, &key, &f, None, 7).unwrap().samples, 0);
        assert_eq!(s.hist.count(), 2);
        assert_eq!((s.hist.min_us, s.hist.max_us), (Some(10), Some(30)));
        assert_eq!(s.interval_max_us, Some(30));
        // another interval: the window belongs to an earlier one
        let s = flow_stats(&info, &key, &f, acc, 8).unwrap();
        assert_eq!(s.interval_min_us, None);
        f.ifindex = 4;
        assert_eq!(flow_stats(&info, &key, &f, acc, 7).unwrap().iface, "if4");

        let mut c = BTreeMap::new();
        c.insert("flows_created", 10);
        c.insert("flows_evicted", 6);
        c.insert("pending_created", 9);
        c.insert("pending_evicted", 3);
        c.insert("seen_ingress", 50);
        c.insert("sampled_ingress", 0);
        derived_counters(&mut c, false);
        assert_eq!(c["flows_live"], 4);
        assert_eq!(c["pending_live"], 6);
        assert_eq!(c["sampled_ingress"], 0, "sampling: the kernel's own count");
        derived_counters(&mut c, true);
        assert_eq!(c["sampled_ingress"], 50, "every packet: sampled = seen");
        assert_eq!(c["sampled_egress"], 0);
    }

    #[test]
    fn icmp_flows_are_told_apart_by_the_key() {
        let mut key = Flow {
            tunnel: Default::default(),
            netns: 5,
            local: "10.0.0.1:4242".parse().unwrap(),
            remote: "10.0.0.2:0".parse().unwrap(),
        }
        .to_key();
        assert_eq!(FlowKind::from_key(&key), (FlowKind::Tcp, Side::Unknown));
        // bits 12-15 of `vlan`: the side; ICMP or ICMPv6 by the family
        key.vlan = 1 << 12;
        assert_eq!(FlowKind::from_key(&key), (FlowKind::Icmp, Side::Pinger));
        key.family = crate::analysis::flow::AF_INET6;
        key.vlan = (2 << 12) | 7; // VLAN 7 too
        assert_eq!(FlowKind::from_key(&key), (FlowKind::Icmpv6, Side::Pinged));
        // a flow entry of an ICMP key: its side comes from the key, not the handshake
        let f = SamplerFlow {
            side: 1,
            ..Default::default()
        };
        let s = flow_stats(&[], &key, &f, None, 0).unwrap();
        assert_eq!((s.kind, s.side), (FlowKind::Icmpv6, Side::Pinged));
        assert_eq!(s.flow.tunnel.vlan, Some(7));
        key.vlan = 0;
        key.family = crate::analysis::flow::AF_INET;
        let s = flow_stats(&[], &key, &f, None, 0).unwrap();
        assert_eq!((s.kind, s.side), (FlowKind::Tcp, Side::Client));
        // raw samples: the same rules
        let mut e = Event {
            r#type: 2,
            side: 2,
            ..Default::default()
        };
        e.key = key;
        let smp = SamplerSample::from_event(&e).unwrap();
        assert_eq!((smp.kind, smp.side), (FlowKind::Tcp, Side::Server));
        e.key.vlan = 1 << 12;
        let smp = SamplerSample::from_event(&e).unwrap();
        assert_eq!((smp.kind, smp.side), (FlowKind::Icmp, Side::Pinger));
    }

    #[test]
    fn protocols_to_the_kernel_mask() {
        let mut c = SamplerConfig::default();
        assert_eq!(c.proto_mask(), 3);
        c.protos = vec![Proto::Icmp];
        assert_eq!(c.proto_mask(), 2);
        c.protos = vec![Proto::Tcp];
        assert_eq!(c.proto_mask(), 1);
        c.protos.clear();
        assert!(c.validate().is_err());
        // settings saved before --proto existed still load (both protocols)
        let mut j = serde_json::to_value(SamplerConfig::default()).unwrap();
        j.as_object_mut().unwrap().remove("protos");
        let back: SamplerConfig = serde_json::from_value(j).unwrap();
        assert_eq!(back.protos, vec![Proto::Tcp, Proto::Icmp]);
    }

    #[test]
    fn decodes_sampler_event_fixture() {
        let mut e = Event {
            r#type: 2,
            flags: 2,
            rtt_us: 1234,
            ts_ns: 99,
            reserved2: 7,
            ..Default::default()
        };
        e.key = Flow {
            tunnel: Default::default(),
            netns: 5,
            local: "10.0.0.1:80".parse().unwrap(),
            remote: "10.0.0.2:9".parse().unwrap(),
        }
        .to_key();
        let bytes = bpf::as_bytes(&e).to_vec();
        let d: Event = bpf::decode(&bytes).unwrap();
        let s = SamplerSample::from_event(&d).unwrap();
        assert_eq!(s.rtt_us, 1234);
        assert_eq!(s.ifindex, 7);
        assert_eq!(s.matching, Matching::Tsval);
        assert_eq!(s.flow.local.port(), 80);
        let mut tcp = d;
        tcp.r#type = 1;
        assert!(SamplerSample::from_event(&tcp).is_none());
    }
}
