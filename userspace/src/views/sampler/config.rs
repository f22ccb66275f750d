//! The sampler view's configuration: what it times (`--proto`), how it matches (`--match`),
//! how it attaches (`--attach`), its sampling and table size ([`SamplerConfig`]), and the
//! interfaces it is given ([`IfaceSpec`]). The options that fill it are in `options.rs`.
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::{MAX_TABLE, MIN_TABLE, WAYS};
use crate::analysis::flow::Side;
use crate::bpf::{sampler::types as t, FlowKey};

/// A protocol the sampler times (`--proto`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP data segments and the ACKs (or TSecr) answering them.
    Tcp,
    /// ICMP and ICMPv6 echo: request and reply matched by addresses, identifier and sequence.
    Icmp,
}

/// What kind of flow a sampler flow is (from its key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowKind {
    Tcp,
    Icmp,
    Icmpv6,
}

impl FlowKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            FlowKind::Tcp => "tcp",
            FlowKind::Icmp => "icmp",
            FlowKind::Icmpv6 => "icmpv6",
        }
    }

    /// The kind and, for ICMP, the side, from bits 12-15 of the key's `vlan`
    /// field (bpf/rttscope.h, sampler section): 0 for TCP, else `enum
    /// rttscope_sampler_icmp_side`; ICMP or ICMPv6 by the key's family.
    pub fn from_key(key: &FlowKey) -> (FlowKind, Side) {
        let shift = t::rttscope_tunnel::RTTSCOPE_KEY_KIND_SHIFT.0;
        let side = match (key.vlan >> shift) as u32 {
            x if x == t::rttscope_sampler_icmp_side::RTTSCOPE_ICMP_PINGER.0 => Side::Pinger,
            x if x == t::rttscope_sampler_icmp_side::RTTSCOPE_ICMP_PINGED.0 => Side::Pinged,
            _ => return (FlowKind::Tcp, Side::Unknown),
        };
        match key.family {
            crate::analysis::flow::AF_INET6 => (FlowKind::Icmpv6, side),
            _ => (FlowKind::Icmp, side),
        }
    }
}

fn default_protos() -> Vec<Proto> {
    vec![Proto::Tcp, Proto::Icmp]
}

/// How an outgoing segment and an incoming packet are paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Matching {
    /// End sequence of a data segment out, a cumulative ACK covering it in (the cloud sampler).
    Seq,
    /// TCP timestamps: TSval out, the TSecr echoing it in (pping/ePPing); works on forwarded traffic.
    Tsval,
}

impl Matching {
    pub fn as_str(&self) -> &'static str {
        match self {
            Matching::Seq => "seq",
            Matching::Tsval => "tsval",
        }
    }
    pub(crate) fn raw(&self) -> u32 {
        match self {
            Matching::Seq => t::rttscope_sampler_match::RTTSCOPE_MATCH_SEQ.0,
            Matching::Tsval => t::rttscope_sampler_match::RTTSCOPE_MATCH_TSVAL.0,
        }
    }
}

/// How the programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// tcx links when the kernel has them (>= 6.6), else clsact filters.
    Auto,
    /// tcx links only.
    Tcx,
    /// clsact filters only (legacy tc; cleaned up at start and on exit).
    Clsact,
}

/// Settings of the sampler view (all recorded with every report).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SamplerConfig {
    /// Each packet in each direction is sampled with probability 1/sample_every.
    pub sample_every: u32,
    pub matching: Matching,
    /// Stream every sample through the ring buffer too.
    pub raw: bool,
    /// Flows the kernel keeps (histogram and pending segments in one table
    /// entry): the table holds `max_flows` rounded up to a power of two
    /// ([`SamplerConfig::table_entries`]), LRU within each set of 4.
    pub max_flows: u32,
    /// A pending segment older than this is dropped (counted as expired).
    #[serde(with = "duration_ms")]
    pub pending_timeout: Duration,
    pub attach: AttachMode,
    /// Protocols timed (`--proto`; default both): TCP, ICMP/ICMPv6 echo.
    #[serde(default = "default_protos")]
    pub protos: Vec<Proto>,
    /// At most this many interfaces attached at once (`--max-ifaces`): those an `--iface`
    /// pattern matches beyond it are refused and counted (`ifaces_refused`).
    #[serde(default = "default_max_ifaces")]
    pub max_ifaces: u32,
    /// UDP destination ports whose packets are parsed as VXLAN (`--vxlan-port`), at most
    /// [`MAX_TUNNEL_PORTS`].
    #[serde(default = "default_vxlan_ports")]
    pub vxlan_ports: Vec<u16>,
    /// UDP destination ports whose packets are parsed as Geneve (`--geneve-port`).
    #[serde(default = "default_geneve_ports")]
    pub geneve_ports: Vec<u16>,
}

