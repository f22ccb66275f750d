//! The socket's own 4-tuple of a connection the packet sampler sees
//! translated (DNAT in the output or prerouting hook, SNAT/masquerade in
//! postrouting, as kube-proxy and masquerading gateways do): one question to
//! the connection tracker of the namespace the NAT happened in (ctnetlink,
//! `IPCTNL_MSG_CT_GET` of one tuple: the kernel's hash lookup of that entry,
//! never a dump of the table), through [`Netlink`].
//!
//! The sampler's flow is the wire's tuple `(local, remote)`. Looked up as a
//! reply tuple (`src = remote, dst = local`) it is a connection this host
//! opened: the socket's tuple is the entry's original direction. Looked up as
//! an original tuple (`src = remote, dst = local`) it is one the peer opened:
//! the socket's tuple is the reply direction, reversed. An entry whose two
//! directions mirror each other has no NAT.
//!
//! ctnetlink needs CAP_NET_ADMIN in the namespace (kept by daemon mode) and
//! the kernel's `nf_conntrack_netlink`; a namespace without either has no
//! answer, counted, never guessed. NAT done outside conntrack (Cilium's
//! socket-level load balancing keeps it in its own maps) has no entry here.
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};

use crate::analysis::flow::Flow;
use crate::sys::flowcache::{Cached, FlowCache};
use crate::sys::netlink::{self, Netlink, NLMSG_HDR};
use crate::sys::netns::NetNs;

const NETLINK_NETFILTER: libc::c_int = 12;
/// `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET`, and the answer's `IPCTNL_MSG_CT_NEW`.
const CT_GET: u16 = 0x101;
const CT_NEW: u16 = 0x100;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// One direction of a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// What the tracker says of a wire tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Translated: the socket's own (local, remote).
    Nat(SocketAddr, SocketAddr),
    /// An entry without translation.
    NoNat,
    /// No entry (never tracked, expired, or NAT outside conntrack).
    Absent,
}

/// A ctnetlink socket of one network namespace.
pub struct Conntrack {
    nl: Netlink,
}

impl Conntrack {
    /// Open one in the calling thread's namespace (`netns::run_in` for another).
    pub fn open() -> Result<Conntrack> {
        Ok(Conntrack {
            nl: Netlink::open(NETLINK_NETFILTER, "ctnetlink")?,
        })
    }

    /// The entry of a TCP tuple in one direction (`reply`: as the reply tuple).
    pub fn get(&mut self, t: Tuple, reply: bool) -> Result<Option<(Tuple, Tuple)>> {
        let seq = self.nl.next_seq();
        let req = request(seq, t, reply);
        self.nl.ask(&req, |b| answer(b, seq))
    }

    /// The socket's tuple of the wire's TCP flow `local` <-> `remote`.
    pub fn lookup(&mut self, local: SocketAddr, remote: SocketAddr) -> Result<Lookup> {
        let t = Tuple {
            src: remote,
            dst: local,
        };
        if let Some((orig, _)) = self.get(t, true)? {
            // this host opened it: the socket's tuple is the original direction
            return Ok(if orig.src == local && orig.dst == remote {
                Lookup::NoNat
            } else {
                Lookup::Nat(orig.src, orig.dst)
            });
        }
        if let Some((_, reply)) = self.get(t, false)? {
            // the peer opened it: the socket's tuple is the reply direction, reversed
            return Ok(if reply.src == local && reply.dst == remote {
                Lookup::NoNat
            } else {
                Lookup::Nat(reply.src, reply.dst)
            });
        }
        Ok(Lookup::Absent)
    }
}

fn put_tuple(r: &mut Vec<u8>, kind: u16, t: Tuple) {
    let outer = netlink::begin_nest(r, kind);
    let ip = netlink::begin_nest(r, CTA_TUPLE_IP);
    match (t.src.ip(), t.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            netlink::put_attr(r, CTA_IP_V4_SRC, &s.octets());
            netlink::put_attr(r, CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            netlink::put_attr(r, CTA_IP_V6_SRC, &v6(s).octets());
            netlink::put_attr(r, CTA_IP_V6_DST, &v6(d).octets());
        }
    }
    netlink::end_nest(r, ip);
    let proto = netlink::begin_nest(r, CTA_TUPLE_PROTO);
    netlink::put_attr(r, CTA_PROTO_NUM, &[libc::IPPROTO_TCP as u8]);
    netlink::put_attr(r, CTA_PROTO_SRC_PORT, &t.src.port().to_be_bytes());
    netlink::put_attr(r, CTA_PROTO_DST_PORT, &t.dst.port().to_be_bytes());
    netlink::end_nest(r, proto);
    netlink::end_nest(r, outer);
}

