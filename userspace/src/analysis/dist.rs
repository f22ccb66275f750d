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
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The largest number of buckets a layout may have (ours, to keep memory bounded; not a cloud limit).
pub const MAX_BUCKETS: usize = 10_000;

/// The default alignment period (the smallest the vm_flow metrics offer).
pub const DEFAULT_ALIGNMENT_PERIOD_S: f64 = 60.0;

/// The percentiles the Cloud Monitoring aligners offer and rttscope prints by default.
pub const DEFAULT_PERCENTILES: [f64; 3] = [50.0, 95.0, 99.0];

#[derive(Debug, Error, PartialEq)]
pub enum DistError {
    #[error("bad bucket layout '{spec}': {why}")]
    BadLayout { spec: String, why: String },
    #[error("percentile {0} is outside 0..=100")]
    BadPercentile(f64),
    #[error("cannot merge distributions with different layouts ({ours} and {theirs})")]
    LayoutMismatch { ours: String, theirs: String },
    #[error("alignment period must be a positive number of seconds, not {0}")]
    BadPeriod(f64),
}

/// The unit of a distribution's values (the cloud metric uses milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ValueUnit {
    Us,
    #[default]
    Ms,
    S,
}

impl ValueUnit {
    /// Microseconds per one of this unit.
    pub fn us_per_unit(self) -> f64 {
        match self {
            ValueUnit::Us => 1.0,
            ValueUnit::Ms => 1e3,
            ValueUnit::S => 1e6,
        }
    }
    /// Convert microseconds into this unit.
    pub fn from_us(self, us: f64) -> f64 {
        us / self.us_per_unit()
    }
    /// Convert a value in this unit into microseconds.
    pub fn to_us(self, v: f64) -> f64 {
        v * self.us_per_unit()
    }
    pub fn as_str(self) -> &'static str {
        match self {
            ValueUnit::Us => "us",
            ValueUnit::Ms => "ms",
            ValueUnit::S => "s",
        }
    }
}

impl fmt::Display for ValueUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `google.api.Distribution.BucketOptions`: one of three layouts, always with an underflow bucket
/// (number 0) and an overflow bucket (number N-1) around the finite ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum BucketOptions {
    Linear {
        num_finite_buckets: u32,
        width: f64,
        offset: f64,
    },
    Exponential {
        num_finite_buckets: u32,
        growth_factor: f64,
        scale: f64,
    },
    Explicit {
        bounds: Vec<f64>,
    },
}

/// The assumed `vm_flow/rtt` layout, in milliseconds: bounds 0, then `scale * growth^i` for
/// i = 0..=n, i.e. 0, 1, 2, 4, ..., 65536 ms with the defaults (17 finite buckets). An assumption:
/// only the 0-1 ms first bucket and the unit are known (see the module documentation).
pub fn vm_flow_preset() -> BucketOptions {
    vm_flow_with(1.0, 2.0, 16).expect("the default preset is valid")
}

fn vm_flow_with(scale: f64, growth: f64, n: u32) -> Result<BucketOptions, String> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(format!("scale must be > 0, not {scale}"));
    }
    if !(growth.is_finite() && growth > 1.0) {
        return Err(format!("growth must be > 1, not {growth}"));
    }
    if n as usize + 3 > MAX_BUCKETS {
        return Err(format!("n must be at most {}", MAX_BUCKETS - 3));
    }
    let mut bounds = vec![0.0];
    bounds.extend((0..=n).map(|i| scale * growth.powi(i as i32)));
    Ok(BucketOptions::Explicit { bounds })
}

