//! A flow as userspace shows it, converted from the kernel's `rttscope_flow_key`.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::bpf::FlowKey;

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// One end's view of a connection: (namespace, local, remote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Flow {
    pub netns: u32,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

impl Flow {
    pub fn from_key(k: &FlowKey) -> Option<Flow> {
        let (l, r) = match k.family {
            AF_INET => (
                IpAddr::V4(Ipv4Addr::new(
                    k.laddr[0], k.laddr[1], k.laddr[2], k.laddr[3],
                )),
                IpAddr::V4(Ipv4Addr::new(
                    k.raddr[0], k.raddr[1], k.raddr[2], k.raddr[3],
                )),
            ),
            AF_INET6 => (
                IpAddr::V6(Ipv6Addr::from(k.laddr)),
                IpAddr::V6(Ipv6Addr::from(k.raddr)),
            ),
            _ => return None,
        };
        Some(Flow {
            netns: k.netns,
            local: SocketAddr::new(l, k.lport),
            remote: SocketAddr::new(r, k.rport),
        })
    }

    pub fn to_key(&self) -> FlowKey {
        let mut k = FlowKey {
            netns: self.netns,
            lport: self.local.port(),
            rport: self.remote.port(),
            ..Default::default()
        };
        match (self.local.ip(), self.remote.ip()) {
            (IpAddr::V4(l), IpAddr::V4(r)) => {
                k.family = AF_INET;
                k.laddr[..4].copy_from_slice(&l.octets());
                k.raddr[..4].copy_from_slice(&r.octets());
            }
            (l, r) => {
                k.family = AF_INET6;
                k.laddr = to_v6(l).octets();
                k.raddr = to_v6(r).octets();
            }
        }
        k
    }

    /// The same connection seen from the other end (when both ends are in view).
    pub fn reversed(&self, peer_netns: u32) -> Flow {
        Flow {
            netns: peer_netns,
            local: self.remote,
            remote: self.local,
        }
    }
}

fn to_v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}", self.local, self.remote)
    }
}

/// Which end computed the sample: the data sender whose ACKs were timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Client,
    Server,
    Unknown,
    /// ICMP echo (sampler): this host sent the request.
    Pinger,
    /// ICMP echo (sampler): this host answered it (the RTT is its own reply time).
    Pinged,
}

impl Side {
    pub fn from_raw(v: u8) -> Side {
        match v {
            1 => Side::Client,
            2 => Side::Server,
            _ => Side::Unknown,
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
            Side::Unknown => "?",
            Side::Pinger => "pinger",
            Side::Pinged => "pinged",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_roundtrip_v4_v6() {
        for (l, r) in [
            ("10.0.0.1:80", "10.0.0.2:5555"),
            ("[fd77::1]:443", "[fd77::2]:40000"),
        ] {
            let f = Flow {
                netns: 4026531840,
                local: l.parse().unwrap(),
                remote: r.parse().unwrap(),
            };
            let k = f.to_key();
            assert_eq!(Flow::from_key(&k), Some(f));
        }
    }

    #[test]
    fn decodes_key_bytes_fixture() {
        // netns=0x11223344, AF_INET, lport 80, rport 5555, 10.0.0.1 -> 10.0.0.2
        let mut b = vec![0x44, 0x33, 0x22, 0x11, 2, 0, 80, 0, 0xb3, 0x15, 0, 0];
        b.extend([10, 0, 0, 1]);
        b.extend([0u8; 12]);
        b.extend([10, 0, 0, 2]);
        b.extend([0u8; 12]);
        let k: FlowKey = crate::bpf::decode(&b).unwrap();
        let f = Flow::from_key(&k).unwrap();
        assert_eq!(f.netns, 0x11223344);
        assert_eq!(f.local, "10.0.0.1:80".parse().unwrap());
        assert_eq!(f.remote, "10.0.0.2:5555".parse().unwrap());
        assert!(crate::bpf::decode::<FlowKey>(&b[..10]).is_err());
        let mut bad = b.clone();
        bad[4] = 99;
        assert_eq!(Flow::from_key(&crate::bpf::decode(&bad).unwrap()), None);
    }
}
