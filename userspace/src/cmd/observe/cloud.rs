//! `observe --cloud-buckets`: each view aggregated like the cloud metric.
use std::time::Duration;

use serde_json::json;

use crate::analysis::hist::Hist;

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

    /// The period so far (or the completed one) as JSON.
    pub(super) fn point(&self, t: f64, complete: bool) -> serde_json::Value {
        let p = |q: f64| {
            self.dist
                .percentile(q)
                .ok()
                .flatten()
                .map(|x| x.value * 1000.0)
        };
        json!({
            "period_start_s": self.period_start,
            "period_s": self.period.as_secs_f64(),
            "complete": complete,
            "t": t,
            "count": self.dist.count,
            "layout": self.layout.spec(),
            "p50_us": p(50.0), "p95_us": p(95.0), "p99_us": p(99.0),
        })
    }

    /// Close the period if it is over: returns the completed point.
    pub(super) fn roll(&mut self, t: f64) -> Option<serde_json::Value> {
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
