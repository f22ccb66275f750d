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
use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::analysis::dist::{BucketOptions, Distribution, ValueUnit};
use crate::analysis::results::RunResult;

/// The custom metric rttscope writes.
pub const METRIC_TYPE: &str = "custom.googleapis.com/rttscope/rtt";
/// The cloud metric this module is mostly about.
pub const VM_FLOW_RTT: &str = "networking.googleapis.com/vm_flow/rtt";
/// At most this many time series in one create request (the API's documented limit).
pub const MAX_SERIES_PER_REQUEST: usize = 200;
/// At most this many label sets rttscope writes (like the Prometheus exporter's default); more go
/// to one overflow series per view.
pub const MAX_SERIES: usize = 1000;
/// Bounds of what is read: time series per file, points per series.
pub const MAX_READ_SERIES: usize = 100_000;

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

/// A point's value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PointValue {
    /// A `distributionValue` with its layout and bucket counts.
    Distribution(Box<Distribution>),
    /// A `distributionValue` without samples (and possibly without a layout).
    EmptyDistribution,
    /// A `doubleValue`: already reduced by the request's aligner/reducer (e.g.
    /// `ALIGN_PERCENTILE_50`); the file does not say which percentile it is.
    Double(f64),
    /// An `int64Value` (e.g. `ALIGN_COUNT`).
    Int64(i64),
}

/// One point: its interval (Unix seconds) and value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudPoint {
    /// Start of the interval; `None` when absent (GAUGE: the end time).
    pub start_unix_s: Option<f64>,
    pub end_unix_s: f64,
    pub value: PointValue,
}

impl CloudPoint {
    /// The interval as text, `START .. END` (or the instant of a GAUGE point).
    pub fn interval_text(&self) -> String {
        match self.start_unix_s {
            Some(s) if s != self.end_unix_s => {
                format!("{} .. {}", rfc3339(s), rfc3339(self.end_unix_s))
            }
            _ => rfc3339(self.end_unix_s),
        }
    }
}

/// One time series as read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudSeries {
    pub metric_type: String,
    pub metric_labels: BTreeMap<String, String>,
    pub resource_type: String,
    pub resource_labels: BTreeMap<String, String>,
    /// GAUGE, DELTA or CUMULATIVE (as written in the file; empty when absent).
    pub metric_kind: String,
    /// DISTRIBUTION, DOUBLE, INT64 (as written; empty when absent).
    pub value_type: String,
    /// The values' unit: from the series' `unit` (or the response's), else assumed milliseconds.
    pub unit: ValueUnit,
    /// Whether `unit` was given by the file (false: assumed ms, the vm_flow metric's unit).
    pub unit_given: bool,
    /// Points in time order (a list response gives them newest first).
    pub points: Vec<CloudPoint>,
}

impl CloudSeries {
    /// `type {k=v, ...}` of the metric.
    pub fn metric_text(&self) -> String {
        labels_text(&self.metric_type, &self.metric_labels)
    }
    pub fn resource_text(&self) -> String {
        labels_text(&self.resource_type, &self.resource_labels)
    }
    /// Whether the series holds distributions (by its points, or its valueType when empty).
    pub fn is_distribution(&self) -> bool {
        self.value_type == "DISTRIBUTION"
            || self.points.iter().any(|p| {
                matches!(
                    p.value,
                    PointValue::Distribution(_) | PointValue::EmptyDistribution
                )
            })
    }
}

fn labels_text(t: &str, l: &BTreeMap<String, String>) -> String {
    if l.is_empty() {
        return t.to_string();
    }
    let kv: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{t} {{{}}}", kv.join(", "))
}

/// A whole file: every time series in it (JSON Lines of requests are concatenated, series with
/// the same metric and resource merged).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudFile {
    pub name: String,
    pub series: Vec<CloudSeries>,
}

/// Whether a text looks like a Cloud Monitoring document (rather than an rttscope result).
pub fn looks_like_cloud(text: &str) -> bool {
    let head: String = text.chars().take(4096).collect();
    let t = head.trim_start();
    (t.starts_with('{') && head.contains("\"timeSeries\""))
        || (t.starts_with('[') && head.contains("\"points\""))
}

/// Cut a JSON value's text for an error message (at most 60 characters, no control characters).
fn quote(v: &Value) -> String {
    let s = v.to_string();
    let mut out: String = s
        .chars()
        .take(60)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().count() > 60 {
        out.push_str("...");
    }
    out
}