impl BucketOptions {
    /// Parse a layout spec: `vm_flow[:scale=1,growth=2,n=16]`,
    /// `exponential:scale=1,growth=2,n=64`, `linear:width=1,offset=0,n=100`, `explicit:0,1,2,5,10`.
    pub fn parse(spec: &str) -> Result<BucketOptions, DistError> {
        let bad = |why: String| DistError::BadLayout {
            spec: spec.to_string(),
            why,
        };
        let s = spec.trim();
        let (kind, rest) = match s.split_once(':') {
            Some((k, r)) => (k.trim(), r.trim()),
            None => (s, ""),
        };
        let opts = match kind {
            "vm_flow" | "vm-flow" | "vmflow" => {
                let kv = parse_kv(rest, &["scale", "growth", "n"]).map_err(bad)?;
                let scale = kv.get("scale").copied().unwrap_or(1.0);
                let growth = kv.get("growth").copied().unwrap_or(2.0);
                let n = to_count(kv.get("n").copied().unwrap_or(16.0)).map_err(bad)?;
                vm_flow_with(scale, growth, n).map_err(bad)?
            }
            "exponential" | "exp" => {
                let kv = parse_kv(rest, &["scale", "growth", "n"]).map_err(bad)?;
                let need = |k: &str| {
                    kv.get(k)
                        .copied()
                        .ok_or_else(|| bad(format!("'{k}=' is missing")))
                };
                BucketOptions::Exponential {
                    scale: need("scale")?,
                    growth_factor: need("growth")?,
                    num_finite_buckets: to_count(need("n")?).map_err(bad)?,
                }
            }
            "linear" | "lin" => {
                let kv = parse_kv(rest, &["width", "offset", "n"]).map_err(bad)?;
                let need = |k: &str| {
                    kv.get(k)
                        .copied()
                        .ok_or_else(|| bad(format!("'{k}=' is missing")))
                };
                BucketOptions::Linear {
                    width: need("width")?,
                    offset: kv.get("offset").copied().unwrap_or(0.0),
                    num_finite_buckets: to_count(need("n")?).map_err(bad)?,
                }
            }
            "explicit" => {
                if rest.is_empty() {
                    return Err(bad("give the bounds, e.g. explicit:0,1,2,5,10".into()));
                }
                let bounds = rest
                    .split(',')
                    .map(|b| {
                        b.trim()
                            .parse::<f64>()
                            .map_err(|_| bad(format!("'{}' is not a number", b.trim())))
                    })
                    .collect::<Result<Vec<f64>, _>>()?;
                BucketOptions::Explicit { bounds }
            }
            other => {
                return Err(bad(format!(
                    "unknown layout '{other}' (use vm_flow, exponential, linear or explicit)"
                )))
            }
        };
        opts.validate().map_err(bad)?;
        Ok(opts)
    }

    /// Check the constraints the API documents (and our bucket cap).
    pub fn validate(&self) -> Result<(), String> {
        match self {
            BucketOptions::Linear {
                num_finite_buckets,
                width,
                offset,
            } => {
                if *num_finite_buckets == 0 {
                    return Err("n must be > 0".into());
                }
                if !(width.is_finite() && *width > 0.0) {
                    return Err(format!("width must be > 0, not {width}"));
                }
                if !offset.is_finite() {
                    return Err("offset must be finite".into());
                }
            }
            BucketOptions::Exponential {
                num_finite_buckets,
                growth_factor,
                scale,
            } => {
                if *num_finite_buckets == 0 {
                    return Err("n must be > 0".into());
                }
                if !(growth_factor.is_finite() && *growth_factor > 1.0) {
                    return Err(format!("growth must be > 1, not {growth_factor}"));
                }
                if !(scale.is_finite() && *scale > 0.0) {
                    return Err(format!("scale must be > 0, not {scale}"));
                }
                let top = scale * growth_factor.powf(*num_finite_buckets as f64);
                if !top.is_finite() {
                    return Err("the largest bound overflows; use fewer buckets".into());
                }
            }
            BucketOptions::Explicit { bounds } => {
                if bounds.is_empty() {
                    return Err("at least one bound is needed".into());
                }
                if bounds.iter().any(|b| !b.is_finite()) {
                    return Err("bounds must be finite".into());
                }
                if bounds.windows(2).any(|w| w[0] >= w[1]) {
                    return Err("bounds must be strictly increasing".into());
                }
            }
        }
        if self.num_buckets() > MAX_BUCKETS {
            return Err(format!("at most {MAX_BUCKETS} buckets"));
        }
        Ok(())
    }

