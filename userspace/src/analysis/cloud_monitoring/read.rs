//! Reading Cloud Monitoring files: a `projects.timeSeries.list` response (or create request
//! bodies, one per line) into [`CloudFile`]'s series and points, every malformed part refused in
//! one sentence naming its place; a file's points merged into one distribution.
use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::{Map, Value};

use super::time::{parse_rfc3339, rfc3339};
use crate::analysis::dist::{BucketOptions, Distribution, ValueUnit};

/// The cloud metric this module is mostly about.
pub const VM_FLOW_RTT: &str = "networking.googleapis.com/vm_flow/rtt";
/// Bounds of what is read: time series per file, points per series.
pub const MAX_READ_SERIES: usize = 100_000;

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

/// A series' metric: its type (empty when absent) and labels.
fn series_metric(
    m: &Map<String, Value>,
) -> std::result::Result<(String, BTreeMap<String, String>), String> {
    let metric = m.get("metric");
    let metric_type = match metric.and_then(|x| x.get("type")) {
        Some(Value::String(s)) => s.clone(),
        None => String::new(),
        Some(other) => return Err(format!("metric.type is not a string: {}", quote(other))),
    };
    let metric_labels = string_map(metric.and_then(|x| x.get("labels")), "metric.labels")?;
    Ok((metric_type, metric_labels))
}

/// A series' monitored resource: its type (empty when absent or not a string) and labels.
fn series_resource(
    m: &Map<String, Value>,
) -> std::result::Result<(String, BTreeMap<String, String>), String> {
    let resource = m.get("resource");
    let resource_type = resource
        .and_then(|x| x.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let resource_labels = string_map(resource.and_then(|x| x.get("labels")), "resource.labels")?;
    Ok((resource_type, resource_labels))
}

/// A series' text field `k` (empty when absent).
fn series_text(m: &Map<String, Value>, k: &str) -> std::result::Result<String, String> {
    match m.get(k) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{k} is not a string: {}", quote(other))),
    }
}

/// A series' points in `unit`, sorted by end time; an error names the point's index.
fn series_points(
    m: &Map<String, Value>,
    unit: ValueUnit,
) -> std::result::Result<Vec<CloudPoint>, (Option<usize>, String)> {
    let points = match m.get("points") {
        None => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(other) => return Err((None, format!("points is not an array: {}", quote(other)))),
    };
    let mut out = Vec::with_capacity(points.len());
    for (j, p) in points.iter().enumerate() {
        out.push(parse_point(p, unit).map_err(|e| (Some(j), e))?);
    }
    out.sort_by(|a, b| a.end_unix_s.total_cmp(&b.end_unix_s));
    Ok(out)
}

/// One TimeSeries object; an error carries the point's index when a point is at fault.
fn parse_series(
    ts: &Value,
    default_unit: Option<&str>,
) -> std::result::Result<CloudSeries, (Option<usize>, String)> {
    let whole = |e: String| (None, e);
    let m = ts
        .as_object()
        .ok_or_else(|| whole(format!("is not an object: {}", quote(ts))))?;
    let (metric_type, metric_labels) = series_metric(m).map_err(whole)?;
    let (resource_type, resource_labels) = series_resource(m).map_err(whole)?;
    let metric_kind = series_text(m, "metricKind").map_err(whole)?;
    let value_type = series_text(m, "valueType").map_err(whole)?;
    let unit_text = series_text(m, "unit").map_err(whole)?;
    let unit_text = if unit_text.is_empty() {
        default_unit.unwrap_or("")
    } else {
        unit_text.as_str()
    };
    let given = unit_of(unit_text);
    let unit = given.unwrap_or(ValueUnit::Ms);
    let points = series_points(m, unit)?;
    Ok(CloudSeries {
        metric_type,
        metric_labels,
        resource_type,
        resource_labels,
        metric_kind,
        value_type,
        unit,
        unit_given: given.is_some(),
        points,
    })
}

/// Parse a Cloud Monitoring document: a `projects.timeSeries.list` response, a create request
/// body (both `{"timeSeries": [...]}`), a bare array of TimeSeries, or JSON Lines of these
/// (`observe --format cloud-monitoring`). Series with the same metric and resource (from several
/// lines or pages) are merged. Errors are one sentence naming the file, the series, the point and
/// the field.
pub fn parse(text: &str, name: &str) -> Result<CloudFile> {
    let docs = documents(text, name)?;
    let mut series: Vec<CloudSeries> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut number = 0usize;
    for (line, doc) in &docs {
        let at = line.map_or(String::new(), |l| format!(" line {l}"));
        let (list, unit) = series_list(doc, name, &at)?;
        for ts in list {
            number += 1;
            if number > MAX_READ_SERIES {
                bail!("{name} holds more than {MAX_READ_SERIES} time series");
            }
            let s = parse_series(ts, unit)
                .map_err(|(point, e)| series_error(name, &at, number, ts, point, e))?;
            add_series(&mut series, &mut index, s);
        }
    }
    Ok(CloudFile {
        name: name.to_string(),
        series,
    })
}

/// The JSON documents of a file, each with its line number when the file is JSON Lines (`None`
/// when the whole text is one document). A key named twice in one object is refused.
fn documents(text: &str, name: &str) -> Result<Vec<(Option<usize>, Value)>> {
    // strict_json: an object that names a key twice is refused (serde_json keeps the last).
    let dup = |e: &serde_json::Error| e.classify() == serde_json::error::Category::Data;
    let whole = match crate::analysis::strict_json::from_str(text) {
        Ok(v) => return Ok(vec![(None, v)]),
        Err(e) if dup(&e) => bail!("{name} is not a Cloud Monitoring file: {e}"),
        Err(whole) => whole,
    };
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
    Ok(docs)
}

/// The TimeSeries of one document (`{"timeSeries": [...]}`, a bare array, or one bare
/// TimeSeries) and the document's default unit; `at` names its line in errors.
fn series_list<'a>(doc: &'a Value, name: &str, at: &str) -> Result<(&'a [Value], Option<&'a str>)> {
    Ok(match doc {
        Value::Array(a) => (a.as_slice(), None),
        Value::Object(m) => match m.get("timeSeries") {
            Some(Value::Array(a)) => (a.as_slice(), m.get("unit").and_then(Value::as_str)),
            None if m.contains_key("points") => (std::slice::from_ref(doc), None),
            None => {
                bail!("{name}{at} has no timeSeries (expected a projects.timeSeries.list response)")
            }
            Some(other) => bail!("{name}{at}: timeSeries is not an array: {}", quote(other)),
        },
        other => bail!("{name}{at} is not a timeSeries document: {}", quote(other)),
    })
}

/// The error sentence of a bad series: the file, line, series number and metric type, the
/// point (1-based) when one is at fault, and what is wrong.
fn series_error(
    name: &str,
    at: &str,
    number: usize,
    ts: &Value,
    point: Option<usize>,
    e: String,
) -> anyhow::Error {
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
}

/// Add a series to `series`, merged (points joined, sorted by end time) into an earlier one
/// with the same metric, resource, kind and value type; `index` maps that identity to its place.
fn add_series(series: &mut Vec<CloudSeries>, index: &mut BTreeMap<String, usize>, s: CloudSeries) {
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
