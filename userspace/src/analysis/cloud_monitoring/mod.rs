//! Cloud Monitoring time series in and out (issue 16): read the JSON that
//! `projects.timeSeries.list` returns for a distribution metric (such as
//! `networking.googleapis.com/vm_flow/rtt`), and write local views as `TimeSeries` ready for
//! `projects.timeSeries.create` (the custom distribution metric [`METRIC_TYPE`]).
//!
//! The REST API's JSON (the proto3 JSON mapping of `google.monitoring.v3.TimeSeries`), restated
//! from the public API reference:
//!
//! - `{"timeSeries": [TimeSeries], "nextPageToken": "...", "executionErrors": [...], "unit": "..."}`
//!   is a list response; a create request body is `{"timeSeries": [TimeSeries]}`.
//! - `TimeSeries = {metric: {type, labels}, resource: {type, labels}, metricKind: GAUGE | DELTA |
//!   CUMULATIVE, valueType: BOOL | INT64 | DOUBLE | STRING | DISTRIBUTION | MONEY, unit, points}`;
//!   "when listing time series, points are returned in reverse time order"; "when creating a time
//!   series, this field must contain exactly one point".
//! - `Point = {interval: {startTime, endTime}, value: TypedValue}`; times are RFC 3339 strings.
//!   GAUGE: the start time is optional and, if given, equals the end time. DELTA: a non-zero
//!   interval, points contiguous and not overlapping. CUMULATIVE: a non-zero interval, later
//!   points keep the start time and increase the end time until a reset.
//! - `TypedValue` holds one of `boolValue`, `int64Value`, `doubleValue`, `stringValue`,
//!   `distributionValue`. A request with an aligner such as `ALIGN_PERCENTILE_50` returns DOUBLE
//!   points (`doubleValue`): already reduced, no buckets left.
//! - `Distribution = {count, mean, sumOfSquaredDeviation, range: {min, max}, bucketOptions,
//!   bucketCounts, exemplars}`; int64 fields (`count`, each of `bucketCounts`, `int64Value`) are
//!   JSON strings in the proto3 mapping (numbers are accepted too). `bucketCounts` may hold fewer
//!   values than the layout has buckets: the missing trailing buckets are zero. Their sum must be
//!   `count`. A field left at its default (0, empty) may be absent.
//!
//! - [`read`]: a list response into [`CloudFile`], merged with [`merge_file`].
//! - [`write`]: local views as create request bodies ([`result_requests`], [`LiveExport`]).
//! - [`time`]: RFC 3339 times.
mod read;
mod time;
mod write;