    /// N: the number of buckets including underflow and overflow.
    pub fn num_buckets(&self) -> usize {
        match self {
            BucketOptions::Linear {
                num_finite_buckets, ..
            }
            | BucketOptions::Exponential {
                num_finite_buckets, ..
            } => *num_finite_buckets as usize + 2,
            BucketOptions::Explicit { bounds } => bounds.len() + 1,
        }
    }

    /// Lower bound of bucket `i` (`-inf` for the underflow bucket 0).
    pub fn lower(&self, i: usize) -> f64 {
        if i == 0 {
            return f64::NEG_INFINITY;
        }
        self.finite_bound(i - 1)
    }

    /// Upper bound of bucket `i` (`+inf` for the overflow bucket N-1).
    pub fn upper(&self, i: usize) -> f64 {
        if i + 1 >= self.num_buckets() {
            return f64::INFINITY;
        }
        self.finite_bound(i)
    }

    /// The k-th boundary (k = 0..=N-2): the upper bound of bucket k, the lower bound of bucket k+1.
    fn finite_bound(&self, k: usize) -> f64 {
        match self {
            BucketOptions::Linear { width, offset, .. } => offset + width * k as f64,
            BucketOptions::Exponential {
                growth_factor,
                scale,
                ..
            } => scale * growth_factor.powi(k as i32),
            BucketOptions::Explicit { bounds } => bounds[k],
        }
    }

    /// The bucket a value falls into (`[lower, upper)`). NaN is not a value: callers filter it.
    pub fn index(&self, v: f64) -> usize {
        let n = self.num_buckets();
        let guess = match self {
            BucketOptions::Linear { width, offset, .. } => {
                let x = (v - offset) / width;
                if x < 0.0 {
                    0
                } else {
                    (x.floor() as usize).saturating_add(1).min(n - 1)
                }
            }
            BucketOptions::Exponential {
                growth_factor,
                scale,
                ..
            } => {
                if v < *scale {
                    0
                } else {
                    let x = (v / scale).ln() / growth_factor.ln();
                    (x.floor() as usize).saturating_add(1).min(n - 1)
                }
            }
            BucketOptions::Explicit { bounds } => bounds.partition_point(|b| *b <= v),
        };
        // Floating-point rounding in the closed forms can be off by one at a boundary: settle it
        // against the bounds themselves.
        let mut i = guess;
        while i > 0 && v < self.lower(i) {
            i -= 1;
        }
        while i + 1 < n && v >= self.upper(i) {
            i += 1;
        }
        i
    }

    /// A canonical spec string that [`BucketOptions::parse`] reads back.
    pub fn spec(&self) -> String {
        match self {
            BucketOptions::Linear {
                num_finite_buckets,
                width,
                offset,
            } => format!("linear:width={width},offset={offset},n={num_finite_buckets}"),
            BucketOptions::Exponential {
                num_finite_buckets,
                growth_factor,
                scale,
            } => format!("exponential:scale={scale},growth={growth_factor},n={num_finite_buckets}"),
            BucketOptions::Explicit { bounds } => {
                let b: Vec<String> = bounds.iter().map(|b| b.to_string()).collect();
                format!("explicit:{}", b.join(","))
            }
        }
    }
}

/// The largest layout file `--layout-from` / `from:FILE` reads (bounded memory).
pub const MAX_LAYOUT_FILE_BYTES: u64 = 256 << 20;

/// A JSON number, or a number written as a JSON string (the proto3 JSON mapping writes int64
/// values as strings and may write doubles as strings, including "NaN" and "Infinity").
fn api_number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => match s.trim() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            t => t.parse::<f64>().ok(),
        },
        _ => None,
    }
}

