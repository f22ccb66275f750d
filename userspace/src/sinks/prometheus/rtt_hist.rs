//! The RTT histogram metric: Prometheus buckets whose every bound is a kernel
//! bucket boundary ([`RTT_BOUNDS_US`]), fed with whole kernel histograms at
//! once; the classic and native buckets are derived when the exporter renders.
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::analysis::hist::{self, Hist};

use super::native;
use super::parking_lot_free::Mutex;

/// Prometheus bucket upper bounds in microseconds: 10 and 14 x 2^k, k = 0..=20
/// (10 us .. 10.49 s, ratio ~1.4 per bucket), all kernel bucket boundaries.
pub const RTT_BOUNDS_US: [u32; 42] = {
    let mut b = [0u32; 42];
    let mut k = 0;
    while k <= 20 {
        b[2 * k] = 10 << k;
        b[2 * k + 1] = 14 << k;
        k += 1;
    }
    b
};

/// Number of Prometheus buckets used (bounds up to 10 x 2^20 us; the 14 x 2^20
/// entry is past 10 s and dropped), plus +Inf.
pub(super) const N_BOUNDS: usize = 41;

/// A Prometheus histogram fed with whole kernel histograms at once
/// (prometheus-client's own `Histogram` takes one observation at a time).
/// It keeps the series' cumulative kernel histogram; the classic buckets
/// and the native (exponential) buckets are both derived from it when the
/// exporter renders.
#[derive(Debug, Clone, Default)]
pub struct RttHist {
    inner: Arc<Mutex<RttHistInner>>,
}

#[derive(Debug)]
pub(super) struct RttHistInner {
    /// Every sample of the series, in the kernel's log-linear layout.
    hist: Hist,
    /// The native histogram's schema: lowered (for good) when the series
    /// needs more than `native::MAX_BUCKETS` buckets.
    schema: i32,
}

impl Default for RttHistInner {
    fn default() -> Self {
        RttHistInner {
            hist: Hist::default(),
            schema: native::SCHEMA,
        }
    }
}

/// For each kernel bucket, the index of the Prometheus bucket that holds it.
pub(super) fn kernel_to_prom() -> &'static [u8; hist::BUCKETS] {
    static MAP: std::sync::OnceLock<[u8; hist::BUCKETS]> = std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        let mut m = [0u8; hist::BUCKETS];
        for (i, slot) in m.iter_mut().enumerate() {
            let (_, hi) = hist::bucket_bounds(i);
            // All values in [lo, hi) are <= hi - 1 < bound when hi <= bound.
            let idx = RTT_BOUNDS_US[..N_BOUNDS]
                .iter()
                .position(|&b| hi.is_finite() && hi <= b as f64)
                .unwrap_or(N_BOUNDS);
            *slot = idx as u8;
        }
        m
    })
}

/// Classic buckets (per bucket, not cumulative; the last is +Inf) of a kernel histogram.
pub(super) fn classic_buckets(h: &Hist) -> Vec<(f64, u64)> {
    let map = kernel_to_prom();
    let mut out: Vec<(f64, u64)> = RTT_BOUNDS_US[..N_BOUNDS]
        .iter()
        .map(|&b| (b as f64 / 1e6, 0))
        .chain(std::iter::once((f64::MAX, 0)))
        .collect();
    for (i, c) in h.buckets() {
        out[map[i.min(hist::BUCKETS - 1)] as usize].1 += c;
    }
    out
}

impl RttHist {
    /// Add `cur - prev` (cumulative kernel histograms of one flow; `prev`
    /// None: all of `cur`). Returns the number of samples added.
    pub fn add_delta(&self, cur: &Hist, prev: Option<&Hist>) -> u64 {
        let d;
        let delta = match prev {
            Some(p) => {
                d = cur.delta(p);
                &d
            }
            None => cur,
        };
        let n = delta.count();
        if n > 0 {
            let mut g = self.inner.lock();
            g.hist.merge(delta);
            // The series' range is known from the buckets; exact min/max are not exported.
            g.hist.min_us = None;
            g.hist.max_us = None;
        }
        n
    }

    /// (sum in seconds, count, cumulative counts per bound) for tests and docs.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let g = self.inner.lock();
        let mut acc = 0;
        let cum = classic_buckets(&g.hist)
            .into_iter()
            .map(|(b, c)| {
                acc += c;
                (b, acc)
            })
            .collect();
        (g.hist.sum_us as f64 / 1e6, g.hist.count(), cum)
    }

    /// The native (exponential) buckets, at the series' schema or lower.
    pub fn native(&self) -> native::Native {
        let mut g = self.inner.lock();
        let n = native::from_hist(&g.hist, g.schema);
        g.schema = n.schema;
        n
    }
}

impl TypedMetric for RttHist {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for RttHist {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let g = self.inner.lock();
        let buckets = classic_buckets(&g.hist);
        encoder.encode_histogram::<()>(g.hist.sum_us as f64 / 1e6, g.hist.count(), &buckets, None)
    }
    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}