/// An int64 as the proto3 JSON mapping writes it: a string of digits (or a JSON integer).
fn int64(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.trim().parse::<i64>().ok(),
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                .map(|f| f as i64)
        }),
        _ => None,
    }
}

/// A double: a JSON number or a string ("NaN", "Infinity", "1.5").
fn double(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.trim() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            t => t.parse().ok(),
        },
        _ => None,
    }
}

fn string_map(
    v: Option<&Value>,
    what: &str,
) -> std::result::Result<BTreeMap<String, String>, String> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, x)| match x {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(format!("{what}.{k} is not a string: {}", quote(other))),
            })
            .collect(),
        Some(other) => Err(format!("{what} is not an object: {}", quote(other))),
    }
}

/// The unit of a series (`ms`, `us`, `s`; UCUM `1` or empty: unknown).
fn unit_of(s: &str) -> Option<ValueUnit> {
    match s.trim() {
        "ms" => Some(ValueUnit::Ms),
        "us" | "µs" => Some(ValueUnit::Us),
        "s" => Some(ValueUnit::S),
        _ => None,
    }
}

/// Parse a `distributionValue`.
fn parse_distribution(v: &Value, unit: ValueUnit) -> std::result::Result<PointValue, String> {
    let m = v
        .as_object()
        .ok_or_else(|| format!("value.distributionValue is not an object: {}", quote(v)))?;
    let count = dist_count(m)?;
    let mean = dist_number(m, "mean")?;
    let ssd = dist_number(m, "sumOfSquaredDeviation")?;
    if ssd < 0.0 {
        return Err(format!(
            "{} is negative: {ssd}",
            dist_field("sumOfSquaredDeviation")
        ));
    }
    let options = match m.get("bucketOptions") {
        None => None,
        Some(o) => {
            Some(BucketOptions::from_api(o).map_err(|e| format!("value.distributionValue.{e}"))?)
        }
    };
    let raw_counts: &[Value] = match m.get("bucketCounts") {
        None => &[],
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(format!(
                "{} is not an array: {}",
                dist_field("bucketCounts"),
                quote(other)
            ))
        }
    };
    let Some(options) = options else {
        if count == 0 && raw_counts.is_empty() {
            return Ok(PointValue::EmptyDistribution);
        }
        return Err(format!(
            "value.distributionValue has {count} samples but no bucketOptions"
        ));
    };
    let counts = bucket_counts(raw_counts, &options, count)?;
    if count == 0 {
        return Ok(PointValue::EmptyDistribution);
    }
    let range = dist_range(m)?;
    Ok(PointValue::Distribution(Box::new(Distribution {
        bucket_options: options,
        unit,
        bucket_counts: counts,
        count,
        mean,
        sum_of_squared_deviation: ssd,
        min: range.0,
        max: range.1,
        rejected: 0,
    })))
}

/// The path of a field of a `distributionValue`, for errors.
fn dist_field(k: &str) -> String {
    format!("value.distributionValue.{k}")
}

/// A `distributionValue`'s `count` (0 when absent).
fn dist_count(m: &Map<String, Value>) -> std::result::Result<u64, String> {
    Ok(match m.get("count") {
        None => 0,
        Some(x) => int64(x).filter(|c| *c >= 0).ok_or_else(|| {
            format!(
                "{} is not a non-negative int64: {}",
                dist_field("count"),
                quote(x)
            )
        })? as u64,
    })
}

/// A finite number field of a `distributionValue` (0 when absent).
fn dist_number(m: &Map<String, Value>, k: &str) -> std::result::Result<f64, String> {
    match m.get(k) {
        None => Ok(0.0),
        Some(x) => double(x)
            .filter(|d| d.is_finite())
            .ok_or_else(|| format!("{} is not a finite number: {}", dist_field(k), quote(x))),
    }
}

