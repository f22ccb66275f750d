//! The Prometheus protobuf exposition format (`io.prometheus.client.MetricFamily`,
//! length-delimited), which Prometheus asks for when native histograms are
//! enabled: every family of the OpenMetrics text, with `rttscope_rtt_seconds`
//! carrying its native (sparse exponential) buckets beside the classic ones.
//!
//! The messages are the ones of Prometheus' `io/prometheus/client/metrics.proto`
//! (proto2; field numbers as there), declared with prost's derive so that no
//! protoc is needed at build time. prometheus-client's own `protobuf` feature
//! writes the OpenMetrics protobuf (`openmetrics.MetricSet`), which Prometheus
//! 2.x does not scrape and which has no native buckets.
//!
//! The families are taken from the registry's OpenMetrics text (rendered once
//! per interval anyway), so both formats carry the same values.
use std::collections::HashMap;

use super::native::{Native, ZERO_THRESHOLD};

/// What a scraper gets when it asks for the protobuf format.
pub const CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Gauge {
    #[prost(double, tag = "1")]
    pub value: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Counter {
    #[prost(double, tag = "1")]
    pub value: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Untyped {
    #[prost(double, tag = "1")]
    pub value: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    #[prost(uint64, tag = "1")]
    pub cumulative_count: u64,
    #[prost(double, tag = "2")]
    pub upper_bound: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketSpan {
    #[prost(sint32, tag = "1")]
    pub offset: i32,
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    #[prost(uint64, tag = "1")]
    pub sample_count: u64,
    #[prost(double, tag = "2")]
    pub sample_sum: f64,
    #[prost(message, repeated, tag = "3")]
    pub bucket: Vec<Bucket>,
    #[prost(sint32, tag = "5")]
    pub schema: i32,
    #[prost(double, tag = "6")]
    pub zero_threshold: f64,
    #[prost(uint64, tag = "7")]
    pub zero_count: u64,
    #[prost(message, repeated, tag = "12")]
    pub positive_span: Vec<BucketSpan>,
    #[prost(sint64, repeated, packed = "false", tag = "13")]
    pub positive_delta: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    #[prost(message, optional, tag = "2")]
    pub gauge: Option<Gauge>,
    #[prost(message, optional, tag = "3")]
    pub counter: Option<Counter>,
    #[prost(message, optional, tag = "5")]
    pub untyped: Option<Untyped>,
    #[prost(message, optional, tag = "7")]
    pub histogram: Option<Histogram>,
}

/// `MetricType` of metrics.proto.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Untyped = 3,
    Histogram = 4,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricFamily {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub help: String,
    #[prost(int32, tag = "3")]
    pub r#type: i32,
    #[prost(message, repeated, tag = "4")]
    pub metric: Vec<Metric>,
}

/// Label pairs as a lookup key: sorted by name.
pub type LabelKey = Vec<(String, String)>;

/// Sorted label pairs (the key of a native histogram).
pub fn label_key(mut pairs: Vec<(String, String)>) -> LabelKey {
    pairs.sort();
    pairs
}

/// One parsed sample line: metric name, labels, value.
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// Parse `name{a="x",b="y"} value` (our own OpenMetrics output: labels
/// quoted, `\\`, `\"` and `\n` escaped).
fn parse_sample(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = Vec::new();
    let rest = if let Some(mut r) = rest.strip_prefix('{') {
        loop {
            r = r.trim_start_matches(',');
            if let Some(after) = r.strip_prefix('}') {
                break after;
            }
            let (k, after) = r.split_once("=\"")?;
            let mut v = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => v.push('\n'),
                        c => v.push(c),
                    },
                    (_, c) => v.push(c),
                }
            };
            labels.push((k.to_string(), v));
            r = &after[end + 1..];
        }
    } else {
        rest
    };
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

fn unescape_help(s: &str) -> String {
    s.replace("\\n", "\n")
        .replace("\\\"", "\"")
        .replace("\\\\", "\\")
}

/// A family being assembled from the text.
struct Fam {
    name: String,
    help: String,
    typ: MetricType,
    metrics: Vec<Metric>,
    /// Histogram series by label set (without `le`): index into `metrics`.
    index: HashMap<LabelKey, usize>,
}

impl Fam {
    fn new(name: &str, typ: &str) -> Fam {
        let typ = match typ {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            _ => MetricType::Untyped,
        };
        // The protobuf format names a counter family like its sample.
        let name = if typ == MetricType::Counter && !name.ends_with("_total") {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        Fam {
            name,
            help: String::new(),
            typ,
            metrics: Vec::new(),
            index: HashMap::new(),
        }
    }

    fn add(&mut self, s: Sample) {
        let label = |l: &[(String, String)]| {
            l.iter()
                .map(|(n, v)| LabelPair {
                    name: n.clone(),
                    value: v.clone(),
                })
                .collect()
        };
        let mut m = Metric {
            label: label(&s.labels),
            ..Default::default()
        };
        match self.typ {
            MetricType::Counter => m.counter = Some(Counter { value: s.value }),
            MetricType::Gauge => m.gauge = Some(Gauge { value: s.value }),
            MetricType::Untyped => m.untyped = Some(Untyped { value: s.value }),
            MetricType::Histogram => return self.add_hist(s, label),
        }
        self.metrics.push(m);
    }

    fn add_hist(&mut self, s: Sample, label: impl Fn(&[(String, String)]) -> Vec<LabelPair>) {
        let le = s
            .labels
            .iter()
            .find(|(n, _)| n == "le")
            .map(|(_, v)| v.clone());
        let rest: Vec<(String, String)> = s.labels.into_iter().filter(|(n, _)| n != "le").collect();
        let key = label_key(rest.clone());
        let i = *self.index.entry(key).or_insert_with(|| {
            self.metrics.push(Metric {
                label: label(&rest),
                histogram: Some(Histogram::default()),
                ..Default::default()
            });
            self.metrics.len() - 1
        });
        let h = self.metrics[i]
            .histogram
            .as_mut()
            .expect("histogram metric");
        let suffix = s.name.strip_prefix(self.name.as_str()).unwrap_or("");
        match (suffix, le) {
            ("_sum", _) => h.sample_sum = s.value,
            ("_count", _) => h.sample_count = s.value as u64,
            ("_bucket", Some(le)) => {
                let ub = parse_value(&le).unwrap_or(f64::INFINITY);
                // +Inf is implied by the count in this format.
                if ub.is_finite() {
                    h.bucket.push(Bucket {
                        cumulative_count: s.value as u64,
                        upper_bound: ub,
                    });
                }
            }
            _ => {}
        }
    }

    /// Attach native buckets to the series that have them.
    fn attach(&mut self, natives: &HashMap<LabelKey, Native>) {
        for (key, &i) in &self.index {
            let Some(n) = natives.get(key) else { continue };
            let h = self.metrics[i]
                .histogram
                .as_mut()
                .expect("histogram metric");
            let (spans, deltas) = n.spans_deltas();
            h.schema = n.schema;
            h.zero_threshold = ZERO_THRESHOLD;
            h.zero_count = n.zero_count;
            h.positive_span = spans
                .into_iter()
                .map(|(offset, length)| BucketSpan { offset, length })
                .collect();
            h.positive_delta = deltas;
        }
    }

    fn finish(self) -> MetricFamily {
        MetricFamily {
            name: self.name,
            help: self.help,
            r#type: self.typ as i32,
            metric: self.metrics,
        }
    }
}

/// The families of an OpenMetrics text, with `natives[labels]` added to the
/// histogram family `native_family`.
pub fn families(
    openmetrics: &str,
    native_family: &str,
    natives: &HashMap<LabelKey, Native>,
) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    let mut cur: Option<Fam> = None;
    let mut help: HashMap<String, String> = HashMap::new();
    let finish = |f: Fam, out: &mut Vec<MetricFamily>| {
        let mut f = f;
        if f.name == native_family {
            f.attach(natives);
        }
        out.push(f.finish());
    };
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), unescape_help(text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, typ) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            if let Some(f) = cur.take() {
                finish(f, &mut out);
            }
            let mut f = Fam::new(name, typ);
            f.help = help.remove(name).unwrap_or_default();
            cur = Some(f);
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else if let (Some(f), Some(s)) = (cur.as_mut(), parse_sample(line)) {
            f.add(s);
        }
    }
    if let Some(f) = cur.take() {
        finish(f, &mut out);
    }
    out
}

