//! Which end of a TCP connection a sampler flow is, when the programs did
//! not see its handshake (opened before the sampler started, or the SYN not
//! sampled): the host's socket table, as the TCP view decides for the
//! connections its iterator finds (`views::tcp::decode_flow`). A flow whose
//! 4-tuple is a socket of the interface's namespace is the server's if its
//! local port is a listening port there, else the client's; a flow with no
//! socket (forwarded traffic on a router, or already closed) is the
//! server's if its local port listens, else unknown.
//!
//! The table is read from `/proc/thread-self/net/tcp` and `tcp6` by a
//! thread inside each namespace (`sys::netns::run_in`), only when a flow
//! of unknown side shows up, at most once per read.
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::analysis::flow::{Flow, Side};
use crate::sys::netns::{self, NetNs};

/// TCP state LISTEN in /proc/net/tcp.
const LISTEN: u8 = 0x0a;

/// The TCP sockets of some namespaces: listening ports, and connections.
#[derive(Debug, Default)]
pub struct SocketTable {
    listeners: HashSet<(u32, u16)>,
    conns: HashSet<(u32, SocketAddr, SocketAddr)>,
}

impl SocketTable {
    /// Read the sockets of each namespace (by inode); a namespace that
    /// cannot be entered or read is left out (its flows stay unknown).
    pub fn read(namespaces: &[NetNs]) -> SocketTable {
        let mut t = SocketTable::default();
        for ns in namespaces {
            let text = netns::run_in(ns, || -> anyhow::Result<String> {
                let mut s = std::fs::read_to_string("/proc/thread-self/net/tcp")?;
                // no IPv6 in the kernel: tcp6 is absent
                s.push_str(
                    &std::fs::read_to_string("/proc/thread-self/net/tcp6").unwrap_or_default(),
                );
                Ok(s)
            });
            match text {
                Ok(text) => t.add(ns.inode, &text),
                Err(e) => tracing::debug!("socket table of {}: {e:#}", ns.name),
            }
        }
        t
    }

    /// Add the sockets of one namespace from /proc/net/tcp{,6} text.
    pub fn add(&mut self, netns: u32, text: &str) {
        for (local, remote, state) in text.lines().filter_map(parse_line) {
            if state == LISTEN {
                self.listeners.insert((netns, local.port()));
            } else {
                self.conns.insert((netns, local, remote));
            }
        }
    }

    /// The side of a TCP flow by the rules above.
    pub fn side(&self, f: &Flow) -> Side {
        let listens = self.listeners.contains(&(f.netns, f.local.port()));
        if listens {
            Side::Server
        } else if self.conns.contains(&(f.netns, f.local, f.remote))
            || self
                .conns
                .contains(&(f.netns, mapped(f.local), mapped(f.remote)))
        {
            Side::Client
        } else {
            Side::Unknown
        }
    }
}

/// An IPv4 address as a dual-stack socket shows it in tcp6 (::ffff:a.b.c.d).
fn mapped(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    }
}

/// One line of /proc/net/tcp or tcp6: (local, remote, state); None for the
/// header or anything malformed.
pub(crate) fn parse_line(line: &str) -> Option<(SocketAddr, SocketAddr, u8)> {
    let mut it = line.split_whitespace();
    let _slot = it.next()?.strip_suffix(':')?;
    let local = parse_addr(it.next()?)?;
    let remote = parse_addr(it.next()?)?;
    let state = u8::from_str_radix(it.next()?, 16).ok()?;
    Some((local, remote, state))
}

