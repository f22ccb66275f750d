//! The kernel's per-flow log-linear histogram (see `rttscope_hist_bucket()`
//! in `bpf/rttscope.h`): bucket bounds, percentiles and interval deltas.
//!
//! Layout: values 0..63 us get one bucket each; each power of two
//! `[2^e, 2^(e+1))` for e = 6..24 is split into 64 linear sub-buckets of
//! 2^(e-6) us (every value below 128 us has a bucket of its own; relative
//! width <= 1/64); the last bucket is open ended (>= ~33.3 s).
//!
//! # Percentiles
//!
//! [`Hist::percentile`] finds the bucket that holds the nearest-rank sample
//! (the same rank as [`crate::analysis::stats::percentile_sorted`], so the
//! bucket is exact), then places the value inside it: linearly by rank
//! between the bucket's smallest and largest possible sample (integers
//! `lo ..= hi - 1`, narrowed to the exact min/max when known), then clamped
//! to the window where no value of the bucket can be more than
//! [`MAX_REL_ERR`] away. A finite bucket spans at most a ratio of
//! 1 + 1/64 between its smallest and largest sample, so that window is never
//! empty: **every percentile is within 0.8% of the exact one**, whatever the
//! distribution (values in the open last bucket excepted). The
//! interpolation only chooses where in that window.
use serde::{Deserialize, Serialize};

use crate::analysis::stats::Summary;
use crate::bpf::consts;

pub const BUCKETS: usize = consts::HIST_BUCKETS;
const SUB: u32 = consts::HIST_SUB as u32;
const SUB_BITS: u32 = consts::HIST_SUB_BITS as u32;
const MAX_EXP: u32 = consts::HIST_MAX_EXP as u32;

/// Largest relative error of a percentile, by construction (see the module
/// notes): (1 + 1/64) <= (1 + e) / (1 - e) holds for e = 0.8%.
pub const MAX_REL_ERR: f64 = 0.008;

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
/// the kernel tracked alongside it. Only the buckets from the first to the
/// last non-empty one are stored (a flow's samples usually fill a few
/// neighbouring buckets of the 1280); every method treats the others as
/// empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hist {
    /// Index of the bucket `counts[0]` stands for.
    first: usize,
    counts: Vec<u64>,
    pub sum_us: u64,
    /// Exact minimum and maximum, when known (else derived from bucket bounds).
    pub min_us: Option<u32>,
    pub max_us: Option<u32>,
}

/// Non-empty buckets (index, count), ascending: one or two kept inline (an
/// idle flow's histogram needs no heap allocation).
pub type Buckets = smallvec::SmallVec<[(u16, u32); 2]>;

/// A compact snapshot of a cumulative histogram: only non-empty buckets.
/// Flows usually fill a handful of buckets, so keeping the previous
/// interval's snapshot per flow costs tens of bytes instead of 5 KiB.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    buckets: Buckets,
    sum_us: u64,
}

impl Snapshot {
    /// Snapshot of a kernel histogram given as its non-empty buckets
    /// (index, count), ascending.
    pub fn of_sparse(buckets: &[(u16, u32)], sum_us: u64) -> Self {
        Snapshot {
            buckets: buckets.iter().copied().collect(),
            sum_us,
        }
    }

    /// Snapshot of a cumulative histogram.
    pub fn of_hist(h: &Hist) -> Self {
        let buckets = h
            .buckets()
            .map(|(i, c)| (i as u16, c.min(u32::MAX as u64) as u32))
            .collect();
        Snapshot {
            buckets,
            sum_us: h.sum_us,
        }
    }

    /// Whether `buckets` and `sum_us` (cumulative, sparse) are still what this
    /// snapshot holds: nothing was added since (the common case of an idle
    /// flow, answered without building a histogram).
    pub fn unchanged(&self, buckets: &[(u16, u32)], sum_us: u64) -> bool {
        self.sum_us == sum_us && *self.buckets == *buckets
    }

