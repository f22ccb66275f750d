//! Sparse exponential buckets (Prometheus native histograms, OpenTelemetry
//! exponential histograms) from rttscope's log-linear histogram.
//!
//! At schema `s` bucket `i` holds the values in `(2^((i-1)/2^s), 2^(i/2^s)]`
//! seconds (Prometheus' indexing; OpenTelemetry's index is `i - 1`, same
//! bounds). Schema 3 makes each bucket 2^(1/8) = 1.0905x wide, the ~1.1
//! factor Kubernetes and Cilium use.
//!
//! The mapping from the kernel's histogram ([`hist::bucket_bounds`]: integer
//! microseconds, 64 linear sub-buckets per power of two, at most 1.56% wide)
//! is exact where the bounds nest: a kernel bucket whose smallest and largest
//! possible sample (`lo` and `hi - 1` us) fall into the same exponential
//! bucket moves over whole, which is true of every bucket below 128 us (one
//! integer each) and of ~5 in 6 above. A kernel bucket that straddles an
//! exponential bound (at most one, as it is narrower than any exponential
//! bucket at schema <= 3) is split in proportion to the integer values on
//! each side of the bound (samples assumed uniform over the bucket's
//! integers): of its cumulative count `C`, `floor(C * f)` go below the bound
//! and the rest above. Computed from the series' cumulative histogram at
//! each render, both parts only ever grow, so a rate() never sees a reset,
//! and the bucket counts add up to `_count` exactly. Value 0 us goes to the
//! zero bucket; the kernel's open last bucket (>= 33.5 s) to the bucket of
//! its lower bound.
//!
//! Bucket limit: like Prometheus' `native_histogram_bucket_limit` (and
//! client_golang's `NativeHistogramMaxBucketNumber`), a series with more than
//! [`MAX_BUCKETS`] populated buckets is reduced to the next lower schema
//! (each pair of neighbouring buckets merged: the bounds of schema s-1 are
//! every other bound of schema s) until it fits. The lowered schema sticks to
//! the series (a series never switches back and forth).
use crate::analysis::hist::{self, Hist};

/// The schema used while a series fits: 2^(1/8) = 1.0905x per bucket.
pub const SCHEMA: i32 = 3;
/// Lowest schema Prometheus accepts.
pub const MIN_SCHEMA: i32 = -4;
/// Most populated buckets per series before the schema is lowered.
pub const MAX_BUCKETS: usize = 160;
/// The zero bucket's width (client_golang's default, 2^-128): only a sample
/// of 0 us falls into it.
pub const ZERO_THRESHOLD: f64 = 2.938_735_877_055_719e-39;

/// Upper bound (seconds) of bucket `i` at `schema`.
pub fn upper_bound(i: i32, schema: i32) -> f64 {
    (i as f64 * 2f64.powi(-schema)).exp2()
}

/// Index of the bucket holding `x` > 0 seconds at `schema`.
pub fn index_of(x: f64, schema: i32) -> i32 {
    if x.is_nan() || x <= 0.0 {
        return i32::MIN / 2; // the zero bucket's side: never a populated bucket
    }
    let mut i = (x.log2() * 2f64.powi(schema)).ceil() as i32;
    // log2 is not exact: put x on the right side of the bound it is near.
    if upper_bound(i - 1, schema) >= x {
        i -= 1;
    } else if upper_bound(i, schema) < x {
        i += 1;
    }
    i
}

/// One series' exponential buckets: absolute (not delta) counts of the
/// populated buckets, ascending by index.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Native {
    pub schema: i32,
    pub zero_count: u64,
    pub count: u64,
    pub sum_s: f64,
    pub buckets: Vec<(i32, u64)>,
}

/// The exponential buckets of a cumulative kernel histogram at `schema` or
/// lower (down to [`MIN_SCHEMA`]) so that at most [`MAX_BUCKETS`] are
/// populated.
pub fn from_hist(h: &Hist, schema: i32) -> Native {
    let mut s = schema;
    loop {
        let n = at_schema(h, s);
        if n.buckets.len() <= MAX_BUCKETS || s <= MIN_SCHEMA {
            return n;
        }
        s -= 1;
    }
}

