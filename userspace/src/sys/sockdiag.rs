//! Which cgroup owns the TCP socket of a 4-tuple (`--label-workload` for
//! the sampler's flows): one exact lookup through sock_diag (inet_diag,
//! `SOCK_DIAG_BY_FAMILY` without `NLM_F_DUMP`: the kernel's hash lookup of
//! that one socket, not a walk of the table), whose answer carries
//! `INET_DIAG_CGROUP_ID` (kernels >= 5.7 with `CONFIG_SOCK_CGROUP_DATA`,
//! which cgroup BPF selects: every kernel the TCP view runs on). The id's
//! low 32 bits are the cgroup directory's inode, as the TCP view records it.
//!
//! A lookup answers for an open socket only: a TIME_WAIT socket carries no
//! cgroup, and a listening socket is not taken as the owner (a router's
//! listener on `0.0.0.0:PORT` would otherwise claim forwarded flows). The
//! socket is opened in the namespace the calling thread is in and stays
//! there; sock_diag needs no privilege for this.
use std::net::{IpAddr, SocketAddr};

use anyhow::{bail, Context, Result};

use crate::analysis::flow::Flow;
use crate::sys::flowcache::{Cached, FlowCache};
use crate::sys::netlink::{self, Netlink};
use crate::sys::netns::NetNs;

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_CGROUP_ID: u16 = 21;
const TCP_LISTEN: u8 = 10;
/// nlmsghdr (16) + inet_diag_req_v2 (56).
const REQ_LEN: usize = 72;
/// nlmsghdr (16) + inet_diag_msg (72): where the attributes start.
const ATTRS_AT: usize = 88;

/// What the socket table says about a 4-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// An open socket of that cgroup id.
    Cgroup(u64),
    /// No open socket (none, TIME_WAIT, or only a listener), or no cgroup id in the answer.
    None,
}

/// A sock_diag socket of one network namespace.
pub struct SockDiag {
    nl: Netlink,
}

impl SockDiag {
    /// Open one in the calling thread's namespace (`netns::run_in` for another).
    pub fn open() -> Result<SockDiag> {
        Ok(SockDiag {
            nl: Netlink::open(NETLINK_SOCK_DIAG, "sock_diag")?,
        })
    }

    /// The owner of the TCP socket `local` <-> `remote` in this namespace.
    pub fn tcp_owner(&mut self, local: SocketAddr, remote: SocketAddr) -> Result<Owner> {
        let seq = self.nl.next_seq();
        let req = request(seq, local, remote);
        self.nl.ask(&req, |b| answer(b, seq))
    }
}

/// The request: exact lookup of one TCP socket, any state.
fn request(seq: u32, local: SocketAddr, remote: SocketAddr) -> [u8; REQ_LEN] {
    let mut r = [0u8; REQ_LEN];
    netlink::set_header(&mut r, SOCK_DIAG_BY_FAMILY, libc::NLM_F_REQUEST as u16, seq);
    r[16] = match local.ip() {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    };
    r[17] = libc::IPPROTO_TCP as u8;
    r[20..24].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
                                                        // inet_diag_sockid: ports and addresses in network order.
    r[24..26].copy_from_slice(&local.port().to_be_bytes());
    r[26..28].copy_from_slice(&remote.port().to_be_bytes());
    put_addr(&mut r[28..44], local.ip());
    put_addr(&mut r[44..60], remote.ip());
    // idiag_if 0 (any), cookie INET_DIAG_NOCOOKIE
    r[64..72].copy_from_slice(&[0xff; 8]);
    r
}