pub use read::{
    cdf_points_us, looks_like_cloud, merge_file, parse, CloudFile, CloudPoint, CloudSeries,
    MergedCloud, PointValue, MAX_READ_SERIES, VM_FLOW_RTT,
};
pub use time::{parse_rfc3339, rfc3339};
pub use write::{
    distribution_to_api, remote_prefix, requests, resource, result_requests, time_series,
    LiveExport, MetricKind, SeriesLabels, MAX_SERIES, MAX_SERIES_PER_REQUEST, METRIC_TYPE,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::dist::{vm_flow_preset, BucketOptions, Distribution, ValueUnit};

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/cloud")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn only_dist(f: &CloudFile, s: usize, p: usize) -> Distribution {
        match &f.series[s].points[p].value {
            PointValue::Distribution(d) => (**d).clone(),
            other => panic!("not a distribution: {other:?}"),
        }
    }

    #[test]
    fn exponential_fixture_reproduces_the_documented_example() {
        let f = parse(&fixture("exponential.json"), "exponential.json").unwrap();
        assert_eq!(f.series.len(), 1);
        let s = &f.series[0];
        assert_eq!(s.metric_type, VM_FLOW_RTT);
        assert_eq!(s.metric_kind, "DELTA");
        assert_eq!(s.unit, ValueUnit::Ms);
        assert!(s.unit_given);
        assert_eq!(s.resource_type, "gce_instance");
        // The list response gives points newest first; they are sorted.
        assert!(s.points[0].end_unix_s < s.points[1].end_unix_s);
        let d = only_dist(&f, 0, 0);
        assert_eq!(d.bucket_counts.len(), 12);
        assert_eq!((d.count, d.bucket_counts[8]), (1, 1));
        let p = |q: f64| d.percentile(q).unwrap().unwrap().value;
        assert!((p(50.0) - 192.0).abs() < 1e-9);
        assert!((p(95.0) - 249.6).abs() < 1e-9);
        assert!((p(99.0) - 254.72).abs() < 1e-9);
    }

    #[test]
    fn linear_and_explicit_fixtures_with_omitted_trailing_buckets() {
        let f = parse(&fixture("linear.json"), "linear.json").unwrap();
        let d = only_dist(&f, 0, 0);
        assert_eq!(
            d.bucket_options,
            BucketOptions::parse("linear:width=0.5,offset=0,n=8").unwrap()
        );
        // bucketCounts ["0","6","3","1"]: the other 6 buckets are zero.
        assert_eq!(d.bucket_counts, vec![0, 6, 3, 1, 0, 0, 0, 0, 0, 0]);
        // 10 samples: 60 % in [0, 0.5): p50 = 0.5 * 50/60.
        assert!((d.percentile(50.0).unwrap().unwrap().value - 0.5 * 50.0 / 60.0).abs() < 1e-12);
        // p95 in [1, 1.5) (range 90-100 %): 1 + 0.5 * 0.5 = 1.25.
        assert!((d.percentile(95.0).unwrap().unwrap().value - 1.25).abs() < 1e-12);
        assert_eq!((d.min, d.max), (Some(0.1), Some(1.2)));

        let f = parse(&fixture("explicit-vm_flow.json"), "explicit-vm_flow.json").unwrap();
        let d = only_dist(&f, 0, 0);
        assert_eq!(d.bucket_options, vm_flow_preset());
        assert_eq!(d.count, 1002);
        assert_eq!(d.bucket_counts.iter().sum::<u64>(), 1002);
        // The Google note: every sub-millisecond sample in [0, 1) -> median 0.5 ms.
        let p50 = d.percentile(50.0).unwrap().unwrap();
        assert_eq!(p50.bucket, 1);
        assert!(
            (p50.value - 50.0 / (100.0 * 1001.0 / 1002.0)).abs() < 1e-9,
            "{p50:?}"
        );
    }

    #[test]
    fn aligned_doubles_are_read_as_such() {
        let f = parse(&fixture("aligned-p50.json"), "aligned-p50.json").unwrap();
        let s = &f.series[0];
        assert_eq!(
            (s.metric_kind.as_str(), s.value_type.as_str()),
            ("GAUGE", "DOUBLE")
        );
        assert!(!s.is_distribution());
        assert_eq!(s.points.len(), 2);
        assert_eq!(s.points[0].value, PointValue::Double(0.5));
        assert_eq!(s.points[0].start_unix_s, s.points[0].end_unix_s.into());
    }

    #[test]
    fn malformed_files_fail_in_one_sentence_naming_the_place() {
        let cases = [
            ("bad-count.json", "time series 1 (networking.googleapis.com/vm_flow/rtt), point 1: value.distributionValue.count is 5 but bucketCounts add up to 4"),
            ("bad-bucket-count.json", "point 1: value.distributionValue.bucketCounts[2] is not a non-negative int64: \"-3\""),
            ("bad-too-many-buckets.json", "bucketCounts has 5 values, more than the 4 buckets"),
            ("bad-layout.json", "point 1: value.distributionValue.bucketOptions.exponentialBuckets: growth must be > 1"),
            ("bad-time.json", "point 2: interval.endTime is not an RFC 3339 time"),
            ("bad-no-timeseries.json", "has no timeSeries"),
        ];
        for (file, says) in cases {
            let e = format!("{:#}", parse(&fixture(file), file).unwrap_err());
            assert!(e.starts_with(file), "{file}: {e}");
            assert!(e.contains(says), "{file}: {e}");
            assert!(!e.contains('\n'), "{file}: {e}");
        }
        for (text, says) in [
            ("", "is empty"),
            ("{", "is not JSON"),
            ("[1]", "time series 1: is not an object"),
            (r#"{"timeSeries": 3}"#, "timeSeries is not an array"),
            (
                r#"{"timeSeries": [{"points": [{"interval": {"endTime": "2026-01-01T00:00:00Z"}, "value": {"boolValue": true}}]}]}"#,
                "value holds none of",
            ),
            (
                r#"{"timeSeries": [{"points": [{"value": {"doubleValue": 1}}]}]}"#,
                "point 1: has no interval",
            ),
            (
                r#"{"timeSeries": [{"metric": {"labels": {"a": 1}}}]}"#,
                "metric.labels.a is not a string",
            ),
            (
                r#"{"timeSeries": [{"points": [{"interval": {"endTime": "2026-01-01T00:00:00Z"}, "value": {"distributionValue": {"count": "2"}}}]}]}"#,
                "has 2 samples but no bucketOptions",
            ),
            (
                r#"{"timeSeries": [{"points": [{"interval": {"startTime": "2026-01-01T00:00:01Z", "endTime": "2026-01-01T00:00:00Z"}, "value": {"doubleValue": 1}}]}]}"#,
                "startTime is after",
            ),
        ] {
            let e = format!("{:#}", parse(text, "f.json").unwrap_err());
            assert!(e.starts_with("f.json"), "{text}: {e}");
            assert!(e.contains(says), "{text}: {e}");
        }
        // An empty distribution is fine.
        let f = parse(r#"{"timeSeries": [{"points": [{"interval": {"endTime": "2026-01-01T00:00:00Z"}, "value": {"distributionValue": {}}}]}]}"#, "f").unwrap();
        assert_eq!(f.series[0].points[0].value, PointValue::EmptyDistribution);
    }

    #[test]
    fn written_series_read_back_the_same() {
        let mut d = Distribution::new(vm_flow_preset(), ValueUnit::Ms);
        for i in 0..500 {
            d.add_us(100.0 + (i * 37 % 3000) as f64);
        }
        d.add_us(45_000.0);
        let labels = SeriesLabels {
            view: "tcp".into(),
            side: "server".into(),
            netns: "ns-b".into(),
            remote_prefix: remote_prefix("10.99.0.77".parse().unwrap(), 24, 48),
        };
        assert_eq!(labels.remote_prefix, "10.99.0.0/24");
        let ts = time_series(
            &labels,
            &resource("vm"),
            MetricKind::Cumulative,
            1_795_245_000.0,
            1_795_245_060.5,
            &d,
        );
        // The API's field names.
        for k in [
            "metric",
            "resource",
            "metricKind",
            "valueType",
            "points",
            "unit",
        ] {
            assert!(ts.get(k).is_some(), "{k}");
        }
        let dv = &ts["points"][0]["value"]["distributionValue"];
        for k in [
            "count",
            "mean",
            "sumOfSquaredDeviation",
            "range",
            "bucketOptions",
            "bucketCounts",
        ] {
            assert!(dv.get(k).is_some(), "{k}: {dv}");
        }
        assert!(dv["count"].is_string());
        assert!(dv["bucketOptions"]["explicitBuckets"]["bounds"].is_array());
        assert_eq!(
            ts["points"][0]["interval"]["startTime"],
            "2026-11-21T07:10:00Z"
        );
        assert_eq!(
            ts["points"][0]["interval"]["endTime"],
            "2026-11-21T07:11:00.500Z"
        );
        assert_eq!(ts["metric"]["type"], METRIC_TYPE);
        assert_eq!(ts["metric"]["labels"]["remote_prefix"], "10.99.0.0/24");
        // Trailing empty buckets are left out.
        assert!(dv["bucketCounts"].as_array().unwrap().len() < d.bucket_counts.len());
        let text = serde_json::to_string(&requests(vec![ts])[0]).unwrap();
        let back = parse(&text, "out.json").unwrap();
        let s = &back.series[0];
        assert_eq!(
            (s.metric_kind.as_str(), s.value_type.as_str()),
            ("CUMULATIVE", "DISTRIBUTION")
        );
        assert_eq!(s.metric_labels["side"], "server");
        let got = only_dist(&back, 0, 0);
        assert_eq!(got.bucket_counts, d.bucket_counts);
        assert_eq!(got.count, d.count);
        assert!((got.mean - d.mean).abs() < 1e-12);
        assert!((got.sum_of_squared_deviation - d.sum_of_squared_deviation).abs() < 1e-6);
        for p in [5.0, 50.0, 95.0, 99.0] {
            assert_eq!(got.percentile(p).unwrap(), d.percentile(p).unwrap(), "p{p}");
        }
        // GAUGE: start time left out (it equals the end time).
        let g = time_series(&labels, &resource("vm"), MetricKind::Gauge, 0.0, 10.0, &d);
        assert!(g["points"][0]["interval"].get("startTime").is_none());
    }

    #[test]
    fn live_export_caps_label_sets_and_chunks_requests() {
        let mut x = LiveExport::new(vm_flow_preset(), 1000.0);
        for i in 0..(MAX_SERIES + 50) {
            x.add(
                SeriesLabels {
                    view: "tcp".into(),
                    side: "client".into(),
                    netns: "host".into(),
                    remote_prefix: format!("10.{}.{}.0/24", i / 256, i % 256),
                },
                150.0,
            );
        }
        assert_eq!(x.len(), MAX_SERIES + 1);
        assert_eq!(x.overflowed, 50);
        let reqs = x.requests(1060.0, "vm");
        assert_eq!(
            reqs.len(),
            (MAX_SERIES + 1).div_ceil(MAX_SERIES_PER_REQUEST)
        );
        assert!(reqs
            .iter()
            .all(|r| r["timeSeries"].as_array().unwrap().len() <= MAX_SERIES_PER_REQUEST));
        let lines: String = reqs.iter().map(|r| r.to_string() + "\n").collect();
        let back = parse(&lines, "lines").unwrap();
        assert_eq!(back.series.len(), MAX_SERIES + 1);
    }

    #[test]
    fn merged_file_and_cdf_points() {
        let f = parse(&fixture("exponential.json"), "e").unwrap();
        let m = merge_file(&f);
        let d = m.distribution.unwrap();
        assert_eq!((m.points, m.skipped, d.count), (2, 0, 4));
        assert_eq!(d.bucket_counts[5], 3);
        assert_eq!(d.bucket_counts[8], 1);
        assert_eq!(m.start_unix_s, parse_rfc3339("2026-11-21T06:00:00Z"));
        // 3 samples in [16, 32) ms, 1 in [128, 256) ms.
        let cdf = cdf_points_us(&d);
        assert_eq!(cdf.first(), Some(&(16_000.0, 0.0)));
        assert_eq!(cdf[1], (32_000.0, 0.75));
        assert_eq!(cdf.last(), Some(&(256_000.0, 1.0)));
        let a = merge_file(&parse(&fixture("aligned-p50.json"), "a").unwrap());
        assert_eq!((a.distribution, a.aligned), (None, vec![0.5, 0.5]));
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 256,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Mutated distribution documents: parsed or refused in one sentence, never a panic, and a
        /// parsed distribution's percentiles are defined.
        #[test]
        fn any_distribution_document_parses_or_fails_in_one_sentence(
            count in proptest::prop_oneof!["\"[0-9]{1,3}\"", "[0-9]{1,3}", "\"-1\"", "\"x\"", "null", "1e400", "\"99999999999999999999\""],
            kind in 0usize..4,
            n in proptest::prop_oneof!["[0-9]{1,2}", "\"[0-9]{1,5}\"", "-1", "2.5", "\"\""],
            g in proptest::prop_oneof!["[0-9]\\.?[0-9]?", "\"NaN\"", "\"Infinity\"", "-2"],
            counts in proptest::collection::vec(proptest::prop_oneof!["\"[0-9]{1,2}\"", "[0-9]", "\"-1\"", "true"], 0..24),
            time in proptest::prop_oneof!["\"2026-01-01T00:00:0[0-9]Z\"", "\"2026-01-01T00:00:00.1234567890Z\"", "\"\\u0000\"", "7"],
        ) {
            let opts = match kind {
                0 => format!("{{\"exponentialBuckets\": {{\"numFiniteBuckets\": {n}, \"growthFactor\": {g}, \"scale\": 1}}}}"),
                1 => format!("{{\"linearBuckets\": {{\"numFiniteBuckets\": {n}, \"width\": {g}}}}}"),
                2 => format!("{{\"explicitBuckets\": {{\"bounds\": [0, {g}, 10]}}}}"),
                _ => "{}".to_string(),
            };
            let text = format!(
                "{{\"timeSeries\": [{{\"metric\": {{\"type\": \"t\"}}, \"points\": [{{\"interval\": {{\"endTime\": {time}}}, \"value\": {{\"distributionValue\": {{\"count\": {count}, \"bucketOptions\": {opts}, \"bucketCounts\": [{}]}}}}}}]}}]}}",
                counts.join(", ")
            );
            match parse(&text, "f.json") {
                Ok(f) => {
                    for s in &f.series {
                        for p in &s.points {
                            if let PointValue::Distribution(d) = &p.value {
                                proptest::prop_assert!(d.percentile(50.0).unwrap().is_some());
                            }
                        }
                    }
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    proptest::prop_assert!(e.starts_with("f.json"), "{}", e);
                    proptest::prop_assert!(!e.chars().any(|c| c.is_control()), "{:?}", e);
                    proptest::prop_assert!(e.len() < 600, "{}", e);
                }
            }
        }
    }
}