/// The exponential buckets of `h` at exactly `schema`.
pub fn at_schema(h: &Hist, schema: i32) -> Native {
    let mut out: Vec<(i32, u64)> = Vec::new();
    let mut add = |i: i32, c: u64| {
        if c == 0 {
            return;
        }
        match out.last_mut() {
            Some((j, n)) if *j == i => *n += c,
            _ => out.push((i, c)),
        }
    };
    let mut zero = 0;
    for (k, c) in h.buckets() {
        let (lo, hi) = hist::bucket_bounds(k);
        if lo == 0.0 {
            zero += c;
            continue;
        }
        let a = index_of(lo * 1e-6, schema);
        if !hi.is_finite() {
            add(a, c);
            continue;
        }
        let b = index_of((hi - 1.0) * 1e-6, schema);
        if a == b {
            add(a, c);
            continue;
        }
        // Straddles the bound of bucket a: integers lo..=floor(bound) go below.
        let bound_us = (upper_bound(a, schema) * 1e6).floor();
        let below = (bound_us - lo + 1.0).clamp(0.0, hi - lo);
        let low = ((c as f64) * below / (hi - lo)).floor() as u64;
        add(a, low.min(c));
        add(b, c - low.min(c));
    }
    Native {
        schema,
        zero_count: zero,
        count: h.count(),
        sum_s: h.sum_us as f64 / 1e6,
        buckets: out,
    }
}

impl Native {
    /// Prometheus' spans and deltas: (spans as (offset, length), deltas).
    /// The first span's offset is the first index; each later one's is the
    /// gap of empty buckets before it.
    pub fn spans_deltas(&self) -> (Vec<(i32, u32)>, Vec<i64>) {
        let mut spans: Vec<(i32, u32)> = Vec::new();
        let mut deltas = Vec::with_capacity(self.buckets.len());
        let mut prev_idx: Option<i32> = None;
        let mut prev_count = 0i64;
        for &(i, c) in &self.buckets {
            match prev_idx {
                Some(p) if i == p + 1 => spans.last_mut().expect("a span is open").1 += 1,
                Some(p) => spans.push((i - p - 1, 1)),
                None => spans.push((i, 1)),
            }
            deltas.push(c as i64 - prev_count);
            prev_count = c as i64;
            prev_idx = Some(i);
        }
        (spans, deltas)
    }

    /// OpenTelemetry's dense positive buckets: (offset, counts), where
    /// `counts[j]` holds OTel index `offset + j` = Prometheus index `offset + j + 1`.
    pub fn otel_dense(&self) -> (i32, Vec<u64>) {
        let (Some(&(first, _)), Some(&(last, _))) = (self.buckets.first(), self.buckets.last())
        else {
            return (0, Vec::new());
        };
        let mut counts = vec![0u64; (last - first + 1) as usize];
        for &(i, c) in &self.buckets {
            counts[(i - first) as usize] = c;
        }
        (first - 1, counts)
    }

