//! Cloud Monitoring distributions: bucket layouts, percentile aligners, alignment periods.
//!
//! The cloud RTT metric (`networking.googleapis.com/vm_flow/rtt`) is not a list of samples but a
//! `Distribution` value: a histogram of counts over a bucket layout (`BucketOptions`), read back
//! through an aligner such as `ALIGN_PERCENTILE_50`. This module reproduces that lens so a sample set
//! can be looked at the way the metric would report it.
//!
//! What the Google API documentation says (google.api.Distribution, Cloud Monitoring
//! "Percentiles and distribution-valued metrics", google.monitoring.v3.Aggregation), restated:
//!
//! - A layout has N buckets. Bucket 0 is the *underflow* bucket (only an upper bound), bucket N-1 the
//!   *overflow* bucket (only a lower bound), buckets 1..=N-2 are finite. Every bucket includes its
//!   lower bound and excludes its upper bound: `[lower, upper)`.
//! - `Linear { num_finite_buckets, width, offset }`: N = num_finite_buckets + 2;
//!   upper bound of bucket i (0 <= i < N-1) = offset + width * i;
//!   lower bound of bucket i (1 <= i < N) = offset + width * (i - 1). width > 0, num_finite_buckets > 0.
//! - `Exponential { num_finite_buckets, growth_factor, scale }`: N = num_finite_buckets + 2;
//!   upper bound (0 <= i < N-1) = scale * growth_factor^i;
//!   lower bound (1 <= i < N) = scale * growth_factor^(i - 1). growth_factor > 1, scale > 0.
//! - `Explicit { bounds }`: bounds strictly increasing, N = bounds.len() + 1;
//!   upper bound (0 <= i < N-1) = bounds[i]; lower bound (1 <= i < N) = bounds[i - 1].
//! - `bucket_counts` has N values: the underflow count first, then the finite buckets, then overflow.
//!   A distribution also carries count, mean, sum of squared deviations and optionally the range
//!   (min, max) of the population.
//! - Percentiles of a distribution: find the bucket that contains the p-th percentile from the
//!   cumulative counts; each bucket covers a *percentile range* [p_low, p_up] (the percentage of
//!   samples below the bucket, and below its upper bound); then interpolate linearly:
//!   `bucket_low + (bucket_up - bucket_low) * (p - p_low) / (p_up - p_low)`.
//!   The documented example (exponential, scale 1, growth factor 2, one sample in bucket 8 =
//!   [128, 256)) gives p50 = 192, p95 = 249.6, p99 = 254.72 (the page rounds to 254.7).
//!   The estimate depends only on the counts and the bucket widths, never on the measured values.
//! - Aligners: "all the data points in an alignment_period are mathematically grouped together,
//!   resulting in a single data point for each alignment_period with end timestamp at the end of the
//!   period". `ALIGN_PERCENTILE_99/95/50/05` apply to GAUGE and DELTA metrics with distribution
//!   values; the result is the given percentile of all data points in the period, a GAUGE of type
//!   DOUBLE. The minimum alignment period for the vm_flow metrics is 60 s (the seed note), which is
//!   our default.
//!
//! What the documentation does NOT say, and what rttscope therefore chooses (the same convention as
//! Prometheus' `histogram_quantile`):
//! - a percentile in the underflow bucket interpolates from 0 up to the bucket's upper bound when that
//!   bound is positive (RTTs are never negative), otherwise it is the upper bound;
//! - a percentile in the overflow bucket is the overflow bucket's lower bound (the largest finite
//!   bound), and is marked as a lower limit (`Percentile::open_above`);
//! - when the p-th percentile falls exactly on the boundary between two non-empty buckets, the lower
//!   bucket is used (its upper bound is returned);
//! - periods are aligned to the start of the recording (t = 0 s); periods without samples produce
//!   no point (a percentile of nothing does not exist).
//!
//! The `vm_flow/rtt` bucket layout is not published. The seed note only tells that its unit is the
//! millisecond and its smallest bucket is 0-1 ms ("virtually all the samples ... became counts in
//! that bucket. Thus the computed median ... of 0.5 milliseconds"). [`vm_flow_preset`] is an
//! ASSUMPTION built to match that: explicit bounds 0, 1, 2, 4, ... ms (a finite 0-1 ms bucket
//! followed by doubling buckets). Every parameter can be changed (`vm_flow:scale=..,growth=..,n=..`)
//! or replaced by any other layout.
//!
//! - [`layout`]: bucket layouts and their specs ([`api`]: in the REST API's JSON).
//! - [`distribution`]: counts over a layout and their percentiles.
//! - [`align`]: one distribution per alignment period.
//! - [`unit`], [`error`]: the values' unit, what can go wrong.
mod align;
mod api;
mod distribution;
mod error;
mod layout;
mod unit;