/// Ports of each tunnel kind the programs take (`RTTSCOPE_MAX_TUNNEL_PORTS`: 16 bits each in
/// one `u64` of `.rodata`).
pub const MAX_TUNNEL_PORTS: usize = 4;
/// VXLAN's ports by default: IANA's 4789 (Calico) and Linux's default 8472 (Flannel, Cilium).
pub const DEFAULT_VXLAN_PORTS: [u16; 2] = [4789, 8472];
/// Geneve's port by default (IANA's; Cilium's tunnel mode).
pub const DEFAULT_GENEVE_PORTS: [u16; 1] = [6081];

fn default_vxlan_ports() -> Vec<u16> {
    DEFAULT_VXLAN_PORTS.to_vec()
}

fn default_geneve_ports() -> Vec<u16> {
    DEFAULT_GENEVE_PORTS.to_vec()
}

/// A kind's ports as the programs' `cfg_*_ports`: 16 bits each, from the lowest (0: unused).
pub(crate) fn pack_ports(ports: &[u16]) -> u64 {
    ports
        .iter()
        .take(MAX_TUNNEL_PORTS)
        .enumerate()
        .fold(0, |a, (i, &p)| a | (p as u64) << (16 * i))
}

/// `--max-ifaces` by default: interfaces one observer attaches at once.
pub const DEFAULT_MAX_IFACES: u32 = 256;
/// The largest `--max-ifaces`: 3 file descriptors per interface (2 tcx links, the blind
/// check's netlink socket) stay under a limit of 65,536.
pub const MAX_IFACES: u32 = 16384;

fn default_max_ifaces() -> u32 {
    DEFAULT_MAX_IFACES
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            sample_every: 1,
            matching: Matching::Seq,
            raw: false,
            max_flows: 16384,
            pending_timeout: Duration::from_secs(10),
            attach: AttachMode::Auto,
            protos: default_protos(),
            max_ifaces: DEFAULT_MAX_IFACES,
            vxlan_ports: default_vxlan_ports(),
            geneve_ports: default_geneve_ports(),
        }
    }
}

/// The tunnel ports: at most [`MAX_TUNNEL_PORTS`] of each kind, none 0, none taken by both;
/// `names`: how the user gave them (the flags, or the config file's keys).
pub fn check_tunnel_ports(vxlan: &[u16], geneve: &[u16], names: [&str; 2]) -> Result<()> {
    for (flag, ports) in [(names[0], vxlan), (names[1], geneve)] {
        if ports.len() > MAX_TUNNEL_PORTS {
            bail!(
                "{flag} takes at most {MAX_TUNNEL_PORTS} ports, not {} ({ports:?})",
                ports.len()
            );
        }
        if ports.contains(&0) {
            bail!("{flag}: 0 is not a port");
        }
    }
    if let Some(p) = vxlan.iter().find(|p| geneve.contains(p)) {
        bail!(
            "UDP port {p} is given as both a VXLAN ({}) and a Geneve port ({})",
            names[0],
            names[1]
        );
    }
    Ok(())
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1000.0)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs_f64(f64::deserialize(d)? / 1000.0))
    }
}

impl SamplerConfig {
    pub fn validate(&self) -> Result<()> {
        if self.sample_every == 0 {
            bail!("--sample-every must be at least 1");
        }
        crate::views::scope::check_max_flows(self.max_flows)?;
        if self.pending_timeout.is_zero() || self.pending_timeout > Duration::from_secs(3600) {
            bail!("the pending timeout must be between 1 ns and 1 h (a pending slot keeps 32 bits of microseconds)");
        }
        if self.protos.is_empty() {
            bail!("--proto needs at least one of tcp, icmp");
        }
        if self.max_ifaces == 0 || self.max_ifaces > MAX_IFACES {
            bail!(
                "--max-ifaces must be between 1 and {MAX_IFACES}, not {}",
                self.max_ifaces
            );
        }
        check_tunnel_ports(
            &self.vxlan_ports,
            &self.geneve_ports,
            ["--vxlan-port", "--geneve-port"],
        )
    }

