//! Route netlink questions about one interface, through a socket of its network namespace (the
//! one the calling thread was in when it was opened: it stays there, and asking needs no
//! privilege, so it keeps working after the daemon drops its capabilities): the interface's own
//! packet counters and XDP program (RTM_GETLINK: IFLA_STATS64, IFLA_XDP), and the tc filters
//! of a clsact hook in the order they run (RTM_GETTFILTER dump), as `tc filter show` lists them;
//! the interfaces of the namespace ([`Rtnl::links`]) and, on a socket of its own subscribed to
//! RTMGRP_LINK, their creation and deletion as it happens ([`LinkEvents`]: the sampler's
//! `--iface` patterns follow interfaces that come and go).
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result};

const RTM_GETTFILTER: u16 = 46;
const NLMSG_HDR: usize = 16;
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
    fd: OwnedFd,
    seq: u32,
}

/// The attributes of a netlink message part: (type without flags, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some((kind, payload))
    })
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
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("opening a route netlink socket");
        }
        // SAFETY: fd was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: tv outlives the call, its size is given.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(Rtnl { fd, seq: 0 })
    }

    /// Send one request (`body` after the header) and collect the payloads of the answer's
    /// messages (one, or a dump's until NLMSG_DONE). An error answer is an `io::Error`.
    fn ask(&mut self, kind: u16, dump: bool, body: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let mut req = vec![0u8; NLMSG_HDR];
        let len = (NLMSG_HDR + body.len()) as u32;
        req[0..4].copy_from_slice(&len.to_ne_bytes());
        req[4..6].copy_from_slice(&kind.to_ne_bytes());
        let flags = libc::NLM_F_REQUEST as u16 | (if dump { libc::NLM_F_DUMP as u16 } else { 0 });
        req[6..8].copy_from_slice(&flags.to_ne_bytes());
        req[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        req.extend_from_slice(body);
        let fd = self.fd.as_raw_fd();
        // SAFETY: req is a valid buffer of the given length.
        let n = unsafe { libc::send(fd, req.as_ptr().cast(), req.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("sending a netlink request");
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: buf is a valid, writable buffer of the given length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(std::io::Error::last_os_error()).context("reading netlink's answer");
            }
            if self.messages(&buf[..n as usize], dump, &mut out)? {
                return Ok(out);
            }
        }
    }

    /// The messages of one datagram into `out`; true when the answer is complete.
    fn messages(&self, b: &[u8], dump: bool, out: &mut Vec<Vec<u8>>) -> Result<bool> {
        for m in split(b) {
            let (kind, seq, payload) = m?;
            if seq != self.seq {
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

/// The messages of one netlink datagram: (type, sequence, payload after the header).
fn split(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, u32, &[u8])>> {
    std::iter::from_fn(move || {
        if b.len() < NLMSG_HDR {
            return None;
        }
        let len = u32_of(b).unwrap_or(0) as usize;
        if len < NLMSG_HDR || len > b.len() {
            b = &[];
            return Some(Err(anyhow::anyhow!(
                "a malformed netlink message ({len} bytes)"
            )));
        }
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        let seq = u32_of(&b[8..]).unwrap_or(0);
        let payload = &b[NLMSG_HDR..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some(Ok((kind, seq, payload)))
    })
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
    fd: OwnedFd,
}

impl LinkEvents {
    /// Subscribe in the calling thread's namespace; a receive buffer of 4 MiB where
    /// SO_RCVBUFFORCE is allowed (a burst of thousands of interfaces), else the default (an
    /// overflow is [`LinkEvent::Lost`], and the caller lists the interfaces again).
    pub fn open() -> Result<LinkEvents> {
        let r = Rtnl::open()?;
        let fd = r.fd;
        // SAFETY: sockaddr_nl is plain old data; zeroed is a valid value.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: sa is a valid sockaddr_nl of the given size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .context("subscribing to interface notifications (RTMGRP_LINK)");
        }
        let size: libc::c_int = 4 << 20;
        // SAFETY: size outlives the call, its size is given; failure leaves the default.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                &size as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        Ok(LinkEvents { fd })
    }

    /// The notifications that arrive within `wait` (at least one datagram's worth when any
    /// arrives; empty after the wait without one).
    pub fn next(&mut self, wait: std::time::Duration) -> Result<Vec<LinkEvent>> {
        let mut out = Vec::new();
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
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
                    self.fd.as_raw_fd(),
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
    for (kind, _, payload) in split(b).map_while(Result::ok) {
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
        a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(payload);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
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
