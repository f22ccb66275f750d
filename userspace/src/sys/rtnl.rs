//! Route netlink questions about one interface, through a socket of its network namespace (the
//! one the calling thread was in when it was opened: it stays there, and asking needs no
//! privilege, so it keeps working after the daemon drops its capabilities): the interface's own
//! packet counters and XDP program (RTM_GETLINK: IFLA_STATS64, IFLA_XDP), and the tc filters
//! of a clsact hook in the order they run (RTM_GETTFILTER dump), as `tc filter show` lists them;
//! the interfaces of the namespace ([`Rtnl::links`]) and, on a socket of its own subscribed to
//! RTMGRP_LINK, their creation and deletion as it happens ([`LinkEvents`]: the sampler's
//! `--iface` patterns follow interfaces that come and go).
use std::os::fd::AsRawFd;

use anyhow::{Context, Result};

use crate::sys::netlink::{self, attrs, Netlink, NLMSG_HDR};

const RTM_GETTFILTER: u16 = 46;
/// `struct ifinfomsg` and `struct tcmsg`.
const IFINFOMSG: usize = 16;
const TCMSG: usize = 20;
const IFLA_IFNAME: u16 = 3;
const IFLA_STATS64: u16 = 23;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_PROG_ID: u16 = 4;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_CHAIN: u16 = 11;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_ID: u16 = 11;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
/// clsact's hooks as a filter's parent (`TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS/EGRESS)`).
const PARENT_INGRESS: u32 = 0xFFFF_FFF2;
const PARENT_EGRESS: u32 = 0xFFFF_FFF3;

/// An interface's own counters and XDP program, as the kernel keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkState {
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// The XDP program on the interface, if any: its id and how it is attached.
    pub xdp: Option<(u32, &'static str)>,
}

/// One tc filter of a clsact hook.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TcFilter {
    pub priority: u16,
    pub handle: u32,
    /// The classifier (`bpf`, `u32`, `flower`, `matchall`, ...).
    pub kind: String,
    /// bpf filters: the name tc gave it (often `file.o:[section]`) and the program's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prog_id: Option<u32>,
    /// bpf filters: direct-action (the program's return value is the verdict).
    pub direct_action: bool,
    pub chain: u32,
}

/// A route netlink socket of one network namespace.
pub struct Rtnl {
    nl: Netlink,
}

fn u32_of(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_ne_bytes)
        .unwrap_or(0)
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl Rtnl {
    /// Open one in the calling thread's namespace (`netns::run_in` for another).
    pub fn open() -> Result<Rtnl> {
        // A dump's datagrams are as large as the reader's buffer allows (32 KiB at most).
        let nl = Netlink::open(libc::NETLINK_ROUTE, "route netlink")?.answers_up_to(64 * 1024);
        Ok(Rtnl { nl })
    }

    /// Send one request (`body` after the header) and collect the payloads of the answer's
    /// messages (one, or a dump's until NLMSG_DONE). An error answer is an `io::Error`.
    fn ask(&mut self, kind: u16, dump: bool, body: &[u8]) -> Result<Vec<Vec<u8>>> {
        let seq = self.nl.next_seq();
        let mut req = vec![0u8; NLMSG_HDR];
        req.extend_from_slice(body);
        let flags = libc::NLM_F_REQUEST as u16 | (if dump { libc::NLM_F_DUMP as u16 } else { 0 });
        netlink::set_header(&mut req, kind, flags, seq);
        let mut out = Vec::new();
        self.nl.ask(&req, |b| {
            Ok(answer_part(b, seq, dump, &mut out)?.then_some(()))
        })?;
        Ok(out)
    }

    /// Every interface of the namespace: index, name and link type (a dump of RTM_GETLINK).
    pub fn links(&mut self) -> Result<Vec<LinkName>> {
        let mut body = [0u8; IFINFOMSG];
        body[0] = libc::AF_UNSPEC as u8;
        let answer = self
            .ask(libc::RTM_GETLINK, true, &body)
            .context("listing the interfaces over netlink")?;
        Ok(answer.iter().filter_map(|m| parse_link_name(m)).collect())
    }

    /// The interface's counters and XDP program; None if there is no such interface.
    pub fn link(&mut self, ifindex: u32) -> Result<Option<LinkState>> {
        let mut body = [0u8; IFINFOMSG];
        body[0] = libc::AF_UNSPEC as u8;
        body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        let answer = match self.ask(libc::RTM_GETLINK, false, &body) {
            Ok(a) => a,
            Err(e) if is_errno(&e, libc::ENODEV) => return Ok(None),
            Err(e) => return Err(e.context("asking netlink for a link")),
        };
        let Some(msg) = answer.first().filter(|m| m.len() >= IFINFOMSG) else {
            return Ok(None);
        };
        Ok(Some(parse_link(&msg[IFINFOMSG..])))
    }

    /// The tc filters of the interface's clsact hook (ingress or egress), in the order they
    /// run (by priority, then as listed); empty without a clsact qdisc.
    pub fn filters(&mut self, ifindex: u32, egress: bool) -> Result<Vec<TcFilter>> {
        let mut body = [0u8; TCMSG];
        body[0] = libc::AF_UNSPEC as u8;
        body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        let parent = if egress {
            PARENT_EGRESS
        } else {
            PARENT_INGRESS
        };
        body[12..16].copy_from_slice(&parent.to_ne_bytes());
        let answer = match self.ask(RTM_GETTFILTER, true, &body) {
            Ok(a) => a,
            // no clsact (or ingress) qdisc: no filter
            Err(e) if is_errno(&e, libc::EINVAL) || is_errno(&e, libc::ENOENT) => Vec::new(),
            Err(e) => return Err(e.context("listing tc filters over netlink")),
        };
        let mut out: Vec<TcFilter> = answer.iter().filter_map(|m| parse_filter(m)).collect();
        out.sort_by_key(|f| (f.chain, f.priority));
        Ok(out)
    }
}

