//! OTLP/HTTP export (`observe --otlp URL`): the metrics of `/metrics` pushed
//! as OTLP protobuf to an OpenTelemetry Collector or any OTLP receiver
//! (Prometheus' `/api/v1/otlp/v1/metrics`), RTT as exponential histograms.
//!
//! Delivery never blocks the kernel reads: the observe loop renders a
//! request (cumulative temporality: each one carries every count since the
//! start, so losing one loses no samples) and puts it into a bounded queue
//! ([`QUEUE`] requests, the oldest dropped and counted when full); a thread
//! of its own POSTs them. Failures are counted by cause
//! (`rttscope_otlp_failures_total{cause}`) and logged once per cause.
//!
//! Names (OpenTelemetry semantic conventions where one applies; docs/metrics.md):
//! resource `service.name` (`rttscope`, or `OTEL_SERVICE_NAME`),
//! `service.version`, `service.instance.id` (the host name), `host.name`,
//! `os.type`, plus `OTEL_RESOURCE_ATTRIBUTES`; data point attributes
//! `network.transport` (from `proto`: `tcp`, or `icmp`/`icmpv6`, which the
//! convention's list lacks), `network.local.port` (int; absent for "other"),
//! and `rttscope.view`, `rttscope.side`, `rttscope.netns`,
//! `rttscope.peer.prefix` (a CIDR prefix, not the address
//! `network.peer.address` means), `rttscope.<label>` for every other label.
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{bail, Result};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::sinks::prometheus::{native::Native, proto as prom, Rendered, RttLabels};

pub mod proto;
use proto::*;

/// Requests waiting to be sent, at most; the oldest is dropped past that.
pub const QUEUE: usize = 4;
/// A request not answered within this time fails (cause `timeout`).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Where to send: host:port and path of an `http://` URL.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub authority: String,
    pub path: String,
}

impl Endpoint {
    /// Parse `http://HOST:PORT[/PATH]`; no path (or `/`) means the OTLP
    /// default `/v1/metrics`, as `OTEL_EXPORTER_OTLP_ENDPOINT` does.
    pub fn parse(url: &str) -> Result<Endpoint> {
        let Some(rest) = url.strip_prefix("http://") else {
            if url.starts_with("https://") {
                bail!("--otlp '{url}': https is not supported; send to a local OpenTelemetry Collector over http:// and let it forward with TLS");
            }
            bail!("--otlp '{url}' is not an http:// URL (e.g. http://127.0.0.1:4318)");
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let host_ok = authority
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !host_ok {
            bail!("--otlp '{url}': give the host and port, e.g. http://127.0.0.1:4318");
        }
        let path = if path.is_empty() || path == "/" {
            "/v1/metrics".to_string()
        } else {
            path.to_string()
        };
        Ok(Endpoint {
            authority: authority.to_string(),
            path,
        })
    }
}

fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(v) }),
    }
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

