//! Bucket layouts in the REST API's JSON (`bucketOptions`): read from a Cloud Monitoring file
//! (`--layout-from`, `from:FILE`) and written back.
use super::layout::{BucketOptions, MAX_BUCKETS};

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

/// Which layout a `bucketOptions` object holds: exactly one of `linearBuckets`,
/// `exponentialBuckets`, `explicitBuckets`.
fn api_layout_kind(
    obj: &serde_json::Map<String, serde_json::Value>,
) -> Result<&'static str, String> {
    let kinds: Vec<&'static str> = ["linearBuckets", "exponentialBuckets", "explicitBuckets"]
        .into_iter()
        .filter(|k| obj.contains_key(*k))
        .collect();
    match kinds.as_slice() {
        [k] => Ok(*k),
        [] => Err(
            "bucketOptions has none of linearBuckets, exponentialBuckets, explicitBuckets".into(),
        ),
        _ => Err(format!(
            "bucketOptions has more than one layout ({})",
            kinds.join(", ")
        )),
    }
}

/// The finite number in field `f` of layout `kind`'s object `b`; 0 when it is missing (the
/// proto3 default).
fn api_field(
    b: &serde_json::Map<String, serde_json::Value>,
    kind: &str,
    f: &str,
) -> Result<f64, String> {
    match b.get(f) {
        None => Ok(0.0),
        Some(x) => api_number(x)
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("bucketOptions.{kind}.{f} is not a finite number: {x}")),
    }
}

/// The bucket count in field `f` of layout `kind`'s object `b`: a whole number from 0 to
/// [`MAX_BUCKETS`] (0 when missing, which validation refuses).
fn api_count(
    b: &serde_json::Map<String, serde_json::Value>,
    kind: &str,
    f: &str,
) -> Result<u32, String> {
    let n = api_field(b, kind, f)?;
    if n.fract() != 0.0 || !(0.0..=(MAX_BUCKETS as f64)).contains(&n) {
        return Err(format!(
            "bucketOptions.{kind}.{f} must be a whole number from 1 to {MAX_BUCKETS}, not {n}"
        ));
    }
    Ok(n as u32)
}

/// The `bounds` of an `explicitBuckets` object `b`: finite numbers, fewer than [`MAX_BUCKETS`];
/// none when missing.
fn api_bounds(b: &serde_json::Map<String, serde_json::Value>) -> Result<Vec<f64>, String> {
    match b.get("bounds") {
        None => Ok(Vec::new()),
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
                        format!(
                            "bucketOptions.explicitBuckets.bounds[{i}] is not a finite number: {x}"
                        )
                    })
                })
                .collect()
        }
        Some(x) => Err(format!(
            "bucketOptions.explicitBuckets.bounds is not an array: {x}"
        )),
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
        let kind = api_layout_kind(obj)?;
        let b = obj[kind]
            .as_object()
            .ok_or_else(|| format!("bucketOptions.{kind} is not an object"))?;
        let num = |f: &str| api_field(b, kind, f);
        let count = |f: &str| api_count(b, kind, f);
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
            _ => BucketOptions::Explicit {
                bounds: api_bounds(b)?,
            },
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
