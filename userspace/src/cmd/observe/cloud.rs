//! `observe --cloud-buckets`: each view aggregated like the cloud metric; `--format
//! cloud-monitoring`: each flow group's distribution as Cloud Monitoring time series.
use std::time::Duration;

use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::Hist;
use crate::analysis::records::CloudPoint;
use crate::views::view::{FlowDelta, FlowSink};
use crate::views::ViewKind;

/// Live cloud-metric aggregation of one view (`--cloud-buckets`): the kernel
/// histograms' interval deltas go into a Cloud Monitoring distribution, each
/// kernel bucket at its midpoint (kernel buckets are <= 1.6% wide, far
/// narrower than the cloud's 0-1, 1-2, 2-4 ms buckets).
pub(super) struct CloudAgg {
    layout: crate::analysis::dist::BucketOptions,
    period: Duration,
    dist: crate::analysis::dist::Distribution,
    period_start: f64,
}

impl CloudAgg {
    pub(super) fn new(layout: crate::analysis::dist::BucketOptions, period: Duration) -> Self {
        let dist = crate::analysis::dist::Distribution::new(
            layout.clone(),
            crate::analysis::dist::ValueUnit::Ms,
        );
        CloudAgg {
            layout,
            period,
            dist,
            period_start: 0.0,
        }
    }

    pub(super) fn add(&mut self, h: &Hist) {
        for (i, c) in h.buckets() {
            let (lo, hi) = crate::analysis::hist::bucket_bounds(i);
            let mid = if hi.is_finite() { (lo + hi) / 2.0 } else { lo };
            let v = match (h.min_us, h.max_us) {
                (Some(mn), Some(mx)) => mid.clamp(mn as f64, mx as f64),
                _ => mid,
            };
            self.dist.add_n(v / 1000.0, c);
        }
    }

    /// The period so far (or the completed one).
    pub(super) fn point(&self, t: f64, complete: bool) -> CloudPoint {
        let p = |q: f64| {
            self.dist
                .percentile(q)
                .ok()
                .flatten()
                .map(|x| x.value * 1000.0)
        };
        CloudPoint {
            complete,
            count: self.dist.count,
            layout: self.layout.spec(),
            p50_us: p(50.0),
            p95_us: p(95.0),
            p99_us: p(99.0),
            period_s: self.period.as_secs_f64(),
            period_start_s: self.period_start,
            t,
        }
    }

    /// Close the period if it is over: returns the completed point.
    pub(super) fn roll(&mut self, t: f64) -> Option<CloudPoint> {
        if t - self.period_start + 1e-6 < self.period.as_secs_f64() {
            return None;
        }
        let done = self.point(t, true);
        self.dist = crate::analysis::dist::Distribution::new(
            self.layout.clone(),
            crate::analysis::dist::ValueUnit::Ms,
        );
        self.period_start = t;
        Some(done)
    }
}

/// `--format cloud-monitoring`: every flow's samples since the start, from the kernel's
/// per-flow histograms (the deltas the session hands its sinks each read), in one CUMULATIVE
/// distribution per label set. Built from the histograms, not the ring buffer, so a sample the
/// ring would have dropped is still counted.
pub(super) struct CloudSink {
    pub(super) export: crate::analysis::cloud_monitoring::LiveExport,
    v4_prefix: u8,
    v6_prefix: u8,
}

impl CloudSink {
    pub(super) fn new(
        layout: crate::analysis::dist::BucketOptions,
        start_unix_s: f64,
        v4_prefix: u8,
        v6_prefix: u8,
    ) -> Self {
        CloudSink {
            export: crate::analysis::cloud_monitoring::LiveExport::new(layout, start_unix_s),
            v4_prefix,
            v6_prefix,
        }
    }

    fn add(&mut self, view: &str, flow: &Flow, side: Side, netns: String, delta: &Hist) {
        let labels = crate::analysis::cloud_monitoring::SeriesLabels {
            view: view.to_string(),
            side: side.as_str().to_string(),
            netns,
            remote_prefix: crate::analysis::cloud_monitoring::remote_prefix(
                flow.remote.ip(),
                self.v4_prefix,
                self.v6_prefix,
            ),
        };
        self.export.add_hist(labels, delta);
    }
}

impl FlowSink for CloudSink {
    fn flow_delta(&mut self, view: ViewKind, d: &FlowDelta<'_>) {
        self.add(
            view.as_str(),
            d.flow,
            d.side,
            d.netns_name.to_string(),
            d.delta,
        );
    }
}

/// Two sinks fed the same reads (the Prometheus exporter and the cloud export).
pub(super) struct Both<'a>(
    pub(super) Option<&'a mut dyn FlowSink>,
    pub(super) Option<&'a mut dyn FlowSink>,
);

impl FlowSink for Both<'_> {
    fn flow_delta(&mut self, view: ViewKind, d: &FlowDelta<'_>) {
        for s in [self.0.as_deref_mut(), self.1.as_deref_mut()]
            .into_iter()
            .flatten()
        {
            s.flow_delta(view, d);
        }
    }
}
