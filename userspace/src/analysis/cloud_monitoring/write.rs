//! Writing local views as Cloud Monitoring `TimeSeries` for `projects.timeSeries.create` (the
//! custom distribution metric [`METRIC_TYPE`]): a result's views, or observe's live export.
use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::time::{parse_rfc3339, rfc3339};
use crate::analysis::dist::{BucketOptions, Distribution, ValueUnit};
use crate::analysis::results::{RunResult, ViewSeries};

/// The custom metric rttscope writes.
pub const METRIC_TYPE: &str = "custom.googleapis.com/rttscope/rtt";
/// At most this many time series in one create request (the API's documented limit).
pub const MAX_SERIES_PER_REQUEST: usize = 200;
/// At most this many label sets rttscope writes (like the Prometheus exporter's default); more go
/// to one overflow series per view.
pub const MAX_SERIES: usize = 1000;

/// The metric kind written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MetricKind {
    /// A point-in-time distribution (start = end).
    Gauge,
    /// Counts accumulated from a fixed start time (observe: since it started; a result: the run).
    Cumulative,
}

impl MetricKind {
    pub fn as_api(self) -> &'static str {
        match self {
            MetricKind::Gauge => "GAUGE",
            MetricKind::Cumulative => "CUMULATIVE",
        }
    }
}

/// The metric labels rttscope writes, bounded like the Prometheus exporter's: the view, which
/// side measured, the network namespace's name, the remote address cut to a prefix.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct SeriesLabels {
    pub view: String,
    pub side: String,
    pub netns: String,
    pub remote_prefix: String,
}

impl SeriesLabels {
    /// The overflow series of a view (more than [`MAX_SERIES`] label sets).
    pub fn overflow(view: &str) -> SeriesLabels {
        SeriesLabels {
            view: view.to_string(),
            side: "overflow".into(),
            netns: "overflow".into(),
            remote_prefix: "overflow".into(),
        }
    }

    fn to_api(&self) -> Value {
        // Label values: at most 1024 characters (a Cloud Monitoring limit); ours are cut at 100.
        let cut = |s: &str| -> String {
            let s: String = s.chars().filter(|c| !c.is_control()).take(100).collect();
            if s.is_empty() {
                "unknown".into()
            } else {
                s
            }
        };
        json!({
            "view": cut(&self.view),
            "side": cut(&self.side),
            "netns": cut(&self.netns),
            "remote_prefix": cut(&self.remote_prefix),
        })
    }
}

/// A remote address cut to a prefix (/24 for IPv4, /48 for IPv6 by default, IPv4-mapped IPv6 as
/// IPv4), the Prometheus exporter's default aggregation.
pub fn remote_prefix(ip: IpAddr, v4_bits: u8, v6_bits: u8) -> String {
    let net: ipnet::IpNet = match ip {
        IpAddr::V4(a) => ipnet::Ipv4Net::new(a, v4_bits.min(32))
            .map(|n| n.trunc().into())
            .unwrap_or_else(|_| ipnet::Ipv4Net::from(a).into()),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => return remote_prefix(IpAddr::V4(v4), v4_bits, v6_bits),
            None => ipnet::Ipv6Net::new(a, v6_bits.min(128))
                .map(|n| n.trunc().into())
                .unwrap_or_else(|_| ipnet::Ipv6Net::from(a).into()),
        },
    };
    net.to_string()
}

/// The monitored resource rttscope writes: `generic_node` (one of the resource types that
/// custom metrics may use) with the host's name as `node_id`. `project_id` is not written.
pub fn resource(hostname: &str) -> Value {
    let node: String = hostname
        .chars()
        .filter(|c| !c.is_control())
        .take(100)
        .collect();
    json!({
        "type": "generic_node",
        "labels": {"location": "global", "namespace": "rttscope", "node_id": if node.is_empty() { "unknown".to_string() } else { node }},
    })
}

