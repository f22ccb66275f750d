//! The kinds of passive view: the registry's list of names, in the order
//! the session reads the views and every record lists their columns
//! ([`crate::analysis::columns::Columns`]), and one [`ViewInfo`] per view (its
//! name and how records, tables, charts and the exporter show it). It lives with the records' vocabulary,
//! below the views, so records and sinks can key by a view without using
//! the views' code (scripts/check-modules.py checks the layers); each
//! view's code is registered in `crate::views` (`ViewConfig`).
use serde::Serialize;

use super::flow::Side;

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

/// What the layers above the views know of a view without using its code: one entry per view
/// ([`ViewKind::info`]), its name and how records, tables, charts and the exporter show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewInfo {
    /// The name records, labels and `--view` write.
    pub name: &'static str,
    /// The short column label (the lab's table: `TCP_CLI`, `SMP_SRV`).
    pub short_name: &'static str,
    /// Whether its samples are RTTs of flows, each taken on one side of its connection (the lab
    /// runs these views and gives each side a column; a counters-only view has none).
    pub flow_rtts: bool,
    /// Whether it samples packets as a cloud provider's flow metric does (vm_flow/rtt): its
    /// samples are also read through that metric's bucket layout (compare's `<view> cloud` row,
    /// the lab's `cloud_p50_us` and `*_CLOUD_P50` columns).
    pub cloud_metric: bool,
    /// Whether its rows carry the socket's own smoothed RTT and retransmissions
    /// (`ViewStats::srtt_us`, `retrans`: the table's `SRTT ms` and `RETR` columns).
    pub socket_columns: bool,
    /// What kind of measurement it is, as a chart's legend says it after its name.
    pub legend: &'static str,
    /// What its RTT samples are, in a few words (the exporter's HELP text of `rttscope_rtt`);
    /// None: it takes no RTT samples.
    pub rtt_samples_are: Option<&'static str>,
    /// The counter that is its level of tracked flows (`rttscope_flows_tracked`), if it has one,
    /// and what that level counts (the metric's HELP text).
    pub flows_level: Option<(&'static str, &'static str)>,
    /// Whether each raw sample carries the side of its connection it was taken on (TCP's
    /// sock_ops program runs in the socket, which knows its side); otherwise a raw sample takes
    /// the side its flow's row resolved by the end of the run (observe's `--json` series).
    pub sample_side: bool,
    /// The keys of its settings and its counters in `compare`'s result (`settings.<key>`, null
    /// when the view was not attached); None: compare does not attach it.
    pub compare_keys: Option<(&'static str, &'static str)>,
    /// What its series are, as the result schema's kind describes them (docs/result.schema.json).
    pub series_about: &'static str,
    /// What its key in observe's start record holds (the key is its name; absent when it is not
    /// attached; docs/observe-record.schema.json), the value its `start_record` gives; None: it
    /// has no key there.
    pub start_about: Option<&'static str>,
}

const TCP: ViewInfo = ViewInfo {
    name: "tcp",
    short_name: "TCP",
    flow_rtts: true,
    cloud_metric: false,
    socket_columns: true,
    legend: "TCP view, the kernel's RTT samples",
    rtt_samples_are: Some("TCP's own RTT samples"),
    flows_level: Some(("flows_tracked", "flows in its table")),
    sample_side: true,
    compare_keys: Some(("tcp_view", "tcp_counters")),
    series_about: "RTT as TCP computes it (sock_ops RTT callback, or `ss -ti`).",
    start_about: Some("The TCP view's hook (absent without it)."),
};

const SAMPLER: ViewInfo = ViewInfo {
    name: "sampler",
    short_name: "SMP",
    flow_rtts: true,
    cloud_metric: true,
    socket_columns: false,
    legend: "packet sampler at the interface",
    rtt_samples_are: Some("packet-sampler RTT"),
    flows_level: Some(("flows_live", "flow-table entries in use")),
    sample_side: false,
    compare_keys: Some(("sampler", "sampler_counters")),
    series_about: "The cloud-style packet sampler (tc programs).",
    start_about: Some("The sampler view's settings, interfaces and programs (absent without it)."),
};

#[cfg(feature = "example-view")]
const COUNT: ViewInfo = ViewInfo {
    name: "count",
    short_name: "CNT",
    flow_rtts: false,
    cloud_metric: false,
    socket_columns: false,
    legend: "packets and bytes of a cgroup",
    rtt_samples_are: None,
    flows_level: None,
    sample_side: false,
    compare_keys: None,
    series_about: "The example view: packets and bytes of a cgroup (cgroup_skb).",
    start_about: None,
};

impl ViewKind {
    /// Every view, in registry order (the order the session reads them and
    /// records list their columns).
    pub const ALL: &'static [ViewKind] = &[
        ViewKind::Tcp,
        ViewKind::Sampler,
        #[cfg(feature = "example-view")]
        ViewKind::Count,
    ];

    /// The view's entry: its name and how it is shown.
    pub const fn info(self) -> &'static ViewInfo {
        match self {
            ViewKind::Tcp => &TCP,
            ViewKind::Sampler => &SAMPLER,
            #[cfg(feature = "example-view")]
            ViewKind::Count => &COUNT,
        }
    }

    pub fn as_str(&self) -> &'static str {
        self.info().name
    }

    /// The view of a name as records and labels write it (None: not a view
    /// this build knows).
    pub fn from_name(name: &str) -> Option<ViewKind> {
        Self::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    /// The label of its rows and series on one side of a connection (`tcp client`, `sampler
    /// server`): compare's rows, the lab's views.
    pub fn label(self, side: Side) -> String {
        format!("{} {}", self.as_str(), side.as_str())
    }

    /// The view whose samples are the socket's own RTT (the one whose rows carry the socket's
    /// columns, [`ViewInfo::socket_columns`]: TCP's), the reference that compare's notes and the
    /// lab's observations explain the others against; None in a build without one.
    pub fn socket() -> Option<ViewKind> {
        Self::ALL.iter().copied().find(|k| k.socket_columns())
    }

    /// The views whose samples are read as the cloud's flow metric too
    /// ([`ViewInfo::cloud_metric`]: the packet sampler), in registry order.
    pub fn cloud_metric_views() -> impl Iterator<Item = ViewKind> {
        Self::ALL.iter().copied().filter(|k| k.cloud_metric())
    }

    /// [`ViewInfo::short_name`].
    pub fn short_name(self) -> &'static str {
        self.info().short_name
    }

    /// [`ViewInfo::flow_rtts`].
    pub fn flow_rtts(self) -> bool {
        self.info().flow_rtts
    }

    /// [`ViewInfo::cloud_metric`].
    pub fn cloud_metric(self) -> bool {
        self.info().cloud_metric
    }

    /// [`ViewInfo::socket_columns`].
    pub fn socket_columns(self) -> bool {
        self.info().socket_columns
    }

    /// [`ViewInfo::legend`].
    pub fn legend(self) -> &'static str {
        self.info().legend
    }

    /// [`ViewInfo::rtt_samples_are`].
    pub fn rtt_samples_are(self) -> Option<&'static str> {
        self.info().rtt_samples_are
    }

    /// What the view's level of tracked flows counts (the HELP text of
    /// `rttscope_flows_tracked`); None when it has no such level ([`ViewInfo::flows_level`]).
    pub fn flows_tracked_are(self) -> Option<&'static str> {
        self.info().flows_level.map(|(_, what)| what)
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
        self.info().flows_level.map(|(counter, _)| counter)
    }
}
