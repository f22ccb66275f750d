//! Percentile maths shared by every view: exact percentiles over samples,
//! a streaming HDR-histogram recorder for long runs, and a netperf-style
//! log-linear histogram for comparing with what netperf itself reports.
//!
//! All public values are microseconds as `f64` unless a name says otherwise.
//!
//! # Exact percentile definition
//!
//! [`percentile_sorted`], the one percentile function of exact samples every command uses, has
//! the *nearest-rank* definition: the p-th
//! percentile of `n` sorted samples is the smallest sample `x` such that at
//! least `p`% of the samples are `<= x`, i.e. the sample at 1-based rank
//! `ceil(p/100 * n)` (rank 1 for p = 0). It always returns one of the samples
//! (no interpolation), so `min <= p50 <= p90 <= p99 <= max` holds exactly.
//! That rank is one function, [`nearest_rank`]. The other `percentile` functions take the same
//! rank in bucketed data (the kernel's log-linear histogram, [`hdr_percentile`] for
//! [`HdrRecorder`]) or are lenses `bucket` shows beside it on purpose (netperf's histogram walk,
//! the cloud aligner's interpolation in `analysis::dist`, Prometheus' `histogram_quantile` that
//! the exporter's tests compare with).
//!
//! # One summary
//!
//! [`Summary`] is the one summary type: probe, compare and the lab compute it from exact samples
//! (through `ViewSummary::of_samples`), observe from its histograms (`Hist::summary`, the same
//! rank taken in the buckets, no stddev). What else carries statistics is a format, not another
//! summary:
//! - observe's records write a `Summary` as `n`, `min_us`, ..., `max_us` (no stddev), the
//!   schema's `HistSummary` (`analysis::records`);
//! - `analysis::results::ViewSummary`: the result file's per-view summary (its schema): optional
//!   statistics, `method`, `extra`, filled from a `Summary`;
//! - `analysis::records::ViewStats`: a table row's cells, a `Summary` plus TCP's srtt and
//!   retransmissions;
//! - irtt's `Stats` (active/irtt): irtt's own JSON, field for field, for irtt compatibility.
use hdrhistogram::Histogram;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// NaN (an empty summary) as JSON `null`, and back.
mod nan_null {
    use super::*;
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_nan() {
            s.serialize_none()
        } else {
            s.serialize_f64(*v)
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// Summary of a set of RTT samples, all in microseconds: of the exact samples
/// ([`Summary::from_sorted`]) or of a histogram of them (`analysis::hist::Hist::summary`). NaN: a
/// value not known (none for an empty set; a histogram's `stddev`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Summary {
    pub n: u64,
    #[serde(with = "nan_null")]
    pub min: f64,
    #[serde(with = "nan_null")]
    pub mean: f64,
    #[serde(with = "nan_null")]
    pub p50: f64,
    #[serde(with = "nan_null")]
    pub p90: f64,
    #[serde(with = "nan_null")]
    pub p99: f64,
    #[serde(with = "nan_null")]
    pub max: f64,
    /// Population standard deviation (divide by n, as netperf and ping's mdev do).
    #[serde(with = "nan_null")]
    pub stddev: f64,
}

/// Equal when every value is, a value not known (NaN) equal to another not known.
impl PartialEq for Summary {
    fn eq(&self, o: &Self) -> bool {
        let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
        self.n == o.n
            && same(self.min, o.min)
            && same(self.mean, o.mean)
            && same(self.p50, o.p50)
            && same(self.p90, o.p90)
            && same(self.p99, o.p99)
            && same(self.max, o.max)
            && same(self.stddev, o.stddev)
    }
}

impl Summary {
    /// The summary of an empty set: n = 0, every value NaN (serialized as null).
    pub fn empty() -> Self {
        Summary {
            n: 0,
            min: f64::NAN,
            mean: f64::NAN,
            p50: f64::NAN,
            p90: f64::NAN,
            p99: f64::NAN,
            max: f64::NAN,
            stddev: f64::NAN,
        }
    }

    /// Exact summary of samples in microseconds (order does not matter).
    pub fn from_us(samples: &[f64]) -> Self {
        Self::from_sorted(&sorted(samples))
    }

