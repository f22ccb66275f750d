//! A flow as userspace shows it, converted from the kernel's `rttscope_flow_key`.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::bpf::FlowKey;

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// One end's view of a connection: (namespace, local, remote), and the
/// tunnel identity it was seen with (none for a socket's flow and for a
/// plain packet's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Flow {
    pub netns: u32,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    #[serde(default, skip_serializing_if = "Tunnel::is_none")]
    pub tunnel: Tunnel,
}

/// How the packets of a tunnelled flow were encapsulated.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Encap {
    Vxlan,
    Geneve,
    /// IPv4 or IPv6 inside IPv4 or IPv6 (protocol 4 or 41): no VNI.
    Ipip,
}

impl Encap {
    pub fn as_str(&self) -> &'static str {
        match self {
            Encap::Vxlan => "vxlan",
            Encap::Geneve => "geneve",
            Encap::Ipip => "ipip",
        }
    }
}

/// A flow's tunnel identity, part of its key (bpf/rttscope.h, struct
/// rttscope_flow_key): the VLAN id of the frame its own packets travel in
/// (the inner, customer tag of two), and for a flow seen inside VXLAN or
/// Geneve the VNI (0 is a valid VNI: None is no VNI) and the encapsulation.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub struct Tunnel {
    /// VLAN id 1-4095; None: untagged (or a priority tag, id 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<Encap>,
}

const KEY_VLAN_MASK: u16 = 0xfff;
const TUN_VNI_MASK: u32 = 0xff_ffff;
const TUN_VNI: u32 = 1 << 24;
const TUN_ENCAP_SHIFT: u32 = 25;

impl Tunnel {
    /// No VLAN, no tunnel: a plain flow.
    pub fn is_none(&self) -> bool {
        *self == Tunnel::default()
    }

    /// From the key's `vlan` (its low 12 bits) and `tunnel` fields.
    pub fn from_key(k: &FlowKey) -> Tunnel {
        let vlan = k.vlan & KEY_VLAN_MASK;
        Tunnel {
            vlan: (vlan != 0).then_some(vlan),
            vni: (k.tunnel & TUN_VNI != 0).then_some(k.tunnel & TUN_VNI_MASK),
            encap: match (k.tunnel >> TUN_ENCAP_SHIFT) & 3 {
                1 => Some(Encap::Vxlan),
                2 => Some(Encap::Geneve),
                3 => Some(Encap::Ipip),
                _ => None,
            },
        }
    }

    /// Into a key's `vlan` and `tunnel` fields.
    fn to_key(self, k: &mut FlowKey) {
        k.vlan = self.vlan.unwrap_or(0) & KEY_VLAN_MASK;
        k.tunnel = self.vni.map_or(0, |v| TUN_VNI | (v & TUN_VNI_MASK))
            | match self.encap {
                None => 0,
                Some(Encap::Vxlan) => 1 << TUN_ENCAP_SHIFT,
                Some(Encap::Geneve) => 2 << TUN_ENCAP_SHIFT,
                Some(Encap::Ipip) => 3 << TUN_ENCAP_SHIFT,
            };
    }
}

impl fmt::Display for Tunnel {
    /// `vlan 7`, `vxlan vni 42`, `vlan 7 geneve vni 0`, `ipip` (empty for none).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = vec![];
        if let Some(v) = self.vlan {
            parts.push(format!("vlan {v}"));
        }
        if let Some(e) = self.encap {
            parts.push(e.as_str().to_string());
        }
        if let Some(v) = self.vni {
            parts.push(format!("vni {v}"));
        }
        write!(f, "{}", parts.join(" "))
    }
}

