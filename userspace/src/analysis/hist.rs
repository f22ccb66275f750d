//! The kernel's per-flow log-linear histogram (see `rttscope_hist_bucket()`
//! in `bpf/rttscope.h`): bucket bounds, percentiles and interval deltas.
//!
//! Layout: values 0..7 us get one bucket each; each power of two
//! `[2^e, 2^(e+1))` for e = 3..26 is split into 8 linear sub-buckets
//! (relative width <= 12.5%); the last bucket is open ended.
use serde::{Deserialize, Serialize};

use crate::bpf::consts;

pub const BUCKETS: usize = consts::HIST_BUCKETS;
const SUB: u32 = consts::HIST_SUB as u32;
const SUB_BITS: u32 = consts::HIST_SUB_BITS as u32;
const MAX_EXP: u32 = consts::HIST_MAX_EXP as u32;

/// Bucket index of a value in microseconds (the same formula as the C side).
pub fn bucket_of(v: u32) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 31 - v.leading_zeros();
    if e >= MAX_EXP {
        return BUCKETS - 1;
    }
    (SUB + (e - SUB_BITS) * SUB + ((v >> (e - SUB_BITS)) & (SUB - 1))) as usize
}

/// `[lower, upper)` bounds of bucket `i` in microseconds; the last bucket's
/// upper bound is `f64::INFINITY`.
pub fn bucket_bounds(i: usize) -> (f64, f64) {
    let i = i as u32;
    if i < SUB {
        return (i as f64, i as f64 + 1.0);
    }
    let e = (i - SUB) / SUB + SUB_BITS;
    let sub = (i - SUB) % SUB;
    let lo = ((SUB + sub) as u64) << (e - SUB_BITS);
    let hi = ((SUB + sub + 1) as u64) << (e - SUB_BITS);
    if i as usize == BUCKETS - 1 {
        (lo as f64, f64::INFINITY)
    } else {
        (lo as f64, hi as f64)
    }
}

/// A histogram of RTT samples in microseconds, with the exact min/max/sum
/// the kernel tracked alongside it. `counts[i]` is bucket `i`; the vector
/// may stop before the last bucket (`from_counts` drops trailing empty
/// buckets: a flow of sub-millisecond RTTs needs ~65 of the 200, and a read
/// of a large flow table holds one histogram per flow); every method treats
/// missing buckets as empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hist {
    pub counts: Vec<u64>,
    pub sum_us: u64,
    /// Exact minimum and maximum, when known (else derived from bucket bounds).
    pub min_us: Option<u32>,
    pub max_us: Option<u32>,
}

impl Default for Hist {
    fn default() -> Self {
        Hist {
            counts: vec![0; BUCKETS],
            sum_us: 0,
            min_us: None,
            max_us: None,
        }
    }
}

/// Percentiles and moments of a histogram (microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HistSummary {
    pub n: u64,
    pub min_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// A compact snapshot of a cumulative histogram: only non-empty buckets.
/// Flows usually fill a handful of buckets, so keeping the previous
/// interval's snapshot per flow costs tens of bytes instead of 1.6 KB.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    buckets: Box<[(u16, u32)]>,
    sum_us: u64,
}

impl Snapshot {
    /// Snapshot of a kernel histogram given as raw counts.
    pub fn of_counts(counts: &[u32], sum_us: u64) -> Self {
        let buckets = counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (i as u16, c))
            .collect();
        Snapshot { buckets, sum_us }
    }

    /// Snapshot of a cumulative histogram.
    pub fn of_hist(h: &Hist) -> Self {
        let buckets = h
            .counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (i as u16, c.min(u32::MAX as u64) as u32))
            .collect();
        Snapshot {
            buckets,
            sum_us: h.sum_us,
        }
    }

    /// Counts of the cumulative histogram `h` added since this snapshot.
    pub fn delta_hist(&self, h: &Hist) -> Hist {
        let mut d = Hist {
            counts: h.counts.clone(),
            sum_us: h.sum_us.saturating_sub(self.sum_us),
            min_us: None,
            max_us: None,
        };
        for &(i, c) in self.buckets.iter() {
            if let Some(b) = d.counts.get_mut(i as usize) {
                *b = b.saturating_sub(c as u64);
            }
        }
        d
    }

    /// Counts in `counts` (cumulative, raw) added since this snapshot.
    pub fn delta(&self, counts: &[u32], sum_us: u64) -> Hist {
        let mut h = Hist::from_counts(counts, sum_us.saturating_sub(self.sum_us), None, None);
        for &(i, c) in self.buckets.iter() {
            if let Some(b) = h.counts.get_mut(i as usize) {
                *b = b.saturating_sub(c as u64);
            }
        }
        h
    }
}

