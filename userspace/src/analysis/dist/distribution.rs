//! A distribution (`google.api.Distribution`): counts over a layout, its moments, and its
//! percentiles read the way Cloud Monitoring's aligners read them.
use serde::{Deserialize, Serialize};

use super::error::DistError;
use super::layout::BucketOptions;
use super::unit::ValueUnit;

/// A percentile read from a distribution, with where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentile {
    /// The requested percentile (0..=100).
    pub p: f64,
    /// The interpolated value, in the distribution's unit.
    pub value: f64,
    /// The bucket it was read from.
    pub bucket: usize,
    /// The bucket's percentile range [p_low, p_up].
    pub p_low: f64,
    pub p_up: f64,
    /// True when the percentile lies in the overflow bucket: the true value is at least `value`.
    pub open_above: bool,
}

/// A `google.api.Distribution`: counts over a bucket layout plus the population statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub bucket_options: BucketOptions,
    pub unit: ValueUnit,
    pub bucket_counts: Vec<u64>,
    pub count: u64,
    pub mean: f64,
    /// Sum of squared deviations from the mean (Welford's method, as the API describes).
    pub sum_of_squared_deviation: f64,
    /// The range of the population; `None` while empty.
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Values that were not added because they are not finite numbers.
    pub rejected: u64,
}

impl Distribution {
    pub fn new(bucket_options: BucketOptions, unit: ValueUnit) -> Distribution {
        let n = bucket_options.num_buckets();
        Distribution {
            bucket_options,
            unit,
            bucket_counts: vec![0; n],
            count: 0,
            mean: 0.0,
            sum_of_squared_deviation: 0.0,
            min: None,
            max: None,
            rejected: 0,
        }
    }