/// The `bucketCounts` in `options`' buckets (missing trailing ones 0), which
/// must add up to `count`.
fn bucket_counts(
    raw_counts: &[Value],
    options: &BucketOptions,
    count: u64,
) -> std::result::Result<Vec<u64>, String> {
    let f = dist_field;
    let n = options.num_buckets();
    if raw_counts.len() > n {
        return Err(format!(
            "{} has {} values, more than the {n} buckets of its layout {}",
            f("bucketCounts"),
            raw_counts.len(),
            options.spec()
        ));
    }
    let mut counts = vec![0u64; n];
    for (i, x) in raw_counts.iter().enumerate() {
        counts[i] = int64(x).filter(|c| *c >= 0).ok_or_else(|| {
            format!(
                "{}[{i}] is not a non-negative int64: {}",
                f("bucketCounts"),
                quote(x)
            )
        })? as u64;
    }
    let sum = counts.iter().try_fold(0u64, |a, &c| a.checked_add(c));
    if sum != Some(count) {
        if raw_counts.is_empty() && count > 0 {
            return Err(format!(
                "value.distributionValue has {count} samples but no bucketCounts"
            ));
        }
        return Err(format!(
            "{} is {count} but bucketCounts add up to {}",
            f("count"),
            sum.map_or("more than 2^64".to_string(), |s| s.to_string())
        ));
    }
    Ok(counts)
}

/// A `distributionValue`'s `range` (min, max; an absent bound is 0), or
/// none when there is no range.
fn dist_range(m: &Map<String, Value>) -> std::result::Result<(Option<f64>, Option<f64>), String> {
    let Some(r) = m.get("range") else {
        return Ok((None, None));
    };
    let g = |k: &str| -> std::result::Result<Option<f64>, String> {
        match r.get(k) {
            None => Ok(Some(0.0)),
            Some(x) => double(x)
                .filter(|d| d.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "{}.{k} is not a finite number: {}",
                        dist_field("range"),
                        quote(x)
                    )
                }),
        }
    };
    Ok((g("min")?, g("max")?))
}

fn parse_point(p: &Value, unit: ValueUnit) -> std::result::Result<CloudPoint, String> {
    let m = p
        .as_object()
        .ok_or_else(|| format!("is not an object: {}", quote(p)))?;
    let interval = m
        .get("interval")
        .ok_or_else(|| "has no interval".to_string())?;
    let time = |k: &str| -> std::result::Result<Option<f64>, String> {
        match interval.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => parse_rfc3339(s).map(Some).ok_or_else(|| {
                format!(
                    "interval.{k} is not an RFC 3339 time: {}",
                    quote(&Value::String(s.clone()))
                )
            }),
            Some(other) => Err(format!("interval.{k} is not a string: {}", quote(other))),
        }
    };
    let end = time("endTime")?.ok_or_else(|| "has no interval.endTime".to_string())?;
    let start = time("startTime")?;
    if let Some(s) = start {
        if s > end {
            return Err("interval.startTime is after interval.endTime".into());
        }
    }
    let v = m
        .get("value")
        .and_then(Value::as_object)
        .ok_or_else(|| "has no value object".to_string())?;
    let value = if let Some(d) = v.get("distributionValue") {
        parse_distribution(d, unit)?
    } else if let Some(x) = v.get("doubleValue") {
        PointValue::Double(
            double(x).ok_or_else(|| format!("value.doubleValue is not a number: {}", quote(x)))?,
        )
    } else if let Some(x) = v.get("int64Value") {
        PointValue::Int64(
            int64(x).ok_or_else(|| format!("value.int64Value is not an int64: {}", quote(x)))?,
        )
    } else {
        let keys: Vec<&String> = v.keys().collect();
        return Err(format!(
            "value holds none of distributionValue, doubleValue, int64Value (keys: {keys:?})"
        ));
    };
    Ok(CloudPoint {
        start_unix_s: start,
        end_unix_s: end,
        value,
    })
}