pub use align::{align, AlignedPoint, LiveAligner};
pub use api::{layout_from_file, layout_from_json, MAX_LAYOUT_FILE_BYTES};
pub use distribution::{Distribution, Percentile};
pub use error::DistError;
pub use layout::{vm_flow_preset, BucketOptions, MAX_BUCKETS};
pub use unit::ValueUnit;

/// The default alignment period (the smallest the vm_flow metrics offer).
pub const DEFAULT_ALIGNMENT_PERIOD_S: f64 = 60.0;

/// The percentiles the Cloud Monitoring aligners offer and rttscope prints by default.
pub const DEFAULT_PERCENTILES: [f64; 3] = [50.0, 95.0, 99.0];

/// Parse a percentile list such as `50,95,99` or `p50,p99.9`.
pub fn parse_percentiles(s: &str) -> Result<Vec<f64>, DistError> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let t = part.trim().trim_start_matches(['p', 'P']);
        let p: f64 = t.parse().map_err(|_| DistError::BadPercentile(f64::NAN))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(DistError::BadPercentile(p));
        }
        out.push(p);
    }
    Ok(out)
}

/// clap value parser for one `--percentile` value (use with `value_delimiter = ','`).
pub fn percentile_arg(s: &str) -> Result<f64, String> {
    match parse_percentiles(s).as_deref() {
        Ok([p]) => Ok(*p),
        _ => Err(format!(
            "'{s}' is not a percentile: use numbers from 0 to 100, e.g. 50,95,99"
        )),
    }
}

/// clap value parser for `--layout` (and `observe --cloud-layout`, `compare --layout`): a spec
/// ([`BucketOptions::parse`]) or `from:FILE`, the layout of a Cloud Monitoring file
/// ([`layout_from_file`]).
pub fn layout_arg(s: &str) -> Result<BucketOptions, String> {
    if let Some(path) = s.strip_prefix("from:") {
        return layout_from_file(std::path::Path::new(path));
    }
    BucketOptions::parse(s).map_err(|e| e.to_string())
}