/// A distribution as the API's `distributionValue` JSON: int64s as strings, trailing empty
/// buckets left out (the API reads them as zero).
pub fn distribution_to_api(d: &Distribution) -> Value {
    let mut counts: &[u64] = &d.bucket_counts;
    while let [rest @ .., 0] = counts {
        counts = rest;
    }
    let mut m = Map::new();
    m.insert("count".into(), json!(d.count.to_string()));
    m.insert("mean".into(), json!(if d.count > 0 { d.mean } else { 0.0 }));
    m.insert(
        "sumOfSquaredDeviation".into(),
        json!(if d.count > 1 {
            d.sum_of_squared_deviation.max(0.0)
        } else {
            0.0
        }),
    );
    if let (Some(min), Some(max)) = (d.min, d.max) {
        m.insert("range".into(), json!({"min": min, "max": max}));
    }
    m.insert("bucketOptions".into(), d.bucket_options.to_api());
    m.insert(
        "bucketCounts".into(),
        Value::Array(counts.iter().map(|c| json!(c.to_string())).collect()),
    );
    Value::Object(m)
}

/// One `TimeSeries` for `projects.timeSeries.create`: exactly one point.
pub fn time_series(
    labels: &SeriesLabels,
    resource: &Value,
    kind: MetricKind,
    start_unix_s: f64,
    end_unix_s: f64,
    d: &Distribution,
) -> Value {
    let interval = match kind {
        MetricKind::Gauge => json!({"endTime": rfc3339(end_unix_s)}),
        MetricKind::Cumulative => {
            // A non-zero interval: at least a millisecond.
            let end = end_unix_s.max(start_unix_s + 0.001);
            json!({"startTime": rfc3339(start_unix_s), "endTime": rfc3339(end)})
        }
    };
    json!({
        "metric": {"type": METRIC_TYPE, "labels": labels.to_api()},
        "resource": resource,
        "metricKind": kind.as_api(),
        "valueType": "DISTRIBUTION",
        "unit": d.unit.as_str(),
        "points": [{"interval": interval, "value": {"distributionValue": distribution_to_api(d)}}],
    })
}

/// Create request bodies (`{"timeSeries": [...]}`), at most [`MAX_SERIES_PER_REQUEST`] each.
pub fn requests(series: Vec<Value>) -> Vec<Value> {
    series
        .chunks(MAX_SERIES_PER_REQUEST)
        .map(|c| json!({"timeSeries": c}))
        .collect()
}

/// The remote address of a result's flow text (`10.0.0.1:4000 -> 10.0.0.2:5001`).
fn flow_remote(flow: &str) -> Option<IpAddr> {
    let remote = flow.split("->").nth(1)?.trim();
    remote
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip())
        .ok()
        .or_else(|| remote.parse::<IpAddr>().ok())
}

/// A saved result as create requests: one CUMULATIVE series per view (and flow), its samples in
/// `layout` over the run (start: `start_unix_s`, else the file's `created` time minus the span of
/// the samples; end: start + the last sample's time). Views without samples are left out.
pub fn result_requests(
    r: &RunResult,
    layout: &BucketOptions,
    unit: ValueUnit,
) -> Result<Vec<Value>> {
    let start = result_start(r)?;
    let res = resource(&r.host.hostname);
    let mut series = Vec::new();
    for v in &r.views {
        if v.samples.is_empty() {
            continue;
        }
        let mut d = Distribution::new(layout.clone(), unit);
        let mut last = 0.0f64;
        for s in &v.samples {
            d.add_us(s.rtt_us);
            if s.t_s().is_finite() {
                last = last.max(s.t_s());
            }
        }
        series.push(time_series(
            &result_labels(r, v),
            &res,
            MetricKind::Cumulative,
            start,
            start + last,
            &d,
        ));
    }
    if series.is_empty() {
        bail!("the result has no samples to write");
    }
    Ok(requests(series))
}

