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
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::analysis::flow::Flow;
use crate::sys::netlink::Netlink;
use crate::sys::netns::{self, NetNs};

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
    r[0..4].copy_from_slice(&(REQ_LEN as u32).to_ne_bytes());
    r[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    r[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    r[8..12].copy_from_slice(&seq.to_ne_bytes());
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
    if buf.len() < 16 {
        bail!("short sock_diag answer ({} bytes)", buf.len());
    }
    let u16_at = |o: usize| u16::from_ne_bytes([buf[o], buf[o + 1]]);
    if u32::from_ne_bytes(buf[8..12].try_into().unwrap()) != seq {
        return Ok(None);
    }
    let kind = u16_at(4);
    if kind == libc::NLMSG_ERROR as u16 && buf.len() >= 20 {
        let err = -i32::from_ne_bytes(buf[16..20].try_into().unwrap());
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
    let end = (u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize).min(buf.len());
    let mut at = ATTRS_AT;
    while at + 4 <= end {
        let (len, ty) = (u16_at(at) as usize, u16_at(at + 2));
        if len < 4 || at + len > end {
            break;
        }
        if ty == INET_DIAG_CGROUP_ID && len >= 12 {
            let id = u64::from_ne_bytes(buf[at + 4..at + 12].try_into().unwrap());
            return Ok(Some(Owner::Cgroup(id)));
        }
        at += (len + 3) & !3;
    }
    Ok(Some(Owner::None))
}

/// A found owner is asked again after this long (the 4-tuple may be reused by another socket).
pub const RECHECK_FOUND: Duration = Duration::from_secs(60);
/// A flow with no owner is asked again after this long at the earliest.
pub const RECHECK_NONE: Duration = Duration::from_secs(10);
/// Lookups per read at most (the rest wait for the next read).
pub const MAX_LOOKUPS_PER_READ: u32 = 4_096;
/// Flows remembered at most (beyond the sampler's own table: never reached).
pub const MAX_KNOWN: usize = 65_536;

/// The owners' cgroups of the sampler's TCP flows: one sock_diag lookup per
/// flow in its interface's namespace, cached while the flow is seen (found:
/// asked again after [`RECHECK_FOUND`]; none: after [`RECHECK_NONE`]), at
/// most [`MAX_LOOKUPS_PER_READ`] per read. Called once per read per flow,
/// never per packet.
pub struct FlowOwners {
    /// A sock_diag socket per namespace inode (opened at the start, while
    /// the process may still enter namespaces).
    sockets: HashMap<u32, SockDiag>,
    known: HashMap<Flow, (u32, Instant)>,
    seen: HashSet<Flow>,
    budget: u32,
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
        let mut sockets = HashMap::new();
        for ns in namespaces {
            match netns::run_in(ns, SockDiag::open) {
                Ok(s) => {
                    sockets.insert(ns.inode, s);
                }
                Err(e) => tracing::debug!("sock_diag in {}: {e:#}", ns.name),
            }
        }
        FlowOwners {
            sockets,
            known: HashMap::new(),
            seen: HashSet::new(),
            budget: MAX_LOOKUPS_PER_READ,
            lookups: 0,
            unknown: 0,
        }
    }

    /// A new read.
    pub fn begin(&mut self) {
        self.seen.clear();
        self.budget = MAX_LOOKUPS_PER_READ;
    }

    /// A flow still in the sampler's table (no new samples): keep its
    /// owner for the end summary, when its socket may be gone.
    pub fn keep(&mut self, f: &Flow) {
        if self.known.contains_key(f) {
            self.seen.insert(*f);
        }
    }

    /// Forget the flows not seen since [`FlowOwners::begin`].
    pub fn end(&mut self) {
        let seen = &self.seen;
        self.known.retain(|f, _| seen.contains(f));
    }

    /// The cgroup inode (the id's low 32 bits) of the flow's local socket, 0 when none.
    pub fn cgroup(&mut self, f: &Flow) -> u32 {
        self.seen.insert(*f);
        if let Some(&(cg, at)) = self.known.get(f) {
            let fresh = if cg != 0 { RECHECK_FOUND } else { RECHECK_NONE };
            if at.elapsed() < fresh || self.budget == 0 {
                return cg;
            }
        } else if self.budget == 0 || self.known.len() >= MAX_KNOWN {
            self.unknown += 1;
            return 0;
        }
        self.budget -= 1;
        let cg = match self.sockets.get_mut(&f.netns) {
            Some(s) => {
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
            None => 0,
        };
        if cg == 0 {
            self.unknown += 1;
        }
        self.known.insert(*f, (cg, Instant::now()));
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