/// `0100007F:1F90` (IPv4: the address's bytes as one native-endian u32 in
/// hex) or 32 hex digits (IPv6: four such words), then the port in hex.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let word = |w: &str| u32::from_str_radix(w, 16).ok().map(u32::to_ne_bytes);
    let ip = match a.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(a)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(a.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// A flow the socket table could not place is looked up again after this
/// long at the earliest (a busy host's table is large: not every read).
const RECHECK_UNKNOWN: std::time::Duration = std::time::Duration::from_secs(10);

/// The side of each sampler flow the kernel could not label, resolved once
/// per flow (cached while the flow is seen; an unknown answer for
/// [`RECHECK_UNKNOWN`]), reading the socket table at most once per call to
/// [`SideResolver::begin`].
#[derive(Default)]
pub struct SideResolver {
    namespaces: Vec<NetNs>,
    known: HashMap<Flow, (Side, std::time::Instant)>,
    seen: HashSet<Flow>,
    table: Option<SocketTable>,
}

impl SideResolver {
    /// For the namespaces of the sampler's interfaces.
    pub fn new(namespaces: Vec<NetNs>) -> SideResolver {
        SideResolver {
            namespaces,
            ..Default::default()
        }
    }

    /// A new read: the socket table may be read again (once).
    pub fn begin(&mut self) {
        self.table = None;
        self.seen.clear();
    }

    /// Forget the flows not seen since [`SideResolver::begin`] (bounded by the flow table).
    pub fn end(&mut self) {
        let seen = &self.seen;
        self.known.retain(|f, _| seen.contains(f));
    }

    /// The side of a TCP flow the kernel did not label.
    pub fn side(&mut self, f: &Flow) -> Side {
        self.seen.insert(*f);
        match self.known.get(f) {
            Some((s, at)) if *s != Side::Unknown || at.elapsed() < RECHECK_UNKNOWN => return *s,
            _ => {}
        }
        let namespaces = &self.namespaces;
        let side = self
            .table
            .get_or_insert_with(|| SocketTable::read(namespaces))
            .side(f);
        self.known.insert(*f, (side, std::time::Instant::now()));
        side
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1389 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 ffff 100 0 0 10 0
   1: 01004D0A:9C40 02004D0A:1389 01 00000000:00000000 00:00000000 00000000     0        0 2 1 ffff 20 4 30 10 -1
";
    const TCP6: &str =
        "  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0
   1: 0000000000000000FFFF0000010B4D0A:A000 0000000000000000FFFF0000020B4D0A:0050 01 0
";

    #[test]
    fn parses_proc_net_tcp() {
        let (l, r, st) = parse_line(TCP.lines().nth(2).unwrap()).unwrap();
        assert_eq!(l, "10.77.0.1:40000".parse().unwrap());
        assert_eq!(r, "10.77.0.2:5001".parse().unwrap());
        assert_eq!(st, 1);
        assert!(parse_line(TCP.lines().next().unwrap()).is_none());
        let (l, _, st) = parse_line(TCP6.lines().nth(2).unwrap()).unwrap();
        assert_eq!(l, "[::ffff:10.77.11.1]:40960".parse().unwrap());
        assert_eq!(st, 1);
    }

    #[test]
    fn sides_from_listeners_and_connections() {
        let mut t = SocketTable::default();
        t.add(7, TCP);
        t.add(7, TCP6);
        let flow = |l: &str, r: &str, ns| Flow {
            tunnel: Default::default(),
            netns: ns,
            local: l.parse().unwrap(),
            remote: r.parse().unwrap(),
        };
        // a connection to the listener on 5001 from 40000: the client's end
        assert_eq!(
            t.side(&flow("10.77.0.1:40000", "10.77.0.2:5001", 7)),
            Side::Client
        );
        // the listening port's end: the server's (port 5001 listens on 127.0.0.1)
        assert_eq!(
            t.side(&flow("10.77.0.2:5001", "10.77.0.1:40000", 7)),
            Side::Server
        );
        // [::]:80 listens (dual stack)
        assert_eq!(
            t.side(&flow("10.77.11.2:80", "10.77.11.1:40960", 7)),
            Side::Server
        );
        // the IPv4 client end as the dual-stack table shows it (::ffff:)
        assert_eq!(
            t.side(&flow("10.77.11.1:40960", "10.77.11.2:80", 7)),
            Side::Client
        );
        // no socket: forwarded, or another namespace
        assert_eq!(
            t.side(&flow("10.77.0.1:40000", "10.77.0.2:5001", 8)),
            Side::Unknown
        );
    }

    proptest! {
        #[test]
        fn parser_survives_anything(text in "\\PC{0,200}(\n\\PC{0,120}){0,5}") {
            let mut t = SocketTable::default();
            t.add(1, &text);
        }

        #[test]
        fn parser_survives_near_misses(
            a in "[0-9A-Fa-f:]{0,40}", b in "[0-9A-Fa-f:]{0,40}", st in "[0-9A-Fa-f]{0,3}"
        ) {
            let _ = parse_line(&format!("  0: {a} {b} {st} 0"));
        }
    }
}