/// The length-delimited protobuf of the families (what `/metrics` serves).
pub fn encode(families: &[MetricFamily]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(families.len() * 256);
    for f in families {
        // Writing into a Vec cannot run out of room.
        let _ = prost::Message::encode_length_delimited(f, &mut buf);
    }
    buf
}

/// Decode length-delimited families (tests; what a scraper does).
pub fn decode(mut buf: &[u8]) -> Result<Vec<MetricFamily>, prost::DecodeError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        out.push(<MetricFamily as prost::Message>::decode_length_delimited(
            &mut buf,
        )?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP rttscope_rtt_seconds RTT "samples" \\ per view.
# TYPE rttscope_rtt_seconds histogram
# UNIT rttscope_rtt_seconds seconds
rttscope_rtt_seconds_sum{view="tcp",side="client"} 0.5
rttscope_rtt_seconds_count{view="tcp",side="client"} 3
rttscope_rtt_seconds_bucket{le="0.001",view="tcp",side="client"} 1
rttscope_rtt_seconds_bucket{le="+Inf",view="tcp",side="client"} 3
# HELP rttscope_samples RTT samples.
# TYPE rttscope_samples counter
rttscope_samples_total{view="tcp"} 250
# TYPE rttscope_series gauge
rttscope_series 7
rttscope_build_info{version="a\"b"} 1
# EOF
"#;

    #[test]
    fn text_to_families_with_native_buckets() {
        let mut natives = HashMap::new();
        natives.insert(
            label_key(vec![
                ("view".into(), "tcp".into()),
                ("side".into(), "client".into()),
            ]),
            Native {
                schema: 3,
                zero_count: 0,
                count: 3,
                sum_s: 0.5,
                buckets: vec![(-80, 1), (-10, 2)],
            },
        );
        let fams = families(TEXT, "rttscope_rtt_seconds", &natives);
        let bytes = encode(&fams);
        let back = decode(&bytes).unwrap();
        assert_eq!(back, fams);
        assert_eq!(back.len(), 3);
        let h = &back[0];
        assert_eq!(h.name, "rttscope_rtt_seconds");
        assert_eq!(h.help, "RTT \"samples\" \\ per view.");
        assert_eq!(h.r#type, MetricType::Histogram as i32);
        let hm = h.metric[0].histogram.as_ref().unwrap();
        assert_eq!((hm.sample_count, hm.sample_sum), (3, 0.5));
        assert_eq!(hm.bucket.len(), 1, "+Inf is implied");
        assert_eq!(hm.schema, 3);
        assert_eq!(hm.positive_delta, vec![1, 1]);
        assert_eq!(hm.positive_span.len(), 2);
        assert_eq!(h.metric[0].label.len(), 2);
        assert_eq!(back[1].name, "rttscope_samples_total");
        assert_eq!(back[1].metric[0].counter.as_ref().unwrap().value, 250.0);
        assert_eq!(back[2].metric.len(), 2);
        assert_eq!(back[2].metric[1].label[0].value, "a\"b");
    }
}
