//! A fleet of three observers against a real Prometheus 2.53.3, started with
//! native histograms and its OTLP receiver. Debian's prometheus packages
//! (2.53.3 in trixie) are built without the OTLP receiver (Debian bug
//! #1080354), so scripts/setup.sh builds upstream 2.53.3 from its Go module
//! source into /var/cache/rttscope/prometheus-otlp (`RTTSCOPE_PROMETHEUS`
//! overrides). Each observer
//! plays one node: its own lab testbed (client, router, server namespaces;
//! the router's NFQUEUE emulator delays packets, with jitter), its own
//! request/response flows, `--netns` filtered to its own namespaces. Node C's
//! client thinks 12 ms between requests, so its server side is delayed-ACK
//! bound (path + think). Prometheus scrapes A and B (protobuf, native and
//! classic buckets); C pushes OTLP.
//!
//! Truth: every raw sample the same observers printed (`--format json
//! --raw`). Checked: `histogram_quantile` of p50 and p99 per side, over the
//! scraped series, the pushed series and the whole fleet, within 5% of the
//! nearest-rank percentiles of the raw samples of the same nodes and side.
//! The classic buckets' error is printed (docs/metrics.md quotes it).
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rttscope::lab::emulator::{Impairment, LinkConfig};
use rttscope::lab::testbed::{Role, Testbed, SRV_ADDR};
use rttscope_e2e::prometheus::*;
use rttscope_e2e::*;

const PORT: u16 = 5301;
/// How long the flows run.
const TRAFFIC: Duration = Duration::from_secs(30);

/// One node: a lab testbed with delay, an RR server and clients, an observer.
struct Node {
    name: &'static str,
    flows: (RrServer, Vec<RrClient>),
    observer: Option<ChildGuard>,
    out_path: PathBuf,
    _imp: Impairment,
    _tb: Testbed,
}

/// A handle on a testbed namespace for the e2e helpers (the testbed removes it).
fn ns_of(tb: &Testbed, role: Role) -> ManuallyDrop<NetNs> {
    ManuallyDrop::new(NetNs { name: tb.ns(role) })
}

impl Node {
    fn start(
        name: &'static str,
        delay_ms: u64,
        jitter_ms: u64,
        think: Duration,
        out: &[String],
    ) -> Node {
        let tb = Testbed::new().unwrap();
        let mut imp = Impairment::new(&tb).unwrap();
        imp.set_both(LinkConfig {
            delay: Duration::from_millis(delay_ms),
            jitter: Duration::from_millis(jitter_ms),
            ..Default::default()
        })
        .unwrap();
        let mut cmd = Command::new(rttscope_bin());
        cmd.arg("observe")
            .args(["--netns", &tb.ns(Role::Cli), "--netns", &tb.ns(Role::Srv)])
            .args(["--port", &PORT.to_string()])
            .args(["--interval", "1s", "--format", "json", "--raw"])
            .args(out);
        // Standard output into a file: a pipe nobody reads while the test
        // runs would stop the observer (and its ring buffer would overrun).
        let out_path = std::env::temp_dir().join(unique("rtsfleet"));
        let out_file = std::fs::File::create(&out_path).unwrap();
        let child = cmd
            .stdout(out_file)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let observer = ChildGuard(Some(child));
        // The observer attaches before the flows start (their first samples are its).
        std::thread::sleep(Duration::from_millis(2500));
        let (cli, srv) = (ns_of(&tb, Role::Cli), ns_of(&tb, Role::Srv));
        let addr = SocketAddr::new(SRV_ADDR.into(), PORT);
        let server = RrServer::start(&srv, addr, 200).unwrap();
        let clients = (0..2)
            .map(|_| RrClient::start(&cli, addr, 200, think).unwrap())
            .collect();
        Node {
            name,
            flows: (server, clients),
            observer: Some(observer),
            out_path,
            _imp: imp,
            _tb: tb,
        }
    }

    /// Stop the flows, let the observer report once more, stop it (SIGTERM)
    /// and return its raw samples as (side, rtt_us).
    fn finish(&mut self) -> Vec<(String, u32)> {
        self.flows.1.clear();
        std::thread::sleep(Duration::from_millis(2500));
        let g = self.observer.take().unwrap();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(g.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let out = g.wait_output(Duration::from_secs(20)).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "observer {}: {stderr}", self.name);
        let stdout = std::fs::read(&self.out_path).unwrap();
        let _ = std::fs::remove_file(&self.out_path);
        let lines = parse_lines(&stdout).unwrap();
        let c = last_interval_counters(&lines, "tcp");
        assert_eq!(
            c["raw_events_dropped"], 0,
            "node {}: raw stream complete: {c}",
            self.name
        );
        lines
            .iter()
            .filter(|l| l["type"] == "sample" && l["view"] == "tcp")
            .map(|l| {
                (
                    l["side"].as_str().unwrap_or("?").to_string(),
                    l["rtt_us"].as_u64().unwrap() as u32,
                )
            })
            .collect()
    }
}

