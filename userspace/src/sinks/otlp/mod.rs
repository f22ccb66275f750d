//! OTLP/HTTP export (`observe --otlp URL`): the metrics of `/metrics` pushed
//! as OTLP protobuf to an OpenTelemetry Collector or any OTLP receiver
//! (Prometheus' `/api/v1/otlp/v1/metrics`), RTT as exponential histograms.
//!
//! Delivery never blocks the kernel reads: the observe loop renders a
//! request (cumulative temporality: each one carries every count since the
//! start, so losing one loses no samples) and puts it into a bounded queue
//! ([`push::QUEUE`] requests); a thread of its own POSTs them, retries with
//! backoff and, at exit, sends only the last one within a deadline
//! ([`push`]). Where and how: flags, TOML and the OpenTelemetry environment
//! ([`settings`]); http:// or https:// with headers and gzip ([`client`]).
//!
//! Names (OpenTelemetry semantic conventions where one applies; docs/metrics.md):
//! resource `service.name` (`rttscope`, or `OTEL_SERVICE_NAME`, which wins
//! over a `service.name` in `OTEL_RESOURCE_ATTRIBUTES`),
//! `service.version`, `service.instance.id` (the host name), `host.name`,
//! `os.type`, plus `OTEL_RESOURCE_ATTRIBUTES`; data point attributes
//! `network.transport` (from `proto`: `tcp`, or `icmp`/`icmpv6`, which the
//! convention's list lacks), `network.local.port` (int; absent for "other"),
//! and `rttscope.view`, `rttscope.side`, `rttscope.netns`,
//! `rttscope.peer.prefix` (a CIDR prefix, not the address
//! `network.peer.address` means), `rttscope.<label>` for every other label.

use crate::sinks::prometheus::{native::Native, proto as prom, Rendered, RttLabels};

pub mod client;
pub mod proto;
pub mod push;
pub mod settings;
mod stats;
use proto::*;
pub use push::Pusher;
pub use settings::{Endpoint, Settings};
pub use stats::Stats;

fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(v) }),
    }
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

/// The resource: who is reporting (see the module notes), from the process's environment.
pub fn resource(hostname: &str) -> Resource {
    resource_in(hostname, &settings::process_env)
}

/// [`resource`] in the environment `env`: `OTEL_RESOURCE_ATTRIBUTES`
/// (`k=v,k=v`, values URL-encoded) adds or replaces; `OTEL_SERVICE_NAME`
/// wins over its `service.name`. A malformed entry is left out.
pub fn resource_in(hostname: &str, env: settings::Env) -> Resource {
    let mut attrs = vec![
        kv("service.name", s("rttscope")),
        kv("service.version", s(env!("CARGO_PKG_VERSION"))),
        kv("service.instance.id", s(hostname)),
        kv("host.name", s(hostname)),
        kv("os.type", s("linux")),
    ];
    let mut set = |k: &str, v: &str| {
        attrs.retain(|a| a.key != k);
        attrs.push(kv(k, s(v)));
    };
    let extra = env("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    // entry by entry: one bad entry does not lose the others
    for pair in extra.split(',') {
        if let Ok(kvs) = settings::parse_pairs(pair, "OTEL_RESOURCE_ATTRIBUTES") {
            for (k, v) in kvs.iter().filter(|(k, _)| !k.is_empty()) {
                set(k, v);
            }
        }
    }
    if let Some(name) = env("OTEL_SERVICE_NAME").filter(|v| !v.trim().is_empty()) {
        set("service.name", name.trim());
    }
    Resource { attributes: attrs }
}

/// A label as OpenTelemetry attributes (none for a port that is "other").
pub fn attribute(name: &str, value: &str) -> Option<KeyValue> {
    Some(match name {
        "proto" => kv("network.transport", s(value)),
        "local_port" => kv("network.local.port", Value::Int(value.parse().ok()?)),
        "remote_prefix" => kv("rttscope.peer.prefix", s(value)),
        other => kv(&format!("rttscope.{other}"), s(value)),
    })
}

fn attributes<'a>(labels: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<KeyValue> {
    labels.filter_map(|(n, v)| attribute(n, v)).collect()
}

/// Times of every data point: the exporter's start and now (Unix ns).
#[derive(Clone, Copy, Debug)]
pub struct Times {
    pub start_ns: u64,
    pub now_ns: u64,
}