fn v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}

/// The request: GET of one entry by its original or reply tuple.
fn request(seq: u32, t: Tuple, reply: bool) -> Vec<u8> {
    let mut r = vec![0u8; NLMSG_HDR];
    let family = match t.src.ip() {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    };
    // struct nfgenmsg: family, version NFNETLINK_V0, res_id 0
    r.extend_from_slice(&[family, 0, 0, 0]);
    let kind = if reply {
        CTA_TUPLE_REPLY
    } else {
        CTA_TUPLE_ORIG
    };
    put_tuple(&mut r, kind, t);
    netlink::set_header(&mut r, CT_GET, libc::NLM_F_REQUEST as u16, seq);
    r
}

/// One datagram of the answer: Some(Some((original, reply))) for the question `seq`,
/// Some(None) when there is no such entry, None for another question's answer.
fn answer(b: &[u8], seq: u32) -> Result<Option<Option<(Tuple, Tuple)>>> {
    let (len, kind, _, s) = netlink::header(b)?;
    if s != seq {
        return Ok(None);
    }
    if let Some(err) = netlink::error_of(b) {
        return match err {
            libc::ENOENT => Ok(Some(None)),
            e => Err(std::io::Error::from_raw_os_error(e)).context("ctnetlink lookup"),
        };
    }
    if kind != CT_NEW || b.len() < NLMSG_HDR + 4 {
        anyhow::bail!(
            "unexpected ctnetlink answer (type {kind:#x}, {} bytes)",
            b.len()
        );
    }
    let (mut orig, mut reply) = (None, None);
    for (k, v) in netlink::attrs(&b[NLMSG_HDR + 4..len.min(b.len())]) {
        match k {
            CTA_TUPLE_ORIG => orig = parse_tuple(v),
            CTA_TUPLE_REPLY => reply = parse_tuple(v),
            _ => {}
        }
    }
    match (orig, reply) {
        (Some(o), Some(r)) => Ok(Some(Some((o, r)))),
        _ => anyhow::bail!("a ctnetlink answer without both tuples"),
    }
}

