//! Alignment periods: the samples grouped into one distribution per period, as an aligner
//! groups a metric's points (in one go, or live).
use std::collections::BTreeMap;

use serde::Serialize;

use super::distribution::Distribution;
use super::error::DistError;
use super::layout::BucketOptions;
use super::unit::ValueUnit;

/// One aligned point: the distribution of the samples in `[start_s, end_s)`; the API stamps the
/// point with `end_s`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlignedPoint {
    pub start_s: f64,
    pub end_s: f64,
    pub distribution: Distribution,
}

/// Group `(t_s, value_us)` samples into alignment periods of `period_s` seconds, counted from
/// t = 0, one distribution per period with samples (in time order).
pub fn align(
    samples: impl IntoIterator<Item = (f64, f64)>,
    period_s: f64,
    options: &BucketOptions,
    unit: ValueUnit,
) -> Result<Vec<AlignedPoint>, DistError> {
    if !(period_s.is_finite() && period_s > 0.0) {
        return Err(DistError::BadPeriod(period_s));
    }
    let mut periods: BTreeMap<i64, Distribution> = BTreeMap::new();
    for (t, us) in samples {
        if !t.is_finite() {
            continue;
        }
        let k = (t / period_s).floor() as i64;
        periods
            .entry(k)
            .or_insert_with(|| Distribution::new(options.clone(), unit))
            .add_us(us);
    }
    Ok(periods
        .into_iter()
        .map(|(k, distribution)| AlignedPoint {
            start_s: k as f64 * period_s,
            end_s: (k + 1) as f64 * period_s,
            distribution,
        })
        .collect())
}

/// Alignment as samples arrive (for live views, e.g. `observe --cloud-buckets`): feed samples in
/// time order; each time a sample opens a new period, the finished period is returned. A sample
/// older than the open period cannot be placed any more: it is counted in `late` and dropped.
#[derive(Debug, Clone)]
pub struct LiveAligner {
    options: BucketOptions,
    unit: ValueUnit,
    period_s: f64,
    open: Option<(i64, Distribution)>,
    /// Samples dropped because their period had already been closed.
    pub late: u64,
}

impl LiveAligner {
    pub fn new(options: BucketOptions, unit: ValueUnit, period_s: f64) -> Result<Self, DistError> {
        if !(period_s.is_finite() && period_s > 0.0) {
            return Err(DistError::BadPeriod(period_s));
        }
        Ok(LiveAligner {
            options,
            unit,
            period_s,
            open: None,
            late: 0,
        })
    }

    /// Add a sample taken at `t_s` (seconds since the start); returns the period it closed, if any.
    pub fn add(&mut self, t_s: f64, rtt_us: f64) -> Option<AlignedPoint> {
        if !t_s.is_finite() {
            self.late += 1;
            return None;
        }
        let k = (t_s / self.period_s).floor() as i64;
        match &mut self.open {
            Some((open_k, d)) if *open_k == k => {
                d.add_us(rtt_us);
                return None;
            }
            Some((open_k, _)) if k < *open_k => {
                self.late += 1;
                return None;
            }
            _ => {}
        }
        let closed = self.open.take().map(|(open_k, d)| self.point(open_k, d));
        let mut d = Distribution::new(self.options.clone(), self.unit);
        d.add_us(rtt_us);
        self.open = Some((k, d));
        closed
    }

    /// The samples of the open period so far.
    pub fn current(&self) -> Option<&Distribution> {
        self.open.as_ref().map(|(_, d)| d)
    }

    /// Close the open period (at the end of a run).
    pub fn flush(&mut self) -> Option<AlignedPoint> {
        self.open.take().map(|(k, d)| self.point(k, d))
    }

    fn point(&self, k: i64, distribution: Distribution) -> AlignedPoint {
        AlignedPoint {
            start_s: k as f64 * self.period_s,
            end_s: (k + 1) as f64 * self.period_s,
            distribution,
        }
    }
}