    /// Exact summary of samples already sorted ascending (see [`sorted`]).
    pub fn from_sorted(v: &[f64]) -> Self {
        if v.is_empty() {
            return Self::empty();
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        Summary {
            n: v.len() as u64,
            min: v[0],
            mean,
            p50: percentile_sorted(v, 50.0),
            p90: percentile_sorted(v, 90.0),
            p99: percentile_sorted(v, 99.0),
            max: v[v.len() - 1],
            stddev: var.sqrt(),
        }
    }

    /// Exact summary of samples in nanoseconds.
    pub fn from_ns(samples: &[u64]) -> Self {
        let us: Vec<f64> = samples.iter().map(|&x| x as f64 / 1e3).collect();
        Self::from_us(&us)
    }
}

/// The samples without NaN, sorted ascending: what [`percentile_sorted`] takes.
pub fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Nearest-rank percentile of samples already sorted ascending; NaN when empty.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[nearest_rank(p, sorted.len() as u64) as usize - 1]
}

/// The one percentile definition (docs/results.md): the 1-based rank of the p-th percentile
/// (`p` in 0..=100, clamped) of `n` >= 1 samples sorted ascending, ceil(p/100 * n), at least 1.
/// [`percentile_sorted`] takes the sample of that rank, and a histogram the bucket that holds it
/// (`crate::analysis::hist::Hist::percentile`).
pub fn nearest_rank(p: f64, n: u64) -> u64 {
    let p = p.clamp(0.0, 100.0);
    // computed with a small tolerance so that e.g. 0.9 * 100 is 90, not 90.00000000000001
    (((p / 100.0) * n as f64 - 1e-9).ceil().max(1.0) as u64).min(n)
}

/// The p-th percentile (`p` in 0..=100) of an HDR histogram: the bucket that holds the sample
/// of [`nearest_rank`], its highest equivalent value (its lowest for p = 0), as hdrhistogram's
/// `value_at_quantile` reads a bucket, so within the histogram's precision of the exact
/// percentile; 0 when empty. The rank is ours, not `value_at_quantile`'s (its p7 of 100 samples
/// takes rank ceil(0.07 * 100) = 8, as 0.07 * 100 is 7.000000000000001 in floating point).
pub fn hdr_percentile(h: &Histogram<u64>, p: f64) -> u64 {
    let rank = nearest_rank(p, h.len());
    let mut seen = 0;
    let value = h
        .iter_recorded()
        .find(|v| {
            seen += v.count_since_last_iteration();
            seen >= rank
        })
        .map_or(h.max(), |v| v.value_iterated_to());
    match p <= 0.0 {
        true => h.lowest_equivalent(value),
        false => h.highest_equivalent(value),
    }
}

/// Streaming recorder for long runs: an HDR histogram over nanoseconds,
/// 1 ns .. 1 hour, 3 significant digits (relative error <= 0.1%), plus exact
/// min/max/mean/stddev kept alongside.
#[derive(Debug, Clone)]
pub struct HdrRecorder {
    hist: Histogram<u64>,
    sum: f64,
    sumsq: f64,
    /// Values above the histogram's range (recorded as the maximum).
    pub saturated: u64,
}

impl Default for HdrRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl HdrRecorder {
    const HIGH_NS: u64 = 3_600_000_000_000;

    pub fn new() -> Self {
        HdrRecorder {
            hist: Histogram::new_with_bounds(1, Self::HIGH_NS, 3).expect("valid HDR bounds"),
            sum: 0.0,
            sumsq: 0.0,
            saturated: 0,
        }
    }