/// clap value parser for `--layout-from FILE`.
pub fn layout_from_arg(s: &str) -> Result<BucketOptions, String> {
    layout_from_file(std::path::Path::new(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(scale: f64, growth: f64, n: u32) -> BucketOptions {
        BucketOptions::Exponential {
            num_finite_buckets: n,
            growth_factor: growth,
            scale,
        }
    }

    #[test]
    fn kernel_buckets_spread_over_cloud_bounds() {
        let layout = BucketOptions::parse("explicit:0,1,2,4").unwrap();
        let mut d = Distribution::new(layout.clone(), ValueUnit::Ms);
        // [960, 1024) us holds 40 values below 1 ms and 24 at or above it.
        d.add_spread_us(960.0, 1024.0, 64);
        assert_eq!(d.bucket_counts, vec![0, 40, 24, 0, 0]);
        // A kernel bucket inside one cloud bucket lands there whole.
        d.add_spread_us(1408.0, 1536.0, 5);
        assert_eq!(d.bucket_counts, vec![0, 40, 29, 0, 0]);
        assert_eq!(d.count, 69);
        // One-value buckets are exact; the counts always add up, whatever the split.
        let mut e = Distribution::new(layout, ValueUnit::Ms);
        e.add_spread_us(999.0, 1000.0, 3);
        assert_eq!(e.bucket_counts[1], 3);
        for n in 1..200u64 {
            let before = e.count;
            e.add_spread_us(1920.0, 2048.0, n);
            assert_eq!(e.count - before, n);
        }
        assert_eq!(e.bucket_counts.iter().sum::<u64>(), e.count);
        // An open-ended bucket goes in at its lower bound.
        e.add_spread_us(5000.0, f64::INFINITY, 2);
        assert_eq!(e.bucket_counts[4], 2);
    }

    #[test]
    fn documented_example_one_sample() {
        // Cloud Monitoring "Percentiles and distribution-valued metrics", case 1: exponential
        // scale 1, growth 2, 10 finite buckets, one sample in bucket 8 = [128, 256).
        let o = exp(1.0, 2.0, 10);
        assert_eq!(o.num_buckets(), 12);
        assert_eq!((o.lower(8), o.upper(8)), (128.0, 256.0));
        assert_eq!((o.lower(11), o.upper(0)), (1024.0, 1.0));
        let mut d = Distribution::new(o, ValueUnit::Ms);
        d.add(200.0);
        assert_eq!(d.bucket_counts[8], 1);
        let p = |q: f64| d.percentile(q).unwrap().unwrap();
        assert_eq!(p(50.0).bucket, 8);
        assert!((p(50.0).value - 192.0).abs() < 1e-9, "{:?}", p(50.0));
        assert!((p(95.0).value - 249.6).abs() < 1e-9, "{:?}", p(95.0));
        assert!((p(99.0).value - 254.72).abs() < 1e-9, "{:?}", p(99.0));
        assert_eq!((p(50.0).p_low, p(50.0).p_up), (0.0, 100.0));
    }

    #[test]
    fn interpolates_across_buckets_from_percentile_ranges() {
        // Ten samples: 4 in [4,8), 5 in [16,32), 1 in [256,512). Percentile ranges 0-40, 40-90, 90-100.
        let mut d = Distribution::new(exp(1.0, 2.0, 10), ValueUnit::Ms);
        for v in [5.0, 5.0, 6.0, 7.0, 20.0, 20.0, 20.0, 30.0, 31.0, 300.0] {
            d.add(v);
        }
        let p50 = d.percentile(50.0).unwrap().unwrap();
        assert_eq!((p50.p_low, p50.p_up), (40.0, 90.0));
        // 16 + 16 * (50 - 40) / (90 - 40) = 19.2
        assert!((p50.value - 19.2).abs() < 1e-9, "{p50:?}");
        let p95 = d.percentile(95.0).unwrap().unwrap();
        // 256 + 256 * (95 - 90) / 10 = 384
        assert!((p95.value - 384.0).abs() < 1e-9, "{p95:?}");
        // Exactly on the 40 % boundary: the lower bucket's upper bound.
        assert!((d.percentile(40.0).unwrap().unwrap().value - 8.0).abs() < 1e-9);
        assert!((d.percentile(0.0).unwrap().unwrap().value - 4.0).abs() < 1e-9);
        assert!((d.percentile(100.0).unwrap().unwrap().value - 512.0).abs() < 1e-9);
    }

    #[test]
    fn vm_flow_sub_millisecond_median_is_half_a_millisecond() {
        // The seed's artifact: RTTs of 0.1-0.3 ms all land in the 0-1 ms bucket, median 0.5 ms.
        let mut d = Distribution::new(vm_flow_preset(), ValueUnit::Ms);
        for i in 0..1000 {
            let ms = 0.1 + 0.2 * i as f64 / 999.0;
            d.add_us(ms * 1000.0);
        }
        assert_eq!(d.count, 1000);
        assert_eq!(d.bucket_counts[1], 1000, "{:?}", d.bucket_counts);
        assert_eq!(
            (d.bucket_options.lower(1), d.bucket_options.upper(1)),
            (0.0, 1.0)
        );
        let p50 = d.percentile(50.0).unwrap().unwrap();
        assert!((p50.value - 0.5).abs() < 1e-12, "{p50:?}");
        let p99 = d.percentile(99.0).unwrap().unwrap();
        assert!((p99.value - 0.99).abs() < 1e-12, "{p99:?}");
        assert!((d.mean - 0.2).abs() < 1e-9);
    }

    #[test]
    fn underflow_and_overflow() {
        let o = BucketOptions::parse("explicit:1,2,4").unwrap();
        assert_eq!(o.num_buckets(), 4);
        let mut d = Distribution::new(o, ValueUnit::Ms);
        for v in [0.2, 0.4, 0.6, 0.8] {
            d.add(v); // underflow (-inf, 1)
        }
        for v in [10.0, 20.0, 30.0, 40.0, 50.0, 60.0] {
            d.add(v); // overflow [4, inf)
        }
        assert_eq!(d.bucket_counts, vec![4, 0, 0, 6]);
        // Underflow: interpolated from 0 to the upper bound 1 over the range 0-40 %.
        let p20 = d.percentile(20.0).unwrap().unwrap();
        assert_eq!(p20.bucket, 0);
        assert!((p20.value - 0.5).abs() < 1e-12, "{p20:?}");
        assert!(!p20.open_above);
        // Overflow: the lower bound, flagged as a lower limit.
        let p99 = d.percentile(99.0).unwrap().unwrap();
        assert_eq!((p99.bucket, p99.value, p99.open_above), (3, 4.0, true));
        assert_eq!((d.min, d.max), (Some(0.2), Some(60.0)));
        // Negative bounds: the underflow bucket returns its upper bound.
        let mut n = Distribution::new(
            BucketOptions::parse("explicit:-5,5").unwrap(),
            ValueUnit::Ms,
        );
        n.add(-100.0);
        assert_eq!(n.percentile(50.0).unwrap().unwrap().value, -5.0);
        // Non-finite values are counted, not bucketed.
        d.add(f64::NAN);
        d.add(f64::INFINITY);
        assert_eq!((d.count, d.rejected), (10, 2));
    }

    #[test]
    fn empty_and_bad_percentiles() {
        let d = Distribution::new(vm_flow_preset(), ValueUnit::Ms);
        assert_eq!(d.percentile(50.0).unwrap(), None);
        assert!(d.percentile(101.0).is_err());
        assert!(d.percentile(-1.0).is_err());
    }

    #[test]
    fn bounds_follow_the_documented_formulas() {
        let l = BucketOptions::parse("linear:width=0.5,offset=1,n=4").unwrap();
        assert_eq!(l.num_buckets(), 6);
        let bounds: Vec<f64> = (1..6).map(|i| l.lower(i)).collect();
        assert_eq!(bounds, vec![1.0, 1.5, 2.0, 2.5, 3.0]);
        assert_eq!(l.index(0.99), 0);
        assert_eq!(l.index(1.0), 1);
        assert_eq!(l.index(1.49), 1);
        assert_eq!(l.index(1.5), 2);
        assert_eq!(l.index(3.0), 5);
        assert_eq!(l.index(1e9), 5);
        let e = BucketOptions::parse("exponential:scale=0.1,growth=10,n=5").unwrap();
        // Values exactly on a bound belong to the bucket above it, despite float rounding.
        for i in 1..6 {
            let b = e.lower(i);
            assert_eq!(e.index(b), i, "bound {b}");
            assert_eq!(e.index(b * (1.0 - 1e-12)), i - 1, "just below {b}");
        }
        assert_eq!(e.index(-3.0), 0);
        assert_eq!(e.index(0.0), 0);
        let x = BucketOptions::parse("explicit:0,1,2,5,10").unwrap();
        assert_eq!(
            [-1.0, 0.0, 0.5, 1.0, 4.9, 5.0, 10.0, 11.0].map(|v| x.index(v)),
            [0, 1, 1, 2, 3, 4, 5, 5]
        );
    }

    #[test]
    fn layout_specs_parse_and_round_trip() {
        let v = BucketOptions::parse("vm_flow").unwrap();
        assert_eq!(v, vm_flow_preset());
        assert_eq!(
            (v.lower(1), v.upper(1), v.upper(2), v.upper(3)),
            (0.0, 1.0, 2.0, 4.0)
        );
        assert_eq!(v.num_buckets(), 19);
        let v2 = BucketOptions::parse("vm_flow:scale=0.5,growth=4,n=3").unwrap();
        assert_eq!(
            v2,
            BucketOptions::Explicit {
                bounds: vec![0.0, 0.5, 2.0, 8.0, 32.0]
            }
        );
        for spec in [
            "exponential:scale=1,growth=2,n=64",
            "linear:width=1,offset=0,n=100",
            "explicit:0,1,2,5,10",
            "exp:growth_factor=1.5,scale=0.01,num_finite_buckets=40",
        ] {
            let o = BucketOptions::parse(spec).unwrap();
            assert_eq!(BucketOptions::parse(&o.spec()).unwrap(), o, "{spec}");
        }
        for bad in [
            "",
            "poisson",
            "exponential:scale=1,growth=1,n=3",
            "exponential:scale=0,growth=2,n=3",
            "exponential:scale=1,growth=2",
            "exponential:scale=1,growth=2,n=2.5",
            "linear:width=-1,n=3",
            "linear:width=1,n=0",
            "linear:width=1,n=20000",
            "explicit:",
            "explicit:1,1",
            "explicit:2,1",
            "explicit:1,x",
            "vm_flow:bogus=1",
            "exponential:scale=1,growth=10,n=400",
        ] {
            let e = BucketOptions::parse(bad);
            assert!(e.is_err(), "'{bad}' should be rejected, got {e:?}");
        }
    }

    #[test]
    fn merge_matches_adding_everything_to_one() {
        let o = vm_flow_preset();
        let (mut a, mut b, mut all) = (
            Distribution::new(o.clone(), ValueUnit::Ms),
            Distribution::new(o.clone(), ValueUnit::Ms),
            Distribution::new(o, ValueUnit::Ms),
        );
        for i in 0..100 {
            let v = (i as f64 * 0.37) % 13.0;
            let part = if i % 3 == 0 { &mut a } else { &mut b };
            part.add(v);
            all.add(v);
        }
        a.merge(&b).unwrap();
        assert_eq!(a.bucket_counts, all.bucket_counts);
        assert_eq!(a.count, all.count);
        assert!((a.mean - all.mean).abs() < 1e-9);
        assert!((a.sum_of_squared_deviation - all.sum_of_squared_deviation).abs() < 1e-6);
        assert_eq!((a.min, a.max), (all.min, all.max));
        let other = Distribution::new(BucketOptions::parse("explicit:1").unwrap(), ValueUnit::Ms);
        assert!(a.merge(&other).is_err());
    }

    #[test]
    fn alignment_groups_by_period() {
        let samples = vec![(0.0, 500.0), (59.9, 1500.0), (60.0, 3000.0), (185.0, 100.0)];
        let pts = align(samples, 60.0, &vm_flow_preset(), ValueUnit::Ms).unwrap();
        assert_eq!(pts.len(), 3, "{pts:?}");
        assert_eq!(
            (pts[0].start_s, pts[0].end_s, pts[0].distribution.count),
            (0.0, 60.0, 2)
        );
        assert_eq!((pts[1].start_s, pts[1].distribution.count), (60.0, 1));
        assert_eq!((pts[2].start_s, pts[2].end_s), (180.0, 240.0));
        // [2, 4) ms bucket, one sample: p50 = 3 ms.
        assert_eq!(
            pts[1].distribution.percentile(50.0).unwrap().unwrap().value,
            3.0
        );
        assert!(align(vec![], 0.0, &vm_flow_preset(), ValueUnit::Ms).is_err());
    }

    #[test]
    fn live_alignment_matches_batch_alignment() {
        let samples: Vec<(f64, f64)> = (0..500)
            .map(|i| (i as f64 * 0.7, 100.0 + (i * 37 % 5000) as f64))
            .collect();
        let batch = align(samples.clone(), 60.0, &vm_flow_preset(), ValueUnit::Ms).unwrap();
        let mut live = LiveAligner::new(vm_flow_preset(), ValueUnit::Ms, 60.0).unwrap();
        let mut got: Vec<AlignedPoint> = samples
            .iter()
            .filter_map(|&(t, us)| live.add(t, us))
            .collect();
        assert_eq!(
            live.current().unwrap().count,
            batch.last().unwrap().distribution.count
        );
        got.extend(live.flush());
        assert_eq!(got, batch);
        // A sample for a closed period is counted, not silently merged.
        let mut live = LiveAligner::new(vm_flow_preset(), ValueUnit::Ms, 1.0).unwrap();
        assert!(live.add(5.5, 100.0).is_none());
        assert!(live.add(2.0, 100.0).is_none());
        assert_eq!(live.late, 1);
        let p = live.add(6.0, 100.0).unwrap();
        assert_eq!((p.start_s, p.end_s, p.distribution.count), (5.0, 6.0, 1));
        assert!(LiveAligner::new(vm_flow_preset(), ValueUnit::Ms, -1.0).is_err());
    }

    #[test]
    fn api_bucket_options_read_and_write_back() {
        use serde_json::json;
        let cases = [
            (
                json!({"exponentialBuckets": {"numFiniteBuckets": 10, "growthFactor": 2, "scale": 1}}),
                exp(1.0, 2.0, 10),
            ),
            (
                json!({"linearBuckets": {"numFiniteBuckets": "4", "width": 0.5, "offset": "1"}}),
                BucketOptions::parse("linear:width=0.5,offset=1,n=4").unwrap(),
            ),
            (
                // offset omitted: the proto3 default 0.
                json!({"linearBuckets": {"numFiniteBuckets": 3, "width": 1}}),
                BucketOptions::parse("linear:width=1,offset=0,n=3").unwrap(),
            ),
            (
                json!({"explicitBuckets": {"bounds": [0, 1, 2, 4]}}),
                BucketOptions::parse("explicit:0,1,2,4").unwrap(),
            ),
        ];
        for (api, want) in cases {
            let got = BucketOptions::from_api(&api).unwrap();
            assert_eq!(got, want, "{api}");
            assert_eq!(BucketOptions::from_api(&got.to_api()).unwrap(), got);
        }
        assert_eq!(
            BucketOptions::from_api(&vm_flow_preset().to_api()).unwrap(),
            vm_flow_preset()
        );
        for (bad, says) in [
            (json!({}), "none of linearBuckets"),
            (
                json!({"linearBuckets": {"numFiniteBuckets": 3, "width": 1}, "explicitBuckets": {"bounds": [1]}}),
                "more than one",
            ),
            (
                json!({"exponentialBuckets": {"numFiniteBuckets": 3, "growthFactor": 1, "scale": 1}}),
                "growth must be > 1",
            ),
            (
                json!({"exponentialBuckets": {"numFiniteBuckets": 3, "growthFactor": 2}}),
                "scale must be > 0",
            ),
            (
                json!({"linearBuckets": {"numFiniteBuckets": 2.5, "width": 1}}),
                "numFiniteBuckets must be a whole number",
            ),
            (
                json!({"linearBuckets": {"numFiniteBuckets": "x", "width": 1}}),
                "linearBuckets.numFiniteBuckets is not a finite number",
            ),
            (
                json!({"explicitBuckets": {"bounds": [2, 1]}}),
                "strictly increasing",
            ),
            (
                json!({"explicitBuckets": {"bounds": [1, "NaN"]}}),
                "bounds[1] is not a finite number",
            ),
            (json!({"explicitBuckets": {"bounds": 3}}), "not an array"),
            (json!({"explicitBuckets": {}}), "at least one bound"),
            (json!([1]), "not an object"),
        ] {
            let e = BucketOptions::from_api(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn layout_from_a_cloud_file() {
        let doc = r#"{"timeSeries": [{"points": [{"value": {"distributionValue": {"count": "1",
            "bucketOptions": {"explicitBuckets": {"bounds": [0, 1, 2]}}, "bucketCounts": ["0", "1"]}}}]}]}"#;
        assert_eq!(
            layout_from_json(doc, "f.json").unwrap(),
            BucketOptions::parse("explicit:0,1,2").unwrap()
        );
        // JSON Lines (observe --format cloud-monitoring): the same layout on every line.
        let lines = format!("{}\n{}\n", doc.replace('\n', " "), doc.replace('\n', " "));
        assert!(layout_from_json(&lines, "f.json").is_ok());
        let two = doc.replace("]}]}", "]}, {\"points\": [{\"value\": {\"distributionValue\": {\"bucketOptions\": {\"explicitBuckets\": {\"bounds\": [5]}}}}}]}]}");
        let e = layout_from_json(&two, "f.json").unwrap_err();
        assert!(e.contains("more than one bucket layout"), "{e}");
        let e = layout_from_json(
            r#"{"timeSeries": [{"points": [{"value": {"doubleValue": 0.5}}]}]}"#,
            "d.json",
        )
        .unwrap_err();
        assert!(e.starts_with("d.json holds no distribution point"), "{e}");
        assert!(layout_from_json("{", "b.json")
            .unwrap_err()
            .starts_with("b.json is not JSON"));
        let e = layout_arg("from:/nonexistent/cloud.json").unwrap_err();
        assert!(e.starts_with("cannot read /nonexistent/cloud.json"), "{e}");
    }

    #[test]
    fn percentile_lists() {
        assert_eq!(
            parse_percentiles("50,95,99").unwrap(),
            vec![50.0, 95.0, 99.0]
        );
        assert_eq!(parse_percentiles("p5, p99.9").unwrap(), vec![5.0, 99.9]);
        assert!(parse_percentiles("50,101").is_err());
        assert!(parse_percentiles("fifty").is_err());
    }
}