/// One native histogram as an OTLP exponential data point with `attributes`.
fn exp_point(attributes: Vec<KeyValue>, n: &Native, t: Times) -> ExponentialHistogramDataPoint {
    let (offset, bucket_counts) = n.otel_dense();
    ExponentialHistogramDataPoint {
        attributes,
        start_time_unix_nano: t.start_ns,
        time_unix_nano: t.now_ns,
        count: n.count,
        sum: Some(n.sum_s),
        scale: n.schema,
        zero_count: n.zero_count,
        positive: Some(Buckets {
            offset,
            bucket_counts,
        }),
        zero_threshold: 0.0,
    }
}

/// The TCP view's handshake RTTs by side (`rttscope.tcp.handshake`).
fn handshake_metric(natives: &[(String, Native)], t: Times) -> Metric {
    let data_points = natives
        .iter()
        .map(|(side, n)| exp_point(attributes([("side", side.as_str())].into_iter()), n, t))
        .collect();
    Metric {
        name: "rttscope.tcp.handshake".into(),
        description: "Handshake RTT of each connection the TCP view saw established (client: SYN to SYN-ACK; server: SYN-ACK to the ACK)".into(),
        unit: "s".into(),
        data: Some(Data::ExponentialHistogram(ExponentialHistogram {
            data_points,
            aggregation_temporality: CUMULATIVE,
        })),
    }
}

fn rtt_metric(natives: &[(RttLabels, Native)], t: Times) -> Metric {
    let data_points = natives
        .iter()
        .map(|(l, n)| {
            let pairs = l.pairs();
            let (offset, bucket_counts) = n.otel_dense();
            ExponentialHistogramDataPoint {
                attributes: attributes(pairs.iter().map(|(a, b)| (a.as_str(), b.as_str()))),
                start_time_unix_nano: t.start_ns,
                time_unix_nano: t.now_ns,
                count: n.count,
                sum: Some(n.sum_s),
                scale: n.schema,
                zero_count: n.zero_count,
                positive: Some(Buckets {
                    offset,
                    bucket_counts,
                }),
                zero_threshold: 0.0,
            }
        })
        .collect();
    Metric {
        name: "rttscope.rtt".into(),
        description: "RTT samples per view, side and flow group".into(),
        unit: "s".into(),
        data: Some(Data::ExponentialHistogram(ExponentialHistogram {
            data_points,
            aggregation_temporality: CUMULATIVE,
        })),
    }
}

/// A counter or gauge family of `/metrics` as an OTLP Sum or Gauge.
fn number_metric(f: &prom::MetricFamily, t: Times) -> Option<Metric> {
    let counter = f.r#type == prom::MetricType::Counter as i32;
    if !counter && f.r#type != prom::MetricType::Gauge as i32 {
        return None;
    }
    let data_points = f
        .metric
        .iter()
        .map(|m| NumberDataPoint {
            attributes: attributes(m.label.iter().map(|l| (l.name.as_str(), l.value.as_str()))),
            start_time_unix_nano: t.start_ns,
            time_unix_nano: t.now_ns,
            as_double: m
                .counter
                .as_ref()
                .map(|c| c.value)
                .or(m.gauge.as_ref().map(|g| g.value))
                .unwrap_or(0.0),
        })
        .collect();
    let name = if counter {
        f.name.strip_suffix("_total").unwrap_or(&f.name)
    } else {
        &f.name
    };
    let data = if counter {
        Data::Sum(Sum {
            data_points,
            aggregation_temporality: CUMULATIVE,
            is_monotonic: true,
        })
    } else {
        Data::Gauge(Gauge { data_points })
    };
    Some(Metric {
        name: name.to_string(),
        description: f.help.clone(),
        unit: String::new(),
        data: Some(data),
    })
}

/// One export request of a render: RTT as exponential histograms, every
/// counter and gauge of `/metrics` beside it.
pub fn request(r: &Rendered, resource: &Resource, t: Times) -> ExportMetricsServiceRequest {
    let om = String::from_utf8_lossy(&r.openmetrics);
    let fams = prom::families(&om, "", &Default::default());
    let mut metrics = vec![rtt_metric(&r.natives, t)];
    if !r.handshake_natives.is_empty() {
        metrics.push(handshake_metric(&r.handshake_natives, t));
    }
    metrics.extend(fams.iter().filter_map(|f| number_metric(f, t)));
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "rttscope".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                metrics,
            }],
            schema_url: "https://opentelemetry.io/schemas/1.26.0".into(),
        }],
    }
}