/// The messages of one datagram of the answer to question `seq` into `out`; true when the
/// answer is complete.
fn answer_part(b: &[u8], seq: u32, dump: bool, out: &mut Vec<Vec<u8>>) -> Result<bool> {
    for m in netlink::messages(b) {
        let (kind, s, payload) = m?;
        if s != seq {
            continue; // an answer to an earlier question that timed out
        }
        match kind as i32 {
            libc::NLMSG_DONE => return Ok(true),
            libc::NLMSG_ERROR => {
                let err = -(u32_of(payload).unwrap_or(0) as i32);
                if err == 0 {
                    return Ok(true);
                }
                return Err(std::io::Error::from_raw_os_error(err).into());
            }
            _ => out.push(payload.to_vec()),
        }
        if !dump {
            return Ok(true);
        }
    }
    Ok(false)
}

/// An interface's index, name and link type (`ifi_type`: ARPHRD_*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkName {
    pub ifindex: u32,
    pub name: String,
    pub arphrd: u16,
}

/// `struct ifinfomsg` and IFLA_IFNAME of an RTM_NEWLINK/RTM_DELLINK message.
fn parse_link_name(m: &[u8]) -> Option<LinkName> {
    let hdr = m.get(..IFINFOMSG)?;
    let arphrd = u16::from_ne_bytes([hdr[2], hdr[3]]);
    let ifindex = u32_of(&hdr[4..])?;
    let name = attrs(&m[IFINFOMSG..]).find(|(k, _)| *k == IFLA_IFNAME)?.1;
    Some(LinkName {
        ifindex,
        name: cstr(name),
        arphrd,
    })
}

/// What happened to an interface (an RTM_NEWLINK or RTM_DELLINK notification).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// Created, or changed (state, name, ...): RTM_NEWLINK.
    New(LinkName),
    /// Deleted, or moved to another namespace: RTM_DELLINK.
    Gone(LinkName),
    /// Notifications were lost (the socket's buffer overflowed): list the interfaces again.
    Lost,
}

/// A route netlink socket subscribed to the interfaces of its namespace (RTMGRP_LINK): every
/// interface created, changed or deleted there, as the kernel announces it.
pub struct LinkEvents {
    nl: Netlink,
}

impl LinkEvents {
    /// Subscribe in the calling thread's namespace; a receive buffer of 4 MiB where
    /// SO_RCVBUFFORCE is allowed (a burst of thousands of interfaces), else the default (an
    /// overflow is [`LinkEvent::Lost`], and the caller lists the interfaces again).
    pub fn open() -> Result<LinkEvents> {
        let nl = Rtnl::open()?.nl;
        nl.subscribe(libc::RTMGRP_LINK as u32)
            .context("subscribing to interface notifications (RTMGRP_LINK)")?;
        // Failure (no CAP_NET_ADMIN) leaves the default.
        let size: libc::c_int = 4 << 20;
        let _ = nl.set_option(libc::SO_RCVBUFFORCE, &size);
        Ok(LinkEvents { nl })
    }