impl Hist {
    pub fn from_counts<T: Copy + Into<u64>>(
        counts: &[T],
        sum_us: u64,
        min_us: Option<u32>,
        max_us: Option<u32>,
    ) -> Self {
        let used = counts
            .iter()
            .rposition(|&x| x.into() > 0)
            .map_or(0, |i| i + 1)
            .min(BUCKETS);
        let c: Vec<u64> = counts[..used].iter().map(|&x| x.into()).collect();
        Hist {
            counts: c,
            sum_us,
            min_us,
            max_us,
        }
    }

    pub fn record(&mut self, us: u32) {
        let b = bucket_of(us);
        if b >= self.counts.len() {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.sum_us += us as u64;
        self.min_us = Some(self.min_us.map_or(us, |m| m.min(us)));
        self.max_us = Some(self.max_us.map_or(us, |m| m.max(us)));
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Set the exact min/max kept alongside the counts, keeping only bounds
    /// consistent with the counts: a sample counted in the histogram but
    /// missed by the kernel's min/max window (it arrived between the read and
    /// the epoch change) makes that bound unknown (bucket bounds are used)
    /// rather than wrong.
    pub fn set_range(&mut self, min: Option<u32>, max: Option<u32>) {
        let first = self.counts.iter().position(|&c| c > 0);
        let last = self.counts.iter().rposition(|&c| c > 0);
        self.min_us = match (min, first) {
            (Some(m), Some(f)) if bucket_of(m) <= f => Some(m),
            _ => None,
        };
        self.max_us = match (max, last) {
            (Some(m), Some(l)) if bucket_of(m) >= l => Some(m),
            _ => None,
        };
    }

    /// Counts added since `earlier` (a previous snapshot of the same
    /// cumulative histogram). min/max are left unknown: the caller supplies
    /// the interval's own min/max when the kernel tracked them.
    pub fn delta(&self, earlier: &Hist) -> Hist {
        let counts = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, a)| a.saturating_sub(earlier.counts.get(i).copied().unwrap_or(0)))
            .collect();
        Hist {
            counts,
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
            min_us: None,
            max_us: None,
        }
    }