/// One node's raw samples: (side, rtt_us).
type Samples<'a> = &'a [(String, u32)];

/// Nearest-rank percentile (seconds) of µs samples.
fn pct(v: &mut [u32], q: f64) -> f64 {
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1] as f64 * 1e-6
}

fn by_side(samples: &[&[(String, u32)]], side: &str) -> Vec<u32> {
    samples
        .iter()
        .flat_map(|s| s.iter())
        .filter(|(s, _)| s == side)
        .map(|(_, v)| *v)
        .collect()
}

/// The value of `q` for one side (the label is `side`, or `rttscope_side` for OTLP).
fn per_side(p: &Prometheus, q: &str, side_label: &str, side: &str) -> f64 {
    let r = p.query(q);
    r.iter()
        .find(|(m, _)| m[side_label] == side)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {side_label}={side} in {q}: {r:?}"))
}

#[test]
fn fleet_percentiles_from_native_and_otlp_histograms_within_5_percent() {
    if !require_root() {
        return;
    }
    let t0 = Instant::now();
    let (pa, pb) = (free_port(), free_port());
    let prom = Prometheus::start(&[pa, pb]);
    let otlp = format!("http://127.0.0.1:{}/api/v1/otlp/v1/metrics", prom.port);
    let listen = |p: u16| vec!["--listen".to_string(), format!("127.0.0.1:{p}")];
    let mut nodes = [
        Node::start("a", 2, 1, Duration::ZERO, &listen(pa)),
        Node::start("b", 5, 2, Duration::ZERO, &listen(pb)),
        Node::start(
            "c",
            1,
            1,
            Duration::from_millis(12),
            &["--otlp".into(), otlp, "--otlp-interval".into(), "1s".into()],
        ),
    ];
    std::thread::sleep(TRAFFIC);
    let raw: Vec<Vec<(String, u32)>> = nodes.iter_mut().map(|n| n.finish()).collect();
    // One more scrape after the observers' last interval was rendered.
    std::thread::sleep(Duration::from_millis(1500));
    let (a, b, c) = (&raw[0][..], &raw[1][..], &raw[2][..]);
    let sel_scraped = "rttscope_rtt_seconds{job=\"rttscope-scrape\",view=\"tcp\"}";
    let sel_pushed = "rttscope_rtt_seconds{rttscope_view=\"tcp\"}";
    assert!(!prom.series(sel_scraped).is_empty(), "no scraped series");
    assert!(
        !prom.series(sel_pushed).is_empty(),
        "no pushed series: {:?}",
        prom.series("{__name__=~\"rttscope.*\"}")
    );
    let (report, failures) = percentiles_against_raw(&prom, [a, b, c]);
    let report = report.join("\n");
    eprintln!("{report}");
    check_shipped_queries(&prom);
    eprintln!("(test took {:.0?})", t0.elapsed());
    assert!(
        failures.is_empty(),
        "off by more than 5%:\n{}\n\nall:\n{report}",
        failures.join("\n")
    );
}

/// The queries of the shipped dashboard and examples/deploy/promql.md
/// (`$__rate_interval` as 1m, `$instance` as `.*`).
fn shipped_queries() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy");
    let sub = |q: &str| {
        q.replace("$__rate_interval", "1m")
            .replace("$instance", ".*")
    };
    let mut out = Vec::new();
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                format!("dashboard: {}", p["title"]),
                sub(t["expr"].as_str().unwrap()),
            ));
        }
    }
    let md = std::fs::read_to_string(root.join("promql.md")).unwrap();
    let mut in_block = false;
    let mut cur = String::new();
    let flush = |cur: &mut String, out: &mut Vec<(String, String)>| {
        if !cur.trim().is_empty() {
            out.push(("promql.md".into(), sub(cur.trim())));
        }
        cur.clear();
    };
    for line in md.lines() {
        if line.starts_with("```") {
            flush(&mut cur, &mut out);
            in_block = line == "```promql";
            continue;
        }
        if let Some(e) = line.trim_start().strip_prefix("expr: ") {
            out.push(("promql.md alert".into(), sub(e)));
        }
        if !in_block {
            continue;
        }
        let cont = line.starts_with([' ', '/', '-', '+', '*', ')']) && !cur.is_empty();
        if line.starts_with('#') || !cont {
            flush(&mut cur, &mut out);
        }
        if !line.starts_with('#') {
            cur.push(' ');
            cur.push_str(line);
        }
    }
    flush(&mut cur, &mut out);
    out
}