    /// `cfg_protos` of the programs: a bit per protocol timed.
    pub(crate) fn proto_mask(&self) -> u32 {
        self.protos
            .iter()
            .map(|p| match p {
                Proto::Tcp => t::rttscope_sampler_proto::RTTSCOPE_PROTO_TCP.0,
                Proto::Icmp => t::rttscope_sampler_proto::RTTSCOPE_PROTO_ICMP.0,
            })
            .fold(0, |a, b| a | b)
    }

    /// Entries of the kernel's flow table: `max_flows` rounded up to a
    /// power of two, at least `RTTSCOPE_SAMPLER_MIN_TABLE`.
    pub fn table_entries(&self) -> u32 {
        self.max_flows
            .clamp(MIN_TABLE, MAX_TABLE)
            .next_power_of_two()
    }

    /// `cfg_set_mask` of the programs: sets - 1 (sets: a power of two).
    pub(crate) fn set_mask(&self) -> u32 {
        self.table_entries() / WAYS - 1
    }

    /// `bpf_get_prandom_u32() < threshold` samples with probability 1/N; 0 = every packet.
    pub fn threshold(&self) -> u32 {
        if self.sample_every <= 1 {
            0
        } else {
            ((1u64 << 32) / self.sample_every as u64) as u32
        }
    }
}

/// `--iface NAME` (current namespace) or `--iface NETNS:NAME`; NAME may be a glob pattern
/// (`*`, `?`, `[...]`: `veth*`, `lxc*`), which attaches every matching interface of the
/// namespace, those there at start and those created later ([`IfaceSpec::is_pattern`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfaceSpec {
    pub netns: Option<String>,
    pub name: String,
}

impl FromStr for IfaceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (ns, name) = match s.split_once(':') {
            Some((ns, name)) => (Some(ns.to_string()), name),
            None => (None, s),
        };
        if name.is_empty() || name.len() > 15 || name.contains('/') || name.contains(' ') {
            return Err(format!(
                "'{s}' is not an interface (NAME or NETNS:NAME, NAME at most 15 characters)"
            ));
        }
        if ns.as_deref() == Some("") {
            return Err(format!("'{s}': empty namespace before ':'"));
        }
        if let Some(e) = glob_error(name) {
            return Err(format!("'{s}': {e}"));
        }
        if ns.as_deref().is_some_and(|n| n.contains(['*', '?', '['])) {
            return Err(format!(
                "'{s}': a pattern of namespaces is not supported: name the namespace (NETNS:PATTERN), or give a pattern of the observer's own namespace's interfaces"
            ));
        }
        Ok(IfaceSpec {
            netns: ns,
            name: name.to_string(),
        })
    }
}

impl IfaceSpec {
    /// Whether the name is a pattern (`*`, `?` or `[`), followed as interfaces come and go.
    pub fn is_pattern(&self) -> bool {
        self.name.contains(['*', '?', '['])
    }

    /// Whether interface `name` is this one, or matches its pattern.
    pub fn matches(&self, name: &str) -> bool {
        glob(self.name.as_bytes(), name.as_bytes())
    }
}

/// Why a pattern is malformed (an unclosed `[`), if it is.
fn glob_error(p: &str) -> Option<&'static str> {
    let mut rest = p;
    while let Some(i) = rest.find('[') {
        // a class: `[` then at least one character, then `]`
        let after = &rest[i + 1..];
        let body = after.strip_prefix('!').unwrap_or(after);
        match body.get(1..).and_then(|b| b.find(']')) {
            Some(j) => rest = &body[j + 2..],
            None => return Some("an unclosed '[' in the interface pattern"),
        }
    }
    None
}