    /// The q-quantile (0..1) as Prometheus' histogram_quantile computes it
    /// for a native histogram: exponential interpolation inside the bucket
    /// (tests and docs compare with it).
    pub fn quantile(&self, q: f64) -> f64 {
        let rank = q * self.count as f64;
        let mut acc = self.zero_count as f64;
        if rank <= acc {
            return 0.0;
        }
        for &(i, c) in &self.buckets {
            if acc + c as f64 >= rank {
                let lo = upper_bound(i - 1, self.schema);
                let hi = upper_bound(i, self.schema);
                let frac = (rank - acc) / c as f64;
                return lo * (hi / lo).powf(frac);
            }
            acc += c as f64;
        }
        self.buckets
            .last()
            .map_or(0.0, |&(i, _)| upper_bound(i, self.schema))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist_of(vals: &[u32]) -> Hist {
        let mut h = Hist::default();
        for &v in vals {
            h.record(v);
        }
        h
    }

    #[test]
    fn index_and_bounds_agree() {
        for s in [-4, -1, 0, 1, 3, 8] {
            // Indices of 2^-60 .. 2^60 s.
            let lim = (60.0 * 2f64.powi(s)) as i32;
            for i in -lim..lim {
                let ub = upper_bound(i, s);
                assert_eq!(index_of(ub, s), i, "upper bound of {i} at {s}");
                assert_eq!(index_of(ub * 1.000_000_01, s), i + 1, "{i} at {s}");
            }
        }
        assert_eq!(index_of(1.0, 3), 0);
        // Schema 3: each bucket 2^(1/8) wide.
        let w = upper_bound(1, 3) / upper_bound(0, 3);
        assert!((w - 1.0905).abs() < 1e-4, "{w}");
    }

    /// Every bucket's count equals the number of samples whose value is in
    /// its bounds, but for the samples of the (at most two) kernel buckets
    /// that straddle its edges; totals are exact.
    #[test]
    fn mapping_is_exact_where_bounds_nest_and_totals_always() {
        let mut vals = Vec::new();
        let mut v = 1u32;
        while v < 5_000_000 {
            vals.push(v);
            vals.push(v + 3);
            v = v * 103 / 100 + 1;
        }
        vals.push(0);
        let h = hist_of(&vals);
        let n = at_schema(&h, SCHEMA);
        assert_eq!(n.count, vals.len() as u64);
        assert_eq!(
            n.zero_count + n.buckets.iter().map(|b| b.1).sum::<u64>(),
            n.count,
            "bucket counts add up to _count"
        );
        assert_eq!(n.zero_count, 1);
        for &(i, c) in &n.buckets {
            let (lo, hi) = (upper_bound(i - 1, SCHEMA), upper_bound(i, SCHEMA));
            let exact = vals
                .iter()
                .filter(|&&v| v > 0 && (v as f64 * 1e-6) > lo && (v as f64 * 1e-6) <= hi)
                .count() as u64;
            // The kernel bucket holding an edge, if it straddles the edge.
            let straddler = |e: f64| {
                let k = hist::bucket_of((e * 1e6).floor() as u32);
                let (klo, khi) = hist::bucket_bounds(k);
                if index_of(klo * 1e-6, SCHEMA) != index_of((khi - 1.0) * 1e-6, SCHEMA) {
                    h.get(k)
                } else {
                    0
                }
            };
            let slack = straddler(lo) + straddler(hi);
            // Below 128 us every kernel bucket is one integer: slack 0, exact.
            assert!(
                c.abs_diff(exact) <= slack,
                "bucket {i} ({lo}..{hi}]: {c} vs {exact}, slack {slack}"
            );
            if hi < 127e-6 {
                assert_eq!(slack, 0);
            }
        }
    }

    #[test]
    fn split_parts_only_grow() {
        // The first kernel bucket above 200 us that straddles a schema-3 bound.
        let k = (0..hist::BUCKETS - 1)
            .find(|&k| {
                let (lo, hi) = hist::bucket_bounds(k);
                lo > 200.0 && index_of(lo * 1e-6, 3) != index_of((hi - 1.0) * 1e-6, 3)
            })
            .expect("a straddling kernel bucket");
        let (lo, _) = hist::bucket_bounds(k);
        let mut h = Hist::default();
        let mut last = (0, 0);
        for _ in 0..50 {
            h.record(lo as u32);
            let n = at_schema(&h, 3);
            assert_eq!(n.buckets.len().min(2), n.buckets.len());
            let a = n.buckets.first().map_or(0, |b| b.1);
            let b = if n.buckets.len() == 2 {
                n.buckets[1].1
            } else {
                0
            };
            assert!(a + b == n.count && a >= last.0 && b >= last.1, "{n:?}");
            last = (a, b);
        }
    }

    #[test]
    fn wide_ranges_reduce_the_schema() {
        // 1 us .. 30 s at 1.5% steps: about 8 x 25 = 200 populated buckets at schema 3.
        let mut vals = Vec::new();
        let mut v = 1.0f64;
        while v < 30e6 {
            vals.push(v as u32);
            v *= 1.015;
        }
        let h = hist_of(&vals);
        assert!(at_schema(&h, 3).buckets.len() > MAX_BUCKETS);
        let n = from_hist(&h, SCHEMA);
        assert!(
            n.schema < SCHEMA && n.buckets.len() <= MAX_BUCKETS,
            "{}",
            n.schema
        );
        assert_eq!(n.buckets.iter().map(|b| b.1).sum::<u64>(), n.count);
        // The lower schema's buckets are pairs of the higher one's merged.
        let hi = at_schema(&h, n.schema + 1);
        let mut merged: Vec<(i32, u64)> = Vec::new();
        for &(i, c) in &hi.buckets {
            let j = (i - 1).div_euclid(2) + 1;
            match merged.last_mut() {
                Some((k, m)) if *k == j => *m += c,
                _ => merged.push((j, c)),
            }
        }
        let diff: u64 = merged
            .iter()
            .zip(&n.buckets)
            .map(|(a, b)| {
                assert_eq!(a.0, b.0);
                a.1.abs_diff(b.1)
            })
            .sum();
        assert!(diff <= 4, "merged pairs differ by {diff}");
    }

    #[test]
    fn spans_deltas_and_otel_layout() {
        let n = Native {
            schema: 3,
            zero_count: 0,
            count: 10,
            sum_s: 1.0,
            buckets: vec![(-5, 2), (-4, 3), (-1, 4), (2, 1)],
        };
        let (spans, deltas) = n.spans_deltas();
        assert_eq!(spans, vec![(-5, 2), (2, 1), (2, 1)]);
        assert_eq!(deltas, vec![2, 1, 1, -3]);
        let (off, counts) = n.otel_dense();
        assert_eq!(off, -6);
        assert_eq!(counts, vec![2, 3, 0, 0, 4, 0, 0, 1]);
    }

    #[test]
    fn quantiles_within_a_bucket_width() {
        let vals: Vec<u32> = (1..=10_000).map(|i| 1000 + i * 3).collect();
        let n = from_hist(&hist_of(&vals), SCHEMA);
        for q in [0.5, 0.99] {
            let exact = vals[((q * vals.len() as f64).ceil() as usize) - 1] as f64 * 1e-6;
            let got = n.quantile(q);
            assert!((got / exact - 1.0).abs() < 0.05, "q{q}: {got} vs {exact}");
        }
    }
}