impl BucketOptions {
    /// Build a layout from the JSON of a `google.api.Distribution.BucketOptions` as the Cloud
    /// Monitoring REST API writes it: exactly one of `linearBuckets {numFiniteBuckets, width,
    /// offset}`, `exponentialBuckets {numFiniteBuckets, growthFactor, scale}`, `explicitBuckets
    /// {bounds}`. A missing numeric field is its proto3 default (0), which validation then refuses
    /// where the API requires more (offset 0 is valid). The error names the field.
    pub fn from_api(v: &serde_json::Value) -> Result<BucketOptions, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "bucketOptions is not an object".to_string())?;
        let kinds: Vec<&str> = ["linearBuckets", "exponentialBuckets", "explicitBuckets"]
            .into_iter()
            .filter(|k| obj.contains_key(*k))
            .collect();
        let kind =
            match kinds.as_slice() {
                [k] => *k,
                [] => return Err(
                    "bucketOptions has none of linearBuckets, exponentialBuckets, explicitBuckets"
                        .into(),
                ),
                _ => {
                    return Err(format!(
                        "bucketOptions has more than one layout ({})",
                        kinds.join(", ")
                    ))
                }
            };
        let b = obj[kind]
            .as_object()
            .ok_or_else(|| format!("bucketOptions.{kind} is not an object"))?;
        let num = |f: &str| -> Result<f64, String> {
            match b.get(f) {
                None => Ok(0.0),
                Some(x) => api_number(x)
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| format!("bucketOptions.{kind}.{f} is not a finite number: {x}")),
            }
        };
        let count = |f: &str| -> Result<u32, String> {
            let n = num(f)?;
            if n.fract() != 0.0 || !(0.0..=(MAX_BUCKETS as f64)).contains(&n) {
                return Err(format!(
                    "bucketOptions.{kind}.{f} must be a whole number from 1 to {MAX_BUCKETS}, not {n}"
                ));
            }
            Ok(n as u32)
        };
        let opts = match kind {
            "linearBuckets" => BucketOptions::Linear {
                num_finite_buckets: count("numFiniteBuckets")?,
                width: num("width")?,
                offset: num("offset")?,
            },
            "exponentialBuckets" => BucketOptions::Exponential {
                num_finite_buckets: count("numFiniteBuckets")?,
                growth_factor: num("growthFactor")?,
                scale: num("scale")?,
            },
            _ => {
                let bounds = match b.get("bounds") {
                    None => Vec::new(),
                    Some(serde_json::Value::Array(a)) => {
                        if a.len() >= MAX_BUCKETS {
                            return Err(format!(
                                "bucketOptions.explicitBuckets.bounds has {} bounds, more than {}",
                                a.len(),
                                MAX_BUCKETS - 1
                            ));
                        }
                        a.iter()
                            .enumerate()
                            .map(|(i, x)| {
                                api_number(x).filter(|x| x.is_finite()).ok_or_else(|| {
                                    format!("bucketOptions.explicitBuckets.bounds[{i}] is not a finite number: {x}")
                                })
                            })
                            .collect::<Result<Vec<f64>, String>>()?
                    }
                    Some(x) => {
                        return Err(format!(
                            "bucketOptions.explicitBuckets.bounds is not an array: {x}"
                        ))
                    }
                };
                BucketOptions::Explicit { bounds }
            }
        };
        opts.validate()
            .map_err(|why| format!("bucketOptions.{kind}: {why}"))?;
        Ok(opts)
    }

    /// The layout as the REST API's `bucketOptions` JSON (the inverse of [`Self::from_api`]).
    pub fn to_api(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            BucketOptions::Linear {
                num_finite_buckets,
                width,
                offset,
            } => json!({"linearBuckets": {
                "numFiniteBuckets": num_finite_buckets, "width": width, "offset": offset}}),
            BucketOptions::Exponential {
                num_finite_buckets,
                growth_factor,
                scale,
            } => json!({"exponentialBuckets": {
                "numFiniteBuckets": num_finite_buckets, "growthFactor": growth_factor, "scale": scale}}),
            BucketOptions::Explicit { bounds } => json!({"explicitBuckets": {"bounds": bounds}}),
        }
    }
}