    /// Counts of the cumulative histogram `h` added since this snapshot.
    pub fn delta_hist(&self, h: &Hist) -> Hist {
        let mut d = h.clone();
        d.sum_us = h.sum_us.saturating_sub(self.sum_us);
        d.min_us = None;
        d.max_us = None;
        d.subtract(self.buckets.iter().map(|&(i, c)| (i as usize, c as u64)));
        d
    }

    /// Counts in `buckets` (cumulative, sparse) added since this snapshot.
    pub fn delta_sparse(&self, buckets: &[(u16, u32)], sum_us: u64) -> Hist {
        if self.unchanged(buckets, sum_us) {
            return Hist::default();
        }
        let mut h = Hist::from_sparse(buckets, sum_us.saturating_sub(self.sum_us), None, None);
        h.subtract(self.buckets.iter().map(|&(i, c)| (i as usize, c as u64)));
        h
    }
}

/// Where an estimate of any value in `[a, b]` is within [`MAX_REL_ERR`] of
/// it: `[b (1 - e), a (1 + e)]`, or None when the span is too wide for that
/// (only the open last bucket).
fn window(a: f64, b: f64) -> Option<(f64, f64)> {
    let (wlo, whi) = (b * (1.0 - MAX_REL_ERR), a * (1.0 + MAX_REL_ERR));
    (wlo <= whi).then_some((wlo, whi))
}

impl Hist {
    pub fn from_counts<T: Copy + Into<u64>>(
        counts: &[T],
        sum_us: u64,
        min_us: Option<u32>,
        max_us: Option<u32>,
    ) -> Self {
        let counts = &counts[..counts.len().min(BUCKETS)];
        let Some(first) = counts.iter().position(|&x| x.into() > 0) else {
            return Hist {
                sum_us,
                min_us,
                max_us,
                ..Default::default()
            };
        };
        let last = counts.iter().rposition(|&x| x.into() > 0).unwrap_or(first);
        Hist {
            first,
            counts: counts[first..=last].iter().map(|&x| x.into()).collect(),
            sum_us,
            min_us,
            max_us,
        }
    }

    /// A histogram from its non-empty buckets (index, count), in any order
    /// (a repeated index adds up); indices past the last bucket are ignored.
    pub fn from_sparse(
        buckets: &[(u16, u32)],
        sum_us: u64,
        min_us: Option<u32>,
        max_us: Option<u32>,
    ) -> Self {
        let mut h = Hist {
            sum_us,
            min_us,
            max_us,
            ..Default::default()
        };
        let nonzero = || {
            buckets
                .iter()
                .filter(|&&(i, c)| c > 0 && (i as usize) < BUCKETS)
        };
        let (f, l) = nonzero().fold((u16::MAX, 0), |(f, l), &(i, _)| (f.min(i), l.max(i)));
        if f <= l {
            h.first = f as usize;
            h.counts = vec![0; (l - f) as usize + 1];
            for &(i, c) in nonzero() {
                h.counts[(i - f) as usize] += c as u64;
            }
        }
        h
    }

    /// Count of bucket `i` (0 outside the stored range).
    pub fn get(&self, i: usize) -> u64 {
        i.checked_sub(self.first)
            .and_then(|j| self.counts.get(j))
            .copied()
            .unwrap_or(0)
    }