fn parse_series(
    ts: &Value,
    default_unit: Option<&str>,
) -> std::result::Result<CloudSeries, (Option<usize>, String)> {
    let whole = |e: String| (None, e);
    let m = ts
        .as_object()
        .ok_or_else(|| whole(format!("is not an object: {}", quote(ts))))?;
    let metric = m.get("metric");
    let metric_type = match metric.and_then(|x| x.get("type")) {
        Some(Value::String(s)) => s.clone(),
        None => String::new(),
        Some(other) => {
            return Err(whole(format!(
                "metric.type is not a string: {}",
                quote(other)
            )))
        }
    };
    let metric_labels =
        string_map(metric.and_then(|x| x.get("labels")), "metric.labels").map_err(whole)?;
    let resource = m.get("resource");
    let resource_type = resource
        .and_then(|x| x.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let resource_labels =
        string_map(resource.and_then(|x| x.get("labels")), "resource.labels").map_err(whole)?;
    let text = |k: &str| -> std::result::Result<String, (Option<usize>, String)> {
        match m.get(k) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(whole(format!("{k} is not a string: {}", quote(other)))),
        }
    };
    let metric_kind = text("metricKind")?;
    let value_type = text("valueType")?;
    let unit_text = text("unit")?;
    let unit_text = if unit_text.is_empty() {
        default_unit.unwrap_or("")
    } else {
        unit_text.as_str()
    };
    let given = unit_of(unit_text);
    let unit = given.unwrap_or(ValueUnit::Ms);
    let points = match m.get("points") {
        None => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(other) => return Err(whole(format!("points is not an array: {}", quote(other)))),
    };
    let mut out = Vec::with_capacity(points.len());
    for (j, p) in points.iter().enumerate() {
        out.push(parse_point(p, unit).map_err(|e| (Some(j), e))?);
    }
    out.sort_by(|a, b| a.end_unix_s.total_cmp(&b.end_unix_s));
    Ok(CloudSeries {
        metric_type,
        metric_labels,
        resource_type,
        resource_labels,
        metric_kind,
        value_type,
        unit,
        unit_given: given.is_some(),
        points: out,
    })
}

/// Parse a Cloud Monitoring document: a `projects.timeSeries.list` response, a create request
/// body (both `{"timeSeries": [...]}`), a bare array of TimeSeries, or JSON Lines of these
/// (`observe --format cloud-monitoring`). Series with the same metric and resource (from several
/// lines or pages) are merged. Errors are one sentence naming the file, the series, the point and
/// the field.
pub fn parse(text: &str, name: &str) -> Result<CloudFile> {
    // strict_json: an object that names a key twice is refused (serde_json keeps the last).
    let dup = |e: &serde_json::Error| e.classify() == serde_json::error::Category::Data;
    let docs: Vec<(Option<usize>, Value)> = match crate::analysis::strict_json::from_str(text) {
        Ok(v) => vec![(None, v)],
        Err(e) if dup(&e) => bail!("{name} is not a Cloud Monitoring file: {e}"),
        Err(whole) => {
            let mut docs = Vec::new();
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match crate::analysis::strict_json::from_str(line) {
                    Ok(v) => docs.push((Some(i + 1), v)),
                    Err(e) if dup(&e) => {
                        bail!(
                            "{name} line {} is not a Cloud Monitoring request: {e}",
                            i + 1
                        )
                    }
                    Err(_) if docs.is_empty() => bail!("{name} is not JSON: {whole}"),
                    Err(e) => bail!("{name} line {} is not JSON: {e}", i + 1),
                }
            }
            if docs.is_empty() {
                bail!("{name} is empty");
            }
            docs
        }
    };
    let mut series: Vec<CloudSeries> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut number = 0usize;
    for (line, doc) in &docs {
        let at = line.map_or(String::new(), |l| format!(" line {l}"));
        let (list, unit) = match doc {
            Value::Array(a) => (a.as_slice(), None),
            Value::Object(m) => match m.get("timeSeries") {
                Some(Value::Array(a)) => (a.as_slice(), m.get("unit").and_then(Value::as_str)),
                None if m.contains_key("points") => (std::slice::from_ref(doc), None),
                None => bail!(
                    "{name}{at} has no timeSeries (expected a projects.timeSeries.list response)"
                ),
                Some(other) => bail!("{name}{at}: timeSeries is not an array: {}", quote(other)),
            },
            other => bail!("{name}{at} is not a timeSeries document: {}", quote(other)),
        };
        for ts in list {
            number += 1;
            if number > MAX_READ_SERIES {
                bail!("{name} holds more than {MAX_READ_SERIES} time series");
            }
            let s = parse_series(ts, unit).map_err(|(point, e)| {
                let what = ts
                    .get("metric")
                    .and_then(|m| m.get("type"))
                    .and_then(Value::as_str)
                    .map(|t| format!(" ({})", t.chars().take(80).collect::<String>()))
                    .unwrap_or_default();
                match point {
                    Some(j) => anyhow::anyhow!(
                        "{name}{at}: time series {number}{what}, point {}: {e}",
                        j + 1
                    ),
                    None => anyhow::anyhow!("{name}{at}: time series {number}{what}: {e}"),
                }
            })?;
            let key = format!(
                "{}\u{0}{:?}\u{0}{}\u{0}{:?}\u{0}{}\u{0}{}",
                s.metric_type,
                s.metric_labels,
                s.resource_type,
                s.resource_labels,
                s.metric_kind,
                s.value_type
            );
            match index.get(&key) {
                Some(&k) => {
                    let t = &mut series[k];
                    t.points.extend(s.points);
                    t.points
                        .sort_by(|a, b| a.end_unix_s.total_cmp(&b.end_unix_s));
                }
                None => {
                    index.insert(key, series.len());
                    series.push(s);
                }
            }
        }
    }
    Ok(CloudFile {
        name: name.to_string(),
        series,
    })
}