/// Every `bucketOptions` object in a JSON document, in document order (depth first).
fn collect_bucket_options<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if k == "bucketOptions" {
                    out.push(x);
                } else {
                    collect_bucket_options(x, out);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_bucket_options(x, out)),
        _ => {}
    }
}

/// The bucket layout of a Cloud Monitoring file (`projects.timeSeries.list` response, or
/// rttscope's own `--format cloud-monitoring` output, also as JSON Lines): the `bucketOptions`
/// of its distribution points. Every point must use the same layout; a file without a
/// distribution point has no layout. `name` is used in the error sentence.
pub fn layout_from_json(text: &str, name: &str) -> Result<BucketOptions, String> {
    let docs: Vec<serde_json::Value> = match serde_json::from_str(text) {
        Ok(v) => vec![v],
        Err(whole) => {
            let mut docs = Vec::new();
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                docs.push(serde_json::from_str(line).map_err(|e| {
                    if i == 0 {
                        format!("{name} is not JSON: {whole}")
                    } else {
                        format!("{name} line {} is not JSON: {e}", i + 1)
                    }
                })?);
            }
            docs
        }
    };
    let mut found = Vec::new();
    for d in &docs {
        collect_bucket_options(d, &mut found);
    }
    let first = found.first().ok_or_else(|| {
        format!("{name} holds no distribution point with bucketOptions (a DOUBLE series from an aligner carries no layout)")
    })?;
    let layout = BucketOptions::from_api(first).map_err(|e| format!("{name}: {e}"))?;
    for (i, o) in found.iter().enumerate().skip(1) {
        let other = BucketOptions::from_api(o).map_err(|e| format!("{name}: {e}"))?;
        if other != layout {
            return Err(format!(
                "{name} holds more than one bucket layout ({} and, at distribution {}, {}): pick one series",
                layout.spec(),
                i + 1,
                other.spec()
            ));
        }
    }
    Ok(layout)
}

/// [`layout_from_json`] of a file (at most [`MAX_LAYOUT_FILE_BYTES`]).
pub fn layout_from_file(path: &std::path::Path) -> Result<BucketOptions, String> {
    let name = path.display().to_string();
    let text = crate::sys::files::read_to_string_capped(path, MAX_LAYOUT_FILE_BYTES)
        .map_err(|e| e.to_string())?;
    layout_from_json(&text, &name)
}

fn parse_kv(rest: &str, keys: &[&str]) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    if rest.is_empty() {
        return Ok(out);
    }
    for part in rest.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("'{}' is not key=value", part.trim()))?;
        let k = match k.trim() {
            "growth_factor" => "growth",
            "num_finite_buckets" => "n",
            other => other,
        };
        if !keys.contains(&k) {
            return Err(format!("unknown key '{k}' (known: {})", keys.join(", ")));
        }
        let v: f64 = v
            .trim()
            .parse()
            .map_err(|_| format!("'{}' is not a number", v.trim()))?;
        if !v.is_finite() {
            return Err(format!("'{k}' must be finite"));
        }
        out.insert(k.to_string(), v);
    }
    Ok(out)
}

fn to_count(v: f64) -> Result<u32, String> {
    if v.fract() != 0.0 || !(1.0..=(MAX_BUCKETS as f64)).contains(&v) {
        return Err(format!(
            "n must be a whole number between 1 and {MAX_BUCKETS}, not {v}"
        ));
    }
    Ok(v as u32)
}

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
mod add_n_tests {
    use super::*;

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