/// A saved result's start: `start_unix_s`, else its `created` time minus the span of the samples.
fn result_start(r: &RunResult) -> Result<f64> {
    let span = r
        .views
        .iter()
        .flat_map(|v| v.samples.iter().map(|s| s.t_s()))
        .filter(|t| t.is_finite())
        .fold(0.0f64, f64::max);
    Ok(match r.start_unix_s {
        Some(s) => s,
        None => match parse_rfc3339(&r.created) {
            Some(c) => c - span,
            None => bail!(
                "the result has neither start_unix_s nor a readable created time ('{}')",
                r.created.chars().take(40).collect::<String>()
            ),
        },
    })
}

/// The labels of a saved result's view series (`unknown` where the result does not say).
fn result_labels(r: &RunResult, v: &ViewSeries) -> SeriesLabels {
    SeriesLabels {
        view: v.name.clone(),
        side: v.side.clone().unwrap_or_else(|| "unknown".into()),
        netns: r
            .settings
            .get("netns")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string(),
        remote_prefix: v
            .flow
            .as_deref()
            .and_then(flow_remote)
            .map_or("unknown".into(), |ip| remote_prefix(ip, 24, 48)),
    }
}

/// Live export for `observe --format cloud-monitoring`: every sample since the start in one
/// CUMULATIVE distribution per label set (at most [`MAX_SERIES`], more into one overflow series per
/// view). Each interval writes every series with the same start time and the interval's end.
#[derive(Debug, Clone)]
pub struct LiveExport {
    layout: BucketOptions,
    start_unix_s: f64,
    groups: BTreeMap<SeriesLabels, Distribution>,
    /// Samples that went to an overflow series.
    pub overflowed: u64,
}

impl LiveExport {
    pub fn new(layout: BucketOptions, start_unix_s: f64) -> LiveExport {
        LiveExport {
            layout,
            start_unix_s,
            groups: BTreeMap::new(),
            overflowed: 0,
        }
    }

    /// Add one sample (microseconds) to its label set.
    pub fn add(&mut self, labels: SeriesLabels, rtt_us: f64) {
        self.group(labels, 1).add_us(rtt_us);
    }

    /// Add a kernel histogram's samples (one flow's samples since the last read) to their label
    /// set, each kernel bucket spread over its values ([`Distribution::add_spread_us`]): every
    /// sample the kernel counted is in, a kernel bucket that straddles a bound of the layout is
    /// split in proportion.
    pub fn add_hist(&mut self, labels: SeriesLabels, h: &crate::analysis::hist::Hist) {
        let n = h.count();
        if n == 0 {
            return;
        }
        let d = self.group(labels, n);
        for (i, c) in h.buckets() {
            let (lo, hi) = crate::analysis::hist::bucket_bounds(i);
            d.add_spread_us(lo, hi, c);
        }
    }

    /// The distribution of a label set (the view's overflow set past [`MAX_SERIES`]), which is
    /// about to take `n` samples.
    fn group(&mut self, labels: SeriesLabels, n: u64) -> &mut Distribution {
        let labels = if self.groups.contains_key(&labels) || self.groups.len() < MAX_SERIES {
            labels
        } else {
            self.overflowed += n;
            SeriesLabels::overflow(&labels.view)
        };
        let layout = &self.layout;
        self.groups
            .entry(labels)
            .or_insert_with(|| Distribution::new(layout.clone(), ValueUnit::Ms))
    }

    /// Number of label sets so far.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The create requests for the state at `end_unix_s`.
    pub fn requests(&self, end_unix_s: f64, hostname: &str) -> Vec<Value> {
        let res = resource(hostname);
        requests(
            self.groups
                .iter()
                .map(|(l, d)| {
                    time_series(
                        l,
                        &res,
                        MetricKind::Cumulative,
                        self.start_unix_s,
                        end_unix_s,
                        d,
                    )
                })
                .collect(),
        )
    }
}