/// What a file says as one view: its distribution points merged (a CUMULATIVE series
/// contributes its last point, which holds the earlier ones), in the layout of the first one;
/// points with another layout are counted in `skipped`. Aligned doubles are returned as values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergedCloud {
    pub distribution: Option<Distribution>,
    /// Distribution points merged.
    pub points: usize,
    /// Distribution points left out (another layout or unit).
    pub skipped: usize,
    /// The values of aligned (DOUBLE/INT64) points, in the series' unit.
    pub aligned: Vec<f64>,
    /// The earliest start and latest end of the points used (Unix seconds).
    pub start_unix_s: Option<f64>,
    pub end_unix_s: Option<f64>,
}

pub fn merge_file(f: &CloudFile) -> MergedCloud {
    let mut m = MergedCloud {
        distribution: None,
        points: 0,
        skipped: 0,
        aligned: Vec::new(),
        start_unix_s: None,
        end_unix_s: None,
    };
    for s in &f.series {
        let pts: Vec<&CloudPoint> = if s.metric_kind == "CUMULATIVE" {
            s.points.last().into_iter().collect()
        } else {
            s.points.iter().collect()
        };
        for p in pts {
            let used = match &p.value {
                PointValue::Distribution(d) => match &mut m.distribution {
                    None => {
                        m.distribution = Some((**d).clone());
                        true
                    }
                    Some(acc) => acc.merge(d).is_ok(),
                },
                PointValue::Double(v) => {
                    m.aligned.push(*v);
                    true
                }
                PointValue::Int64(v) => {
                    m.aligned.push(*v as f64);
                    true
                }
                PointValue::EmptyDistribution => false,
            };
            if !used {
                if matches!(p.value, PointValue::Distribution(_)) {
                    m.skipped += 1;
                }
                continue;
            }
            if matches!(p.value, PointValue::Distribution(_)) {
                m.points += 1;
            }
            let st = p.start_unix_s.unwrap_or(p.end_unix_s);
            m.start_unix_s = Some(m.start_unix_s.map_or(st, |x| x.min(st)));
            m.end_unix_s = Some(m.end_unix_s.map_or(p.end_unix_s, |x| x.max(p.end_unix_s)));
        }
    }
    m
}

/// CDF points of a distribution from its bucket counts: (upper bound in us, fraction of samples
/// below it) for each finite bucket up to the last non-empty one, starting at (lower bound of the
/// first non-empty bucket, 0). The underflow bucket starts at 0 when its bound is positive.
pub fn cdf_points_us(d: &Distribution) -> Vec<(f64, f64)> {
    let total = d.count as f64;
    if d.count == 0 {
        return Vec::new();
    }
    let o = &d.bucket_options;
    let n = d.bucket_counts.len();
    let first = d.bucket_counts.iter().position(|&c| c > 0).unwrap_or(0);
    let last = d.bucket_counts.iter().rposition(|&c| c > 0).unwrap_or(0);
    let lo = if first == 0 {
        o.upper(0).min(0.0)
    } else {
        o.lower(first)
    };
    let mut out = vec![(d.unit.to_us(lo), 0.0)];
    let mut cum = 0u64;
    for i in first..=last {
        cum += d.bucket_counts[i];
        // The overflow bucket has no upper bound: its samples are drawn at its lower bound.
        let x = if i == n - 1 { o.lower(i) } else { o.upper(i) };
        out.push((d.unit.to_us(x), cum as f64 / total));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Times
// ---------------------------------------------------------------------------------------------

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Unix seconds as RFC 3339 UTC with nanoseconds when needed (`2026-11-21T06:00:00.250Z`), the
/// way the API writes `google.protobuf.Timestamp` (0, 3, 6 or 9 fractional digits).
pub fn rfc3339(unix_s: f64) -> String {
    // Microseconds: an f64 Unix time carries no more (about 0.2 us of resolution today).
    let total_ns = (unix_s * 1e6).round() as i128 * 1000;
    let secs = total_ns.div_euclid(1_000_000_000) as i64;
    let ns = total_ns.rem_euclid(1_000_000_000) as u32;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let base = format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    );
    if ns == 0 {
        format!("{base}Z")
    } else if ns.is_multiple_of(1_000_000) {
        format!("{base}.{:03}Z", ns / 1_000_000)
    } else if ns.is_multiple_of(1000) {
        format!("{base}.{:06}Z", ns / 1000)
    } else {
        format!("{base}.{ns:09}Z")
    }
}

/// Parse an RFC 3339 time (`2026-11-21T06:00:00Z`, fractions, `+hh:mm` offsets) to Unix seconds.
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let b = s.trim().as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = std::str::from_utf8(&b[r]).ok()?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac = 0.0;
    if b[i] == b'.' {
        let st = i + 1;
        i = st;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == st || i - st > 9 {
            return None;
        }
        frac = format!("0.{}", std::str::from_utf8(&b[st..i]).ok()?)
            .parse()
            .ok()?;
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0i64,
        c @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)? as i64;
            let om = num(i + 4..i + 6)? as i64;
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *c == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y as i64, mo, d);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + se) as i64 - offset;
    Some(secs as f64 + frac)
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

