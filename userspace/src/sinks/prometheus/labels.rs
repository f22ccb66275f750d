//! The exporter's label sets, bounded ([`LabelPolicy`]): the remote address
//! cut to a prefix, the local port kept only for listed ports, the workload
//! labels a cgroup path tells; and the small label sets of the counters.
use std::net::IpAddr;
use std::time::Duration;

use anyhow::Result;
use prometheus_client::encoding::EncodeLabelSet;

use crate::analysis::flow::{Flow, Side};
use crate::analysis::view_kind::ViewKind;
use crate::analysis::workload::Workload;

use super::proto;

/// How flows are turned into bounded label sets.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelPolicy {
    /// Remote IPv4 addresses are cut to this prefix length (0..=32).
    pub v4_prefix: u8,
    /// Remote IPv6 addresses are cut to this prefix length (0..=128).
    pub v6_prefix: u8,
    /// Local ports kept as label values; every other port becomes "other".
    pub ports: Vec<u16>,
    /// Workload labels (unit, container, pod_namespace, pod, qos) from the
    /// socket's cgroup: off by default (a label set per workload).
    pub workload: bool,
    /// `backend_prefix`: the address a NATed connection was translated to, cut as the
    /// remote's (`--label-backend`): off by default (a label set per backend).
    pub backend: bool,
    /// `remote_name`: the remote address's name (`--names`).
    pub names: bool,
    /// At most this many RTT label sets; more go to the overflow series.
    pub max_series: usize,
    /// A label set without samples for this long is removed.
    pub series_idle: Duration,
}

impl Default for LabelPolicy {
    fn default() -> Self {
        LabelPolicy {
            v4_prefix: 24,
            v6_prefix: 48,
            ports: Vec::new(),
            workload: false,
            backend: false,
            names: false,
            max_series: 1000,
            series_idle: Duration::from_secs(600),
        }
    }
}

impl LabelPolicy {
    /// One clear sentence for an impossible policy.
    pub fn validate(&self) -> Result<()> {
        if self.v4_prefix > 32 {
            anyhow::bail!(
                "the IPv4 label prefix must be 0..32 bits, not {}",
                self.v4_prefix
            );
        }
        if self.v6_prefix > 128 {
            anyhow::bail!(
                "the IPv6 label prefix must be 0..128 bits, not {}",
                self.v6_prefix
            );
        }
        if self.max_series == 0 {
            anyhow::bail!("the series cap (max_series) must be at least 1");
        }
        if self.max_series > 1_000_000 {
            anyhow::bail!(
                "the series cap (max_series) must be at most 1000000, not {}",
                self.max_series
            );
        }
        if self.ports.len() > 1024 {
            anyhow::bail!(
                "at most 1024 label ports may be listed, not {}",
                self.ports.len()
            );
        }
        Ok(())
    }

    /// The remote address cut to the policy's prefix, as CIDR text.
    pub fn remote_prefix(&self, ip: IpAddr) -> String {
        let net: ipnet::IpNet = match ip {
            IpAddr::V4(a) => ipnet::Ipv4Net::new(a, self.v4_prefix.min(32))
                .map(|n| n.trunc().into())
                .unwrap_or_else(|_| ipnet::Ipv4Net::from(a).into()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => return self.remote_prefix(IpAddr::V4(v4)),
                None => ipnet::Ipv6Net::new(a, self.v6_prefix.min(128))
                    .map(|n| n.trunc().into())
                    .unwrap_or_else(|_| ipnet::Ipv6Net::from(a).into()),
            },
        };
        net.to_string()
    }

    /// The local port label: the port when listed, else "other".
    pub fn local_port(&self, port: u16) -> String {
        if self.ports.contains(&port) {
            port.to_string()
        } else {
            "other".to_string()
        }
    }

    /// The label set of a flow's samples.
    pub fn labels(&self, view: ViewKind, flow: &Flow, side: Side, netns: &str) -> RttLabels {
        RttLabels {
            view: view.as_str().to_string(),
            side: side_label(side).to_string(),
            netns: netns.to_string(),
            remote_prefix: self.remote_prefix(flow.remote.ip()),
            local_port: self.local_port(flow.local.port()),
            proto: proto_label(flow, side).to_string(),
            remote_name: None,
            backend_prefix: None,
            workload: None,
        }
    }
}

/// The workload labels of a flow (`--label-workload`): only those the
/// cgroup path tells are exported (an empty value is no label in Prometheus).
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkloadLabels {
    pub unit: String,
    pub container: String,
    pub pod_namespace: String,
    pub pod: String,
    pub qos: String,
}