/// Unix time in ns.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::flow::{Flow, Side};
    use crate::analysis::hist::Hist;
    use crate::sinks::prometheus::{Exporter, LabelPolicy};
    use crate::views::ViewKind;
    use prost::Message;

    #[test]
    fn request_carries_exponential_rtt_and_semconv_names() {
        let mut ex = Exporter::new(LabelPolicy {
            ports: vec![443],
            ..Default::default()
        })
        .unwrap();
        let mut h = Hist::default();
        for v in [0, 100, 1000, 1000, 25_000] {
            h.record(v);
        }
        let f = Flow {
            tunnel: Default::default(),
            netns: 1,
            local: "10.0.0.1:443".parse().unwrap(),
            remote: "192.0.2.9:5555".parse().unwrap(),
        };
        ex.observe_flow(ViewKind::Tcp, &f, Side::Server, "ns", &h, None);
        let mut c = std::collections::BTreeMap::new();
        c.insert("samples", 5u64);
        ex.set_counters(ViewKind::Tcp, &c);
        let r = ex.render();
        let t = Times {
            start_ns: 1,
            now_ns: 2,
        };
        let req = request(&r, &resource("node-a"), t);
        let bytes = req.encode_to_vec();
        let back = ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back, req);
        let rm = &back.resource_metrics[0];
        let res = &rm.resource.as_ref().unwrap().attributes;
        assert!(res.iter().any(|a| a.key == "service.name"));
        assert!(res.iter().any(|a| a.key == "host.name"
            && a.value
                == Some(AnyValue {
                    value: Some(s("node-a"))
                })));
        let m = &rm.scope_metrics[0].metrics;
        let Some(Data::ExponentialHistogram(eh)) = &m[0].data else {
            panic!("{:?}", m[0])
        };
        assert_eq!(
            (m[0].name.as_str(), m[0].unit.as_str()),
            ("rttscope.rtt", "s")
        );
        let dp = &eh.data_points[0];
        assert_eq!((dp.count, dp.zero_count, dp.scale), (5, 1, 3));
        let pos = dp.positive.as_ref().unwrap();
        assert_eq!(pos.bucket_counts.iter().sum::<u64>(), 4);
        // 1 ms = 2^(-9.97) s: Prometheus index ceil(-9.97 * 8) = -79, OTel -80.
        let i_ms = pos.offset + pos.bucket_counts.iter().position(|&c| c == 2).unwrap() as i32;
        assert_eq!(i_ms, -80);
        let keys: Vec<&str> = dp.attributes.iter().map(|a| a.key.as_str()).collect();
        for k in [
            "network.transport",
            "network.local.port",
            "rttscope.side",
            "rttscope.view",
            "rttscope.peer.prefix",
        ] {
            assert!(keys.contains(&k), "{keys:?}");
        }
        let port = dp
            .attributes
            .iter()
            .find(|a| a.key == "network.local.port")
            .unwrap();
        assert_eq!(
            port.value,
            Some(AnyValue {
                value: Some(Value::Int(443))
            })
        );
        let samples = m.iter().find(|m| m.name == "rttscope_samples").unwrap();
        let Some(Data::Sum(sum)) = &samples.data else {
            panic!()
        };
        assert!(sum.is_monotonic && sum.aggregation_temporality == CUMULATIVE);
        assert_eq!(sum.data_points[0].as_double, 5.0);
    }

    #[test]
    fn resource_takes_the_environment_and_the_service_name_wins() {
        let env = |k: &str| match k {
            "OTEL_RESOURCE_ATTRIBUTES" => Some(
                "service.name=attr,deployment.environment=prod%20eu,host.name=h2,bad,k=%zz".into(),
            ),
            "OTEL_SERVICE_NAME" => Some("edge".into()),
            _ => None,
        };
        let r = resource_in("node-a", &env);
        let get = |k: &str| {
            r.attributes
                .iter()
                .filter(|a| a.key == k)
                .map(|a| a.value.clone())
                .collect::<Vec<_>>()
        };
        let one = |v: &str| vec![Some(AnyValue { value: Some(s(v)) })];
        assert_eq!(get("service.name"), one("edge"));
        assert_eq!(get("deployment.environment"), one("prod eu"));
        assert_eq!(get("host.name"), one("h2"));
        assert_eq!(get("service.instance.id"), one("node-a"));
        assert!(get("k").is_empty() && get("bad").is_empty());
        let r = resource_in("node-a", &|_| None);
        assert_eq!(
            r.attributes[0].value,
            Some(AnyValue {
                value: Some(s("rttscope"))
            })
        );
    }
}
