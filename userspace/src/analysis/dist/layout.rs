//! Bucket layouts (`google.api.Distribution.BucketOptions`): linear, exponential and explicit,
//! their bounds and bucket index, the `vm_flow` preset and the command line's layout specs.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::DistError;

/// The largest number of buckets a layout may have (ours, to keep memory bounded; not a cloud limit).
pub const MAX_BUCKETS: usize = 10_000;

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

/// The layout a spec's kind and parameters name, not yet validated.
fn layout_of(kind: &str, rest: &str) -> Result<BucketOptions, String> {
    match kind {
        "vm_flow" | "vm-flow" | "vmflow" => vm_flow_spec(rest),
        "exponential" | "exp" => exponential_spec(rest),
        "linear" | "lin" => linear_spec(rest),
        "explicit" => explicit_spec(rest),
        other => Err(format!(
            "unknown layout '{other}' (use vm_flow, exponential, linear or explicit)"
        )),
    }
}

/// `vm_flow[:scale=1,growth=2,n=16]`: the preset with its defaults overridden.
fn vm_flow_spec(rest: &str) -> Result<BucketOptions, String> {
    let kv = parse_kv(rest, &["scale", "growth", "n"])?;
    let scale = kv.get("scale").copied().unwrap_or(1.0);
    let growth = kv.get("growth").copied().unwrap_or(2.0);
    let n = to_count(kv.get("n").copied().unwrap_or(16.0))?;
    vm_flow_with(scale, growth, n)
}

/// `exponential:scale=1,growth=2,n=64`: every parameter required.
fn exponential_spec(rest: &str) -> Result<BucketOptions, String> {
    let kv = parse_kv(rest, &["scale", "growth", "n"])?;
    Ok(BucketOptions::Exponential {
        scale: need(&kv, "scale")?,
        growth_factor: need(&kv, "growth")?,
        num_finite_buckets: to_count(need(&kv, "n")?)?,
    })
}

/// `linear:width=1,offset=0,n=100`: the offset defaults to 0.
fn linear_spec(rest: &str) -> Result<BucketOptions, String> {
    let kv = parse_kv(rest, &["width", "offset", "n"])?;
    Ok(BucketOptions::Linear {
        width: need(&kv, "width")?,
        offset: kv.get("offset").copied().unwrap_or(0.0),
        num_finite_buckets: to_count(need(&kv, "n")?)?,
    })
}

/// A key a spec must give ([`parse_kv`]'s map).
fn need(kv: &BTreeMap<String, f64>, k: &str) -> Result<f64, String> {
    kv.get(k)
        .copied()
        .ok_or_else(|| format!("'{k}=' is missing"))
}

/// `explicit:0,1,2,5,10`: the bounds as given.
fn explicit_spec(rest: &str) -> Result<BucketOptions, String> {
    if rest.is_empty() {
        return Err("give the bounds, e.g. explicit:0,1,2,5,10".into());
    }
    let bounds = rest
        .split(',')
        .map(|b| {
            b.trim()
                .parse::<f64>()
                .map_err(|_| format!("'{}' is not a number", b.trim()))
        })
        .collect::<Result<Vec<f64>, _>>()?;
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
        let opts = layout_of(kind, rest).map_err(bad)?;
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