    /// Add one value (in the distribution's unit). Non-finite values are counted in `rejected`.
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() {
            self.rejected += 1;
            return;
        }
        let i = self.bucket_options.index(v);
        self.bucket_counts[i] += 1;
        self.count += 1;
        let d = v - self.mean;
        self.mean += d / self.count as f64;
        self.sum_of_squared_deviation += d * (v - self.mean);
        self.min = Some(self.min.map_or(v, |m| m.min(v)));
        self.max = Some(self.max.map_or(v, |m| m.max(v)));
    }

    /// Add `n` copies of one value (in the distribution's unit): the same
    /// counts, mean and sum of squared deviations as `n` calls to `add`
    /// (Chan et al.'s pairwise update with a zero-variance group).
    pub fn add_n(&mut self, v: f64, n: u64) {
        if n == 0 {
            return;
        }
        if !v.is_finite() {
            self.rejected += n;
            return;
        }
        let i = self.bucket_options.index(v);
        self.bucket_counts[i] += n;
        let (na, nb) = (self.count as f64, n as f64);
        let d = v - self.mean;
        self.count += n;
        self.mean += d * nb / (na + nb);
        self.sum_of_squared_deviation += d * d * na * nb / (na + nb);
        self.min = Some(self.min.map_or(v, |m| m.min(v)));
        self.max = Some(self.max.map_or(v, |m| m.max(v)));
    }

    /// Add `n` samples known only to be whole microseconds in `[lo_us, hi_us)` (one bucket of
    /// the kernel's histogram), spread evenly over those values: a kernel bucket inside one of
    /// this layout's buckets lands there whole, exactly; one that straddles a bound is split in
    /// proportion to its values on each side (largest-remainder rounding: the counts add up to
    /// `n`). Each part is added at the middle of its values, so the mean and the sum of squared
    /// deviations are those of the parts' midpoints.
    pub fn add_spread_us(&mut self, lo_us: f64, hi_us: f64, n: u64) {
        if n == 0 {
            return;
        }
        let (lo, hi) = (lo_us.ceil(), hi_us.ceil());
        if !(lo.is_finite() && hi.is_finite()) || hi - lo <= 1.0 {
            self.add_n(self.unit.from_us(lo_us), n);
            return;
        }
        // Cut [lo, hi) at this layout's bounds, in microseconds, on whole values.
        let opts = &self.bucket_options;
        let (first, last) = (
            opts.index(self.unit.from_us(lo)),
            opts.index(self.unit.from_us(hi - 1.0)),
        );
        let mut cuts = vec![lo];
        cuts.extend((first..last).map(|i| self.unit.to_us(opts.upper(i)).ceil().clamp(lo, hi)));
        cuts.push(hi);
        let width = hi - lo;
        let mut given = 0u64;
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            if b <= a {
                continue;
            }
            // Cumulative rounding: the parts sum to n whatever the cuts.
            let upto = ((b - lo) / width * n as f64).round() as u64;
            let part = upto.min(n) - given;
            given += part;
            self.add_n(self.unit.from_us((a + b - 1.0) / 2.0), part);
        }
    }

    /// Add a value given in microseconds (converted to the distribution's unit).
    pub fn add_us(&mut self, us: f64) {
        self.add(self.unit.from_us(us));
    }

    /// The p-th percentile (0..=100) as Cloud Monitoring's percentile aligners compute it, or
    /// `None` for an empty distribution.
    pub fn percentile(&self, p: f64) -> Result<Option<Percentile>, DistError> {
        if !(0.0..=100.0).contains(&p) {
            return Err(DistError::BadPercentile(p));
        }
        if self.count == 0 {
            return Ok(None);
        }
        let total = self.count as f64;
        let n = self.bucket_counts.len();
        let mut below = 0u64;
        for (i, &c) in self.bucket_counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let p_low = 100.0 * below as f64 / total;
            let p_up = 100.0 * (below + c) as f64 / total;
            below += c;
            if p_up < p && below < self.count {
                continue;
            }
            let (lo, hi) = (self.bucket_options.lower(i), self.bucket_options.upper(i));
            let frac = ((p - p_low) / (p_up - p_low)).clamp(0.0, 1.0);
            let (value, open_above) = if i == n - 1 {
                (lo, true)
            } else if i == 0 {
                if hi > 0.0 {
                    (hi * frac, false)
                } else {
                    (hi, false)
                }
            } else {
                (lo + (hi - lo) * frac, false)
            };
            return Ok(Some(Percentile {
                p,
                value,
                bucket: i,
                p_low,
                p_up,
                open_above,
            }));
        }
        unreachable!("count > 0 means some bucket is non-empty")
    }

    /// Merge another distribution with the same layout (what alignment does to DELTA points).
    pub fn merge(&mut self, other: &Distribution) -> Result<(), DistError> {
        if self.bucket_options != other.bucket_options || self.unit != other.unit {
            return Err(DistError::LayoutMismatch {
                ours: format!("{} {}", self.bucket_options.spec(), self.unit),
                theirs: format!("{} {}", other.bucket_options.spec(), other.unit),
            });
        }
        if other.count == 0 {
            self.rejected += other.rejected;
            return Ok(());
        }
        for (a, b) in self.bucket_counts.iter_mut().zip(&other.bucket_counts) {
            *a += b;
        }
        let (n1, n2) = (self.count as f64, other.count as f64);
        let n = n1 + n2;
        let d = other.mean - self.mean;
        self.sum_of_squared_deviation += other.sum_of_squared_deviation + d * d * n1 * n2 / n;
        self.mean += d * n2 / n;
        self.count += other.count;
        self.min = match (self.min, other.min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.max = match (self.max, other.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.rejected += other.rejected;
        Ok(())
    }
}

#[cfg(test)]
mod add_n_tests {
    use super::*;
    use crate::analysis::dist::vm_flow_preset;

    #[test]
    fn add_n_equals_repeated_add() {
        let mut a = Distribution::new(vm_flow_preset(), ValueUnit::Ms);
        let mut b = a.clone();
        for (v, n) in [(0.2, 3u64), (1.5, 2), (0.7, 5), (40.0, 1)] {
            a.add_n(v, n);
            for _ in 0..n {
                b.add(v);
            }
        }
        assert_eq!(a.bucket_counts, b.bucket_counts);
        assert_eq!(a.count, b.count);
        assert!((a.mean - b.mean).abs() < 1e-9);
        assert!((a.sum_of_squared_deviation - b.sum_of_squared_deviation).abs() < 1e-6);
    }
}