/// A nested CTA_TUPLE_*: addresses and TCP/UDP ports.
fn parse_tuple(b: &[u8]) -> Option<Tuple> {
    let (mut src, mut dst, mut sport, mut dport) = (None, None, None, None);
    for (k, v) in netlink::attrs(b) {
        match k {
            CTA_TUPLE_IP => {
                for (k, v) in netlink::attrs(v) {
                    let ip = match v.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(v).ok()?),
                        16 => IpAddr::from(<[u8; 16]>::try_from(v).ok()?),
                        _ => continue,
                    };
                    match k {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(ip),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = Some(ip),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (k, v) in netlink::attrs(v) {
                    let port = || Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?));
                    match k {
                        CTA_PROTO_SRC_PORT => sport = port(),
                        CTA_PROTO_DST_PORT => dport = port(),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple {
        src: SocketAddr::new(src?, sport?),
        dst: SocketAddr::new(dst?, dport?),
    })
}

/// The sampler's NATed flows mapped to their sockets' tuples: one lookup per
/// flow no earlier view knows (a flow without NAT that the TCP view sees
/// never gets here), cached while the flow is seen ([`FlowCache`]: translated, asked again
/// after a minute; not, after 10 s), a bounded number per read and flows at most.
pub struct NatJoin {
    /// The socket's flow of each wire flow, None when not translated.
    cache: FlowCache<Conntrack, Option<Flow>>,
    /// ctnetlink lookups made (each one or two GETs).
    pub lookups: u64,
    /// Flows found translated (each once per stay in the cache).
    pub translated: u64,
    /// Lookups that failed (no ctnetlink in the kernel, no permission, a timeout).
    pub errors: u64,
    /// Flows the cache or the per-read budget had no room for.
    pub skipped: u64,
}

impl NatJoin {
    /// For the namespaces of the sampler's interfaces; one that cannot be
    /// entered, or has no ctnetlink, gets no socket (its flows are never
    /// translated).
    pub fn open(namespaces: &[NetNs]) -> NatJoin {
        NatJoin {
            cache: FlowCache::open(namespaces, "ctnetlink", Conntrack::open),
            lookups: 0,
            translated: 0,
            errors: 0,
            skipped: 0,
        }
    }

    /// A new read.
    pub fn begin(&mut self) {
        self.cache.begin();
    }

    /// A flow still in the sampler's table without new samples: keep what is known of it.
    pub fn keep(&mut self, f: &Flow) {
        self.cache.keep(f);
    }

    /// Forget the flows not seen since [`NatJoin::begin`].
    pub fn end(&mut self) {
        self.cache.end();
    }

    /// The socket's flow of the wire's flow `f`, when the tracker of its
    /// namespace translated it; None when not (or unknown).
    pub fn socket_of(&mut self, f: &Flow) -> Option<Flow> {
        let ct = match self.cache.get(f, Option::is_some) {
            Cached::Known(socket) => return socket,
            Cached::NoRoom => {
                self.skipped += 1;
                return None;
            }
            Cached::NoSocket => return None,
            Cached::Ask(ct) => ct,
        };
        self.lookups += 1;
        let socket = match ct.lookup(f.local, f.remote) {
            Ok(Lookup::Nat(local, remote)) => Some(Flow::new(f.netns, local, remote)),
            Ok(_) => None,
            Err(e) => {
                self.errors += 1;
                tracing::debug!("ctnetlink lookup of {f:?}: {e:#}");
                None
            }
        };
        let was = self.cache.insert(*f, socket);
        if socket.is_some() && was.flatten() != socket {
            self.translated += 1;
        }
        socket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(s: &str, d: &str) -> Tuple {
        Tuple {
            src: s.parse().unwrap(),
            dst: d.parse().unwrap(),
        }
    }

    /// The request as `conntrack -G` would send it, and an answer built the
    /// way the kernel nests it, read back.
    #[test]
    fn request_and_answer_layout() {
        let t = tuple("10.99.0.2:7001", "10.99.0.1:60310");
        let r = request(5, t, true);
        assert_eq!(netlink::header(&r).unwrap(), (r.len(), CT_GET, 1, 5));
        assert_eq!(&r[16..20], &[2, 0, 0, 0]);
        let outer: Vec<_> = netlink::attrs(&r[20..]).collect();
        assert_eq!(outer.len(), 1);
        assert_eq!(outer[0].0, CTA_TUPLE_REPLY);
        assert_eq!(parse_tuple(outer[0].1), Some(t));
        // an answer: CT_NEW with both tuples (and another attribute between)
        let mut a = vec![0u8; NLMSG_HDR];
        a.extend_from_slice(&[2, 0, 0, 0]);
        let orig = tuple("10.99.0.1:60310", "10.100.0.10:80");
        put_tuple(&mut a, CTA_TUPLE_ORIG, orig);
        netlink::put_attr(&mut a, 3, &[0, 0, 0, 8]);
        put_tuple(&mut a, CTA_TUPLE_REPLY, t);
        netlink::set_header(&mut a, CT_NEW, 0, 5);
        assert_eq!(answer(&a, 5).unwrap(), Some(Some((orig, t))));
        assert_eq!(answer(&a, 6).unwrap(), None);
        // IPv6
        let t6 = tuple("[fd99::2]:7001", "[fd99::1]:40000");
        let r6 = request(1, t6, false);
        assert_eq!(r6[16], libc::AF_INET6 as u8);
        let o6: Vec<_> = netlink::attrs(&r6[20..]).collect();
        assert_eq!((o6[0].0, parse_tuple(o6[0].1)), (CTA_TUPLE_ORIG, Some(t6)));
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        assert!(answer(&[0; 8], 1).is_err());
        let mut a = vec![0u8; NLMSG_HDR + 4];
        netlink::set_header(&mut a, CT_NEW, 0, 1);
        assert!(answer(&a, 1).is_err(), "no tuples");
        let mut e = vec![0u8; NLMSG_HDR + 4];
        e[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        netlink::set_header(&mut e, libc::NLMSG_ERROR as u16, 0, 1);
        assert_eq!(answer(&e, 1).unwrap(), Some(None));
        e[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert!(answer(&e, 1).is_err());
        assert_eq!(parse_tuple(&[1, 0, 1, 0, 9, 9]), None);
    }

    /// No NAT in a fresh namespace of our own... is not available unprivileged: the live
    /// lookups are checked end to end (tests/tests/nat.rs). Here: an absent entry in the
    /// caller's namespace is no error when ctnetlink is there (skipped when it is not).
    #[test]
    fn absent_entry_is_absent() {
        let Ok(mut ct) = Conntrack::open() else {
            return;
        };
        match ct.lookup(
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ) {
            Ok(l) => assert_eq!(l, Lookup::Absent),
            Err(e) => eprintln!("ctnetlink unavailable here: {e:#}"),
        }
    }
}