    /// Add another histogram into this one.
    pub fn merge(&mut self, other: &Hist) {
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_us += other.sum_us;
        self.min_us = match (self.min_us, other.min_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.max_us = match (self.max_us, other.max_us) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// The p-th percentile (0..=100): find the bucket holding rank
    /// `ceil(p/100 * n)` and interpolate linearly inside it, clamped to the
    /// exact min/max when known.
    pub fn percentile(&self, p: f64) -> f64 {
        let n = self.count();
        if n == 0 {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * n as f64).ceil().clamp(1.0, n as f64);
        let mut seen = 0u64;
        let (lo_clamp, hi_clamp) = self.range();
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            if (seen + c) as f64 >= rank {
                let (lo, hi) = bucket_bounds(i);
                let lo = lo.max(lo_clamp);
                let hi = if hi.is_finite() {
                    hi.min(hi_clamp.max(lo))
                } else {
                    hi_clamp.max(lo)
                };
                let frac = (rank - seen as f64) / c as f64;
                return lo + (hi - lo) * frac;
            }
            seen += c;
        }
        hi_clamp
    }

    /// (min, max) in us: exact when known, else bucket bounds.
    pub fn range(&self) -> (f64, f64) {
        let first = self.counts.iter().position(|&c| c > 0);
        let last = self.counts.iter().rposition(|&c| c > 0);
        let min = match (self.min_us, first) {
            (Some(m), _) => m as f64,
            (None, Some(i)) => bucket_bounds(i).0,
            _ => f64::NAN,
        };
        let max = match (self.max_us, last) {
            (Some(m), _) => m as f64,
            (None, Some(i)) => {
                let (lo, hi) = bucket_bounds(i);
                if hi.is_finite() {
                    hi
                } else {
                    lo
                }
            }
            _ => f64::NAN,
        };
        (min, max)
    }

    pub fn summary(&self) -> HistSummary {
        let n = self.count();
        let (min, max) = self.range();
        HistSummary {
            n,
            min_us: min,
            mean_us: if n > 0 {
                self.sum_us as f64 / n as f64
            } else {
                f64::NAN
            },
            p50_us: self.percentile(50.0),
            p90_us: self.percentile(90.0),
            p99_us: self.percentile(99.0),
            max_us: max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_values() {
        let mut prev_hi = 0.0;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_bounds(i);
            assert_eq!(
                lo,
                prev_hi,
                "bucket {i} starts where {} ended",
                i.saturating_sub(1)
            );
            assert!(hi > lo);
            prev_hi = hi;
        }
        for v in [
            0u32,
            1,
            7,
            8,
            9,
            15,
            16,
            100,
            999,
            1000,
            40_000,
            1 << 20,
            (1 << 27) - 1,
            1 << 27,
            u32::MAX,
        ] {
            let b = bucket_of(v);
            let (lo, hi) = bucket_bounds(b);
            assert!(
                v as f64 >= lo && (v as f64) < hi,
                "{v} in bucket {b} [{lo},{hi})"
            );
        }
        assert_eq!(BUCKETS, 200);
    }

    #[test]
    fn bucket_width_is_at_most_12_5_percent() {
        for i in 8..BUCKETS - 1 {
            let (lo, hi) = bucket_bounds(i);
            assert!((hi - lo) / lo <= 0.125 + 1e-12);
        }
    }

    #[test]
    fn percentiles_close_to_exact() {
        let mut h = Hist::default();
        let mut v: Vec<u32> = (0..10_000).map(|i| 50 + (i * 37 % 20_000)).collect();
        for &x in &v {
            h.record(x);
        }
        v.sort();
        for p in [50.0, 90.0, 99.0] {
            let exact = v[((p / 100.0 * v.len() as f64).ceil() as usize) - 1] as f64;
            let got = h.percentile(p);
            assert!(
                (got - exact).abs() / exact < 0.07,
                "p{p}: hist {got} exact {exact}"
            );
        }
        let s = h.summary();
        assert_eq!(s.n, 10_000);
        assert_eq!(s.min_us, 50.0);
        assert!(
            s.min_us <= s.p50_us
                && s.p50_us <= s.p90_us
                && s.p90_us <= s.p99_us
                && s.p99_us <= s.max_us
        );
    }

    #[test]
    fn single_value_is_exact() {
        let mut h = Hist::default();
        for _ in 0..10 {
            h.record(20_000);
        }
        assert_eq!(h.percentile(50.0), 20_000.0);
        assert_eq!(h.summary().mean_us, 20_000.0);
    }

    #[test]
    fn inconsistent_window_bounds_are_dropped() {
        let mut h = Hist::default();
        for v in [90, 100, 128] {
            h.record(v);
        }
        // A window that missed the 128 us sample: its max is not kept.
        h.set_range(Some(90), Some(115));
        assert_eq!(h.min_us, Some(90));
        assert_eq!(h.max_us, None);
        let s = h.summary();
        assert!(s.p99_us <= s.max_us, "p99 {} <= max {}", s.p99_us, s.max_us);
        h.set_range(Some(90), Some(128));
        assert_eq!(h.max_us, Some(128));
        h.set_range(Some(200), Some(128));
        assert_eq!(h.min_us, None);
    }

    #[test]
    fn snapshot_delta_matches_dense_delta() {
        let mut raw = vec![0u32; BUCKETS];
        raw[bucket_of(10)] = 1;
        let snap = Snapshot::of_counts(&raw, 10);
        raw[bucket_of(100)] += 2;
        raw[bucket_of(10)] += 1;
        let d = snap.delta(&raw, 10 + 200 + 10);
        assert_eq!(d.count(), 3);
        assert_eq!(d.sum_us, 210);
        assert_eq!(d.counts[bucket_of(100)], 2);
        assert_eq!(Snapshot::default().delta(&raw, 0).count(), 4);
    }

    /// Histograms read from the kernel stop at their last non-empty bucket;
    /// every operation gives what the full-length histogram would.
    #[test]
    fn trimmed_histograms_behave_like_full_ones() {
        let mut raw = vec![0u32; BUCKETS];
        raw[bucket_of(20)] = 3;
        raw[bucket_of(300)] = 1;
        let short = Hist::from_counts(&raw, 360, Some(20), Some(300));
        assert_eq!(short.counts.len(), bucket_of(300) + 1);
        let mut full = short.clone();
        full.counts.resize(BUCKETS, 0);
        assert_eq!(short.summary(), full.summary());
        assert!(Hist::from_counts(&[0u32; BUCKETS], 0, None, None)
            .counts
            .is_empty());
        // merge: a longer one into a shorter one, and the other way round
        let mut long = Hist::default();
        long.record(40_000);
        let mut a = short.clone();
        a.merge(&long);
        let mut b = long.clone();
        b.merge(&short);
        assert_eq!(a.count(), 5);
        assert_eq!(a.summary(), b.summary());
        assert_eq!(a.counts[bucket_of(40_000)], 1);
        // record past the end
        let mut c = short.clone();
        c.record(1_000_000);
        assert_eq!(c.count(), 5);
        assert_eq!(c.counts[bucket_of(1_000_000)], 1);
        // delta against an earlier read that was longer (a re-keyed flow) or shorter
        assert_eq!(short.delta(&c).count(), 0);
        assert_eq!(c.delta(&short).count(), 1);
        let snap = Snapshot::of_hist(&c);
        assert_eq!(snap.delta_hist(&short).count(), 0);
        assert_eq!(snap.delta(&raw, 360).count(), 0);
    }

    #[test]
    fn delta_and_merge() {
        let mut a = Hist::default();
        a.record(10);
        let snap = a.clone();
        a.record(100);
        a.record(100);
        let d = a.delta(&snap);
        assert_eq!(d.count(), 2);
        assert_eq!(d.sum_us, 200);
        let mut m = Hist::default();
        m.merge(&snap);
        m.merge(&d);
        assert_eq!(m.count(), 3);
        assert!(Hist::default().percentile(50.0).is_nan());
    }
}