    /// The notifications that arrive within `wait` (at least one datagram's worth when any
    /// arrives; empty after the wait without one).
    pub fn next(&mut self, wait: std::time::Duration) -> Result<Vec<LinkEvent>> {
        let mut out = Vec::new();
        let mut pfd = libc::pollfd {
            fd: self.nl.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, wait.as_millis().min(i32::MAX as u128) as i32) };
        if n <= 0 {
            return Ok(out);
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: buf is a valid, writable buffer of the given length.
            let n = unsafe {
                libc::recv(
                    self.nl.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(out),
                    Some(libc::ENOBUFS) => out.push(LinkEvent::Lost),
                    Some(libc::EINTR) => {}
                    _ => return Err(e).context("reading interface notifications"),
                }
                continue;
            }
            link_events(&buf[..n as usize], &mut out);
        }
    }
}

/// The interface notifications of one datagram.
fn link_events(b: &[u8], out: &mut Vec<LinkEvent>) {
    for (kind, _, payload) in netlink::messages(b).map_while(Result::ok) {
        let Some(l) = parse_link_name(payload) else {
            continue;
        };
        match kind {
            libc::RTM_NEWLINK => out.push(LinkEvent::New(l)),
            libc::RTM_DELLINK => out.push(LinkEvent::Gone(l)),
            _ => {}
        }
    }
}

fn is_errno(e: &anyhow::Error, errno: i32) -> bool {
    e.downcast_ref::<std::io::Error>()
        .and_then(|e| e.raw_os_error())
        == Some(errno)
}

/// IFLA_STATS64's packet counts and IFLA_XDP's program from RTM_NEWLINK's attributes.
fn parse_link(b: &[u8]) -> LinkState {
    let mut st = LinkState::default();
    for (kind, p) in attrs(b) {
        match kind {
            // struct rtnl_link_stats64 { rx_packets, tx_packets, ... }
            IFLA_STATS64 => (st.rx_packets, st.tx_packets) = (u64_at(p, 0), u64_at(p, 8)),
            IFLA_XDP => {
                let (mut mode, mut id) = (0u8, 0u32);
                for (k, v) in attrs(p) {
                    match k {
                        IFLA_XDP_ATTACHED => mode = v.first().copied().unwrap_or(0),
                        IFLA_XDP_PROG_ID => id = u32_of(v).unwrap_or(0),
                        _ => {}
                    }
                }
                let how = match mode {
                    0 => None,
                    1 => Some("driver"),
                    2 => Some("generic"),
                    3 => Some("offloaded"),
                    _ => Some("several modes"),
                };
                st.xdp = how.map(|h| (id, h));
            }
            _ => {}
        }
    }
    st
}