/// Shell-style matching (fnmatch without flags, as `ip link show` users write them): `*` any
/// run, `?` one character, `[abc]`/`[a-z]`/`[!a]` one of a class.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    star = Some((pi, si));
                    pi += 1;
                    continue;
                }
                b'?' => {
                    (pi, si) = (pi + 1, si + 1);
                    continue;
                }
                b'[' => {
                    if let Some((hit, len)) = class(&p[pi..], s[si]) {
                        if hit {
                            (pi, si) = (pi + len, si + 1);
                            continue;
                        }
                    }
                }
                c if c == s[si] => {
                    (pi, si) = (pi + 1, si + 1);
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, ss)) => {
                star = Some((sp, ss + 1));
                (pi, si) = (sp + 1, ss + 1);
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at the start of `p` against `c`: (matches, the class's length).
fn class(p: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = p.get(1) == Some(&b'!');
    if negate {
        i += 1;
    }
    let start = i;
    let mut hit = false;
    while i < p.len() && (p[i] != b']' || i == start) {
        if p.get(i + 1) == Some(&b'-') && p.get(i + 2).is_some_and(|&e| e != b']') {
            hit |= (p[i]..=p[i + 2]).contains(&c);
            i += 3;
        } else {
            hit |= p[i] == c;
            i += 1;
        }
    }
    (i < p.len()).then_some((hit != negate, i + 1))
}

impl fmt::Display for IfaceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.netns {
            Some(ns) => write!(f, "{ns}:{}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

#[cfg(test)]
mod glob_tests {
    use super::*;

    #[test]
    fn patterns_match_as_the_shell_does() {
        let m = |p: &str, n: &str| p.parse::<IfaceSpec>().unwrap().matches(n);
        assert!(m("veth*", "veth0") && m("veth*", "veth") && !m("veth*", "xveth0"));
        assert!(m("lxc*", "lxc12ab") && !m("lxc*", "cali1"));
        assert!(m("*", "eth0") && m("e?h0", "eth0") && !m("e?h0", "eh0"));
        assert!(m("rq[0-9]a*", "rq7a12") && !m("rq[0-9]a*", "rqxa1"));
        assert!(m("rq[!0-9]*", "rqx") && !m("rq[!0-9]*", "rq1"));
        assert!(m("a*b*c", "axxbyyc") && !m("a*b*c", "axxbyy"));
        assert!(m("eth0", "eth0") && !m("eth0", "eth01"));
        assert!("ns1:veth*".parse::<IfaceSpec>().unwrap().is_pattern());
        assert!(!"ns1:veth0".parse::<IfaceSpec>().unwrap().is_pattern());
        let e = "veth[0".parse::<IfaceSpec>().unwrap_err();
        assert!(e.contains("unclosed"), "{e}");
        assert!("n*:eth0".parse::<IfaceSpec>().is_err());
    }

    #[test]
    fn tunnel_ports_pack_as_the_programs_read_them() {
        assert_eq!(pack_ports(&DEFAULT_VXLAN_PORTS), 4789 | (8472 << 16));
        assert_eq!(pack_ports(&DEFAULT_GENEVE_PORTS), 6081);
        assert_eq!(
            pack_ports(&[1, 2, 3, 65535]),
            1 | 2 << 16 | 3 << 32 | 65535 << 48
        );
        let flags = ["--vxlan-port", "--geneve-port"];
        let c = |v: &[u16], g: &[u16]| check_tunnel_ports(v, g, flags).map_err(|e| e.to_string());
        assert!(c(&DEFAULT_VXLAN_PORTS, &DEFAULT_GENEVE_PORTS).is_ok());
        assert!(c(&[], &[]).is_ok(), "no ports: that kind is not parsed");
        assert_eq!(
            c(&[1, 2, 3, 4, 5], &[]).unwrap_err(),
            "--vxlan-port takes at most 4 ports, not 5 ([1, 2, 3, 4, 5])"
        );
        assert_eq!(c(&[], &[0]).unwrap_err(), "--geneve-port: 0 is not a port");
        assert!(c(&[4789], &[4789]).unwrap_err().contains("both a VXLAN"));
        let cfg = SamplerConfig {
            vxlan_ports: vec![4790],
            ..Default::default()
        };
        assert!(cfg.validate().is_ok());
    }
}