fn put_addr(dst: &mut [u8], a: IpAddr) {
    match a {
        IpAddr::V4(v4) => dst[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => dst.copy_from_slice(&v6.octets()),
    }
}

/// One datagram of the answer: Some(owner) for the question `seq`, None
/// for another question's answer.
fn answer(buf: &[u8], seq: u32) -> Result<Option<Owner>> {
    let (len, kind, _, s) = netlink::header(buf)?;
    if s != seq {
        return Ok(None);
    }
    if let Some(err) = netlink::error_of(buf) {
        return match err {
            libc::ENOENT => Ok(Some(Owner::None)),
            e => Err(std::io::Error::from_raw_os_error(e)).context("sock_diag lookup"),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY || buf.len() < ATTRS_AT {
        bail!(
            "unexpected sock_diag answer (type {kind}, {} bytes)",
            buf.len()
        );
    }
    if buf[17] == TCP_LISTEN {
        return Ok(Some(Owner::None));
    }
    let end = len.clamp(ATTRS_AT, buf.len());
    for (ty, v) in netlink::attrs(&buf[ATTRS_AT..end]) {
        if let (INET_DIAG_CGROUP_ID, Some(id)) = (ty, v.get(..8)) {
            let id = u64::from_ne_bytes(id.try_into().unwrap());
            return Ok(Some(Owner::Cgroup(id)));
        }
    }
    Ok(Some(Owner::None))
}

/// The owners' cgroups of the sampler's TCP flows: one sock_diag lookup per flow in its
/// interface's namespace, cached while the flow is seen ([`FlowCache`]). Called once per read
/// per flow, never per packet.
pub struct FlowOwners {
    /// The cgroup inode found for each flow, 0 for none.
    cache: FlowCache<SockDiag, u32>,
    /// sock_diag lookups made.
    pub lookups: u64,
    /// Flows looked up whose owner was not found (no open socket, a
    /// namespace without a socket, a failed lookup, or the cache full).
    pub unknown: u64,
}

impl FlowOwners {
    /// For the namespaces of the sampler's interfaces; a namespace that
    /// cannot be entered has no socket (its flows have no owner).
    pub fn open(namespaces: &[NetNs]) -> FlowOwners {
        FlowOwners {
            cache: FlowCache::open(namespaces, "sock_diag", SockDiag::open),
            lookups: 0,
            unknown: 0,
        }
    }

    /// A new read.
    pub fn begin(&mut self) {
        self.cache.begin();
    }

    /// A flow still in the sampler's table (no new samples): keep its
    /// owner for the end summary, when its socket may be gone.
    pub fn keep(&mut self, f: &Flow) {
        self.cache.keep(f);
    }

    /// Forget the flows not seen since [`FlowOwners::begin`].
    pub fn end(&mut self) {
        self.cache.end();
    }

    /// The cgroup inode (the id's low 32 bits) of the flow's local socket, 0 when none.
    pub fn cgroup(&mut self, f: &Flow) -> u32 {
        let cg = match self.cache.get(f, |cg| *cg != 0) {
            Cached::Known(cg) => return cg,
            Cached::NoRoom => {
                self.unknown += 1;
                return 0;
            }
            Cached::NoSocket => 0,
            Cached::Ask(s) => {
                self.lookups += 1;
                match s.tcp_owner(f.local, f.remote) {
                    Ok(Owner::Cgroup(id)) => id as u32,
                    Ok(Owner::None) => 0,
                    Err(e) => {
                        tracing::debug!("sock_diag lookup of {f:?}: {e:#}");
                        0
                    }
                }
            }
        };
        if cg == 0 {
            self.unknown += 1;
        }
        self.cache.insert(*f, cg);
        cg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn request_layout() {
        let r = request(
            7,
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 72);
        assert_eq!((r[16], r[17]), (2, 6));
        assert_eq!(&r[24..28], &[0x9c, 0x40, 0, 80]);
        assert_eq!(&r[28..32], &[10, 0, 0, 1]);
        assert_eq!(&r[44..48], &[10, 0, 0, 2]);
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        assert!(answer(&[0; 8], 1).is_err());
        let mut b = vec![0u8; 40];
        b[4..6].copy_from_slice(&99u16.to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        assert!(answer(&b, 1).is_err());
        assert!(matches!(answer(&b, 2), Ok(None)));
        // an attribute running past the end is ignored
        let mut b = vec![0u8; ATTRS_AT + 8];
        b[0..4].copy_from_slice(&((ATTRS_AT + 8) as u32).to_ne_bytes());
        b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        b[ATTRS_AT..ATTRS_AT + 2].copy_from_slice(&200u16.to_ne_bytes());
        assert_eq!(answer(&b, 1).unwrap(), Some(Owner::None));
    }

    /// A real connection on loopback: both ends are this process's sockets,
    /// in this process's cgroup; the listener alone is no owner.
    #[test]
    fn own_connection_has_our_cgroup() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let mut d = SockDiag::open().unwrap();
        let a = d
            .tcp_owner(c.local_addr().unwrap(), c.peer_addr().unwrap())
            .unwrap();
        let b = d
            .tcp_owner(s.local_addr().unwrap(), s.peer_addr().unwrap())
            .unwrap();
        let Owner::Cgroup(id) = a else {
            panic!("no cgroup id for an open socket: {a:?}");
        };
        assert_eq!(a, b);
        // the cgroup id's low 32 bits: our cgroup v2 directory's inode
        if let Some(root) = crate::sys::preflight::cgroup2_mount() {
            let me = std::fs::read_to_string("/proc/self/cgroup").unwrap();
            if let Some(rel) = me.lines().find_map(|l| l.strip_prefix("0::")) {
                use std::os::unix::fs::MetadataExt;
                let dir = std::path::Path::new(&root).join(rel.trim_start_matches('/'));
                if let Ok(md) = std::fs::metadata(&dir) {
                    assert_eq!(md.ino() as u32, id as u32, "{}", dir.display());
                }
            }
        }
        let gone = d
            .tcp_owner(
                "127.0.0.1:1".parse().unwrap(),
                "127.0.0.1:2".parse().unwrap(),
            )
            .unwrap();
        assert_eq!(gone, Owner::None);
        // the listener's own port from an unknown peer: the listener is not the owner
        let lone = d
            .tcp_owner(l.local_addr().unwrap(), "127.0.0.9:9".parse().unwrap())
            .unwrap();
        assert_eq!(lone, Owner::None);
    }
}