/// Identifiers used as labels in `by (...)` and `{...}` matchers.
fn labels_used(q: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = q;
    while let Some(i) = rest.find("by (") {
        let after = &rest[i + 4..];
        let end = after.find(')').unwrap_or(after.len());
        out.extend(after[..end].split(',').map(|l| l.trim().to_string()));
        rest = &after[end..];
    }
    let mut rest = q;
    while let Some(i) = rest.find('{') {
        let after = &rest[i + 1..];
        let end = after.find('}').unwrap_or(after.len());
        for m in after[..end].split(',') {
            let name: String = m
                .trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
        rest = &after[end..];
    }
    out.sort();
    out.dedup();
    out
}

/// Every shipped query runs, and every metric name and label it uses exists
/// in what Prometheus scraped from the live observers.
fn check_shipped_queries(p: &Prometheus) {
    let queries = shipped_queries();
    assert!(queries.len() > 20, "{queries:?}");
    let mut problems = Vec::new();
    for (src, q) in &queries {
        let (_, body) = http_get(p.port, &format!("/api/v1/query?query={}", urlencode(q))).unwrap();
        if !body.contains("\"status\":\"success\"") {
            problems.push(format!("{src}: {q}: {body}"));
            continue;
        }
        let names: Vec<String> = q
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("rttscope_") || w.starts_with("process_"))
            .map(String::from)
            .collect();
        let mut label_names = std::collections::HashSet::new();
        for n in &names {
            // Present only when `--otlp` is on (the scraped observer pushes nothing): the
            // failures once a delivery failed, the drops from the start, by reason.
            if n.starts_with("rttscope_otlp_") {
                continue;
            }
            let series = p.series(&format!("{n}{{job=\"rttscope-scrape\"}}"));
            if series.is_empty() {
                problems.push(format!("{src}: no series {n} in: {q}"));
            }
            for s in &series {
                label_names.extend(s.as_object().unwrap().keys().cloned());
            }
        }
        for l in labels_used(q) {
            if !names.is_empty()
                && !names.iter().all(|n| n.starts_with("rttscope_otlp_"))
                && !label_names.contains(&l)
            {
                problems.push(format!("{src}: label {l} not on {names:?}: {q}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "shipped queries that do not hold:\n{}",
        problems.join("\n")
    );
    eprintln!(
        "{} shipped queries checked against the live scrape",
        queries.len()
    );
}

/// Every percentile Prometheus computes (scraped, pushed, fleet; classic buckets for the docs)
/// beside the one of the raw samples: the report's lines, and those off by more than 5 %.
fn percentiles_against_raw(prom: &Prometheus, raw: [Samples; 3]) -> (Vec<String>, Vec<String>) {
    let [a, b, c] = raw;
    let sel_scraped = "rttscope_rtt_seconds{job=\"rttscope-scrape\",view=\"tcp\"}";
    let sel_pushed = "rttscope_rtt_seconds{rttscope_view=\"tcp\"}";
    let fleet_rate = format!(
        "label_replace(rate({sel_pushed}[1m]), \"side\", \"$1\", \"rttscope_side\", \"(.+)\") or rate({sel_scraped}[1m])"
    );
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for side in ["client", "server"] {
        for q in [0.5, 0.99] {
            let cases: [(&str, String, &str, Vec<Samples>); 3] = [
                (
                    "scraped (native)",
                    format!("histogram_quantile({q}, sum by (side) (rate({sel_scraped}[1m])))"),
                    "side",
                    vec![a, b],
                ),
                (
                    "pushed (OTLP)",
                    format!(
                        "histogram_quantile({q}, sum by (rttscope_side) (rate({sel_pushed}[1m])))"
                    ),
                    "rttscope_side",
                    vec![c],
                ),
                (
                    "fleet",
                    format!("histogram_quantile({q}, sum by (side) ({fleet_rate}))"),
                    "side",
                    vec![a, b, c],
                ),
            ];
            for (what, query, label, nodes) in cases {
                let mut truth = by_side(&nodes, side);
                assert!(
                    truth.len() > 200,
                    "{what} {side}: only {} raw samples",
                    truth.len()
                );
                let exact = pct(&mut truth, q);
                let got = per_side(prom, &query, label, side);
                let err = got / exact - 1.0;
                let line = format!(
                    "{what:<17} {side:<6} p{:<2}: prometheus {:.4} ms, raw {:.4} ms ({} samples): {:+.2}%",
                    (q * 100.0) as u32,
                    got * 1e3,
                    exact * 1e3,
                    truth.len(),
                    err * 100.0
                );
                if err.abs() > 0.05 {
                    failures.push(line.clone());
                }
                report.push(line);
            }
            // The classic buckets of the scraped nodes, for the docs.
            let classic = format!(
                "histogram_quantile({q}, sum by (side, le) (rate(rttscope_rtt_seconds_bucket{{job=\"rttscope-scrape\",view=\"tcp\"}}[1m])))"
            );
            let mut truth = by_side(&[a, b], side);
            let exact = pct(&mut truth, q);
            let got = per_side(prom, &classic, "side", side);
            report.push(format!(
                "{:<17} {side:<6} p{:<2}: prometheus {:.4} ms, raw {:.4} ms: {:+.2}%",
                "scraped (classic)",
                (q * 100.0) as u32,
                got * 1e3,
                exact * 1e3,
                (got / exact - 1.0) * 100.0
            ));
        }
    }
    (report, failures)
}