/// One RTM_NEWTFILTER message (`struct tcmsg` and its attributes); None for the entry that
/// only announces a priority's classifier (handle 0).
fn parse_filter(m: &[u8]) -> Option<TcFilter> {
    let tcm = m.get(..TCMSG)?;
    let handle = u32_of(&tcm[8..])?;
    let info = u32_of(&tcm[16..])?;
    if handle == 0 {
        return None;
    }
    let mut f = TcFilter {
        priority: (info >> 16) as u16,
        handle,
        ..TcFilter::default()
    };
    for (kind, p) in attrs(&m[TCMSG..]) {
        match kind {
            TCA_KIND => f.kind = cstr(p),
            TCA_CHAIN => f.chain = u32_of(p).unwrap_or(0),
            TCA_OPTIONS => {
                for (k, v) in attrs(p) {
                    match k {
                        TCA_BPF_NAME => f.name = Some(cstr(v)),
                        TCA_BPF_ID => f.prog_id = u32_of(v),
                        TCA_BPF_FLAGS => {
                            f.direct_action =
                                (u32_of(v).unwrap_or(0) & TCA_BPF_FLAG_ACT_DIRECT) != 0
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if f.kind != "bpf" {
        (f.name, f.prog_id) = (None, None);
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        netlink::put_attr(&mut a, kind, payload);
        a
    }

    /// A dump's datagrams: parts collected until NLMSG_DONE; another question's skipped; an
    /// error answer is the io::Error of its errno; a single answer ends at its first message.
    #[test]
    fn answers_are_collected_until_done_or_error() {
        let msg = |kind: u16, seq: u32, payload: &[u8]| {
            let mut m = vec![0u8; NLMSG_HDR];
            m.extend_from_slice(payload);
            netlink::set_header(&mut m, kind, 0, seq);
            m
        };
        let mut out = Vec::new();
        let mut d = msg(libc::RTM_NEWLINK, 3, &[1, 2, 3, 4]);
        d.extend(msg(libc::RTM_NEWLINK, 2, &[9, 9, 9, 9]));
        assert!(!answer_part(&d, 3, true, &mut out).unwrap());
        let done = msg(libc::NLMSG_DONE as u16, 3, &[0; 4]);
        assert!(answer_part(&done, 3, true, &mut out).unwrap());
        assert_eq!(out, [vec![1u8, 2, 3, 4]]);
        let err = msg(libc::NLMSG_ERROR as u16, 4, &(-libc::ENODEV).to_ne_bytes());
        let e = answer_part(&err, 4, false, &mut out).unwrap_err();
        assert_eq!(
            e.downcast_ref::<std::io::Error>().unwrap().raw_os_error(),
            Some(libc::ENODEV)
        );
        out.clear();
        assert!(answer_part(&d, 2, false, &mut out).unwrap());
        assert_eq!(out, [vec![9u8, 9, 9, 9]]);
        // the second message cut 2 bytes short: an error, not a panic
        assert!(answer_part(&d[..38], 3, true, &mut out).is_err());
    }

    #[test]
    fn a_bpf_filter_message_decodes() {
        let mut m = vec![0u8; TCMSG];
        m[8..12].copy_from_slice(&0x7273u32.to_ne_bytes());
        m[16..20].copy_from_slice(&((1u32 << 16) | 0x0300).to_ne_bytes());
        m.extend(attr(TCA_KIND, b"bpf\0"));
        let mut opts = attr(TCA_BPF_NAME, b"cni.o:[tc]\0");
        opts.extend(attr(TCA_BPF_ID, &42u32.to_ne_bytes()));
        opts.extend(attr(TCA_BPF_FLAGS, &1u32.to_ne_bytes()));
        m.extend(attr(TCA_OPTIONS | 0x8000, &opts));
        let f = parse_filter(&m).unwrap();
        assert_eq!((f.priority, f.handle), (1, 0x7273));
        assert_eq!(f.kind, "bpf");
        assert_eq!(f.name.as_deref(), Some("cni.o:[tc]"));
        assert_eq!(f.prog_id, Some(42));
        assert!(f.direct_action);
        // the priority's announcement (handle 0) is not a filter
        m[8..12].copy_from_slice(&0u32.to_ne_bytes());
        assert!(parse_filter(&m).is_none());
    }

    #[test]
    fn link_stats_and_xdp_decode() {
        let mut stats = vec![0u8; 64];
        stats[0..8].copy_from_slice(&123u64.to_ne_bytes());
        stats[8..16].copy_from_slice(&456u64.to_ne_bytes());
        let mut b = attr(IFLA_STATS64, &stats);
        let mut xdp = attr(IFLA_XDP_ATTACHED, &[1]);
        xdp.extend(attr(IFLA_XDP_PROG_ID, &7u32.to_ne_bytes()));
        b.extend(attr(IFLA_XDP | 0x8000, &xdp));
        let st = parse_link(&b);
        assert_eq!((st.rx_packets, st.tx_packets), (123, 456));
        assert_eq!(st.xdp, Some((7, "driver")));
        // a truncated attribute ends the walk, never panics
        assert_eq!(parse_link(&b[..6]), LinkState::default());
    }

    #[test]
    fn link_notifications_decode() {
        let mut msg = Vec::new();
        let mut body = vec![0u8; IFINFOMSG];
        body[2..4].copy_from_slice(&1u16.to_ne_bytes());
        body[4..8].copy_from_slice(&42i32.to_ne_bytes());
        body.extend(attr(IFLA_IFNAME, b"rq7a12\0"));
        for kind in [libc::RTM_NEWLINK, libc::RTM_DELLINK, libc::RTM_NEWADDR] {
            let mut m = vec![0u8; NLMSG_HDR];
            m[0..4].copy_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
            m[4..6].copy_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(&body);
            msg.extend(m);
        }
        let mut out = Vec::new();
        link_events(&msg, &mut out);
        let l = LinkName {
            ifindex: 42,
            name: "rq7a12".into(),
            arphrd: 1,
        };
        assert_eq!(out, [LinkEvent::New(l.clone()), LinkEvent::Gone(l)]);
        // a cut message ends the walk, never panics
        out.clear();
        link_events(&msg[..NLMSG_HDR + 6], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn loopback_has_counters_and_no_filter() {
        let mut r = Rtnl::open().unwrap();
        let lo = r.link(1).unwrap().expect("lo is ifindex 1");
        assert!(lo.xdp.is_none());
        assert!(r.link(0x7fff_fff0).unwrap().is_none());
        // lo has no clsact qdisc in a test run: an empty list, not an error
        let _ = r.filters(1, false).unwrap();
        let links = r.links().unwrap();
        assert!(links
            .iter()
            .any(|l| l.ifindex == 1 && l.name == "lo" && l.arphrd == 772));
    }
}