impl WorkloadLabels {
    pub fn of(w: &Workload) -> WorkloadLabels {
        WorkloadLabels {
            unit: w.unit.clone().unwrap_or_default(),
            container: w.container_short().unwrap_or_default().to_string(),
            pod_namespace: w.pod_namespace.clone().unwrap_or_default(),
            pod: match (&w.pod_name, &w.pod_uid) {
                (Some(n), _) => n.clone(),
                (None, Some(uid)) => format!("pod-{uid}"),
                _ => String::new(),
            },
            qos: w.qos.map(|q| q.as_str().to_string()).unwrap_or_default(),
        }
    }
    fn pairs(&self) -> [(&'static str, &str); 5] {
        [
            ("unit", &self.unit),
            ("container", &self.container),
            ("pod_namespace", &self.pod_namespace),
            ("pod", &self.pod),
            ("qos", &self.qos),
        ]
    }
}

/// The flow's protocol: ICMP echo flows (the sampler's, side pinger or
/// pinged) are `icmp` or `icmpv6`, every other flow `tcp`.
pub(super) fn proto_label(flow: &Flow, side: Side) -> &'static str {
    match (side, flow.remote.ip()) {
        (Side::Pinger | Side::Pinged, IpAddr::V6(_)) => "icmpv6",
        (Side::Pinger | Side::Pinged, IpAddr::V4(_)) => "icmp",
        _ => "tcp",
    }
}

pub(super) fn side_label(s: Side) -> &'static str {
    match s {
        Side::Client => "client",
        Side::Server => "server",
        Side::Unknown => "unknown",
        Side::Pinger => "pinger",
        Side::Pinged => "pinged",
    }
}

/// Labels of an RTT histogram series. A label added here is exported by
/// every format: the text formats through `EncodeLabelSet`, the protobuf
/// native buckets and OTLP through [`RttLabels::pairs`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct RttLabels {
    pub view: String,
    pub side: String,
    pub netns: String,
    pub remote_prefix: String,
    pub local_port: String,
    /// `tcp`, or `icmp`/`icmpv6` for the sampler's ICMP echo flows.
    pub proto: String,
    /// `--names`: the remote address's name (empty: none, no label).
    pub remote_name: Option<String>,
    /// `--label-backend`: where NAT sent the connection, as a prefix (empty: no NAT, no label).
    pub backend_prefix: Option<String>,
    /// `--label-workload`: who owns the socket (None: the option is off).
    pub workload: Option<WorkloadLabels>,
}

impl EncodeLabelSet for RttLabels {
    fn encode(
        &self,
        mut enc: prometheus_client::encoding::LabelSetEncoder,
    ) -> std::result::Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeLabel;
        for (k, v) in self.in_order() {
            (k, v).encode(enc.encode_label())?;
        }
        Ok(())
    }
}

impl RttLabels {
    /// (name, value) of every label, sorted by name.
    pub fn pairs(&self) -> proto::LabelKey {
        let pairs = self.in_order().map(|(k, v)| (k.to_string(), v.to_string()));
        proto::label_key(pairs.collect())
    }

    /// Every label in the text format's order; the workload's only where known.
    fn in_order(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let fixed = [
            ("view", self.view.as_str()),
            ("side", self.side.as_str()),
            ("netns", self.netns.as_str()),
            ("remote_prefix", self.remote_prefix.as_str()),
            ("local_port", self.local_port.as_str()),
            ("proto", self.proto.as_str()),
        ];
        let workload = self.workload.iter().flat_map(|w| w.pairs());
        let name = self.remote_name.iter().map(|n| ("remote_name", n.as_str()));
        let backend = self
            .backend_prefix
            .iter()
            .map(|n| ("backend_prefix", n.as_str()));
        fixed
            .into_iter()
            .chain(name.chain(backend).filter(|(_, v)| !v.is_empty()))
            .chain(workload.filter(|(_, v)| !v.is_empty()))
    }

    /// The one overflow series of a view.
    pub fn overflow(view: ViewKind) -> RttLabels {
        let o = "overflow".to_string();
        RttLabels {
            view: view.as_str().to_string(),
            side: o.clone(),
            netns: o.clone(),
            remote_prefix: o.clone(),
            local_port: o.clone(),
            proto: o,
            remote_name: None,
            backend_prefix: None,
            workload: None,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ViewLabel {
    pub(super) view: String,
}

/// One hook of a view on one interface (`rttscope_hook_*`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HookLabels {
    pub(super) view: String,
    pub(super) netns: String,
    pub(super) interface: String,
    pub(super) direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DropLabels {
    pub(super) view: String,
    pub(super) reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EventLabels {
    pub(super) view: String,
    pub(super) event: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ProgLabels {
    /// The program's name: stable across restarts (its id is not).
    pub(super) prog: String,
}