    pub fn record_ns(&mut self, ns: u64) {
        let v = ns.max(1);
        if v > Self::HIGH_NS {
            self.saturated += 1;
        }
        self.hist.saturating_record(v);
        let us = ns as f64 / 1e3;
        self.sum += us;
        self.sumsq += us * us;
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Percentile (`p` in 0..=100) in microseconds; NaN when empty ([`hdr_percentile`]).
    pub fn percentile_us(&self, p: f64) -> f64 {
        if self.hist.is_empty() {
            return f64::NAN;
        }
        hdr_percentile(&self.hist, p) as f64 / 1e3
    }

    pub fn summary(&self) -> Summary {
        let n = self.count();
        if n == 0 {
            return Summary::empty();
        }
        let mean = self.sum / n as f64;
        let var = (self.sumsq / n as f64 - mean * mean).max(0.0);
        Summary {
            n,
            min: self.hist.min() as f64 / 1e3,
            mean,
            p50: self.percentile_us(50.0),
            p90: self.percentile_us(90.0),
            p99: self.percentile_us(99.0),
            max: self.hist.max() as f64 / 1e3,
            stddev: var.sqrt(),
        }
    }
}

/// A netperf-style log-linear histogram (netperf `src/hist.h`, `HIST_add`,
/// `HIST_get_percentile` in `src/netlib.c`), reproduced so rttscope can report
/// the percentiles netperf would have printed for the same samples.
///
/// Bucketing: whole microseconds (netperf's `delta_micro` truncates), eight
/// decades (1 us, 10 us, ... 10 s) of 100 buckets each; within a decade the
/// value is divided by 10 repeatedly in single precision until it is below 10
/// and then multiplied by 10 and truncated to pick the bucket, as netperf does
/// (for every whole-microsecond value below 10 s this equals integer bucketing:
/// bucket width = 1/100 of the decade's top, checked exhaustively). Values of
/// 100 s and more go to an overflow count ("ridiculous").
///
/// Percentile walk: `num = trunc(total * p)`; 0 gives 0. Buckets are walked
/// decade by decade; in the first bucket where the running count reaches
/// `num` the result is `trunc((i + (num - last) / (current - last)) * scale / 10)`
/// with `scale` the decade's unit, i.e. linear interpolation inside the
/// bucket, evaluated in double precision in netperf's order (so an exact
/// 199 can come out as 198.99999 and truncate to 198, as in netperf). A result that
/// truncates to 0 (below 1 us) makes netperf continue with the next decade and, those
/// being empty, report 100 s; we answer 0 there instead (issue 26.7). Past every decade
/// the answer is 100 s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetperfHist {
    /// 8 decades x 100 buckets.
    buckets: Vec<u32>,
    ridiculous: u64,
    total: u64,
}

impl Default for NetperfHist {
    fn default() -> Self {
        Self::new()
    }
}

impl NetperfHist {
    const PER_DECADE: usize = 100;
    const DECADES: usize = 8;
    const BASE: f32 = 10.0;

    pub fn new() -> Self {
        NetperfHist {
            buckets: vec![0; Self::PER_DECADE * Self::DECADES],
            ridiculous: 0,
            total: 0,
        }
    }

    /// Record a value in whole microseconds.
    pub fn record_us(&mut self, us: u64) {
        self.total += 1;
        if us > i32::MAX as u64 {
            self.ridiculous += 1;
            return;
        }
        let mut val = us as i32 as f32;
        for decade in 0..Self::DECADES {
            if decade > 0 {
                val /= 10.0;
            }
            if val < 10.0 {
                let idx = ((val * Self::BASE) as usize).min(Self::PER_DECADE - 1);
                let b = &mut self.buckets[decade * Self::PER_DECADE + idx];
                *b = b.saturating_add(1);
                return;
            }
        }
        self.ridiculous += 1;
    }