    /// Non-empty buckets as (bucket index, count), ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let first = self.first;
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(move |(j, &c)| (first + j, c))
    }

    /// Whether both hold the same counts (sums and bounds aside).
    pub fn same_counts(&self, other: &Hist) -> bool {
        self.buckets().eq(other.buckets())
    }

    /// Grow the stored range to cover buckets `f..=l`.
    fn cover(&mut self, f: usize, l: usize) {
        if self.counts.is_empty() {
            self.first = f;
        } else if f < self.first {
            let grow = self.first - f;
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.first = f;
        }
        let len = l.max(f) - self.first + 1;
        if len > self.counts.len() {
            self.counts.resize(len, 0);
        }
    }

    /// Take (bucket, count) pairs away (saturating), then drop empty ends.
    fn subtract(&mut self, pairs: impl Iterator<Item = (usize, u64)>) {
        for (i, c) in pairs {
            if let Some(b) = i
                .checked_sub(self.first)
                .and_then(|j| self.counts.get_mut(j))
            {
                *b = b.saturating_sub(c);
            }
        }
        self.trim();
    }

    /// Keep the stored range from the first to the last non-empty bucket.
    fn trim(&mut self) {
        match self.counts.iter().position(|&c| c > 0) {
            None => {
                self.counts.clear();
                self.first = 0;
            }
            Some(lead) => {
                let last = self.counts.iter().rposition(|&c| c > 0).unwrap_or(lead);
                self.counts.truncate(last + 1);
                self.counts.drain(..lead);
                self.first += lead;
            }
        }
    }

    pub fn record(&mut self, us: u32) {
        let b = bucket_of(us);
        self.cover(b, b);
        self.counts[b - self.first] += 1;
        self.sum_us += us as u64;
        self.min_us = Some(self.min_us.map_or(us, |m| m.min(us)));
        self.max_us = Some(self.max_us.map_or(us, |m| m.max(us)));
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Indices of the first and last non-empty buckets.
    fn span(&self) -> Option<(usize, usize)> {
        (!self.counts.is_empty()).then(|| (self.first, self.first + self.counts.len() - 1))
    }

    /// Set the exact min/max kept alongside the counts, keeping only bounds
    /// consistent with the counts: a sample counted in the histogram but
    /// missed by the kernel's min/max window (it arrived between the read and
    /// the epoch change) makes that bound unknown (bucket bounds are used)
    /// rather than wrong.
    pub fn set_range(&mut self, min: Option<u32>, max: Option<u32>) {
        let span = self.span();
        self.min_us = match (min, span) {
            (Some(m), Some((f, _))) if bucket_of(m) <= f => Some(m),
            _ => None,
        };
        self.max_us = match (max, span) {
            (Some(m), Some((_, l))) if bucket_of(m) >= l => Some(m),
            _ => None,
        };
    }

    /// Counts added since `earlier` (a previous snapshot of the same
    /// cumulative histogram). min/max are left unknown: the caller supplies
    /// the interval's own min/max when the kernel tracked them.
    pub fn delta(&self, earlier: &Hist) -> Hist {
        let mut d = self.clone();
        d.sum_us = self.sum_us.saturating_sub(earlier.sum_us);
        d.min_us = None;
        d.max_us = None;
        d.subtract(earlier.buckets());
        d
    }

    /// Add another histogram into this one.
    pub fn merge(&mut self, other: &Hist) {
        if let Some((f, l)) = other.span() {
            self.cover(f, l);
            for (i, c) in other.buckets() {
                self.counts[i - self.first] += c;
            }
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

    /// The p-th percentile (0..=100), within [`MAX_REL_ERR`] of the exact
    /// nearest-rank percentile of the samples (see the module notes).
    pub fn percentile(&self, p: f64) -> f64 {
        let n = self.count();
        if n == 0 {
            return f64::NAN;
        }
        let rank = crate::analysis::stats::nearest_rank(p, n);
        let mut seen = 0u64;
        for (i, c) in self.buckets() {
            if seen + c >= rank {
                return self.place(i, rank - seen, c);
            }
            seen += c;
        }
        self.range().1
    }

    /// The value of the `k`-th (1-based) of the `c` samples in bucket `i`.
    fn place(&self, i: usize, k: u64, c: u64) -> f64 {
        let span = self.span();
        match (self.min_us, self.max_us) {
            // the smallest / largest sample itself, when the kernel kept it
            (Some(m), _) if k == 1 && span.is_some_and(|s| s.0 == i) => return m as f64,
            (_, Some(m)) if k == c && span.is_some_and(|s| s.1 == i) => return m as f64,
            _ => {}
        }
        let (a, b) = self.sample_range(i);
        let x = a + (b - a) * (k as f64 - 0.5) / c as f64;
        match window(a, b) {
            Some((wlo, whi)) => x.clamp(wlo, whi),
            None => x, // only the open last bucket is that wide
        }
    }

    /// The smallest and largest sample bucket `i` can hold (whole us),
    /// narrowed by the exact min/max when known.
    fn sample_range(&self, i: usize) -> (f64, f64) {
        let (lo, hi) = bucket_bounds(i);
        let a = self.min_us.map_or(lo, |m| lo.max(m as f64));
        let b = match (hi.is_finite(), self.max_us) {
            (true, Some(m)) => (hi - 1.0).min(m as f64),
            (true, None) => hi - 1.0,
            (false, Some(m)) => m as f64,
            (false, None) => lo,
        };
        (a, b.max(a))
    }

    /// (min, max) in us: exact when known, else the first / last non-empty
    /// bucket's value that is within [`MAX_REL_ERR`] of any sample it holds.
    pub fn range(&self) -> (f64, f64) {
        let Some((f, l)) = self.span() else {
            return (f64::NAN, f64::NAN);
        };
        let min = match self.min_us {
            Some(m) => m as f64,
            None => {
                let (a, b) = self.sample_range(f);
                window(a, b).map_or(a, |w| w.0.max(a))
            }
        };
        let max = match self.max_us {
            Some(m) => m as f64,
            None => {
                let (a, b) = self.sample_range(l);
                window(a, b).map_or(b, |w| w.1.min(b))
            }
        };
        (min, max)
    }

    /// The summary of its samples ([`Summary`], the one summary type), the percentiles taken at
    /// the exact definition's rank within the buckets ([`Hist::percentile`]); no standard
    /// deviation (NaN: a histogram keeps no sum of squares). Empty: n = 0 and every value NaN.
    pub fn summary(&self) -> Summary {
        let n = self.count();
        let (min, max) = self.range();
        Summary {
            n,
            min,
            mean: if n > 0 {
                self.sum_us as f64 / n as f64
            } else {
                f64::NAN
            },
            p50: self.percentile(50.0),
            p90: self.percentile(90.0),
            p99: self.percentile(99.0),
            max,
            stddev: f64::NAN,
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
            127,
            128,
            129,
            4_950,
            (1 << 25) - 1,
            1 << 25,
            u32::MAX,
        ] {
            let b = bucket_of(v);
            let (lo, hi) = bucket_bounds(b);
            assert!(
                v as f64 >= lo && (v as f64) < hi,
                "{v} in bucket {b} [{lo},{hi})"
            );
        }
        assert_eq!(BUCKETS, 1280);
    }

    #[test]
    fn bucket_width_is_at_most_one_64th() {
        for i in 0..BUCKETS - 1 {
            let (lo, hi) = bucket_bounds(i);
            // every value below 128 us has a bucket of its own
            assert!(
                hi - lo == 1.0 || (hi - lo) / lo <= 1.0 / 64.0 + 1e-12,
                "bucket {i}"
            );
        }
        assert_eq!(bucket_bounds(127), (127.0, 128.0));
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
                (got - exact).abs() / exact <= MAX_REL_ERR,
                "p{p}: hist {got} exact {exact}"
            );
        }
        let s = h.summary();
        assert_eq!(s.n, 10_000);
        assert_eq!(s.min, 50.0);
        assert!(s.min <= s.p50 && s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max);
    }

    #[test]
    fn single_value_is_exact() {
        let mut h = Hist::default();
        for _ in 0..10 {
            h.record(20_000);
        }
        assert_eq!(h.percentile(50.0), 20_000.0);
        assert_eq!(h.summary().mean, 20_000.0);
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
        assert!(s.p99 <= s.max, "p99 {} <= max {}", s.p99, s.max);
        h.set_range(Some(90), Some(128));
        assert_eq!(h.max_us, Some(128));
        h.set_range(Some(200), Some(128));
        assert_eq!(h.min_us, None);
    }

    /// The sparse pairs of dense counts (what the fine pool keeps per flow).
    fn sparse(raw: &[u32]) -> Vec<(u16, u32)> {
        raw.iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (i as u16, c))
            .collect()
    }

    #[test]
    fn snapshot_delta_matches_dense_delta() {
        let mut raw = vec![0u32; BUCKETS];
        raw[bucket_of(10)] = 1;
        let snap = Snapshot::of_sparse(&sparse(&raw), 10);
        assert!(snap.unchanged(&sparse(&raw), 10));
        assert_eq!(snap.delta_sparse(&sparse(&raw), 10), Hist::default());
        raw[bucket_of(100)] += 2;
        raw[bucket_of(10)] += 1;
        assert!(!snap.unchanged(&sparse(&raw), 10 + 200 + 10));
        let d = snap.delta_sparse(&sparse(&raw), 10 + 200 + 10);
        assert_eq!(d.count(), 3);
        assert_eq!(d.sum_us, 210);
        assert_eq!(d.get(bucket_of(100)), 2);
        assert_eq!(d.get(bucket_of(10)), 1);
        let dense = Hist::from_counts(&raw, 220, None, None);
        assert_eq!(Snapshot::default().delta_sparse(&sparse(&raw), 220), dense);
        // the sparse form gives the dense form's histogram, in any order
        let mut shuffled = sparse(&raw);
        shuffled.reverse();
        shuffled.push((BUCKETS as u16, 9)); // past the end: ignored
        assert_eq!(Hist::from_sparse(&shuffled, 220, None, None), dense);
        assert_eq!(Hist::from_sparse(&[], 5, None, None).count(), 0);
    }

    /// Histograms read from the kernel stop at their last non-empty bucket;
    /// every operation gives what the full-length histogram would.
    #[test]
    fn trimmed_histograms_behave_like_full_ones() {
        let mut raw = vec![0u32; BUCKETS];
        raw[bucket_of(20)] = 3;
        raw[bucket_of(300)] = 1;
        let short = Hist::from_counts(&raw, 360, Some(20), Some(300));
        assert_eq!(short.counts.len(), bucket_of(300) - bucket_of(20) + 1);
        assert_eq!(short.first, bucket_of(20));
        let mut full = short.clone();
        full.cover(0, BUCKETS - 1);
        assert_eq!(short.summary(), full.summary());
        assert!(Hist::from_counts(&[0u32; BUCKETS], 0, None, None)
            .counts
            .is_empty());
        // a merge into an empty histogram, and below the stored range
        let mut e = Hist::default();
        e.merge(&short);
        assert_eq!(e, short);
        let mut low = Hist::default();
        low.record(3);
        e.merge(&low);
        assert_eq!((e.first, e.get(3), e.get(bucket_of(300))), (3, 1, 1));
        // merge: a longer one into a shorter one, and the other way round
        let mut long = Hist::default();
        long.record(40_000);
        let mut a = short.clone();
        a.merge(&long);
        let mut b = long.clone();
        b.merge(&short);
        assert_eq!(a.count(), 5);
        assert_eq!(a.summary(), b.summary());
        assert_eq!(a.get(bucket_of(40_000)), 1);
        // record past the end
        let mut c = short.clone();
        c.record(1_000_000);
        assert_eq!(c.count(), 5);
        assert_eq!(c.get(bucket_of(1_000_000)), 1);
        // delta against an earlier read that was longer (a re-keyed flow) or shorter
        assert_eq!(short.delta(&c).count(), 0);
        assert_eq!(c.delta(&short).count(), 1);
        let snap = Snapshot::of_hist(&c);
        assert_eq!(snap.delta_hist(&short).count(), 0);
        assert_eq!(snap.delta_sparse(&sparse(&raw), 360).count(), 0);
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

    /// Largest relative error of `h`'s percentiles against the exact
    /// nearest-rank ones of `v`, over many p: (error, p, exact, got).
    fn worst_error(h: &Hist, v: &[u32]) -> (f64, f64, f64, f64) {
        let mut sorted: Vec<f64> = v.iter().map(|&x| x as f64).collect();
        sorted.sort_by(f64::total_cmp);
        let mut worst = (0.0, 0.0, 0.0, 0.0);
        for p in [
            0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 100.0,
        ] {
            let exact = crate::analysis::stats::percentile_sorted(&sorted, p);
            let got = h.percentile(p);
            let err = if exact == 0.0 {
                got.abs()
            } else {
                (got - exact).abs() / exact
            };
            if err > worst.0 {
                worst = (err, p, exact, got);
            }
        }
        worst
    }

    /// Synthetic distributions: (name, samples) for many shapes, centres from
    /// 1 us to 20 s, spreads from 0.05% to 100%, 1 to 5000 samples.
    fn synthetic() -> Vec<(String, Vec<u32>)> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let mut out = Vec::new();
        for i in 0..3000 {
            let centre = (rng.gen_range(0.0f64..(2e7f64).ln())).exp();
            let cv = [0.0005, 0.002, 0.005, 0.01, 0.03, 0.1, 0.3, 1.0][i % 8];
            let n = [1, 2, 3, 7, 20, 100, 1000, 5000][(i / 8) % 8];
            let shape = (i / 64) % 7;
            let mut gauss = || {
                // Box-Muller
                let (u1, u2): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen_range(0.0..1.0));
                (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
            };
            let v: Vec<u32> = (0..n)
                .map(|_| {
                    let g = gauss();
                    let x = match shape {
                        0 => centre * (1.0 + cv * g),                             // normal
                        1 => centre * (cv * g).exp(),                             // log-normal
                        2 => centre * (1.0 + cv * (g.abs() * 0.5)), // half-normal tail
                        3 => centre * if g > 0.0 { 1.0 } else { 1.0 + 3.0 * cv }, // two points
                        4 => centre * (1.0 - cv * (1.0 - (g * 0.3).tanh().abs()).ln()), // exponential-like tail
                        5 => centre * (1.0 + cv * (g * 2.0).round()), // a few discrete values
                        _ => centre * (1.0 + cv * g.abs().powi(3)),   // heavy tail
                    };
                    x.clamp(0.0, (1u64 << 24) as f64) as u32
                })
                .collect();
            out.push((
                format!("shape {shape} centre {centre:.0} us cv {cv} n {n}"),
                v,
            ));
        }
        out
    }

    /// The estimator's promise (issue 15): every percentile within 1% of the
    /// exact one; by construction within MAX_REL_ERR (0.8%). Checked with the
    /// histogram alone (min/max from bucket bounds), with the exact min/max
    /// (as the kernel keeps them), and for an interval (a delta of two
    /// cumulative histograms with the window's min/max).
    #[test]
    fn estimator_within_one_percent_over_many_distributions() {
        let mut worst = (0.0, String::new(), (0.0, 0.0, 0.0, 0.0));
        let mut errs = Vec::new();
        for (name, v) in synthetic() {
            let mut exact_range = Hist::default();
            for &x in &v {
                exact_range.record(x);
            }
            let counts_only = Hist::from_counts(
                &(0..BUCKETS).map(|i| exact_range.get(i)).collect::<Vec<_>>(),
                exact_range.sum_us,
                None,
                None,
            );
            // an interval: 100 earlier samples elsewhere, then these
            let mut cum = Hist::default();
            for k in 0..100u32 {
                cum.record(1 + k * 997);
            }
            let before = cum.clone();
            for &x in &v {
                cum.record(x);
            }
            let mut interval = cum.delta(&before);
            interval.set_range(exact_range.min_us, exact_range.max_us);
            for (how, h) in [
                ("exact range", &exact_range),
                ("counts only", &counts_only),
                ("interval", &interval),
            ] {
                let w = worst_error(h, &v);
                errs.push(w.0);
                if w.0 > worst.0 {
                    worst = (w.0, format!("{name}, {how}"), w);
                }
            }
        }
        errs.sort_by(f64::total_cmp);
        let (err, name, (_, p, exact, got)) = worst;
        println!(
            "{} percentiles: median error {:.4}%, 99th {:.3}%, worst {:.3}% ({name}: p{p} exact {exact} got {got:.2})",
            errs.len() * 12,
            100.0 * errs[errs.len() / 2],
            100.0 * errs[errs.len() * 99 / 100],
            100.0 * err
        );
        assert!(
            err <= MAX_REL_ERR + 1e-12,
            "worst error {:.3}% > {:.1}%: {name}: p{p} exact {exact} got {got}",
            100.0 * err,
            100.0 * MAX_REL_ERR
        );
    }

    /// The cases linear interpolation alone gets wrong: two values at the
    /// two ends of one wide bucket, and a tight cluster (issue 15: 4.86 ms
    /// reported for an exact 4.95).
    #[test]
    fn adversarial_buckets_stay_within_bound() {
        let (lo, hi) = bucket_bounds(bucket_of(1 << 20));
        let (lo, hi) = (lo as u32, hi as u32 - 1);
        for (a, b, other) in [(lo, hi, 1u32), (lo, hi, 1 << 23)] {
            let mut v = vec![a; 50];
            v.extend(vec![b; 50]);
            v.push(other); // a sample elsewhere: min/max do not pin the bucket
            let mut h = Hist::default();
            v.iter().for_each(|&x| h.record(x));
            let (err, p, exact, got) = worst_error(&h, &v);
            assert!(err <= MAX_REL_ERR + 1e-12, "p{p}: exact {exact} got {got}");
        }
        let mut v: Vec<u32> = (0..200).map(|i| 4_900 + (i * 7919) % 100).collect();
        v.push(80);
        let mut h = Hist::default();
        v.iter().for_each(|&x| h.record(x));
        let (err, p, exact, got) = worst_error(&h, &v);
        assert!(err <= MAX_REL_ERR, "p{p}: exact {exact} got {got}");
    }

    /// The histogram's rank is the exact definition's rank, for every n and p
    /// (else a percentile could land in the neighbouring bucket).
    #[test]
    fn rank_is_the_exact_definitions_rank() {
        for n in 1..=400u64 {
            let sorted: Vec<f64> = (1..=n).map(|x| x as f64).collect();
            for p10 in 0..=1000 {
                let p = p10 as f64 / 10.0;
                let exact = crate::analysis::stats::percentile_sorted(&sorted, p);
                let rank = crate::analysis::stats::nearest_rank(p, n);
                assert_eq!(rank as f64, exact, "n {n} p {p}");
            }
        }
    }

    /// The C formula (bpf/rttscope.h, compiled for this host) and the Rust
    /// one give the same bucket for every value below 2^20 and around every
    /// bucket bound above it.
    #[test]
    fn c_and_rust_bucket_formulas_agree() {
        let dir = std::env::temp_dir().join(format!("rttscope-hist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("b.c");
        std::fs::write(
            &src,
            r#"#include <stdio.h>
#include "rttscope.h"
int main(void) {
	unsigned long long v;
	for (v = 0; v < (1ull << 20); v++)
		printf("%llu %u\n", v, rttscope_hist_bucket((__u32)v));
	for (v = 1ull << 20; v <= 0xffffffffull; v += 1 + v / 300)
		printf("%llu %u\n%llu %u\n", v - 1, rttscope_hist_bucket((__u32)(v - 1)), v, rttscope_hist_bucket((__u32)v));
	printf("%llu %u\n", 0xffffffffull, rttscope_hist_bucket(0xffffffffu));
	return 0;
}
"#,
        )
        .unwrap();
        let bpf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bpf");
        let exe = dir.join("b");
        let cc = ["clang-19", "clang", "cc"]
            .into_iter()
            .find(|c| {
                std::process::Command::new(c)
                    .arg("--version")
                    .output()
                    .is_ok()
            })
            .expect("a C compiler (scripts/setup.sh installs clang-19)");
        let st = std::process::Command::new(cc)
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-I")
            .arg(&bpf)
            .status()
            .unwrap();
        assert!(st.success(), "{cc} could not compile bpf/rttscope.h");
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out.stdout).unwrap();
        let mut n = 0;
        for line in text.lines() {
            let (v, b) = line.split_once(' ').unwrap();
            let (v, b): (u32, usize) = (v.parse().unwrap(), b.parse().unwrap());
            assert_eq!(bucket_of(v), b, "value {v}: Rust bucket vs C bucket");
            n += 1;
        }
        assert!(n > 1 << 20, "only {n} values compared");
    }
}
