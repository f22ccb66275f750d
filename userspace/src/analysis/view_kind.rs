//! The kinds of passive view: the registry's list of names, in the order
//! the session reads the views and every record lists their columns
//! ([`crate::analysis::columns::Columns`]). It lives with the records' vocabulary,
//! below the views, so records and sinks can key by a view without using
//! the views' code (scripts/check-modules.py checks the layers); each
//! view's code is registered in `crate::views` (`ViewConfig`).
use serde::Serialize;

/// The passive views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ViewKind {
    /// RTT as TCP computes it (sock_ops RTT callback).
    Tcp,
    /// The cloud-style packet sampler at interface ingress/egress (tc).
    Sampler,
    /// The example view: packets and bytes in and out of a cgroup (cgroup_skb).
    #[cfg(feature = "example-view")]
    Count,
}

impl ViewKind {
    /// Every view, in registry order (the order the session reads them and
    /// records list their columns).
    pub const ALL: &'static [ViewKind] = &[
        ViewKind::Tcp,
        ViewKind::Sampler,
        #[cfg(feature = "example-view")]
        ViewKind::Count,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            ViewKind::Tcp => "tcp",
            ViewKind::Sampler => "sampler",
            #[cfg(feature = "example-view")]
            ViewKind::Count => "count",
        }
    }

    /// The view of a name as records and labels write it (None: not a view
    /// this build knows).
    pub fn from_name(name: &str) -> Option<ViewKind> {
        Self::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    /// The view's short column label (the lab's table: `TCP_CLI`, `SMP_SRV`).
    pub fn short_name(self) -> &'static str {
        match self {
            ViewKind::Tcp => "TCP",
            ViewKind::Sampler => "SMP",
            #[cfg(feature = "example-view")]
            ViewKind::Count => "CNT",
        }
    }

    /// Whether the view's samples are RTTs of flows, each taken on one side of its connection
    /// (the lab runs these views and gives each side a column; a counters-only view has none).
    pub fn flow_rtts(self) -> bool {
        match self {
            ViewKind::Tcp | ViewKind::Sampler => true,
            #[cfg(feature = "example-view")]
            ViewKind::Count => false,
        }
    }

    /// Whether the view samples packets as a cloud provider's flow metric does (vm_flow/rtt):
    /// its samples are also read through that metric's bucket layout (compare's `<view> cloud`
    /// row, the lab's `cloud_p50_us` and `*_CLOUD_P50` columns).
    pub fn cloud_metric(self) -> bool {
        self == ViewKind::Sampler
    }

    /// Whether the view's rows carry the socket's own smoothed RTT and retransmissions
    /// (`ViewStats::srtt_us`, `retrans`: the table's `SRTT ms` and `RETR` columns).
    pub fn socket_columns(self) -> bool {
        self == ViewKind::Tcp
    }

    /// What kind of measurement the view is, as a chart's legend says it after its name.
    pub fn legend(self) -> &'static str {
        match self {
            ViewKind::Tcp => "TCP view, the kernel's RTT samples",
            ViewKind::Sampler => "packet sampler at the interface",
            #[cfg(feature = "example-view")]
            ViewKind::Count => "packets and bytes of a cgroup",
        }
    }

    /// What the view's RTT samples are, in a few words (the exporter's HELP text of
    /// `rttscope_rtt`); None: the view takes no RTT samples.
    pub fn rtt_samples_are(self) -> Option<&'static str> {
        match self {
            ViewKind::Tcp => Some("TCP's own RTT samples"),
            ViewKind::Sampler => Some("packet-sampler RTT"),
            #[cfg(feature = "example-view")]
            ViewKind::Count => None,
        }
    }

    /// What the view's level of tracked flows counts (the HELP text of
    /// `rttscope_flows_tracked`); None when it has no such level ([`Self::flows_level`]).
    pub fn flows_tracked_are(self) -> Option<&'static str> {
        match self {
            ViewKind::Tcp => Some("flows in its table"),
            ViewKind::Sampler => Some("flow-table entries in use"),
            #[cfg(feature = "example-view")]
            ViewKind::Count => None,
        }
    }

    /// "name: what; name: what" over the views `what` describes, in registry order (the
    /// exporter's HELP texts).
    pub fn each_says(what: impl Fn(ViewKind) -> Option<&'static str>) -> String {
        Self::ALL
            .iter()
            .filter_map(|&k| what(k).map(|w| format!("{}: {w}", k.as_str())))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The counter that is the view's level of tracked flows
    /// (`rttscope_flows_tracked`), if it has one.
    pub fn flows_level(self) -> Option<&'static str> {
        match self {
            ViewKind::Tcp => Some("flows_tracked"),
            ViewKind::Sampler => Some("flows_live"),
            #[cfg(feature = "example-view")]
            ViewKind::Count => None,
        }
    }
}