    /// Record a value in nanoseconds, truncated to whole microseconds as netperf does.
    pub fn record_ns(&mut self, ns: u64) {
        self.record_us(ns / 1000);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// Values of 100 s and more.
    pub fn overflow(&self) -> u64 {
        self.ridiculous
    }

    /// netperf's `HIST_get_percentile`; `p` is a fraction in 0..=1 (0.5 for P50),
    /// result in whole microseconds.
    pub fn percentile_us(&self, p: f64) -> u64 {
        let num = (self.total as f64 * p) as i64;
        if num <= 0 {
            return 0;
        }
        let mut current: i64 = 0;
        let mut scale = 1.0f64;
        for decade in 0..Self::DECADES {
            let row = &self.buckets[decade * Self::PER_DECADE..(decade + 1) * Self::PER_DECADE];
            for (i, &c) in row.iter().enumerate() {
                let last = current;
                current += c as i64;
                if current >= num {
                    let frac = if current > last {
                        (num - last) as f64 / (current - last) as f64
                    } else {
                        0.0
                    };
                    let result = ((i as f64 + frac) * scale / Self::BASE as f64) as i64;
                    // Reached in this decade: the answer is here, even when it truncates to
                    // 0 (below 1 us). netperf goes on to the next decades and, all of them
                    // empty, reports 100 s (issue 26.7); we do not.
                    return result.max(0) as u64;
                }
            }
            scale *= 10.0;
        }
        100_000_000
    }

    /// Per-decade counts in netperf's report layout (`HIST_report`): 8 rows of 10.
    pub fn report_rows(&self) -> Vec<[u64; 10]> {
        (0..Self::DECADES)
            .map(|d| {
                let mut row = [0u64; 10];
                for (j, r) in row.iter_mut().enumerate() {
                    let s = d * Self::PER_DECADE + j * 10;
                    *r = self.buckets[s..s + 10].iter().map(|&x| x as u64).sum();
                }
                row
            })
            .collect()
    }
}

/// P50/P90/P99 from a [`NetperfHist`], whole microseconds, as netperf prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetperfPercentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
}

impl NetperfPercentiles {
    pub fn of(h: &NetperfHist) -> Self {
        NetperfPercentiles {
            p50: h.percentile_us(0.50),
            p90: h.percentile_us(0.90),
            p99: h.percentile_us(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile_sorted(&v, 50.0), 50.0);
        assert_eq!(percentile_sorted(&v, 90.0), 90.0);
        assert_eq!(percentile_sorted(&v, 99.0), 99.0);
        assert_eq!(percentile_sorted(&v, 100.0), 100.0);
        assert_eq!(percentile_sorted(&v, 0.0), 1.0);
        assert_eq!(percentile_sorted(&sorted(&[3.0, 1.0, 2.0]), 50.0), 2.0);
        assert_eq!(percentile_sorted(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.0);
        assert_eq!(percentile_sorted(&[7.0], 99.0), 7.0);
        assert!(percentile_sorted(&[], 50.0).is_nan());
    }

    #[test]
    fn summary_exact() {
        let s = Summary::from_us(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.n, 8);
        assert_eq!(s.min, 2.0);
        assert_eq!(s.max, 9.0);
        assert_eq!(s.mean, 5.0);
        assert_eq!(s.stddev, 2.0);
        assert_eq!(s.p50, 4.0);
        assert_eq!(s.p99, 9.0);
        let e = Summary::from_us(&[]);
        assert_eq!(e.n, 0);
        assert!(e.p50.is_nan());
        let ns = Summary::from_ns(&[1000, 3000]);
        assert_eq!(ns.mean, 2.0);
    }

    #[test]
    fn summary_serializes() {
        let s = Summary::from_us(&[1.0, 2.0]);
        let j = serde_json::to_string(&s).unwrap();
        let back: Summary = serde_json::from_str(&j).unwrap();
        assert_eq!(s, back);
        let e = serde_json::to_string(&Summary::empty()).unwrap();
        assert!(e.contains("\"p50\":null"), "{e}");
        let back: Summary = serde_json::from_str(&e).unwrap();
        assert!(back.p50.is_nan() && back.n == 0);
    }

    #[test]
    fn hdr_close_to_exact() {
        let mut r = HdrRecorder::new();
        let mut us = Vec::new();
        for i in 0..10_000u64 {
            let ns = 20_000 + (i * 7919) % 80_000;
            r.record_ns(ns);
            us.push(ns as f64 / 1e3);
        }
        let exact = Summary::from_us(&us);
        let s = r.summary();
        assert_eq!(s.n, 10_000);
        for (a, b) in [
            (s.p50, exact.p50),
            (s.p90, exact.p90),
            (s.p99, exact.p99),
            (s.min, exact.min),
            (s.max, exact.max),
        ] {
            assert!((a - b).abs() / b < 0.002, "hdr {a} vs exact {b}");
        }
        assert!((s.mean - exact.mean).abs() < 1e-6);
        assert!((s.stddev - exact.stddev).abs() / exact.stddev < 1e-6);
        assert!(HdrRecorder::new().percentile_us(50.0).is_nan());
    }

    /// Past `--max-samples` a probe's percentiles take the exact definition's rank in the
    /// histogram: the p7 of 1..=100 ms is 7 ms (rank 7), not 8 ms (hdrhistogram's own rank,
    /// ceil(0.07 * 100) = 8 in floating point), each within the histogram's 0.1%.
    #[test]
    fn hdr_takes_the_nearest_rank() {
        let mut r = HdrRecorder::new();
        for ms in 1..=100u64 {
            r.record_ns(ms * 1_000_000);
        }
        let exact: Vec<f64> = (1..=100).map(|ms| ms as f64 * 1e3).collect();
        for p in [0.0, 1.0, 7.0, 14.0, 50.0, 55.0, 90.0, 99.0, 99.9, 100.0] {
            let (got, want) = (r.percentile_us(p), percentile_sorted(&exact, p));
            assert!((got - want).abs() / want < 0.001, "p{p}: {got} vs {want}");
        }
        // an empty histogram reads 0, as value_at_quantile did (the lab emulator's lateness)
        let empty = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for p in [0.0, 50.0, 99.0, 100.0] {
            assert_eq!(hdr_percentile(&empty, p), 0, "p{p}");
            assert_eq!(empty.value_at_quantile(p / 100.0), 0, "p{p}");
        }
        // random sets: the bucket of the exact percentile's sample
        let mut x = 12345u64;
        for n in [1usize, 2, 3, 7, 100, 1000, 4321] {
            let mut r = HdrRecorder::new();
            let mut us = Vec::new();
            for _ in 0..n {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let ns = 1_000 + (x >> 33) % 50_000_000;
                r.record_ns(ns);
                us.push(ns as f64 / 1e3);
            }
            let sorted = sorted(&us);
            for p10 in 0..=1000 {
                let p = p10 as f64 / 10.0;
                let (got, want) = (r.percentile_us(p), percentile_sorted(&sorted, p));
                assert!(
                    (got - want).abs() / want < 0.001,
                    "n {n} p{p}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn netperf_buckets() {
        let mut h = NetperfHist::new();
        h.record_us(5);
        h.record_us(57);
        h.record_us(570);
        h.record_us(100_000_000_000);
        let rows = h.report_rows();
        assert_eq!(rows[0][5], 1);
        assert_eq!(rows[1][5], 1);
        assert_eq!(rows[2][5], 1);
        assert_eq!(h.overflow(), 1);
        assert_eq!(h.count(), 4);
        // 570 us: 100 us decade, bucket 57 (10 us wide).
        assert_eq!(h.buckets[2 * 100 + 57], 1);
        // 9_999_999 us: the 1 s decade's last bucket.
        let mut h = NetperfHist::new();
        h.record_us(9_999_999);
        assert_eq!(h.buckets[6 * 100 + 99], 1);
    }

    #[test]
    fn netperf_percentile_walk() {
        // 100 samples of 95 us: ten_usec decade, bucket 95 (width 1 us).
        let mut h = NetperfHist::new();
        for _ in 0..100 {
            h.record_us(95);
        }
        // num = 50; bucket 95 holds 0..100 -> (95 + 50/100) * 10 / 10 = 95.5 -> 95
        assert_eq!(h.percentile_us(0.5), 95);
        assert_eq!(h.percentile_us(0.99), 95);
        // Spread over 100..199 us: hundred_usec decade, buckets of 10 us.
        let mut h = NetperfHist::new();
        for us in 100..200 {
            h.record_us(us);
        }
        // num = 50: buckets 10..19 hold 10 each -> reaches 50 in bucket 14 with
        // last = 40: (14 + 10/10) * 100 / 10 = 150
        assert_eq!(h.percentile_us(0.5), 150);
        // num = 90 -> bucket 18, (18 + 1) * 10 = 190
        assert_eq!(h.percentile_us(0.9), 190);
        // num = trunc(0.99 * 100) = 99 -> bucket 19, last 90: (19 + 0.9) * 100 / 10
        // = 198.99999999999997 in doubles, truncated: 198 (what netperf prints too).
        assert_eq!(h.percentile_us(0.99), 198);
        assert_eq!(NetperfHist::new().percentile_us(0.5), 0);
    }

    #[test]
    fn netperf_close_to_exact_for_realistic_data() {
        let mut h = NetperfHist::new();
        let mut v = Vec::new();
        for i in 0..5000u64 {
            let us = 40 + (i * 31) % 200;
            h.record_us(us);
            v.push(us as f64);
        }
        let exact = percentile_sorted(&sorted(&v), 50.0);
        let np = h.percentile_us(0.5) as f64;
        assert!(
            (np - exact).abs() / exact < 0.1,
            "netperf {np} exact {exact}"
        );
        let p = NetperfPercentiles::of(&h);
        assert!(p.p50 <= p.p90 && p.p90 <= p.p99);
    }

    #[test]
    fn netperf_sub_microsecond_continues() {
        let mut h = NetperfHist::new();
        for _ in 0..10 {
            h.record_us(0);
        }
        // netperf's walk gives 0 in the unit decade and goes on; every later
        // decade is empty, so it falls through to 100 s. We stop at 0 (issue 26.7).
        assert_eq!(h.percentile_us(0.5), 0);
        // 60% zeros: p50 below 1 us, p95 the larger values' decade.
        let mut h = NetperfHist::new();
        for _ in 0..6 {
            h.record_us(0);
        }
        for _ in 0..4 {
            h.record_us(108);
        }
        assert_eq!(h.percentile_us(0.5), 0);
        assert!((100..=110).contains(&h.percentile_us(0.95)));
    }
}