/// The metric kind written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MetricKind {
    /// A point-in-time distribution (start = end).
    Gauge,
    /// Counts accumulated from a fixed start time (observe: since it started; a result: the run).
    Cumulative,
}

impl MetricKind {
    pub fn as_api(self) -> &'static str {
        match self {
            MetricKind::Gauge => "GAUGE",
            MetricKind::Cumulative => "CUMULATIVE",
        }
    }
}

/// The metric labels rttscope writes, bounded like the Prometheus exporter's: the view, which
/// side measured, the network namespace's name, the remote address cut to a prefix.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct SeriesLabels {
    pub view: String,
    pub side: String,
    pub netns: String,
    pub remote_prefix: String,
}

impl SeriesLabels {
    /// The overflow series of a view (more than [`MAX_SERIES`] label sets).
    pub fn overflow(view: &str) -> SeriesLabels {
        SeriesLabels {
            view: view.to_string(),
            side: "overflow".into(),
            netns: "overflow".into(),
            remote_prefix: "overflow".into(),
        }
    }

    fn to_api(&self) -> Value {
        // Label values: at most 1024 characters (a Cloud Monitoring limit); ours are cut at 100.
        let cut = |s: &str| -> String {
            let s: String = s.chars().filter(|c| !c.is_control()).take(100).collect();
            if s.is_empty() {
                "unknown".into()
            } else {
                s
            }
        };
        json!({
            "view": cut(&self.view),
            "side": cut(&self.side),
            "netns": cut(&self.netns),
            "remote_prefix": cut(&self.remote_prefix),
        })
    }
}

/// A remote address cut to a prefix (/24 for IPv4, /48 for IPv6 by default, IPv4-mapped IPv6 as
/// IPv4), the Prometheus exporter's default aggregation.
pub fn remote_prefix(ip: IpAddr, v4_bits: u8, v6_bits: u8) -> String {
    let net: ipnet::IpNet = match ip {
        IpAddr::V4(a) => ipnet::Ipv4Net::new(a, v4_bits.min(32))
            .map(|n| n.trunc().into())
            .unwrap_or_else(|_| ipnet::Ipv4Net::from(a).into()),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => return remote_prefix(IpAddr::V4(v4), v4_bits, v6_bits),
            None => ipnet::Ipv6Net::new(a, v6_bits.min(128))
                .map(|n| n.trunc().into())
                .unwrap_or_else(|_| ipnet::Ipv6Net::from(a).into()),
        },
    };
    net.to_string()
}

/// The monitored resource rttscope writes: `generic_node` (one of the resource types that
/// custom metrics may use) with the host's name as `node_id`. `project_id` is not written.
pub fn resource(hostname: &str) -> Value {
    let node: String = hostname
        .chars()
        .filter(|c| !c.is_control())
        .take(100)
        .collect();
    json!({
        "type": "generic_node",
        "labels": {"location": "global", "namespace": "rttscope", "node_id": if node.is_empty() { "unknown".to_string() } else { node }},
    })
}

