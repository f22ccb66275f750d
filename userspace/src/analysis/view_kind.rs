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
    /// its samples are also read through that metric's bucket layout (the lab's `cloud_p50_us`
    /// and `*_CLOUD_P50` columns).
    pub fn cloud_metric(self) -> bool {
        self == ViewKind::Sampler
    }

    /// Whether the view's rows carry the socket's own smoothed RTT and retransmissions
    /// (`ViewStats::srtt_us`, `retrans`: the table's `SRTT ms` and `RETR` columns).
    pub fn socket_columns(self) -> bool {
        self == ViewKind::Tcp
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