/// The resource: who is reporting (see the module notes).
pub fn resource(hostname: &str) -> Resource {
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "rttscope".into());
    let mut attrs = vec![
        kv("service.name", s(&service)),
        kv("service.version", s(env!("CARGO_PKG_VERSION"))),
        kv("service.instance.id", s(hostname)),
        kv("host.name", s(hostname)),
        kv("os.type", s("linux")),
    ];
    // OTEL_RESOURCE_ATTRIBUTES=key=value,key=value adds or replaces.
    let extra = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    for pair in extra.split(',').filter(|p| !p.trim().is_empty()) {
        if let Some((k, v)) = pair.split_once('=') {
            let k = k.trim();
            attrs.retain(|a| a.key != k);
            attrs.push(kv(k, s(v.trim())));
        }
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

/// Delivery counters, registered in the exporter's registry.
#[derive(Clone, Default)]
pub struct Stats {
    pub sent: Counter,
    pub dropped: Counter,
    pub failures: Family<Vec<(String, String)>, Counter>,
}

impl Stats {
    pub fn register(r: &mut Registry) -> Stats {
        let s = Stats::default();
        r.register(
            "rttscope_otlp_exports",
            "OTLP export requests delivered (answered 2xx)",
            s.sent.clone(),
        );
        r.register(
            "rttscope_otlp_dropped",
            "OTLP export requests dropped unsent because the queue was full (the next one carries the same cumulative counts)",
            s.dropped.clone(),
        );
        r.register(
            "rttscope_otlp_failures",
            "OTLP export requests that failed, by cause (connect, timeout, http_<status>, io)",
            s.failures.clone(),
        );
        s
    }

    fn failed(&self, cause: &str) {
        self.failures
            .get_or_create(&vec![("cause".into(), cause.into())])
            .inc();
    }
}

/// What the observe loop and the sending thread share.
struct Shared {
    queue: Mutex<(VecDeque<Vec<u8>>, bool)>,
    ready: Condvar,
}

/// The sending side: a thread with its own runtime, fed through a bounded queue.
pub struct Pusher {
    shared: Arc<Shared>,
    stats: Stats,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pusher {
    pub fn start(endpoint: Endpoint, stats: Stats) -> Result<Pusher> {
        let shared = Arc::new(Shared {
            queue: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        });
        let (sh, st) = (shared.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("rttscope-otlp".into())
            .spawn(move || send_loop(&endpoint, &sh, &st))?;
        Ok(Pusher {
            shared,
            stats,
            thread: Some(thread),
        })
    }

    /// Queue one encoded request; never waits (drops the oldest when full).
    pub fn push(&self, body: Vec<u8>) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.0.len() >= QUEUE {
            q.0.pop_front();
            self.stats.dropped.inc();
        }
        q.0.push_back(body);
        self.shared.ready.notify_one();
    }
}

impl Drop for Pusher {
    /// Send what is queued (the last counts), then stop the thread.
    fn drop(&mut self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1 = true;
        self.shared.ready.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send_loop(ep: &Endpoint, sh: &Shared, stats: &Stats) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        stats.failed("runtime");
        return;
    };
    let mut logged: HashSet<String> = HashSet::new();
    loop {
        let (body, stop) = {
            let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
            while q.0.is_empty() && !q.1 {
                q = sh.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            (q.0.pop_front(), q.1)
        };
        let Some(body) = body else { return };
        match rt.block_on(post(ep, body)) {
            Ok(()) => {
                stats.sent.inc();
            }
            Err((cause, why)) => {
                stats.failed(&cause);
                if logged.insert(cause.clone()) {
                    eprintln!(
                        "rttscope: OTLP export to http://{}{} failed ({cause}): {why} (counted in rttscope_otlp_failures_total; said once per cause)",
                        ep.authority, ep.path
                    );
                }
            }
        }
        if stop && sh.queue.lock().map(|q| q.0.is_empty()).unwrap_or(true) {
            return;
        }
    }
}

/// POST one request; the error is (cause, sentence).
async fn post(ep: &Endpoint, body: Vec<u8>) -> Result<(), (String, String)> {
    let fut = async {
        let sock = tokio::net::TcpStream::connect(&ep.authority)
            .await
            .map_err(|e| ("connect".to_string(), e.to_string()))?;
        let io = hyper_util::rt::TokioIo::new(sock);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| ("io".to_string(), e.to_string()))?;
        tokio::spawn(conn);
        let req = hyper::Request::post(ep.path.as_str())
            .header(hyper::header::HOST, ep.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                hyper::header::USER_AGENT,
                concat!("rttscope/", env!("CARGO_PKG_VERSION")),
            )
            .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
            .map_err(|e| ("io".to_string(), e.to_string()))?;
        let res = send
            .send_request(req)
            .await
            .map_err(|e| ("io".to_string(), e.to_string()))?;
        let code = res.status();
        if code.is_success() {
            Ok(())
        } else {
            Err((
                format!("http_{}", code.as_u16()),
                format!("answered {code}"),
            ))
        }
    };
    match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(("timeout".into(), format!("no answer within {TIMEOUT:?}"))),
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
    fn endpoints() {
        let e = Endpoint::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.path.as_str()),
            ("127.0.0.1:4318", "/v1/metrics")
        );
        let e = Endpoint::parse("http://[::1]:9090/api/v1/otlp/v1/metrics").unwrap();
        assert_eq!(e.path, "/api/v1/otlp/v1/metrics");
        for bad in ["https://x:1", "127.0.0.1:4318", "http://host", "http://:1/"] {
            let e = Endpoint::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--otlp") && !e.contains('\n'), "{e}");
        }
    }

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

    /// A receiver that is not there: failures counted by cause, pushes never
    /// wait, the queue stays bounded (oldest dropped and counted).
    #[test]
    fn failures_are_counted_and_the_queue_is_bounded() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l); // nothing listens there now
        let stats = Stats::default();
        let p = Pusher::start(
            Endpoint::parse(&format!("http://{addr}")).unwrap(),
            stats.clone(),
        )
        .unwrap();
        let t0 = std::time::Instant::now();
        for _ in 0..100 {
            p.push(vec![0u8; 1000]);
        }
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "push waited {:?}",
            t0.elapsed()
        );
        drop(p);
        let fails = stats
            .failures
            .get_or_create(&vec![("cause".into(), "connect".into())])
            .get();
        let dropped = stats.dropped.get();
        assert!(fails >= 1, "connect failures {fails}");
        assert_eq!(
            fails + dropped,
            100,
            "every request sent or dropped: {fails} + {dropped}"
        );
        assert_eq!(stats.sent.get(), 0);
    }
}