/// A distribution as the API's `distributionValue` JSON: int64s as strings, trailing empty
/// buckets left out (the API reads them as zero).
pub fn distribution_to_api(d: &Distribution) -> Value {
    let mut counts: &[u64] = &d.bucket_counts;
    while let [rest @ .., 0] = counts {
        counts = rest;
    }
    let mut m = Map::new();
    m.insert("count".into(), json!(d.count.to_string()));
    m.insert("mean".into(), json!(if d.count > 0 { d.mean } else { 0.0 }));
    m.insert(
        "sumOfSquaredDeviation".into(),
        json!(if d.count > 1 {
            d.sum_of_squared_deviation.max(0.0)
        } else {
            0.0
        }),
    );
    if let (Some(min), Some(max)) = (d.min, d.max) {
        m.insert("range".into(), json!({"min": min, "max": max}));
    }
    m.insert("bucketOptions".into(), d.bucket_options.to_api());
    m.insert(
        "bucketCounts".into(),
        Value::Array(counts.iter().map(|c| json!(c.to_string())).collect()),
    );
    Value::Object(m)
}

/// One `TimeSeries` for `projects.timeSeries.create`: exactly one point.
pub fn time_series(
    labels: &SeriesLabels,
    resource: &Value,
    kind: MetricKind,
    start_unix_s: f64,
    end_unix_s: f64,
    d: &Distribution,
) -> Value {
    let interval = match kind {
        MetricKind::Gauge => json!({"endTime": rfc3339(end_unix_s)}),
        MetricKind::Cumulative => {
            // A non-zero interval: at least a millisecond.
            let end = end_unix_s.max(start_unix_s + 0.001);
            json!({"startTime": rfc3339(start_unix_s), "endTime": rfc3339(end)})
        }
    };
    json!({
        "metric": {"type": METRIC_TYPE, "labels": labels.to_api()},
        "resource": resource,
        "metricKind": kind.as_api(),
        "valueType": "DISTRIBUTION",
        "unit": d.unit.as_str(),
        "points": [{"interval": interval, "value": {"distributionValue": distribution_to_api(d)}}],
    })
}

/// Create request bodies (`{"timeSeries": [...]}`), at most [`MAX_SERIES_PER_REQUEST`] each.
pub fn requests(series: Vec<Value>) -> Vec<Value> {
    series
        .chunks(MAX_SERIES_PER_REQUEST)
        .map(|c| json!({"timeSeries": c}))
        .collect()
}

/// The remote address of a result's flow text (`10.0.0.1:4000 -> 10.0.0.2:5001`).
fn flow_remote(flow: &str) -> Option<IpAddr> {
    let remote = flow.split("->").nth(1)?.trim();
    remote
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip())
        .ok()
        .or_else(|| remote.parse::<IpAddr>().ok())
}

/// A saved result as create requests: one CUMULATIVE series per view (and flow), its samples in
/// `layout` over the run (start: `start_unix_s`, else the file's `created` time minus the span of
/// the samples; end: start + the last sample's time). Views without samples are left out.
pub fn result_requests(
    r: &RunResult,
    layout: &BucketOptions,
    unit: ValueUnit,
) -> Result<Vec<Value>> {
    let span = r
        .views
        .iter()
        .flat_map(|v| v.samples.iter().map(|s| s.t_s()))
        .filter(|t| t.is_finite())
        .fold(0.0f64, f64::max);
    let start = match r.start_unix_s {
        Some(s) => s,
        None => match parse_rfc3339(&r.created) {
            Some(c) => c - span,
            None => bail!(
                "the result has neither start_unix_s nor a readable created time ('{}')",
                r.created.chars().take(40).collect::<String>()
            ),
        },
    };
    let res = resource(&r.host.hostname);
    let mut series = Vec::new();
    for v in &r.views {
        if v.samples.is_empty() {
            continue;
        }
        let mut d = Distribution::new(layout.clone(), unit);
        let mut last = 0.0f64;
        for s in &v.samples {
            d.add_us(s.rtt_us);
            if s.t_s().is_finite() {
                last = last.max(s.t_s());
            }
        }
        let labels = SeriesLabels {
            view: v.name.clone(),
            side: v.side.clone().unwrap_or_else(|| "unknown".into()),
            netns: r
                .settings
                .get("netns")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            remote_prefix: v
                .flow
                .as_deref()
                .and_then(flow_remote)
                .map_or("unknown".into(), |ip| remote_prefix(ip, 24, 48)),
        };
        series.push(time_series(
            &labels,
            &res,
            MetricKind::Cumulative,
            start,
            start + last,
            &d,
        ));
    }
    if series.is_empty() {
        bail!("the result has no samples to write");
    }
    Ok(requests(series))
}