impl Flow {
    /// A plain flow (no tunnel identity).
    pub fn new(netns: u32, local: SocketAddr, remote: SocketAddr) -> Flow {
        Flow {
            netns,
            local,
            remote,
            tunnel: Tunnel::default(),
        }
    }

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
            tunnel: Tunnel::from_key(k),
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
        self.tunnel.to_key(&mut k);
        k
    }

    /// The same connection seen from the other end (when both ends are in view).
    pub fn reversed(&self, peer_netns: u32) -> Flow {
        Flow {
            netns: peer_netns,
            local: self.remote,
            remote: self.local,
            tunnel: self.tunnel,
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
            let mut f = Flow::new(4026531840, l.parse().unwrap(), r.parse().unwrap());
            let k = f.to_key();
            assert_eq!(Flow::from_key(&k), Some(f));
            for t in [
                Tunnel {
                    vlan: Some(4095),
                    vni: Some(0),
                    encap: Some(Encap::Vxlan),
                },
                Tunnel {
                    vlan: None,
                    vni: Some(0xff_ffff),
                    encap: Some(Encap::Geneve),
                },
                Tunnel {
                    vlan: Some(7),
                    vni: None,
                    encap: Some(Encap::Ipip),
                },
            ] {
                f.tunnel = t;
                let k = f.to_key();
                assert_eq!(Flow::from_key(&k), Some(f), "{t}");
            }
        }
    }

    #[test]
    fn tunnel_key_bits_and_json() {
        // bpf/rttscope.h: vlan's low 12 bits (the high 4 are the sampler's kind of flow),
        // tunnel = VNI | 1 << 24 (present) | encapsulation << 25
        let mut k = Flow::new(
            1,
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:2".parse().unwrap(),
        )
        .to_key();
        k.vlan = 0x1000 | 42;
        k.tunnel = 5 | (1 << 24) | (1 << 25);
        let f = Flow::from_key(&k).unwrap();
        assert_eq!(f.tunnel.vlan, Some(42));
        assert_eq!(f.tunnel.vni, Some(5));
        assert_eq!(f.tunnel.encap, Some(Encap::Vxlan));
        assert_eq!(f.tunnel.to_string(), "vlan 42 vxlan vni 5");
        let j = serde_json::to_value(f).unwrap();
        assert_eq!(
            j["tunnel"],
            serde_json::json!({"vlan": 42, "vni": 5, "encap": "vxlan"})
        );
        // a plain flow's JSON is what it was
        let plain = serde_json::to_value(Flow {
            tunnel: Tunnel::default(),
            ..f
        })
        .unwrap();
        assert!(plain.get("tunnel").is_none(), "{plain}");
    }

    #[test]
    fn decodes_key_bytes_fixture() {
        // netns=0x11223344, AF_INET, lport 80, rport 5555, 10.0.0.1 -> 10.0.0.2
        let mut b = vec![0x44, 0x33, 0x22, 0x11, 2, 0, 80, 0, 0xb3, 0x15, 0, 0];
        b.extend([10, 0, 0, 1]);
        b.extend([0u8; 12]);
        b.extend([10, 0, 0, 2]);
        b.extend([0u8; 12]);
        b.extend([0u8; 4]); // tunnel: none
        let k: FlowKey = crate::bpf::decode(&b).unwrap();
        let f = Flow::from_key(&k).unwrap();
        assert_eq!(f.netns, 0x11223344);
        assert_eq!(f.local, "10.0.0.1:80".parse().unwrap());
        assert_eq!(f.remote, "10.0.0.2:5555".parse().unwrap());
        assert!(f.tunnel.is_none());
        // VNI 7 in VXLAN: 7 | present (1 << 24) | VXLAN (1 << 25), little-endian
        let mut vx = b.clone();
        vx[44..48].copy_from_slice(&[7, 0, 0, 3]);
        let t = Flow::from_key(&crate::bpf::decode(&vx).unwrap())
            .unwrap()
            .tunnel;
        assert_eq!((t.vni, t.encap), (Some(7), Some(Encap::Vxlan)));
        assert!(crate::bpf::decode::<FlowKey>(&b[..10]).is_err());
        let mut bad = b.clone();
        bad[4] = 99;
        assert_eq!(Flow::from_key(&crate::bpf::decode(&bad).unwrap()), None);
    }
}