/// Live export for `observe --format cloud-monitoring`: every sample since the start in one
/// CUMULATIVE distribution per label set (at most [`MAX_SERIES`], more into one overflow series per
/// view). Each interval writes every series with the same start time and the interval's end.
#[derive(Debug, Clone)]
pub struct LiveExport {
    layout: BucketOptions,
    start_unix_s: f64,
    groups: BTreeMap<SeriesLabels, Distribution>,
    /// Samples that went to an overflow series.
    pub overflowed: u64,
}

impl LiveExport {
    pub fn new(layout: BucketOptions, start_unix_s: f64) -> LiveExport {
        LiveExport {
            layout,
            start_unix_s,
            groups: BTreeMap::new(),
            overflowed: 0,
        }
    }

    /// Add one sample (microseconds) to its label set.
    pub fn add(&mut self, labels: SeriesLabels, rtt_us: f64) {
        self.group(labels, 1).add_us(rtt_us);
    }

    /// Add a kernel histogram's samples (one flow's samples since the last read) to their label
    /// set, each kernel bucket spread over its values ([`Distribution::add_spread_us`]): every
    /// sample the kernel counted is in, a kernel bucket that straddles a bound of the layout is
    /// split in proportion.
    pub fn add_hist(&mut self, labels: SeriesLabels, h: &crate::analysis::hist::Hist) {
        let n = h.count();
        if n == 0 {
            return;
        }
        let d = self.group(labels, n);
        for (i, c) in h.buckets() {
            let (lo, hi) = crate::analysis::hist::bucket_bounds(i);
            d.add_spread_us(lo, hi, c);
        }
    }

    /// The distribution of a label set (the view's overflow set past [`MAX_SERIES`]), which is
    /// about to take `n` samples.
    fn group(&mut self, labels: SeriesLabels, n: u64) -> &mut Distribution {
        let labels = if self.groups.contains_key(&labels) || self.groups.len() < MAX_SERIES {
            labels
        } else {
            self.overflowed += n;
            SeriesLabels::overflow(&labels.view)
        };
        let layout = &self.layout;
        self.groups
            .entry(labels)
            .or_insert_with(|| Distribution::new(layout.clone(), ValueUnit::Ms))
    }

    /// Number of label sets so far.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The create requests for the state at `end_unix_s`.
    pub fn requests(&self, end_unix_s: f64, hostname: &str) -> Vec<Value> {
        let res = resource(hostname);
        requests(
            self.groups
                .iter()
                .map(|(l, d)| {
                    time_series(
                        l,
                        &res,
                        MetricKind::Cumulative,
                        self.start_unix_s,
                        end_unix_s,
                        d,
                    )
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::dist::vm_flow_preset;

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
    fn times_round_trip() {
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400.25), "2000-02-29T00:00:00.250Z");
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00.250Z"),
            Some(951_782_400.25)
        );
        assert_eq!(parse_rfc3339("2026-11-21T07:12:33Z"), Some(1_795_245_153.0));
        assert_eq!(
            parse_rfc3339("2026-11-21T08:12:33+01:00"),
            Some(1_795_245_153.0)
        );
        assert_eq!(
            parse_rfc3339("2026-11-21T07:12:33.000001Z")
                .map(|t| ((t - 1_795_245_153.0) * 1e6).round()),
            Some(1.0)
        );
        for t in [
            1_795_245_153.0,
            1_795_245_153.5,
            1_795_245_153.123_456,
            86_399.0,
        ] {
            let back = parse_rfc3339(&rfc3339(t)).unwrap();
            assert!((back - t).abs() < 1e-6, "{t} -> {} -> {back}", rfc3339(t));
        }
        for bad in [
            "",
            "2026-11-21",
            "2026-13-01T00:00:00Z",
            "2026-11-21T07:12:33",
            "2026-11-21T07:12:33.Z",
            "2026-11-21T25:00:00Z",
            "x026-11-21T07:12:33Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
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
